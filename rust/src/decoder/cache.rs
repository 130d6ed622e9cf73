//! Per-slot KV cache and token history, preallocated at construction.
//!
//! Format (`KvFormat`, `kv_store.rs`): f32 by default: the decoder's activations are f32
//! (`precision="preserve"`), and rounding K and V to bf16 moves the logits by ~1e-3 relative, a hundred
//! times the 1e-5 the decoder promises against the model's float32 forward. bf16 (half the bytes) and
//! int8 codes with a scale per head and position (0.27x at head_dim 64) are chosen by the caller, their
//! cost measured. Memory is allocated zeroed (untouched pages cost nothing until a slot's context
//! reaches them).
//!
//! Layout per slot: [layer][k|v][kv_head][position][head_dim], so the keys one head attends over are
//! contiguous. A global layer holds `max_context` positions. A sliding-window layer of w keys holds
//! only what its queries can still see: `window_capacity` positions (the window, `KEEP` older ones so
//! that a slot can be truncated back a little — rejected speculative drafts — and room for two
//! windows of rows). When a step would run past that, the layer's last `w - 1 + KEEP` keys move to the
//! front and its `base` (the cache index held at position 0) advances; keys stay contiguous, so the
//! attention kernels read them as before, and the values are the same floats (exactness unchanged).
//! The price: a slot cannot be truncated (or its prefix copied) back to a length whose window starts
//! before a moved-out key; `min_len` says how far back it can go, and both verbs refuse beyond it.
//! Each slot also keeps the tokens it holds (for prefix reuse by later callers).

use super::kv_store::{KvStore, RowWriter};
use super::recipe::{Limits, Recipe};
use crate::attention::KvView;
use crate::isa::Isa;

/// Keys older than a window that a windowed layer keeps, so a slot can be truncated back by up to
/// this many tokens past its window: a step's rejected drafts (`lookup::MAX_DRAFT`).
pub const KEEP: usize = super::lookup::MAX_DRAFT;

/// Positions a layer with window `w` holds: all of `max_context` for global layers; else the window,
/// `KEEP` older keys and two windows of rows (a step of up to `chunk_rows` rows always fits after a move,
/// and moves come at most once per `chunk_rows` positions).
pub fn window_capacity(window: Option<usize>, lim: &Limits) -> usize {
    match window {
        Some(w) => (w - 1 + KEEP + 2 * lim.chunk_rows).min(lim.max_context),
        None => lim.max_context,
    }
}

pub struct Slot {
    kv: KvStore,
    tokens: Vec<u32>,
    /// Per layer: the cache index held at position 0 of the layer's block (0 for global layers).
    base: Vec<usize>,
    /// Rotary position of the next token (its cache index unless the caller set another, e.g. the
    /// column of a left-padded row in a Hugging Face batch).
    next_pos: usize,
}

/// One layer's place in a slot: its window, how many positions it holds and where its K block starts.
#[derive(Clone, Copy)]
struct LayerBlock {
    window: Option<usize>,
    capacity: usize,
    offset: usize,
}

/// What a caller asked of a slot's start (for the error message).
#[derive(Clone, Copy)]
enum Verb {
    Truncate,
    Copy,
}

pub struct KvCache {
    slots: Vec<Slot>,
    layers: Vec<LayerBlock>,
    kv_heads: usize,
    head_dim: usize,
}

/// Bytes of K and V one slot holds, and bytes each further token adds (its global layers).
pub fn kv_bytes(r: &Recipe, lim: &Limits) -> Option<(usize, usize)> {
    let per_position = 2usize
        .checked_mul(r.kv_heads)?
        .checked_mul(lim.kv.row_bytes(r.head_dim))?;
    let (mut slot, mut token) = (0usize, 0usize);
    for spec in &r.layer_specs {
        let cap = window_capacity(spec.window, lim);
        slot = slot.checked_add(cap.checked_mul(per_position)?)?;
        if cap == lim.max_context {
            token += per_position; // a global layer (or a window as long as the context)
        }
    }
    Some((slot, token))
}

