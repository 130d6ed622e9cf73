//! AVX2 weighted sums over an 8-bit cache (`values_q8`): the weights' 15-bit codes (also what the
//! AVX-512 tier uses) and a `vpmaddwd` kernel. Value codes are widened to i16 and interleaved by key
//! pairs (one 32-bit lane = one dim of two keys), so one broadcast pair of weight codes times a tile
//! vector adds both keys' products for 8 dims in exact i32.
//!
//! Numerical contract: the scalar tier's bits (`values_q8`): the codes come from the same IEEE
//! operations in the same order, the sums are exact integers, the epilogue is the same two roundings.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::values_q8::{PvQ8Args, CHUNK, MAX_D, WMAX};

/// One row's weight codes as i16 (keys not seen: 0); returns the row's scale `ws` (the contract's).
///
/// # Safety
/// AVX2 and FMA; p[from..to] readable (nothing else of p is read), from < to <= CHUNK.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn weights(
    p: *const f32,
    vs: &[f32; CHUNK],
    (from, to): (usize, usize),
    codes: &mut [i16; CHUNK],
) -> f32 {
    let groups = to.div_ceil(8);
    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let (lo, hi) = (
        _mm256_set1_epi32(from as i32 - 1),
        _mm256_set1_epi32(to as i32),
    );
    let mut w = [_mm256_setzero_ps(); CHUNK / 8];
    let mut m = _mm256_setzero_ps();
    for (g, wg) in w.iter_mut().enumerate().take(groups) {
        let idx = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * g as i32));
        let seen = _mm256_and_si256(_mm256_cmpgt_epi32(idx, lo), _mm256_cmpgt_epi32(hi, idx));
        // Masked lanes read nothing and give 0 (vs is finite).
        let pv = _mm256_maskload_ps(p.add(8 * g), seen);
        *wg = _mm256_mul_ps(pv, _mm256_loadu_ps(vs.as_ptr().add(8 * g)));
        // max_ps returns its second operand when either is NaN: NaN weights leave the max, as f32::max.
        m = _mm256_max_ps(*wg, m);
    }
    let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let wmax = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps::<1>(h, h)));
    let ws = wmax / WMAX;
    let inv = _mm256_set1_ps(if ws >= f32::MIN_POSITIVE {
        1.0 / ws
    } else {
        0.0
    });
    let (half, zero, top) = (
        _mm256_set1_ps(0.5),
        _mm256_setzero_si256(),
        _mm256_set1_epi32(32767),
    );
    for g in (0..CHUNK / 8).step_by(2) {
        let code = |x: __m256| {
            // NaN converts to i32::MIN, which the max makes 0 (as `as i32` does).
            let c = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(x, inv), half));
            _mm256_min_epi32(_mm256_max_epi32(c, zero), top)
        };
        let packed = _mm256_packs_epi32(code(w[g]), code(w[g + 1]));
        let ordered = _mm256_permute4x64_epi64::<0xD8>(packed);
        _mm256_storeu_si256(codes.as_mut_ptr().add(8 * g).cast(), ordered);
    }
    ws
}

/// Value tile: pair j, 16-dim group g, half h at [(j * MAX_D / 16 + g) * 2 + h], left uninitialised
/// (zeroing 32 KB per call cost more than a decode step's sums): every entry read is written first.
const TILE: usize = CHUNK / 2 * MAX_D / 16 * 2;
type Tile = [MaybeUninit<__m256i>; TILE];

/// The weighted sums `args` describes.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn pv_q8(args: PvQ8Args<'_>) {
    if !args.has_work() {
        return;
    }
    let PvQ8Args {
        p,
        lds,
        seen,
        v,
        ldv,
        vs,
        keys,
        d,
        acc,
    } = args;
    let (pairs, groups) = (keys.div_ceil(2), d.div_ceil(16));
    // Entries j < pairs, g < groups are written here and only those are read.
    let mut tile: Tile = [MaybeUninit::uninit(); TILE];
    for j in 0..pairs {
        for g in 0..groups {
            let width = (d - 16 * g).min(16);
            let row = |s: usize| {
                if s < keys {
                    let mut b = [0i8; 16];
                    b[..width].copy_from_slice(&v[s * ldv + 16 * g..s * ldv + 16 * g + width]);
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(b.as_ptr().cast()))
                } else {
                    _mm256_setzero_si256()
                }
            };
            let (a, b) = (row(2 * j), row(2 * j + 1));
            let at = (j * (MAX_D / 16) + g) * 2;
            tile[at] = MaybeUninit::new(_mm256_unpacklo_epi16(a, b));
            tile[at + 1] = MaybeUninit::new(_mm256_unpackhi_epi16(a, b));
        }
    }
    let mut codes = [0i16; CHUNK];
    for (r, &(from, to)) in seen.iter().enumerate() {
        if from >= to {
            continue;
        }
        let ws = weights(p.as_ptr().add(r * lds), vs, (from, to), &mut codes);
        if ws <= 0.0 {
            continue;
        }
        let out = acc.as_mut_ptr().add(r * d);
        let mut g = 0;
        while g < groups {
            let n = (groups - g).min(2);
            if n == 2 {
                groups_of::<2>(&tile, &codes, (from / 2, to.div_ceil(2)), g, ws, out, d);
            } else {
                groups_of::<1>(&tile, &codes, (from / 2, to.div_ceil(2)), g, ws, out, d);
            }
            g += n;
        }
    }
}

/// One row's sums for G 16-dim groups from g0, over key pairs j0..j1, added into out[16 g0..].
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn groups_of<const G: usize>(
    tile: &Tile,
    codes: &[i16; CHUNK],
    (j0, j1): (usize, usize),
    g0: usize,
    ws: f32,
    out: *mut f32,
    d: usize,
) {
    let mut s = [[_mm256_setzero_si256(); 2]; G];
    for j in j0..j1 {
        // Keys 2j and 2j + 1's codes: the low and high halves of each 32-bit lane.
        let b = _mm256_set1_epi32((codes.as_ptr().add(2 * j) as *const i32).read_unaligned());
        for (g, sg) in s.iter_mut().enumerate() {
            let at = (j * (MAX_D / 16) + g0 + g) * 2;
            // Written by `pv_q8` for every pair and group this reads.
            let (t0, t1) = (tile[at].assume_init(), tile[at + 1].assume_init());
            sg[0] = _mm256_add_epi32(sg[0], _mm256_madd_epi16(b, t0));
            sg[1] = _mm256_add_epi32(sg[1], _mm256_madd_epi16(b, t1));
        }
    }
    let wsv = _mm256_set1_ps(ws);
    for (g, sg) in s.iter().enumerate() {
        // Lane (L, i) of half 0 holds dim 8L + i, of half 1 dim 8L + 4 + i: back to dim order.
        let lo = _mm256_permute2x128_si256::<0x20>(sg[0], sg[1]);
        let hi = _mm256_permute2x128_si256::<0x31>(sg[0], sg[1]);
        for (k, part) in [lo, hi].into_iter().enumerate() {
            let dim = 16 * (g0 + g) + 8 * k;
            if dim >= d {
                break;
            }
            let add = _mm256_mul_ps(_mm256_cvtepi32_ps(part), wsv);
            if d - dim >= 8 {
                let o = out.add(dim);
                _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), add));
            } else {
                let mut tmp = [0.0f32; 8];
                _mm256_storeu_ps(tmp.as_mut_ptr(), add);
                for (i, &t) in tmp[..d - dim].iter().enumerate() {
                    *out.add(dim + i) += t;
                }
            }
        }
    }
}
