//! Portable scalar tier of `panel_linear`, and the test oracle for the SIMD tiers.
//!
//! Numerical contract: each output sums its k products in order (plain multiply and add, no fused
//! multiply-add) in blocks of `KC` whose sums are added to the output in k order, for every number
//! of x rows; then the bias.

use std::ops::Range;

use super::{slot, Job, PanelWeight, KC, PANEL};
use crate::bf16::bf16_to_f32;

/// Weight (row j of the panel, column kk) of panel `p`, widened.
#[inline]
fn weight(w: &PanelWeight, p: usize, j: usize, kk: usize) -> f32 {
    match w {
        PanelWeight::Bf16 { data, k, .. } => bf16_to_f32(data[(p * k + kk) * PANEL + slot(j)]),
        PanelWeight::F32 { data, k, .. } => data[(p * k + kk) * PANEL + j],
    }
}

/// # Safety
/// `job` must satisfy `panel_linear`'s length contract; no other thread may write the columns of
/// `panels` concurrently.
pub unsafe fn panels(job: &Job<'_>, panels: Range<usize>) {
    let (n, k) = (job.w.n(), job.w.k());
    let kc = KC;
    for p in panels {
        for j in 0..PANEL.min(n - p * PANEL) {
            let col = p * PANEL + j;
            for i in 0..job.m {
                let x = &job.x[i * k..(i + 1) * k];
                let mut total = 0.0f32;
                for k0 in (0..k).step_by(kc) {
                    let mut s = 0.0f32;
                    for (kk, &xv) in x.iter().enumerate().take((k0 + kc).min(k)).skip(k0) {
                        s += xv * weight(job.w, p, j, kk);
                    }
                    total = if k0 == 0 { s } else { total + s };
                }
                if let Some(b) = job.bias {
                    total += b[col];
                }
                // SAFETY: i < m and col < n, so the offset is inside y's m * n values; this task owns
                // the columns of its panels.
                unsafe { *job.y.get().add(i * n + col) = total };
            }
        }
    }
}
