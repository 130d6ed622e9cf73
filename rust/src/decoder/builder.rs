//! Assembles a `Decoder` from tensors handed over one at a time by name (by the C entry points),
//! copying each into decoder-owned memory. Every tensor is checked against the table (`tensors.rs`)
//! for the recipe: an unknown name, a tensor the recipe has no place for, or a wrong shape is refused
//! when it is given; whatever is missing is named when the decoder is built.

use super::recipe::{Limits, Recipe};
use super::tensors::{present, Tensor};
use super::weights::{Mat, MatFormat, Stored, Weights};
use super::Decoder;
use crate::quant::{gguf, quantize, Format, QuantOptions, QuantRows, QuantWeight};

/// Tensor data as handed over: bf16 bits or f32 values, row-major [rows, cols].
pub enum Data<'a> {
    Bf16(&'a [u16]),
    F32(&'a [f32]),
}

impl Data<'_> {
    fn len(&self) -> usize {
        match self {
            Data::Bf16(d) => d.len(),
            Data::F32(d) => d.len(),
        }
    }

    fn finite(&self) -> bool {
        match self {
            Data::Bf16(d) => d.iter().all(|&b| (b & 0x7f80) != 0x7f80),
            Data::F32(d) => d.iter().all(|v| v.is_finite()),
        }
    }

    fn to_f32(&self) -> Vec<f32> {
        match self {
            Data::Bf16(d) => d.iter().map(|&b| crate::bf16::bf16_to_f32(b)).collect(),
            Data::F32(d) => d.to_vec(),
        }
    }
}

/// How a matrix is stored: as given, quantized (with an optional per-input-column importance), or coded:
/// the format's scales fitted to the given values (with the importance) as `Quant` fits them, and then
/// the given codes (row-major, stored form: `quant::grid`) under those scales (GPTQ's result).
#[derive(Clone, Copy, Debug)]
pub enum Store<'a> {
    AsGiven,
    Quant(Format, Option<&'a [f32]>),
    Coded(Format, Option<&'a [f32]>, &'a [u8]),
}

pub struct Builder {
    recipe: Recipe,
    limits: Limits,
    w: Weights,
    /// Threads that quantize a matrix's rows (`set_threads`).
    quant_threads: usize,
}

/// "layer 3's qkv (the fused q/k/v projection)", "layer 1's expert 5 expert_up (...)" or "embed (the
/// token embedding)".
pub fn describe(t: Tensor, layer: usize, expert: usize) -> String {
    let s = t.spec();
    if s.per_expert {
        format!("layer {layer}'s expert {expert} {} ({})", s.name, s.about)
    } else if s.per_layer {
        format!("layer {layer}'s {} ({})", s.name, s.about)
    } else {
        format!("{} ({})", s.name, s.about)
    }
}

impl Builder {
    pub fn new(recipe: Recipe, limits: Limits) -> Result<Builder, String> {
        recipe.check()?;
        limits.check()?;
        let w = Weights::new(recipe.layers);
        Ok(Builder {
            recipe,
            limits,
            w,
            quant_threads: 1,
        })
    }

    pub fn recipe(&self) -> &Recipe {
        &self.recipe
    }

    /// Threads that quantize matrices (1 until set; the C entry points pass the decoder pool's size).
    pub fn set_threads(&mut self, n: usize) {
        self.quant_threads = n.max(1);
    }

