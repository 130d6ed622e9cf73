//! Per-matrix decode bandwidth of the quantized formats: one x row through many copies of a
//! model's layer matrices (more bytes than any cache holds, so every pass streams from memory), as a
//! decode step reads them, on the decoder's 2-thread pool. Prints GB/s of weight bytes per matrix
//! shape and for the layer's matrices in decode order, beside a 2-thread read of as many bytes.
//!
//! Run: `cargo run --release -p kwker-kernels --example quant_stream [hidden inter q_rows kv_rows]`
//! (default SmolLM2-360M: 960 2560 960 320); `benchmarks/bench_matrices.py` runs it beside the triad.

use std::hint::black_box;
use std::time::Instant;

use kwker_kernels::isa;
use kwker_kernels::par::Parallel;
use kwker_kernels::pool::SpinPool;
use kwker_kernels::quant::{quant_linear, quantize, Format, QuantOptions, QuantWeight};

/// Bytes of weights cycled through per format: well past the last-level cache (`KWKER_STREAM_MB`
/// overrides it, e.g. 8 to measure the kernels' in-cache rate).
fn total() -> usize {
    let mb = std::env::var("KWKER_STREAM_MB")
        .ok()
        .and_then(|v| v.parse().ok());
    mb.unwrap_or(384) << 20
}
const ROUNDS: usize = 5;

fn rng_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// GB/s of reading `bytes` of u64s on the pool's threads (sums kept so nothing is elided).
fn read_gbs(pool: &SpinPool, data: &[u64]) -> f64 {
    let n = pool.threads();
    let per = data.len().div_ceil(n);
    let mut times = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let task = |i: usize| {
            let part = &data[(i * per).min(data.len())..((i + 1) * per).min(data.len())];
            black_box(part.iter().fold(0u64, |a, &v| a.wrapping_add(v)));
        };
        pool.run(n, &task);
        times.push(t.elapsed().as_secs_f64());
    }
    (data.len() * 8) as f64 / median(times) / 1e9
}

fn main() {
    let total = total();
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (h, inter, q, kv) = match args[..] {
        [h, i, q, kv] => (h, i, q, kv),
        _ => (960, 2560, 960, 320),
    };
    let shapes = [
        ("qkv", q + 2 * kv, h),
        ("o", h, q),
        ("gate_up", 2 * inter, h),
        ("down", h, inter),
    ];
    let tier = isa::best();
    let pool = SpinPool::new(2);
    let words = vec![1u64; total / 8];
    println!(
        "tier {} ({}), 2 threads; 2-thread read of {} MB: {:.1} GB/s",
        tier.name(),
        kwker_kernels::quant::kernel_name(tier),
        total >> 20,
        read_gbs(&pool, &words)
    );
    println!(
        "format shape n x k: GB/s per matrix (median of {ROUNDS} passes over {} MB)",
        total >> 20
    );
    for f in [Format::Q4K, Format::Q6K, Format::Q4, Format::Q8] {
        let opt = QuantOptions {
            format: f,
            importance: None,
            threads: 2,
        };
        // One quantized matrix per shape, cloned so the copies live at distinct addresses.
        let base: Vec<QuantWeight> = shapes
            .iter()
            .map(|&(_, n, k)| QuantWeight::pack(&quantize(&rng_vec(n * k, 7), n, k, &opt).unwrap()))
            .collect();
        let layer: usize = base.iter().map(|w| w.bytes()).sum();
        let copies = total.div_ceil(layer);
        let layers: Vec<Vec<QuantWeight>> = (0..copies).map(|_| base.clone()).collect();
        let x: Vec<Vec<f32>> = shapes.iter().map(|&(_, _, k)| rng_vec(k, 3)).collect();
        let mut y: Vec<Vec<f32>> = shapes.iter().map(|&(_, n, _)| vec![0.0; n]).collect();
        let mut line = format!("{:>4}", f.name());
        // Each shape alone, cycled through its copies.
        for (s, &(name, n, k)) in shapes.iter().enumerate() {
            let mut times = Vec::new();
            for _ in 0..ROUNDS {
                let t = Instant::now();
                for l in &layers {
                    quant_linear(tier, &pool, &x[s], 1, &l[s], None, &mut y[s]);
                }
                times.push(t.elapsed().as_secs_f64());
            }
            let gbs = (base[s].bytes() * copies) as f64 / median(times) / 1e9;
            line += &format!("  {name} {n}x{k} {gbs:.1}");
        }
        // The layer's matrices in decode order, layer after layer.
        let mut times = Vec::new();
        for _ in 0..ROUNDS {
            let t = Instant::now();
            for l in &layers {
                for s in 0..shapes.len() {
                    quant_linear(tier, &pool, &x[s], 1, &l[s], None, &mut y[s]);
                }
            }
            times.push(t.elapsed().as_secs_f64());
        }
        let gbs = (layer * copies) as f64 / median(times) / 1e9;
        // This machine's bandwidth drifts: a read measured right after, for the ratio.
        let read = read_gbs(&pool, &words);
        println!(
            "{line}  | layer in order {gbs:.1} GB/s = {:.2} of a read at {read:.1} ({:.2} MB per layer)",
            gbs / read,
            layer as f64 / 1e6
        );
        black_box(&y);
    }
}
