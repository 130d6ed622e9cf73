//! Vectorised elementwise math for the decoder: activations (SiLU, GELU with tanh or erf, ReLU), and
//! soft-capping `cap * tanh(x / cap)` (Gemma 2's attention scores and final logits). One file per
//! instruction set with the same function names; `generic` is the scalar reference and test oracle.
//!
//! Numerical contract: each function performs, per element, the operations torch's own CPU kernels
//! perform, in the same order (so the only differences are in `exp`, `tanh` and `erf`):
//!   silu(x)       = x / (1 + exp(-x))
//!   gelu_tanh(x)  = (0.5 * x) * (1 + tanh(b * (x + 0.044715 * (x * x * x)))),  b = f32(sqrt(2 / pi))
//!                   (`gelu_pytorch_tanh`; HF's `gelu_new` is the same operations in Python)
//!   gelu_erf(x)   = (x * 0.5) * (1 + erf(x * f32(1 / sqrt 2)))
//!   relu(x)       = max(x, 0) (NaN stays NaN)
//!   softcap(x, c) = tanh(x / c) * c
//! The reference evaluates exp/tanh with libm and erf to f32 accuracy. The SIMD tiers use a
//! Cephes-style exp (a few ulp), a Cephes tanh (odd polynomial below |x| = 0.625, else
//! 1 - 2 / (exp(2|x|) + 1): a few ulp), and for erf the Abramowitz-Stegun 7.1.26 form that torch's
//! own vectorised `erf` uses (absolute error <= 1.5e-7, so GELU-erf agrees with torch's to that).

pub mod generic;
mod stamp;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use crate::isa::Isa;
use serde::{Deserialize, Serialize};

/// An MLP activation, named as in the recipe (Hugging Face's `hidden_act` names map onto these).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Act {
    Silu,
    GeluTanh,
    GeluErf,
    Relu,
}

/// Calls the function `$f` of `isa`'s tier with the given arguments.
macro_rules! by_tier {
    ($isa:expr, $f:ident($($arg:expr),*)) => {
        match $isa {
            // SAFETY: the tier is supported (the callers' contract).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Amx => unsafe { avx512::$f($($arg),*) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::AvxVnni => unsafe { avx2::$f($($arg),*) },
            _ => generic::$f($($arg),*),
        }
    };
}

/// out[i] = act(g[i]) * u[i] (a gated MLP). Slices of equal length; `isa` must be supported by
/// this CPU (the decoder checks it once per step).
pub fn act_mul(isa: Isa, act: Act, g: &[f32], u: &[f32], out: &mut [f32]) {
    assert!(
        g.len() == u.len() && u.len() == out.len(),
        "act_mul: lengths differ"
    );
    by_tier!(isa, act_mul(act, g, u, out))
}

/// x[i] = act(x[i]) (a plain MLP).
pub fn act_in_place(isa: Isa, act: Act, x: &mut [f32]) {
    by_tier!(isa, act_in_place(act, x))
}

/// x[i] = tanh(x[i] / cap) * cap.
pub fn softcap(isa: Isa, x: &mut [f32], cap: f32) {
    by_tier!(isa, softcap(x, cap))
}
