//! One call's inputs as every tier's kernels read them (`Job`): the panel-and-row-tile walk the tiers
//! share, the rows' activation codes, and the store of a panel's sums into y (with the bias).
//!
//! Numerical contract: `store` adds the bias to each finished sum (one f32 addition, last) and writes
//! nothing else; the rest only finds the data.

use std::ops::Range;

use super::{QActs, QuantWeight, QPANEL, QSUB};
use crate::par::SyncPtr;

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
