//! The step executor: runs a whole model step (e.g. one decode token of a compiled Hugging Face
//! model) as a list of instructions over caller-owned buffers, in one call.
//!
//! The program is planned in Python (`kwker_torch/planner.py`) from one traced run of the graph
//! and handed over as a flat list of i64 words; buffers are "slots" (graph inputs such as the KV
//! cache, constants such as weights, and preallocated intermediates) whose base pointers the caller
//! passes on every run. Every view is checked against its slot's size when the program is decoded,
//! so a run only needs the caller's promise that each pointer covers the size declared for it.
//!
//! Word format (see `kwker_torch/planner.py`, which writes it):
//!   view    = slot, byte offset, dtype, ndim, dims[ndim], strides[ndim]
//!   operand = 0, view | 1, f64 bits
//!   1 EW      op, out view, n, operand * n
//!   2 REDUCE  mean(0/1), out view, in view
//!   3 LINEAR  x view [m,k], w view [n,k], has_bias, (bias view [n]), out view [m,n]
//!   4 ATTEND  q, k, v views, has_mask, (mask view), causal, scale f64 bits, out view
//!   5 INDEX_COPY dim, dst view, index view, src view
//!   6 EMBED   ids view, weight view, out view
//!
//! Numerical contract: each instruction follows its kernel's contract (pointwise: torch's f32
//! arithmetic, rounded once to the output type; linear: f32 sums of exact products; attention:
//! as `attention::decode_attention`). Instructions run in program order.

pub mod attend;
pub mod pointwise;
pub mod view;

use crate::isa::Isa;
use crate::linear::{linear, Weight};
use crate::par::Parallel;
use attend::Attend;
use pointwise::{Embed, Ew, EwOp, IndexCopy, Operand, Reduce};
use view::{load_f32, store_f32, DType, View};

/// y[m, n] = x[m, k] @ w[n, k]^T (+ bias).
#[derive(Clone, Debug)]
pub struct Linear {
    pub x: View,
    pub w: View,
    pub bias: Option<View>,
    pub out: View,
}

impl Linear {
    fn new(x: View, w: View, bias: Option<View>, out: View) -> Result<Linear, String> {
        let shapes = || format!("x {:?}, w {:?}, out {:?}", x.dims, w.dims, out.dims);
        if x.ndim() != 2 || w.ndim() != 2 || out.ndim() != 2 {
            return Err(format!("linear: x, w and out must be 2-D ({})", shapes()));
        }
        let (m, k, n) = (x.dims[0], x.dims[1], w.dims[0]);
        if w.dims[1] != k || out.dims != [m, n] {
            return Err(format!("linear: shapes do not fit ({})", shapes()));
        }
        if !w.is_contiguous() || !matches!(w.dtype, DType::F32 | DType::Bf16) {
            return Err("linear: the weight must be a contiguous float32/bfloat16 [n, k]".into());
        }
        if (x.strides[1] != 1 && k > 1) || (out.strides[1] != 1 && n > 1) {
            return Err("linear: rows of x and out must be dense".into());
        }
        if !x.dtype.is_float() || !out.dtype.is_float() {
            return Err("linear: x and out must be float32/bfloat16".into());
        }
        if let Some(b) = &bias {
            if b.dims != [n] || !b.dtype.is_float() {
                return Err(format!("linear: bias {:?} must be a float [{n}]", b.dims));
            }
        }
        if out.slot == x.slot || out.slot == w.slot {
            return Err("linear: out must not share a buffer with x or w".into());
        }
        Ok(Linear { x, w, bias, out })
    }

    /// # Safety
    /// As for `Program::run`.
    unsafe fn run(&self, isa: Isa, par: &dyn Parallel, slots: &[*mut u8], scratch: &mut Scratch) {
        let (m, k, n) = (self.x.dims[0], self.x.dims[1], self.w.dims[0]);
        if m == 0 || n == 0 {
            return;
        }
        // SAFETY (block): every pointer comes from a view checked against its slot at decode;
        // the weight's alignment was checked by `Program::run`; out is a different slot.
        unsafe {
            let xp = self.x.ptr(slots);
            let x: &[f32] = if self.x.dtype == DType::F32
                && (self.x.strides[0] == k || m == 1)
                && (xp as usize).is_multiple_of(4)
            {
                std::slice::from_raw_parts(xp as *const f32, m * k)
            } else {
                scratch.x.resize(m * k, 0.0);
                for (i, row) in scratch.x.chunks_exact_mut(k.max(1)).enumerate() {
                    load_f32(
                        xp.add(i * self.x.strides[0] * self.x.dtype.size()),
                        self.x.dtype,
                        1,
                        row,
                    );
                }
                &scratch.x
            };
            let wp = self.w.ptr(slots);
            let w = match self.w.dtype {
                DType::Bf16 => Weight::Bf16(std::slice::from_raw_parts(wp as *const u16, n * k)),
                _ => Weight::F32(std::slice::from_raw_parts(wp as *const f32, n * k)),
            };
            let bias = self.bias.as_ref().map(|b| {
                scratch.bias.resize(n, 0.0);
                load_f32(b.ptr(slots), b.dtype, b.strides[0], &mut scratch.bias);
                &scratch.bias[..]
            });
            let op = self.out.ptr(slots);
            let direct = self.out.dtype == DType::F32
                && (self.out.strides[0] == n || m == 1)
                && (op as usize).is_multiple_of(4);
            if direct {
                let y = std::slice::from_raw_parts_mut(op as *mut f32, m * n);
                linear(isa, par, x, m, k, w, n, bias, y);
            } else {
                scratch.y.resize(m * n, 0.0);
                linear(isa, par, x, m, k, w, n, bias, &mut scratch.y);
                for (i, row) in scratch.y.chunks_exact(n).enumerate() {
                    store_f32(
                        op.add(i * self.out.strides[0] * self.out.dtype.size()),
                        self.out.dtype,
                        1,
                        row,
                    );
                }
            }
        }
    }
}

