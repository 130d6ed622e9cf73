//! Keys or values as a cache stores them (`KvView`), and their rows widened to f32 a chunk at a time.
//!
//! Formats: the query's element type (`Elem`, what the torch op passes), bf16 (a decoder's bf16 cache
//! beside f32 queries), and int8 codes with one f32 scale per row (a decoder's 8-bit cache: value = scale *
//! code). Numerical contract: widening is exact for `Elem` and bf16 (a bf16 is the top half of an f32);
//! an int8 row becomes `scale * code` in f32, one rounding per value.

use super::{Ops, View4};
use crate::bf16::{classify, Bf16, ElemSlice, Element};
use crate::hint::prefetch;

/// K or V in its stored format; every variant has dims [B, H, S, D].
#[derive(Clone, Copy, Debug)]
pub enum KvView<'a, E> {
    /// The queries' own element type.
    Elem(View4<'a, E>),
    /// bf16 rows.
    Bf16(View4<'a, Bf16>),
    /// int8 rows and their scales (`scales` dims [B, H, S, 1]).
    Q8 {
        codes: View4<'a, i8>,
        scales: View4<'a, f32>,
    },
}

impl<E: Element> KvView<'_, E> {
    pub fn dims(&self) -> [usize; 4] {
        match self {
            KvView::Elem(v) => v.dims,
            KvView::Bf16(v) => v.dims,
            KvView::Q8 { codes, .. } => codes.dims,
        }
    }

    /// Panics unless every row the dims address lies inside the data (and the scales match the codes).
    pub(crate) fn check(&self, name: &str) {
        match self {
            KvView::Elem(v) => v.check(name),
            KvView::Bf16(v) => v.check(name),
            KvView::Q8 { codes, scales } => {
                codes.check(name);
                assert!(
                    scales.dims[..3] == codes.dims[..3] && scales.dims[3] == 1,
                    "decode_attention: {name}'s scales have dims {:?}, expected [B, H, S, 1] of codes {:?}",
                    scales.dims,
                    codes.dims
                );
                scales.check(name);
            }
        }
    }

    /// True where the rows are bf16 as the queries are (the torch op's bf16 attention).
    pub(crate) fn is_bf16_elem(&self) -> bool {
        matches!(self, KvView::Elem(v) if matches!(classify(v.data), ElemSlice::Bf16(_)))
    }

    /// Asks for rows s0..s0 + n of (b, h), and an 8-bit cache's scales of them, to be brought into L1
    /// (hints only: rows past the view are skipped). A decode step reads each sequence's cache once per
    /// layer after the step's weight stream has pushed it out of every cache level, and the kernels'
    /// loads of a chunk's keys then waited on memory a block of keys at a time (`perf annotate` of an
    /// 8-sequence step: 72 % of `pv_q8`'s samples on its first V load, 32 % of `qk_q8`'s on a K load).
    pub(crate) fn prefetch(&self, b: usize, h: usize, s0: usize, n: usize) {
        let n = n.min(self.dims()[2].saturating_sub(s0));
        match self {
            KvView::Elem(v) => prefetch_rows(v, b, h, s0, n),
            KvView::Bf16(v) => prefetch_rows(v, b, h, s0, n),
            KvView::Q8 { codes, scales } => {
                prefetch_rows(codes, b, h, s0, n);
                prefetch_rows(scales, b, h, s0, n);
            }
        }
    }
}

/// `KvView::prefetch` of one view: each row's lines, or where rows are under a line apart the span
/// they cover.
fn prefetch_rows<T>(v: &View4<'_, T>, b: usize, h: usize, s0: usize, n: usize) {
    if n == 0 || v.dims[3] == 0 {
        return;
    }
    let size = std::mem::size_of::<T>();
    let (row, step) = (v.dims[3] * size, v.strides[2] * size);
    let first = v
        .data
        .as_ptr()
        .wrapping_add(v.offset(b, h, s0))
        .cast::<u8>();
    if step < 64 {
        prefetch(first, (n - 1) * step + row);
    } else {
        for i in 0..n {
            prefetch(first.wrapping_add(i * step), row);
        }
    }
}

/// Rows s0..s0+n of (b, h) as f32, with their row stride: borrowed in place when they are f32,
/// widened into `buf` (stride d) otherwise.
#[allow(clippy::too_many_arguments)]
pub(crate) fn kv_rows_f32<'r, E: Element>(
    ops: &Ops,
    kv: &KvView<'r, E>,
    b: usize,
    h: usize,
    s0: usize,
    n: usize,
    buf: &'r mut [f32],
) -> (&'r [f32], usize) {
    match kv {
        KvView::Elem(v) => rows_f32(ops, &classify(v.data), v, b, h, s0, n, buf),
        KvView::Bf16(v) => rows_f32(ops, &classify(v.data), v, b, h, s0, n, buf),
        KvView::Q8 { codes, scales } => {
            let d = codes.dims[3];
            for (i, dst) in buf[..n * d].chunks_exact_mut(d).enumerate() {
                let off = codes.offset(b, h, s0 + i);
                let scale = scales.data[scales.offset(b, h, s0 + i)];
                // SAFETY: `ops` belongs to an ISA the CPU supports (attend's contract); the
                // codes slice and dst both hold d values.
                unsafe { (ops.widen_q8)(&codes.data[off..off + d], scale, dst) };
            }
            (&buf[..n * d], d)
        }
    }
}

/// Rows s0..s0+n of (b, h) of a view of E as f32 (see `kv_rows_f32`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn rows_f32<'r, E: Element>(
    ops: &Ops,
    data: &ElemSlice<'r, E>,
    view: &View4<'_, E>,
    b: usize,
    h: usize,
    s0: usize,
    n: usize,
    buf: &'r mut [f32],
) -> (&'r [f32], usize) {
    let d = view.dims[3];
    let ld = view.strides[2];
    let off = view.offset(b, h, s0);
    match data {
        ElemSlice::F32(s) => (&s[off..off + (n - 1) * ld + d], ld),
        ElemSlice::Bf16(s) if ld == d => {
            // Contiguous rows: one call for the whole chunk.
            // SAFETY: `ops` belongs to an ISA the CPU supports (attend's contract).
            unsafe { (ops.widen_bf16)(&s[off..off + n * d], &mut buf[..n * d]) };
            (&buf[..n * d], d)
        }
        ElemSlice::Bf16(s) => {
            for (i, dst) in buf[..n * d].chunks_exact_mut(d).enumerate() {
                let src = &s[off + i * ld..off + i * ld + d];
                // SAFETY: as above.
                unsafe { (ops.widen_bf16)(src, dst) };
            }
            (&buf[..n * d], d)
        }
        ElemSlice::Other(s) => {
            for (i, dst) in buf[..n * d].chunks_exact_mut(d).enumerate() {
                for (o, x) in dst.iter_mut().zip(&s[off + i * ld..off + i * ld + d]) {
                    *o = x.to_f32();
                }
            }
            (&buf[..n * d], d)
        }
    }
}
