//! Weighted sums of an 8-bit cache's values as integer dot products. Per query row and chunk of 64 keys
//! (chunks at multiples of 64 positions, so a row's chunks never depend on the rows beside it), each
//! softmax numerator times its value row's scale is rounded to a 15-bit code under one scale, and the
//! codes multiply the value codes in exact i32 sums: `vpdpwssd` on AVX-512 VNNI (32 multiply-adds an
//! instruction against 16 for the f32 FMAs over widened values, and no widening), `vpmaddwd` on AVX2,
//! i32 loops in the scalar tier; every tier gives the same bits.
//!
//! Numerical contract, per row and chunk with at least one key seen (rows that see none are left as
//! they are): `w_s = p_s * vs_s` over the keys seen; `ws = max(w) / 32767` (NaN ignored); `inv = 1 / ws`
//! where ws is a normal float, else 0; `code_s = clamp(trunc(w_s * inv + 0.5), 0, 32767)` (0 for keys not
//! seen and for NaN); `isum_i = sum_s code_s * vcode_s,i` (exact: |isum| < 64 * 32767 * 128 < 2^31); then,
//! where ws > 0, `acc_i = acc_i + isum_i as f32 * ws` (two IEEE operations, no fusion). The rounding of
//! the numerators costs at most half a code: 1.5e-5 of the chunk's largest weight. The softmax denominator
//! stays the f32 sum of the numerators.

/// Codes per chunk: `block::KEY_CHUNK`.
pub(crate) const CHUNK: usize = 64;
/// Largest code of a weight.
pub(crate) const WMAX: f32 = 32767.0;
/// Largest head size the tiers' value tiles hold (Gemma 3's 256); larger heads take the f32 path.
pub(crate) const MAX_D: usize = 256;

/// Operands of `pv_q8`: acc[r*d..][..d] += the weighted sum of row r's seen keys of one chunk.
pub(crate) struct PvQ8Args<'a> {
    /// Softmax numerators: row r's for key s of the chunk at p[r*lds + s] (read only where seen).
    pub p: &'a [f32],
    pub lds: usize,
    /// Keys of the chunk each row sees, from..to (from >= to: none); one entry per row.
    pub seen: &'a [(usize, usize)],
    /// The chunk's value codes, `keys` rows of stride `ldv`.
    pub v: &'a [i8],
    pub ldv: usize,
    /// The value rows' scales, CHUNK entries (zero past `keys`).
    pub vs: &'a [f32; CHUNK],
    pub keys: usize,
    pub d: usize,
    pub acc: &'a mut [f32],
}

impl PvQ8Args<'_> {
    /// Whether there is work. Panics when a slice is shorter than the shape needs or a row's keys run
    /// past the chunk, so a tier may then read through raw pointers.
    #[inline]
    pub(crate) fn has_work(&self) -> bool {
        let rows = self.seen.len();
        if rows == 0 || self.keys == 0 {
            return false;
        }
        assert!(
            self.keys <= CHUNK && self.d <= MAX_D,
            "pv_q8: {} keys of {} dims exceed the chunk",
            self.keys,
            self.d
        );
        for (r, &(from, to)) in self.seen.iter().enumerate() {
            assert!(to <= self.keys, "pv_q8: row {r} sees past the chunk");
            assert!(
                from >= to || self.p.len() >= r * self.lds + to,
                "pv_q8: p too short"
            );
        }
        assert!(
            self.v.len() >= (self.keys - 1) * self.ldv + self.d,
            "pv_q8: v too short"
        );
        assert!(self.acc.len() >= rows * self.d, "pv_q8: acc too short");
        true
    }
}

/// The codes of one row's weights (the contract's rounding); returns the row's scale `ws`.
pub(crate) fn weights(
    p: &[f32],
    vs: &[f32; CHUNK],
    (from, to): (usize, usize),
) -> ([i32; CHUNK], f32) {
    let mut codes = [0i32; CHUNK];
    if from >= to {
        return (codes, 0.0);
    }
    let wmax = (from..to).fold(0.0f32, |m, s| m.max(p[s] * vs[s]));
    let ws = wmax / WMAX;
    let inv = if ws >= f32::MIN_POSITIVE {
        1.0 / ws
    } else {
        0.0
    };
    for s in from..to {
        codes[s] = ((p[s] * vs[s] * inv + 0.5) as i32).clamp(0, 32767);
    }
    (codes, ws)
}

