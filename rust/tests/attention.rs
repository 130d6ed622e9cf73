//! `decode_attention` tests: every supported tier against the generic tier and an f64
//! reference over head counts, GQA groupings, causal query blocks, cache lengths, head sizes,
//! strided layouts, f32 and bf16; plus runner independence, empty inputs and validation.
//!
//! Tolerances. Inputs are in [-1, 1) and scale = 1/sqrt(D), so scores are O(1) and outputs are
//! convex combinations of V rows (|out| <= 1). f32 outputs: rounding-order and exp differences
//! are ~1e-6; we allow 2e-5 absolute. bf16 outputs: both sides are rounded to bf16, which may
//! differ by one bf16 ulp when an f32 value sits on a rounding boundary; and the kernel rounds
//! the softmax numerators to bf16 before P·V (as torch does for bf16), a relative error of at
//! most 2^-9 per weight, so at most 2^-9 * max|v| = 2^-9 on the output. We allow
//! 2^-7 * |value| + 2^-9 + 2e-5.

mod common;

use common::Rng;
use kwker_kernels::attention::{decode_attention, View4};
use kwker_kernels::bf16::{Bf16, Element};
use kwker_kernels::isa::{self, Isa};
use kwker_kernels::par::{Parallel, ScopedThreads, Serial};

/// How q (and the cache) are laid out in memory.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// [B, H, T, D] contiguous; cache [B, Hkv, S, D] contiguous.
    Contiguous,
    /// q stored [B, T, H, D] (torch's pre-transpose layout); cache stored [B, Hkv, S_cap, D]
    /// with spare capacity S_cap = S + 3 and 5 floats of padding per row (stride D + 5).
    Strided,
}

struct Tensor<E> {
    data: Vec<E>,
    dims: [usize; 4],
    strides: [usize; 4],
}

impl<E: Element> Tensor<E> {
    fn view(&self) -> View4<'_, E> {
        View4 {
            data: &self.data,
            dims: self.dims,
            strides: self.strides,
        }
    }
    fn at(&self, i: [usize; 4]) -> f64 {
        let off: usize = (0..4).map(|a| i[a] * self.strides[a]).sum();
        self.data[off].to_f32() as f64
    }
}

/// A logical [a, b, c, d] tensor stored with the given axis order and padding.
fn make<E: Element>(
    rng: &mut Rng,
    dims: [usize; 4],
    storage_order: [usize; 4],
    cap: [usize; 4],
) -> Tensor<E> {
    // Storage dims (outer to inner) with capacities; strides computed back to logical axes.
    let mut strides = [0usize; 4];
    let mut stride = 1;
    for &axis in storage_order.iter().rev() {
        strides[axis] = stride;
        stride *= cap[axis];
    }
    let data = (0..stride).map(|_| E::from_f32(rng.unit())).collect();
    let _ = dims;
    Tensor {
        data,
        dims,
        strides,
    }
}

struct Case<E> {
    q: Tensor<E>,
    k: Tensor<E>,
    v: Tensor<E>,
    scale: f32,
}

