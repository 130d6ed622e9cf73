//! The decoder's small pointwise steps, each computing exactly what Hugging Face's float32 modules do
//! (same operations in the same order per element):
//!   rotary:    y[i] = x[i] c[i] - x[i+h] s[i],  y[i+h] = x[i+h] c[i] + x[i] s[i]  for i < h, over the
//!              first 2h values of each head (rotate_half; partial rotary leaves the rest as is)
//!   residual:  x = x + y * m  (m = 1: x + y)
//!   clip:      x = clamp(x, -c, c)
//!   scale:     x = x * m;  divide: x = x / d
//! Norms are in `norm.rs`, activations and soft-capping in `crate::vmath`.

/// Rotary embedding, in place, of `heads` consecutive heads of `d` values each, with the cos/sin
/// of one position (`cos`, `sin`: h values each, 2h <= d).
pub fn rope(x: &mut [f32], heads: usize, d: usize, cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    for h in x[..heads * d].chunks_exact_mut(d) {
        let (a, b) = h[..2 * half].split_at_mut(half);
        for i in 0..half {
            let (x1, x2) = (a[i], b[i]);
            a[i] = x1 * cos[i] - x2 * sin[i];
            b[i] = x2 * cos[i] + x1 * sin[i];
        }
    }
}

/// x += y, elementwise.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// x += y * m, elementwise (Granite's `residual + hidden * residual_multiplier`); m = 1 adds.
pub fn add_scaled(x: &mut [f32], y: &[f32], m: f32) {
    if m == 1.0 {
        return add_in_place(x, y);
    }
    for (a, b) in x.iter_mut().zip(y) {
        *a += b * m;
    }
}

/// x = clamp(x, -c, c) (OLMo's clip_qkv; NaN stays NaN, as torch's clamp).
pub fn clip(x: &mut [f32], c: f32) {
    for v in x {
        if *v > c {
            *v = c;
        } else if *v < -c {
            *v = -c;
        }
    }
}

/// x *= m.
pub fn scale(x: &mut [f32], m: f32) {
    for v in x {
        *v *= m;
    }
}

/// x /= d.
pub fn divide(x: &mut [f32], d: f32) {
    for v in x {
        *v /= d;
    }
}

/// cos and sin tables [positions][h] of a rotary embedding with h = inv_freq.len(): angle =
/// pos * inv_freq[i] in f32 (as HF's f32 product of position and frequency), cos/sin evaluated in f64
/// and rounded once, then multiplied by `scale` in f32 (HF's attention_scaling).
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
