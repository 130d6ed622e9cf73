//! Scores against an 8-bit cache's keys as integer dot products: each (pre-scaled) query row is
//! quantized like a cache row (`quant::row_q8`: int8 codes, one scale), so q.k is an exact i32 sum of
//! code products, scaled once per score. AVX-512 VNNI runs it with `vpdpbusd` on keys transposed into
//! lanes (`avx512_q8`: 64 multiply-adds an instruction, against 16 for the f32 FMAs of the widened
//! keys); every other tier sums the same codes as integer-valued floats with its own f32 `qk`, which
//! is exact, so every tier, tile and batch gives the same bits.
//!
//! Numerical contract: `score = (isum as f32 * qs) * ks` with `isum = sum_i qcode_i * kcode_i` (exact),
//! `qs` the query row's scale and `ks` the key row's, for heads of at most MAX_INT_D dims (larger ones keep
//! f32 scores). The float path's partial sums are integers below 2^24 (|isum| <= 127 * 127 * d), so its f32
//! additions are exact in any order.
//! What quantizing the query costs is stated beside the 8-bit cache's quality (docs/quantization.md).

use super::{Ops, QkArgs, View4};

/// Largest head size whose queries are rounded to one scale per row; larger heads (Gemma 3's 256) keep
/// f32 scores over the widened keys. Measured on the real Gemma 3 270M (Q4_K_M source, quality tool, 20
/// chunks): one scale over 256 dims raised int4's KL against float32 by 7 % (3.00e-2 -> 3.22e-2), over
/// 64 dims on the real SmolLM2-135M by 2 %. Any d up to 1040 would keep the float path's sums exact
/// (127 * 127 * 1040 < 2^24).
pub(crate) const MAX_INT_D: usize = 128;

/// Operands of `qk_q8`: scores[r*lds + s] = (isum(r, s) as f32 * qs[r]) * ks[s] for r < rows, s < keys,
/// isum(r, s) = sum over i < d of q[r*d + i] * k[s*ldk + i].
pub(crate) struct QkQ8Args<'a> {
    pub q: &'a [i8],
    pub qs: &'a [f32],
    pub rows: usize,
    pub k: &'a [i8],
    /// Stride of k's rows, in codes.
    pub ldk: usize,
    pub ks: &'a [f32],
    pub keys: usize,
    pub d: usize,
    pub scores: &'a mut [f32],
    /// Stride of the score rows, in floats.
    pub lds: usize,
}

impl QkQ8Args<'_> {
    /// Whether there is work (rows and keys non-zero). Panics when a slice is shorter than the shape
    /// needs, so a tier may then read through raw pointers.
    #[inline]
    pub(crate) fn has_work(&self) -> bool {
        if self.rows == 0 || self.keys == 0 {
            return false;
        }
        assert!(
            self.q.len() >= self.rows * self.d && self.qs.len() >= self.rows,
            "qk_q8: q too short"
        );
        assert!(
            self.k.len() >= (self.keys - 1) * self.ldk + self.d && self.ks.len() >= self.keys,
            "qk_q8: k too short"
        );
        assert!(
            self.scores.len() >= (self.rows - 1) * self.lds + self.keys,
            "qk_q8: scores too short"
        );
        true
    }
}

/// Query rows r0..r0 + n (d codes each, of `q`) plus 128 as unsigned bytes, row i at `out[i * stride..]`:
/// the operand `vpdpbusd` multiplies; the integer kernels take the bias off with the keys' code sums.
#[cfg(target_arch = "x86_64")]
pub(crate) fn bias_rows(
    q: &[i8],
    d: usize,
    (r0, n): (usize, usize),
    out: &mut [u8],
    stride: usize,
) {
    for i in 0..n {
        let row = &q[(r0 + i) * d..(r0 + i + 1) * d];
        for (o, &c) in out[i * stride..i * stride + d].iter_mut().zip(row) {
            *o = (c as u8) ^ 0x80;
        }
    }
}