impl KvCache {
    pub fn new(r: &Recipe, lim: &Limits) -> Result<KvCache, String> {
        let too_big = "the KV cache size overflows; lower max_context or max_batch";
        let mut layers = Vec::with_capacity(r.layers);
        let mut at = 0usize;
        for spec in &r.layer_specs {
            let capacity = window_capacity(spec.window, lim);
            layers.push(LayerBlock {
                window: spec.window,
                capacity,
                offset: at,
            });
            let block = [2, r.kv_heads, capacity, r.head_dim]
                .iter()
                .try_fold(1usize, |a, &b| a.checked_mul(b))
                .ok_or(too_big)?;
            at = at.checked_add(block).ok_or(too_big)?;
        }
        let per_slot = at;
        let mut slots = Vec::with_capacity(lim.slots);
        for _ in 0..lim.slots {
            let kv = KvStore::zeroed(lim.kv, per_slot, r.head_dim).ok_or_else(|| {
                format!(
                    "cannot allocate a KV cache of {} MB per slot; lower max_context or max_batch",
                    kv_bytes(r, lim).map_or(0, |b| b.0) >> 20
                )
            })?;
            slots.push(Slot {
                kv,
                tokens: Vec::new(),
                base: vec![0; r.layers],
                next_pos: 0,
            });
        }
        Ok(KvCache {
            slots,
            layers,
            kv_heads: r.kv_heads,
            head_dim: r.head_dim,
        })
    }

    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    pub fn len(&self, slot: usize) -> usize {
        self.slots[slot].tokens.len()
    }

    pub fn tokens(&self, slot: usize) -> &[u32] {
        &self.slots[slot].tokens
    }

    /// Floats of one head's K (or V) rows of layer `l`: [capacity][head_dim].
    fn head_len(&self, l: usize) -> usize {
        self.layers[l].capacity * self.head_dim
    }

    /// Layer `l`'s K and V of a slot from cache index `key0` (held: `key0 >= base`) for `keys` keys,
    /// as views [1, kv_heads, keys, head_dim] for the attention kernels.
    pub fn views(&self, slot: usize, l: usize, key0: usize, keys: usize) -> [KvView<'_, f32>; 2] {
        let (d, head) = (self.head_dim, self.head_len(l));
        let s = &self.slots[slot];
        let at = self.layers[l].offset + (key0 - s.base[l]) * d;
        let dims = [1, self.kv_heads, keys, d];
        let strides = [self.kv_heads * head, head, d, 1];
        let v = at + self.kv_heads * head;
        [s.kv.view(at, dims, strides), s.kv.view(v, dims, strides)]
    }

    /// Makes room in every windowed layer of a slot for `n` rows from cache index `first` on (a step's
    /// segment; `n` <= chunk_rows): a layer that would run past its capacity first moves the keys its
    /// window and `KEEP` still need to the front. Global layers always have room.
    pub fn make_room(&mut self, slot: usize, first: usize, n: usize) {
        let (hd, d) = (self.kv_heads, self.head_dim);
        for (l, lb) in self.layers.iter().enumerate() {
            let Some(w) = lb.window else { continue };
            let s = &mut self.slots[slot];
            let base = s.base[l];
            if first + n - base <= lb.capacity {
                continue;
            }
            // Keep the keys from `keep0` on: the window of row `first` and KEEP older ones.
            let keep0 = first.saturating_sub(w - 1 + KEEP).max(base);
            let (from, count) = (keep0 - base, first - keep0);
            let head = lb.capacity * d;
            for h in 0..2 * hd {
                let at = lb.offset + h * head;
                s.kv.copy_within(at + from * d..at + (from + count) * d, at, d);
            }
            s.base[l] = keep0;
        }
    }

