//! `quant_linear` and its kin: each tier's kernels (`Tier`, chosen by `tier`), the checks, the
//! activations quantized once per call, and the matrix's panels split into tasks across the pool (one
//! call, or a mixture's experts as one parallel region: `quant_linear_group`), plus the hooks through
//! which tests run the AVX-VNNI and AMX tiers' logic over exact emulations.
//!
//! Numerical contract: the module's (`quant.rs`); a task computes whole panels for every row, so the
//! split across threads never changes a bit.

use std::cell::RefCell;
use std::ops::Range;

use super::acts::{quantize_activations, quantize_par, ActsOut, Source};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx2_acts, avx2_rows, avx512, avxvnni};
use super::{generic, superblock, Format, Job, QActs, QuantWeight, QPANEL};
use crate::isa::Isa;
use crate::par::{chunk_ranges, run_tasks, Parallel};
use crate::vmath::Act;

/// Below this many multiply-adds per task, splitting further costs more than it saves.
const MIN_MACS_PER_TASK: usize = 1 << 17;
/// From this many rows (batched steps, prompts) a linear is split into `FINE_TASKS` tasks per thread.
const FINE_ROWS: usize = 4;
/// Tasks per runner thread from `FINE_ROWS` rows: the region's tail (the last task, while the other
/// threads wait) a sixteenth of it on two threads instead of a quarter (measured: 135M pp512 +5 %, its
/// 8-row step -7 %; 8 per thread no better).
const FINE_TASKS: usize = 4;

type PanelFn = unsafe fn(&Job<'_>, Range<usize>);
pub(super) type QuantizeFn = unsafe fn(&[f32], ActsOut);

/// A tier's kernels: `panels` over activations from `quantize` (which also writes `QActs::fine` where
/// `fine`), and the super-block formats' path (`sup`; None: `panels` runs them too, the AVX2 tier's own),
/// Q6K16's (`sup16`: the AMX tier's AVX-512 tiles, the AVX2 tier's AVX-VNNI tiles over the emulation).
pub(super) struct Tier {
    panels: PanelFn,
    pub quantize: QuantizeFn,
    name: &'static str,
    pub fine: bool,
    sup: Option<&'static superblock::Kernels>,
    sup16: &'static superblock::Kernels,
}

impl Tier {
    /// The super-block path's kernels for a format at m rows (None: `panels` runs it). The nibble
    /// formats (Q4, Q40, Q50) take it from its `min_rows`, their 32-value blocks eight to a super-block,
    /// under the same fused epilogue as their own tiles (the same bits whatever the path).
    fn sup_for(&self, f: Format, m: usize) -> Option<&'static superblock::Kernels> {
        match f {
            Format::Q6K16 => Some(self.sup16),
            f if f.is_super() => self.sup,
            f if f.is_nibbles() => self.sup.filter(|k| m >= k.min_rows),
            _ => None,
        }
    }

    /// Panels a task's range should be a multiple of: the super-block path's unpacked group, so that no
    /// task ends in a group cut short (its tiles are widest on whole groups).
    fn panel_align(&self, w: &QuantWeight, m: usize) -> usize {
        match self.sup_for(w.format, m) {
            Some(k) if m >= k.min_rows => k.panels,
            _ => 1,
        }
    }

    /// The job's panel ranges, one per task: as many tasks as threads (`FINE_TASKS` times that from
    /// `FINE_ROWS` rows), but at most one per `MIN_MACS_PER_TASK` multiply-adds, each a multiple of
    /// `panel_align` panels.
    fn chunks(&self, par: &dyn Parallel, job: &Job<'_>) -> Vec<Range<usize>> {
        let (m, n, k) = (job.m, job.w.n, job.w.k);
        let per = if m >= FINE_ROWS { FINE_TASKS } else { 1 };
        let want = (per * par.num_threads()).clamp(1, (m * n * k / MIN_MACS_PER_TASK).max(1));
        chunk_ranges(n.div_ceil(QPANEL), want, self.panel_align(job.w, m))
    }

    /// Fills the activations' tiled layout where this call's tiles read it (`Kernels::needs_tiled`).
    fn tile_acts(&self, acts: &mut QActs, m: usize, w: &QuantWeight) {
        if self.sup_for(w.format, m).is_some_and(|k| k.needs_tiled(m)) {
            acts.tile_rows(m, w.k);
        }
    }

    /// Runs the job's panels `panels` with the kernels of its matrix's format.
    ///
    /// # Safety
    /// The CPU runs the tier; `job` satisfies `quant_linear`'s contract with activations quantized for
    /// its format by this tier; no other thread writes these panels' columns.
    unsafe fn run(&self, job: &Job<'_>, panels: Range<usize>) {
        match self.sup_for(job.w.format, job.m) {
            Some(k) => superblock::run(k, job, panels),
            None => (self.panels)(job, panels),
        }
    }
}

