//! One layer over a window of rows, composed as the recipe says (`recipe::Block`, `Placement`):
//!
//!   sequential:  x += rs * post(attn(pre(x)));  x += rs * post(mlp(pre(x)))
//!                pre = attn_norm / mlp_norm (Pre, Sandwich) or nothing (Post, PostResidual);
//!                post = post_attn_norm / post_mlp_norm (Sandwich, Post) or nothing (Pre);
//!                PostResidual norms the sum instead: x = post(x + f(x))
//!   parallel:    h = attn_norm(x);  x = (attn(h) + mlp(mlp_norm(x) or h)) + x,
//!                or (x + attn(h)) + mlp(...), as the model rounds it
//!   mlp:         down(act(gate h) * up h) when gated, else down(act(up h)), biases as the recipe has;
//!                in a sparse layer the mixture of experts (`moe.rs`)
//!
//! Numerical contract: as `forward.rs` (float32; each part as its module's contract).

use super::attend::{self, AttnBufs};
use super::cache::KvCache;
use super::ctx::{Model, Scratch, Window, MIN_ROW_VALUES};
use super::mlp;
use super::moe;
use super::norm::{norm_rows, norm_rows_in_place};
use super::ops;
use super::recipe::{Block, Placement, Recipe};
use super::rope::Table;
use super::tensors::Tensor;
use super::weights::Weights;
use crate::isa::Isa;
use crate::par::{rows_mut, Parallel};

/// Norm `weight` (and its bias tensor `bias`) of layer `l` over `m` rows of `x` into `out`.
fn norm_into(
    r: &Recipe,
    w: &Weights,
    par: &dyn Parallel,
    l: usize,
    t: [Tensor; 2],
    x: &[f32],
    out: &mut [f32],
) {
    let hd = r.hidden;
    let (wt, b) = (w.vec(t[0], l), w.vec(t[1], l));
    rows_mut(par, out, hd, MIN_ROW_VALUES, &|i0, o| {
        norm_rows(&r.norm, wt, b, hd, &x[i0 * hd..i0 * hd + o.len()], o)
    });
}

fn norm_here(r: &Recipe, w: &Weights, par: &dyn Parallel, l: usize, t: [Tensor; 2], x: &mut [f32]) {
    let (wt, b) = (w.vec(t[0], l), w.vec(t[1], l));
    rows_mut(par, x, r.hidden, MIN_ROW_VALUES, &|_, xs| {
        norm_rows_in_place(&r.norm, wt, b, r.hidden, xs)
    });
}

const ATTN_NORM: [Tensor; 2] = [Tensor::AttnNorm, Tensor::AttnNormBias];
const MLP_NORM: [Tensor; 2] = [Tensor::MlpNorm, Tensor::MlpNormBias];
const POST_ATTN: [Tensor; 2] = [Tensor::PostAttnNorm, Tensor::PostAttnNormBias];
const POST_MLP: [Tensor; 2] = [Tensor::PostMlpNorm, Tensor::PostMlpNormBias];

/// Layer `l` over the window's rows, in place on `s.x`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    model: &Model<'_>,
    tables: &[&Table],
    isa: Isa,
    par: &dyn Parallel,
    cache: &mut KvCache,
    s: &mut Scratch,
    win: &Window<'_>,
    l: usize,
) {
    let rows = win.rows;
    let (r, w) = (model.r, model.w);
    let n = rows.len() * r.hidden;
    // Disjoint buffers of the scratch, borrowed apart.
    let Scratch {
        x,
        h,
        qkv,
        attn,
        a,
        gu,
        act,
        f,
        tmp,
        moe: mbufs,
        ..
    } = s;
    let (x, h, a, f) = (&mut x[..n], &mut h[..n], &mut a[..n], &mut f[..n]);
    let mut bufs = AttnBufs { qkv, attn, tmp };
    let m = rows.len();
    let mut attention = |input: &[f32], out: &mut [f32]| {
        attend::sublayer(
            model, tables, isa, par, cache, input, &mut bufs, out, win, l,
        )
    };
    let sparse = r.sparse(l);
    let mut run_mlp = |input: &[f32], out: &mut [f32]| {
        if sparse {
            moe::run(r, w, isa, par, input, mbufs, gu, act, out, m, l)
        } else {
            let mats = (
                w.mat(Tensor::Up, l),
                w.vec(Tensor::UpBias, l),
                w.mat(Tensor::Down, l),
                w.vec(Tensor::DownBias, l),
            );
            mlp::ffn(r, isa, par, mats, input, gu, act, out, m)
        }
    };
    match r.block {
        Block::Sequential => {
            let pre = matches!(r.placement, Placement::Pre | Placement::Sandwich);
            let post_out = matches!(r.placement, Placement::Sandwich | Placement::Post);
            let post_sum = r.placement == Placement::PostResidual;
            // One sub-layer as the placement wants it: input norm (pre), the sub-layer, its output norm,
            // the scaled residual, a norm of the sum (post-residual).
            let sub = |x: &mut [f32],
                       h: &mut [f32],
                       out: &mut [f32],
                       (input_norm, output_norm): ([Tensor; 2], [Tensor; 2]),
                       run: &mut dyn FnMut(&[f32], &mut [f32])| {
                if pre {
                    norm_into(r, w, par, l, input_norm, x, h);
                    run(h, out);
                } else {
                    run(x, out);
                }
                if post_out {
                    norm_here(r, w, par, l, output_norm, out);
                }
                ops::add_scaled(x, out, r.residual_scale);
                if post_sum {
                    norm_here(r, w, par, l, output_norm, x);
                }
            };
            sub(x, h, a, (ATTN_NORM, POST_ATTN), &mut attention);
            sub(x, h, f, (MLP_NORM, POST_MLP), &mut run_mlp);
        }
        Block::Parallel {
            shared_norm,
            residual_last,
        } => {
            norm_into(r, w, par, l, ATTN_NORM, x, h);
            attention(h, a);
            if !shared_norm {
                norm_into(r, w, par, l, MLP_NORM, x, h);
            }
            run_mlp(h, f);
            if residual_last {
                ops::add_in_place(a, f);
                ops::add_in_place(x, a);
            } else {
                ops::add_in_place(x, a);
                ops::add_in_place(x, f);
            }
        }
    }
}
