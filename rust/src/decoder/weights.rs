//! The decoder's weights, owned by the decoder (copied in once, so nothing the caller frees or
//! replaces later can leave a dangling pointer): plain matrices and vectors, one struct per layer.
//!
//! Matrices are stored in the checkpoint's own dtype (bf16 or f32; the caller decides whether a
//! bf16-exact f32 matrix is stored as bf16), packed into column panels, or quantized to 8 or 4 bits
//! when the caller asks (`quant.rs`). Norm weights and biases are f32 (bf16 values widen
//! exactly). Fused projections: q/k/v rows stacked as [q; k; v], gate/up as [gate; up].

use crate::panel::PanelWeight;
use crate::quant::{Format, QuantWeight};

/// A [rows, cols] weight matrix, packed once into the layout its kernel reads whatever the batch
/// size: column panels of bf16/f32 values (`panel.rs`), or 8-/4-bit codes (`quant.rs`).
#[derive(Clone, Debug)]
pub enum Mat {
    Panel(PanelWeight),
    Quant(QuantWeight),
}

impl Mat {
    pub fn from_bf16(data: &[u16], rows: usize, cols: usize) -> Mat {
        Mat::Panel(PanelWeight::from_bf16(data, rows, cols))
    }

    pub fn from_f32(data: &[f32], rows: usize, cols: usize) -> Mat {
        Mat::Panel(PanelWeight::from_f32(data, rows, cols))
    }

    pub fn rows(&self) -> usize {
        match self {
            Mat::Panel(p) => p.n(),
            Mat::Quant(q) => q.n(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Mat::Panel(p) => p.k(),
            Mat::Quant(q) => q.k(),
        }
    }

    /// The storage format's name: "bf16", "f32", "q8" or "q4".
    pub fn format_name(&self) -> &'static str {
        match self {
            Mat::Panel(PanelWeight::Bf16 { .. }) => "bf16",
            Mat::Panel(PanelWeight::F32 { .. }) => "f32",
            Mat::Quant(q) => q.format.name(),
        }
    }

    /// Format code of a saved matrix: 0 f32, 1 bf16, 2 q8, 3 q4.
    pub fn format_code(&self) -> i32 {
        match self {
            Mat::Panel(PanelWeight::F32 { .. }) => 0,
            Mat::Panel(PanelWeight::Bf16 { .. }) => 1,
            Mat::Quant(q) if q.format == Format::Q8 => 2,
            Mat::Quant(_) => 3,
        }
    }

    /// The packed data as bytes, as `from_packed` takes it back.
    pub fn packed_bytes(&self) -> Vec<u8> {
        match self {
            Mat::Panel(p) => p.packed_bytes(),
            Mat::Quant(q) => q.packed_bytes().to_vec(),
        }
    }

    /// A matrix from its saved format code and packed bytes.
    pub fn from_packed(code: i32, rows: usize, cols: usize, bytes: &[u8]) -> Result<Mat, String> {
        match code {
            0 | 1 => PanelWeight::from_packed(code == 1, bytes, rows, cols).map(Mat::Panel),
            2 | 3 => {
                let f = if code == 2 { Format::Q8 } else { Format::Q4 };
                QuantWeight::from_packed(f, rows, cols, bytes.to_vec()).map(Mat::Quant)
            }
            _ => Err(format!("unknown matrix format code {code}")),
        }
    }

    /// Bytes read per pass over the matrix.
    pub fn bytes(&self) -> usize {
        match self {
            Mat::Panel(p) => p.bytes(),
            Mat::Quant(q) => q.bytes(),
        }
    }

    /// Row `r` widened (or dequantized) to f32 into `out` (embedding lookup).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        match self {
            Mat::Panel(p) => p.row_f32(r, out),
            Mat::Quant(q) => q.row_f32(r, out),
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
