//! 8-bit and 4-bit weights and their linear, `y = x @ dequant(w)^T + bias`, with activations
//! quantized to int8 for integer dot products.
//!
//! Formats (one scale set per block of k, per output row):
//! - `Q8`: value = d * c, c in [-127, 127], one f32 scale d per 64 values (8.5 bits per weight).
//! - `Q80`: as Q8 with one f16 scale per 32 values (8.5 bits per weight, llama.cpp's Q8_0): the values
//!   of Q8_0 (and of Q5_0 and Q4_0, whose codes fit in int8 under the same f16 scale) carried over
//!   exactly from a GGUF file (`gguf.rs`).
//! - `Q4`: value = d * c + m, c in [0, 15], f16 d and f16 m per 32 values (5.0 bits per weight).
//! - `Q40`, `Q50`: value = d * (c - z), c in [0, 15] (z = 8) or [0, 31] (z = 16), one f16 d per 32
//!   values (4.5 and 5.5 bits per weight): llama.cpp's Q4_0 and Q5_0, so a GGUF file's tensors of those
//!   types run in their own bits (`gguf.rs`); the same 4-bit nibble layout as Q4, Q50's fifth bit in a
//!   bit plane (`QuantWeight::pack`).
//! - `Q4K`, `Q6K`: super-blocks of 256 values with 6-/8-bit scales per 32-value sub-block (4.5 and
//!   6.3125 bits per weight; layout and values in `kblock`); `Q6K16` as Q6K with an i8 scale per 16
//!   values (6.5625 bits per weight: llama.cpp's Q6_K, so a GGUF file's Q6_K tensors run as they are).
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
//! This file holds the formats (`Format`) and the module's public names; the parts live in
//! `quant/weight.rs` (`QuantRows`, `QuantWeight`), `quant/acts.rs` (`QActs`, `quantize_block`),
//! `quant/linear.rs` (the tiers, `quant_linear`, the split into tasks), `quant/job.rs` (what a tier's
//! kernels read, and the store of their sums), `quant/fit.rs` (the quantizers) and one file per tier.

mod acts;
mod generic;
mod job;
mod linear;
mod weight;
#[macro_use]
mod superblock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_rows;
#[cfg(target_arch = "x86_64")]
mod avx2_unpack;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avxvnni;
mod f16;
mod fit;
mod fit_k;
pub mod gguf;
pub mod grid;
pub mod kblock;

pub(crate) use acts::{block_scale, ActsOut};
pub use acts::{quantize_activations, quantize_block, BlockCodes, QActs, LO};
pub use f16::{f16_to_f32, f32_to_f16};
pub use fit::{quantize, QuantOptions};
pub(crate) use job::{store, Job};
pub use linear::{
    kernel_name, quant_linear, quant_linear_amx_emulated, quant_linear_group,
    quant_linear_vnni_emulated, super_amx_products_run, super_min_rows, super_unpacked_panels_run,
    GroupItem,
};
pub use weight::{QuantRows, QuantWeight};

/// Output rows per packed panel (one 512-bit vector of i32 sums).
pub const QPANEL: usize = 16;
/// Activation block, and the unit every kernel's inner loop covers.
pub const QSUB: usize = 32;

/// A weight format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    Q8,
    Q80,
    Q4,
    Q4K,
    Q6K,
    Q40,
    Q50,
    Q6K16,
}

impl Format {
    pub const ALL: [Format; 8] = [
        Format::Q8,
        Format::Q80,
        Format::Q4,
        Format::Q4K,
        Format::Q6K,
        Format::Q40,
        Format::Q50,
        Format::Q6K16,
    ];

    /// Values of k sharing one scale (the super-block formats: one top-level scale).
    pub const fn block(self) -> usize {
        match self {
            Format::Q8 => 64,
            Format::Q80 | Format::Q4 | Format::Q40 | Format::Q50 => 32,
            Format::Q4K | Format::Q6K | Format::Q6K16 => kblock::SUPER,
        }
    }

    /// What k must be a multiple of (the super-block formats end a row in a shorter super-block).
    pub const fn granule(self) -> usize {
        match self {
            Format::Q8 => 64,
            _ => QSUB,
        }
    }

