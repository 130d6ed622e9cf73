//! Decode attention over a KV cache: the public entry point. Validates shapes, splits the work
//! into (batch, kv head, q-head subgroup, query block, key range) tasks and dispatches the
//! per-ISA primitives to `block::attend`. Caches longer than SPLIT_KEYS are cut into key
//! ranges whose partial softmax results are merged afterwards (flash-decoding), so a single
//! sequence with few kv heads still uses every thread without reading K/V twice.
//!
//! Numerical contract: out = softmax(s) v with s = scale * q.k^T (q is scaled first), optionally
//! soft-capped to cap * tanh(s / cap) (Gemma 2), and a causal mask against the cache end: query t of
//! T sees keys 0..=S-T+t, or with a sliding window of w keys only the last w of those (itself
//! included, as Hugging Face's sliding-window mask). Inputs are widened to f32 in small row chunks (the cache
//! is never copied whole); scores, the max-subtracted softmax and all sums are f32; split key
//! ranges are combined by rescaling with exp(range max - overall max); each output row is
//! divided by its softmax denominator and converted to E once, at the end. For bf16 inputs the
//! softmax numerators are rounded to bf16 before they weight V (the denominator is their f32
//! sum), matching torch's CPU scaled_dot_product_attention for bf16. The task split
//! depends only on the shapes' key ranges, so results do not depend on the runner. Tiers differ
//! only in summation order and in the exp implementation (SIMD tiers use a polynomial exp
//! accurate to a few ulp).

mod block;
mod generic;
mod kv_view;
mod operands;
mod scores_q8;
mod stamp;
mod values_q8;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_q8;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_q8;
#[cfg(target_arch = "x86_64")]
mod avxvnni_q8;

use crate::bf16::Element;
use crate::isa::Isa;
use crate::par::{run_tasks, Parallel, SyncPtr};
pub use kv_view::KvView;
pub(crate) use operands::{PvArgs, QkArgs};

/// A strided 4-D view. `strides` are in elements; `strides[3]` must be 1 (rows contiguous)
/// unless `dims[3] <= 1`; `data` must cover the largest offset.
#[derive(Clone, Copy, Debug)]
pub struct View4<'a, E> {
    pub data: &'a [E],
    pub dims: [usize; 4],
    pub strides: [usize; 4],
}

impl<'a, E> View4<'a, E> {
    /// A row-major (C-contiguous) view of `data` with the given dims.
    pub fn contiguous(data: &'a [E], dims: [usize; 4]) -> Self {
        let strides = [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1];
        View4 {
            data,
            dims,
            strides,
        }
    }

    /// Panics unless every element the dims address lies inside `data`.
    fn check(&self, name: &str) {
        if self.dims.contains(&0) {
            return;
        }
        assert!(
            self.strides[3] == 1 || self.dims[3] == 1,
            "decode_attention: {name} must have unit stride in its last dim, got strides {:?}",
            self.strides
        );
        let max_offset = self
            .dims
            .iter()
            .zip(&self.strides)
            .try_fold(0usize, |acc, (&d, &s)| {
                (d - 1).checked_mul(s)?.checked_add(acc)
            })
            .unwrap_or(usize::MAX);
        assert!(
            max_offset < self.data.len(),
            "decode_attention: {name} with dims {:?} and strides {:?} needs {} elements, \
             data has {}",
            self.dims,
            self.strides,
            max_offset.saturating_add(1),
            self.data.len()
        );
    }

    /// Offset of row (a, b, c), i.e. of element (a, b, c, 0).
    #[inline]
    fn offset(&self, a: usize, b: usize, c: usize) -> usize {
        a * self.strides[0] + b * self.strides[1] + c * self.strides[2]
    }
}

