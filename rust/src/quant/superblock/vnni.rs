//! AVX-VNNI row tiles of the super-block path (256-bit `vpdpbusd`, client CPUs without AVX-512): the AVX-512
//! tier's tiles on two half-panel vectors (rows 0-7, 8-15), each sub-block's exact dot product scaled by
//! `vpmulld` into the super-block's i32 sum, the B sums by `vpmaddwd`.
//!
//! `vnni_super!` is stamped twice inside `quant::avxvnni`: `real` with the instruction (run where the CPU
//! has AVX-VNNI) and `emulated` with its exact AVX2 stand-in, so the tiles are tested bit for bit against
//! the scalar reference on any AVX2 CPU. Tiles: packed codes 2 rows at a time, unpacked 3 rows x 1 panel
//! (two chains and two sums per row: 12 of the 16 registers). Not yet timed on an AVX-VNNI CPU.
//! Contract: `superblock.rs`'s, bit for bit.

/// Stamps `sup::KERNELS` for one `vpdpbusd` (`$dp`) under `$features`.
macro_rules! vnni_super {
    ($features:literal, $dp:path) => {
        pub mod sup {
            use std::arch::x86_64::*;

            use crate::quant::avx2::bx;
            use crate::quant::superblock::avx2::{codes, packed_scales};
            use crate::quant::superblock::{x86, Hdr, Kernels, Tile};
            use crate::quant::Format;

            pub(crate) static KERNELS: Kernels = Kernels {
                quantize: x86::quantize_super,
                header: x86::header,
                codes: x86::codes,
                tile,
                min_rows: 6,
                panels: 1,
            };

            /// Packed: scales from the packed bytes per sub-block, B summed per sub-block; unpacked:
            /// from the header, B from its pairs at the end (as the AVX2 tiles).
            #[target_feature(enable = $features)]
            #[allow(clippy::needless_range_loop)] // register tiles indexed by constant bounds
            unsafe fn rows<const M: usize, const PACKED: bool, const Q6: bool>(t: &Tile<'_>) {
                // The header exists only beside unpacked codes.
                let hd = || -> &Hdr { &*t.hdr };
                let mut isum = [[_mm256_setzero_si256(); 2]; M];
                let mut bm = [[_mm256_setzero_si256(); 2]; M];
                for s in 0..t.t {
                    let mut acc = [[_mm256_setzero_si256(); 2]; M];
                    for v in 0..8 {
                        let w = codes::<PACKED, Q6>(t.src, t.t, s, v);
                        for r in 0..M {
                            let xb = bx(t.x(r).add(s * 32 + 4 * v));
                            for h in 0..2 {
                                acc[r][h] = $dp(acc[r][h], w[h], xb);
                            }
                        }
                    }
                    let (sc, mw) = if PACKED {
                        packed_scales::<Q6>(t.src, t.t, s)
                    } else {
                        let at = hd().sc[s].as_ptr();
                        let sc = [
                            _mm256_load_si256(at.cast()),
                            _mm256_load_si256(at.add(8).cast()),
                        ];
                        (sc, sc)
                    };
                    for r in 0..M {
                        let sum = _mm256_set1_epi32(*t.scale_sums(r).1.add(s) as u16 as i32);
                        for h in 0..2 {
                            let prod = _mm256_mullo_epi32(acc[r][h], sc[h]);
                            isum[r][h] = _mm256_add_epi32(isum[r][h], prod);
                            if PACKED {
                                let b = _mm256_madd_epi16(mw[h], sum);
                                bm[r][h] = _mm256_add_epi32(bm[r][h], b);
                            }
                        }
                    }
                }
                let pairs = t.t.div_ceil(2);
                for r in 0..M {
                    let (dx, bs) = t.scale_sums(r);
                    let dxv = _mm256_set1_ps(dx);
                    for h in 0..2 {
                        let (d, dmin) = if PACKED {
                            let f16s =
                                |o: usize| _mm256_cvtph_ps(_mm_loadu_si128(t.src.add(o).cast()));
                            (
                                f16s(16 * h),
                                if Q6 {
                                    _mm256_setzero_ps()
                                } else {
                                    f16s(32 + 16 * h)
                                },
                            )
                        } else {
                            for j in 0..pairs {
                                let bj =
                                    _mm256_set1_epi32(bs.add(2 * j).cast::<i32>().read_unaligned());
                                let wj =
                                    _mm256_load_si256(hd().pairs[j].as_ptr().add(8 * h).cast());
                                bm[r][h] = _mm256_add_epi32(bm[r][h], _mm256_madd_epi16(wj, bj));
                            }
                            let d = _mm256_load_ps(hd().d.as_ptr().add(8 * h));
                            (d, _mm256_load_ps(hd().dmin.as_ptr().add(8 * h)))
                        };
                        let yp = t.y.add(r * t.ystride + 8 * h);
                        let y = if Q6 {
                            let c = _mm256_sub_epi32(isum[r][h], _mm256_slli_epi32::<5>(bm[r][h]));
                            let v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(c));
                            _mm256_fmadd_ps(dxv, v, _mm256_loadu_ps(yp))
                        } else {
                            let m = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(bm[r][h]));
                            let v = _mm256_fmsub_ps(d, _mm256_cvtepi32_ps(isum[r][h]), m);
                            _mm256_fmadd_ps(dxv, v, _mm256_loadu_ps(yp))
                        };
                        _mm256_storeu_ps(yp, y);
                    }
                }
            }

            /// The tile for what is left (one panel: `Kernels::panels` is 1).
            ///
            /// # Safety
            /// The CPU runs `$features`; `t` is what the `superblock` driver gives a tile.
            unsafe fn tile(t: &Tile<'_>) -> usize {
                let (left, q6) = (t.left(), t.job.w.format == Format::Q6K);
                macro_rules! go {
                    ($m:literal, $packed:literal) => {{
                        if q6 {
                            rows::<$m, $packed, true>(t)
                        } else {
                            rows::<$m, $packed, false>(t)
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
