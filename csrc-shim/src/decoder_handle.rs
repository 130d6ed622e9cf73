//! What the decoder's C entry points share (`decoder_build_ffi`, `decoder_step_ffi`, `decoder_io_ffi`):
//! the handle (one decoder behind its own lock), the process's decoder pool, and helpers that turn raw
//! C arguments into checked Rust values. Every entry point returns 0 (or a handle) on success and a
//! message in `err` otherwise; panics are caught (`error::guarded`).
use crate::config::thread_cap;
use crate::torch_pool::TorchPool;
use kwker_kernels::decoder::Decoder;
use kwker_kernels::par::Parallel;
use kwker_kernels::pool::SpinPool;
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard};

/// `len` values at `ptr`, or an empty slice when `len` is 0 (then `ptr` may be null: an empty torch
/// tensor's data pointer is).
///
/// # Safety
/// When `len > 0`, `ptr` must be valid for `len` reads of T for the returned lifetime.
pub unsafe fn raw_slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if len == 0 || ptr.is_null() {
        return &[];
    }
    // SAFETY: non-null and valid for len reads (the caller's contract).
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `p` must be null or a valid NUL-terminated string for the returned lifetime.
pub unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, String> {
    if p.is_null() {
        return Err(format!("{what} is null"));
    }
    // SAFETY: a valid NUL-terminated string (caller's contract).
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| format!("{what} is not UTF-8"))
}

pub fn size(v: i64, what: &str) -> Result<usize, String> {
    usize::try_from(v).map_err(|_| format!("{what} must be >= 0, got {v}"))
}

/// Writes `bytes` into `out` (capacity `cap`) when it fits, and its length into `needed` either way:
/// the caller asks again with a larger buffer when `needed > cap`.
///
/// # Safety
/// `out` null or writable for `cap` bytes; `needed` writable.
pub unsafe fn write_out(
    bytes: &[u8],
    out: *mut u8,
    cap: usize,
    needed: *mut usize,
) -> Result<(), String> {
    if needed.is_null() {
        return Err("null length pointer".into());
    }
    // SAFETY: writable (caller's contract, null-checked).
    unsafe { *needed = bytes.len() };
    if !out.is_null() && bytes.len() <= cap {
        // SAFETY: out holds cap >= bytes.len() bytes (caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out, bytes.len()) };
    }
    Ok(())
}

/// The process's decoder pool, rebuilt when the wanted thread count changes.
pub fn pool() -> Arc<SpinPool> {
    static POOL: Mutex<Option<Arc<SpinPool>>> = Mutex::new(None);
    let want = match thread_cap() {
        0 => crate::torch_pool::torch_threads(),
        n => n,
    }
    .max(1);
    let mut g = POOL.lock().unwrap_or_else(|p| p.into_inner());
    match &*g {
        Some(p) if p.threads() == want => Arc::clone(p),
        _ => {
            let p = Arc::new(SpinPool::new(want));
            *g = Some(Arc::clone(&p));
            p
        }
    }
}

/// Runs `f` on the decoder's pool, or on torch's intra-op pool when `KWKER_DECODER_POOL=torch` (read at
/// every step, ~0.2 us, so a benchmark can switch within one process to measure one against the other).
pub fn with_pool<R>(f: impl FnOnce(&dyn Parallel) -> R) -> R {
    let torch = std::env::var_os("KWKER_DECODER_POOL").is_some_and(|v| v == "torch");
    if torch {
        f(&TorchPool::new())
    } else {
        f(&*pool())
    }
}

/// A built decoder behind its lock: calls from several threads on one decoder run one after another;
/// different decoders run concurrently.
pub struct Handle {
    pub dec: Mutex<Decoder>,
}

/// # Safety
/// `h` must be a live handle from `kwker_decoder_build`.
pub unsafe fn handle<'a>(h: *mut c_void) -> Result<&'a Handle, String> {
    if h.is_null() {
        return Err("the decoder handle is null".into());
    }
    // SAFETY: a live handle (caller's contract).
    Ok(unsafe { &*(h as *const Handle) })
}

pub fn lock(h: &Handle) -> MutexGuard<'_, Decoder> {
    h.dec.lock().unwrap_or_else(|p| p.into_inner())
}
