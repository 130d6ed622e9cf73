//! AVX-512 VNNI row tiles of the super-block path: `vpdpbusd` multiplies 4 unsigned codes by a broadcast of
//! 4 signed activation codes into the i32 lane of each of a panel's 16 rows; a sub-block's 8 of them make
//! its exact dot product, then the contract's float epilogue (4 operations per row and panel).
//!
//! Tiles: a decode step's rows (below `min_rows`) read the packed codes, up to 8 rows at a time; from
//! `min_rows` rows the unpacked codes, 6 rows x 2 panels (12 sums in flight, each activation broadcast
//! feeding two `vpdpbusd` and each code vector six: 12 accumulators and 12 sums of the 32 registers).
//! Contract: `superblock.rs`'s, bit for bit.

use std::arch::x86_64::*;

use super::{x86, Kernels, Tile};
use crate::quant::avx2_unpack::q4k_scale_bytes;
use crate::quant::avx512::bx;
use crate::quant::kblock::Layout;
use crate::quant::Format;

pub(crate) static KERNELS: Kernels = Kernels {
    header: x86::header,
    codes: x86::codes,
    tile,
    min_rows: 24,
    panels: 2,
};

/// Rows per tile reading packed codes, and per tile of unpacked codes.
const MR_PACKED: usize = 8;
const MR: usize = 6;

/// `acc + a . broadcast(*x)` (`vpdpbusd` with the 4 activation bytes at `x` as an embedded `{1to16}`
/// broadcast): written as assembly because LLVM otherwise hoists a packed tile's broadcasts out of the
/// sub-block loop and, past its registers, spills them to the stack and reloads them (a 5- to 7-row q4k
/// tile ran at half the 8-row tile's rate, `quant_hot`). Same instruction, same exact i32 sums.
///
/// Safety: used only inside this file's `avx512vnni` functions; `x` points at 4 readable bytes.
macro_rules! dpbusd_bcast {
    ($acc:expr, $a:expr, $x:expr) => {{
        let mut acc: __m512i = $acc;
        std::arch::asm!(
            "vpdpbusd {acc}, {a}, dword ptr [{x}]{{1to16}}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) $a,
            x = in(reg) $x,
            options(pure, readonly, nostack, preserves_flags),
        );
        acc
    }};
}

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

/// The formats a tile is stamped for (its `KIND`).
const Q4K: u8 = 0;
const Q6K: u8 = 1;
const Q6K16: u8 = 2;

const fn format_of(kind: u8) -> Format {
    match kind {
        Q4K => Format::Q4K,
        Q6K => Format::Q6K,
        _ => Format::Q6K16,
    }
}

/// Codes of 4-k group `v` of sub-block `s` (of `t`) of the panel at `src`, 16 rows x 4 whole bytes.
#[inline(always)]
unsafe fn codes<const PACKED: bool, const KIND: u8>(
    src: *const u8,
    t: usize,
    s: usize,
    v: usize,
) -> __m512i {
    if !PACKED {
        return _mm512_load_si512(src.add(s * 512 + v * 64).cast());
    }
    let cp = src.add(Layout::codes_at(format_of(KIND), t, s));
    let nib = _mm512_set1_epi8(0x0f);
    let g = _mm512_loadu_si512(cp.add((v / 2) * 64).cast());
    let c = if v.is_multiple_of(2) {
        _mm512_and_si512(g, nib)
    } else {
        _mm512_and_si512(_mm512_srli_epi16::<4>(g), nib)
    };
    if KIND != Q4K {
        let hb = _mm512_loadu_si512(cp.add(256 + (v / 4) * 64).cast());
        _mm512_or_si512(c, high_bits(hb, v))
    } else {
        c
    }
}

