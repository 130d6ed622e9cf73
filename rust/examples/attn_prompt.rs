//! Prompt attention timing without the rest of a step: one sequence's T-token prompt over its own T keys
//! (causal, f32), the shapes of a layer of SmolLM2-135M (9 query / 3 kv heads, head_dim 64) by default,
//! on one thread, minimum of many calls (the VM's noise only ever adds time). Prints the tier, the time
//! per call and the multiply-add rate (q.k and p.v products that a causal mask keeps).
//!
//! Run: `cargo run --release -p kwker-kernels --example attn_prompt [tokens=512] [hq=9] [hkv=3] [d=64] [iters=40]
//! [q8=0] [queries=T]` (`KWKER_ISA` picks the tier; `q8=1`: K and V as an 8-bit cache holds them, codes and a scale
//! per row, as int4's decoder runs; `queries=1`: a decode step's attention over T keys).

use std::time::Instant;

use kwker_kernels::attention::{attention_kv, AttnParams, KvView, View4};
use kwker_kernels::isa;
use kwker_kernels::par::Serial;

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .map(|s| s.parse().expect("a number"))
        .collect();
    let arg = |i: usize, def: usize| a.get(i).copied().unwrap_or(def);
    let (t, hq, hkv, d, iters) = (arg(0, 512), arg(1, 9), arg(2, 3), arg(3, 64), arg(4, 40));
    let q8 = arg(5, 0) == 1;
    // Query rows (the last `nq` of the T positions): 1 times a decode step over a T-key cache.
    let nq = arg(6, t).clamp(1, t);
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
        fill(hq * nq * d, 1),
        fill(hkv * t * d, 2),
        fill(hkv * t * d, 3),
    );
    // The 8-bit cache's rows: a scale per row (max / 127) and rounded codes.
    let quantize = |x: &[f32]| -> (Vec<i8>, Vec<f32>) {
        let mut codes = vec![0i8; x.len()];
        let mut scales = Vec::new();
        for (row, c) in x.chunks_exact(d).zip(codes.chunks_exact_mut(d)) {
            let s = row.iter().fold(0.0f32, |m, y| m.max(y.abs())) / 127.0;
            for (o, &y) in c.iter_mut().zip(row) {
                *o = (y / s).round() as i8;
            }
            scales.push(s);
        }
        (codes, scales)
    };
    let ((kc, ks), (vc, vs)) = (quantize(&k), quantize(&v));
    let dims = [1, hkv, t, d];
    fn view<'a>(
        q8: bool,
        dims: [usize; 4],
        x: &'a [f32],
        c: &'a [i8],
        s: &'a [f32],
    ) -> KvView<'a, f32> {
        if q8 {
            let scales = View4::contiguous(s, [dims[0], dims[1], dims[2], 1]);
            KvView::Q8 {
                codes: View4::contiguous(c, dims),
                scales,
            }
        } else {
            KvView::Elem(View4::contiguous(x, dims))
        }
    }
    let mut out = vec![0.0f32; hq * nq * d];
    let mut best = f64::INFINITY;
    for _ in 0..iters {
        let s = Instant::now();
        attention_kv(
            isa,
            &Serial,
            View4::contiguous(&q, [1, hq, nq, d]),
            view(q8, dims, &k, &kc, &ks),
            view(q8, dims, &v, &vc, &vs),
            &AttnParams::scaled(0.125),
            &mut out,
        );
        best = best.min(s.elapsed().as_secs_f64());
    }
    let seen = (t * (t + 1) - (t - nq) * (t - nq + 1)) / 2;
    let macs = 2.0 * (hq * d) as f64 * seen as f64;
    println!(
        "{}{} T={t} queries={nq} Hq={hq} Hkv={hkv} D={d}: {:.3} ms, {:.1} GMAC/s (1 thread), checksum {:.6}",
        isa.name(),
        if q8 { " q8" } else { "" },
        best * 1e3,
        macs / best / 1e9,
        out.iter().map(|&x| x as f64).sum::<f64>()
    );
}
