//! `kwker_plan_*`: the step executor's C entry points (called from `kwker_torch/executor.py`
//! through ctypes). A plan is created once from the planner's word list and the byte size of
//! every buffer, then run once per model step with the buffers' current addresses.
//!
//! Contract: errors (bad programs, out-of-range token ids or cache positions) come back as a
//! non-zero return code and a message; panics are caught. The plan holds a lock while it runs, so
//! concurrent runs of one plan serialize instead of sharing its scratch space.
use crate::config::current_isa;
use crate::error::guarded;
use crate::torch_pool::TorchPool;
use kwker_kernels::exec::Program;
use std::ffi::{c_char, c_void};
use std::sync::Mutex;

/// Decodes a program; returns an owned plan handle, or null with a message in `err`.
///
/// # Safety
/// `words` must point to `n_words` i64 and `slot_bytes` to `n_slots` u64.
#[no_mangle]
pub unsafe extern "C" fn kwker_plan_new(
    words: *const i64,
    n_words: usize,
    slot_bytes: *const u64,
    n_slots: usize,
    err: *mut c_char,
    err_len: usize,
) -> *mut c_void {
    let mut plan: *mut c_void = std::ptr::null_mut();
    guarded(err, err_len, || {
        // SAFETY: the caller passes arrays of the stated lengths.
        let (w, s) = unsafe {
            (
                std::slice::from_raw_parts(words, n_words),
                std::slice::from_raw_parts(slot_bytes, n_slots),
            )
        };
        let sizes: Vec<usize> = s.iter().map(|&b| b as usize).collect();
        let program = Program::decode(w, &sizes)?;
        plan = Box::into_raw(Box::new(Mutex::new(program))) as *mut c_void;
        Ok(())
    });
    plan
}

/// Runs a plan over `slots` (one address per buffer, in the order the plan was created with).
///
/// # Safety
/// `plan` must come from `kwker_plan_new` and not be freed; `slots` must point to `n_slots`
/// addresses, each valid for the byte size declared for it at creation.
#[no_mangle]
pub unsafe extern "C" fn kwker_plan_run(
    plan: *mut c_void,
    slots: *const usize,
    n_slots: usize,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        if plan.is_null() {
            return Err("the plan handle is null".into());
        }
        // SAFETY: a live handle from kwker_plan_new (caller's contract).
        let plan = unsafe { &*(plan as *const Mutex<Program>) };
        let mut program = plan.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: n_slots addresses (caller's contract).
        let addrs = unsafe { std::slice::from_raw_parts(slots, n_slots) };
        let ptrs: Vec<*mut u8> = addrs.iter().map(|&a| a as *mut u8).collect();
        // SAFETY: the caller promises each address covers its declared size; the lock keeps
        // other runs of this plan out.
        unsafe { program.run(current_isa(), &TorchPool::new(), &ptrs) }
    })
}

/// Frees a plan (null is ignored).
///
/// # Safety
/// `plan` must come from `kwker_plan_new` and not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn kwker_plan_free(plan: *mut c_void) {
    if !plan.is_null() {
        // SAFETY: ownership returns from the handle created by Box::into_raw.
        drop(unsafe { Box::from_raw(plan as *mut Mutex<Program>) });
    }
}
