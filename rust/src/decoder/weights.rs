//! The decoder's weights, owned by the decoder (copied in once, so nothing the caller frees or
//! replaces later can leave a dangling pointer): plain matrices and vectors, one struct per layer.
//!
//! Matrices are stored in the checkpoint's own dtype (bf16 or f32; the caller decides whether a
//! bf16-exact f32 matrix is stored as bf16). Norm weights and biases are f32 (bf16 values widen
//! exactly). Fused projections: q/k/v rows stacked as [q; k; v], gate/up as [gate; up].

use crate::linear::Weight;

/// A row-major [rows, cols] weight matrix.
#[derive(Clone, Debug)]
pub enum Mat {
    Bf16 {
        data: Vec<u16>,
        rows: usize,
        cols: usize,
    },
    F32 {
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    },
}

impl Mat {
    pub fn rows(&self) -> usize {
        match self {
            Mat::Bf16 { rows, .. } | Mat::F32 { rows, .. } => *rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Mat::Bf16 { cols, .. } | Mat::F32 { cols, .. } => *cols,
        }
    }

    pub fn weight(&self) -> Weight<'_> {
        match self {
            Mat::Bf16 { data, .. } => Weight::Bf16(data),
            Mat::F32 { data, .. } => Weight::F32(data),
        }
    }

    /// Bytes read per pass over the matrix.
    pub fn bytes(&self) -> usize {
        match self {
            Mat::Bf16 { data, .. } => data.len() * 2,
            Mat::F32 { data, .. } => data.len() * 4,
        }
    }

    /// Row `r` widened to f32 into `out` (embedding lookup).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        match self {
            Mat::Bf16 { data, cols, .. } => {
                crate::bf16::bf16_slice_to_f32(&data[r * cols..(r + 1) * cols], out)
            }
            Mat::F32 { data, cols, .. } => out.copy_from_slice(&data[r * cols..(r + 1) * cols]),
        }
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