#[derive(Clone, Debug)]
pub enum Instr {
    Ew(Ew),
    Reduce(Reduce),
    Linear(Linear),
    Attend(Attend),
    IndexCopy(IndexCopy),
    Embed(Embed),
}

#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    y: Vec<f32>,
    bias: Vec<f32>,
}

/// A decoded, checked program.
pub struct Program {
    pub instrs: Vec<Instr>,
    slot_bytes: Vec<usize>,
    /// Slots the linear/attention kernels read as typed slices: (slot, alignment).
    aligned: Vec<(usize, usize)>,
    scratch: Scratch,
}

struct Words<'a> {
    w: &'a [i64],
    pos: usize,
}

impl Words<'_> {
    fn next(&mut self) -> Result<i64, String> {
        let v = *self
            .w
            .get(self.pos)
            .ok_or("the program ends in the middle of an instruction")?;
        self.pos += 1;
        Ok(v)
    }

    fn usize(&mut self, what: &str) -> Result<usize, String> {
        let v = self.next()?;
        usize::try_from(v).map_err(|_| format!("{what} must be >= 0, got {v}"))
    }

    fn f64(&mut self) -> Result<f64, String> {
        Ok(f64::from_bits(self.next()? as u64))
    }

    fn view(&mut self, slot_bytes: &[usize]) -> Result<View, String> {
        let slot = self.usize("slot")?;
        let offset = self.usize("offset")?;
        let dtype = DType::from_code(self.next()?)?;
        let nd = self.usize("ndim")?;
        if nd > view::MAX_DIMS {
            return Err(format!(
                "a view has {nd} dims; at most {} are supported",
                view::MAX_DIMS
            ));
        }
        let dims = (0..nd)
            .map(|_| self.usize("dim"))
            .collect::<Result<Vec<_>, _>>()?;
        let strides = (0..nd)
            .map(|_| self.usize("stride"))
            .collect::<Result<Vec<_>, _>>()?;
        let v = View {
            slot,
            offset,
            dtype,
            dims,
            strides,
        };
        let size = *slot_bytes.get(slot).ok_or_else(|| {
            format!(
                "view of slot {slot}, but there are {} slots",
                slot_bytes.len()
            )
        })?;
        match v.end_bytes() {
            Some(end) if end <= size => Ok(v),
            _ => Err(format!(
                "a view (offset {}, dims {:?}, strides {:?}) reaches past its {size}-byte slot {slot}",
                v.offset, v.dims, v.strides
            )),
        }
    }
}

