//! The super-block formats' linear (Q4K, Q6K, Q6K16; layout in `kblock`) over activations quantized per 32
//! values (`quantize_block`): one driver (`run`) for every tier; a tier brings its header unpacking, its
//! code unpacking and its row tiles (`Kernels`). The nibble formats' prompts (Q4, Q40, Q50) run here too,
//! their 32-value blocks eight to a super-block, in Q4K's form (`ds` = d, `dm` = -m or z d).
//!
//! Numerical contract, for activation row i, output j and sub-block s (dx, sx the activations' scale
//! and code sum there, q their codes; ds = d * sc and dm = dmin * mc the weights' sub-block scale and
//! min, exact in f32: an f16 times an integer below 2^8):
//! - Q4K: dot = sum c * q (exact i32), `y = fma(fma(ds, f32(dot), -(dm * sx)), dx, y)`;
//! - Q6K (codes u = c + 32 stored unsigned): dot = sum u * q, `y = fma(ds, (f32(dot) - 32 sx) * dx, y)`
//!   (`f32(dot) - 32 sx` exact: integers below 2^24);
//! - Q6K16 (Q6K's codes, a scale per 16 values: ds = d * sc_a for the sub-block's first 16, dm = d * sc_b
//!   for its last 16): dot_a, dot_b the halves' sums, sa the first 16 activation codes' sum and sb = sx -
//!   sa (exact), `y = fma(ds, (f32(dot_a) - 32 sa) * dx, y)`, then `y = fma(dm, (f32(dot_b) - 32 sb) *
//!   dx, y)`.
//!
//! y starts at zero, takes the sub-blocks in k order, then the bias. Every step is an exact integer sum
//! or one correctly rounded float operation in a fixed order, so every tier, every tile shape and every
//! split across threads gives the same bits as the scalar reference (`generic::tile`): a row's result
//! never depends on the rows beside it (the server's exactness).
//!
//! The scalar, AVX-512 VNNI, AVX-VNNI and AMX-INT8 (`amx.rs`: `tdpbsud` per sub-block) tiers run this path
//! (Q6K16: all but AMX, whose CPUs run it on the AVX-512 tiles; the AVX2 tier runs it on the AVX-VNNI
//! tiles over the exact `vpdpbusd` emulation). The AVX2 tier keeps its own tiles
//! (`quant/avx2.rs`, `quant/avx2_rows.rs`), whose Q4K order (the integer scale inside the widening
//! `vpmaddwd`, d once per super-block) measured 10-25 % faster on AVX2 than this contract's.
//!
//! Why not one activation scale per 256 values with integer sums across the super-block (llama.cpp's
//! Q8_K; two fewer float operations per sub-block and row; commit 938eb4b): measured with the quality tool (20 chunks of
//! real text), int4 cost +3.07 % perplexity on the real SmolLM2-135M (+1.99 % per 32) and +14.25 % on the
//! real Gemma 3 270M (+13.26 %), past issue 30's +0.1 percentage point bar (benchmarks/HISTORY.md).
//!
//! The driver walks a task's rows in L2-sized blocks and, for each, its panels in groups of
//! `Kernels::panels` (1 below `Kernels::min_rows` rows). From `min_rows` rows it goes super-block by
//! super-block: each panel's super-block is unpacked once into L1, its header (`d * sc`, `dmin * mc`
//! per sub-block, `Hdr`) and its codes (whole bytes, 4 KB), so every row tile reads them without
//! unpacking nibbles and scales again (y in scratch between super-blocks; the next super-block prefetched
//! while the rows compute). Below that (decode steps) each tile reads a panel's packed bytes whole, y in
//! registers throughout, and prefetches the next super-block a few lines per sub-block.

use std::ops::Range;

use super::acts::TILE_ROWS;
use super::kblock::{sub_scales, super_bytes, Layout, SUBS, SUPER};
use super::{store, Format, Job, QPANEL, QSUB};
use crate::hint::prefetch;
use crate::scratch::with_scratch;

pub(super) mod amx;
#[cfg(target_arch = "x86_64")]
pub(super) mod avx512;
pub(super) mod generic;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86;
#[cfg(target_arch = "x86_64")]
#[macro_use]
pub(super) mod vnni;

