//! AVX-512 VNNI row tiles of the super-block path: `vpdpbusd` multiplies 4 unsigned codes by a broadcast of
//! 4 signed activation codes into the i32 lane of each of a panel's 16 rows; a sub-block's 8 of them make
//! its exact dot product, which `vpmulld` scales by the row's sub-block scale into the super-block's i32
//! sum (A); the B sums take 4 `vpdpwssd` per super-block. The float epilogue runs once per super-block.
//!
//! Tiles: a decode step's rows (below `min_rows`) read the packed codes, up to 8 rows at a time; from
//! `min_rows` rows the unpacked codes, 6 rows x 2 panels (12 sums in flight, each activation broadcast
//! feeding two `vpdpbusd` and each code vector six: 24 accumulators of the 32 registers).
//! Contract: `superblock.rs`'s, bit for bit.

use std::arch::x86_64::*;

use super::{x86, Hdr, Kernels, Tile};
use crate::quant::avx2::q4k_scale_bytes;
use crate::quant::kblock::Layout;
use crate::quant::Format;

pub(crate) static KERNELS: Kernels = Kernels {
    quantize: x86::quantize_super,
    header: x86::header,
    codes: x86::codes,
    tile,
    min_rows: 6,
    panels: 1,
};

/// Rows per tile reading packed codes, and per tile of the 2-panel unpacked groups.
const MR_PACKED: usize = 8;
const MR: usize = 8;

/// Q6K's high bits of code vector `v` moved to bits 4-5 of each byte: vector v's bits are `2 (v % 4)` of
/// its byte; 16-bit shifts move the neighbouring byte's bits only into positions the 0x30 mask drops.
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

/// Codes of 4-k group `v` of sub-block `s` (of `t`) of the panel at `src`, 16 rows x 4 whole bytes.
#[inline(always)]
unsafe fn codes<const PACKED: bool, const Q6: bool>(
    src: *const u8,
    t: usize,
    s: usize,
    v: usize,
) -> __m512i {
    if !PACKED {
        return _mm512_load_si512(src.add(s * 512 + v * 64).cast());
    }
    let f = if Q6 { Format::Q6K } else { Format::Q4K };
    let cp = src.add(Layout::codes_at(f, t, s));
    let nib = _mm512_set1_epi8(0x0f);
    let g = _mm512_loadu_si512(cp.add((v / 2) * 64).cast());
    let c = if v.is_multiple_of(2) {
        _mm512_and_si512(g, nib)
    } else {
        _mm512_and_si512(_mm512_srli_epi16::<4>(g), nib)
    };
    if Q6 {
        let hb = _mm512_loadu_si512(cp.add(256 + (v / 4) * 64).cast());
        _mm512_or_si512(c, high_bits(hb, v))
    } else {
        c
    }
}

/// Four activation codes starting at `p`, broadcast to every lane.
#[inline(always)]
unsafe fn bx(p: *const i8) -> __m512i {
    _mm512_set1_epi32(p.cast::<i32>().read_unaligned())
}

/// Sub-block `s` of the packed super-block at `blk` (of `t`): the 16 rows' scale, and B's weight (Q4K's
/// min, Q6K's scale again), as i32 lanes.
#[inline(always)]
unsafe fn packed_scales<const Q6: bool>(blk: *const u8, t: usize, s: usize) -> (__m512i, __m512i) {
    if Q6 {
        let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(32 + 16 * s).cast()));
        (sc, sc)
    } else {
        let (sc, mc) = q4k_scale_bytes(blk, t, s);
        (_mm512_cvtepu8_epi32(sc), _mm512_cvtepu8_epi32(mc))
    }
}

