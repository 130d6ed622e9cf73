//! 8-bit and 4-bit weights and their linear, `y = x @ dequant(w)^T + bias`, with activations
//! quantized to int8 for integer dot products.
//!
//! Formats (one scale set per block of k, per output row):
//! - `Q8`: value = d * c, c in [-127, 127], one f32 scale d per 64 values (8.5 bits per weight).
//! - `Q80`: as Q8 with one f16 scale per 32 values (8.5 bits per weight, llama.cpp's Q8_0): the values
//!   of Q8_0 (and of Q5_0 and Q4_0, whose codes fit in int8 under the same f16 scale) carried over
//!   exactly from a GGUF file (`gguf.rs`).
//! - `Q4`: value = d * c + m, c in [0, 15], f16 d and f16 m per 32 values (5.0 bits per weight).
//! - `Q4K`, `Q6K`: super-blocks of 256 values with 6-/8-bit scales per 32-value sub-block (4.5 and
//!   6.3125 bits per weight; layout and values in `kblock`).
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
//! `d * (dot * dx')` (Q8) or `(d * dot + m * sum(q)) * dx` (Q4) to an f32 accumulator, in k order; the
//! bias last. Tiers differ from the scalar reference only in fused multiply-add rounding, so the result is
//! a float linear of the dequantized weights and the rounded activations, up to f32 rounding.
//!
//! Q4K and Q6K read the same per-32 codes; `superblock.rs` states their contract (a fixed fused-float
//! epilogue per sub-block), under which every tier, tile and thread split gives the scalar tier's bits.

mod acts;
mod generic;
#[macro_use]
mod superblock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_rows;
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

use std::cell::RefCell;
use std::ops::Range;

pub use acts::quantize_activations;
use acts::quantize_par;
pub(crate) use acts::ActsOut;
pub use f16::{f16_to_f32, f32_to_f16};
pub use fit::{quantize, QuantOptions};

use crate::isa::Isa;
use crate::par::{chunk_ranges, run_tasks, Parallel, SyncPtr};

/// Output rows per packed panel (one 512-bit vector of i32 sums).
pub const QPANEL: usize = 16;
/// Activation block, and the unit every kernel's inner loop covers.
pub const QSUB: usize = 32;
/// Below this many multiply-adds per task, splitting further costs more than it saves.
const MIN_MACS_PER_TASK: usize = 1 << 17;

/// A weight format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    Q8,
    Q80,
    Q4,
    Q4K,
    Q6K,
}

impl Format {
    pub const ALL: [Format; 5] = [
        Format::Q8,
        Format::Q80,
        Format::Q4,
        Format::Q4K,
        Format::Q6K,
    ];

