//! AVX-512 (F/BW/VL/DQ) + FMA attention primitives (16 f32 lanes, masked head-dim tails).
//!
//! Numerical contract: f32 FMA accumulation. Scores for 8 keys are reduced together (fold
//! 512 -> 256 bits, then a horizontal-add tree); `pv` keeps the output row in registers
//! across all keys. A prompt's rows go three at a time (`qk`'s row groups, `pv_rows`), sharing
//! each K/V load: every row's arithmetic is the one-row kernel's, bit for bit. exp is a Cephes-style polynomial scaled with `vscalefps` (max error
//! ~2 ulp, gradual underflow to 0, NaN propagates).

use std::arch::x86_64::*;
use std::ops::Range;

use super::operands::RowsAt;
use super::operands::{col_blocks, pv_has_work};
use super::stamp::{even_odd_keys, exp_poly, row_scores};
use super::{PvArgs, QkArgs};

/// Mask of the first `n` lanes (all 16 when n >= 16).
#[inline]
pub(crate) fn lanes(n: usize) -> __mmask16 {
    if n >= 16 {
        !0
    } else {
        (1u16 << n) - 1
    }
}

/// Horizontal sum of one vector in the order of each lane of `hsum8` (halves, quarters, then pairs),
/// so a key's score has the same bits in a group of 8 keys or in the tail (see the AVX2 tier).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
fn hsum(v: __m512) -> f32 {
    let h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
    let q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
    let w = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps::<1>(w, w)))
}

/// [sum of a[0]'s lanes, ..., sum of a[7]'s lanes] in one 8-lane vector: a transpose-and-add
/// tree on full zmm registers (8 -> 4 -> 2 -> 1), ~24 single-uop shuffles/adds for 8 sums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
fn hsum8(a: &[__m512; 8]) -> __m256 {
    // Halves: [x.lo256 + x.hi256 | y.lo256 + y.hi256] for the pairs (0,1) (2,3) (4,5) (6,7).
    let halves = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y),
        )
    };
    let (h01, h23, h45, h67) = (
        halves(a[0], a[1]),
        halves(a[2], a[3]),
        halves(a[4], a[5]),
        halves(a[6], a[7]),
    );
    // Quarters: 128-bit lane i holds 4 partial sums of vector i (0..4), then of 4 + i.
    let quarters = |x: __m512, y: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
        )
    };
    let q0 = quarters(h01, h23);
    let q1 = quarters(h45, h67);
    // In-lane: lane i -> [sum(i), sum(4 + i), sum(i), sum(4 + i)].
    let v = _mm512_add_ps(_mm512_unpacklo_ps(q0, q1), _mm512_unpackhi_ps(q0, q1));
    let v = _mm512_add_ps(v, _mm512_permute_ps::<0b01_00_11_10>(v));
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, v))
}

/// acc[j] += q * k_j[..q.len()] lane-wise for the J keys `k + j*ldk`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
unsafe fn dot_keys<const J: usize>(q: &[f32], k: *const f32, ldk: usize, acc: &mut [__m512; J]) {
    let (d, q) = (q.len(), q.as_ptr());
    let mut i = 0;
    while i < d {
        // Masked-off lanes are neither read nor faulted on, and load as 0.
        let m = lanes(d - i);
        let qv = _mm512_maskz_loadu_ps(m, q.add(i));
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k.add(j * ldk + i)), *a);
        }
        i += 16;
    }
}

