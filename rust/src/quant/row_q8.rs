//! One f32 row quantized to int8 codes under one scale: the rows of the decoder's 8-bit KV cache
//! (`decoder::kv_store::KvStore::Q8`) and the query rows that score against them (`attention`'s integer
//! scores). The scalar reference and an AVX2 tier that gives the same bits: a 512-token prompt of the
//! 135M quantizes 5.9 M cache values, and the libm `roundf` per value of the scalar loop cost ~5 % of it
//! (perf, Xeon, 2026-12-07).
//!
//! Numerical contract: `scale = max|x| / 127` (NaN values ignored by the max), `inv = 1 / scale` (0 for
//! a zero scale), `code = clamp(round(x * inv), -127, 127)` with round half away from zero, and a NaN
//! product stored as 0 (Rust's saturating `as i8`). The AVX2 tier rounds by truncating and adding
//! sign(x) where the dropped part is at least one half (`x - trunc(x)` is exact), which is `roundf`
//! for every finite value; max, division and product are single IEEE operations, so both tiers agree
//! bit for bit.

use crate::isa::Isa;

/// Quantizes `x` into `codes` (same length); returns the row's scale.
pub fn quantize_row(isa: Isa, x: &[f32], codes: &mut [i8]) -> f32 {
    assert_eq!(
        x.len(),
        codes.len(),
        "kv_q8: row and codes differ in length"
    );
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && isa.is_supported() && crate::quant::avx2::usable() {
        // SAFETY: the CPU has AVX2, FMA and F16C (the quantized linears' AVX2 tier, whose packing and
        // max this borrows); the lengths were checked above.
        return unsafe { avx2::quantize_row(x, codes) };
    }
    let _ = isa;
    quantize_row_scalar(x, codes)
}

/// The scalar reference.
pub fn quantize_row_scalar(x: &[f32], codes: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, y| m.max(y.abs()));
    let (scale, inv) = scale_inv(amax);
    for (o, &y) in codes.iter_mut().zip(x) {
        *o = code(y, inv);
    }
    scale
}

/// The row's scale and the multiplier of its values.
#[inline]
fn scale_inv(amax: f32) -> (f32, f32) {
    let scale = amax / 127.0;
    (scale, if scale > 0.0 { 1.0 / scale } else { 0.0 })
}

#[inline]
fn code(y: f32, inv: f32) -> i8 {
    (y * inv).round().clamp(-127.0, 127.0) as i8
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use crate::quant::avx2_acts::{hmax, pack_codes};

    /// `quantize_row_scalar`, 32 values a step (the rest scalar).
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `codes.len() == x.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn quantize_row(x: &[f32], codes: &mut [i8]) -> f32 {
        let n = x.len();
        let main = n / 32 * 32;
        let p = x.as_ptr();
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        // max_ps returns its second operand when either is NaN: with the running max second, a NaN
        // value leaves it unchanged, as f32::max does.
        let mut m = _mm256_setzero_ps();
        for i in (0..main).step_by(8) {
            m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p.add(i)), abs_mask), m);
        }
        let amax = x[main..].iter().fold(hmax(m), |m, y| m.max(y.abs()));
        let (scale, inv) = super::scale_inv(amax);
        let iv = _mm256_set1_ps(inv);
        let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
        let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
        let sign = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
        let round = |v: __m256| {
            let y = _mm256_mul_ps(v, iv);
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
            let frac = _mm256_and_ps(_mm256_sub_ps(y, t), abs_mask);
            let away = _mm256_or_ps(one, _mm256_and_ps(y, sign));
            let r = _mm256_add_ps(
                t,
                _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, half), away),
            );
            // NaN products (ordered-compare false) become 0 before the clamp, as `as i8` makes them.
            let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(y, y));
            _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
        };
        for i in (0..main).step_by(32) {
            let v = pack_codes([0, 8, 16, 24].map(|o| round(_mm256_loadu_ps(p.add(i + o)))));
            _mm256_storeu_si256(codes.as_mut_ptr().add(i).cast(), v);
        }
        for (o, &y) in codes[main..].iter_mut().zip(&x[main..]) {
            *o = super::code(y, inv);
        }
        scale
    }
}

#[cfg(test)]
mod tests {
    use super::{quantize_row, quantize_row_scalar};
    use crate::isa;

    /// Every tier against the scalar reference, bit for bit: lengths on both sides of a step of 32,
    /// exact halves (which round away from zero), the clamp (infinite products too), zero rows, NaN and
    /// infinity.
    #[test]
    fn every_tier_equals_the_scalar_reference() {
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for n in [1, 7, 31, 32, 33, 63, 64, 65, 80, 128, 256] {
            rows.push(
                (0..n)
                    .map(|i| ((i * 37 + 11) % 97) as f32 * 0.173 - 8.1)
                    .collect(),
            );
        }
        // A max of 127 makes the scale 1: every k + 0.5 is an exact half, either sign.
        rows.push(
            std::iter::once(127.0)
                .chain((0..63).map(|i| i as f32 - 31.5))
                .collect(),
        );
        rows.push(vec![0.0; 64]);
        // A subnormal max: 1 / scale overflows, the products are infinite and clamp to +-127.
        rows.push((0..64).map(|i| (i as f32 - 31.0) * 1e-41).collect());
        let mut nan = rows[5].clone();
        nan[3] = f32::NAN;
        nan[40] = f32::NAN;
        rows.push(nan);
        let mut inf = rows[5].clone();
        inf[9] = f32::INFINITY;
        rows.push(inf);
        for tier in isa::supported() {
            for x in &rows {
                let (mut fast, mut reference) = (vec![5i8; x.len()], vec![0i8; x.len()]);
                let s = quantize_row(tier, x, &mut fast);
                let r = quantize_row_scalar(x, &mut reference);
                assert_eq!(s.to_bits(), r.to_bits(), "{} n {}", tier.name(), x.len());
                assert_eq!(fast, reference, "{} n {}", tier.name(), x.len());
            }
        }
    }
}
