//! AVX2 unpacking of packed weights, shared by the AVX2 tiles (`avx2.rs`), its many-rows path
//! (`avx2_rows.rs`), the AVX-VNNI tier and the super-block path's x86 pieces (`superblock/x86.rs`): a
//! group of Q4 / Q4K nibbles or Q6K codes as whole bytes per half panel, and Q4K / Q6K sub-block scales
//! and f16 super-block scales widened for the epilogues.
//!
//! Numerical contract: exact; codes and scales come out as the integers and f16 values the packing
//! holds (`kblock.rs`), the products `dmin * mc` as one f32 multiply, as the scalar reference's.

use std::arch::x86_64::*;

/// One group of 8 k of a 16-row panel in Q4's layout (64 bytes at `at`): per half panel h (rows 0-7,
/// 8-15) the low nibbles (k 8g..8g+3) and the high nibbles (k 8g+4..8g+7) as bytes, `[h][nibble]`.
/// Shared by the Q4 and Q4K tiles and by `avx2_rows`' unpacking.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q4_codes(at: *const u8) -> [[__m256i; 2]; 2] {
    let nib = _mm256_set1_epi8(0x0f);
    [0, 32].map(|o| {
        let v = _mm256_loadu_si256(at.add(o).cast());
        [
            _mm256_and_si256(v, nib),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib),
        ]
    })
}

/// Group g of a Q40 / Q50 block whose nibbles start at `co` (Q4's layout): as `q4_codes`, for Q50 each
/// byte completed with its fifth bit from the bit plane at `hb` (whole codes 0..=31).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q5_codes(co: *const u8, hb: Option<*const u8>, g: usize) -> [[__m256i; 2]; 2] {
    let mut c = q4_codes(co.add(g * 64));
    if let Some(hb) = hb {
        for (h, ch) in c.iter_mut().enumerate() {
            let plane = _mm256_loadu_si256(hb.add(32 * h).cast());
            ch[0] = _mm256_or_si256(ch[0], fifth_bits(plane, 2 * g));
            ch[1] = _mm256_or_si256(ch[1], fifth_bits(plane, 2 * g + 1));
        }
    }
    c
}

/// Q50's fifth bits of code vector `v` moved to bit 4 of each byte (see the AVX-512 tier's `fifth_bits`).
#[inline(always)]
pub(super) unsafe fn fifth_bits(hb: __m256i, v: usize) -> __m256i {
    let moved = match v {
        0 => _mm256_slli_epi16::<4>(hb),
        1 => _mm256_slli_epi16::<3>(hb),
        2 => _mm256_slli_epi16::<2>(hb),
        3 => _mm256_slli_epi16::<1>(hb),
        4 => hb,
        5 => _mm256_srli_epi16::<1>(hb),
        6 => _mm256_srli_epi16::<2>(hb),
        _ => _mm256_srli_epi16::<3>(hb),
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(0x10))
}

/// Group g of the Q6K sub-block whose codes start at `cp`: as `q4_codes`, each byte completed with its
/// 2 high bits (whole codes 0..=63). Shared by `tile_super` and `avx2_rows`' unpacking.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q6k_codes(cp: *const u8, g: usize) -> [[__m256i; 2]; 2] {
    let mut c = q4_codes(cp.add(g * 64));
    let hp = cp.add(256 + (g / 2) * 64);
    for (h, ch) in c.iter_mut().enumerate() {
        let hb = _mm256_loadu_si256(hp.add(32 * h).cast());
        ch[0] = _mm256_or_si256(ch[0], high_bits(hb, 2 * g));
        ch[1] = _mm256_or_si256(ch[1], high_bits(hb, 2 * g + 1));
    }
    c
}

/// Q6K's high bits of code vector `v` moved to bits 4-5 of each byte (see the AVX-512 tier).
#[inline(always)]
pub(super) unsafe fn high_bits(hb: __m256i, v: usize) -> __m256i {
    let m = _mm256_set1_epi8(0x30);
    match v % 4 {
        0 => _mm256_and_si256(_mm256_slli_epi16::<4>(hb), m),
        1 => _mm256_and_si256(_mm256_slli_epi16::<2>(hb), m),
        2 => _mm256_and_si256(hb, m),
        _ => _mm256_and_si256(_mm256_srli_epi16::<2>(hb), m),
    }
}

/// Sixteen bytes (one per row) to two vectors of 8 f32s, unsigned or signed.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn bytes_f32(v: __m128i, signed: bool) -> [__m256; 2] {
    let hi = _mm_srli_si128::<8>(v);
    if signed {
        [
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
        ]
    } else {
        [
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
        ]
    }
}

/// Sixteen f16s at `at` as two vectors of 8 f32s (rows 0-7, 8-15).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn f16x16(at: *const u8) -> [__m256; 2] {
    [0, 16].map(|o| _mm256_cvtph_ps(_mm_loadu_si128(at.add(o).cast())))
}

/// Q4K sub-block `s` (of `t`) of the super-block at `blk`: its 16 rows' 6-bit scales and mins as bytes, the
/// 12-bit packing of `kblock.rs` undone. SSE2 only (the x86-64 baseline), so every tier calls it.
#[inline]
pub(super) unsafe fn q4k_scale_bytes(blk: *const u8, t: usize, s: usize) -> (__m128i, __m128i) {
    let (n4, n3, n12) = (
        _mm_set1_epi8(0x0f),
        _mm_set1_epi8(0x03),
        _mm_set1_epi8(0x0c),
    );
    let lo = _mm_loadu_si128(blk.add(64 + 16 * s).cast());
    let mut hi = _mm_loadu_si128(blk.add(64 + 16 * t + 16 * (s / 2)).cast());
    if s % 2 == 1 {
        hi = _mm_srli_epi16::<4>(hi);
    }
    let sc = _mm_or_si128(
        _mm_and_si128(lo, n4),
        _mm_slli_epi16::<4>(_mm_and_si128(hi, n3)),
    );
    let mc = _mm_or_si128(
        _mm_and_si128(_mm_srli_epi16::<4>(lo), n4),
        _mm_slli_epi16::<2>(_mm_and_si128(hi, n12)),
    );
    (sc, mc)
}

/// Q4K sub-block `s` (of `t`) of the super-block at `blk`: each row's 6-bit scale in both i16 halves
/// of its lane (rows 0-7, rows 8-15), for `vpmaddwd`; and `dmin * mc` per row as f32 (`mv` = dmin).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn q4k_scales(
    blk: *const u8,
    t: usize,
    s: usize,
    mv: [__m256; 2],
) -> ([__m256i; 2], [__m256; 2]) {
    let (sc, mc) = q4k_scale_bytes(blk, t, s);
    let scp = [
        _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(sc, sc)),
        _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(sc, sc)),
    ];
    let mcf = bytes_f32(mc, false);
    (
        scp,
        [_mm256_mul_ps(mv[0], mcf[0]), _mm256_mul_ps(mv[1], mcf[1])],
    )
}