    /// The tensor named `name` of `layer` (and `expert`), checked to belong to this recipe with shape
    /// [rows, cols].
    fn resolve(
        &self,
        name: &str,
        layer: usize,
        expert: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Tensor, String> {
        let t = Tensor::by_name(name).ok_or_else(|| {
            format!("unknown tensor name {name:?} (the decoder's tensors are listed in tensors.rs)")
        })?;
        let spec = t.spec();
        if spec.per_layer && layer >= self.recipe.layers {
            return Err(format!(
                "layer {layer} does not exist (the model has {})",
                self.recipe.layers
            ));
        }
        let layer = if spec.per_layer { layer } else { 0 };
        if spec.per_expert && expert >= self.recipe.experts() {
            return Err(format!(
                "expert {expert} does not exist (the model has {} per sparse layer)",
                self.recipe.experts()
            ));
        }
        let expert = if spec.per_expert { expert } else { 0 };
        let want = t.shape(&self.recipe, layer).ok_or_else(|| {
            format!(
                "{} is not part of this model's recipe (its composition has no place for it)",
                describe(t, layer, expert)
            )
        })?;
        if want != [rows, cols] {
            return Err(format!(
                "{} is [{rows}, {cols}], expected [{}, {}]",
                describe(t, layer, expert),
                want[0],
                want[1]
            ));
        }
        Ok(t)
    }

    /// Copies one tensor in. `layer` is ignored for model-level tensors, `expert` unless the tensor is
    /// per expert; `store` only applies to matrices.
    #[allow(clippy::too_many_arguments)]
    pub fn set(
        &mut self,
        name: &str,
        layer: usize,
        expert: usize,
        data: Data<'_>,
        rows: usize,
        cols: usize,
        store: Store<'_>,
    ) -> Result<(), String> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(format!(
                "{name}: {} values for a [{rows}, {cols}] tensor",
                data.len()
            ));
        }
        let t = self.resolve(name, layer, expert, rows, cols)?;
        if !data.finite() {
            return Err(format!(
                "{}: the tensor holds NaN or infinite values",
                describe(t, layer, expert)
            ));
        }
        if !t.spec().matrix {
            if matches!(store, Store::Quant(..) | Store::Coded(..)) {
                return Err(format!(
                    "{} is a vector; only matrices can be quantized",
                    describe(t, layer, expert)
                ));
            }
            self.w.put(t, layer, expert, Stored::Vec(data.to_f32()));
            return Ok(());
        }
        let m = match (store, data) {
            (Store::AsGiven, Data::Bf16(d)) => Mat::from_bf16(d, rows, cols),
            (Store::AsGiven, Data::F32(d)) => Mat::from_f32(d, rows, cols),
            (Store::Quant(format, importance) | Store::Coded(format, importance, _), data) => {
                let values = data.to_f32();
                let opt = QuantOptions {
                    format,
                    importance,
                    threads: self.quant_threads,
                };
                let mut q = quantize(&values, rows, cols, &opt).map_err(|e| {
                    format!(
                        "{} cannot be stored as {}: {e}",
                        describe(t, layer, expert),
                        format.name()
                    )
                })?;
                if let Store::Coded(_, _, codes) = store {
                    q.set_codes(codes)
                        .map_err(|e| format!("{}: {e}", describe(t, layer, expert)))?;
                }
                Mat::Quant(QuantWeight::pack(&q))
            }
        };
        self.w.put(t, layer, expert, Stored::Mat(m));
        Ok(())
    }

    /// A matrix in its packed form, as a saved decoder holds it (`Mat::format`,
    /// `Mat::packed_bytes`); lengths and scales are checked, so a damaged file is refused.
    #[allow(clippy::too_many_arguments)]
    pub fn set_packed(
        &mut self,
        name: &str,
        layer: usize,
        expert: usize,
        format: MatFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<(), String> {
        let t = self.resolve(name, layer, expert, rows, cols)?;
        let expert = if t.spec().per_expert { expert } else { 0 };
        if !t.spec().matrix {
            return Err(format!("{} is not a matrix", describe(t, layer, expert)));
        }
        let m = Mat::from_packed(format, rows, cols, bytes)
            .map_err(|e| format!("{}: {e}", describe(t, layer, expert)))?;
        self.w.put(t, layer, expert, Stored::Mat(m));
        Ok(())
    }

    /// A matrix from a GGUF file's blocks (`quant::gguf`): `parts` are (ggml type, rows) stacked in order
    /// (a fused projection's q, k, v from three tensors), `bytes` their rows of blocks one after another.
    /// Returns the format stored (runs of parts: their formats joined by `+`, e.g. `q4k+q6_k`) and whether
    /// every value is the file's exactly: parts of one format are repacked as they are; parts whose exact
    /// formats differ keep each run of rows in its own format (`Mat::Parts`: a Q4_K_M file's q/k in Q4_K
    /// beside v in Q6_K), or where that cannot be (a run not whole 16-row panels, a part not exact) are
    /// dequantized and quantized together to the widest of them, which the caller reports.
    pub fn set_gguf(
        &mut self,
        name: &str,
        layer: usize,
        expert: usize,
        parts: &[(u32, usize)],
        cols: usize,
        bytes: &[u8],
    ) -> Result<(String, bool), String> {
        if parts.is_empty() {
            return Err(format!("{name}: a GGUF matrix needs at least one part"));
        }
        let rows = parts.iter().map(|p| p.1).sum();
        let t = self.resolve(name, layer, expert, rows, cols)?;
        let expert = if t.spec().per_expert { expert } else { 0 };
        if !t.spec().matrix {
            return Err(format!("{} is not a matrix", describe(t, layer, expert)));
        }
        let what = |e: String| format!("{}: {e}", describe(t, layer, expert));
        let mut read = Vec::with_capacity(parts.len());
        let mut at = 0usize;
        // Parts of Q4_0 / Q5_0 / Q8_0 stack in the widest of their formats, exactly.
        let types: Vec<u32> = parts.iter().map(|p| p.0).collect();
        let into = gguf::stack_format(&types);
        for &(ty, n) in parts {
            let (bs, bb) = gguf::block_shape(ty)
                .ok_or_else(|| what(format!("ggml type {ty} is not repacked here")))?;
            let len = n.saturating_mul(cols.div_ceil(bs) * bb);
            let part = bytes.get(at..at.saturating_add(len)).ok_or_else(|| {
                what(format!(
                    "{} bytes are fewer than its parts need",
                    bytes.len()
                ))
            })?;
            read.push(gguf::to_rows(ty, part, n, cols, into).map_err(what)?);
            at += len;
        }
        if at != bytes.len() {
            return Err(what(format!("{} bytes, its parts take {at}", bytes.len())));
        }
        let first = read[0].0.format;
        let (q, exact) = if read.iter().all(|(q, _)| q.format == first) {
            let exact = read.iter().all(|r| r.1);
            (
                QuantRows::stack(read.into_iter().map(|r| r.0).collect()),
                exact,
            )
        } else if let Some(runs) = exact_runs(&read) {
            // Parts in formats no one format holds (Q4_K q/k beside Q6_K v): each run of rows in its own.
            let name = runs
                .iter()
                .map(|w| w.format.name())
                .collect::<Vec<_>>()
                .join("+");
            self.w.put(t, layer, expert, Stored::Mat(Mat::Parts(runs)));
            return Ok((name, true));
        } else {
            let widest = read
                .iter()
                .map(|r| r.0.format)
                .max_by(|a, b| a.bits_per_weight().total_cmp(&b.bits_per_weight()))
                .expect("at least one part");
            let values: Vec<f32> = read.iter().flat_map(|r| r.0.dequantize()).collect();
            let opt = QuantOptions {
                format: widest,
                importance: None,
                threads: self.quant_threads,
            };
            (quantize(&values, rows, cols, &opt).map_err(what)?, false)
        };
        let format = q.format;
        self.w.put(
            t,
            layer,
            expert,
            Stored::Mat(Mat::Quant(QuantWeight::pack(&q))),
        );
        Ok((format.name().to_string(), exact))
    }

    /// The decoder, once every tensor the recipe has has been given.
    pub fn build(self) -> Result<Decoder, String> {
        for p in present(&self.recipe) {
            if self.w.shape_at(p.tensor, p.layer, p.expert).is_none() {
                return Err(format!(
                    "{} was never given",
                    describe(p.tensor, p.layer, p.expert)
                ));
            }
        }
        Decoder::new(self.recipe, self.limits, self.w)
    }
}

/// A GGUF matrix's parts (each converted into its own format) as runs of consecutive parts of one format, each
/// packed: when every part is exact and every run but the last is whole 16-row panels (`parts::check`); None
/// otherwise (the caller quantizes the values again into one format).
fn exact_runs(read: &[(QuantRows, bool)]) -> Option<Vec<QuantWeight>> {
    if !read.iter().all(|r| r.1) {
        return None;
    }
    let mut runs: Vec<Vec<QuantRows>> = Vec::new();
    for (q, _) in read {
        match runs.last_mut() {
            Some(run) if run[0].format == q.format => run.push(q.clone()),
            _ => runs.push(vec![q.clone()]),
        }
    }
    let packed: Vec<QuantWeight> = runs
        .into_iter()
        .map(|run| QuantWeight::pack(&QuantRows::stack(run)))
        .collect();
    super::parts::check(&packed).ok().map(|()| packed)
}
