//! AVX-512 VNNI attention over an 8-bit cache. Scores (`scores_q8::QkQ8Args`): the chunk's keys are transposed
//! into lanes (16 keys to a vector, 4 consecutive head dims of each key to a lane: the layout
//! `vpdpbusd` multiplies against one broadcast group of 4 query codes), then every query row costs
//! d / 4 `vpdpbusd` per 16 keys and no horizontal sums. `vpdpbusd` multiplies unsigned by signed bytes:
//! the query codes go in biased by 128 and the keys' code sums (one `vpdpbusd` against ones per lane
//! group) remove the bias, so the i32 sums are the exact products of the signed codes.
//!
//! Weighted sums (`values_q8::PvQ8Args`): `vpdpwssd` on value codes widened to i16 and interleaved by key
//! pairs, against broadcast pairs of the weights' 15-bit codes.
//!
//! Numerical contract: the scalar references' bits (exact i32 sums; then `(isum as f32 * qs) * ks` for
//! scores and `acc + isum as f32 * ws` for sums, IEEE operations in that order).

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::avx512::lanes;
use super::scores_q8::{bias_rows, QkQ8Args};
use super::values_q8::{PvQ8Args, CHUNK, MAX_D, WMAX};

/// Keys and head dims one call handles (a key chunk of `block::KEY_CHUNK`; the largest head size
/// among the families, Gemma 3's 256).
pub(crate) const TILE_KEYS: usize = 64;
pub(crate) const TILE_D: usize = 256;
/// Lane groups (of 4 dims) per key block in the tile.
const GROUPS: usize = TILE_D / 4;

