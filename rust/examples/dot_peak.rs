//! The machine's own multiply-add peak per instruction set, so a GEMM can report its share of it: each
//! instruction the quantized and float kernels are built on, issued back to back on 10-12 independent registers
//! (inline assembly: nothing for the compiler to hoist or fuse), on 1 thread and on every thread at once.
//!
//! Counted as multiply-adds (MACs) per instruction: `vpmaddubsw` 32 (u8 x i8 pairs into i16), AVX-VNNI
//! `vpdpbusd` 32 and AVX-512 `vpdpbusd` 64 (u8 x i8 quads into i32), `vfmadd231ps` 8 / 16. "maddubs + paddw" is
//! the AVX2 integer dot as the Q4 tiles issue it (one i16 add per product vector), the AVX2 rate a GEMM can
//! reach at best. Tiers this CPU lacks are skipped with a message.
//!
//! Run: `cargo run --release --example dot_peak [seconds per measurement]` (or
//! `python benchmarks/bench_peak.py`). Output: one line per instruction, GMAC/s on 1 thread and on all.
use std::arch::asm;
use std::arch::x86_64::*;
use std::time::Instant;

/// Iterations of each kernel's loop body per call (each body issues 10-12 instructions).
const ITERS: u64 = 1 << 20;

/// One measured instruction: its name, MACs per loop iteration, whether the CPU has it, and the loop.
struct Kernel {
    name: &'static str,
    macs_per_iter: f64,
    usable: fn() -> bool,
    run: fn(u64),
}

fn has(feature: &str) -> bool {
    match feature {
        "avx2" => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
        "avxvnni" => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("avxvnni"),
        "avx512vnni" => {
            is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni")
        }
        "avx512f" => is_x86_feature_detected!("avx512f"),
        _ => false,
    }
}

/// 10 independent `vpmaddubsw` (each writes its own register; no accumulation chain to wait on).
#[target_feature(enable = "avx2")]
unsafe fn maddubs(n: u64) {
    let (a, b) = (_mm256_set1_epi8(3), _mm256_set1_epi8(-5));
    // SAFETY: register-only instructions the CPU has (checked by `usable`); no memory, no stack.
    asm!(
        "2:",
        "vpmaddubsw {d0}, {a}, {b}", "vpmaddubsw {d1}, {a}, {b}", "vpmaddubsw {d2}, {a}, {b}",
        "vpmaddubsw {d3}, {a}, {b}", "vpmaddubsw {d4}, {a}, {b}", "vpmaddubsw {d5}, {a}, {b}",
        "vpmaddubsw {d6}, {a}, {b}", "vpmaddubsw {d7}, {a}, {b}", "vpmaddubsw {d8}, {a}, {b}",
        "vpmaddubsw {d9}, {a}, {b}",
        "dec {n}", "jnz 2b",
        n = inout(reg) n => _, a = in(ymm_reg) a, b = in(ymm_reg) b,
        d0 = out(ymm_reg) _, d1 = out(ymm_reg) _, d2 = out(ymm_reg) _, d3 = out(ymm_reg) _,
        d4 = out(ymm_reg) _, d5 = out(ymm_reg) _, d6 = out(ymm_reg) _, d7 = out(ymm_reg) _,
        d8 = out(ymm_reg) _, d9 = out(ymm_reg) _,
        options(nostack, nomem),
    );
}

/// 6 independent `vpmaddubsw` + `vpaddw` pairs (the product added into its own i16 accumulator).
#[target_feature(enable = "avx2")]
unsafe fn maddubs_add(n: u64) {
    let (a, b, z) = (
        _mm256_set1_epi8(3),
        _mm256_set1_epi8(-5),
        _mm256_setzero_si256(),
    );
    // SAFETY: as `maddubs`.
    asm!(
        "2:",
        "vpmaddubsw {t0}, {a}, {b}", "vpaddw {c0}, {c0}, {t0}",
        "vpmaddubsw {t1}, {a}, {b}", "vpaddw {c1}, {c1}, {t1}",
        "vpmaddubsw {t2}, {a}, {b}", "vpaddw {c2}, {c2}, {t2}",
        "vpmaddubsw {t0}, {a}, {b}", "vpaddw {c3}, {c3}, {t0}",
        "vpmaddubsw {t1}, {a}, {b}", "vpaddw {c4}, {c4}, {t1}",
        "vpmaddubsw {t2}, {a}, {b}", "vpaddw {c5}, {c5}, {t2}",
        "dec {n}", "jnz 2b",
        n = inout(reg) n => _, a = in(ymm_reg) a, b = in(ymm_reg) b,
        t0 = out(ymm_reg) _, t1 = out(ymm_reg) _, t2 = out(ymm_reg) _,
        c0 = inout(ymm_reg) z => _, c1 = inout(ymm_reg) z => _, c2 = inout(ymm_reg) z => _,
        c3 = inout(ymm_reg) z => _, c4 = inout(ymm_reg) z => _, c5 = inout(ymm_reg) z => _,
        options(nostack, nomem),
    );
}

