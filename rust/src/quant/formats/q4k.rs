//! Q4K: super-blocks of 256 values (llama.cpp's Q4_K class), per output row.
//!
//! value = (d * sc) * c - (dmin * mc), c in [0, 15], sc and mc in [0, 63] per 32-value sub-block under an f16
//! d and dmin per super-block: 4.5 bits per weight. `d * sc` and `dmin * mc` are exact in f32 (an f16 times an
//! integer below 2^8), so the reference, the packed form and every kernel agree on each sub-block's scale and
//! min exactly. A GGUF file's Q4_K tensors come over bit for bit (`gguf.rs`). Packed layout, and the shorter
//! last super-block of a row whose length is not a multiple of 256: `kblock.rs`.
//!
//! Quantizer: each 32-value sub-block gets its own asymmetric grid, scale and min (min <= 0, subtracted),
//! fitted as Q4's blocks are (`fit_grid`: 21 trial grids, weighted least squares for each); the super-block's
//! f16 d and dmin are then max scale / 63 and max min / 63, each sub-block's 6-bit sc and mc the nearest
//! multiples, and the codes are chosen again for those exact values. A few d around max / 63 are tried
//! (`fit.rs`'s `best_d`) and the one with the least weighted error is kept (a slightly larger d lets the
//! largest scale round down instead of clipping).

use super::fit_grid;
use crate::quant::fit::{best_d, error_weights};
use crate::quant::kblock::SUBS;
use crate::quant::{f16_to_f32, f32_to_f16, QSUB};

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