/// Whether this CPU runs the kernel.
pub(crate) fn usable() -> bool {
    crate::isa::Isa::Avx512.cpu_has() && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// Tile entries (`__m512i` is 64-byte aligned) left uninitialised: zeroing 16-32 KB per call cost more than
/// a decode step's scores. Every entry a kernel reads it has written first.
type Tile<const N: usize> = [MaybeUninit<__m512i>; N];

/// 16 x 16 transpose of 32-bit elements: out[c] lane j = rows[j] lane c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")]
#[inline]
fn transpose16(r: &[__m512i; 16]) -> [__m512i; 16] {
    // Within each 128-bit lane: 4 x 4 transposes of 32-bit elements across rows 4i..4i+4.
    let t: [__m512i; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i & 1 == 0 {
            _mm512_unpacklo_epi32(a, b)
        } else {
            _mm512_unpackhi_epi32(a, b)
        }
    });
    // u[4m + j] holds, in 128-bit lane L, element 4L + j of rows 4m..4m+4.
    let u: [__m512i; 16] = std::array::from_fn(|i| {
        let (m, j) = (i / 4, i % 4);
        let (a, b) = (t[4 * m + (j & 2) / 2], t[4 * m + 2 + (j & 2) / 2]);
        if j & 1 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    let mut out = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        let v = _mm512_shuffle_i32x4::<0x88>(u[j], u[4 + j]);
        let w = _mm512_shuffle_i32x4::<0xDD>(u[j], u[4 + j]);
        let x = _mm512_shuffle_i32x4::<0x88>(u[8 + j], u[12 + j]);
        let y = _mm512_shuffle_i32x4::<0xDD>(u[8 + j], u[12 + j]);
        out[j] = _mm512_shuffle_i32x4::<0x88>(v, x);
        out[8 + j] = _mm512_shuffle_i32x4::<0xDD>(v, x);
        out[4 + j] = _mm512_shuffle_i32x4::<0x88>(w, y);
        out[12 + j] = _mm512_shuffle_i32x4::<0xDD>(w, y);
    }
    out
}

/// The scores `args` describes.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and VNNI (`usable`); keys <= TILE_KEYS, d <= TILE_D.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
pub unsafe fn qk_q8(args: QkQ8Args<'_>) {
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
    let nb = keys.div_ceil(16);
    let groups = d.div_ceil(4);
    // Tile block kb, group g: lane j = dims 4g..4g+4 of key 16 kb + j (zeros past d and past the keys,
    // so they add nothing whatever the query's bytes there).
    // Entries kb < nb, g < groups are written here and only those are read.
    let mut tile: Tile<{ TILE_KEYS / 16 * GROUPS }> =
        [MaybeUninit::uninit(); TILE_KEYS / 16 * GROUPS];
    let mut bias = [_mm512_setzero_si512(); TILE_KEYS / 16];
    let ones = _mm512_set1_epi8(1);
    for (kb, bias_kb) in bias.iter_mut().enumerate().take(nb) {
        for c in 0..d.div_ceil(64) {
            let width = (d - 64 * c).min(64);
            let mask: __mmask64 = if width == 64 { !0 } else { (1u64 << width) - 1 };
            let rows16: [__m512i; 16] = std::array::from_fn(|j| {
                let s = 16 * kb + j;
                if s < keys {
                    // SAFETY: key s < keys starts at s * ldk and has d codes (has_work); the mask
                    // reads only dims 64c..64c + width < d.
                    _mm512_maskz_loadu_epi8(mask, k.as_ptr().add(s * ldk + 64 * c).cast())
                } else {
                    _mm512_setzero_si512()
                }
            });
            let cols = transpose16(&rows16);
            for (i, col) in cols.iter().enumerate() {
                if 16 * c + i < groups {
                    tile[kb * GROUPS + 16 * c + i] = MaybeUninit::new(*col);
                }
            }
        }
        // bias = -128 * (sum of each key's codes): what the +128 on the query codes adds.
        let mut sum = _mm512_setzero_si512();
        for g in 0..groups {
            sum = _mm512_dpbusd_epi32(sum, ones, tile[kb * GROUPS + g].assume_init());
        }
        *bias_kb = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(sum));
    }

    // Query codes biased by 128, in rows of TILE_D bytes (past d: never multiplied by a nonzero key).
    let mut biased = [0u8; 4 * TILE_D];
    let mut r = 0;
    while r < rows {
        let n = (rows - r).min(4);
        bias_rows(q, d, (r, n), &mut biased, TILE_D);
        // Reads only the entries written above (kb < nb, g < groups).
        let tile_ptr = tile.as_ptr().cast::<__m512i>();
        let qb = biased.as_ptr();
        let out = scores.as_mut_ptr().add(r * lds);
        let (qsr, ksp) = (&qs[r..r + n], ks.as_ptr());
        macro_rules! go {
            ($r:literal) => {
                match nb {
                    1 => block::<$r, 1>(qb, tile_ptr, groups, &bias, qsr, ksp, keys, out, lds),
                    2 => block::<$r, 2>(qb, tile_ptr, groups, &bias, qsr, ksp, keys, out, lds),
                    3 => block::<$r, 3>(qb, tile_ptr, groups, &bias, qsr, ksp, keys, out, lds),
                    _ => block::<$r, 4>(qb, tile_ptr, groups, &bias, qsr, ksp, keys, out, lds),
                }
            };
        }
        match n {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            _ => go!(4),
        }
        r += n;
    }
}

/// R query rows against NB blocks of 16 keys: R x NB accumulators, each group of 4 dims one tile load
/// per block and one broadcast per row.
///
/// # Safety
/// As `qk_q8`; `qb` holds R rows of TILE_D bytes, `tile` NB blocks of GROUPS vectors, `ks` the keys'
/// scales (keys of them), `out` R rows of stride `lds` with room for `keys` scores each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn block<const R: usize, const NB: usize>(
    qb: *const u8,
    tile: *const __m512i,
    groups: usize,
    bias: &[__m512i; TILE_KEYS / 16],
    qs: &[f32],
    ks: *const f32,
    keys: usize,
    out: *mut f32,
    lds: usize,
) {
    let mut acc = [[_mm512_setzero_si512(); NB]; R];
    for row in acc.iter_mut() {
        row.copy_from_slice(&bias[..NB]);
    }
    for g in 0..groups {
        let t: [__m512i; NB] = std::array::from_fn(|kb| *tile.add(kb * GROUPS + g));
        for (i, row) in acc.iter_mut().enumerate() {
            let b = _mm512_set1_epi32((qb.add(i * TILE_D + 4 * g) as *const i32).read_unaligned());
            for (a, &tv) in row.iter_mut().zip(&t) {
                *a = _mm512_dpbusd_epi32(*a, b, tv);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        let qsv = _mm512_set1_ps(qs[i]);
        for (kb, &a) in row.iter().enumerate() {
            let m = lanes(keys.saturating_sub(16 * kb));
            let ksv = _mm512_maskz_loadu_ps(m, ks.add(16 * kb));
            let v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), qsv), ksv);
            _mm512_mask_storeu_ps(out.add(i * lds + 16 * kb), m, v);
        }
    }
}

