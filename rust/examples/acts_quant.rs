//! Activation quantization alone (`quantize_activations`, what every quantized linear starts with): the
//! best of 200 calls on one thread, per 32-block. Run: `cargo run --release --example acts_quant
//! [values]` (default 512 x 1536, a SmolLM2-135M prompt's MLP input; 16384 stays in L1); the tier is
//! the CPU's best or the one `KWKER_ISA` names.
use std::time::Instant;

use kwker_kernels::isa;
use kwker_kernels::quant::{quantize_activations, QActs, QSUB};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(512 * 1536, |v| v.parse().expect("values: a number"));
    assert!(n.is_multiple_of(QSUB), "values: a multiple of {QSUB}");
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 % 1009) as f32 - 504.0) / 504.0)
        .collect();
    let mut acts = QActs::default();
    let tier = isa::detect();
    let mut best = f64::MAX;
    for _ in 0..200 {
        let t = Instant::now();
        quantize_activations(tier, &x, &mut acts);
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "{} values ({}): {:.3} ms, {:.2} ns per 32-block",
        n,
        tier.name(),
        best * 1e3,
        best * 1e9 / (n / QSUB) as f64
    );
}
