//! bf16-weight GEMMs on AMX tiles (`tdpbf16ps`) over float32 or bf16 activations: the `amx` tier
//! of `linear` (row-major weights, packed per call) and of `panel_linear` (the decoder's panels).
//!
//! Exact split: every float32 activation x is cut into hi + mid + lo, three bf16 values whose sum
//! is x exactly (truncation: hi keeps the top 8 significant bits, mid the next 8 of the remainder,
//! lo what is left, which fits in 8 bits). A bf16 x bf16 product is exact in float32, so
//! y = hi W^T + mid W^T + lo W^T has every product of the float32 GEMM, summed in float32 in
//! another order: float32-level results, as the FMA tiers give. Activations that were bf16 (a
//! torch bf16 model under `torch_ops.install()`) have mid = lo = 0 and run one pass, not three.
//!
//! Blocking: the activations are split once per call (in parallel, by rows) into row-major bf16
//! pieces padded to 32 rows and k to a multiple of 32 (rows one 64-byte line further apart when
//! they would be a multiple of 4 KB apart: a tile load's 16 rows would share cache sets). Each task
//! owns a block of columns (or of rows, when columns are few) and walks it as `Blocking` says: for
//! each 256 columns and 512 rows, k whole up to 1024 (else in equal chunks), the chunk's weights are
//! packed once into the tiles' pair order (`bf16_pack`; L2), then every 32-row block of the pieces
//! runs over all those columns (4 sum tiles; each k step loads the 2 weight tiles once and 2
//! activation tiles per piece), so the activations come from memory once per 256 columns, not once
//! per 32 (which had left the 3-piece GEMM at the rate of the activations' stream). Between k chunks
//! the sums go through memory (stored and reloaded as float32: the same bits); the bias is added once
//! at the end.
//!
//! Numerical contract: float32 sums of exact products (the hardware's order); like every AMX and
//! AVX512-BF16 instruction, `tdpbf16ps` reads denormal inputs as zero and flushes denormal results,
//! so a piece or weight below 2^-126 (1.2e-38) in magnitude counts as zero: nothing changes for
//! |x| >= 2^-103 (where mid and lo are normal whenever non-zero); below, x loses less than 2^-126 of
//! itself, and a product or sum below 2^-126 becomes zero.
//! Infinities and NaN in x stay in hi (mid = lo = 0), so they reach y as float32 would carry them.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) use super::bf16_pack::Weights;
use super::bf16_pack::{pack_b, KS, NB};
#[cfg(target_arch = "x86_64")]
use super::bf16_split::split_rows_avx512;
use super::bf16_split::{split_rows, Split, SplitArgs};
use super::{Tiles, ROWS, ROW_BYTES};
#[cfg(target_arch = "x86_64")]
use crate::isa::Isa;
use crate::par::{chunk_ranges, run_tasks, Parallel, SyncPtr};
use crate::scratch::with_scratch;

/// From this many rows on, bf16 linears run on AMX tiles (below: the AVX-512 GEMV / GEMM).
pub(crate) const MIN_M: usize = 32;
/// Rows of one block of four sum tiles (its columns: `NB`).
const MB: usize = 2 * ROWS;
/// Below this many multiply-adds per task, splitting further costs more than it saves.
const MIN_MACS_PER_TASK: usize = 1 << 20;

/// One GEMM: y[m, n] = x[m, k] w^T (+ bias), the weights row-major or in panels.
pub(crate) type Gemm<'a> = crate::linear::Problem<'a, Weights<'a>>;

/// 32 x 32 float32 sums, as the four tiles store them.
#[repr(C, align(64))]
struct Stage([f32; MB * NB]);

/// How a task walks its rows, columns and k (see the module header): `nc` columns of packed weights
/// at a time (multiple of 32), `mc` rows (multiple of 32), and k whole up to `kc`, else in near-equal
/// chunks of at most `kc` (multiples of 32) whose sums go through memory between chunks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Blocking {
    pub nc: usize,
    pub mc: usize,
    pub kc: usize,
}

