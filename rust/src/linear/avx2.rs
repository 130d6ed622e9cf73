//! AVX2 + FMA tier of `linear` (256-bit vectors, 8 f32 lanes).
//!
//! GEMV (up to GEMV_MAX_M x rows, memory-bound): each block of 8 weight rows is streamed once,
//! 16 weights per row per step, and widened in registers while up to 4 x rows reuse it.
//! bf16 weights are widened as (even, odd) pairs with an AND and a byte shuffle, which keeps
//! the conversion off the FMA ports; x is reordered to match once per call. 8 independent
//! accumulators hide FMA latency; k tails (k % 8) are scalar.
//! GEMM (many x rows, compute-bound): BLIS-style. Weight panels of NR=16 columns are packed to
//! f32 per KC-long k block; a 6x16 register tile (12 ymm accumulators) broadcasts x elements.
//!
//! Numerical contract: f32 FMA accumulation. GEMV: each lane accumulates a fixed residue class
//! of k (kk % 8 for f32; for bf16, lane l takes elements 2l and 2l+1 of every 16-block), lanes
//! are reduced pairwise, the scalar tail is added in order, then the bias. GEMM: each KC
//! block's sum is added to y in k order, then the bias once after the last block.

use std::arch::x86_64::*;
use std::ops::Range;

use super::packed_gemm::{gemm_entry, micro_k_loop, packed_gemm, Blocking, Tile};
use super::{for_each_gemv_tile, Problem, Weight};
use crate::bf16::bf16_to_f32;
use crate::scratch::with_scratch;

/// Up to this many x rows use the GEMV path (measured crossover, see kernel_bench).
pub const GEMV_MAX_M: usize = 16;

/// Fills y[rows x cols] with the GEMV loop.
///
/// # Safety
/// The CPU must support AVX2 and FMA. `p` must satisfy the `linear` length contract
/// (x: m*k, w: n*k, bias: n, y points at m*n f32s), `rows`/`cols` must lie within m/n, and no
/// other thread may access the tile of y concurrently.
pub unsafe fn gemv(p: &Problem<'_>, rows: Range<usize>, cols: Range<usize>) {
    debug_assert!(rows.end <= p.m && cols.end <= p.n, "tile outside y");
    let k = p.k;
    match p.w {
        Weight::Bf16(w) => {
            // bf16 weights are widened as (even, odd) element pairs (see `tile`), so x is
            // reordered to match once per call: within each 16-block, even elements first.
            with_scratch(rows.len() * k, |xp| {
                for (dst, i) in xp.chunks_exact_mut(k).zip(rows.clone()) {
                    permute_even_odd(&p.x[i * k..(i + 1) * k], dst);
                }
                gemv_impl::<true>(p, xp.as_ptr(), w.as_ptr().cast(), rows, cols)
            })
        }
        Weight::F32(w) => {
            let x = p.x.as_ptr().add(rows.start * k);
            gemv_impl::<false>(p, x, w.as_ptr().cast(), rows, cols)
        }
    }
}

/// dst = src with every full 16-element block reordered as [0, 2, .., 14, 1, 3, .., 15]; the
/// k % 16 tail is copied unchanged.
fn permute_even_odd(src: &[f32], dst: &mut [f32]) {
    let (blocks, tail) = src.as_chunks::<16>();
    let (dblocks, dtail) = dst.as_chunks_mut::<16>();
    for (b, d) in blocks.iter().zip(dblocks) {
        for l in 0..8 {
            d[l] = b[2 * l];
            d[8 + l] = b[2 * l + 1];
        }
    }
    dtail.copy_from_slice(tail);
}

