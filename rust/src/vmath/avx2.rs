//! AVX2 tier of `vmath`: 8 lanes; a tail runs through a padded vector, so it gets exactly the vector
//! path's result. exp is the attention kernels' `exp8`; tanh and erf as described in `vmath`.

use std::arch::x86_64::*;

use super::generic::{GELU_BETA, GELU_KAPPA};
use super::stamp::lane_math;
use super::Act;
use crate::attention::avx2::exp8;

#[target_feature(enable = "avx2,fma")]
#[inline]
fn abs8(x: __m256) -> __m256 {
    _mm256_andnot_ps(_mm256_set1_ps(-0.0), x)
}

/// x with `x_sign`'s sign bit or-ed in (x is non-negative here, so this copies the sign).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn or_sign8(x: __m256, x_sign: __m256) -> __m256 {
    _mm256_or_ps(x, _mm256_and_ps(x_sign, _mm256_set1_ps(-0.0)))
}

/// `yes` where a < b, else `no`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn select_lt8(a: __m256, b: __m256, yes: __m256, no: __m256) -> __m256 {
    _mm256_blendv_ps(no, yes, _mm256_cmp_ps::<_CMP_LT_OQ>(a, b))
}

lane_math! {
    features: "avx2,fma", vector: __m256, exp: exp8, abs: abs8, or_sign: or_sign8, select_lt: select_lt8,
    ops: [_mm256_set1_ps, _mm256_setzero_ps, _mm256_add_ps, _mm256_sub_ps, _mm256_mul_ps, _mm256_div_ps, _mm256_fmadd_ps, _mm256_and_ps, _mm256_xor_ps, _mm256_max_ps]
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
        _mm256_storeu_ps(
            out.as_mut_ptr().add(i),
            _mm256_mul_ps(activate(act, gv), uv),
        );
        i += 8;
    }
    if i < n {
        let (mut tg, mut tu) = ([0.0f32; 8], [0.0f32; 8]);
        tg[..n - i].copy_from_slice(&g[i..]);
        tu[..n - i].copy_from_slice(&u[i..]);
        let y = _mm256_mul_ps(
            activate(act, _mm256_loadu_ps(tg.as_ptr())),
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
    map(x, |v| activate(act, v));
}

/// x[i] = tanh(x[i] / cap) * cap.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn softcap(x: &mut [f32], cap: f32) {
    let c = _mm256_set1_ps(cap);
    map(x, |v| _mm256_mul_ps(tanh(_mm256_div_ps(v, c)), c));
}
