//! Panel-packed linear: every tier against the row-major scalar reference over awkward shapes (n and
//! k not multiples of anything, 1, 31/33, 63/65, tails of the 32-row panel and of the 256-long k
//! block, x rows on both sides of the 12-row tile limit; each row the same bits alone or in any call), bf16 and f32 weights, with and
//! without bias, serial and threaded; packing round-trips rows exactly.

mod common;

use common::Rng;
use kwker_kernels::bf16::bf16_to_f32;
use kwker_kernels::isa;
use kwker_kernels::linear::{linear, Weight};
use kwker_kernels::par::{ScopedThreads, Serial};
use kwker_kernels::pool::SpinPool;
use kwker_kernels::preserve_linear::{panel_linear, panel_linear_group, GroupItem, PanelWeight};

/// |a - b| <= 1e-5 * (sum of |x_k w_k| + |bias|): f32 summation-order error, never more.
fn check(got: &[f32], want: &[f32], scale: &[f32], what: &str) {
    for (i, ((g, w), s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * s + 1e-30,
            "{what}: element {i}: {g} vs {w} (scale {s})"
        );
    }
}

fn case(m: usize, n: usize, k: usize, bf16: bool, bias: bool, rng: &mut Rng) {
    let x = rng.vec(m * k);
    let wb = rng.bf16_vec(n * k);
    let wf: Vec<f32> = if bf16 {
        wb.iter().map(|&b| bf16_to_f32(b)).collect()
    } else {
        rng.vec(n * k)
    };
    let b = bias.then(|| rng.vec(n));
    let packed = if bf16 {
        PanelWeight::from_bf16(&wb, n, k)
    } else {
        PanelWeight::from_f32(&wf, n, k)
    };
    let mut want = vec![0.0f32; m * n];
    linear(
        isa::Isa::Generic,
        &Serial,
        &x,
        m,
        k,
        Weight::F32(&wf),
        n,
        b.as_deref(),
        &mut want,
    );
    let mut scale = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            scale[i * n + j] = (0..k)
                .map(|kk| (x[i * k + kk] * wf[j * k + kk]).abs())
                .sum::<f32>()
                + b.as_ref().map_or(0.0, |b| b[j].abs());
        }
    }
    for tier in isa::supported() {
        for threads in [1, 3] {
            let mut got = vec![f32::NAN; m * n];
            if threads == 1 {
                panel_linear(tier, &Serial, &x, m, &packed, b.as_deref(), &mut got);
            } else {
                panel_linear(
                    tier,
                    &ScopedThreads(threads),
                    &x,
                    m,
                    &packed,
                    b.as_deref(),
                    &mut got,
                );
            }
            let what = format!(
                "{} m={m} n={n} k={k} bf16={bf16} bias={bias} threads={threads}",
                tier.name()
            );
            check(&got, &want, &scale, &what);
        }
    }
}

#[test]
fn every_tier_matches_the_reference_on_awkward_shapes() {
    let mut rng = Rng::new(11);
    for &n in &[1, 31, 32, 33, 65, 100] {
        for &k in &[1, 2, 17, 63, 65, 257, 577] {
            for &m in &[1, 2, 4, 5, 12, 13] {
                case(m, n, k, true, n % 2 == 1, &mut rng);
            }
        }
    }
    for &(m, n, k) in &[(1, 33, 65), (3, 64, 300), (7, 31, 513), (17, 96, 70)] {
        case(m, n, k, false, true, &mut rng);
        case(m, n, k, false, false, &mut rng);
    }
}

/// A row's outputs are the same bits whatever rows share its call (1 row, a few, a prompt's many;
/// any place in the register tiles): a sequence's logits do not depend on the batch it is in. The
/// `amx` tier's GEMM for many bf16 rows is the stated exception (its tiles' order), so it is tested
/// on its f32 panels only.
#[test]
fn each_row_equals_that_row_alone_whatever_its_call() {
    let mut rng = Rng::new(15);
    for &(n, k) in &[(33, 65), (100, 577), (64, 1536)] {
        for bf16 in [true, false] {
            let m = 29;
            let x = rng.vec(m * k);
            let w = if bf16 {
                PanelWeight::from_bf16(&rng.bf16_vec(n * k), n, k)
            } else {
                PanelWeight::from_f32(&rng.vec(n * k), n, k)
            };
            let b = rng.vec(n);
            for tier in isa::supported() {
                if bf16 && tier == isa::Isa::Amx {
                    continue;
                }
                let mut alone = vec![0.0f32; m * n];
                for i in 0..m {
                    let (xi, yi) = (&x[i * k..(i + 1) * k], &mut alone[i * n..(i + 1) * n]);
                    panel_linear(tier, &Serial, xi, 1, &w, Some(&b), yi);
                }
                for rows in [2, 3, 4, 5, 12, 13, 29] {
                    let mut got = vec![f32::NAN; rows * n];
                    panel_linear(tier, &Serial, &x[..rows * k], rows, &w, Some(&b), &mut got);
                    assert_eq!(
                        got,
                        alone[..rows * n],
                        "{} rows={rows} n={n} k={k} bf16={bf16}",
                        tier.name()
                    );
                }
            }
        }
    }
}

