//! AVX-VNNI Q4K and Q6K for many x rows (prompts, batched steps), as `avx2_rows` does for AVX2: each
//! panel's super-block is unpacked once (codes as whole bytes; Q4K's `d * sc` and `dmin * mc`, Q6K's
//! `d * sc` as f32) and every row tile reads it, through `avx2_rows`'s driver. The tiles are the AVX-VNNI
//! tier's with the unpacking taken out: `vpdpbusd` into one i32 chain per row and half panel (the row
//! tile gives the independent chains), Q4K tiles 2 rows x 2 panels or 4 rows x 1 panel, Q6K 4 rows x 1.
//!
//! `vnni_rows!` is stamped inside `avxvnni::real` (the instruction) and `avxvnni::emulated` (its exact
//! AVX2 stand-in), so this path is tested on any AVX2 CPU against the 1-row tiles, bit for bit.
//! Its threshold (`avx2_rows::MIN_ROWS`) was measured for AVX2 on a Zen 3; not yet on an AVX-VNNI CPU.
//!
//! Numerical contract: the AVX-VNNI tier's tiles', bit for bit (exact i32 sums, the same float
//! operations in the same order: Q4K `y += (ds * dot - dm * sx) * dx`, Q6K `y += ds * ((dot - 32 sx) *
//! dx)`, per sub-block), y carried across super-blocks through memory (exact), so a row's result is
//! the one it gets alone (the server's exactness).

