//! The decoder's float linear ("preserve" precision: f32 or bf16 weights, f32 products and sums):
//! `y = x @ w^T + bias` over weights repacked once into column panels.
//!
//! Layout: the weight's n output rows are cut into panels of 32; a panel stores, for every k, its 32
//! values side by side (k-major), so one cache line (bf16) or two (f32) feed 32 outputs at once.
//! - One layout serves every batch size: a decode step (m = 1) streams the panels front to back,
//!   a batch of sequences (m <= 16) reuses each loaded line for every x row, a prompt (m = 512) runs as
//!   a register-blocked GEMM reading the bf16 panels directly: no per-call packing, no horizontal sums.
//! - bf16 panels interleave rows i and 16 + i in each 32-bit word (row i in the low half), so a
//!   shift and a mask widen 32 values into two f32 vectors of 16 consecutive rows each.
//! - The last panel is zero-padded; padded outputs are never stored.
//!
//! On the `amx` tier, bf16 panels of many rows (prompts) run on AMX tiles instead (`amx::bf16_gemm`:
//! float32-exact products of an exact bf16 split of x, float32 sums in the tiles' order).
//!
//! Numerical contract: every product is exact (bf16 widens exactly), every sum f32; an output is the
//! sum over k blocks of `KC` of in-order partial sums, then the bias, whatever the number of rows: a
//! row's outputs do not depend on the rows beside it in a call, so a sequence's logits are the same
//! bits alone or batched with others (the server's concurrent requests, verified drafts). Tiers
//! differ from the scalar reference only in fused multiply-add rounding. The exception: the `amx`
//! tier's GEMM for calls of many rows (`amx::bf16_gemm`) sums in its tiles' order.

mod generic;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod driver;

use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use crate::amx::bf16_gemm;
use crate::bf16::bf16_to_f32;
use crate::isa::Isa;
use crate::par::{chunk_ranges, run_tasks, Parallel, SyncPtr};

/// Output rows per panel.
pub const PANEL: usize = 32;
/// k block of the GEMM path (a 256 x 32 bf16 panel block is 16 KB: it stays in L1).
pub(crate) const KC: usize = 256;
/// Below this many multiply-adds per task, splitting further costs more than it saves.
const MIN_FMAS_PER_TASK: usize = 1 << 17;

/// Panel-packed weights of a [n, k] matrix.
#[derive(Clone, Debug)]
pub enum PanelWeight {
    Bf16 { data: Vec<u16>, n: usize, k: usize },
    F32 { data: Vec<f32>, n: usize, k: usize },
}

/// Where packed element (row j, column kk) lives, and for bf16 its slot within the panel's 32.
#[inline]
fn slot(j: usize) -> usize {
    let r = j % PANEL;
    if r < 16 {
        2 * r
    } else {
        2 * (r - 16) + 1
    }
}

/// Row-major [n, k] values into zero-padded panels, row j at position `at(j)` of its panel's 32.
fn pack<T: Copy + Default>(w: &[T], n: usize, k: usize, at: impl Fn(usize) -> usize) -> Vec<T> {
    assert_eq!(
        w.len(),
        n * k,
        "panel: {} values for a [{n}, {k}] matrix",
        w.len()
    );
    let mut data = vec![T::default(); n.div_ceil(PANEL) * k * PANEL];
    for j in 0..n {
        let base = (j / PANEL) * k * PANEL + at(j);
        for kk in 0..k {
            data[base + kk * PANEL] = w[j * k + kk];
        }
    }
    data
}

impl PanelWeight {
    /// Packs a row-major bf16 [n, k] matrix.
    pub fn from_bf16(w: &[u16], n: usize, k: usize) -> PanelWeight {
        PanelWeight::Bf16 {
            data: pack(w, n, k, slot),
            n,
            k,
        }
    }

    /// Packs a row-major f32 [n, k] matrix (rows in natural order within a panel).
    pub fn from_f32(w: &[f32], n: usize, k: usize) -> PanelWeight {
        PanelWeight::F32 {
            data: pack(w, n, k, |j| j % PANEL),
            n,
            k,
        }
    }

