//! One slot's K and V values in the cache's format (`KvFormat`): float32, bf16, or int8 codes with one
//! f32 scale per row of `head_dim` values (one head at one position). Offsets are in values; a row's
//! scale sits at its offset / head_dim.
//!
//! Numerical contract: f32 rows are stored as given; bf16 rows rounded to nearest even; an int8 row is
//! `scale = max|x| / 127`, `code = round(x / scale)` (a zero row: scale 0, codes 0), read back as
//! `scale * code` (`attention::KvView`). Moves and copies keep the stored bits.

use std::marker::PhantomData;
use std::ops::Range;

use super::recipe::KvFormat;
use crate::attention::{KvView, View4};
use crate::bf16::{f32_to_bf16, Bf16};
use crate::hint::prefetch;
use crate::isa::Isa;
use crate::par::SyncPtr;
use crate::quant::row_q8;

/// Values whose all-zero bit pattern is a valid zero (what `zeroed` may hand out).
trait ZeroBits: Copy {}
impl ZeroBits for f32 {}
impl ZeroBits for Bf16 {}
impl ZeroBits for i8 {}

/// `n` zeroed values from the allocator's zeroed path (fresh pages from the OS stay untouched, so a
/// slot costs memory only as far as its context is used), or None when the allocation fails.
fn zeroed<T: ZeroBits>(n: usize) -> Option<Vec<T>> {
    if n == 0 || std::mem::size_of::<T>() == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    // SAFETY: the layout has a non-zero size (n > 0, T not zero-sized).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if ptr.is_null() {
        return None;
    }
    // SAFETY: ptr was allocated by the global allocator with the layout of [T; n] (what a Vec<T> of
    // capacity n uses), and all n values are initialised: zero bits are a valid T (`ZeroBits`).
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

pub enum KvStore {
    F32(Vec<f32>),
    Bf16(Vec<Bf16>),
    Q8 { codes: Vec<i8>, scales: Vec<f32> },
}

impl KvStore {
    /// `n` zeroed values (rows of `d`) in `format`, or None when the memory is not there.
    pub fn zeroed(format: KvFormat, n: usize, d: usize) -> Option<KvStore> {
        Some(match format {
            KvFormat::F32 => KvStore::F32(zeroed(n)?),
            KvFormat::Bf16 => KvStore::Bf16(zeroed(n)?),
            KvFormat::Q8 => KvStore::Q8 {
                codes: zeroed(n)?,
                scales: zeroed(n / d.max(1))?,
            },
        })
    }

    /// A handle through which several threads may store disjoint rows at once (`RowWriter::write`).
    pub fn row_writer(&mut self) -> RowWriter<'_> {
        let raw = match self {
            KvStore::F32(v) => Raw::F32(SyncPtr(v.as_mut_ptr()), v.len()),
            KvStore::Bf16(v) => Raw::Bf16(SyncPtr(v.as_mut_ptr()), v.len()),
            KvStore::Q8 { codes, scales } => Raw::Q8 {
                codes: SyncPtr(codes.as_mut_ptr()),
                scales: SyncPtr(scales.as_mut_ptr()),
                len: codes.len(),
            },
        };
        RowWriter {
            raw,
            _store: PhantomData,
        }
    }

    /// Moves the rows of `src` (value offsets, whole rows of `d`) to start at `dst`.
    pub fn copy_within(&mut self, src: Range<usize>, dst: usize, d: usize) {
        match self {
            KvStore::F32(v) => v.copy_within(src, dst),
            KvStore::Bf16(v) => v.copy_within(src, dst),
            KvStore::Q8 { codes, scales } => {
                scales.copy_within(src.start / d..src.end / d, dst / d);
                codes.copy_within(src, dst);
            }
        }
    }

    /// Copies the rows of `range` (value offsets, whole rows of `d`) from `from`, same format.
    pub fn copy_from(&mut self, from: &KvStore, range: Range<usize>, d: usize) {
        match (self, from) {
            (KvStore::F32(a), KvStore::F32(b)) => a[range.clone()].copy_from_slice(&b[range]),
            (KvStore::Bf16(a), KvStore::Bf16(b)) => a[range.clone()].copy_from_slice(&b[range]),
            (
                KvStore::Q8 { codes, scales },
                KvStore::Q8 {
                    codes: c,
                    scales: s,
                },
            ) => {
                let rows = range.start / d..range.end / d;
                scales[rows.clone()].copy_from_slice(&s[rows]);
                codes[range.clone()].copy_from_slice(&c[range]);
            }
            _ => unreachable!("slots of one cache share its format"),
        }
    }

    /// The view from value offset `at` with `dims` [1, heads, keys, d] and `strides` (in values).
    pub fn view(&self, at: usize, dims: [usize; 4], strides: [usize; 4]) -> KvView<'_, f32> {
        match self {
            KvStore::F32(v) => KvView::Elem(View4 {
                data: &v[at..],
                dims,
                strides,
            }),
            KvStore::Bf16(v) => KvView::Bf16(View4 {
                data: &v[at..],
                dims,
                strides,
            }),
            KvStore::Q8 { codes, scales } => {
                let d = dims[3];
                KvView::Q8 {
                    codes: View4 {
                        data: &codes[at..],
                        dims,
                        strides,
                    },
                    scales: View4 {
                        data: &scales[at / d..],
                        dims: [dims[0], dims[1], dims[2], 1],
                        strides: [strides[0] / d, strides[1] / d, strides[2] / d, 1],
                    },
                }
            }
        }
    }
}

