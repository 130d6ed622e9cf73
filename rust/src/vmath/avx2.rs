//! AVX2 tier of `vmath`: 8 lanes; a tail runs through a padded vector, so it gets exactly the vector
//! path's result. exp is the attention kernels' `exp8`; tanh and erf as described in `vmath`.

use std::arch::x86_64::*;

use super::generic::{GELU_BETA, GELU_KAPPA};
use super::Act;
use crate::attention::avx2::exp8;

#[target_feature(enable = "avx2,fma")]
#[inline]
fn abs8(x: __m256) -> __m256 {
    _mm256_andnot_ps(_mm256_set1_ps(-0.0), x)
}

/// tanh(x): Cephes' odd polynomial below |x| = 0.625, else sign(x) * (1 - 2 / (exp(2|x|) + 1)).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn tanh8(x: __m256) -> __m256 {
    let ax = abs8(x);
    let z = _mm256_mul_ps(x, x);
    let mut p = _mm256_set1_ps(-5.704_988_7e-3);
    for c in [2.063_909e-2, -5.373_971_6e-2, 1.333_144_2e-1, -3.333_328e-1] {
        p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(c));
    }
    let small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
    let one = _mm256_set1_ps(1.0);
    let e = exp8(_mm256_add_ps(ax, ax));
    let large = _mm256_sub_ps(
        one,
        _mm256_div_ps(_mm256_set1_ps(2.0), _mm256_add_ps(e, one)),
    );
    let large = _mm256_or_ps(large, _mm256_and_ps(x, _mm256_set1_ps(-0.0)));
    let is_small = _mm256_cmp_ps::<_CMP_LT_OQ>(ax, _mm256_set1_ps(0.625));
    _mm256_blendv_ps(large, small, is_small)
}

/// erf(x) as torch's vectorised erf computes it (Abramowitz-Stegun 7.1.26).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn erf8(x: __m256) -> __m256 {
    let neg_zero = _mm256_set1_ps(-0.0);
    let one = _mm256_set1_ps(1.0);
    let sign = _mm256_and_ps(neg_zero, x);
    let ax = abs8(x);
    let t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.327_591_1), ax, one));
    let mut r = _mm256_fmadd_ps(_mm256_set1_ps(1.061_405_4), t, _mm256_set1_ps(-1.453_152));
    for c in [1.421_413_7, -0.284_496_74, 0.254_829_6] {
        r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(c));
    }
    let e = exp8(_mm256_xor_ps(neg_zero, _mm256_mul_ps(x, x)));
    let y = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_xor_ps(neg_zero, e), t), r, one);
    _mm256_xor_ps(sign, y)
}

#[target_feature(enable = "avx2,fma")]
#[inline]
fn act8(act: Act, x: __m256) -> __m256 {
    let one = _mm256_set1_ps(1.0);
    match act {
        Act::Silu => _mm256_div_ps(
            x,
            _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))),
        ),
        Act::GeluTanh => {
            let cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
            let inner = _mm256_mul_ps(
                _mm256_set1_ps(GELU_BETA),
                _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(GELU_KAPPA), cube)),
            );
            let half_x = _mm256_mul_ps(_mm256_set1_ps(0.5), x);
            _mm256_mul_ps(half_x, _mm256_add_ps(one, tanh8(inner)))
        }
        Act::GeluErf => {
            let e = erf8(_mm256_mul_ps(
                x,
                _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2),
            ));
            _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.5)), _mm256_add_ps(one, e))
        }
        // max(x, 0) returns its second operand for NaN: put x second so NaN stays NaN.
        Act::Relu => _mm256_max_ps(_mm256_setzero_ps(), x),
    }
}

/// Runs `f` over `x` 8 lanes at a time, the tail through a zero-padded vector.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn map(x: &mut [f32], f: impl Fn(__m256) -> __m256) {
    let n = x.len();
    let p = x.as_mut_ptr();
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(p.add(i), f(_mm256_loadu_ps(p.add(i))));
        i += 8;
    }
    if i < n {
        let mut tmp = [0.0f32; 8];
        tmp[..n - i].copy_from_slice(&x[i..]);
        _mm256_storeu_ps(tmp.as_mut_ptr(), f(_mm256_loadu_ps(tmp.as_ptr())));
        x[i..].copy_from_slice(&tmp[..n - i]);
    }
}

/// out[i] = act(g[i]) * u[i].
///
/// # Safety
/// The CPU must support AVX2 and FMA; the slices have equal lengths.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn act_mul(act: Act, g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = out.len();
    let mut i = 0;
    while i + 8 <= n {
        let gv = _mm256_loadu_ps(g.as_ptr().add(i));
        let uv = _mm256_loadu_ps(u.as_ptr().add(i));
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(act8(act, gv), uv));
        i += 8;
    }
    if i < n {
        let (mut tg, mut tu) = ([0.0f32; 8], [0.0f32; 8]);
        tg[..n - i].copy_from_slice(&g[i..]);
        tu[..n - i].copy_from_slice(&u[i..]);
        let y = _mm256_mul_ps(
            act8(act, _mm256_loadu_ps(tg.as_ptr())),
            _mm256_loadu_ps(tu.as_ptr()),
        );
        _mm256_storeu_ps(tg.as_mut_ptr(), y);
        out[i..].copy_from_slice(&tg[..n - i]);
    }
}

/// x[i] = act(x[i]).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn act_in_place(act: Act, x: &mut [f32]) {
    map(x, |v| act8(act, v));
}

/// x[i] = tanh(x[i] / cap) * cap.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softcap(x: &mut [f32], cap: f32) {
    let c = _mm256_set1_ps(cap);
    map(x, |v| _mm256_mul_ps(tanh8(_mm256_div_ps(v, c)), c));
}
