//! The step executor against direct references: broadcasting pointwise maps with bf16 rounding,
//! a mean, attention through both the staircase fast path and the exact masked path (for every
//! tier this CPU runs), index_copy_ bounds, and decode-time rejection of views outside their slot.

use kwker_kernels::bf16::f32_to_bf16;
use kwker_kernels::exec::Program;
use kwker_kernels::isa::{self, Isa};
use kwker_kernels::par::Serial;

const F32: i64 = 0;
const BF16: i64 = 1;
const I64: i64 = 2;
const BOOL: i64 = 3;

fn view(slot: i64, offset: i64, dtype: i64, dims: &[i64], strides: &[i64]) -> Vec<i64> {
    let mut w = vec![slot, offset, dtype, dims.len() as i64];
    w.extend_from_slice(dims);
    w.extend_from_slice(strides);
    w
}

/// Buffers are plain Vec<u8>: the allocator aligns them to at least 8 bytes, and `Program::run`
/// reports (never assumes) misaligned buffers for the kernels that read typed slices.
fn run(words: &[i64], bufs: &mut [Vec<u8>], isa: Isa) -> Result<(), String> {
    let sizes: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
    let mut p = Program::decode(words, &sizes)?;
    let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
    // SAFETY: each pointer covers the size given to decode; nothing else touches the buffers.
    unsafe { p.run(isa, &Serial, &ptrs) }
}

fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn broadcast_add_rounds_once_to_bf16() {
    // out[2,3] (bf16) = a[2,3] (f32) + b[3] (f32, broadcast over rows)
    let a: Vec<f32> = (0..6).map(|i| 1.0 + i as f32 / 3.0).collect();
    let b = [0.001f32, -2.5, 1e-3];
    let mut bufs = vec![vec![0u8; 12], f32_bytes(&a), f32_bytes(&b)];
    let mut w = vec![1, 1];
    w.extend(view(0, 0, BF16, &[2, 3], &[3, 1]));
    w.push(2);
    w.push(0);
    w.extend(view(1, 0, F32, &[2, 3], &[3, 1]));
    w.push(0);
    w.extend(view(2, 0, F32, &[2, 3], &[0, 1]));
    run(&w, &mut bufs, Isa::Generic).unwrap();
    for i in 0..6 {
        let got = u16::from_le_bytes([bufs[0][2 * i], bufs[0][2 * i + 1]]);
        assert_eq!(got, f32_to_bf16(a[i] + b[i % 3]), "element {i}");
    }
}

#[test]
fn int64_add_and_scalar_operands() {
    // out[3] (i64) = x[3] + 5
    let x: Vec<u8> = [1i64, -4, 9].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut bufs = vec![vec![0u8; 24], x];
    let mut w = vec![1, 1];
    w.extend(view(0, 0, I64, &[3], &[1]));
    w.extend([2, 0]);
    w.extend(view(1, 0, I64, &[3], &[1]));
    w.extend([1, 5.0f64.to_bits() as i64]);
    run(&w, &mut bufs, Isa::Generic).unwrap();
    let got: Vec<i64> = bufs[0]
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, [6, 1, 14]);
}

#[test]
fn mean_over_the_last_dim() {
    let x: Vec<f32> = (0..2 * 37).map(|i| (i as f32).sin()).collect();
    let mut bufs = vec![vec![0u8; 8], f32_bytes(&x)];
    let mut w = vec![2, 1];
    w.extend(view(0, 0, F32, &[2], &[1]));
    w.extend(view(1, 0, F32, &[2, 37], &[37, 1]));
    run(&w, &mut bufs, Isa::Generic).unwrap();
    let got = bytes_f32(&bufs[0]);
    for r in 0..2 {
        let want: f64 = x[r * 37..(r + 1) * 37]
            .iter()
            .map(|&v| v as f64)
            .sum::<f64>()
            / 37.0;
        assert!((got[r] as f64 - want).abs() < 1e-6, "{} vs {want}", got[r]);
    }
}

/// Reference attention in f64 for q [1,H,T,D], k/v [1,Hkv,S,D] and a visibility mask [T][S].
fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: (usize, usize, usize, usize, usize),
    vis: &[Vec<bool>],
) -> Vec<f64> {
    let (h, hkv, t, s, d) = dims;
    let mut out = vec![0.0; h * t * d];
    for hh in 0..h {
        let kv = hh / (h / hkv);
        for tt in 0..t {
            let qr = &q[(hh * t + tt) * d..][..d];
            let sc: Vec<f64> = (0..s)
                .map(|j| {
                    let kr = &k[(kv * s + j) * d..][..d];
                    qr.iter()
                        .zip(kr)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * 0.25
                })
                .collect();
            let max = (0..s)
                .filter(|&j| vis[tt][j])
                .map(|j| sc[j])
                .fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = (0..s)
                .map(|j| if vis[tt][j] { (sc[j] - max).exp() } else { 0.0 })
                .collect();
            let sum: f64 = p.iter().sum();
            for i in 0..d {
                out[(hh * t + tt) * d + i] = (0..s)
                    .map(|j| p[j] * v[(kv * s + j) * d + i] as f64)
                    .sum::<f64>()
                    / sum;
            }
        }
    }
    out
}