/// The scalar reference of every tier.
#[cfg(test)]
pub(crate) fn qk_q8_reference(args: QkQ8Args<'_>) {
    if !args.has_work() {
        return;
    }
    let d = args.d;
    for r in 0..args.rows {
        let qr = &args.q[r * d..(r + 1) * d];
        for s in 0..args.keys {
            let kr = &args.k[s * args.ldk..s * args.ldk + d];
            let isum: i32 = qr.iter().zip(kr).map(|(&a, &b)| a as i32 * b as i32).sum();
            args.scores[r * args.lds + s] = (isum as f32 * args.qs[r]) * args.ks[s];
        }
    }
}

/// The query rows of a task in both forms the tiers read.
pub(crate) struct QRows<'a> {
    pub codes: &'a [i8],
    pub scales: &'a [f32],
    /// The codes as f32 (what tiers without `Ops::qk_q8` feed their float `qk`).
    pub as_f32: &'a [f32],
}

/// Scores of query rows r0.. (of `q`) against keys s0..s0 + n of (b, h) of an 8-bit cache, into
/// `scores[(r - r0) * lds..]`; `chunk` holds n * d floats of scratch.
///
/// # Safety
/// `ops` belongs to an ISA the CPU supports; the views passed `attention_kv`'s checks; n <= 64
/// (`block::KEY_CHUNK`) and d <= MAX_INT_D.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn chunk_scores(
    ops: &Ops,
    q: &QRows<'_>,
    r0: usize,
    codes: &View4<'_, i8>,
    scales: &View4<'_, f32>,
    (b, h, s0, n): (usize, usize, usize, usize),
    chunk: &mut [f32],
    scores: &mut [f32],
    lds: usize,
) {
    let d = codes.dims[3];
    let rows = q.scales.len() - r0;
    let mut ks = [0.0f32; 64];
    for (i, o) in ks[..n].iter_mut().enumerate() {
        *o = scales.data[scales.offset(b, h, s0 + i)];
    }
    let off = codes.offset(b, h, s0);
    let ldk = codes.strides[2];
    let k = &codes.data[off..off + (n - 1) * ldk + d];
    match ops.qk_q8 {
        Some(qk_q8) => qk_q8(QkQ8Args {
            q: &q.codes[r0 * d..],
            qs: &q.scales[r0..],
            rows,
            k,
            ldk,
            ks: &ks[..n],
            keys: n,
            d,
            scores,
            lds,
        }),
        None => {
            for (i, dst) in chunk[..n * d].chunks_exact_mut(d).enumerate() {
                // Scale 1: the codes themselves, exactly.
                (ops.widen_q8)(&k[i * ldk..i * ldk + d], 1.0, dst);
            }
            (ops.qk)(QkArgs {
                q: &q.as_f32[r0 * d..],
                rows,
                k: &chunk[..n * d],
                ldk: d,
                keys: n,
                d,
                scores,
                lds,
            });
            for (r, &qs) in q.scales[r0..].iter().enumerate() {
                for (x, &kss) in scores[r * lds..r * lds + n].iter_mut().zip(&ks[..n]) {
                    *x = (*x * qs) * kss;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{chunk_scores, qk_q8_reference, QRows, QkQ8Args};
    use crate::attention::{Ops, View4};
    use crate::isa;

    /// Deterministic codes over the whole i8 range.
    fn codes(n: usize, seed: u64) -> Vec<i8> {
        crate::attention::tests::stream(n, seed)
            .iter()
            .map(|&x| (x >> 56) as u8 as i8)
            .collect()
    }

    /// Every tier, and the float path of the tiers that have an integer kernel, against the scalar
    /// reference, bit for bit: head sizes that are and are not multiples of 4, 16 and 64 (up to Gemma's
    /// 256), key counts on both sides of the 16-key blocks, row counts on both sides of the 4-row tiles,
    /// strided keys and scores, extreme codes (-128 and 127 included).
    #[test]
    fn every_tier_equals_the_reference_bit_for_bit() {
        for tier in isa::supported() {
            let mut float_path = Ops::of(tier);
            let has_int = float_path.qk_q8.is_some();
            // The integer kernels run wherever the CPU has them (this test then covers them).
            #[cfg(target_arch = "x86_64")]
            match tier {
                isa::Isa::Avx512 => assert_eq!(has_int, crate::attention::avx512_q8::usable()),
                isa::Isa::AvxVnni => {
                    assert_eq!(has_int, crate::attention::avxvnni_q8::usable())
                }
                _ => {}
            }
            float_path.qk_q8 = None;
            let mut ops = vec![Some(Ops::of(tier)), has_int.then_some(float_path)];
            // The AVX-VNNI kernel's layout through its exact emulation, on any AVX2 CPU.
            #[cfg(target_arch = "x86_64")]
            if tier == isa::Isa::Avx2 {
                let mut emulated = Ops::of(tier);
                emulated.qk_q8 = Some(crate::attention::avxvnni_q8::emulated::qk_q8 as _);
                ops.push(Some(emulated));
            }
            for ops in ops.iter().flatten() {
                for d in [1, 4, 6, 62, 64, 80, 96, 128, 130, 256] {
                    for keys in [1, 15, 16, 17, 33, 63, 64] {
                        for rows in [1, 2, 3, 4, 5, 7, 9] {
                            let (ldk, lds) = (d + 3, keys + 5);
                            let q = codes(rows * d, d as u64);
                            let k = codes(64 * ldk, keys as u64 + 7);
                            let qs: Vec<f32> = (0..rows).map(|r| 0.013 + r as f32 * 1e-3).collect();
                            let ksc: Vec<f32> =
                                (0..keys).map(|s| 0.021 - s as f32 * 1e-4).collect();
                            let mut want = vec![0.0f32; rows * lds];
                            qk_q8_reference(QkQ8Args {
                                q: &q,
                                qs: &qs,
                                rows,
                                k: &k,
                                ldk,
                                ks: &ksc,
                                keys,
                                d,
                                scores: &mut want,
                                lds,
                            });
                            // The same keys as a cache view [1, 1, 64, d] with row stride ldk.
                            let kv = View4 {
                                data: &k[..],
                                dims: [1, 1, 64, d],
                                strides: [64 * ldk, 64 * ldk, ldk, 1],
                            };
                            let mut scales = vec![0.0f32; 64];
                            scales[..keys].copy_from_slice(&ksc);
                            let sv = View4::contiguous(&scales[..], [1, 1, 64, 1]);
                            let as_f32: Vec<f32> = q.iter().map(|&c| c as f32).collect();
                            let rq = QRows {
                                codes: &q,
                                scales: &qs,
                                as_f32: &as_f32,
                            };
                            let mut got = vec![0.0f32; rows * lds];
                            let mut chunk = vec![0.0f32; 64 * d];
                            // SAFETY: the tier is supported; keys <= 64, d <= 256; the views cover their dims.
                            unsafe {
                                chunk_scores(
                                    ops,
                                    &rq,
                                    0,
                                    &kv,
                                    &sv,
                                    (0, 0, 0, keys),
                                    &mut chunk,
                                    &mut got,
                                    lds,
                                )
                            };
                            for r in 0..rows {
                                let (g, w) = (
                                    &got[r * lds..r * lds + keys],
                                    &want[r * lds..r * lds + keys],
                                );
                                let bits =
                                    |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                                let kind = if ops.qk_q8.is_some() {
                                    "integer"
                                } else {
                                    "float"
                                };
                                assert_eq!(
                                    bits(g),
                                    bits(w),
                                    "{} {kind} d {d} keys {keys} rows {rows} row {r}",
                                    tier.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
