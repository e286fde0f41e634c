//! How a model is spread over the machine. Tensor parallelism (`tensor`) splits every
//! layer by output rows over NUMA nodes, each part computing whole dot products; the
//! ring's pipeline placement (windows of layers over devices) will sit beside it.

pub mod tensor;
