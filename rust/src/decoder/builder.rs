//! Assembles a `Decoder` from tensors handed over one at a time (by the C entry points), copying
//! each into decoder-owned memory, and names whatever is missing or mis-shaped when it is built.

use super::config::Config;
use super::weights::{Layer, Mat, Weights};
use super::Decoder;
use crate::quant::{quantize, Format, QuantOptions, QuantWeight};

/// Which tensor `Builder::set` receives. Matrices keep their dtype; vectors become f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Embed,
    LmHead,
    FinalNorm,
    AttnNorm,
    Wqkv,
    Bqkv,
    Wo,
    Bo,
    FfnNorm,
    WGateUp,
    BGateUp,
    WDown,
    BDown,
}

impl Kind {
    pub fn from_code(c: i32) -> Option<Kind> {
        use Kind::*;
        const ALL: [Kind; 13] = [
            Embed, LmHead, FinalNorm, AttnNorm, Wqkv, Bqkv, Wo, Bo, FfnNorm, WGateUp, BGateUp,
            WDown, BDown,
        ];
        usize::try_from(c).ok().and_then(|i| ALL.get(i).copied())
    }

    fn per_layer(self) -> bool {
        !matches!(self, Kind::Embed | Kind::LmHead | Kind::FinalNorm)
    }

    fn is_matrix(self) -> bool {
        matches!(
            self,
            Kind::Embed | Kind::LmHead | Kind::Wqkv | Kind::Wo | Kind::WGateUp | Kind::WDown
        )
    }
}

