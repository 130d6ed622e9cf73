//! AVX2 pieces of the super-block path that every x86 tier shares (AVX-512 and AVX-VNNI CPUs have AVX2):
//! the activation quantizer per super-block, a panel's header unpacked into `Hdr`, and its codes unpacked
//! into whole bytes. Each matches its scalar reference bit for bit (`acts::quantize_super`,
//! `header_ref`, `codes_ref`); they run once per super-block and panel (codes: once per panel and
//! call), so the AVX-512 tier gains little from wider versions.
//!
//! Every function is `unsafe` for the same reasons: the CPU must have AVX2, FMA and F16C, and the
//! pointers must hold what the `superblock` driver gives them.

use std::arch::x86_64::*;

use super::{Hdr, CODES_BYTES};
use crate::quant::acts::SuperOut;
use crate::quant::avx2::{
    f16x16, hmax, hsum_i32, q4_codes, q4k_scale_bytes, q6k_codes, store_codes,
};
use crate::quant::kblock::{Layout, SUBS, SUPER};
use crate::quant::{block_scale, Format, QSUB};

/// x's rows of k quantized per super-block, as `acts::quantize_super`.
///
/// # Safety
/// See the module; `out` holds x's rows and no other thread writes them.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_super(x: &[f32], k: usize, out: SuperOut) {
    let sign = _mm256_set1_ps(-0.0);
    let (lo, hi) = (_mm256_set1_epi32(-127), _mm256_set1_epi32(127));
    for (r, row) in x.chunks_exact(k).enumerate() {
        let o = out.row(r, k);
        for b in 0..k.div_ceil(SUPER) {
            let subs = (k - b * SUPER).min(SUPER) / QSUB;
            let p = row.as_ptr().add(b * SUPER);
            let mut a = _mm256_setzero_ps();
            for i in 0..subs * 4 {
                a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * i))));
            }
            let (d, id) = block_scale(hmax(a));
            let idv = _mm256_set1_ps(id);
            for s in 0..SUBS {
                let mut sum = 0;
                if s < subs {
                    // Default MXCSR rounding is to nearest even, as the reference's round_ties_even.
                    let code = |i: usize| {
                        let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(s * QSUB + 8 * i)), idv);
                        _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(v), lo), hi)
                    };
                    let c = [code(0), code(1), code(2), code(3)];
                    store_codes(c, o.q.add(b * SUPER + s * QSUB));
                    sum = hsum_i32(_mm256_add_epi32(
                        _mm256_add_epi32(c[0], c[1]),
                        _mm256_add_epi32(c[2], c[3]),
                    ));
                }
                *o.bsums.add(b * SUBS + s) = sum as i16;
            }
            *o.d.add(b) = d;
        }
    }
}

/// A panel's packed super-block header (`t` sub-blocks at `blk`) into `h`, as `header_ref`.
///
/// # Safety
/// See the module.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn header(f: Format, blk: *const u8, t: usize, h: *mut Hdr) {
    let q4k = f == Format::Q4K;
    let (o, zero) = (&mut *h, _mm256_setzero_si256());
    let put = |at: *mut i32, v: [__m256i; 2]| {
        _mm256_store_si256(at.cast(), v[0]);
        _mm256_store_si256(at.add(8).cast(), v[1]);
    };
    let dv = f16x16(blk);
    let mv = if q4k {
        f16x16(blk.add(32))
    } else {
        [_mm256_setzero_ps(); 2]
    };
    for i in 0..2 {
        _mm256_store_ps(o.d.as_mut_ptr().add(8 * i), dv[i]);
        _mm256_store_ps(o.dmin.as_mut_ptr().add(8 * i), mv[i]);
    }
    // Per sub-block the 16 rows' weights of the B sums as bytes: Q4K's mins, Q6K's scales.
    let mut m = [_mm_setzero_si128(); SUBS];
    #[allow(clippy::needless_range_loop)] // s indexes the header's rows and m alike
    for s in 0..SUBS {
        if s >= t {
            put(o.sc[s].as_mut_ptr(), [zero; 2]);
            put(o.sc2[s].as_mut_ptr(), [zero; 2]);
            continue;
        }
        let sc32 = if q4k {
            let (sc, mc) = q4k_scale_bytes(blk, t, s);
            m[s] = mc;
            [
                _mm256_cvtepu8_epi32(sc),
                _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(sc)),
            ]
        } else {
            let sc = _mm_loadu_si128(blk.add(32 + 16 * s).cast());
            m[s] = sc;
            [
                _mm256_cvtepi8_epi32(sc),
                _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc)),
            ]
        };
        put(o.sc[s].as_mut_ptr(), sc32);
        let low = _mm256_set1_epi32(0xffff);
        let twice =
            |v: __m256i| _mm256_or_si256(_mm256_and_si256(v, low), _mm256_slli_epi32::<16>(v));
        put(o.sc2[s].as_mut_ptr(), [twice(sc32[0]), twice(sc32[1])]);
    }
    for j in 0..SUBS / 2 {
        // Bytes lo0 hi0 lo1 hi1 ...: widened to i16, each row's lane holds (m_2j, m_2j+1).
        let (a, b) = (m[2 * j], m[2 * j + 1]);
        let (lo, hi) = (_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b));
        let v = if q4k {
            [_mm256_cvtepu8_epi16(lo), _mm256_cvtepu8_epi16(hi)]
        } else {
            [_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi)]
        };
        put(o.pairs[j].as_mut_ptr(), v);
    }
}

/// A panel's packed codes (`t` sub-blocks at `blk`) as whole bytes into `out` (`CODES_BYTES`, 32-byte
/// aligned), as `codes_ref`.
///
/// # Safety
/// See the module.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn codes(f: Format, blk: *const u8, t: usize, out: *mut u8) {
    debug_assert!(t * 512 <= CODES_BYTES);
    for s in 0..t {
        let cp = blk.add(Layout::codes_at(f, t, s));
        for g in 0..4 {
            // [half panel][nibble]: nibble h of group g is 4-k group v = 2g + h.
            let c = if f == Format::Q6K {
                q6k_codes(cp, g)
            } else {
                q4_codes(cp.add(g * 64))
            };
            for (h, ch) in c.iter().enumerate() {
                for (nb, v) in ch.iter().enumerate() {
                    let at = out.add(s * 512 + (2 * g + nb) * 64 + 32 * h);
                    _mm256_store_si256(at.cast(), *v);
                }
            }
        }
    }
}