    /// Values of k sharing one scale (the super-block formats: one top-level scale).
    pub const fn block(self) -> usize {
        match self {
            Format::Q8 => 64,
            Format::Q80 | Format::Q4 => 32,
            Format::Q4K | Format::Q6K => kblock::SUPER,
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

    /// Whether values are stored in super-blocks (`kblock`).
    pub const fn is_super(self) -> bool {
        matches!(self, Format::Q4K | Format::Q6K)
    }

    /// Byte offset of a Q8 / Q80 / Q4 block's codes, after its 16 rows' scales (Q8: f32; Q80: f16; Q4:
    /// f16 scales, then f16 mins).
    pub(crate) const fn codes_at(self) -> usize {
        match self {
            Format::Q80 => QPANEL * 2,
            _ => 64,
        }
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
            Format::Q4K | Format::Q6K => kblock::super_bytes(self, kblock::SUBS),
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

/// The reference form: `codes[j * k + kk]` (Q8 and Q80 stored as `c + 128`, Q6K as `c + 32`),
/// `scales[j * nb + b]`, `mins[j * nb + b]` (Q4 and Q4K; f16-representable, as Q4's scales; Q4K's
/// min is subtracted), with nb = ceil(k / block); the super-block formats' sub-block scales
/// `subs[j * k / 32 + s]` (Q6K, an i8 as u8) or `subs[2 (j * k / 32 + s) + {0, 1}]` (Q4K's sc, mc).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantRows {
    pub format: Format,
    pub n: usize,
    pub k: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub mins: Vec<f32>,
    pub subs: Vec<u8>,
}

impl QuantRows {
    /// All-zero codes and scales for an [n, k] matrix (k a multiple of the format's granule).
    pub fn zeros(format: Format, n: usize, k: usize) -> QuantRows {
        let nb = k.div_ceil(format.block());
        let subs = if format.is_super() {
            n * (k / QSUB) * kblock::subs_per_block(format)
        } else {
            0
        };
        QuantRows {
            format,
            n,
            k,
            codes: vec![0; n * k],
            scales: vec![0.0; n * nb],
            mins: if matches!(format, Format::Q4 | Format::Q4K) {
                vec![0.0; n * nb]
            } else {
                Vec::new()
            },
            subs: vec![0; subs],
        }
    }

    /// Matrices of one format and k stacked by rows (a fused projection's parts).
    pub fn stack(parts: Vec<QuantRows>) -> QuantRows {
        let mut it = parts.into_iter();
        let mut q = it.next().expect("stack: at least one part");
        for p in it {
            assert!(
                p.format == q.format && p.k == q.k,
                "stack: parts differ in format or k"
            );
            q.n += p.n;
            q.codes.extend(p.codes);
            q.scales.extend(p.scales);
            q.mins.extend(p.mins);
            q.subs.extend(p.subs);
        }
        q
    }

    /// Row-major [n, k] f32 values the codes stand for.
    pub fn dequantize(&self) -> Vec<f32> {
        let nb = self.k.div_ceil(self.format.block());
        let mut out = vec![0.0f32; self.n * self.k];
        for (i, o) in out.iter_mut().enumerate() {
            let (j, kk) = (i / self.k, i % self.k);
            if self.format.is_super() {
                *o = kblock::value(self, j, kk);
                continue;
            }
            let b = j * nb + kk / self.format.block();
            let c = self.codes[i] as f32;
            *o = match self.format {
                Format::Q8 | Format::Q80 => self.scales[b] * (c - 128.0),
                _ => self.scales[b] * c + self.mins[b],
            };
        }
        out
    }
}

/// Panel-packed quantized [n, k] weights.
#[derive(Clone, Debug)]
pub struct QuantWeight {
    pub format: Format,
    n: usize,
    k: usize,
    data: Vec<u8>,
}

impl QuantWeight {
    /// Packs the reference form. Panel p, block b starts at byte `(p * nb + b) * block_bytes`:
    /// - Q8: 16 f32 scales, then for each 32-k half and each group of 4 k, 16 rows x 4 codes
    ///   (`c + 128`; one 64-byte vector holds 4 consecutive k of 16 rows, as `vpdpbusd` reads them).
    ///   Q80: 16 f16 scales, then the codes as Q8's with one 32-k half per block.
    /// - Q4: 16 f16 scales, 16 f16 mins, then for each group g of 8 k, 16 rows x 4 bytes whose low
    ///   nibbles are k = 8g..8g+3 and high nibbles k = 8g+4..8g+7.
    ///
    /// Rows past n are zero weights (Q8 code 128, scale 0; Q4 code 0, scale 0, min 0).
    pub fn pack(q: &QuantRows) -> QuantWeight {
        let (f, n, k) = (q.format, q.n, q.k);
        assert!(
            k > 0 && k.is_multiple_of(f.granule()),
            "pack: k = {k} is not a positive multiple of the {} block",
            f.name()
        );
        let z = QuantRows::zeros(f, n, k);
        assert!(
            q.codes.len() == z.codes.len()
                && q.scales.len() == z.scales.len()
                && q.mins.len() == z.mins.len()
                && q.subs.len() == z.subs.len(),
            "pack: codes/scales/mins lengths do not match [{n}, {k}]"
        );
        if f.is_super() {
            let data = kblock::pack(q);
            return QuantWeight {
                format: f,
                n,
                k,
                data,
            };
        }
        let nb = k / f.block();
        let panels = n.div_ceil(QPANEL);
        let bb = f.block_bytes();
        let mut data = vec![0u8; panels * nb * bb];
        for p in 0..panels {
            for b in 0..nb {
                let blk = &mut data[(p * nb + b) * bb..(p * nb + b + 1) * bb];
                for r in 0..QPANEL {
                    let j = p * QPANEL + r;
                    let live = j < n;
                    let code = |kk: usize| -> u8 {
                        match (live, f) {
                            (true, _) => q.codes[j * k + b * f.block() + kk],
                            (false, Format::Q8 | Format::Q80) => 128,
                            (false, _) => 0,
                        }
                    };
                    let s = if live { q.scales[j * nb + b] } else { 0.0 };
                    match f {
                        Format::Q8 | Format::Q80 => {
                            if f == Format::Q80 {
                                debug_assert_eq!(
                                    f16_to_f32(f32_to_f16(s)),
                                    s,
                                    "q8_0 scales are f16"
                                );
                                blk[r * 2..r * 2 + 2].copy_from_slice(&f32_to_f16(s).to_le_bytes());
                            } else {
                                blk[r * 4..r * 4 + 4].copy_from_slice(&s.to_le_bytes());
                            }
                            for kk in 0..f.block() {
                                blk[f.codes_at() + (kk / 4) * 64 + r * 4 + kk % 4] = code(kk);
                            }
                        }
                        _ => {
                            let m = if live { q.mins[j * nb + b] } else { 0.0 };
                            blk[r * 2..r * 2 + 2].copy_from_slice(&f32_to_f16(s).to_le_bytes());
                            blk[32 + r * 2..34 + r * 2]
                                .copy_from_slice(&f32_to_f16(m).to_le_bytes());
                            for g in 0..4 {
                                for t in 0..4 {
                                    let byte = code(g * 8 + t) | (code(g * 8 + 4 + t) << 4);
                                    blk[64 + g * 64 + r * 4 + t] = byte;
                                }
                            }
                        }
                    }
                }
            }
        }
        QuantWeight {
            format: f,
            n,
            k,
            data,
        }
    }

    /// The reference form back (the inverse of `pack`).
    pub fn unpack(&self) -> QuantRows {
        let (f, n, k) = (self.format, self.n, self.k);
        if f.is_super() {
            return kblock::unpack(f, n, k, &self.data);
        }
        let nb = k / f.block();
        let mut q = QuantRows::zeros(f, n, k);
        for j in 0..n {
            for b in 0..nb {
                q.scales[j * nb + b] = self.scale(j, b);
                if f == Format::Q4 {
                    q.mins[j * nb + b] = self.min(j, b);
                }
            }
            for kk in 0..k {
                q.codes[j * k + kk] = self.code(j, kk);
            }
        }
        q
    }

    fn block_of(&self, j: usize, b: usize) -> &[u8] {
        let nb = self.k / self.format.block();
        let bb = self.format.block_bytes();
        let at = ((j / QPANEL) * nb + b) * bb;
        &self.data[at..at + bb]
    }

    fn scale(&self, j: usize, b: usize) -> f32 {
        let (blk, r) = (self.block_of(j, b), j % QPANEL);
        match self.format {
            Format::Q8 | Format::Q80 => self.format.q8_scale(blk, r),
            _ => f16_to_f32(u16::from_le_bytes([blk[r * 2], blk[r * 2 + 1]])),
        }
    }

    fn min(&self, j: usize, b: usize) -> f32 {
        let (blk, r) = (self.block_of(j, b), j % QPANEL);
        f16_to_f32(u16::from_le_bytes([blk[32 + r * 2], blk[33 + r * 2]]))
    }

    fn code(&self, j: usize, kk: usize) -> u8 {
        let bs = self.format.block();
        let (blk, r, t) = (self.block_of(j, kk / bs), j % QPANEL, kk % bs);
        match self.format {
            Format::Q8 | Format::Q80 => blk[self.format.codes_at() + (t / 4) * 64 + r * 4 + t % 4],
            _ => {
                let (g, h, u) = (t / 8, (t % 8) / 4, t % 4);
                (blk[64 + g * 64 + r * 4 + u] >> (4 * h)) & 0x0f
            }
        }
    }

    /// Rebuilds packed weights from their bytes (a saved decoder), checking the length and that every
    /// scale and min is finite (a corrupted file is refused, not run).
    pub fn from_packed(
        format: Format,
        n: usize,
        k: usize,
        data: Vec<u8>,
    ) -> Result<QuantWeight, String> {
        if k == 0 || !k.is_multiple_of(format.granule()) {
            return Err(format!(
                "k = {k} is not a multiple of the {} block",
                format.name()
            ));
        }
        let want = n
            .div_ceil(QPANEL)
            .checked_mul(format.panel_bytes(k))
            .ok_or_else(|| format!("a [{n}, {k}] matrix is too large"))?;
        if data.len() != want {
            return Err(format!(
                "{} bytes of {} data for a [{n}, {k}] matrix, expected {want}",
                data.len(),
                format.name()
            ));
        }
        if format.is_super() {
            kblock::check_finite(format, n, k, &data)?;
            return Ok(QuantWeight { format, n, k, data });
        }
        let w = QuantWeight { format, n, k, data };
        let nb = k / format.block();
        for j in 0..n {
            for b in 0..nb {
                let min = if format == Format::Q4 {
                    w.min(j, b)
                } else {
                    0.0
                };
                if !w.scale(j, b).is_finite() || !min.is_finite() {
                    return Err(format!("row {j} block {b} has a non-finite scale or min"));
                }
            }
        }
        Ok(w)
    }

    /// The packed bytes (what `from_packed` takes back).
    pub fn packed_bytes(&self) -> &[u8] {
        &self.data
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes one pass over the matrix reads (padding included).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    pub(crate) fn data(&self) -> &[u8] {
        &self.data
    }

    /// Row j dequantized (an embedding lookup).
    pub fn row_f32(&self, j: usize, out: &mut [f32]) {
        if self.format.is_super() {
            kblock::row_f32(self.format, self.k, &self.data, j, out);
            return;
        }
        let bs = self.format.block();
        for (kk, o) in out[..self.k].iter_mut().enumerate() {
            let (s, c) = (self.scale(j, kk / bs), self.code(j, kk) as f32);
            *o = match self.format {
                Format::Q8 | Format::Q80 => s * (c - 128.0),
                _ => s * c + self.min(j, kk / bs),
            };
        }
    }
}

/// x rows quantized per 32-block, `[m, k]` codes and `[m, k/32]` per-block values:
/// - `q`, `d`, `s`: x ~ d * q (int8 codes, d = max|x| / 127, s = sum of q, kept as an f32, exact as
///   |s| <= 32 * 127, so that a Q4 kernel's per-block epilogue broadcasts it without a conversion), what
///   Q4 matrices read;
/// - plus `q2`, `d_fine`, `s_fine`: the residual's codes, so that x ~ d_fine * (254 * q + q2) with
///   d_fine = d / 254 (about 15 bits; s_fine = 254 * s + sum of q2), what Q8 matrices read;
/// - `fine`: 254 * q + q2 as one i16 per value (|.| <= 32385), written by the AVX2 tier only (its Q8
///   kernel multiplies i16 pairs with `vpmaddwd`, one product per weight instead of two), empty
///   otherwise.
#[derive(Default)]
pub struct QActs {
    pub q: Vec<i8>,
    pub q2: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub d_fine: Vec<f32>,
    pub s_fine: Vec<i32>,
    pub fine: Vec<i16>,
}

/// One 32-block's scales and sums (see `QActs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockCodes {
    pub d: f32,
    pub s: i32,
    pub d_fine: f32,
    pub s_fine: i32,
}

/// Weight of the coarse codes in the fine representation: x ~ d_fine * (LO * q + q2).
pub const LO: i32 = 254;

/// One 32-block of activations: the reference every tier matches bit for bit. q = round_ties_even(x *
/// (127 / max|x|)); the residual r = x - q * d (a plain multiply and subtract) gives q2 =
/// round_ties_even(r * (254 * 127 / max|x|)), both clamped to [-127, 127]. A block so small that
/// 127 / max|x| overflows (below ~3.7e-37) is coded as zeros. Non-finite activations (only from
/// non-finite inputs: weights are checked finite) have no defined codes and may differ between tiers.
pub fn quantize_block(x: &[f32], q: &mut [i8], q2: &mut [i8]) -> BlockCodes {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let (d, id) = block_scale(amax);
    let id2 = id * LO as f32;
    let (mut s, mut s2) = (0, 0);
    for ((o, o2), &v) in q.iter_mut().zip(q2.iter_mut()).zip(x) {
        let c = (v * id).round_ties_even().clamp(-127.0, 127.0);
        let r = v - c * d;
        let c2 = (r * id2).round_ties_even().clamp(-127.0, 127.0);
        (*o, *o2) = (c as i8, c2 as i8);
        s += c as i32;
        s2 += c2 as i32;
    }
    BlockCodes::new(d, s, s2)
}

/// A block's scale and inverse scale from its max |x|: the rule every tier shares (zeros when
/// 127 / max|x| is not finite).
#[inline]
pub(crate) fn block_scale(amax: f32) -> (f32, f32) {
    if amax > 0.0 && (127.0 / amax).is_finite() {
        (amax / 127.0, 127.0 / amax)
    } else {
        (0.0, 0.0)
    }
}

impl BlockCodes {
    /// From the coarse scale and the sums of the coarse and residual codes.
    #[inline]
    pub(crate) fn new(d: f32, s: i32, s2: i32) -> BlockCodes {
        BlockCodes {
            d,
            s,
            d_fine: d / LO as f32,
            s_fine: LO * s + s2,
        }
    }
}

/// One call's inputs, as every tier's `panels` reads them.
pub(crate) struct Job<'a> {
    pub acts: &'a QActs,
    pub m: usize,
    pub w: &'a QuantWeight,
    pub bias: Option<&'a [f32]>,
    /// Points at m * n f32s.
    pub y: SyncPtr<f32>,
}

impl<'a> Job<'a> {
    /// A call's job: y (m * n values) written through a raw pointer by the tasks, each its own columns.
    pub(crate) fn new(
        acts: &'a QActs,
        m: usize,
        w: &'a QuantWeight,
        bias: Option<&'a [f32]>,
        y: &'a mut [f32],
    ) -> Job<'a> {
        let y = SyncPtr(y.as_mut_ptr());
        Job {
            acts,
            m,
            w,
            bias,
            y,
        }
    }

    /// Walks `panels` and, in each, the rows in tiles of at most `mr`: `tile(p, i0, rows)` runs one
    /// (every tier's `panels` loop).
    #[inline(always)]
    pub(crate) fn for_each_tile(
        &self,
        panels: Range<usize>,
        mr: usize,
        mut tile: impl FnMut(usize, usize, usize),
    ) {
        for p in panels {
            let mut i0 = 0;
            while i0 < self.m {
                let rows = (self.m - i0).min(mr);
                tile(p, i0, rows);
                i0 += rows;
            }
        }
    }

    /// Row i0's activation codes (rows k apart) and its per-32 scales and code sums (rows k / 32
    /// apart).
    ///
    /// # Safety
    /// i0 < m, and the activations hold the job's m rows.
    #[inline(always)]
    pub(crate) unsafe fn row_codes(&self, i0: usize) -> (*const i8, &'a [f32], &'a [f32]) {
        let (a, k) = (self.acts, self.w.k());
        let nsub = k / QSUB;
        (
            a.q.as_ptr().add(i0 * k),
            &a.d[i0 * nsub..],
            &a.s[i0 * nsub..],
        )
    }
}

type PanelFn = unsafe fn(&Job<'_>, Range<usize>);
type QuantizeFn = unsafe fn(&[f32], ActsOut);

/// A tier's kernels: `panels` over activations from `quantize` (which also writes `QActs::fine` where
/// `fine`), and the super-block formats' path (`sup`; None: `panels` runs them too, the AVX2 tier's own).
struct Tier {
    panels: PanelFn,
    quantize: QuantizeFn,
    name: &'static str,
    fine: bool,
    sup: Option<&'static superblock::Kernels>,
}

impl Tier {
    /// Panels a task's range should be a multiple of: the super-block path's unpacked group, so that no
    /// task ends in a group cut short (its tiles are widest on whole groups).
    fn panel_align(&self, w: &QuantWeight, m: usize) -> usize {
        match self.sup {
            Some(k) if w.format.is_super() && m >= k.min_rows => k.panels,
            _ => 1,
        }
    }

    /// The job's panel ranges, one per task: as many tasks as threads, but at most one per
    /// `MIN_MACS_PER_TASK` multiply-adds, each a multiple of `panel_align` panels.
    fn chunks(&self, par: &dyn Parallel, job: &Job<'_>) -> Vec<Range<usize>> {
        let (m, n, k) = (job.m, job.w.n, job.w.k);
        let want = par
            .num_threads()
            .clamp(1, (m * n * k / MIN_MACS_PER_TASK).max(1));
        chunk_ranges(n.div_ceil(QPANEL), want, self.panel_align(job.w, m))
    }

    /// Runs the job's panels `panels` with the kernels of its matrix's format.
    ///
    /// # Safety
    /// The CPU runs the tier; `job` satisfies `quant_linear`'s contract with activations quantized for
    /// its format by this tier; no other thread writes these panels' columns.
    unsafe fn run(&self, job: &Job<'_>, panels: Range<usize>) {
        match self.sup {
            Some(k) if job.w.format.is_super() => superblock::run(k, job, panels),
            _ => (self.panels)(job, panels),
        }
    }
}

/// The kernels for `isa`: AVX-512 with VNNI (`vpdpbusd`), else AVX-VNNI (256-bit `vpdpbusd`), else
/// AVX2 (`vpmaddubsw`; it also serves AVX-512 CPUs without VNNI), else scalar.
fn tier(isa: Isa) -> Tier {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 && avx512::usable() {
            // On AMX-INT8 CPUs the super-block formats' prompts run on its tiles; all else as AVX-512.
            let amx = isa >= Isa::Amx && crate::amx::int8::usable();
            return Tier {
                panels: avx512::panels,
                quantize: avx512::quantize_rows,
                name: if amx { "amx-int8" } else { "avx512vnni" },
                fine: false,
                sup: Some(if amx {
                    &superblock::amx::KERNELS
                } else {
                    &superblock::avx512::KERNELS
                }),
            };
        }
        if isa >= Isa::Avx2 && avx2::usable() {
            // The AVX2 quantizer (with the i16 fine codes) under the AVX-VNNI kernels where the CPU
            // has them, else the AVX2 ones (whose super-block path is their own: no `sup`).
            let vnni = isa >= Isa::AvxVnni && avxvnni::usable();
            return Tier {
                panels: if vnni {
                    avxvnni::real::panels
                } else {
                    avx2::panels
                },
                quantize: avx2::quantize_rows,
                name: if vnni { "avxvnni" } else { "avx2" },
                fine: true,
                sup: vnni.then_some(&avxvnni::real::sup::KERNELS),
            };
        }
    }
    let _ = isa;
    Tier {
        panels: generic::panels,
        quantize: generic::quantize_rows,
        name: "generic",
        fine: false,
        sup: Some(&superblock::generic::KERNELS),
    }
}

/// Panels the calling thread has run through a many-rows path of the super-block formats (each panel's
/// super-blocks unpacked once for all rows: `quant/superblock.rs`, the AVX2 tier's `quant/avx2_rows.rs`):
/// how tests prove it ran.
pub fn super_unpacked_panels_run() -> usize {
    #[cfg(target_arch = "x86_64")]
    return superblock::unpacked_panels_run() + avx2_rows::panels_run();
    #[cfg(not(target_arch = "x86_64"))]
    superblock::unpacked_panels_run()
}

/// `quant_linear` with the super-block formats' AMX tier over an exact emulation of the AMX-INT8 tiles
/// (`tdpbsud`): how that tier's logic is tested on CPUs without AMX (where the CPU has it, the real
/// instructions run as the `amx` tier of `quant_linear`). Other formats run the scalar tier. Any CPU;
/// `simd_epilogue` takes the hardware tier's AVX-512 epilogue (panics without AVX-512) instead of the
/// scalar one.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn quant_linear_amx_emulated(
    simd_epilogue: bool,
    par: &dyn Parallel,
    x: &[f32],
    m: usize,
    w: &QuantWeight,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    if check(x, m, w, bias, y) {
        let sup: &'static superblock::Kernels = if simd_epilogue {
            assert!(
                cfg!(target_arch = "x86_64") && Isa::Avx512.is_supported(),
                "quant_linear_amx_emulated: the AVX-512 epilogue needs AVX-512"
            );
            #[cfg(target_arch = "x86_64")]
            {
                &superblock::amx::EMULATED_AVX512
            }
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!()
        } else {
            &superblock::amx::EMULATED
        };
        let emulated = Tier {
            sup: Some(sup),
            ..tier(Isa::Generic)
        };
        linear_with(Isa::Generic, &emulated, par, x, m, w, bias, y);
    }
}