    /// Whether values are 8-bit codes under one scale per block (Q8, Q80: the same kernels; Q80's scales
    /// are f16).
    pub const fn is_q8(self) -> bool {
        matches!(self, Format::Q8 | Format::Q80)
    }

    /// The zero point of the formats whose codes c stand for `d * (c - z)` under one f16 d per 32 values
    /// (Q40: 8, Q50: 16); None for the others.
    pub const fn zero_point(self) -> Option<i32> {
        match self {
            Format::Q40 => Some(8),
            Format::Q50 => Some(16),
            _ => None,
        }
    }

    /// Whether a block's codes are Q4's nibbles (Q4, Q40, Q50; Q50 adds a fifth bit from its bit plane).
    pub const fn is_nibbles(self) -> bool {
        matches!(self, Format::Q4 | Format::Q40 | Format::Q50)
    }

    /// Whether values are stored in super-blocks (`kblock`).
    pub const fn is_super(self) -> bool {
        matches!(self, Format::Q4K | Format::Q6K | Format::Q6K16)
    }

    /// Whether values are Q6K's 6-bit codes (Q6K, Q6K16: the same code layout, scales per 32 or 16).
    pub const fn is_q6(self) -> bool {
        matches!(self, Format::Q6K | Format::Q6K16)
    }

    /// Byte offset of a Q8 / Q80 / Q4 / Q40 / Q50 block's codes, after its 16 rows' scales (Q8: f32;
    /// Q80, Q40, Q50: f16; Q4: f16 scales, then f16 mins).
    pub(crate) const fn codes_at(self) -> usize {
        match self {
            Format::Q80 | Format::Q40 | Format::Q50 => QPANEL * 2,
            _ => 64,
        }
    }

    /// Byte offset of a Q50 block's bit plane of fifth bits, after its nibbles.
    pub(crate) const fn high_bits_at(self) -> usize {
        self.codes_at() + QPANEL * 16
    }

    /// A Q8 / Q80 block's scale of row `r` of its panel (`blk`: the block's bytes).
    #[inline(always)]
    pub(crate) fn q8_scale(self, blk: &[u8], r: usize) -> f32 {
        if self == Format::Q80 {
            f16_to_f32(u16::from_le_bytes([blk[2 * r], blk[2 * r + 1]]))
        } else {
            f32::from_le_bytes(blk[4 * r..4 * r + 4].try_into().unwrap())
        }
    }

    /// Bytes of one packed (full) block of a panel: scales first, then the codes.
    pub(crate) const fn block_bytes(self) -> usize {
        match self {
            Format::Q8 => QPANEL * 4 + QPANEL * 64,
            Format::Q80 => QPANEL * 2 + QPANEL * 32,
            Format::Q4 => QPANEL * 2 * 2 + QPANEL * 16,
            Format::Q40 => QPANEL * 2 + QPANEL * 16,
            Format::Q50 => QPANEL * 2 + QPANEL * 16 + QPANEL * 4,
            Format::Q4K | Format::Q6K | Format::Q6K16 => kblock::super_bytes(self, kblock::SUBS),
        }
    }

    /// Bytes of one panel of 16 rows of k values.
    pub(crate) fn panel_bytes(self, k: usize) -> usize {
        if self.is_super() {
            kblock::Layout::new(self, k).panel_bytes
        } else {
            k / self.block() * self.block_bytes()
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Q8 => "q8",
            Format::Q80 => "q8_0",
            Format::Q4 => "q4",
            Format::Q4K => "q4k",
            Format::Q6K => "q6k",
            Format::Q40 => "q4_0",
            Format::Q50 => "q5_0",
            Format::Q6K16 => "q6_k",
        }
    }

    /// Bits per weight of whole blocks (a shorter last super-block costs a little more).
    pub fn bits_per_weight(self) -> f64 {
        (self.block_bytes() * 8) as f64 / (QPANEL * self.block()) as f64
    }

    /// Bytes per row of a super-block of `t` sub-blocks of 32 (its header included; `t` = 8 is a whole
    /// one); None for the formats without super-blocks. What a row whose length is not a multiple of 256
    /// costs: whole super-blocks, then one of `t` sub-blocks.
    pub fn super_row_bytes(self, t: usize) -> Option<usize> {
        (self.is_super() && t <= kblock::SUBS).then(|| kblock::super_bytes(self, t) / QPANEL)
    }
}
