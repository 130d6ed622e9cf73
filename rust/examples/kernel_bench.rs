//! Kernel timing: linear GEMV/GEMM per tier and decode attention, plus a read-bandwidth
//! baseline. Run with `cargo run --release -p kwker-kernels --example kernel_bench [quick]`.
//!
//! GEMV rates are weight bytes / time (the memory-bound quantity); GEMM rates are
//! 2*m*n*k / time. "1t" is the `Serial` runner on the caller; "2t" is `ScopedThreads(2)`,
//! which pays a thread spawn per call (tens of microseconds); "2p" is a persistent 2-thread
//! pool defined below (a stand-in for torch's intra-op pool, a few microseconds per call).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use kwker_kernels::attention::{decode_attention, View4};
use kwker_kernels::bf16::{bf16_to_f32, f32_to_bf16, Bf16};
use kwker_kernels::isa::{self, Isa};
use kwker_kernels::linear::{linear, linear_path, Weight};
use kwker_kernels::par::{Parallel, ScopedThreads, Serial};

/// A persistent pool: the caller plus `workers` threads that spin briefly between jobs and
/// then sleep on a condvar. Tasks are handed out from a shared counter.
struct Pool {
    shared: Arc<Shared>,
    threads: usize,
}

struct Shared {
    /// Job generation; bumped for every `run`.
    epoch: AtomicUsize,
    /// The current job's closure, lifetime-erased; valid while `run` is waiting.
    job: Mutex<Option<(usize, usize)>>,
    wake: Condvar,
    next: AtomicUsize,
    busy: AtomicUsize,
    stop: AtomicBool,
}

type TaskFn<'a> = dyn Fn(usize) + Sync + 'a;

impl Pool {
    fn new(threads: usize) -> Pool {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: Mutex::new(None),
            wake: Condvar::new(),
            next: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        for _ in 1..threads {
            let sh = shared.clone();
            std::thread::spawn(move || worker(&sh));
        }
        Pool { shared, threads }
    }
}

fn drain(sh: &Shared, f: &TaskFn<'_>, n: usize) {
    loop {
        let i = sh.next.fetch_add(1, Ordering::AcqRel);
        if i >= n {
            break;
        }
        f(i);
    }
}

fn worker(sh: &Shared) {
    let mut seen = 0;
    loop {
        let spin_until = Instant::now() + Duration::from_millis(2);
        while sh.epoch.load(Ordering::Acquire) == seen && Instant::now() < spin_until {
            std::hint::spin_loop();
        }
        let mut job = sh.job.lock().unwrap();
        while sh.epoch.load(Ordering::Acquire) == seen {
            if sh.stop.load(Ordering::Acquire) {
                return;
            }
            job = sh.wake.wait(job).unwrap();
        }
        seen = sh.epoch.load(Ordering::Acquire);
        // None: the job already finished (its caller cleared it) before we looked.
        let Some((data, n)) = *job else { continue };
        sh.busy.fetch_add(1, Ordering::AcqRel);
        drop(job);
        // SAFETY: `run` published a pointer to its `&TaskFn` and does not return (so the
        // closure stays alive) until `busy` drops back to zero, which happens below.
        let f: &TaskFn<'_> = unsafe { *(data as *const &TaskFn<'_>) };
        drain(sh, f, n);
        sh.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _guard = self.shared.job.lock().unwrap();
        self.shared.epoch.fetch_add(1, Ordering::AcqRel);
        self.shared.wake.notify_all();
    }
}

impl Parallel for Pool {
    fn num_threads(&self) -> usize {
        self.threads
    }
    fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let sh = &*self.shared;
        let fref: &TaskFn<'_> = f;
        {
            let mut job = sh.job.lock().unwrap();
            sh.next.store(0, Ordering::Release);
            *job = Some((&fref as *const &TaskFn<'_> as usize, n_tasks));
            sh.epoch.fetch_add(1, Ordering::AcqRel);
            sh.wake.notify_all();
        }
        drain(sh, f, n_tasks);
        // Wait for workers that picked up this job, then retract it (under the lock, so no
        // worker can pick up the pointer to our soon-dead stack frame afterwards).
        loop {
            let mut job = sh.job.lock().unwrap();
            if sh.busy.load(Ordering::Acquire) == 0 {
                *job = None;
                break;
            }
            drop(job);
            std::hint::spin_loop();
        }
    }
}

/// Seconds per call: best of 5 rounds, each averaging enough calls to fill `budget`.
fn time_it(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut calls = 0u32;
    while start.elapsed() < budget / 10 {
        f();
        calls += 1;
    }
    let per_round = calls.max(1);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..per_round {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / per_round as f64);
    }
    best
}

