//! AVX2 tier of `quant_linear` (also what AVX-512 CPUs without VNNI run): `vpmaddubsw` multiplies
//! unsigned by signed bytes into i16 pairs, `vpmaddwd` by ones widens them to i32. A 16-row panel is
//! two 256-bit halves (rows 0-7, rows 8-15); up to 2 x rows share each loaded weight vector.
//!
//! - Q8 (codes stored + 128): the activations' coarse and residual codes combined into one i16
//!   (254 * q + q2, `QActs::fine`), so one `vpmaddwd` on the widened weight bytes makes both products
//!   at once, exact in i32; the + 128 is taken off with the activations' sum (`s_fine`).
//! - Q4 (codes 0..=15): no sign trick; a whole 32-block's pair sums (8 per lane, each within
//!   2 * 15 * 127) add up in i16 without saturating before one widening. Q40 as Q4; Q50 (codes 0..=31)
//!   widens each group of 8 k to i32 before the next is added, as Q6K.
//!
//! - Q4K: as Q4 per 32-value sub-block; the 6-bit scale multiplies the i16 sums in the widening
//!   `vpmaddwd` (no float conversion), the super-block's f16 scale once per super-block.
//! - Q6K (codes 0..=63): a pair sum is within 2 * 63 * 127 and the low and high nibbles' two within
//!   i16, so each group of 8 k is widened to i32 before the next is added.
//!
//! Numerical contract: exact integer sums per 32-block as the scalar tier; each block's contribution
//! is added with fused multiply-adds (`d * t + y`, and for Q4 also `d * dot + m * sum(q)`), and Q4K
//! in its own order: `y += d * sum_s((sc * dot) * dx) - sum_s((dmin * mc) * (sum(q) * dx))` (the
//! same value as the scalar tier's to float32 rounding). Rows of one call are computed alike,
//! whichever tile they fall in. The activations these tiles read are quantized by `avx2_acts`.
//!
//! From `avx2_rows::MIN_ROWS` rows (prompts, batched steps) Q4K and Q6K go to `avx2_rows`, which unpacks
//! each panel's super-block once for all rows and computes every row bit for bit as the tiles here.
//!
//! Weights are prefetched ahead of the block being read, every cache line of it: on a Zen 3 (AVX2,
//! no AVX-512) a layer's q4 / q4k / q6k matrices streamed at 0.43-0.62 of a plain 2-thread read with
//! one line prefetched, 0.82-0.99 with every line (`benchmarks/bench_matrices.py`).

use std::arch::x86_64::*;
use std::ops::Range;

use super::avx2_unpack::{bytes_f32, f16x16, q4_codes, q4k_scales, q5_codes, q6k_codes};
use super::kblock::{Layout, SUBS};
use super::{store, Format, Job, QActs, QPANEL, QSUB};
use crate::hint;
use crate::isa::Isa;

/// x rows per register tile: 2 rows x 2 halves of i32 sums and of f32 outputs (Q4K tiles of 4
/// rows, or 4 rows of one panel half, measured no faster per row on a Zen 3).
const MR: usize = 2;

/// Whether this CPU has the tier (AVX2, FMA, and F16C for the Q4 scales).
pub fn usable() -> bool {
    Isa::Avx2.cpu_has() && std::arch::is_x86_feature_detected!("f16c")
}

/// Prefetches the weights a few blocks ahead of `blk` (of `bb` bytes), for every tier's Q8 / Q80 / Q4
/// tiles (measured on Granite 1B-A400M decode steps with the AVX-512 tier, whose experts are 0.3-0.6 MB
/// matrices read once: every line of the Q4 block 8 ahead, +10-15 % tokens/s over one line 2 ahead;
/// Q8's longer blocks stream well with one line 2 ahead, and prefetching every line cost 12 %).
/// Q80's 8.5-line blocks stream like Q4's when `first` (the panel's first row tile, the one that reads
/// it from memory): on an AMD EPYC Zen 5 a 262144 x 640 q8_0 lm_head (Gemma 3's) went from 0.66-1.20
/// to 0.97-1.28 of a plain read measured beside it (medians 29.7 -> 36.6 GB/s, alternating runs), and
/// SmolLM2-135M int8 decode steps from 4.5-5.7 to 3.7-5.0 ms; later row tiles find the panel in cache.
/// Prefetches past the matrix's end are harmless hints. SSE only (the x86-64 baseline).
#[inline(always)]
pub(super) fn prefetch(f: Format, blk: *const u8, bb: usize, first: bool) {
    match f {
        // Every line of the block 8 blocks ahead.
        Format::Q4 | Format::Q40 | Format::Q50 => hint::prefetch(blk.wrapping_add(8 * bb), bb),
        Format::Q80 if first => hint::prefetch(blk.wrapping_add(8 * bb), bb),
        // One line, 2 blocks ahead.
        _ => hint::prefetch(blk.wrapping_add(2 * bb), 1),
    }
}

