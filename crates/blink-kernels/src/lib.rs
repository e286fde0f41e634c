//! Compute kernels: numerics only. Owns the quantized block formats and their scalar
//! reference kernels (the test oracle), the instruction-set path and dot order, and the
//! runtime-dispatched SIMD kernels: matrix products, attention, element-wise ops.
//!
//! Must not touch models, files or threads: a kernel computes what it is handed on the
//! calling thread. Thread pools, pinning and NUMA memory are `blink-runtime`'s, which this
//! crate does not depend on; callers split work and hand each thread its share.
//!
//! Layout: [`quant`] holds the ggml block formats and their scalar reference kernels
//! (dequantize, quantize, dot product); [`cpu`], [`order`] and [`flavour`] fix the
//! instruction-set path, the float order of quantized dots and which llama.cpp build
//! (AVX-512 or AVX2) the llama order reproduces; [`gemm`], [`attention`] and [`ops`] are the
//! kernels the forward pass calls; [`lora`] adds an adapter's delta after a projection.
//! [`fgemm`] is training's float product; `x86` holds AVX pieces shared across them.

pub mod attention;
pub mod cpu;
pub mod fgemm;
pub mod flavour;
pub mod gemm;
pub mod gelu;
pub mod lora;
mod libm_expf;
pub mod math;
#[cfg(target_arch = "aarch64")]
mod neon;
pub mod ops;
pub mod order;
pub mod quant;
#[cfg(target_arch = "x86_64")]
pub mod x86;
