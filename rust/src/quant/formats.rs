//! The weight formats: `Format`, the table every layer reads (block sizes, packed bytes, bits, names;
//! exported through the ABI as `kwker_decoder_abi()`'s "quant" list, which `kwker_torch/decoder/plan.py` reads),
//! and one file per family of formats with its values, layout and quantizer:
//! - `formats/q8.rs`: Q8 and Q80 (8-bit codes under one scale per 64 or 32 values);
//! - `formats/q4.rs`: Q4, Q40 and Q50 (4- and 5-bit codes per 32 values, llama.cpp's Q4_1 / Q4_0 / Q5_0 class);
//! - `formats/q4k.rs`: Q4K (llama.cpp's Q4_K class: super-blocks of 256, 6-bit sub-block scales and mins);
//! - `formats/q6k.rs`: Q6K and Q6K16 (llama.cpp's Q6_K class).
//!
//! The super-block formats' shared packed layout is `kblock.rs`; the non-super formats' is `weight.rs`'s
//! `pack`. The scalar references every SIMD tier is tested against: `generic.rs` (Q8, Q80, Q4, Q40, Q50 on
//! the panel path) and `superblock/generic.rs` (the super-block path, which also runs the nibble formats'
//! prompts). GGUF types map onto these formats in `gguf.rs`. Adding a format: a variant here (and in
//! `ALL`), its quantizer in its family's file, its packing, and its kernels; the decoder's format names
//! (`decoder::weights::MatFormat`) and the ABI follow from `ALL`.

mod q4;
mod q4k;
mod q6k;
mod q8;

pub(crate) use q4::{fit_grid, fit_q4, fit_zero};
pub(crate) use q4k::fit_q4k;
pub(crate) use q6k::fit_q6k;
pub(crate) use q8::fit_q8;

use super::{f16_to_f32, kblock, QPANEL, QSUB};

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

    /// The format named `name` (`name`'s inverse), if any.
    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == name)
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
