//! AVX2 Q4K and Q6K for many x rows (prompts, batched steps): each panel's super-block is unpacked once
//! into a small buffer (codes as whole bytes, Q4K's 6-bit scales widened to i16 and `dmin * mc`, `d` and
//! Q6K's `d * sc` to f32: 5-6 KB per panel, L1-resident) and then read by every row tile. The per-row
//! work is left with the products, their sums and the block epilogue; the nibble, high-bit and scale
//! unpacking, about a third of the 2-row tiles' vector instructions, is paid once per panel instead of
//! once per row pair. Q4K tiles are 2 rows x 2 panels (32 output rows: one activation broadcast feeds
//! four `vpmaddubsw`), or 4 rows x 1 panel for an odd last panel; Q6K tiles 3 rows x 1 panel (its i32
//! widening needs registers). Measured on a Zen 3 (one thread, in cache, `examples/quant_hot`): Q4K
//! 1.2x and Q6K 1.35-1.4x the 2-row tiles from 16 rows, about even at 4 rows (hence `MIN_ROWS`). The
//! next super-block is prefetched while the rows compute, for batched decode steps that stream weights.
//! The AVX2 tier keeps this path rather than the other tiers' driver (`superblock.rs`): its Q4K order
//! (the integer scale inside the widening `vpmaddwd`) measured 10-25 % faster on AVX2.
//!
//! Every function here is `unsafe` for the same reasons: the CPU must have AVX2, FMA and F16C, and `job`
//! must satisfy `quant_linear`'s length contract (pointers into the weights, activations and scratch are
//! computed from its shapes).
//!
//! Numerical contract: the same integer sums and the same float operations in the same order as the
//! AVX2 tier's tiles (Q4K as `tile_q4k`: per sub-block `ya += cvt(madd(acc, sc)) * dx`, `y -= (dmin *
//! mc) * (sum(q) * dx)`, per super-block `y += d * ya`; Q6K as `tile_super`: per sub-block `y += (d *
//! sc) * ((dot - 32 sum(q)) * dx)`), y carried across super-blocks through memory (exact), so a row's
//! result is bit-identical to that row alone through the 1-row tiles (the server's exactness).

use std::arch::x86_64::*;
use std::cell::Cell;
use std::ops::Range;

use super::avx2::{add_group, bx, dx_sx, q4k_step, q6k_step};
use super::avx2_unpack::{bytes_f32, f16x16, q4_codes, q4k_scales, q6k_codes};
use super::kblock::{Layout, SUBS};
use super::{store, Format, Job, QPANEL, QSUB};
use crate::scratch::with_scratch;

/// x rows from which a Q4K or Q6K call takes this path (at 4 rows the two paths ran even on a Zen 3).
pub(super) const MIN_ROWS: usize = 6;
/// Q4K rows per 1-panel tile: 4 rows x 2 halves of i16 sums = 8 of the 16 ymm registers, a nibble's two
/// weight vectors and one broadcast 3 more (`ya` and `y` are spilled, touched once per sub-block).
const MR: usize = 4;

thread_local! {
    /// Panels this thread ran through this path (tests prove the path ran with it).
    static PANELS_RUN: Cell<usize> = const { Cell::new(0) };
}

/// Panels the calling thread has run through the unpacked-rows path (a serial call runs on it).
pub fn panels_run() -> usize {
    PANELS_RUN.with(Cell::get)
}

/// Bytes of one unpacked Q4K sub-block: i16 scales (2 halves x 32 B), `dmin * mc` (2 x 32 B), then per
/// group of 8 k and half panel the low- and high-nibble bytes (4 x 2 x 64 B).
const SUB_BYTES: usize = 128 + 4 * 2 * 64;
/// Bytes of one unpacked Q4K super-block: `d` (2 x 32 B), then the sub-blocks.
const SUPER_BYTES: usize = 64 + SUBS * SUB_BYTES;

/// Unpacks super-block `blk` of `t` sub-blocks into `u` (`SUPER_BYTES`, 32-byte aligned).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack(blk: *const u8, t: usize, u: *mut u8) {
    let f = Format::Q4K;
    let (dv, mv) = (f16x16(blk), f16x16(blk.add(32)));
    _mm256_store_ps(u.cast(), dv[0]);
    _mm256_store_ps(u.add(32).cast(), dv[1]);
    for s in 0..t {
        let o = u.add(64 + s * SUB_BYTES);
        let (scp, dm) = q4k_scales(blk, t, s, mv);
        _mm256_store_si256(o.cast(), scp[0]);
        _mm256_store_si256(o.add(32).cast(), scp[1]);
        _mm256_store_ps(o.add(64).cast(), dm[0]);
        _mm256_store_ps(o.add(96).cast(), dm[1]);
        let cp = blk.add(Layout::codes_at(f, t, s));
        for g in 0..4 {
            for (h, c) in q4_codes(cp.add(g * 64)).into_iter().enumerate() {
                let at = o.add(128 + g * 128 + h * 64);
                _mm256_store_si256(at.cast(), c[0]);
                _mm256_store_si256(at.add(32).cast(), c[1]);
            }
        }
    }
}

