//! Code both SIMD tiers run with their own intrinsics, written once: each macro here is stamped
//! into the AVX2 and the AVX-512 tier, so every intrinsic sits (and inlines) in that tier's own
//! `#[target_feature]` function exactly as a hand-written copy would, with no generic layer between.
//!
//! Numerical contract: each macro is the operations its doc lists, in that order; the tiers differ
//! only in vector width and in what they pass in (loads, masks, how exp clamps and scales).
//! `exp_poly`: with n = round(x log2 e) given, r = x - n ln2 in two steps (ln2 split into
//! 0.693359375 and -2.12194440e-4, so the first product is exact), then 1 + r + r^2 P(r) with
//! Cephes' degree-5 P.

/// Stamps the one-row score loop both SIMD tiers run, from one text: out[s] = dot(q, k_s) for s in
/// from..keys (q the row's d values, k_s at k + s*ldk), keys in groups of 8 (`dot_keys::<8>` then `hsum8`, an 8-float
/// store) and then one at a time (`dot_keys::<1>` then `hsum`), the accumulators starting at the
/// tier's `$zero()` vector. `dot_keys`, `hsum8` and `hsum` are the calling tier's. Expands to unsafe code (raw
/// pointers).
macro_rules! row_scores {
    ($zero:ident, $q:expr, $k:expr, $ldk:expr, $from:expr, $keys:expr, $out:expr) => {{
        let (qr, kp, ldk, keys, out) = ($q, $k, $ldk, $keys, $out);
        let mut s = $from;
        while s + 8 <= keys {
            let mut acc = [$zero(); 8];
            dot_keys::<8>(qr, kp.add(s * ldk), ldk, &mut acc);
            _mm256_storeu_ps(out.add(s), hsum8(&acc));
            s += 8;
        }
        while s < keys {
            let mut acc = [$zero(); 1];
            dot_keys::<1>(qr, kp.add(s * ldk), ldk, &mut acc);
            *out.add(s) = hsum(acc[0]);
            s += 1;
        }
    }};
}
pub(crate) use row_scores;

/// 1 + r + r^2 P(r) for r = x - n ln2 (see the module doc), from the tier's intrinsics.
macro_rules! exp_poly {
    ($x:expr, $n:expr, $set1:ident, $fmadd:ident, $fnmadd:ident, $mul:ident, $add:ident) => {{
        let (x, n) = ($x, $n);
        let r = $fnmadd(n, $set1(0.693_359_4), x);
        let r = $fnmadd(n, $set1(-2.121_944_4e-4), r);
        let mut y = $set1(1.987_569_1e-4);
        for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
            y = $fmadd(y, r, $set1(c));
        }
        $add($fmadd(y, $mul(r, r), r), $set1(1.0))
    }};
}
pub(crate) use exp_poly;

/// The even/odd key walk of a one-row `pv_block`: for each pair of keys, `$even[c] += p[2i] *
/// v_2i` and `$odd[c] += p[2i+1] * v_2i+1` for c < $n (one FMA each), then an odd last key into
/// `$even`. `|ptr, c| load` loads vector c of the V row at `ptr` (the tier's masked load); `$v` is
/// the first V row, `$ldv` the row stride. Expands to unsafe code (raw pointers).
macro_rules! even_odd_keys {
    ($p:expr, $v:expr, $ldv:expr, $n:expr, $even:ident, $odd:ident, $set1:ident, $fmadd:ident,
     |$ptr:ident, $c:ident| $load:expr) => {{
        let (mut row, ldv) = ($v, $ldv);
        let pairs = $p.chunks_exact(2);
        let last = pairs.remainder();
        for pair in pairs {
            let (p0, p1) = ($set1(pair[0]), $set1(pair[1]));
            for $c in 0..$n {
                let v0 = {
                    let $ptr = row;
                    $load
                };
                let v1 = {
                    let $ptr = row.add(ldv);
                    $load
                };
                $even[$c] = $fmadd(p0, v0, $even[$c]);
                $odd[$c] = $fmadd(p1, v1, $odd[$c]);
            }
            row = row.add(2 * ldv);
        }
        if let [pl] = *last {
            let pb = $set1(pl);
            for $c in 0..$n {
                let v0 = {
                    let $ptr = row;
                    $load
                };
                $even[$c] = $fmadd(pb, v0, $even[$c]);
            }
        }
    }};
}
pub(crate) use even_odd_keys;
