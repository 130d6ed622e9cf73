//! The AVX2 tier's activation quantization (`QActs`, with the i16 fine codes its Q8 kernel reads), and the
//! packing of 32 codes to bytes that `row_q8` shares. Per group of 8 blocks: their maxima reduced by one tree
//! of shuffles, both scales of all 8 from one division each, the code sums from `vpmaddubsw` / `vpmaddwd`
//! reduced by a second tree, the scales and sums stored as vectors.
//!
//! Numerical contract: every 32-block bit-identical to `acts::quantize_block` (the same correctly rounded
//! divisions lane by lane, round-to-nearest-even conversions, the same clamps; exact integer sums).

use std::arch::x86_64::*;

use super::{ActsOut, LO, QSUB};

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn hmax(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    _mm_cvtss_f32(m)
}

/// 32 i32 codes packed to bytes in k order, clamped to [-127, 127] (packs saturates to [-128, 127]).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn pack_codes(c: [__m256i; 4]) -> __m256i {
    // packs works within 128-bit lanes; the permute restores k order.
    let w16 = _mm256_packs_epi16(
        _mm256_packs_epi32(c[0], c[1]),
        _mm256_packs_epi32(c[2], c[3]),
    );
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_max_epi8(
        _mm256_permutevar8x32_epi32(w16, order),
        _mm256_set1_epi8(-127),
    )
}

/// Blocks whose scales are found together: their maxima reduced into one vector, both scales of all of
/// them from one division each.
const SCALE_GROUP: usize = 8;

/// The maxima of 8 vectors, lane j of the result the maximum over `a[j]`'s lanes: a tree of shuffles
/// (7 steps for 8 blocks instead of a horizontal reduction of 3 dependent steps each). Max is exact, so
/// the values are those of any reduction order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn max_of_each(a: &[__m256; SCALE_GROUP]) -> __m256 {
    // m[j]'s 128-bit lane L holds block 2 j + L's 4 partial maxima.
    let m: [__m256; 4] = std::array::from_fn(|j| {
        let (x, y) = (a[2 * j], a[2 * j + 1]);
        _mm256_max_ps(
            _mm256_permute2f128_ps::<0x20>(x, y),
            _mm256_permute2f128_ps::<0x31>(x, y),
        )
    });
    let n: [__m256; 2] = std::array::from_fn(|i| {
        let (x, y) = (m[2 * i], m[2 * i + 1]);
        _mm256_max_ps(
            _mm256_shuffle_ps::<0x44>(x, y),
            _mm256_shuffle_ps::<0xEE>(x, y),
        )
    });
    // Element 4 L + e now holds block 2 e + L's maximum.
    let t = _mm256_max_ps(
        _mm256_shuffle_ps::<0x88>(n[0], n[1]),
        _mm256_shuffle_ps::<0xDD>(n[0], n[1]),
    );
    _mm256_permutevar8x32_ps(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// 8 blocks' code sums from their per-4 sums (`v[j]`, block j's: in each 128-bit lane two partial sums of
/// its coarse codes, then two of its residual ones): (coarse sums, residual sums), lane j block j's.
/// Exact i32 additions (|sum| <= 32 x 127), in a tree of shuffles instead of a reduction per block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn sums_of_each(v: &[__m256i; SCALE_GROUP]) -> (__m256i, __m256i) {
    // m[j]'s lane L: block 2 j + L's two coarse partials, then its two residual ones.
    let m: [__m256i; 4] = std::array::from_fn(|j| {
        let (x, y) = (v[2 * j], v[2 * j + 1]);
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(x, y),
            _mm256_permute2x128_si256::<0x31>(x, y),
        )
    });
    // n[i]'s lane L: block 4 i + L's coarse and residual sums, then block 4 i + 2 + L's.
    let n: [__m256; 2] =
        std::array::from_fn(|i| _mm256_castsi256_ps(_mm256_hadd_epi32(m[2 * i], m[2 * i + 1])));
    // Element 4 L + e: block 2 e + L's (as in max_of_each).
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let pick = |t: __m256| _mm256_permutevar8x32_epi32(_mm256_castps_si256(t), order);
    (
        pick(_mm256_shuffle_ps::<0x88>(n[0], n[1])),
        pick(_mm256_shuffle_ps::<0xDD>(n[0], n[1])),
    )
}

