//! Q4, Q40 and Q50: 4- and 5-bit codes per 32 values, per output row.
//!
//! - `Q4`: value = d * c + m, c in [0, 15], f16 d and f16 m per 32 values: 5.0 bits per weight (llama.cpp's
//!   Q4_1 class; a GGUF file's Q4_1 tensors come over exactly).
//! - `Q40`, `Q50`: value = d * (c - z), c in [0, 15] (z = 8) or [0, 31] (z = 16), one f16 d per 32 values: 4.5
//!   and 5.5 bits per weight, llama.cpp's Q4_0 and Q5_0.
//!
//! Packed (`weight.rs`'s `pack`), a panel's block holds its 16 rows' f16 scales (Q4: then its f16 mins), then
//! the nibbles: 4 groups of 8 k, 16 rows x 4 bytes, low nibbles k 8g..8g+3, high nibbles 8g+4..8g+7; Q50's
//! fifth bits follow in a bit plane. The kernels compute each block as `d * dot - dm * sum(q)` (dm = -m or
//! z d), Q4K's form, so the nibble formats' prompts run on the super-block path (`superblock.rs`).
//!
//! Quantizers:
//! - Q4: an asymmetric grid fitted as llama.cpp's `make_qkx2_quants` does (`fit_grid`: 21 trial grids around
//!   (max - min) / 15, each followed by the weighted least-squares d and m for its codes); the best is rounded
//!   to f16 and the codes are chosen again for the rounded values.
//! - Q40, Q50: d = s * max / -z for the value of largest magnitude (it takes the code 0, where the range is one
//!   step longer), for the s in `ZERO_SHRINK` of least weighted error (s = 1 is ggml's rule), rounded to f16
//!   before the codes are chosen for it.
//!
//! Error weights: `fit.rs`'s `error_weights` (an importance vector's, else the data-free `mean|w| + |w|`).

use crate::quant::fit::error_weights;
use crate::quant::{f16_to_f32, f32_to_f16};

/// Candidate shrink factors of the Q40 / Q50 scale.
const ZERO_SHRINK: [f32; 6] = [1.0, 0.97, 0.94, 0.91, 0.88, 0.85];

/// One Q40 / Q50 block (zero point z): writes codes 0..2z - 1, returns d (f16-representable).
pub(crate) fn fit_zero(x: &[f32], imp: Option<&[f32]>, codes: &mut [u8], z: i32) -> f32 {
    let top = x
        .iter()
        .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
    // The code of v on the grid d * c - z d, rounded as GPTQ rounds on the same grid (`grid.rs`'s step
    // and offset; floor(t + 0.5) in f32), so that GPTQ under an identity Hessian stores these codes.
    let code = |v: f32, d: f32| -> u8 {
        if d == 0.0 {
            z as u8
        } else {
            let off = -(z as f32) * d;
            ((v - off) / d + 0.5).floor().clamp(0.0, (2 * z - 1) as f32) as u8
        }
    };
    if top == 0.0 {
        codes.fill(z as u8);
        return 0.0;
    }
    let av = x.iter().map(|v| v.abs()).sum::<f32>() / x.len() as f32;
    let wt = error_weights(x, imp, |v| av + v.abs());
    let (mut best, mut best_err) = (0.0f32, f32::INFINITY);
    for s in ZERO_SHRINK {
        let d = f16_to_f32(f32_to_f16(s * top / -(z as f32)));
        let err: f32 = x
            .iter()
            .zip(&wt)
            .map(|(&v, &w)| w * (v - d * (code(v, d) as i32 - z) as f32).powi(2))
            .sum();
        if err < best_err {
            (best, best_err) = (d, err);
        }
    }
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = code(v, best);
    }
    best
}

/// One Q4 block: writes codes 0..=15, returns (d, m), both f16-representable.
pub(crate) fn fit_q4(x: &[f32], imp: Option<&[f32]>, codes: &mut [u8]) -> (f32, f32) {
    let n = x.len() as f32;
    let av = x.iter().map(|v| v.abs()).sum::<f32>() / n;
    let wt = error_weights(x, imp, |v| av + v.abs());
    let (d, m) = fit_grid(x, &wt, false);
    let (d, m) = (f16_to_f32(f32_to_f16(d)), f16_to_f32(f32_to_f16(m)));
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = if d > 0.0 {
            ((v - m) / d).round().clamp(0.0, 15.0) as u8
        } else {
            0
        };
    }
    (d, m)
}

/// The asymmetric 16-level grid d * c + m (c in 0..=15) of least weighted error among 21 trials
/// (unrounded); `nonpos_min` keeps m <= 0 (Q4K subtracts an unsigned min).
pub(crate) fn fit_grid(x: &[f32], wt: &[f32], nonpos_min: bool) -> (f32, f32) {
    let mut lo = x.iter().fold(f32::INFINITY, |a, &v| a.min(v));
    let hi = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    if nonpos_min {
        lo = lo.min(0.0);
    }
    let (mut d, mut m) = (0.0f32, lo);
    if hi > lo {
        let err_of = |d: f32, m: f32, q: &[f32]| -> f32 {
            x.iter()
                .zip(q)
                .zip(wt)
                .map(|((&v, &c), &w)| w * (d * c + m - v).powi(2))
                .sum()
        };
        let mut q = vec![0.0f32; x.len()];
        let grid = |iscale: f32, q: &mut [f32]| {
            for (c, &v) in q.iter_mut().zip(x) {
                *c = (iscale * (v - lo)).round().clamp(0.0, 15.0);
            }
        };
        d = (hi - lo) / 15.0;
        grid(1.0 / d, &mut q);
        let mut best_err = err_of(d, m, &q);
        for step in 0..=20 {
            let iscale = (-1.0 + 0.1 * step as f32 + 15.0) / (hi - lo);
            grid(iscale, &mut q);
            // Weighted least squares for (d, m) given the codes.
            let (mut sw, mut sq, mut sq2, mut sx, mut sqx) =
                (0.0f32, 0.0f32, 0.0f32, 0.0f32, 0.0f32);
            for ((&v, &c), &w) in x.iter().zip(&q).zip(wt) {
                sw += w;
                sq += w * c;
                sq2 += w * c * c;
                sx += w * v;
                sqx += w * c * v;
            }
            let det = sw * sq2 - sq * sq;
            if det <= 0.0 {
                continue;
            }
            let (mut dd, mut mm) = ((sw * sqx - sq * sx) / det, (sq2 * sx - sq * sqx) / det);
            if nonpos_min && mm > 0.0 {
                // The best grid with m = 0 for these codes.
                (dd, mm) = (if sq2 > 0.0 { sqx / sq2 } else { 0.0 }, 0.0);
            }
            let e = err_of(dd, mm, &q);
            if e < best_err && dd > 0.0 {
                (d, m, best_err) = (dd, mm, e);
            }
        }
    }
    (d, m)
}