/// The scores `args` describes: scores[r*lds + s] = dot(q[r*d..][..d], k[s*ldk..][..d]).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub unsafe fn qk(args: QkArgs<'_>) {
    if !args.has_work() {
        return;
    }
    let (kp, ldk, keys, d, lds) = (args.k.as_ptr(), args.ldk, args.keys, args.d, args.lds);
    let (rows, q, scores) = (args.rows, args.q.as_ptr(), args.scores.as_mut_ptr());
    let keys8 = keys / 8 * 8;
    // Groups of 3 rows share each key load (24 accumulators); each score's arithmetic is the
    // one-row kernel's (lane-wise FMAs over d, then `hsum8`), so a row's scores do not depend on
    // the rows beside it.
    let mut r = 0;
    while r + 3 <= rows {
        let qr = q.add(r * d);
        let out = scores.add(r * lds);
        for s in (0..keys8).step_by(8) {
            let mut acc = [[_mm512_setzero_ps(); 8]; 3];
            dot_rows_keys::<3>(qr, d, kp.add(s * ldk), ldk, d, &mut acc);
            for (i, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add(i * lds + s), hsum8(a));
            }
        }
        for i in 0..3 {
            let qi = &args.q[(r + i) * d..(r + i + 1) * d];
            tail_keys(qi, kp, ldk, keys8..keys, out.add(i * lds));
        }
        r += 3;
    }
    for r in r..rows {
        let (qr, out) = (&args.q[r * d..(r + 1) * d], scores.add(r * lds));
        row_scores!(_mm512_setzero_ps, qr, kp, ldk, 0, keys, out);
    }
}

/// out[s] = dot(q, k_s) for the keys s in `keys` one at a time (a row group's keys past its last
/// group of 8), as `row_scores!` scores them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
unsafe fn tail_keys(q: &[f32], kp: *const f32, ldk: usize, keys: Range<usize>, out: *mut f32) {
    for s in keys {
        let mut acc = [_mm512_setzero_ps(); 1];
        dot_keys::<1>(q, kp.add(s * ldk), ldk, &mut acc);
        *out.add(s) = hsum(acc[0]);
    }
}

/// acc[r][j] += q_r[..d] * k_j[..d] lane-wise for R query rows `q + r*ldq` and the 8 keys `k + j*ldk`:
/// `dot_keys::<8>` on each row, every key vector loaded once for all R rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)] // a register tile: acc[r][j] reads clearer than zipped iterators
unsafe fn dot_rows_keys<const R: usize>(
    q: *const f32,
    ldq: usize,
    k: *const f32,
    ldk: usize,
    d: usize,
    acc: &mut [[__m512; 8]; R],
) {
    let mut i = 0;
    while i < d {
        let m = lanes(d - i);
        let mut qv = [_mm512_setzero_ps(); R];
        for (r, v) in qv.iter_mut().enumerate() {
            *v = _mm512_maskz_loadu_ps(m, q.add(r * ldq + i));
        }
        for j in 0..8 {
            let kv = _mm512_maskz_loadu_ps(m, k.add(j * ldk + i));
            for r in 0..R {
                acc[r][j] = _mm512_fmadd_ps(qv[r], kv, acc[r][j]);
            }
        }
        i += 16;
    }
}

/// acc[..width] += sum_s p[s] * v_s[..width] for width <= 16*N, accumulating in registers.
/// Even and odd keys go to separate accumulators (summed at the end) so that short rows
/// (N <= 4 vectors) still have 2N independent FMA chains to cover the FMA latency.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
unsafe fn pv_block<const N: usize>(
    p: &[f32],
    v: *const f32,
    ldv: usize,
    acc: *mut f32,
    width: usize,
) {
    let mut masks = [0 as __mmask16; N];
    for (c, m) in masks.iter_mut().enumerate() {
        *m = lanes(width - 16 * c);
    }
    let mut even = [_mm512_setzero_ps(); N];
    let mut odd = [_mm512_setzero_ps(); N];
    for c in 0..N {
        even[c] = _mm512_maskz_loadu_ps(masks[c], acc.add(16 * c));
    }
    let (set1, fmadd) = (_mm512_set1_ps, _mm512_fmadd_ps);
    even_odd_keys!(p, v, ldv, N, even, odd, set1, fmadd, |row, c| {
        _mm512_maskz_loadu_ps(masks[c], row.add(16 * c))
    });
    for c in 0..N {
        _mm512_mask_storeu_ps(acc.add(16 * c), masks[c], _mm512_add_ps(even[c], odd[c]));
    }
}

