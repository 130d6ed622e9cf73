//! `y = x @ w^T + bias`: the dispatcher. Validates sizes, picks the tier and the path
//! (memory-bound GEMV for few rows, packed GEMM for many), and splits the output into
//! disjoint tiles for the parallel runner.
//!
//! Numerical contract: every y element is an f32 sum of f32 products (bf16 weights are widened
//! exactly), and the bias is added once, after the full sum. The result of one element does not
//! depend on the runner or the tiling; tiers differ only in summation order. On AMX and AVX512-BF16
//! CPUs, 32+ rows of bf16 weights run on bf16 products (`amx::bf16_gemm`: exact, float32 sums), whose
//! instructions read denormal inputs as zero and flush denormal sums (below 1.2e-38).

mod generic;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
// Panel packing is only needed by the packed-GEMM (SIMD) tiers.
#[cfg(target_arch = "x86_64")]
mod pack;
#[cfg(target_arch = "x86_64")]
mod pack_avx2;
#[cfg(target_arch = "x86_64")]
mod packed_gemm;

use std::ops::Range;

pub(crate) use generic::dot as generic_dot;

#[cfg(target_arch = "x86_64")]
use crate::amx::{bf16_gemm, dpbf16};
use crate::isa::Isa;
use crate::par::{chunk_ranges, run_tasks, Parallel, SyncPtr};

