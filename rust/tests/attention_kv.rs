//! Attention over K and V in a cache's own format (`attention_kv`): bf16 rows give, bit for bit, the f32
//! attention over the values they stand for (widening is exact), in every tier, over awkward shapes (1 and
//! 65 keys, a split cache of 1,100 keys, head sizes 16 and 80, grouped heads, a window, several query
//! tokens); int8 rows with a scale each, whose scores are integer dot products of the keys' codes with
//! the scaled queries rounded as a cache row is (`quant::row_q8`) and whose weighted sums multiply the
//! value codes by 15-bit codes of the softmax numerators (`values_q8`), give the f32 attention over those
//! queries' and keys' values within 5e-5 (measured at most 1.9e-5 on values in [-1, 1]: half a code of
//! the numerators is 1.5e-5 of a chunk's largest), and give each query row the bits of that row alone
//! over its own prefix (what speculation and batching rely on), windowed or not; and a bf16 cache under
//! f32 queries does not round the softmax numerators as the all-bf16 torch op does.

mod common;

use common::Rng;
use kwker_kernels::attention::{attention, attention_kv, AttnParams, KvView, View4};
use kwker_kernels::bf16::{bf16_to_f32, Bf16};
use kwker_kernels::isa;
use kwker_kernels::par::{ScopedThreads, Serial};
use kwker_kernels::quant::row_q8::quantize_row_scalar;

