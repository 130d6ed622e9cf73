//! The whole-model decoder: a Llama-family causal LM (Llama, SmolLM2, Qwen2/2.5, Mistral) run as one
//! native call per step over a ragged batch of sequence slots.
//!
//! - `config`: shapes and limits; `weights`: the owned matrices; `cache`: per-slot KV cache;
//!   `forward`: one step; `ops`: pointwise maps; `sample` and `generate`: the native loop.
//! - Slots are llama.cpp-style sequences: each holds its tokens and their K/V; a step appends tokens
//!   to several slots at once (prompt chunks and single decode tokens mixed), `truncate` drops a
//!   suffix (rejected speculative tokens), `copy_prefix` shares a prefix between slots.
//!
//! Numerical contract: float32 activations, sums and KV cache; weights bf16 or f32 as given; logits
//! equal the model's float32 forward up to summation order (measured ~1e-6 relative).

pub mod builder;
pub mod cache;
pub mod config;
pub mod forward;
pub mod generate;
pub mod lookup;
pub mod ops;
pub mod sample;
pub mod weights;

use cache::KvCache;
use config::Config;
pub use forward::{Logits, SeqStep};
use forward::{Model, Scratch};
use weights::{Layer, Mat, Weights};

use crate::isa::Isa;
use crate::par::Parallel;

/// A model with its cache and scratch space. Not `Sync`: callers serialise steps (the FFI holds a
/// lock per decoder).
pub struct Decoder {
    cfg: Config,
    w: Weights,
    cache: KvCache,
    cos: Vec<f32>,
    sin: Vec<f32>,
    scratch: Scratch,
}