impl Blocking {
    /// Measured on a Sapphire Rapids class Xeon (benchmarks/HISTORY.md, "AMX bf16 prompts"): the packed weights of
    /// 256 columns by up to 1024 k (512 KB) and the sums of 512 x 256 stay in L2, a 32-row block of the
    /// activations' pieces is reused by 8 column blocks.
    pub(crate) const DEFAULT: Blocking = Blocking {
        nc: 256,
        mc: 512,
        kc: 1024,
    };

    /// The k chunk for a padded k of `kp`: kp itself when it fits, else kp cut into equal parts.
    fn k_chunk(&self, kp: usize) -> usize {
        kp.div_ceil(kp.div_ceil(self.kc)).next_multiple_of(KS)
    }
}

/// One task: y[rows x cols] from the split activations and w.
///
/// Order (the same sums in the same order whatever the blocking: a sum tile stored as float32 and
/// loaded back is unchanged): for each `nc` columns and `mc` rows, for each k chunk, the chunk's
/// weights are packed once; then each 32-row block of activations runs over every 32-column block,
/// so its pieces are read from memory once per chunk and reused from cache, and the packed weights
/// (L2) serve every row block. A block's sums start at zero on the first chunk, are reloaded from
/// `acc` on later ones, and go to y (plus the bias) after the last.
///
/// # Safety
/// `t` can run (hardware tiles only where `amx::usable()`); rows start on a multiple of 32 and
/// lie within m; cols start on a multiple of 32 and lie within n; `a` is a complete split of x;
/// no other thread writes this tile of y; AVX-512 is present when `avx512` is set.
unsafe fn task<T: Tiles>(
    t: &mut T,
    p: &Gemm<'_>,
    a: &Split,
    rows: Range<usize>,
    cols: Range<usize>,
    avx512: bool,
    bl: Blocking,
) {
    let (k, n, kp) = (p.k, p.n, a.kp);
    let a_stride = a.ld * 2;
    let kc = bl.k_chunk(kp);
    // Equal chunks (a last chunk of one 32-column block would reuse each activation block once).
    let even = |len: usize, most: usize, unit: usize| {
        len.div_ceil(len.div_ceil(most)).next_multiple_of(unit)
    };
    let (nc, mc) = (even(cols.len(), bl.nc, NB), even(rows.len(), bl.mc, MB));
    let acc_len = if kc < kp { mc * nc } else { 0 };
    let mut stage = Stage([0.0; MB * NB]);
    with_scratch(nc * kc / 2 + acc_len, |buf| {
        let (packed, acc) = buf.split_at_mut(nc * kc / 2);
        // SAFETY: the f32 scratch's first nc * kc / 2 floats hold nc * kc u16s, 64-byte aligned
        // (nc * kc / 2 is a multiple of 16, so `acc` is 64-byte aligned too).
        let packed =
            unsafe { std::slice::from_raw_parts_mut(packed.as_mut_ptr().cast::<u16>(), nc * kc) };
        let acc = acc.as_mut_ptr();
        // SAFETY (whole block): tiles are configured before use and released at the end; every
        // tile pointer below addresses 16 rows of 64 bytes inside `packed` (block bi of the chunk,
        // steps < kcl / 32), the split (rows rb .. rb + 32 <= m_pad, k < kp), `acc` (block
        // (rb - ic) / 32, bi of mc / 32 x nc / 32 blocks of 32 x 32) or `stage`; y is written only
        // at rows x cols of this task.
        unsafe {
            t.configure();
            for jc in cols.clone().step_by(nc) {
                let jce = (jc + nc).min(cols.end);
                for ic in rows.clone().step_by(mc) {
                    let ice = (ic + mc).min(rows.end);
                    for k0 in (0..kp).step_by(kc) {
                        let kcl = kc.min(kp - k0);
                        let (first, last) = (k0 == 0, k0 + kcl == kp);
                        for (bi, j0) in (jc..jce).step_by(NB).enumerate() {
                            let dst = &mut packed[bi * kcl * NB..(bi + 1) * kcl * NB];
                            pack_b(p.w, n, k, j0, k0, kcl, dst, avx512);
                        }
                        for rb in (ic..ice).step_by(MB) {
                            for (bi, j0) in (jc..jce).step_by(NB).enumerate() {
                                let sums = acc.add((((rb - ic) / MB) * (nc / NB) + bi) * MB * NB);
                                let tiles = [(0, 0), (0, 1), (1, 0), (1, 1)];
                                if first {
                                    t.zero_c();
                                } else {
                                    for (tile, (i, j)) in tiles.into_iter().enumerate() {
                                        let at = sums.add(i * ROWS * NB + j * ROWS);
                                        t.load_c(tile, at.cast(), NB * 4);
                                    }
                                }
                                let b0 = packed.as_ptr().add(bi * kcl * NB);
                                for step in 0..kcl / KS {
                                    let b = b0.add(step * 2 * ROWS * KS);
                                    t.load_b(0, b.cast(), ROW_BYTES);
                                    t.load_b(1, b.add(ROWS * KS).cast(), ROW_BYTES);
                                    for piece in 0..a.pieces {
                                        let at = a
                                            .data
                                            .add((piece * a.m_pad + rb) * a.ld + k0 + step * KS);
                                        t.load_a(0, at.cast(), a_stride);
                                        t.load_a(1, at.add(ROWS * a.ld).cast(), a_stride);
                                        t.dp_bf16();
                                    }
                                }
                                let out = if last { stage.0.as_mut_ptr() } else { sums };
                                for (tile, (i, j)) in tiles.into_iter().enumerate() {
                                    t.store_c(
                                        tile,
                                        out.add(i * ROWS * NB + j * ROWS).cast(),
                                        NB * 4,
                                    );
                                }
                                if last {
                                    finish(
                                        p,
                                        &stage,
                                        rb..(rb + MB).min(rows.end),
                                        j0..(j0 + NB).min(cols.end),
                                    );
                                }
                            }
                        }
                    }
                }
            }
            t.release();
        }
    });
}

