//! The decoder's linear: one call for a matrix stored as float panels (`panel`), quantized (`quant`) or as runs
//! of rows in different formats (`parts`), and a group of independent ones (a mixture's experts) in one
//! parallel region per storage kind.
//! Numerical contract: `panel_linear`'s, `quant_linear`'s and `parts_linear`'s; a grouped item gives `lin`'s
//! bits alone.

use super::parts::parts_linear;
use super::weights::Mat;
use crate::isa::Isa;
use crate::par::Parallel;
use crate::preserve_linear::panel_linear;
use crate::quant::quant_linear;

/// y[..m * n] = x[..m * k] w^T (+ b), for a matrix stored either way.
pub fn lin(
    isa: Isa,
    par: &dyn Parallel,
    x: &[f32],
    m: usize,
    w: &Mat,
    b: Option<&[f32]>,
    y: &mut [f32],
) {
    let (n, k) = (w.rows(), w.cols());
    let (x, y) = (&x[..m * k], &mut y[..m * n]);
    match w {
        Mat::Panel(p) => panel_linear(isa, par, x, m, p, b, y),
        Mat::Quant(q) => quant_linear(isa, par, x, m, q, b, y),
        Mat::Parts(ps) => parts_linear(isa, par, x, m, ps, b, y),
    }
}

/// One linear of a group (`lin_group`): y[..m * n] = x[..m * k] w^T, no bias.
pub struct LinItem<'a> {
    pub x: &'a [f32],
    pub m: usize,
    pub w: &'a Mat,
    pub y: &'a mut [f32],
}

/// Independent linears (a mixture's experts) in one parallel region per storage kind; each result is
/// bit-identical to `lin` of that item alone.
pub fn lin_group(isa: Isa, par: &dyn Parallel, items: Vec<LinItem<'_>>) {
    let mut panels = Vec::new();
    let mut quants = Vec::new();
    for it in items {
        let (n, k, m) = (it.w.rows(), it.w.cols(), it.m);
        let (x, y) = (&it.x[..m * k], &mut it.y[..m * n]);
        match it.w {
            Mat::Panel(w) => panels.push(crate::preserve_linear::GroupItem { x, m, w, y }),
            Mat::Quant(w) => quants.push(crate::quant::GroupItem { x, m, w, y }),
            // Not a mixture's layout (GGUF experts are refused); run alone, as `lin`.
            Mat::Parts(ps) => parts_linear(isa, par, x, m, ps, None, y),
        }
    }
    if !panels.is_empty() {
        crate::preserve_linear::panel_linear_group(isa, par, &mut panels);
    }
    if !quants.is_empty() {
        crate::quant::quant_linear_group(isa, par, &mut quants);
    }
}
