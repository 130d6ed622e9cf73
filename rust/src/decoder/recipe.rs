//! A decoder-only transformer described as data: which norm, where the norms sit, how attention and
//! MLP are composed, how positions enter, and the per-family extras (q/k norms, clipping, soft-caps,
//! scalars). Every family the decoder runs is one `Recipe` (built from the Hugging Face config in
//! `kwker_torch/decoder/families/`); nothing in `forward` names a family.
//!
//! The recipe crosses the FFI as JSON (serde), and is saved as such beside the weights. `check`
//! validates it; `tensors.rs` derives from it which tensors exist and their shapes.
//!
//! Numerical contract of the parts (float32 throughout, see `forward.rs`): norms as `norm.rs`,
//! rotary as `rope.rs`, activations as `vmath`; scalars multiply (`embed_scale`, `residual_scale`)
//! or divide (`logit_divisor`) exactly where Hugging Face's modules do.

use serde::{Deserialize, Serialize};

pub use crate::vmath::Act;

/// How a norm normalises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// x * rsqrt(mean(x^2) + eps) (Gemma's `1 + w` is folded into the weight at load).
    Rms,
    /// (x - mean) * rsqrt(var + eps).
    Layer,
}

/// A norm: its kind, epsilon, and whether it has a weight and a bias (OLMo's and OPT-350m's
/// LayerNorms have neither).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Norm {
    pub kind: NormKind,
    pub eps: f32,
    pub weight: bool,
    pub bias: bool,
}

/// Where a sequential block's norms sit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// x += f(norm(x)).
    Pre,
    /// x += post_norm(f(norm(x))) (Gemma 2/3).
    Sandwich,
    /// x += post_norm(f(x)) (OLMo2).
    Post,
    /// x = post_norm(x + f(x)) (OPT with do_layer_norm_before=False).
    PostResidual,
}

/// How attention and MLP combine within a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Block {
    /// The MLP reads the attention's output (the norms as `Placement` says).
    Sequential,
    /// x + attn(attn_norm(x)) + mlp(mlp_norm(x)) (GPT-NeoX); with `shared_norm` both read
    /// attn_norm(x) (Phi-2, StableLM). `residual_last`: summed as (attn + mlp) + x (NeoX, Phi),
    /// else as (x + attn) + mlp (StableLM), as each model rounds it.
    Parallel {
        shared_norm: bool,
        residual_last: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mlp {
    /// down(act(gate x) * up x), the gate's rows before the up rows in one matrix; else
    /// down(act(up x)).
    pub gated: bool,
    pub act: Act,
}

/// How a mixture-of-experts layer's router turns its logits (router · x, float32) into the k experts
/// a row runs through and their weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Router {
    /// Softmax over every expert, the k largest probabilities, divided by their sum when
    /// `renormalize` (Mixtral always; Qwen3-MoE and OLMoE when `norm_topk_prob`).
    SoftmaxTopk { renormalize: bool },
    /// The k largest logits, then a softmax over those k (Granite-MoE).
    TopkSoftmax,
}

/// The experts of the sparse layers (`LayerSpec::sparse`): each an MLP as `Recipe::mlp` composes it
/// (no biases) of width `intermediate`; a row's MLP output is the router-weighted sum of its `top_k`
/// experts' outputs, summed in ascending expert order as Hugging Face's `index_add_` loop does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Moe {
    pub experts: usize,
    pub top_k: usize,
    pub intermediate: usize,
    pub router: Router,
}

/// Which projections have a bias.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Biases {
    pub qkv: bool,
    pub o: bool,
    pub up: bool,
    pub down: bool,
    pub lm_head: bool,
}

/// Over what a q/k norm normalises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkScope {
    /// Each head's head_dim values (Qwen3, Gemma 3, StableLM, Phi).
    Head,
    /// The whole q (heads * head_dim) and the whole k projection (OLMo2).
    Full,
}

/// A norm of q and k after their projection, before rotary.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QkNorm {
    pub norm: Norm,
    pub scope: QkScope,
    /// Per-head scope only: each head has its own weights (StableLM), stored [heads * head_dim];
    /// else one head_dim weight serves every head.
    pub per_head_weights: bool,
}