/// y[rows, cols] = the staged sums (+ bias): rows and cols lie inside one 32 x 32 block.
///
/// # Safety
/// y holds m x n floats that only this task writes at rows x cols.
unsafe fn finish(p: &Gemm<'_>, stage: &Stage, rows: Range<usize>, cols: Range<usize>) {
    let (n, rb, j0) = (p.n, rows.start, cols.start);
    for r in rows {
        let src = &stage.0[(r - rb) * NB..(r - rb) * NB + cols.len()];
        // SAFETY: the caller's contract.
        let dst = unsafe { std::slice::from_raw_parts_mut(p.y.get().add(r * n + j0), cols.len()) };
        match p.bias {
            Some(bias) => {
                for ((d, s), b) in dst.iter_mut().zip(src).zip(&bias[cols.clone()]) {
                    *d = s + b;
                }
            }
            None => dst.copy_from_slice(src),
        }
    }
}

/// y = x w^T (+ bias) on AMX tiles, every row of y. `make` gives each task its tiles (`amx::Hw`
/// on an AMX CPU, `amx::Emu` in tests); `avx512` splits with AVX-512 code.
///
/// # Safety
/// `make`'s tiles can run on this CPU, and AVX-512 is present when `avx512` is set; m, n, k > 0,
/// x holds m * k values, w n * k (row-major) or its panels, the bias n, y points at m * n f32s
/// that nothing else accesses during the call.
pub(crate) unsafe fn gemm<T: Tiles>(
    par: &dyn Parallel,
    p: &Gemm<'_>,
    make: &(dyn Fn() -> T + Sync),
    avx512: bool,
) {
    // SAFETY: forwarded contract.
    unsafe { gemm_blocked(par, p, make, avx512, Blocking::DEFAULT) }
}

/// The `amx` tier's path for calls of `MIN_M` rows or more: runs `p` on the AMX tiles and returns
/// true, or leaves the call to the caller's other paths (false) on any other tier or fewer rows.
///
/// # Safety
/// `isa` is supported by this CPU; `p` meets `gemm`'s contract (m, n, k > 0, lengths checked).
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn gemm_on_amx(isa: Isa, par: &dyn Parallel, p: &Gemm<'_>) -> bool {
    if isa != Isa::Amx || p.m < MIN_M {
        return false;
    }
    // SAFETY: the Amx tier is supported (caller's contract): AVX-512 and usable AMX tiles; the rest is
    // the caller's contract, forwarded.
    unsafe { gemm(par, p, &|| super::Hw, true) };
    true
}

