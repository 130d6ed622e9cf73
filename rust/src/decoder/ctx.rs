//! What every part of a decoder step shares: the model it reads (`Model`), the rows of a window and where
//! they come from (`Row`, `Segment`), and the scratch activations kept between steps (`Scratch`).
//! Numerical contract: none (storage and bookkeeping only).

use std::ops::Range;

use super::recipe::{Limits, Recipe};
use super::rope::RopeTables;
use super::weights::Weights;

/// Values per task below which a prompt's per-row work stays on one thread.
pub(crate) const MIN_ROW_VALUES: usize = 1 << 14;

/// Scratch activations for up to `rows` rows, grown on demand and kept between steps.
#[derive(Default)]
pub struct Scratch {
    /// The residual stream [rows][hidden].
    pub x: Vec<f32>,
    /// A sub-layer's normed input [rows][hidden].
    pub h: Vec<f32>,
    pub qkv: Vec<f32>,
    /// Attention output before o [rows][heads * head_dim].
    pub attn: Vec<f32>,
    /// The attention sub-layer's output [rows][hidden].
    pub a: Vec<f32>,
    /// The MLP's first projection [rows][up_rows].
    pub gu: Vec<f32>,
    pub act: Vec<f32>,
    /// The MLP sub-layer's output [rows][hidden].
    pub f: Vec<f32>,
    /// One sequence's attention output, [heads][tokens][head_dim].
    pub tmp: Vec<f32>,
    /// Embedding-width rows (token embeddings before proj_in; the lm_head input after proj_out).
    pub e: Vec<f32>,
    /// The rows whose logits are wanted, gathered from `x` ([rows][hidden]).
    pub fin: Vec<f32>,
    /// A sparse layer's router logits and per-expert rows.
    pub moe: MoeBufs,
    rows: usize,
}

impl Scratch {
    pub(crate) fn ensure(&mut self, r: &Recipe, rows: usize) {
        if rows <= self.rows {
            return;
        }
        let grow = |v: &mut Vec<f32>, w: usize| v.resize(rows * w, 0.0);
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
            let at_least = |v: &mut Vec<f32>, n: usize| {
                if v.len() < n {
                    v.resize(n, 0.0)
                }
            };
            at_least(&mut self.gu, expert_rows * r.expert_up_rows());
            at_least(&mut self.act, expert_rows * moe.intermediate);
            grow(&mut self.moe.logits, moe.experts);
            grow(&mut self.moe.rows_in, h * moe.top_k);
            grow(&mut self.moe.rows_out, h * moe.top_k);
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