/// The scalar tier and the reference of the others.
pub(crate) fn pv_q8(args: PvQ8Args<'_>) {
    if !args.has_work() {
        return;
    }
    let d = args.d;
    for (r, &seen) in args.seen.iter().enumerate() {
        if seen.0 >= seen.1 {
            continue;
        }
        let (codes, ws) = weights(&args.p[r * args.lds..], args.vs, seen);
        if ws <= 0.0 {
            continue;
        }
        for i in 0..d {
            let isum: i32 = (seen.0..seen.1)
                .map(|s| codes[s] * args.v[s * args.ldv + i] as i32)
                .sum();
            let a = &mut args.acc[r * d + i];
            *a += isum as f32 * ws;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{pv_q8, PvQ8Args, CHUNK};
    use crate::attention::tests::stream;
    use crate::attention::Ops;
    use crate::isa;

    /// Every tier's `pv_q8` against the scalar tier, bit for bit: head sizes on both sides of the
    /// tiles' 16 / 32 dims (up to Gemma's 256), key counts odd and even, rows seeing all, a prefix,
    /// a middle range or none of the chunk, weights spanning many binades (tiny ones round to 0), a
    /// row whose value scales are all zero, and accumulators that already hold sums.
    #[test]
    fn every_tier_equals_the_scalar_tier_bit_for_bit() {
        for tier in isa::supported() {
            let ops = Ops::of(tier);
            for d in [1, 8, 15, 16, 17, 33, 64, 80, 96, 128, 200, 256] {
                for keys in [1, 2, 3, 16, 31, 33, 63, 64] {
                    let rows = 7;
                    let (ldv, lds) = (d + 3, CHUNK + 5);
                    let v: Vec<i8> = stream(keys * ldv, d as u64)
                        .iter()
                        .map(|&x| (((x >> 40) % 255) as i32 - 127) as i8)
                        .collect();
                    let p: Vec<f32> = stream(rows * lds, keys as u64 + 1)
                        .iter()
                        .map(|&x| {
                            ((x >> 40) as f32 / (1u64 << 24) as f32).powi(((x & 7) * 3) as i32)
                        })
                        .collect();
                    let mut vs = [0.0f32; CHUNK];
                    for (s, o) in vs[..keys].iter_mut().enumerate() {
                        *o = 0.004 + s as f32 * 1e-4;
                    }
                    let seen: Vec<(usize, usize)> = vec![
                        (0, keys),
                        (0, keys.div_ceil(2)),
                        (keys / 3, keys - keys / 4),
                        (0, 0),
                        (keys - 1, keys),
                        (1.min(keys - 1), keys),
                        (0, 1),
                    ];
                    let acc0: Vec<f32> = stream(rows * d, 9)
                        .iter()
                        .map(|&x| (x >> 50) as f32 * 1e-3 - 4.0)
                        .collect();
                    let run = |f: unsafe fn(PvQ8Args<'_>), vs: &[f32; CHUNK]| {
                        let mut acc = acc0.clone();
                        // SAFETY: the tier is supported; the slices cover the shapes (has_work checks).
                        unsafe {
                            f(PvQ8Args {
                                p: &p,
                                lds,
                                seen: &seen,
                                v: &v,
                                ldv,
                                vs,
                                keys,
                                d,
                                acc: &mut acc,
                            })
                        };
                        acc.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                    };
                    for (vs, zero) in [(vs, false), ([0.0; CHUNK], true)] {
                        let want = run(pv_q8, &vs);
                        let got = run(ops.pv_q8, &vs);
                        assert_eq!(got, want, "{} d {d} keys {keys}", tier.name());
                        let unchanged = acc0.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        // Zero scales add nothing; otherwise row 0 is its f32 weighted sum within the codes' rounding.
                        assert_eq!(want == unchanged, zero, "d {d} keys {keys}");
                        for i in 0..d {
                            let f: f32 = (0..keys)
                                .map(|s| p[s] * vs[s] * v[s * ldv + i] as f32)
                                .sum();
                            let wmax = (0..keys).fold(0.0f32, |m, s| m.max(p[s] * vs[s]));
                            let got = f32::from_bits(want[i]) - acc0[i];
                            assert!(
                                (got - f).abs() <= wmax * 127.0 * keys as f32 / 32767.0 + 1e-3,
                                "d {d} keys {keys} dim {i}"
                            );
                        }
                    }
                }
            }
        }
    }
}
