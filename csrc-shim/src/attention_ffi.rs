//! `kwker_decode_attention`: attention of T new query tokens over a cache of S keys/values, each query
//! token t seeing keys 0..=S-T+t. Strided q/k/v (last dim dense) are read in place, f32 or bf16;
//! scores, softmax and sums in f32 inside the kernel.
use crate::config::current_isa;
use crate::error::{guarded, to_usize};
use crate::torch_pool::TorchPool;
use kwker_kernels::attention::{decode_attention, View4};
use kwker_kernels::bf16::{Bf16, Element};
use std::ffi::{c_char, c_void};

/// Shape and strides of one 4-D operand, read from the C arrays.
struct Geometry {
    dims: [usize; 4],
    strides: [usize; 4],
}

impl Geometry {
    /// # Safety
    /// `dims` and `strides` must each point to 4 readable i64.
    unsafe fn read(dims: *const i64, strides: *const i64, what: &str) -> Result<Self, String> {
        let mut g = Geometry {
            dims: [0; 4],
            strides: [0; 4],
        };
        for i in 0..4 {
            // SAFETY: the caller guarantees 4 elements in each array.
            let (d, s) = unsafe { (*dims.add(i), *strides.add(i)) };
            g.dims[i] = to_usize(d, what)?;
            g.strides[i] = to_usize(s, what)?;
        }
        Ok(g)
    }

    /// Elements spanned from the first to the last element (0 for an empty tensor).
    fn span(&self) -> usize {
        if self.dims.contains(&0) {
            return 0;
        }
        1 + (0..4)
            .map(|i| (self.dims[i] - 1) * self.strides[i])
            .sum::<usize>()
    }

    /// # Safety
    /// `ptr` must be valid for `self.span()` elements of E.
    unsafe fn view<'a, E: Element>(&self, ptr: *const c_void) -> View4<'a, E> {
        // SAFETY: the tensor's storage covers its span from its data pointer.
        let data = unsafe { std::slice::from_raw_parts(ptr as *const E, self.span()) };
        View4 {
            data,
            dims: self.dims,
            strides: self.strides,
        }
    }
}

/// # Safety
/// As for `kwker_decode_attention`.
#[allow(clippy::too_many_arguments)]
unsafe fn run<E: Element>(
    q: (*const c_void, &Geometry),
    k: (*const c_void, &Geometry),
    v: (*const c_void, &Geometry),
    scale: f32,
    out: *mut c_void,
) {
    let len: usize = q.1.dims.iter().product();
    // SAFETY: the C++ layer validated shapes and passes tensors whose storage covers their spans;
    // out is a fresh contiguous [B, Hq, T, D] tensor of E.
    unsafe {
        let out = std::slice::from_raw_parts_mut(out as *mut E, len);
        let pool = TorchPool::new();
        decode_attention(
            current_isa(),
            &pool,
            q.1.view(q.0),
            k.1.view(k.0),
            v.1.view(v.0),
            scale,
            out,
        );
    }
}

/// See `cpp/kwker_ffi.h`.
///
/// # Safety
/// Pointers must reference tensors with the stated geometry; `out` must not alias inputs.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_decode_attention(
    dtype: i32,
    q: *const c_void,
    q_dims: *const i64,
    q_strides: *const i64,
    k: *const c_void,
    k_dims: *const i64,
    k_strides: *const i64,
    v: *const c_void,
    v_dims: *const i64,
    v_strides: *const i64,
    scale: f32,
    out: *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: each dims/strides pointer references 4 i64 (kwker_ffi.h).
        let (qg, kg, vg) = unsafe {
            (
                Geometry::read(q_dims, q_strides, "q")?,
                Geometry::read(k_dims, k_strides, "k")?,
                Geometry::read(v_dims, v_strides, "v")?,
            )
        };
        // SAFETY: forwarded caller guarantees.
        unsafe {
            match dtype {
                0 => run::<f32>((q, &qg), (k, &kg), (v, &vg), scale, out),
                1 => run::<Bf16>((q, &qg), (k, &kg), (v, &vg), scale, out),
                _ => return Err(format!("unsupported dtype code {dtype}")),
            }
        }
        Ok(())
    })
}