/// Tile products (16 rows x one sub-block x one panel) the calling thread has run on the super-block
/// formats' AMX path, real or emulated: how tests prove it ran.
#[doc(hidden)]
pub fn super_amx_products_run() -> usize {
    superblock::amx::products_run()
}

/// Rows from which `isa`'s tier runs the super-block formats through its many-rows path.
pub fn super_min_rows(isa: Isa) -> usize {
    match tier(isa).sup {
        Some(k) => k.min_rows,
        #[cfg(target_arch = "x86_64")]
        None => avx2_rows::MIN_ROWS,
        #[cfg(not(target_arch = "x86_64"))]
        None => usize::MAX,
    }
}

/// The kernel family `quant_linear` runs for a tier on this CPU (for tests and logs).
pub fn kernel_name(isa: Isa) -> &'static str {
    tier(isa).name
}

thread_local! {
    /// Each calling thread's activation buffers, reused across calls.
    static ACTS: RefCell<QActs> = RefCell::new(QActs::default());
}

/// y[i, j] = sum_kk x[i, kk] * w[j, kk] (+ bias[j]) with w quantized and x quantized per 32-block
/// (see the module's contract). Panics (never UB) when a length disagrees with the shapes or `isa`
/// is not supported.
pub fn quant_linear(
    isa: Isa,
    par: &dyn Parallel,
    x: &[f32],
    m: usize,
    w: &QuantWeight,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    assert_supported(isa);
    if check(x, m, w, bias, y) {
        linear_with(isa, &tier(isa), par, x, m, w, bias, y);
    }
}

