//! AVX-VNNI tier of `quant_linear`: the VEX-encoded, 256-bit `vpdpbusd` of client CPUs without
//! AVX-512 (Intel Alder Lake and later, AMD Zen 5 client parts) multiplies 4 unsigned weight codes by
//! 4 signed activation codes and adds them into an i32 lane, as the AVX-512 VNNI tier does with
//! 16-row vectors; here a 16-row panel is two 256-bit halves (rows 0-7, rows 8-15), and up to 2 x
//! rows share each loaded weight vector.
//!
//! The kernels are written once (`vnni_kernels!`) and stamped twice: `real` with `vpdpbusd`
//! (compiled everywhere, run where the CPU has AVX-VNNI), and `emulated` with an exact AVX2
//! stand-in (two `vpmaddwd` on the even and odd bytes), so the layout and epilogue logic is tested
//! against the scalar reference on any AVX2 machine, and the instruction itself where it exists.
//!
//! The super-block formats' tiles (`superblock/vnni.rs`, `vnni_super!`) are stamped the same two ways.
//!
//! Numerical contract: the AVX-512 tier's, block for block (exact i32 sums; Q8 reads the coarse and
//! residual activation codes and takes the weights' + 128 off with `128 * s_fine`; each block's
//! contribution is added with fused multiply-adds: `d * t + y`; Q4, Q40 and Q50 as the scalar tier's
//! fused form).

use std::arch::x86_64::*;

/// Whether this CPU has the tier: AVX2, FMA, F16C (the AVX2 tier's) and AVX-VNNI.
pub fn usable() -> bool {
    super::avx2::usable() && std::arch::is_x86_feature_detected!("avxvnni")
}

/// `acc + sum of 4 u8 * i8 products` per i32 lane, exactly (no saturation), as `vpdpbusd` computes
/// it: the even and odd bytes widened to i16 (u8 zero-, i8 sign-extended), two `vpmaddwd` (each
/// product within 255 * 128, each pair sum within i32).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn dpbusd_emulated(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    let even = _mm256_set1_epi16(0x00ff);
    let (u_even, u_odd) = (_mm256_and_si256(u, even), _mm256_srli_epi16::<8>(u));
    let s_even = _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(s));
    let s_odd = _mm256_srai_epi16::<8>(s);
    let sums = _mm256_add_epi32(
        _mm256_madd_epi16(u_even, s_even),
        _mm256_madd_epi16(u_odd, s_odd),
    );
    _mm256_add_epi32(acc, sums)
}

