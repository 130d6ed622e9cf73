//! The attention sub-layer of one layer over a window of rows:
//!
//!   [q|k|v] = h Wqkv^T (+ b)  ->  clamp to +-clip_qkv  ->  q/k norm (per head or over the whole
//!   projection)  ->  rotary over each head's first rot_dim values at the row's position (the layer's
//!   table)  ->  K/V into the row's slot  ->  attention per sequence over its slot's cache (the layer's
//!   scale, sliding window and soft-cap)  ->  o = a Wo^T (+ b)
//!
//! Attention runs per sequence (segment) over the keys it can see: with a sliding window the cache
//! view starts at the first key its first row sees and the kernel bounds each row's keys, so a
//! window costs what full attention of that length costs, prompt rows in blocks.
//! Numerical contract: as `forward.rs` (clip -> norm -> rotary, or norm -> clip -> rotary where the recipe
//! says `clip_after_norm`: OLMoE).

use super::cache::KvCache;
use super::ctx::{Lines, Model, Segment, Window, MIN_ROW_VALUES};
use super::linear::lin;
use super::norm::norm_rows_in_place;
use super::ops;
use super::recipe::{QkNorm, QkScope};
use super::rope::Table;
use super::tensors::Tensor;
use crate::attention::{attention_kv, AttnParams, View4};
use crate::isa::Isa;
use crate::par::{rows_mut, Parallel, Serial, SyncPtr};

/// Rows of a window whose cache lines `sublayer` prefetches: a batched decode step's (a prompt's rows
/// are written in order, which the hardware prefetcher follows).
const MAX_PREFETCH_ROWS: usize = 16;

/// The sub-layer's scratch: q/k/v rows, the attention output before o, a per-sequence buffer.
pub struct AttnBufs<'a> {
    pub qkv: &'a mut Lines,
    pub attn: &'a mut Lines,
    pub tmp: &'a mut Lines,
}

/// q/k norm of one row's q (`q`, heads * d) and k (`k`, kv_heads * d) in place.
fn qk_norm(n: &QkNorm, w: [Option<&[f32]>; 4], d: usize, q: &mut [f32], k: &mut [f32]) {
    for (x, (wt, bs)) in [(q, (w[0], w[1])), (k, (w[2], w[3]))] {
        match (n.scope, n.per_head_weights) {
            (QkScope::Full, _) => norm_rows_in_place(&n.norm, wt, bs, x.len(), x),
            (QkScope::Head, false) => norm_rows_in_place(&n.norm, wt, bs, d, x),
            (QkScope::Head, true) => {
                for (h, head) in x.chunks_exact_mut(d).enumerate() {
                    let (hw, hb) = (
                        wt.map(|v| &v[h * d..(h + 1) * d]),
                        bs.map(|v| &v[h * d..(h + 1) * d]),
                    );
                    norm_rows_in_place(&n.norm, hw, hb, d, head);
                }
            }
        }
    }
}

