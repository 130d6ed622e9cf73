//! The quantized matrices: `QuantRows`, the reference form the quantizers produce and the tests
//! dequantize, and `QuantWeight`, the same numbers packed into panels of 16 output rows for the
//! kernels (and back: `unpack`, `from_packed` of a saved decoder, `row_f32` of an embedding lookup).
//!
//! Numerical contract: packing is lossless (`unpack` gives back the reference form; Q80's, Q40's and
//! Q50's scales are f16 values already), and `dequantize` / `row_f32` compute each value as
//! `d * (c - 128)` (Q8, Q80), `d * c + m` (Q4) or `d * (c - z)` (Q40, Q50) in f32, the super-block
//! formats' as `kblock::value`.

use super::{f16_to_f32, f32_to_f16, kblock, Format, QPANEL, QSUB};

/// The reference form: `codes[j * k + kk]` (Q8 and Q80 stored as `c + 128`, Q6K as `c + 32`, Q40 and Q50
/// as their unsigned codes),
/// `scales[j * nb + b]`, `mins[j * nb + b]` (Q4 and Q4K; f16-representable, as Q4's scales; Q4K's
/// min is subtracted), with nb = ceil(k / block); the super-block formats' sub-block scales
/// `subs[j * k / 32 + s]` (Q6K, an i8 as u8) or `subs[2 (j * k / 32 + s) + {0, 1}]` (Q4K's sc, mc; Q6K16's
/// two halves' i8 scales).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantRows {
    pub format: Format,
    pub n: usize,
    pub k: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub mins: Vec<f32>,
    pub subs: Vec<u8>,
}

impl QuantRows {
    /// All-zero codes and scales for an [n, k] matrix (k a multiple of the format's granule).
    pub fn zeros(format: Format, n: usize, k: usize) -> QuantRows {
        let nb = k.div_ceil(format.block());
        let subs = if format.is_super() {
            n * (k / QSUB) * kblock::subs_per_block(format)
        } else {
            0
        };
        QuantRows {
            format,
            n,
            k,
            codes: vec![0; n * k],
            scales: vec![0.0; n * nb],
            mins: if matches!(format, Format::Q4 | Format::Q4K) {
                vec![0.0; n * nb]
            } else {
                Vec::new()
            },
            subs: vec![0; subs],
        }
    }

    /// Matrices of one format and k stacked by rows (a fused projection's parts).
    pub fn stack(parts: Vec<QuantRows>) -> QuantRows {
        let mut it = parts.into_iter();
        let mut q = it.next().expect("stack: at least one part");
        for p in it {
            assert!(
                p.format == q.format && p.k == q.k,
                "stack: parts differ in format or k"
            );
            q.n += p.n;
            q.codes.extend(p.codes);
            q.scales.extend(p.scales);
            q.mins.extend(p.mins);
            q.subs.extend(p.subs);
        }
        q
    }

    /// Row-major [n, k] f32 values the codes stand for.
    pub fn dequantize(&self) -> Vec<f32> {
        let nb = self.k.div_ceil(self.format.block());
        let mut out = vec![0.0f32; self.n * self.k];
        for (i, o) in out.iter_mut().enumerate() {
            let (j, kk) = (i / self.k, i % self.k);
            if self.format.is_super() {
                *o = kblock::value(self, j, kk);
                continue;
            }
            let b = j * nb + kk / self.format.block();
            let c = self.codes[i] as f32;
            *o = value(self.format, self.scales[b], self.mins.get(b).copied(), c);
        }
        out
    }
}

/// A Q8 / Q80 / Q4 / Q40 / Q50 value from its block's scale d, min m (Q4) and stored code c, as the
/// module's contract says.
#[inline]
fn value(f: Format, d: f32, m: Option<f32>, c: f32) -> f32 {
    match (f, f.zero_point()) {
        (Format::Q8 | Format::Q80, _) => d * (c - 128.0),
        (_, Some(z)) => d * (c - z as f32),
        _ => d * c + m.expect("q4 has mins"),
    }
}

/// Panel-packed quantized [n, k] weights.
#[derive(Clone, Debug)]
pub struct QuantWeight {
    pub format: Format,
    pub(super) n: usize,
    pub(super) k: usize,
    data: Vec<u8>,
}