/// `gemm` with a given blocking (the same bits whatever it is: tests use small blocks).
///
/// # Safety
/// As `gemm`; the blocking's sizes are positive multiples of 32.
pub(crate) unsafe fn gemm_blocked<T: Tiles>(
    par: &dyn Parallel,
    p: &Gemm<'_>,
    make: &(dyn Fn() -> T + Sync),
    avx512: bool,
    bl: Blocking,
) {
    let (m, k, n) = (p.m, p.k, p.n);
    let (m_pad, kp) = (m.next_multiple_of(MB), k.next_multiple_of(KS));
    // Rows a multiple of 4 KB apart would put a tile load's 16 rows in the same cache sets.
    let ld = if (kp * 2).is_multiple_of(4096) {
        kp + KS
    } else {
        kp
    };
    let want = |work: usize| {
        par.num_threads()
            .clamp(1, (work / MIN_MACS_PER_TASK).max(1))
    };
    with_scratch((3 * m_pad * ld).div_ceil(2), |buf| {
        // The f32 scratch holds 3 * m_pad * ld u16s, 64-byte aligned.
        let out = SyncPtr(buf.as_mut_ptr().cast::<u16>());
        let split = SplitArgs {
            x: p.x,
            m,
            k,
            m_pad,
            kp,
            ld,
            out,
        };
        let (any_mid, any_lo) = (AtomicBool::new(false), AtomicBool::new(false));
        let chunks = chunk_ranges(m_pad, want(m_pad * kp * 16), MB);
        run_tasks(par, chunks.len(), &|i| {
            let rows = chunks[i].clone();
            // SAFETY: `out` holds 3 * m_pad * ld u16s (the buffer above); chunks are disjoint
            // row ranges, so each task writes its own rows; AVX-512 only when the caller says so.
            let (a, b) = unsafe {
                #[cfg(target_arch = "x86_64")]
                if avx512 {
                    split_rows_avx512(&split, rows)
                } else {
                    split_rows(&split, rows)
                }
                #[cfg(not(target_arch = "x86_64"))]
                split_rows(&split, rows)
            };
            any_mid.fetch_or(a, Ordering::Relaxed);
            any_lo.fetch_or(b, Ordering::Relaxed);
        });
        let pieces = if any_lo.into_inner() {
            3
        } else if any_mid.into_inner() {
            2
        } else {
            1
        };
        let a = Split {
            data: out.get(),
            pieces,
            m_pad,
            kp,
            ld,
        };
        let tasks = want(m * n * k * pieces);
        let tiles: Vec<(Range<usize>, Range<usize>)> =
            if n.div_ceil(NB) >= 2 * tasks || m_pad / MB < tasks {
                chunk_ranges(n, tasks, NB)
                    .into_iter()
                    .map(|c| (0..m, c))
                    .collect()
            } else {
                chunk_ranges(m, tasks, MB)
                    .into_iter()
                    .map(|r| (r, 0..n))
                    .collect()
            };
        let a = SyncSplit(a);
        run_tasks(par, tiles.len(), &|i| {
            let (rows, cols) = tiles[i].clone();
            let mut t = make();
            // SAFETY: chunk_ranges aligns starts to 32 and keeps within m / n; tiles are
            // disjoint; the split is complete (run_tasks above joined); `make`'s contract.
            unsafe { task(&mut t, p, a.get(), rows, cols, avx512, bl) }
        });
    });
}

/// The split is only read by the GEMM tasks, after every writer joined.
struct SyncSplit(Split);

impl SyncSplit {
    /// Inside closures: a method call captures the whole (Sync) wrapper, a field its raw pointer.
    fn get(&self) -> &Split {
        &self.0
    }
}
// SAFETY: the pointed-to data is immutable while tasks share it (written before, read after).
unsafe impl Sync for SyncSplit {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::amx::bf16_split::lcg;
    use crate::amx::Emu;
    use crate::bf16::{bf16_to_f32, f32_to_bf16};
    use crate::par::{ScopedThreads, Serial};
    use crate::preserve_linear::PanelWeight;

    /// A test problem's data: x [m, k] (seeded, optionally rounded to bf16 values), bf16 weights
    /// [n, k] row-major, a bias of n.
    struct Data {
        x: Vec<f32>,
        w: Vec<u16>,
        bias: Vec<f32>,
        m: usize,
        k: usize,
        n: usize,
    }

