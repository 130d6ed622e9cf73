//! The decoder's weights, owned by the decoder (copied in once, so nothing the caller frees or
//! replaces later can leave a dangling pointer): matrices and vectors keyed by the tensor table.
//!
//! Matrices are stored in the checkpoint's own dtype (bf16 or f32; the caller decides whether a
//! bf16-exact f32 matrix is stored as bf16), packed into column panels, or quantized to 8 or 4 bits
//! when the caller asks (`quant.rs`). Norm weights and biases are f32 (bf16 values widen
//! exactly). Fused projections: q/k/v rows stacked as [q; k; v], gate/up as [gate; up]; a fused matrix
//! whose parts come quantized in formats no one format holds exactly (a GGUF file's q/k in Q4_K beside
//! v in Q6_K) keeps each run of rows in its own format (`Mat::Parts`, `decoder/parts.rs`).

use super::tensors::{Tensor, TABLE};
use crate::preserve_linear::PanelWeight;
use crate::quant::{Format, QuantWeight};

/// How a matrix is stored. The name is the only code that crosses the FFI or is saved for it; the
/// quantized formats are `quant::Format`'s own list (one place to add a format).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatFormat {
    F32,
    Bf16,
    Quant(Format),
    /// Runs of rows in different quantized formats (`Mat::Parts`).
    Parts,
}

impl MatFormat {
    /// Every format, in the order the ABI lists them: the float panels, `Format::ALL`, then parts.
    pub fn all() -> impl Iterator<Item = MatFormat> {
        [MatFormat::F32, MatFormat::Bf16]
            .into_iter()
            .chain(Format::ALL.map(MatFormat::Quant))
            .chain([MatFormat::Parts])
    }

    pub fn name(self) -> &'static str {
        match self {
            MatFormat::F32 => "f32",
            MatFormat::Bf16 => "bf16",
            MatFormat::Quant(f) => f.name(),
            MatFormat::Parts => "parts",
        }
    }

    /// The quantized format it stores (None for the float panels and for parts).
    pub fn quant(self) -> Option<Format> {
        match self {
            MatFormat::Quant(f) => Some(f),
            _ => None,
        }
    }

    pub fn from_name(s: &str) -> Option<MatFormat> {
        MatFormat::all().find(|f| f.name() == s)
    }
}

/// A [rows, cols] weight matrix, packed once into the layout its kernel reads whatever the batch
/// size: column panels of bf16/f32 values (`preserve_linear.rs`), or 8-/4-bit codes (`quant.rs`).
#[derive(Clone, Debug)]
pub enum Mat {
    Panel(PanelWeight),
    Quant(QuantWeight),
    /// Runs of rows, in order, each quantized in its own format (at least two; every run but the last a
    /// whole number of 16-row panels; the same cols).
    Parts(Vec<QuantWeight>),
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
            Mat::Parts(ps) => ps.iter().map(QuantWeight::n).sum(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Mat::Panel(p) => p.k(),
            Mat::Quant(q) => q.k(),
            Mat::Parts(ps) => ps[0].k(),
        }
    }

    /// How the matrix is stored.
    pub fn format(&self) -> MatFormat {
        match self {
            Mat::Panel(PanelWeight::F32 { .. }) => MatFormat::F32,
            Mat::Panel(PanelWeight::Bf16 { .. }) => MatFormat::Bf16,
            Mat::Quant(q) => MatFormat::Quant(q.format),
            Mat::Parts(_) => MatFormat::Parts,
        }
    }

    /// The packed data as bytes, as `from_packed` takes it back.
    pub fn packed_bytes(&self) -> Vec<u8> {
        match self {
            Mat::Panel(p) => p.packed_bytes(),
            Mat::Quant(q) => q.packed_bytes().to_vec(),
            Mat::Parts(ps) => super::parts::to_bytes(ps),
        }
    }

    /// A matrix from its format and packed bytes (lengths and scales checked).
    pub fn from_packed(
        format: MatFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Mat, String> {
        if format == MatFormat::Parts {
            return super::parts::from_bytes(rows, cols, bytes).map(Mat::Parts);
        }
        match format.quant() {
            None => PanelWeight::from_packed(format == MatFormat::Bf16, bytes, rows, cols)
                .map(Mat::Panel),
            Some(f) => QuantWeight::from_packed(f, rows, cols, bytes.to_vec()).map(Mat::Quant),
        }
    }

    /// Bytes read per pass over the matrix.
    pub fn bytes(&self) -> usize {
        match self {
            Mat::Panel(p) => p.bytes(),
            Mat::Quant(q) => q.bytes(),
            Mat::Parts(ps) => ps.iter().map(QuantWeight::bytes).sum(),
        }
    }

    /// Row `r` widened (or dequantized) to f32 into `out` (embedding lookup).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        match self {
            Mat::Panel(p) => p.row_f32(r, out),
            Mat::Quant(q) => q.row_f32(r, out),
            Mat::Parts(ps) => {
                let mut r = r;
                for q in ps {
                    if r < q.n() {
                        return q.row_f32(r, out);
                    }
                    r -= q.n();
                }
                panic!("row past the matrix's rows");
            }
        }
    }
}

