//! The whole-model decoder: a causal LM described by a `Recipe` (every dense family the product runs:
//! Llama-likes, Qwen3, Gemma 2/3, Phi-2/3/4, Granite, StableLM, StarCoder2, OLMo/OLMo2, GPT-2,
//! GPT-NeoX, OPT) run as one native call per step over a ragged batch of sequence slots.
//!
//! - `recipe`: the composition as data; `tensors`: the one table of tensor names and shapes;
//!   `weights`: the owned tensors; `builder`: tensors in by name, checked; `cache`: per-slot KV
//!   cache (`kv_store`: one slot's values, rows quantized by `quant::row_q8`); `rope`: rotary tables; `norm`,
//!   `ops`: pointwise parts; `forward` (the step), `layer` (one layer as the recipe composes it),
//!   `attend` (the attention sub-layer); `sample` and `generate`: the native loop; `lookup`:
//!   prompt-lookup drafts.
//! - Slots are llama.cpp-style sequences: each holds its tokens and their K/V; a step appends tokens
//!   to several slots at once (prompt chunks and single decode tokens mixed), `truncate` drops a
//!   suffix (rejected speculative tokens), `copy_prefix` shares a prefix between slots.
//!
//! Numerical contract: float32 activations, sums and KV cache; weights bf16 or f32 as given (or
//! quantized when asked); logits equal the model's float32 forward up to summation order (measured
//! ~1e-6 relative) with unquantized weights.

pub mod attend;
pub mod builder;
pub mod cache;
pub mod ctx;
pub mod forward;
pub mod generate;
pub mod kv_store;
pub mod layer;
pub mod linear;
pub mod lookup;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod ops;
pub mod parts;
pub mod recipe;
pub mod rope;
pub mod sample;
pub mod tensors;
pub mod weights;

use cache::KvCache;
use ctx::{Model, Scratch};
pub use forward::{Logits, Output, SeqStep};
use recipe::{Limits, Positions, Recipe};
use rope::RopeTables;
use weights::Weights;

use crate::isa::Isa;
use crate::par::Parallel;

/// A model with its cache and scratch space. Not `Sync`: callers serialise steps (the FFI holds a
/// lock per decoder).
pub struct Decoder {
    recipe: Recipe,
    limits: Limits,
    w: Weights,
    cache: KvCache,
    ropes: Vec<RopeTables>,
    scratch: Scratch,
}

impl Decoder {
    /// Checks the recipe, the limits and every tensor's shape (the builder has), and allocates the
    /// slots' caches and the rotary tables.
    pub fn new(recipe: Recipe, limits: Limits, w: Weights) -> Result<Decoder, String> {
        recipe.check()?;
        limits.check()?;
        for p in tensors::present(&recipe) {
            let what = || builder::describe(p.tensor, p.layer, p.expert);
            match w.shape_at(p.tensor, p.layer, p.expert) {
                Some(got) if got == p.shape => {}
                Some(got) => {
                    return Err(format!(
                        "{} is [{}, {}], expected [{}, {}]",
                        what(),
                        got[0],
                        got[1],
                        p.shape[0],
                        p.shape[1]
                    ));
                }
                None => return Err(format!("{} is missing", what())),
            }
        }
        let cache = KvCache::new(&recipe, &limits)?;
        // Rotary positions may run ahead of cache indices (left-padded rows keep their column as
        // position), by at most max_context (`set_next_pos`).
        let positions = limits
            .max_context
            .checked_mul(2)
            .filter(|p| p.checked_mul(recipe.head_dim).is_some_and(|n| n <= 1 << 32))
            .ok_or("max_context * head_dim is too large for the rotary tables")?;
        let ropes = recipe
            .ropes()
            .iter()
            .map(|r| RopeTables::new(r, positions))
            .collect();
        Ok(Decoder {
            recipe,
            limits,
            w,
            cache,
            ropes,
            scratch: Scratch::default(),
        })
    }

    pub fn recipe(&self) -> &Recipe {
        &self.recipe
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Expert runs and rows so far (`moe::ExpertCounts`).
    pub fn expert_counts(&self) -> moe::ExpertCounts {
        self.scratch.moe.counts
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

    /// The shortest length other than 0 a slot can be truncated to, or its first tokens copied: its
    /// sliding-window layers keep only their window and `cache::KEEP` older keys.
    pub fn slot_min_len(&self, slot: usize) -> Result<usize, String> {
        self.check_slot(slot)?;
        Ok(self.cache.min_len(slot))
    }

    /// Bytes of K and V one slot holds at `max_context` (windowed layers hold only their window), and
    /// the bytes each further token adds (its global layers').
    pub fn kv_bytes(&self) -> (usize, usize) {
        // The cache was allocated from the same sizes, so they cannot overflow here.
        cache::kv_bytes(&self.recipe, &self.limits).unwrap_or((0, 0))
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
        if pos > self.limits.max_context {
            return Err(format!(
                "position {pos} is beyond max_context = {}",
                self.limits.max_context
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
        if slot >= self.limits.slots {
            return Err(format!(
                "slot {slot} does not exist: this decoder has {} slot(s) (0..{}); raise max_batch",
                self.limits.slots, self.limits.slots
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
        let mut used = vec![false; self.limits.slots];
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
            if let Some(&bad) = sq.tokens.iter().find(|&&t| t as usize >= self.recipe.vocab) {
                return Err(format!(
                    "token id {bad} is out of range for a vocabulary of {} (ids must be in [0, {}))",
                    self.recipe.vocab, self.recipe.vocab
                ));
            }
            let have = self.cache.len(sq.slot);
            if let Positions::Learned { offset, len } = self.recipe.positions {
                let last = self.cache.next_pos(sq.slot) + sq.tokens.len() - 1;
                if last + offset >= len {
                    return Err(format!(
                        "slot {} would reach position {last}, but the model's learned position table \
                         holds {} positions (max_position_embeddings / n_positions); use a shorter input",
                        sq.slot,
                        len - offset.min(len)
                    ));
                }
            }
            if have + sq.tokens.len() > self.limits.max_context {
                return Err(format!(
                    "slot {} would hold {} + {} = {} tokens, more than max_context = {}; use a larger \
                     max_context or a shorter input",
                    sq.slot,
                    have,
                    sq.tokens.len(),
                    have + sq.tokens.len(),
                    self.limits.max_context
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
        self.step_as(isa, par, batch, Output::Logits, logits)
    }

    /// `step`, writing `output` for the rows each sequence's mode asks for: the logits, or the final
    /// normed hidden rows ([logit_rows(batch), output.width()], row-major).
    pub fn step_as(
        &mut self,
        isa: Isa,
        par: &dyn Parallel,
        batch: &[SeqStep<'_>],
        output: Output,
        out: &mut [f32],
    ) -> Result<(), String> {
        self.check_batch(batch)?;
        let need = Self::logit_rows(batch) * output.width(&self.recipe);
        if out.len() != need {
            let what = match output {
                Output::Logits => "logits",
                Output::Hidden => "hidden-state",
            };
            return Err(format!(
                "the {what} buffer holds {} floats, the batch needs {need}",
                out.len()
            ));
        }
        if !isa.is_supported() {
            return Err(format!("this CPU cannot run the {} tier", isa.name()));
        }
        let model = Model {
            r: &self.recipe,
            lim: &self.limits,
            w: &self.w,
            ropes: &self.ropes,
        };
        forward::step(
            &model,
            isa,
            par,
            &mut self.cache,
            &mut self.scratch,
            batch,
            output,
            out,
        );
        Ok(())
    }
}
