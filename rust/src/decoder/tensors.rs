//! The one table of the decoder's tensors: each tensor's name (as it crosses the FFI, is saved, and
//! is named in the quantization plan), whether it is per layer and a matrix, and, from a `Recipe`,
//! whether the model has it and its shape. The builder, the shape checks, save/load (`export`) and the
//! Python side's loading and quantization plan all read this table; a new tensor is one row here.
//!
//! Matrices are [rows, cols] = [outputs, inputs] as `nn.Linear` stores them (fused projections stack
//! their parts' rows: q/k/v as [q; k; v], a gated MLP's first matrix as [gate; up]); vectors are
//! [1, n]. The embedding and the learned position table are matrices read by row.
//!
//! A sparse layer (`LayerSpec::sparse`) has a router [experts, hidden] and, per expert, an up and a down
//! matrix (shaped as the dense MLP's, of the experts' width) in place of the dense MLP's; those are the
//! table's per-expert rows, placed by (layer, expert).

use super::recipe::{Positions, QkScope, Recipe};

/// Every tensor a decoder may hold, in `TABLE` order (the discriminant is the row).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tensor {
    Embed,
    PosEmbed,
    ProjIn,
    ProjOut,
    FinalNorm,
    FinalNormBias,
    LmHead,
    LmHeadBias,
    AttnNorm,
    AttnNormBias,
    Qkv,
    QkvBias,
    QNorm,
    QNormBias,
    KNorm,
    KNormBias,
    O,
    OBias,
    PostAttnNorm,
    PostAttnNormBias,
    MlpNorm,
    MlpNormBias,
    Up,
    UpBias,
    Down,
    DownBias,
    PostMlpNorm,
    PostMlpNormBias,
    Router,
    ExpertUp,
    ExpertDown,
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub tensor: Tensor,
    /// The name across the FFI, in saved files and in `formats=` plans.
    pub name: &'static str,
    pub per_layer: bool,
    /// One per expert of a sparse layer (placed by layer and expert).
    pub per_expert: bool,
    pub matrix: bool,
    /// What it is, for people (error messages).
    pub about: &'static str,
}

const fn spec(
    tensor: Tensor,
    name: &'static str,
    per_layer: bool,
    matrix: bool,
    about: &'static str,
) -> Spec {
    Spec {
        tensor,
        name,
        per_layer,
        per_expert: false,
        matrix,
        about,
    }
}

const fn expert_spec(tensor: Tensor, name: &'static str, about: &'static str) -> Spec {
    Spec {
        tensor,
        name,
        per_layer: true,
        per_expert: true,
        matrix: true,
        about,
    }
}

use Tensor::*;

// One line a tensor: its name in the C API, per layer, a matrix, what it is.
#[rustfmt::skip]
pub const TABLE: [Spec; 31] = [
    spec(Embed, "embed", false, true, "the token embedding"),
    spec(PosEmbed, "pos_embed", false, true, "the learned position embedding",),
    spec(ProjIn, "proj_in", false, true, "the projection from the embedding width (project_in)",),
    spec(ProjOut, "proj_out", false, true, "the projection to the embedding width (project_out)",),
    spec(FinalNorm, "final_norm", false, false, "the final norm's weight",),
    spec(FinalNormBias, "final_norm.bias", false, false, "the final norm's bias",),
    spec(LmHead, "lm_head", false, true, "lm_head"),
    spec(LmHeadBias, "lm_head.bias", false, false, "lm_head's bias"),
    spec(AttnNorm, "attn_norm", true, false, "the attention input norm's weight",),
    spec(AttnNormBias, "attn_norm.bias", true, false, "the attention input norm's bias",),
    spec(Qkv, "qkv", true, true, "the fused q/k/v projection"),
    spec(QkvBias, "qkv.bias", true, false, "the q/k/v bias"),
    spec(QNorm, "q_norm", true, false, "the q norm's weight"),
    spec(QNormBias, "q_norm.bias", true, false, "the q norm's bias"),
    spec(KNorm, "k_norm", true, false, "the k norm's weight"),
    spec(KNormBias, "k_norm.bias", true, false, "the k norm's bias"),
    spec(O, "o", true, true, "the attention output projection"),
    spec(OBias, "o.bias", true, false, "the attention output bias"),
    spec(PostAttnNorm, "post_attn_norm", true, false, "the attention output norm's weight",),
    spec(PostAttnNormBias, "post_attn_norm.bias", true, false, "the attention output norm's bias",),
    spec(MlpNorm, "mlp_norm", true, false, "the MLP input norm's weight",),
    spec(MlpNormBias, "mlp_norm.bias", true, false, "the MLP input norm's bias",),
    spec(Up, "up", true, true, "the MLP's first projection (gate and up stacked when gated)",),
    spec(UpBias, "up.bias", true, false, "the MLP's first bias"),
    spec(Down, "down", true, true, "the MLP's down projection"),
    spec(DownBias, "down.bias", true, false, "the MLP's down bias"),
    spec(PostMlpNorm, "post_mlp_norm", true, false, "the MLP output norm's weight",),
    spec(PostMlpNormBias, "post_mlp_norm.bias", true, false, "the MLP output norm's bias",),
    spec(Router, "router", true, true, "the mixture's router (one row per expert)",),
    expert_spec(ExpertUp, "expert_up", "an expert's first projection (gate and up stacked when gated)",),
    expert_spec(ExpertDown, "expert_down", "an expert's down projection"),
];