/// Row i0's activations: k, sub-blocks per row, its int8 codes, and its per-32 scales and code sums.
#[inline(always)]
pub(super) unsafe fn row_acts(
    job: &Job<'_>,
    i0: usize,
) -> (usize, usize, *const i8, *const f32, *const f32) {
    let (a, k) = (job.acts, job.w.k());
    let nsub = k / QSUB;
    let xq = a.q.as_ptr().add(i0 * k);
    (
        k,
        nsub,
        xq,
        a.d.as_ptr().add(i0 * nsub),
        a.s.as_ptr().add(i0 * nsub),
    )
}

/// M rows of y, Q vectors of 8 each (row stride 8 Q f32), from the scratch that carries them.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn load_y<const M: usize, const Q: usize>(yacc: *const f32) -> [[__m256; Q]; M] {
    std::array::from_fn(|r| std::array::from_fn(|q| _mm256_loadu_ps(yacc.add(r * 8 * Q + 8 * q))))
}

/// Rows i0..i0+M against Q half panels (Q / 2 panels unpacked one after another at `u`), over one
/// super-block (sub-blocks `sb0..sb0 + t` of the row): `yacc` (row stride 8 Q f32) carries y in and out.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // y[r], ya[r], acc[r] are register tiles indexed by a constant bound
unsafe fn rows<const M: usize, const Q: usize>(
    job: &Job<'_>,
    at: SuperAt,
    i0: usize,
    yacc: *mut f32,
) {
    let SuperAt { u, t, sb0 } = at;
    let (k, nsub, xq, dxs, sxs) = row_acts(job, i0);
    // Half panel q's unpacked super-block and its offset within a sub-block's groups.
    let half = |q: usize| (u.add((q / 2) * SUPER_BYTES), q % 2);
    let mut y = load_y::<M, Q>(yacc);
    let mut ya = [[_mm256_setzero_ps(); Q]; M];
    for s in 0..t {
        let sb = sb0 + s;
        let mut acc = [[_mm256_setzero_si256(); Q]; M];
        for g in 0..4 {
            // Nibble by nibble: its Q half-panel vectors, then each row's broadcast against all of them.
            for nb in 0..2 {
                let w: [__m256i; Q] = std::array::from_fn(|q| {
                    let (up, h) = half(q);
                    let at = up.add(64 + s * SUB_BYTES + 128 + g * 128 + 64 * h + 32 * nb);
                    _mm256_load_si256(at.cast())
                });
                for r in 0..M {
                    let xb = bx(xq.add(r * k + sb * QSUB + g * 8 + 4 * nb));
                    for q in 0..Q {
                        acc[r][q] = _mm256_add_epi16(acc[r][q], _mm256_maddubs_epi16(w[q], xb));
                    }
                }
            }
        }
        for r in 0..M {
            let scale = dx_sx(*dxs.add(r * nsub + sb), *sxs.add(r * nsub + sb));
            for q in 0..Q {
                let (up, h) = half(q);
                let o = up.add(64 + s * SUB_BYTES);
                let scp = _mm256_load_si256(o.add(32 * h).cast());
                let dm = _mm256_load_ps(o.add(64 + 32 * h).cast());
                q4k_step(&mut ya[r][q], &mut y[r][q], acc[r][q], scp, dm, scale);
            }
        }
    }
    for q in 0..Q {
        let (up, h) = half(q);
        let dv = _mm256_load_ps(up.add(32 * h).cast());
        for r in 0..M {
            let v = _mm256_fmadd_ps(dv, ya[r][q], y[r][q]);
            _mm256_storeu_ps(yacc.add(r * 8 * Q + 8 * q), v);
        }
    }
}

/// Q4K: rows i0.. of panels (P = 1 or 2) against the unpacked super-block at `u`; returns the rows done.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_tile<const P: usize>(job: &Job<'_>, at: SuperAt, i0: usize, yr: *mut f32) -> usize {
    let left = job.m - i0;
    if P == 2 {
        match left {
            1 => rows::<1, 4>(job, at, i0, yr),
            _ => rows::<2, 4>(job, at, i0, yr),
        }
        left.min(2)
    } else {
        match left {
            1 => rows::<1, 2>(job, at, i0, yr),
            2 => rows::<2, 2>(job, at, i0, yr),
            3 => rows::<3, 2>(job, at, i0, yr),
            _ => rows::<4, 2>(job, at, i0, yr),
        }
        left.min(MR)
    }
}

