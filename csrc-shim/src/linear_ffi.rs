//! `kwker_linear`: y[m, n] = x[m, k] @ w[n, k]^T (+ bias) for f32/bf16 activations and weights.
//!
//! Numerics: bf16 inputs are widened exactly to f32, the kernel sums in f32, the bias is added in f32
//! and a bf16 output is rounded once (round-to-nearest-even), as torch's own bf16 linear does.
use crate::config::current_isa;
use crate::error::{guarded, to_usize};
use crate::torch_pool::TorchPool;
use kwker_kernels::bf16::{bf16_slice_to_f32, f32_slice_to_bf16};
use kwker_kernels::linear::{linear, Weight};
use std::ffi::{c_char, c_void};

const F32: i32 = 0;
const BF16: i32 = 1;
const NONE: i32 = -1;

/// Widens `len` elements at `ptr` (f32 or bf16) into an f32 Vec, or borrows them when already f32.
///
/// # Safety
/// `ptr` must point to `len` readable elements of the given dtype.
unsafe fn as_f32(ptr: *const c_void, dtype: i32, len: usize, buf: &mut Vec<f32>) -> &[f32] {
    if dtype == F32 {
        // SAFETY: caller guarantees `len` f32 values at ptr.
        return unsafe { std::slice::from_raw_parts(ptr as *const f32, len) };
    }
    // SAFETY: caller guarantees `len` bf16 (u16) values at ptr.
    let src = unsafe { std::slice::from_raw_parts(ptr as *const u16, len) };
    buf.resize(len, 0.0);
    bf16_slice_to_f32(src, buf);
    buf
}

fn check_dtype(code: i32, what: &str) -> Result<(), String> {
    match code {
        F32 | BF16 => Ok(()),
        _ => Err(format!("{what}: unsupported dtype code {code}")),
    }
}

/// See `cpp/kwker_ffi.h`.
///
/// # Safety
/// Pointers must reference contiguous buffers of the stated sizes and dtypes; `y` must not alias inputs.
#[no_mangle]
pub unsafe extern "C" fn kwker_linear(
    x: *const c_void,
    x_dtype: i32,
    m: i64,
    k: i64,
    w: *const c_void,
    w_dtype: i32,
    n: i64,
    bias: *const c_void,
    bias_dtype: i32,
    y: *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        let (m, k, n) = (to_usize(m, "m")?, to_usize(k, "k")?, to_usize(n, "n")?);
        check_dtype(x_dtype, "x")?;
        check_dtype(w_dtype, "weight")?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let mut x_buf = Vec::new();
        // SAFETY: the C++ layer passes a contiguous [m, k] tensor of x_dtype.
        let xs = unsafe { as_f32(x, x_dtype, m * k, &mut x_buf) };
        let weight = if w_dtype == BF16 {
            // SAFETY: contiguous [n, k] bf16 weight.
            Weight::Bf16(unsafe { std::slice::from_raw_parts(w as *const u16, n * k) })
        } else {
            // SAFETY: contiguous [n, k] f32 weight.
            Weight::F32(unsafe { std::slice::from_raw_parts(w as *const f32, n * k) })
        };
        let mut b_buf = Vec::new();
        let b = if bias_dtype == NONE || bias.is_null() {
            None
        } else {
            check_dtype(bias_dtype, "bias")?;
            // SAFETY: contiguous [n] bias of bias_dtype.
            Some(unsafe { as_f32(bias, bias_dtype, n, &mut b_buf) })
        };
        let pool = TorchPool::new();
        if x_dtype == F32 {
            // SAFETY: y is a fresh contiguous [m, n] f32 output tensor, disjoint from the inputs.
            let ys = unsafe { std::slice::from_raw_parts_mut(y as *mut f32, m * n) };
            linear(current_isa(), &pool, xs, m, k, weight, n, b, ys);
        } else {
            let mut acc = vec![0.0f32; m * n];
            linear(current_isa(), &pool, xs, m, k, weight, n, b, &mut acc);
            // SAFETY: y is a fresh contiguous [m, n] bf16 output tensor.
            let ys = unsafe { std::slice::from_raw_parts_mut(y as *mut u16, m * n) };
            f32_slice_to_bf16(&acc, ys);
        }
        Ok(())
    })
}
