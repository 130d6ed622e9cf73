//! AVX2 weight-panel packing: same result as `pack::pack_panel`, built from 8x8 register
//! transposes (bf16 rows are widened on load). Used by the AVX2 *and* AVX-512 GEMM tiers:
//! packing is shuffle-bound, and 512-bit shuffles move no more elements per cycle than 256-bit
//! ones, so a wider version would not be faster. Scalar packing costs ~1.4 cycles/element,
//! which was ~20 % of a 128-row GEMM; this is ~0.5.
//!
//! Contract: exact copies (bf16 widened exactly); partial panels and the kc % 8 tail take the
//! scalar path, so the output is bit-identical to `pack::pack_panel`.

use std::arch::x86_64::*;

use super::pack::{pack_panel as pack_panel_scalar, PanelAt};
use super::Weight;
use crate::bf16::bf16_to_f32;

/// 8 rows in, 8 columns out: out[c][r] = rows[r][c].
#[target_feature(enable = "avx2,fma")]
#[inline]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// Packs an 8-row group: dst[p * nr + c] = w[(j + c) * k + p0 + p] for c < 8, p < kc8.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn pack_group<const BF16: bool>(
    w: *const u8,
    k: usize,
    j: usize,
    p0: usize,
    kc8: usize,
    nr: usize,
    dst: *mut f32,
) {
    let mut pb = 0;
    while pb < kc8 {
        let mut rows = [_mm256_setzero_ps(); 8];
        for (i, row) in rows.iter_mut().enumerate() {
            let idx = (j + i) * k + p0 + pb;
            *row = if BF16 {
                let h = _mm_loadu_si128(w.cast::<u16>().add(idx).cast());
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            } else {
                _mm256_loadu_ps(w.cast::<f32>().add(idx))
            };
        }
        for (c, col) in transpose8(rows).into_iter().enumerate() {
            _mm256_storeu_ps(dst.add((pb + c) * nr), col);
        }
        pb += 8;
    }
}

/// Same contract as `pack::pack_panel`.
///
/// # Safety
/// The CPU must support AVX2 and FMA. (Slice bounds are checked here.)
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn pack_panel(w: Weight<'_>, k: usize, at: PanelAt, dst: &mut [f32]) {
    let PanelAt {
        j0,
        nvalid,
        p0,
        kc,
        nr,
    } = at;
    if nvalid != nr || !nr.is_multiple_of(8) || kc < 8 {
        return pack_panel_scalar(w, k, at, dst);
    }
    assert!(dst.len() >= kc * nr, "pack_panel: dst too short");
    assert!(
        p0 + kc <= k && (j0 + nr) * k <= w.len(),
        "pack_panel: panel outside the weights"
    );
    let kc8 = kc / 8 * 8;
    for g in (0..nr).step_by(8) {
        let out = dst.as_mut_ptr().add(g);
        match w {
            Weight::Bf16(s) => pack_group::<true>(s.as_ptr().cast(), k, j0 + g, p0, kc8, nr, out),
            Weight::F32(s) => pack_group::<false>(s.as_ptr().cast(), k, j0 + g, p0, kc8, nr, out),
        }
    }
    for c in 0..nr {
        let row = (j0 + c) * k + p0;
        for p in kc8..kc {
            dst[p * nr + c] = match w {
                Weight::Bf16(s) => bf16_to_f32(s[row + p]),
                Weight::F32(s) => s[row + p],
            };
        }
    }
}