/// Attention sub-layer of layer `l`: `input` [rows][hidden] -> `out` [rows][hidden]; writes the
/// rows' K/V into their slots.
#[allow(clippy::too_many_arguments)]
pub fn sublayer(
    model: &Model<'_>,
    tables: &[&Table],
    isa: Isa,
    par: &dyn Parallel,
    cache: &mut KvCache,
    input: &[f32],
    b: &mut AttnBufs<'_>,
    out: &mut [f32],
    win: &Window<'_>,
    l: usize,
) {
    let (rows, segs) = (win.rows, win.segs);
    let (r, w) = (model.r, model.w);
    let m = rows.len();
    let (qw, kvw, d) = (r.q_width(), r.kv_width(), r.head_dim);
    let qkvw = r.qkv_width();
    let spec = &r.layer_specs[l];
    // The cache lines this window's K/V rows go to, on their way while q/k/v are computed (a decode
    // step's weight stream evicts them from every cache; the writes below then waited on each).
    let kv = cache.layer_writer(l);
    for row in rows.iter().take(MAX_PREFETCH_ROWS) {
        kv.prefetch(row.slot, row.index);
    }
    lin(
        isa,
        par,
        input,
        m,
        w.mat(Tensor::Qkv, l),
        w.vec(Tensor::QkvBias, l),
        b.qkv,
    );
    let norm_w = [
        Tensor::QNorm,
        Tensor::QNormBias,
        Tensor::KNorm,
        Tensor::KNormBias,
    ]
    .map(|t| w.vec(t, l));
    let rope = tables
        .get(spec.rope)
        .map(|t| (*t, model.ropes[spec.rope].half));
    // Clip, q/k norm and rotary row by row (a prompt's rows split among the threads), and each row's
    // K/V into the cache where it was computed.
    rows_mut(
        par,
        &mut b.qkv[..m * qkvw],
        qkvw,
        MIN_ROW_VALUES,
        &|i0, chunk| {
            for (qkv, row) in chunk.chunks_exact_mut(qkvw).zip(&rows[i0..]) {
                let clip = r.clip_qkv;
                if let (Some(c), false) = (clip, r.clip_after_norm) {
                    ops::clip(qkv, c);
                }
                if let Some(n) = &r.qk_norm {
                    let (q, rest) = qkv.split_at_mut(qw);
                    qk_norm(n, norm_w, d, q, &mut rest[..kvw]);
                }
                if let (Some(c), true) = (clip, r.clip_after_norm) {
                    ops::clip(qkv, c);
                }
                if let Some((t, half)) = rope {
                    let (cos, sin) = t.at(row.pos, half);
                    ops::rope(&mut qkv[..qw + kvw], r.heads + r.kv_heads, d, cos, sin);
                }
                let (k, v) = (&qkv[qw..qw + kvw], &qkv[qw + kvw..]);
                // SAFETY: a window's rows are distinct (slot, index) positions, each in one chunk.
                unsafe { kv.write(isa, row.slot, row.index, k, v) };
            }
        },
    );
    let params = AttnParams {
        scale: spec.attn_scale,
        softcap: r.attn_softcap,
        window: spec.window,
    };
    if segs.len() > 1 {
        // Several sequences: one parallel region over them, each sequence's attention on one
        // thread (its own rows of `attn`, its own scratch), instead of one small region each.
        let dst = SyncPtr(b.attn.as_mut_ptr());
        let (qkv, cache_ref) = (&*b.qkv, &*cache);
        par.run(segs.len(), &|i| {
            let g = &segs[i];
            let mut tmp = vec![0.0f32; qw * g.rows.len()];
            // SAFETY: segment i owns rows g.rows of `attn` (segments are disjoint row ranges of
            // the window) and `attn` holds m * q_width floats; run() joins before it is read.
            let rows = unsafe {
                std::slice::from_raw_parts_mut(dst.get().add(g.rows.start * qw), g.rows.len() * qw)
            };
            attend(
                model, isa, &Serial, cache_ref, qkv, &mut tmp, rows, g, l, &params,
            );
        });
    } else if let Some(g) = segs.first() {
        let rows = &mut b.attn[g.rows.start * qw..g.rows.end * qw];
        attend(model, isa, par, cache, b.qkv, b.tmp, rows, g, l, &params);
    }
    lin(
        isa,
        par,
        b.attn,
        m,
        w.mat(Tensor::O, l),
        w.vec(Tensor::OBias, l),
        out,
    );
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
    params: &AttnParams,
) {
    let r = model.r;
    let (d, hq) = (r.head_dim, r.heads);
    let (qkvw, qw) = (r.qkv_width(), r.q_width());
    let n = g.rows.len();
    // The first key the segment's first row sees (its window's start), and the keys up to its last;
    // a windowed layer still holds them (`cache.rs`).
    let key0 = params.window.map_or(0, |w| (g.pos0 + 1).saturating_sub(w));
    let keys = g.pos0 + n - key0;
    let q = View4 {
        data: &qkv[g.rows.start * qkvw..],
        dims: [1, hq, n, d],
        strides: [n * qkvw, d, qkvw, 1],
    };
    let [k, v] = cache.views(g.slot, layer, key0, keys);
    if n == 1 {
        // One token: [heads][1][d] is already the row layout.
        attention_kv(isa, par, q, k, v, params, &mut out[..qw]);
        return;
    }
    let o = &mut tmp[..hq * n * d];
    attention_kv(isa, par, q, k, v, params, o);
    // [heads][tokens][d] -> rows [tokens][heads * d]
    for t in 0..n {
        for h in 0..hq {
            let src = (h * n + t) * d;
            out[t * qw + h * d..t * qw + (h + 1) * d].copy_from_slice(&o[src..src + d]);
        }
    }
}
