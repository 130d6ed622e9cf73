//! One slot's K and V values in the cache's format (`KvFormat`): float32, bf16, or int8 codes with one
//! f32 scale per row of `head_dim` values (one head at one position). Offsets are in values; a row's
//! scale sits at its offset / head_dim.
//!
//! Numerical contract: f32 rows are stored as given; bf16 rows rounded to nearest even; an int8 row is
//! `scale = max|x| / 127`, `code = round(x / scale)` (a zero row: scale 0, codes 0), read back as
//! `scale * code` (`attention::KvView`). Moves and copies keep the stored bits.

use std::ops::Range;

use super::kv_q8;
use super::recipe::KvFormat;
use crate::attention::{KvView, View4};
use crate::bf16::{f32_to_bf16, Bf16};
use crate::isa::Isa;

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

    /// Stores the row `x` at offset `at` (a multiple of `x.len()`); `isa` picks the int8 quantizer's
    /// tier (every tier gives the same bits: `kv_q8`).
    pub fn write_row(&mut self, isa: Isa, at: usize, x: &[f32]) {
        let d = x.len();
        match self {
            KvStore::F32(v) => v[at..at + d].copy_from_slice(x),
            KvStore::Bf16(v) => {
                for (o, &y) in v[at..at + d].iter_mut().zip(x) {
                    *o = Bf16(f32_to_bf16(y));
                }
            }
            KvStore::Q8 { codes, scales } => {
                scales[at / d] = kv_q8::quantize_row(isa, x, &mut codes[at..at + d]);
            }
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
