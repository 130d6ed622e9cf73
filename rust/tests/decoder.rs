//! The decoder composed from recipes: the tensor table's order, shapes and presence per composition;
//! the builder's refusals (unknown name, a tensor the recipe has no place for, a wrong shape, a missing
//! tensor); the recipe's JSON form; and, on random weights for recipes that use every part (sandwich
//! and post norms, parallel blocks, q/k norms per head and across the projection, partial rotary with
//! LongRoPE, windows, soft-caps, clipping, learned positions with a narrower embedding), that every tier
//! agrees with the scalar tier and that a prompt read in one step equals the same tokens read one by
//! one (10 rows cross LongRoPE's switch at 8); mixtures (dense and sparse layers, both routers) run each
//! chosen expert once per window over the rows that chose it. Exactness against Hugging Face is
//! tests/decoder/test_families.py.

mod common;

use common::recipes::{base, build_with, norm};
use kwker_kernels::decoder::builder::{Builder, Data, Store};
use kwker_kernels::decoder::recipe::*;
use kwker_kernels::decoder::tensors::{present, Tensor, TABLE};
use kwker_kernels::decoder::{Decoder, Logits, SeqStep};
use kwker_kernels::isa::{self, Isa};
use kwker_kernels::par::{ScopedThreads, Serial};

fn recipes() -> Vec<(&'static str, Recipe)> {
    let mut gemma = base(2);
    gemma.placement = Placement::Sandwich;
    gemma.mlp.act = Act::GeluTanh;
    gemma.qk_norm = Some(QkNorm {
        norm: norm(NormKind::Rms, false),
        scope: QkScope::Head,
        per_head_weights: false,
    });
    gemma.attn_softcap = Some(0.8);
    gemma.final_softcap = Some(3.0);
    gemma.embed_scale = 5.6;
    gemma.layer_specs[0].window = Some(3);
    if let Positions::Rotary { ropes } = &mut gemma.positions {
        let mut global = ropes[0].clone();
        global.inv_freq.iter_mut().for_each(|f| *f *= 0.5);
        global.long = Some(LongRope {
            inv_freq: ropes[0].inv_freq.iter().map(|f| f * 0.1).collect(),
            from_len: 8,
        });
        ropes.push(global);
    }
    gemma.layer_specs[1].rope = 1;
    let mut olmo2 = base(2);
    olmo2.placement = Placement::Post;
    olmo2.qk_norm = Some(QkNorm {
        norm: norm(NormKind::Rms, false),
        scope: QkScope::Full,
        per_head_weights: false,
    });
    olmo2.clip_qkv = Some(0.4);
    let mut neox = base(2);
    neox.norm = norm(NormKind::Layer, true);
    neox.block = Block::Parallel {
        shared_norm: false,
        residual_last: true,
    };
    neox.mlp = Mlp {
        gated: false,
        act: Act::GeluErf,
    };
    neox.bias = Biases {
        qkv: true,
        o: true,
        up: true,
        down: true,
        lm_head: true,
    };
    neox.tied_embeddings = false;
    let mut stablelm = base(1);
    stablelm.norm = norm(NormKind::Layer, true);
    stablelm.block = Block::Parallel {
        shared_norm: true,
        residual_last: false,
    };
    stablelm.qk_norm = Some(QkNorm {
        norm: norm(NormKind::Layer, false),
        scope: QkScope::Head,
        per_head_weights: true,
    });
    let mut opt = base(2);
    opt.norm = norm(NormKind::Layer, true);
    opt.placement = Placement::PostResidual;
    opt.final_norm = false;
    opt.embed_dim = 24;
    opt.mlp = Mlp {
        gated: false,
        act: Act::Relu,
    };
    opt.positions = Positions::Learned { offset: 2, len: 40 };
    let mut granite = base(2);
    granite.embed_scale = 12.0;
    granite.residual_scale = 0.22;
    granite.logit_divisor = 8.0;
    // A mixture: layer 0 dense, layers 1 and 2 sparse (4 experts of width 24, 2 per row).
    let mut mixtral = base(3);
    mixtral.moe = Some(Moe {
        experts: 4,
        top_k: 2,
        intermediate: 24,
        router: Router::SoftmaxTopk { renormalize: true },
    });
    mixtral.layer_specs[1].sparse = true;
    mixtral.layer_specs[2].sparse = true;
    let mut granite_moe = granite.clone();
    granite_moe.moe = Some(Moe {
        experts: 5,
        top_k: 3,
        intermediate: 16,
        router: Router::TopkSoftmax,
    });
    granite_moe
        .layer_specs
        .iter_mut()
        .for_each(|s| s.sparse = true);
    vec![
        ("gemma", gemma),
        ("olmo2", olmo2),
        ("neox", neox),
        ("stablelm", stablelm),
        ("opt", opt),
        ("granite", granite),
        ("mixtral", mixtral),
        ("granite_moe", granite_moe),
    ]
}

