//! Activation quantization into `QActs`: each tier's quantizers behind two entry points, per 32-block
//! (`quantize_activations`, what Q8 and Q4 matrices read) and per 256-value super-block
//! (`quantize_super_activations`, what Q4K and Q6K matrices read); a prompt's rows split across the pool
//! (`quantize_par`); and the raw views (`ActsOut`, `SuperOut`) through which several threads write one
//! buffer.
//!
//! Numerical contract: every 32-block (`quantize_block`) or super-block (`quantize_super`) is quantized
//! alone, bit-identical to the scalar reference in every tier, so the codes do not depend on the tier or
//! on how rows are split across threads.

use super::kblock::{SUBS, SUPER};
use super::{block_scale, tier, BlockCodes, Format, QActs, QuantizeFn, QSUB};
use crate::isa::Isa;
use crate::par::{chunk_ranges, run_tasks, Parallel};

/// Where a tier's quantizer writes its x's block 0: raw pointers into a `QActs` sized by
/// `quantize_activations`, possibly offset to a later block (`at`), so that row ranges of one x are
/// quantized by several threads into one buffer. `fine` is null for tiers that do not write it.
#[derive(Clone, Copy)]
pub(crate) struct ActsOut {
    pub q: *mut i8,
    pub q2: *mut i8,
    pub fine: *mut i16,
    d: *mut f32,
    s: *mut f32,
    d_fine: *mut f32,
    s_fine: *mut i32,
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

/// Where a tier's super-block quantizer writes rows of k values: codes (`k` per row), scales
/// (`k.div_ceil(256)` per row) and sub-block sums (8 per scale) of row 0 of its x.
#[derive(Clone, Copy)]
pub(crate) struct SuperOut {
    pub q: *mut i8,
    pub d: *mut f32,
    pub bsums: *mut i16,
}

// SAFETY: a SuperOut is only shared by tasks that write disjoint row ranges of it (`quantize_par`).
unsafe impl Sync for SuperOut {}

impl SuperOut {
    fn of(acts: &mut QActs) -> SuperOut {
        SuperOut {
            q: acts.q.as_mut_ptr(),
            d: acts.sd.as_mut_ptr(),
            bsums: acts.bsums.as_mut_ptr(),
        }
    }

    /// The same buffers from row `r` (rows of k values) on.
    ///
    /// # Safety
    /// Row r lies inside the buffers.
    #[inline]
    pub(crate) unsafe fn row(self, r: usize, k: usize) -> SuperOut {
        let nsb = k.div_ceil(SUPER);
        SuperOut {
            q: self.q.add(r * k),
            d: self.d.add(r * nsb),
            bsums: self.bsums.add(r * nsb * SUBS),
        }
    }
}

/// A tier's super-block quantizer: x is whole rows of k values (k a multiple of 32).
pub(crate) type SuperQuantizeFn = unsafe fn(&[f32], usize, SuperOut);

/// One super-block of activations (`x.len()` a multiple of 32, at most 256): codes q =
/// round_ties_even(x * (127 / max|x|)) clamped to [-127, 127], the sums of each 32 codes in `bsums`
/// (zero past x's end), and the scale d = max|x| / 127 returned (zeros when 127 / max|x| is not finite,
/// as `quantize_block`). The reference every tier matches bit for bit.
pub fn quantize_super(x: &[f32], q: &mut [i8], bsums: &mut [i16; SUBS]) -> f32 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let (d, id) = block_scale(amax);
    *bsums = [0; SUBS];
    for (s, (qs, xs)) in q.chunks_mut(QSUB).zip(x.chunks(QSUB)).enumerate() {
        let mut sum = 0i32;
        for (o, &v) in qs.iter_mut().zip(xs) {
            let c = (v * id).round_ties_even().clamp(-127.0, 127.0);
            *o = c as i8;
            sum += c as i32;
        }
        // |sum| <= 32 * 127: an i16.
        bsums[s] = sum as i16;
    }
    d
}

/// The scalar tier's super-block quantizer (`quantize_super` per super-block of each row).
///
/// # Safety
/// `out` holds x's rows (`quantize_super_activations`) and no other thread writes them.
pub(crate) unsafe fn quantize_super_rows(x: &[f32], k: usize, out: SuperOut) {
    for (r, row) in x.chunks_exact(k).enumerate() {
        let o = out.row(r, k);
        for (b, xs) in row.chunks(SUPER).enumerate() {
            let q = std::slice::from_raw_parts_mut(o.q.add(b * SUPER), xs.len());
            let bs = &mut *o.bsums.add(b * SUBS).cast::<[i16; SUBS]>();
            *o.d.add(b) = quantize_super(xs, q, bs);
        }
    }
}

