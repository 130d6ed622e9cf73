//! The exact split of float32 activations into three bf16 pieces for the AMX bf16 GEMM (`bf16_gemm`): every x
//! is hi + mid + lo exactly (truncation: hi keeps the top 8 significant bits, mid the next 8 of the remainder, lo
//! what is left); bf16-valued activations have mid = lo = 0, and the GEMM then runs one pass instead of three.
//! Numerical contract: the pieces sum to x bit for bit (infinities and NaN stay in hi); see `bf16_gemm`'s
//! header for what the tiles then do with denormal pieces.

use std::ops::Range;

use crate::par::SyncPtr;

/// The activations as bf16 pieces: `pieces` blocks of `m_pad` rows, `ld` u16s apart, each holding
/// kp values (zero past k; zero rows past m).
pub(super) struct Split {
    pub data: *const u16,
    pub pieces: usize,
    pub m_pad: usize,
    pub kp: usize,
    pub ld: usize,
}

/// Cuts x into hi + mid + lo (see the module header). Returns whether mid and lo had a non-zero.
#[inline(always)]
fn split_row(x: &[f32], hi: &mut [u16], mid: &mut [u16], lo: &mut [u16]) -> (bool, bool) {
    let (mut any_mid, mut any_lo) = (0u16, 0u16);
    for (i, &v) in x.iter().enumerate() {
        let bits = v.to_bits();
        let h = bits & 0xffff_0000;
        // Inf / NaN (exponent all ones): everything in hi, NaN kept a NaN after truncation.
        let special = bits & 0x7f80_0000 == 0x7f80_0000;
        let r = if special { 0.0 } else { v - f32::from_bits(h) };
        let m = r.to_bits() & 0xffff_0000;
        let l = (r - f32::from_bits(m)).to_bits();
        let h = if special && bits & 0x007f_ffff != 0 {
            0x7fc0
        } else {
            (h >> 16) as u16
        };
        hi[i] = h;
        mid[i] = (m >> 16) as u16;
        lo[i] = (l >> 16) as u16;
        any_mid |= mid[i] & 0x7fff;
        any_lo |= lo[i] & 0x7fff;
    }
    (any_mid != 0, any_lo != 0)
}

/// One split: x (m x k) into the three piece blocks at `out` (`[3][m_pad][ld]` u16s, kp values a row).
pub(super) struct SplitArgs<'a> {
    pub x: &'a [f32],
    pub m: usize,
    pub k: usize,
    pub m_pad: usize,
    pub kp: usize,
    pub ld: usize,
    pub out: SyncPtr<u16>,
}

/// Splits rows `rows` of x into the piece blocks, zeros past m and k. Returns (any mid, any lo).
///
/// # Safety
/// `out` points at 3 * m_pad * ld u16s, kp <= ld, and no other thread writes these rows.
pub(super) unsafe fn split_rows(s: &SplitArgs<'_>, rows: Range<usize>) -> (bool, bool) {
    let (k, m_pad, kp, ld, out) = (s.k, s.m_pad, s.kp, s.ld, s.out.get());
    let (mut any_mid, mut any_lo) = (false, false);
    for r in rows {
        // SAFETY: r < m_pad, so the three rows lie inside `out` (caller's contract), and they
        // are distinct rows of distinct pieces: the slices do not overlap.
        let (hi, mid, lo) = unsafe {
            (
                std::slice::from_raw_parts_mut(out.add(r * ld), kp),
                std::slice::from_raw_parts_mut(out.add((m_pad + r) * ld), kp),
                std::slice::from_raw_parts_mut(out.add((2 * m_pad + r) * ld), kp),
            )
        };
        if r < s.m {
            let (a, b) = split_row(&s.x[r * k..(r + 1) * k], hi, mid, lo);
            any_mid |= a;
            any_lo |= b;
            for piece in [&mut *hi, &mut *mid, &mut *lo] {
                piece[k..].fill(0);
            }
        } else {
            for piece in [hi, mid, lo] {
                piece.fill(0);
            }
        }
    }
    (any_mid, any_lo)
}

/// `split_rows` compiled for AVX-512 (the same code, vectorised), for the hardware path.
///
/// # Safety
/// As `split_rows`, and the CPU has AVX-512 F/BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
pub(super) unsafe fn split_rows_avx512(s: &SplitArgs<'_>, rows: Range<usize>) -> (bool, bool) {
    // SAFETY: forwarded contract.
    unsafe { split_rows(s, rows) }
}

/// Test values in [-1, 1) from a seeded LCG (this file's and `bf16_gemm`'s tests).
#[cfg(test)]
pub(super) fn lcg(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bf16::{bf16_to_f32, f32_to_bf16};

    /// bf16 activations take one pass and give the float32 sums of the bf16 products; float32 ones
    /// need all three pieces: dropping lo shows (the test of the split itself).
    #[test]
    fn split_is_exact_and_counts_pieces() {
        let mut seed = 11u64;
        let k = 64;
        let x: Vec<f32> = (0..k).map(|_| lcg(&mut seed)).collect();
        let (mut hi, mut mid, mut lo) = (vec![0; k], vec![0; k], vec![0; k]);
        let (a, b) = split_row(&x, &mut hi, &mut mid, &mut lo);
        assert!(a && b, "random float32 values need all three pieces");
        for i in 0..k {
            let sum = bf16_to_f32(hi[i]) + bf16_to_f32(mid[i]) + bf16_to_f32(lo[i]);
            assert_eq!(sum.to_bits(), x[i].to_bits(), "{i}: {} != {}", sum, x[i]);
        }
        let xb: Vec<f32> = x.iter().map(|&v| bf16_to_f32(f32_to_bf16(v))).collect();
        assert_eq!(split_row(&xb, &mut hi, &mut mid, &mut lo), (false, false));
        let specials = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -0.0, 1e-40];
        split_row(&specials, &mut hi[..5], &mut mid[..5], &mut lo[..5]);
        assert_eq!(&hi[..2], &[0x7f80, 0xff80]);
        assert!(bf16_to_f32(hi[2]).is_nan());
        assert_eq!(hi[3], 0x8000);
        assert_eq!((&mid[..3], &lo[..3]), (&[0u16; 3][..], &[0u16; 3][..]));
    }
}
