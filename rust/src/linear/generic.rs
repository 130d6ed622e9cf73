//! Portable scalar tier of `linear`, and the test oracle for the SIMD tiers.
//!
//! Numerical contract: each y element is an f32 dot product accumulated in 8 interleaved
//! partial sums (lane l takes kk % 8 == l, like an 8-wide SIMD register; the fixed layout lets
//! LLVM vectorize it on any target), combined pairwise, then the k % 8 tail in order, then the
//! bias. Plain multiply + add, no fused multiply-add: FMA is not in every baseline target.

use std::ops::Range;

use super::{Problem, Weight};
use crate::bf16::bf16_slice_to_f32;
use crate::scratch::with_scratch;

/// Blocking constants (only used by the dispatcher to align task splits).
pub const MR: usize = 4;
pub const NR: usize = 16;
/// GEMV and GEMM are the same loop here; the dispatcher's choice does not matter.
pub const GEMV_MAX_M: usize = 8;

/// Dot product of two equally long f32 slices (see the module contract for the order).
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let (ac, at) = a.as_chunks::<8>();
    let (bc, bt) = b.as_chunks::<8>();
    let mut acc = [0.0f32; 8];
    for (x, w) in ac.iter().zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * w[l];
        }
    }
    // Same pairing as the SIMD horizontal sums: (0+4, 2+6) and (1+5, 3+7).
    let mut s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (x, w) in at.iter().zip(bt) {
        s += x * w;
    }
    s
}

/// Fills y[rows x cols]. Each weight row is read (and widened) once, then dotted with every x
/// row in `rows`.
///
/// # Safety
/// `p` must satisfy the `linear` length contract (x: m*k, w: n*k, bias: n, y points at m*n
/// f32s), `rows`/`cols` must lie within m/n, and no other thread may access the tile of y
/// concurrently.
pub unsafe fn gemv(p: &Problem<'_>, rows: Range<usize>, cols: Range<usize>) {
    debug_assert!(rows.end <= p.m && cols.end <= p.n, "tile outside y");
    let k = p.k;
    with_scratch(k, |wrow_buf| {
        for j in cols {
            let wrow: &[f32] = match p.w {
                Weight::F32(w) => &w[j * k..(j + 1) * k],
                Weight::Bf16(w) => {
                    bf16_slice_to_f32(&w[j * k..(j + 1) * k], wrow_buf);
                    wrow_buf
                }
            };
            let b = p.bias.map_or(0.0, |b| b[j]);
            for i in rows.clone() {
                let v = dot(&p.x[i * k..(i + 1) * k], wrow) + b;
                // SAFETY: i < m and j < n (caller contract), so i*n + j is inside y's m*n
                // elements, and this task exclusively owns the (rows, cols) tile.
                unsafe { *p.y.0.add(i * p.n + j) = v };
            }
        }
    });
}

/// Same as `gemv`: the scalar tier has no separate compute-bound path.
///
/// # Safety
/// Same contract as [`gemv`].
pub unsafe fn gemm(p: &Problem<'_>, rows: Range<usize>, cols: Range<usize>) {
    debug_assert!(rows.end <= p.m && cols.end <= p.n, "tile outside y");
    // SAFETY: identical contract, forwarded unchanged.
    unsafe { gemv(p, rows, cols) }
}
