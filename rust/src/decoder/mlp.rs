//! One MLP, dense or an expert: down(act(gate h) * up h) or down(act(up h)), the gated activation on every
//! thread by rows; a quantized down projection computes it row by row while quantizing its input
//! (`quant_linear_gated`), never writing the hidden rows. Numerical contract: the linears' (`linear.rs`)
//! and `vmath`'s activations, float32 throughout; either way of the gated activation gives the same bits.

use super::ctx::MIN_ROW_VALUES;
use super::linear::lin;
use super::recipe::Recipe;
use super::weights::Mat;
use crate::isa::Isa;
use crate::par::{rows_mut, Parallel};
use crate::quant::quant_linear_gated;
use crate::vmath;

/// One MLP (dense or an expert): down(act(gate h) * up h) or down(act(up h)), over `m` rows of `input`
/// into `out` ([m][hidden]); `gu` and `act` hold the intermediate rows.
#[allow(clippy::too_many_arguments)]
pub fn ffn(
    r: &Recipe,
    isa: Isa,
    par: &dyn Parallel,
    mats: (&Mat, Option<&[f32]>, &Mat, Option<&[f32]>),
    input: &[f32],
    gu: &mut [f32],
    act: &mut [f32],
    out: &mut [f32],
    m: usize,
) {
    let (up, up_bias, down, down_bias) = mats;
    let i = down.cols();
    lin(isa, par, input, m, up, up_bias, gu);
    let hidden: &[f32] = if r.mlp.gated {
        let gu = &gu[..m * 2 * i];
        if let Mat::Quant(q) = down {
            // The hidden rows go straight into the down projection's activation codes.
            let out = &mut out[..m * down.rows()];
            return quant_linear_gated(isa, par, gu, r.mlp.act, m, q, down_bias, out);
        }
        rows_mut(par, &mut act[..m * i], i, MIN_ROW_VALUES, &|i0, out| {
            for (row, o) in gu[i0 * 2 * i..]
                .chunks_exact(2 * i)
                .zip(out.chunks_exact_mut(i))
            {
                let (g, u) = row.split_at(i);
                vmath::act_mul(isa, r.mlp.act, g, u, o);
            }
        });
        &act[..m * i]
    } else {
        vmath::act_in_place(isa, r.mlp.act, &mut gu[..m * i]);
        &gu[..m * i]
    };
    lin(isa, par, hidden, m, down, down_bias, out);
}
