//! Q6K and Q6K16: super-blocks of 256 values with 6-bit codes (llama.cpp's Q6_K class), per output row.
//!
//! - `Q6K`: value = (d * sc) * (u - 32), u in [0, 63] (stored unsigned, as `vpdpbusd` wants), sc an i8 per
//!   32-value sub-block under an f16 d per super-block: 6.3125 bits per weight.
//! - `Q6K16`: the same codes with an i8 scale per 16 values: 6.5625 bits per weight, llama.cpp's Q6_K, so a
//!   GGUF file's Q6_K tensors run as they are (`gguf.rs`).
//!
//! Packed layout: `kblock.rs`.
//!
//! Quantizer: each sub-block a symmetric grid of 64 levels (-32..=31) whose scale is fitted as llama.cpp's
//! `make_qx_quants` does (`fit_sym`: 19 trial scales around the one mapping the largest |w| to -32, weighted
//! least squares for each); the super-block's f16 d maps the largest |scale| to 127 (a few d around it tried,
//! `fit.rs`'s `best_d`), each sub-block keeps an i8 multiple of d, and the codes are chosen again for it.

use crate::quant::fit::{best_d, error_weights};

/// One Q6K super-block: writes codes `c + 32` and i8 scales (as u8) into `subs`, returns d
/// (f16-representable, possibly negative). `len`: values per scale (32: Q6K, 16: Q6K16).
pub(crate) fn fit_q6k(
    x: &[f32],
    imp: Option<&[f32]>,
    codes: &mut [u8],
    subs: &mut [u8],
    len: usize,
) -> f32 {
    let t = x.len() / len;
    let mut scale = vec![0.0f32; t];
    let mut wts: Vec<Vec<f32>> = Vec::with_capacity(t);
    for s in 0..t {
        let xs = &x[s * len..(s + 1) * len];
        let wt = error_weights(xs, imp.map(|v| &v[s * len..(s + 1) * len]), |v| v * v);
        scale[s] = fit_sym(xs, &wt);
        wts.push(wt);
    }
    // The scale of largest magnitude, with its sign: it maps to -128 / 127 as Q6_K's do.
    let smax = scale
        .iter()
        .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
    // For d: each sub-block's scale rounded to an i8 multiple of d, x coded for it.
    best_d(smax, 127.0, |d| {
        let mut err = 0.0f32;
        for (s, wt) in wts.iter().enumerate() {
            let sc = if d != 0.0 {
                (scale[s] / d).round().clamp(-127.0, 127.0)
            } else {
                0.0
            };
            subs[s] = sc as i8 as u8;
            let ds = d * sc;
            for i in s * len..(s + 1) * len {
                let c = if ds != 0.0 {
                    (x[i] / ds).round().clamp(-32.0, 31.0)
                } else {
                    0.0
                };
                codes[i] = (c as i32 + 32) as u8;
                let e = ds * c - x[i];
                err += wt[i - s * len] * e * e;
            }
        }
        err
    })
}

/// A symmetric 64-level grid's scale for one sub-block (codes -32..=31, the extreme value at -32).
fn fit_sym(x: &[f32], wt: &[f32]) -> f32 {
    let max = x
        .iter()
        .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
    if max.abs() < 1e-30 {
        return 0.0;
    }
    let (mut best_scale, mut best) = (0.0f32, 0.0f32);
    for step in -9..=9 {
        let iscale = -(32.0 + 0.1 * step as f32) / max;
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for (&v, &w) in x.iter().zip(wt) {
            let l = (iscale * v).round().clamp(-32.0, 31.0);
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        // Least squares scale sumlx / suml2 removes sumlx^2 / suml2 of the error: keep the largest.
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            (best_scale, best) = (sumlx / suml2, sumlx * sumlx / suml2);
        }
    }
    best_scale
}
