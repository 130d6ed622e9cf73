//! A step's hidden-state output (`Output::Hidden`, what embeddings pool): the rows are the lm_head's
//! input, so multiplying them by the lm_head gives the step's own logits (to float32 summation order),
//! with a narrower embedding (`proj_out`) they are embed_dim wide, and a hidden step writes the same K/V
//! as a logits step (the next token's logits are bit for bit those after a logits step). A buffer of the
//! wrong size is refused with a message.

mod common;

use common::recipes::{base, build_with};
use kwker_kernels::decoder::recipe::*;
use kwker_kernels::decoder::{Decoder, Logits, Output, SeqStep};
use kwker_kernels::isa::Isa;
use kwker_kernels::par::Serial;

fn decoder(r: &Recipe) -> Decoder {
    let limits = Limits {
        slots: 2,
        max_context: 32,
        chunk_rows: 4,
        kv: KvFormat::F32,
    };
    build_with(r, 21, limits)
}

fn run(dec: &mut Decoder, slot: usize, tokens: &[u32], mode: Logits, output: Output) -> Vec<f32> {
    let batch = [SeqStep {
        slot,
        tokens,
        logits: mode,
    }];
    let mut out = vec![0.0; Decoder::logit_rows(&batch) * output.width(dec.recipe())];
    dec.step_as(Isa::Generic, &Serial, &batch, output, &mut out)
        .unwrap();
    out
}

#[test]
fn hidden_rows_times_the_lm_head_are_the_logits_and_leave_the_same_cache() {
    let tokens: Vec<u32> = (0..9).map(|i| (i * 11 + 5) % 50).collect();
    let mut narrow = base(2);
    narrow.embed_dim = 24; // proj_in / proj_out (OPT-350m): hidden rows are embed_dim wide
    narrow.tied_embeddings = false;
    for r in [base(2), narrow] {
        let mut dec = decoder(&r);
        let (v, e) = (r.vocab, r.embed_dim);
        let hidden = run(&mut dec, 0, &tokens, Logits::All, Output::Hidden);
        let logits = run(&mut dec, 1, &tokens, Logits::All, Output::Logits);
        assert_eq!(hidden.len(), tokens.len() * e);
        let peak = logits.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let mut row = vec![0.0f32; e];
        let mut worst = 0.0f32;
        for t in 0..tokens.len() {
            for j in 0..v {
                dec.weights().lm_head().row_f32(j, &mut row);
                let h = &hidden[t * e..(t + 1) * e];
                let dot: f64 = h.iter().zip(&row).map(|(a, b)| *a as f64 * *b as f64).sum();
                worst = worst.max((dot as f32 - logits[t * v + j]).abs());
            }
        }
        assert!(
            worst <= 1e-5 * peak,
            "embed_dim {e}: {worst} vs peak {peak}"
        );
        // The next token after a hidden step and after a logits step: the same bits.
        let a = run(&mut dec, 0, &[7], Logits::Last, Output::Logits);
        let b = run(&mut dec, 1, &[7], Logits::Last, Output::Logits);
        assert_eq!(a, b);
    }
}

#[test]
fn a_hidden_buffer_of_the_wrong_size_is_refused() {
    let r = base(1);
    let mut dec = decoder(&r);
    let batch = [SeqStep {
        slot: 0,
        tokens: &[1, 2, 3],
        logits: Logits::Last,
    }];
    let mut out = vec![0.0; r.vocab];
    let err = dec
        .step_as(Isa::Generic, &Serial, &batch, Output::Hidden, &mut out)
        .unwrap_err();
    assert!(
        err.contains("hidden-state buffer holds 50 floats, the batch needs 32"),
        "{err}"
    );
}
