//! Process-wide settings of the extension: which instruction-set tier runs (detected once, `KWKER_ISA`
//! forces one, tests switch it at run time; `kwker_isa_supported` only asks, never switches) and how many threads a kernel may use
//! (`KWKER_NUM_THREADS`, default: torch's intra-op thread count, i.e. the physical cores).
use kwker_kernels::isa::{self, Isa};
use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

const UNSET: u8 = u8::MAX;
static ISA: AtomicU8 = AtomicU8::new(UNSET);
/// 0 = follow torch's thread count.
static THREADS: AtomicUsize = AtomicUsize::new(usize::MAX);

fn code(isa: Isa) -> u8 {
    match isa {
        Isa::Generic => 0,
        Isa::Avx2 => 1,
        Isa::Avx512 => 2,
        Isa::AvxVnni => 3,
        Isa::Amx => 4,
    }
}

fn from_code(c: u8) -> Isa {
    match c {
        1 => Isa::Avx2,
        2 => Isa::Avx512,
        3 => Isa::AvxVnni,
        4 => Isa::Amx,
        _ => Isa::Generic,
    }
}

/// The tier kernels run on now.
pub fn current_isa() -> Isa {
    let c = ISA.load(Ordering::Relaxed);
    if c != UNSET {
        return from_code(c);
    }
    let isa = isa::detect();
    ISA.store(code(isa), Ordering::Relaxed);
    isa
}

/// Thread cap for kernels: 0 means "as many as torch's pool has".
pub fn thread_cap() -> usize {
    let t = THREADS.load(Ordering::Relaxed);
    if t != usize::MAX {
        return t;
    }
    let from_env = std::env::var("KWKER_NUM_THREADS")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(0);
    THREADS.store(from_env, Ordering::Relaxed);
    from_env
}

/// Name of the tier in use ("generic", "avx2", "avxvnni", "avx512", "amx"); a static string.
#[no_mangle]
pub extern "C" fn kwker_isa_name() -> *const c_char {
    // Static C strings, one per tier, so the pointer stays valid forever.
    let name: &'static CStr = match current_isa() {
        Isa::Generic => c"generic",
        Isa::Avx2 => c"avx2",
        Isa::AvxVnni => c"avxvnni",
        Isa::Avx512 => c"avx512",
        Isa::Amx => c"amx",
    };
    name.as_ptr()
}

/// Forces a tier by name. Returns 0 on success, 1 for an unknown name, 2 if the host cannot run it.
///
/// # Safety
/// `name` must be a valid NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn kwker_set_isa(name: *const c_char) -> i32 {
    if name.is_null() {
        return 1;
    }
    // SAFETY: the caller guarantees a valid NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let Some(isa) = Isa::from_name(&name) else {
        return 1;
    };
    if !isa.is_supported() {
        return 2;
    }
    ISA.store(code(isa), Ordering::Relaxed);
    0
}

/// Whether the host can run a tier, without changing the tier in use (a probe that other threads'
/// kernels cannot notice). Returns 0 if it can, 1 for an unknown name, 2 if the host cannot run it.
///
/// # Safety
/// `name` must be a valid NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn kwker_isa_supported(name: *const c_char) -> i32 {
    if name.is_null() {
        return 1;
    }
    // SAFETY: the caller guarantees a valid NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    match Isa::from_name(&name) {
        None => 1,
        Some(isa) if isa.is_supported() => 0,
        Some(_) => 2,
    }
}

/// Threads a kernel may use (0 = torch's intra-op thread count).
#[no_mangle]
pub extern "C" fn kwker_num_threads() -> usize {
    thread_cap()
}

/// Sets the thread cap (0 = follow torch).
#[no_mangle]
pub extern "C" fn kwker_set_num_threads(n: usize) {
    THREADS.store(n, Ordering::Relaxed);
}