/// Tensor data as handed over: bf16 bits or f32 values, row-major [rows, cols].
pub enum Data<'a> {
    Bf16(&'a [u16]),
    F32(&'a [f32]),
}

/// How a matrix is stored: as given, or quantized (with an optional per-input-column importance).
#[derive(Clone, Copy, Debug)]
pub enum Store<'a> {
    AsGiven,
    Quant(Format, Option<&'a [f32]>),
}

#[derive(Default)]
struct PartialLayer {
    attn_norm: Option<Vec<f32>>,
    wqkv: Option<Mat>,
    bqkv: Option<Vec<f32>>,
    wo: Option<Mat>,
    bo: Option<Vec<f32>>,
    ffn_norm: Option<Vec<f32>>,
    w_gate_up: Option<Mat>,
    b_gate_up: Option<Vec<f32>>,
    w_down: Option<Mat>,
    b_down: Option<Vec<f32>>,
}

pub struct Builder {
    cfg: Config,
    embed: Option<Mat>,
    lm_head: Option<Mat>,
    final_norm: Option<Vec<f32>>,
    layers: Vec<PartialLayer>,
    /// Threads that quantize a matrix's rows (`set_threads`).
    quant_threads: usize,
}

fn need<T>(v: Option<T>, what: &str) -> Result<T, String> {
    v.ok_or_else(|| format!("{what} was never given"))
}

impl Builder {
    pub fn new(cfg: Config) -> Result<Builder, String> {
        cfg.check()?;
        let layers = (0..cfg.layers).map(|_| PartialLayer::default()).collect();
        Ok(Builder {
            cfg,
            embed: None,
            lm_head: None,
            final_norm: None,
            layers,
            quant_threads: 1,
        })
    }

    /// Threads that quantize matrices (1 until set; the C entry points pass the decoder pool's size).
    pub fn set_threads(&mut self, n: usize) {
        self.quant_threads = n.max(1);
    }

    /// Copies one tensor in. `layer` is ignored for model-level tensors; `store` only applies to
    /// matrices.
    pub fn set(
        &mut self,
        kind: Kind,
        layer: usize,
        data: Data<'_>,
        rows: usize,
        cols: usize,
        store: Store<'_>,
    ) -> Result<(), String> {
        let len = match &data {
            Data::Bf16(d) => d.len(),
            Data::F32(d) => d.len(),
        };
        if rows.checked_mul(cols) != Some(len) {
            return Err(format!(
                "{kind:?}: {len} values for a [{rows}, {cols}] tensor"
            ));
        }
        let finite = match &data {
            Data::Bf16(d) => d.iter().all(|&b| (b & 0x7f80) != 0x7f80),
            Data::F32(d) => d.iter().all(|v| v.is_finite()),
        };
        if !finite {
            return Err(format!(
                "{kind:?}{}: the tensor holds NaN or infinite values",
                if kind.per_layer() {
                    format!(" of layer {layer}")
                } else {
                    String::new()
                }
            ));
        }
        if kind.per_layer() && layer >= self.layers.len() {
            return Err(format!(
                "layer {layer} does not exist (the model has {})",
                self.layers.len()
            ));
        }
        if !kind.is_matrix() && matches!(store, Store::Quant(..)) {
            return Err(format!(
                "{kind:?} is a vector; only matrices can be quantized"
            ));
        }
        if kind.is_matrix() {
            let m = match (store, data) {
                (Store::AsGiven, Data::Bf16(d)) => Mat::from_bf16(d, rows, cols),
                (Store::AsGiven, Data::F32(d)) => Mat::from_f32(d, rows, cols),
                (Store::Quant(format, importance), data) => {
                    let f32s: Vec<f32>;
                    let values = match data {
                        Data::F32(d) => d,
                        Data::Bf16(d) => {
                            f32s = d.iter().map(|&b| crate::bf16::bf16_to_f32(b)).collect();
                            &f32s
                        }
                    };
                    let threads =
                        std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
                    let opt = QuantOptions {
                        format,
                        importance,
                        threads,
                    };
                    let q = quantize(values, rows, cols, &opt).map_err(|e| {
                        format!(
                            "{kind:?} of layer {layer} cannot be stored as {}: {e}",
                            format.name()
                        )
                    })?;
                    Mat::Quant(QuantWeight::pack(&q))
                }
            };
            self.store_matrix(kind, layer, m);
            return Ok(());
        }
        let v = match data {
            Data::Bf16(d) => d.iter().map(|&b| crate::bf16::bf16_to_f32(b)).collect(),
            Data::F32(d) => d.to_vec(),
        };
        if kind == Kind::FinalNorm {
            self.final_norm = Some(v);
            return Ok(());
        }
        let l = &mut self.layers[layer]; // in range: checked above for per-layer kinds
        match kind {
            Kind::AttnNorm => l.attn_norm = Some(v),
            Kind::Bqkv => l.bqkv = Some(v),
            Kind::Bo => l.bo = Some(v),
            Kind::FfnNorm => l.ffn_norm = Some(v),
            Kind::BGateUp => l.b_gate_up = Some(v),
            _ => l.b_down = Some(v),
        }
        Ok(())
    }

    /// `m` as the matrix `kind` (a matrix kind) of `layer` (in range for per-layer kinds).
    fn store_matrix(&mut self, kind: Kind, layer: usize, m: Mat) {
        match kind {
            Kind::Embed => self.embed = Some(m),
            Kind::LmHead => self.lm_head = Some(m),
            Kind::Wqkv => self.layers[layer].wqkv = Some(m),
            Kind::Wo => self.layers[layer].wo = Some(m),
            Kind::WGateUp => self.layers[layer].w_gate_up = Some(m),
            _ => self.layers[layer].w_down = Some(m),
        }
    }

    /// A matrix in its packed form, as a saved decoder holds it (`Mat::format_code`,
    /// `Mat::packed_bytes`); lengths and scales are checked, so a damaged file is refused.
    pub fn set_packed(
        &mut self,
        kind: Kind,
        layer: usize,
        code: i32,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<(), String> {
        if !kind.is_matrix() {
            return Err(format!("{kind:?} is not a matrix"));
        }
        if kind.per_layer() && layer >= self.layers.len() {
            return Err(format!(
                "layer {layer} does not exist (the model has {})",
                self.layers.len()
            ));
        }
        let m = Mat::from_packed(code, rows, cols, bytes)
            .map_err(|e| format!("{kind:?} of layer {layer}: {e}"))?;
        self.store_matrix(kind, layer, m);
        Ok(())
    }

    /// The decoder, once every required tensor has been given.
    pub fn build(self) -> Result<Decoder, String> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, p) in self.layers.into_iter().enumerate() {
            let at = |what: &str| format!("layer {i}'s {what}");
            layers.push(Layer {
                attn_norm: need(p.attn_norm, &at("input_layernorm"))?,
                wqkv: need(p.wqkv, &at("q/k/v projection"))?,
                bqkv: p.bqkv,
                wo: need(p.wo, &at("o_proj"))?,
                bo: p.bo,
                ffn_norm: need(p.ffn_norm, &at("post_attention_layernorm"))?,
                w_gate_up: need(p.w_gate_up, &at("gate/up projection"))?,
                b_gate_up: p.b_gate_up,
                w_down: need(p.w_down, &at("down_proj"))?,
                b_down: p.b_down,
            });
        }
        let tied = self.cfg.tied_embeddings;
        let lm_head = if tied {
            None
        } else {
            Some(need(
                self.lm_head,
                "lm_head (the model's embeddings are not tied)",
            )?)
        };
        let w = Weights {
            embed: need(self.embed, "the embedding")?,
            layers,
            final_norm: need(self.final_norm, "the final norm")?,
            lm_head,
        };
        Decoder::new(self.cfg, w)
    }
}
