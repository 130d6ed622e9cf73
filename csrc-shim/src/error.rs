//! Error plumbing for the C boundary: run a closure, catch panics, write messages into the caller's
//! buffer (always NUL-terminated, truncated to fit).
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `body`; on `Err` or panic writes the message into `err` and returns 1, else returns 0.
pub fn guarded(err: *mut c_char, err_len: usize, body: impl FnOnce() -> Result<(), String>) -> i32 {
    let msg = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return 0,
        Ok(Err(msg)) => msg,
        Err(payload) => {
            let what = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".to_string());
            format!("internal error in the Rust kernel ({what}); please report it")
        }
    };
    write_message(err, err_len, &msg);
    1
}

fn write_message(err: *mut c_char, err_len: usize, msg: &str) {
    if err.is_null() || err_len == 0 {
        return;
    }
    let bytes = msg.as_bytes();
    let n = bytes.len().min(err_len - 1);
    // SAFETY: the caller passes a writable buffer of `err_len` bytes; we write n + 1 <= err_len bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), err as *mut u8, n);
        *err.add(n) = 0;
    }
}

/// A usize from a C size that the C++ layer has already checked to be non-negative.
pub fn to_usize(v: i64, what: &str) -> Result<usize, String> {
    usize::try_from(v).map_err(|_| format!("{what} must be non-negative, got {v}"))
}