/// The tier's `panels` and tiles over one `vpdpbusd`: `$features` are the tiles' target features,
/// `$dp` the dot instruction (an intrinsic or its exact emulation).
macro_rules! vnni_kernels {
    ($features:literal, $dp:path) => {
        use std::arch::x86_64::*;
        use std::ops::Range;

        use crate::quant::avx2::{bx, store_halves, BlockTile};
        use crate::quant::avx2_unpack::{f16x16, fifth_bits};
        use crate::quant::{Format, Job, LO, QSUB};

        /// x rows per register tile: 2 rows x 2 halves x 2 i32 chains, and 2 x 2 f32 outputs.
        const MR: usize = 2;

        /// The two halves (rows 0-7, 8-15) of 32 bytes at `at`.
        #[inline(always)]
        unsafe fn halves(at: *const u8) -> [__m256i; 2] {
            [
                _mm256_loadu_si256(at.cast()),
                _mm256_loadu_si256(at.add(32).cast()),
            ]
        }

        #[target_feature(enable = $features)]
        #[allow(clippy::needless_range_loop)] // y[r] and acc[r] are register tiles indexed by a constant bound
        unsafe fn tile<const M: usize>(job: &Job<'_>, p: usize, i0: usize) {
            let src = BlockTile::new(job, p, i0);
            let mut y = [[_mm256_setzero_ps(); 2]; M];
            let nib = _mm256_set1_epi8(0x0f);
            src.for_each_block(|b, blk| {
                if src.f.is_q8() {
                    let dv = [0, 1].map(|s| {
                        if src.f == Format::Q80 {
                            _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * s).cast()))
                        } else {
                            _mm256_loadu_ps(blk.add(32 * s).cast())
                        }
                    });
                    let (parts, co) = (src.f.block() / QSUB, src.f.codes_at());
                    for h in 0..parts {
                        let sb = b * parts + h;
                        let mut acc = [[_mm256_setzero_si256(); 2]; M];
                        let mut acc2 = [[_mm256_setzero_si256(); 2]; M];
                        for g in 0..8 {
                            let wv = halves(blk.add(co + h * 512 + g * 64));
                            for r in 0..M {
                                let at = r * src.k + sb * QSUB + g * 4;
                                let (xv, xv2) = (bx(src.xq.add(at)), bx(src.xq2.add(at)));
                                for s in 0..2 {
                                    acc[r][s] = $dp(acc[r][s], wv[s], xv);
                                    acc2[r][s] = $dp(acc2[r][s], wv[s], xv2);
                                }
                            }
                        }
                        for r in 0..M {
                            // 254 * (dot + 128 s) + (dot2 + 128 s2) - 128 * (254 s + s2): exact in i32.
                            let fix = _mm256_set1_epi32(128 * src.sfs[r * src.nsub + sb]);
                            let dx = _mm256_set1_ps(src.dfs[r * src.nsub + sb]);
                            for s in 0..2 {
                                let fine = _mm256_add_epi32(
                                    _mm256_mullo_epi32(acc[r][s], _mm256_set1_epi32(LO)),
                                    acc2[r][s],
                                );
                                let dot = _mm256_cvtepi32_ps(_mm256_sub_epi32(fine, fix));
                                y[r][s] = _mm256_fmadd_ps(dv[s], _mm256_mul_ps(dot, dx), y[r][s]);
                            }
                        }
                    }
                } else {
                    // Q4's d * c + m, Q40's / Q50's d * (c - z) = d * c + (-z d) (exact): one min per row.
                    let dv = f16x16(blk);
                    let mv = match src.f.zero_point() {
                        Some(z) => dv.map(|d| _mm256_mul_ps(_mm256_set1_ps(-(z as f32)), d)),
                        None => f16x16(blk.add(32)),
                    };
                    let (co, q5) = (src.f.codes_at(), src.f == Format::Q50);
                    // Two i32 chains per row (low and high nibbles), as the AVX-512 tier.
                    let mut acc = [[_mm256_setzero_si256(); 2]; M];
                    let mut acc2 = [[_mm256_setzero_si256(); 2]; M];
                    for g in 0..4 {
                        let v = halves(blk.add(co + g * 64));
                        let mut lo = v.map(|v| _mm256_and_si256(v, nib));
                        let mut hi = v.map(|v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib));
                        if q5 {
                            let hb = halves(blk.add(src.f.high_bits_at()));
                            for s in 0..2 {
                                lo[s] = _mm256_or_si256(lo[s], fifth_bits(hb[s], 2 * g));
                                hi[s] = _mm256_or_si256(hi[s], fifth_bits(hb[s], 2 * g + 1));
                            }
                        }
                        for r in 0..M {
                            let xr = src.xq.add(r * src.k + b * QSUB + g * 8);
                            let (xa, xb) = (bx(xr), bx(xr.add(4)));
                            for s in 0..2 {
                                acc[r][s] = $dp(acc[r][s], lo[s], xa);
                                acc2[r][s] = $dp(acc2[r][s], hi[s], xb);
                            }
                        }
                    }
                    for r in 0..M {
                        let sx = _mm256_set1_ps(src.sxs[r * src.nsub + b]);
                        let dx = _mm256_set1_ps(src.dxs[r * src.nsub + b]);
                        for s in 0..2 {
                            let dot = _mm256_cvtepi32_ps(_mm256_add_epi32(acc[r][s], acc2[r][s]));
                            let t = _mm256_fmadd_ps(dv[s], dot, _mm256_mul_ps(mv[s], sx));
                            y[r][s] = _mm256_fmadd_ps(t, dx, y[r][s]);
                        }
                    }
                }
            });
            store_halves(job, i0, p, &y);
        }

        /// # Safety
        /// The CPU has `$features`; `job` satisfies `quant_linear`'s contract; no other thread
        /// writes the columns of `panels`.
        pub unsafe fn panels(job: &Job<'_>, panels: Range<usize>) {
            // SAFETY (the tiles): the caller's contract; each tile's rows and panel are the job's.
            job.for_each_tile(panels, MR, |p, i0, m| match m {
                1 => tile::<1>(job, p, i0),
                _ => tile::<2>(job, p, i0),
            });
        }
    };
}

/// The tier itself: `vpdpbusd` (VEX, 256-bit).
pub mod real {
    vnni_kernels!("avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32);
    vnni_super!("avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32);
}

/// The same kernels over `dpbusd_emulated` (AVX2 only): what tests run where the CPU lacks AVX-VNNI.
pub mod emulated {
    use super::dpbusd_emulated;
    vnni_kernels!("avx2,fma,f16c", dpbusd_emulated);
    vnni_super!("avx2,fma,f16c", crate::quant::avxvnni::dpbusd_emulated);
}
