//! AVX2 pieces of the super-block path that the x86 tiers share (AVX-512 and AVX-VNNI CPUs have AVX2):
//! a panel's header unpacked into `Hdr` (and the same scales from packed bytes for the decode tiles), its
//! codes unpacked into whole bytes, and a group of codes read either way as two half-panel vectors. Each matches its scalar reference bit for bit (`header_ref`,
//! `codes_ref`); they run once per super-block and panel (and row block), so the AVX-512 tier gains
//! little from wider versions.
//!
//! Every function is `unsafe` for the same reasons: the CPU must have AVX2, FMA and F16C, and the
//! pointers must hold what the `superblock` driver gives them.

use std::arch::x86_64::*;

use super::{Hdr, CODES_BYTES};
use crate::quant::avx2_unpack::{
    f16x16, high_bits, q4_codes, q4k_scale_bytes, q5_codes, q6k_codes,
};
use crate::quant::kblock::{Layout, SUBS};
use crate::quant::Format;

/// A panel's packed super-block header (`t` sub-blocks at `blk`) into `h`, as `header_ref`.
///
/// # Safety
/// See the module.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn header(f: Format, blk: *const u8, t: usize, h: *mut Hdr) {
    let o = &mut *h;
    if f.is_nibbles() {
        // Block s's d and the min it subtracts (Q4: -m; Q40, Q50: z d), as `kblock::sub_scales`.
        let bb = f.block_bytes();
        for s in 0..SUBS {
            let zero = [_mm256_setzero_ps(); 2];
            let (ds, dm) = if s >= t {
                (zero, zero)
            } else if let Some(z) = f.zero_point() {
                let d = f16x16(blk.add(s * bb));
                (d, d.map(|v| _mm256_mul_ps(_mm256_set1_ps(z as f32), v)))
            } else {
                let m = f16x16(blk.add(s * bb + 32));
                let neg = _mm256_set1_ps(-0.0);
                (f16x16(blk.add(s * bb)), m.map(|v| _mm256_xor_ps(v, neg)))
            };
            for i in 0..2 {
                _mm256_store_ps(o.ds[s].as_mut_ptr().add(8 * i), ds[i]);
                _mm256_store_ps(o.dm[s].as_mut_ptr().add(8 * i), dm[i]);
            }
        }
        return;
    }
    let dv = f16x16(blk);
    let mv = if f == Format::Q4K {
        f16x16(blk.add(32))
    } else {
        [_mm256_setzero_ps(); 2]
    };
    for s in 0..SUBS {
        let (ds, dm) = if s < t {
            packed_scales(f, blk, t, s, dv, mv)
        } else {
            ([_mm256_setzero_ps(); 2], [_mm256_setzero_ps(); 2])
        };
        for i in 0..2 {
            _mm256_store_ps(o.ds[s].as_mut_ptr().add(8 * i), ds[i]);
            _mm256_store_ps(o.dm[s].as_mut_ptr().add(8 * i), dm[i]);
        }
    }
}

/// Sub-block `s` (of `t`) of the packed super-block at `blk`, per half panel: `d * sc` and `dmin * mc`
/// (Q6K: 0; Q6K16: its two halves' `d * sc`) as f32, given the rows' d (`dv`) and dmin (`mv`). Exact
/// products, as `kblock::sub_scales`.
#[inline(always)]
pub(crate) unsafe fn packed_scales(
    f: Format,
    blk: *const u8,
    t: usize,
    s: usize,
    dv: [__m256; 2],
    mv: [__m256; 2],
) -> ([__m256; 2], [__m256; 2]) {
    let lo_hi = |v: __m128i| [v, _mm_srli_si128::<8>(v)];
    if f == Format::Q4K {
        let (sc, mc) = q4k_scale_bytes(blk, t, s);
        let (sc, mc) = (lo_hi(sc), lo_hi(mc));
        let ds0 = _mm256_mul_ps(dv[0], _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc[0])));
        let ds1 = _mm256_mul_ps(dv[1], _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc[1])));
        let dm0 = _mm256_mul_ps(mv[0], _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mc[0])));
        let dm1 = _mm256_mul_ps(mv[1], _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mc[1])));
        ([ds0, ds1], [dm0, dm1])
    } else {
        // Q6K: one i8 scale per sub-block; Q6K16: the first half's, then the second half's (as dm).
        let scaled = |at: usize| {
            let sc = lo_hi(_mm_loadu_si128(blk.add(at).cast()));
            [0, 1].map(|i| _mm256_mul_ps(dv[i], _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc[i]))))
        };
        if f == Format::Q6K16 {
            (scaled(32 + 32 * s), scaled(48 + 32 * s))
        } else {
            (scaled(32 + 16 * s), [_mm256_setzero_ps(); 2])
        }
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
        let plane = (f == Format::Q50).then(|| blk.add(s * f.block_bytes() + f.high_bits_at()));
        for g in 0..4 {
            // [half panel][nibble]: nibble h of group g is 4-k group v = 2g + h.
            let c = if f.is_q6() {
                q6k_codes(cp, g)
            } else if f.is_nibbles() {
                q5_codes(cp, plane, g)
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

/// Codes of 4-k group `v` of sub-block `s` (of `t`) of the panel at `src`, as two half-panel vectors of
/// whole bytes: from the unpacked layout, or split from the packed nibbles (and Q6K's high bits).
#[inline(always)]
pub(crate) unsafe fn group_codes<const PACKED: bool, const Q6: bool>(
    f: Format,
    src: *const u8,
    t: usize,
    s: usize,
    v: usize,
) -> [__m256i; 2] {
    if !PACKED {
        let at = src.add(s * 512 + v * 64);
        return [
            _mm256_load_si256(at.cast()),
            _mm256_load_si256(at.add(32).cast()),
        ];
    }
    let cp = src.add(Layout::codes_at(f, t, s));
    [packed_half::<Q6>(cp, v, 0), packed_half::<Q6>(cp, v, 32)]
}

/// Half `o` (0: rows 0-7, 32: rows 8-15) of `group_codes` from a packed sub-block's codes at `cp`. A function,
/// not a closure: a closure carries the caller's target features and was left outlined (one call per
/// vector).
#[inline(always)]
unsafe fn packed_half<const Q6: bool>(cp: *const u8, v: usize, o: usize) -> __m256i {
    let nib = _mm256_set1_epi8(0x0f);
    let g = _mm256_loadu_si256(cp.add((v / 2) * 64 + o).cast());
    let c = if v.is_multiple_of(2) {
        _mm256_and_si256(g, nib)
    } else {
        _mm256_and_si256(_mm256_srli_epi16::<4>(g), nib)
    };
    if Q6 {
        let hb = _mm256_loadu_si256(cp.add(256 + (v / 4) * 64 + o).cast());
        _mm256_or_si256(c, high_bits(hb, v))
    } else {
        c
    }
}