impl<E: Element> Case<E> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        seed: u64,
        b: usize,
        hq: usize,
        hkv: usize,
        t: usize,
        s: usize,
        d: usize,
        l: Layout,
    ) -> Self {
        let mut rng = Rng::new(seed);
        let qd = [b, hq, t, d];
        let kd = [b, hkv, s, d];
        let (q, k, v) = match l {
            Layout::Contiguous => (
                make(&mut rng, qd, [0, 1, 2, 3], qd),
                make(&mut rng, kd, [0, 1, 2, 3], kd),
                make(&mut rng, kd, [0, 1, 2, 3], kd),
            ),
            Layout::Strided => {
                let kcap = [b, hkv, s + 3, d + 5];
                (
                    make(&mut rng, qd, [0, 2, 1, 3], qd),
                    make(&mut rng, kd, [0, 1, 2, 3], kcap),
                    make(&mut rng, kd, [0, 1, 2, 3], kcap),
                )
            }
        };
        Case {
            q,
            k,
            v,
            scale: 1.0 / (d as f32).sqrt(),
        }
    }

    fn run(&self, isa: Isa, par: &dyn Parallel) -> Vec<E> {
        let [b, hq, t, d] = self.q.dims;
        let mut out = vec![E::from_f32(f32::NAN); b * hq * t * d];
        decode_attention(
            isa,
            par,
            self.q.view(),
            self.k.view(),
            self.v.view(),
            self.scale,
            &mut out,
        );
        out
    }

    /// Straightforward f64 softmax attention with the causal-against-cache-end mask.
    fn reference(&self) -> Vec<f64> {
        let [b, hq, t, d] = self.q.dims;
        let [_, hkv, s, _] = self.k.dims;
        let group = hq / hkv;
        let mut out = vec![0.0; b * hq * t * d];
        for bb in 0..b {
            for h in 0..hq {
                let kvh = h / group;
                for tt in 0..t {
                    let visible = s - t + tt + 1;
                    let scores: Vec<f64> = (0..visible)
                        .map(|ss| {
                            (0..d)
                                .map(|i| self.q.at([bb, h, tt, i]) * self.k.at([bb, kvh, ss, i]))
                                .sum::<f64>()
                                * self.scale as f64
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let p: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                    let denom: f64 = p.iter().sum();
                    for i in 0..d {
                        let o: f64 = (0..visible)
                            .map(|ss| p[ss] * self.v.at([bb, kvh, ss, i]))
                            .sum();
                        out[((bb * hq + h) * t + tt) * d + i] = o / denom;
                    }
                }
            }
        }
        out
    }
}

fn tolerance<E: Element>(value: f64) -> f64 {
    let bf16 = std::mem::size_of::<E>() == 2;
    if bf16 {
        value.abs() / 128.0 + 1.0 / 512.0 + 2e-5
    } else {
        2e-5
    }
}

fn assert_close<E: Element>(what: &str, got: &[E], want: &[f64]) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f32() as f64;
        let tol = tolerance::<E>(w);
        assert!(
            (g - w).abs() <= tol,
            "{what}: element {i}: got {g}, want {w}, |diff| {:e} > {tol:e}",
            (g - w).abs()
        );
    }
}

fn check<E: Element>(b: usize, (hq, hkv): (usize, usize), t: usize, s: usize, d: usize, l: Layout) {
    let seed = (b * 7 + hq * 131 + t * 17 + s * 1009 + d * 65537) as u64;
    let case = Case::<E>::new(seed, b, hq, hkv, t, s, d, l);
    let exact = case.reference();
    let tag = format!(
        "{} B={b} Hq={hq} Hkv={hkv} T={t} S={s} D={d} {l:?}",
        if std::mem::size_of::<E>() == 2 {
            "bf16"
        } else {
            "f32"
        }
    );
    let oracle = case.run(Isa::Generic, &Serial);
    assert_close(&format!("generic vs f64, {tag}"), &oracle, &exact);
    let oracle64: Vec<f64> = oracle.iter().map(|x| x.to_f32() as f64).collect();
    for isa in isa::supported() {
        let got = case.run(isa, &Serial);
        assert_close(&format!("{} vs f64, {tag}", isa.name()), &got, &exact);
        assert_close(
            &format!("{} vs generic, {tag}", isa.name()),
            &got,
            &oracle64,
        );
    }
}

fn grid<E: Element>() {
    for b in [1, 2] {
        for heads in [(1, 1), (4, 1), (9, 3), (8, 8)] {
            for t in [1, 3] {
                for s in [1, 5, 65, 200] {
                    if t > s {
                        continue;
                    }
                    for d in [1, 17, 64, 80, 128] {
                        let layout = if (b + t + s + d) % 2 == 0 {
                            Layout::Contiguous
                        } else {
                            Layout::Strided
                        };
                        check::<E>(b, heads, t, s, d, layout);
                    }
                }
            }
        }
    }
}