/// Stamps `rows::panels` for one `vpdpbusd` (`$dp`) under `$features`.
macro_rules! vnni_rows {
    ($features:literal, $dp:path) => {
        pub mod rows {
            use std::arch::x86_64::*;
            use std::ops::Range;

            use crate::quant::avx2::{bytes_f32, f16x16, q4_codes, q4k_scale_bytes};
            use crate::quant::avx2_rows::{
                bx, load_y, panels_with, row_acts, RowTiles, Q6_SUB_BYTES,
            };
            use crate::quant::kblock::{Layout, SUBS};
            use crate::quant::{Format, Job, QPANEL, QSUB};

            /// Bytes of one unpacked Q4K sub-block: `d * sc` and `dmin * mc` (f32, 2 halves x 32 B
            /// each), then per group of 8 k, half panel and nibble the codes as bytes (4 x 2 x 2 x 32 B).
            const SUB_BYTES: usize = 128 + 4 * 2 * 64;
            const Q4K_SUPER_BYTES: usize = SUBS * SUB_BYTES;

            /// Unpacks Q4K super-block `blk` of `t` sub-blocks into `u` (32-byte aligned).
            #[target_feature(enable = $features)]
            unsafe fn unpack_q4k(blk: *const u8, t: usize, u: *mut u8) {
                let (dv, mv) = (f16x16(blk), f16x16(blk.add(32)));
                for s in 0..t {
                    let o = u.add(s * SUB_BYTES);
                    // As the 1-row tile computes them: the same products, so the same bits.
                    let (sc, mc) = q4k_scale_bytes(blk, t, s);
                    let (scf, mcf) = (bytes_f32(sc, false), bytes_f32(mc, false));
                    for h in 0..2 {
                        _mm256_store_ps(o.add(32 * h).cast(), _mm256_mul_ps(dv[h], scf[h]));
                        _mm256_store_ps(o.add(64 + 32 * h).cast(), _mm256_mul_ps(mv[h], mcf[h]));
                    }
                    let cp = blk.add(Layout::codes_at(Format::Q4K, t, s));
                    for g in 0..4 {
                        for (h, c) in q4_codes(cp.add(g * 64)).into_iter().enumerate() {
                            let at = o.add(128 + g * 128 + h * 64);
                            _mm256_store_si256(at.cast(), c[0]);
                            _mm256_store_si256(at.add(32).cast(), c[1]);
                        }
                    }
                }
            }

            /// Q4K rows i0..i0+M against Q half panels (Q / 2 panels unpacked one after another at
            /// `u`) over one super-block; `yacc` (row stride 8 Q f32) carries y in and out.
            #[target_feature(enable = $features)]
            #[allow(clippy::needless_range_loop)] // register tiles indexed by constant bounds
            unsafe fn rows_q4k<const M: usize, const Q: usize>(
                job: &Job<'_>,
                u: *const u8,
                t: usize,
                sb0: usize,
                i0: usize,
                yacc: *mut f32,
            ) {
                let (k, nsub, xq, dxs, sxs) = row_acts(job, i0);
                let half = |q: usize| (u.add((q / 2) * Q4K_SUPER_BYTES), q % 2);
                let mut y = load_y::<M, Q>(yacc);
                for s in 0..t {
                    let sb = sb0 + s;
                    let mut acc = [[_mm256_setzero_si256(); Q]; M];
                    for g in 0..4 {
                        for nb in 0..2 {
                            let w: [__m256i; Q] = std::array::from_fn(|q| {
                                let (up, h) = half(q);
                                let at = up.add(s * SUB_BYTES + 128 + g * 128 + 64 * h + 32 * nb);
                                _mm256_load_si256(at.cast())
                            });
                            for r in 0..M {
                                let xb = bx(xq.add(r * k + sb * QSUB + g * 8 + 4 * nb));
                                for q in 0..Q {
                                    acc[r][q] = $dp(acc[r][q], w[q], xb);
                                }
                            }
                        }
                    }
                    for r in 0..M {
                        let sx = _mm256_set1_ps(*sxs.add(r * nsub + sb));
                        let dx = _mm256_set1_ps(*dxs.add(r * nsub + sb));
                        for q in 0..Q {
                            let (up, h) = half(q);
                            let o = up.add(s * SUB_BYTES);
                            let ds = _mm256_load_ps(o.add(32 * h).cast());
                            let dm = _mm256_load_ps(o.add(64 + 32 * h).cast());
                            let dot = _mm256_cvtepi32_ps(acc[r][q]);
                            let t = _mm256_fmsub_ps(ds, dot, _mm256_mul_ps(dm, sx));
                            y[r][q] = _mm256_fmadd_ps(t, dx, y[r][q]);
                        }
                    }
                }
                for r in 0..M {
                    for q in 0..Q {
                        _mm256_storeu_ps(yacc.add(r * 8 * Q + 8 * q), y[r][q]);
                    }
                }
            }

            /// Q4K: rows i0.. of P panels (1 or 2); returns the rows done.
            #[target_feature(enable = $features)]
            unsafe fn q4k_tile<const P: usize>(
                job: &Job<'_>,
                u: *const u8,
                t: usize,
                sb0: usize,
                i0: usize,
                yr: *mut f32,
            ) -> usize {
                let left = job.m - i0;
                if P == 2 {
                    match left {
                        1 => rows_q4k::<1, 4>(job, u, t, sb0, i0, yr),
                        _ => rows_q4k::<2, 4>(job, u, t, sb0, i0, yr),
                    }
                    left.min(2)
                } else {
                    match left {
                        1 => rows_q4k::<1, 2>(job, u, t, sb0, i0, yr),
                        2 => rows_q4k::<2, 2>(job, u, t, sb0, i0, yr),
                        3 => rows_q4k::<3, 2>(job, u, t, sb0, i0, yr),
                        _ => rows_q4k::<4, 2>(job, u, t, sb0, i0, yr),
                    }
                    left.min(4)
                }
            }

            /// Q6K rows i0..i0+M over one super-block unpacked by `avx2_rows::unpack_q6k` (`d * sc`,
            /// then per group and half panel the two 4-k code vectors as bytes 0..=63).
            #[target_feature(enable = $features)]
            #[allow(clippy::needless_range_loop)] // register tiles indexed by constant bounds
            unsafe fn rows_q6k<const M: usize>(
                job: &Job<'_>,
                u: *const u8,
                t: usize,
                sb0: usize,
                i0: usize,
                yacc: *mut f32,
            ) {
                let (k, nsub, xq, dxs, sxs) = row_acts(job, i0);
                let mut y = load_y::<M, 2>(yacc);
                for s in 0..t {
                    let sb = sb0 + s;
                    let o = u.add(s * Q6_SUB_BYTES);
                    let mut acc = [[_mm256_setzero_si256(); 2]; M];
                    for g in 0..4 {
                        let at = o.add(64 + g * 128);
                        let w: [__m256i; 4] =
                            std::array::from_fn(|i| _mm256_load_si256(at.add(32 * i).cast()));
                        for r in 0..M {
                            let xr = xq.add(r * k + sb * QSUB + g * 8);
                            let (xa, xb) = (bx(xr), bx(xr.add(4)));
                            for h in 0..2 {
                                acc[r][h] = $dp($dp(acc[r][h], w[2 * h], xa), w[2 * h + 1], xb);
                            }
                        }
                    }
                    for r in 0..M {
                        let sx = _mm256_set1_ps(*sxs.add(r * nsub + sb));
                        let dx = _mm256_set1_ps(*dxs.add(r * nsub + sb));
                        for h in 0..2 {
                            let ds = _mm256_load_ps(o.add(32 * h).cast());
                            let dot = _mm256_cvtepi32_ps(acc[r][h]);
                            let c = _mm256_sub_ps(dot, _mm256_mul_ps(_mm256_set1_ps(32.0), sx));
                            y[r][h] = _mm256_fmadd_ps(ds, _mm256_mul_ps(c, dx), y[r][h]);
                        }
                    }
                }
                for r in 0..M {
                    for h in 0..2 {
                        _mm256_storeu_ps(yacc.add(r * QPANEL + 8 * h), y[r][h]);
                    }
                }
            }

            #[target_feature(enable = $features)]
            unsafe fn q6k_tile(
                job: &Job<'_>,
                u: *const u8,
                t: usize,
                sb0: usize,
                i0: usize,
                yr: *mut f32,
            ) -> usize {
                let left = job.m - i0;
                match left {
                    1 => rows_q6k::<1>(job, u, t, sb0, i0, yr),
                    2 => rows_q6k::<2>(job, u, t, sb0, i0, yr),
                    3 => rows_q6k::<3>(job, u, t, sb0, i0, yr),
                    _ => rows_q6k::<4>(job, u, t, sb0, i0, yr),
                }
                left.min(4)
            }

            /// The job's Q4K or Q6K panels for all its rows.
            ///
            /// # Safety
            /// The CPU has `$features`; `job` satisfies `quant_linear`'s contract with a Q4K or Q6K
            /// matrix; no other thread writes these panels' columns.
            pub unsafe fn panels(job: &Job<'_>, panels: Range<usize>) {
                let tiles = RowTiles {
                    q4k_super_bytes: Q4K_SUPER_BYTES,
                    unpack_q4k,
                    q4k_one_panel: q4k_tile::<1>,
                    q4k_two_panels: q4k_tile::<2>,
                    q6k: q6k_tile,
                };
                panels_with(job, panels, &tiles);
            }
        }
    };
}
