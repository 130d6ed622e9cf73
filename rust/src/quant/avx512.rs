//! AVX-512 VNNI tier of `quant_linear`: `vpdpbusd` multiplies 4 unsigned weight codes by 4 signed
//! activation codes and adds them into an i32 lane, 16 output rows per instruction; up to 8 x rows
//! share each loaded weight vector.
//!
//! Q8 codes are stored as `c + 128` (unsigned, as `vpdpbusd` wants its first operand), so a block's
//! sum is corrected by `128 * sum(q)` (exact, in i32); Q8 reads both activation codes (coarse and
//! residual, two `vpdpbusd` per weight vector) and combines them in i32. Q4 codes are 0..=15 already; their nibbles
//! are split with a shift and a mask.
//!
//! The super-block formats (Q4K, Q6K) unpack each sub-block's 16 rows of 6-/8-bit scales into one
//! f32 vector per sub-block; Q6K's high code bits are shifted into place beside the low nibbles.
//!
//! Numerical contract: as the scalar tier, except that each block's contribution is added with a
//! fused multiply-add (`d * t + y`, and for Q4 also `d * dot + m * sum(q)`, for Q4K
//! `ds * dot - dm * sum(q)`).

use std::arch::x86_64::*;
use std::ops::Range;

use super::kblock::{Layout, SUBS};
use super::{block_scale, store, ActsOut, BlockCodes, Format, Job, LO, QPANEL, QSUB};
use crate::isa::Isa;

/// x rows per register tile: 8 (Q8: 16) i32 sums and 8 f32 outputs, plus the weight vectors.
const MR: usize = 8;

/// Whether this CPU has the tier (AVX-512 F/BW/VL/DQ and VNNI).
pub fn usable() -> bool {
    Isa::Avx512.cpu_has() && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// # Safety
/// The CPU supports the tier (`usable`); `out` holds x's blocks (`quantize_activations`) and no other
/// thread writes them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
pub unsafe fn quantize_rows(x: &[f32], out: ActsOut) {
    let sign = _mm512_set1_ps(-0.0);
    let (lo, hi) = (_mm512_set1_epi32(-127), _mm512_set1_epi32(127));
    for b in 0..x.len() / QSUB {
        let p = x.as_ptr().add(b * QSUB);
        let v = [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))];
        let a = _mm512_max_ps(_mm512_andnot_ps(sign, v[0]), _mm512_andnot_ps(sign, v[1]));
        let amax = _mm512_reduce_max_ps(a);
        let (dd, id) = block_scale(amax);
        let (idv, ddv, id2v) = (
            _mm512_set1_ps(id),
            _mm512_set1_ps(dd),
            _mm512_set1_ps(id * LO as f32),
        );
        let (mut s1, mut s2) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for (h, &vh) in v.iter().enumerate() {
            // Default MXCSR rounding is to nearest even, as the reference's round_ties_even; the
            // residual is a separate multiply and subtract, as in the reference.
            let c = _mm512_min_epi32(
                _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(vh, idv)), lo),
                hi,
            );
            let r = _mm512_sub_ps(vh, _mm512_mul_ps(_mm512_cvtepi32_ps(c), ddv));
            let c2 = _mm512_min_epi32(
                _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(r, id2v)), lo),
                hi,
            );
            let at = b * QSUB + h * 16;
            _mm_storeu_si128(out.q.add(at).cast(), _mm512_cvtepi32_epi8(c));
            _mm_storeu_si128(out.q2.add(at).cast(), _mm512_cvtepi32_epi8(c2));
            s1 = _mm512_add_epi32(s1, c);
            s2 = _mm512_add_epi32(s2, c2);
        }
        let (s1, s2) = (_mm512_reduce_add_epi32(s1), _mm512_reduce_add_epi32(s2));
        out.put(b, BlockCodes::new(dd, s1, s2));
    }
}

/// Prefetches the weights a few blocks ahead of `blk` (measured on Granite 1B-A400M decode steps, whose
/// experts are 0.3-0.6 MB matrices read once: every line of the Q4 block 8 ahead, +10-15 % tokens/s
/// over one line 2 ahead; Q8's longer blocks stream well with one line 2 ahead, and prefetching
/// every line cost 12 %). Prefetches past the matrix's end are harmless hints.
#[inline(always)]
unsafe fn prefetch(f: Format, blk: *const u8, bb: usize) {
    match f {
        Format::Q4 => {
            let ahead = blk.wrapping_add(8 * bb);
            for line in 0..bb.div_ceil(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64).cast());
            }
        }
        _ => _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(2 * bb).cast()),
    }
}

