//! Sliding-window attention in blocks: a prompt's attention with a window of w keys against full causal
//! attention, as time per visible (query, key) pair, so a window is shown to cost what full attention over
//! the same number of keys costs (no row-at-a-time path). Gemma 3 1B's shape: 4 query heads, 1 kv head,
//! head_dim 256; f32 K/V as the decoder keeps them; the decoder's pool of `threads` threads.
//!
//! Run: `cargo run --release -p kwker-kernels --example window_bench [threads]`.

use std::time::Instant;

use kwker_kernels::attention::{attention, AttnParams, View4};
use kwker_kernels::isa;
use kwker_kernels::pool::SpinPool;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let pool = SpinPool::new(threads);
    let tier = isa::detect();
    let (hq, hkv, d) = (4, 1, 256);
    println!(
        "tier {}, {threads} threads, Hq {hq} Hkv {hkv} D {d}",
        tier.name()
    );
    for (t, window) in [
        (512usize, None),
        (1024, None),
        (2048, Some(512usize)),
        (4096, Some(512)),
        (4096, Some(1024)),
    ] {
        let s = t;
        let q: Vec<f32> = (0..hq * t * d)
            .map(|i| ((i % 97) as f32 - 48.0) * 0.01)
            .collect();
        let k: Vec<f32> = (0..hkv * s * d)
            .map(|i| ((i % 89) as f32 - 44.0) * 0.01)
            .collect();
        let v = k.clone();
        let mut out = vec![0.0f32; hq * t * d];
        let p = AttnParams {
            scale: 0.0625,
            softcap: None,
            window,
        };
        let mut ts = Vec::new();
        for _ in 0..5 {
            let t0 = Instant::now();
            attention(
                tier,
                &pool,
                View4::contiguous(&q[..], [1, hq, t, d]),
                View4::contiguous(&k[..], [1, hkv, s, d]),
                View4::contiguous(&v[..], [1, hkv, s, d]),
                &p,
                &mut out,
            );
            ts.push(t0.elapsed().as_secs_f64());
        }
        let w = window.unwrap_or(usize::MAX);
        let pairs: usize = (0..t).map(|r| (r + 1).min(w)).sum::<usize>() * hq;
        let sec = median(ts);
        println!(
            "prompt {t:5} rows, window {:>5}: {:7.2} ms, {:5.2} ns per visible (query, key) pair",
            window.map_or("full".to_string(), |w| w.to_string()),
            sec * 1e3,
            sec * 1e9 / pairs as f64
        );
    }
}
