//! AVX-512 (F/BW/VL/DQ) + FMA tier of `linear` (512-bit vectors, 16 f32 lanes, masked tails).
//!
//! GEMV (up to GEMV_MAX_M x rows, memory-bound): each block of 8 weight rows is streamed once
//! and widened in registers (bf16: zero-extend u16 -> u32, shift left 16), while up to 4 x
//! rows reuse it; 8+ independent accumulators hide FMA latency; k tails use masked loads.
//! GEMM (many x rows, compute-bound): BLIS-style. Weight panels of NR=32 columns are packed to
//! f32 per KC-long k block; a 12x32 register tile (24 zmm accumulators) broadcasts x elements;
//! edge columns use masked stores.
//!
//! Numerical contract: f32 FMA accumulation. GEMV: lane l of a vector sums kk % 16 == l
//! (the masked tail lands in the low lanes), lanes are reduced as a tree, then the bias. GEMM:
//! each KC block's sum is added to y in k order, then the bias once after the last block.

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2::{prefetch_ahead, PREFETCH_ROWS};
use super::packed_gemm::{gemm_entry, micro_k_loop, packed_gemm, Blocking, Tile};
use super::{for_each_gemv_tile, Problem, Weight};

/// Up to this many x rows use the GEMV path (measured crossover, see kernel_bench).
pub const GEMV_MAX_M: usize = 16;

/// Fills y[rows x cols] with the GEMV loop.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and FMA. `p` must satisfy the `linear` length
/// contract (x: m*k, w: n*k, bias: n, y points at m*n f32s), `rows`/`cols` must lie within
/// m/n, and no other thread may access the tile of y concurrently.
pub unsafe fn gemv(p: &Problem<'_>, rows: Range<usize>, cols: Range<usize>) {
    debug_assert!(rows.end <= p.m && cols.end <= p.n, "tile outside y");
    match p.w {
        Weight::Bf16(w) => gemv_impl::<true>(p, w.as_ptr().cast(), rows, cols),
        Weight::F32(w) => gemv_impl::<false>(p, w.as_ptr().cast(), rows, cols),
    }
}

/// `w` is the weight base pointer; `BF16` selects how it is read.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn gemv_impl<const BF16: bool>(
    p: &Problem<'_>,
    w: *const u8,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // Tile shapes keep R*G <= 24 accumulators within 32 zmm registers.
    for_each_gemv_tile(
        rows,
        cols,
        |i, j, g| match g {
            1 => tile::<BF16, 8, 1>(p, w, i, j),
            2 => tile::<BF16, 8, 2>(p, w, i, j),
            3 => tile::<BF16, 8, 3>(p, w, i, j),
            _ => {
                tile::<BF16, 4, 4>(p, w, i, j);
                tile::<BF16, 4, 4>(p, w, i, j + 4);
            }
        },
        |i, j, g| match g {
            1 => tile::<BF16, 1, 1>(p, w, i, j),
            2 => tile::<BF16, 1, 2>(p, w, i, j),
            3 => tile::<BF16, 1, 3>(p, w, i, j),
            _ => tile::<BF16, 1, 4>(p, w, i, j),
        },
    );
}

/// 16 weights starting at element `idx`, widened to f32; lanes outside `mask` are 0 and their
/// memory is not touched.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
unsafe fn load_w16<const BF16: bool>(w: *const u8, idx: usize, mask: __mmask16) -> __m512 {
    if BF16 {
        let h = _mm256_maskz_loadu_epi16(mask, w.cast::<i16>().add(idx));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    } else {
        _mm512_maskz_loadu_ps(mask, w.cast::<f32>().add(idx))
    }
}

