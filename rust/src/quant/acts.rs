//! Activation quantization into `QActs`: the scalar reference of one 32-block (`quantize_block`, with
//! the scale rule every tier shares, `block_scale`), each tier's quantizer behind one entry point
//! (`quantize_activations`), a prompt's rows split across the pool (`quantize_par`, from the rows
//! themselves or from a gated MLP's gate/up output: `Source`), and the raw view (`ActsOut`) through
//! which several threads write one buffer.
//!
//! Numerical contract: every 32-block is quantized alone, bit-identical to `quantize_block` in every tier,
//! so the codes do not depend on the tier or on how rows are split across threads; a gated source's
//! rows are `vmath::act_mul`'s values, so their codes are those of the rows it would have written.

use std::ops::Range;

use super::linear::{tier, QuantizeFn};
use super::QSUB;
use crate::isa::Isa;
use crate::par::{chunk_ranges, run_tasks, Parallel};
use crate::scratch::with_scratch;
use crate::vmath::{self, Act};

/// Where a tier's quantizer writes its x's block 0: raw pointers into a `QActs` sized by
/// `quantize_activations`, possibly offset to a later block (`at`), so that row ranges of one x are
/// quantized by several threads into one buffer. `fine` is null for tiers that do not write it.
#[derive(Clone, Copy)]
pub(crate) struct ActsOut {
    pub q: *mut i8,
    pub q2: *mut i8,
    pub fine: *mut i16,
    pub d: *mut f32,
    pub s: *mut f32,
    pub d_fine: *mut f32,
    pub s_fine: *mut i32,
}

// SAFETY: an ActsOut is only shared by tasks that write disjoint block ranges of it (`quantize_par`).
unsafe impl Sync for ActsOut {}

impl ActsOut {
    fn of(acts: &mut QActs) -> ActsOut {
        ActsOut {
            q: acts.q.as_mut_ptr(),
            q2: acts.q2.as_mut_ptr(),
            fine: if acts.fine.is_empty() {
                std::ptr::null_mut()
            } else {
                acts.fine.as_mut_ptr()
            },
            d: acts.d.as_mut_ptr(),
            s: acts.s.as_mut_ptr(),
            d_fine: acts.d_fine.as_mut_ptr(),
            s_fine: acts.s_fine.as_mut_ptr(),
        }
    }

    /// The same buffers from block `b` on.
    ///
    /// # Safety
    /// Block b lies inside the buffers.
    unsafe fn at(self, b: usize) -> ActsOut {
        ActsOut {
            q: self.q.add(b * QSUB),
            q2: self.q2.add(b * QSUB),
            fine: if self.fine.is_null() {
                self.fine
            } else {
                self.fine.add(b * QSUB)
            },
            d: self.d.add(b),
            s: self.s.add(b),
            d_fine: self.d_fine.add(b),
            s_fine: self.s_fine.add(b),
        }
    }

    /// Stores block `b`'s scales and sums.
    ///
    /// # Safety
    /// Block b lies inside the buffers and no other thread writes it.
    #[inline]
    pub(crate) unsafe fn put(self, b: usize, c: BlockCodes) {
        *self.d.add(b) = c.d;
        *self.s.add(b) = c.s as f32;
        *self.d_fine.add(b) = c.d_fine;
        *self.s_fine.add(b) = c.s_fine;
    }
}

/// Quantizes x (rows of k, k a multiple of 32, `x.len()` a multiple of k) per 32-block into `acts`
/// with `isa`'s kernel: bit-identical to `quantize_block` in every tier.
pub fn quantize_activations(isa: Isa, x: &[f32], acts: &mut QActs) {
    let quantize = size_acts(isa, x.len(), acts);
    // SAFETY: the tier is supported and every buffer was sized for x (size_acts).
    unsafe { quantize(x, ActsOut::of(acts)) };
}

/// Checks the number of values and `isa`, sizes `acts` for that many, and returns the tier's quantizer.
fn size_acts(isa: Isa, values: usize, acts: &mut QActs) -> QuantizeFn {
    assert!(
        values.is_multiple_of(QSUB),
        "quantize_activations: {values} values are not whole 32-blocks"
    );
    assert!(
        isa.is_supported(),
        "quantize_activations: tier {} is not supported by this CPU",
        isa.name()
    );
    let nsub = values / QSUB;
    acts.q.resize(values, 0);
    acts.q2.resize(values, 0);
    for v in [&mut acts.d, &mut acts.s, &mut acts.d_fine] {
        v.resize(nsub, 0.0);
    }
    acts.s_fine.resize(nsub, 0);
    let t = tier(isa);
    if t.fine {
        acts.fine.resize(values, 0);
    } else {
        acts.fine.clear();
    }
    t.quantize
}

/// Where a linear's activation rows come from.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// The rows themselves, `[m][k]`.
    Rows(&'a [f32]),
    /// A gated MLP's hidden rows `act(gate) * up`, from its gate/up output `[m][2 k]` (gate first):
    /// each row is computed by `vmath::act_mul` into L1 scratch and quantized there, so the f32 rows
    /// are never written out and read back (6 KB a row per layer of SmolLM2's prompts).
    Gated { gu: &'a [f32], act: Act },
}

impl Source<'_> {
    /// Quantizes rows `rows` (of k) into `out` (the buffers of all m rows).
    ///
    /// # Safety
    /// `quantize` is a supported tier's (the one `isa` names), `out` was sized for the source's m rows
    /// of k (`size_acts`), and no other thread writes these rows' blocks.
    unsafe fn quantize(
        self,
        isa: Isa,
        quantize: QuantizeFn,
        k: usize,
        rows: Range<usize>,
        out: ActsOut,
    ) {
        match self {
            Source::Rows(x) => quantize(
                &x[rows.start * k..rows.end * k],
                out.at(rows.start * k / QSUB),
            ),
            Source::Gated { gu, act } => with_scratch(k, |h| {
                for i in rows {
                    let (g, u) = gu[i * 2 * k..(i + 1) * 2 * k].split_at(k);
                    vmath::act_mul(isa, act, g, u, h);
                    quantize(h, out.at(i * k / QSUB));
                }
            }),
        }
    }
}