/// Panics unless the CPU runs `isa`.
fn assert_supported(isa: Isa) {
    let name = isa.name();
    assert!(
        isa.is_supported(),
        "quant_linear: tier {name} is not supported by this CPU"
    );
}

/// Panics (never UB) unless x, y and the bias have the lengths of an [m, k] x [n, k]^T linear;
/// returns whether there is anything to compute.
fn check(x: &[f32], m: usize, w: &QuantWeight, bias: Option<&[f32]>, y: &[f32]) -> bool {
    let (n, k, xl, yl) = (w.n, w.k, x.len(), y.len());
    assert!(
        xl == m * k,
        "quant_linear: x has {xl} elements, expected {m}*{k}"
    );
    assert!(
        yl == m * n,
        "quant_linear: y has {yl} elements, expected {m}*{n}"
    );
    let bias_fits = bias.is_none_or(|b| b.len() == n);
    assert!(bias_fits, "quant_linear: the bias must have {n} values");
    m > 0 && n > 0
}

/// The AVX-VNNI tier's kernels over an exact AVX2 emulation of `vpdpbusd`: how its logic is tested
/// on CPUs without AVX-VNNI (the instruction itself is tested where the CPU has it, as the
/// `avxvnni` tier of `quant_linear`). `quant_linear`'s contract; panics without AVX2.
#[doc(hidden)]
pub fn quant_linear_vnni_emulated(
    par: &dyn Parallel,
    x: &[f32],
    m: usize,
    w: &QuantWeight,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    assert!(
        cfg!(target_arch = "x86_64") && Isa::Avx2.is_supported(),
        "quant_linear_vnni_emulated needs AVX2"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if check(x, m, w, bias, y) {
            let emulated = Tier {
                panels: avxvnni::emulated::panels,
                sup: Some(&avxvnni::emulated::sup::KERNELS),
                ..tier(Isa::Avx2)
            };
            linear_with(Isa::Avx2, &emulated, par, x, m, w, bias, y);
        }
    }
}

