//! AVX-512 tier of `vmath`: 16 lanes, masked tails (a tail gets exactly the vector path's result).
//! exp is the attention kernels' `exp16`; tanh and erf as described in `vmath`.

use std::arch::x86_64::*;

use super::generic::{GELU_BETA, GELU_KAPPA};
use super::stamp::lane_math;
use super::Act;
use crate::attention::avx512::{exp16, lanes};

/// x with `x_sign`'s sign bit or-ed in (x is non-negative here, so this copies the sign).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
fn or_sign16(x: __m512, x_sign: __m512) -> __m512 {
    let sign = _mm512_and_si512(_mm512_castps_si512(x_sign), _mm512_set1_epi32(i32::MIN));
    _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(x), sign))
}

/// `yes` where a < b, else `no`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
fn select_lt16(a: __m512, b: __m512, yes: __m512, no: __m512) -> __m512 {
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b), no, yes)
}

lane_math! {
    features: "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma", vector: __m512, exp: exp16,
    abs: _mm512_abs_ps, or_sign: or_sign16, select_lt: select_lt16,
    ops: [_mm512_set1_ps, _mm512_setzero_ps, _mm512_add_ps, _mm512_sub_ps, _mm512_mul_ps, _mm512_div_ps, _mm512_fmadd_ps, _mm512_and_ps, _mm512_xor_ps, _mm512_max_ps]
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
            _mm512_mul_ps(activate(act, gv), uv),
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
        _mm512_mask_storeu_ps(p.add(i), m, activate(act, v));
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
        _mm512_mask_storeu_ps(p.add(i), m, _mm512_mul_ps(tanh(_mm512_div_ps(v, c)), c));
        i += 16;
    }
}