/// Per-ISA primitives used by `block::attend` (every tier exports these names).
pub(crate) struct Ops {
    /// The tier these are (for the helpers outside this module it calls, such as `row_q8`).
    pub isa: Isa,
    /// The scores `QkArgs` describes.
    pub qk: unsafe fn(QkArgs<'_>),
    /// The weighted sums `PvArgs` describes: the tier's one-row `pv` (acc[..d] += sum_s p[s] *
    /// v[s*ldv..][..d]) on each row over the same keys, bit for bit as `pv` per row.
    pub pv_rows: unsafe fn(PvArgs<'_>),
    /// row[i] = exp(row[i] - max(row)) for a non-empty row; returns (max, sum of new row).
    pub exp_sum: unsafe fn(&mut [f32]) -> (f32, f32),
    /// dst[i] = widened src[i].
    pub widen_bf16: unsafe fn(&[u16], &mut [f32]),
    /// dst[i] = scale * codes[i] (a row of an 8-bit cache).
    pub widen_q8: unsafe fn(&[i8], f32, &mut [f32]),
    /// x[i] = tanh(x[i] / cap) * cap.
    pub softcap: unsafe fn(&mut [f32], f32),
    /// Integer scores against an 8-bit cache (`scores_q8`), where the tier has them; the others sum
    /// the same codes with `qk`, to the same bits.
    pub qk_q8: Option<unsafe fn(scores_q8::QkQ8Args<'_>)>,
    /// Weighted sums of an 8-bit cache's values (`values_q8`), the same bits in every tier.
    pub pv_q8: unsafe fn(values_q8::PvQ8Args<'_>),
}

/// The `Ops` of tier module `$tier` (its attention kernels and `vmath`'s soft-cap of the same tier).
/// The scalar tier's safe functions coerce to the `unsafe fn` pointers.
macro_rules! tier_ops {
    ($isa:expr, $tier:ident, $qk_q8:expr, $pv_q8:expr) => {
        Ops {
            isa: $isa,
            qk_q8: $qk_q8,
            pv_q8: $pv_q8,
            qk: $tier::qk,
            pv_rows: $tier::pv_rows,
            exp_sum: $tier::exp_sum,
            widen_bf16: $tier::widen_bf16,
            widen_q8: $tier::widen_q8,
            softcap: crate::vmath::$tier::softcap,
        }
    };
}

impl Ops {
    fn of(isa: Isa) -> Ops {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Amx => {
                let vnni = avx512_q8::usable();
                let qk_q8 = vnni.then_some(avx512_q8::qk_q8 as _);
                let pv_q8 = if vnni {
                    avx512_q8::pv_q8
                } else {
                    avx2_q8::pv_q8
                };
                tier_ops!(isa, avx512, qk_q8, pv_q8)
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 | Isa::AvxVnni => {
                let vnni = isa == Isa::AvxVnni && avxvnni_q8::usable();
                let qk_q8 = vnni.then_some(avxvnni_q8::real::qk_q8 as _);
                tier_ops!(isa, avx2, qk_q8, avx2_q8::pv_q8)
            }
            _ => tier_ops!(isa, generic, None, values_q8::pv_q8),
        }
    }
}

/// What a query sees and how its scores are formed, beyond the shapes.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    /// Multiplies q before the dot products.
    pub scale: f32,
    /// Scores become cap * tanh(score / cap) (Gemma 2's attn_logit_softcapping).
    pub softcap: Option<f32>,
    /// Keys a query sees, itself included; None = every earlier key.
    pub window: Option<usize>,
}

impl AttnParams {
    /// Plain causal attention with this scale.
    pub fn scaled(scale: f32) -> AttnParams {
        AttnParams {
            scale,
            softcap: None,
            window: None,
        }
    }
}

/// Query rows (heads x tokens) one task handles together; bounds its scratch to
/// MAX_ROWS * (2 * D + S) + 64 * D floats (64 = `block::KEY_CHUNK`).
const MAX_ROWS: usize = 32;
/// Keys per split of a long cache (a multiple of `block::KEY_CHUNK`).
const SPLIT_KEYS: usize = 512;
/// Below this many multiply-adds (q.k plus p.v) everything runs on the caller.
const MIN_PARALLEL_FMAS: usize = 1 << 16;

/// q dims [B, Hq, T, D]; k, v dims [B, Hkv, S, D]; out contiguous [B, Hq, T, D].
/// q head h reads kv head h / (Hq / Hkv); query t attends to keys 0..=S-T+t.
///
/// Returns without work when B, Hq or T is 0. Panics (never UB) on T > S, Hq % Hkv != 0,
/// mismatched dims, non-unit last stride, views that overrun their data, a wrong `out`
/// length, or an `isa` this CPU does not support.
pub fn decode_attention<E: Element>(
    isa: Isa,
    par: &dyn Parallel,
    q: View4<'_, E>,
    k: View4<'_, E>,
    v: View4<'_, E>,
    scale: f32,
    out: &mut [E],
) {
    attention(isa, par, q, k, v, &AttnParams::scaled(scale), out)
}

/// `decode_attention` with a sliding window and soft-capping (`AttnParams`). A window of w keys
/// costs what full attention over w + T keys costs: key ranges no query of a task can see are
/// skipped. Panics also on a window of 0 or a non-positive cap.
pub fn attention<E: Element>(
    isa: Isa,
    par: &dyn Parallel,
    q: View4<'_, E>,
    k: View4<'_, E>,
    v: View4<'_, E>,
    params: &AttnParams,
    out: &mut [E],
) {
    attention_kv(isa, par, q, KvView::Elem(k), KvView::Elem(v), params, out)
}

/// `attention` over K and V in a cache's own format (`KvView`: f32, bf16 or int8 rows with a scale
/// each), widened to f32 a chunk of keys at a time. Same contract; the bf16 rounding of the softmax
/// numerators applies only where q, K and V are all bf16 (the torch op), not to a bf16 cache.
pub fn attention_kv<E: Element>(
    isa: Isa,
    par: &dyn Parallel,
    q: View4<'_, E>,
    k: KvView<'_, E>,
    v: KvView<'_, E>,
    params: &AttnParams,
    out: &mut [E],
) {
    let [b, hq, t, d] = q.dims;
    let [kb, hkv, s, kd] = k.dims();
    let total = q
        .dims
        .iter()
        .try_fold(1usize, |acc, &x| acc.checked_mul(x))
        .expect("decode_attention: q dims overflow usize");
    assert_eq!(
        out.len(),
        total,
        "decode_attention: out has {} elements, expected B*Hq*T*D for q dims {:?}",
        out.len(),
        q.dims
    );
    if b == 0 || hq == 0 || t == 0 {
        return;
    }
    assert_eq!(
        k.dims(),
        v.dims(),
        "decode_attention: k dims {:?} differ from v dims {:?}",
        k.dims(),
        v.dims()
    );
    assert!(
        kb == b && kd == d,
        "decode_attention: k/v dims {:?} do not match q dims {:?} in batch or head size",
        k.dims(),
        q.dims
    );
    assert!(
        hkv > 0 && hq % hkv == 0,
        "decode_attention: {hq} query heads are not a multiple of {hkv} kv heads"
    );
    assert!(
        t <= s,
        "decode_attention: {t} query tokens but only {s} cached keys (T must be <= S)"
    );
    q.check("q");
    k.check("k");
    v.check("v");
    assert!(
        isa.is_supported(),
        "decode_attention: ISA tier {} is not supported by this CPU",
        isa.name()
    );
    assert!(
        params.window != Some(0),
        "decode_attention: a sliding window must hold at least one key"
    );
    assert!(
        params.softcap.is_none_or(|c| c > 0.0),
        "decode_attention: the soft-cap must be positive"
    );
    if d == 0 {
        return;
    }

    let group = hq / hkv;
    let t_per = t.min((MAX_ROWS / group).max(1));
    let t_blocks = t.div_ceil(t_per);
    // Long caches are cut into fixed key ranges merged afterwards (see the module doc). The
    // cut depends only on S, never on the runner, so results are runner-independent.
    let parts = s.div_ceil(SPLIT_KEYS).max(1);
    let units = b * hkv * t_blocks;
    let threads = par.num_threads().max(1);
    // Whole groups share each K/V row while it is hot; split a group only when there would
    // otherwise be too few tasks to keep every thread busy (per-row results do not change).
    let h_per = if units * parts < 2 * threads {
        group.div_ceil((2 * threads).div_ceil(units * parts).min(group))
    } else {
        group
    }
    .min(MAX_ROWS);
    let h_blocks = group.div_ceil(h_per);
    let n_blocks = units * h_blocks;
    let n_tasks = n_blocks * parts;

    // Block i (of n_blocks) in (b, kv head, token block, head block) order.
    let block_of = |i: usize, keys: std::ops::Range<usize>| {
        let hb = i % h_blocks;
        let tb = (i / h_blocks) % t_blocks;
        let kvh = (i / (h_blocks * t_blocks)) % hkv;
        let bb = i / (h_blocks * t_blocks * hkv);
        let h0 = kvh * group + hb * h_per;
        let t0 = tb * t_per;
        block::Block {
            b: bb,
            kv_head: kvh,
            heads: h0..(h0 + h_per).min((kvh + 1) * group),
            tokens: t0..(t0 + t_per).min(t),
            keys,
        }
    };

    let ops = Ops::of(isa);
    // Partial rows [max, sum, acc[..d]] of every (block, part) when the keys are split.
    let slot = h_per * t_per * (d + 2);
    let mut partials = vec![0.0f32; if parts > 1 { n_tasks * slot } else { 0 }];
    let partial_ptr = SyncPtr(partials.as_mut_ptr());
    let out_ptr = SyncPtr(out.as_mut_ptr());
    let task = |i: usize| {
        let part = i % parts;
        let job = block_of(i / parts, part * SPLIT_KEYS..(part + 1) * SPLIT_KEYS);
        let sink = if parts > 1 {
            // SAFETY: i < n_tasks and `partials` holds n_tasks * slot floats, so the offset
            // stays inside the allocation; task i alone writes partials[i*slot..(i+1)*slot].
            block::Sink::Partial(SyncPtr(unsafe { partial_ptr.get().add(i * slot) }))
        } else {
            block::Sink::Out(out_ptr)
        };
        // SAFETY: tasks write disjoint memory: either their own partial slot, or (unsplit)
        // disjoint (b, head, token) rows of `out`, which has B*Hq*T*D elements (asserted); the
        // views were bounds-checked and `ops` belongs to a supported ISA (asserted above).
        unsafe { block::attend(&ops, &q, &k, &v, params, sink, &job) };
    };
    let fmas = (b * hq * t).saturating_mul(s).saturating_mul(2 * d);
    if fmas < MIN_PARALLEL_FMAS {
        (0..n_tasks).for_each(task);
    } else {
        run_tasks(par, n_tasks, &task);
    }
    if parts > 1 {
        for i in 0..n_blocks {
            let job = block_of(i, 0..s);
            block::merge(
                &partials[i * parts * slot..(i + 1) * parts * slot],
                parts,
                &job,
                &q.dims,
                out,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Ops, PvArgs, QkArgs};
    use crate::isa;

    /// A deterministic xorshift stream (the attention tests' inputs).
    pub(super) fn stream(n: usize, seed: u64) -> Vec<u64> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            })
            .collect()
    }

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        stream(n, seed)
            .iter()
            .map(|&x| (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }

    /// The multi-row kernels (`qk` over many rows, `pv_rows`) against the same kernels one row at a
    /// time, bit for bit, in every tier the host runs: odd and even key counts, head sizes that mix
    /// whole and masked vectors, row counts on both sides of the tiles' 3.
    #[test]
    fn multi_row_kernels_equal_one_row_calls_bit_for_bit() {
        for tier in isa::supported() {
            let ops = Ops::of(tier);
            for d in [16, 64, 80, 96, 128] {
                for keys in [1, 2, 7, 8, 9, 63, 64, 65] {
                    for rows in [1, 2, 3, 4, 5, 7] {
                        let lds = keys + 3;
                        let (ldk, ldv) = (d + 5, d + 1);
                        let q = values(rows * d, 1);
                        let k = values(keys * ldk, 2);
                        let v = values(keys * ldv, 3);
                        let p = values(rows * lds, 4);
                        let acc0 = values(rows * d, 5);
                        let (mut many, mut one) = (vec![0.0; rows * lds], vec![0.0; rows * lds]);
                        let (mut acc_many, mut acc_one) = (acc0.clone(), acc0.clone());
                        let run =
                            |q: &[f32], p: &[f32], rows, scores: &mut [f32], acc: &mut [f32]| {
                                let qk = QkArgs {
                                    q,
                                    rows,
                                    k: &k,
                                    ldk,
                                    keys,
                                    d,
                                    scores,
                                    lds,
                                };
                                let pv = PvArgs {
                                    p,
                                    lds,
                                    rows,
                                    keys,
                                    v: &v,
                                    ldv,
                                    d,
                                    acc,
                                };
                                // SAFETY: the tier is supported; every slice covers what the kernels read and write.
                                unsafe {
                                    (ops.qk)(qk);
                                    (ops.pv_rows)(pv);
                                }
                            };
                        run(&q, &p, rows, &mut many, &mut acc_many);
                        for r in 0..rows {
                            let (sr, ar) = (&mut one[r * lds..], &mut acc_one[r * d..(r + 1) * d]);
                            run(&q[r * d..], &p[r * lds..], 1, sr, ar);
                        }
                        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        let at = format!("{} d {d} keys {keys} rows {rows}", tier.name());
                        assert_eq!(bits(&many), bits(&one), "qk, {at}");
                        assert_eq!(bits(&acc_many), bits(&acc_one), "pv_rows, {at}");
                    }
                }
            }
        }
    }

    /// Every tier's 8-bit widening equals the scalar reference bit for bit, tails included.
    #[test]
    fn widen_q8_equals_the_scalar_reference_on_every_tier() {
        let codes: Vec<i8> = (0..300)
            .map(|i| ((i * 37 + 11) % 256) as u8 as i8)
            .collect();
        for tier in isa::supported() {
            let ops = Ops::of(tier);
            for n in [0, 1, 7, 8, 15, 16, 17, 63, 64, 65, 128, 300] {
                let (mut fast, mut reference) = (vec![9.0f32; n], vec![0.0f32; n]);
                // SAFETY: the tier is supported and both slices hold n values.
                unsafe { (ops.widen_q8)(&codes[..n], 0.013_7, &mut fast) };
                super::generic::widen_q8(&codes[..n], 0.013_7, &mut reference);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&reference), "{} n {n}", tier.name());
            }
        }
    }
}