/// The kernels for `isa`: AVX-512 with VNNI (`vpdpbusd`), else AVX-VNNI (256-bit `vpdpbusd`), else
/// AVX2 (`vpmaddubsw`; it also serves AVX-512 CPUs without VNNI), else scalar.
pub(super) fn tier(isa: Isa) -> Tier {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 && avx512::usable() {
            // On AMX-INT8 CPUs the super-block formats' prompts run on its tiles; all else as AVX-512.
            let amx = isa >= Isa::Amx && crate::amx::int8::usable();
            return Tier {
                panels: avx512::panels,
                quantize: avx512::quantize_rows,
                name: if amx { "amx-int8" } else { "avx512vnni" },
                fine: false,
                sup: Some(if amx {
                    &superblock::amx::KERNELS
                } else {
                    &superblock::avx512::KERNELS
                }),
                sup16: &superblock::avx512::KERNELS,
            };
        }
        if isa >= Isa::Avx2 && avx2::usable() {
            // The AVX2 quantizer (with the i16 fine codes) under the AVX-VNNI kernels where the CPU
            // has them, else the AVX2 ones (whose super-block path is their own: no `sup`).
            let vnni = isa >= Isa::AvxVnni && avxvnni::usable();
            return Tier {
                panels: if vnni {
                    avxvnni::real::panels
                } else {
                    avx2::panels
                },
                quantize: avx2_acts::quantize_rows,
                name: if vnni { "avxvnni" } else { "avx2" },
                fine: true,
                sup: vnni.then_some(&avxvnni::real::sup::KERNELS),
                sup16: if vnni {
                    &avxvnni::real::sup::KERNELS
                } else {
                    &avxvnni::emulated::sup::KERNELS
                },
            };
        }
    }
    let _ = isa;
    Tier {
        panels: generic::panels,
        quantize: generic::quantize_rows,
        name: "generic",
        fine: false,
        sup: Some(&superblock::generic::KERNELS),
        sup16: &superblock::generic::KERNELS,
    }
}

/// Panels the calling thread has run through a many-rows path of the super-block formats (each panel's
/// super-blocks unpacked once for all rows: `quant/superblock.rs`, the AVX2 tier's `quant/avx2_rows.rs`):
/// how tests prove it ran.
pub fn super_unpacked_panels_run() -> usize {
    #[cfg(target_arch = "x86_64")]
    return superblock::unpacked_panels_run() + avx2_rows::panels_run();
    #[cfg(not(target_arch = "x86_64"))]
    superblock::unpacked_panels_run()
}

/// `quant_linear` with the super-block formats' AMX tier over an exact emulation of the AMX-INT8 tiles
/// (`tdpbsud`): how that tier's logic is tested on CPUs without AMX (where the CPU has it, the real
/// instructions run as the `amx` tier of `quant_linear`). Other formats run the scalar tier. Any CPU;
/// `simd_epilogue` takes the hardware tier's AVX-512 epilogue (panics without AVX-512) instead of the
/// scalar one.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn quant_linear_amx_emulated(
    simd_epilogue: bool,
    par: &dyn Parallel,
    x: &[f32],
    m: usize,
    w: &QuantWeight,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    if check(x, m, w, bias, y) {
        let sup: &'static superblock::Kernels = if simd_epilogue {
            assert!(
                cfg!(target_arch = "x86_64") && Isa::Avx512.is_supported(),
                "quant_linear_amx_emulated: the AVX-512 epilogue needs AVX-512"
            );
            #[cfg(target_arch = "x86_64")]
            {
                &superblock::amx::EMULATED_AVX512
            }
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!()
        } else {
            &superblock::amx::EMULATED
        };
        let emulated = Tier {
            sup: Some(sup),
            ..tier(Isa::Generic)
        };
        linear_with(Isa::Generic, &emulated, par, Source::Rows(x), m, w, bias, y);
    }
}