/// The store's buffers as raw pointers (and their lengths in values).
enum Raw {
    F32(SyncPtr<f32>, usize),
    Bf16(SyncPtr<Bf16>, usize),
    Q8 {
        codes: SyncPtr<i8>,
        scales: SyncPtr<f32>,
        len: usize,
    },
}

/// Stores rows into a `KvStore`, from several threads at once, each row at its own offset; holds the
/// store mutably borrowed while it lives.
pub struct RowWriter<'a> {
    raw: Raw,
    _store: PhantomData<&'a mut KvStore>,
}

impl RowWriter<'_> {
    /// Asks for the lines of the row of `d` values at offset `at` (and an int8 row's scale) to be
    /// brought into L1 before it is written: a hint, nothing is read or written (offsets past the store
    /// are skipped).
    pub fn prefetch(&self, at: usize, d: usize) {
        // The row's first byte, the bytes per value, and the store's length in values.
        let (row, size, len) = match &self.raw {
            Raw::F32(p, len) => (p.get().wrapping_add(at).cast::<u8>(), 4, *len),
            Raw::Bf16(p, len) => (p.get().wrapping_add(at).cast::<u8>(), 2, *len),
            Raw::Q8 { codes, len, .. } => (codes.get().wrapping_add(at).cast::<u8>(), 1, *len),
        };
        if d == 0 || at.checked_add(d).is_none_or(|e| e > len) {
            return;
        }
        prefetch(row, d * size);
        if let Raw::Q8 { scales, .. } = &self.raw {
            prefetch(scales.get().wrapping_add(at / d).cast(), 4);
        }
    }

    /// Stores the row `x` at offset `at` (a multiple of `x.len()`) in the store's format (the module's
    /// contract; `isa` picks the int8 quantizer's tier, the same bits on every tier). Panics (never UB)
    /// when the row does not fit.
    ///
    /// # Safety
    /// No other call may write or read the same row (offsets at..at + x.len()) while this one runs.
    pub unsafe fn write(&self, isa: Isa, at: usize, x: &[f32]) {
        let d = x.len();
        let len = match &self.raw {
            Raw::F32(_, len) | Raw::Bf16(_, len) | Raw::Q8 { len, .. } => *len,
        };
        assert!(
            d > 0 && at.checked_add(d).is_some_and(|e| e <= len),
            "kv row {at}+{d} outside the cache of {len} values"
        );
        match &self.raw {
            Raw::F32(p, _) => {
                // SAFETY: inside the buffer (asserted) and this row is ours alone (the caller's contract).
                let dst = std::slice::from_raw_parts_mut(p.get().add(at), d);
                dst.copy_from_slice(x);
            }
            Raw::Bf16(p, _) => {
                // SAFETY: as above.
                let dst = std::slice::from_raw_parts_mut(p.get().add(at), d);
                for (o, &y) in dst.iter_mut().zip(x) {
                    *o = Bf16(f32_to_bf16(y));
                }
            }
            Raw::Q8 { codes, scales, .. } => {
                // SAFETY: as above; the row's scale at at / d is its own (one scale per row of d).
                let dst = std::slice::from_raw_parts_mut(codes.get().add(at), d);
                *scales.get().add(at / d) = row_q8::quantize_row(isa, x, dst);
            }
        }
    }
}
