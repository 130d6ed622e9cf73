//! AVX2 tier of the decoder's SwiGLU (see `avx512.rs`): 8 lanes, the scalar tail as `ops::silu_mul`.

use std::arch::x86_64::*;

use crate::attention::avx2::exp8;

/// out[i] = g[i] / (1 + exp(-g[i])) * u[i] for equally long slices.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn silu_mul_row(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = g.len().min(u.len()).min(out.len());
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        let gv = _mm256_loadu_ps(g.as_ptr().add(i));
        let uv = _mm256_loadu_ps(u.as_ptr().add(i));
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        let s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_mul_ps(s, uv));
        i += 8;
    }
    super::silu_mul_scalar(&g[i..n], &u[i..n], &mut out[i..n]);
}
