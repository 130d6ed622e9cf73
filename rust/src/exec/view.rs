//! Strided views over raw buffers ("slots") for the step executor: element types, the view
//! record the program encodes, row loads/stores with conversion, and the odometer that walks the
//! outer dims of several views at once.
//!
//! Numerical contract: loads widen exactly (bf16 -> f32 is exact; int64 and bool become f32
//! exactly for |x| < 2^24); stores round once (f32 -> bf16 round-to-nearest-even like torch,
//! f32 -> int64 truncates toward zero like torch's `.long()`, any value != 0 -> true).

use crate::bf16::{bf16_to_f32, f32_to_bf16};

/// Element types a view may hold (codes match `kwker_torch/planner.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    Bf16,
    I64,
    Bool,
}

impl DType {
    pub fn from_code(c: i64) -> Result<DType, String> {
        Ok(match c {
            0 => DType::F32,
            1 => DType::Bf16,
            2 => DType::I64,
            3 => DType::Bool,
            _ => return Err(format!("unknown dtype code {c}")),
        })
    }

    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
            DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::Bf16)
    }
}

/// `dims`/`strides` (in elements) of `dtype` values starting `offset` bytes into slot `slot`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub slot: usize,
    pub offset: usize,
    pub dtype: DType,
    pub dims: Vec<usize>,
    pub strides: Vec<usize>,
}

impl View {
    pub fn ndim(&self) -> usize {
        self.dims.len()
    }

    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// One past the last byte the view addresses, or None on overflow.
    pub fn end_bytes(&self) -> Option<usize> {
        if self.dims.contains(&0) {
            return Some(self.offset);
        }
        let mut last = 0usize;
        for (&d, &s) in self.dims.iter().zip(&self.strides) {
            last = last.checked_add((d - 1).checked_mul(s)?)?;
        }
        last.checked_add(1)?
            .checked_mul(self.dtype.size())?
            .checked_add(self.offset)
    }

    /// The sub-view `start..start + len` along `dim` (caller keeps it in range).
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> View {
        let mut v = self.clone();
        v.offset += start * self.strides[dim] * self.dtype.size();
        v.dims[dim] = len;
        v
    }

    /// True when the elements are laid out row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        let mut expect = 1;
        for (&d, &s) in self.dims.iter().zip(&self.strides).rev() {
            if d != 1 && s != expect {
                return false;
            }
            expect *= d;
        }
        true
    }

    /// Address of the first element.
    ///
    /// # Safety
    /// `slots[self.slot]` must be valid for `self.end_bytes()` bytes (checked at decode time
    /// against the slot sizes the caller promised).
    #[inline]
    pub unsafe fn ptr(&self, slots: &[*mut u8]) -> *mut u8 {
        // SAFETY: the offset lies inside the slot by the caller's contract.
        unsafe { slots[self.slot].add(self.offset) }
    }
}

/// Reads `out.len()` elements, `stride` elements apart, widened to f32.
///
/// # Safety
/// `p` must be valid for reads of every addressed element of `dt`.
pub unsafe fn load_f32(p: *const u8, dt: DType, stride: usize, out: &mut [f32]) {
    // SAFETY (all arms): element i lives at p + i * stride * size, inside the caller's range;
    // unaligned reads make no alignment assumption about views of odd offsets.
    unsafe {
        match dt {
            DType::F32 if stride == 1 => {
                std::ptr::copy_nonoverlapping(p as *const f32, out.as_mut_ptr(), out.len())
            }
            DType::F32 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = (p as *const f32).add(i * stride).read_unaligned();
                }
            }
            DType::Bf16 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = bf16_to_f32((p as *const u16).add(i * stride).read_unaligned());
                }
            }
            DType::I64 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = (p as *const i64).add(i * stride).read_unaligned() as f32;
                }
            }
            DType::Bool => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = (*p.add(i * stride) != 0) as u8 as f32;
                }
            }
        }
    }
}

/// Writes `src` to `src.len()` elements `stride` apart, converting from f32.
///
/// # Safety
/// `p` must be valid for writes of every addressed element of `dt`.
pub unsafe fn store_f32(p: *mut u8, dt: DType, stride: usize, src: &[f32]) {
    // SAFETY (all arms): as in load_f32, for writes.
    unsafe {
        match dt {
            DType::F32 if stride == 1 => {
                std::ptr::copy_nonoverlapping(src.as_ptr(), p as *mut f32, src.len())
            }
            DType::F32 => {
                for (i, &x) in src.iter().enumerate() {
                    (p as *mut f32).add(i * stride).write_unaligned(x);
                }
            }
            DType::Bf16 => {
                for (i, &x) in src.iter().enumerate() {
                    (p as *mut u16)
                        .add(i * stride)
                        .write_unaligned(f32_to_bf16(x));
                }
            }
            DType::I64 => {
                for (i, &x) in src.iter().enumerate() {
                    (p as *mut i64).add(i * stride).write_unaligned(x as i64);
                }
            }
            DType::Bool => {
                for (i, &x) in src.iter().enumerate() {
                    *p.add(i * stride) = (x != 0.0) as u8;
                }
            }
        }
    }
}

