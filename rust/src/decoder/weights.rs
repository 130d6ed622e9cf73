//! The decoder's weights, owned by the decoder (copied in once, so nothing the caller frees or
//! replaces later can leave a dangling pointer): plain matrices and vectors, one struct per layer.
//!
//! Matrices are stored in the checkpoint's own dtype (bf16 or f32; the caller decides whether a
//! bf16-exact f32 matrix is stored as bf16), packed into column panels. Norm weights and biases are f32 (bf16 values widen
//! exactly). Fused projections: q/k/v rows stacked as [q; k; v], gate/up as [gate; up].

use crate::panel::PanelWeight;

/// A [rows, cols] weight matrix, packed into column panels once (`panel.rs`): the layout every
/// decoder linear reads, whatever its batch size.
#[derive(Clone, Debug)]
pub struct Mat(pub PanelWeight);

impl Mat {
    pub fn from_bf16(data: &[u16], rows: usize, cols: usize) -> Mat {
        Mat(PanelWeight::from_bf16(data, rows, cols))
    }

    pub fn from_f32(data: &[f32], rows: usize, cols: usize) -> Mat {
        Mat(PanelWeight::from_f32(data, rows, cols))
    }

    pub fn rows(&self) -> usize {
        self.0.n()
    }

    pub fn cols(&self) -> usize {
        self.0.k()
    }

    pub fn is_bf16(&self) -> bool {
        matches!(self.0, PanelWeight::Bf16 { .. })
    }

    /// Bytes read per pass over the matrix.
    pub fn bytes(&self) -> usize {
        self.0.bytes()
    }

    /// Row `r` widened to f32 into `out` (embedding lookup).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        self.0.row_f32(r, out)
    }
}

/// One transformer layer.
#[derive(Clone, Debug)]
pub struct Layer {
    pub attn_norm: Vec<f32>,
    /// [q_width + 2 * kv_width, hidden]
    pub wqkv: Mat,
    pub bqkv: Option<Vec<f32>>,
    /// [hidden, q_width]
    pub wo: Mat,
    pub bo: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    /// [2 * intermediate, hidden]
    pub w_gate_up: Mat,
    pub b_gate_up: Option<Vec<f32>>,
    /// [hidden, intermediate]
    pub w_down: Mat,
    pub b_down: Option<Vec<f32>>,
}

/// The whole model.
#[derive(Clone, Debug)]
pub struct Weights {
    /// [vocab, hidden]
    pub embed: Mat,
    pub layers: Vec<Layer>,
    pub final_norm: Vec<f32>,
    /// [vocab, hidden]; None when tied to `embed`.
    pub lm_head: Option<Mat>,
}

impl Weights {
    pub fn lm_head(&self) -> &Mat {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Weight bytes read per decode step (every matrix once; the embedding row lookup is
    /// negligible unless it is also the lm_head).
    pub fn bytes_per_token(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes())
            .sum();
        layers + self.lm_head().bytes()
    }
}
