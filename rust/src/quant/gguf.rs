//! llama.cpp's GGUF tensor blocks read into this crate's reference form (`QuantRows`), so that a GGUF
//! file's quantized matrices run as they are: repacked, not quantized again.
//!
//! Contract: where `exact_format` names a format, every value of the result (`QuantRows::dequantize`)
//! equals ggml's own dequantization of the block bit for bit (the same f16 scales widened exactly, the
//! same integer codes, the same float operations):
//! - Q8_0 -> `Q80`, Q5_0 -> `Q50`, Q4_0 -> `Q40`: d * (c - z) with ggml's f16 d and its codes, in the
//!   file's own bits per weight (8.5, 5.5, 4.5);
//! - parts of one fused matrix in different types of these three (a Q4_K_M file's Q5_0 q/k beside a Q8_0
//!   v) stack in the widest of their formats, each part's values unchanged: Q4_0's codes q as q + 8 in
//!   `Q50` (d * (q - 8) = d * ((q + 8) - 16)), Q4_0's and Q5_0's as q - z + 128 in `Q80` (`stack_format`);
//! - Q4_1 -> `Q4`: d * c + m with ggml's f16 d and m;
//! - Q4_K -> `Q4K`: (d * sc) * c - dmin * m with ggml's f16 d and dmin and 6-bit sc and m per 32 values;
//! - Q6_K -> `Q6K16`: (d * sc) * (u - 32) with ggml's f16 d, an i8 sc per 16 values and 6-bit codes.
//!
//! Block layouts are ggml's (`ggml-common.h`): little-endian, one row of k values = k / 32 (k / 256 for the
//! K-quants) blocks.

use super::{f16_to_f32, Format, QuantRows, QSUB};

/// ggml type ids (`enum ggml_type`) this module reads.
pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q5_0: u32 = 6;
pub const Q8_0: u32 = 8;
pub const Q4_K: u32 = 12;
pub const Q6_K: u32 = 14;

/// (values per block, bytes per block) of a ggml type read here.
pub fn block_shape(ty: u32) -> Option<(usize, usize)> {
    Some(match ty {
        Q4_0 => (32, 18),
        Q4_1 => (32, 20),
        Q5_0 => (32, 22),
        Q8_0 => (32, 34),
        Q4_K => (256, 144),
        Q6_K => (256, 210),
        _ => return None,
    })
}

/// The format that holds a ggml type's values exactly.
pub fn exact_format(ty: u32) -> Option<Format> {
    match ty {
        Q8_0 => Some(Format::Q80),
        Q5_0 => Some(Format::Q50),
        Q4_0 => Some(Format::Q40),
        Q4_1 => Some(Format::Q4),
        Q4_K => Some(Format::Q4K),
        Q6_K => Some(Format::Q6K16),
        _ => None,
    }
}

/// The format in which parts of these types stack into one matrix with every value the file's: their
/// common format, or for a mix of Q4_0 / Q5_0 / Q8_0 the widest of theirs; None for other mixes.
pub fn stack_format(types: &[u32]) -> Option<Format> {
    let first = exact_format(*types.first()?)?;
    if types.iter().all(|&t| exact_format(t) == Some(first)) {
        return Some(first);
    }
    if !types.iter().all(|t| matches!(*t, Q4_0 | Q5_0 | Q8_0)) {
        return None;
    }
    Some(if types.contains(&Q8_0) {
        Format::Q80
    } else {
        Format::Q50
    })
}

