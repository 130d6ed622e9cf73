//! What every part of a decoder step shares: the model it reads (`Model`), the rows of a window and where
//! they come from (`Row`, `Segment`), and the scratch activations kept between steps (`Scratch`).
//! Numerical contract: none (storage and bookkeeping only).

use std::ops::Range;

use super::recipe::{Limits, Recipe};
use super::rope::RopeTables;
use super::weights::Weights;

/// Values per task below which a prompt's per-row work stays on one thread.
pub(crate) const MIN_ROW_VALUES: usize = 1 << 14;

/// 16 f32s on one 64-byte cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([f32; 16]);

/// f32 storage that starts on a cache line, read and written as a slice: rows of a width that is a
/// multiple of 16 then start on lines too, so the prompt linears may stream whole lines of their outputs
/// past the caches (`quant::superblock`'s stores: on an Intel Xeon 7 % faster than plain stores in cache,
/// where the same stores on lines cut in two had cost a prompt 30 %).
#[derive(Default)]
pub struct Lines {
    buf: Vec<Line>,
    len: usize,
}

impl Lines {
    /// Grows to `n` values (new ones zero); never shrinks.
    pub fn grow(&mut self, n: usize) {
        if n > self.len {
            self.buf.resize(n.div_ceil(16), Line([0.0; 16]));
            self.len = n;
        }
    }
}

impl std::ops::Deref for Lines {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `buf` holds at least `len` initialised f32s (Line is 16 of them, repr(C)).
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast(), self.len) }
    }
}

impl std::ops::DerefMut for Lines {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as `deref`, and `&mut self` makes the slice the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast(), self.len) }
    }
}

/// Scratch activations for up to `rows` rows, grown on demand and kept between steps.
#[derive(Default)]
pub struct Scratch {
    /// The residual stream [rows][hidden].
    pub x: Lines,
    /// A sub-layer's normed input [rows][hidden].
    pub h: Lines,
    pub qkv: Lines,
    /// Attention output before o [rows][heads * head_dim].
    pub attn: Lines,
    /// The attention sub-layer's output [rows][hidden].
    pub a: Lines,
    /// The MLP's first projection [rows][up_rows].
    pub gu: Lines,
    pub act: Lines,
    /// The MLP sub-layer's output [rows][hidden].
    pub f: Lines,
    /// One sequence's attention output, [heads][tokens][head_dim].
    pub tmp: Lines,
    /// Embedding-width rows (token embeddings before proj_in; the lm_head input after proj_out).
    pub e: Lines,
    /// The rows whose logits are wanted, gathered from `x` ([rows][hidden]).
    pub fin: Lines,
    /// A sparse layer's router logits and per-expert rows.
    pub moe: MoeBufs,
    rows: usize,
}

impl Scratch {
    pub(crate) fn ensure(&mut self, r: &Recipe, rows: usize) {
        if rows <= self.rows {
            return;
        }
        let grow = |v: &mut Lines, w: usize| v.grow(rows * w);
        let h = r.hidden;
        for v in [
            &mut self.x,
            &mut self.h,
            &mut self.a,
            &mut self.f,
            &mut self.fin,
        ] {
            grow(v, h);
        }
        grow(&mut self.qkv, r.qkv_width());
        grow(&mut self.attn, r.q_width());
        grow(&mut self.gu, r.up_rows());
        grow(&mut self.act, r.intermediate);
        if let Some(moe) = r.moe {
            // An expert's rows (at most the window's) or a grouped step's picks (moe::GROUP_PICKS).
            let picks = rows * moe.top_k;
            let expert_rows = rows.max(picks.min(super::moe::GROUP_PICKS));
            let at_least = |v: &mut Lines, n: usize| v.grow(n);
            at_least(&mut self.gu, expert_rows * r.expert_up_rows());
            at_least(&mut self.act, expert_rows * moe.intermediate);
            self.moe.logits.resize(rows * moe.experts, 0.0);
            self.moe.rows_in.resize(rows * h * moe.top_k, 0.0);
            self.moe.rows_out.resize(rows * h * moe.top_k, 0.0);
        }
        grow(&mut self.tmp, r.q_width());
        grow(&mut self.e, r.embed_dim.max(h));
        self.rows = rows;
    }
}

/// Where each row of a window comes from: its slot, cache index and rotary position.
pub struct Row {
    pub slot: usize,
    pub index: usize,
    pub pos: usize,
}

/// A sequence's rows inside one window.
pub struct Segment {
    pub slot: usize,
    pub rows: Range<usize>,
    /// Cache index of the segment's first row.
    pub pos0: usize,
}

/// A window's rows (sequence after sequence) and its sequences' segments of them.
pub struct Window<'a> {
    pub rows: &'a [Row],
    pub segs: &'a [Segment],
}

/// Everything a step reads besides the activations.
pub struct Model<'a> {
    pub r: &'a Recipe,
    pub lim: &'a Limits,
    pub w: &'a Weights,
    pub ropes: &'a [RopeTables],
}

/// Scratch of a sparse layer, grown with the window (`Scratch` owns it).
#[derive(Default)]
pub struct MoeBufs {
    /// Router logits [rows][experts].
    pub logits: Vec<f32>,
    /// The window's rows gathered by expert [picks][hidden] (expert 0's rows first).
    pub rows_in: Vec<f32>,
    /// The experts' outputs in the same order [picks][hidden].
    pub rows_out: Vec<f32>,
    /// Expert linears run and rows run through them since the decoder was built (tests read them: a
    /// decode row runs its k experts once each, a prompt's rows share one run per expert).
    pub counts: ExpertCounts,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertCounts {
    /// Expert MLPs run (one per expert chosen in a window).
    pub runs: u64,
    /// Rows run through them (each row once per expert it chose).
    pub rows: u64,
    /// Linear calls the experts' matrices ran in: two per window when grouped (`GROUP_PICKS`), else
    /// two per expert run.
    pub calls: u64,
}
