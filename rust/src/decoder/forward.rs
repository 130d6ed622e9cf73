//! One decoder step: the whole model over a ragged batch of sequences, in one call.
//!
//! The batch's new tokens are laid out as rows (sequence after sequence) and processed in windows of
//! at most `chunk_rows` rows; within a window every layer runs on all its rows at once, so the
//! weights are read once per window whatever mix of prompt chunks and single decode tokens it holds:
//!
//!   x = embed(tokens)
//!   per layer:  h = rmsnorm(x);  [q|k|v] = h Wqkv^T (+b);  rotary(q, k) at each row's position;
//!               K/V rows -> the row's slot cache;  a = attention(q, cache) per sequence;
//!               x += a Wo^T;  h = rmsnorm(x);  [g|u] = h Wgu^T;  x += (silu(g) * u) Wdown^T
//!   logits of the rows asked for = rmsnorm(x) Wlm^T
//!
//! A later window sees the K/V the earlier windows wrote, so a long prompt may span windows.
//! Numerical contract: float32 activations and sums throughout (`linear`, `attention` and `ops`
//! contracts); with panel (bf16/f32) weights the only difference from the model's float32 forward
//! is summation order. A quantized matrix's linear reads its input rounded to int8 per 32 values
//! (`quant.rs`); everything around it stays float32.

use std::ops::Range;

use super::cache::KvCache;
use super::config::Config;
use super::ops;
use super::weights::{Mat, Weights};
use crate::attention::{decode_attention, View4};
use crate::isa::Isa;
use crate::panel::panel_linear;
use crate::par::{Parallel, Serial, SyncPtr};
use crate::quant::quant_linear;

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

/// One sequence of a step: `tokens` follow what `slot` already holds.
#[derive(Clone, Copy, Debug)]
pub struct SeqStep<'a> {
    pub slot: usize,
    pub tokens: &'a [u32],
    pub logits: Logits,
}

/// Scratch activations for up to `rows` rows, grown on demand and kept between steps.
#[derive(Default)]
pub struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    gu: Vec<f32>,
    act: Vec<f32>,
    /// One sequence's attention output, [heads][tokens][head_dim].
    tmp: Vec<f32>,
    /// The rows whose logits are wanted, gathered from `x` ([rows][hidden]).
    fin: Vec<f32>,
    rows: usize,
}

impl Scratch {
    fn ensure(&mut self, cfg: &Config, rows: usize) {
        if rows <= self.rows {
            return;
        }
        let grow = |v: &mut Vec<f32>, w: usize| v.resize(rows * w, 0.0);
        grow(&mut self.x, cfg.hidden);
        grow(&mut self.h, cfg.hidden);
        grow(&mut self.qkv, cfg.qkv_width());
        grow(&mut self.attn, cfg.q_width());
        grow(&mut self.gu, 2 * cfg.intermediate);
        grow(&mut self.act, cfg.intermediate);
        grow(&mut self.tmp, cfg.q_width());
        grow(&mut self.fin, cfg.hidden);
        self.rows = rows;
    }
}

/// Where each row of a window comes from: its slot, cache index and rotary position.
struct Row {
    slot: usize,
    index: usize,
    pos: usize,
}

/// A sequence's rows inside one window.
struct Segment {
    slot: usize,
    rows: Range<usize>,
    /// Cache index of the segment's first row.
    pos0: usize,
}

/// Everything a step reads besides the activations.
pub struct Model<'a> {
    pub cfg: &'a Config,
    pub w: &'a Weights,
    pub cos: &'a [f32],
    pub sin: &'a [f32],
}

fn lin(
    isa: Isa,
    par: &dyn Parallel,
    x: &[f32],
    m: usize,
    w: &Mat,
    b: Option<&Vec<f32>>,
    y: &mut [f32],
) {
    let (n, k) = (w.rows(), w.cols());
    let (x, y, b) = (&x[..m * k], &mut y[..m * n], b.map(|b| b.as_slice()));
    match w {
        Mat::Panel(p) => panel_linear(isa, par, x, m, p, b, y),
        Mat::Quant(q) => quant_linear(isa, par, x, m, q, b, y),
    }
}

