//! AVX2 row tiles of the super-block path (also what AVX-512 CPUs without VNNI run): `vpmaddubsw` multiplies
//! the unsigned codes by a broadcast of 4 signed activation codes into i16 pair sums, and `vpmaddwd` by the
//! sub-block scale (twice per lane, `Hdr::sc2`) widens them to i32 already scaled. A panel is two 256-bit
//! halves (rows 0-7, 8-15).
//!
//! i16 bounds: a Q4K pair sum is within 2 * 15 * 127, so a whole sub-block's eight (3810 each, 30480 in
//! all) add up in i16 before one `vpmaddwd`; a Q6K pair sum is within 2 * 63 * 127 = 16002, so two (the
//! 8 k of one packed group) are the most an i16 holds: Q6K widens per group.
//!
//! Tiles: a decode step's rows (below `min_rows`) read the packed codes 2 rows at a time; from `min_rows`
//! the unpacked codes, Q4K 2 rows x 2 panels (one broadcast feeds four `vpmaddubsw`) and Q6K 3 rows x
//! 1 panel (its per-group widening needs the registers). Contract: `superblock.rs`'s, bit for bit.

use std::arch::x86_64::*;

use super::{x86, Hdr, Kernels, Tile};
use crate::quant::avx2::{bx, high_bits, q4k_scale_bytes};
use crate::quant::kblock::Layout;
use crate::quant::Format;

pub(crate) static KERNELS: Kernels = Kernels {
    quantize: x86::quantize_super,
    header: x86::header,
    codes: x86::codes,
    tile,
    min_rows: 6,
    panels: 2,
};

/// Codes of 4-k group `v` of sub-block `s` (of `t`) of the panel at `src`, as two half-panel vectors of
/// whole bytes: from the unpacked layout, or split from the packed nibbles (and Q6K's high bits).
#[inline(always)]
pub(crate) unsafe fn codes<const PACKED: bool, const Q6: bool>(
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
    let f = if Q6 { Format::Q6K } else { Format::Q4K };
    let cp = src.add(Layout::codes_at(f, t, s));
    [packed_half::<Q6>(cp, v, 0), packed_half::<Q6>(cp, v, 32)]
}

/// Half `o` (0: rows 0-7, 32: rows 8-15) of `codes` from a packed sub-block's codes at `cp`. A function,
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

/// Sub-block `s` of the packed super-block at `blk` (of `t`), per half panel: the rows' scale and B's
/// weight (Q4K's min, Q6K's scale again) as i32 lanes (the weight's high half meets a zero in
/// `vpmaddwd`).
#[inline(always)]
pub(crate) unsafe fn packed_scales<const Q6: bool>(
    blk: *const u8,
    t: usize,
    s: usize,
) -> ([__m256i; 2], [__m256i; 2]) {
    if Q6 {
        let sc = _mm_loadu_si128(blk.add(32 + 16 * s).cast());
        let w = [
            _mm256_cvtepi8_epi32(sc),
            _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc)),
        ];
        (w, w)
    } else {
        let (sc, mc) = q4k_scale_bytes(blk, t, s);
        let wide = |v: __m128i| {
            [
                _mm256_cvtepu8_epi32(v),
                _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v)),
            ]
        };
        (wide(sc), wide(mc))
    }
}

/// An i32 scale lane as the same i16 twice (`Hdr::sc2`'s form, for `vpmaddwd`).
#[inline(always)]
unsafe fn twice(v: __m256i) -> __m256i {
    let low = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    _mm256_or_si256(low, _mm256_slli_epi32::<16>(v))
}