/// # Safety
/// The CPU supports the tier (`usable`); `out` holds x's blocks, `fine` included (`quantize_activations`),
/// and no other thread writes them.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_rows(x: &[f32], out: ActsOut) {
    let sign = _mm256_set1_ps(-0.0);
    let lo16 = _mm256_set1_epi16(LO as i16);
    let lo_f = _mm256_set1_ps(LO as f32);
    let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    let blocks = x.len() / QSUB;
    let mut g0 = 0;
    while g0 < blocks {
        let n = SCALE_GROUP.min(blocks - g0);
        // Each block's scales, 8 blocks at once: block_scale's rule lane by lane (the same correctly
        // rounded divisions; a lane that is not > 0, or whose 127 / max is not finite, gets zeros).
        let mut a = [_mm256_setzero_ps(); SCALE_GROUP];
        for (j, aj) in a.iter_mut().enumerate().take(n) {
            let p = x.as_ptr().add((g0 + j) * QSUB);
            let v: [__m256; 4] =
                std::array::from_fn(|h| _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * h))));
            *aj = _mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3]));
        }
        let amax = max_of_each(&a);
        let c127 = _mm256_set1_ps(127.0);
        let inv = _mm256_div_ps(c127, amax);
        let ok = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GT_OQ>(amax, _mm256_setzero_ps()),
            _mm256_cmp_ps::<_CMP_LT_OQ>(inv, _mm256_set1_ps(f32::INFINITY)),
        );
        let dd = _mm256_and_ps(ok, _mm256_div_ps(amax, c127));
        let id = _mm256_and_ps(ok, inv);
        let (mut dds, mut ids, mut id2s) = ([0f32; 8], [0f32; 8], [0f32; 8]);
        _mm256_storeu_ps(dds.as_mut_ptr(), dd);
        _mm256_storeu_ps(ids.as_mut_ptr(), id);
        _mm256_storeu_ps(id2s.as_mut_ptr(), _mm256_mul_ps(id, lo_f));
        let mut sums = [_mm256_setzero_si256(); SCALE_GROUP];
        for j in 0..n {
            let b = g0 + j;
            let p = x.as_ptr().add(b * QSUB);
            let v: [__m256; 4] = std::array::from_fn(|h| _mm256_loadu_ps(p.add(8 * h)));
            let (idv, ddv, id2v) = (
                _mm256_set1_ps(ids[j]),
                _mm256_set1_ps(dds[j]),
                _mm256_set1_ps(id2s[j]),
            );
            // Default MXCSR rounding is to nearest even, as the reference's round_ties_even; the
            // residual is a separate multiply and subtract, as in the reference. |x * id| <= 127 for
            // finite x, so the coarse codes need no clamp before the residual; the saturating packs and
            // the max with -127 in `pack_codes` clamp both to [-127, 127] as the reference does.
            let c = v.map(|vi| _mm256_cvtps_epi32(_mm256_mul_ps(vi, idv)));
            let c2: [__m256i; 4] = std::array::from_fn(|h| {
                let r = _mm256_sub_ps(v[h], _mm256_mul_ps(_mm256_cvtepi32_ps(c[h]), ddv));
                _mm256_cvtps_epi32(_mm256_mul_ps(r, id2v))
            });
            let (q, q2) = (pack_codes(c), pack_codes(c2));
            _mm256_storeu_si256(out.q.add(b * QSUB).cast(), q);
            _mm256_storeu_si256(out.q2.add(b * QSUB).cast(), q2);
            // fine = LO * q + q2 (within i16: |.| <= 254 * 127 + 127), in k order for the Q8 kernel.
            for h in 0..2 {
                let half = |v: __m256i| {
                    _mm256_cvtepi8_epi16(if h == 0 {
                        _mm256_castsi256_si128(v)
                    } else {
                        _mm256_extracti128_si256::<1>(v)
                    })
                };
                let f = _mm256_add_epi16(_mm256_mullo_epi16(half(q), lo16), half(q2));
                _mm256_storeu_si256(out.fine.add(b * QSUB + 16 * h).cast(), f);
            }
            // Sums of the stored codes, 4 at a time (ones times each signed code), reduced below.
            let four = |q: __m256i| _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
            sums[j] = _mm256_hadd_epi32(four(q), four(q2));
        }
        // The 8 blocks' scales and sums stored at once (a shorter last group: its blocks only).
        let (s1, s2) = sums_of_each(&sums);
        let keep = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        _mm256_maskstore_ps(out.d.add(g0), keep, dd);
        _mm256_maskstore_ps(out.s.add(g0), keep, _mm256_cvtepi32_ps(s1));
        _mm256_maskstore_ps(out.d_fine.add(g0), keep, _mm256_div_ps(dd, lo_f));
        let fine = _mm256_add_epi32(_mm256_mullo_epi32(s1, _mm256_set1_epi32(LO)), s2);
        _mm256_maskstore_epi32(out.s_fine.add(g0), keep, fine);
        g0 += n;
    }
}
