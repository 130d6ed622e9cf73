//! The executor's attention instruction: `scaled_dot_product_attention(q, k, v, attn_mask)` with
//! q [B, Hq, T, D], k/v [B, Hkv, S, D] (grouped-query: q head h reads kv head h / (Hq / Hkv)) and
//! an optional boolean or additive mask broadcast to [B, Hq, T, S] that is the same for every head.
//!
//! A static KV cache hands attention its whole buffer plus a mask hiding the unused tail. When a
//! batch row's mask is a causal staircase (query t sees exactly keys 0..L-T+t, the rest masked),
//! the instruction runs the fast `decode_attention` kernel on the first L keys only; any other
//! mask (left padding, custom masks) takes the exact scalar path below.
//!
//! Numerical contract: as `attention::decode_attention` (f32 scores and sums; for bf16 the
//! softmax numerators are rounded to bf16 before they weight V). Masked keys contribute exactly
//! zero; a query whose keys are all masked gets zeros.

use super::view::{load_f32, DType, View};
use crate::attention::{decode_attention, View4};
use crate::bf16::{f32_to_bf16, Bf16, Element};
use crate::isa::Isa;
use crate::par::Parallel;

#[derive(Clone, Debug)]
pub struct Attend {
    pub q: View,
    pub k: View,
    pub v: View,
    pub mask: Option<View>,
    /// No mask and `is_causal=True` (the planner only passes it when T == S, where torch's
    /// top-left causal mask equals the kernel's bottom-right one).
    pub causal: bool,
    pub scale: f32,
    pub out: View,
}

impl Attend {
    pub fn new(
        q: View,
        k: View,
        v: View,
        mask: Option<View>,
        causal: bool,
        scale: f32,
        out: View,
    ) -> Result<Attend, String> {
        let bad = |why: &str| {
            Err(format!(
                "attention: {why} (q {:?}, k {:?}, v {:?}, out {:?})",
                q.dims, k.dims, v.dims, out.dims
            ))
        };
        if [&q, &k, &v, &out].iter().any(|x| x.ndim() != 4) {
            return bad("q, k, v and out must be 4-D");
        }
        let [b, hq, t, d] = [q.dims[0], q.dims[1], q.dims[2], q.dims[3]];
        let (hkv, s) = (k.dims[1], k.dims[2]);
        if k.dims != v.dims || k.dims[0] != b || k.dims[3] != d || hkv == 0 || hq % hkv != 0 {
            return bad("k/v dims do not fit q");
        }
        if out.dims != q.dims {
            return bad("out must be shaped like q");
        }
        if !(q.dtype.is_float() && k.dtype == q.dtype && v.dtype == q.dtype && out.dtype == q.dtype)
        {
            return bad("q, k, v and out must share one float dtype");
        }
        for x in [&q, &k, &v] {
            if x.strides[3] != 1 && d > 1 {
                return bad("the last dim of q, k and v must be dense");
            }
        }
        if causal && (mask.is_some() || t != s) {
            return bad("is_causal is only supported without a mask and with T == S");
        }
        if let Some(m) = &mask {
            if m.dims != [b, hq, t, s] || (hq > 1 && m.strides[1] != 0) {
                return bad(
                    "the mask must broadcast to [B, Hq, T, S] and be the same for every head",
                );
            }
        }
        Ok(Attend {
            q,
            k,
            v,
            mask,
            causal,
            scale,
            out,
        })
    }

    /// # Safety
    /// Views inside their slots (checked at decode); `out` does not overlap q/k/v/mask.
    pub unsafe fn run(&self, isa: Isa, par: &dyn Parallel, slots: &[*mut u8]) {
        // SAFETY: forwarded.
        unsafe {
            match self.q.dtype {
                DType::Bf16 => self.run_typed::<Bf16>(isa, par, slots),
                _ => self.run_typed::<f32>(isa, par, slots),
            }
        }
    }