impl Program {
    /// Decodes and checks `words` against the byte sizes of the slots it will run on.
    pub fn decode(words: &[i64], slot_bytes: &[usize]) -> Result<Program, String> {
        let mut r = Words { w: words, pos: 0 };
        let mut instrs = Vec::new();
        let mut aligned = Vec::new();
        while r.pos < words.len() {
            let code = r.next()?;
            let at = instrs.len();
            let wrap = |e: String| format!("instruction {at}: {e}");
            let instr = match code {
                1 => {
                    let op = EwOp::from_code(r.next()?).map_err(wrap)?;
                    let out = r.view(slot_bytes).map_err(wrap)?;
                    let n = r.usize("operand count").map_err(wrap)?;
                    let mut args = Vec::with_capacity(n);
                    for _ in 0..n {
                        args.push(match r.next().map_err(wrap)? {
                            0 => Operand::View(r.view(slot_bytes).map_err(wrap)?),
                            1 => Operand::Scalar(r.f64().map_err(wrap)?),
                            k => return Err(wrap(format!("unknown operand kind {k}"))),
                        });
                    }
                    Instr::Ew(Ew::new(op, out, args).map_err(wrap)?)
                }
                2 => {
                    let mean = r.next().map_err(wrap)? != 0;
                    let out = r.view(slot_bytes).map_err(wrap)?;
                    let inp = r.view(slot_bytes).map_err(wrap)?;
                    Instr::Reduce(Reduce::new(mean, out, inp).map_err(wrap)?)
                }
                3 => {
                    let x = r.view(slot_bytes).map_err(wrap)?;
                    let w = r.view(slot_bytes).map_err(wrap)?;
                    let bias = match r.next().map_err(wrap)? {
                        0 => None,
                        _ => Some(r.view(slot_bytes).map_err(wrap)?),
                    };
                    let out = r.view(slot_bytes).map_err(wrap)?;
                    let l = Linear::new(x, w, bias, out).map_err(wrap)?;
                    aligned.push((l.w.slot, l.w.dtype.size()));
                    check_offset_aligned(&l.w).map_err(wrap)?;
                    Instr::Linear(l)
                }
                4 => {
                    let q = r.view(slot_bytes).map_err(wrap)?;
                    let k = r.view(slot_bytes).map_err(wrap)?;
                    let v = r.view(slot_bytes).map_err(wrap)?;
                    let mask = match r.next().map_err(wrap)? {
                        0 => None,
                        _ => Some(r.view(slot_bytes).map_err(wrap)?),
                    };
                    let causal = r.next().map_err(wrap)? != 0;
                    let scale = r.f64().map_err(wrap)? as f32;
                    let out = r.view(slot_bytes).map_err(wrap)?;
                    for x in [&q, &k, &v, &out] {
                        check_offset_aligned(x).map_err(wrap)?;
                        aligned.push((x.slot, x.dtype.size()));
                    }
                    let overlaps = [&q, &k, &v].iter().any(|x| x.slot == out.slot)
                        || mask.as_ref().is_some_and(|m| m.slot == out.slot);
                    if overlaps {
                        return Err(wrap(
                            "attention: out must not share a buffer with its inputs".into(),
                        ));
                    }
                    Instr::Attend(Attend::new(q, k, v, mask, causal, scale, out).map_err(wrap)?)
                }
                5 => {
                    let dim = r.usize("dim").map_err(wrap)?;
                    let dst = r.view(slot_bytes).map_err(wrap)?;
                    let index = r.view(slot_bytes).map_err(wrap)?;
                    let src = r.view(slot_bytes).map_err(wrap)?;
                    Instr::IndexCopy(IndexCopy::new(dim, dst, index, src).map_err(wrap)?)
                }
                6 => {
                    let ids = r.view(slot_bytes).map_err(wrap)?;
                    let weight = r.view(slot_bytes).map_err(wrap)?;
                    let out = r.view(slot_bytes).map_err(wrap)?;
                    Instr::Embed(Embed::new(ids, weight, out).map_err(wrap)?)
                }
                c => return Err(wrap(format!("unknown instruction code {c}"))),
            };
            instrs.push(instr);
        }
        aligned.sort_unstable();
        aligned.dedup();
        Ok(Program {
            instrs,
            slot_bytes: slot_bytes.to_vec(),
            aligned,
            scratch: Scratch::default(),
        })
    }

    pub fn num_slots(&self) -> usize {
        self.slot_bytes.len()
    }

    /// Runs every instruction in order.
    ///
    /// # Safety
    /// `slots[i]` must be valid for reads and writes of the `slot_bytes[i]` bytes given to
    /// `decode`, and no other thread may touch those bytes during the call.
    pub unsafe fn run(
        &mut self,
        isa: Isa,
        par: &dyn Parallel,
        slots: &[*mut u8],
    ) -> Result<(), String> {
        if slots.len() != self.slot_bytes.len() {
            return Err(format!(
                "the program was planned for {} buffers but {} were passed",
                self.slot_bytes.len(),
                slots.len()
            ));
        }
        for &(s, align) in &self.aligned {
            if !(slots[s] as usize).is_multiple_of(align) {
                return Err(format!("buffer {s} is not aligned to {align} bytes"));
            }
        }
        if !isa.is_supported() {
            return Err(format!("this CPU cannot run the {} tier", isa.name()));
        }
        for (i, instr) in self.instrs.iter().enumerate() {
            // SAFETY: views were checked against the slot sizes at decode; the caller promises
            // the slots cover those sizes and are not used concurrently.
            let r = unsafe {
                match instr {
                    Instr::Ew(x) => {
                        x.run(slots);
                        Ok(())
                    }
                    Instr::Reduce(x) => {
                        x.run(slots);
                        Ok(())
                    }
                    Instr::Linear(x) => {
                        x.run(isa, par, slots, &mut self.scratch);
                        Ok(())
                    }
                    Instr::Attend(x) => {
                        x.run(isa, par, slots);
                        Ok(())
                    }
                    Instr::IndexCopy(x) => x.run(slots),
                    Instr::Embed(x) => x.run(slots),
                }
            };
            r.map_err(|e| format!("instruction {i}: {e}"))?;
        }
        Ok(())
    }
}

fn check_offset_aligned(v: &View) -> Result<(), String> {
    if !v.offset.is_multiple_of(v.dtype.size()) {
        return Err(format!(
            "a view's byte offset {} is not a multiple of its element size",
            v.offset
        ));
    }
    Ok(())
}