/// A Q8 / Q80 / Q4 tile's inputs (every x86 tier's): the format, k and 32-blocks per row; panel p's
/// blocks; row i0's codes (coarse, residual, and this tier's i16 fine ones; rows k apart) and its
/// per-32 values (`QActs`' d, s, d_fine, s_fine; rows k / 32 apart).
pub(super) struct BlockTile<'a> {
    pub f: Format,
    pub k: usize,
    pub nsub: usize,
    bb: usize,
    nb: usize,
    base: *const u8,
    /// The panel's first row tile (rows from 0): the one whose blocks come from memory.
    first: bool,
    pub xq: *const i8,
    pub xq2: *const i8,
    pub xf: *const i16,
    pub dxs: &'a [f32],
    pub sxs: &'a [f32],
    pub dfs: &'a [f32],
    pub sfs: &'a [i32],
}

impl<'a> BlockTile<'a> {
    /// Rows i0.. on panel p of the job's Q8 / Q80 / Q4 matrix.
    ///
    /// # Safety
    /// i0 < m, p a panel of the matrix, and the activations hold the job's m rows.
    #[inline(always)]
    pub(super) unsafe fn new(job: &Job<'a>, p: usize, i0: usize) -> BlockTile<'a> {
        let (w, a): (_, &'a QActs) = (job.w, job.acts);
        let (f, k) = (w.format, w.k());
        let (bb, nb, nsub) = (f.block_bytes(), k / f.block(), k / QSUB);
        let (xq, dxs, sxs) = job.row_codes(i0);
        BlockTile {
            f,
            k,
            nsub,
            bb,
            nb,
            base: w.data().as_ptr().add(p * nb * bb),
            first: i0 == 0,
            xq,
            xq2: a.q2.as_ptr().add(i0 * k),
            // Only the AVX2 tier writes the fine codes (empty elsewhere): no pointer arithmetic past them.
            xf: a.fine.as_ptr().wrapping_add(i0 * k),
            dxs,
            sxs,
            dfs: &a.d_fine[i0 * nsub..],
            sfs: &a.s_fine[i0 * nsub..],
        }
    }

    /// Runs `block(b, bytes)` on the panel's blocks in k order, each after prefetching ahead of it.
    ///
    /// # Safety
    /// As `new`; `block` reads at most a block's bytes.
    #[inline(always)]
    pub(super) unsafe fn for_each_block(&self, mut block: impl FnMut(usize, *const u8)) {
        for b in 0..self.nb {
            let blk = self.base.add(b * self.bb);
            prefetch(self.f, blk, self.bb, self.first);
            block(b, blk);
        }
    }
}

/// Four activation codes starting at `p`, broadcast to every i32 lane.
#[inline(always)]
pub(super) unsafe fn bx(p: *const i8) -> __m256i {
    _mm256_set1_epi32(p.cast::<i32>().read_unaligned())
}

#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // y[r] and acc[r] are register tiles indexed by a constant bound
unsafe fn tile<const M: usize>(job: &Job<'_>, p: usize, i0: usize) {
    let src = BlockTile::new(job, p, i0);
    let mut y = [[_mm256_setzero_ps(); 2]; M];
    let ones = _mm256_set1_epi16(1);
    // Swaps rows 2, 3 with 4, 5 of eight (its own inverse): the order hadd leaves Q8's sums in.
    let q8_order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    src.for_each_block(|b, blk| {
        match src.f {
            Format::Q8 | Format::Q80 => {
                // Each 16-byte quarter of a group (4 rows x 4 k) widens to u16 and meets the fine
                // activation codes in one vpmaddwd: per row two i32 lanes, paired up by hadd into
                // rows [0, 1, 4, 5 | 2, 3, 6, 7] (and 8 more), the order the scales are put in.
                let dv = [0, 1].map(|s| {
                    let d = if src.f == Format::Q80 {
                        _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * s).cast()))
                    } else {
                        _mm256_loadu_ps(blk.add(32 * s).cast())
                    };
                    _mm256_permutevar8x32_ps(d, q8_order)
                });
                let (halves, co) = (src.f.block() / QSUB, src.f.codes_at());
                for h in 0..halves {
                    let sb = b * halves + h;
                    let mut acc = [[_mm256_setzero_si256(); 4]; M];
                    for g in 0..8 {
                        let at = blk.add(co + h * 512 + g * 64);
                        let mut xv = [_mm256_setzero_si256(); M];
                        for r in 0..M {
                            let xo = src.xf.add(r * src.k + sb * QSUB + g * 4);
                            xv[r] = _mm256_set1_epi64x(xo.cast::<i64>().read_unaligned());
                        }
                        for q in 0..4 {
                            let wv = _mm256_cvtepu8_epi16(_mm_loadu_si128(at.add(16 * q).cast()));
                            for r in 0..M {
                                acc[r][q] =
                                    _mm256_add_epi32(acc[r][q], _mm256_madd_epi16(wv, xv[r]));
                            }
                        }
                    }
                    for r in 0..M {
                        // The codes are stored + 128: sum((c + 128) * fine) - 128 * sum(fine). Every
                        // lane stays within i32: 16 products of at most 255 * 32385 per lane, and the
                        // correction at most 128 * 32 * 32385.
                        let corr = _mm256_set1_epi32(128 * src.sfs[r * src.nsub + sb]);
                        let dx = _mm256_set1_ps(src.dfs[r * src.nsub + sb]);
                        for s in 0..2 {
                            let pair = _mm256_hadd_epi32(acc[r][2 * s], acc[r][2 * s + 1]);
                            let fine = _mm256_sub_epi32(pair, corr);
                            let t = _mm256_mul_ps(_mm256_cvtepi32_ps(fine), dx);
                            y[r][s] = _mm256_fmadd_ps(dv[s], t, y[r][s]);
                        }
                    }
                }
            }
            _ => {
                // Q4's d * c + m, Q40's / Q50's d * (c - z) = d * c + (-z d) (exact): one min per row.
                let dv = f16x16(blk);
                let mv = match src.f.zero_point() {
                    Some(z) => dv.map(|d| _mm256_mul_ps(_mm256_set1_ps(-(z as f32)), d)),
                    None => f16x16(blk.add(32)),
                };
                let co = blk.add(src.f.codes_at());
                let q5 = src.f == Format::Q50;
                let mut acc = [[_mm256_setzero_si256(); 2]; M];
                if q5 {
                    // Codes 0..=31: a group's two nibble products fill an i16, so widen per group.
                    let hb = Some(blk.add(src.f.high_bits_at()));
                    for g in 0..4 {
                        let c = q5_codes(co, hb, g);
                        add_group::<M, true>(&mut acc, &c, src.xq.add(b * QSUB + g * 8), src.k);
                    }
                } else {
                    for g in 0..4 {
                        let c = q5_codes(co, None, g);
                        add_group::<M, false>(&mut acc, &c, src.xq.add(b * QSUB + g * 8), src.k);
                    }
                }
                for r in 0..M {
                    let sx = _mm256_set1_ps(src.sxs[r * src.nsub + b]);
                    let dx = _mm256_set1_ps(src.dxs[r * src.nsub + b]);
                    for s in 0..2 {
                        let sum = if q5 {
                            acc[r][s]
                        } else {
                            _mm256_madd_epi16(acc[r][s], ones)
                        };
                        let dot = _mm256_cvtepi32_ps(sum);
                        let t = _mm256_fmadd_ps(dv[s], dot, _mm256_mul_ps(mv[s], sx));
                        y[r][s] = _mm256_fmadd_ps(t, dx, y[r][s]);
                    }
                }
            }
        }
    });
    if src.f.is_q8() {
        for yr in &mut y {
            *yr = yr.map(|v| _mm256_permutevar8x32_ps(v, q8_order));
        }
    }
    store_halves(job, i0, p, &y);
}

