//! A fitted matrix's grid, what GPTQ (`kwker_torch/decoder/gptq.py`) quantizes column by column under:
//! for every row and 32-value sub-block, the step and offset with which a stored code c (as
//! `QuantRows::codes` holds it: Q8 and Q80 `c + 128`, Q6K `c + 32`, Q40 and Q50 `c + z`) stands for `step * c + offset`,
//! and the codes' range; then `set_codes` puts codes chosen elsewhere back under the same grid.
//!
//! Numerical contract: `step * c + offset` equals `QuantRows::dequantize` exactly for Q4 and Q4K (the
//! same f32 operations), and up to one f32 rounding for Q8, Q80, Q40, Q50 and Q6K (`d * (c - z)` against
//! `d * c - d * z`): GPTQ only uses these values to carry each column's rounding error onward, and
//! the codes it chooses are stored as they are.

use super::kblock::SUPER;
use super::{Format, QuantRows, QSUB};

/// The stored codes' range (inclusive) of a format.
pub fn code_range(f: Format) -> (u8, u8) {
    match f {
        Format::Q8 | Format::Q80 => (1, 255),
        Format::Q4 | Format::Q4K => (0, 15),
        Format::Q6K | Format::Q6K16 => (0, 63),
        Format::Q40 => (0, 15),
        Format::Q50 => (0, 31),
    }
}

/// Each (row, 32-value sub-block)'s step and offset, row-major `[n, k / 32]` each. Q6K16's scale changes
/// within a sub-block: refused.
pub fn grid(q: &QuantRows) -> Result<(Vec<f32>, Vec<f32>), String> {
    let (n, k, f) = (q.n, q.k, q.format);
    if f == Format::Q6K16 {
        return Err(
            "q6_k has a scale per 16 values, and GPTQ fits a grid per 32: use q6k (a scale per 32)"
                .into(),
        );
    }
    let nsub = k / QSUB;
    let (mut step, mut offset) = (vec![0.0f32; n * nsub], vec![0.0f32; n * nsub]);
    let nb = k.div_ceil(f.block());
    for j in 0..n {
        for s in 0..nsub {
            let (st, off) = match f {
                Format::Q8 | Format::Q80 | Format::Q4 | Format::Q40 | Format::Q50 => {
                    let b = j * nb + s * QSUB / f.block();
                    if f == Format::Q4 {
                        (q.scales[b], q.mins[b])
                    } else {
                        let z = f.zero_point().unwrap_or(128);
                        (q.scales[b], -(z as f32) * q.scales[b])
                    }
                }
                Format::Q4K => {
                    let b = j * k.div_ceil(SUPER) + s * QSUB / SUPER;
                    let (sc, mc) = (q.subs[(j * nsub + s) * 2], q.subs[(j * nsub + s) * 2 + 1]);
                    (q.scales[b] * sc as f32, -(q.mins[b] * mc as f32))
                }
                Format::Q6K | Format::Q6K16 => {
                    let b = j * k.div_ceil(SUPER) + s * QSUB / SUPER;
                    let st = q.scales[b] * q.subs[j * nsub + s] as i8 as f32;
                    (st, -32.0 * st)
                }
            };
            step[j * nsub + s] = st;
            offset[j * nsub + s] = off;
        }
    }
    Ok((step, offset))
}

impl QuantRows {
    /// Replaces the codes (row-major `[n, k]`, stored form) under the fitted scales; refuses codes out of
    /// the format's range or of the wrong count.
    pub fn set_codes(&mut self, codes: &[u8]) -> Result<(), String> {
        if codes.len() != self.codes.len() {
            return Err(format!(
                "{} codes for a [{}, {}] matrix",
                codes.len(),
                self.n,
                self.k
            ));
        }
        let (lo, hi) = code_range(self.format);
        if let Some(i) = codes.iter().position(|c| !(lo..=hi).contains(c)) {
            return Err(format!(
                "code [{}, {}] is {}, outside {}'s range {lo}..={hi}",
                i / self.k,
                i % self.k,
                codes[i],
                self.format.name()
            ));
        }
        self.codes.copy_from_slice(codes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{quantize, QuantOptions};

    fn matrix(n: usize, k: usize) -> Vec<f32> {
        (0..n * k)
            .map(|i| ((i as f32 * 0.7309).sin() * 1.3 + (i % 7) as f32 * 0.05) * 0.02)
            .collect()
    }

    /// The grid reproduces every format's dequantized values (exactly for Q4 / Q4K, to one rounding
    /// otherwise), on a row whose length is not a multiple of 256 (a shorter last super-block).
    #[test]
    fn grid_reproduces_dequantize() {
        let (n, k) = (5, 576);
        let w = matrix(n, k);
        for f in Format::ALL {
            let opt = QuantOptions {
                format: f,
                importance: None,
                threads: 1,
            };
            let q = quantize(&w, n, k, &opt).unwrap();
            if f == Format::Q6K16 {
                assert!(grid(&q).unwrap_err().contains("use q6k"));
                continue;
            }
            let (step, offset) = grid(&q).unwrap();
            let deq = q.dequantize();
            let (lo, hi) = code_range(f);
            for (i, &v) in deq.iter().enumerate() {
                let (j, kk) = (i / k, i % k);
                let g = j * (k / QSUB) + kk / QSUB;
                let c = q.codes[i];
                assert!((lo..=hi).contains(&c), "{f:?}: code {c}");
                let got = step[g] * c as f32 + offset[g];
                let tol = if matches!(f, Format::Q4 | Format::Q4K) {
                    0.0
                } else {
                    f32::EPSILON * v.abs().max(step[g].abs() * 128.0)
                };
                assert!((got - v).abs() <= tol, "{f:?} [{j}, {kk}]: {got} vs {v}");
            }
        }
    }

    #[test]
    fn set_codes_checks_range_and_count() {
        let w = matrix(2, 64);
        let opt = QuantOptions {
            format: Format::Q4K,
            importance: None,
            threads: 1,
        };
        let mut q = quantize(&w, 2, 64, &opt).unwrap();
        let mut c = q.codes.clone();
        c[0] = if c[0] == 15 { 14 } else { c[0] + 1 };
        q.set_codes(&c).unwrap();
        assert_eq!(q.codes, c);
        c[70] = 16;
        let e = q.set_codes(&c).unwrap_err();
        assert!(
            e.contains("code [1, 6] is 16, outside q4k's range 0..=15"),
            "{e}"
        );
        assert!(q.set_codes(&c[..10]).unwrap_err().contains("10 codes"));
    }
}