/// A rotary embedding table: rotate_half over the first `2 * inv_freq.len()` values of each head
/// (partial rotary when fewer than head_dim).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rope {
    pub inv_freq: Vec<f32>,
    /// Multiplies cos and sin (Hugging Face's attention_scaling).
    pub scale: f32,
    /// LongRoPE's second set of frequencies.
    #[serde(default)]
    pub long: Option<LongRope>,
}

/// LongRoPE (Phi-3, Phi-4-mini): a step whose largest position + 1 exceeds `from_len` rotates its
/// new tokens with `inv_freq` instead of the short set, as Hugging Face switches on the whole call's
/// `max(position_ids) + 1`; keys already cached keep the rotation they were written with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LongRope {
    pub inv_freq: Vec<f32>,
    pub from_len: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Positions {
    /// Rotary embeddings; each layer names its table (Gemma 3: local and global bases).
    Rotary { ropes: Vec<Rope> },
    /// A learned table added to the embeddings at row `position + offset` (GPT-2: 0; OPT: 2).
    Learned { offset: usize, len: usize },
}

/// What differs from layer to layer.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerSpec {
    /// Keys a query sees, itself included; None = all earlier keys.
    #[serde(default)]
    pub window: Option<usize>,
    /// Index of the layer's rotary table (`Positions::Rotary`); 0 otherwise.
    #[serde(default)]
    pub rope: usize,
    /// Multiplies q before the dot products (usually head_dim^-0.5).
    pub attn_scale: f32,
    /// The MLP is the mixture of experts (`Recipe::moe`) instead of the dense MLP.
    #[serde(default)]
    pub sparse: bool,
}

fn one() -> f32 {
    1.0
}

/// The whole model's composition and shapes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    pub vocab: usize,
    pub hidden: usize,
    /// Width of the token embedding and of lm_head's input: `hidden`, unless the model projects in
    /// and out of a narrower embedding (OPT's word_embed_proj_dim).
    pub embed_dim: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub norm: Norm,
    pub placement: Placement,
    pub block: Block,
    pub mlp: Mlp,
    /// The experts of the layers whose spec is `sparse`; dense layers keep `intermediate`.
    #[serde(default)]
    pub moe: Option<Moe>,
    pub bias: Biases,
    #[serde(default)]
    pub qk_norm: Option<QkNorm>,
    /// q, k and v clamped to [-c, c] after their projection (OLMo).
    #[serde(default)]
    pub clip_qkv: Option<f32>,
    /// The clamp comes after the q/k norm instead of before it (OLMoE).
    #[serde(default)]
    pub clip_after_norm: bool,
    #[serde(default)]
    pub attn_softcap: Option<f32>,
    #[serde(default)]
    pub final_softcap: Option<f32>,
    /// Embeddings times this (Gemma's normalizer, Granite's embedding_multiplier).
    #[serde(default = "one")]
    pub embed_scale: f32,
    /// Attention and MLP outputs times this before the residual add (Granite).
    #[serde(default = "one")]
    pub residual_scale: f32,
    /// Logits divided by this (Granite's logits_scaling).
    #[serde(default = "one")]
    pub logit_divisor: f32,
    /// A norm before the lm_head (OPT-350m has none).
    pub final_norm: bool,
    /// lm_head is the embedding matrix.
    pub tied_embeddings: bool,
    pub positions: Positions,
    pub layer_specs: Vec<LayerSpec>,
}

fn finite(v: f32, what: &str) -> Result<(), String> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(format!("{what} must be finite, got {v}"))
    }
}

fn check_norm(n: &Norm, what: &str) -> Result<(), String> {
    if !(n.eps.is_finite() && n.eps >= 0.0) {
        return Err(format!(
            "{what}: eps must be finite and >= 0, got {}",
            n.eps
        ));
    }
    Ok(())
}