/// Stores a tile's rows i0.. of panel p, each as two halves of 8 sums (bias added by `store`).
///
/// # Safety
/// As `store`'s, for every row of the tile.
#[inline(always)]
pub(super) unsafe fn store_halves<const M: usize>(
    job: &Job<'_>,
    i0: usize,
    p: usize,
    y: &[[__m256; 2]; M],
) {
    for (r, yr) in y.iter().enumerate() {
        let mut sums = [0.0f32; QPANEL];
        _mm256_storeu_ps(sums.as_mut_ptr(), yr[0]);
        _mm256_storeu_ps(sums.as_mut_ptr().add(8), yr[1]);
        store(job, i0 + r, p, &sums);
    }
}

/// One group of 8 k into each row's two half-panel sums: per half h, `vpmaddubsw` of its low- and
/// high-nibble code vectors `c[h]` against the row's 4-k broadcasts at `x + r k` and 4 further, the
/// two added in i16; then added in i16 (`WIDEN` false: Q4 and Q4K, whose 32-block sums fit) or first
/// widened to i32 with `vpmaddwd` by ones (Q6K, whose two products fill an i16).
///
/// # Safety
/// x + r k points at 8 readable codes for every r < M; the CPU has AVX2.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // acc[r] is a register tile indexed by a constant bound
pub(super) unsafe fn add_group<const M: usize, const WIDEN: bool>(
    acc: &mut [[__m256i; 2]; M],
    c: &[[__m256i; 2]; 2],
    x: *const i8,
    k: usize,
) {
    for r in 0..M {
        let xr = x.add(r * k);
        let (xa, xb) = (bx(xr), bx(xr.add(4)));
        for h in 0..2 {
            let pr = _mm256_add_epi16(
                _mm256_maddubs_epi16(c[h][0], xa),
                _mm256_maddubs_epi16(c[h][1], xb),
            );
            acc[r][h] = if WIDEN {
                _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(pr, _mm256_set1_epi16(1)))
            } else {
                _mm256_add_epi16(acc[r][h], pr)
            };
        }
    }
}

