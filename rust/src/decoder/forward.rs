//! One decoder step: the whole model over a ragged batch of sequences, in one call.
//!
//! The batch's new tokens are laid out as rows (sequence after sequence) and processed in windows of
//! at most `chunk_rows` rows; within a window every layer runs on all its rows at once, so the
//! weights are read once per window whatever mix of prompt chunks and single decode tokens it holds:
//!
//!   x = embed(tokens) [-> proj_in] [* embed_scale] [+ pos_embed(position + offset)]
//!   per layer: as the recipe composes it (`layer.rs`)
//!   hidden of the rows asked for = [final_norm] [-> proj_out]   (HF's `last_hidden_state`)
//!   logits of the rows asked for = hidden -> lm_head (+ bias) [/ logit_divisor] [-> final soft-cap]
//!
//! A step returns either (`Output`): the logits, or the hidden rows themselves (embeddings).
//!
//! A later window sees the K/V the earlier windows wrote, so a long prompt may span windows. The
//! LongRoPE table (short or long) is picked once per step from the step's largest position, as
//! Hugging Face picks it once per forward call.
//! Numerical contract: float32 activations and sums throughout (`linear`, `attention`, `norm`, `ops`
//! and `vmath` contracts); with panel (bf16/f32) weights the only difference from the model's float32
//! forward is summation order (and exp/tanh/erf within a few ulp). A quantized matrix's linear reads
//! its input rounded to int8 per 32 values (`quant.rs`); everything around it stays float32.

use super::cache::KvCache;
use super::ctx::{Model, Row, Scratch, Segment, Window};
use super::layer;
use super::linear::lin;
use super::norm::norm_rows;
use super::ops;
use super::recipe::Positions;
use super::rope::Table;
use super::tensors::Tensor;
use crate::isa::Isa;
use crate::par::{rows_mut, Parallel};
use crate::vmath;

/// Which logits a sequence of the batch wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    /// The last new token's (the next-token distribution).
    Last,
    /// Every new token's (scoring, speculative verification).
    All,
}

impl Logits {
    pub fn rows(self, tokens: usize) -> usize {
        match self {
            Logits::None => 0,
            Logits::Last => 1,
            Logits::All => tokens,
        }
    }
}

/// What a step writes for the rows its sequences ask for (`Logits` says which rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// [rows, vocab]: the next-token logits.
    Logits,
    /// [rows, embed_dim]: the final normed hidden state, the lm_head's input (after `proj_out` where
    /// the model has one), which Hugging Face returns as `last_hidden_state` and embedders pool.
    Hidden,
}

impl Output {
    /// Floats per row.
    pub fn width(self, r: &super::recipe::Recipe) -> usize {
        match self {
            Output::Logits => r.vocab,
            Output::Hidden => r.embed_dim,
        }
    }
}

/// One sequence of a step: `tokens` follow what `slot` already holds.
#[derive(Clone, Copy, Debug)]
pub struct SeqStep<'a> {
    pub slot: usize,
    pub tokens: &'a [u32],
    pub logits: Logits,
}

