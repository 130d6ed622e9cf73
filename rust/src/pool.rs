//! A persistent worker pool for the whole-model decoder: workers spin briefly between jobs (a decode
//! step is ~150 parallel regions of 20-200 µs each, too short for a sleep/wake per region), then park.
//!
//! Why not torch's OpenMP pool: it splits each region statically, one share per thread, so a thread
//! the OS has not scheduled (another process on its core) holds every region until it runs again;
//! measured on these 2-core machines, a busy loop on one core took stock torch generation from 24 to
//! 0.7 tokens/s. Here tasks are claimed one at a time from a shared counter by whichever thread is
//! running, the caller included, so a descheduled worker only delays the task it has claimed. When
//! the caller finds itself waiting long for such a task (`STALL`), it runs the next regions alone for
//! `SOLO` and then tries the workers again: under contention a step degrades towards one thread's
//! speed instead of collapsing.
//!
//! Contract (as `par::Parallel`): `run` returns after every task has run exactly once; a task panic is
//! re-raised in the caller after all tasks have finished. Tasks must not call `run` on the same pool
//! (a nested call runs inline). Results never depend on which thread runs a task.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::par::Parallel;

/// A worker polls for new jobs this long after its last one before parking.
const SPIN: Duration = Duration::from_micros(1500);
/// The caller waiting this long (plus four of its own average task times) for tasks claimed by others
/// counts as a stall: a worker that is running finishes a claimed task in about one task time, and a
/// descheduled one is away for a scheduler time slice (milliseconds). At 250 us this VM's own jitter
/// triggered 5-10 stalls per quiet benchmark run, costing 13 % of the decode rate; at 1 ms, none.
const STALL: Duration = Duration::from_micros(1000);
/// After a stall the caller runs regions alone this long.
const SOLO: Duration = Duration::from_millis(20);
/// Tasks per thread the kernels are asked to split into (`num_threads()` reports threads * this), so
/// the thread that is running can take over the share of one that is not. Measured (bench_pool.py,
/// SmolLM2-135M tg, one process, interleaved with torch's pool): 2 costs ~6 % quiet against torch's
/// static split (1 is at parity) and slows 1.5x under a pinned busy loop (1: 1.9x; torch's pool: 3.2-3.6x).
const OVERSPLIT: usize = 2;

/// One job, on the caller's stack while `run` lasts.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    /// The first task panic's message.
    panicked: Mutex<Option<String>>,
}

/// The claim word packs (epoch, task count, next unclaimed index) so that a claim checks all three
/// at once: a worker can never pair one job's count with another job's epoch.
const IDX_BITS: u32 = 20;
const MAX_TASKS: usize = (1 << IDX_BITS) - 1;
const EPOCH_MASK: u64 = (1 << (64 - 2 * IDX_BITS)) - 1;

fn pack(epoch: u64, n: usize, idx: usize) -> u64 {
    (epoch << (2 * IDX_BITS)) | ((n as u64) << IDX_BITS) | idx as u64
}

fn epoch_of(word: u64) -> u64 {
    word >> (2 * IDX_BITS)
}

struct Shared {
    /// `pack(epoch, n_tasks, next index)` of the current job.
    next: AtomicU64,
    /// The current job; only dereferenced after a successful claim of one of its tasks.
    job: AtomicPtr<Job<'static>>,
    /// Tasks of the current job that have finished.
    done: AtomicUsize,
    /// Parked workers, and the condition they wait on.
    parked: Mutex<usize>,
    wake: Condvar,
    shutdown: AtomicBool,
}

/// The pool. Dropping it stops and joins the workers.
pub struct SpinPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    threads: usize,
    /// Epoch of the last job (only written by the caller holding `busy`).
    epoch: AtomicU64,
    /// Until when (nanoseconds after `born`) callers run alone after a stall; 0 = not solo.
    solo_until: AtomicU64,
    born: Instant,
    stalls: AtomicU64,
    busy: AtomicBool,
}

