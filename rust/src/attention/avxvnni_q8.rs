//! AVX-VNNI scores against an 8-bit cache (`scores_q8::QkQ8Args`): `avx512_q8`'s design on the 256-bit,
//! VEX-encoded `vpdpbusd` of CPUs without AVX-512 (Intel Alder Lake and later, Sierra Forest): a chunk's
//! keys transposed into lanes (8 keys to a vector, 4 consecutive head dims of each key to a lane), the
//! query codes biased by 128 into unsigned bytes and broadcast 4 at a time, the bias taken off with the
//! keys' code sums. 32 multiply-adds an instruction, against the 8 of the f32 FMAs the AVX2 tier runs
//! on the widened codes; 4 query rows x 2 key blocks share each load (16 ymm registers).
//!
//! Stamped twice (`qk_kernels!`, as `quant::avxvnni`): `real` with the instruction and, for tests,
//! `emulated` with `quant::avxvnni::dpbusd_emulated` (exact, AVX2 only), so the layout is tested on any
//! AVX2 machine and the instruction where it exists.
//!
//! Numerical contract: the scalar reference's bits (`scores_q8`: exact i32 sums, then
//! `(isum as f32 * qs) * ks`).

use std::arch::x86_64::*;

/// Keys and head dims one call handles (a key chunk of `block::KEY_CHUNK`; heads up to Gemma 3's 256).
pub(crate) const TILE_KEYS: usize = 64;
pub(crate) const TILE_D: usize = 256;
/// Lane groups (of 4 dims) per key block, and key blocks (of 8 keys) in the tile.
const GROUPS: usize = TILE_D / 4;
const BLOCKS: usize = TILE_KEYS / 8;

/// Whether this CPU runs the `real` kernel.
pub(crate) fn usable() -> bool {
    crate::isa::Isa::AvxVnni.cpu_has() && crate::quant::avxvnni::usable()
}

/// 8 x 8 transpose of 32-bit elements: out[c] lane j = rows[j] lane c.
#[target_feature(enable = "avx2")]
#[inline]
fn transpose8(r: &[__m256i; 8]) -> [__m256i; 8] {
    // t[2m] = rows 2m, 2m+1 interleaved by elements 0-1 (4-5) of each 128-bit half, t[2m+1] by 2-3 (6-7).
    let t: [__m256i; 8] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i & 1 == 0 {
            _mm256_unpacklo_epi32(a, b)
        } else {
            _mm256_unpackhi_epi32(a, b)
        }
    });
    // c[4h + j]: column j (half 0) and j + 4 (half 1) of rows 4h..4h + 4.
    let c: [__m256i; 8] = std::array::from_fn(|i| {
        let (h, j) = (i / 4, i % 4);
        let (a, b) = (t[4 * h + j / 2], t[4 * h + 2 + j / 2]);
        if j % 2 == 0 {
            _mm256_unpacklo_epi64(a, b)
        } else {
            _mm256_unpackhi_epi64(a, b)
        }
    });
    std::array::from_fn(|i| {
        let j = i % 4;
        if i < 4 {
            _mm256_permute2x128_si256::<0x20>(c[j], c[4 + j])
        } else {
            _mm256_permute2x128_si256::<0x31>(c[j], c[4 + j])
        }
    })
}

/// A mask of the first `n` (at most 8) 32-bit lanes, for `maskload` / `maskstore`.
#[target_feature(enable = "avx2")]
#[inline]
fn lanes8(n: usize) -> __m256i {
    let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n.min(8) as i32), idx)
}

