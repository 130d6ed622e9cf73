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
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / len;
            let var = row
                .iter()
                .map(|&v| (v as f64 - mean) * (v as f64 - mean))
                .sum::<f64>()
                / len;
            let r = 1.0 / (var as f32 + eps).sqrt();
            Stats {
                a: r,
                b: -r * mean as f32,
            }
        }
    }
}

#[inline]
fn apply(kind: NormKind, s: Stats, x: f32, w: f32, b: f32) -> f32 {
    match kind {
        NormKind::Rms => w * (x * s.a) + b,
        NormKind::Layer => (x * s.a + s.b) * w + b,
    }
}

/// One row's weight and bias values at i (1 and 0 when absent).
struct Affine<'a> {
    w: Option<&'a [f32]>,
    b: Option<&'a [f32]>,
}

impl Affine<'_> {
    #[inline]
    fn at(&self, i: usize) -> (f32, f32) {
        (self.w.map_or(1.0, |w| w[i]), self.b.map_or(0.0, |b| b[i]))
    }
}

/// Normalises each `dim`-wide row of `x` into `out`. RMSNorm without a bias adds nothing (so it is
/// exactly `w * (x * r)`).
pub fn norm_rows(
    n: &Norm,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    dim: usize,
    x: &[f32],
    out: &mut [f32],
) {
    let aff = Affine { w, b };
    for (row, o) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let s = stats(n.kind, n.eps, row);
        if n.kind == NormKind::Rms && b.is_none() {
            // The common case without the `+ 0.0`, which would turn -0.0 into 0.0.
            for (i, (o, &v)) in o.iter_mut().zip(row).enumerate() {
                *o = aff.at(i).0 * (v * s.a);
            }
        } else {
            for (i, (o, &v)) in o.iter_mut().zip(row).enumerate() {
                let (wi, bi) = aff.at(i);
                *o = apply(n.kind, s, v, wi, bi);
            }
        }
    }
}

/// `norm_rows` in place.
pub fn norm_rows_in_place(
    n: &Norm,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
    dim: usize,
    x: &mut [f32],
) {
    let aff = Affine { w, b };
    for row in x.chunks_exact_mut(dim) {
        let s = stats(n.kind, n.eps, row);
        let plain_rms = n.kind == NormKind::Rms && b.is_none();
        for (i, v) in row.iter_mut().enumerate() {
            let (wi, bi) = aff.at(i);
            *v = if plain_rms {
                wi * (*v * s.a)
            } else {
                apply(n.kind, s, *v, wi, bi)
            };
        }
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
