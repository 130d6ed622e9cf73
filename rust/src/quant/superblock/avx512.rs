//! AVX-512 VNNI row tiles of the super-block path: `vpdpbusd` multiplies 4 unsigned codes by a broadcast of
//! 4 signed activation codes into the i32 lane of each of a panel's 16 rows; a sub-block's 8 of them make
//! its exact dot product, then the contract's float epilogue (4 operations per row and panel).
//!
//! Tiles: a decode step's rows (below `min_rows`) read the packed codes, up to 8 rows at a time, their
//! activations from the tiled layout (`QActs::tile_rows`: every row's 4 codes a broadcast at a constant
//! offset from one pointer; with a pointer per row the 8-row tile ran more address arithmetic and
//! reloads of spilled row pointers than `vpdpbusd`); from `min_rows` rows the unpacked codes, 6 rows x 2
//! panels (12 sums in flight, each activation broadcast feeding two `vpdpbusd` and each code vector six:
//! 12 accumulators and 12 sums of the 32 registers).
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
    tiled: true,
};

/// Rows per tile reading packed codes, and per tile of unpacked codes.
const MR_PACKED: usize = crate::quant::acts::TILE_ROWS;
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

/// One row and panel's sub-block added into y by the contract's float epilogue (`superblock.rs`), for both
/// kinds of tile: the two chains' i32 sums, the weights' `ds` / `dm`, and the row's scale dx, code sum sx
/// and (Q6K16 only) first-half code sum sa.
#[inline(always)]
unsafe fn epilogue<const KIND: u8>(
    y: __m512,
    (acc, acc2): (__m512i, __m512i),
    (ds, dm): (__m512, __m512),
    (dx, sx, sa): (f32, f32, f32),
) -> __m512 {
    if KIND == Q6K16 {
        let half = |acc: __m512i, ds: __m512, sum: f32, y: __m512| {
            let c = _mm512_sub_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(32.0 * sum));
            _mm512_fmadd_ps(ds, _mm512_mul_ps(c, _mm512_set1_ps(dx)), y)
        };
        return half(acc2, dm, sx - sa, half(acc, ds, sa, y));
    }
    let dot = _mm512_cvtepi32_ps(_mm512_add_epi32(acc, acc2));
    if KIND == Q6K {
        let c = _mm512_sub_ps(dot, _mm512_set1_ps(32.0 * sx));
        _mm512_fmadd_ps(ds, _mm512_mul_ps(c, _mm512_set1_ps(dx)), y)
    } else {
        let v = _mm512_fmsub_ps(ds, dot, _mm512_mul_ps(dm, _mm512_set1_ps(sx)));
        _mm512_fmadd_ps(v, _mm512_set1_ps(dx), y)
    }
}

/// `acc + a . broadcast(x[OFF..OFF + 4])` (`vpdpbusd` with an embedded `{1to16}` broadcast at a constant
/// displacement): the packed tiles' rows are at fixed offsets from one pointer in the tiled layout, so
/// each product is one instruction with no address arithmetic. Assembly, as `dpbusd_bcast`.
///
/// Safety: the CPU has AVX-512 VNNI; `x + OFF` points at 4 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dp_at<const OFF: usize>(acc: __m512i, a: __m512i, x: *const i8) -> __m512i {
    let mut acc = acc;
    std::arch::asm!(
        "vpdpbusd {acc}, {a}, dword ptr [{x} + {off}]{{1to16}}",
        acc = inout(zmm_reg) acc,
        a = in(zmm_reg) a,
        x = in(reg) x,
        off = const OFF,
        options(pure, readonly, nostack, preserves_flags),
    );
    acc
}

/// Rows i0..i0 + M (a whole group of the tiled layout, `QActs::tile_rows`) against one panel's packed
/// super-blocks, y in registers throughout: a decode step's tile. Per sub-block and 4-k group, the code
/// vector is unpacked once and feeds M `vpdpbusd`, each row's 4 activation codes a broadcast at a constant
/// offset from the sub-block's pointer (`dp_at`); two chains per row (the two nibbles of a packed
/// group; Q6K16: the sub-block's halves).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
#[allow(clippy::needless_range_loop)] // y[r], acc[r] are register tiles indexed by constant bounds
unsafe fn packed<const M: usize, const KIND: u8>(t: &Tile<'_>) {
    let mut y = [_mm512_setzero_ps(); M];
    for r in 0..M {
        y[r] = _mm512_loadu_ps(t.y.add(r * t.ystride));
    }
    for b in t.blocks.clone() {
        let (tt, src) = (t.lay.subs(b), t.block(b));
        let (xq, xd, xs) = t.tiled::<M>(b);
        // The panel's d and dmin, widened once per super-block.
        let dv = _mm512_cvtph_ps(_mm256_loadu_si256(src.cast()));
        let mv = if KIND == Q4K {
            _mm512_cvtph_ps(_mm256_loadu_si256(src.add(32).cast()))
        } else {
            _mm512_setzero_ps()
        };
        for s in 0..tt {
            t.prefetch_next(b, s, tt);
            let x = xq.add(s * M * 32);
            let mut acc = [_mm512_setzero_si512(); M];
            let mut acc2 = [_mm512_setzero_si512(); M];
            // Row r's codes of group v at 32 r + 4 v (literal rows and groups: constant displacements).
            macro_rules! dot {
                ($acc:ident, $a:expr, $v:literal) => {
                    dot!(@ $acc, $a, $v; 0 1 2 3 4 5 6 7)
                };
                (@ $acc:ident, $a:expr, $v:literal; $($r:literal)*) => {
                    $(
                        if $r < M {
                            $acc[$r] = dp_at::<{ 32 * $r + 4 * $v }>($acc[$r], $a, x);
                        }
                    )*
                };
            }
            // Group g's two code vectors (v = 2g, 2g + 1): which chain each goes to is a constant.
            macro_rules! group {
                ($g:literal, $lo:literal, $hi:literal) => {{
                    let lo = codes::<true, KIND>(src, tt, s, $lo);
                    let hi = codes::<true, KIND>(src, tt, s, $hi);
                    if KIND == Q6K16 && $g >= 2 {
                        dot!(acc2, lo, $lo);
                        dot!(acc2, hi, $hi);
                    } else if KIND == Q6K16 {
                        dot!(acc, lo, $lo);
                        dot!(acc, hi, $hi);
                    } else {
                        dot!(acc, lo, $lo);
                        dot!(acc2, hi, $hi);
                    }
                }};
            }
            group!(0, 0, 1);
            group!(1, 2, 3);
            group!(2, 4, 5);
            group!(3, 6, 7);
            let (ds, dm) = packed_scales::<KIND>(src, tt, s, dv, mv);
            for r in 0..M {
                let (dx, sx) = (*xd.add(s * M + r), *xs.add(s * M + r));
                let sa = if KIND == Q6K16 {
                    t.half_sum(r, b, s)
                } else {
                    0.0
                };
                y[r] = epilogue::<KIND>(y[r], (acc[r], acc2[r]), (ds, dm), (dx, sx, sa));
            }
        }
    }
    for r in 0..M {
        _mm512_storeu_ps(t.y.add(r * t.ystride), y[r]);
    }
}