/// Q6K's step for one row and sub-block: per half, `y += ds * ((f32(dot) - 32 sx) * dx)` (dot - 32
/// sum(q) is exact in f32: integers below 2^24).
#[inline(always)]
pub(super) unsafe fn q6k_step(
    y: &mut [__m256; 2],
    dot: &[__m256i; 2],
    ds: [__m256; 2],
    dx: f32,
    sx: f32,
) {
    let (sx, dx) = (_mm256_set1_ps(sx), _mm256_set1_ps(dx));
    for h in 0..2 {
        let c = _mm256_sub_ps(
            _mm256_cvtepi32_ps(dot[h]),
            _mm256_mul_ps(_mm256_set1_ps(32.0), sx),
        );
        y[h] = _mm256_fmadd_ps(ds[h], _mm256_mul_ps(c, dx), y[h]);
    }
}

/// Q4K's step for one row and sub-block (see `tile_q4k`), per half h: `ya += f32(madd(acc, sc)) * dx`,
/// `y -= (dmin * mc) * (sum(q) * dx)`.
#[inline(always)]
pub(super) unsafe fn q4k_step(
    ya: &mut __m256,
    y: &mut __m256,
    acc: __m256i,
    scp: __m256i,
    dm: __m256,
    (dxv, cv): (__m256, __m256),
) {
    let dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(acc, scp));
    *ya = _mm256_fmadd_ps(dot, dxv, *ya);
    *y = _mm256_fnmadd_ps(dm, cv, *y);
}

#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // y[r] and acc[r] are register tiles indexed by a constant bound
unsafe fn tile_super<const M: usize>(job: &Job<'_>, p: usize, i0: usize) {
    let (xq, dxs, sxs) = job.row_codes(i0);
    let (f, k) = (job.w.format, job.w.k());
    let (nsub, full) = (k / QSUB, f.block_bytes());
    let mut y = [[_mm256_setzero_ps(); 2]; M];
    for_each_super(job, p, |b, t, blk| {
        let dv = f16x16(blk);
        for s in 0..t {
            let sb = b * SUBS + s;
            let cp = blk.add(Layout::codes_at(f, t, s));
            // Every line of this sub-block's codes one super-block ahead (on Zen 3 the decode step
            // streamed at 0.43 of a plain read with one line, 0.99 with all six).
            for line in 0..6 {
                _mm_prefetch::<_MM_HINT_T0>(cp.wrapping_add(full + line * 64).cast());
            }
            let scf = bytes_f32(_mm_loadu_si128(blk.add(32 + 16 * s).cast()), true);
            let ds = [_mm256_mul_ps(dv[0], scf[0]), _mm256_mul_ps(dv[1], scf[1])];
            // i32 sums, widened per group (two nibble products of 6-bit codes fill an i16).
            let mut acc = [[_mm256_setzero_si256(); 2]; M];
            for g in 0..4 {
                let c = q6k_codes(cp, g);
                add_group::<M, true>(&mut acc, &c, xq.add(sb * QSUB + g * 8), k);
            }
            for r in 0..M {
                let (dx, sx) = (dxs[r * nsub + sb], sxs[r * nsub + sb]);
                q6k_step(&mut y[r], &acc[r], ds, dx, sx);
            }
        }
    });
    store_halves(job, i0, p, &y);
}