impl Recipe {
    pub fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }

    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Width of the fused q/k/v projection output: [q; k; v].
    pub fn qkv_width(&self) -> usize {
        self.q_width() + 2 * self.kv_width()
    }

    /// Rows of the MLP's first matrix: [gate; up] when gated.
    pub fn up_rows(&self) -> usize {
        if self.mlp.gated {
            2 * self.intermediate
        } else {
            self.intermediate
        }
    }

    /// Rows of an expert's first matrix ([gate; up] when gated).
    pub fn expert_up_rows(&self) -> usize {
        let i = self.moe.map_or(0, |m| m.intermediate);
        if self.mlp.gated {
            2 * i
        } else {
            i
        }
    }

    /// Whether layer `l`'s MLP is the mixture of experts.
    pub fn sparse(&self, l: usize) -> bool {
        self.layer_specs.get(l).is_some_and(|s| s.sparse)
    }

    /// Experts of a sparse layer (0 without experts).
    pub fn experts(&self) -> usize {
        self.moe.map_or(0, |m| m.experts)
    }

    pub fn ropes(&self) -> &[Rope] {
        match &self.positions {
            Positions::Rotary { ropes } => ropes,
            Positions::Learned { .. } => &[],
        }
    }

    /// Whether the layers' sub-layer inputs are normed (sequential pre/sandwich, or parallel).
    pub fn has_attn_norm(&self) -> bool {
        matches!(self.block, Block::Parallel { .. })
            || matches!(self.placement, Placement::Pre | Placement::Sandwich)
    }

    pub fn has_mlp_norm(&self) -> bool {
        match self.block {
            Block::Parallel { shared_norm, .. } => !shared_norm,
            Block::Sequential => matches!(self.placement, Placement::Pre | Placement::Sandwich),
        }
    }

    /// Whether sub-layer outputs (or, post-residual, the sums) are normed after the sub-layer.
    pub fn has_post_norms(&self) -> bool {
        self.block == Block::Sequential && self.placement != Placement::Pre
    }

    /// Checks every field; the message names the field and what was expected.
    pub fn check(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab),
            ("hidden_size", self.hidden),
            ("the embedding width", self.embed_dim),
            ("num_hidden_layers", self.layers),
            ("num_attention_heads", self.heads),
            ("num_key_value_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("{name} must be positive, got 0"));
            }
            if v >= 1 << 24 {
                return Err(format!("{name} = {v} is too large (at most 2^24 - 1)"));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.heads, self.kv_heads
            ));
        }
        // Every dimension is below 2^24 (checked with the positives above), so the widths below cannot
        // overflow; their products are checked (in release builds an overflowing product would wrap).
        for (a, b) in [
            (self.qkv_width(), self.hidden),
            (self.vocab, self.hidden.max(self.embed_dim)),
            (self.up_rows(), self.hidden),
        ] {
            if a.checked_mul(b).is_none_or(|e| e > isize::MAX as usize / 8) {
                return Err(format!("a [{a}, {b}] matrix is too large to hold"));
            }
        }
        if let Some(m) = &self.moe {
            for (name, v) in [
                ("num_experts", m.experts),
                ("num_experts_per_tok", m.top_k),
                ("moe_intermediate_size", m.intermediate),
            ] {
                if v == 0 || v >= 1 << 24 {
                    return Err(format!("{name} = {v}: expected 1 ..= 2^24 - 1"));
                }
            }
            if m.top_k > m.experts {
                return Err(format!(
                    "num_experts_per_tok ({}) is more than num_experts ({})",
                    m.top_k, m.experts
                ));
            }
            let a = self.expert_up_rows();
            if a.checked_mul(self.hidden)
                .is_none_or(|e| e > isize::MAX as usize / 8)
            {
                return Err(format!(
                    "an expert's [{a}, {}] matrix is too large to hold",
                    self.hidden
                ));
            }
            if self.bias.up || self.bias.down {
                return Err(
                    "the experts' MLPs have no biases; a mixture with MLP biases is not supported"
                        .into(),
                );
            }
        }
        if let Some(l) = self.layer_specs.iter().position(|s| s.sparse) {
            if self.moe.is_none() {
                return Err(format!(
                    "layer {l} is sparse but the recipe has no experts (moe)"
                ));
            }
        }
        check_norm(&self.norm, "the norm")?;
        if let Some(q) = &self.qk_norm {
            check_norm(&q.norm, "the q/k norm")?;
            if q.per_head_weights && q.scope == QkScope::Full {
                return Err("per-head q/k norm weights need the per-head scope".into());
            }
        }
        if self.block != Block::Sequential && self.placement != Placement::Pre {
            return Err("a parallel block takes pre-norm placement only".into());
        }
        if self.block != Block::Sequential && self.residual_scale != 1.0 {
            return Err("residual_scale applies to sequential blocks only".into());
        }
        for (what, v) in [
            ("embed_scale", self.embed_scale),
            ("residual_scale", self.residual_scale),
            ("logit_divisor", self.logit_divisor),
        ] {
            finite(v, what)?;
        }
        if self.logit_divisor == 0.0 {
            return Err("logit_divisor (logits_scaling) must not be 0".into());
        }
        for (what, c) in [
            ("attn_softcap", self.attn_softcap),
            ("final_softcap", self.final_softcap),
            ("clip_qkv", self.clip_qkv),
        ] {
            if let Some(c) = c {
                if !(c.is_finite() && c > 0.0) {
                    return Err(format!("{what} must be finite and positive, got {c}"));
                }
            }
        }
        if self.layer_specs.len() != self.layers {
            return Err(format!(
                "{} layer specs for {} layers",
                self.layer_specs.len(),
                self.layers
            ));
        }
        let ropes = self.ropes();
        if matches!(self.positions, Positions::Rotary { .. }) && ropes.is_empty() {
            return Err("rotary positions need at least one rotary table".into());
        }
        for (i, r) in ropes.iter().enumerate() {
            let sets = std::iter::once(&r.inv_freq).chain(r.long.as_ref().map(|l| &l.inv_freq));
            for f in sets {
                if f.is_empty() || 2 * f.len() > self.head_dim {
                    return Err(format!(
                        "rotary table {i} has {} frequencies; expected 1..={} (head_dim / 2)",
                        f.len(),
                        self.head_dim / 2
                    ));
                }
                if f.len() != r.inv_freq.len() {
                    return Err(format!(
                        "rotary table {i}: LongRoPE's long and short sets differ in length"
                    ));
                }
                if f.iter().any(|v| !v.is_finite()) {
                    return Err(format!(
                        "rotary table {i}: inverse frequencies must be finite"
                    ));
                }
            }
            finite(r.scale, "the rotary scale")?;
        }
        if let Positions::Learned { len, .. } = self.positions {
            if len == 0 {
                return Err("the learned position table is empty".into());
            }
        }
        for (l, s) in self.layer_specs.iter().enumerate() {
            if s.window == Some(0) {
                return Err(format!("layer {l}: a sliding window must be positive"));
            }
            finite(s.attn_scale, "the attention scale")?;
            if s.rope >= ropes.len().max(1) {
                return Err(format!(
                    "layer {l} uses rotary table {} of {}",
                    s.rope,
                    ropes.len()
                ));
            }
        }
        Ok(())
    }
}

