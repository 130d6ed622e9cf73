//! AVX-512 tier of `vmath`: 16 lanes, masked tails (a tail gets exactly the vector path's result).
//! exp is the attention kernels' `exp16`; tanh and erf as described in `vmath`.

use std::arch::x86_64::*;

use super::generic::{GELU_BETA, GELU_KAPPA};
use super::Act;
use crate::attention::avx512::{exp16, lanes};

/// tanh(x): Cephes' odd polynomial below |x| = 0.625, else sign(x) * (1 - 2 / (exp(2|x|) + 1)).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
pub(crate) fn tanh16(x: __m512) -> __m512 {
    let ax = _mm512_abs_ps(x);
    let z = _mm512_mul_ps(x, x);
    let mut p = _mm512_set1_ps(-5.704_988_7e-3);
    for c in [2.063_909e-2, -5.373_971_6e-2, 1.333_144_2e-1, -3.333_328e-1] {
        p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(c));
    }
    let small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
    let one = _mm512_set1_ps(1.0);
    let e = exp16(_mm512_add_ps(ax, ax));
    let large = _mm512_sub_ps(
        one,
        _mm512_div_ps(_mm512_set1_ps(2.0), _mm512_add_ps(e, one)),
    );
    // Copy x's sign onto the large branch (|large| carries none).
    let sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN));
    let large = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(large), sign));
    let is_small = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(ax, _mm512_set1_ps(0.625));
    _mm512_mask_blend_ps(is_small, large, small)
}

/// erf(x) as torch's vectorised erf computes it (Abramowitz-Stegun 7.1.26).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
fn erf16(x: __m512) -> __m512 {
    let neg_zero = _mm512_set1_ps(-0.0);
    let one = _mm512_set1_ps(1.0);
    let sign = _mm512_and_ps(neg_zero, x);
    let ax = _mm512_abs_ps(x);
    let t = _mm512_div_ps(one, _mm512_fmadd_ps(_mm512_set1_ps(0.327_591_1), ax, one));
    let mut r = _mm512_fmadd_ps(_mm512_set1_ps(1.061_405_4), t, _mm512_set1_ps(-1.453_152));
    for c in [1.421_413_7, -0.284_496_74, 0.254_829_6] {
        r = _mm512_fmadd_ps(r, t, _mm512_set1_ps(c));
    }
    let e = exp16(_mm512_xor_ps(neg_zero, _mm512_mul_ps(x, x)));
    let y = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_xor_ps(neg_zero, e), t), r, one);
    _mm512_xor_ps(sign, y)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
fn act16(act: Act, x: __m512) -> __m512 {
    let one = _mm512_set1_ps(1.0);
    match act {
        Act::Silu => _mm512_div_ps(
            x,
            _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))),
        ),
        Act::GeluTanh => {
            let cube = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
            let inner = _mm512_mul_ps(
                _mm512_set1_ps(GELU_BETA),
                _mm512_add_ps(x, _mm512_mul_ps(_mm512_set1_ps(GELU_KAPPA), cube)),
            );
            let half_x = _mm512_mul_ps(_mm512_set1_ps(0.5), x);
            _mm512_mul_ps(half_x, _mm512_add_ps(one, tanh16(inner)))
        }
        Act::GeluErf => {
            let e = erf16(_mm512_mul_ps(
                x,
                _mm512_set1_ps(std::f32::consts::FRAC_1_SQRT_2),
            ));
            _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5)), _mm512_add_ps(one, e))
        }
        // max(x, 0) returns its second operand for NaN: put x second so NaN stays NaN.
        Act::Relu => _mm512_max_ps(_mm512_setzero_ps(), x),
    }
}

/// out[i] = act(g[i]) * u[i].
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and FMA; the slices have equal lengths.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub unsafe fn act_mul(act: Act, g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = out.len();
    let mut i = 0;
    while i < n {
        let m = lanes(n - i);
        let gv = _mm512_maskz_loadu_ps(m, g.as_ptr().add(i));
        let uv = _mm512_maskz_loadu_ps(m, u.as_ptr().add(i));
        _mm512_mask_storeu_ps(
            out.as_mut_ptr().add(i),
            m,
            _mm512_mul_ps(act16(act, gv), uv),
        );
        i += 16;
    }
}

/// x[i] = act(x[i]).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub unsafe fn act_in_place(act: Act, x: &mut [f32]) {
    let n = x.len();
    let p = x.as_mut_ptr();
    let mut i = 0;
    while i < n {
        let m = lanes(n - i);
        let v = _mm512_maskz_loadu_ps(m, p.add(i));
        _mm512_mask_storeu_ps(p.add(i), m, act16(act, v));
        i += 16;
    }
}

/// x[i] = tanh(x[i] / cap) * cap.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub unsafe fn softcap(x: &mut [f32], cap: f32) {
    let n = x.len();
    let p = x.as_mut_ptr();
    let c = _mm512_set1_ps(cap);
    let mut i = 0;
    while i < n {
        let m = lanes(n - i);
        let v = _mm512_maskz_loadu_ps(m, p.add(i));
        _mm512_mask_storeu_ps(p.add(i), m, _mm512_mul_ps(tanh16(_mm512_div_ps(v, c)), c));
        i += 16;
    }
}