/// A stored tensor: a matrix (packed) or a vector (f32).
#[derive(Clone, Debug)]
pub enum Stored {
    Mat(Mat),
    Vec(Vec<f32>),
}

impl Stored {
    /// [rows, cols] as the table states shapes (vectors are [1, n]).
    pub fn shape(&self) -> [usize; 2] {
        match self {
            Stored::Mat(m) => [m.rows(), m.cols()],
            Stored::Vec(v) => [1, v.len()],
        }
    }
}

/// Every tensor of the model, keyed by the table (`tensors.rs`): model-level tensors, then each
/// layer's. Built by `Builder`, which checks that exactly the tensors the recipe has are present with
/// their shapes, so the accessors below may assume what the recipe says.
#[derive(Clone, Debug)]
pub struct Weights {
    model: Vec<Option<Stored>>,
    layers: Vec<Vec<Option<Stored>>>,
    /// A sparse layer's experts: [layer][expert] -> (up, down).
    experts: Vec<Vec<[Option<Mat>; 2]>>,
}

/// Index of a per-expert tensor in an expert's pair.
fn expert_slot(t: Tensor) -> usize {
    match t {
        Tensor::ExpertUp => 0,
        _ => 1,
    }
}

impl Weights {
    pub fn new(layers: usize) -> Weights {
        let n = TABLE.len();
        Weights {
            model: vec![None; n],
            layers: vec![vec![None; n]; layers],
            experts: vec![Vec::new(); layers],
        }
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    fn slot(&self, t: Tensor, layer: usize) -> Option<&Stored> {
        if t.spec().per_layer {
            self.layers.get(layer)?[t as usize].as_ref()
        } else {
            self.model[t as usize].as_ref()
        }
    }

    /// Stores `s` as tensor `t` of `layer` and `expert` (each ignored where the tensor has none; in
    /// range otherwise: the builder checks it; a per-expert tensor must be a matrix).
    pub fn put(&mut self, t: Tensor, layer: usize, expert: usize, s: Stored) {
        if t.spec().per_expert {
            let list = &mut self.experts[layer];
            if list.len() <= expert {
                list.resize(expert + 1, [None, None]);
            }
            if let Stored::Mat(m) = s {
                list[expert][expert_slot(t)] = Some(m);
            }
        } else if t.spec().per_layer {
            self.layers[layer][t as usize] = Some(s);
        } else {
            self.model[t as usize] = Some(s);
        }
    }

    /// Tensor `t` of `layer` (not a per-expert tensor: see `get_at`).
    pub fn get(&self, t: Tensor, layer: usize) -> Option<&Stored> {
        self.slot(t, layer)
    }

    /// The shape of tensor `t` of `layer` and `expert` as stored, or None when it is not.
    pub fn shape_at(&self, t: Tensor, layer: usize, expert: usize) -> Option<[usize; 2]> {
        if t.spec().per_expert {
            self.expert_mat(t, layer, expert)
                .map(|m| [m.rows(), m.cols()])
        } else {
            self.slot(t, layer).map(Stored::shape)
        }
    }

    /// A matrix anywhere in the table (per-expert ones included), when stored.
    pub fn mat_at(&self, t: Tensor, layer: usize, expert: usize) -> Option<&Mat> {
        if t.spec().per_expert {
            self.expert_mat(t, layer, expert)
        } else {
            self.mat_opt(t, layer)
        }
    }

    /// A per-expert matrix (`Tensor::ExpertUp` / `ExpertDown`) of `layer`'s `expert`, when stored.
    pub fn expert_mat(&self, t: Tensor, layer: usize, expert: usize) -> Option<&Mat> {
        self.experts.get(layer)?.get(expert)?[expert_slot(t)].as_ref()
    }

    /// Expert `e` of sparse layer `l`: (up, down), which the recipe guarantees.
    pub fn expert(&self, l: usize, e: usize) -> (&Mat, &Mat) {
        let pair = &self.experts[l][e];
        match pair {
            [Some(u), Some(d)] => (u, d),
            _ => panic!("expert {e} of layer {l} is missing"),
        }
    }

    /// Matrix `t` of `layer`, when present.
    pub fn mat_opt(&self, t: Tensor, layer: usize) -> Option<&Mat> {
        match self.slot(t, layer) {
            Some(Stored::Mat(m)) => Some(m),
            _ => None,
        }
    }

    /// Matrix `t` of `layer`, which the recipe guarantees (`Builder::build` checked it).
    pub fn mat(&self, t: Tensor, layer: usize) -> &Mat {
        self.mat_opt(t, layer)
            .unwrap_or_else(|| panic!("{} of layer {layer} is missing", t.spec().name))
    }

    /// Vector `t` of `layer`, when present.
    pub fn vec(&self, t: Tensor, layer: usize) -> Option<&[f32]> {
        match self.slot(t, layer) {
            Some(Stored::Vec(v)) => Some(v),
            _ => None,
        }
    }

    pub fn embed(&self) -> &Mat {
        self.mat(Tensor::Embed, 0)
    }

    pub fn lm_head(&self) -> &Mat {
        self.mat_opt(Tensor::LmHead, 0)
            .unwrap_or_else(|| self.embed())
    }

    /// Weight bytes read per decode step: every matrix multiplied once (the embedding and position
    /// rows looked up are negligible unless the embedding is also the lm_head); a sparse layer reads
    /// its router and `top_k` of its experts (their mean size: experts may be stored differently).
    pub fn bytes_per_token(&self, top_k: usize) -> usize {
        let mut n = self.lm_head().bytes();
        for t in [Tensor::ProjIn, Tensor::ProjOut] {
            n += self.mat_opt(t, 0).map_or(0, Mat::bytes);
        }
        for l in 0..self.layers.len() {
            for t in [
                Tensor::Qkv,
                Tensor::O,
                Tensor::Up,
                Tensor::Down,
                Tensor::Router,
            ] {
                n += self.mat_opt(t, l).map_or(0, Mat::bytes);
            }
            n += self.active_expert_bytes(l, top_k);
        }
        n
    }

    /// Bytes of `top_k` of layer `l`'s experts (their mean size times k; 0 for a dense layer).
    pub fn active_expert_bytes(&self, l: usize, top_k: usize) -> usize {
        let list = &self.experts[l];
        if list.is_empty() {
            return 0;
        }
        let all: usize = list.iter().flatten().flatten().map(Mat::bytes).sum();
        all * top_k / list.len()
    }
}
