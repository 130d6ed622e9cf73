//! The shape of a Llama-family model (Llama, SmolLM2, Qwen2/2.5, Mistral) as the decoder needs it,
//! and the decoder's own limits (sequence slots, context length, rows per chunk).
//!
//! Rotary embedding is described by its inverse frequencies (as the model's own rotary module
//! computed them, so Llama-3 and other static rope scalings come for free) and an attention scaling
//! factor applied to cos/sin.

/// Model hyper-parameters plus decoder limits. Validated by `Config::check`.
#[derive(Clone, Debug)]
pub struct Config {
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub rms_eps: f32,
    /// Softmax scale of attention scores (usually head_dim^-0.5).
    pub attn_scale: f32,
    /// head_dim / 2 inverse frequencies of the rotary embedding.
    pub inv_freq: Vec<f32>,
    /// Multiplies cos and sin (1.0 except for scalings such as YaRN).
    pub rope_scale: f32,
    /// Keys a query sees, itself included (Mistral); None = all earlier keys.
    pub sliding_window: Option<usize>,
    /// lm_head is the embedding matrix.
    pub tied_embeddings: bool,
    /// Sequence slots (sequences that can be in flight at once, each with its own KV cache).
    pub slots: usize,
    /// Positions each slot's KV cache holds.
    pub max_context: usize,
    /// Rows (tokens) processed together in one pass over the layers; longer steps are chunked.
    pub chunk_rows: usize,
}

impl Config {
    /// Width of the fused q/k/v projection output.
    pub fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }

    pub fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }

    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Checks every field; the message names the field and what was expected.
    pub fn check(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab),
            ("hidden_size", self.hidden),
            ("num_hidden_layers", self.layers),
            ("num_attention_heads", self.heads),
            ("num_key_value_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate),
            ("max_batch (slots)", self.slots),
            ("max_context", self.max_context),
            ("chunk_rows", self.chunk_rows),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("{name} must be positive, got 0"));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.heads, self.kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "head_dim must be even for rotary embeddings, got {}",
                self.head_dim
            ));
        }
        if self.inv_freq.len() != self.head_dim / 2 {
            return Err(format!(
                "the rotary embedding has {} inverse frequencies, expected head_dim / 2 = {}",
                self.inv_freq.len(),
                self.head_dim / 2
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return Err(format!(
                "rms_norm_eps must be finite and >= 0, got {}",
                self.rms_eps
            ));
        }
        if !self.attn_scale.is_finite() || !self.rope_scale.is_finite() {
            return Err("the attention and rotary scales must be finite".into());
        }
        if self.inv_freq.iter().any(|f| !f.is_finite()) {
            return Err("the rotary inverse frequencies must be finite".into());
        }
        if self.sliding_window == Some(0) {
            return Err("sliding_window must be positive".into());
        }
        if self.max_context > u32::MAX as usize || self.vocab > u32::MAX as usize {
            return Err("max_context and vocab_size must fit in 32 bits".into());
        }
        Ok(())
    }
}