/// Whether `into` holds a ggml type's values exactly (`stack_format`'s widenings).
fn holds(ty: u32, into: Format) -> bool {
    exact_format(ty) == Some(into)
        || matches!((ty, into), (Q4_0, Format::Q50) | (Q4_0 | Q5_0, Format::Q80))
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// An [n, k] matrix of ggml type `ty` (`data`: its n rows of blocks, as in the file) in the reference form,
/// and whether its values are the file's exactly (every type read here: true). `into`:
/// the format to hold it (`stack_format` of a fused matrix's parts); None: the type's own.
pub fn to_rows(
    ty: u32,
    data: &[u8],
    n: usize,
    k: usize,
    into: Option<Format>,
) -> Result<(QuantRows, bool), String> {
    let (bs, bb) = block_shape(ty).ok_or_else(|| {
        format!("ggml type {ty} has no repacking here (read: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K)")
    })?;
    if k == 0 || !k.is_multiple_of(bs) {
        return Err(format!(
            "k = {k} is not a multiple of the type's {bs}-value block"
        ));
    }
    let row_bytes = k / bs * bb;
    if Some(data.len()) != n.checked_mul(row_bytes) {
        return Err(format!(
            "{} bytes for a [{n}, {k}] matrix of ggml type {ty}, expected {}",
            data.len(),
            n.saturating_mul(row_bytes)
        ));
    }
    let f = into
        .unwrap_or_else(|| exact_format(ty).expect("every type with a block shape has a format"));
    if !holds(ty, f) {
        return Err(format!(
            "ggml type {ty} cannot be held exactly in {}",
            f.name()
        ));
    }
    let mut q = QuantRows::zeros(f, n, k);
    for (j, row) in data.chunks_exact(row_bytes).enumerate() {
        for (b, blk) in row.chunks_exact(bb).enumerate() {
            let at = j * k + b * bs;
            let codes = &mut q.codes[at..at + bs];
            match ty {
                Q8_0 | Q5_0 | Q4_0 => {
                    q.scales[j * (k / 32) + b] = f16_at(blk, 0);
                    // Stored c + z: 128 for Q80's unsigned codes, Q40's 8 and Q50's 16.
                    let z = f.zero_point().unwrap_or(128);
                    for (t, c) in codes.iter_mut().enumerate() {
                        *c = (small_code(ty, blk, t) + z) as u8;
                    }
                }
                Q4_1 => {
                    q.scales[j * (k / 32) + b] = f16_at(blk, 0);
                    q.mins[j * (k / 32) + b] = f16_at(blk, 2);
                    for (t, c) in codes.iter_mut().enumerate() {
                        *c = (blk[4 + t % 16] >> (4 * (t / 16))) & 0x0f;
                    }
                }
                Q4_K => {
                    let nsb = k / 256;
                    q.scales[j * nsb + b] = f16_at(blk, 0);
                    q.mins[j * nsb + b] = f16_at(blk, 2);
                    for s in 0..8 {
                        let (sc, m) = k4_scale_min(&blk[4..16], s);
                        let sub = (j * (k / QSUB) + b * 8 + s) * 2;
                        q.subs[sub] = sc;
                        q.subs[sub + 1] = m;
                    }
                    // 64-value chunk c: its first 32 values in the low nibbles of qs[32c..], the next 32 in
                    // the high ones.
                    for (t, c) in codes.iter_mut().enumerate() {
                        let (chunk, half, l) = (t / 64, (t % 64) / 32, t % 32);
                        *c = (blk[16 + 32 * chunk + l] >> (4 * half)) & 0x0f;
                    }
                }
                _ => {
                    // Q6_K: sub-block s's two 16-value scales, in order.
                    q.scales[j * (k / 256) + b] = f16_at(blk, 208);
                    for s in 0..16 {
                        q.subs[2 * (j * (k / QSUB) + b * 8) + s] = blk[192 + s];
                    }
                    for (t, c) in codes.iter_mut().enumerate() {
                        *c = q6_k_code(blk, t);
                    }
                }
            }
        }
    }
    Ok((q, true))
}

/// Code t of a Q8_0 / Q5_0 / Q4_0 block, signed.
fn small_code(ty: u32, blk: &[u8], t: usize) -> i32 {
    match ty {
        Q8_0 => blk[2 + t] as i8 as i32,
        Q4_0 => ((blk[2 + t % 16] >> (4 * (t / 16))) & 0x0f) as i32 - 8,
        _ => {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            let lo = ((blk[6 + t % 16] >> (4 * (t / 16))) & 0x0f) as u32;
            (lo | (((qh >> t) & 1) << 4)) as i32 - 16
        }
    }
}

/// Q4_K's 6-bit scale and min of sub-block s from its 12 packed bytes (ggml's `get_scale_min_k4`).
fn k4_scale_min(q: &[u8], s: usize) -> (u8, u8) {
    if s < 4 {
        (q[s] & 63, q[s + 4] & 63)
    } else {
        (
            (q[s + 4] & 0x0f) | ((q[s - 4] >> 6) << 4),
            (q[s + 4] >> 4) | ((q[s] >> 6) << 4),
        )
    }
}

/// Q6_K value t's code + 32 (0..=63): ql[128], qh[64], then 16 i8 scales and the f16 d. Each 128-value
/// half h: l in 0..32 reads ql[64h + l] (low nibble: value l, high: l + 64) and ql[64h + 32 + l] (value
/// l + 32, l + 96), their high 2 bits from qh[32h + l] at bits 0, 2, 4, 6 for values l, l + 32, l + 64, l + 96.
fn q6_k_code(blk: &[u8], t: usize) -> u8 {
    let (h, u) = (t / 128, t % 128);
    let (quarter, l) = (u / 32, u % 32);
    let ql = blk[64 * h + 32 * (quarter % 2) + l] >> (4 * (quarter / 2));
    let qh = blk[128 + 32 * h + l] >> (2 * quarter);
    (ql & 0x0f) | ((qh & 3) << 4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QuantWeight;

    /// `n` pseudo-random bytes (a linear congruential generator's top bits).
    fn random_bytes(mut seed: u64, n: usize) -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn parts_stack_in_the_widest_format_that_holds_them_all() {
        assert_eq!(stack_format(&[Q4_0]), Some(Format::Q40));
        assert_eq!(stack_format(&[Q5_0, Q5_0]), Some(Format::Q50));
        assert_eq!(stack_format(&[Q4_0, Q5_0, Q5_0]), Some(Format::Q50));
        assert_eq!(stack_format(&[Q4_0, Q8_0]), Some(Format::Q80));
        assert_eq!(stack_format(&[Q5_0, Q8_0, Q4_0]), Some(Format::Q80));
        assert_eq!(stack_format(&[Q4_K, Q4_K]), Some(Format::Q4K));
        assert_eq!(stack_format(&[Q4_K, Q6_K]), None);
        assert_eq!(stack_format(&[Q4_1, Q4_0]), None);
        assert_eq!(stack_format(&[]), None);
    }

    /// Random Q4_0 / Q5_0 blocks in each format that holds them: every value ggml's d * (q - z), through
    /// the packed form and back.
    #[test]
    fn q4_0_and_q5_0_blocks_keep_their_values_in_every_format_that_holds_them() {
        let (n, k) = (19, 96);
        for (ty, intos) in [
            (Q4_0, vec![Format::Q40, Format::Q50, Format::Q80]),
            (Q5_0, vec![Format::Q50, Format::Q80]),
        ] {
            let (_, bb) = block_shape(ty).unwrap();
            let mut data = random_bytes(3, n * k / 32 * bb);
            for blk in data.chunks_exact_mut(bb) {
                blk[..2].copy_from_slice(&crate::quant::f32_to_f16(0.01).to_le_bytes());
            }
            // ggml's dequantization: d * (q - z), the signed code times the f16 scale widened.
            let d = f16_to_f32(crate::quant::f32_to_f16(0.01));
            let want: Vec<f32> = data
                .chunks_exact(bb)
                .flat_map(|blk| (0..32).map(move |t| d * small_code(ty, blk, t) as f32))
                .collect();
            assert!(to_rows(ty, &data, n, k, Some(Format::Q4)).is_err());
            for into in intos {
                let (q, exact) = to_rows(ty, &data, n, k, Some(into)).unwrap();
                assert!(exact && q.format == into);
                let back = QuantWeight::pack(&q).unpack();
                assert!(
                    back.dequantize() == want,
                    "{ty} in {into:?}: values changed"
                );
            }
        }
    }

    /// Random Q6_K blocks whose 16-value scales all differ: every value ggml's (d * sc) * (q - 32), through
    /// the packed Q6K16 form and back, on k = 512 (two blocks per row).
    #[test]
    fn q6_k_blocks_keep_their_values_with_a_scale_per_16() {
        let (n, k) = (21, 512);
        let mut data = random_bytes(5, n * k / 256 * 210);
        for blk in data.chunks_exact_mut(210) {
            blk[208..210].copy_from_slice(&crate::quant::f32_to_f16(0.003).to_le_bytes());
        }
        let want: Vec<f32> = data
            .chunks_exact(210)
            .flat_map(|blk| {
                let d = f16_at(blk, 208);
                (0..256).map(move |t| {
                    d * blk[192 + t / 16] as i8 as f32 * (q6_k_code(blk, t) as f32 - 32.0)
                })
            })
            .collect();
        let (q, exact) = to_rows(Q6_K, &data, n, k, None).unwrap();
        assert!(exact && q.format == Format::Q6K16);
        let back = QuantWeight::pack(&q).unpack();
        assert!(back.dequantize() == want, "values changed");
        let mut row = vec![0.0f32; k];
        QuantWeight::pack(&q).row_f32(7, &mut row);
        assert!(row[..] == want[7 * k..8 * k], "row_f32");
    }

    #[test]
    fn q4_k_scale_unpacking_reads_all_six_bits() {
        // Sub-blocks 4..8 take their top 2 bits from the high bits of bytes 0..8.
        let q = [0xffu8; 12];
        for s in 0..8 {
            assert_eq!(k4_scale_min(&q, s), (63, 63));
        }
        let mut q = [0u8; 12];
        q[8] = 0x21; // sub-block 4: sc low 4 bits 1, m low 4 bits 2
        q[0] = 0xc0; // sub-block 4's sc high bits 3
        q[4] = 0x40; // sub-block 4's m high bits 1
        assert_eq!(k4_scale_min(&q, 4), (1 | (3 << 4), 2 | (1 << 4)));
    }
}