/// One row's weight codes as i16 (keys not seen: 0); returns the row's scale `ws`. The contract's
/// operations lane by lane, as `avx2_q8::weights` does them 8 lanes at a time (the same bits): 16 lanes
/// halve the instructions, which were over a third of `pv_q8` in a prompt (perf, AMD Zen 5).
///
/// # Safety
/// AVX-512 F/BW/VL/DQ; p[from..to] readable (nothing else of p is read), from < to <= CHUNK.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn weights(
    p: *const f32,
    vs: &[f32; CHUNK],
    (from, to): (usize, usize),
    codes: &mut [i16; CHUNK],
) -> f32 {
    const { assert!(CHUNK == 64) };
    // Keys from..to as one bit each.
    let upto = if to >= 64 { !0u64 } else { (1u64 << to) - 1 };
    let seen = upto & !((1u64 << from) - 1);
    let mut w = [_mm512_setzero_ps(); CHUNK / 16];
    let mut m = _mm512_setzero_ps();
    for (g, wg) in w.iter_mut().enumerate() {
        let k = (seen >> (16 * g)) as __mmask16;
        if k != 0 {
            // Masked lanes read nothing and give 0 (vs is finite).
            let pv = _mm512_maskz_loadu_ps(k, p.wrapping_add(16 * g));
            *wg = _mm512_mul_ps(pv, _mm512_loadu_ps(vs.as_ptr().add(16 * g)));
            // max_ps returns its second operand when either is NaN: NaN weights leave the max, as f32::max.
            m = _mm512_max_ps(*wg, m);
        }
    }
    // No NaN is left and every value is >= +0: the order of the reduction does not matter.
    let ws = _mm512_reduce_max_ps(m) / WMAX;
    let inv = _mm512_set1_ps(if ws >= f32::MIN_POSITIVE {
        1.0 / ws
    } else {
        0.0
    });
    let (half, zero, top) = (
        _mm512_set1_ps(0.5),
        _mm512_setzero_si512(),
        _mm512_set1_epi32(32767),
    );
    for (g, wg) in w.iter().enumerate() {
        // NaN converts to i32::MIN, which the max makes 0 (as `as i32` does); after the clamp the
        // narrowing to i16 is exact.
        let c = _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(*wg, inv), half));
        let c = _mm512_min_epi32(_mm512_max_epi32(c, zero), top);
        _mm256_storeu_si256(
            codes.as_mut_ptr().add(16 * g).cast(),
            _mm512_cvtepi32_epi16(c),
        );
    }
    ws
}

/// Value tile of `pv_q8`: key pair j, 32-dim group g, half h at [(j * VGROUPS + g) * 2 + h].
const VGROUPS: usize = MAX_D / 32;
const VTILE: usize = CHUNK / 2 * VGROUPS * 2;

