//! The decoder's pointwise steps, written to compute exactly what Hugging Face's float32 modules do
//! (same operations in the same order per element; only reductions differ in summation order):
//!   RMSNorm:  y = w * (x * (1 / sqrt(mean(x^2) + eps)))          (LlamaRMSNorm in f32)
//!   rotary:   y[i] = x[i] c[i] - x[i+h] s[i],  y[i+h] = x[i+h] c[i] + x[i] s[i]   (rotate_half)
//!   SwiGLU:   y = (g / (1 + exp(-g))) * u                         (silu(gate) * up)
//! SwiGLU has one `exp` per intermediate value (46K per SmolLM2-135M token, 24M per 512-token prompt,
//! 29 % of a prompt's time in scalar code), so it runs per ISA (`ops/avx512.rs`, `ops/avx2.rs`, with a
//! polynomial exp a few ulp from libm's); the others are plain Rust.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

use crate::isa::Isa;

/// RMSNorm of each `dim`-wide row of `x` into `out`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let dim = w.len();
    for (row, o) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
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
        let inv = 1.0 / (ss / dim as f32 + eps).sqrt();
        for ((o, &v), &g) in o.iter_mut().zip(row).zip(w) {
            *o = g * (v * inv);
        }
    }
}

/// Rotary embedding, in place, of `heads` consecutive heads of `d` values each, with the cos/sin
/// of one position (`cos`, `sin`: d / 2 values each).
pub fn rope(x: &mut [f32], heads: usize, d: usize, cos: &[f32], sin: &[f32]) {
    let half = d / 2;
    for h in x[..heads * d].chunks_exact_mut(d) {
        let (a, b) = h.split_at_mut(half);
        for i in 0..half {
            let (x1, x2) = (a[i], b[i]);
            a[i] = x1 * cos[i] - x2 * sin[i];
            b[i] = x2 * cos[i] + x1 * sin[i];
        }
    }
}

/// out[r, i] = silu(gu[r, i]) * gu[r, n + i] for rows of `gu` = [gate | up] (2n wide). `isa` must be
/// supported by this CPU (the decoder checks it once per step).
pub fn silu_mul(isa: Isa, gu: &[f32], n: usize, out: &mut [f32]) {
    for (row, o) in gu.chunks_exact(2 * n).zip(out.chunks_exact_mut(n)) {
        let (g, u) = row.split_at(n);
        match isa {
            // SAFETY: the tier is supported (the caller's contract).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { avx512::silu_mul_row(g, u, o) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { avx2::silu_mul_row(g, u, o) },
            _ => silu_mul_scalar(g, u, o),
        }
    }
}

/// The scalar reference: out[i] = g[i] / (1 + exp(-g[i])) * u[i].
pub fn silu_mul_scalar(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &gv), &uv) in out.iter_mut().zip(g).zip(u) {
        *o = gv / (1.0 + (-gv).exp()) * uv;
    }
}

/// x += y, elementwise.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// cos and sin tables [positions][d / 2] of the rotary embedding: angle = pos * inv_freq[i] in f32
/// (as HF's f32 matmul of position by frequency), cos/sin evaluated in f64 and rounded once, then
/// multiplied by `scale` in f32 (HF's attention_scaling).
pub fn rope_tables(inv_freq: &[f32], positions: usize, scale: f32) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let mut cos = vec![0.0f32; positions * half];
    let mut sin = vec![0.0f32; positions * half];
    for p in 0..positions {
        for (i, &f) in inv_freq.iter().enumerate() {
            let angle = (p as f32 * f) as f64;
            cos[p * half + i] = (angle.cos() as f32) * scale;
            sin[p * half + i] = (angle.sin() as f32) * scale;
        }
    }
    (cos, sin)
}