/// Four activation codes starting at `p`, broadcast to every lane.
#[inline(always)]
unsafe fn bx(p: *const i8) -> __m512i {
    _mm512_set1_epi32(p.cast::<i32>().read_unaligned())
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
#[allow(clippy::needless_range_loop)] // y[r] and acc[r] are register tiles indexed by a constant bound
unsafe fn tile<const M: usize>(job: &Job<'_>, p: usize, i0: usize) {
    let w = job.w;
    let (f, k) = (w.format, w.k());
    let (bb, nb, nsub) = (f.block_bytes(), k / f.block(), k / QSUB);
    let base = w.data().as_ptr().add(p * nb * bb);
    let a = job.acts;
    let (xq, xq2) = (a.q.as_ptr().add(i0 * k), a.q2.as_ptr().add(i0 * k));
    let (dxs, sxs) = (&a.d[i0 * nsub..], &a.s[i0 * nsub..]);
    let (dfs, sfs) = (&a.d_fine[i0 * nsub..], &a.s_fine[i0 * nsub..]);
    let mut y = [_mm512_setzero_ps(); M];
    let nib = _mm512_set1_epi8(0x0f);
    for b in 0..nb {
        let blk = base.add(b * bb);
        prefetch(f, blk, bb);
        match f {
            Format::Q8 => {
                let dv = _mm512_loadu_ps(blk.cast());
                for h in 0..2 {
                    let sb = b * 2 + h;
                    let mut acc = [_mm512_setzero_si512(); M];
                    let mut acc2 = [_mm512_setzero_si512(); M];
                    for g in 0..8 {
                        let wv = _mm512_loadu_si512(blk.add(64 + h * 512 + g * 64).cast());
                        for r in 0..M {
                            let at = r * k + sb * QSUB + g * 4;
                            acc[r] = _mm512_dpbusd_epi32(acc[r], wv, bx(xq.add(at)));
                            acc2[r] = _mm512_dpbusd_epi32(acc2[r], wv, bx(xq2.add(at)));
                        }
                    }
                    for r in 0..M {
                        // 254 * (dot + 128 s) + (dot2 + 128 s2) - 128 * (254 s + s2): exact in i32.
                        let fine = _mm512_add_epi32(
                            _mm512_mullo_epi32(acc[r], _mm512_set1_epi32(LO)),
                            acc2[r],
                        );
                        let fix = _mm512_set1_epi32(128 * sfs[r * nsub + sb]);
                        let dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(fine, fix));
                        let t = _mm512_mul_ps(dot, _mm512_set1_ps(dfs[r * nsub + sb]));
                        y[r] = _mm512_fmadd_ps(dv, t, y[r]);
                    }
                }
            }
            _ => {
                let dv = _mm512_cvtph_ps(_mm256_loadu_si256(blk.cast()));
                let mv = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32).cast()));
                // Two i32 chains per row (low and high nibbles): the block's 8 dot products are
                // then 4 deep, not 8; the sums are exact integers either way.
                let mut acc = [_mm512_setzero_si512(); M];
                let mut acc2 = [_mm512_setzero_si512(); M];
                for g in 0..4 {
                    let wv = _mm512_loadu_si512(blk.add(64 + g * 64).cast());
                    let lo = _mm512_and_si512(wv, nib);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), nib);
                    for r in 0..M {
                        let xr = xq.add(r * k + b * QSUB + g * 8);
                        acc[r] = _mm512_dpbusd_epi32(acc[r], lo, bx(xr));
                        acc2[r] = _mm512_dpbusd_epi32(acc2[r], hi, bx(xr.add(4)));
                    }
                }
                for r in 0..M {
                    let sx = _mm512_set1_ps(sxs[r * nsub + b]);
                    let dot = _mm512_add_epi32(acc[r], acc2[r]);
                    let t = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(dot), _mm512_mul_ps(mv, sx));
                    y[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(dxs[r * nsub + b]), y[r]);
                }
            }
        }
    }
    for r in 0..M {
        let mut sums = [0.0f32; QPANEL];
        _mm512_storeu_ps(sums.as_mut_ptr(), y[r]);
        store(job, i0 + r, p, &sums);
    }
}

/// Q6K's high bits of code vector `v` (0..8 within a sub-block) moved to bits 4-5 of each byte:
/// vector v's bits are `2 (v % 4)` of its byte; 16-bit shifts move the neighbouring byte's bits only
/// into positions the 0x30 mask drops.
#[inline(always)]
unsafe fn high_bits(hb: __m512i, v: usize) -> __m512i {
    let m = _mm512_set1_epi8(0x30);
    match v % 4 {
        0 => _mm512_and_si512(_mm512_slli_epi16::<4>(hb), m),
        1 => _mm512_and_si512(_mm512_slli_epi16::<2>(hb), m),
        2 => _mm512_and_si512(hb, m),
        _ => _mm512_and_si512(_mm512_srli_epi16::<2>(hb), m),
    }
}