    /// Layer `l`'s writer of K and V rows that several threads may use at once, each on its own rows
    /// (`LayerWriter::write`): a prompt's rows are written where they are computed.
    pub fn layer_writer(&mut self, l: usize) -> LayerWriter<'_> {
        let (d, head) = (self.head_dim, self.head_len(l));
        let k0 = self.layers[l].offset;
        let kv_heads = self.kv_heads;
        let (bases, stores) = self
            .slots
            .iter_mut()
            .map(|s| (s.base[l], s.kv.row_writer()))
            .unzip();
        LayerWriter {
            stores,
            bases,
            k0,
            v0: k0 + kv_heads * head,
            head,
            d,
            kv_heads,
        }
    }

    /// Records that `tokens` now follow the slot's content (their K/V are written by the step).
    pub fn push_tokens(&mut self, slot: usize, tokens: &[u32]) {
        let s = &mut self.slots[slot];
        s.tokens.extend_from_slice(tokens);
        s.next_pos += tokens.len();
    }

    /// Rotary position the slot's next token gets.
    pub fn next_pos(&self, slot: usize) -> usize {
        self.slots[slot].next_pos
    }

    /// Sets the rotary position of the slot's next token (later tokens follow it).
    pub fn set_next_pos(&mut self, slot: usize, pos: usize) {
        self.slots[slot].next_pos = pos;
    }

    /// The shortest length other than 0 a slot can keep (`truncate`, `copy_prefix`): the next token's
    /// window must still be held by every windowed layer. 0 (emptying) is always possible.
    pub fn min_len(&self, slot: usize) -> usize {
        let s = &self.slots[slot];
        self.layers
            .iter()
            .zip(&s.base)
            .filter(|&(_, &b)| b > 0)
            .map(|(lb, &b)| b + lb.window.map_or(0, |w| w - 1))
            .max()
            .unwrap_or(0)
    }

    /// Err unless a slot holding `have` tokens can keep its first `len`.
    fn check_keep(&self, slot: usize, len: usize, verb: Verb) -> Result<(), String> {
        let have = self.len(slot);
        let what = match verb {
            Verb::Truncate => format!("cannot truncate slot {slot} to {len} tokens"),
            Verb::Copy => format!("cannot copy {len} tokens from slot {slot}"),
        };
        if len > have {
            return Err(format!("{what}: it holds only {have}"));
        }
        let least = self.min_len(slot);
        if len != 0 && len < least {
            return Err(format!(
                "{what}: its sliding-window layers no longer hold the keys the window of token {len} \
                 needs (they keep the last window and {KEEP} tokens; at least {least} tokens can be \
                 kept). Empty the slot and read the tokens again"
            ));
        }
        Ok(())
    }

    /// Keeps the first `len` positions of a slot (0, or from `min_len` to its length).
    pub fn truncate(&mut self, slot: usize, len: usize) -> Result<(), String> {
        self.check_keep(slot, len, Verb::Truncate)?;
        let have = self.len(slot);
        let s = &mut self.slots[slot];
        s.tokens.truncate(len);
        if len == 0 {
            s.next_pos = 0;
            s.base.fill(0);
        } else {
            s.next_pos -= have - len;
        }
        Ok(())
    }

    /// Makes `dst` hold the first `len` positions of `src` (K/V and tokens), e.g. a shared prompt.
    pub fn copy_prefix(&mut self, src: usize, dst: usize, len: usize) -> Result<(), String> {
        self.check_keep(src, len, Verb::Copy)?;
        if src == dst {
            return self.truncate(dst, len);
        }
        let have = self.len(src);
        let d = self.head_dim;
        let (a, b) = (src.min(dst), src.max(dst));
        let (lo, hi) = self.slots.split_at_mut(b);
        let (from, to) = if src < dst {
            (&lo[a], &mut hi[0])
        } else {
            (&hi[0], &mut lo[a])
        };
        for (l, lb) in self.layers.iter().enumerate() {
            let base = if len == 0 { 0 } else { from.base[l] };
            let n = (len - base.min(len)) * d;
            let head = lb.capacity * d;
            for h in 0..2 * self.kv_heads {
                let at = lb.offset + h * head;
                to.kv.copy_from(&from.kv, at..at + n, d);
            }
            to.base[l] = base;
        }
        to.tokens.clear();
        to.tokens.extend_from_slice(&from.tokens[..len]);
        to.next_pos = if len == 0 {
            0
        } else {
            from.next_pos - (have - len)
        };
        Ok(())
    }
}

/// One layer's K/V rows of every slot, writable from several threads (`KvCache::layer_writer`).
pub struct LayerWriter<'a> {
    stores: Vec<RowWriter<'a>>,
    /// Each slot's cache index held at position 0 of this layer.
    bases: Vec<usize>,
    k0: usize,
    v0: usize,
    head: usize,
    d: usize,
    kv_heads: usize,
}

impl LayerWriter<'_> {
    /// Asks for the lines `write(slot, index, ..)` will store into (hints only; a slot or index
    /// outside the cache is skipped): issued before the layer's q/k/v projection, they arrive while it
    /// runs instead of stalling the stores after it.
    pub fn prefetch(&self, slot: usize, index: usize) {
        let rel = self
            .bases
            .get(slot)
            .and_then(|&base| index.checked_sub(base));
        let Some(at0) = rel.map(|i| i * self.d).filter(|&at0| at0 < self.head) else {
            return;
        };
        for h in 0..self.kv_heads {
            let at = h * self.head + at0;
            self.stores[slot].prefetch(self.k0 + at, self.d);
            self.stores[slot].prefetch(self.v0 + at, self.d);
        }
    }

    /// Writes the K and V rows of one position (each [kv_heads * head_dim], head-major); `isa` picks
    /// the tier of an int8 cache's quantizer (the same bits on every tier). Panics (never UB) on a slot
    /// or index outside the cache.
    ///
    /// # Safety
    /// No other call writes the same (slot, index) while this one runs.
    pub unsafe fn write(&self, isa: Isa, slot: usize, index: usize, k: &[f32], v: &[f32]) {
        let d = self.d;
        let at0 = (index - self.bases[slot]) * d;
        assert!(
            at0 < self.head,
            "kv index {index} past the layer's capacity"
        );
        for h in 0..self.kv_heads {
            let at = h * self.head + at0;
            // SAFETY: (slot, index) is this call's alone (the caller's contract), so are its rows.
            self.stores[slot].write(isa, self.k0 + at, &k[h * d..(h + 1) * d]);
            self.stores[slot].write(isa, self.v0 + at, &v[h * d..(h + 1) * d]);
        }
    }
}