/// `x` points at x row `rows.start` (rows k apart; even/odd-permuted when BF16), `w` at the
/// weights; `BF16` selects how they are read.
#[target_feature(enable = "avx2,fma")]
unsafe fn gemv_impl<const BF16: bool>(
    p: &Problem<'_>,
    x: *const f32,
    w: *const u8,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // Tile shapes keep R*G <= 12 accumulators (plus loads) within 16 ymm registers.
    let x_row = |i: usize| x.add((i - rows.start) * p.k);
    for_each_gemv_tile(
        rows.clone(),
        cols,
        |i, j, g| match g {
            1 => tile::<BF16, 8, 1>(p, x_row(i), w, i, j),
            2 => {
                tile::<BF16, 4, 2>(p, x_row(i), w, i, j);
                tile::<BF16, 4, 2>(p, x_row(i), w, i, j + 4);
            }
            3 => {
                tile::<BF16, 4, 3>(p, x_row(i), w, i, j);
                tile::<BF16, 4, 3>(p, x_row(i), w, i, j + 4);
            }
            _ => {
                for jj in (j..j + 8).step_by(2) {
                    tile::<BF16, 2, 4>(p, x_row(i), w, i, jj);
                }
            }
        },
        |i, j, g| match g {
            1 => tile::<BF16, 1, 1>(p, x_row(i), w, i, j),
            2 => tile::<BF16, 1, 2>(p, x_row(i), w, i, j),
            3 => tile::<BF16, 1, 3>(p, x_row(i), w, i, j),
            _ => tile::<BF16, 1, 4>(p, x_row(i), w, i, j),
        },
    );
}

/// 8 weights starting at element `idx`, widened to f32.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn load_w8<const BF16: bool>(w: *const u8, idx: usize) -> __m256 {
    if BF16 {
        let h = _mm_loadu_si128(w.cast::<u16>().add(idx).cast());
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    } else {
        _mm256_loadu_ps(w.cast::<f32>().add(idx))
    }
}

/// One weight element, widened to f32 (K tails).
#[inline(always)]
unsafe fn load_w1<const BF16: bool>(w: *const u8, idx: usize) -> f32 {
    if BF16 {
        bf16_to_f32(*w.cast::<u16>().add(idx))
    } else {
        *w.cast::<f32>().add(idx)
    }
}

/// Horizontal sum, pairing lanes as (0+4, 2+6), (1+5, 3+7) like the generic tier.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
}

/// y[i+g][j+r] = dot(x row i+g, w row j+r) + bias, for g < G, r < R. `x` points at row i
/// (rows k apart), even/odd-permuted when BF16.
///
/// bf16 trick: a 32-byte load holds 8 (even, odd) element pairs in 32-bit lanes.
/// `lane & 0xFFFF0000` is the odd element as f32 and a byte shuffle moving the low half up is
/// the even one; both run off the FMA ports (unlike zero-extend + shift), so the loop is no
/// longer ALU-bound.
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)] // acc[g][r] is a 2-D register tile
unsafe fn tile<const BF16: bool, const R: usize, const G: usize>(
    p: &Problem<'_>,
    x: *const f32,
    w: *const u8,
    i: usize,
    j: usize,
) {
    let k = p.k;
    let k8 = k / 8 * 8;
    let k16 = k / 16 * 16;
    let hi_half = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    let lo_to_hi = _mm256_setr_epi8(
        -128, -128, 0, 1, -128, -128, 4, 5, -128, -128, 8, 9, -128, -128, 12, 13, //
        -128, -128, 0, 1, -128, -128, 4, 5, -128, -128, 8, 9, -128, -128, 12, 13,
    );
    let mut acc = [[_mm256_setzero_ps(); R]; G];
    let mut kk = 0;
    // 16 weights per row per step. f32: whole 64-byte lines per step, which streams
    // noticeably faster; both vectors go into the same accumulator in k order.
    while kk < k16 {
        let mut xv = [[_mm256_setzero_ps(); 2]; G];
        for (g, v) in xv.iter_mut().enumerate() {
            v[0] = _mm256_loadu_ps(x.add(g * k + kk));
            v[1] = _mm256_loadu_ps(x.add(g * k + kk + 8));
        }
        for r in 0..R {
            prefetch_ahead::<BF16>(w, (j + r + PREFETCH_ROWS) * k + kk);
            let (w0, w1) = if BF16 {
                let raw = _mm256_loadu_si256(w.cast::<u16>().add((j + r) * k + kk).cast());
                (
                    _mm256_castsi256_ps(_mm256_shuffle_epi8(raw, lo_to_hi)),
                    _mm256_castsi256_ps(_mm256_and_si256(raw, hi_half)),
                )
            } else {
                (
                    load_w8::<false>(w, (j + r) * k + kk),
                    load_w8::<false>(w, (j + r) * k + kk + 8),
                )
            };
            for g in 0..G {
                acc[g][r] = _mm256_fmadd_ps(xv[g][0], w0, acc[g][r]);
                acc[g][r] = _mm256_fmadd_ps(xv[g][1], w1, acc[g][r]);
            }
        }
        kk += 16;
    }
    while kk < k8 {
        let mut xv = [_mm256_setzero_ps(); G];
        for (g, v) in xv.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(x.add(g * k + kk));
        }
        for r in 0..R {
            let wv = load_w8::<BF16>(w, (j + r) * k + kk);
            for g in 0..G {
                acc[g][r] = _mm256_fmadd_ps(xv[g], wv, acc[g][r]);
            }
        }
        kk += 8;
    }
    for (g, acc_g) in acc.iter().enumerate() {
        for (r, &a) in acc_g.iter().enumerate() {
            let mut s = hsum(a);
            for t in k8..k {
                s += *x.add(g * k + t) * load_w1::<BF16>(w, (j + r) * k + t);
            }
            if let Some(b) = p.bias {
                s += *b.get_unchecked(j + r);
            }
            *p.y.0.add((i + g) * p.n + j + r) = s;
        }
    }
}

