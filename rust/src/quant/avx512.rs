//! AVX-512 VNNI tier of `quant_linear` for Q8, Q80, Q4, Q40 and Q50 (the super-block formats':
//! `superblock/avx512.rs`):
//! `vpdpbusd` multiplies 4 unsigned weight codes by 4 signed
//! activation codes and adds them into an i32 lane, 16 output rows per instruction; up to 8 x rows
//! share each loaded weight vector.
//!
//! Q8 codes are stored as `c + 128` (unsigned, as `vpdpbusd` wants its first operand), so a block's
//! sum is corrected by `128 * sum(q)` (exact, in i32); Q8 reads both activation codes (coarse and
//! residual, two `vpdpbusd` per weight vector) and combines them in i32. Q4 codes are 0..=15 already; their nibbles
//! are split with a shift and a mask (Q40's too; Q50 ORs in each byte's fifth bit from its bit plane).
//!
//! Numerical contract: as the scalar tier, except that each block's contribution is added with a
//! fused multiply-add (`d * t + y`); Q4, Q40 and Q50 exactly as the scalar tier (its fused form).

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2::BlockTile;
use super::{store, ActsOut, Format, Job, LO, QPANEL, QSUB};
use crate::isa::Isa;

/// x rows per register tile: 8 (Q8: 16) i32 sums and 8 f32 outputs, plus the weight vectors.
const MR: usize = 8;

/// Whether this CPU has the tier (AVX-512 F/BW/VL/DQ and VNNI).
pub fn usable() -> bool {
    Isa::Avx512.cpu_has() && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// Blocks whose scales are found together: their maxima reduced into one vector, both scales of all
/// of them from one division each.
const SCALE_GROUP: usize = 16;

/// The maxima of 16 vectors, lane j of the result the maximum over `a[j]`'s lanes: a tree of in-register
/// shuffles (15 steps for 16 blocks instead of a horizontal reduction of 4 dependent steps each). Max is
/// exact, so the values are those of any reduction order.
#[inline(always)]
unsafe fn max_of_each(a: &[__m512; SCALE_GROUP]) -> __m512 {
    // Halves of each pair of blocks, then quarters, then within 128-bit lanes.
    let m: [__m512; 8] = std::array::from_fn(|i| {
        let (x, y) = (a[2 * i], a[2 * i + 1]);
        _mm512_max_ps(
            _mm512_shuffle_f32x4::<0x44>(x, y),
            _mm512_shuffle_f32x4::<0xEE>(x, y),
        )
    });
    // Lane L of n[i] holds block 4 i + L's 4 partial maxima.
    let n: [__m512; 4] = std::array::from_fn(|i| {
        let (x, y) = (m[2 * i], m[2 * i + 1]);
        _mm512_max_ps(
            _mm512_shuffle_f32x4::<0x88>(x, y),
            _mm512_shuffle_f32x4::<0xDD>(x, y),
        )
    });
    let o: [__m512; 2] = std::array::from_fn(|i| {
        let (x, y) = (n[2 * i], n[2 * i + 1]);
        _mm512_max_ps(
            _mm512_shuffle_ps::<0x44>(x, y),
            _mm512_shuffle_ps::<0xEE>(x, y),
        )
    });
    // Element 4 L + e now holds block 4 e + L's maximum.
    let t = _mm512_max_ps(
        _mm512_shuffle_ps::<0x88>(o[0], o[1]),
        _mm512_shuffle_ps::<0xDD>(o[0], o[1]),
    );
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, t)
}

/// Where `sums_of_each`'s last step leaves block B's sum of kind c (0 coarse, 1 residual): element
/// `4 L + e` of vector i (the second vector's elements numbered from 16), with B = 8 i + 2 e + L / 2 and
/// c = L % 2 (the shuffles' order, below).
const fn sum_positions(kind: usize) -> [i32; 16] {
    let mut idx = [0i32; 16];
    let mut b = 0;
    while b < 16 {
        let (i, rem) = (b / 8, b % 8);
        let (e, l) = (rem / 2, 2 * (rem % 2) + kind);
        idx[b] = (16 * i + 4 * l + e) as i32;
        b += 1;
    }
    idx
}