fn build(r: &Recipe, seed: u64) -> Decoder {
    let limits = Limits {
        slots: 2,
        max_context: 32,
        chunk_rows: 4,
        kv: KvFormat::F32,
    };
    build_with(r, seed, limits)
}

fn logits_of(dec: &mut Decoder, isa: Isa, tokens: &[u32], one_by_one: bool) -> Vec<f32> {
    let v = dec.recipe().vocab;
    dec.truncate(0, 0).unwrap();
    if !one_by_one {
        let mut out = vec![0.0; tokens.len() * v];
        dec.step(
            isa,
            &Serial,
            &[SeqStep {
                slot: 0,
                tokens,
                logits: Logits::All,
            }],
            &mut out,
        )
        .unwrap();
        return out;
    }
    let mut out = Vec::new();
    for t in tokens {
        let mut row = vec![0.0; v];
        dec.step(
            isa,
            &Serial,
            &[SeqStep {
                slot: 0,
                tokens: std::slice::from_ref(t),
                logits: Logits::Last,
            }],
            &mut row,
        )
        .unwrap();
        out.extend(row);
    }
    out
}

#[test]
fn the_table_is_in_enum_order_with_unique_names() {
    for (i, s) in TABLE.iter().enumerate() {
        assert_eq!(s.tensor as usize, i, "{} is row {i}", s.name);
        assert_eq!(Tensor::by_name(s.name), Some(s.tensor));
        assert_eq!(TABLE.iter().filter(|o| o.name == s.name).count(), 1);
    }
}

#[test]
fn compositions_decide_which_tensors_exist() {
    let rs = recipes();
    let names = |r: &Recipe| -> Vec<&str> {
        present(r)
            .iter()
            .filter(|x| x.layer == 0)
            .map(|x| x.tensor.spec().name)
            .collect()
    };
    let gemma = names(&rs[0].1);
    for n in [
        "attn_norm",
        "post_attn_norm",
        "mlp_norm",
        "post_mlp_norm",
        "q_norm",
        "k_norm",
    ] {
        assert!(gemma.contains(&n), "{n} missing from {gemma:?}");
    }
    assert!(!gemma.contains(&"lm_head"));
    let olmo2 = names(&rs[1].1);
    assert!(!olmo2.contains(&"attn_norm") && olmo2.contains(&"post_mlp_norm"));
    assert_eq!(
        Tensor::QNorm.shape(&rs[1].1, 0),
        Some([1, 64]),
        "full-width q norm"
    );
    assert_eq!(
        Tensor::KNorm.shape(&rs[3].1, 0),
        Some([1, 32]),
        "per-head k weights, 2 heads x 16"
    );
    assert_eq!(
        Tensor::QNorm.shape(&rs[0].1, 0),
        Some([1, 16]),
        "one head's weights shared"
    );
    let neox = names(&rs[2].1);
    assert!(
        neox.contains(&"mlp_norm.bias")
            && neox.contains(&"lm_head.bias")
            && !neox.contains(&"post_attn_norm")
    );
    let stablelm = names(&rs[3].1);
    assert!(
        !stablelm.contains(&"mlp_norm"),
        "a shared norm has no MLP norm"
    );
    let opt = names(&rs[4].1);
    assert!(opt.contains(&"proj_in") && opt.contains(&"pos_embed") && !opt.contains(&"final_norm"));
    assert_eq!(Tensor::Embed.shape(&rs[4].1, 0), Some([50, 24]));
    assert_eq!(Tensor::ProjOut.shape(&rs[4].1, 0), Some([24, 32]));
}