impl SpinPool {
    /// A pool running tasks on `threads` threads: the caller of `run` plus `threads - 1` workers.
    pub fn new(threads: usize) -> SpinPool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            next: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            parked: Mutex::new(0),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let workers = (1..threads)
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("kwker-worker-{i}"))
                    .spawn(move || worker(&s))
                    .expect("kwker: cannot start a worker thread")
            })
            .collect();
        SpinPool {
            shared,
            workers,
            threads,
            epoch: AtomicU64::new(0),
            solo_until: AtomicU64::new(0),
            born: Instant::now(),
            stalls: AtomicU64::new(0),
            busy: AtomicBool::new(false),
        }
    }

    /// Threads this pool runs tasks on (caller included).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Times the caller gave up waiting for a descheduled worker and ran alone for a while.
    pub fn stalls(&self) -> u64 {
        self.stalls.load(Ordering::Relaxed)
    }

    fn now_ns(&self) -> u64 {
        self.born.elapsed().as_nanos() as u64
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.parked.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Claims the next task of epoch `epoch`, or None when that job has no unclaimed task left (or a
/// newer job has replaced it).
fn claim(shared: &Shared, epoch: u64) -> Option<usize> {
    let mut cur = shared.next.load(Ordering::Acquire);
    loop {
        let n = ((cur >> IDX_BITS) as usize) & MAX_TASKS;
        let idx = (cur as usize) & MAX_TASKS;
        if epoch_of(cur) != epoch || idx >= n {
            return None;
        }
        match shared
            .next
            .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Some(idx),
            Err(now) => cur = now,
        }
    }
}

/// Runs task i of `job`, recording a panic instead of unwinding into the pool.
fn run_task(job: &Job<'_>, i: usize) {
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| (job.f)(i))) {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        job.panicked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(msg);
    }
}

fn worker(shared: &Shared) {
    let mut seen_epoch = 0u64;
    let mut idle_since = Instant::now();
    loop {
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        let epoch = epoch_of(shared.next.load(Ordering::Acquire));
        if epoch != seen_epoch {
            seen_epoch = epoch;
            while let Some(i) = claim(shared, epoch) {
                // Loaded after the claim: the claimed task is unfinished, so the job of `epoch` is
                // still the current one (a job is replaced only after all its tasks are done).
                let job_ptr = shared.job.load(Ordering::Acquire);
                // SAFETY: a successful claim of epoch `epoch` means run() for that job has not
                // returned (it waits for `done == n`, and this task is not done), so the Job on its
                // stack is alive and `job` still points at it.
                let job = unsafe { &*job_ptr };
                run_task(job, i);
                shared.done.fetch_add(1, Ordering::Release);
            }
            idle_since = Instant::now();
            continue;
        }
        if idle_since.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        // Park until a new job is published (or shutdown).
        let mut parked = shared.parked.lock().unwrap_or_else(|p| p.into_inner());
        *parked += 1;
        while epoch_of(shared.next.load(Ordering::Acquire)) == seen_epoch
            && !shared.shutdown.load(Ordering::Acquire)
        {
            parked = shared.wake.wait(parked).unwrap_or_else(|p| p.into_inner());
        }
        *parked -= 1;
        idle_since = Instant::now();
    }
}

impl Parallel for SpinPool {
    fn num_threads(&self) -> usize {
        if self.threads > 1 {
            self.threads * OVERSPLIT
        } else {
            1
        }
    }

    fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        let solo = self.solo_until.load(Ordering::Relaxed) > self.now_ns();
        if self.threads <= 1
            || n_tasks == 1
            || solo
            || n_tasks > MAX_TASKS
            || self
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            // Alone (one thread, one task, a recent stall, or the pool already in use by another
            // caller or by an enclosing task): inline, in order.
            (0..n_tasks).for_each(f);
            return;
        }
        let job = Job {
            f,
            panicked: Mutex::new(None),
        };
        // Epochs run 1..=EPOCH_MASK and wrap (0 is the workers' "nothing seen yet").
        let epoch = self.epoch.load(Ordering::Relaxed) % EPOCH_MASK + 1;
        self.epoch.store(epoch, Ordering::Relaxed);
        let shared = &*self.shared;
        shared.done.store(0, Ordering::Relaxed);
        // The job lives until every task has finished (the wait below); workers only dereference it
        // after claiming a task of this epoch.
        shared
            .job
            .store(&job as *const Job as *mut Job<'static>, Ordering::Release);
        shared
            .next
            .store(pack(epoch, n_tasks, 0), Ordering::Release);
        if *shared.parked.lock().unwrap_or_else(|p| p.into_inner()) > 0 {
            shared.wake.notify_all();
        }
        let mut mine = 0;
        let work_start = Instant::now();
        while let Some(i) = claim(shared, epoch) {
            run_task(&job, i);
            mine += 1;
        }
        shared.done.fetch_add(mine, Ordering::Release);
        let wait_start = Instant::now();
        let patience = STALL + (wait_start - work_start) * 4 / (mine.max(1) as u32);
        let mut spins = 0u32;
        while shared.done.load(Ordering::Acquire) < n_tasks {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) && wait_start.elapsed() > patience {
                // A worker holds a task but is not running: finish waiting, then go solo for a while.
                while shared.done.load(Ordering::Acquire) < n_tasks {
                    std::thread::yield_now();
                }
                self.stalls.fetch_add(1, Ordering::Relaxed);
                self.solo_until
                    .store(self.now_ns() + SOLO.as_nanos() as u64, Ordering::Relaxed);
                break;
            }
        }
        self.busy.store(false, Ordering::Release);
        if let Some(msg) = job.panicked.into_inner().unwrap_or_else(|p| p.into_inner()) {
            panic!("a kernel task panicked: {msg}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_runs_once() {
        let pool = SpinPool::new(3);
        for n in [1usize, 2, 5, 64, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                pool.run(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 50),
                "n={n}"
            );
        }
    }

    #[test]
    fn panics_propagate_after_all_tasks() {
        let pool = SpinPool::new(2);
        let count = AtomicUsize::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(16, &|i| {
                count.fetch_add(1, Ordering::Relaxed);
                assert!(i != 7, "boom");
            })
        }));
        assert!(r.is_err());
        assert_eq!(count.load(Ordering::Relaxed), 16);
        // Still usable afterwards.
        let again = AtomicUsize::new(0);
        pool.run(8, &|_| {
            again.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(again.load(Ordering::Relaxed), 8);
    }

    /// Tasks that take a while, after the workers have parked: a worker must wake and take some.
    #[test]
    fn parked_workers_wake_and_take_tasks() {
        let pool = SpinPool::new(2);
        std::thread::sleep(SPIN * 3);
        let caller = std::thread::current().id();
        let by_worker = AtomicUsize::new(0);
        for _ in 0..20 {
            pool.run(8, &|_| {
                std::thread::sleep(Duration::from_micros(200));
                if std::thread::current().id() != caller {
                    by_worker.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        assert!(
            by_worker.load(Ordering::Relaxed) > 0,
            "no task ran on a worker"
        );
    }

    /// Two callers at once: one gets the workers, the other runs inline; both complete every task.
    #[test]
    fn concurrent_callers_each_run_all_their_tasks() {
        let pool = SpinPool::new(2);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for n in [3usize, 17, 64] {
                        let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                        for _ in 0..200 {
                            pool.run(n, &|i| {
                                hits[i].fetch_add(1, Ordering::Relaxed);
                            });
                        }
                        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 200));
                    }
                });
            }
        });
    }

    /// A worker that holds a task far longer than the caller's own tasks counts as a stall and sends
    /// the next regions solo (run inline by the caller).
    #[test]
    fn a_stalled_worker_sends_the_pool_solo() {
        let pool = SpinPool::new(2);
        let caller = std::thread::current().id();
        for _ in 0..10 {
            // The caller's task is short (the worker has time to claim the other); the worker's long.
            pool.run(2, &|_| {
                let on_worker = std::thread::current().id() != caller;
                std::thread::sleep(Duration::from_micros(if on_worker { 5000 } else { 100 }));
            });
            if pool.stalls() > 0 {
                break;
            }
        }
        assert_eq!(pool.stalls(), 1);
        let off_caller = AtomicUsize::new(0);
        pool.run(16, &|_| {
            if std::thread::current().id() != caller {
                off_caller.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert_eq!(
            off_caller.load(Ordering::Relaxed),
            0,
            "a solo region ran on a worker"
        );
    }
}