/// Quantizes x (rows of k, k a multiple of 32, `x.len()` a multiple of k) per 32-block into `acts`
/// with `isa`'s kernel: bit-identical to `quantize_block` in every tier.
pub fn quantize_activations(isa: Isa, x: &[f32], acts: &mut QActs) {
    let quantize = size_acts(isa, x, acts);
    // SAFETY: the tier is supported and every buffer was sized for x (size_acts).
    unsafe { quantize(x, ActsOut::of(acts)) };
}

/// Quantizes x (rows of k values, k a positive multiple of 32) per 256-value super-block of each row into
/// `acts` (`q`, `sd`, `bsums`) with `isa`'s kernel: bit-identical to `quantize_super` in every tier.
pub fn quantize_super_activations(isa: Isa, x: &[f32], k: usize, acts: &mut QActs) {
    let quantize = size_super(isa, x, k, acts);
    // SAFETY: the tier is supported and every buffer was sized for x's rows (size_super).
    unsafe { quantize(x, k, SuperOut::of(acts)) };
}

/// Checks x and `isa`, sizes `acts` for x, and returns the tier's quantizer.
fn size_acts(isa: Isa, x: &[f32], acts: &mut QActs) -> QuantizeFn {
    assert!(
        x.len().is_multiple_of(QSUB),
        "quantize_activations: {} values are not whole 32-blocks",
        x.len()
    );
    assert!(
        isa.is_supported(),
        "quantize_activations: tier {} is not supported by this CPU",
        isa.name()
    );
    let nsub = x.len() / QSUB;
    acts.q.resize(x.len(), 0);
    acts.q2.resize(x.len(), 0);
    for v in [&mut acts.d, &mut acts.s, &mut acts.d_fine] {
        v.resize(nsub, 0.0);
    }
    acts.s_fine.resize(nsub, 0);
    let t = tier(isa);
    if t.fine {
        acts.fine.resize(x.len(), 0);
    } else {
        acts.fine.clear();
    }
    t.quantize
}

/// `size_acts` for the super-block format.
fn size_super(isa: Isa, x: &[f32], k: usize, acts: &mut QActs) -> SuperQuantizeFn {
    assert!(
        k > 0 && k.is_multiple_of(QSUB) && x.len().is_multiple_of(k),
        "quantize_super_activations: {} values are not whole rows of k = {k} (a positive multiple of 32)",
        x.len()
    );
    assert!(
        isa.is_supported(),
        "quantize_super_activations: tier {} is not supported by this CPU",
        isa.name()
    );
    let nsb = x.len() / k * k.div_ceil(SUPER);
    acts.q.resize(x.len(), 0);
    acts.sd.resize(nsb, 0.0);
    acts.bsums.resize(nsb * SUBS, 0);
    tier(isa).sup.quantize
}

/// Values from which activation quantization is split across the pool (a task's share of a prompt's
/// rows; below it, waking the pool costs more than it saves).
const MIN_QUANT_VALUES_PER_TASK: usize = 1 << 15;

/// x's rows of k quantized as `format`'s matrices read them (per super-block for Q4K / Q6K, per 32-block
/// otherwise), row ranges on the pool's threads: the same codes (each block is quantized alone), written
/// into `acts` by disjoint tasks. A prompt's rows otherwise quantize on the calling thread while the
/// others wait (3-7 % of an int4 SmolLM2-135M prompt).
pub(super) fn quantize_par(
    isa: Isa,
    par: &dyn Parallel,
    x: &[f32],
    k: usize,
    format: Format,
    acts: &mut QActs,
) {
    let rows = x.len() / k;
    let parts = par
        .num_threads()
        .min(rows)
        .min(x.len() / MIN_QUANT_VALUES_PER_TASK);
    let sup = format.is_super();
    if parts <= 1 {
        return if sup {
            quantize_super_activations(isa, x, k, acts)
        } else {
            quantize_activations(isa, x, acts)
        };
    }
    let chunks = chunk_ranges(rows, parts, 1);
    if sup {
        let quantize = size_super(isa, x, k, acts);
        let out = SuperOut::of(acts);
        let task = |i: usize| {
            let r = &chunks[i];
            // SAFETY: supported tier, buffers sized for x (size_super); the chunks are disjoint row
            // ranges, so each task writes its own rows.
            unsafe { quantize(&x[r.start * k..r.end * k], k, out.row(r.start, k)) }
        };
        return run_tasks(par, chunks.len(), &task);
    }
    let quantize = size_acts(isa, x, acts);
    let out = ActsOut::of(acts);
    let task = |i: usize| {
        let r = &chunks[i];
        // SAFETY: supported tier, buffers sized for x (size_acts); the chunks are disjoint row ranges,
        // so each task writes its own blocks (k is a multiple of 32: rows start on block boundaries).
        unsafe { quantize(&x[r.start * k..r.end * k], out.at(r.start * k / QSUB)) }
    };
    run_tasks(par, chunks.len(), &task);
}
