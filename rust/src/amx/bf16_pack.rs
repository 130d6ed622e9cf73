//! Packing bf16 weights into the order `tdpbf16ps` reads its second operand in, one block of 32 columns
//! and one chunk of k at a time (`bf16_gemm`'s B operand), from row-major weights or the decoder's panels.
//!
//! Layout of a packed block of 32 columns and kc values of k (kc a multiple of 32): `[kc / 32][2 tiles]
//! [16 pairs][16 columns][2]` (`packed_at`). Exact: values are moved, never converted; zeros past n and k.
//! The AVX-512 versions write the same bytes as the scalar loops (a unit test compares them).

use super::ROWS;
use crate::preserve_linear::PANEL;

/// Columns of one packed block (two 16-column tiles).
pub(super) const NB: usize = 2 * ROWS;
/// k per tile step: 16 bf16 pairs per 64-byte row.
pub(super) const KS: usize = super::ROW_BYTES / 2;

/// The bf16 weights of a GEMM, `[n, k]`, in one of the layouts the crate stores them in.
#[derive(Clone, Copy)]
pub(crate) enum Weights<'a> {
    /// Row-major (torch's `nn.Linear.weight`).
    RowMajor(&'a [u16]),
    /// `preserve_linear::PanelWeight::Bf16`'s data: panels of 32 rows, k-major, rows i and 16 + i side by side.
    Panels(&'a [u16]),
}

/// Where weight (column c < 32 of the block, k index kk counted from the chunk's start) goes.
#[inline(always)]
pub(super) fn packed_at(c: usize, kk: usize) -> usize {
    let (tile, col) = (c / ROWS, c % ROWS);
    let (step, pair, odd) = (kk / KS, (kk % KS) / 2, kk % 2);
    (((step * 2 + tile) * ROWS + pair) * ROWS + col) * 2 + odd
}

/// Packs columns j0 .. j0 + 32 and k values k0 .. k0 + kc of the [n, k] weights into `dst` (kc * 32
/// values). k0 and kc are multiples of 32; j0 of 32. `avx512`: the CPU has AVX-512F (faster loops, the
/// same bytes).
#[allow(clippy::too_many_arguments)]
pub(super) fn pack_b(
    w: Weights<'_>,
    n: usize,
    k: usize,
    j0: usize,
    k0: usize,
    kc: usize,
    dst: &mut [u16],
    avx512: bool,
) {
    debug_assert!(dst.len() == kc * NB && k0.is_multiple_of(KS) && kc.is_multiple_of(KS));
    let k_end = k.min(k0 + kc);
    if j0 + NB > n || k_end < k0 + kc {
        dst.fill(0);
    }
    let cols = NB.min(n - j0);
    match w {
        #[cfg(target_arch = "x86_64")]
        Weights::RowMajor(w) if avx512 => {
            // SAFETY: the caller's `avx512` promise; rows j0 .. j0 + cols of w exist, k_end <= k.
            unsafe { pack_rows_avx512(w, k, j0, cols, k0, k_end, dst) }
        }
        Weights::RowMajor(w) => {
            for c in 0..cols {
                let row = &w[(j0 + c) * k..(j0 + c + 1) * k];
                for (kk, &v) in row[k0..k_end].iter().enumerate() {
                    dst[packed_at(c, kk)] = v;
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Weights::Panels(w) if avx512 => {
            let panel = &w[(j0 / PANEL) * k * PANEL..(j0 / PANEL + 1) * k * PANEL];
            // SAFETY: the caller's `avx512` promise; the panel holds k lines of 32 values.
            unsafe { pack_panel_avx512(panel, k0, k_end, dst) }
        }
        Weights::Panels(w) => {
            // NB == PANEL and j0 is a multiple of 32: one panel, k lines of 32 values, column i of the
            // block at slot 2i (i < 16) or 2(i - 16) + 1. Past n the panel holds zeros.
            let panel = &w[(j0 / PANEL) * k * PANEL..(j0 / PANEL + 1) * k * PANEL];
            for (kk, line) in panel[k0 * PANEL..k_end * PANEL]
                .chunks_exact(PANEL)
                .enumerate()
            {
                for (s, &v) in line.iter().enumerate() {
                    let c = if s % 2 == 0 { s / 2 } else { ROWS + s / 2 };
                    dst[packed_at(c, kk)] = v;
                }
            }
        }
    }
}

/// Row-major weights with AVX-512 gathers: each (k step, tile, pair) is one gather of the 16 columns'
/// bf16 pairs (as u32), where the scalar loop wrote 32 values one at a time. An odd k's last pair,
/// missing its second value, is written alone; `dst` was zeroed where k or the columns end.
///
/// # Safety
/// The CPU has AVX-512F; rows j0 .. j0 + cols of the [n, k] matrix w exist; k_end <= k; `dst` holds
/// the chunk (kc * NB values, kc >= k_end - k0).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn pack_rows_avx512(
    w: &[u16],
    k: usize,
    j0: usize,
    cols: usize,
    k0: usize,
    k_end: usize,
    dst: &mut [u16],
) {
    use std::arch::x86_64::*;
    let base = w.as_ptr().add(j0 * k);
    for tile in 0..2 {
        let first = tile * ROWS;
        if first >= cols {
            break;
        }
        let live = (cols - first).min(ROWS);
        let mask: __mmask16 = if live == ROWS { !0 } else { (1u16 << live) - 1 };
        // Column c's row starts at (first + c) * k values from base.
        let rows = _mm512_mullo_epi32(
            _mm512_add_epi32(
                _mm512_set1_epi32(first as i32),
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            ),
            _mm512_set1_epi32(k as i32),
        );
        for kk in (k0..k_end).step_by(2) {
            let local = kk - k0;
            let (step, pair) = (local / KS, (local % KS) / 2);
            let out = dst
                .as_mut_ptr()
                .add(((step * 2 + tile) * ROWS + pair) * ROWS * 2);
            if kk + 1 < k {
                let idx = _mm512_add_epi32(rows, _mm512_set1_epi32(kk as i32));
                // Scale 2: the indices count u16 values; each lane reads the pair (kk, kk + 1).
                let v = _mm512_mask_i32gather_epi32::<2>(
                    _mm512_setzero_si512(),
                    mask,
                    idx,
                    base.cast(),
                );
                _mm512_storeu_si512(out.cast(), v);
            } else {
                for c in 0..live {
                    *out.add(2 * c) = *base.add((first + c) * k + kk);
                }
            }
        }
    }
}

/// One panel's lines k0 .. k_end with AVX-512: a panel line holds, as 16 u32 lanes, (column i, column
/// 16 + i) at one k; two lines (k even, k odd) become one pair row of each tile: tile 0 takes both
/// lines' low halves, tile 1 their high halves. Four integer operations per 64 bytes written (the
/// scalar loop scattered 32 values one by one: a pack per 32 columns cost up to a fifth of a prompt GEMM).
///
/// # Safety
/// The CPU has AVX-512F; `panel` holds k_end lines of 32 values at least; `dst` holds the chunk
/// (kc * NB values, kc >= k_end - k0, k0 even); where k_end is odd, the missing odd line reads as zero.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
unsafe fn pack_panel_avx512(panel: &[u16], k0: usize, k_end: usize, dst: &mut [u16]) {
    use std::arch::x86_64::*;
    let low = _mm512_set1_epi32(0xffff);
    let src = panel.as_ptr();
    for kk in (k0..k_end).step_by(2) {
        let local = kk - k0;
        let (step, pair) = (local / KS, (local % KS) / 2);
        let even = _mm512_loadu_si512(src.add(kk * PANEL).cast());
        let odd = if kk + 1 < k_end {
            _mm512_loadu_si512(src.add((kk + 1) * PANEL).cast())
        } else {
            _mm512_setzero_si512()
        };
        let t0 = _mm512_or_si512(_mm512_and_si512(even, low), _mm512_slli_epi32::<16>(odd));
        let t1 = _mm512_or_si512(_mm512_srli_epi32::<16>(even), _mm512_andnot_si512(low, odd));
        let out = dst.as_mut_ptr().add((step * 2 * ROWS + pair) * ROWS * 2);
        _mm512_storeu_si512(out.cast(), t0);
        _mm512_storeu_si512(out.add(ROWS * ROWS * 2).cast(), t1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bf16::f32_to_bf16;
    use crate::preserve_linear::PanelWeight;

    /// The AVX-512 packings (gathered rows, shuffled panels) equal the scalar ones over awkward shapes and
    /// chunks: odd k, a last block of few columns, a chunk that ends past k, a chunk in the middle.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx512_packing_equals_the_scalar_packing() {
        if !crate::isa::Isa::Avx512.cpu_has() {
            return;
        }
        let mut seed = 9u32;
        for &(n, k, j0, k0, kc) in &[
            (40usize, 65usize, 32usize, 0usize, 96usize),
            (40, 65, 32, 64, 32),
            (64, 96, 0, 32, 32),
            (33, 7, 32, 0, 32),
            (32, 2048, 0, 0, 2048),
            (32, 2048, 0, 1024, 512),
        ] {
            let w: Vec<u16> = (0..n * k)
                .map(|_| {
                    seed = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
                    f32_to_bf16((seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5)
                })
                .collect();
            let PanelWeight::Bf16 { data, .. } = PanelWeight::from_bf16(&w, n, k) else {
                unreachable!()
            };
            let scalar = |w: Weights<'_>| {
                let mut d = vec![7u16; kc * NB];
                pack_b(w, n, k, j0, k0, kc, &mut d, false);
                d
            };
            let fast = |w: Weights<'_>| {
                let mut d = vec![9u16; kc * NB];
                pack_b(w, n, k, j0, k0, kc, &mut d, true);
                d
            };
            let rows = scalar(Weights::RowMajor(&w));
            assert_eq!(
                rows,
                fast(Weights::RowMajor(&w)),
                "rows n{n} k{k} j0 {j0} k0 {k0}"
            );
            assert_eq!(
                rows,
                scalar(Weights::Panels(&data)),
                "panels n{n} k{k} j0 {j0} k0 {k0}"
            );
            assert_eq!(
                rows,
                fast(Weights::Panels(&data)),
                "avx512 panels n{n} k{k} j0 {j0} k0 {k0}"
            );
        }
    }
}