/// How the KV cache stores K and V (`cache.rs`): float32 (the 1e-5 contract), bf16 (half the bytes), or
/// int8 codes with one f32 scale per head and position (0.27x float32 at head_dim 64).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvFormat {
    #[default]
    F32,
    Bf16,
    Q8,
}

impl KvFormat {
    /// The format named `name` ("f32", "bf16", "q8").
    pub fn parse(name: &str) -> Result<KvFormat, String> {
        match name {
            "f32" => Ok(KvFormat::F32),
            "bf16" => Ok(KvFormat::Bf16),
            "q8" => Ok(KvFormat::Q8),
            _ => Err(format!(
                "unknown KV cache format {name:?}: expected \"f32\", \"bf16\" or \"q8\""
            )),
        }
    }

    /// Bytes one head's row of `d` values takes.
    pub fn row_bytes(self, d: usize) -> usize {
        match self {
            KvFormat::F32 => 4 * d,
            KvFormat::Bf16 => 2 * d,
            KvFormat::Q8 => d + 4,
        }
    }
}

/// The decoder's own limits (not part of the model): sequence slots, positions per slot, rows per
/// pass over the weights, and how the cache stores K and V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub slots: usize,
    pub max_context: usize,
    pub chunk_rows: usize,
    #[serde(default)]
    pub kv: KvFormat,
}

impl Limits {
    pub fn check(&self) -> Result<(), String> {
        for (name, v) in [
            ("max_batch (slots)", self.slots),
            ("max_context", self.max_context),
            ("chunk_rows", self.chunk_rows),
        ] {
            if v == 0 {
                return Err(format!("{name} must be positive, got 0"));
            }
        }
        if self.max_context > u32::MAX as usize {
            return Err("max_context must fit in 32 bits".into());
        }
        Ok(())
    }
}
