//! The decoder's norms, each computing what Hugging Face's float32 module computes (same operations
//! in the same order per element; only the row reductions differ in summation order):
//!   RMSNorm:   y = w * (x * (1 / sqrt(mean(x^2) + eps)))          (LlamaRMSNorm; Gemma's `1 + w`
//!              is folded into w at load, bit-exactly: HF computes `1.0 + w.float()` in f32 too)
//!   LayerNorm: y = (x * r + (-r * mean)) * w + b,  r = 1 / sqrt(var + eps)   (torch's CPU kernel;
//!              mean and population variance accumulated in f64, then rounded)
//! A missing weight or bias is 1 or 0 (weightless LayerNorm: OLMo, OPT-350m's non-affine norms).
//! Norms are a few flops per activation against a matrix row per activation in the linears around
//! them, so they are plain Rust (LLVM vectorises the elementwise passes).

use super::recipe::{Norm, NormKind};

/// Per-row statistics: y[i] = (x[i] * a + b) for LayerNorm, x[i] * a for RMSNorm, then the affine.
#[derive(Clone, Copy)]
struct Stats {
    a: f32,
    b: f32,
}

/// sum of f(x) over `row` in f64, in four interleaved partials (independent chains: the loop runs at
/// throughput, not at the add's latency).
#[inline]
fn sum4(row: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut acc = [0.0f64; 4];
    let mut chunks = row.chunks_exact(4);
    for c in &mut chunks {
        for i in 0..4 {
            acc[i] += f(c[i]);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| f(v)).sum();
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

fn stats(kind: NormKind, eps: f32, row: &[f32]) -> Stats {
    let n = row.len() as f32;
    match kind {
        NormKind::Rms => {
            // Four partial sums: faster, and no less accurate than one running sum.
            let mut acc = [0.0f32; 4];
            let mut chunks = row.chunks_exact(4);
            for c in &mut chunks {
                for i in 0..4 {
                    acc[i] += c[i] * c[i];
                }
            }
            let mut ss = (acc[0] + acc[1]) + (acc[2] + acc[3]);
            for v in chunks.remainder() {
                ss += v * v;
            }
            Stats {
                a: 1.0 / (ss / n + eps).sqrt(),
                b: 0.0,
            }
        }
        NormKind::Layer => {
            let len = row.len() as f64;
            let mean = sum4(row, |v| v as f64) / len;
            let var = sum4(row, |v| (v as f64 - mean) * (v as f64 - mean)) / len;
            let r = 1.0 / (var as f32 + eps).sqrt();
            Stats {
                a: r,
                b: -r * mean as f32,
            }
        }
    }
}

/// One row: `out[i] = f(x[i])` with the stats and affine of the norm, each case its own loop over zipped
/// slices (so LLVM vectorises it; no per-element Option tests).
#[inline]
fn row(kind: NormKind, s: Stats, w: Option<&[f32]>, b: Option<&[f32]>, x: &[f32], out: &mut [f32]) {
    let n = x.len();
    match (kind, w, b) {
        // w * (x * r): LlamaRMSNorm's order (no `+ 0.0`, which would turn -0.0 into 0.0).
        (NormKind::Rms, Some(w), None) => {
            for ((o, &v), &g) in out.iter_mut().zip(x).zip(&w[..n]) {
                *o = g * (v * s.a);
            }
        }
        (NormKind::Rms, None, None) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * s.a;
            }
        }
        // (x * r + (-r * mean)) * w + b: torch's CPU LayerNorm.
        (NormKind::Layer, Some(w), Some(b)) => {
            for (((o, &v), &g), &c) in out.iter_mut().zip(x).zip(&w[..n]).zip(&b[..n]) {
                *o = (v * s.a + s.b) * g + c;
            }
        }
        (NormKind::Layer, Some(w), None) => {
            for ((o, &v), &g) in out.iter_mut().zip(x).zip(&w[..n]) {
                *o = (v * s.a + s.b) * g;
            }
        }
        (NormKind::Layer, None, None) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * s.a + s.b;
            }
        }
        // A bias without a weight (no family has one) or an RMSNorm bias: the general form.
        (_, w, b) => {
            for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
                let (g, c) = (w.map_or(1.0, |w| w[i]), b.map_or(0.0, |b| b[i]));
                *o = match kind {
                    NormKind::Rms => g * (v * s.a) + c,
                    NormKind::Layer => (v * s.a + s.b) * g + c,
                };
            }
        }
    }
}

/// Normalises each `dim`-wide row of `x` into `out`.
pub fn norm_rows(
    n: &Norm,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    dim: usize,
    x: &[f32],
    out: &mut [f32],
) {
    for (xr, o) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        row(n.kind, stats(n.kind, n.eps, xr), w, b, xr, o);
    }
}

/// `norm_rows` in place (through one row of scratch: the row is read whole for its statistics first).
pub fn norm_rows_in_place(
    n: &Norm,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    dim: usize,
    x: &mut [f32],
) {
    let mut tmp = vec![0.0f32; dim];
    for xr in x.chunks_exact_mut(dim) {
        let s = stats(n.kind, n.eps, xr);
        tmp.copy_from_slice(xr);
        row(n.kind, s, w, b, &tmp, xr);
    }
}

/// RMSNorm with a weight, the Llama case (kept as the reference the tests name).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = Norm {
        kind: NormKind::Rms,
        eps,
        weight: true,
        bias: false,
    };
    norm_rows(&n, Some(w), None, w.len(), x, out);
}