/// Reads elements as i64 (floats truncate toward zero).
///
/// # Safety
/// As for `load_f32`.
pub unsafe fn load_i64(p: *const u8, dt: DType, stride: usize, out: &mut [i64]) {
    // SAFETY (all arms): as in load_f32.
    unsafe {
        match dt {
            DType::I64 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = (p as *const i64).add(i * stride).read_unaligned();
                }
            }
            DType::Bool => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = (*p.add(i * stride) != 0) as i64;
                }
            }
            _ => {
                let mut f = vec![0.0f32; out.len()];
                load_f32(p, dt, stride, &mut f);
                for (o, x) in out.iter_mut().zip(f) {
                    *o = x as i64;
                }
            }
        }
    }
}

/// Writes i64 values (to int64 or bool views; the decoder allows nothing else).
///
/// # Safety
/// As for `store_f32`.
pub unsafe fn store_i64(p: *mut u8, dt: DType, stride: usize, src: &[i64]) {
    // SAFETY (all arms): as in store_f32.
    unsafe {
        match dt {
            DType::I64 => {
                for (i, &x) in src.iter().enumerate() {
                    (p as *mut i64).add(i * stride).write_unaligned(x);
                }
            }
            DType::Bool => {
                for (i, &x) in src.iter().enumerate() {
                    *p.add(i * stride) = (x != 0) as u8;
                }
            }
            _ => {
                let f: Vec<f32> = src.iter().map(|&x| x as f32).collect();
                store_f32(p, dt, stride, &f);
            }
        }
    }
}

/// Most dims a view may have (the program decoder rejects more).
pub const MAX_DIMS: usize = 16;
/// Most views one layout walks together (output plus two operands).
pub const MAX_VIEWS: usize = 4;

/// Joint layout of several same-shaped views after dropping size-1 dims and merging dims that
/// are contiguous in every view, so most pointwise work becomes one long row.
#[derive(Clone, Debug)]
pub struct Layout {
    pub dims: Vec<usize>,
    /// strides[v][d] for view v.
    pub strides: Vec<Vec<usize>>,
}

impl Layout {
    pub fn of(dims: &[usize], strides: &[&[usize]]) -> Layout {
        let keep: Vec<usize> = (0..dims.len()).filter(|&d| dims[d] != 1).collect();
        let mut out_dims: Vec<usize> = Vec::new();
        let mut out_strides: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
        for &d in &keep {
            let mergeable = !out_dims.is_empty()
                && strides.iter().zip(&out_strides).all(|(s, os)| {
                    // the previous (outer) dim steps exactly over this whole inner dim
                    *os.last().unwrap() == s[d] * dims[d]
                });
            if mergeable {
                *out_dims.last_mut().unwrap() *= dims[d];
                for (s, os) in strides.iter().zip(out_strides.iter_mut()) {
                    *os.last_mut().unwrap() = s[d];
                }
            } else {
                out_dims.push(dims[d]);
                for (s, os) in strides.iter().zip(out_strides.iter_mut()) {
                    os.push(s[d]);
                }
            }
        }
        if out_dims.is_empty() {
            out_dims.push(if dims.contains(&0) { 0 } else { 1 });
            for os in out_strides.iter_mut() {
                os.push(0);
            }
        }
        Layout {
            dims: out_dims,
            strides: out_strides,
        }
    }

    /// Calls `f(offsets)` once per row (all dims but the last), with each view's element offset
    /// of the row's first element.
    pub fn for_each_row(&self, mut f: impl FnMut(&[usize])) {
        let nd = self.dims.len();
        if self.dims.contains(&0) {
            return;
        }
        let nv = self.strides.len();
        // Fixed-size state: views have at most MAX_DIMS dims (checked at decode) and instructions
        // at most MAX_VIEWS views, so no allocation per call.
        assert!(
            nd <= MAX_DIMS && nv <= MAX_VIEWS,
            "layout too large: {nd} dims, {nv} views"
        );
        let mut idx = [0usize; MAX_DIMS];
        let mut off_buf = [0usize; MAX_VIEWS];
        let off = &mut off_buf[..nv];
        loop {
            f(off);
            // odometer over dims[..nd-1], innermost first
            let mut d = nd - 1;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                for (o, s) in off.iter_mut().zip(&self.strides) {
                    *o += s[d];
                }
                if idx[d] < self.dims[d] {
                    break;
                }
                for (o, s) in off.iter_mut().zip(&self.strides) {
                    *o -= s[d] * self.dims[d];
                }
                idx[d] = 0;
            }
        }
    }
}
