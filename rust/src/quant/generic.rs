//! Portable scalar tier of `quant_linear` for Q8, Q80, Q4, Q40 and Q50, and the test oracle for the SIMD
//! tiers (the super-block formats' is `superblock/generic.rs`).
//!
//! Numerical contract: exact i32 dot products per 32-block; each block's contribution
//! `d * ((254 * dot + dot2) * dx')` (Q8, coarse and residual codes), `(d * dot + m * sum(q)) * dx`
//! (Q4) or `d * ((dot - z * sum(q)) * dx)` (Q40, Q50; the difference exact in f32) is added to the
//! output in k order with plain multiplies and adds (no fused multiply-add); then the bias.

use std::ops::Range;

use super::{f16_to_f32, quantize_block, store, ActsOut, Format, Job, LO, QPANEL, QSUB};

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
                                _ => {
                                    let (g, hi, u) = (kk / 8, (kk % 8) / 4, kk % 4);
                                    let byte = blk[f.codes_at() + g * 64 + r * 4 + u];
                                    let lo = ((byte >> (4 * hi)) & 0x0f) as i32;
                                    if f == Format::Q50 {
                                        let plane = blk[f.high_bits_at() + r * 4 + u];
                                        lo | ((((plane >> (2 * g + hi)) & 1) as i32) << 4)
                                    } else {
                                        lo
                                    }
                                }
                            };
                            dot += c * xq[sb * QSUB + t] as i32;
                            dot2 += c * xq2[sb * QSUB + t] as i32;
                        }
                        let contrib = match f {
                            Format::Q8 | Format::Q80 => {
                                let d = f.q8_scale(blk, r);
                                let fine = LO * dot + dot2;
                                d * (fine as f32 * a.d_fine[i * nsub + sb])
                            }
                            Format::Q40 | Format::Q50 => {
                                let d =
                                    f16_to_f32(u16::from_le_bytes([blk[2 * r], blk[2 * r + 1]]));
                                let z = f.zero_point().expect("q4_0 / q5_0") as f32;
                                let (dx, sx) = (a.d[i * nsub + sb], a.s[i * nsub + sb]);
                                d * ((dot as f32 - z * sx) * dx)
                            }
                            _ => {
                                let d =
                                    f16_to_f32(u16::from_le_bytes([blk[2 * r], blk[2 * r + 1]]));
                                let m = f16_to_f32(u16::from_le_bytes([
                                    blk[32 + 2 * r],
                                    blk[33 + 2 * r],
                                ]));
                                let (dx, sx) = (a.d[i * nsub + sb], a.s[i * nsub + sb]);
                                (d * dot as f32 + m * sx) * dx
                            }
                        };
                        *sum += contrib;
                    }
                }
            }
            // SAFETY: forwarded from the caller (this task owns panel p's columns).
            unsafe { store(job, i, p, &sums) };
        }
    }
}
