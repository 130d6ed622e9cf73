//! `attention` with a sliding window and soft-capped scores (Gemma 2, Mistral, Gemma 3's local layers):
//! every tier the host has against an f64 reference, over windows of 1 key, fewer keys than the cache,
//! more keys than the cache, several query rows per block (prompts), caches long enough to be split
//! into key ranges (S > 512) whose windows start inside a later range, and GQA groupings.
//!
//! Tolerance: scores are O(1) (inputs in [-1, 1), scale 1/sqrt(D)) and outputs convex combinations of V
//! rows, so rounding-order, exp and tanh differences stay ~1e-6; we allow 2e-5 absolute, as the plain
//! attention tests do.

mod common;

use common::Rng;
use kwker_kernels::attention::{attention, AttnParams, View4};
use kwker_kernels::isa;
use kwker_kernels::par::{ScopedThreads, Serial};

/// f64 attention: query t of T sees keys max(0, S-T+t+1-w) ..= S-T+t, scores soft-capped.
#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    hq: usize,
    hkv: usize,
    t: usize,
    s: usize,
    d: usize,
    p: &AttnParams,
) -> Vec<f64> {
    let group = hq / hkv;
    let mut out = vec![0.0; hq * t * d];
    for h in 0..hq {
        let kvh = h / group;
        for tt in 0..t {
            let hi = s - t + tt + 1;
            let lo = hi.saturating_sub(p.window.unwrap_or(usize::MAX));
            let scores: Vec<f64> = (lo..hi)
                .map(|ss| {
                    let dot: f64 = (0..d)
                        .map(|i| q[(h * t + tt) * d + i] as f64 * k[(kvh * s + ss) * d + i] as f64)
                        .sum();
                    let x = dot * p.scale as f64;
                    match p.softcap {
                        Some(c) => (x / c as f64).tanh() * c as f64,
                        None => x,
                    }
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let den: f64 = e.iter().sum();
            for i in 0..d {
                let o: f64 = (lo..hi)
                    .map(|ss| e[ss - lo] * v[(kvh * s + ss) * d + i] as f64)
                    .sum();
                out[(h * t + tt) * d + i] = o / den;
            }
        }
    }
    out
}

fn check(
    hq: usize,
    hkv: usize,
    t: usize,
    s: usize,
    d: usize,
    window: Option<usize>,
    softcap: Option<f32>,
) {
    let mut rng = Rng::new((hq * 31 + t * 7 + s * 101 + d) as u64);
    let (q, k, v) = (
        rng.vec(hq * t * d),
        rng.vec(hkv * s * d),
        rng.vec(hkv * s * d),
    );
    let p = AttnParams {
        scale: (d as f32).powf(-0.5) * 3.0,
        softcap,
        window,
    };
    let want = reference(&q, &k, &v, hq, hkv, t, s, d, &p);
    let qv = View4::contiguous(&q[..], [1, hq, t, d]);
    let kv = View4::contiguous(&k[..], [1, hkv, s, d]);
    let vv = View4::contiguous(&v[..], [1, hkv, s, d]);
    for tier in isa::supported() {
        for threads in [1, 3] {
            let mut got = vec![f32::NAN; hq * t * d];
            if threads == 1 {
                attention(tier, &Serial, qv, kv, vv, &p, &mut got);
            } else {
                attention(tier, &ScopedThreads(threads), qv, kv, vv, &p, &mut got);
            }
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g as f64 - w).abs() <= 2e-5,
                    "{} x{threads}: Hq={hq} Hkv={hkv} T={t} S={s} D={d} window {window:?} cap {softcap:?}: \
                     element {i}: {g} vs {w}",
                    tier.name()
                );
            }
        }
    }
}

#[test]
fn windows_and_soft_caps_match_f64() {
    for (hq, hkv) in [(1, 1), (4, 1), (6, 3)] {
        for (t, s) in [(1, 1), (1, 9), (5, 9), (9, 9), (3, 70)] {
            for d in [17, 64] {
                for window in [None, Some(1), Some(4), Some(8), Some(500)] {
                    for softcap in [None, Some(0.7f32), Some(50.0)] {
                        check(hq, hkv, t, s, d, window, softcap);
                    }
                }
            }
        }
    }
}

#[test]
fn windows_over_split_key_ranges() {
    // S > 512: the keys are cut into ranges merged afterwards; windows start inside later ranges, and a
    // block of prompt rows sees ranges no single row covers alone.
    check(2, 1, 1, 1100, 64, Some(100), None);
    check(3, 1, 40, 1300, 32, Some(600), Some(5.0));
    check(2, 2, 64, 700, 16, Some(64), None);
    check(4, 2, 7, 1030, 64, Some(1030), None);
}