#[test]
fn grid_f32() {
    grid::<f32>();
}

#[test]
fn grid_bf16() {
    grid::<Bf16>();
}

/// Both layouts for a few shapes regardless of the grid's alternation; T = S (plain causal
/// self-attention) and a long cache spanning several key chunks.
#[test]
fn layouts_full_causal_and_long_cache() {
    for l in [Layout::Contiguous, Layout::Strided] {
        check::<f32>(1, (4, 2), 7, 7, 64, l);
        check::<Bf16>(2, (6, 3), 5, 5, 80, l);
        check::<f32>(1, (9, 3), 2, 1000, 64, l);
        check::<Bf16>(1, (2, 1), 1, 777, 33, l);
        // Key ranges split and merged (S > 512), with several query tokens per block and
        // query blocks whose visible keys end in different splits.
        check::<f32>(1, (3, 1), 3, 1100, 64, l);
        check::<Bf16>(1, (2, 2), 600, 600, 16, l);
        // Many query rows per kv head (exercises query blocking past 32 rows).
        check::<f32>(1, (40, 1), 3, 50, 16, l);
    }
}

/// Tasks are split differently for different thread counts, but each output row is computed
/// by the same code in the same order, so results must be bit-identical.
#[test]
fn runners_agree_exactly() {
    let case = Case::<Bf16>::new(3, 2, 9, 3, 3, 300, 64, Layout::Strided);
    for isa in isa::supported() {
        let serial = case.run(isa, &Serial);
        for threads in [2, 3, 8] {
            assert_eq!(
                serial,
                case.run(isa, &ScopedThreads(threads)),
                "{} {threads}t",
                isa.name()
            );
        }
    }
}

#[test]
fn empty_inputs_return_quietly() {
    let none: [f32; 0] = [];
    let kv = [0.5f32; 8];
    for isa in isa::supported() {
        for qdims in [[0, 2, 1, 4], [1, 0, 1, 4], [1, 2, 0, 4]] {
            let q = View4::contiguous(&none, qdims);
            let k = View4::contiguous(&kv, [1, 1, 2, 4]);
            decode_attention(isa, &Serial, q, k, k, 1.0, &mut []);
        }
        // S = 0 with T = 0.
        let q = View4::contiguous(&none, [1, 2, 0, 4]);
        let k = View4::contiguous(&none, [1, 1, 0, 4]);
        decode_attention(isa, &Serial, q, k, k, 1.0, &mut []);
    }
}

fn attend_f32(q: View4<'_, f32>, k: View4<'_, f32>, out_len: usize) {
    let mut out = vec![0.0f32; out_len];
    decode_attention(isa::detect(), &Serial, q, k, k, 1.0, &mut out);
}

#[test]
#[should_panic(expected = "T must be <= S")]
fn more_queries_than_keys_panics() {
    let d = [0.0f32; 64];
    attend_f32(
        View4::contiguous(&d, [1, 1, 3, 4]),
        View4::contiguous(&d, [1, 1, 2, 4]),
        12,
    );
}

#[test]
#[should_panic(expected = "not a multiple")]
fn ungrouped_heads_panic() {
    let d = [0.0f32; 64];
    attend_f32(
        View4::contiguous(&d, [1, 3, 1, 4]),
        View4::contiguous(&d, [1, 2, 2, 4]),
        12,
    );
}

#[test]
#[should_panic(expected = "unit stride")]
fn non_unit_last_stride_panics() {
    let d = [0.0f32; 64];
    let q = View4 {
        data: &d[..],
        dims: [1, 1, 1, 4],
        strides: [8, 8, 8, 2],
    };
    attend_f32(q, View4::contiguous(&d, [1, 1, 2, 4]), 4);
}

