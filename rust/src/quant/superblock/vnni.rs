//! AVX-VNNI row tiles of the super-block path (256-bit `vpdpbusd`, client CPUs without AVX-512): the AVX-512
//! tier's tiles on two half-panel vectors (rows 0-7, 8-15): each sub-block's exact dot product, then the
//! contract's float epilogue.
//!
//! `vnni_super!` is stamped twice inside `quant::avxvnni`: `real` with the instruction (run where the CPU
//! has AVX-VNNI) and `emulated` with its exact AVX2 stand-in, so the tiles are tested bit for bit against
//! the scalar reference on any AVX2 CPU. Tiles: packed codes 2 rows at a time, unpacked 3 rows x 1 panel
//! (two sums and two outputs per row: 12 of the 16 registers). Not yet timed on an AVX-VNNI CPU.
//! Contract: `superblock.rs`'s, bit for bit.

/// Stamps `sup::KERNELS` for one `vpdpbusd` (`$dp`) under `$features`.
macro_rules! vnni_super {
    ($features:literal, $dp:path) => {
        pub mod sup {
            use std::arch::x86_64::*;

            use crate::quant::avx2::bx;
            use crate::quant::avx2_unpack::f16x16;
            use crate::quant::superblock::x86::group_codes;
            use crate::quant::superblock::{x86, Hdr, Kernels, Tile};
            use crate::quant::Format;

            pub(crate) static KERNELS: Kernels = Kernels {
                header: x86::header,
                codes: x86::codes,
                tile,
                min_rows: 6,
                panels: 1,
                tiled: false,
            };

            /// One panel, rows i0..i0 + M, as the AVX-512 tiles on two half-panel vectors.
            #[target_feature(enable = $features)]
            #[allow(clippy::needless_range_loop)] // register tiles indexed by constant bounds
            unsafe fn rows<const M: usize, const PACKED: bool, const KIND: u8>(t: &Tile<'_>) {
                // KIND: 0 Q4K, 1 Q6K, 2 Q6K16 (the AVX-512 tiles' stamps).
                let f = match KIND {
                    0 => Format::Q4K,
                    1 => Format::Q6K,
                    _ => Format::Q6K16,
                };
                let q6 = KIND != 0;
                let mut y = [[_mm256_setzero_ps(); 2]; M];
                for r in 0..M {
                    for h in 0..2 {
                        y[r][h] = _mm256_loadu_ps(t.y.add(r * t.ystride + 8 * h));
                    }
                }
                for b in t.blocks.clone() {
                    let (tt, src) = (t.lay.subs(b), t.block(b));
                    let zero = [_mm256_setzero_ps(); 2];
                    let (mut dv, mut mv) = (zero, zero);
                    if PACKED {
                        dv = f16x16(src);
                        if !q6 {
                            mv = f16x16(src.add(32));
                        }
                    }
                    for s in 0..tt {
                        if PACKED {
                            t.prefetch_next(b, s, tt);
                        }
                        // Two chains per row and half (even and odd groups), as the AVX-512 tiles; Q6K16's
                        // first 16 k in one, the last 16 in the other (its halves' sums).
                        let mut acc = [[_mm256_setzero_si256(); 2]; M];
                        let mut acc2 = [[_mm256_setzero_si256(); 2]; M];
                        for v in 0..8 {
                            let w = if q6 {
                                group_codes::<PACKED, true>(f, src, tt, s, v)
                            } else {
                                group_codes::<PACKED, false>(f, src, tt, s, v)
                            };
                            for r in 0..M {
                                let xb = bx(t.x(r, b).add(s * 32 + 4 * v));
                                for h in 0..2 {
                                    let second = if KIND == 2 {
                                        v >= 4
                                    } else {
                                        M < 2 && v % 2 == 1
                                    };
                                    if second {
                                        acc2[r][h] = $dp(acc2[r][h], w[h], xb);
                                    } else {
                                        acc[r][h] = $dp(acc[r][h], w[h], xb);
                                    }
                                }
                            }
                        }
                        let (ds, dm) = if PACKED {
                            x86::packed_scales(f, src, tt, s, dv, mv)
                        } else {
                            // The header exists only beside unpacked codes.
                            let h: &Hdr = &*t.hdr;
                            let half = |a: &[f32; 16]| {
                                [
                                    _mm256_load_ps(a.as_ptr()),
                                    _mm256_load_ps(a.as_ptr().add(8)),
                                ]
                            };
                            (half(&h.ds[s]), half(&h.dm[s]))
                        };
                        for r in 0..M {
                            let (dx, sx) = t.scale_sum(r, b, s);
                            if KIND == 2 {
                                let sa = t.half_sum(r, b, s);
                                let half = |acc: __m256i, ds: __m256, sum: f32, y: __m256| {
                                    let c = _mm256_sub_ps(
                                        _mm256_cvtepi32_ps(acc),
                                        _mm256_set1_ps(32.0 * sum),
                                    );
                                    _mm256_fmadd_ps(ds, _mm256_mul_ps(c, _mm256_set1_ps(dx)), y)
                                };
                                for h in 0..2 {
                                    let ya = half(acc[r][h], ds[h], sa, y[r][h]);
                                    y[r][h] = half(acc2[r][h], dm[h], sx - sa, ya);
                                }
                                continue;
                            }
                            for h in 0..2 {
                                let sum = if M < 2 {
                                    _mm256_add_epi32(acc[r][h], acc2[r][h])
                                } else {
                                    acc[r][h]
                                };
                                let d = _mm256_cvtepi32_ps(sum);
                                y[r][h] = if q6 {
                                    let c = _mm256_sub_ps(d, _mm256_set1_ps(32.0 * sx));
                                    let cd = _mm256_mul_ps(c, _mm256_set1_ps(dx));
                                    _mm256_fmadd_ps(ds[h], cd, y[r][h])
                                } else {
                                    let m = _mm256_mul_ps(dm[h], _mm256_set1_ps(sx));
                                    let v = _mm256_fmsub_ps(ds[h], d, m);
                                    _mm256_fmadd_ps(v, _mm256_set1_ps(dx), y[r][h])
                                };
                            }
                        }
                    }
                }
                for r in 0..M {
                    for h in 0..2 {
                        _mm256_storeu_ps(t.y.add(r * t.ystride + 8 * h), y[r][h]);
                    }
                }
            }

            /// The tile for what is left (one panel: `Kernels::panels` is 1).
            ///
            /// # Safety
            /// The CPU runs `$features`; `t` is what the `superblock` driver gives a tile.
            unsafe fn tile(t: &Tile<'_>) -> usize {
                let left = t.left();
                macro_rules! go {
                    ($m:literal, $packed:literal) => {{
                        match t.job.w.format {
                            Format::Q6K => rows::<$m, $packed, 1>(t),
                            Format::Q6K16 => rows::<$m, $packed, 2>(t),
                            _ => rows::<$m, $packed, 0>(t),
                        }
                        $m
                    }};
                }
                match (t.packed, left) {
                    (true, 1) => go!(1, true),
                    (true, _) => go!(2, true),
                    (false, 1) => go!(1, false),
                    (false, 2) => go!(2, false),
                    (false, _) => go!(3, false),
                }
            }
        }
    };
}