/// Sub-block `s` of the packed super-block at `blk` (of `t`): the 16 rows' `d * sc` and `dmin * mc`
/// (Q6K: 0; Q6K16: its halves' `d * sc`), given their d and dmin; exact products, as `kblock::sub_scales`.
#[inline(always)]
unsafe fn packed_scales<const KIND: u8>(
    blk: *const u8,
    t: usize,
    s: usize,
    d: __m512,
    dmin: __m512,
) -> (__m512, __m512) {
    let f32s = |v: __m512i| _mm512_cvtepi32_ps(v);
    let i8s = |at: usize| {
        _mm512_mul_ps(
            d,
            f32s(_mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(at).cast()))),
        )
    };
    if KIND == Q6K16 {
        (i8s(32 + 32 * s), i8s(48 + 32 * s))
    } else if KIND == Q6K {
        (i8s(32 + 16 * s), _mm512_setzero_ps())
    } else {
        let (sc, mc) = q4k_scale_bytes(blk, t, s);
        (
            _mm512_mul_ps(d, f32s(_mm512_cvtepu8_epi32(sc))),
            _mm512_mul_ps(dmin, f32s(_mm512_cvtepu8_epi32(mc))),
        )
    }
}

/// Rows i0..i0 + M against P panels over the tile's super-blocks, y carried in registers throughout.
/// Packed: the scales from the packed bytes per sub-block; unpacked: from the headers.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
#[allow(clippy::needless_range_loop)] // y[r][p], acc[r][p] are register tiles indexed by constant bounds
unsafe fn rows<const M: usize, const P: usize, const PACKED: bool, const KIND: u8>(t: &Tile<'_>) {
    let mut y = [[_mm512_setzero_ps(); P]; M];
    for r in 0..M {
        for p in 0..P {
            y[r][p] = _mm512_loadu_ps(t.y.add(r * t.ystride + 16 * p));
        }
    }
    for b in t.blocks.clone() {
        let (tt, base) = (t.lay.subs(b), t.block(b));
        let src = |p: usize| base.add(p * t.stride);
        let mut xs = [std::ptr::null::<i8>(); M];
        for (r, x) in xs.iter_mut().enumerate() {
            *x = t.x(r, b);
        }
        // Packed: each panel's d and dmin, widened once per super-block; the next one fetched.
        let mut dv = [_mm512_setzero_ps(); P];
        let mut mv = [_mm512_setzero_ps(); P];
        if PACKED {
            for p in 0..P {
                dv[p] = _mm512_cvtph_ps(_mm256_loadu_si256(src(p).cast()));
                if KIND == Q4K {
                    mv[p] = _mm512_cvtph_ps(_mm256_loadu_si256(src(p).add(32).cast()));
                }
            }
        }
        for s in 0..tt {
            if PACKED {
                t.prefetch_next(b, s, tt);
            }
            // Packed: two chains per row and panel (even and odd groups of 4 k, the two nibbles of a packed
            // group): the broadcasts stay memory operands of `vpdpbusd` (with one chain LLVM hoisted an
            // 8-row tile's 64 broadcasts into registers and spilled them; m = 16 ran at half the rate).
            // Unpacked: one chain (12 accumulators and y fit the registers; the second chain's 12 additions
            // per sub-block cost 5-7 % of the in-cache rate, measured). Q6K16: the first 16 k's products in
            // one chain, the last 16's in the other (its halves' sums).
            let mut acc = [[_mm512_setzero_si512(); P]; M];
            let mut acc2 = [[_mm512_setzero_si512(); P]; M];
            for g in 0..4 {
                let mut lo = [_mm512_setzero_si512(); P];
                let mut hi = [_mm512_setzero_si512(); P];
                for p in 0..P {
                    lo[p] = codes::<PACKED, KIND>(src(p), tt, s, 2 * g);
                    hi[p] = codes::<PACKED, KIND>(src(p), tt, s, 2 * g + 1);
                }
                for r in 0..M {
                    let xr = xs[r].add(s * 32 + 8 * g);
                    // Which chain each nibble's products go to (compile-time constants per stamp).
                    let lo_second = KIND == Q6K16 && g >= 2;
                    let hi_second = if KIND == Q6K16 { g >= 2 } else { PACKED };
                    for p in 0..P {
                        // One panel: each broadcast feeds one `vpdpbusd`, as its memory operand.
                        let dot = |acc: __m512i, a: __m512i, x: *const i8| {
                            if P == 1 {
                                // SAFETY: this function has avx512vnni; x is in the tile's activation row.
                                dpbusd_bcast!(acc, a, x)
                            } else {
                                _mm512_dpbusd_epi32(acc, a, bx(x))
                            }
                        };
                        if lo_second {
                            acc2[r][p] = dot(acc2[r][p], lo[p], xr);
                        } else {
                            acc[r][p] = dot(acc[r][p], lo[p], xr);
                        }
                        if hi_second {
                            acc2[r][p] = dot(acc2[r][p], hi[p], xr.add(4));
                        } else {
                            acc[r][p] = dot(acc[r][p], hi[p], xr.add(4));
                        }
                    }
                }
            }
            // Q6K16: each row's first-half activation sum, shared by the panels.
            let mut sa = [0.0f32; M];
            if KIND == Q6K16 {
                for (r, v) in sa.iter_mut().enumerate() {
                    *v = t.half_sum(r, b, s);
                }
            }
            for p in 0..P {
                let (ds, dm) = if PACKED {
                    packed_scales::<KIND>(src(p), tt, s, dv[p], mv[p])
                } else {
                    let h = &*t.hdr.add(p);
                    (
                        _mm512_load_ps(h.ds[s].as_ptr()),
                        _mm512_load_ps(h.dm[s].as_ptr()),
                    )
                };
                for r in 0..M {
                    let (dx, sx) = t.scale_sum(r, b, s);
                    if KIND == Q6K16 {
                        let half = |acc: __m512i, ds: __m512, sum: f32, y: __m512| {
                            let c =
                                _mm512_sub_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(32.0 * sum));
                            _mm512_fmadd_ps(ds, _mm512_mul_ps(c, _mm512_set1_ps(dx)), y)
                        };
                        let ya = half(acc[r][p], ds, sa[r], y[r][p]);
                        y[r][p] = half(acc2[r][p], dm, sx - sa[r], ya);
                        continue;
                    }
                    let dot = _mm512_cvtepi32_ps(_mm512_add_epi32(acc[r][p], acc2[r][p]));
                    y[r][p] = if KIND == Q6K {
                        let c = _mm512_sub_ps(dot, _mm512_set1_ps(32.0 * sx));
                        _mm512_fmadd_ps(ds, _mm512_mul_ps(c, _mm512_set1_ps(dx)), y[r][p])
                    } else {
                        let v = _mm512_fmsub_ps(ds, dot, _mm512_mul_ps(dm, _mm512_set1_ps(sx)));
                        _mm512_fmadd_ps(v, _mm512_set1_ps(dx), y[r][p])
                    };
                }
            }
        }
    }
    for r in 0..M {
        for p in 0..P {
            _mm512_storeu_ps(t.y.add(r * t.ystride + 16 * p), y[r][p]);
        }
    }
}

/// The tile for what is left: rows and panels as the module says.
///
/// # Safety
/// The CPU has the tier (`quant::avx512::usable`); `t` is what the `superblock` driver gives a tile.
pub(super) unsafe fn tile(t: &Tile<'_>) -> usize {
    let left = t.left();
    macro_rules! go {
        ($m:literal, $p:literal, $packed:literal) => {{
            match t.job.w.format {
                Format::Q6K => rows::<$m, $p, $packed, Q6K>(t),
                Format::Q6K16 => rows::<$m, $p, $packed, Q6K16>(t),
                _ => rows::<$m, $p, $packed, Q4K>(t),
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
        (_, _) => go!(6, 1, false),
    }
}