#[test]
#[should_panic(expected = "needs 16 elements")]
fn short_data_panics() {
    let d = [0.0f32; 15];
    attend_f32(
        View4::contiguous(&d[..4], [1, 1, 1, 4]),
        View4::contiguous(&d, [1, 1, 4, 4]),
        4,
    );
}

#[test]
#[should_panic(expected = "out has 3 elements")]
fn wrong_out_len_panics() {
    let d = [0.0f32; 16];
    attend_f32(
        View4::contiguous(&d[..4], [1, 1, 1, 4]),
        View4::contiguous(&d, [1, 1, 2, 4]),
        3,
    );
}

/// Query token t of a T-token call over S keys against the same token alone over its S - T + t + 1
/// keys (as a decoder's multi-token step against one-token steps): bit-identical in every tier,
/// whatever groups of 8 keys the scores fall in (cache lengths on both sides of a multiple of 8) and
/// whichever rows share a tile (a multi-token call shares K/V loads among 3 rows: with one or two
/// query heads per kv head the one-token call runs the single-row kernels; head sizes 80 and 96 mix
/// the AVX2 tier's in-order and split column blocks and a masked tail).
fn rows_equal_one_token_calls<E: Element>() {
    let mut rng = Rng::new(41);
    for (hq, hkv, d) in [(9, 3, 64), (4, 4, 64), (4, 2, 80), (3, 3, 96), (2, 1, 128)] {
        rows_equal_for_shape::<E>(&mut rng, hq, hkv, d);
    }
}

fn rows_equal_for_shape<E: Element>(rng: &mut Rng, hq: usize, hkv: usize, d: usize) {
    for prefix in [79, 80, 81, 85] {
        for t in [2, 7, 8, 9, 13] {
            let s = prefix + t;
            let to_e = |v: Vec<f32>| v.into_iter().map(E::from_f32).collect::<Vec<E>>();
            let (q, k, v) = (
                to_e(rng.vec(hq * t * d)),
                to_e(rng.vec(hkv * s * d)),
                to_e(rng.vec(hkv * s * d)),
            );
            let strides = [hkv * s * d, s * d, d, 1];
            fn kv<E: Element>(data: &[E], keys: usize, strides: [usize; 4]) -> View4<'_, E> {
                let (hkv, d) = (strides[0] / strides[1], strides[2]);
                View4 {
                    data,
                    dims: [1, hkv, keys, d],
                    strides,
                }
            }
            for isa in isa::supported() {
                let mut all = vec![E::from_f32(0.0); hq * t * d];
                let qv = View4::contiguous(&q, [1, hq, t, d]);
                decode_attention(
                    isa,
                    &Serial,
                    qv,
                    kv(&k, s, strides),
                    kv(&v, s, strides),
                    0.125,
                    &mut all,
                );
                for tok in 0..t {
                    // The token's queries alone: [1, Hq, 1, D] with the full tensor's head stride.
                    let one_q = View4 {
                        data: &q[tok * d..],
                        dims: [1, hq, 1, d],
                        strides: [hq * t * d, t * d, d, 1],
                    };
                    let keys = prefix + tok + 1;
                    let mut one = vec![E::from_f32(0.0); hq * d];
                    decode_attention(
                        isa,
                        &Serial,
                        one_q,
                        kv(&k, keys, strides),
                        kv(&v, keys, strides),
                        0.125,
                        &mut one,
                    );
                    for h in 0..hq {
                        let got = &all[(h * t + tok) * d..][..d];
                        assert!(
                            got.iter().zip(&one[h * d..][..d]).all(|(a, b)| a.to_f32().to_bits() == b.to_f32().to_bits()),
                            "{} Hq {hq} Hkv {hkv} D {d} prefix {prefix} T {t}: token {tok} head {h} \
                             differs from its one-token call",
                            isa.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn each_query_row_equals_its_one_token_call_f32() {
    rows_equal_one_token_calls::<f32>();
}

#[test]
fn each_query_row_equals_its_one_token_call_bf16() {
    rows_equal_one_token_calls::<Bf16>();
}
