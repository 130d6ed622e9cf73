//! Weight-panel packing for the GEMM paths (tier-independent).
//!
//! A panel holds `nr` consecutive weight rows (= output columns) for a `kc`-long slice of k,
//! transposed to `[kc][nr]` f32 so the microkernel loads one contiguous vector row per k step.
//! Contract: values are copied exactly (bf16 widened exactly); columns past the end of the
//! weight matrix are zero, so edge tiles can run the full-width microkernel.

use super::Weight;
use crate::bf16::bf16_to_f32;

/// One panel: weight rows (= output columns) j0 .. j0 + nvalid of a panel `nr` wide, and the k values
/// p0 .. p0 + kc.
#[derive(Clone, Copy)]
pub(crate) struct PanelAt {
    pub j0: usize,
    pub nvalid: usize,
    pub p0: usize,
    pub kc: usize,
    pub nr: usize,
}

/// Writes `dst[p * nr + c] = w[(j0 + c) * k + p0 + p]` for p < kc, c < nvalid, and zero for
/// nvalid <= c < nr.
pub(crate) fn pack_panel(w: Weight<'_>, k: usize, at: PanelAt, dst: &mut [f32]) {
    let (j0, nvalid, p0, kc, nr) = (at.j0, at.nvalid, at.p0, at.kc, at.nr);
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