    /// Rebuilds a packed matrix from the little-endian bytes of its packed data (a saved decoder),
    /// checking their length against [n, k].
    pub fn from_packed(
        bf16: bool,
        bytes: &[u8],
        n: usize,
        k: usize,
    ) -> Result<PanelWeight, String> {
        let want = (n.div_ceil(PANEL) * PANEL)
            .checked_mul(k)
            .and_then(|e| e.checked_mul(if bf16 { 2 } else { 4 }))
            .ok_or_else(|| format!("a [{n}, {k}] matrix is too large"))?;
        if bytes.len() != want {
            return Err(format!(
                "{} bytes of packed data for a [{n}, {k}] matrix, expected {want}",
                bytes.len()
            ));
        }
        Ok(if bf16 {
            let data = bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect();
            PanelWeight::Bf16 { data, n, k }
        } else {
            let data: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            if data.iter().any(|v| !v.is_finite()) {
                return Err("the packed data holds non-finite values".into());
            }
            PanelWeight::F32 { data, n, k }
        })
    }

    /// The packed data as little-endian bytes (what `from_packed` takes back).
    pub fn packed_bytes(&self) -> Vec<u8> {
        match self {
            PanelWeight::Bf16 { data, .. } => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            PanelWeight::F32 { data, .. } => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    pub fn n(&self) -> usize {
        match self {
            PanelWeight::Bf16 { n, .. } | PanelWeight::F32 { n, .. } => *n,
        }
    }

    pub fn k(&self) -> usize {
        match self {
            PanelWeight::Bf16 { k, .. } | PanelWeight::F32 { k, .. } => *k,
        }
    }

    /// Bytes of the stored matrix (padding included): what one pass over it reads.
    pub fn bytes(&self) -> usize {
        match self {
            PanelWeight::Bf16 { data, .. } => data.len() * 2,
            PanelWeight::F32 { data, .. } => data.len() * 4,
        }
    }

    /// Row j (an embedding lookup) widened to f32.
    pub fn row_f32(&self, j: usize, out: &mut [f32]) {
        let k = self.k();
        match self {
            PanelWeight::Bf16 { data, .. } => {
                let base = (j / PANEL) * k * PANEL + slot(j);
                for (kk, o) in out[..k].iter_mut().enumerate() {
                    *o = bf16_to_f32(data[base + kk * PANEL]);
                }
            }
            PanelWeight::F32 { data, .. } => {
                let base = (j / PANEL) * k * PANEL + j % PANEL;
                for (kk, o) in out[..k].iter_mut().enumerate() {
                    *o = data[base + kk * PANEL];
                }
            }
        }
    }
}

/// One call: x [m, k] (rows `ldx` apart), y [m, n] (rows `n` apart).
pub(crate) struct Job<'a> {
    pub x: &'a [f32],
    pub m: usize,
    pub w: &'a PanelWeight,
    pub bias: Option<&'a [f32]>,
    /// Points at m * n f32s.
    pub y: SyncPtr<f32>,
}

/// Fills the outputs of `panels` for all m rows. Every tier exports one with this signature.
type PanelFn = unsafe fn(&Job<'_>, Range<usize>);

fn tier(isa: Isa) -> PanelFn {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => avx512::panels,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni => avx2::panels,
        _ => generic::panels,
    }
}

/// One linear of a group: `y[..m * n] = x[..m * k] w^T`, no bias.
pub struct GroupItem<'a> {
    pub x: &'a [f32],
    pub m: usize,
    pub w: &'a PanelWeight,
    pub y: &'a mut [f32],
}