/// Runs `block(b, t, bytes)` on panel p's super-blocks in k order (t: its sub-blocks), each after
/// prefetching the next super-block's header (its scales, one super-block ahead; harmless past the end).
///
/// # Safety
/// p is a panel of the job's Q4K or Q6K matrix; `block` reads at most the super-block's bytes.
#[inline(always)]
unsafe fn for_each_super(job: &Job<'_>, p: usize, mut block: impl FnMut(usize, usize, *const u8)) {
    let (w, f) = (job.w, job.w.format);
    let (lay, full) = (Layout::new(f, w.k()), f.block_bytes());
    for b in 0..lay.blocks() {
        let t = lay.subs(b);
        let blk = w.data().as_ptr().add(lay.at(p, b));
        for line in 0..4 {
            _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(full + line * 64).cast());
        }
        block(b, t, blk);
    }
}

/// Q4K: per 32-value sub-block the i16 sums (as Q4) meet the 6-bit scale in the widening `vpmaddwd`
/// itself (sc * dot, exact in i32 and in f32: below 63 * 32 * 15 * 127 < 2^24), so the scale costs no
/// float conversion; `d * sum_s(sc * dot * dx)` is applied once per super-block and the mins per
/// sub-block as `(dmin * mc) * (sum(q) * dx)`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // y[r] and acc[r] are register tiles indexed by a constant bound
unsafe fn tile_q4k<const M: usize>(job: &Job<'_>, p: usize, i0: usize) {
    let (xq, dxs, sxs) = job.row_codes(i0);
    let (f, k) = (job.w.format, job.w.k());
    let (nsub, full) = (k / QSUB, f.block_bytes());
    let mut y = [[_mm256_setzero_ps(); 2]; M];
    for_each_super(job, p, |b, t, blk| {
        let (dv, mv) = (f16x16(blk), f16x16(blk.add(32)));
        let mut ya = [[_mm256_setzero_ps(); 2]; M];
        for s in 0..t {
            let sb = b * SUBS + s;
            let cp = blk.add(Layout::codes_at(f, t, s));
            for line in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(cp.wrapping_add(full + line * 64).cast());
            }
            let (scp, dm) = q4k_scales(blk, t, s, mv);
            let mut acc = [[_mm256_setzero_si256(); 2]; M];
            for g in 0..4 {
                let c = q4_codes(cp.add(g * 64));
                add_group::<M, false>(&mut acc, &c, xq.add(sb * QSUB + g * 8), k);
            }
            for r in 0..M {
                let scale = dx_sx(dxs[r * nsub + sb], sxs[r * nsub + sb]);
                for h in 0..2 {
                    q4k_step(&mut ya[r][h], &mut y[r][h], acc[r][h], scp[h], dm[h], scale);
                }
            }
        }
        for r in 0..M {
            for h in 0..2 {
                y[r][h] = _mm256_fmadd_ps(dv[h], ya[r][h], y[r][h]);
            }
        }
    });
    store_halves(job, i0, p, &y);
}

/// A row's Q4K activation factors for `q4k_step`: dx and sum(q) * dx, broadcast.
#[inline(always)]
pub(super) unsafe fn dx_sx(dx: f32, sx: f32) -> (__m256, __m256) {
    (_mm256_set1_ps(dx), _mm256_set1_ps(sx * dx))
}

/// # Safety
/// The CPU supports the tier; `job` satisfies `quant_linear`'s contract; no other thread writes the
/// columns of `panels`.
pub unsafe fn panels(job: &Job<'_>, panels: Range<usize>) {
    let (sup, q4k) = (job.w.format.is_super(), job.w.format == Format::Q4K);
    assert!(
        !job.w.format.is_q8() || job.acts.fine.len() >= job.m * job.w.k(),
        "quant avx2: Q8 needs the activations this tier quantized (their i16 fine codes)"
    );
    if sup && job.m >= super::avx2_rows::MIN_ROWS {
        return super::avx2_rows::panels(job, panels);
    }
    // SAFETY (the tiles): the caller's contract; each tile's rows and panel are the job's.
    job.for_each_tile(panels, MR, |p, i0, m| match (m, sup, q4k) {
        (1, _, true) => tile_q4k::<1>(job, p, i0),
        (_, _, true) => tile_q4k::<2>(job, p, i0),
        (1, false, _) => tile::<1>(job, p, i0),
        (_, false, _) => tile::<2>(job, p, i0),
        (1, true, _) => tile_super::<1>(job, p, i0),
        (_, true, _) => tile_super::<2>(job, p, i0),
    });
}
