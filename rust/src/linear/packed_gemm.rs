//! The BLIS-style loop nest shared by the SIMD GEMM tiers: for each NC column block and KC k block,
//! pack the weight panels (NR columns each, widened to f32) into scratch, then run the tier's
//! MR x NR microkernel over every row tile of each MC row block. Tiers differ only in their blocking
//! constants and microkernel.
//!
//! Numerical contract: each KC block's partial sum is added to y in k order (the first block
//! overwrites y), and the bias is added once, with the last block.

use std::ops::Range;

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
                    pack_panel(p.w, k, j0, bl.nr.min(jc + nc - j0), pc, kc, bl.nr, dst);
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
