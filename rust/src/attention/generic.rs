//! Portable scalar attention primitives; the test oracle for the SIMD tiers.
//!
//! Numerical contract: f32 throughout. Dots accumulate in 8 interleaved partial sums like the
//! linear generic tier; exp is `f32::exp` (libm, within 1 ulp); sums are sequential.

use crate::bf16::bf16_slice_to_f32;
use crate::linear::generic_dot as dot;

/// scores[r*lds + s] = dot(q[r*d..][..d], k[s*ldk..][..d]) for r < rows, s < keys.
#[allow(clippy::too_many_arguments)] // same shape as the SIMD tiers
pub fn qk(
    q: &[f32],
    rows: usize,
    k: &[f32],
    ldk: usize,
    keys: usize,
    d: usize,
    scores: &mut [f32],
    lds: usize,
) {
    for r in 0..rows {
        let qr = &q[r * d..(r + 1) * d];
        for s in 0..keys {
            scores[r * lds + s] = dot(qr, &k[s * ldk..s * ldk + d]);
        }
    }
}

/// acc[..d] += sum over s < p.len() of p[s] * v[s*ldv..][..d], keys in order.
pub fn pv(p: &[f32], v: &[f32], ldv: usize, d: usize, acc: &mut [f32]) {
    assert_eq!(acc.len(), d, "pv: acc must hold exactly d values");
    for (s, &ps) in p.iter().enumerate() {
        for (a, &x) in acc.iter_mut().zip(&v[s * ldv..s * ldv + d]) {
            *a += ps * x;
        }
    }
}

/// acc[r*d..][..d] += sum over s < keys of p[r*lds + s] * v[s*ldv..][..d] for r < rows: `pv` per row.
#[allow(clippy::too_many_arguments)] // same shape as the SIMD tiers
pub fn pv_rows(
    p: &[f32],
    lds: usize,
    rows: usize,
    keys: usize,
    v: &[f32],
    ldv: usize,
    d: usize,
    acc: &mut [f32],
) {
    for r in 0..rows {
        pv(
            &p[r * lds..r * lds + keys],
            v,
            ldv,
            d,
            &mut acc[r * d..(r + 1) * d],
        );
    }
}

/// row[i] = exp(row[i] - max(row)); returns (max, sum of the new values).
pub fn exp_sum(row: &mut [f32]) -> (f32, f32) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for x in row.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    (max, sum)
}

/// dst[i] = widened src[i].
pub fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    bf16_slice_to_f32(src, dst);
}