/// Rows i0..i0 + M against P panels' unpacked codes of the tile's super-block (the scales from the
/// headers), y carried in registers across its sub-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
#[allow(clippy::needless_range_loop)] // y[r][p], acc[r][p] are register tiles indexed by constant bounds
unsafe fn rows<const M: usize, const P: usize, const KIND: u8>(t: &Tile<'_>) {
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
        for s in 0..tt {
            // One chain (12 accumulators and y fit the registers; a second chain's 12 additions per
            // sub-block cost 5-7 % of the in-cache rate, measured). Q6K16: the first 16 k's products in
            // one chain, the last 16's in the other (its halves' sums).
            let mut acc = [[_mm512_setzero_si512(); P]; M];
            let mut acc2 = [[_mm512_setzero_si512(); P]; M];
            for g in 0..4 {
                let mut lo = [_mm512_setzero_si512(); P];
                let mut hi = [_mm512_setzero_si512(); P];
                for p in 0..P {
                    lo[p] = codes::<false, KIND>(src(p), tt, s, 2 * g);
                    hi[p] = codes::<false, KIND>(src(p), tt, s, 2 * g + 1);
                }
                for r in 0..M {
                    let xr = xs[r].add(s * 32 + 8 * g);
                    // Which chain the products go to (a compile-time constant per stamp).
                    let second = KIND == Q6K16 && g >= 2;
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
                        if second {
                            acc2[r][p] = dot(acc2[r][p], lo[p], xr);
                        } else {
                            acc[r][p] = dot(acc[r][p], lo[p], xr);
                        }
                        if second {
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
                let h = &*t.hdr.add(p);
                let ds = _mm512_load_ps(h.ds[s].as_ptr());
                let dm = _mm512_load_ps(h.dm[s].as_ptr());
                for r in 0..M {
                    let (dx, sx) = t.scale_sum(r, b, s);
                    let sums = (acc[r][p], acc2[r][p]);
                    y[r][p] = epilogue::<KIND>(y[r][p], sums, (ds, dm), (dx, sx, sa[r]));
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
        ($m:literal, $p:literal) => {{
            match t.job.w.format {
                Format::Q6K => rows::<$m, $p, Q6K>(t),
                Format::Q6K16 => rows::<$m, $p, Q6K16>(t),
                _ => rows::<$m, $p, Q4K>(t),
            }
            $m
        }};
    }
    if t.packed {
        macro_rules! packed {
            ($m:literal) => {{
                match t.job.w.format {
                    Format::Q6K => packed::<$m, Q6K>(t),
                    Format::Q6K16 => packed::<$m, Q6K16>(t),
                    _ => packed::<$m, Q4K>(t),
                }
                $m
            }};
        }
        // Whole groups of the tiled layout: i0 is a multiple of 8 (the driver's first row is 0 here).
        return match left.min(MR_PACKED) {
            1 => packed!(1),
            2 => packed!(2),
            3 => packed!(3),
            4 => packed!(4),
            5 => packed!(5),
            6 => packed!(6),
            7 => packed!(7),
            _ => packed!(8),
        };
    }
    match (t.panels, left.min(MR)) {
        (2, 1) => go!(1, 2),
        (2, 2) => go!(2, 2),
        (2, 3) => go!(3, 2),
        (2, 4) => go!(4, 2),
        (2, 5) => go!(5, 2),
        (2, _) => go!(6, 2),
        (_, 1) => go!(1, 1),
        (_, 2) => go!(2, 1),
        (_, 3) => go!(3, 1),
        (_, 4) => go!(4, 1),
        (_, 5) => go!(5, 1),
        (_, _) => go!(6, 1),
    }
}