/// The weighted sums `values_q8::PvQ8Args` describes, with `vpdpwssd`: value codes widened to i16 and
/// interleaved by key pairs, four rows at a time sharing each tile load; the weights' codes those of
/// `avx2_q8::weights`, 16 lanes at a time (`weights` above).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ and VNNI (`usable`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
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
    let (pairs, groups) = (keys.div_ceil(2), d.div_ceil(32));
    // Entries j < pairs, g < groups are written here and only those are read.
    let mut tile: Tile<VTILE> = [MaybeUninit::uninit(); VTILE];
    for j in 0..pairs {
        for g in 0..groups {
            let width = (d - 32 * g).min(32);
            let mask: __mmask32 = if width == 32 { !0 } else { (1u32 << width) - 1 };
            let row = |s: usize| {
                if s < keys {
                    // SAFETY: key s < keys has d codes from s * ldv (has_work); the mask reads only
                    // dims 32g..32g + width <= d.
                    let b = _mm256_maskz_loadu_epi8(mask, v.as_ptr().add(s * ldv + 32 * g).cast());
                    _mm512_cvtepi8_epi16(b)
                } else {
                    _mm512_setzero_si512()
                }
            };
            let (a, b) = (row(2 * j), row(2 * j + 1));
            let at = (j * VGROUPS + g) * 2;
            tile[at] = MaybeUninit::new(_mm512_unpacklo_epi16(a, b));
            tile[at + 1] = MaybeUninit::new(_mm512_unpackhi_epi16(a, b));
        }
    }
    let rows = seen.len();
    let mut r = 0;
    while r < rows {
        let n = (rows - r).min(4);
        let mut codes = [[0i16; CHUNK]; 4];
        let mut ws = [0.0f32; 4];
        let (mut j0, mut j1) = (usize::MAX, 0);
        for i in 0..n {
            let (from, to) = seen[r + i];
            if from < to {
                ws[i] = weights(p.as_ptr().add((r + i) * lds), vs, (from, to), &mut codes[i]);
                j0 = j0.min(from / 2);
                j1 = j1.max(to.div_ceil(2));
            }
        }
        if ws.iter().any(|&w| w > 0.0) {
            let out = acc.as_mut_ptr().add(r * d);
            let mut g = 0;
            while g < groups {
                let two = groups - g >= 2;
                macro_rules! go {
                    ($r:literal) => {
                        if two {
                            vblock::<$r, 2>(&tile, &codes, &ws, (j0, j1), g, out, d)
                        } else {
                            vblock::<$r, 1>(&tile, &codes, &ws, (j0, j1), g, out, d)
                        }
                    };
                }
                match n {
                    1 => go!(1),
                    2 => go!(2),
                    3 => go!(3),
                    _ => go!(4),
                }
                g += if two { 2 } else { 1 };
            }
        }
        r += n;
    }
}

/// R rows' sums for G 32-dim groups from g0 over key pairs j0..j1, added into the rows of `out`
/// (stride d) whose scale is positive.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")]
#[inline]
unsafe fn vblock<const R: usize, const G: usize>(
    tile: &Tile<VTILE>,
    codes: &[[i16; CHUNK]; 4],
    ws: &[f32; 4],
    (j0, j1): (usize, usize),
    g0: usize,
    out: *mut f32,
    d: usize,
) {
    let mut s = [[[_mm512_setzero_si512(); 2]; G]; R];
    for j in j0..j1 {
        let t: [[__m512i; 2]; G] = std::array::from_fn(|g| {
            let at = (j * VGROUPS + g0 + g) * 2;
            // Written by `pv_q8` for every pair and group this reads.
            [tile[at].assume_init(), tile[at + 1].assume_init()]
        });
        for (i, si) in s.iter_mut().enumerate() {
            // Keys 2j and 2j + 1's codes: the low and high halves of each 32-bit lane.
            let b =
                _mm512_set1_epi32((codes[i].as_ptr().add(2 * j) as *const i32).read_unaligned());
            for (sg, tg) in si.iter_mut().zip(&t) {
                sg[0] = _mm512_dpwssd_epi32(sg[0], b, tg[0]);
                sg[1] = _mm512_dpwssd_epi32(sg[1], b, tg[1]);
            }
        }
    }
    // Lane (L, i) of half 0 holds dim 8L + i, of half 1 dim 8L + 4 + i: back to dim order.
    let idx = [
        _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23),
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31),
    ];
    for (i, si) in s.iter().enumerate() {
        if ws[i] <= 0.0 {
            continue;
        }
        let wsv = _mm512_set1_ps(ws[i]);
        for (g, sg) in si.iter().enumerate() {
            for (k, ix) in idx.iter().enumerate() {
                let dim = 32 * (g0 + g) + 16 * k;
                if dim >= d {
                    break;
                }
                let part = _mm512_permutex2var_epi32(sg[0], *ix, sg[1]);
                let m = lanes(d - dim);
                let o = out.add(i * d + dim);
                let add = _mm512_mul_ps(_mm512_cvtepi32_ps(part), wsv);
                _mm512_mask_storeu_ps(o, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), add));
            }
        }
    }
}