/// Codes and scales of rows of `d` values (one scale per row), and the values they stand for.
fn q8_rows(x: &[f32], d: usize) -> (Vec<i8>, Vec<f32>, Vec<f32>) {
    let (mut codes, mut scales, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for row in x.chunks_exact(d) {
        let scale = row.iter().fold(0.0f32, |m, y| m.max(y.abs())) / 127.0;
        scales.push(scale);
        for &y in row {
            let c = (y / scale).round().clamp(-127.0, 127.0) as i8;
            codes.push(c);
            values.push(scale * c as f32);
        }
    }
    (codes, scales, values)
}

#[test]
fn stored_formats_equal_f32_attention_over_their_values() {
    let mut rng = Rng::new(3);
    let threads = ScopedThreads(2);
    let mut worst = 0.0f32;
    for tier in isa::supported() {
        for (hq, hkv, t, s, d, window) in [
            (1, 1, 1, 1, 16, None),
            (4, 2, 1, 65, 80, None),
            (6, 2, 3, 1100, 16, None),
            (2, 1, 5, 130, 80, Some(7)),
        ] {
            let q = rng.vec(hq * t * d);
            let kv_len = hkv * s * d;
            let (k, v) = (rng.vec(kv_len), rng.vec(kv_len));
            let params = AttnParams {
                scale: 0.3,
                softcap: None,
                window,
            };
            let dims = [1, hkv, s, d];
            let qv = View4::contiguous(&q, [1, hq, t, d]);
            let run_f32 = |k: &[f32], v: &[f32]| {
                let mut out = vec![0.0f32; hq * t * d];
                let (kv, vv) = (View4::contiguous(k, dims), View4::contiguous(v, dims));
                attention(tier, &threads, qv, kv, vv, &params, &mut out);
                out
            };
            let run = |k: KvView<'_, f32>, v: KvView<'_, f32>| {
                let mut out = vec![0.0f32; hq * t * d];
                attention_kv(tier, &Serial, qv, k, v, &params, &mut out);
                out
            };
            let at = format!("{} hq {hq} hkv {hkv} t {t} s {s} d {d}", tier.name());

            // bf16 rows.
            let to_bf16 = |x: &[f32]| -> Vec<Bf16> {
                x.iter()
                    .map(|&y| Bf16(kwker_kernels::bf16::f32_to_bf16(y)))
                    .collect()
            };
            let (kb, vb) = (to_bf16(&k), to_bf16(&v));
            let widen = |x: &[Bf16]| x.iter().map(|b| bf16_to_f32(b.0)).collect::<Vec<_>>();
            let want = run_f32(&widen(&kb), &widen(&vb));
            let got = run(
                KvView::Bf16(View4::contiguous(&kb, dims)),
                KvView::Bf16(View4::contiguous(&vb, dims)),
            );
            assert_eq!(bits(&got), bits(&want), "bf16, {at}");

            // int8 rows with a scale each, against f32 attention (scale 1) over the queries pre-scaled
            // and rounded as the kernel rounds them.
            let (kc, ks, kvals) = q8_rows(&k, d);
            let (vc, vs, vvals) = q8_rows(&v, d);
            let mut qr = vec![0.0f32; q.len()];
            for (row, dst) in q.chunks_exact(d).zip(qr.chunks_exact_mut(d)) {
                let scaled: Vec<f32> = row.iter().map(|&x| params.scale * x).collect();
                let mut codes = vec![0i8; d];
                let qs = quantize_row_scalar(&scaled, &mut codes);
                for (o, &c) in dst.iter_mut().zip(&codes) {
                    *o = qs * c as f32;
                }
            }
            let mut want = vec![0.0f32; hq * t * d];
            let unit = AttnParams {
                scale: 1.0,
                ..params
            };
            attention(
                tier,
                &threads,
                View4::contiguous(&qr, [1, hq, t, d]),
                View4::contiguous(&kvals, dims),
                View4::contiguous(&vvals, dims),
                &unit,
                &mut want,
            );
            let sdims = [1, hkv, s, 1];
            let got = run(
                KvView::Q8 {
                    codes: View4::contiguous(&kc, dims),
                    scales: View4::contiguous(&ks, sdims),
                },
                KvView::Q8 {
                    codes: View4::contiguous(&vc, dims),
                    scales: View4::contiguous(&vs, sdims),
                },
            );
            let err = got
                .iter()
                .zip(&want)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            worst = worst.max(err);
            assert!(err <= 5e-5, "q8, {at}: max error {err}");
            // Threads do not change a bit.
            let mut threaded = vec![0.0f32; hq * t * d];
            attention_kv(
                tier,
                &threads,
                qv,
                KvView::Q8 {
                    codes: View4::contiguous(&kc, dims),
                    scales: View4::contiguous(&ks, sdims),
                },
                KvView::Q8 {
                    codes: View4::contiguous(&vc, dims),
                    scales: View4::contiguous(&vs, sdims),
                },
                &params,
                &mut threaded,
            );
            assert_eq!(bits(&got), bits(&threaded), "q8 threaded, {at}");
        }
    }
    println!("q8 against f32 over the rounded queries: max error {worst:e}");
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// An 8-bit cache's rows computed together equal each row computed alone over its own prefix, bit for bit,
/// in every tier: the numerators' codes group keys by absolute position, never by the first row of a task.
#[test]
fn q8_rows_together_equal_each_row_alone() {
    let mut rng = Rng::new(5);
    for tier in isa::supported() {
        for (hq, hkv, t, s, d, window) in [
            (3, 1, 9, 70, 64, None),
            (2, 1, 7, 140, 80, Some(67)),
            (4, 2, 5, 600, 32, Some(100)),
            (1, 1, 3, 1100, 16, None),
            // Past 128 dims the scores stay f32 over the widened keys; the values stay integer.
            (2, 1, 4, 90, 160, Some(70)),
        ] {
            let q = rng.vec(hq * t * d);
            let x = rng.vec(hkv * s * d);
            let (kc, ks, _) = q8_rows(&x, d);
            let (vc, vs, _) = q8_rows(&rng.vec(hkv * s * d), d);
            let params = AttnParams {
                scale: 0.7,
                softcap: None,
                window,
            };
            let view = |codes, scales, n| q8_prefix(codes, scales, [hkv, s, n, d]);
            let mut all = vec![0.0f32; hq * t * d];
            let qv = View4::contiguous(&q, [1, hq, t, d]);
            attention_kv(
                tier,
                &Serial,
                qv,
                view(&kc, &ks, s),
                view(&vc, &vs, s),
                &params,
                &mut all,
            );
            for i in 0..t {
                // Row i alone: position s - t + i over the cache's first s - t + i + 1 keys.
                let n = s - t + i + 1;
                let qi: Vec<f32> = (0..hq)
                    .flat_map(|h| q[(h * t + i) * d..(h * t + i + 1) * d].to_vec())
                    .collect();
                let mut one = vec![0.0f32; hq * d];
                let qv = View4::contiguous(&qi, [1, hq, 1, d]);
                attention_kv(
                    tier,
                    &Serial,
                    qv,
                    view(&kc, &ks, n),
                    view(&vc, &vs, n),
                    &params,
                    &mut one,
                );
                for h in 0..hq {
                    assert_eq!(
                        bits(&all[(h * t + i) * d..(h * t + i + 1) * d]),
                        bits(&one[h * d..(h + 1) * d]),
                        "{} hq {hq} t {t} s {s} d {d} window {window:?}: row {i} head {h}",
                        tier.name()
                    );
                }
            }
        }
    }
}

/// The first n positions of each of hkv heads of an 8-bit cache of s positions (the full cache's strides).
fn q8_prefix<'a>(
    codes: &'a [i8],
    scales: &'a [f32],
    [hkv, s, n, d]: [usize; 4],
) -> KvView<'a, f32> {
    KvView::Q8 {
        codes: View4 {
            data: &codes[..((hkv - 1) * s + n) * d],
            dims: [1, hkv, n, d],
            strides: [hkv * s * d, s * d, d, 1],
        },
        scales: View4 {
            data: &scales[..(hkv - 1) * s + n],
            dims: [1, hkv, n, 1],
            strides: [hkv * s, s, 1, 1],
        },
    }
}