/// One panel's super-block header, widened for the tiles (64-byte aligned, in L1 scratch).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Hdr {
    /// Sub-block s's d * sc per row (sub-blocks past t are zero).
    pub ds: [[f32; QPANEL]; SUBS],
    /// Sub-block s's dmin * mc per row (Q6K: zero; Q6K16: d * sc_b, its second 16 values' scale).
    pub dm: [[f32; QPANEL]; SUBS],
}

/// Bytes of a `Hdr`.
pub(crate) const HDR_BYTES: usize = std::mem::size_of::<Hdr>();
/// Bytes of a panel's unpacked codes: sub-block s, group v of 4 k: 16 rows x 4 codes at `s * 512 + v * 64
/// + 4 r` (the order `vpdpbusd` and `vpmaddubsw` read a broadcast of 4 activation codes against).
pub(crate) const CODES_BYTES: usize = SUBS * 8 * 64;

/// What a row tile computes: rows `i0..` (as many as it takes) against `panels` panels over super-blocks
/// `blocks`, adding into y (one super-block at a time from unpacked codes; a panel's whole row from packed
/// bytes, y in registers throughout).
pub(crate) struct Tile<'a> {
    pub job: &'a Job<'a>,
    pub lay: Layout,
    pub blocks: Range<usize>,
    /// `panels` unpacked headers, one after another (unpacked codes only).
    pub hdr: *const Hdr,
    /// Panel 0's packed super-block 0, or its unpacked codes (`CODES_BYTES`).
    pub src: *const u8,
    /// Bytes from one panel's codes to the next.
    pub stride: usize,
    pub packed: bool,
    pub panels: usize,
    /// The tile's first row, and the end of the rows it may take.
    pub i0: usize,
    pub end: usize,
    /// Row i0's y (16 per panel); rows `ystride` f32s apart.
    pub y: *mut f32,
    pub ystride: usize,
}

impl Tile<'_> {
    /// Rows left from i0.
    #[inline(always)]
    pub fn left(&self) -> usize {
        self.end - self.i0
    }

    /// Panel 0's bytes of super-block b: its packed super-block, or the unpacked codes.
    #[inline(always)]
    pub unsafe fn block(&self, b: usize) -> *const u8 {
        if self.packed {
            self.src.add(self.lay.at(0, b))
        } else {
            self.src
        }
    }

    /// Row i0 + r's codes of super-block b.
    #[inline(always)]
    pub unsafe fn x(&self, r: usize, b: usize) -> *const i8 {
        let k = self.job.w.k();
        self.job.acts.q.as_ptr().add((self.i0 + r) * k + b * SUPER)
    }

    /// The tile's rows in the tiled layout (`QActs::tile_rows`) at super-block b's first 32-block: codes
    /// (row r of 32-block s at `32 * (s * M + r)`), scales and sums (at `s * M + r`), for a tile of M rows
    /// that are a whole group of that layout (i0 a multiple of `TILE_ROWS`). One row's layout is its own.
    ///
    /// # Safety
    /// The caller filled the tiled layout for the job's rows (`Kernels::needs_tiled`), or m = 1.
    #[inline(always)]
    pub unsafe fn tiled<const M: usize>(&self, b: usize) -> (*const i8, *const f32, *const f32) {
        let (a, k) = (self.job.acts, self.job.w.k());
        let nsub = k / QSUB;
        debug_assert!(
            self.i0.is_multiple_of(TILE_ROWS) && M == TILE_ROWS.min(self.job.m - self.i0)
        );
        let u = self.i0 * nsub + b * SUBS * M;
        if self.job.m == 1 {
            return (
                a.q.as_ptr().add(u * QSUB),
                a.d.as_ptr().add(u),
                a.s.as_ptr().add(u),
            );
        }
        (
            a.tiled.as_ptr().add(u * QSUB),
            a.tiled_d.as_ptr().add(u),
            a.tiled_s.as_ptr().add(u),
        )
    }

    /// Row i0 + r's activation scale and code sum of sub-block s of super-block b.
    #[inline(always)]
    pub unsafe fn scale_sum(&self, r: usize, b: usize, s: usize) -> (f32, f32) {
        let nsub = self.job.w.k() / QSUB;
        let at = (self.i0 + r) * nsub + b * SUBS + s;
        let a = self.job.acts;
        (*a.d.as_ptr().add(at), *a.s.as_ptr().add(at))
    }

    /// Row i0 + r's sum of the first 16 activation codes of sub-block s of super-block b (Q6K16's first
    /// half), exact in f32.
    #[inline(always)]
    pub unsafe fn half_sum(&self, r: usize, b: usize, s: usize) -> f32 {
        let x = std::slice::from_raw_parts(self.x(r, b).add(s * QSUB), QSUB / 2);
        x.iter().map(|&c| c as i32).sum::<i32>() as f32
    }

    /// For a tile on packed bytes, before sub-block s of super-block b (of t sub-blocks): prefetches, in
    /// every panel, the bytes `AHEAD` full super-blocks after this sub-block's codes (and before the
    /// first, after the header): a later super-block's, or past a short last one the next panel's. Decode
    /// steps stream their weights through here, a few lines at a time (a whole super-block's lines at
    /// once, and any arithmetic per prefetch, measured slower).
    #[inline(always)]
    pub unsafe fn prefetch_next(&self, b: usize, s: usize, t: usize) {
        let f = self.job.w.format;
        let full = f.block_bytes();
        let lines = if f == Format::Q4K { 4 } else { 6 };
        for p in 0..self.panels {
            let blk = self.block(b).wrapping_add(p * self.stride);
            // Past the matrix's end harmless hints (wrapping_add: no pointer arithmetic past it).
            if s == 0 {
                prefetch(blk.wrapping_add(AHEAD * full), 4 * 64);
            }
            let cp = blk.wrapping_add(Layout::codes_at(f, t, s) + AHEAD * full);
            prefetch(cp, lines * 64);
        }
    }
}