/// Weight rows ahead of the current tile that the GEMV prefetches: two 8-row tiles, ~18 KB at
/// K=576 bf16. The hardware prefetcher alone left a cold (DRAM-resident) GEMV at about half of
/// the machine's bandwidth; a software prefetch keeps enough lines in flight.
pub(super) const PREFETCH_ROWS: usize = 16;

/// Asks for the cache line holding weight element `idx` to be brought into L2 (T1: streamed
/// weights are used once, so they need not displace x's lines in L1). `idx` may lie past the
/// end of the weights: prefetching never faults, and the address uses wrapping arithmetic.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn prefetch_ahead<const BF16: bool>(w: *const u8, idx: usize) {
    let bytes = idx * if BF16 { 2 } else { 4 };
    _mm_prefetch::<_MM_HINT_T1>(w.wrapping_add(bytes).cast::<i8>());
}

// GEMM blocking: a 6 x 16 register tile (12 ymm accumulators); k blocks of KC = 256 (one packed panel,
// KC * NR * 4 = 16 KB, stays in L1 while all row tiles use it); row blocks of MC = 72, a multiple of MR
// (their x slice, MC * KC * 4 = 72 KB, stays in L2); column blocks of NC = 512, a multiple of NR (the
// packed weights, KC * NC * 4 = 512 KB, stay in L2).
gemm_entry!(mr: 6, nr: 16, kc: 256, mc: 72, nc: 512, heights: 6 5 4 3 2);

/// M x 16 register tile: y_tile (+)= x[M, kc] * panel[kc, 16] (+ bias).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn micro<const M: usize>(t: &Tile) {
    #[rustfmt::skip]
    let mut acc = micro_k_loop!(t, M, 8, _mm256_setzero_ps, _mm256_loadu_ps, |x| _mm256_broadcast_ss(&*x), _mm256_fmadd_ps);
    if t.nvalid == NR {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let c = t.c.add(r * t.ldc);
            if !t.first {
                acc_r[0] = _mm256_add_ps(_mm256_loadu_ps(c), acc_r[0]);
                acc_r[1] = _mm256_add_ps(_mm256_loadu_ps(c.add(8)), acc_r[1]);
            }
            if !t.bias.is_null() {
                acc_r[0] = _mm256_add_ps(acc_r[0], _mm256_loadu_ps(t.bias));
                acc_r[1] = _mm256_add_ps(acc_r[1], _mm256_loadu_ps(t.bias.add(8)));
            }
            _mm256_storeu_ps(c, acc_r[0]);
            _mm256_storeu_ps(c.add(8), acc_r[1]);
        }
    } else {
        // Edge tile: spill to a stack buffer and copy only the columns that exist, with the
        // same (y + block) + bias order as the full tile.
        let mut tmp = [0.0f32; NR];
        for (r, acc_r) in acc.iter().enumerate() {
            _mm256_storeu_ps(tmp.as_mut_ptr(), acc_r[0]);
            _mm256_storeu_ps(tmp.as_mut_ptr().add(8), acc_r[1]);
            let c = t.c.add(r * t.ldc);
            for (col, &v) in tmp[..t.nvalid].iter().enumerate() {
                let mut s = if t.first { v } else { *c.add(col) + v };
                if !t.bias.is_null() {
                    s += *t.bias.add(col);
                }
                *c.add(col) = s;
            }
        }
    }
}
