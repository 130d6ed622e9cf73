//! Scalar reference of `vmath` (see its header for the formulas): libm's exp and tanh, and erf
//! evaluated in f64 to better than f32 accuracy.

use super::Act;

/// f32(sqrt(2 / pi)), as torch rounds `M_SQRT2 * M_2_SQRTPI * 0.5`.
pub const GELU_BETA: f32 = 0.797_884_6;
pub const GELU_KAPPA: f32 = 0.044_715;

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn gelu_tanh(x: f32) -> f32 {
    let inner = GELU_BETA * (x + GELU_KAPPA * (x * x * x));
    0.5 * x * (1.0 + inner.tanh())
}

pub fn gelu_erf(x: f32) -> f32 {
    x * 0.5 * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

pub fn relu(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// erf(x) rounded once to f32: the Maclaurin series in f64 below |x| = 4 (its largest term is
/// ~4e6 there, so ~9 of f64's 16 digits survive the cancellation, more than f32 keeps), and
/// +-1 beyond (erfc(4) = 1.5e-8 is below half an f32 step under 1).
pub fn erf(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = (x as f64).abs();
    if a >= 4.0 {
        return 1.0f32.copysign(x);
    }
    let z = a * a;
    let (mut term, mut sum) = (a, a);
    for n in 1..200 {
        term *= -z / n as f64;
        let t = term / (2 * n + 1) as f64;
        sum += t;
        if t.abs() < 1e-17 * sum.abs() {
            break;
        }
    }
    ((sum * std::f64::consts::FRAC_2_SQRT_PI) as f32).copysign(x)
}

fn apply(act: Act) -> fn(f32) -> f32 {
    match act {
        Act::Silu => silu,
        Act::GeluTanh => gelu_tanh,
        Act::GeluErf => gelu_erf,
        Act::Relu => relu,
    }
}

pub fn act_mul(act: Act, g: &[f32], u: &[f32], out: &mut [f32]) {
    let f = apply(act);
    for ((o, &gv), &uv) in out.iter_mut().zip(g).zip(u) {
        *o = f(gv) * uv;
    }
}

pub fn act_in_place(act: Act, x: &mut [f32]) {
    let f = apply(act);
    for v in x {
        *v = f(*v);
    }
}

pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = (*v / cap).tanh() * cap;
    }
}
