//! 8-bit and 4-bit weights and their linear, `y = x @ dequant(w)^T + bias`, with activations
//! quantized to int8 for integer dot products.
//!
//! Formats (one scale set per block of k, per output row; each family's values, layout and quantizer in
//! `quant/formats/`, the table of their sizes and names in `quant/formats.rs`):
//! - `Q8`, `Q80`: 8-bit codes under an f32 scale per 64 values or an f16 one per 32 (llama.cpp's Q8_0).
//! - `Q4`, `Q40`, `Q50`: 4-/5-bit codes per 32 values (llama.cpp's Q4_1, Q4_0, Q5_0).
//! - `Q4K`, `Q6K`, `Q6K16`: super-blocks of 256 values with 6-/8-bit scales per 32- (Q6K16: 16-) value
//!   sub-block (llama.cpp's Q4_K and Q6_K classes; layout in `kblock`).
//!
//! GGUF tensors of the llama.cpp types named run in their own bits (`gguf.rs`).
//!
//! `QuantRows` is the reference form (codes row-major, one scale per row and block) that the
//! quantizers produce and the tests dequantize; `QuantWeight` is the same numbers packed into panels
//! of 16 output rows for the kernels (layout in `pack`).
//!
//! Numerical contract of `quant_linear`, Q8 and Q4: each x row is cut into blocks of 32 and quantized
//! (`quantize_block`, bit-identical in every tier): Q4 matrices read x as int8 codes, x ~ dx * q with
//! dx = max|x| / 127 (as llama.cpp's q8 activations); Q8 matrices read it with a second int8 code for
//! the residual, x ~ dx' * (254 q + q2), dx' = dx / 254, error at most dx' / 2 (about 15 bits: the
//! int8 rounding of activations with outlier channels cost more perplexity than the 8-bit weights).
//! Within a 32-block the dot product of codes is an exact i32 sum; the block then contributes
//! `d * (dot * dx')` (Q8, Q80) to an f32 accumulator in k order, or (Q4, Q40, Q50)
//! `y = fma(fma(d, dot, -(dm * sum(q))), dx, y)` with dm = -m (Q4) or z d (Q40, Q50): the super-block
//! formats' Q4K form, so that their prompts run on that path (`superblock.rs`, 8 blocks to a super-block)
//! with the bits of their own tiles; the bias last. Q8's tiers differ from the scalar reference only in
//! fused multiply-add rounding, so the result is a float linear of the dequantized weights and the rounded
//! activations, up to f32 rounding; Q4, Q40 and Q50 give the scalar tier's bits in every tier.
//!
//! Q4K, Q6K and Q6K16 read the same per-32 codes; `superblock.rs` states their contract (a fixed fused-float
//! epilogue per sub-block), under which every tier, tile and thread split gives the scalar tier's bits.
//!
//! This file holds the module's public names; the parts live in `quant/formats.rs` (`Format`, and one file
//! per family of formats), `quant/weight.rs` (`QuantRows`, `QuantWeight`), `quant/acts.rs` (`QActs`, `quantize_block`),
//! `quant/linear.rs` (the tiers, `quant_linear`, the split into tasks), `quant/job.rs` (what a tier's
//! kernels read, and the store of their sums), `quant/fit.rs` (the quantizers' driver) and one file per tier
//! (the AVX2 tier's activation quantizer in `quant/avx2_acts.rs`).

mod acts;
mod generic;
mod job;
mod linear;
mod weight;
#[macro_use]
mod superblock;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_acts;
#[cfg(target_arch = "x86_64")]
mod avx2_rows;
#[cfg(target_arch = "x86_64")]
mod avx2_unpack;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avxvnni;
mod f16;
mod fit;
mod formats;
pub mod gguf;
pub mod grid;
pub mod kblock;
pub mod row_q8;

pub(crate) use acts::ActsOut;
pub use acts::{quantize_activations, quantize_block, tiled_acts_run, BlockCodes, QActs, LO};
pub use f16::{f16_to_f32, f32_to_f16};
pub use fit::{quantize, QuantOptions};
pub use formats::Format;
pub(crate) use job::{store, Job};
pub use linear::{
    gated_linears_run, kernel_name, quant_linear, quant_linear_amx_emulated, quant_linear_gated,
    quant_linear_group, quant_linear_vnni_emulated, super_amx_products_run, super_min_rows,
    super_unpacked_panels_run, GroupItem,
};
pub use weight::{QuantRows, QuantWeight};

/// Output rows per packed panel (one 512-bit vector of i32 sums).
pub const QPANEL: usize = 16;
/// Activation block, and the unit every kernel's inner loop covers.
pub const QSUB: usize = 32;
