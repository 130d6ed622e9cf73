//! The super-block formats' packed layout: 256 values of k share an f16 scale (and, for Q4K, an f16
//! min), and each 32-value sub-block refines them with small integer scales, as llama.cpp's K-quants.
//!
//! - `Q4K`: value = (d * sc) * c - (dmin * mc), c in 0..=15, sc and mc in 0..=63 per sub-block: 4.5
//!   bits per weight.
//! - `Q6K`: value = (d * sc) * (u - 32), u in 0..=63 (stored unsigned, as `vpdpbusd` wants), sc an i8
//!   per sub-block: 6.3125 bits per weight.
//!
//! `d * sc` and `dmin * mc` are exact in f32 (an f16 times an integer below 2^8), so the reference,
//! the packed form and every kernel agree on each sub-block's scale and min exactly.
//!
//! A row whose length k is not a multiple of 256 keeps whole super-blocks for the multiples and ends in
//! one shorter super-block of (k % 256) / 32 sub-blocks with the same header, so 576-, 896- or
//! 960-wide matrices are not stored in a bigger format.
//!
//! Panel p (16 output rows) holds its super-blocks in k order; super-block b of t sub-blocks:
//! - Q4K: 16 f16 d, 16 f16 dmin; `16 t` bytes `sc & 15 | (mc & 15) << 4` (sub-block j's 16 rows at
//!   `16 j`); `16 ceil(t / 2)` bytes of the high bits (pair q = sub-blocks 2q, 2q+1: bits 0-1 sc >> 4
//!   and 2-3 mc >> 4 of 2q, bits 4-5 and 6-7 of 2q+1); then each sub-block's codes in Q4's layout
//!   (4 groups of 8 k, 16 rows x 4 bytes, low nibbles k 8g..8g+3, high nibbles 8g+4..8g+7).
//! - Q6K: 16 f16 d; `16 t` i8 scales; then per sub-block 256 bytes of the low 4 bits in Q4's layout
//!   and 128 bytes of the high 2 bits: code vector v = 2g + h (group g, nibble h) keeps its bits in
//!   byte `(v / 4) * 64 + 4 r + u`, bits `2 (v % 4)`.
//! - Q6K16: 16 f16 d; per sub-block 16 i8 first-half scales then 16 second-half ones (`32 t` bytes); then
//!   the codes as Q6K's.

use super::{f16_to_f32, f32_to_f16, Format, QuantRows, QPANEL, QSUB};

/// Values of k per super-block.
pub const SUPER: usize = 256;
/// Sub-blocks per full super-block.
pub const SUBS: usize = SUPER / QSUB;

/// Bytes of a panel's super-block with `t` sub-blocks.
pub(crate) const fn super_bytes(f: Format, t: usize) -> usize {
    match f {
        Format::Q4K => 64 + 16 * t + 16 * t.div_ceil(2) + 256 * t,
        Format::Q6K => 32 + 16 * t + 384 * t,
        Format::Q6K16 => 32 + 32 * t + 384 * t,
        // The nibble formats' 32-value blocks, t of them in k order: the super-block driver's view.
        Format::Q4 | Format::Q40 | Format::Q50 => t * f.block_bytes(),
        Format::Q8 | Format::Q80 => 0,
    }
}

/// Where a matrix's super-blocks are: k = `full` whole super-blocks and a `tail` of sub-blocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub f: Format,
    pub full: usize,
    pub tail: usize,
    pub panel_bytes: usize,
}

impl Layout {
    pub fn new(f: Format, k: usize) -> Layout {
        let (full, tail) = (k / SUPER, (k % SUPER) / QSUB);
        let tail_bytes = if tail > 0 { super_bytes(f, tail) } else { 0 };
        Layout {
            f,
            full,
            tail,
            panel_bytes: full * super_bytes(f, SUBS) + tail_bytes,
        }
    }

    /// Super-blocks per panel.
    pub fn blocks(&self) -> usize {
        self.full + usize::from(self.tail > 0)
    }

    /// Sub-blocks of super-block b.
    #[inline(always)]
    pub fn subs(&self, b: usize) -> usize {
        if b < self.full {
            SUBS
        } else {
            self.tail
        }
    }

