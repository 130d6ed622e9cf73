//! The SIMD tiers' panel loop, written once and stamped into each tier's module by `panel_tier!` with
//! that tier's vector type, intrinsics and tile heights (so each tier compiles its own copy, every
//! intrinsic inlined under its `#[target_feature]`). The tier supplies `MR` (x rows per register tile),
//! `load::<BF16, H>` (half H of a panel's
//! k step, widened: two vectors) and `store::<H>` (those outputs written, or added to y, bias last).
//! A half is the part of a panel's 32 outputs two vectors hold: the 512-bit tier has one, the 256-bit
//! tier two (rows 8h.. and 16 + 8h..), each run over all of k before the next.
//!
//! Numerical contract (`preserve_linear.rs`'s, the same for every row count): each `KC` block of k summed by
//! f32 FMA in k order from zero, the blocks' sums added in k order, the bias last.

/// Panel lines (k steps) prefetched ahead: the one-row stream into L2 (T1), 2 KB of bf16 ahead;
/// the register tiles into L1, 1.5 KB ahead. Measured on SmolLM2-135M's matrices (decoder_bench):
/// without prefetch the 8-row tile ran at 16.6 ms/token, with it 12.0 (the row-major GEMV's speed).
pub(super) const PREFETCH_ONE: usize = 32;
pub(super) const PREFETCH_TILE: usize = 24;

/// Stamps `micro`, `one_row`, `panels`, `run` and `run_half` for one tier (see the module header).
macro_rules! panel_tier {
    (
        features: $f:literal,
        vector: $v:ty,
        zero: $zero:ident,
        add: $add:ident,
        fmadd: $fmadd:ident,
        splat: $splat:ident,
        halves: [$($h:literal)+],
        heights: [$($rows:literal)+] $(,)?
    ) => {
        /// acc[r] = x[r][k0..k0+kc] . half H of panel[k0..k0+kc] for r < M (rows `ldx` apart).
        #[target_feature(enable = $f)]
        #[inline]
        #[allow(clippy::needless_range_loop)] // acc[r] is a register tile indexed by a constant bound
        unsafe fn micro<const BF16: bool, const H: usize, const M: usize>(
            x: *const f32,
            ldx: usize,
            w: *const u8,
            k0: usize,
            kc: usize,
            acc: &mut [[$v; 2]; MR],
        ) {
            let mut a = [[$zero(); 2]; M];
            let line = if BF16 { 64 } else { 128 };
            for kk in k0..k0 + kc {
                if H == 0 {
                    // Prefetching never faults; the address is formed with wrapping arithmetic.
                    _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add((kk + PREFETCH_TILE) * line).cast());
                }
                let (lo, hi) = load::<BF16, H>(w, kk);
                for r in 0..M {
                    let xb = $splat(*x.add(r * ldx + kk));
                    a[r][0] = $fmadd(xb, lo, a[r][0]);
                    a[r][1] = $fmadd(xb, hi, a[r][1]);
                }
            }
            acc[..M].copy_from_slice(&a);
        }

        /// One x row, half H, over the whole of k: a memory-bound stream with prefetch, in `KC` blocks
        /// summed as the GEMM path sums them (so a row's outputs do not depend on how many rows its
        /// call has).
        #[target_feature(enable = $f)]
        #[inline]
        unsafe fn one_row<const BF16: bool, const H: usize>(
            x: *const f32,
            w: *const u8,
            k: usize,
        ) -> [$v; 2] {
            let line = if BF16 { 64 } else { 128 };
            let mut total = [$zero(); 2];
            let mut k0 = 0;
            while k0 < k {
                let end = (k0 + KC).min(k);
                let (mut a0, mut a1) = ($zero(), $zero());
                for kk in k0..end {
                    if H == 0 {
                        _mm_prefetch::<_MM_HINT_T1>(w.wrapping_add((kk + PREFETCH_ONE) * line).cast());
                    }
                    let (lo, hi) = load::<BF16, H>(w, kk);
                    let xb = $splat(*x.add(kk));
                    a0 = $fmadd(xb, lo, a0);
                    a1 = $fmadd(xb, hi, a1);
                }
                total = if k0 == 0 {
                    [a0, a1]
                } else {
                    [$add(total[0], a0), $add(total[1], a1)]
                };
                k0 = end;
            }
            total
        }

        /// # Safety
        /// The CPU must support this tier's features; `job` must satisfy `panel_linear`'s length
        /// contract; no other thread may write the columns of `panels` concurrently.
        pub unsafe fn panels(job: &Job<'_>, panels: Range<usize>) {
            match job.w {
                PanelWeight::Bf16 { data, .. } => run::<true>(job, data.as_ptr().cast(), panels),
                PanelWeight::F32 { data, .. } => run::<false>(job, data.as_ptr().cast(), panels),
            }
        }

        #[target_feature(enable = $f)]
        unsafe fn run<const BF16: bool>(job: &Job<'_>, base: *const u8, panels: Range<usize>) {
            let esize = if BF16 { 2 } else { 4 };
            for p in panels {
                let w = base.add(p * job.w.k() * PANEL * esize);
                $(run_half::<BF16, $h>(job, w, p * PANEL);)+
            }
        }

        /// Half H of the panel at `w` (outputs from column `col`) for every x row.
        #[target_feature(enable = $f)]
        #[inline]
        unsafe fn run_half<const BF16: bool, const H: usize>(job: &Job<'_>, w: *const u8, col: usize) {
            let (m, k) = (job.m, job.w.k());
            let x = job.x.as_ptr();
            if m == 1 {
                store::<H>(job, 0, col, one_row::<BF16, H>(x, w, k), false, true);
                return;
            }
            let mut k0 = 0;
            while k0 < k {
                let kb = KC.min(k - k0);
                let last = k0 + kb == k;
                let mut i = 0;
                while i < m {
                    let rows = (m - i).min(MR);
                    let mut acc = [[$zero(); 2]; MR];
                    let f = match rows {
                        $($rows => micro::<BF16, H, $rows>,)+
                        _ => micro::<BF16, H, 1>,
                    };
                    f(x.add(i * k), k, w, k0, kb, &mut acc);
                    for (r, a) in acc.iter().take(rows).enumerate() {
                        store::<H>(job, i + r, col, *a, k0 > 0, last);
                    }
                    i += rows;
                }
                k0 += kb;
            }
        }
    };
}
pub(super) use panel_tier;
