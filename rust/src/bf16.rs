//! bf16 <-> f32 conversions and the `Element` trait for kernels generic over storage type.
//!
//! Contract: widening is exact (a bf16 is the upper half of an f32). Narrowing rounds to
//! nearest, ties to even, bit-for-bit like torch's `c10::BFloat16(float)`: every NaN becomes the
//! quiet NaN 0x7FC0, values past the largest bf16 round to ±inf, subnormals are kept (no flush).

use std::any::TypeId;

/// A bf16 value stored as its raw bits.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// Exact widening: the bf16 bits become the upper 16 bits of the f32.
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Round-to-nearest-even narrowing, identical to `c10::round_to_nearest_even`.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7FC0;
    }
    let u = x.to_bits();
    // Adding 0x7FFF rounds up when the dropped half is > 0x8000; the extra +1 when the kept
    // part is odd turns the exact tie into round-to-even. No u32 overflow: the largest non-NaN
    // pattern is 0xFF80_0000 (-inf).
    let rounding_bias = ((u >> 16) & 1) + 0x7FFF;
    ((u + rounding_bias) >> 16) as u16
}

/// Widens a slice. Written as a plain loop so LLVM vectorizes it for the baseline target.
pub fn bf16_slice_to_f32(src: &[u16], dst: &mut [f32]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "bf16_slice_to_f32: source has {} elements but destination {}",
        src.len(),
        dst.len()
    );
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16_to_f32(s);
    }
}

/// Narrows a slice with `f32_to_bf16` semantics (branch-free, so it vectorizes).
pub fn f32_slice_to_bf16(src: &[f32], dst: &mut [u16]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "f32_slice_to_bf16: source has {} elements but destination {}",
        src.len(),
        dst.len()
    );
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32_to_bf16(s);
    }
}

/// A storage type the kernels can read and write; all arithmetic happens in f32.
pub trait Element: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl Element for f32 {
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Element for Bf16 {
    #[inline]
    fn to_f32(self) -> f32 {
        bf16_to_f32(self.0)
    }
    #[inline]
    fn from_f32(x: f32) -> Self {
        Bf16(f32_to_bf16(x))
    }
}

/// An `Element` slice seen as its concrete storage, so kernels can pick a SIMD load path.
pub(crate) enum ElemSlice<'a, E> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
    /// A user-defined `Element`: converted element by element.
    Other(&'a [E]),
}

/// Identifies the storage type of `s` (a compile-time constant per instantiation).
pub(crate) fn classify<E: Element>(s: &[E]) -> ElemSlice<'_, E> {
    if TypeId::of::<E>() == TypeId::of::<f32>() {
        // SAFETY: E has the same TypeId as f32, so E *is* f32 and the slice is reinterpreted
        // with its own element type, length and lifetime.
        ElemSlice::F32(unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) })
    } else if TypeId::of::<E>() == TypeId::of::<Bf16>() {
        // SAFETY: E is Bf16, which is #[repr(transparent)] over u16: same size, alignment and
        // bit validity, so the slice can be viewed as u16 with the same length and lifetime.
        ElemSlice::Bf16(unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u16>(), s.len()) })
    } else {
        ElemSlice::Other(s)
    }
}