    /// Keys each batch row attends to when its mask is a causal staircase, else None.
    ///
    /// # Safety
    /// As for `run`.
    unsafe fn staircase(&self, slots: &[*mut u8], b: usize) -> Option<usize> {
        let Some(m) = &self.mask else {
            // Without a mask every query sees every key: the kernel's causal rule agrees only
            // for one query token, or when T == S and torch was asked for a causal mask.
            return (self.causal || self.q.dims[2] == 1).then_some(self.k.dims[2]);
        };
        let (t, s) = (self.q.dims[2], self.k.dims[2]);
        let mut row = vec![0.0f32; s];
        let mut first = 0;
        for tt in 0..t {
            // SAFETY: row (b, head 0, tt) of the checked mask view.
            unsafe {
                let p = m
                    .ptr(slots)
                    .add((b * m.strides[0] + tt * m.strides[2]) * m.dtype.size());
                load_f32(p, m.dtype, m.strides[3], &mut row);
            }
            let visible = |x: f32| {
                if m.dtype == DType::Bool {
                    x != 0.0
                } else {
                    x == 0.0
                }
            };
            let hidden = |x: f32| {
                if m.dtype == DType::Bool {
                    x == 0.0
                } else {
                    x == f32::NEG_INFINITY
                }
            };
            let p = row.iter().take_while(|&&x| visible(x)).count();
            if p == 0 || !row[p..].iter().all(|&x| hidden(x)) {
                return None;
            }
            if tt == 0 {
                first = p;
            } else if p != first + tt {
                return None;
            }
        }
        Some(first + t - 1)
    }

    /// # Safety
    /// As for `run`.
    unsafe fn run_typed<E: Element>(&self, isa: Isa, par: &dyn Parallel, slots: &[*mut u8]) {
        let [b, hq, t, d] = [
            self.q.dims[0],
            self.q.dims[1],
            self.q.dims[2],
            self.q.dims[3],
        ];
        let per_batch = hq * t * d;
        // Kernels write [B, Hq, T, D] row-major; torch lays a multi-token result out as
        // [B, T, Hq, D], so such outputs go through a temporary and a strided copy.
        let contiguous = self.out.is_contiguous();
        let mut tmp: Vec<E> = if contiguous {
            Vec::new()
        } else {
            vec![E::from_f32(0.0); b * per_batch]
        };
        let dst: *mut E = if contiguous {
            // SAFETY: the checked, aligned out view starts inside its slot.
            unsafe { (slots[self.out.slot] as *mut E).add(self.out.offset / self.out.dtype.size()) }
        } else {
            tmp.as_mut_ptr()
        };
        for bb in 0..b {
            // SAFETY: forwarded.
            let keys = unsafe { self.staircase(slots, bb) };
            match keys {
                Some(l) if l >= t => {
                    // SAFETY: batch row bb of each checked view; out rows of batch bb are a
                    // contiguous block that no input overlaps.
                    unsafe {
                        let q = self.view4::<E>(slots, &self.q, bb, self.q.dims[2]);
                        let k = self.view4::<E>(slots, &self.k, bb, l);
                        let v = self.view4::<E>(slots, &self.v, bb, l);
                        let out =
                            std::slice::from_raw_parts_mut(dst.add(bb * per_batch), per_batch);
                        decode_attention(isa, par, q, k, v, self.scale, out);
                    }
                }
                // SAFETY: forwarded; dst holds B*Hq*T*D elements.
                _ => unsafe { self.masked::<E>(slots, bb, dst) },
            }
        }
        if !contiguous {
            let o = &self.out;
            let s = &o.strides;
            for (row, chunk) in tmp.chunks_exact(d.max(1)).enumerate().take(b * hq * t) {
                let (bb, h, tt) = (row / (hq * t), (row / t) % hq, row % t);
                for (i, &x) in chunk.iter().enumerate() {
                    // SAFETY: element (bb, h, tt, i) of the checked, aligned out view.
                    unsafe {
                        (o.ptr(slots) as *mut E)
                            .add(bb * s[0] + h * s[1] + tt * s[2] + i * s[3])
                            .write(x)
                    };
                }
            }
        }
    }