#[test]
fn the_builder_names_what_is_wrong() {
    let r = &recipes()[0].1;
    let limits = Limits {
        slots: 1,
        max_context: 8,
        chunk_rows: 8,
        kv: KvFormat::F32,
    };
    let mut b = Builder::new(r.clone(), limits).unwrap();
    let v = vec![0.5f32; 64 * 32];
    let err = b
        .set("qkv_proj", 0, 0, Data::F32(&v[..32]), 1, 32, Store::AsGiven)
        .unwrap_err();
    assert!(err.contains("unknown tensor name \"qkv_proj\""), "{err}");
    let err = b
        .set(
            "lm_head",
            0,
            0,
            Data::F32(&v[..50 * 32]),
            50,
            32,
            Store::AsGiven,
        )
        .unwrap_err();
    assert!(
        err.contains("lm_head (lm_head) is not part of this model's recipe"),
        "{err}"
    );
    let err = b
        .set(
            "qkv",
            1,
            0,
            Data::F32(&v[..32 * 32]),
            32,
            32,
            Store::AsGiven,
        )
        .unwrap_err();
    assert_eq!(
        err,
        "layer 1's qkv (the fused q/k/v projection) is [32, 32], expected [128, 32]"
    );
    let err = b
        .set("q_norm", 5, 0, Data::F32(&v[..16]), 1, 16, Store::AsGiven)
        .unwrap_err();
    assert!(err.contains("layer 5 does not exist"), "{err}");
    let err = b
        .set(
            "attn_norm",
            0,
            0,
            Data::F32(&v[..32]),
            1,
            32,
            Store::Quant(kwker_kernels::quant::Format::Q8, None),
        )
        .unwrap_err();
    assert!(err.contains("only matrices can be quantized"), "{err}");
    let err = b.build().err().expect("nothing was given");
    assert!(
        err.starts_with("embed (the token embedding) was never given"),
        "{err}"
    );
}

#[test]
fn recipes_round_trip_through_json_and_are_checked() {
    for (name, r) in recipes() {
        let text = serde_json::to_string(&r).unwrap();
        let back: Recipe = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r, "{name}");
        back.check().unwrap();
    }
    let mut bad = base(1);
    bad.layer_specs[0].sparse = true;
    assert_eq!(
        bad.check().unwrap_err(),
        "layer 0 is sparse but the recipe has no experts (moe)"
    );
    bad.moe = Some(Moe {
        experts: 4,
        top_k: 5,
        intermediate: 8,
        router: Router::TopkSoftmax,
    });
    assert_eq!(
        bad.check().unwrap_err(),
        "num_experts_per_tok (5) is more than num_experts (4)"
    );
    let mut bad = base(1);
    bad.layer_specs[0].window = Some(0);
    assert_eq!(
        bad.check().unwrap_err(),
        "layer 0: a sliding window must be positive"
    );
    let mut bad = base(1);
    bad.block = Block::Parallel {
        shared_norm: true,
        residual_last: true,
    };
    bad.placement = Placement::Sandwich;
    assert!(bad
        .check()
        .unwrap_err()
        .contains("parallel block takes pre-norm"));
    assert!(serde_json::from_str::<Recipe>(
        &serde_json::to_string(&base(1))
            .unwrap()
            .replace("\"hidden\"", "\"hiden\"")
    )
    .is_err());
}