    /// Byte offset of super-block b of panel p.
    #[inline(always)]
    pub fn at(&self, p: usize, b: usize) -> usize {
        p * self.panel_bytes + b * super_bytes(self.f, SUBS)
    }

    /// Offset, within a super-block of t sub-blocks, of sub-block j's codes.
    #[inline(always)]
    pub fn codes(&self, t: usize, j: usize) -> usize {
        Layout::codes_at(self.f, t, j)
    }

    #[inline(always)]
    pub const fn codes_at(f: Format, t: usize, j: usize) -> usize {
        match f {
            Format::Q4K => 64 + 16 * t + 16 * t.div_ceil(2) + 256 * j,
            Format::Q6K16 => 32 + 32 * t + 384 * j,
            Format::Q4 | Format::Q40 | Format::Q50 => j * f.block_bytes() + f.codes_at(),
            _ => 32 + 16 * t + 384 * j,
        }
    }
}

/// The sub-block scales of a reference form: Q4K keeps (sc, mc) pairs, Q6K one i8 (as u8) each, Q6K16
/// two (its halves').
pub(crate) fn subs_per_block(f: Format) -> usize {
    if matches!(f, Format::Q4K | Format::Q6K16) {
        2
    } else {
        1
    }
}

/// Value of row j, column kk of the reference form.
pub(crate) fn value(q: &QuantRows, j: usize, kk: usize) -> f32 {
    let (nsb, nsub) = (q.k.div_ceil(SUPER), q.k / QSUB);
    let (b, s) = (kk / SUPER, kk / QSUB);
    let c = q.codes[j * q.k + kk] as f32;
    match q.format {
        Format::Q4K => {
            let (sc, mc) = (q.subs[(j * nsub + s) * 2], q.subs[(j * nsub + s) * 2 + 1]);
            (q.scales[j * nsb + b] * sc as f32) * c - q.mins[j * nsb + b] * mc as f32
        }
        Format::Q6K16 => {
            let sc = q.subs[(j * nsub + s) * 2 + (kk % QSUB) / 16] as i8;
            (q.scales[j * nsb + b] * sc as f32) * (c - 32.0)
        }
        _ => (q.scales[j * nsb + b] * q.subs[j * nsub + s] as i8 as f32) * (c - 32.0),
    }
}

