//! Rotary tables for a decoder: one per `Rope` of the recipe (Gemma 3 has a local and a global one),
//! each with LongRoPE's second set when the recipe has one, for every position a slot can reach
//! (2 * max_context: rotary positions may run ahead of cache indices, `set_next_pos`).
//!
//! Numerical contract: `ops::rope_tables` (angle in f32, cos/sin in f64 rounded once, times the
//! attention scaling in f32), as Hugging Face's rotary modules compute them.

use super::ops::rope_tables;
use super::recipe::Rope;

/// cos and sin, [positions][half].
pub struct Table {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

pub struct RopeTables {
    pub half: usize,
    pub short: Table,
    /// LongRoPE: (the long set, the length beyond which a step uses it).
    pub long: Option<(Table, usize)>,
}

impl RopeTables {
    pub fn new(r: &Rope, positions: usize) -> RopeTables {
        let table = |f: &[f32]| {
            let (cos, sin) = rope_tables(f, positions, r.scale);
            Table { cos, sin }
        };
        RopeTables {
            half: r.inv_freq.len(),
            short: table(&r.inv_freq),
            long: r.long.as_ref().map(|l| (table(&l.inv_freq), l.from_len)),
        }
    }

    /// The set a step uses whose largest position is `max_pos`: the long one when
    /// max_pos + 1 > from_len (Hugging Face's `seq_len > original_max_position_embeddings`).
    pub fn pick(&self, max_pos: usize) -> &Table {
        match &self.long {
            Some((t, from_len)) if max_pos + 1 > *from_len => t,
            _ => &self.short,
        }
    }
}

impl Table {
    /// cos and sin of position `pos`.
    #[inline]
    pub fn at(&self, pos: usize, half: usize) -> (&[f32], &[f32]) {
        let r = pos * half..(pos + 1) * half;
        (&self.cos[r.clone()], &self.sin[r])
    }
}