/// acc[..d] += sum over s < p.len() of p[s] * v[s*ldv..][..d], keys in order.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub unsafe fn pv(p: &[f32], v: &[f32], ldv: usize, d: usize, acc: &mut [f32]) {
    if !pv_has_work(p, v, ldv, d, acc) {
        return;
    }
    // Columns in blocks of up to 8 vectors (128 floats): 8 accumulators stay in registers.
    for (c0, width) in col_blocks(d, 128) {
        let (vp, ap) = (v.as_ptr().add(c0), acc.as_mut_ptr().add(c0));
        match width.div_ceil(16) {
            8 => pv_block::<8>(p, vp, ldv, ap, width),
            7 => pv_block::<7>(p, vp, ldv, ap, width),
            6 => pv_block::<6>(p, vp, ldv, ap, width),
            5 => pv_block::<5>(p, vp, ldv, ap, width),
            4 => pv_block::<4>(p, vp, ldv, ap, width),
            3 => pv_block::<3>(p, vp, ldv, ap, width),
            2 => pv_block::<2>(p, vp, ldv, ap, width),
            _ => pv_block::<1>(p, vp, ldv, ap, width),
        }
    }
}

/// `pv` for R rows sharing their keys: acc[r*lda..][..width] += sum_s p[r*lds + s] * v_s[..width] for
/// width <= 64, each V vector loaded once for the R rows. Every lane's arithmetic is `pv_block`'s (even
/// keys into the running sum, odd keys into a second one started at 0, the two added at the end), so a
/// row's result does not depend on the rows beside it.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
#[allow(clippy::needless_range_loop)] // a register tile, indexed [row][vector]
unsafe fn pv_rows_block<const R: usize>(at: RowsAt, width: usize) {
    let (p, v, acc, lds, keys, ldv, lda) = at;
    const N: usize = 4;
    let mut masks = [0 as __mmask16; N];
    for (c, m) in masks.iter_mut().enumerate() {
        *m = lanes(width.saturating_sub(16 * c));
    }
    let mut even = [[_mm512_setzero_ps(); N]; R];
    let mut odd = [[_mm512_setzero_ps(); N]; R];
    for r in 0..R {
        for c in 0..N {
            even[r][c] = _mm512_maskz_loadu_ps(masks[c], acc.add(r * lda + 16 * c));
        }
    }
    let mut s = 0;
    while s + 2 <= keys {
        let row = v.add(s * ldv);
        let mut p0 = [_mm512_setzero_ps(); R];
        let mut p1 = [_mm512_setzero_ps(); R];
        for r in 0..R {
            p0[r] = _mm512_set1_ps(*p.add(r * lds + s));
            p1[r] = _mm512_set1_ps(*p.add(r * lds + s + 1));
        }
        for c in 0..N {
            let v0 = _mm512_maskz_loadu_ps(masks[c], row.add(16 * c));
            let v1 = _mm512_maskz_loadu_ps(masks[c], row.add(ldv + 16 * c));
            for r in 0..R {
                even[r][c] = _mm512_fmadd_ps(p0[r], v0, even[r][c]);
                odd[r][c] = _mm512_fmadd_ps(p1[r], v1, odd[r][c]);
            }
        }
        s += 2;
    }
    if s < keys {
        let row = v.add(s * ldv);
        for c in 0..N {
            let v0 = _mm512_maskz_loadu_ps(masks[c], row.add(16 * c));
            for r in 0..R {
                even[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(r * lds + s)), v0, even[r][c]);
            }
        }
    }
    for r in 0..R {
        for c in 0..N {
            let sum = _mm512_add_ps(even[r][c], odd[r][c]);
            _mm512_mask_storeu_ps(acc.add(r * lda + 16 * c), masks[c], sum);
        }
    }
}