/// Tile products (16 rows x one sub-block x one panel) the calling thread has run on the super-block
/// formats' AMX path, real or emulated: how tests prove it ran.
#[doc(hidden)]
pub fn super_amx_products_run() -> usize {
    superblock::amx::products_run()
}

/// Rows from which `isa`'s tier runs the super-block formats through its many-rows path.
pub fn super_min_rows(isa: Isa) -> usize {
    match tier(isa).sup {
        Some(k) => k.min_rows,
        #[cfg(target_arch = "x86_64")]
        None => avx2_rows::MIN_ROWS,
        #[cfg(not(target_arch = "x86_64"))]
        None => usize::MAX,
    }
}

/// The kernel family `quant_linear` runs for a tier on this CPU (for tests and logs).
pub fn kernel_name(isa: Isa) -> &'static str {
    tier(isa).name
}

thread_local! {
    /// Each calling thread's activation buffers, reused across calls.
    static ACTS: RefCell<QActs> = RefCell::new(QActs::default());
}

/// y[i, j] = sum_kk x[i, kk] * w[j, kk] (+ bias[j]) with w quantized and x quantized per 32-block
/// (see the module's contract). Panics (never UB) when a length disagrees with the shapes or `isa`
/// is not supported.
pub fn quant_linear(
    isa: Isa,
    par: &dyn Parallel,
    x: &[f32],
    m: usize,
    w: &QuantWeight,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    assert_supported(isa);
    if check(x, m, w, bias, y) {
        linear_with(isa, &tier(isa), par, Source::Rows(x), m, w, bias, y);
    }
}

thread_local! {
    /// Gated linears (`quant_linear_gated`) the calling thread has run.
    static GATED_RUN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A gated MLP's down projection, `y = (act(gate) * up) w^T (+ bias)`, from its gate/up output `gu`
/// (`[m][2 k]`, each row's gate first, k = w's columns): bit-identical to `vmath::act_mul` of each row
/// followed by `quant_linear`, without the hidden rows ever written to memory (each is computed into
/// L1 and quantized there, on the threads that quantize). Panics (never UB) as `quant_linear` does.
#[allow(clippy::too_many_arguments)]
pub fn quant_linear_gated(
    isa: Isa,
    par: &dyn Parallel,
    gu: &[f32],
    act: Act,
    m: usize,
    w: &QuantWeight,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    assert_supported(isa);
    let k = w.k;
    assert!(
        gu.len() == m * 2 * k,
        "quant_linear_gated: gate/up has {} elements, expected {m}*2*{k}",
        gu.len()
    );
    if check_out(m, w, bias, y) {
        GATED_RUN.with(|c| c.set(c.get() + 1));
        linear_with(
            isa,
            &tier(isa),
            par,
            Source::Gated { gu, act },
            m,
            w,
            bias,
            y,
        );
    }
}

/// `quant_linear_gated` calls the calling thread has made: how tests prove a decoder took that path.
#[doc(hidden)]
pub fn gated_linears_run() -> usize {
    GATED_RUN.with(|c| c.get())
}

/// Panics unless the CPU runs `isa`.
fn assert_supported(isa: Isa) {
    let name = isa.name();
    assert!(
        isa.is_supported(),
        "quant_linear: tier {name} is not supported by this CPU"
    );
}

/// Panics (never UB) unless x, y and the bias have the lengths of an [m, k] x [n, k]^T linear;
/// returns whether there is anything to compute.
fn check(x: &[f32], m: usize, w: &QuantWeight, bias: Option<&[f32]>, y: &[f32]) -> bool {
    let (k, xl) = (w.k, x.len());
    assert!(
        xl == m * k,
        "quant_linear: x has {xl} elements, expected {m}*{k}"
    );
    check_out(m, w, bias, y)
}

/// `check`'s part for y and the bias.
fn check_out(m: usize, w: &QuantWeight, bias: Option<&[f32]>, y: &[f32]) -> bool {
    let (n, yl) = (w.n, y.len());
    assert!(
        yl == m * n,
        "quant_linear: y has {yl} elements, expected {m}*{n}"
    );
    let bias_fits = bias.is_none_or(|b| b.len() == n);
    assert!(bias_fits, "quant_linear: the bias must have {n} values");
    m > 0 && n > 0
}

/// The AVX-VNNI tier's kernels over an exact AVX2 emulation of `vpdpbusd`: how its logic is tested
/// on CPUs without AVX-VNNI (the instruction itself is tested where the CPU has it, as the
/// `avxvnni` tier of `quant_linear`). `quant_linear`'s contract; panics without AVX2.
#[doc(hidden)]
pub fn quant_linear_vnni_emulated(
    par: &dyn Parallel,
    x: &[f32],
    m: usize,
    w: &QuantWeight,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    assert!(
        cfg!(target_arch = "x86_64") && Isa::Avx2.is_supported(),
        "quant_linear_vnni_emulated needs AVX2"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if check(x, m, w, bias, y) {
            let emulated = Tier {
                panels: avxvnni::emulated::panels,
                sup: Some(&avxvnni::emulated::sup::KERNELS),
                sup16: &avxvnni::emulated::sup::KERNELS,
                ..tier(Isa::Avx2)
            };
            linear_with(Isa::Avx2, &emulated, par, Source::Rows(x), m, w, bias, y);
        }
    }
}

/// `quant_linear` after its checks: the source's rows quantized by `isa`'s tier, then `kernels` over
/// the panels.
#[allow(clippy::too_many_arguments)]
fn linear_with(
    isa: Isa,
    kernels: &Tier,
    par: &dyn Parallel,
    x: Source<'_>,
    m: usize,
    w: &QuantWeight,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    ACTS.with(|cell| {
        let mut acts = cell.borrow_mut();
        quantize_par(isa, par, x, m, w.k, &mut acts);
        kernels.tile_acts(&mut acts, m, w);
        let job = Job::new(&acts, m, w, bias, y);
        let chunks = kernels.chunks(par, &job);
        let task = |i: usize| {
            // SAFETY: supported tier, activations quantized for the format by it; chunks are disjoint
            // panel ranges, so each task writes its own columns of y; every length was checked above.
            unsafe { kernels.run(&job, chunks[i].clone()) }
        };
        run_tasks(par, chunks.len(), &task);
    });
}

/// One linear of a group: `y[..m * n] = x[..m * k] dequant(w)^T`, no bias.
pub struct GroupItem<'a> {
    pub x: &'a [f32],
    pub m: usize,
    pub w: &'a QuantWeight,
    pub y: &'a mut [f32],
}

