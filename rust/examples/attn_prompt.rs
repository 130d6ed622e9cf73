//! Prompt attention timing without the rest of a step: one sequence's T-token prompt over its own T keys
//! (causal, f32), the shapes of a layer of SmolLM2-135M (9 query / 3 kv heads, head_dim 64) by default,
//! on one thread, minimum of many calls (the VM's noise only ever adds time). Prints the tier, the time
//! per call and the multiply-add rate (q.k and p.v products that a causal mask keeps).
//!
//! Run: `cargo run --release -p kwker-kernels --example attn_prompt [tokens=512] [hq=9] [hkv=3] [d=64] [iters=40]`
//! (`KWKER_ISA` picks the tier).

use std::time::Instant;

use kwker_kernels::attention::{decode_attention, View4};
use kwker_kernels::isa;
use kwker_kernels::par::Serial;

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("a number"))
        .collect();
    let arg = |i: usize, def: usize| a.get(i).copied().unwrap_or(def);
    let (t, hq, hkv, d, iters) = (arg(0, 512), arg(1, 9), arg(2, 3), arg(3, 64), arg(4, 40));
    let isa = isa::detect();
    // Deterministic values in [-1, 1): the timing does not depend on them.
    let fill = |n: usize, seed: u32| -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 8) as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    };
    let (q, k, v) = (
        fill(hq * t * d, 1),
        fill(hkv * t * d, 2),
        fill(hkv * t * d, 3),
    );
    let mut out = vec![0.0f32; hq * t * d];
    let mut best = f64::INFINITY;
    for _ in 0..iters {
        let s = Instant::now();
        decode_attention(
            isa,
            &Serial,
            View4::contiguous(&q, [1, hq, t, d]),
            View4::contiguous(&k, [1, hkv, t, d]),
            View4::contiguous(&v, [1, hkv, t, d]),
            0.125,
            &mut out,
        );
        best = best.min(s.elapsed().as_secs_f64());
    }
    let macs = 2.0 * (hq * d) as f64 * (t * (t + 1) / 2) as f64;
    println!(
        "{} T={t} Hq={hq} Hkv={hkv} D={d}: {:.3} ms, {:.1} GMAC/s (1 thread), checksum {:.6}",
        isa.name(),
        best * 1e3,
        macs / best / 1e9,
        out.iter().map(|&x| x as f64).sum::<f64>()
    );
}