/// Unpacks a super-block (`blk`, its sub-block count, the 32-byte aligned destination).
pub(super) type UnpackFn = unsafe fn(*const u8, usize, *mut u8);
/// A row tile: `tile(job, at, i0, yacc)` takes rows i0.. and returns how many it did.
pub(super) type TileFn = unsafe fn(&Job<'_>, SuperAt, usize, *mut f32) -> usize;

/// The super-block a row tile reads: its unpacked bytes (`u`), its sub-blocks (`t`), and the index of
/// its first sub-block within a row (`sb0`).
#[derive(Clone, Copy)]
pub(super) struct SuperAt {
    u: *const u8,
    t: usize,
    sb0: usize,
}

/// What a format's path is made of: its unpacked super-block's size, the unpacking, and the row tiles.
struct Path {
    super_bytes: usize,
    /// Bytes of a full packed super-block (what is prefetched).
    super_packed: usize,
    unpack: UnpackFn,
    tile: TileFn,
}

/// A tier's part of this path: its Q4K unpacking (and unpacked size) and its row tiles; Q6K is
/// unpacked by `unpack_q6k` for every tier.
pub(super) struct RowTiles {
    pub q4k_super_bytes: usize,
    pub unpack_q4k: UnpackFn,
    pub q4k_one_panel: TileFn,
    pub q4k_two_panels: TileFn,
    pub q6k: TileFn,
}

/// Panels p0..p0+P for all of the job's rows, super-block by super-block: each panel's unpacked once,
/// then every row tile reads it; y (row stride 16 P) lives in scratch between super-blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn drive<const P: usize>(job: &Job<'_>, p0: usize, path: &Path) {
    let (w, m) = (job.w, job.m);
    let lay = Layout::new(w.format, w.k());
    // Scratch in f32s: the unpacked super-blocks (super_bytes a multiple of 64), then y of every row.
    let ub = P * path.super_bytes / 4;
    let stride = P * QPANEL;
    PANELS_RUN.with(|c| c.set(c.get() + P));
    with_scratch(ub + m * stride, |buf| {
        let (ubuf, yacc) = buf.split_at_mut(ub);
        yacc.fill(0.0);
        let (u, ya) = (ubuf.as_mut_ptr().cast::<u8>(), yacc.as_mut_ptr());
        for b in 0..lay.blocks() {
            let t = lay.subs(b);
            for j in 0..P {
                let blk = w.data().as_ptr().add(lay.at(p0 + j, b));
                (path.unpack)(blk, t, u.add(j * path.super_bytes));
            }
            if b + 1 < lay.blocks() {
                // The next super-block's bytes, fetched while the rows compute on this one: a batched
                // decode step streams its weights from memory through here (on the Zen 3, 8 rows of a
                // 38 MB Q4K matrix took 5.5 ms with it, 7.0 without).
                for j in 0..P {
                    let next = w.data().as_ptr().add(lay.at(p0 + j, b + 1));
                    // A full super-block's lines even before a shorter last one: prefetches past the
                    // matrix's end are harmless hints (wrapping_add: no pointer arithmetic past it).
                    for line in 0..path.super_packed.div_ceil(64) {
                        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64 * line).cast());
                    }
                }
            }
            let mut i0 = 0;
            while i0 < m {
                let at = SuperAt {
                    u,
                    t,
                    sb0: b * SUBS,
                };
                i0 += (path.tile)(job, at, i0, ya.add(i0 * stride));
            }
        }
        for i in 0..m {
            for j in 0..P {
                let at = i * stride + j * QPANEL;
                let sums: &[f32; QPANEL] = yacc[at..at + QPANEL].try_into().unwrap();
                store(job, i, p0 + j, sums);
            }
        }
    });
}

/// The job's panels `panels` (a Q4K or Q6K matrix, at least `MIN_ROWS` rows wanted; any count works).
///
/// # Safety
/// The CPU supports AVX2, FMA and F16C; `job` satisfies `quant_linear`'s contract with a Q4K or Q6K
/// matrix; no other thread writes these panels' columns.
pub(super) unsafe fn panels(job: &Job<'_>, panels: Range<usize>) {
    let tiles = RowTiles {
        q4k_super_bytes: SUPER_BYTES,
        unpack_q4k: unpack,
        q4k_one_panel: q4k_tile::<1>,
        q4k_two_panels: q4k_tile::<2>,
        q6k: q6k_tile,
    };
    panels_with(job, panels, &tiles);
}