/// `$name(n)`: `$instr` accumulating into 12 independent `$reg` registers, `n` times (latency 4-5 cycles:
/// 12 chains cover two pipes); `$a` / `$b` / `$z` build the operands and the zeroed accumulators.
macro_rules! chains12 {
    ($name:ident, $features:literal, $reg:ident, $instr:literal, $a:expr, $b:expr, $z:expr) => {
        #[target_feature(enable = $features)]
        unsafe fn $name(n: u64) {
            let (a, b, z) = ($a, $b, $z);
            // SAFETY: register-only instructions the CPU has (checked by `usable`); no memory, no stack.
            asm!(
                "2:",
                concat!($instr, " {c0}, {a}, {b}"), concat!($instr, " {c1}, {a}, {b}"),
                concat!($instr, " {c2}, {a}, {b}"), concat!($instr, " {c3}, {a}, {b}"),
                concat!($instr, " {c4}, {a}, {b}"), concat!($instr, " {c5}, {a}, {b}"),
                concat!($instr, " {c6}, {a}, {b}"), concat!($instr, " {c7}, {a}, {b}"),
                concat!($instr, " {c8}, {a}, {b}"), concat!($instr, " {c9}, {a}, {b}"),
                concat!($instr, " {c10}, {a}, {b}"), concat!($instr, " {c11}, {a}, {b}"),
                "dec {n}", "jnz 2b",
                n = inout(reg) n => _, a = in($reg) a, b = in($reg) b,
                c0 = inout($reg) z => _, c1 = inout($reg) z => _, c2 = inout($reg) z => _,
                c3 = inout($reg) z => _, c4 = inout($reg) z => _, c5 = inout($reg) z => _,
                c6 = inout($reg) z => _, c7 = inout($reg) z => _, c8 = inout($reg) z => _,
                c9 = inout($reg) z => _, c10 = inout($reg) z => _, c11 = inout($reg) z => _,
                options(nostack, nomem),
            );
        }
    };
}

chains12!(
    fma_ymm,
    "avx2,fma",
    ymm_reg,
    "vfmadd231ps",
    _mm256_set1_ps(1.0),
    _mm256_set1_ps(0.0),
    _mm256_setzero_ps()
);
// The VEX encoding of client CPUs without AVX-512.
chains12!(
    dpbusd_ymm,
    "avx2,avxvnni",
    ymm_reg,
    "{{vex}} vpdpbusd",
    _mm256_set1_epi8(3),
    _mm256_set1_epi8(-5),
    _mm256_setzero_si256()
);
chains12!(
    dpbusd_zmm,
    "avx512f,avx512vnni",
    zmm_reg,
    "vpdpbusd",
    _mm512_set1_epi8(3),
    _mm512_set1_epi8(-5),
    _mm512_setzero_si512()
);
chains12!(
    fma_zmm,
    "avx512f",
    zmm_reg,
    "vfmadd231ps",
    _mm512_set1_ps(1.0),
    _mm512_set1_ps(0.0),
    _mm512_setzero_ps()
);

fn kernels() -> Vec<Kernel> {
    vec![
        Kernel {
            name: "avx2 vpmaddubsw (32 MACs)",
            macs_per_iter: 10.0 * 32.0,
            usable: || has("avx2"),
            // SAFETY (each `run`): called only when `usable` says the CPU has the instructions.
            run: |n| unsafe { maddubs(n) },
        },
        Kernel {
            name: "avx2 vpmaddubsw + vpaddw",
            macs_per_iter: 6.0 * 32.0,
            usable: || has("avx2"),
            run: |n| unsafe { maddubs_add(n) },
        },
        Kernel {
            name: "avx2 vfmadd231ps ymm (8 f32 MACs)",
            macs_per_iter: 12.0 * 8.0,
            usable: || has("avx2"),
            run: |n| unsafe { fma_ymm(n) },
        },
        Kernel {
            name: "avxvnni vpdpbusd ymm (32 MACs)",
            macs_per_iter: 12.0 * 32.0,
            usable: || has("avxvnni"),
            run: |n| unsafe { dpbusd_ymm(n) },
        },
        Kernel {
            name: "avx512 vpdpbusd zmm (64 MACs)",
            macs_per_iter: 12.0 * 64.0,
            usable: || has("avx512vnni"),
            run: |n| unsafe { dpbusd_zmm(n) },
        },
        Kernel {
            name: "avx512 vfmadd231ps zmm (16 f32 MACs)",
            macs_per_iter: 12.0 * 16.0,
            usable: || has("avx512f"),
            run: |n| unsafe { fma_zmm(n) },
        },
    ]
}

/// GMAC/s of `k` on `threads` threads at once (each runs its loop for about `secs`; best of 3).
fn rate(k: &Kernel, threads: usize, secs: f64) -> f64 {
    // Calibrate the call count on one thread so that a measurement lasts about `secs`.
    let t = Instant::now();
    (k.run)(ITERS);
    let calls = ((secs / t.elapsed().as_secs_f64()).ceil() as u64).max(1);
    let mut best = 0.0f64;
    for _ in 0..3 {
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..calls {
                        (k.run)(ITERS);
                    }
                });
            }
        });
        let macs = k.macs_per_iter * (ITERS * calls * threads as u64) as f64;
        best = best.max(macs / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(0.3);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("instruction: GMAC/s on 1 thread, on {threads} threads");
    for k in kernels() {
        if !(k.usable)() {
            println!("{}: skipped (this CPU lacks it)", k.name);
            continue;
        }
        let one = rate(&k, 1, secs);
        let all = rate(&k, threads, secs);
        println!("{}: {one:.1}, {all:.1}", k.name);
    }
}