#[test]
fn every_tier_agrees_and_one_step_equals_token_by_token() {
    let tokens: Vec<u32> = (0..10).map(|i| (i * 7 + 3) % 50).collect();
    for (name, r) in recipes() {
        let mut dec = build(&r, 11);
        let reference = logits_of(&mut dec, Isa::Generic, &tokens, true);
        let peak = reference.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(peak.is_finite() && peak > 0.0, "{name}");
        for tier in isa::supported() {
            for one_by_one in [false, true] {
                if name == "gemma" && !one_by_one {
                    continue; // LongRoPE: a 10-token step rotates every row long; one by one switches at row 8
                }
                let got = logits_of(&mut dec, tier, &tokens, one_by_one);
                let worst = got
                    .iter()
                    .zip(&reference)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                assert!(
                    worst <= 2e-5 * peak,
                    "{name} {} one_by_one={one_by_one}: {worst} vs peak {peak}",
                    tier.name()
                );
            }
        }
    }
}

#[test]
fn longrope_switches_on_the_whole_steps_largest_position() {
    let r = &recipes()[0].1;
    let mut dec = build(r, 12);
    let tokens: Vec<u32> = (0..10).map(|i| (i * 5 + 1) % 50).collect();
    // All 10 rows in one step: every row long (max position 9 + 1 > 8); rows 0..8 differ from the
    // one-by-one steps, which rotate them short.
    let together = logits_of(&mut dec, Isa::Generic, &tokens, false);
    let alone = logits_of(&mut dec, Isa::Generic, &tokens, true);
    let v = r.vocab;
    let row_diff = |i: usize| {
        (0..v)
            .map(|j| (together[i * v + j] - alone[i * v + j]).abs())
            .fold(0.0f32, f32::max)
    };
    assert!(
        row_diff(0) < 1e-5,
        "position 0 rotates by nothing, long or short"
    );
    assert!(row_diff(1) > 1e-3, "the long set must change a short row");
    // Token 8 (position 8: 9 > 8) is long alone too, but its keys 0..8 were written short one by one.
    assert!(row_diff(9) > 1e-4);
}

#[test]
fn learned_positions_beyond_the_table_are_refused() {
    let mut r = recipes()[4].1.clone();
    r.positions = Positions::Learned { offset: 2, len: 20 };
    let mut dec = build(&r, 13);
    dec.set_next_pos(0, 17).unwrap();
    let err = dec
        .step(
            Isa::Generic,
            &Serial,
            &[SeqStep {
                slot: 0,
                tokens: &[1, 2],
                logits: Logits::Last,
            }],
            &mut [0.0; 50],
        )
        .unwrap_err();
    assert!(
        err.contains("would reach position 18") && err.contains("holds 18 positions"),
        "{err}"
    );
    dec.truncate(0, 0).unwrap();
    dec.set_next_pos(0, 16).unwrap();
    dec.step(
        Isa::Generic,
        &Serial,
        &[SeqStep {
            slot: 0,
            tokens: &[1, 2],
            logits: Logits::Last,
        }],
        &mut [0.0; 50],
    )
    .unwrap();
}