/// Runs a validated batch (see `Decoder::step`): writes K/V and tokens into the slots and the wanted
/// logits, sequence by sequence, into `logits` ([rows wanted, vocab]).
pub fn step(
    model: &Model<'_>,
    isa: Isa,
    par: &dyn Parallel,
    cache: &mut KvCache,
    s: &mut Scratch,
    batch: &[SeqStep<'_>],
    logits: &mut [f32],
) {
    let cfg = model.cfg;
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
    let total = rows.len();
    let chunk = cfg.chunk_rows.min(total).max(1);
    s.ensure(cfg, chunk);
    let mut out_row = 0;
    let mut w0 = 0;
    while w0 < total {
        let w1 = (w0 + chunk).min(total);
        window(model, isa, par, cache, s, &rows[w0..w1], &tokens[w0..w1]);
        // Logits of the wanted rows in this window.
        let want: Vec<usize> = wanted
            .iter()
            .filter(|&&r| (w0..w1).contains(&r))
            .map(|&r| r - w0)
            .collect();
        if !want.is_empty() {
            let hd = cfg.hidden;
            for (i, &r) in want.iter().enumerate() {
                let (src, dst) = (r * hd, i * hd);
                s.fin[dst..dst + hd].copy_from_slice(&s.x[src..src + hd]);
            }
            let m = want.len();
            ops::rms_norm(
                &s.fin[..m * hd],
                &model.w.final_norm,
                cfg.rms_eps,
                &mut s.h[..m * hd],
            );
            let v = cfg.vocab;
            let y = &mut logits[out_row * v..(out_row + m) * v];
            lin(isa, par, &s.h, m, model.w.lm_head(), None, y);
            out_row += m;
        }
        w0 = w1;
    }
    for sq in batch {
        cache.push_tokens(sq.slot, sq.tokens);
    }
}

/// All layers over one window of rows.
fn window(
    model: &Model<'_>,
    isa: Isa,
    par: &dyn Parallel,
    cache: &mut KvCache,
    s: &mut Scratch,
    rows: &[Row],
    tokens: &[u32],
) {
    let cfg = model.cfg;
    let (hd, m) = (cfg.hidden, rows.len());
    let (qw, kvw, d) = (cfg.q_width(), cfg.kv_width(), cfg.head_dim);
    let qkvw = cfg.qkv_width();
    let half = d / 2;
    for (r, &t) in tokens.iter().enumerate() {
        model
            .w
            .embed
            .row_f32(t as usize, &mut s.x[r * hd..(r + 1) * hd]);
    }
    // Segments: consecutive rows of one slot.
    let mut segs: Vec<Segment> = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        match segs.last_mut() {
            Some(g) if g.slot == row.slot && g.pos0 + (r - g.rows.start) == row.index => {
                g.rows.end = r + 1
            }
            _ => segs.push(Segment {
                slot: row.slot,
                rows: r..r + 1,
                pos0: row.index,
            }),
        }
    }
    for (l, lw) in model.w.layers.iter().enumerate() {
        ops::rms_norm(
            &s.x[..m * hd],
            &lw.attn_norm,
            cfg.rms_eps,
            &mut s.h[..m * hd],
        );
        lin(isa, par, &s.h, m, &lw.wqkv, lw.bqkv.as_ref(), &mut s.qkv);
        for (r, row) in rows.iter().enumerate() {
            let qkv = &mut s.qkv[r * qkvw..(r + 1) * qkvw];
            let (cos, sin) = (
                &model.cos[row.pos * half..(row.pos + 1) * half],
                &model.sin[row.pos * half..(row.pos + 1) * half],
            );
            ops::rope(&mut qkv[..qw + kvw], cfg.heads + cfg.kv_heads, d, cos, sin);
            cache.write(
                row.slot,
                l,
                row.index,
                &qkv[qw..qw + kvw],
                &qkv[qw + kvw..qw + 2 * kvw],
            );
        }
        if segs.len() > 1 {
            // Several sequences: one parallel region over them, each sequence's attention on one
            // thread (its own rows of `attn`, its own scratch), instead of one small region each.
            let out = SyncPtr(s.attn.as_mut_ptr());
            let (qkv, cache_ref) = (&s.qkv, &*cache);
            par.run(segs.len(), &|i| {
                let g = &segs[i];
                let mut tmp = vec![0.0f32; cfg.q_width() * g.rows.len()];
                // SAFETY: segment i owns rows g.rows of `attn` (segments are disjoint row ranges of
                // the window) and `attn` holds m * q_width floats; run() joins before `s` is used.
                let rows = unsafe {
                    std::slice::from_raw_parts_mut(
                        out.get().add(g.rows.start * cfg.q_width()),
                        g.rows.len() * cfg.q_width(),
                    )
                };
                attend(model, isa, &Serial, cache_ref, qkv, &mut tmp, rows, g, l);
            });
        } else if let Some(g) = segs.first() {
            let rows = &mut s.attn[g.rows.start * qw..g.rows.end * qw];
            attend(model, isa, par, cache, &s.qkv, &mut s.tmp, rows, g, l);
        }
        lin(isa, par, &s.attn, m, &lw.wo, lw.bo.as_ref(), &mut s.h);
        ops::add_in_place(&mut s.x[..m * hd], &s.h[..m * hd]);
        ops::rms_norm(
            &s.x[..m * hd],
            &lw.ffn_norm,
            cfg.rms_eps,
            &mut s.h[..m * hd],
        );
        lin(
            isa,
            par,
            &s.h,
            m,
            &lw.w_gate_up,
            lw.b_gate_up.as_ref(),
            &mut s.gu,
        );
        ops::silu_mul(
            isa,
            &s.gu[..m * 2 * cfg.intermediate],
            cfg.intermediate,
            &mut s.act[..m * cfg.intermediate],
        );
        lin(
            isa,
            par,
            &s.act,
            m,
            &lw.w_down,
            lw.b_down.as_ref(),
            &mut s.h,
        );
        ops::add_in_place(&mut s.x[..m * hd], &s.h[..m * hd]);
    }
}