/// Values from which activation quantization is split across the pool (a task's share of a prompt's
/// rows; below it, waking the pool costs more than it saves).
const MIN_QUANT_VALUES_PER_TASK: usize = 1 << 15;

/// m rows of k from `src` quantized into `acts` (as `quantize_activations` of those rows), row ranges on
/// the pool's threads: the same codes (each 32-block is quantized alone), written into `acts` by
/// disjoint tasks. A prompt's rows otherwise quantize on the calling thread while the others wait (3-7 %
/// of an int4 SmolLM2-135M prompt). k is a multiple of 32, `src` holds m rows (checked by the callers).
pub(super) fn quantize_par(
    isa: Isa,
    par: &dyn Parallel,
    src: Source<'_>,
    m: usize,
    k: usize,
    acts: &mut QActs,
) {
    let values = m * k;
    let parts = par
        .num_threads()
        .min(m)
        .min(values / MIN_QUANT_VALUES_PER_TASK)
        .max(1);
    let quantize = size_acts(isa, values, acts);
    let out = ActsOut::of(acts);
    if parts == 1 {
        // SAFETY: supported tier (size_acts), buffers sized for the m rows, one writer.
        return unsafe { src.quantize(isa, quantize, k, 0..m, out) };
    }
    let chunks = chunk_ranges(m, parts, 1);
    let task = |i: usize| {
        // SAFETY: supported tier, buffers sized for the m rows (size_acts); the chunks are disjoint row
        // ranges, so each task writes its own blocks (k is a multiple of 32: rows start on block boundaries).
        unsafe { src.quantize(isa, quantize, k, chunks[i].clone(), out) }
    };
    run_tasks(par, chunks.len(), &task);
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
/// - `tiled`, `tiled_d`, `tiled_s`: the same codes, scales and sums in the order the packed (decode-step)
///   super-block tiles read them (`tile_rows`), filled only for those calls of two rows or more.
#[derive(Default)]
pub struct QActs {
    pub q: Vec<i8>,
    pub q2: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub d_fine: Vec<f32>,
    pub s_fine: Vec<i32>,
    pub fine: Vec<i16>,
    pub tiled: Vec<i8>,
    pub tiled_d: Vec<f32>,
    pub tiled_s: Vec<f32>,
}

thread_local! {
    /// Calls whose activations the calling thread copied into the tiled layout (`QActs::tile_rows`).
    static TILED_RUN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Linears whose activations the calling thread tiled for the packed tiles: how tests prove a decode
/// step's tiles read the tiled layout.
#[doc(hidden)]
pub fn tiled_acts_run() -> usize {
    TILED_RUN.with(std::cell::Cell::get)
}

/// Rows per group of the tiled layout (`QActs::tile_rows`): the packed tiles' widest row tile.
pub(crate) const TILE_ROWS: usize = 8;

impl QActs {
    /// Copies m rows of k (quantized: `q`, `d`, `s`) into the tiled layout: rows in groups of
    /// `TILE_ROWS` (the last group the m % 8 left), and in a group of w rows starting at row j0, 32-block
    /// u of row j0 + r at codes `j0 * k + (u * w + r) * 32` and at scale / sum `j0 * k / 32 + u * w + r`.
    /// A tile of a group's rows then finds every row's codes of a 32-block at fixed offsets from one
    /// pointer (its broadcasts are memory operands with constant displacements, no address arithmetic
    /// or row pointers per row: a decode step's 8-row q4k tile spent more instructions on those than on
    /// its `vpdpbusd`). One row's tiled layout is its own, so one row is never copied. A copy only: the
    /// values are `q`, `d` and `s` unchanged.
    pub(crate) fn tile_rows(&mut self, m: usize, k: usize) {
        let nsub = k / QSUB;
        assert!(
            self.q.len() >= m * k && self.d.len() >= m * nsub,
            "tile_rows: activations hold fewer than {m} rows of {k}"
        );
        TILED_RUN.with(|c| c.set(c.get() + 1));
        self.tiled.resize(m * k, 0);
        self.tiled_d.resize(m * nsub, 0.0);
        self.tiled_s.resize(m * nsub, 0.0);
        for j0 in (0..m).step_by(TILE_ROWS) {
            let w = TILE_ROWS.min(m - j0);
            for r in 0..w {
                let row = j0 + r;
                for u in 0..nsub {
                    let (src, dst) = (row * k + u * QSUB, j0 * k + (u * w + r) * QSUB);
                    self.tiled[dst..dst + QSUB].copy_from_slice(&self.q[src..src + QSUB]);
                    let at = j0 * nsub + u * w + r;
                    self.tiled_d[at] = self.d[row * nsub + u];
                    self.tiled_s[at] = self.s[row * nsub + u];
                }
            }
        }
    }
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