/// Several independent `panel_linear`s (a mixture's experts) in one parallel region: every item's
/// panel ranges are tasks of one `run`. Each item's result is bit-identical to `panel_linear` of that
/// item alone (same kernel over the same rows). Panics (never UB) when a length disagrees with the
/// shapes or `isa` is not supported.
pub fn panel_linear_group(isa: Isa, par: &dyn Parallel, items: &mut [GroupItem<'_>]) {
    assert!(
        isa.is_supported(),
        "panel_linear_group: tier {} is not supported by this CPU",
        isa.name()
    );
    let f = tier(isa);
    let mut jobs = Vec::with_capacity(items.len());
    let mut tasks: Vec<(usize, Range<usize>)> = Vec::new();
    for it in items.iter_mut() {
        let (n, k) = (it.w.n(), it.w.k());
        assert!(
            it.x.len() == it.m * k && it.y.len() == it.m * n,
            "panel_linear_group: x has {} and y {} elements, expected {}*{k} and {}*{n}",
            it.x.len(),
            it.y.len(),
            it.m,
            it.m
        );
        if it.m > 0 && n > 0 && k == 0 {
            crate::linear::broadcast_bias(it.y, n, None);
            continue;
        }
        if it.m == 0 || n == 0 {
            continue;
        }
        let want = par
            .num_threads()
            .clamp(1, (it.m * n * k / MIN_FMAS_PER_TASK).max(1));
        for r in chunk_ranges(n.div_ceil(PANEL), want, 1) {
            tasks.push((jobs.len(), r));
        }
        jobs.push(Job {
            x: it.x,
            m: it.m,
            w: it.w,
            bias: None,
            y: SyncPtr(it.y.as_mut_ptr()),
        });
    }
    let task = |i: usize| {
        let (j, r) = &tasks[i];
        // SAFETY: supported tier (asserted); each job's chunks are disjoint panel ranges of its own y
        // (the items' outputs are distinct &mut slices), so no two tasks write the same element;
        // lengths were checked above.
        unsafe { f(&jobs[*j], r.clone()) }
    };
    run_tasks(par, tasks.len(), &task);
}

/// y[i, j] = sum_kk x[i, kk] * w[j, kk] (+ bias[j]) for x [m, k] row-major and y [m, n] row-major.
///
/// Panics (never UB) when a slice length disagrees with m and the weight's shape, or when `isa`
/// is not supported by this CPU.
pub fn panel_linear(
    isa: Isa,
    par: &dyn Parallel,
    x: &[f32],
    m: usize,
    w: &PanelWeight,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    let (n, k) = (w.n(), w.k());
    assert_eq!(
        x.len(),
        m * k,
        "panel_linear: x has {} elements, expected {m}*{k}",
        x.len()
    );
    assert_eq!(
        y.len(),
        m * n,
        "panel_linear: y has {} elements, expected {m}*{n}",
        y.len()
    );
    assert!(
        bias.is_none_or(|b| b.len() == n),
        "panel_linear: the bias must have {n} values"
    );
    assert!(
        isa.is_supported(),
        "panel_linear: tier {} is not supported by this CPU",
        isa.name()
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        crate::linear::broadcast_bias(y, n, bias);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let PanelWeight::Bf16 { data, .. } = w {
        let g = bf16_gemm::Gemm {
            x,
            m,
            k,
            w: bf16_gemm::Weights::Panels(data),
            n,
            bias,
            y: SyncPtr(y.as_mut_ptr()),
        };
        // SAFETY: the tier is supported (asserted above); lengths checked, m, n, k > 0; y is ours
        // alone for the call.
        if unsafe { bf16_gemm::gemm_on_amx(isa, par, &g) } {
            return;
        }
    }
    let job = Job {
        x,
        m,
        w,
        bias,
        y: SyncPtr(y.as_mut_ptr()),
    };
    let panels = n.div_ceil(PANEL);
    let want = par
        .num_threads()
        .clamp(1, (m * n * k / MIN_FMAS_PER_TASK).max(1));
    let chunks = chunk_ranges(panels, want, 1);
    let f = tier(isa);
    let task = |i: usize| {
        // SAFETY: the tier belongs to a supported ISA (asserted); chunks are disjoint panel ranges,
        // so each task writes its own columns of y; lengths were checked above.
        unsafe { f(&job, chunks[i].clone()) }
    };
    run_tasks(par, chunks.len(), &task);
}