/// Where a stored tensor sits: its layer (0 for model-level) and expert (0 unless per expert).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub tensor: Tensor,
    pub layer: usize,
    pub expert: usize,
    pub shape: [usize; 2],
}

impl Tensor {
    pub fn spec(self) -> &'static Spec {
        &TABLE[self as usize]
    }

    pub fn by_name(name: &str) -> Option<Tensor> {
        TABLE.iter().find(|s| s.name == name).map(|s| s.tensor)
    }

    /// [rows, cols] of this tensor in layer `l` of a model of recipe `r` (any `l` for model-level
    /// tensors), or None when it has none.
    pub fn shape(self, r: &Recipe, l: usize) -> Option<[usize; 2]> {
        let sparse = r.sparse(l);
        let (h, e) = (r.hidden, r.embed_dim);
        let vec = |present: bool, n: usize| present.then_some([1, n]);
        let norm_w = r.norm.weight;
        let norm_b = r.norm.bias;
        let qk = r.qk_norm.as_ref();
        let qk_len = |heads: usize| {
            qk.map(|q| match (q.scope, q.per_head_weights) {
                (QkScope::Head, false) => r.head_dim,
                _ => heads * r.head_dim,
            })
        };
        match self {
            Embed => Some([r.vocab, e]),
            PosEmbed => match r.positions {
                Positions::Learned { len, .. } => Some([len, h]),
                Positions::Rotary { .. } => None,
            },
            ProjIn => (e != h).then_some([h, e]),
            ProjOut => (e != h).then_some([e, h]),
            FinalNorm => vec(r.final_norm && norm_w, h),
            FinalNormBias => vec(r.final_norm && norm_b, h),
            LmHead => (!r.tied_embeddings).then_some([r.vocab, e]),
            LmHeadBias => vec(r.bias.lm_head, r.vocab),
            AttnNorm => vec(r.has_attn_norm() && norm_w, h),
            AttnNormBias => vec(r.has_attn_norm() && norm_b, h),
            Qkv => Some([r.qkv_width(), h]),
            QkvBias => vec(r.bias.qkv, r.qkv_width()),
            QNorm => qk
                .filter(|q| q.norm.weight)
                .and(qk_len(r.heads))
                .map(|n| [1, n]),
            QNormBias => qk
                .filter(|q| q.norm.bias)
                .and(qk_len(r.heads))
                .map(|n| [1, n]),
            KNorm => qk
                .filter(|q| q.norm.weight)
                .and(qk_len(r.kv_heads))
                .map(|n| [1, n]),
            KNormBias => qk
                .filter(|q| q.norm.bias)
                .and(qk_len(r.kv_heads))
                .map(|n| [1, n]),
            O => Some([h, r.q_width()]),
            OBias => vec(r.bias.o, h),
            PostAttnNorm | PostMlpNorm => vec(r.has_post_norms() && norm_w, h),
            PostAttnNormBias | PostMlpNormBias => vec(r.has_post_norms() && norm_b, h),
            MlpNorm => vec(r.has_mlp_norm() && norm_w, h),
            MlpNormBias => vec(r.has_mlp_norm() && norm_b, h),
            Up => (!sparse).then_some([r.up_rows(), h]),
            UpBias => vec(!sparse && r.bias.up, r.up_rows()),
            Down => (!sparse).then_some([h, r.intermediate]),
            DownBias => vec(!sparse && r.bias.down, h),
            Router => sparse.then_some([r.experts(), h]),
            ExpertUp => sparse.then_some([r.expert_up_rows(), h]),
            ExpertDown => r.moe.filter(|_| sparse).map(|m| [h, m.intermediate]),
        }
    }
}

/// Every tensor a model of recipe `r` holds, in table order, model-level first, then layer by layer
/// (a sparse layer's experts after its other tensors, expert by expert).
pub fn present(r: &Recipe) -> Vec<Place> {
    let mut out = Vec::new();
    let mut add = |tensor: Tensor, layer: usize, expert: usize| {
        if let Some(shape) = tensor.shape(r, layer) {
            out.push(Place {
                tensor,
                layer,
                expert,
                shape,
            });
        }
    };
    for s in TABLE.iter().filter(|s| !s.per_layer) {
        add(s.tensor, 0, 0);
    }
    for l in 0..r.layers {
        for s in TABLE.iter().filter(|s| s.per_layer && !s.per_expert) {
            add(s.tensor, l, 0);
        }
        if r.sparse(l) {
            for e in 0..r.experts() {
                for s in TABLE.iter().filter(|s| s.per_expert) {
                    add(s.tensor, l, e);
                }
            }
        }
    }
    out
}