fn runners(pool: &Pool) -> [(&'static str, &dyn Parallel); 3] {
    [("1t", &Serial), ("2t", &ScopedThreads(2)), ("2p", pool)]
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761);
            (h >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

/// Sum of a slice with 4 independent 8-lane AVX2 accumulators (a pure streaming read).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn stream_sum(v: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 4];
    for c in v.chunks_exact(32) {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: c has 32 floats, so c[8j..8j+8] is in bounds.
            *a = _mm256_add_ps(*a, unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * j)) });
        }
    }
    let mut out = [0.0f32; 8];
    // SAFETY: out has 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(acc[0], acc[1])) };
    out.iter().sum()
}

#[cfg(not(target_arch = "x86_64"))]
fn stream_sum(v: &[f32]) -> f32 {
    v.iter().sum()
}

/// Read bandwidth over `bytes` of f32, the yardstick for the memory-bound GEMV.
fn bandwidth(bytes: usize, budget: Duration, pool: &Pool) {
    let v = data(bytes / 4, 1);
    for (label, par) in runners(pool) {
        let t = time_it(budget, || {
            let parts = par.num_threads();
            let chunk = v.len().div_ceil(parts);
            let sums: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
            par.run(parts, &|i| {
                let part = &v[i * chunk..((i + 1) * chunk).min(v.len())];
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX2 is checked just before.
                let s = if is_x86_feature_detected!("avx2") {
                    unsafe { stream_sum(part) }
                } else {
                    part.iter().sum()
                };
                #[cfg(not(target_arch = "x86_64"))]
                let s = stream_sum(part);
                sums[i].store(s.to_bits() as usize, Ordering::Relaxed);
            });
            black_box(&sums);
        });
        println!(
            "read bandwidth {:>6.1} MB {label}: {:6.1} GB/s",
            bytes as f64 / 1e6,
            bytes as f64 / t / 1e9
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "quick");
    // Optional section filter: any of bw gemv cross gemm attn (default: all).
    let sections = ["bw", "gemv", "cross", "gemm", "attn"];
    let picked: Vec<&str> = sections
        .into_iter()
        .filter(|s| args.iter().any(|a| a == s))
        .collect();
    let run = |name: &str| picked.is_empty() || picked.contains(&name);
    let budget = Duration::from_millis(if quick { 150 } else { 400 });
    let tiers = isa::supported();
    let pool = Pool::new(2);
    println!("tiers: {:?}, detect() = {:?}", tiers, isa::detect());

    if run("bw") {
        bandwidth(1 << 20, budget, &pool);
        bandwidth(113 << 20, budget, &pool);
    }

    if run("gemv") {
        println!("\n== GEMV m=1: weight GB/s (n x k) ==");
    }
    for &(n, k) in [(576, 576), (1536, 576), (576, 1536), (49152, 576)]
        .iter()
        .filter(|_| run("gemv"))
    {
        let x = data(k, 2);
        let wf = data(n * k, 3);
        let wb: Vec<u16> = wf.iter().map(|&v| f32_to_bf16(v)).collect();
        let mut y = vec![0.0f32; n];
        for &isa in &tiers {
            let mut line = format!("{n:>6}x{k:<5} {:<8}", isa.name());
            for (wname, w, bytes) in [
                ("bf16", Weight::Bf16(&wb), n * k * 2),
                ("f32", Weight::F32(&wf), n * k * 4),
            ] {
                for (pname, par) in runners(&pool) {
                    let t = time_it(budget, || linear(isa, par, &x, 1, k, w, n, None, &mut y));
                    line += &format!(
                        " {wname} {pname} {:6.1} GB/s ({:7.1} us)",
                        bytes as f64 / t / 1e9,
                        t * 1e6
                    );
                }
            }
            println!("{line}");
        }
    }

    if run("cross") {
        println!("\n== GEMV vs GEMM path crossover, 1 thread, n=1536 k=576 bf16: us per call ==");
    }
    if run("cross") {
        let (n, k) = (1536, 576);
        let wb: Vec<u16> = data(n * k, 4).iter().map(|&v| f32_to_bf16(v)).collect();
        for &isa in tiers.iter().filter(|&&i| i != Isa::Generic) {
            for m in [1, 2, 4, 5, 6, 8, 12, 16, 24] {
                let x = data(m * k, 5);
                let mut y = vec![0.0f32; m * n];
                let w = Weight::Bf16(&wb);
                let tv = time_it(budget / 2, || {
                    linear_path(isa, false, &x, m, k, w, n, None, &mut y)
                });
                let tm = time_it(budget / 2, || {
                    linear_path(isa, true, &x, m, k, w, n, None, &mut y)
                });
                println!(
                    "{:<7} m={m:<3} gemv {:7.1} us  gemm {:7.1} us",
                    isa.name(),
                    tv * 1e6,
                    tm * 1e6
                );
            }
        }
    }

    if run("gemm") {
        println!("\n== GEMM m=128 k=576 n=1536: GFLOP/s ==");
    }
    if run("gemm") {
        let (m, k, n) = (128, 576, 1536);
        let x = data(m * k, 6);
        let wf = data(n * k, 7);
        let wb: Vec<u16> = wf.iter().map(|&v| f32_to_bf16(v)).collect();
        let xb: Vec<f32> = x.iter().map(|&v| bf16_to_f32(f32_to_bf16(v))).collect();
        let mut y = vec![0.0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64;
        for &isa in &tiers {
            let mut line = format!("{:<8}", isa.name());
            for (wname, w) in [("bf16", Weight::Bf16(&wb)), ("f32", Weight::F32(&wf))] {
                for (pname, par) in runners(&pool) {
                    let t = time_it(budget, || linear(isa, par, &x, m, k, w, n, None, &mut y));
                    line += &format!(" {wname} {pname} {:6.1} GFLOP/s", flops / t / 1e9);
                }
            }
            // Activations that are bf16 values (a bf16 model under install()): one AMX pass of
            // the three an arbitrary float32 needs; the other tiers do not care.
            let t = time_it(budget, || {
                linear(isa, &pool, &xb, m, k, Weight::Bf16(&wb), n, None, &mut y)
            });
            line += &format!(" bf16 x-in-bf16 2p {:6.1} GFLOP/s", flops / t / 1e9);
            println!("{line}");
        }
    }

    if run("attn") {
        println!("\n== decode attention B=1 T=1 D=64, Hq=9 Hkv=3, bf16 cache: us per call ==");
    }
    for s in [128, 1024, 4096].into_iter().filter(|_| run("attn")) {
        let (hq, hkv, d) = (9, 3, 64);
        let q: Vec<Bf16> = data(hq * d, 8)
            .iter()
            .map(|&v| Bf16(f32_to_bf16(v)))
            .collect();
        let kc: Vec<Bf16> = data(hkv * s * d, 9)
            .iter()
            .map(|&v| Bf16(f32_to_bf16(v)))
            .collect();
        let vc: Vec<Bf16> = data(hkv * s * d, 10)
            .iter()
            .map(|&v| Bf16(f32_to_bf16(v)))
            .collect();
        let mut out = vec![Bf16(0); hq * d];
        for &isa in &tiers {
            let mut line = format!("S={s:<5} {:<8}", isa.name());
            for (pname, par) in runners(&pool) {
                let t = time_it(budget, || {
                    decode_attention(
                        isa,
                        par,
                        View4::contiguous(&q, [1, hq, 1, d]),
                        View4::contiguous(&kc, [1, hkv, s, d]),
                        View4::contiguous(&vc, [1, hkv, s, d]),
                        0.125,
                        &mut out,
                    )
                });
                let bytes = 2.0 * (hkv * s * d * 2) as f64;
                line += &format!(
                    " {pname} {:8.1} us ({:5.1} GB/s KV)",
                    t * 1e6,
                    bytes / t / 1e9
                );
            }
            println!("{line}");
        }
    }
}
