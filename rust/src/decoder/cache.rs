//! Per-slot KV cache and token history, preallocated for `max_context` positions at construction.
//!
//! dtype: f32. The decoder's activations are f32 (`precision="preserve"`), and rounding K and V to
//! bf16 would move the logits by ~1e-3 relative, a hundred times the 1e-5 the decoder promises
//! against the model's float32 forward. Memory is allocated zeroed (untouched pages cost nothing
//! until a slot's context reaches them).
//!
//! Layout per slot: [layer][k|v][kv_head][position][head_dim], so the keys one head attends over are
//! contiguous. Each slot also keeps the tokens it holds (for prefix reuse by later callers).

use super::recipe::{Limits, Recipe};

pub struct Slot {
    kv: Vec<f32>,
    tokens: Vec<u32>,
    /// Rotary position of the next token (its cache index unless the caller set another, e.g. the
    /// column of a left-padded row in a Hugging Face batch).
    next_pos: usize,
}

/// `n` zeroed f32s from the allocator's zeroed path (fresh pages from the OS stay untouched, so a slot
/// costs memory only as far as its context is used), or None when the allocation fails.
fn zeroed(n: usize) -> Option<Vec<f32>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<f32>(n).ok()?;
    // SAFETY: the layout has a non-zero size (n > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut f32;
    if ptr.is_null() {
        return None;
    }
    // SAFETY: ptr was allocated by the global allocator with the layout of [f32; n] (exactly what a
    // Vec<f32> of capacity n uses), and all n values are initialised (zero bits are 0.0f32).
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

pub struct KvCache {
    slots: Vec<Slot>,
    kv_heads: usize,
    head_dim: usize,
    max_context: usize,
    layers: usize,
}

impl KvCache {
    pub fn new(r: &Recipe, lim: &Limits) -> Result<KvCache, String> {
        let per_slot = [r.layers, 2, r.kv_heads, lim.max_context, r.head_dim]
            .iter()
            .try_fold(1usize, |a, &b| a.checked_mul(b))
            .ok_or("the KV cache size overflows; lower max_context or max_batch")?;
        let mut slots = Vec::with_capacity(lim.slots);
        for _ in 0..lim.slots {
            let kv = zeroed(per_slot).ok_or_else(|| {
                format!(
                    "cannot allocate a KV cache of {} MB per slot; lower max_context or max_batch",
                    (per_slot * 4) >> 20
                )
            })?;
            slots.push(Slot {
                kv,
                tokens: Vec::new(),
                next_pos: 0,
            });
        }
        Ok(KvCache {
            slots,
            kv_heads: r.kv_heads,
            head_dim: r.head_dim,
            max_context: lim.max_context,
            layers: r.layers,
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

    /// Floats of one layer's K (or V) block of a slot: [kv_heads][max_context][head_dim].
    pub fn block_len(&self) -> usize {
        self.kv_heads * self.max_context * self.head_dim
    }

    /// Offset of layer `l`'s K (`v = false`) or V block within a slot.
    fn block_offset(&self, layer: usize, v: bool) -> usize {
        (2 * layer + v as usize) * self.block_len()
    }

    /// Layer `l`'s K and V blocks of a slot.
    pub fn layer(&self, slot: usize, layer: usize) -> (&[f32], &[f32]) {
        let n = self.block_len();
        let k0 = self.block_offset(layer, false);
        let kv = &self.slots[slot].kv;
        (&kv[k0..k0 + n], &kv[k0 + n..k0 + 2 * n])
    }

    /// Writes the K and V rows of one position (each [kv_heads * head_dim], head-major).
    pub fn write(&mut self, slot: usize, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let (d, ctx) = (self.head_dim, self.max_context);
        let k0 = self.block_offset(layer, false);
        let v0 = self.block_offset(layer, true);
        let kv = &mut self.slots[slot].kv;
        for h in 0..self.kv_heads {
            let at = (h * ctx + pos) * d;
            kv[k0 + at..k0 + at + d].copy_from_slice(&k[h * d..(h + 1) * d]);
            kv[v0 + at..v0 + at + d].copy_from_slice(&v[h * d..(h + 1) * d]);
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

    /// Keeps the first `len` positions of a slot (`len` <= its length).
    pub fn truncate(&mut self, slot: usize, len: usize) -> Result<(), String> {
        let have = self.len(slot);
        if len > have {
            return Err(format!(
                "cannot truncate slot {slot} to {len} tokens: it holds only {have}"
            ));
        }
        let s = &mut self.slots[slot];
        s.tokens.truncate(len);
        s.next_pos = if len == 0 {
            0
        } else {
            s.next_pos - (have - len)
        };
        Ok(())
    }

    /// Makes `dst` hold the first `len` positions of `src` (K/V and tokens), e.g. a shared prompt.
    pub fn copy_prefix(&mut self, src: usize, dst: usize, len: usize) -> Result<(), String> {
        let have = self.len(src);
        if len > have {
            return Err(format!(
                "cannot copy {len} tokens from slot {src}: it holds only {have}"
            ));
        }
        if src == dst {
            return self.truncate(dst, len);
        }
        let (d, ctx) = (self.head_dim, self.max_context);
        let (a, b) = (src.min(dst), src.max(dst));
        let (lo, hi) = self.slots.split_at_mut(b);
        let (from, to) = if src < dst {
            (&lo[a], &mut hi[0])
        } else {
            (&hi[0], &mut lo[a])
        };
        for block in 0..2 * self.layers {
            for h in 0..self.kv_heads {
                let at = block * self.kv_heads * ctx * d + h * ctx * d;
                to.kv[at..at + len * d].copy_from_slice(&from.kv[at..at + len * d]);
            }
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