/// One super-block format's tile: per sub-block, the 16 rows' `ds = d * sc` (and Q4K's
/// `dm = dmin * mc`) as f32 vectors, then Q4's nibble loop (Q6K: with the high bits or-ed in).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
#[allow(clippy::needless_range_loop)] // y[r] and acc[r] are register tiles indexed by a constant bound
unsafe fn tile_super<const M: usize>(job: &Job<'_>, p: usize, i0: usize) {
    let w = job.w;
    let (f, k) = (w.format, w.k());
    let (lay, nsub) = (Layout::new(f, k), k / QSUB);
    let full = f.block_bytes();
    let a = job.acts;
    let xq = a.q.as_ptr().add(i0 * k);
    let (dxs, sxs) = (&a.d[i0 * nsub..], &a.s[i0 * nsub..]);
    let mut y = [_mm512_setzero_ps(); M];
    let nib = _mm512_set1_epi8(0x0f);
    let q4k = f == Format::Q4K;
    for b in 0..lay.blocks() {
        let t = lay.subs(b);
        let blk = w.data().as_ptr().add(lay.at(p, b));
        // The next super-block's header (its scales), one super-block ahead; harmless past the end.
        for line in 0..4 {
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(full + line * 64).cast());
        }
        let dv = _mm512_cvtph_ps(_mm256_loadu_si256(blk.cast()));
        let mv = if q4k {
            _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32).cast()))
        } else {
            _mm512_setzero_ps()
        };
        for s in 0..t {
            let sb = b * SUBS + s;
            let cp = blk.add(Layout::codes_at(f, t, s));
            let lines = if q4k { 4 } else { 6 };
            for line in 0..lines {
                _mm_prefetch::<_MM_HINT_T0>(cp.wrapping_add(full + line * 64).cast());
            }
            let (ds, dm) = if q4k {
                let (sc, mc) = super::avx2::q4k_scale_bytes(blk, t, s);
                let f32s = |v: __m128i| _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
                (_mm512_mul_ps(dv, f32s(sc)), _mm512_mul_ps(mv, f32s(mc)))
            } else {
                let sc = _mm_loadu_si128(blk.add(32 + 16 * s).cast());
                let scf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc));
                (_mm512_mul_ps(dv, scf), _mm512_setzero_ps())
            };
            let mut acc = [_mm512_setzero_si512(); M];
            let mut acc2 = [_mm512_setzero_si512(); M];
            for g in 0..4 {
                let wv = _mm512_loadu_si512(cp.add(g * 64).cast());
                let mut lo = _mm512_and_si512(wv, nib);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wv), nib);
                if !q4k {
                    let hb = _mm512_loadu_si512(cp.add(256 + (g / 2) * 64).cast());
                    lo = _mm512_or_si512(lo, high_bits(hb, 2 * g));
                    hi = _mm512_or_si512(hi, high_bits(hb, 2 * g + 1));
                }
                for r in 0..M {
                    let xr = xq.add(r * k + sb * QSUB + g * 8);
                    acc[r] = _mm512_dpbusd_epi32(acc[r], lo, bx(xr));
                    acc2[r] = _mm512_dpbusd_epi32(acc2[r], hi, bx(xr.add(4)));
                }
            }
            for r in 0..M {
                let sx = _mm512_set1_ps(sxs[r * nsub + sb]);
                let dx = _mm512_set1_ps(dxs[r * nsub + sb]);
                let dot = _mm512_cvtepi32_ps(_mm512_add_epi32(acc[r], acc2[r]));
                if q4k {
                    let t = _mm512_fmsub_ps(ds, dot, _mm512_mul_ps(dm, sx));
                    y[r] = _mm512_fmadd_ps(t, dx, y[r]);
                } else {
                    // dot - 32 sum(q) is exact in f32 (integers below 2^24).
                    let c = _mm512_sub_ps(dot, _mm512_mul_ps(_mm512_set1_ps(32.0), sx));
                    y[r] = _mm512_fmadd_ps(ds, _mm512_mul_ps(c, dx), y[r]);
                }
            }
        }
    }
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
    let sup = job.w.format.is_super();
    for p in panels {
        let mut i0 = 0;
        while i0 < job.m {
            let m = (job.m - i0).min(MR);
            macro_rules! run {
                ($m:literal) => {
                    if sup {
                        tile_super::<$m>(job, p, i0)
                    } else {
                        tile::<$m>(job, p, i0)
                    }
                };
            }
            match m {
                1 => run!(1),
                2 => run!(2),
                3 => run!(3),
                4 => run!(4),
                5 => run!(5),
                6 => run!(6),
                7 => run!(7),
                _ => run!(8),
            }
            i0 += m;
        }
    }
}
