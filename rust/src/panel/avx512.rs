//! AVX-512 (F/BW/VL/DQ) + FMA tier of `panel_linear`: 16 f32 lanes, a panel's 32 outputs in two
//! vectors per x row; up to 12 x rows share each loaded panel line (24 accumulators).
//!
//! bf16 panels: one 64-byte load holds a k step of 32 rows; `<< 16` gives rows 0-15, `& 0xffff0000`
//! rows 16-31 (see the layout in `panel.rs`). One row streams the panels with its own prefetch.
//!
//! Numerical contract (`panel.rs`'s, the same for every row count): each `KC` block of k summed by
//! f32 FMA in k order from zero, the blocks' sums added in k order, the bias last.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{Job, PanelWeight, KC, PANEL};

/// x rows per GEMM register tile.
const MR: usize = 12;
/// Panel lines (k steps) prefetched ahead: the one-row stream into L2 (T1), 2 KB of bf16 ahead;
/// the register tiles into L1, 1.5 KB ahead. Measured on SmolLM2-135M's matrices (decoder_bench):
/// without prefetch the 8-row tile ran at 16.6 ms/token, with it 12.0 (the row-major GEMV's speed).
const PREFETCH_ONE: usize = 32;
const PREFETCH_TILE: usize = 24;

/// The 32 weights of k step `kk` of a panel starting at `w`, widened: (rows 0-15, rows 16-31).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
unsafe fn load32<const BF16: bool>(w: *const u8, kk: usize) -> (__m512, __m512) {
    if BF16 {
        let v = _mm512_loadu_si512(w.add(kk * 64).cast());
        let lo = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v));
        let hi = _mm512_castsi512_ps(_mm512_and_si512(
            v,
            _mm512_set1_epi32(0xffff_0000u32 as i32),
        ));
        (lo, hi)
    } else {
        let p = w.add(kk * 128).cast::<f32>();
        (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
    }
}

/// acc[r] = x[r][k0..k0+kc] . panel[k0..k0+kc] for r < M (rows `ldx` apart).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)] // acc[r] is a register tile indexed by a constant bound
unsafe fn micro<const BF16: bool, const M: usize>(
    x: *const f32,
    ldx: usize,
    w: *const u8,
    k0: usize,
    kc: usize,
    acc: &mut [[__m512; 2]; MR],
) {
    let mut a = [[_mm512_setzero_ps(); 2]; M];
    let line = if BF16 { 64 } else { 128 };
    for kk in k0..k0 + kc {
        // Prefetching never faults; the address is formed with wrapping arithmetic.
        _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add((kk + PREFETCH_TILE) * line).cast());
        let (lo, hi) = load32::<BF16>(w, kk);
        for r in 0..M {
            let xb = _mm512_set1_ps(*x.add(r * ldx + kk));
            a[r][0] = _mm512_fmadd_ps(xb, lo, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(xb, hi, a[r][1]);
        }
    }
    acc[..M].copy_from_slice(&a);
}

/// One x row over the whole of k: a memory-bound stream with prefetch, in `KC` blocks summed as the
/// GEMM path sums them (so a row's outputs do not depend on how many rows its call has).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
unsafe fn one_row<const BF16: bool>(x: *const f32, w: *const u8, k: usize) -> [__m512; 2] {
    let line = if BF16 { 64 } else { 128 };
    let mut total = [_mm512_setzero_ps(); 2];
    let mut k0 = 0;
    while k0 < k {
        let end = (k0 + KC).min(k);
        let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for kk in k0..end {
            _mm_prefetch::<_MM_HINT_T1>(w.wrapping_add((kk + PREFETCH_ONE) * line).cast());
            let (lo, hi) = load32::<BF16>(w, kk);
            let xb = _mm512_set1_ps(*x.add(kk));
            a0 = _mm512_fmadd_ps(xb, lo, a0);
            a1 = _mm512_fmadd_ps(xb, hi, a1);
        }
        total = if k0 == 0 {
            [a0, a1]
        } else {
            [_mm512_add_ps(total[0], a0), _mm512_add_ps(total[1], a1)]
        };
        k0 = end;
    }
    total
}

/// Writes (or adds to) the 32 outputs of row `i`, columns `col..`, keeping columns < n.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
unsafe fn store(job: &Job<'_>, i: usize, col: usize, mut v: [__m512; 2], add: bool, bias: bool) {
    let n = job.w.n();
    let valid = (n - col).min(PANEL);
    let bits: u32 = if valid == PANEL {
        u32::MAX
    } else {
        (1u32 << valid) - 1
    };
    let masks = [bits as __mmask16, (bits >> 16) as __mmask16];
    for h in 0..2 {
        let (m, off) = (masks[h], 16 * h);
        if m == 0 {
            continue; // no valid column in this half: its address may lie past the end of y
        }
        // In bounds: column col + off < n, so the row's element is inside y's m * n values.
        let y = job.y.get().add(i * n + col + off);
        if add {
            v[h] = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y), v[h]);
        }
        if bias {
            if let Some(b) = job.bias {
                v[h] = _mm512_add_ps(v[h], _mm512_maskz_loadu_ps(m, b.as_ptr().add(col + off)));
            }
        }
        _mm512_mask_storeu_ps(y, m, v[h]);
    }
}

/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and FMA; `job` must satisfy `panel_linear`'s length
/// contract; no other thread may write the columns of `panels` concurrently.
pub unsafe fn panels(job: &Job<'_>, panels: Range<usize>) {
    match job.w {
        PanelWeight::Bf16 { data, .. } => run::<true>(job, data.as_ptr().cast(), panels),
        PanelWeight::F32 { data, .. } => run::<false>(job, data.as_ptr().cast(), panels),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
unsafe fn run<const BF16: bool>(job: &Job<'_>, base: *const u8, panels: Range<usize>) {
    let (m, k) = (job.m, job.w.k());
    let esize = if BF16 { 2 } else { 4 };
    let x = job.x.as_ptr();
    for p in panels {
        let w = base.add(p * k * PANEL * esize);
        let col = p * PANEL;
        if m == 1 {
            store(job, 0, col, one_row::<BF16>(x, w, k), false, true);
            continue;
        }
        let mut k0 = 0;
        while k0 < k {
            let kb = KC.min(k - k0);
            let last = k0 + kb == k;
            let mut i = 0;
            while i < m {
                let rows = (m - i).min(MR);
                let xi = x.add(i * k);
                let mut acc = [[_mm512_setzero_ps(); 2]; MR];
                let f = match rows {
                    12 => micro::<BF16, 12>,
                    11 => micro::<BF16, 11>,
                    10 => micro::<BF16, 10>,
                    9 => micro::<BF16, 9>,
                    8 => micro::<BF16, 8>,
                    7 => micro::<BF16, 7>,
                    6 => micro::<BF16, 6>,
                    5 => micro::<BF16, 5>,
                    4 => micro::<BF16, 4>,
                    3 => micro::<BF16, 3>,
                    2 => micro::<BF16, 2>,
                    _ => micro::<BF16, 1>,
                };
                f(xi, k, w, k0, kb, &mut acc);
                for (r, a) in acc.iter().take(rows).enumerate() {
                    store(job, i + r, col, *a, k0 > 0, last);
                }
                i += rows;
            }
            k0 += kb;
        }
    }
}
