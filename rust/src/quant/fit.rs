//! The quantizers' driver: f32 weights to the reference form (`QuantRows`), one block (or super-block) at a
//! time on several threads, each format's own quantizer in `formats/` (Q8 / Q80 in `q8.rs`, Q4 / Q40 / Q50 in
//! `q4.rs`, Q4K in `q4k.rs`, Q6K / Q6K16 in `q6k.rs`), and what they share:
//!
//! - the weights of the squared error every quantizer minimises: with an importance vector (the mean of x^2
//!   per input column over a calibration text), `imp[col] * sqrt(sigma2 + w^2)` as llama.cpp's imatrix
//!   quantizers use; without, a data-free weight each format names (`error_weights`);
//! - the super-block formats' choice of their f16 scale among a few trials (`best_d`).

use super::formats::{fit_q4, fit_q4k, fit_q6k, fit_q8, fit_zero};
use super::kblock::subs_per_block;
use super::{f16_to_f32, f32_to_f16, Format, QuantRows, QSUB};

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

/// Trial multipliers of the super-block scale (1 = max / 63 or max / 127).
const D_TRIALS: [f32; 5] = [1.0, 1.01, 1.02, 0.99, 1.03];

/// Of the trial super-block scales (f16-rounded `mul * smax / levels`, `mul` in `D_TRIALS`), the one
/// whose coding has the least weighted squared error, the codes then written again for it: `code(d)`
/// codes the super-block for d and returns that error.
pub(crate) fn best_d(smax: f32, levels: f32, mut code: impl FnMut(f32) -> f32) -> f32 {
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
