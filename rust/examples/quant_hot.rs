//! In-cache rate of each format's kernels at m = 1, 2, 4, 16 and 64 rows on one thread (compute bound, no memory
//! stalls): a matrix small enough for L2, called many times. Run: `cargo run --release --example quant_hot [n k]
//! [m=1,64,...] [q4k q6k q4 q8] [iters=N]` (the default tier, or the one `KWKER_ISA` names; `iters=N` times N calls
//! once, to count instructions under `valgrind --tool=callgrind`).
use std::hint::black_box;
use std::time::Instant;

use kwker_kernels::isa;
use kwker_kernels::pool::SpinPool;
use kwker_kernels::quant::{quant_linear, quantize, Format, QuantOptions, QuantWeight};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nums: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let (n, k) = match nums[..] {
        [n, k] => (n, k),
        _ => (256, 960),
    };
    let ms: Vec<usize> = args
        .iter()
        .find_map(|a| a.strip_prefix("m="))
        .map_or(vec![1, 2, 4, 16, 64], |l| {
            l.split(',').map(|v| v.parse().unwrap()).collect()
        });
    // `iters=N` (calls per timing, 5 timings): few, to count instructions under callgrind.
    let iters: Option<usize> = args
        .iter()
        .find_map(|a| a.strip_prefix("iters="))
        .map(|v| v.parse().unwrap());
    let reps = if iters.is_some() { 1 } else { 5 };
    let mut formats: Vec<Format> = Format::ALL
        .into_iter()
        .filter(|f| args.iter().any(|a| a == f.name()))
        .collect();
    if formats.is_empty() {
        formats = vec![Format::Q4K, Format::Q6K, Format::Q4, Format::Q8];
    }
    let tier = isa::detect();
    let pool = SpinPool::new(1);
    let x: Vec<f32> = (0..k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let wf: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919 % 1009) as f32 - 504.0) / 504.0)
        .collect();
    for &m in &ms {
        let xm: Vec<f32> = (0..m).flat_map(|_| x.iter().copied()).collect();
        for &f in &formats {
            let opt = QuantOptions {
                format: f,
                importance: None,
                threads: 1,
            };
            let w = QuantWeight::pack(&quantize(&wf, n, k, &opt).unwrap());
            let mut y = vec![0.0; m * n];
            let iters = iters.unwrap_or((200_000_000 / w.bytes()).max(10));
            let mut best = f64::MAX;
            for _ in 0..reps {
                let t = Instant::now();
                for _ in 0..iters {
                    quant_linear(tier, &pool, &xm, m, &w, None, &mut y);
                }
                best = best.min(t.elapsed().as_secs_f64() / iters as f64);
            }
            black_box(&y);
            println!(
                "{} m={m} {n}x{k} ({}): {:.2} us/call, {:.1} GB/s of weights, {:.1} GMAC/s",
                f.name(),
                kwker_kernels::quant::kernel_name(tier),
                best * 1e6,
                w.bytes() as f64 / best / 1e9,
                (m * n * k) as f64 / best / 1e9
            );
        }
    }
}
