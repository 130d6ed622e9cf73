//! AVX2 + FMA tier of `panel_linear`: 8 f32 lanes. A panel is processed in two halves; each half is
//! 16 of its 32 outputs in two vectors per x row (bf16: one 32-byte load per k step, `<< 16` gives
//! rows h*8..h*8+8, `& 0xffff0000` rows 16+h*8..; see the layout in `panel.rs`). Up to 6 x rows share
//! each load (12 accumulators).
//!
//! Numerical contract (`panel.rs`'s, the same for every row count): each `KC` block of k summed by
//! f32 FMA in k order from zero, the blocks' sums added in k order, the bias last.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{Job, PanelWeight, KC, PANEL};

const MR: usize = 6;
/// Panel lines prefetched ahead (as in the AVX-512 tier).
const PREFETCH_ONE: usize = 32;
const PREFETCH_TILE: usize = 24;

/// Half `h` of k step `kk` of a panel at `w`, widened: (rows 8h..8h+8, rows 16+8h..16+8h+8).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn load16<const BF16: bool>(w: *const u8, kk: usize, h: usize) -> (__m256, __m256) {
    if BF16 {
        let v = _mm256_loadu_si256(w.add(kk * 64 + h * 32).cast());
        let lo = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v));
        let hi = _mm256_castsi256_ps(_mm256_and_si256(
            v,
            _mm256_set1_epi32(0xffff_0000u32 as i32),
        ));
        (lo, hi)
    } else {
        let p = w.add(kk * 128).cast::<f32>();
        (
            _mm256_loadu_ps(p.add(8 * h)),
            _mm256_loadu_ps(p.add(16 + 8 * h)),
        )
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)] // acc[r] is a register tile indexed by a constant bound
#[allow(clippy::too_many_arguments)]
unsafe fn micro<const BF16: bool, const M: usize>(
    x: *const f32,
    ldx: usize,
    w: *const u8,
    h: usize,
    k0: usize,
    kc: usize,
    acc: &mut [[__m256; 2]; MR],
) {
    let mut a = [[_mm256_setzero_ps(); 2]; M];
    let line = if BF16 { 64 } else { 128 };
    for kk in k0..k0 + kc {
        if h == 0 {
            // Prefetching never faults; the address is formed with wrapping arithmetic.
            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add((kk + PREFETCH_TILE) * line).cast());
        }
        let (lo, hi) = load16::<BF16>(w, kk, h);
        for r in 0..M {
            let xb = _mm256_set1_ps(*x.add(r * ldx + kk));
            a[r][0] = _mm256_fmadd_ps(xb, lo, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(xb, hi, a[r][1]);
        }
    }
    acc[..M].copy_from_slice(&a);
}

/// One x row, half `h`, over the whole of k with prefetch, in `KC` blocks summed as the GEMM path
/// sums them (so a row's outputs do not depend on how many rows its call has).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn one_row<const BF16: bool>(
    x: *const f32,
    w: *const u8,
    k: usize,
    h: usize,
) -> [__m256; 2] {
    let line = if BF16 { 64 } else { 128 };
    let mut total = [_mm256_setzero_ps(); 2];
    let mut k0 = 0;
    while k0 < k {
        let end = (k0 + KC).min(k);
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for kk in k0..end {
            if h == 0 {
                _mm_prefetch::<_MM_HINT_T1>(w.wrapping_add((kk + PREFETCH_ONE) * line).cast());
            }
            let (lo, hi) = load16::<BF16>(w, kk, h);
            let xb = _mm256_set1_ps(*x.add(kk));
            a0 = _mm256_fmadd_ps(xb, lo, a0);
            a1 = _mm256_fmadd_ps(xb, hi, a1);
        }
        total = if k0 == 0 {
            [a0, a1]
        } else {
            [_mm256_add_ps(total[0], a0), _mm256_add_ps(total[1], a1)]
        };
        k0 = end;
    }
    total
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

/// # Safety
/// The CPU must support AVX2 and FMA; `job` must satisfy `panel_linear`'s length contract; no other
/// thread may write the columns of `panels` concurrently.
pub unsafe fn panels(job: &Job<'_>, panels: Range<usize>) {
    match job.w {
        PanelWeight::Bf16 { data, .. } => run::<true>(job, data.as_ptr().cast(), panels),
        PanelWeight::F32 { data, .. } => run::<false>(job, data.as_ptr().cast(), panels),
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn run<const BF16: bool>(job: &Job<'_>, base: *const u8, panels: Range<usize>) {
    let (m, k) = (job.m, job.w.k());
    let esize = if BF16 { 2 } else { 4 };
    let x = job.x.as_ptr();
    for p in panels {
        let w = base.add(p * k * PANEL * esize);
        let col = p * PANEL;
        for h in 0..2 {
            let (c_lo, c_hi) = (col + 8 * h, col + 16 + 8 * h);
            if m == 1 {
                let [lo, hi] = one_row::<BF16>(x, w, k, h);
                store8(job, 0, c_lo, lo, false, true);
                store8(job, 0, c_hi, hi, false, true);
                continue;
            }
            let mut k0 = 0;
            while k0 < k {
                let kb = KC.min(k - k0);
                let last = k0 + kb == k;
                let mut i = 0;
                while i < m {
                    let rows = (m - i).min(MR);
                    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
                    let f = match rows {
                        6 => micro::<BF16, 6>,
                        5 => micro::<BF16, 5>,
                        4 => micro::<BF16, 4>,
                        3 => micro::<BF16, 3>,
                        2 => micro::<BF16, 2>,
                        _ => micro::<BF16, 1>,
                    };
                    f(x.add(i * k), k, w, h, k0, kb, &mut acc);
                    for (r, a) in acc.iter().take(rows).enumerate() {
                        store8(job, i + r, c_lo, a[0], k0 > 0, last);
                        store8(job, i + r, c_hi, a[1], k0 > 0, last);
                    }
                    i += rows;
                }
                k0 += kb;
            }
        }
    }
}