/// `quant_linear` after its checks: x quantized by `isa`'s tier, then `kernels` over the panels.
#[allow(clippy::too_many_arguments)]
fn linear_with(
    isa: Isa,
    kernels: &Tier,
    par: &dyn Parallel,
    x: &[f32],
    m: usize,
    w: &QuantWeight,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    ACTS.with(|cell| {
        let mut acts = cell.borrow_mut();
        quantize_par(isa, par, x, w.k, &mut acts);
        let job = Job::new(&acts, m, w, bias, y);
        let chunks = kernels.chunks(par, &job);
        let task = |i: usize| {
            // SAFETY: supported tier, activations quantized for the format by it; chunks are disjoint
            // panel ranges, so each task writes its own columns of y; every length was checked above.
            unsafe { kernels.run(&job, chunks[i].clone()) }
        };
        run_tasks(par, chunks.len(), &task);
    });
}

/// One linear of a group: `y[..m * n] = x[..m * k] dequant(w)^T`, no bias.
pub struct GroupItem<'a> {
    pub x: &'a [f32],
    pub m: usize,
    pub w: &'a QuantWeight,
    pub y: &'a mut [f32],
}

thread_local! {
    /// A group's activation buffers, one per item, reused across calls.
    static GROUP_ACTS: RefCell<Vec<QActs>> = const { RefCell::new(Vec::new()) };
}

