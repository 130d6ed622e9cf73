//! The decoder's pointwise steps: every tier's SwiGLU against the scalar reference (lengths around
//! the 8/16-lane tails, inputs from -90 to 90 where exp under- and overflows), and RMSNorm/rotary
//! against f64.

mod common;

use common::Rng;
use kwker_kernels::decoder::ops::{rms_norm, rope, silu_mul, silu_mul_scalar};
use kwker_kernels::isa;

#[test]
fn swiglu_tiers_match_the_scalar_reference() {
    let mut rng = Rng::new(5);
    for n in [1usize, 7, 8, 9, 15, 16, 17, 33, 1536] {
        let g: Vec<f32> = (0..n)
            .map(|i| {
                if i % 5 == 0 {
                    rng.unit() * 90.0
                } else {
                    rng.unit() * 8.0
                }
            })
            .collect();
        let u = rng.vec(n);
        let mut gu = g.clone();
        gu.extend_from_slice(&u);
        let mut want = vec![0.0f32; n];
        silu_mul_scalar(&g, &u, &mut want);
        for tier in isa::supported() {
            let mut got = vec![f32::NAN; n];
            silu_mul(tier, &gu, n, &mut got);
            for i in 0..n {
                let tol = 4e-7 * want[i].abs().max(1e-30);
                assert!(
                    (got[i] - want[i]).abs() <= tol,
                    "{}: n={n} i={i} g={} {} vs {}",
                    tier.name(),
                    g[i],
                    got[i],
                    want[i]
                );
            }
        }
    }
}

#[test]
fn rms_norm_and_rope_match_f64() {
    let mut rng = Rng::new(6);
    let (dim, rows) = (70, 3);
    let x = rng.vec(dim * rows);
    let w = rng.vec(dim);
    let mut out = vec![0.0f32; dim * rows];
    rms_norm(&x, &w, 1e-5, &mut out);
    for r in 0..rows {
        let row = &x[r * dim..(r + 1) * dim];
        let ms: f64 = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / dim as f64;
        for i in 0..dim {
            let want = w[i] as f64 * row[i] as f64 / (ms + 1e-5).sqrt();
            assert!((out[r * dim + i] as f64 - want).abs() <= 1e-6 * want.abs().max(1e-6));
        }
    }
    let d = 8;
    let mut q = rng.vec(2 * d);
    let orig = q.clone();
    let (cos, sin): (Vec<f32>, Vec<f32>) = (0..d / 2)
        .map(|i| ((i as f32).cos(), (i as f32).sin()))
        .unzip();
    rope(&mut q, 2, d, &cos, &sin);
    for h in 0..2 {
        for i in 0..d / 2 {
            let (a, b) = (orig[h * d + i], orig[h * d + i + d / 2]);
            assert_eq!(q[h * d + i], a * cos[i] - b * sin[i]);
            assert_eq!(q[h * d + i + d / 2], b * cos[i] + a * sin[i]);
        }
    }
}
