//! A gated MLP's down projection fed straight from its gate/up output (`quant_linear_gated`): the same bits
//! as `vmath::act_mul` followed by `quant_linear`, in every tier and format, serial and split across
//! threads; a bad length is refused with a reason; and a quantized decoder's steps take that path.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use common::recipes::{base, build_with};
use common::Rng;
use kwker_kernels::decoder::builder::{Builder, Data, Store};
use kwker_kernels::decoder::recipe::{KvFormat, Limits, Recipe};
use kwker_kernels::decoder::tensors::present;
use kwker_kernels::decoder::{Decoder, Logits, SeqStep};
use kwker_kernels::isa::{self, Isa};
use kwker_kernels::par::{Parallel, ScopedThreads, Serial};
use kwker_kernels::quant::{
    gated_linears_run, quant_linear, quant_linear_gated, quantize, Format, QuantOptions,
    QuantWeight,
};
use kwker_kernels::vmath::{act_mul, Act};

fn weight(rng: &mut Rng, format: Format, n: usize, k: usize) -> QuantWeight {
    let opts = QuantOptions {
        format,
        importance: None,
        threads: 2,
    };
    QuantWeight::pack(&quantize(&rng.vec(n * k), n, k, &opts).unwrap())
}

/// act(gate) * up of each row, as the decoder's unfused path writes it.
fn hidden(isa: Isa, act: Act, gu: &[f32], m: usize, k: usize) -> Vec<f32> {
    let mut h = vec![0.0; m * k];
    for (row, o) in gu.chunks_exact(2 * k).zip(h.chunks_exact_mut(k)).take(m) {
        let (g, u) = row.split_at(k);
        act_mul(isa, act, g, u, o);
    }
    h
}

#[test]
fn a_gated_linear_equals_the_activation_then_the_linear_in_every_tier() {
    // Awkward shapes: one row (a decode step), a few (the packed tiles), many (the unpacked path); k not
    // a multiple of a super-block (576) and long enough (1536) that 100 rows split across two threads.
    let mut rng = Rng::new(71);
    let shapes = [(1, 33, 576), (5, 17, 192), (37, 40, 576), (100, 33, 1536)];
    for format in Format::ALL {
        for &(m, n, k) in &shapes {
            let w = weight(&mut rng, format, n, k);
            let bias = rng.vec(n);
            // Gate values spread over the activations' interesting range, up around one.
            let gu: Vec<f32> = rng.vec(m * 2 * k).iter().map(|v| 4.0 * v).collect();
            for tier in isa::supported() {
                for act in [Act::Silu, Act::GeluTanh, Act::GeluErf, Act::Relu] {
                    let h = hidden(tier, act, &gu, m, k);
                    let mut want = vec![0.0; m * n];
                    quant_linear(tier, &Serial, &h, m, &w, Some(&bias), &mut want);
                    let threads: [&dyn Parallel; 2] = [&Serial, &ScopedThreads(2)];
                    for par in threads {
                        let mut got = vec![f32::NAN; m * n];
                        let before = gated_linears_run();
                        quant_linear_gated(tier, par, &gu, act, m, &w, Some(&bias), &mut got);
                        assert_eq!(gated_linears_run() - before, 1);
                        assert_eq!(
                            got,
                            want,
                            "{format:?} {} {act:?} m={m} n={n} k={k} threads={}",
                            tier.name(),
                            par.num_threads()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_gate_up_of_the_wrong_length_is_refused_with_a_reason() {
    let mut rng = Rng::new(72);
    let w = weight(&mut rng, Format::Q4K, 16, 64);
    // Two rows need 2 x (gate + up) = 256 values; 192 is three rows of k.
    let gu = rng.vec(3 * 64);
    let mut y = vec![0.0; 2 * 16];
    let err = catch_unwind(AssertUnwindSafe(|| {
        quant_linear_gated(Isa::Generic, &Serial, &gu, Act::Silu, 2, &w, None, &mut y)
    }))
    .expect_err("a short gate/up must be refused");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert_eq!(
        msg,
        "quant_linear_gated: gate/up has 192 elements, expected 2*2*64"
    );
}

/// One slot, room for the test's prompt in one step.
fn limits() -> Limits {
    Limits {
        slots: 1,
        max_context: 32,
        chunk_rows: 16,
        kv: KvFormat::F32,
    }
}

/// `base`'s model widened so that every matrix's columns are whole 32-blocks, its matrices quantized.
fn quantized(r: &Recipe, format: Format) -> Decoder {
    let mut rng = Rng::new(73);
    let mut b = Builder::new(r.clone(), limits()).unwrap();
    for p in present(r) {
        let (t, layer, [rows, cols]) = (p.tensor, p.layer, p.shape);
        let matrix = t.spec().matrix;
        let data: Vec<f32> = rng
            .vec(rows * cols)
            .iter()
            .map(|v| if matrix { 0.4 * v } else { 1.0 + 0.2 * v })
            .collect();
        let store = if matrix {
            Store::Quant(format, None)
        } else {
            Store::AsGiven
        };
        let name = t.spec().name;
        b.set(name, layer, p.expert, Data::F32(&data), rows, cols, store)
            .unwrap();
    }
    b.build().unwrap()
}

fn prompt_logits(dec: &mut Decoder, isa: Isa, tokens: &[u32]) -> Vec<f32> {
    let mut out = vec![0.0; tokens.len() * dec.recipe().vocab];
    dec.truncate(0, 0).unwrap();
    let step = [SeqStep {
        slot: 0,
        tokens,
        logits: Logits::All,
    }];
    dec.step(isa, &Serial, &step, &mut out).unwrap();
    out
}

#[test]
fn a_quantized_decoders_mlps_take_the_gated_path_and_float_ones_do_not() {
    let mut r = base(2);
    r.hidden = 64;
    r.embed_dim = 64;
    r.intermediate = 96;
    let tokens: Vec<u32> = (0..11).map(|t| (t * 7 + 3) % 50).collect();
    for tier in isa::supported() {
        let mut dec = quantized(&r, Format::Q4K);
        let before = gated_linears_run();
        let logits = prompt_logits(&mut dec, tier, &tokens);
        assert_eq!(gated_linears_run() - before, r.layers, "{}", tier.name());
        assert!(logits.iter().all(|v| v.is_finite()));
        let mut float = build_with(&r, 5, limits());
        let before = gated_linears_run();
        prompt_logits(&mut float, tier, &tokens);
        assert_eq!(gated_linears_run() - before, 0, "{}", tier.name());
    }
}