fn attention_case(isa: Isa, vis: Vec<Vec<bool>>) {
    let (h, hkv, t, s, d) = (4usize, 2usize, vis.len(), vis[0].len(), 16usize);
    let gen = |n: usize, seed: f32| -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect()
    };
    let (q, k, v) = (
        gen(h * t * d, 0.1),
        gen(hkv * s * d, 0.7),
        gen(hkv * s * d, 1.3),
    );
    let mask: Vec<u8> = vis
        .iter()
        .flat_map(|r| r.iter().map(|&b| b as u8))
        .collect();
    let mut bufs = vec![
        (vec![0u8; 4 * h * t * d]),
        (f32_bytes(&q)),
        (f32_bytes(&k)),
        (f32_bytes(&v)),
        mask,
    ];
    let mut w = vec![4];
    w.extend(view(
        1,
        0,
        F32,
        &[1, h as i64, t as i64, d as i64],
        &[(h * t * d) as i64, (t * d) as i64, d as i64, 1],
    ));
    for slot in [2, 3] {
        w.extend(view(
            slot,
            0,
            F32,
            &[1, hkv as i64, s as i64, d as i64],
            &[(hkv * s * d) as i64, (s * d) as i64, d as i64, 1],
        ));
    }
    w.push(1);
    w.extend(view(
        4,
        0,
        BOOL,
        &[1, h as i64, t as i64, s as i64],
        &[0, 0, s as i64, 1],
    ));
    w.push(0);
    w.push(0.25f64.to_bits() as i64);
    w.extend(view(
        0,
        0,
        F32,
        &[1, h as i64, t as i64, d as i64],
        &[(h * t * d) as i64, (t * d) as i64, d as i64, 1],
    ));
    run(&w, &mut bufs, isa).unwrap();
    let got = bytes_f32(&bufs[0]);
    let want = reference(&q, &k, &v, (h, hkv, t, s, d), &vis);
    for (i, (g, r)) in got.iter().zip(&want).enumerate() {
        assert!(
            (*g as f64 - r).abs() < 2e-5,
            "{} element {i}: {g} vs {r}",
            isa.name()
        );
    }
}

#[test]
fn attention_staircase_and_irregular_masks_on_every_tier() {
    for isa in isa::supported() {
        // decode on a static cache of 9 slots, 5 in use: a prefix mask (fast path)
        attention_case(isa, vec![(0..9).map(|j| j < 5).collect()]);
        // a 3-token causal staircase over 6 of 9 slots (fast path)
        attention_case(
            isa,
            (0..3)
                .map(|t| (0..9).map(|j| j < 4 + t).collect())
                .collect(),
        );
        // left padding: not a prefix (exact masked path)
        attention_case(isa, vec![(0..9).map(|j| (2..6).contains(&j)).collect()]);
    }
}

#[test]
fn index_copy_checks_the_cache_position() {
    // dst [4, 2] f32, index [1] = pos, src [1, 2]
    let src = f32_bytes(&[7.0, 8.0]);
    for (pos, ok) in [(3i64, true), (4, false), (-1, false)] {
        let mut bufs = vec![vec![0u8; 32], pos.to_le_bytes().to_vec(), src.clone()];
        let mut w = vec![5, 0];
        w.extend(view(0, 0, F32, &[4, 2], &[2, 1]));
        w.extend(view(1, 0, I64, &[1], &[1]));
        w.extend(view(2, 0, F32, &[1, 2], &[2, 1]));
        let r = run(&w, &mut bufs, Isa::Generic);
        if ok {
            r.unwrap();
            assert_eq!(bytes_f32(&bufs[0])[6..], [7.0, 8.0]);
        } else {
            assert!(r.unwrap_err().contains("out of range"));
        }
    }
}

#[test]
fn views_outside_their_slot_are_rejected_at_decode() {
    let mut w = vec![1, 0];
    w.extend(view(0, 0, F32, &[4], &[1]));
    w.push(1);
    w.push(0);
    w.extend(view(1, 4, F32, &[4], &[1])); // 4 + 16 bytes > 16-byte slot
    let err = Program::decode(&w, &[16, 16]).err().unwrap();
    assert!(err.contains("reaches past"), "{err}");
}