impl Decoder {
    /// Checks every weight's shape against `cfg` and allocates the slots' caches.
    pub fn new(cfg: Config, w: Weights) -> Result<Decoder, String> {
        cfg.check()?;
        check_weights(&cfg, &w)?;
        let cache = KvCache::new(&cfg)?;
        // Rotary positions may run ahead of cache indices (left-padded rows keep their column as
        // position), by at most max_context (`set_next_pos`).
        let positions = cfg
            .max_context
            .checked_mul(2)
            .filter(|p| p.checked_mul(cfg.head_dim).is_some_and(|n| n <= 1 << 32))
            .ok_or("max_context * head_dim is too large for the rotary tables")?;
        let (cos, sin) = ops::rope_tables(&cfg.inv_freq, positions, cfg.rope_scale);
        Ok(Decoder {
            cfg,
            w,
            cache,
            cos,
            sin,
            scratch: Scratch::default(),
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn weights(&self) -> &Weights {
        &self.w
    }

    /// Tokens slot `slot` holds.
    pub fn slot_tokens(&self, slot: usize) -> Result<&[u32], String> {
        self.check_slot(slot)?;
        Ok(self.cache.tokens(slot))
    }

    pub fn slot_len(&self, slot: usize) -> Result<usize, String> {
        self.check_slot(slot)?;
        Ok(self.cache.len(slot))
    }

    /// Keeps the first `len` tokens of a slot (0 empties it).
    pub fn truncate(&mut self, slot: usize, len: usize) -> Result<(), String> {
        self.check_slot(slot)?;
        self.cache.truncate(slot, len)
    }

    /// Sets the rotary position of the next token of an empty slot (later tokens follow it): a
    /// left-padded row of a Hugging Face batch keeps the positions of its columns.
    pub fn set_next_pos(&mut self, slot: usize, pos: usize) -> Result<(), String> {
        self.check_slot(slot)?;
        if self.cache.len(slot) != 0 {
            return Err(format!(
                "slot {slot} is not empty; its position can only be set before its first token"
            ));
        }
        if pos > self.cfg.max_context {
            return Err(format!(
                "position {pos} is beyond max_context = {}",
                self.cfg.max_context
            ));
        }
        self.cache.set_next_pos(slot, pos);
        Ok(())
    }

    /// Makes `dst` hold the first `len` tokens of `src`.
    pub fn copy_prefix(&mut self, src: usize, dst: usize, len: usize) -> Result<(), String> {
        self.check_slot(src)?;
        self.check_slot(dst)?;
        self.cache.copy_prefix(src, dst, len)
    }

    fn check_slot(&self, slot: usize) -> Result<(), String> {
        if slot >= self.cfg.slots {
            return Err(format!(
                "slot {slot} does not exist: this decoder has {} slot(s) (0..{}); raise max_batch",
                self.cfg.slots, self.cfg.slots
            ));
        }
        Ok(())
    }

    /// Rows of logits a batch returns.
    pub fn logit_rows(batch: &[SeqStep<'_>]) -> usize {
        batch.iter().map(|s| s.logits.rows(s.tokens.len())).sum()
    }

    /// Checks a batch without running it.
    pub fn check_batch(&self, batch: &[SeqStep<'_>]) -> Result<(), String> {
        if batch.is_empty() {
            return Err("the batch is empty: give at least one sequence".into());
        }
        let mut used = vec![false; self.cfg.slots];
        for sq in batch {
            self.check_slot(sq.slot)?;
            if std::mem::replace(&mut used[sq.slot], true) {
                return Err(format!(
                    "slot {} appears twice in one batch; each sequence needs its own slot",
                    sq.slot
                ));
            }
            if sq.tokens.is_empty() {
                return Err(format!(
                    "the sequence for slot {} has no tokens (an empty prompt); give at least one token",
                    sq.slot
                ));
            }
            if let Some(&bad) = sq.tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
                return Err(format!(
                    "token id {bad} is out of range for a vocabulary of {} (ids 0..{})",
                    self.cfg.vocab, self.cfg.vocab
                ));
            }
            let have = self.cache.len(sq.slot);
            if have + sq.tokens.len() > self.cfg.max_context {
                return Err(format!(
                    "slot {} would hold {} + {} = {} tokens, more than max_context = {}; use a larger \
                     max_context or a shorter input",
                    sq.slot,
                    have,
                    sq.tokens.len(),
                    have + sq.tokens.len(),
                    self.cfg.max_context
                ));
            }
        }
        Ok(())
    }

    /// Runs one step: appends each sequence's tokens to its slot and writes the logits asked for,
    /// sequence by sequence, into `logits` ([logit_rows(batch), vocab], row-major).
    pub fn step(
        &mut self,
        isa: Isa,
        par: &dyn Parallel,
        batch: &[SeqStep<'_>],
        logits: &mut [f32],
    ) -> Result<(), String> {
        self.check_batch(batch)?;
        let need = Self::logit_rows(batch) * self.cfg.vocab;
        if logits.len() != need {
            return Err(format!(
                "the logits buffer holds {} floats, the batch needs {need}",
                logits.len()
            ));
        }
        if !isa.is_supported() {
            return Err(format!("this CPU cannot run the {} tier", isa.name()));
        }
        let model = Model {
            cfg: &self.cfg,
            w: &self.w,
            cos: &self.cos,
            sin: &self.sin,
        };
        forward::step(
            &model,
            isa,
            par,
            &mut self.cache,
            &mut self.scratch,
            batch,
            logits,
        );
        Ok(())
    }
}

fn check_mat(m: &Mat, rows: usize, cols: usize, what: &str) -> Result<(), String> {
    if m.rows() != rows || m.cols() != cols {
        return Err(format!(
            "{what} is [{}, {}], expected [{rows}, {cols}]",
            m.rows(),
            m.cols()
        ));
    }
    Ok(())
}

fn check_vec(v: Option<&Vec<f32>>, n: usize, what: &str) -> Result<(), String> {
    match v {
        Some(v) if v.len() != n => Err(format!("{what} has {} values, expected {n}", v.len())),
        _ => Ok(()),
    }
}

fn check_weights(cfg: &Config, w: &Weights) -> Result<(), String> {
    let (h, i) = (cfg.hidden, cfg.intermediate);
    check_mat(&w.embed, cfg.vocab, h, "the embedding")?;
    check_mat(w.lm_head(), cfg.vocab, h, "lm_head")?;
    check_vec(Some(&w.final_norm), h, "the final norm")?;
    if w.layers.len() != cfg.layers {
        return Err(format!(
            "{} layers of weights for a model of {} layers",
            w.layers.len(),
            cfg.layers
        ));
    }
    for (n, l) in w.layers.iter().enumerate() {
        let at = |what: &str| format!("layer {n}: {what}");
        let Layer {
            attn_norm,
            wqkv,
            bqkv,
            wo,
            bo,
            ffn_norm,
            w_gate_up,
            b_gate_up,
            w_down,
            b_down,
        } = l;
        check_vec(Some(attn_norm), h, &at("input_layernorm"))?;
        check_mat(wqkv, cfg.qkv_width(), h, &at("the fused q/k/v projection"))?;
        check_vec(bqkv.as_ref(), cfg.qkv_width(), &at("the q/k/v bias"))?;
        check_mat(wo, h, cfg.q_width(), &at("o_proj"))?;
        check_vec(bo.as_ref(), h, &at("the o_proj bias"))?;
        check_vec(Some(ffn_norm), h, &at("post_attention_layernorm"))?;
        check_mat(w_gate_up, 2 * i, h, &at("the fused gate/up projection"))?;
        check_vec(b_gate_up.as_ref(), 2 * i, &at("the gate/up bias"))?;
        check_mat(w_down, h, i, &at("down_proj"))?;
        check_vec(b_down.as_ref(), h, &at("the down_proj bias"))?;
    }
    Ok(())
}
