//! Portable scalar tier of `quant_linear` for Q8, Q80, Q4, Q40 and Q50, and the test oracle for the SIMD
//! tiers (the super-block formats' is `superblock/generic.rs`).
//!
//! Numerical contract: exact i32 dot products per 32-block; each block's contribution is added to the
//! output in k order: Q8 and Q80 `y + d * ((254 * dot + dot2) * dx')` (coarse and residual codes) with
//! plain multiplies and adds; Q4, Q40 and Q50 `fma(fma(d, dot, -(dm * sum(q))), dx, y)` with dm = -m
//! (Q4) or z d (Q40, Q50), the super-block path's Q4K form, so that every tier gives these bits and
//! prompts may run on that path (`superblock.rs`); then the bias.

use std::ops::Range;

use super::{kblock, quantize_block, store, ActsOut, Format, Job, LO, QPANEL, QSUB};

/// # Safety
/// `out` holds x's blocks (`quantize_activations`) and no other thread writes them.
pub unsafe fn quantize_rows(x: &[f32], out: ActsOut) {
    for (b, xb) in x.chunks_exact(QSUB).enumerate() {
        let q = std::slice::from_raw_parts_mut(out.q.add(b * QSUB), QSUB);
        let q2 = std::slice::from_raw_parts_mut(out.q2.add(b * QSUB), QSUB);
        out.put(b, quantize_block(xb, q, q2));
    }
}

/// # Safety
/// `job` satisfies `quant_linear`'s length contract; no other thread writes the columns of `panels`.
pub unsafe fn panels(job: &Job<'_>, panels: Range<usize>) {
    let w = job.w;
    let (f, k) = (w.format, w.k());
    let (bs, bb, nb, nsub) = (f.block(), f.block_bytes(), k / f.block(), k / QSUB);
    let data = w.data();
    for p in panels {
        for i in 0..job.m {
            let a = job.acts;
            let (xq, xq2) = (&a.q[i * k..(i + 1) * k], &a.q2[i * k..(i + 1) * k]);
            let mut sums = [0.0f32; QPANEL];
            for (r, sum) in sums.iter_mut().enumerate() {
                for b in 0..nb {
                    let blk = &data[(p * nb + b) * bb..(p * nb + b + 1) * bb];
                    for h in 0..bs / QSUB {
                        let sb = b * (bs / QSUB) + h;
                        let (mut dot, mut dot2) = (0i32, 0i32);
                        for t in 0..QSUB {
                            let kk = h * QSUB + t;
                            let c = match f {
                                Format::Q8 | Format::Q80 => {
                                    blk[f.codes_at() + (kk / 4) * 64 + r * 4 + kk % 4] as i32 - 128
                                }
                                // A nibble format's block: the super-block reader's sub-block 0 of 1.
                                _ => kblock::code(f, blk, 1, 0, r, kk) as i32,
                            };
                            dot += c * xq[sb * QSUB + t] as i32;
                            dot2 += c * xq2[sb * QSUB + t] as i32;
                        }
                        *sum = match f {
                            Format::Q8 | Format::Q80 => {
                                let d = f.q8_scale(blk, r);
                                let fine = LO * dot + dot2;
                                *sum + d * (fine as f32 * a.d_fine[i * nsub + sb])
                            }
                            _ => {
                                // Q4's d * c + m and Q40's / Q50's d * (c - z) as d * c - dm (dm = -m or
                                // z d, exact), in the super-block formats' fused form: the bits of the
                                // super-block path that runs these formats' prompts (`superblock.rs`).
                                let (d, dm) = kblock::sub_scales(f, blk, 1, 0, r);
                                let (dx, sx) = (a.d[i * nsub + sb], a.s[i * nsub + sb]);
                                d.mul_add(dot as f32, -(dm * sx)).mul_add(dx, *sum)
                            }
                        };
                    }
                }
            }
            // SAFETY: forwarded from the caller (this task owns panel p's columns).
            unsafe { store(job, i, p, &sums) };
        }
    }
}
