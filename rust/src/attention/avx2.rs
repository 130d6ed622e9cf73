//! AVX2 + FMA attention primitives (8 f32 lanes; head-dim tails via masked loads).
//!
//! Numerical contract: f32 FMA accumulation. Scores for 8 keys are reduced together with a
//! horizontal-add tree; `pv` keeps the output row in registers across all keys; `pv_rows` runs
//! three rows at once on `pv`'s arithmetic, bit for bit (16 registers leave no room to do the same
//! for `qk`'s eight sums per row). exp is a
//! Cephes-style polynomial (max error ~2 ulp for results >= 2^-126, results below that flush
//! to 0, NaN propagates).

use std::arch::x86_64::*;

use super::operands::RowsAt;
use super::operands::{col_blocks, pv_has_work};
use super::stamp::{even_odd_keys, exp_poly, row_scores};
use super::{PvArgs, QkArgs};

use crate::bf16::bf16_to_f32;

/// Horizontal sum of one vector, ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)): the order of each
/// lane of `hsum8`, so a key's score has the same bits whether it falls in a group of 8 keys or in
/// the tail (a multi-token step's row then equals the one-token step at its position, which
/// speculative verification and the server's batching rely on).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn hsum(v: __m256) -> f32 {
    let h = _mm_hadd_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let h = _mm_hadd_ps(h, h);
    _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps::<1>(h, h)))
}

/// [hsum(a[0]), ..., hsum(a[7])] in one vector (hadd tree: 9 shuffles/adds for 8 sums).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn hsum8(a: &[__m256; 8]) -> __m256 {
    let g0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    let g1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(g0, g1),
        _mm256_permute2f128_ps::<0x31>(g0, g1),
    )
}

/// Lane mask selecting the first `n` (< 8) lanes, for `_mm256_maskload_ps`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn tail_mask(n: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// acc[j] += q * k_j[..q.len()] lane-wise for the J keys `k + j*ldk`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot_keys<const J: usize>(q: &[f32], k: *const f32, ldk: usize, acc: &mut [__m256; J]) {
    let (d, q) = (q.len(), q.as_ptr());
    let d8 = d / 8 * 8;
    let mut i = 0;
    while i < d8 {
        let qv = _mm256_loadu_ps(q.add(i));
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k.add(j * ldk + i)), *a);
        }
        i += 8;
    }
    if d8 < d {
        // Masked-off lanes are neither read nor faulted on.
        let m = tail_mask(d - d8);
        let qv = _mm256_maskload_ps(q.add(d8), m);
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k.add(j * ldk + d8), m), *a);
        }
    }
}

/// The scores `args` describes: scores[r*lds + s] = dot(q[r*d..][..d], k[s*ldk..][..d]).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn qk(args: QkArgs<'_>) {
    if !args.has_work() {
        return;
    }
    let (k, ldk, keys, d, lds) = (args.k.as_ptr(), args.ldk, args.keys, args.d, args.lds);
    let scores = args.scores.as_mut_ptr();
    for r in 0..args.rows {
        let (qr, out) = (&args.q[r * d..(r + 1) * d], scores.add(r * lds));
        row_scores!(_mm256_setzero_ps, qr, k, ldk, 0, keys, out);
    }
}

/// acc[..8*N] += sum_s p[s] * v_s[..8*N], accumulating in registers; `masks[c]` selects the
/// lanes of vector c (all lanes except in a head-dim tail). With SPLIT, even and odd keys go
/// to separate accumulators (summed at the end) so that short rows (N <= 4) still have 8
/// independent FMA chains to cover the FMA latency.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn pv_block<const N: usize, const SPLIT: bool>(
    p: &[f32],
    v: *const f32,
    ldv: usize,
    acc: *mut f32,
    masks: &[__m256i; N],
) {
    let mut even = [_mm256_setzero_ps(); N];
    let mut odd = [_mm256_setzero_ps(); N];
    for c in 0..N {
        even[c] = _mm256_maskload_ps(acc.add(8 * c), masks[c]);
    }
    if SPLIT {
        let (set1, fmadd) = (_mm256_set1_ps, _mm256_fmadd_ps);
        even_odd_keys!(p, v, ldv, N, even, odd, set1, fmadd, |row, c| {
            _mm256_maskload_ps(row.add(8 * c), masks[c])
        });
        for c in 0..N {
            even[c] = _mm256_add_ps(even[c], odd[c]);
        }
    } else {
        let mut row = v;
        for &ps in p {
            let pb = _mm256_set1_ps(ps);
            for c in 0..N {
                even[c] =
                    _mm256_fmadd_ps(pb, _mm256_maskload_ps(row.add(8 * c), masks[c]), even[c]);
            }
            row = row.add(ldv);
        }
    }
    for c in 0..N {
        _mm256_maskstore_ps(acc.add(8 * c), masks[c], even[c]);
    }
}

