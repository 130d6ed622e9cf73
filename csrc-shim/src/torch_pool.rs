//! Runs kernel tasks on torch's own intra-op thread pool through the stable C function
//! `torch_parallel_for`, so our kernels never compete with a second pool for the same cores (torch's
//! OpenMP workers keep spinning after each of its ops; a pool of our own would fight them).
use crate::config::thread_cap;
use kwker_kernels::par::Parallel;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

type ParallelFunc = extern "C" fn(begin: i64, end: i64, ctx: *mut c_void);

extern "C" {
    // From libtorch_cpu (torch/csrc/stable/c/shim.h, stable since torch 2.10).
    fn torch_parallel_for(
        begin: i64,
        end: i64,
        grain: i64,
        f: ParallelFunc,
        ctx: *mut c_void,
    ) -> i32;
    fn torch_get_num_threads(out: *mut u32) -> i32;
}

/// The runner handed to kernels.
pub struct TorchPool {
    threads: usize,
}

/// torch's intra-op thread count (`torch.get_num_threads()`; the physical cores by default).
pub fn torch_threads() -> usize {
    let mut n: u32 = 1;
    // SAFETY: torch_get_num_threads writes one u32 through a valid pointer.
    let rc = unsafe { torch_get_num_threads(&mut n) };
    if rc == 0 {
        n.max(1) as usize
    } else {
        1
    }
}

impl TorchPool {
    pub fn new() -> Self {
        let torch_threads = torch_threads();
        let cap = thread_cap();
        let threads = if cap == 0 {
            torch_threads
        } else {
            cap.min(torch_threads)
        };
        TorchPool { threads }
    }
}

struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    panicked: AtomicBool,
}

extern "C" fn trampoline(begin: i64, end: i64, ctx: *mut c_void) {
    // SAFETY: ctx is the &Job passed to torch_parallel_for below, alive until it returns.
    let job = unsafe { &*(ctx as *const Job) };
    // A panic must not unwind through torch's C++ frames: catch it and report after the join.
    let r = catch_unwind(AssertUnwindSafe(|| {
        for i in begin..end {
            (job.f)(i as usize);
        }
    }));
    if r.is_err() {
        job.panicked.store(true, Ordering::Relaxed);
    }
}

impl Parallel for TorchPool {
    fn num_threads(&self) -> usize {
        self.threads
    }

    fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.threads <= 1 || n_tasks == 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let job = Job {
            f,
            panicked: AtomicBool::new(false),
        };
        // grain = ceil(n_tasks / threads) so torch makes exactly `threads` chunks at most.
        let grain = n_tasks.div_ceil(self.threads) as i64;
        // SAFETY: `job` outlives the call; torch joins all chunks before returning.
        let rc = unsafe {
            torch_parallel_for(
                0,
                n_tasks as i64,
                grain,
                trampoline,
                &job as *const Job as *mut c_void,
            )
        };
        assert!(rc == 0, "torch_parallel_for failed with code {rc}");
        assert!(
            !job.panicked.load(Ordering::Relaxed),
            "a kernel task panicked"
        );
    }
}
