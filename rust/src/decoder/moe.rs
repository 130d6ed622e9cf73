//! A sparse layer's MLP: the router picks each row's `top_k` experts and their weights, the rows that
//! chose an expert run through its matrices together (one linear per expert per window, so a prompt's
//! expert work is a GEMM and a decode step of one sequence reads only its k experts), and each row's
//! output is the weighted sum of its experts' outputs.
//!
//! Numerical contract (float32, as Hugging Face's float32 forward):
//!   logits = router · x (the preserve/quant linear's f32 sums)
//!   softmax_topk: p = exp(l - max) / sum(exp(l - max)) over all experts; the k largest p (ties to the
//!                 lower expert, a stable order); divided by their sum when renormalising
//!   topk_softmax: the k largest logits; softmax over those k
//!   out[row] = (expert_a(x) * w_a) + (expert_b(x) * w_b) + ... in the router's rank order, each
//!              product rounded before its add (Hugging Face's default `grouped_mm` experts: weighted
//!              outputs summed over the top-k slots; its eager loop sums by expert, 1e-9 apart).
//! exp is libm's `expf`, the sum divided rather than multiplied by its reciprocal (an ulp from torch).

pub use super::ctx::{ExpertCounts, MoeBufs};
use super::linear::{lin, lin_group, LinItem};
use super::mlp::ffn;
use super::recipe::{Recipe, Router};
use super::tensors::Tensor;
use super::weights::{Mat, Weights};
use crate::isa::Isa;
use crate::par::Parallel;
use crate::vmath;

/// At most this many (row, expert) picks in a window run every chosen expert's matrices in one
/// parallel region per matrix (a decode step or a small batch, where one expert's few rows are too
/// little work to split on their own); more run expert after expert, each a GEMM over its rows.
pub const GROUP_PICKS: usize = 64;

/// Each row's k (expert, weight) pairs, in the order the router ranks them.
pub fn route(r: &Router, k: usize, logits: &[f32], experts: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    let mut order: Vec<u32> = (0..experts as u32).collect();
    let mut p = vec![0.0f32; experts];
    for row in logits.chunks_exact(experts) {
        let scores: &[f32] = match r {
            Router::SoftmaxTopk { .. } => {
                softmax(row, &mut p);
                &p
            }
            Router::TopkSoftmax => row,
        };
        // A stable sort: equal scores keep the lower expert first.
        order.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]));
        let top = &order[..k];
        let start = out.len();
        match r {
            Router::SoftmaxTopk { renormalize } => {
                out.extend(top.iter().map(|&e| (e, p[e as usize])));
                if *renormalize {
                    let sum: f32 = out[start..].iter().map(|x| x.1).sum();
                    for x in &mut out[start..] {
                        x.1 /= sum;
                    }
                }
            }
            Router::TopkSoftmax => {
                let l: Vec<f32> = top.iter().map(|&e| row[e as usize]).collect();
                let mut w = vec![0.0f32; k];
                softmax(&l, &mut w);
                out.extend(top.iter().zip(w).map(|(&e, w)| (e, w)));
            }
        }
        order.sort_unstable(); // back to 0..experts for the next row's stable sort
    }
}

/// out = softmax(x), as torch computes it in float32: exp(x - max), then each divided by the sum.
fn softmax(x: &[f32], out: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - max).exp();
        sum += *o;
    }
    for o in out.iter_mut() {
        *o /= sum;
    }
}

/// Cuts `buf` into consecutive `counts[e] * width` slices.
fn split_rows<'a>(mut buf: &'a mut [f32], counts: &[usize], width: usize) -> Vec<&'a mut [f32]> {
    let mut out = Vec::with_capacity(counts.len());
    for &n in counts {
        let (head, rest) = std::mem::take(&mut buf).split_at_mut(n * width);
        out.push(head);
        buf = rest;
    }
    out
}

/// One linear item per expert with rows: expert `e` reads its `count[e]` rows of `x` (`k` wide, in
/// expert order) and writes its rows of `y` (`n` wide) through `mat(e)`.
fn expert_items<'a>(
    x: &'a [f32],
    k: usize,
    y: &'a mut [f32],
    n: usize,
    count: &[usize],
    mat: &dyn Fn(usize) -> &'a Mat,
) -> Vec<LinItem<'a>> {
    let mut items = Vec::new();
    let mut at = 0;
    for (e, ye) in split_rows(y, count, n).into_iter().enumerate() {
        let c = count[e];
        if c > 0 {
            items.push(LinItem {
                x: &x[at * k..(at + c) * k],
                m: c,
                w: mat(e),
                y: ye,
            });
        }
        at += c;
    }
    items
}

