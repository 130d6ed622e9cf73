//! Weight-panel packing for the GEMM paths (tier-independent).
//!
//! A panel holds `nr` consecutive weight rows (= output columns) for a `kc`-long slice of k,
//! transposed to `[kc][nr]` f32 so the microkernel loads one contiguous vector row per k step.
//! Contract: values are copied exactly (bf16 widened exactly); columns past the end of the
//! weight matrix are zero, so edge tiles can run the full-width microkernel.

use super::Weight;
use crate::bf16::bf16_to_f32;

/// Writes `dst[p * nr + c] = w[(j0 + c) * k + p0 + p]` for p < kc, c < nvalid, and zero for
/// nvalid <= c < nr.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_panel(
    w: Weight<'_>,
    k: usize,
    j0: usize,
    nvalid: usize,
    p0: usize,
    kc: usize,
    nr: usize,
    dst: &mut [f32],
) {
    assert!(
        nvalid <= nr && dst.len() >= kc * nr,
        "pack_panel: bad panel shape"
    );
    let dst = &mut dst[..kc * nr];
    for c in 0..nvalid {
        let start = (j0 + c) * k + p0;
        match w {
            Weight::F32(w) => {
                for (p, &v) in w[start..start + kc].iter().enumerate() {
                    dst[p * nr + c] = v;
                }
            }
            Weight::Bf16(w) => {
                for (p, &v) in w[start..start + kc].iter().enumerate() {
                    dst[p * nr + c] = bf16_to_f32(v);
                }
            }
        }
    }
    if nvalid < nr {
        for row in dst.chunks_exact_mut(nr) {
            row[nvalid..].fill(0.0);
        }
    }
}