/// Rows i0..i0 + M against P panels over one super-block, y updated in place. Packed: scales read from
/// the packed bytes per sub-block, B summed per sub-block (`vpdpwssd` of the i32 weight, whose high half
/// meets a zero, by the sum); unpacked: from the headers, B from their pairs at the end.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
#[allow(clippy::needless_range_loop)] // isum[r][p], acc[r][p] are register tiles indexed by constant bounds
unsafe fn rows<const M: usize, const P: usize, const PACKED: bool, const Q6: bool>(t: &Tile<'_>) {
    let hdr = |p: usize| &*t.hdr.add(p);
    let src = |p: usize| t.src.add(p * t.stride);
    let mut isum = [[_mm512_setzero_si512(); P]; M];
    let mut bm = [[_mm512_setzero_si512(); P]; M];
    for s in 0..t.t {
        let mut acc = [[_mm512_setzero_si512(); P]; M];
        for v in 0..8 {
            let mut w = [_mm512_setzero_si512(); P];
            for p in 0..P {
                w[p] = codes::<PACKED, Q6>(src(p), t.t, s, v);
            }
            for r in 0..M {
                let xb = bx(t.x(r).add(s * 32 + 4 * v));
                for p in 0..P {
                    acc[r][p] = _mm512_dpbusd_epi32(acc[r][p], w[p], xb);
                }
            }
        }
        for p in 0..P {
            let (sc, mw) = if PACKED {
                packed_scales::<Q6>(src(p), t.t, s)
            } else {
                let sc = _mm512_load_si512(hdr(p).sc[s].as_ptr().cast());
                (sc, sc)
            };
            for r in 0..M {
                isum[r][p] = _mm512_add_epi32(isum[r][p], _mm512_mullo_epi32(acc[r][p], sc));
                if PACKED {
                    let sum = *t.scale_sums(r).1.add(s) as u16 as i32;
                    bm[r][p] = _mm512_dpwssd_epi32(bm[r][p], mw, _mm512_set1_epi32(sum));
                }
            }
        }
    }
    let pairs = t.t.div_ceil(2);
    for r in 0..M {
        let (dx, bs) = t.scale_sums(r);
        let dxv = _mm512_set1_ps(dx);
        for p in 0..P {
            let (d, dmin) = if PACKED {
                let h = |o: usize| _mm512_cvtph_ps(_mm256_loadu_si256(src(p).add(o).cast()));
                (h(0), if Q6 { _mm512_setzero_ps() } else { h(32) })
            } else {
                let hd: &Hdr = hdr(p);
                for j in 0..pairs {
                    let bj = _mm512_set1_epi32(bs.add(2 * j).cast::<i32>().read_unaligned());
                    let wj = _mm512_load_si512(hd.pairs[j].as_ptr().cast());
                    bm[r][p] = _mm512_dpwssd_epi32(bm[r][p], wj, bj);
                }
                (
                    _mm512_load_ps(hd.d.as_ptr()),
                    _mm512_load_ps(hd.dmin.as_ptr()),
                )
            };
            let yp = t.y.add(r * t.ystride + 16 * p);
            let y = if Q6 {
                let c = _mm512_sub_epi32(isum[r][p], _mm512_slli_epi32::<5>(bm[r][p]));
                _mm512_fmadd_ps(
                    dxv,
                    _mm512_mul_ps(d, _mm512_cvtepi32_ps(c)),
                    _mm512_loadu_ps(yp),
                )
            } else {
                let m = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(bm[r][p]));
                let v = _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(isum[r][p]), m);
                _mm512_fmadd_ps(dxv, v, _mm512_loadu_ps(yp))
            };
            _mm512_storeu_ps(yp, y);
        }
    }
}

/// The tile for what is left: rows and panels as the module says.
///
/// # Safety
/// The CPU has the tier (`quant::avx512::usable`); `t` is what the `superblock` driver gives a tile.
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
    if t.packed {
        return match left.min(MR_PACKED) {
            1 => go!(1, 1, true),
            2 => go!(2, 1, true),
            3 => go!(3, 1, true),
            4 => go!(4, 1, true),
            5 => go!(5, 1, true),
            6 => go!(6, 1, true),
            7 => go!(7, 1, true),
            _ => go!(8, 1, true),
        };
    }
    match (t.panels, left.min(MR)) {
        (2, 1) => go!(1, 2, false),
        (2, 2) => go!(2, 2, false),
        (2, 3) => go!(3, 2, false),
        (2, 4) => go!(4, 2, false),
        (2, 5) => go!(5, 2, false),
        (2, _) => go!(6, 2, false),
        (_, 1) => go!(1, 1, false),
        (_, 2) => go!(2, 1, false),
        (_, 3) => go!(3, 1, false),
        (_, 4) => go!(4, 1, false),
        (_, 5) => go!(5, 1, false),
        (_, 6) => go!(6, 1, false),
        (_, 7) => go!(7, 1, false),
        (_, _) => go!(8, 1, false),
    }
}
