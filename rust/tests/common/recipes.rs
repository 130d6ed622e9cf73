//! Decoder test recipes: a small model (`base`) every composition starts from, and a decoder of it on
//! seeded random float32 weights (`build_with`).

use super::Rng;
use kwker_kernels::decoder::builder::{Builder, Data, Store};
use kwker_kernels::decoder::recipe::*;
use kwker_kernels::decoder::tensors::present;
use kwker_kernels::decoder::Decoder;

pub fn norm(kind: NormKind, bias: bool) -> Norm {
    Norm {
        kind,
        eps: 1e-5,
        weight: true,
        bias,
    }
}

pub fn base(layers: usize) -> Recipe {
    let (d, half) = (16, 6);
    Recipe {
        vocab: 50,
        hidden: 32,
        embed_dim: 32,
        layers,
        heads: 4,
        kv_heads: 2,
        head_dim: d,
        intermediate: 48,
        norm: norm(NormKind::Rms, false),
        placement: Placement::Pre,
        block: Block::Sequential,
        mlp: Mlp {
            gated: true,
            act: Act::Silu,
        },
        moe: None,
        bias: Biases::default(),
        qk_norm: None,
        clip_qkv: None,
        clip_after_norm: false,
        attn_softcap: None,
        final_softcap: None,
        embed_scale: 1.0,
        residual_scale: 1.0,
        logit_divisor: 1.0,
        final_norm: true,
        tied_embeddings: true,
        positions: Positions::Rotary {
            ropes: vec![Rope {
                inv_freq: (0..half)
                    .map(|i| 1e3f32.powf(-(i as f32) / half as f32))
                    .collect(),
                scale: 1.0,
                long: None,
            }],
        },
        layer_specs: vec![
            LayerSpec {
                window: None,
                rope: 0,
                attn_scale: 0.3,
                sparse: false,
            };
            layers
        ],
    }
}

/// Recipes exercising every part.
pub fn build_with(r: &Recipe, seed: u64, limits: Limits) -> Decoder {
    let mut rng = Rng::new(seed);
    let mut b = Builder::new(r.clone(), limits).unwrap();
    for p in present(r) {
        let (t, layer, [rows, cols]) = (p.tensor, p.layer, p.shape);
        let scale = if t.spec().matrix { 0.4 } else { 0.2 };
        let data: Vec<f32> = rng
            .vec(rows * cols)
            .iter()
            .map(|v| v * scale + if t.spec().matrix { 0.0 } else { 1.0 })
            .collect();
        b.set(
            t.spec().name,
            layer,
            p.expert,
            Data::F32(&data),
            rows,
            cols,
            Store::AsGiven,
        )
        .unwrap();
    }
    b.build().unwrap()
}
