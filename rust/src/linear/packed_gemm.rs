//! The BLIS-style loop nest shared by the SIMD GEMM tiers: for each NC column block and KC k block,
//! pack the weight panels (NR columns each, widened to f32) into scratch, then run the tier's
//! MR x NR microkernel over every row tile of each MC row block. Tiers differ only in their blocking
//! constants and microkernel.
//!
//! Numerical contract: each KC block's partial sum is added to y in k order (the first block
//! overwrites y), and the bias is added once, with the last block.

use std::ops::Range;

use super::pack::PanelAt;
use super::pack_avx2::pack_panel;
use super::Problem;
use crate::scratch::with_scratch;

/// Operands of one microkernel call.
pub(super) struct Tile {
    pub kc: usize,
    /// x at (first row of the tile, first k of the block); rows `lda` apart.
    pub a: *const f32,
    pub lda: usize,
    /// Packed panel `[kc][NR]`.
    pub b: *const f32,
    /// y at the tile's top-left element; rows `ldc` apart.
    pub c: *mut f32,
    pub ldc: usize,
    /// Columns of the tile that exist in y (the rest of the panel is zero padding).
    pub nvalid: usize,
    /// First k block: overwrite y instead of accumulating into it.
    pub first: bool,
    /// Bias at the tile's first column, or null when no bias is due (not the last k block).
    pub bias: *const f32,
}

/// A tier's blocking: register tile MR x NR, k block KC, row block MC (multiple of MR), column
/// block NC (multiple of NR).
pub(super) struct Blocking {
    pub mr: usize,
    pub nr: usize,
    pub kc: usize,
    pub mc: usize,
    pub nc: usize,
}

/// A tier's microkernel: y tile (+)= x[rows, kc] * panel[kc, NR] (+ bias) for `rows` <= MR rows.
pub(super) type Micro = unsafe fn(&Tile, usize);

/// Stamps a tier's GEMM entry from one text: its register tile `MR` x `NR` and `BLOCKING`, `gemm` (the
/// shared loop below with this tier's microkernel) and `micro_rows`, which picks the tier's
/// `micro::<M>` for each tile height listed (height 1 is the fallback arm). Expanded in the tier's
/// module, so `micro`, `Problem`, `Range` and `Tile` are that module's.
macro_rules! gemm_entry {
    (mr: $mr:literal, nr: $nr:literal, kc: $kc:literal, mc: $mc:literal, nc: $nc:literal,
     heights: $($rows:literal)+) => {
        /// GEMM register tile: MR x rows by NR weight columns.
        pub const MR: usize = $mr;
        pub const NR: usize = $nr;

        const BLOCKING: Blocking = Blocking {
            mr: MR,
            nr: NR,
            kc: $kc,
            mc: $mc,
            nc: $nc,
        };

        /// Fills y[rows x cols] with the shared packed GEMM loop and this tier's microkernel.
        ///
        /// # Safety
        /// Same contract as [`gemv`].
        pub unsafe fn gemm(p: &Problem<'_>, rows: Range<usize>, cols: Range<usize>) {
            packed_gemm(p, rows, cols, &BLOCKING, micro_rows);
        }

        /// The microkernel instance for a tile of `rows` (1..=MR) x rows.
        ///
        /// # Safety
        /// As for `micro`.
        unsafe fn micro_rows(t: &Tile, rows: usize) {
            match rows {
                $($rows => micro::<$rows>(t),)+
                _ => micro::<1>(t),
            }
        }
    };
}
pub(super) use gemm_entry;

/// The k loop every tier's microkernel opens with, stamped with the tier's intrinsics (so each tier
/// compiles its own copy, as before): for each of the tile's kc k steps, the panel's two vectors of
/// columns (`$lanes` apart) are loaded once and each of the `$m` x rows broadcasts its element
/// (`|$a| $splat`, given a pointer to it) into two FMAs. Evaluates to the `[[vector; 2]; $m]` sums.
macro_rules! micro_k_loop {
    ($t:expr, $m:expr, $lanes:literal, $zero:ident, $load:ident, |$a:ident| $splat:expr, $fmadd:ident) => {{
        let mut acc = [[$zero(); 2]; $m];
        let mut b = $t.b;
        let mut a = $t.a;
        for _ in 0..$t.kc {
            let b0 = $load(b);
            let b1 = $load(b.add($lanes));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let $a = a.add(r * $t.lda);
                let av = $splat;
                acc_r[0] = $fmadd(av, b0, acc_r[0]);
                acc_r[1] = $fmadd(av, b1, acc_r[1]);
            }
            b = b.add(NR);
            a = a.add(1);
        }
        acc
    }};
}
pub(super) use micro_k_loop;

/// Fills y[rows x cols] with the packed GEMM loop.
///
/// # Safety
/// The CPU must run `micro` and the AVX2 packer; `p` must satisfy the `linear` length contract,
/// `rows`/`cols` must lie within m/n, and no other thread may write this tile of y.
pub(super) unsafe fn packed_gemm(
    p: &Problem<'_>,
    rows: Range<usize>,
    cols: Range<usize>,
    bl: &Blocking,
    micro: Micro,
) {
    debug_assert!(rows.end <= p.m && cols.end <= p.n, "tile outside y");
    let k = p.k;
    let panel_cap = bl.kc.min(k) * bl.nr;
    let buf_len = panel_cap * bl.nc.min(cols.len()).div_ceil(bl.nr);
    with_scratch(buf_len, |buf| {
        let mut jc = cols.start;
        while jc < cols.end {
            let nc = bl.nc.min(cols.end - jc);
            let panels = nc.div_ceil(bl.nr);
            let mut pc = 0;
            while pc < k {
                let kc = bl.kc.min(k - pc);
                for q in 0..panels {
                    let j0 = jc + q * bl.nr;
                    let dst = &mut buf[q * kc * bl.nr..(q + 1) * kc * bl.nr];
                    let at = PanelAt {
                        j0,
                        nvalid: bl.nr.min(jc + nc - j0),
                        p0: pc,
                        kc,
                        nr: bl.nr,
                    };
                    pack_panel(p.w, k, at, dst);
                }
                let first = pc == 0;
                let last = pc + kc == k;
                let mut ic = rows.start;
                while ic < rows.end {
                    let ie = rows.end.min(ic + bl.mc);
                    for q in 0..panels {
                        let j0 = jc + q * bl.nr;
                        let bias = match p.bias {
                            Some(bias) if last => bias.as_ptr().add(j0),
                            _ => std::ptr::null(),
                        };
                        let mut ir = ic;
                        while ir < ie {
                            let mr = bl.mr.min(ie - ir);
                            let t = Tile {
                                kc,
                                a: p.x.as_ptr().add(ir * k + pc),
                                lda: k,
                                b: buf.as_ptr().add(q * kc * bl.nr),
                                c: p.y.0.add(ir * p.n + j0),
                                ldc: p.n,
                                nvalid: bl.nr.min(jc + nc - j0),
                                first,
                                bias,
                            };
                            micro(&t, mr);
                            ir += mr;
                        }
                    }
                    ic = ie;
                }
                pc += kc;
            }
            jc += nc;
        }
    });
}