/// 16 blocks' code sums from their per-4 sums (`v[j]`: dwords 0-7 block j's coarse codes, 8-15 its
/// residual ones): (coarse sums, residual sums), lane j block j's. Exact i32 additions (|sum| <= 32 x
/// 127), in a tree of shuffles instead of a horizontal reduction per block.
#[inline(always)]
unsafe fn sums_of_each(v: &[__m512i; SCALE_GROUP]) -> (__m512i, __m512i) {
    // m[j]'s 128-bit lanes: block 2j coarse, 2j residual, 2j+1 coarse, 2j+1 residual (4 partials each).
    let m: [__m512i; 8] = std::array::from_fn(|j| {
        let (x, y) = (v[2 * j], v[2 * j + 1]);
        _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0x88>(x, y),
            _mm512_shuffle_i32x4::<0xDD>(x, y),
        )
    });
    // Two partials of each of m[2i]'s lanes, then two of m[2i + 1]'s.
    let n: [__m512i; 4] = std::array::from_fn(|i| {
        let (x, y) = (m[2 * i], m[2 * i + 1]);
        _mm512_add_epi32(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y))
    });
    // Element 4 L + e of o[i]: lane L of m[4 i + e], whole.
    let o: [__m512i; 2] = std::array::from_fn(|i| {
        let (x, y) = (
            _mm512_castsi512_ps(n[2 * i]),
            _mm512_castsi512_ps(n[2 * i + 1]),
        );
        _mm512_add_epi32(
            _mm512_castps_si512(_mm512_shuffle_ps::<0x88>(x, y)),
            _mm512_castps_si512(_mm512_shuffle_ps::<0xDD>(x, y)),
        )
    });
    let at = |kind: usize| {
        let p = sum_positions(kind);
        _mm512_loadu_si512(p.as_ptr().cast())
    };
    (
        _mm512_permutex2var_epi32(o[0], at(0), o[1]),
        _mm512_permutex2var_epi32(o[0], at(1), o[1]),
    )
}

/// # Safety
/// The CPU supports the tier (`usable`); `out` holds x's blocks (`quantize_activations`) and no other
/// thread writes them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
pub unsafe fn quantize_rows(x: &[f32], out: ActsOut) {
    let sign = _mm512_set1_ps(-0.0);
    let lo = _mm512_set1_epi8(-127);
    let ones = _mm512_set1_epi8(1);
    // packs interleaves its inputs per 128-bit lane: lane L of the packed bytes holds 4 codes each of
    // c[0..16], c[16..32], c2[0..16], c2[16..32] (from 4L on); this gathers them back into k order.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let blocks = x.len() / QSUB;
    let mut g0 = 0;
    while g0 < blocks {
        let n = SCALE_GROUP.min(blocks - g0);
        // Each block's scales, 16 blocks at once: block_scale's rule lane by lane (the same correctly
        // rounded divisions; a lane that is not > 0, or whose 127 / max is not finite, gets zeros).
        let mut a = [_mm512_setzero_ps(); SCALE_GROUP];
        for (j, aj) in a.iter_mut().enumerate().take(n) {
            let p = x.as_ptr().add((g0 + j) * QSUB);
            *aj = _mm512_max_ps(
                _mm512_andnot_ps(sign, _mm512_loadu_ps(p)),
                _mm512_andnot_ps(sign, _mm512_loadu_ps(p.add(16))),
            );
        }
        let amax = max_of_each(&a);
        let c127 = _mm512_set1_ps(127.0);
        let inv = _mm512_div_ps(c127, amax);
        let ok = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(amax, _mm512_setzero_ps())
            & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(inv, _mm512_set1_ps(f32::INFINITY));
        let dd = _mm512_maskz_div_ps(ok, amax, c127);
        let id = _mm512_maskz_mov_ps(ok, inv);
        let lo_f = _mm512_set1_ps(LO as f32);
        let (mut ids, mut id2s, mut dds) = ([0f32; 16], [0f32; 16], [0f32; 16]);
        _mm512_storeu_ps(ids.as_mut_ptr(), id);
        _mm512_storeu_ps(id2s.as_mut_ptr(), _mm512_mul_ps(id, lo_f));
        _mm512_storeu_ps(dds.as_mut_ptr(), dd);
        let mut sums = [_mm512_setzero_si512(); SCALE_GROUP];
        for j in 0..n {
            let b = g0 + j;
            let p = x.as_ptr().add(b * QSUB);
            let v = [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))];
            let (idv, ddv, id2v) = (
                _mm512_set1_ps(ids[j]),
                _mm512_set1_ps(dds[j]),
                _mm512_set1_ps(id2s[j]),
            );
            // Default MXCSR rounding is to nearest even, as the reference's round_ties_even; the
            // residual is a separate multiply and subtract, as in the reference. |x * id| <= 127 for
            // finite x, so the coarse codes need no clamp before the residual; the saturating packs and
            // the max with -127 below clamp both codes to [-127, 127] as the reference does.
            let c = v.map(|vh| _mm512_cvtps_epi32(_mm512_mul_ps(vh, idv)));
            let c2: [__m512i; 2] = std::array::from_fn(|h| {
                let r = _mm512_sub_ps(v[h], _mm512_mul_ps(_mm512_cvtepi32_ps(c[h]), ddv));
                _mm512_cvtps_epi32(_mm512_mul_ps(r, id2v))
            });
            let packed = _mm512_packs_epi16(
                _mm512_packs_epi32(c[0], c[1]),
                _mm512_packs_epi32(c2[0], c2[1]),
            );
            let codes = _mm512_max_epi8(_mm512_permutexvar_epi32(order, packed), lo);
            let at = b * QSUB;
            _mm256_storeu_si256(out.q.add(at).cast(), _mm512_castsi512_si256(codes));
            _mm256_storeu_si256(out.q2.add(at).cast(), _mm512_extracti64x4_epi64::<1>(codes));
            // Sums of the stored codes, 4 at a time (ones times each signed code), reduced below.
            sums[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, codes);
        }
        // The 16 blocks' scales and sums stored at once (a shorter last group: its blocks only).
        let (s1, s2) = sums_of_each(&sums);
        let keep: __mmask16 = if n == 16 { 0xffff } else { (1 << n) - 1 };
        _mm512_mask_storeu_ps(out.d.add(g0), keep, dd);
        _mm512_mask_storeu_ps(out.s.add(g0), keep, _mm512_cvtepi32_ps(s1));
        _mm512_mask_storeu_ps(out.d_fine.add(g0), keep, _mm512_div_ps(dd, lo_f));
        let fine = _mm512_add_epi32(_mm512_mullo_epi32(s1, _mm512_set1_epi32(LO)), s2);
        _mm512_mask_storeu_epi32(out.s_fine.add(g0).cast(), keep, fine);
        g0 += n;
    }
}

