//! AVX2 + FMA tier of `panel_linear`: 8 f32 lanes. A panel is processed in two halves; each half is
//! 16 of its 32 outputs in two vectors per x row (bf16: one 32-byte load per k step, `<< 16` gives
//! rows h*8..h*8+8, `& 0xffff0000` rows 16+h*8..; see the layout in `preserve_linear.rs`). Up to 6 x rows share
//! each load (12 accumulators).
//!
//! Numerical contract (`preserve_linear.rs`'s, the same for every row count): each `KC` block of k summed by
//! f32 FMA in k order from zero, the blocks' sums added in k order, the bias last.

use std::arch::x86_64::*;
use std::ops::Range;

use super::driver::{panel_tier, PREFETCH_ONE, PREFETCH_TILE};
use super::{Job, PanelWeight, KC, PANEL};

const MR: usize = 6;

/// Half `H` of k step `kk` of a panel at `w`, widened: (rows 8H..8H+8, rows 16+8H..16+8H+8).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn load<const BF16: bool, const H: usize>(w: *const u8, kk: usize) -> (__m256, __m256) {
    if BF16 {
        let v = _mm256_loadu_si256(w.add(kk * 64 + H * 32).cast());
        let odd = _mm256_and_si256(v, _mm256_set1_epi32(0xffff_0000u32 as i32));
        (
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
            _mm256_castsi256_ps(odd),
        )
    } else {
        let p = w.add(kk * 128).cast::<f32>();
        (
            _mm256_loadu_ps(p.add(8 * H)),
            _mm256_loadu_ps(p.add(16 + 8 * H)),
        )
    }
}

/// Stores (or adds) 8 outputs at column `col` of row `i`, keeping columns < n.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn store8(job: &Job<'_>, i: usize, col: usize, mut v: __m256, add: bool, bias: bool) {
    let n = job.w.n();
    if col >= n {
        return;
    }
    let valid = (n - col).min(8) as i32;
    let mask = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(valid),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    let y = job.y.get().add(i * n + col);
    if add {
        v = _mm256_add_ps(_mm256_maskload_ps(y, mask), v);
    }
    if bias {
        if let Some(b) = job.bias {
            v = _mm256_add_ps(v, _mm256_maskload_ps(b.as_ptr().add(col), mask));
        }
    }
    _mm256_maskstore_ps(y, mask, v);
}

/// Stores (or adds) half `H` of a panel's outputs for row `i`: `v` holds columns col + 8H.. and
/// col + 16 + 8H.. .
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn store<const H: usize>(
    job: &Job<'_>,
    i: usize,
    col: usize,
    v: [__m256; 2],
    add: bool,
    bias: bool,
) {
    store8(job, i, col + 8 * H, v[0], add, bias);
    store8(job, i, col + 16 + 8 * H, v[1], add, bias);
}

panel_tier! {
    features: "avx2,fma",
    vector: __m256,
    zero: _mm256_setzero_ps,
    add: _mm256_add_ps,
    fmadd: _mm256_fmadd_ps,
    splat: _mm256_set1_ps,
    halves: [0 1],
    heights: [6 5 4 3 2],
}