/// Masks for `pv_block::<N>` covering `width` (<= 8N) lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn block_masks<const N: usize>(width: usize) -> [__m256i; N] {
    let mut m = [_mm256_set1_epi32(-1); N];
    if !width.is_multiple_of(8) {
        m[N - 1] = tail_mask(width % 8);
    }
    m
}

/// acc[..d] += sum over s < p.len() of p[s] * v[s*ldv..][..d], keys in order.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn pv(p: &[f32], v: &[f32], ldv: usize, d: usize, acc: &mut [f32]) {
    if !pv_has_work(p, v, ldv, d, acc) {
        return;
    }
    // Columns in blocks of up to 8 vectors (64 floats): 8 accumulators stay in registers.
    for (c0, width) in col_blocks(d, 64) {
        pv_col_block(p, v.as_ptr().add(c0), ldv, acc.as_mut_ptr().add(c0), width);
    }
}

/// One column block of `pv` (`width` <= 64): blocks of 5 or more vectors sum keys in order, smaller
/// ones split even and odd keys (see `pv_block`).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn pv_col_block(p: &[f32], vp: *const f32, ldv: usize, ap: *mut f32, width: usize) {
    match width.div_ceil(8) {
        8 => pv_block::<8, false>(p, vp, ldv, ap, &block_masks(width)),
        7 => pv_block::<7, false>(p, vp, ldv, ap, &block_masks(width)),
        6 => pv_block::<6, false>(p, vp, ldv, ap, &block_masks(width)),
        5 => pv_block::<5, false>(p, vp, ldv, ap, &block_masks(width)),
        4 => pv_block::<4, true>(p, vp, ldv, ap, &block_masks(width)),
        3 => pv_block::<3, true>(p, vp, ldv, ap, &block_masks(width)),
        2 => pv_block::<2, true>(p, vp, ldv, ap, &block_masks(width)),
        _ => pv_block::<1, true>(p, vp, ldv, ap, &block_masks(width)),
    }
}

/// Three rows of an in-order column block at once: acc[r*lda..][..width] += sum_s p[r*lds + s] *
/// v_s[..width] for width <= 32, keys summed in order into each lane (a 5-8 vector `pv_block`'s
/// arithmetic, lane for lane), each V vector loaded once for the three rows.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn pv_rows_seq<const FULL: bool>(at: RowsAt, width: usize) {
    let (p, v, acc, lds, keys, ldv, lda) = at;
    const N: usize = 4;
    let mut masks = [_mm256_set1_epi32(-1); N];
    for (c, m) in masks.iter_mut().enumerate() {
        let live = width.saturating_sub(8 * c);
        if live < 8 {
            *m = tail_mask(live);
        }
    }
    let mut a = [[_mm256_setzero_ps(); N]; 3];
    for (r, ar) in a.iter_mut().enumerate() {
        for c in 0..N {
            ar[c] = _mm256_maskload_ps(acc.add(r * lda + 8 * c), masks[c]);
        }
    }
    for s in 0..keys {
        let row = v.add(s * ldv);
        let pb = [
            _mm256_set1_ps(*p.add(s)),
            _mm256_set1_ps(*p.add(lds + s)),
            _mm256_set1_ps(*p.add(2 * lds + s)),
        ];
        for c in 0..N {
            // Whole pieces load unmasked: four mask registers beside 12 sums and 3 broadcasts spill.
            let vv = if FULL {
                _mm256_loadu_ps(row.add(8 * c))
            } else {
                _mm256_maskload_ps(row.add(8 * c), masks[c])
            };
            for r in 0..3 {
                a[r][c] = _mm256_fmadd_ps(pb[r], vv, a[r][c]);
            }
        }
    }
    for (r, ar) in a.iter().enumerate() {
        for c in 0..N {
            _mm256_maskstore_ps(acc.add(r * lda + 8 * c), masks[c], ar[c]);
        }
    }
}