#[test]
fn prompt_sized_gemm_matches_the_reference() {
    let mut rng = Rng::new(12);
    case(70, 224, 576, true, true, &mut rng);
    case(30, 100, 1536, false, false, &mut rng);
}

/// Shapes big enough to be cut into several tasks, on the decoder's own pool: every tier equals the
/// serial result of the same tier exactly (tasks own disjoint panels; no sum depends on the split).
#[test]
fn split_across_the_decoders_pool_equals_serial() {
    let mut rng = Rng::new(14);
    let pool = SpinPool::new(3);
    for &(m, n, k) in &[(1, 4096, 256), (8, 1000, 576), (40, 520, 300)] {
        let x = rng.vec(m * k);
        let w = PanelWeight::from_bf16(&rng.bf16_vec(n * k), n, k);
        let b = rng.vec(n);
        for tier in isa::supported() {
            let (mut serial, mut split) = (vec![0.0f32; m * n], vec![f32::NAN; m * n]);
            panel_linear(tier, &Serial, &x, m, &w, Some(&b), &mut serial);
            for _ in 0..3 {
                panel_linear(tier, &pool, &x, m, &w, Some(&b), &mut split);
                assert_eq!(serial, split, "{} m={m} n={n} k={k}", tier.name());
            }
        }
    }
}

#[test]
fn packed_rows_round_trip() {
    let mut rng = Rng::new(13);
    let (n, k) = (70, 19);
    let wb = rng.bf16_vec(n * k);
    let wf = rng.vec(n * k);
    let (pb, pf) = (
        PanelWeight::from_bf16(&wb, n, k),
        PanelWeight::from_f32(&wf, n, k),
    );
    let mut row = vec![0.0f32; k];
    for j in 0..n {
        pb.row_f32(j, &mut row);
        assert!(row
            .iter()
            .zip(&wb[j * k..(j + 1) * k])
            .all(|(a, &b)| *a == bf16_to_f32(b)));
        pf.row_f32(j, &mut row);
        assert_eq!(&row[..], &wf[j * k..(j + 1) * k]);
    }
    assert_eq!(pb.bytes(), 3 * 32 * k * 2); // 70 rows pad to 3 panels
}

#[test]
fn a_group_equals_each_linear_alone_in_every_tier() {
    // Items of awkward shapes (an empty one, k = 0, a prompt-sized one among them), as a mixture's
    // experts: each item's output is bit-identical to panel_linear of that item, serial or threaded.
    let mut rng = Rng::new(42);
    let shapes = [
        (1, 33, 63),
        (0, 32, 65),
        (3, 65, 300),
        (2, 5, 0),
        (20, 31, 257),
    ];
    for bf16 in [true, false] {
        let ws: Vec<PanelWeight> = shapes
            .iter()
            .map(|&(_, n, k)| {
                if bf16 {
                    PanelWeight::from_bf16(&rng.bf16_vec(n * k), n, k)
                } else {
                    PanelWeight::from_f32(&rng.vec(n * k), n, k)
                }
            })
            .collect();
        let xs: Vec<Vec<f32>> = shapes.iter().map(|&(m, _, k)| rng.vec(m * k)).collect();
        for tier in isa::supported() {
            let alone: Vec<Vec<f32>> = shapes
                .iter()
                .zip(&ws)
                .zip(&xs)
                .map(|((&(m, n, _), w), x)| {
                    let mut y = vec![0.0f32; m * n];
                    panel_linear(tier, &Serial, x, m, w, None, &mut y);
                    y
                })
                .collect();
            for threads in [1, 2] {
                let mut ys: Vec<Vec<f32>> = shapes
                    .iter()
                    .map(|&(m, n, _)| vec![f32::NAN; m * n])
                    .collect();
                let mut items: Vec<GroupItem<'_>> = shapes
                    .iter()
                    .zip(&ws)
                    .zip(&xs)
                    .zip(ys.iter_mut())
                    .map(|(((&(m, _, _), w), x), y)| GroupItem { x, m, w, y })
                    .collect();
                panel_linear_group(tier, &ScopedThreads(threads), &mut items);
                assert_eq!(
                    ys,
                    alone,
                    "bf16 {bf16} tier {} threads {threads}",
                    tier.name()
                );
            }
        }
    }
}
