//! Parallel-runner abstraction. Kernels describe their work as `n_tasks` independent closures;
//! the runner decides where they run (the torch build plugs in torch's intra-op pool, Rust
//! tests and benches use `Serial` or `ScopedThreads`).
//!
//! Contract: `run` returns only after every task has finished; a panic in a task propagates to
//! the caller of `run`. Kernels never depend on which thread runs a task or in what order, so
//! results are identical for every runner.

use std::any::Any;
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

pub trait Parallel: Sync {
    /// How many tasks may usefully run at once (kernels size their split from this).
    fn num_threads(&self) -> usize;
    /// Runs f(i) for every i in 0..n_tasks, possibly concurrently; returns when all are done.
    fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync));
}

/// Runs every task in order on the calling thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct Serial;

impl Parallel for Serial {
    fn num_threads(&self) -> usize {
        1
    }
    fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..n_tasks).for_each(f);
    }
}

/// Spawns `N - 1` scoped threads per `run` call (the caller is the N-th worker); tasks are
/// handed out dynamically from a shared counter. Spawning costs tens of microseconds, so this is
/// meant for tests and benches, not for production decode.
#[derive(Clone, Copy, Debug)]
pub struct ScopedThreads(pub usize);

impl Parallel for ScopedThreads {
    fn num_threads(&self) -> usize {
        self.0.max(1)
    }
    fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let workers = self.num_threads().min(n_tasks);
        if workers <= 1 {
            (0..n_tasks).for_each(f);
            return;
        }
        let next = AtomicUsize::new(0);
        // The first panic's payload, re-raised in the caller as it was (scope() alone would replace a
        // worker's message by "a scoped thread panicked").
        let panic: Mutex<Option<Box<dyn Any + Send>>> = Mutex::new(None);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n_tasks {
                break;
            }
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                panic
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(p);
            }
        };
        std::thread::scope(|s| {
            for _ in 1..workers {
                s.spawn(work);
            }
            work();
        });
        if let Some(p) = panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
            resume_unwind(p);
        }
    }
}

/// Splits `0..n` into at most `parts` contiguous, non-empty, balanced ranges whose boundaries
/// are multiples of `align` (only the final end may be unaligned, at `n`).
pub fn chunk_ranges(n: usize, parts: usize, align: usize) -> Vec<Range<usize>> {
    let align = align.max(1);
    let units = n.div_ceil(align);
    let parts = parts.clamp(1, units.max(1));
    (0..parts)
        .map(|p| {
            let start = (p * units / parts * align).min(n);
            let end = ((p + 1) * units / parts * align).min(n);
            start..end
        })
        .filter(|r| !r.is_empty())
        .collect()
}

/// Runs `f` for every task, inline when there is only one (saves the runner's dispatch cost).
pub(crate) fn run_tasks(par: &dyn Parallel, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    match n_tasks {
        0 => {}
        1 => f(0),
        _ => par.run(n_tasks, f),
    }
}

/// A raw output pointer that tasks may share because each writes a disjoint set of elements.
/// Whoever dereferences it must uphold that disjointness (stated at each use).
#[derive(Debug)]
pub(crate) struct SyncPtr<T>(pub *mut T);

// A pointer value is copyable whatever it points at (derive would demand T: Copy).
impl<T> Clone for SyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The pointer. Use this inside closures: a method call captures the whole (Sync)
    /// wrapper, whereas `.0` would capture the bare (non-Sync) pointer field.
    #[inline]
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

// SAFETY: SyncPtr is only a pointer value; every write through it targets elements owned by
// exactly one task (see the uses), and `run` joins all tasks before the borrow it came from ends.
unsafe impl<T: Send> Send for SyncPtr<T> {}
// SAFETY: as above; sharing the pointer value between threads is harmless by itself.
unsafe impl<T: Send> Sync for SyncPtr<T> {}

/// Runs `f(first_row, rows)` over disjoint chunks of whole `width`-wide rows of `data`, one chunk per
/// thread when there are at least `min_values` values per chunk, else `f(0, data)` on the caller. For
/// the per-row elementwise work of a prompt step (norms, activations, rotary), which would otherwise
/// leave every thread but one waiting. Rows are independent, so results do not depend on the split.
pub fn rows_mut<T: Send>(
    par: &dyn Parallel,
    data: &mut [T],
    width: usize,
    min_values: usize,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    let rows = data.len().checked_div(width).unwrap_or(0);
    let parts = par
        .num_threads()
        .min(rows)
        .min(data.len() / min_values.max(1));
    if parts <= 1 {
        return f(0, data);
    }
    let chunks = chunk_ranges(rows, parts, 1);
    let ptr = SyncPtr(data.as_mut_ptr());
    run_tasks(par, chunks.len(), &|i| {
        let r = &chunks[i];
        // SAFETY: the chunks are disjoint row ranges of `data` (rows * width <= data.len()), so each
        // task gets its own elements; run_tasks joins before `data`'s borrow ends.
        let rows = unsafe {
            std::slice::from_raw_parts_mut(ptr.get().add(r.start * width), r.len() * width)
        };
        f(r.start, rows)
    });
}