/// The mixture of sparse layer `l` over `m` rows of `input` into `out` ([m][hidden]).
#[allow(clippy::too_many_arguments)]
pub fn run(
    r: &Recipe,
    w: &Weights,
    isa: Isa,
    par: &dyn Parallel,
    input: &[f32],
    bufs: &mut MoeBufs,
    gu: &mut [f32],
    act: &mut [f32],
    out: &mut [f32],
    m: usize,
    l: usize,
) {
    let moe = r.moe.expect("a sparse layer has experts (Recipe::check)");
    let (hd, ne, k) = (r.hidden, moe.experts, moe.top_k);
    let logits = &mut bufs.logits[..m * ne];
    lin(isa, par, input, m, w.mat(Tensor::Router, l), None, logits);
    let mut picks = Vec::with_capacity(m * k);
    route(&moe.router, k, logits, ne, &mut picks);
    // Group the picks by expert: pick i (row i / k's rank i % k) sits at grouped row pos[i].
    let mut count = vec![0usize; ne];
    for &(e, _) in &picks {
        count[e as usize] += 1;
    }
    let mut next: Vec<usize> = count
        .iter()
        .scan(0, |acc, &c| {
            let at = *acc;
            *acc += c;
            Some(at)
        })
        .collect();
    let mut pos = vec![0usize; picks.len()];
    for (i, &(e, _)) in picks.iter().enumerate() {
        pos[i] = next[e as usize];
        next[e as usize] += 1;
        let row = i / k;
        bufs.rows_in[pos[i] * hd..(pos[i] + 1) * hd]
            .copy_from_slice(&input[row * hd..(row + 1) * hd]);
    }
    let used = count.iter().filter(|&&c| c > 0).count() as u64;
    bufs.counts.runs += used;
    bufs.counts.rows += picks.len() as u64;
    let n = picks.len();
    let (x, y) = (&bufs.rows_in[..n * hd], &mut bufs.rows_out[..n * hd]);
    if n <= GROUP_PICKS {
        grouped(r, w, isa, par, (x, y), (gu, act), &count, l);
        bufs.counts.calls += 2;
    } else {
        let mut at = 0;
        for (e, &c) in count.iter().enumerate() {
            if c == 0 {
                continue;
            }
            let (up, down) = w.expert(l, e);
            let (xe, ye) = (&x[at * hd..(at + c) * hd], &mut y[at * hd..(at + c) * hd]);
            ffn(r, isa, par, (up, None, down, None), xe, gu, act, ye, c);
            at += c;
            bufs.counts.calls += 2;
        }
    }
    // Each row: its picks' outputs times their weights, summed in rank order (each product rounded).
    for (row, o) in out[..m * hd].chunks_exact_mut(hd).enumerate() {
        o.fill(0.0);
        for s in 0..k {
            let i = row * k + s;
            let wt = picks[i].1;
            let src = &y[pos[i] * hd..(pos[i] + 1) * hd];
            if s == 0 {
                for (a, &b) in o.iter_mut().zip(src) {
                    *a = b * wt;
                }
            } else {
                for (a, &b) in o.iter_mut().zip(src) {
                    *a += b * wt;
                }
            }
        }
    }
}

/// Every chosen expert of sparse layer `l` over its grouped rows (`count[e]` each, in expert order)
/// of `x` into `y`: one parallel region for all the first matrices, one for all the down matrices.
/// Each expert's numbers are `ffn`'s over the same rows (the group runs the same kernels per item).
#[allow(clippy::too_many_arguments)]
fn grouped(
    r: &Recipe,
    w: &Weights,
    isa: Isa,
    par: &dyn Parallel,
    (x, y): (&[f32], &mut [f32]),
    (gu, act): (&mut [f32], &mut [f32]),
    count: &[usize],
    l: usize,
) {
    let (hd, n) = (r.hidden, count.iter().sum::<usize>());
    let i = r.moe.map_or(0, |m| m.intermediate);
    let ur = r.expert_up_rows();
    let (gu, act) = (&mut gu[..n * ur], &mut act[..n * i]);
    let first = |e: usize| w.expert(l, e).0;
    lin_group(isa, par, expert_items(x, hd, gu, ur, count, &first));
    let hidden: &[f32] = if r.mlp.gated {
        for (row, o) in gu.chunks_exact(ur).zip(act.chunks_exact_mut(i)) {
            let (g, u) = row.split_at(i);
            vmath::act_mul(isa, r.mlp.act, g, u, o);
        }
        act
    } else {
        vmath::act_in_place(isa, r.mlp.act, gu);
        gu
    };
    let down = |e: usize| w.expert(l, e).1;
    lin_group(isa, par, expert_items(hidden, i, y, hd, count, &down));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_topk_renormalises_and_breaks_ties_low() {
        let mut out = Vec::new();
        let r = Router::SoftmaxTopk { renormalize: true };
        route(&r, 2, &[1.0, 3.0, 3.0, 0.0], 4, &mut out);
        assert_eq!(out.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 2]);
        assert!((out[0].1 - 0.5).abs() < 1e-7 && (out[1].1 - 0.5).abs() < 1e-7);
        let r = Router::SoftmaxTopk { renormalize: false };
        route(&r, 1, &[0.0, 0.0, 2.0_f32.ln()], 3, &mut out);
        assert_eq!(out[0].0, 2);
        assert!((out[0].1 - 0.5).abs() < 1e-6, "{:?}", out);
    }

    #[test]
    fn topk_softmax_is_a_softmax_over_the_chosen() {
        let mut out = Vec::new();
        route(
            &Router::TopkSoftmax,
            2,
            &[5.0, 0.0, 5.0 + 3.0_f32.ln(), -1.0, 2.0, 0.0],
            3,
            &mut out,
        );
        // row 0: experts 2 (weight 3/4) and 0 (1/4); row 1: experts 0 (2.0) and ... [-1, 2, 0] -> 1, 2
        assert_eq!(out.iter().map(|x| x.0).collect::<Vec<_>>(), [2, 0, 1, 2]);
        assert!((out[0].1 - 0.75).abs() < 1e-6 && (out[1].1 - 0.25).abs() < 1e-6);
        let e2 = (2.0f32).exp();
        assert!((out[2].1 - e2 / (e2 + 1.0)).abs() < 1e-6);
    }
}
