//! AVX-512 (F/BW/VL/DQ) + FMA tier of `panel_linear`: 16 f32 lanes, a panel's 32 outputs in two
//! vectors per x row; up to 12 x rows share each loaded panel line (24 accumulators).
//!
//! bf16 panels: one 64-byte load holds a k step of 32 rows; `<< 16` gives rows 0-15, `& 0xffff0000`
//! rows 16-31 (see the layout in `preserve_linear.rs`). One row streams the panels with its own prefetch.
//!
//! Numerical contract (`preserve_linear.rs`'s, the same for every row count): each `KC` block of k summed by
//! f32 FMA in k order from zero, the blocks' sums added in k order, the bias last.

use std::arch::x86_64::*;
use std::ops::Range;

use super::driver::{panel_tier, PREFETCH_ONE, PREFETCH_TILE};
use super::{Job, PanelWeight, KC, PANEL};

/// x rows per GEMM register tile.
const MR: usize = 12;

/// The 32 weights of k step `kk` of a panel starting at `w`, widened: (rows 0-15, rows 16-31); the
/// one half (`H` = 0) of this tier.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
unsafe fn load<const BF16: bool, const H: usize>(w: *const u8, kk: usize) -> (__m512, __m512) {
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

/// Writes (or adds to) the 32 outputs of row `i`, columns `col..`, keeping columns < n (`H` = 0).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
unsafe fn store<const H: usize>(
    job: &Job<'_>,
    i: usize,
    col: usize,
    mut v: [__m512; 2],
    add: bool,
    bias: bool,
) {
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

panel_tier! {
    features: "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma",
    vector: __m512,
    zero: _mm512_setzero_ps,
    add: _mm512_add_ps,
    fmadd: _mm512_fmadd_ps,
    splat: _mm512_set1_ps,
    halves: [0],
    heights: [12 11 10 9 8 7 6 5 4 3 2],
}