/// Four activation codes starting at `p`, broadcast to every lane.
#[inline(always)]
pub(super) unsafe fn bx(p: *const i8) -> __m512i {
    _mm512_set1_epi32(p.cast::<i32>().read_unaligned())
}

/// Q50's fifth bits of code vector `v` (bit v of each byte of the bit plane `hb`) moved to bit 4: the
/// 16-bit shifts carry bits across the byte boundary only into positions the 0x10 mask drops.
#[inline(always)]
pub(super) unsafe fn fifth_bits(hb: __m512i, v: usize) -> __m512i {
    let moved = match v {
        0 => _mm512_slli_epi16::<4>(hb),
        1 => _mm512_slli_epi16::<3>(hb),
        2 => _mm512_slli_epi16::<2>(hb),
        3 => _mm512_slli_epi16::<1>(hb),
        4 => hb,
        5 => _mm512_srli_epi16::<1>(hb),
        6 => _mm512_srli_epi16::<2>(hb),
        _ => _mm512_srli_epi16::<3>(hb),
    };
    _mm512_and_si512(moved, _mm512_set1_epi8(0x10))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
#[allow(clippy::needless_range_loop)] // y[r] and acc[r] are register tiles indexed by a constant bound
unsafe fn tile<const M: usize>(job: &Job<'_>, p: usize, i0: usize) {
    let src = BlockTile::new(job, p, i0);
    let mut y = [_mm512_setzero_ps(); M];
    let nib = _mm512_set1_epi8(0x0f);
    src.for_each_block(|b, blk| {
        match src.f {
            Format::Q8 | Format::Q80 => {
                let dv = if src.f == Format::Q80 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(blk.cast()))
                } else {
                    _mm512_loadu_ps(blk.cast())
                };
                let (halves, co) = (src.f.block() / QSUB, src.f.codes_at());
                for h in 0..halves {
                    let sb = b * halves + h;
                    let mut acc = [_mm512_setzero_si512(); M];
                    let mut acc2 = [_mm512_setzero_si512(); M];
                    for g in 0..8 {
                        let wv = _mm512_loadu_si512(blk.add(co + h * 512 + g * 64).cast());
                        for r in 0..M {
                            let at = r * src.k + sb * QSUB + g * 4;
                            acc[r] = _mm512_dpbusd_epi32(acc[r], wv, bx(src.xq.add(at)));
                            acc2[r] = _mm512_dpbusd_epi32(acc2[r], wv, bx(src.xq2.add(at)));
                        }
                    }
                    for r in 0..M {
                        // 254 * (dot + 128 s) + (dot2 + 128 s2) - 128 * (254 s + s2): exact in i32.
                        let fine = _mm512_add_epi32(
                            _mm512_mullo_epi32(acc[r], _mm512_set1_epi32(LO)),
                            acc2[r],
                        );
                        let fix = _mm512_set1_epi32(128 * src.sfs[r * src.nsub + sb]);
                        let dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(fine, fix));
                        let t = _mm512_mul_ps(dot, _mm512_set1_ps(src.dfs[r * src.nsub + sb]));
                        y[r] = _mm512_fmadd_ps(dv, t, y[r]);
                    }
                }
            }
            _ => {
                // Q4's d * c + m, Q40's / Q50's d * (c - z) = d * c + (-z d) (exact): one min per row.
                let dv = _mm512_cvtph_ps(_mm256_loadu_si256(blk.cast()));
                let mv = match src.f.zero_point() {
                    Some(z) => _mm512_mul_ps(_mm512_set1_ps(-(z as f32)), dv),
                    None => _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32).cast())),
                };
                let (co, q5) = (src.f.codes_at(), src.f == Format::Q50);
                let hb = if q5 {
                    _mm512_loadu_si512(blk.add(src.f.high_bits_at()).cast())
                } else {
                    _mm512_setzero_si512()
                };
                // Two i32 chains per row (low and high nibbles): the block's 8 dot products are
                // then 4 deep, not 8; the sums are exact integers either way.
                let mut acc = [_mm512_setzero_si512(); M];
                let mut acc2 = [_mm512_setzero_si512(); M];
                for g in 0..4 {
                    let wv = _mm512_loadu_si512(blk.add(co + g * 64).cast());
                    let mut lo = _mm512_and_si512(wv, nib);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), nib);
                    if q5 {
                        lo = _mm512_or_si512(lo, fifth_bits(hb, 2 * g));
                        hi = _mm512_or_si512(hi, fifth_bits(hb, 2 * g + 1));
                    }
                    for r in 0..M {
                        let xr = src.xq.add(r * src.k + b * QSUB + g * 8);
                        acc[r] = _mm512_dpbusd_epi32(acc[r], lo, bx(xr));
                        acc2[r] = _mm512_dpbusd_epi32(acc2[r], hi, bx(xr.add(4)));
                    }
                }
                for r in 0..M {
                    let sx = _mm512_set1_ps(src.sxs[r * src.nsub + b]);
                    let dot = _mm512_cvtepi32_ps(_mm512_add_epi32(acc[r], acc2[r]));
                    let t = _mm512_fmadd_ps(dv, dot, _mm512_mul_ps(mv, sx));
                    y[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(src.dxs[r * src.nsub + b]), y[r]);
                }
            }
        }
    });
    for r in 0..M {
        let mut sums = [0.0f32; QPANEL];
        _mm512_storeu_ps(sums.as_mut_ptr(), y[r]);
        store(job, i0 + r, p, &sums);
    }
}

/// # Safety
/// The CPU supports the tier; `job` satisfies `quant_linear`'s contract; no other thread writes the
/// columns of `panels`.
pub unsafe fn panels(job: &Job<'_>, panels: Range<usize>) {
    // SAFETY (the tiles): the caller's contract; each tile's rows and panel are the job's.
    job.for_each_tile(panels, MR, |p, i0, m| match m {
        1 => tile::<1>(job, p, i0),
        2 => tile::<2>(job, p, i0),
        3 => tile::<3>(job, p, i0),
        4 => tile::<4>(job, p, i0),
        5 => tile::<5>(job, p, i0),
        6 => tile::<6>(job, p, i0),
        7 => tile::<7>(job, p, i0),
        _ => tile::<8>(job, p, i0),
    });
}
