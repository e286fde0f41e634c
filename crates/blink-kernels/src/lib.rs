//! Compute kernels: quantized block formats with scalar reference implementations (the test
//! oracle), the persistent SPMD thread pool and thread pinning. Knows nothing of models.
//!
//! Layout: [`quant`] holds the ggml block formats and their scalar reference kernels
//! (dequantize, quantize, dot product); [`cpu`] and [`order`] fix the instruction-set path
//! and the float order of quantized dots; [`pool`] runs one closure on every compute thread
//! with cheap barriers; [`affinity`] pins threads where the OS allows.

pub mod affinity;
pub mod attention;
pub mod bandwidth;
pub mod cpu;
pub mod gemm;
mod libm_expf;
pub mod math;
#[cfg(target_arch = "aarch64")]
mod neon;
pub mod numa;
pub mod ops;
pub mod order;
mod park;
pub mod pool;
pub mod quant;
