//! The quantizers: f32 weights to the reference form (`QuantRows`), one block at a time.
//!
//! - Q8, Q80: d = s * max|w| / 127 for the s in `Q8_SHRINK` that minimises the weighted squared error
//!   (s = 1 is Q8_0's rule; a slightly smaller d rounds most values closer at the cost of clipping
//!   the largest), c = round(w / d).
//! - Q4: an asymmetric grid, d * c + m with c in 0..=15, fitted as llama.cpp's `make_qkx2_quants`
//!   does: 21 trial grids around (max - min) / 15, each followed by the weighted least-squares d and m
//!   for its codes; the best is rounded to f16 and the codes are chosen again for the rounded values.
//!
//! - Q40, Q50: d * (c - z), c in 0..2z, as llama.cpp's Q4_0 / Q5_0: d = s * max / -z for the value of
//!   largest magnitude (it takes the code 0, where the range is one step longer), for the s in
//!   `ZERO_SHRINK` of least weighted error (s = 1 is ggml's rule), rounded to f16 before the codes are
//!   chosen for it.
//!
//! Weights of the squared error: with an importance vector (the mean of x^2 per input column over a
//! calibration text), `imp[col] * sqrt(sigma2 + w^2)` as llama.cpp's imatrix quantizers use; without,
//! the data-free `mean|w| + |w|` (Q4) or 1 (Q8).

use super::fit_k::{fit_q4k, fit_q6k};
use super::kblock::subs_per_block;
use super::{f16_to_f32, f32_to_f16, Format, QuantRows, QSUB};

/// Candidate shrink factors of the Q8 scale.
const Q8_SHRINK: [f32; 5] = [1.0, 0.995, 0.99, 0.985, 0.98];

/// Candidate shrink factors of the Q40 / Q50 scale.
const ZERO_SHRINK: [f32; 6] = [1.0, 0.97, 0.94, 0.91, 0.88, 0.85];

/// How to quantize one matrix.
#[derive(Clone, Copy, Debug)]
pub struct QuantOptions<'a> {
    pub format: Format,
    /// Per input column (k values), >= 0: how much each column's error costs.
    pub importance: Option<&'a [f32]>,
    /// Threads to quantize rows on (the calling thread is one of them).
    pub threads: usize,
}