/// `qk_q8` and its register tiles over the dot instruction `$dp(acc, unsigned, signed)`, compiled with
/// `$features`.
macro_rules! qk_kernels {
    ($features:literal, $dp:path) => {
        use std::arch::x86_64::*;
        use std::mem::MaybeUninit;

        use super::{lanes8, transpose8, BLOCKS, GROUPS, TILE_D, TILE_KEYS};
        use crate::attention::scores_q8::{bias_rows, QkQ8Args};

        /// The scores `args` describes.
        ///
        /// # Safety
        /// The CPU has `$features`; keys <= TILE_KEYS, d <= TILE_D.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn qk_q8(args: QkQ8Args<'_>) {
            if !args.has_work() {
                return;
            }
            let QkQ8Args {
                q,
                qs,
                rows,
                k,
                ldk,
                ks,
                keys,
                d,
                scores,
                lds,
            } = args;
            assert!(
                keys <= TILE_KEYS && d <= TILE_D,
                "qk_q8: {keys} keys of {d} dims exceed the tile"
            );
            let nb = keys.div_ceil(8);
            let groups = d.div_ceil(4);
            // Block kb, group g at [kb * GROUPS + g]: lane j = dims 4g..4g+4 of key 8 kb + j (zeros past d
            // and past the keys, so they add nothing whatever the query's bytes there). Entries kb < nb,
            // g < groups are written here and only those are read (16 KB, not zeroed per call).
            let mut tile = [MaybeUninit::<__m256i>::uninit(); BLOCKS * GROUPS];
            let mut bias = [_mm256_setzero_si256(); BLOCKS];
            let ones = _mm256_set1_epi8(1);
            for (kb, bias_kb) in bias.iter_mut().enumerate().take(nb) {
                for c in 0..d.div_ceil(32) {
                    let width = (d - 32 * c).min(32);
                    let rows8: [__m256i; 8] = std::array::from_fn(|j| {
                        let s = 8 * kb + j;
                        let at = s * ldk + 32 * c;
                        if s >= keys {
                            _mm256_setzero_si256()
                        } else if width == 32 {
                            // SAFETY: key s < keys has d codes from s * ldk (has_work); 32c + 32 <= d.
                            _mm256_loadu_si256(k.as_ptr().add(at).cast())
                        } else {
                            let mut part = [0i8; 32];
                            part[..width].copy_from_slice(&k[at..at + width]);
                            _mm256_loadu_si256(part.as_ptr().cast())
                        }
                    });
                    let cols = transpose8(&rows8);
                    for (i, col) in cols.iter().enumerate() {
                        if 8 * c + i < groups {
                            tile[kb * GROUPS + 8 * c + i] = MaybeUninit::new(*col);
                        }
                    }
                }
                // bias = -128 * (sum of each key's codes): what the +128 on the query codes adds.
                let mut sum = _mm256_setzero_si256();
                for g in 0..groups {
                    sum = $dp(sum, ones, tile[kb * GROUPS + g].assume_init());
                }
                *bias_kb = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<7>(sum));
            }

            // Query codes biased by 128, in rows of TILE_D bytes (past d: never multiplied by a
            // nonzero key).
            let mut biased = [0u8; 4 * TILE_D];
            let tile_ptr = tile.as_ptr().cast::<__m256i>();
            let mut r = 0;
            while r < rows {
                let n = (rows - r).min(4);
                bias_rows(q, d, (r, n), &mut biased, TILE_D);
                let qb = biased.as_ptr();
                let out = scores.as_mut_ptr().add(r * lds);
                let qsr = &qs[r..r + n];
                let mut kb = 0;
                while kb < nb {
                    macro_rules! go {
                        ($r:literal) => {
                            if nb - kb >= 2 {
                                block::<$r, 2>(
                                    qb, tile_ptr, groups, &bias, kb, qsr, ks, keys, out, lds,
                                )
                            } else {
                                block::<$r, 1>(
                                    qb, tile_ptr, groups, &bias, kb, qsr, ks, keys, out, lds,
                                )
                            }
                        };
                    }
                    match n {
                        1 => go!(1),
                        2 => go!(2),
                        3 => go!(3),
                        _ => go!(4),
                    }
                    kb += 2;
                }
                r += n;
            }
        }

        /// R query rows against NB blocks of 8 keys from block kb0: R x NB accumulators, each group of
        /// 4 dims one tile load per block and one broadcast per row.
        ///
        /// # Safety
        /// As `qk_q8`; `qb` holds R rows of TILE_D bytes, the tile blocks kb0..kb0 + NB (< nb) written,
        /// `out` R rows of stride `lds` with room for `keys` scores each.
        #[target_feature(enable = $features)]
        #[inline]
        #[allow(clippy::too_many_arguments)]
        unsafe fn block<const R: usize, const NB: usize>(
            qb: *const u8,
            tile: *const __m256i,
            groups: usize,
            bias: &[__m256i; BLOCKS],
            kb0: usize,
            qs: &[f32],
            ks: &[f32],
            keys: usize,
            out: *mut f32,
            lds: usize,
        ) {
            let mut acc = [[_mm256_setzero_si256(); NB]; R];
            for row in acc.iter_mut() {
                row.copy_from_slice(&bias[kb0..kb0 + NB]);
            }
            for g in 0..groups {
                let t: [__m256i; NB] = std::array::from_fn(|b| *tile.add((kb0 + b) * GROUPS + g));
                for (i, row) in acc.iter_mut().enumerate() {
                    let x = (qb.add(i * TILE_D + 4 * g) as *const i32).read_unaligned();
                    let b = _mm256_set1_epi32(x);
                    for (a, &tv) in row.iter_mut().zip(&t) {
                        *a = $dp(*a, b, tv);
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                let qsv = _mm256_set1_ps(qs[i]);
                for (b, &a) in row.iter().enumerate() {
                    let s0 = 8 * (kb0 + b);
                    let m = lanes8(keys - s0);
                    // Masked lanes are neither read nor written (keys s0.. of ks and of the row).
                    let ksv = _mm256_maskload_ps(ks.as_ptr().wrapping_add(s0), m);
                    let v = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(a), qsv), ksv);
                    _mm256_maskstore_ps(out.add(i * lds + s0), m, v);
                }
            }
        }
    };
}

/// The tier itself: `vpdpbusd` (VEX, 256-bit).
pub(crate) mod real {
    qk_kernels!("avx2,fma,avxvnni", _mm256_dpbusd_avx_epi32);
}

/// The same kernel over `dpbusd_emulated` (AVX2 only): what tests run where the CPU lacks AVX-VNNI.
#[cfg(test)]
pub(crate) mod emulated {
    qk_kernels!("avx2,fma,f16c", crate::quant::avxvnni::dpbusd_emulated);
}