thread_local! {
    /// A group's activation buffers, one per item, reused across calls.
    static GROUP_ACTS: RefCell<Vec<QActs>> = const { RefCell::new(Vec::new()) };
}

/// Several independent `quant_linear`s (a mixture's experts) in one parallel region: each item's rows
/// are quantized on the calling thread, then every item's panel ranges are tasks of one `run`. Each
/// item's result is bit-identical to `quant_linear` of that item alone (same codes, same kernels).
/// Panics (never UB) when a length disagrees with the shapes or `isa` is not supported.
pub fn quant_linear_group(isa: Isa, par: &dyn Parallel, items: &mut [GroupItem<'_>]) {
    assert_supported(isa);
    for it in items.iter() {
        check(it.x, it.m, it.w, None, it.y);
    }
    let kernels = tier(isa);
    GROUP_ACTS.with(|cell| {
        let mut acts = cell.borrow_mut();
        if acts.len() < items.len() {
            acts.resize_with(items.len(), QActs::default);
        }
        for (it, a) in items.iter().zip(acts.iter_mut()) {
            if it.m > 0 {
                quantize_activations(isa, it.x, a);
                kernels.tile_acts(a, it.m, it.w);
            }
        }
        let jobs: Vec<Job<'_>> = items
            .iter_mut()
            .zip(acts.iter())
            .map(|(it, a)| Job::new(a, it.m, it.w, None, it.y))
            .collect();
        // (job, panel range) tasks, each job split as quant_linear splits it.
        let mut tasks: Vec<(usize, Range<usize>)> = Vec::new();
        for (j, job) in jobs.iter().enumerate() {
            if job.m > 0 && job.w.n > 0 {
                tasks.extend(kernels.chunks(par, job).into_iter().map(|r| (j, r)));
            }
        }
        let task = |i: usize| {
            let (j, r) = &tasks[i];
            // SAFETY: supported tier; each job's chunks are disjoint panel ranges of its own y (the
            // items' outputs are distinct &mut slices), so no two tasks write the same element; every
            // length was checked above.
            unsafe { kernels.run(&jobs[*j], r.clone()) }
        };
        run_tasks(par, tasks.len(), &task);
    });
}