    impl Data {
        fn new(seed: u64, (m, k, n): (usize, usize, usize), bf16_x: bool) -> Data {
            let mut seed = seed;
            let round = |v: f32| {
                if bf16_x {
                    bf16_to_f32(f32_to_bf16(v))
                } else {
                    v
                }
            };
            let x = (0..m * k).map(|_| round(lcg(&mut seed))).collect();
            let w = (0..n * k).map(|_| f32_to_bf16(lcg(&mut seed))).collect();
            let bias = (0..n).map(|_| lcg(&mut seed)).collect();
            Data {
                x,
                w,
                bias,
                m,
                k,
                n,
            }
        }

        /// The GEMM of this data (row-major weights), with or without the bias; y not set yet.
        fn gemm(&self, bias: bool) -> Gemm<'_> {
            Gemm {
                x: &self.x,
                m: self.m,
                k: self.k,
                w: Weights::RowMajor(&self.w),
                n: self.n,
                bias: bias.then_some(&self.bias[..]),
                y: SyncPtr(std::ptr::null_mut()),
            }
        }
    }

    /// y in float64 from the same (bf16, row-major) weights and float32 activations.
    fn reference(p: &Gemm<'_>) -> Vec<f64> {
        let Weights::RowMajor(w) = p.w else {
            unreachable!()
        };
        let (m, k, n) = (p.m, p.k, p.n);
        let mut y = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = p.bias.map_or(0.0, |b| b[j] as f64);
                for kk in 0..k {
                    s += p.x[i * k + kk] as f64 * bf16_to_f32(w[j * k + kk]) as f64;
                }
                y[i * n + j] = s;
            }
        }
        y
    }

    /// `p` (its y aside) into a fresh y on tiles `make` gives, with blocking `bl`.
    fn run_on<T: Tiles>(
        par: &dyn Parallel,
        p: &Gemm<'_>,
        make: &(dyn Fn() -> T + Sync),
        avx512: bool,
        bl: Blocking,
    ) -> Vec<f32> {
        let mut y = vec![f32::NAN; p.m * p.n];
        let p = Gemm {
            y: SyncPtr(y.as_mut_ptr()),
            ..*p
        };
        // SAFETY: the callers pass tiles that run here (emulated ones, or the instruction where
        // `dpbf16::usable()`), AVX-512 only where the CPU has it; lengths match.
        unsafe { gemm_blocked(par, &p, make, avx512, bl) };
        y
    }

    /// The emulated AMX tiles' result for row-major weights, after checking the panel layout gives the
    /// same bits.
    fn run(par: &dyn Parallel, p: &Gemm<'_>) -> Vec<f32> {
        let y = run_on(par, p, &Emu::new, false, Blocking::DEFAULT);
        let Weights::RowMajor(w) = p.w else {
            unreachable!()
        };
        let PanelWeight::Bf16 { data, .. } = PanelWeight::from_bf16(w, p.n, p.k) else {
            unreachable!()
        };
        let panels = p.with_weights(Weights::Panels(&data));
        let yp = run_on(par, &panels, &Emu::new, false, Blocking::DEFAULT);
        assert!(
            y.iter().zip(&yp).all(|(a, b)| a.to_bits() == b.to_bits()),
            "panels differ from rows"
        );
        y
    }

    /// `got` within float32 summation error of the float64 `want` (k roundings of partial sums
    /// bounded by sum |x w| <= k).
    fn assert_close(got: &[f32], want: &[f64], k: usize, what: &str) {
        let tol = 2.0 * k as f64 * f32::EPSILON as f64;
        for (i, (&g, &r)) in got.iter().zip(want).enumerate() {
            assert!((g as f64 - r).abs() <= tol, "{what} [{i}]: {g} vs {r}");
        }
    }

    /// Every shape edge (1, 15, 33 rows; n not a multiple of 32; k not a multiple of 32) against
    /// float64, within float32 summation error: the split loses nothing.
    #[test]
    fn emulated_tiles_match_float64_over_awkward_shapes() {
        for (seed, &(m, k, n)) in [
            (1, 32, 16),
            (15, 63, 33),
            (33, 65, 65),
            (64, 96, 32),
            (40, 200, 97),
            (33, 2048, 40), // rows 4 KB apart: the split's rows are padded (ld > kp)
        ]
        .iter()
        .enumerate()
        {
            let d = Data::new(7 + seed as u64, (m, k, n), false);
            for bias in [false, true] {
                let p = d.gemm(bias);
                for par in [&Serial as &dyn Parallel, &ScopedThreads(3)] {
                    assert_close(&run(par, &p), &reference(&p), k, &format!("m{m} k{k} n{n}"));
                }
            }
        }
    }

    /// Any blocking gives the same bits: k in chunks whose sums go through memory, columns and rows in
    /// chunks (equal or not), on row-major weights and panels, one and several threads.
    #[test]
    fn every_blocking_gives_the_same_bits() {
        let d = Data::new(13, (70, 200, 100), false);
        let p = d.gemm(true);
        let whole = Blocking {
            nc: 1 << 20,
            mc: 1 << 20,
            kc: 1 << 20,
        };
        let go = |bl: Blocking, par: &dyn Parallel| run_on(par, &p, &Emu::new, false, bl);
        let want = go(whole, &Serial);
        for bl in [
            Blocking::DEFAULT,
            Blocking {
                nc: 32,
                mc: 32,
                kc: 32,
            },
            Blocking {
                nc: 64,
                mc: 64,
                kc: 96,
            },
            Blocking {
                nc: 96,
                mc: 32,
                kc: 64,
            },
        ] {
            for par in [&Serial as &dyn Parallel, &ScopedThreads(3)] {
                let y = go(bl, par);
                assert!(
                    y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{bl:?} differs"
                );
            }
        }
    }

    /// The AVX512-BF16 tiles (`vdpbf16ps`) over awkward shapes: the emulation of the instruction (any
    /// AVX-512 CPU) within float32 summation error of float64, and the instruction itself (where the CPU
    /// has it) bit for bit equal to its emulation, bf16 activations and float32 ones (three pieces).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn dpbf16_tiles_match_their_emulation_and_float64() {
        use crate::amx::dpbf16::{self, Dpbf16, Emulated, Real};
        if !crate::isa::Isa::Avx512.cpu_has() {
            return;
        }
        for (seed, &(m, k, n, bf16_x)) in [
            (32, 64, 32, true),
            (33, 65, 65, true),
            (40, 200, 97, false),
            (64, 96, 16, true),
            (35, 2048, 40, true),
        ]
        .iter()
        .enumerate()
        {
            let d = Data::new(5 + seed as u64, (m, k, n), bf16_x);
            let p = d.gemm(true);
            let par = ScopedThreads(2);
            let bl = Blocking::DEFAULT;
            let emulated = run_on(&par, &p, &Dpbf16::<Emulated>::new, true, bl);
            assert_close(&emulated, &reference(&p), k, &format!("m{m} k{k} n{n}"));
            if dpbf16::usable() {
                let real = run_on(&par, &p, &Dpbf16::<Real>::new, true, bl);
                assert!(
                    real.iter()
                        .zip(&emulated)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "m{m} k{k} n{n}: vdpbf16ps differs from its emulation"
                );
            }
        }
    }

    /// A GEMM with bf16 activations equals one with their float32 widening bit for bit (one pass
    /// either way), and inf in x reaches y as inf.
    #[test]
    fn bf16_activations_and_infinities() {
        let mut d = Data::new(3, (40, 96, 48), true);
        let (k, n) = (d.k, d.n);
        // Weights >= 0 here: inf times a positive weight is inf, times zero NaN, as in float32.
        d.w.iter_mut().for_each(|v| *v &= 0x7fff);
        let p = d.gemm(false);
        assert_close(&run(&Serial, &p), &reference(&p), k, "bf16 x");
        d.x[5 * k + 3] = f32::INFINITY;
        let y = run(&Serial, &d.gemm(false));
        for j in 0..n {
            let got = y[5 * n + j];
            if d.w[j * k + 3] != 0 {
                assert_eq!(got, f32::INFINITY, "column {j}");
            } else {
                assert!(got.is_nan(), "column {j}: {got}");
            }
        }
        assert!(y[6 * n..].iter().all(|v| v.is_finite()));
    }
}