/// Weights, row-major `[n, k]` (torch's `nn.Linear.weight` layout).
#[derive(Clone, Copy, Debug)]
pub enum Weight<'a> {
    Bf16(&'a [u16]),
    F32(&'a [f32]),
}

impl Weight<'_> {
    pub fn len(&self) -> usize {
        match self {
            Weight::Bf16(w) => w.len(),
            Weight::F32(w) => w.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Everything a tier needs for one call, the weights in layout `W` (this module's `Weight`; the AMX
/// GEMM's `bf16_gemm::Weights`). `y` is written through a raw pointer because tasks own disjoint
/// *column* ranges of the row-major output, which slices cannot express.
pub(crate) struct Problem<'a, W = Weight<'a>> {
    pub x: &'a [f32],
    pub m: usize,
    pub k: usize,
    pub w: W,
    pub n: usize,
    pub bias: Option<&'a [f32]>,
    /// Points at `m * n` f32s.
    pub y: SyncPtr<f32>,
}

impl<'a, W> Problem<'a, W> {
    /// The same call over another layout of the same weights.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn with_weights<V>(&self, w: V) -> Problem<'a, V> {
        Problem {
            x: self.x,
            m: self.m,
            k: self.k,
            w,
            n: self.n,
            bias: self.bias,
            y: self.y,
        }
    }
}

/// Below this many multiply-adds a call runs as a single task on the caller: spreading it
/// costs more than it saves (a persistent pool's dispatch is a few microseconds, ~1/3 of a
/// 576x576 bf16 GEMV; see the "2p" runner in kernel_bench).
const MIN_FMAS_PER_TASK: usize = 1 << 17;

/// y[i*n + j] = sum_kk x[i*k + kk] * w[j*k + kk] (+ bias[j]); x row-major [m, k] f32,
/// y row-major [m, n] f32.
///
/// Panics (never UB) when a slice length disagrees with m, k, n, or when `isa` is not
/// supported by this CPU.
#[allow(clippy::too_many_arguments)] // mirrors the documented BLAS-like signature
pub fn linear(
    isa: Isa,
    par: &dyn Parallel,
    x: &[f32],
    m: usize,
    k: usize,
    w: Weight<'_>,
    n: usize,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    let mk = m.checked_mul(k).expect("linear: m*k overflows usize");
    let nk = n.checked_mul(k).expect("linear: n*k overflows usize");
    let mn = m.checked_mul(n).expect("linear: m*n overflows usize");
    assert_eq!(
        x.len(),
        mk,
        "linear: x has {} elements, expected m*k = {m}*{k}",
        x.len()
    );
    assert_eq!(
        w.len(),
        nk,
        "linear: w has {} elements, expected n*k = {n}*{k}",
        w.len()
    );
    assert_eq!(
        y.len(),
        mn,
        "linear: y has {} elements, expected m*n = {m}*{n}",
        y.len()
    );
    if let Some(b) = bias {
        assert_eq!(
            b.len(),
            n,
            "linear: bias has {} elements, expected n = {n}",
            b.len()
        );
    }
    assert!(
        isa.is_supported(),
        "linear: ISA tier {} is not supported by this CPU",
        isa.name()
    );
    if mn == 0 {
        return;
    }
    if k == 0 {
        broadcast_bias(y, n, bias);
        return;
    }

    let problem = Problem {
        x,
        m,
        k,
        w,
        n,
        bias,
        y: SyncPtr(y.as_mut_ptr()),
    };
    #[cfg(target_arch = "x86_64")]
    if let Weight::Bf16(wb) = w {
        let g = problem.with_weights(bf16_gemm::Weights::RowMajor(wb));
        // SAFETY: the tier is supported (asserted above); lengths were checked against m, k, n, all
        // non-zero here; y is ours alone.
        if unsafe { bf16_gemm::gemm_on_amx(isa, par, &g) } {
            return;
        }
        // AVX512-BF16 CPUs without AMX: bf16 weights times activations that are bf16 values (a torch bf16
        // model under install(); float32 ones would need three passes, slower than the FMA GEMM) run
        // the AMX GEMM on `vdpbf16ps` tiles, twice the multiply-adds of an FMA per instruction.
        if isa >= Isa::Avx512 && m >= bf16_gemm::MIN_M && dpbf16::usable() && bf16_valued(x) {
            BF16_DOT_CALLS.with(|c| c.set(c.get() + 1));
            // SAFETY: AVX-512 (the tier, asserted supported) and AVX512-BF16 (`usable`) are present;
            // lengths were checked against m, k, n, all non-zero here; y is ours alone.
            unsafe { bf16_gemm::gemm(par, &g, &dpbf16::Dpbf16::<dpbf16::Real>::new, true) };
            return;
        }
    }
    let t = Tier::of(isa);
    let fmas = mn.saturating_mul(k);
    let want = par
        .num_threads()
        .clamp(1, (fmas / MIN_FMAS_PER_TASK).max(1));

    let tiles: Vec<(Range<usize>, Range<usize>)> = if m <= t.gemv_max_m {
        // GEMV: each task streams a disjoint block of weight rows, once, for all x rows.
        chunk_ranges(n, want, 16)
            .into_iter()
            .map(|c| (0..m, c))
            .collect()
    } else if n.div_ceil(t.nr) >= 4 * want || m.div_ceil(t.mr) < want {
        // GEMM, enough weight panels: split N so each weight panel is packed by one task.
        chunk_ranges(n, want, t.nr)
            .into_iter()
            .map(|c| (0..m, c))
            .collect()
    } else {
        // GEMM with few columns: split M instead (each task packs the few panels itself).
        chunk_ranges(m, want, t.mr)
            .into_iter()
            .map(|r| (r, 0..n))
            .collect()
    };
    let gemv = m <= t.gemv_max_m;
    let task = |i: usize| {
        let (rows, cols) = tiles[i].clone();
        // SAFETY: `t` belongs to `isa`, which was asserted supported above; the tiles are
        // disjoint (chunk_ranges yields disjoint ranges along one axis), so each task writes
        // its own elements of y; all slices were length-checked against m, k, n above.
        unsafe {
            if gemv {
                (t.gemv)(&problem, rows, cols)
            } else {
                (t.gemm)(&problem, rows, cols)
            }
        }
    };
    run_tasks(par, tiles.len(), &task);
}

/// Whether every value of x is a bf16 value (its low 16 bits zero): activations a bf16 model produced.
fn bf16_valued(x: &[f32]) -> bool {
    // Blocks of 64 fold without a branch (vectorised); the first float32 block decides for most inputs.
    x.chunks(64)
        .all(|c| c.iter().fold(0u32, |a, v| a | (v.to_bits() & 0xffff)) == 0)
}

thread_local! {
    /// Calls this thread ran on `vdpbf16ps` tiles (tests prove the path ran with it).
    static BF16_DOT_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Calls of `linear` the calling thread has run on AVX512-BF16 `vdpbf16ps` tiles.
pub fn bf16_dot_calls() -> usize {
    BF16_DOT_CALLS.with(std::cell::Cell::get)
}

/// Whether this CPU runs bf16 linears of bf16-valued activations on `vdpbf16ps` (AVX512-BF16, no AMX).
pub fn bf16_dot_usable() -> bool {
    #[cfg(target_arch = "x86_64")]
    return dpbf16::usable();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Empty sums (k = 0): every row of y [.., n] is the bias, or zeros.
pub(crate) fn broadcast_bias(y: &mut [f32], n: usize, bias: Option<&[f32]>) {
    for row in y.chunks_exact_mut(n) {
        match bias {
            Some(b) => row.copy_from_slice(b),
            None => row.fill(0.0),
        }
    }
}

/// The GEMV's walk over a tile of y, shared by the SIMD tiers: weight rows 8 at a time, each block
/// visited by every group of up to 4 x rows before the next, so it (8 * k weights) is fetched from
/// memory once and re-read from L1/L2. `full(i, j, g)` runs the g x rows from i over the whole block
/// of weight rows from j; `edge(i, j, g)` over the single weight row j of a last, partial block.
/// Inlined into each tier's `#[target_feature]` `gemv_impl`, whose closures inherit its features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn for_each_gemv_tile(
    rows: Range<usize>,
    cols: Range<usize>,
    mut full: impl FnMut(usize, usize, usize),
    mut edge: impl FnMut(usize, usize, usize),
) {
    const JB: usize = 8;
    let mut j = cols.start;
    while j < cols.end {
        let jb = JB.min(cols.end - j);
        let mut i = rows.start;
        while i < rows.end {
            let g = (rows.end - i).min(4);
            if jb == JB {
                full(i, j, g);
            } else {
                for jj in j..j + jb {
                    edge(i, jj, g);
                }
            }
            i += g;
        }
        j += jb;
    }
}

/// Signature shared by every tier's `gemv` and `gemm`: fill the tile `rows x cols` of y.
type TileFn = unsafe fn(&Problem<'_>, Range<usize>, Range<usize>);

/// One tier's entry points and blocking constants.
struct Tier {
    gemv: TileFn,
    gemm: TileFn,
    mr: usize,
    nr: usize,
    gemv_max_m: usize,
}

impl Tier {
    fn of(isa: Isa) -> Tier {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Amx => Tier {
                gemv: avx512::gemv,
                gemm: avx512::gemm,
                mr: avx512::MR,
                nr: avx512::NR,
                gemv_max_m: avx512::GEMV_MAX_M,
            },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::AvxVnni => Tier {
                gemv: avx2::gemv,
                gemm: avx2::gemm,
                mr: avx2::MR,
                nr: avx2::NR,
                gemv_max_m: avx2::GEMV_MAX_M,
            },
            _ => Tier {
                gemv: generic::gemv,
                gemm: generic::gemm,
                mr: generic::MR,
                nr: generic::NR,
                gemv_max_m: generic::GEMV_MAX_M,
            },
        }
    }
}

/// Test/bench hook: runs one tier's GEMV or GEMM path directly on the whole output, bypassing
/// the path choice, so both paths can be checked against each other at any m.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn linear_path(
    isa: Isa,
    gemm: bool,
    x: &[f32],
    m: usize,
    k: usize,
    w: Weight<'_>,
    n: usize,
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    assert!(
        k > 0 && m > 0 && n > 0,
        "linear_path: sizes must be non-zero"
    );
    assert!(x.len() == m * k && w.len() == n * k && y.len() == m * n);
    assert!(bias.is_none_or(|b| b.len() == n));
    assert!(
        isa.is_supported(),
        "linear_path: {} unsupported",
        isa.name()
    );
    let t = Tier::of(isa);
    let p = Problem {
        x,
        m,
        k,
        w,
        n,
        bias,
        y: SyncPtr(y.as_mut_ptr()),
    };
    // SAFETY: tier supported (asserted), single task owns all of y, lengths checked above.
    unsafe {
        if gemm {
            (t.gemm)(&p, 0..m, 0..n)
        } else {
            (t.gemv)(&p, 0..m, 0..n)
        }
    }
}
