//! AVX-512 tier of the decoder's SwiGLU: silu(g) * u over 16 lanes, exp by the attention kernels'
//! polynomial (a few ulp; torch's own vectorised exp is within 1 ulp), otherwise the same operations
//! in the same order as `ops::silu_mul`: g / (1 + exp(-g)) * u.

use std::arch::x86_64::*;

use crate::attention::avx512::exp16;

/// out[i] = g[i] / (1 + exp(-g[i])) * u[i] for equally long slices.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub unsafe fn silu_mul_row(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = g.len().min(u.len()).min(out.len());
    let one = _mm512_set1_ps(1.0);
    let mut i = 0;
    while i < n {
        let m: __mmask16 = if n - i >= 16 {
            !0
        } else {
            (1u16 << (n - i)) - 1
        };
        let gv = _mm512_maskz_loadu_ps(m, g.as_ptr().add(i));
        let uv = _mm512_maskz_loadu_ps(m, u.as_ptr().add(i));
        let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        let s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(out.as_mut_ptr().add(i), m, _mm512_mul_ps(s, uv));
        i += 16;
    }
}
