//! The super-block quantizers (Q4K, Q6K; layout in `kblock`), one row's super-block at a time.
//!
//! - Q4K: each 32-value sub-block gets its own asymmetric grid, scale and min (min <= 0, subtracted),
//!   fitted as `fit_q4` fits Q4's blocks (21 trial grids, weighted least squares for each); the
//!   super-block's f16 d and dmin are then max scale / 63 and max min / 63, each sub-block's 6-bit sc
//!   and mc the nearest multiples, and the codes are chosen again for those exact values. A few d
//!   around max / 63 are tried and the one with the least weighted error is kept (a slightly larger
//!   d lets the largest scale round down instead of clipping).
//! - Q6K: each sub-block a symmetric grid of 64 levels (-32..=31) whose scale is fitted as llama.cpp's
//!   `make_qx_quants` does (19 trial scales around the one mapping the largest |w| to -32, weighted
//!   least squares for each); the super-block's f16 d maps the largest |scale| to 127, each sub-block
//!   keeps an i8 multiple of d, and the codes are chosen again for it.
//!
//! Error weights are the same as `fit.rs`'s (the importance vector's, or data-free ones).

use super::fit::{error_weights, fit_grid};
use super::kblock::SUBS;
use super::{f16_to_f32, f32_to_f16, QSUB};

/// Trial multipliers of the super-block scale (1 = max / 63 or max / 127).
const D_TRIALS: [f32; 5] = [1.0, 1.01, 1.02, 0.99, 1.03];

/// One Q4K super-block (t sub-blocks of `x`): writes codes 0..=15 and (sc, mc) pairs into `subs`,
/// returns (d, dmin), both f16-representable.
pub(crate) fn fit_q4k(
    x: &[f32],
    imp: Option<&[f32]>,
    codes: &mut [u8],
    subs: &mut [u8],
) -> (f32, f32) {
    let t = x.len() / QSUB;
    let mut scale = [0.0f32; SUBS];
    let mut min = [0.0f32; SUBS];
    let mut wts: Vec<Vec<f32>> = Vec::with_capacity(t);
    for s in 0..t {
        let xs = &x[s * QSUB..(s + 1) * QSUB];
        let av = xs.iter().map(|v| v.abs()).sum::<f32>() / QSUB as f32;
        let wt = error_weights(xs, imp.map(|v| &v[s * QSUB..(s + 1) * QSUB]), |v| {
            av + v.abs()
        });
        let (d, m) = fit_grid(xs, &wt, true);
        (scale[s], min[s]) = (d, -m);
        wts.push(wt);
    }
    let smax = scale[..t].iter().fold(0.0f32, |a, &v| a.max(v));
    let mmax = min[..t].iter().fold(0.0f32, |a, &v| a.max(v));
    let dmin = f16_to_f32(f32_to_f16(mmax / 63.0));
    // For d: each sub-block's scale and min rounded to multiples of (d, dmin), x coded for them.
    let d = best_d(smax, 63.0, |d| {
        let mut err = 0.0f32;
        for (s, wt) in wts.iter().enumerate() {
            let q = |v: f32, by: f32| {
                if by > 0.0 {
                    (v / by).round().clamp(0.0, 63.0)
                } else {
                    0.0
                }
            };
            let (sc, mc) = (q(scale[s], d), q(min[s], dmin));
            (subs[2 * s], subs[2 * s + 1]) = (sc as u8, mc as u8);
            let (ds, dm) = (d * sc, dmin * mc);
            for i in s * QSUB..(s + 1) * QSUB {
                let c = if ds > 0.0 {
                    ((x[i] + dm) / ds).round().clamp(0.0, 15.0)
                } else {
                    0.0
                };
                codes[i] = c as u8;
                let e = ds * c - dm - x[i];
                err += wt[i - s * QSUB] * e * e;
            }
        }
        err
    });
    (d, dmin)
}

/// Of the trial super-block scales (f16-rounded `mul * smax / levels`, `mul` in `D_TRIALS`), the one
/// whose coding has the least weighted squared error, the codes then written again for it: `code(d)`
/// codes the super-block for d and returns that error.
fn best_d(smax: f32, levels: f32, mut code: impl FnMut(f32) -> f32) -> f32 {
    let mut best = (f32::INFINITY, 0.0f32);
    for mul in D_TRIALS {
        let d = f16_to_f32(f32_to_f16(mul * smax / levels));
        let err = code(d);
        if err < best.0 {
            best = (err, d);
        }
        if smax == 0.0 {
            break;
        }
    }
    code(best.1);
    best.1
}

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