/// y[i+g][j+r] = dot(x row i+g, w row j+r) + bias, for g < G, r < R.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
unsafe fn tile<const BF16: bool, const R: usize, const G: usize>(
    p: &Problem<'_>,
    w: *const u8,
    i: usize,
    j: usize,
) {
    let k = p.k;
    let x = p.x.as_ptr().add(i * k);
    let mut acc = [[_mm512_setzero_ps(); R]; G];
    let k16 = k / 16 * 16;
    let mut kk = 0;
    while kk < k16 {
        tile_step::<BF16, R, G>(&mut acc, x, k, w, j, kk, !0);
        kk += 16;
    }
    if k16 < k {
        tile_step::<BF16, R, G>(&mut acc, x, k, w, j, k16, (1u16 << (k - k16)) - 1);
    }
    for (g, acc_g) in acc.iter().enumerate() {
        for (r, &a) in acc_g.iter().enumerate() {
            let mut s = _mm512_reduce_add_ps(a);
            if let Some(b) = p.bias {
                s += *b.get_unchecked(j + r);
            }
            *p.y.0.add((i + g) * p.n + j + r) = s;
        }
    }
}

/// acc[g][r] += x[g][kk..kk+16] * w[j+r][kk..kk+16] over the lanes in `mask`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
#[allow(clippy::too_many_arguments)]
#[allow(clippy::needless_range_loop)] // acc[g][r] is a 2-D register tile
unsafe fn tile_step<const BF16: bool, const R: usize, const G: usize>(
    acc: &mut [[__m512; R]; G],
    x: *const f32,
    k: usize,
    w: *const u8,
    j: usize,
    kk: usize,
    mask: __mmask16,
) {
    let mut xv = [_mm512_setzero_ps(); G];
    for (g, v) in xv.iter_mut().enumerate() {
        *v = _mm512_maskz_loadu_ps(mask, x.add(g * k + kk));
    }
    for r in 0..R {
        prefetch_ahead::<BF16>(w, (j + r + PREFETCH_ROWS) * k + kk);
        let wv = load_w16::<BF16>(w, (j + r) * k + kk, mask);
        for g in 0..G {
            acc[g][r] = _mm512_fmadd_ps(xv[g], wv, acc[g][r]);
        }
    }
}

// GEMM blocking: a 12 x 32 register tile (24 zmm accumulators); k blocks of KC = 256 (one packed panel,
// KC * NR * 4 = 32 KB, stays in L1 while all row tiles use it); row blocks of MC = 96, a multiple of MR
// (their x slice, MC * KC * 4 = 96 KB, stays in L2); column blocks of NC = 512, a multiple of NR (the
// packed weights, KC * NC * 4 = 512 KB, stay in L2).
gemm_entry!(mr: 12, nr: 32, kc: 256, mc: 96, nc: 512, heights: 12 11 10 9 8 7 6 5 4 3 2);

/// M x 32 register tile: y_tile (+)= x[M, kc] * panel[kc, 32] (+ bias). Edge columns are
/// handled with masked loads/stores, so memory past column `nvalid` is never touched.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
unsafe fn micro<const M: usize>(t: &Tile) {
    #[rustfmt::skip]
    let mut acc = micro_k_loop!(t, M, 16, _mm512_setzero_ps, _mm512_loadu_ps, |x| _mm512_set1_ps(*x), _mm512_fmadd_ps);
    let valid = if t.nvalid >= 32 {
        u32::MAX
    } else {
        (1u32 << t.nvalid) - 1
    };
    let m0 = valid as __mmask16;
    let m1 = (valid >> 16) as __mmask16;
    for (r, acc_r) in acc.iter_mut().enumerate() {
        let c = t.c.add(r * t.ldc);
        if !t.first {
            acc_r[0] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, c), acc_r[0]);
            acc_r[1] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, c.add(16)), acc_r[1]);
        }
        if !t.bias.is_null() {
            acc_r[0] = _mm512_add_ps(acc_r[0], _mm512_maskz_loadu_ps(m0, t.bias));
            acc_r[1] = _mm512_add_ps(acc_r[1], _mm512_maskz_loadu_ps(m1, t.bias.add(16)));
        }
        _mm512_mask_storeu_ps(c, m0, acc_r[0]);
        _mm512_mask_storeu_ps(c.add(16), m1, acc_r[1]);
    }
}
