//! The decoder's bf16 panel linear at prompt shapes (what preserve reads a prompt with), per tier:
//! GFLOP/s of `panel_linear` on 2 threads, minimum over interleaved repetitions.
//! Run: `cargo run --release --example preserve_linear_prompt [m=512] [bf16x]` (`bf16x`: activations that are bf16
//! values, one AMX pass instead of three). Tiers: the default one, or `KWKER_ISA`'s.
use std::time::Instant;

use kwker_kernels::bf16::{bf16_to_f32, f32_to_bf16};
use kwker_kernels::isa;
use kwker_kernels::pool::SpinPool;
use kwker_kernels::preserve_linear::{panel_linear, PanelWeight};

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761);
            (h >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let m: usize = args
        .iter()
        .find_map(|a| a.strip_prefix("m="))
        .map_or(512, |v| v.parse().unwrap());
    let bf16x = args.iter().any(|a| a == "bf16x");
    let tier = isa::detect();
    let pool = SpinPool::new(2);
    // Qwen2.5-0.5B's q (896 -> 896), gate/up (896 -> 4864), down (4864 -> 896); SmolLM2-135M's up.
    let shapes = [
        (896, 896),
        (896, 4864),
        (4864, 896),
        (576, 1536),
        (1536, 576),
    ];
    let mut best = vec![f64::MAX; shapes.len()];
    let cases: Vec<_> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(k, n))| {
            let w: Vec<u16> = data(n * k, 7 + i as u32)
                .iter()
                .map(|&v| f32_to_bf16(v))
                .collect();
            let mut x = data(m * k, 3 + i as u32);
            if bf16x {
                x.iter_mut().for_each(|v| *v = bf16_to_f32(f32_to_bf16(*v)));
            }
            (PanelWeight::from_bf16(&w, n, k), x, vec![0f32; m * n])
        })
        .collect();
    let mut cases = cases;
    for _ in 0..7 {
        for (i, (w, x, y)) in cases.iter_mut().enumerate() {
            panel_linear(tier, &pool, x, m, w, None, y);
            let t = Instant::now();
            for _ in 0..3 {
                panel_linear(tier, &pool, x, m, w, None, y);
            }
            best[i] = best[i].min(t.elapsed().as_secs_f64() / 3.0);
        }
    }
    println!(
        "tier {} m={m} activations {}",
        tier.name(),
        if bf16x { "bf16" } else { "f32" }
    );
    for (i, &(k, n)) in shapes.iter().enumerate() {
        let fl = 2.0 * (m * n * k) as f64;
        println!(
            "k={k:<5} n={n:<5} {:8.1} us {:7.1} GFLOP/s",
            best[i] * 1e6,
            fl / best[i] / 1e9
        );
    }
}