/// `panels` over a tier's unpacking and tiles (the AVX-VNNI tier's rows path runs its own through
/// the same driver).
///
/// # Safety
/// As `panels`, and the CPU runs `tiles`' functions.
pub(super) unsafe fn panels_with(job: &Job<'_>, panels: Range<usize>, tiles: &RowTiles) {
    if job.w.format == Format::Q6K {
        let q6 = Path {
            super_bytes: Q6_SUPER_BYTES,
            super_packed: Format::Q6K.block_bytes(),
            unpack: unpack_q6k,
            tile: tiles.q6k,
        };
        for p in panels {
            drive::<1>(job, p, &q6);
        }
        return;
    }
    let one = Path {
        super_bytes: tiles.q4k_super_bytes,
        super_packed: Format::Q4K.block_bytes(),
        unpack: tiles.unpack_q4k,
        tile: tiles.q4k_one_panel,
    };
    let two = Path {
        tile: tiles.q4k_two_panels,
        ..one
    };
    let mut p = panels.start;
    while p + 2 <= panels.end {
        drive::<2>(job, p, &two);
        p += 2;
    }
    if p < panels.end {
        drive::<1>(job, p, &one);
    }
}

/// Bytes of one unpacked Q6K sub-block: `d * sc` as f32 (2 halves x 32 B), then per group of 8 k and
/// half panel the two 4-k code vectors as whole bytes 0..=63 (4 x 2 x 64 B).
pub(super) const Q6_SUB_BYTES: usize = 64 + 4 * 2 * 64;
const Q6_SUPER_BYTES: usize = SUBS * Q6_SUB_BYTES;

/// Unpacks Q6K super-block `blk` of `t` sub-blocks into `u` (`Q6_SUPER_BYTES`, 32-byte aligned).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_q6k(blk: *const u8, t: usize, u: *mut u8) {
    let f = Format::Q6K;
    let dv = f16x16(blk);
    for s in 0..t {
        let o = u.add(s * Q6_SUB_BYTES);
        let scf = bytes_f32(_mm_loadu_si128(blk.add(32 + 16 * s).cast()), true);
        _mm256_store_ps(o.cast(), _mm256_mul_ps(dv[0], scf[0]));
        _mm256_store_ps(o.add(32).cast(), _mm256_mul_ps(dv[1], scf[1]));
        let cp = blk.add(Layout::codes_at(f, t, s));
        for g in 0..4 {
            for (h, c) in q6k_codes(cp, g).into_iter().enumerate() {
                let at = o.add(64 + g * 128 + h * 64);
                _mm256_store_si256(at.cast(), c[0]);
                _mm256_store_si256(at.add(32).cast(), c[1]);
            }
        }
    }
}

/// Q6K rows i0..i0+M over one unpacked super-block, as the AVX2 tier's `tile_super` computes them: per
/// group the two code vectors' i16 products widened to i32; per sub-block `y += (d * sc) * ((dot - 32
/// sum(q)) * dx)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // y[r], acc[r] are register tiles indexed by a constant bound
unsafe fn rows_q6k<const M: usize>(job: &Job<'_>, at: SuperAt, i0: usize, yacc: *mut f32) {
    let SuperAt { u, t, sb0 } = at;
    let (k, nsub, xq, dxs, sxs) = row_acts(job, i0);
    let mut y = load_y::<M, 2>(yacc);
    for s in 0..t {
        let sb = sb0 + s;
        let o = u.add(s * Q6_SUB_BYTES);
        let mut acc = [[_mm256_setzero_si256(); 2]; M];
        for g in 0..4 {
            // Half h's two code vectors, as `q6k_codes` gives them.
            let at = o.add(64 + g * 128);
            let w: [[__m256i; 2]; 2] = std::array::from_fn(|h| {
                std::array::from_fn(|c| _mm256_load_si256(at.add(64 * h + 32 * c).cast()))
            });
            add_group::<M, true>(&mut acc, &w, xq.add(sb * QSUB + g * 8), k);
        }
        let ds = [0, 32].map(|h| _mm256_load_ps(o.add(h).cast()));
        for r in 0..M {
            let (dx, sx) = (*dxs.add(r * nsub + sb), *sxs.add(r * nsub + sb));
            q6k_step(&mut y[r], &acc[r], ds, dx, sx);
        }
    }
    for r in 0..M {
        for h in 0..2 {
            _mm256_storeu_ps(yacc.add(r * QPANEL + 8 * h), y[r][h]);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_tile(job: &Job<'_>, at: SuperAt, i0: usize, yr: *mut f32) -> usize {
    let left = job.m - i0;
    match left {
        1 => rows_q6k::<1>(job, at, i0, yr),
        2 => rows_q6k::<2>(job, at, i0, yr),
        _ => rows_q6k::<3>(job, at, i0, yr),
    }
    left.min(3)
}
