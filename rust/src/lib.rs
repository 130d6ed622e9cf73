//! kwker-kernels: torch-free CPU kernels for running PyTorch language models fast on CPU.
//!
//! Numerical contract (whole crate): inputs may be bf16 or f32, but every product and every
//! sum is computed in f32; nothing is quantized except in `quant`, whose 8-/4-bit linear states
//! its own rounding (weights and activations as integer codes, exact i32 dot products per block).
//! Results are converted to the output element type only at the very end. SIMD tiers differ from
//! the scalar `generic` tier only in the order in which f32 sums are rounded.
//!
//! Each kernel family has one file per instruction set (`generic`, `avx2`, `avx512`) with the
//! same function names; only the dispatchers (`linear::linear`, `attention::decode_attention`)
//! know that several exist. `isa::detect()` picks the best tier the host supports.

pub mod amx;
pub mod attention;
pub mod bf16;
pub mod decoder;
pub mod exec;
pub mod isa;
pub mod linear;
pub mod par;
pub mod pool;
pub mod preserve_linear;
pub mod quant;
pub mod vmath;

mod hint;
mod scratch;