/// Attention of one segment's queries over its slot's cache, into `out` (the segment's rows of the
/// attention output, [tokens][heads * head_dim]); `tmp` holds at least heads * tokens * head_dim.
#[allow(clippy::too_many_arguments)]
fn attend(
    model: &Model<'_>,
    isa: Isa,
    par: &dyn Parallel,
    cache: &KvCache,
    qkv: &[f32],
    tmp: &mut [f32],
    out: &mut [f32],
    g: &Segment,
    layer: usize,
) {
    let cfg = model.cfg;
    let (d, hq, hkv) = (cfg.head_dim, cfg.heads, cfg.kv_heads);
    let qkvw = cfg.qkv_width();
    let qw = cfg.q_width();
    let ctx = cfg.max_context;
    let (kb, vb) = cache.layer(g.slot, layer);
    let t = g.rows.len();
    // Query rows whose sliding window starts after key 0 attend one by one over their own window.
    let windowed_from = match cfg.sliding_window {
        Some(w) => (w.saturating_sub(g.pos0)).min(t), // rows r >= this see a window not starting at 0
        None => t,
    };
    let mut run = |rows: Range<usize>, key0: usize, keys: usize| {
        let n = rows.len();
        let q = View4 {
            data: &qkv[(g.rows.start + rows.start) * qkvw..],
            dims: [1, hq, n, d],
            strides: [n * qkvw, d, qkvw, 1],
        };
        let kv = |b| View4 {
            data: b,
            dims: [1, hkv, keys, d],
            strides: [hkv * ctx * d, ctx * d, d, 1],
        };
        let (k, v) = (kv(&kb[key0 * d..]), kv(&vb[key0 * d..]));
        if n == 1 {
            // One token: [heads][1][d] is already the row layout.
            let dst = &mut out[rows.start * qw..(rows.start + 1) * qw];
            decode_attention(isa, par, q, k, v, cfg.attn_scale, dst);
            return;
        }
        let o = &mut tmp[..hq * n * d];
        decode_attention(isa, par, q, k, v, cfg.attn_scale, o);
        // [heads][tokens][d] -> rows [tokens][heads * d]
        for tt in 0..n {
            let r = rows.start + tt;
            for h in 0..hq {
                let src = (h * n + tt) * d;
                out[r * qw + h * d..r * qw + (h + 1) * d].copy_from_slice(&o[src..src + d]);
            }
        }
    };
    if windowed_from > 0 {
        // Rows 0..windowed_from: causal over keys 0..pos0 + windowed_from.
        run(0..windowed_from, 0, g.pos0 + windowed_from);
    }
    let w = cfg.sliding_window.unwrap_or(usize::MAX);
    for r in windowed_from..t {
        let pos = g.pos0 + r;
        let key0 = pos + 1 - w;
        run(r..r + 1, key0, pos + 1 - key0);
    }
}
