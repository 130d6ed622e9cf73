//! `vmath` (activations and soft-capping) and the decoder's norms and rotary: every tier the host has
//! against the scalar reference over lengths around the 8/16-lane tails (1, 7, 8, 9, 15, 16, 17, 63,
//! 65, 1536), inputs from -90 to 90 where exp under- and overflows; the reference against f64.
//!
//! Tolerances: SiLU and soft-capping 4e-7 relative (a few-ulp exp/tanh); GELU-tanh 3e-7 x max(1, |x|)
//! absolute (1 + tanh cancels for negative x: the result's absolute error, not its relative error, is
//! what a few-ulp tanh bounds); GELU-erf 2e-7 x max(1, |x|) absolute (the SIMD tiers use torch's own
//! Abramowitz-Stegun erf, |error| <= 1.5e-7, halved by the 0.5 x).

mod common;

use common::Rng;
use kwker_kernels::decoder::norm::{norm_rows, norm_rows_in_place};
use kwker_kernels::decoder::ops::rope;
use kwker_kernels::decoder::recipe::{Norm, NormKind};
use kwker_kernels::isa;
use kwker_kernels::vmath::{act_in_place, act_mul, generic, softcap, Act};

const LENS: [usize; 10] = [1, 7, 8, 9, 15, 16, 17, 63, 65, 1536];

fn inputs(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| match i % 7 {
            0 => rng.unit() * 90.0,
            1 => rng.unit() * 0.6, // tanh's polynomial branch
            _ => rng.unit() * 8.0,
        })
        .collect()
}

fn tol(act: Act, x: f32, want: f32) -> f32 {
    match act {
        Act::Silu => 4e-7 * want.abs().max(1e-30),
        Act::GeluTanh => 3e-7 * x.abs().max(1.0),
        Act::GeluErf => 2e-7 * x.abs().max(1.0),
        Act::Relu => 0.0,
    }
}

#[test]
fn activation_tiers_match_the_scalar_reference() {
    let mut rng = Rng::new(5);
    for act in [Act::Silu, Act::GeluTanh, Act::GeluErf, Act::Relu] {
        for n in LENS {
            let g = inputs(&mut rng, n);
            let u = rng.vec(n);
            let mut want = vec![0.0f32; n];
            generic::act_mul(act, &g, &u, &mut want);
            let mut plain = g.clone();
            generic::act_in_place(act, &mut plain);
            for tier in isa::supported() {
                let mut got = vec![f32::NAN; n];
                act_mul(tier, act, &g, &u, &mut got);
                let mut inplace = g.clone();
                act_in_place(tier, act, &mut inplace);
                for i in 0..n {
                    let t = tol(act, g[i], want[i]);
                    assert!(
                        (got[i] - want[i]).abs() <= t,
                        "{act:?} {}: n={n} i={i} x={} {} vs {}",
                        tier.name(),
                        g[i],
                        got[i],
                        want[i]
                    );
                    let t = tol(act, g[i], plain[i]);
                    assert!(
                        (inplace[i] - plain[i]).abs() <= t,
                        "{act:?} in place {}: n={n} x={} {} vs {}",
                        tier.name(),
                        g[i],
                        inplace[i],
                        plain[i]
                    );
                }
            }
        }
    }
}

#[test]
fn softcap_tiers_match_the_scalar_reference() {
    let mut rng = Rng::new(6);
    for cap in [0.5f32, 30.0, 50.0] {
        for n in LENS {
            let x: Vec<f32> = inputs(&mut rng, n).iter().map(|v| v * cap / 4.0).collect();
            let mut want = x.clone();
            generic::softcap(&mut want, cap);
            for tier in isa::supported() {
                let mut got = x.clone();
                softcap(tier, &mut got, cap);
                for i in 0..n {
                    let t = 4e-7 * want[i].abs().max(1e-6 * cap);
                    assert!(
                        (got[i] - want[i]).abs() <= t,
                        "{}: cap {cap} n={n} x={} {} vs {}",
                        tier.name(),
                        x[i],
                        got[i],
                        want[i]
                    );
                }
            }
        }
    }
}