/// Rows i0..i0 + M against P panels over one super-block, y updated in place. Packed: scales read from
/// the packed bytes per sub-block, B summed per sub-block; unpacked: from the headers, B from their
/// pairs at the end.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // isum[r][p][h], acc[...] are register tiles indexed by constant bounds
unsafe fn rows<const M: usize, const P: usize, const PACKED: bool, const Q6: bool>(t: &Tile<'_>) {
    let hdr = |p: usize| &*t.hdr.add(p);
    let src = |p: usize| t.src.add(p * t.stride);
    let mut isum = [[[_mm256_setzero_si256(); 2]; P]; M];
    let mut bm = [[[_mm256_setzero_si256(); 2]; P]; M];
    for s in 0..t.t {
        let mut mw = [[_mm256_setzero_si256(); 2]; P];
        let mut sc2 = [[_mm256_setzero_si256(); 2]; P];
        for p in 0..P {
            if PACKED {
                let (sc, m) = packed_scales::<Q6>(src(p), t.t, s);
                mw[p] = m;
                sc2[p] = [twice(sc[0]), twice(sc[1])];
            } else {
                let at = hdr(p).sc2[s].as_ptr();
                sc2[p] = [
                    _mm256_load_si256(at.cast()),
                    _mm256_load_si256(at.add(8).cast()),
                ];
            }
        }
        if Q6 {
            // Per packed group (4-k groups 2g, 2g + 1): two pair sums in i16, widened and scaled.
            for g in 0..4 {
                let mut w = [[[_mm256_setzero_si256(); 2]; 2]; P];
                for p in 0..P {
                    w[p][0] = codes::<PACKED, Q6>(src(p), t.t, s, 2 * g);
                    w[p][1] = codes::<PACKED, Q6>(src(p), t.t, s, 2 * g + 1);
                }
                for r in 0..M {
                    let xr = t.x(r).add(s * 32 + 8 * g);
                    let (xa, xb) = (bx(xr), bx(xr.add(4)));
                    for p in 0..P {
                        for h in 0..2 {
                            let pr = _mm256_add_epi16(
                                _mm256_maddubs_epi16(w[p][0][h], xa),
                                _mm256_maddubs_epi16(w[p][1][h], xb),
                            );
                            isum[r][p][h] =
                                _mm256_add_epi32(isum[r][p][h], _mm256_madd_epi16(pr, sc2[p][h]));
                        }
                    }
                }
            }
        } else {
            // The whole sub-block's pair sums in i16, then one scaled widening.
            let mut acc = [[[_mm256_setzero_si256(); 2]; P]; M];
            for v in 0..8 {
                let mut w = [[_mm256_setzero_si256(); 2]; P];
                for p in 0..P {
                    w[p] = codes::<PACKED, Q6>(src(p), t.t, s, v);
                }
                for r in 0..M {
                    let xb = bx(t.x(r).add(s * 32 + 4 * v));
                    for p in 0..P {
                        for h in 0..2 {
                            let pr = _mm256_maddubs_epi16(w[p][h], xb);
                            acc[r][p][h] = _mm256_add_epi16(acc[r][p][h], pr);
                        }
                    }
                }
            }
            for r in 0..M {
                for p in 0..P {
                    for h in 0..2 {
                        let prod = _mm256_madd_epi16(acc[r][p][h], sc2[p][h]);
                        isum[r][p][h] = _mm256_add_epi32(isum[r][p][h], prod);
                    }
                }
            }
        }
        if PACKED {
            for r in 0..M {
                let sum = _mm256_set1_epi32(*t.scale_sums(r).1.add(s) as u16 as i32);
                for p in 0..P {
                    for h in 0..2 {
                        let prod = _mm256_madd_epi16(mw[p][h], sum);
                        bm[r][p][h] = _mm256_add_epi32(bm[r][p][h], prod);
                    }
                }
            }
        }
    }
    let pairs = t.t.div_ceil(2);
    for r in 0..M {
        let (dx, bs) = t.scale_sums(r);
        let dxv = _mm256_set1_ps(dx);
        let bp = |j: usize| _mm256_set1_epi32(bs.add(2 * j).cast::<i32>().read_unaligned());
        for p in 0..P {
            for h in 0..2 {
                let (d, dmin) = if PACKED {
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(src(p).add(16 * h).cast()));
                    let dmin = if Q6 {
                        _mm256_setzero_ps()
                    } else {
                        _mm256_cvtph_ps(_mm_loadu_si128(src(p).add(32 + 16 * h).cast()))
                    };
                    (d, dmin)
                } else {
                    let hd: &Hdr = hdr(p);
                    for j in 0..pairs {
                        let wj = _mm256_load_si256(hd.pairs[j].as_ptr().add(8 * h).cast());
                        bm[r][p][h] = _mm256_add_epi32(bm[r][p][h], _mm256_madd_epi16(wj, bp(j)));
                    }
                    let d = _mm256_load_ps(hd.d.as_ptr().add(8 * h));
                    (d, _mm256_load_ps(hd.dmin.as_ptr().add(8 * h)))
                };
                let yp = t.y.add(r * t.ystride + 16 * p + 8 * h);
                let y = if Q6 {
                    let c = _mm256_sub_epi32(isum[r][p][h], _mm256_slli_epi32::<5>(bm[r][p][h]));
                    _mm256_fmadd_ps(
                        dxv,
                        _mm256_mul_ps(d, _mm256_cvtepi32_ps(c)),
                        _mm256_loadu_ps(yp),
                    )
                } else {
                    let m = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(bm[r][p][h]));
                    let v = _mm256_fmsub_ps(d, _mm256_cvtepi32_ps(isum[r][p][h]), m);
                    _mm256_fmadd_ps(dxv, v, _mm256_loadu_ps(yp))
                };
                _mm256_storeu_ps(yp, y);
            }
        }
    }
}

/// The tile for what is left: rows and panels as the module says.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `t` is what the `superblock` driver gives a tile.
unsafe fn tile(t: &Tile<'_>) -> usize {
    let (left, q6) = (t.left(), t.job.w.format == Format::Q6K);
    macro_rules! go {
        ($m:literal, $p:literal, $packed:literal) => {{
            if q6 {
                rows::<$m, $p, $packed, true>(t)
            } else {
                rows::<$m, $p, $packed, false>(t)
            }
            $m
        }};
    }
    match (t.packed, t.panels, q6, left) {
        (true, _, _, 1) => go!(1, 1, true),
        (true, _, _, _) => go!(2, 1, true),
        (false, 2, false, 1) => go!(1, 2, false),
        (false, 2, false, _) => go!(2, 2, false),
        (false, _, false, 1) => go!(1, 1, false),
        (false, _, false, 2) => go!(2, 1, false),
        (false, _, false, 3) => go!(3, 1, false),
        (false, _, false, _) => go!(4, 1, false),
        // Q6K: 3 rows x 1 panel (a 2-panel group runs as two 1-panel halves).
        (false, np, true, _) => {
            let m = left.min(3);
            for j in 0..np {
                let one = Tile {
                    hdr: t.hdr.add(j),
                    src: t.src.add(j * t.stride),
                    panels: 1,
                    y: t.y.add(16 * j),
                    ..*t
                };
                match m {
                    1 => rows::<1, 1, false, true>(&one),
                    2 => rows::<2, 1, false, true>(&one),
                    _ => rows::<3, 1, false, true>(&one),
                }
            }
            m
        }
    }
}