/// Packs the reference form (rows past n are zeros, scales included).
pub(crate) fn pack(q: &QuantRows) -> Vec<u8> {
    let (f, n, k) = (q.format, q.n, q.k);
    let lay = Layout::new(f, k);
    let (nsb, nsub) = (k.div_ceil(SUPER), k / QSUB);
    let panels = n.div_ceil(QPANEL);
    let mut data = vec![0u8; panels * lay.panel_bytes];
    for p in 0..panels {
        for b in 0..lay.blocks() {
            let t = lay.subs(b);
            let blk = &mut data[lay.at(p, b)..lay.at(p, b) + super_bytes(f, t)];
            for r in 0..QPANEL {
                let j = p * QPANEL + r;
                if j >= n {
                    continue;
                }
                let d = f32_to_f16(q.scales[j * nsb + b]).to_le_bytes();
                blk[r * 2..r * 2 + 2].copy_from_slice(&d);
                if f == Format::Q4K {
                    let m = f32_to_f16(q.mins[j * nsb + b]).to_le_bytes();
                    blk[32 + r * 2..34 + r * 2].copy_from_slice(&m);
                }
                for s in 0..t {
                    let sub = j * nsub + b * SUBS + s;
                    match f {
                        Format::Q4K => {
                            let (sc, mc) = (q.subs[sub * 2], q.subs[sub * 2 + 1]);
                            blk[64 + 16 * s + r] = (sc & 15) | ((mc & 15) << 4);
                            let hi = ((sc >> 4) & 3) | (((mc >> 4) & 3) << 2);
                            blk[64 + 16 * t + 16 * (s / 2) + r] |= hi << (4 * (s % 2));
                        }
                        Format::Q6K16 => {
                            blk[32 + 32 * s + r] = q.subs[sub * 2];
                            blk[48 + 32 * s + r] = q.subs[sub * 2 + 1];
                        }
                        _ => blk[32 + 16 * s + r] = q.subs[sub],
                    }
                    let at = lay.codes(t, s);
                    let code = |kk: usize| q.codes[j * k + b * SUPER + s * QSUB + kk];
                    for g in 0..4 {
                        for u in 0..4 {
                            let (c0, c1) = (code(g * 8 + u), code(g * 8 + 4 + u));
                            blk[at + g * 64 + r * 4 + u] = (c0 & 15) | ((c1 & 15) << 4);
                            if f.is_q6() {
                                for (h, c) in [(0, c0), (1, c1)] {
                                    let v = 2 * g + h;
                                    blk[at + 256 + (v / 4) * 64 + r * 4 + u] |=
                                        (c >> 4) << (2 * (v % 4));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    data
}

/// Row r's (d * sc, dmin * mc) of sub-block s in a packed super-block of t sub-blocks (Q6K: dm = 0;
/// Q6K16: its two halves' d * sc_a, d * sc_b; Q4, Q40, Q50: block s's d and the min it subtracts).
#[inline]
pub(crate) fn sub_scales(f: Format, blk: &[u8], t: usize, s: usize, r: usize) -> (f32, f32) {
    if f.is_nibbles() {
        // Block s of 8 viewed as a super-block's sub-block: Q4's d * c + m as d * c - (-m), Q40's and
        // Q50's d * (c - z) as d * c - z d (both exact).
        let h = |at: usize| f16_to_f32(u16::from_le_bytes([blk[at], blk[at + 1]]));
        let at = s * f.block_bytes();
        let d = h(at + 2 * r);
        return match f.zero_point() {
            Some(z) => (d, z as f32 * d),
            None => (d, -h(at + 32 + 2 * r)),
        };
    }
    let (d, dmin) = heads(f, blk, r);
    let (sc, mc) = sub_ints(f, blk, t, s, r);
    if f == Format::Q6K16 {
        return (d * sc as f32, d * mc as f32);
    }
    (d * sc as f32, dmin * mc as f32)
}

/// Row r's super-block scale d and min scale dmin (Q6K: 0) of a packed super-block.
#[inline]
pub(crate) fn heads(f: Format, blk: &[u8], r: usize) -> (f32, f32) {
    let h = |at: usize| f16_to_f32(u16::from_le_bytes([blk[at], blk[at + 1]]));
    match f {
        Format::Q4K => (h(r * 2), h(32 + r * 2)),
        _ => (h(r * 2), 0.0),
    }
}

/// Row r's integer sub-block scale and min (Q4K: sc, mc in 0..=63; Q6K: the i8 scale and 0; Q6K16: the
/// halves' i8 scales) of sub-block s in a packed super-block of t sub-blocks.
#[inline]
pub(crate) fn sub_ints(f: Format, blk: &[u8], t: usize, s: usize, r: usize) -> (i32, i32) {
    match f {
        Format::Q4K => {
            let lo = blk[64 + 16 * s + r];
            let hi = blk[64 + 16 * t + 16 * (s / 2) + r] >> (4 * (s % 2));
            let sc = (lo & 15) | ((hi & 3) << 4);
            let mc = (lo >> 4) | (((hi >> 2) & 3) << 4);
            (sc as i32, mc as i32)
        }
        Format::Q6K16 => (
            blk[32 + 32 * s + r] as i8 as i32,
            blk[48 + 32 * s + r] as i8 as i32,
        ),
        _ => (blk[32 + 16 * s + r] as i8 as i32, 0),
    }
}

/// Row r's stored code of value kk (0..32) of sub-block s (Q6K: unsigned, `c + 32`).
#[inline]
pub(crate) fn code(f: Format, blk: &[u8], t: usize, s: usize, r: usize, kk: usize) -> u8 {
    let at = Layout::codes_at(f, t, s);
    let (g, hh, u) = (kk / 8, (kk % 8) / 4, kk % 4);
    let mut c = (blk[at + g * 64 + r * 4 + u] >> (4 * hh)) & 15;
    if f == Format::Q50 {
        let plane = blk[s * f.block_bytes() + f.high_bits_at() + r * 4 + u];
        c |= ((plane >> (2 * g + hh)) & 1) << 4;
    }
    if f.is_q6() {
        let v = 2 * g + hh;
        c |= ((blk[at + 256 + (v / 4) * 64 + r * 4 + u] >> (2 * (v % 4))) & 3) << 4;
    }
    c
}

/// Row j of a packed matrix dequantized into `out[..k]` (an embedding lookup), as `value` computes it.
pub(crate) fn row_f32(f: Format, k: usize, data: &[u8], j: usize, out: &mut [f32]) {
    let lay = Layout::new(f, k);
    let (p, r) = (j / QPANEL, j % QPANEL);
    // The row's bytes are spread over its whole panel (4 of every 64): ask for all its lines at once
    // rather than one miss at a time (a SmolLM2 q6k lookup 2.35-2.67 -> 1.91-2.19 us).
    crate::hint::prefetch(data[lay.at(p, 0)..].as_ptr(), lay.panel_bytes);
    for b in 0..lay.blocks() {
        let t = lay.subs(b);
        let blk = &data[lay.at(p, b)..lay.at(p, b) + super_bytes(f, t)];
        for s in 0..t {
            let (ds, dm) = sub_scales(f, blk, t, s, r);
            let o = &mut out[b * SUPER + s * QSUB..b * SUPER + (s + 1) * QSUB];
            for (kk, v) in o.iter_mut().enumerate() {
                let c = code(f, blk, t, s, r, kk) as f32;
                *v = match f {
                    Format::Q4K => ds * c - dm,
                    Format::Q6K16 if kk >= 16 => dm * (c - 32.0),
                    _ => ds * (c - 32.0),
                };
            }
        }
    }
}

/// The reference form of packed bytes (the inverse of `pack` for rows below n).
pub(crate) fn unpack(f: Format, n: usize, k: usize, data: &[u8]) -> QuantRows {
    let lay = Layout::new(f, k);
    let (nsb, nsub) = (k.div_ceil(SUPER), k / QSUB);
    let mut q = QuantRows::zeros(f, n, k);
    for j in 0..n {
        let (p, r) = (j / QPANEL, j % QPANEL);
        for b in 0..lay.blocks() {
            let t = lay.subs(b);
            let blk = &data[lay.at(p, b)..lay.at(p, b) + super_bytes(f, t)];
            let h = |at: usize| f16_to_f32(u16::from_le_bytes([blk[at], blk[at + 1]]));
            q.scales[j * nsb + b] = h(r * 2);
            if f == Format::Q4K {
                q.mins[j * nsb + b] = h(32 + r * 2);
            }
            for s in 0..t {
                let sub = j * nsub + b * SUBS + s;
                match f {
                    Format::Q4K => {
                        let lo = blk[64 + 16 * s + r];
                        let hi = blk[64 + 16 * t + 16 * (s / 2) + r] >> (4 * (s % 2));
                        q.subs[sub * 2] = (lo & 15) | ((hi & 3) << 4);
                        q.subs[sub * 2 + 1] = (lo >> 4) | (((hi >> 2) & 3) << 4);
                    }
                    Format::Q6K16 => {
                        q.subs[sub * 2] = blk[32 + 32 * s + r];
                        q.subs[sub * 2 + 1] = blk[48 + 32 * s + r];
                    }
                    _ => q.subs[sub] = blk[32 + 16 * s + r],
                }
                for kk in 0..QSUB {
                    q.codes[j * k + b * SUPER + s * QSUB + kk] = code(f, blk, t, s, r, kk);
                }
            }
        }
    }
    q
}

/// Checks a saved matrix's scales are finite (a corrupted file is refused, not run).
pub(crate) fn check_finite(f: Format, n: usize, k: usize, data: &[u8]) -> Result<(), String> {
    let lay = Layout::new(f, k);
    let heads = if f == Format::Q4K { 32 } else { 16 };
    for p in 0..n.div_ceil(QPANEL) {
        for b in 0..lay.blocks() {
            let at = lay.at(p, b);
            for h in 0..heads {
                let v = f16_to_f32(u16::from_le_bytes([data[at + 2 * h], data[at + 2 * h + 1]]));
                if !v.is_finite() {
                    return Err(format!(
                        "rows {}.. super-block {b} have a non-finite scale or min",
                        p * QPANEL
                    ));
                }
            }
        }
    }
    Ok(())
}