/// Super-blocks ahead that a packed tile prefetches. One (2.3 KB of a q4k panel) is about one DRAM
/// latency of a 1-row step's stream; two measured better on an AMD EPYC Zen 5 (SmolLM2-135M int4 shape,
/// both in one process, alternating: 1-row step medians 3.86 -> 3.58 and 3.51 -> 2.91 ms, 8-row steps
/// unchanged within the host's noise); three no better.
const AHEAD: usize = 2;

/// Unpacks a panel's packed super-block (format, its bytes, sub-blocks) into a header or codes.
pub(crate) type HeaderFn = unsafe fn(Format, *const u8, usize, *mut Hdr);
pub(crate) type CodesFn = unsafe fn(Format, *const u8, usize, *mut u8);
/// A row tile; returns the rows it did (at least one).
pub(crate) type TileFn = unsafe fn(&Tile<'_>) -> usize;

/// A tier's part of the path.
pub(crate) struct Kernels {
    pub header: HeaderFn,
    pub codes: CodesFn,
    pub tile: TileFn,
    /// Rows from which codes are unpacked once per panel.
    pub min_rows: usize,
    /// Panels per unpacked group.
    pub panels: usize,
    /// Whether the packed tiles read the activations' tiled layout (`QActs::tile_rows`).
    pub tiled: bool,
}

impl Kernels {
    /// Whether a call of m rows reads the tiled layout, which its caller then fills (`QActs::tile_rows`)
    /// after quantizing: packed tiles of this tier, two rows or more.
    pub(crate) fn needs_tiled(&self, m: usize) -> bool {
        self.tiled && (2..self.min_rows).contains(&m)
    }
}

/// The job's panels `panels` of a Q4K, Q6K or Q6K16 matrix (see the module's contract).
///
/// # Safety
/// The CPU runs `kernels`' functions; `job` satisfies `quant_linear`'s contract with a Q4K or Q6K matrix
/// and super-block activations; no other thread writes these panels' columns.
pub(crate) unsafe fn run(kernels: &Kernels, job: &Job<'_>, panels: Range<usize>) {
    let (w, m) = (job.w, job.m);
    let f = w.format;
    let lay = Layout::new(f, w.k());
    let unpack = m >= kernels.min_rows;
    if kernels.needs_tiled(m) {
        let filled =
            job.acts.tiled.len() >= m * w.k() && job.acts.tiled_d.len() >= m * w.k() / QSUB;
        assert!(
            filled,
            "superblock::run: the tiled activations were not filled (QActs::tile_rows)"
        );
    }
    let pmax = if unpack { kernels.panels } else { 1 };
    if unpack {
        UNPACKED_PANELS.with(|c| c.set(c.get() + panels.len()));
    }
    let block = row_block(w.k()).min(m);
    let hdr_floats = pmax * HDR_BYTES / 4;
    let code_floats = if unpack { pmax * CODES_BYTES / 4 } else { 0 };
    let ystride = pmax * QPANEL;
    with_scratch(hdr_floats + code_floats + block * ystride, |buf| {
        let (head, y) = buf.split_at_mut(hdr_floats + code_floats);
        let hdr = head.as_mut_ptr().cast::<Hdr>();
        let ubuf = head.as_mut_ptr().add(hdr_floats).cast::<u8>();
        // y through one raw pointer: the tiles write it, the stores below read it.
        let yp = y.as_mut_ptr();
        let data = w.data().as_ptr();
        // Row blocks outermost: a block's activations stay in L2 while every panel reads them (a
        // prompt's whole activations do not), and its output rows are written panel after panel.
        for r0 in (0..m).step_by(block) {
            let rows = r0..(r0 + block).min(m);
            let mut p0 = panels.start;
            while p0 < panels.end {
                let np = pmax.min(panels.end - p0);
                std::ptr::write_bytes(yp, 0, rows.len() * ystride);
                let tiles = |blocks: Range<usize>, src: *const u8, stride: usize| {
                    let mut i0 = rows.start;
                    while i0 < rows.end {
                        let tile = Tile {
                            job,
                            lay,
                            blocks: blocks.clone(),
                            hdr,
                            src,
                            stride,
                            packed: !unpack,
                            panels: np,
                            i0,
                            end: rows.end,
                            y: yp.add((i0 - r0) * ystride),
                            ystride,
                        };
                        i0 += (kernels.tile)(&tile);
                    }
                };
                if unpack {
                    for b in 0..lay.blocks() {
                        let t = lay.subs(b);
                        for j in 0..np {
                            let blk = data.add(lay.at(p0 + j, b));
                            (kernels.header)(f, blk, t, hdr.add(j));
                            (kernels.codes)(f, blk, t, ubuf.add(j * CODES_BYTES));
                            // The next super-block, fetched while the rows compute on this one.
                            prefetch(blk.wrapping_add(super_bytes(f, t)), f.block_bytes());
                        }
                        tiles(b..b + 1, ubuf, CODES_BYTES);
                    }
                } else {
                    // Few rows: each tile reads the packed panel whole (y in registers throughout).
                    tiles(0..lay.blocks(), data.add(lay.at(p0, 0)), lay.panel_bytes);
                }
                for i in rows.clone() {
                    for j in 0..np {
                        let at = yp.add((i - r0) * ystride + j * QPANEL);
                        // SAFETY (both): `at` is this row's panel of the L1 sums, QPANEL floats.
                        if !(unpack && store_stream(job, i, p0 + j, at)) {
                            store(job, i, p0 + j, &*at.cast::<[f32; QPANEL]>());
                        }
                    }
                }
                p0 += np;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if unpack {
            // The streamed stores are weakly ordered: fence them before the task reports done.
            std::arch::x86_64::_mm_sfence();
        }
    });
}

/// A whole panel of row i without bias, 16-byte aligned: stored past the caches (no read for ownership
/// of lines the prompt only writes). Returns false where it does not apply.
#[inline(always)]
unsafe fn store_stream(job: &Job<'_>, i: usize, p: usize, sums: *const f32) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let n = job.w.n;
        let j0 = p * QPANEL;
        let dst = job.y.get().add(i * n + j0);
        if job.bias.is_some() || j0 + QPANEL > n || !(dst as usize).is_multiple_of(64) {
            return false;
        }
        use std::arch::x86_64::*;
        // SAFETY: dst..dst+QPANEL lies in row i of y (checked above) and is 16-byte aligned; SSE is
        // baseline on x86_64.
        for c in 0..4 {
            _mm_stream_ps(dst.add(4 * c), _mm_loadu_ps(sums.add(4 * c)));
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Rows per block of `run`: as many as keep their activation codes within about 256 KB of L2 (k bytes
/// each), at least 96 (a whole number of 6- and 8-row tiles), so that unpacking a super-block once
/// per block stays a few percent of the block's work.
fn row_block(k: usize) -> usize {
    ((256 << 10) / k).max(96) / 24 * 24
}

thread_local! {
    /// Panels this thread ran with unpacked codes (tests prove the many-rows path ran with it).
    static UNPACKED_PANELS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Panels the calling thread has run through the unpacked-codes path of the super-block formats.
pub(crate) fn unpacked_panels_run() -> usize {
    UNPACKED_PANELS.with(std::cell::Cell::get)
}

/// The header of a packed super-block, from `kblock`'s accessors: the reference the SIMD unpacking
/// matches (and the scalar tier's).
///
/// # Safety
/// `blk` holds a packed super-block of `f` with `t` sub-blocks; `h` is writable.
pub(crate) unsafe fn header_ref(f: Format, blk: *const u8, t: usize, h: *mut Hdr) {
    let blk = std::slice::from_raw_parts(blk, super_bytes(f, t));
    let mut o = Hdr {
        ds: [[0.0; QPANEL]; SUBS],
        dm: [[0.0; QPANEL]; SUBS],
    };
    for r in 0..QPANEL {
        for s in 0..t {
            (o.ds[s][r], o.dm[s][r]) = sub_scales(f, blk, t, s, r);
        }
    }
    h.write(o);
}

/// The codes of a packed super-block as whole bytes in the unpacked layout (`CODES_BYTES`), from
/// `kblock::code`: the reference the SIMD unpacking matches.
///
/// # Safety
/// As `header_ref`; `out` holds `CODES_BYTES`.
pub(crate) unsafe fn codes_ref(f: Format, blk: *const u8, t: usize, out: *mut u8) {
    let blk = std::slice::from_raw_parts(blk, super_bytes(f, t));
    let out = std::slice::from_raw_parts_mut(out, CODES_BYTES);
    for s in 0..t {
        for kk in 0..QSUB {
            for r in 0..QPANEL {
                out[s * 512 + (kk / 4) * 64 + 4 * r + kk % 4] =
                    super::kblock::code(f, blk, t, s, r, kk);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{quantize, QuantOptions, QuantWeight};

    /// Packed super-blocks of both formats, whole and short (k = 576: 2 whole, a tail of 2 sub-blocks;
    /// k = 224: a tail of 7), with random scales: the AVX2 unpacking gives the reference's header and
    /// codes exactly.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn simd_unpacking_equals_the_reference() {
        if !crate::isa::Isa::Avx2.is_supported() {
            return;
        }
        let mut seed = 7u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 4.0
        };
        for f in [
            Format::Q4K,
            Format::Q6K,
            Format::Q6K16,
            Format::Q4,
            Format::Q40,
            Format::Q50,
        ] {
            for k in [576usize, 224] {
                let n = 20;
                let v: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
                let opt = QuantOptions {
                    format: f,
                    importance: None,
                    threads: 1,
                };
                let w = QuantWeight::pack(&quantize(&v, n, k, &opt).unwrap());
                let lay = Layout::new(f, k);
                for p in 0..2 {
                    for b in 0..lay.blocks() {
                        let (t, blk) = (lay.subs(b), w.data()[lay.at(p, b)..].as_ptr());
                        // SAFETY: blk is a packed super-block of t sub-blocks; the outputs are locals.
                        unsafe {
                            let (mut want, mut got) = (std::mem::zeroed(), std::mem::zeroed());
                            header_ref(f, blk, t, &mut want);
                            x86::header(f, blk, t, &mut got);
                            assert_eq!(got, want, "{f:?} k={k} panel {p} super-block {b}: header");
                            // 64-byte aligned, as the driver's scratch (the SIMD stores need 32).
                            #[repr(align(64))]
                            struct Codes([u8; CODES_BYTES]);
                            let (mut want, mut got) =
                                (Codes([0; CODES_BYTES]), Codes([1; CODES_BYTES]));
                            codes_ref(f, blk, t, want.0.as_mut_ptr());
                            x86::codes(f, blk, t, got.0.as_mut_ptr());
                            let used = t * 512;
                            assert_eq!(
                                got.0[..used],
                                want.0[..used],
                                "{f:?} k={k} panel {p} super-block {b}: codes"
                            );
                        }
                    }
                }
            }
        }
    }
}