/// acc[r*d..][..d] += sum over s < keys of p[r*lds + s] * v[s*ldv..][..d] for r < rows: `pv` on each
/// row (bit for bit), three rows at a time sharing each V load.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub unsafe fn pv_rows(args: PvArgs<'_>) {
    let three = |a: &PvArgs<'_>, r: usize, ap: *mut f32| {
        for (c0, w) in col_blocks(a.d, 64) {
            pv_rows_block::<3>(a.rows_at(r, c0, ap), w);
        }
    };
    args.in_threes(three, pv);
}

/// exp(x): Cephes range reduction x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial, then
/// `scalef` multiplies by 2^n with correct overflow/underflow.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
pub(crate) fn exp16(x: __m512) -> __m512 {
    // exp(-104) is below the smallest subnormal and exp(89) overflows; clamping keeps the
    // reduction finite (max/min return their second operand for NaN, so NaN passes through).
    let x = _mm512_max_ps(_mm512_set1_ps(-104.0), x);
    let x = _mm512_min_ps(_mm512_set1_ps(89.0), x);
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let (set1, mul, add) = (_mm512_set1_ps, _mm512_mul_ps, _mm512_add_ps);
    let y = exp_poly!(x, n, set1, _mm512_fmadd_ps, _mm512_fnmadd_ps, mul, add);
    _mm512_scalef_ps(y, n)
}

/// row[i] = exp(row[i] - max(row)); returns (max, sum of the new values).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub unsafe fn exp_sum(row: &mut [f32]) -> (f32, f32) {
    let n = row.len();
    let p = row.as_mut_ptr();
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut mv = ninf;
    let mut i = 0;
    while i < n {
        // Masked-off lanes load -inf so they cannot win the max.
        mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(ninf, lanes(n - i), p.add(i)));
        i += 16;
    }
    let max = _mm512_reduce_max_ps(mv);
    let maxv = _mm512_set1_ps(max);
    let mut sum = _mm512_setzero_ps();
    i = 0;
    while i < n {
        let m = lanes(n - i);
        let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p.add(i)), maxv));
        _mm512_mask_storeu_ps(p.add(i), m, e);
        sum = _mm512_mask_add_ps(sum, m, sum, e);
        i += 16;
    }
    (max, _mm512_reduce_add_ps(sum))
}

/// dst[i] = scale * codes[i], as `generic::widen_q8` bit for bit (the same one product).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub unsafe fn widen_q8(codes: &[i8], scale: f32, dst: &mut [f32]) {
    let n = codes.len();
    assert_eq!(n, dst.len(), "widen_q8: length mismatch");
    let sv = _mm512_set1_ps(scale);
    let (s, d) = (codes.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    while i < n {
        // 16 codes (masked at the tail) sign-extended to int32 lanes, converted exactly.
        let m = lanes(n - i);
        let c = _mm_maskz_loadu_epi8(m, s.add(i).cast());
        let f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c));
        _mm512_mask_storeu_ps(d.add(i), m, _mm512_mul_ps(sv, f));
        i += 16;
    }
}

/// dst[i] = widened src[i].
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and FMA.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub unsafe fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    let n = src.len();
    assert_eq!(n, dst.len(), "widen_bf16: length mismatch");
    let widen = |h: __m256i| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    let n32 = n / 32 * 32;
    let mut i = 0;
    // Two vectors per step: whole 64-byte source lines, unmasked.
    while i < n32 {
        let h0 = _mm256_loadu_si256(s.add(i).cast());
        let h1 = _mm256_loadu_si256(s.add(i + 16).cast());
        _mm512_storeu_ps(d.add(i), widen(h0));
        _mm512_storeu_ps(d.add(i + 16), widen(h1));
        i += 32;
    }
    while i < n {
        let m = lanes(n - i);
        let h = _mm256_maskz_loadu_epi16(m, s.add(i).cast());
        _mm512_mask_storeu_ps(d.add(i), m, widen(h));
        i += 16;
    }
}