#[test]
fn reference_erf_and_gelu_match_f64() {
    // erf values from the closed-form series evaluated to 20 digits (Abramowitz & Stegun table 7.1).
    for (x, want) in [
        (0.0f32, 0.0f64),
        (0.1, 0.112_462_916_018_284_9),
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (3.5, 0.999_999_256_901_627_7),
        (-1.5, -0.966_105_146_475_310_7),
        (5.0, 1.0),
    ] {
        let got = generic::erf(x) as f64;
        assert!(
            (got - want).abs() <= 6e-8 * want.abs().max(1e-3),
            "erf({x}) = {got}, want {want}"
        );
    }
    for x in [-3.0f32, -0.7, 0.0, 0.3, 2.5] {
        let xd = x as f64;
        let tanh_form = 0.5
            * xd
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
        assert!((generic::gelu_tanh(x) as f64 - tanh_form).abs() <= 2e-7 * xd.abs().max(1.0));
        assert!(
            (generic::silu(x) as f64 - xd / (1.0 + (-xd).exp())).abs() <= 2e-7 * xd.abs().max(1.0)
        );
    }
    assert!(generic::relu(f32::NAN).is_nan() && generic::relu(-2.0) == 0.0);
}

fn norm(kind: NormKind, weight: bool, bias: bool) -> Norm {
    Norm {
        kind,
        eps: 1e-5,
        weight,
        bias,
    }
}

#[test]
fn norms_match_f64_and_in_place_equals_out_of_place() {
    let mut rng = Rng::new(7);
    let (dim, rows) = (70, 3);
    let x: Vec<f32> = rng.vec(dim * rows).iter().map(|v| v * 3.0 + 0.5).collect();
    let w = rng.vec(dim);
    let b = rng.vec(dim);
    for n in [
        norm(NormKind::Rms, true, false),
        norm(NormKind::Layer, true, true),
        norm(NormKind::Layer, true, false),
        norm(NormKind::Layer, false, false),
    ] {
        let (wo, bo) = (n.weight.then_some(&w[..]), n.bias.then_some(&b[..]));
        let mut out = vec![0.0f32; dim * rows];
        norm_rows(&n, wo, bo, dim, &x, &mut out);
        let mut inplace = x.clone();
        norm_rows_in_place(&n, wo, bo, dim, &mut inplace);
        assert_eq!(out, inplace, "{n:?}");
        for r in 0..rows {
            let row: Vec<f64> = x[r * dim..(r + 1) * dim]
                .iter()
                .map(|&v| v as f64)
                .collect();
            let mean = if n.kind == NormKind::Layer {
                row.iter().sum::<f64>() / dim as f64
            } else {
                0.0
            };
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / dim as f64;
            for i in 0..dim {
                let wi = if n.weight { w[i] as f64 } else { 1.0 };
                let bi = if n.bias { b[i] as f64 } else { 0.0 };
                let want = (row[i] - mean) / (var + 1e-5).sqrt() * wi + bi;
                let got = out[r * dim + i] as f64;
                assert!(
                    (got - want).abs() <= 2e-6 * want.abs().max(1.0),
                    "{n:?} {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn partial_rotary_rotates_the_first_values_only() {
    let mut rng = Rng::new(8);
    let (d, half) = (10, 3);
    let mut q = rng.vec(2 * d);
    let orig = q.clone();
    let (cos, sin): (Vec<f32>, Vec<f32>) = (0..half)
        .map(|i| ((i as f32).cos(), (i as f32).sin()))
        .unzip();
    rope(&mut q, 2, d, &cos, &sin);
    for h in 0..2 {
        for i in 0..half {
            let (a, b) = (orig[h * d + i], orig[h * d + i + half]);
            assert_eq!(q[h * d + i], a * cos[i] - b * sin[i]);
            assert_eq!(q[h * d + i + half], b * cos[i] + a * sin[i]);
        }
        assert_eq!(
            q[h * d + 2 * half..(h + 1) * d],
            orig[h * d + 2 * half..(h + 1) * d]
        );
    }
}