/// Several independent `quant_linear`s (a mixture's experts) in one parallel region: each item's rows
/// are quantized on the calling thread, then every item's panel ranges are tasks of one `run`. Each
/// item's result is bit-identical to `quant_linear` of that item alone (same codes, same kernels).
/// Panics (never UB) when a length disagrees with the shapes or `isa` is not supported.
pub fn quant_linear_group(isa: Isa, par: &dyn Parallel, items: &mut [GroupItem<'_>]) {
    assert_supported(isa);
    for it in items.iter() {
        check(it.x, it.m, it.w, None, it.y);
    }
    let kernels = tier(isa);
    GROUP_ACTS.with(|cell| {
        let mut acts = cell.borrow_mut();
        if acts.len() < items.len() {
            acts.resize_with(items.len(), QActs::default);
        }
        for (it, a) in items.iter().zip(acts.iter_mut()) {
            if it.m > 0 {
                quantize_activations(isa, it.x, a);
            }
        }
        let jobs: Vec<Job<'_>> = items
            .iter_mut()
            .zip(acts.iter())
            .map(|(it, a)| Job::new(a, it.m, it.w, None, it.y))
            .collect();
        // (job, panel range) tasks, each job split as quant_linear splits it.
        let mut tasks: Vec<(usize, Range<usize>)> = Vec::new();
        for (j, job) in jobs.iter().enumerate() {
            if job.m > 0 && job.w.n > 0 {
                tasks.extend(kernels.chunks(par, job).into_iter().map(|r| (j, r)));
            }
        }
        let task = |i: usize| {
            let (j, r) = &tasks[i];
            // SAFETY: supported tier; each job's chunks are disjoint panel ranges of its own y (the
            // items' outputs are distinct &mut slices), so no two tasks write the same element; every
            // length was checked above.
            unsafe { kernels.run(&jobs[*j], r.clone()) }
        };
        run_tasks(par, tasks.len(), &task);
    });
}

/// Adds the bias and stores one panel's 16 sums of row `i` (only the columns that exist).
///
/// # Safety
/// `job.y` points at m * n f32s and no other thread writes these columns.
#[inline]
pub(crate) unsafe fn store(job: &Job<'_>, i: usize, p: usize, sums: &[f32; QPANEL]) {
    let n = job.w.n;
    let j0 = p * QPANEL;
    let live = QPANEL.min(n - j0);
    // SAFETY: row i's columns j0..j0 + live are inside y's m * n values and only this task writes them.
    let dst = job.y.get().add(i * n + j0);
    match job.bias {
        Some(b) => {
            let y = std::slice::from_raw_parts_mut(dst, live);
            for ((o, &s), &bj) in y.iter_mut().zip(sums).zip(&b[j0..j0 + live]) {
                *o = s + bj;
            }
        }
        // A whole panel: one unaligned 64-byte move. Written as a fixed-size value, not a slice copy:
        // LLVM merged the two slice copies into one variable-length call to memcpy per panel and row,
        // which cost 5-6 % of an int4 prompt (perf, SmolLM2-135M shape, Zen 4).
        None if live == QPANEL => dst.cast::<[f32; QPANEL]>().write_unaligned(*sums),
        None => {
            for (c, &s) in sums[..live].iter().enumerate() {
                dst.add(c).write(s);
            }
        }
    }
}