/// acc[r*d..][..d] += sum over s < keys of p[r*lds + s] * v[s*ldv..][..d] for r < rows: `pv` on each
/// row (bit for bit), three rows at a time sharing each V load where `pv` sums keys in order.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn pv_rows(args: PvArgs<'_>) {
    // Rows in threes through `pv`'s column blocks: in-order blocks (5-8 vectors) in 32-column
    // pieces shared by the three rows, split blocks row by row.
    let three = |a: &PvArgs<'_>, r: usize, ap: *mut f32| {
        for (c0, width) in col_blocks(a.d, 64) {
            if width.div_ceil(8) >= 5 {
                for s0 in (0..width).step_by(32) {
                    let w = (width - s0).min(32);
                    if w == 32 {
                        pv_rows_seq::<true>(a.rows_at(r, c0 + s0, ap), w);
                    } else {
                        pv_rows_seq::<false>(a.rows_at(r, c0 + s0, ap), w);
                    }
                }
            } else {
                for i in r..r + 3 {
                    let p = &a.p[i * a.lds..i * a.lds + a.keys];
                    pv_col_block(p, a.v.as_ptr().add(c0), a.ldv, ap.add(i * a.d + c0), width);
                }
            }
        }
    };
    args.in_threes(three, pv);
}

/// exp(x) for x <= ~88.4: Cephes range reduction x = n ln2 + r, |r| <= ln2/2, degree-6
/// polynomial, then scale by 2^n through the exponent bits.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn exp8(x: __m256) -> __m256 {
    // Below this the result is not a normal f32; flush to 0 (also maps -inf to 0).
    let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.336_54));
    // min/max return their second operand for NaN, so NaN passes through.
    let x = _mm256_min_ps(_mm256_set1_ps(88.376_26), x);
    let x = _mm256_max_ps(_mm256_set1_ps(-87.336_54), x);
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let (set1, mul, add) = (_mm256_set1_ps, _mm256_mul_ps, _mm256_add_ps);
    let y = exp_poly!(x, n, set1, _mm256_fmadd_ps, _mm256_fnmadd_ps, mul, add);
    let pow2n = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n)))
}

/// row[i] = exp(row[i] - max(row)); returns (max, sum of the new values).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn exp_sum(row: &mut [f32]) -> (f32, f32) {
    let n = row.len();
    let n8 = n / 8 * 8;
    let p = row.as_mut_ptr();
    let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i < n8 {
        mv = _mm256_max_ps(mv, _mm256_loadu_ps(p.add(i)));
        i += 8;
    }
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), mv);
    let max = lanes
        .iter()
        .chain(&row[n8..])
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    let maxv = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    i = 0;
    while i < n8 {
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), maxv));
        _mm256_storeu_ps(p.add(i), e);
        sum = _mm256_add_ps(sum, e);
        i += 8;
    }
    if n8 < n {
        // Tail through a -inf padded vector: the padding lanes become exp(-inf) = 0.
        let mut tmp = [f32::NEG_INFINITY; 8];
        tmp[..n - n8].copy_from_slice(&row[n8..]);
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(tmp.as_ptr()), maxv));
        _mm256_storeu_ps(tmp.as_mut_ptr(), e);
        row[n8..].copy_from_slice(&tmp[..n - n8]);
        sum = _mm256_add_ps(sum, e);
    }
    (max, hsum(sum))
}

/// dst[i] = scale * codes[i], as `generic::widen_q8` bit for bit (the same one product).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn widen_q8(codes: &[i8], scale: f32, dst: &mut [f32]) {
    let n = codes.len();
    assert_eq!(n, dst.len(), "widen_q8: length mismatch");
    let sv = _mm256_set1_ps(scale);
    let n8 = n / 8 * 8;
    let mut i = 0;
    while i < n8 {
        // 8 codes (one 64-bit load) sign-extended to 8 int32 lanes, converted exactly.
        let c = _mm_loadl_epi64(codes.as_ptr().add(i).cast());
        let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_mul_ps(sv, f));
        i += 8;
    }
    for t in n8..n {
        dst[t] = scale * codes[t] as f32;
    }
}

/// dst[i] = widened src[i].
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    let n = src.len();
    assert_eq!(n, dst.len(), "widen_bf16: length mismatch");
    let n8 = n / 8 * 8;
    let mut i = 0;
    while i < n8 {
        let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
        let f = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_castsi256_ps(f));
        i += 8;
    }
    for t in n8..n {
        dst[t] = bf16_to_f32(src[t]);
    }
}