/// Quantizes a row-major [n, k] matrix. Errors (never panics) name what is wrong with the input.
pub fn quantize(
    w: &[f32],
    n: usize,
    k: usize,
    opt: &QuantOptions<'_>,
) -> Result<QuantRows, String> {
    let f = opt.format;
    let bs = f.block();
    if n.checked_mul(k) != Some(w.len()) {
        return Err(format!("{} values for a [{n}, {k}] matrix", w.len()));
    }
    if k == 0 || !k.is_multiple_of(f.granule()) {
        return Err(format!(
            "its input size k = {k} is not a multiple of the {} block ({} values)",
            f.name(),
            f.granule()
        ));
    }
    if let Some(bad) = w.iter().position(|v| !v.is_finite()) {
        return Err(format!(
            "weight [{}, {}] is {} (non-finite weights cannot be quantized)",
            bad / k,
            bad % k,
            w[bad]
        ));
    }
    if let Some(imp) = opt.importance {
        if imp.len() != k {
            return Err(format!(
                "the importance vector has {} values, expected k = {k}",
                imp.len()
            ));
        }
        if imp.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return Err("the importance vector must be finite and >= 0".into());
        }
    }
    let nb = k.div_ceil(bs);
    let per = if f.is_super() { subs_per_block(f) } else { 0 };
    let mut q = QuantRows::zeros(f, n, k);
    let threads = opt.threads.clamp(1, n.max(1));
    let rows_per = n.div_ceil(threads).max(1);
    let mut min_chunks: Vec<&mut [f32]> = q.mins.chunks_mut(rows_per * nb).collect();
    let sub_len = (rows_per * k / QSUB * per).max(1);
    let mut sub_chunks: Vec<&mut [u8]> = q.subs.chunks_mut(sub_len).collect();
    std::thread::scope(|s| {
        let mut mins_iter = min_chunks.iter_mut();
        let mut subs_iter = sub_chunks.iter_mut();
        for (t, (codes, scales)) in q
            .codes
            .chunks_mut(rows_per * k)
            .zip(q.scales.chunks_mut(rows_per * nb))
            .enumerate()
        {
            let mut mins: Option<&mut [f32]> = mins_iter.next().map(|m| &mut **m);
            let mut subs: Option<&mut [u8]> = subs_iter.next().map(|m| &mut **m);
            let rows = &w[t * rows_per * k..(t * rows_per * k + codes.len()).min(w.len())];
            let imp = opt.importance;
            s.spawn(move || {
                for (r, row) in rows.chunks_exact(k).enumerate() {
                    for b in 0..nb {
                        let cols = b * bs..((b + 1) * bs).min(k);
                        let x = &row[cols.clone()];
                        let wi = imp.map(|v| &v[cols.clone()]);
                        let c = &mut codes[r * k + cols.start..r * k + cols.end];
                        // This super-block's sub-block scales (within this thread's rows).
                        let sub =
                            (r * k + cols.start) / QSUB * per..(r * k + cols.end) / QSUB * per;
                        match f {
                            Format::Q8 => scales[r * nb + b] = fit_q8(x, wi, c, false),
                            Format::Q80 => scales[r * nb + b] = fit_q8(x, wi, c, true),
                            Format::Q40 | Format::Q50 => {
                                let z = f.zero_point().expect("q4_0 and q5_0 have zero points");
                                scales[r * nb + b] = fit_zero(x, wi, c, z);
                            }
                            Format::Q4 => {
                                let (d, m) = fit_q4(x, wi, c);
                                scales[r * nb + b] = d;
                                mins.as_deref_mut().expect("q4 has mins")[r * nb + b] = m;
                            }
                            Format::Q4K => {
                                let sv = &mut subs.as_deref_mut().expect("q4k has subs")[sub];
                                let (d, m) = fit_q4k(x, wi, c, sv);
                                scales[r * nb + b] = d;
                                mins.as_deref_mut().expect("q4k has mins")[r * nb + b] = m;
                            }
                            Format::Q6K | Format::Q6K16 => {
                                let sv = &mut subs.as_deref_mut().expect("q6k has subs")[sub];
                                let len = QSUB / subs_per_block(f);
                                scales[r * nb + b] = fit_q6k(x, wi, c, sv, len);
                            }
                        }
                    }
                }
            });
        }
    });
    // f16 scales and mins overflow past 65504: such a matrix cannot be stored as q4.
    if q.scales.iter().chain(&q.mins).any(|v| !v.is_finite()) {
        return Err(
            "its values are too large for q4's f16 scales (a block spans more than ~1e6, or a \
                    value exceeds 65504); store it as q8"
                .into(),
        );
    }
    Ok(q)
}

pub(crate) fn error_weights(
    x: &[f32],
    imp: Option<&[f32]>,
    data_free: impl Fn(f32) -> f32,
) -> Vec<f32> {
    match imp {
        Some(imp) => {
            let sigma2 = 2.0 * x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
            x.iter()
                .zip(imp)
                .map(|(&v, &i)| i * (sigma2 + v * v).sqrt())
                .collect()
        }
        None => x.iter().map(|&v| data_free(v)).collect(),
    }
}

/// One Q8 block: writes `c + 128` into `codes`, returns d (f16-representable when `half`: Q80 stores its
/// scales as f16, as ggml's Q8_0, so every candidate is rounded before the codes are chosen for it).
fn fit_q8(x: &[f32], imp: Option<&[f32]>, codes: &mut [u8], half: bool) -> f32 {
    let round = |d: f32| if half { f16_to_f32(f32_to_f16(d)) } else { d };
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    if amax == 0.0 {
        codes.fill(128);
        return 0.0;
    }
    let wt = error_weights(x, imp, |_| 1.0);
    let (mut best, mut best_err) = (round(amax / 127.0), f32::INFINITY);
    for s in Q8_SHRINK {
        let d = round(s * amax / 127.0);
        if d == 0.0 {
            continue; // below f16's range: the block stays at the first candidate
        }
        let err: f32 = x
            .iter()
            .zip(&wt)
            .map(|(&v, &w)| {
                let c = (v / d).round().clamp(-127.0, 127.0);
                w * (v - d * c) * (v - d * c)
            })
            .sum();
        if err < best_err {
            (best, best_err) = (d, err);
        }
    }
    for (c, &v) in codes.iter_mut().zip(x) {
        let q = if best == 0.0 {
            0.0
        } else {
            (v / best).round().clamp(-127.0, 127.0)
        };
        *c = (q as i32 + 128) as u8;
    }
    best
}

/// One Q40 / Q50 block (zero point z): writes codes 0..2z - 1, returns d (f16-representable).
fn fit_zero(x: &[f32], imp: Option<&[f32]>, codes: &mut [u8], z: i32) -> f32 {
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
fn fit_q4(x: &[f32], imp: Option<&[f32]>, codes: &mut [u8]) -> (f32, f32) {
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