    /// Batch row `b` of a checked view, keeping the first `rows` entries of dim 2.
    ///
    /// # Safety
    /// The view lies inside its slot; the slot holds E values aligned for E.
    unsafe fn view4<'a, E: Element>(
        &self,
        slots: &[*mut u8],
        v: &View,
        b: usize,
        rows: usize,
    ) -> View4<'a, E> {
        let dims = [1, v.dims[1], rows, v.dims[3]];
        let strides = [v.strides[0], v.strides[1], v.strides[2], v.strides[3]];
        let span = if dims.contains(&0) {
            0
        } else {
            1 + (0..4).map(|i| (dims[i] - 1) * strides[i]).sum::<usize>()
        };
        // SAFETY: a sub-view of the checked view; the start is aligned (checked at run time).
        let data = unsafe {
            std::slice::from_raw_parts((v.ptr(slots) as *const E).add(b * v.strides[0]), span)
        };
        View4 {
            data,
            dims,
            strides,
        }
    }

    /// Exact masked attention for batch row `b` (scalar loops; used for irregular masks and
    /// for several unmasked query tokens that all see every key).
    ///
    /// # Safety
    /// As for `run`.
    unsafe fn masked<E: Element>(&self, slots: &[*mut u8], b: usize, dst: *mut E) {
        let [_, hq, t, d] = [
            self.q.dims[0],
            self.q.dims[1],
            self.q.dims[2],
            self.q.dims[3],
        ];
        let (hkv, s) = (self.k.dims[1], self.k.dims[2]);
        let group = hq / hkv;
        let bf16 = self.q.dtype == DType::Bf16;
        let (mut qrow, mut krow, mut vrow) = (vec![0.0f32; d], vec![0.0f32; d], vec![0.0f32; d]);
        let mut mrow = vec![0.0f32; s];
        let mut scores = vec![0.0f32; s];
        let mut acc = vec![0.0f32; d];
        let at = |x: &View, i: [usize; 3]| -> *const u8 {
            // SAFETY: element (i, 0) of a checked 4-D view.
            unsafe {
                x.ptr(slots).add(
                    (i[0] * x.strides[0] + i[1] * x.strides[1] + i[2] * x.strides[2])
                        * x.dtype.size(),
                )
            }
        };
        for h in 0..hq {
            let kvh = h / group;
            for tt in 0..t {
                // SAFETY: rows of checked views.
                unsafe {
                    load_f32(at(&self.q, [b, h, tt]), self.q.dtype, 1, &mut qrow);
                    match &self.mask {
                        Some(m) => load_f32(at(m, [b, 0, tt]), m.dtype, m.strides[3], &mut mrow),
                        None => mrow.fill(1.0),
                    }
                }
                let boolean = self.mask.as_ref().is_none_or(|m| m.dtype == DType::Bool);
                let mut max = f32::NEG_INFINITY;
                for (j, sc) in scores.iter_mut().enumerate() {
                    if boolean && mrow[j] == 0.0 {
                        *sc = f32::NEG_INFINITY;
                        continue;
                    }
                    // SAFETY: key row j of the checked k view.
                    unsafe { load_f32(at(&self.k, [b, kvh, j]), self.k.dtype, 1, &mut krow) };
                    let dot: f32 = qrow.iter().zip(&krow).map(|(a, c)| a * c).sum();
                    *sc = dot * self.scale + if boolean { 0.0 } else { mrow[j] };
                    max = max.max(*sc);
                }
                acc.fill(0.0);
                let mut sum = 0.0f32;
                if max > f32::NEG_INFINITY {
                    for (j, &sc) in scores.iter().enumerate() {
                        if sc == f32::NEG_INFINITY {
                            continue;
                        }
                        let p = (sc - max).exp();
                        sum += p;
                        let pw = if bf16 {
                            Bf16(f32_to_bf16(p)).to_f32()
                        } else {
                            p
                        };
                        // SAFETY: value row j of the checked v view.
                        unsafe { load_f32(at(&self.v, [b, kvh, j]), self.v.dtype, 1, &mut vrow) };
                        acc.iter_mut().zip(&vrow).for_each(|(a, x)| *a += pw * x);
                    }
                }
                let base = ((b * hq + h) * t + tt) * d;
                for (i, &a) in acc.iter().enumerate() {
                    let y = if sum > 0.0 { a / sum } else { 0.0 };
                    // SAFETY: dst holds B*Hq*T*D elements (caller).
                    unsafe { dst.add(base + i).write(E::from_f32(y)) };
                }
            }
        }
    }
}
