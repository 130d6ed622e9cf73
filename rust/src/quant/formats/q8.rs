//! Q8 and Q80: 8-bit codes under one scale per block of k, per output row.
//!
//! - `Q8`: value = d * c, c in [-127, 127] (stored as c + 128), one f32 d per 64 values: 8.5 bits per weight.
//! - `Q80`: the same codes under one f16 d per 32 values: 8.5 bits per weight, llama.cpp's Q8_0, so a GGUF
//!   file's Q8_0 tensors (and Q4_0 / Q5_0 ones, whose codes fit in int8 under the same f16 d) run in their
//!   own bits.
//!
//! Packed (`weight.rs`'s `pack`), a panel's block holds its 16 rows' scales (f32 or f16), then the codes as
//! `vpdpbusd` reads them: groups of 4 k, 16 rows x 4 bytes each. The kernels read activations with a
//! second int8 code for the residual (`acts.rs`): the int8 rounding of activations with outlier channels
//! cost more perplexity than the 8-bit weights.
//!
//! Quantizer: d = s * max|w| / 127 for the s in `Q8_SHRINK` that minimises the weighted squared error (s = 1 is
//! Q8_0's rule; a slightly smaller d rounds most values closer at the cost of clipping the largest),
//! c = round(w / d); Q80 rounds every candidate d to f16 before its codes are chosen.

use crate::quant::fit::error_weights;
use crate::quant::{f16_to_f32, f32_to_f16};

/// Candidate shrink factors of the Q8 scale.
const Q8_SHRINK: [f32; 5] = [1.0, 0.995, 0.99, 0.985, 0.98];

/// One Q8 block: writes `c + 128` into `codes`, returns d (f16-representable when `half`: Q80 stores its
/// scales as f16, as ggml's Q8_0, so every candidate is rounded before the codes are chosen for it).
pub(crate) fn fit_q8(x: &[f32], imp: Option<&[f32]>, codes: &mut [u8], half: bool) -> f32 {
    let round = |d: f32| if half { f16_to_f32(f32_to_f16(d)) } else { d };
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    if amax == 0.0 {
        codes.fill(128);
        return 0.0;
    }
    let wt = error_weights(x, imp, |_| 1.0);
    let (mut best, mut best_err) = (round(amax / 127.0), f32::INFINITY);
    for s in Q8_SHRINK {
        let d = round(s * amax / 127.0);
        if d == 0.0 {
            continue; // below f16's range: the block stays at the first candidate
        }
        let err: f32 = x
            .iter()
            .zip(&wt)
            .map(|(&v, &w)| {
                let c = (v / d).round().clamp(-127.0, 127.0);
                w * (v - d * c) * (v - d * c)
            })
            .sum();
        if err < best_err {
            (best, best_err) = (d, err);
        }
    }
    for (c, &v) in codes.iter_mut().zip(x) {
        let q = if best == 0.0 {
            0.0
        } else {
            (v / best).round().clamp(-127.0, 127.0)
        };
        *c = (q as i32 + 128) as u8;
    }
    best
}