impl QuantWeight {
    /// Packs the reference form. Panel p, block b starts at byte `(p * nb + b) * block_bytes`:
    /// - Q8: 16 f32 scales, then for each 32-k half and each group of 4 k, 16 rows x 4 codes
    ///   (`c + 128`; one 64-byte vector holds 4 consecutive k of 16 rows, as `vpdpbusd` reads them).
    ///   Q80: 16 f16 scales, then the codes as Q8's with one 32-k half per block.
    /// - Q4: 16 f16 scales, 16 f16 mins, then for each group g of 8 k, 16 rows x 4 bytes whose low
    ///   nibbles are k = 8g..8g+3 and high nibbles k = 8g+4..8g+7.
    /// - Q40: 16 f16 scales, then the nibbles as Q4's. Q50: the same, then a 64-byte bit plane of the
    ///   codes' fifth bits: byte `4 r + u` (row r) holds in bit `v = 2 g + h` the fifth bit of k =
    ///   8g + 4h + u, the code that nibble h of byte `4 r + u` of group g holds the low bits of (so one
    ///   shift and one mask move vector v's bits to bit 4 of the bytes they complete).
    ///
    /// Rows past n are zero weights (Q8 code 128, scale 0; Q4 code 0, scale 0, min 0; Q40 / Q50 code 0,
    /// scale 0).
    pub fn pack(q: &QuantRows) -> QuantWeight {
        let (f, n, k) = (q.format, q.n, q.k);
        assert!(
            k > 0 && k.is_multiple_of(f.granule()),
            "pack: k = {k} is not a positive multiple of the {} block",
            f.name()
        );
        let z = QuantRows::zeros(f, n, k);
        assert!(
            q.codes.len() == z.codes.len()
                && q.scales.len() == z.scales.len()
                && q.mins.len() == z.mins.len()
                && q.subs.len() == z.subs.len(),
            "pack: codes/scales/mins lengths do not match [{n}, {k}]"
        );
        if f.is_super() {
            let data = kblock::pack(q);
            return QuantWeight {
                format: f,
                n,
                k,
                data,
            };
        }
        let nb = k / f.block();
        let panels = n.div_ceil(QPANEL);
        let bb = f.block_bytes();
        let mut data = vec![0u8; panels * nb * bb];
        for p in 0..panels {
            for b in 0..nb {
                let blk = &mut data[(p * nb + b) * bb..(p * nb + b + 1) * bb];
                for r in 0..QPANEL {
                    let j = p * QPANEL + r;
                    let live = j < n;
                    let code = |kk: usize| -> u8 {
                        match (live, f) {
                            (true, _) => q.codes[j * k + b * f.block() + kk],
                            (false, Format::Q8 | Format::Q80) => 128,
                            (false, _) => 0,
                        }
                    };
                    let s = if live { q.scales[j * nb + b] } else { 0.0 };
                    match f {
                        Format::Q8 | Format::Q80 => {
                            if f == Format::Q80 {
                                debug_assert_eq!(
                                    f16_to_f32(f32_to_f16(s)),
                                    s,
                                    "q8_0 scales are f16"
                                );
                                blk[r * 2..r * 2 + 2].copy_from_slice(&f32_to_f16(s).to_le_bytes());
                            } else {
                                blk[r * 4..r * 4 + 4].copy_from_slice(&s.to_le_bytes());
                            }
                            for kk in 0..f.block() {
                                blk[f.codes_at() + (kk / 4) * 64 + r * 4 + kk % 4] = code(kk);
                            }
                        }
                        _ => {
                            debug_assert_eq!(f16_to_f32(f32_to_f16(s)), s, "nibble scales are f16");
                            blk[r * 2..r * 2 + 2].copy_from_slice(&f32_to_f16(s).to_le_bytes());
                            if f == Format::Q4 {
                                let m = if live { q.mins[j * nb + b] } else { 0.0 };
                                blk[32 + r * 2..34 + r * 2]
                                    .copy_from_slice(&f32_to_f16(m).to_le_bytes());
                            }
                            let (co, hb) = (f.codes_at(), f.high_bits_at());
                            for g in 0..4 {
                                for t in 0..4 {
                                    let (lo, hi) = (code(g * 8 + t), code(g * 8 + 4 + t));
                                    blk[co + g * 64 + r * 4 + t] = (lo & 0x0f) | ((hi & 0x0f) << 4);
                                    if f == Format::Q50 {
                                        let bits = ((lo >> 4) & 1) << (2 * g)
                                            | ((hi >> 4) & 1) << (2 * g + 1);
                                        blk[hb + r * 4 + t] |= bits;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        QuantWeight {
            format: f,
            n,
            k,
            data,
        }
    }

    /// The reference form back (the inverse of `pack`).
    pub fn unpack(&self) -> QuantRows {
        let (f, n, k) = (self.format, self.n, self.k);
        if f.is_super() {
            return kblock::unpack(f, n, k, &self.data);
        }
        let nb = k / f.block();
        let mut q = QuantRows::zeros(f, n, k);
        for j in 0..n {
            for b in 0..nb {
                q.scales[j * nb + b] = self.scale(j, b);
                if f == Format::Q4 {
                    q.mins[j * nb + b] = self.min(j, b);
                }
            }
            for kk in 0..k {
                q.codes[j * k + kk] = self.code(j, kk);
            }
        }
        q
    }

    fn block_of(&self, j: usize, b: usize) -> &[u8] {
        let nb = self.k / self.format.block();
        let bb = self.format.block_bytes();
        let at = ((j / QPANEL) * nb + b) * bb;
        &self.data[at..at + bb]
    }

    fn scale(&self, j: usize, b: usize) -> f32 {
        let (blk, r) = (self.block_of(j, b), j % QPANEL);
        match self.format {
            Format::Q8 | Format::Q80 => self.format.q8_scale(blk, r),
            _ => f16_to_f32(u16::from_le_bytes([blk[r * 2], blk[r * 2 + 1]])),
        }
    }

    fn min(&self, j: usize, b: usize) -> f32 {
        let (blk, r) = (self.block_of(j, b), j % QPANEL);
        f16_to_f32(u16::from_le_bytes([blk[32 + r * 2], blk[33 + r * 2]]))
    }

    fn code(&self, j: usize, kk: usize) -> u8 {
        let bs = self.format.block();
        let (blk, r, t) = (self.block_of(j, kk / bs), j % QPANEL, kk % bs);
        match self.format {
            Format::Q8 | Format::Q80 => blk[self.format.codes_at() + (t / 4) * 64 + r * 4 + t % 4],
            // A nibble format's block is the super-block reader's sub-block 0 of 1.
            f => kblock::code(f, blk, 1, 0, r, t),
        }
    }

    /// Rebuilds packed weights from their bytes (a saved decoder), checking the length and that every
    /// scale and min is finite (a corrupted file is refused, not run).
    pub fn from_packed(
        format: Format,
        n: usize,
        k: usize,
        data: Vec<u8>,
    ) -> Result<QuantWeight, String> {
        if k == 0 || !k.is_multiple_of(format.granule()) {
            return Err(format!(
                "k = {k} is not a multiple of the {} block",
                format.name()
            ));
        }
        let want = n
            .div_ceil(QPANEL)
            .checked_mul(format.panel_bytes(k))
            .ok_or_else(|| format!("a [{n}, {k}] matrix is too large"))?;
        if data.len() != want {
            return Err(format!(
                "{} bytes of {} data for a [{n}, {k}] matrix, expected {want}",
                data.len(),
                format.name()
            ));
        }
        if format.is_super() {
            kblock::check_finite(format, n, k, &data)?;
            return Ok(QuantWeight { format, n, k, data });
        }
        let w = QuantWeight { format, n, k, data };
        let nb = k / format.block();
        for j in 0..n {
            for b in 0..nb {
                let min = if format == Format::Q4 {
                    w.min(j, b)
                } else {
                    0.0
                };
                if !w.scale(j, b).is_finite() || !min.is_finite() {
                    return Err(format!("row {j} block {b} has a non-finite scale or min"));
                }
            }
        }
        Ok(w)
    }

    /// The packed bytes (what `from_packed` takes back).
    pub fn packed_bytes(&self) -> &[u8] {
        &self.data
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes one pass over the matrix reads (padding included).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    pub(crate) fn data(&self) -> &[u8] {
        &self.data
    }

    /// Row j dequantized (an embedding lookup).
    pub fn row_f32(&self, j: usize, out: &mut [f32]) {
        if self.format.is_super() {
            kblock::row_f32(self.format, self.k, &self.data, j, out);
            return;
        }
        let bs = self.format.block();
        for (kk, o) in out[..self.k].iter_mut().enumerate() {
            let (s, c) = (self.scale(j, kk / bs), self.code(j, kk) as f32);
            let m = (self.format == Format::Q4).then(|| self.min(j, kk / bs));
            *o = value(self.format, s, m, c);
        }
    }
}
