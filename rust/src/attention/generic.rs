//! Portable scalar attention primitives; the test oracle for the SIMD tiers.
//!
//! Numerical contract: f32 throughout. Dots accumulate in 8 interleaved partial sums like the
//! linear generic tier; exp is `f32::exp` (libm, within 1 ulp); sums are sequential.

use super::{PvArgs, QkArgs};
use crate::bf16::bf16_slice_to_f32;
use crate::linear::generic_dot as dot;

/// The scores `args` describes: scores[r*lds + s] = dot(q[r*d..][..d], k[s*ldk..][..d]).
pub fn qk(args: QkArgs<'_>) {
    let QkArgs {
        q,
        rows,
        k,
        ldk,
        keys,
        d,
        scores,
        lds,
    } = args;
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

/// The weighted sums `args` describes: `pv` on each row.
pub fn pv_rows(mut args: PvArgs<'_>) {
    let PvArgs {
        rows, v, ldv, d, ..
    } = args;
    for r in 0..rows {
        let (p, acc) = args.row(r);
        pv(p, v, ldv, d, acc);
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

/// dst[i] = scale * codes[i] in f32 (one rounding: the product), the reference of every tier.
pub fn widen_q8(codes: &[i8], scale: f32, dst: &mut [f32]) {
    assert_eq!(codes.len(), dst.len(), "widen_q8: length mismatch");
    for (o, &c) in dst.iter_mut().zip(codes) {
        *o = scale * c as f32;
    }
}