#[test]
fn a_step_runs_each_chosen_expert_once_over_the_rows_that_chose_it() {
    let (_, r) = recipes()
        .into_iter()
        .find(|(n, _)| *n == "mixtral")
        .unwrap();
    let moe = r.moe.unwrap();
    let sparse = r.layer_specs.iter().filter(|s| s.sparse).count() as u64;
    let mut dec = build(&r, 14);
    let v = r.vocab;
    // A 10-token prompt in one step (windows of chunk_rows = 4): at most `experts` runs per window and
    // sparse layer, every row through its k experts.
    let tokens: Vec<u32> = (0..10).map(|i| (i * 3 + 2) % 50).collect();
    let before = dec.expert_counts();
    dec.step(
        Isa::Generic,
        &Serial,
        &[SeqStep {
            slot: 0,
            tokens: &tokens,
            logits: Logits::Last,
        }],
        &mut vec![0.0; v],
    )
    .unwrap();
    let after = dec.expert_counts();
    let windows = 10usize.div_ceil(4) as u64;
    assert_eq!(after.rows - before.rows, 10 * moe.top_k as u64 * sparse);
    assert!(after.runs - before.runs <= windows * moe.experts as u64 * sparse);
    // One decode row: exactly its k experts per sparse layer, one row each.
    dec.step(
        Isa::Generic,
        &Serial,
        &[SeqStep {
            slot: 0,
            tokens: &[7],
            logits: Logits::Last,
        }],
        &mut vec![0.0; v],
    )
    .unwrap();
    let last = dec.expert_counts();
    assert_eq!(last.runs - after.runs, moe.top_k as u64 * sparse);
    assert_eq!(last.rows - after.rows, moe.top_k as u64 * sparse);
    // ... in one linear call per matrix kind for all k of them (grouped), where the prompt's windows
    // of 4 rows x 2 picks (8 <= GROUP_PICKS) were grouped too.
    assert_eq!(last.calls - after.calls, 2 * sparse);
    assert_eq!(after.calls - before.calls, 2 * windows * sparse);
    // Bytes per decode token count the router and k of the experts.
    let w = dec.weights();
    let expert = |l: usize, e: usize| {
        let (u, d) = w.expert(l, e);
        u.bytes() + d.bytes()
    };
    assert_eq!(
        w.active_expert_bytes(1, moe.top_k),
        moe.top_k * expert(1, 0)
    );
    assert_eq!(w.active_expert_bytes(0, moe.top_k), 0, "layer 0 is dense");
}

#[test]
fn a_long_window_runs_expert_after_expert_with_the_grouped_rows_numbers() {
    let (_, r) = recipes()
        .into_iter()
        .find(|(n, _)| *n == "mixtral")
        .unwrap();
    let limits = Limits {
        slots: 1,
        max_context: 64,
        chunk_rows: 40,
        kv: KvFormat::F32,
    };
    let mut dec = build_with(&r, 15, limits);
    let sparse = r.layer_specs.iter().filter(|s| s.sparse).count() as u64;
    let tokens: Vec<u32> = (0..40).map(|i| (i * 7 + 1) % 50).collect();
    // 40 rows x 2 picks = 80 > GROUP_PICKS: one GEMM per chosen expert, two linear calls each.
    assert!(40 * r.moe.unwrap().top_k > kwker_kernels::decoder::moe::GROUP_PICKS);
    let before = dec.expert_counts();
    let whole = logits_of(&mut dec, Isa::Generic, &tokens, false);
    let after = dec.expert_counts();
    assert_eq!(after.calls - before.calls, 2 * (after.runs - before.runs));
    assert!(after.runs - before.runs <= r.moe.unwrap().experts as u64 * sparse);
    // Token by token every step is grouped; the logits agree to summation order.
    let single = logits_of(&mut dec, Isa::Generic, &tokens, true);
    let grouped = dec.expert_counts();
    assert_eq!(grouped.calls - after.calls, 2 * sparse * 40);
    let scale = single.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let worst = whole
        .iter()
        .zip(&single)
        .fold(0.0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(worst <= 1e-5 * scale, "{worst} of {scale}");
    // Threads change no number (each task owns whole output panels).
    let threaded = {
        dec.truncate(0, 0).unwrap();
        let mut out = vec![0.0; tokens.len() * r.vocab];
        dec.step(
            Isa::Generic,
            &ScopedThreads(2),
            &[SeqStep {
                slot: 0,
                tokens: &tokens,
                logits: Logits::All,
            }],
            &mut out,
        )
        .unwrap();
        out
    };
    assert_eq!(threaded, whole);
}