/// Runs a validated batch (see `Decoder::step_as`): writes K/V and tokens into the slots and the
/// wanted rows' `output`, sequence by sequence, into `out` ([rows wanted, output.width()]).
#[allow(clippy::too_many_arguments)]
pub fn step(
    model: &Model<'_>,
    isa: Isa,
    par: &dyn Parallel,
    cache: &mut KvCache,
    s: &mut Scratch,
    batch: &[SeqStep<'_>],
    output: Output,
    out: &mut [f32],
) {
    let r = model.r;
    // Flatten the batch: row -> (slot, position, token), and the rows whose logits are wanted.
    let mut rows = Vec::new();
    let mut tokens = Vec::new();
    let mut wanted = Vec::new();
    for sq in batch {
        let start = cache.len(sq.slot);
        let pos = cache.next_pos(sq.slot);
        let n = sq.tokens.len();
        let first_wanted = n - sq.logits.rows(n);
        for (i, &t) in sq.tokens.iter().enumerate() {
            if i >= first_wanted {
                wanted.push(rows.len());
            }
            rows.push(Row {
                slot: sq.slot,
                index: start + i,
                pos: pos + i,
            });
            tokens.push(t);
        }
    }
    // The rotary sets this step uses (LongRoPE switches on the whole call's largest position).
    let max_pos = rows.iter().map(|x| x.pos).max().unwrap_or(0);
    let tables: Vec<&Table> = model.ropes.iter().map(|t| t.pick(max_pos)).collect();
    let total = rows.len();
    let chunk = model.lim.chunk_rows.min(total).max(1);
    s.ensure(r, chunk);
    let mut out_row = 0;
    let mut w0 = 0;
    while w0 < total {
        let w1 = (w0 + chunk).min(total);
        let win = &rows[w0..w1];
        embed(model, isa, par, s, win, &tokens[w0..w1]);
        let segs = segments(win);
        for g in &segs {
            cache.make_room(g.slot, g.pos0, g.rows.len());
        }
        for l in 0..r.layers {
            let w = Window {
                rows: win,
                segs: &segs,
            };
            layer::run(model, &tables, isa, par, cache, s, &w, l);
        }
        let want: Vec<usize> = wanted
            .iter()
            .filter(|&&i| (w0..w1).contains(&i))
            .map(|&i| i - w0)
            .collect();
        if !want.is_empty() {
            let m = want.len();
            let v = output.width(r);
            let y = &mut out[out_row * v..(out_row + m) * v];
            head(model, isa, par, s, &want, output, y);
            out_row += m;
        }
        w0 = w1;
    }
    for sq in batch {
        cache.push_tokens(sq.slot, sq.tokens);
    }
}

/// The window's input rows: token embeddings, projected, scaled, plus learned positions.
fn embed(
    model: &Model<'_>,
    isa: Isa,
    par: &dyn Parallel,
    s: &mut Scratch,
    rows: &[Row],
    tokens: &[u32],
) {
    let (r, w) = (model.r, model.w);
    let (hd, ed, m) = (r.hidden, r.embed_dim, rows.len());
    let proj = w.mat_opt(Tensor::ProjIn, 0);
    let dst = if proj.is_some() { &mut s.e } else { &mut s.x };
    // The lookups split across the pool from two rows: a quantized row is gathered from its 16-row panel
    // value by value (about 2 us a row of SmolLM2's q6k embedding, 1 ms of a 512-token prompt serially).
    let table = w.embed();
    rows_mut(par, &mut dst[..tokens.len() * ed], ed, 1, &|i0, out| {
        for (o, &t) in out.chunks_exact_mut(ed).zip(&tokens[i0..]) {
            table.row_f32(t as usize, o);
        }
    });
    if let Some(p) = proj {
        // The embedding width's rows into the hidden width (OPT's project_in).
        lin(isa, par, &s.e, m, p, None, &mut s.x);
    }
    let x = &mut s.x[..m * hd];
    if r.embed_scale != 1.0 {
        ops::scale(x, r.embed_scale);
    }
    if let Positions::Learned { offset, .. } = r.positions {
        let table = w.mat(Tensor::PosEmbed, 0);
        let mut pe = vec![0.0f32; hd];
        for (i, row) in rows.iter().enumerate() {
            table.row_f32(row.pos + offset, &mut pe);
            ops::add_in_place(&mut x[i * hd..(i + 1) * hd], &pe);
        }
    }
}

/// Consecutive rows of one slot.
fn segments(rows: &[Row]) -> Vec<Segment> {
    let mut segs: Vec<Segment> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        match segs.last_mut() {
            Some(g) if g.slot == row.slot && g.pos0 + (i - g.rows.start) == row.index => {
                g.rows.end = i + 1
            }
            _ => segs.push(Segment {
                slot: row.slot,
                rows: i..i + 1,
                pos0: row.index,
            }),
        }
    }
    segs
}

/// `output` of the window's rows `want` into `y` ([want.len(), output.width()]).
fn head(
    model: &Model<'_>,
    isa: Isa,
    par: &dyn Parallel,
    s: &mut Scratch,
    want: &[usize],
    output: Output,
    y: &mut [f32],
) {
    let (r, w) = (model.r, model.w);
    let (hd, m) = (r.hidden, want.len());
    for (i, &row) in want.iter().enumerate() {
        s.fin[i * hd..(i + 1) * hd].copy_from_slice(&s.x[row * hd..(row + 1) * hd]);
    }
    let mut input: &[f32] = &s.fin[..m * hd];
    if r.final_norm {
        let (nw, nb) = (w.vec(Tensor::FinalNorm, 0), w.vec(Tensor::FinalNormBias, 0));
        norm_rows(&r.norm, nw, nb, hd, input, &mut s.h[..m * hd]);
        input = &s.h[..m * hd];
    }
    if let Some(p) = w.mat_opt(Tensor::ProjOut, 0) {
        lin(isa, par, input, m, p, None, &mut s.e);
        input = &s.e[..m * r.embed_dim];
    }
    if output == Output::Hidden {
        y.copy_from_slice(input);
        return;
    }
    lin(
        isa,
        par,
        input,
        m,
        w.lm_head(),
        w.vec(Tensor::LmHeadBias, 0),
        y,
    );
    if r.logit_divisor != 1.0 {
        ops::divide(y, r.logit_divisor);
    }
    if let Some(cap) = r.final_softcap {
        vmath::softcap(isa, y, cap);
    }
}
