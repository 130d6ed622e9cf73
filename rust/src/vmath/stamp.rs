//! tanh, erf and the activations as both SIMD tiers compute them, written once: `lane_math!` stamps
//! them into a tier with its own vector type and intrinsics, so every intrinsic sits (and inlines)
//! in that tier's `#[target_feature]` functions exactly as a hand-written copy would.
//!
//! Numerical contract: the formulas of `vmath`'s header, each as the operations listed here in this
//! order; the tiers differ only in vector width and in the four helpers they pass (exp, |x|, sign
//! copy, select), which give the same bits in both.

/// Stamps `tanh`, `erf` and `activate` for one tier. `exp`, `abs`, `or_sign(large, x)` (large with x's
/// sign bit or-ed in) and `select_lt(a, b, yes, no)` (yes where a < b, else no) are the tier's
/// helpers; the list after `ops` names its set1, setzero, add, sub, mul, div, fmadd, and, xor and max.
macro_rules! lane_math {
    (features: $feat:literal, vector: $v:ty, exp: $exp:ident, abs: $abs:ident,
     or_sign: $or_sign:ident, select_lt: $select_lt:ident,
     ops: [$set1:ident, $zero:ident, $add:ident, $sub:ident, $mul:ident, $div:ident,
           $fmadd:ident, $and:ident, $xor:ident, $max:ident]) => {
        /// tanh(x): Cephes' odd polynomial below |x| = 0.625, else sign(x) * (1 - 2 / (exp(2|x|) + 1)).
        #[target_feature(enable = $feat)]
        #[inline]
        pub(crate) fn tanh(x: $v) -> $v {
            let ax = $abs(x);
            let z = $mul(x, x);
            let mut p = $set1(-5.704_988_7e-3);
            for c in [2.063_909e-2, -5.373_971_6e-2, 1.333_144_2e-1, -3.333_328e-1] {
                p = $fmadd(p, z, $set1(c));
            }
            let small = $fmadd($mul(p, z), x, x);
            let one = $set1(1.0);
            let e = $exp($add(ax, ax));
            let large = $sub(one, $div($set1(2.0), $add(e, one)));
            $select_lt(ax, $set1(0.625), small, $or_sign(large, x))
        }

        /// erf(x) as torch's vectorised erf computes it (Abramowitz-Stegun 7.1.26).
        #[target_feature(enable = $feat)]
        #[inline]
        fn erf(x: $v) -> $v {
            let neg_zero = $set1(-0.0);
            let one = $set1(1.0);
            let sign = $and(neg_zero, x);
            let ax = $abs(x);
            let t = $div(one, $fmadd($set1(0.327_591_1), ax, one));
            let mut r = $fmadd($set1(1.061_405_4), t, $set1(-1.453_152));
            for c in [1.421_413_7, -0.284_496_74, 0.254_829_6] {
                r = $fmadd(r, t, $set1(c));
            }
            let e = $exp($xor(neg_zero, $mul(x, x)));
            let y = $fmadd($mul($xor(neg_zero, e), t), r, one);
            $xor(sign, y)
        }

        /// act(x), the formulas of `vmath`'s header.
        #[target_feature(enable = $feat)]
        #[inline]
        fn activate(act: Act, x: $v) -> $v {
            let one = $set1(1.0);
            match act {
                Act::Silu => $div(x, $add(one, $exp($sub($zero(), x)))),
                Act::GeluTanh => {
                    let cube = $mul($mul(x, x), x);
                    let inner = $mul($set1(GELU_BETA), $add(x, $mul($set1(GELU_KAPPA), cube)));
                    let half_x = $mul($set1(0.5), x);
                    $mul(half_x, $add(one, tanh(inner)))
                }
                Act::GeluErf => {
                    let e = erf($mul(x, $set1(std::f32::consts::FRAC_1_SQRT_2)));
                    $mul($mul(x, $set1(0.5)), $add(one, e))
                }
                // max(x, 0) returns its second operand for NaN: put x second so NaN stays NaN.
                Act::Relu => $max($zero(), x),
            }
        }
    };
}
pub(crate) use lane_math;
