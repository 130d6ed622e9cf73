//! The executor's data-movement and pointwise instructions: elementwise maps with broadcasting
//! (operands arrive already broadcast to the output's dims, stride 0 on broadcast dims),
//! reductions over trailing dims, `index_copy_` into a cache and embedding lookups.
//!
//! Numerical contract, chosen to equal torch's CPU kernels: float ops compute in f32 on values
//! widened exactly from their storage type and round once to the output type (torch does the
//! same for bf16). Arithmetic (+ - * /, sqrt, rsqrt as 1/sqrt) is IEEE f32 and so bit-identical
//! to torch; exp, silu and sigmoid use torch's f32 formulas with libm's expf, and sin, cos, tanh
//! and pow are evaluated in f64 and rounded: all within 1 ulp of torch's SLEEF f32 versions. Sums
//! accumulate in f32 over 16 interleaved lanes. Integer outputs (int64) compute in i64.

use super::view::{load_f32, load_i64, store_f32, store_i64, DType, Layout, View};

/// Elementwise operations (codes match `kwker_torch/compile/descs.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EwOp {
    Copy,
    Add,
    Sub,
    Mul,
    Div,
    Neg,
    Rsqrt,
    Sqrt,
    Silu,
    Cos,
    Sin,
    Exp,
    Pow,
    Sigmoid,
    Tanh,
    Relu,
    GeluTanh,
    Square,
}

impl EwOp {
    pub fn from_code(c: i64) -> Result<EwOp, String> {
        use EwOp::*;
        const ALL: [EwOp; 18] = [
            Copy, Add, Sub, Mul, Div, Neg, Rsqrt, Sqrt, Silu, Cos, Sin, Exp, Pow, Sigmoid, Tanh,
            Relu, GeluTanh, Square,
        ];
        usize::try_from(c)
            .ok()
            .and_then(|i| ALL.get(i).copied())
            .ok_or_else(|| format!("unknown elementwise op code {c}"))
    }

    pub fn arity(self) -> usize {
        match self {
            EwOp::Add | EwOp::Sub | EwOp::Mul | EwOp::Div | EwOp::Pow => 2,
            _ => 1,
        }
    }

    /// Ops with an exact int64 meaning.
    fn integer_ok(self) -> bool {
        matches!(
            self,
            EwOp::Copy | EwOp::Add | EwOp::Sub | EwOp::Mul | EwOp::Neg | EwOp::Square
        )
    }
}

#[derive(Clone, Debug)]
pub enum Operand {
    View(View),
    Scalar(f64),
}

/// Where one operand's chunk comes from.
enum Src {
    View(*mut u8, DType, usize),
    Scalar(f64),
}

/// out = op(args...) elementwise.
#[derive(Clone, Debug)]
pub struct Ew {
    pub op: EwOp,
    pub out: View,
    pub args: Vec<Operand>,
    layout: Layout,
    integer: bool,
}

/// Rows are processed in chunks of this many elements (stack buffers, zeroed per chunk: small).
const CHUNK: usize = 256;

impl Ew {
    pub fn new(op: EwOp, out: View, args: Vec<Operand>) -> Result<Ew, String> {
        if args.len() != op.arity() {
            return Err(format!(
                "{op:?} takes {} operands, got {}",
                op.arity(),
                args.len()
            ));
        }
        let mut strides: Vec<&[usize]> = vec![&out.strides];
        for a in &args {
            if let Operand::View(v) = a {
                if v.dims != out.dims {
                    return Err(format!(
                        "{op:?}: operand dims {:?} differ from output dims {:?} (operands must be \
                         broadcast by the planner)",
                        v.dims, out.dims
                    ));
                }
                strides.push(&v.strides);
            }
        }
        let integer = out.dtype == DType::I64;
        if integer && !op.integer_ok() {
            return Err(format!("{op:?} has no int64 form"));
        }
        let layout = Layout::of(&out.dims, &strides);
        Ok(Ew {
            op,
            out,
            args,
            layout,
            integer,
        })
    }

    /// # Safety
    /// Every view must lie inside its slot (checked at decode) and the slots must be valid.
    pub unsafe fn run(&self, slots: &[*mut u8]) {
        let inner = *self.layout.dims.last().unwrap();
        let ninner = self.layout.dims.len() - 1;
        // SAFETY: views are inside their slots (decode-time check, caller's contract).
        let out_ptr = unsafe { self.out.ptr(slots) };
        // At most two operands (`new` checks the arity); a fixed array keeps the hot path free of
        // allocations (a decode step runs ~2000 of these on vectors of a few hundred elements).
        let mut arg_ptrs: [Option<*mut u8>; 2] = [None; 2];
        for (p, a) in arg_ptrs.iter_mut().zip(&self.args) {
            if let Operand::View(v) = a {
                // SAFETY: as above.
                *p = Some(unsafe { v.ptr(slots) });
            }
        }
        let arg_ptrs = &arg_ptrs[..self.args.len()];
        self.layout.for_each_row(|offs| {
            let mut start = 0;
            while start < inner {
                let n = CHUNK.min(inner - start);
                // SAFETY: row `offs` plus elements start..start+n stays inside every view.
                unsafe {
                    if self.integer {
                        self.chunk::<i64>(out_ptr, arg_ptrs, offs, ninner, start, n)
                    } else {
                        self.chunk::<f32>(out_ptr, arg_ptrs, offs, ninner, start, n)
                    }
                }
                start += n;
            }
        });
    }

    /// Calls `f(i, src)` for operand i's chunk: its address, dtype and stride, or its scalar value.
    fn each_operand(
        &self,
        arg_ptrs: &[Option<*mut u8>],
        offs: &[usize],
        last: usize,
        start: usize,
        mut f: impl FnMut(usize, Src),
    ) {
        let mut vi = 1; // offs[0] is the output
        for (i, (a, p)) in self.args.iter().zip(arg_ptrs).enumerate() {
            match (a, p) {
                (Operand::View(v), Some(p)) => {
                    let s = self.layout.strides[vi][last];
                    f(
                        i,
                        Src::View(Self::addr(*p, v, offs[vi], s, start), v.dtype, s),
                    );
                    vi += 1;
                }
                (Operand::Scalar(x), _) => f(i, Src::Scalar(*x)),
                _ => unreachable!("view operands always have a pointer"),
            }
        }
    }

    /// Byte address of element `start` of the row at element offset `off` in view `v`.
    fn addr(base: *mut u8, v: &View, off: usize, stride: usize, start: usize) -> *mut u8 {
        base.wrapping_add((off + start * stride) * v.dtype.size())
    }

    /// # Safety
    /// As for `run`, for one in-range chunk.
    unsafe fn chunk<T: Lane>(
        &self,
        out_ptr: *mut u8,
        arg_ptrs: &[Option<*mut u8>],
        offs: &[usize],
        last: usize,
        start: usize,
        n: usize,
    ) {
        let mut bufs = [[T::default(); CHUNK]; 2];
        self.each_operand(arg_ptrs, offs, last, start, |i, src| match src {
            // SAFETY: in-range chunk of a checked view.
            Src::View(p, dt, s) => unsafe { T::load(p, dt, s, &mut bufs[i][..n]) },
            Src::Scalar(x) => bufs[i][..n].fill(T::from_scalar(x)),
        });
        let [a, b] = &mut bufs;
        let (a, b) = (&mut a[..n], &b[..n]);
        T::apply(self.op, a, b);
        let s = self.layout.strides[0][last];
        // SAFETY: in-range chunk of the checked output view.
        unsafe {
            T::store(
                Self::addr(out_ptr, &self.out, offs[0], s, start),
                self.out.dtype,
                s,
                a,
            )
        };
    }
}

/// What a pointwise chunk computes in: f32 for float tensors, wrapping i64 for integer ones.
trait Lane: Copy + Default {
    /// # Safety
    /// `p` addresses `out.len()` elements of `dt` at `stride`.
    unsafe fn load(p: *const u8, dt: DType, stride: usize, out: &mut [Self]);
    /// # Safety
    /// `p` addresses `src.len()` writable elements of `dt` at `stride`.
    unsafe fn store(p: *mut u8, dt: DType, stride: usize, src: &[Self]);
    fn from_scalar(x: f64) -> Self;
    fn apply(op: EwOp, a: &mut [Self], b: &[Self]);
}

/// A lane's loads and stores: the view module's functions for that element type.
macro_rules! lane_io {
    ($t:ty, $load:ident, $store:ident) => {
        unsafe fn load(p: *const u8, dt: DType, stride: usize, out: &mut [$t]) {
            // SAFETY: the caller's.
            unsafe { $load(p, dt, stride, out) }
        }
        unsafe fn store(p: *mut u8, dt: DType, stride: usize, src: &[$t]) {
            // SAFETY: the caller's.
            unsafe { $store(p, dt, stride, src) }
        }
        fn from_scalar(x: f64) -> $t {
            x as $t
        }
    };
}

impl Lane for f32 {
    lane_io!(f32, load_f32, store_f32);
    fn apply(op: EwOp, a: &mut [f32], b: &[f32]) {
        let f64map = |a: &mut [f32], f: fn(f64) -> f64| {
            for x in a.iter_mut() {
                *x = f(*x as f64) as f32;
            }
        };
        match op {
            EwOp::Copy => {}
            EwOp::Add => a.iter_mut().zip(b).for_each(|(x, y)| *x += y),
            EwOp::Sub => a.iter_mut().zip(b).for_each(|(x, y)| *x -= y),
            EwOp::Mul => a.iter_mut().zip(b).for_each(|(x, y)| *x *= y),
            EwOp::Div => a.iter_mut().zip(b).for_each(|(x, y)| *x /= y),
            EwOp::Neg => a.iter_mut().for_each(|x| *x = -*x),
            EwOp::Rsqrt => a.iter_mut().for_each(|x| *x = 1.0 / x.sqrt()),
            EwOp::Sqrt => a.iter_mut().for_each(|x| *x = x.sqrt()),
            EwOp::Square => a.iter_mut().for_each(|x| *x *= *x),
            EwOp::Relu => a.iter_mut().for_each(|x| {
                if *x < 0.0 {
                    *x = 0.0
                }
            }),
            EwOp::Pow => a
                .iter_mut()
                .zip(b)
                .for_each(|(x, y)| *x = (*x as f64).powf(*y as f64) as f32),
            // torch's own f32 formulas; libm's expf is within an ulp like torch's SLEEF exp.
            EwOp::Silu => a.iter_mut().for_each(|x| *x /= 1.0 + (-*x).exp()),
            EwOp::Sigmoid => a.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())),
            EwOp::Cos => f64map(a, f64::cos),
            EwOp::Sin => f64map(a, f64::sin),
            EwOp::Exp => a.iter_mut().for_each(|x| *x = x.exp()),
            EwOp::Tanh => f64map(a, f64::tanh),
            EwOp::GeluTanh => f64map(a, |x| {
                const K: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)
                0.5 * x * (1.0 + (K * (x + 0.044715 * x * x * x)).tanh())
            }),
        }
    }
}

impl Lane for i64 {
    lane_io!(i64, load_i64, store_i64);
    fn apply(op: EwOp, a: &mut [i64], b: &[i64]) {
        match op {
            EwOp::Add => a
                .iter_mut()
                .zip(b)
                .for_each(|(x, y)| *x = x.wrapping_add(*y)),
            EwOp::Sub => a
                .iter_mut()
                .zip(b)
                .for_each(|(x, y)| *x = x.wrapping_sub(*y)),
            EwOp::Mul => a
                .iter_mut()
                .zip(b)
                .for_each(|(x, y)| *x = x.wrapping_mul(*y)),
            EwOp::Neg => a.iter_mut().for_each(|x| *x = x.wrapping_neg()),
            EwOp::Square => a.iter_mut().for_each(|x| *x = x.wrapping_mul(*x)),
            _ => {} // Copy (others rejected in `new`)
        }
    }
}

/// out[kept...] = sum (or mean) of inp[kept..., reduced...]; `inp` lists the kept dims first.
#[derive(Clone, Debug)]
pub struct Reduce {
    pub mean: bool,
    pub out: View,
    pub inp: View,
    kept: Layout,
    reduced: Layout,
    count: usize,
}

impl Reduce {
    pub fn new(mean: bool, out: View, inp: View) -> Result<Reduce, String> {
        let k = out.ndim();
        if inp.ndim() < k || inp.dims[..k] != out.dims[..] {
            return Err(format!(
                "reduce: input dims {:?} do not start with the output dims {:?}",
                inp.dims, out.dims
            ));
        }
        if !out.dtype.is_float() || !inp.dtype.is_float() {
            return Err("reduce: only float32/bfloat16 sums are supported".into());
        }
        let kept = Layout::of(&out.dims, &[&out.strides, &inp.strides[..k]]);
        let reduced = Layout::of(&inp.dims[k..], &[&inp.strides[k..]]);
        let count = inp.dims[k..].iter().product();
        Ok(Reduce {
            mean,
            out,
            inp,
            kept,
            reduced,
            count,
        })
    }

    /// # Safety
    /// As for `Ew::run`.
    pub unsafe fn run(&self, slots: &[*mut u8]) {
        // SAFETY: checked views, caller's contract.
        let (out_ptr, in_ptr) = unsafe { (self.out.ptr(slots), self.inp.ptr(slots)) };
        let (osz, isz) = (self.out.dtype.size(), self.inp.dtype.size());
        let kl = self.kept.dims.len() - 1;
        let rl = self.reduced.dims.len() - 1;
        let rs = self.reduced.strides[0][rl];
        let rn = self.reduced.dims[rl];
        let mut buf = vec![0.0f32; rn];
        let mut row_out = [0.0f32; CHUNK];
        self.kept.for_each_row(|offs| {
            let (so, si) = (self.kept.strides[0][kl], self.kept.strides[1][kl]);
            let mut j = 0;
            while j < self.kept.dims[kl] {
                let n = CHUNK.min(self.kept.dims[kl] - j);
                for (jj, r) in row_out[..n].iter_mut().enumerate() {
                    let base = offs[1] + (j + jj) * si;
                    let mut lanes = [0.0f32; 16];
                    let mut tail = 0.0f32;
                    self.reduced.for_each_row(|roffs| {
                        let p = in_ptr.wrapping_add((base + roffs[0]) * isz);
                        // SAFETY: element (kept index, reduced row) lies in the checked input view.
                        unsafe { load_f32(p, self.inp.dtype, rs, &mut buf) };
                        let mut chunks = buf.chunks_exact(16);
                        for c in &mut chunks {
                            for (l, x) in lanes.iter_mut().zip(c) {
                                *l += x;
                            }
                        }
                        tail += chunks.remainder().iter().sum::<f32>();
                    });
                    let mut s = tail;
                    // pairwise combine of the lanes, like a SIMD horizontal sum
                    let mut w = 16;
                    while w > 1 {
                        w /= 2;
                        for i in 0..w {
                            lanes[i] += lanes[i + w];
                        }
                    }
                    s += lanes[0];
                    *r = if self.mean { s / self.count as f32 } else { s };
                }
                let p = out_ptr.wrapping_add((offs[0] + j * so) * osz);
                // SAFETY: n output elements of the checked output view.
                unsafe { store_f32(p, self.out.dtype, so, &row_out[..n]) };
                j += n;
            }
        });
    }
}

/// dst.index_copy_(dim, index, src): row `index[j]` of dst along `dim` <- row j of src.
#[derive(Clone, Debug)]
pub struct IndexCopy {
    pub dim: usize,
    pub dst: View,
    pub index: View,
    pub src: View,
}

impl IndexCopy {
    pub fn new(dim: usize, dst: View, index: View, src: View) -> Result<IndexCopy, String> {
        let ok = dim < dst.ndim()
            && src.ndim() == dst.ndim()
            && index.ndim() == 1
            && index.dtype == DType::I64
            && src.dims[dim] == index.dims[0]
            && (0..dst.ndim()).all(|d| d == dim || src.dims[d] == dst.dims[d]);
        if !ok {
            return Err(format!(
                "index_copy_: dst {:?}, index {:?} ({:?}), src {:?} along dim {dim} do not fit",
                dst.dims, index.dims, index.dtype, src.dims
            ));
        }
        Ok(IndexCopy {
            dim,
            dst,
            index,
            src,
        })
    }

    /// # Safety
    /// As for `Ew::run`.
    pub unsafe fn run(&self, slots: &[*mut u8]) -> Result<(), String> {
        let n = self.index.dims[0];
        let mut idx = vec![0i64; n];
        // SAFETY: checked 1-D int64 view.
        unsafe {
            load_i64(
                self.index.ptr(slots),
                DType::I64,
                self.index.strides[0],
                &mut idx,
            )
        };
        let size = self.dst.dims[self.dim];
        for (j, &i) in idx.iter().enumerate() {
            if i < 0 || i as usize >= size {
                return Err(format!(
                    "index_copy_: index {i} is out of range for a dimension of size {size} \
                     (is the static cache long enough for this generation?)"
                ));
            }
            let dst = self.dst.narrow(self.dim, i as usize, 1);
            let src = self.src.narrow(self.dim, j, 1);
            let copy = Ew::new(EwOp::Copy, dst, vec![Operand::View(src)])?;
            // SAFETY: narrowed views stay inside the checked dst/src views.
            unsafe { copy.run(slots) };
        }
        Ok(())
    }
}

/// out[i..., :] = weight[ids[i...], :].
#[derive(Clone, Debug)]
pub struct Embed {
    pub ids: View,
    pub weight: View,
    pub out: View,
}

impl Embed {
    pub fn new(ids: View, weight: View, out: View) -> Result<Embed, String> {
        let nd = ids.ndim();
        let ok = ids.dtype == DType::I64
            && weight.ndim() == 2
            && out.ndim() == nd + 1
            && out.dims[..nd] == ids.dims[..]
            && out.dims[nd] == weight.dims[1]
            && out.dtype == weight.dtype;
        if !ok {
            return Err(format!(
                "embedding: ids {:?}, weight {:?} and output {:?} do not fit",
                ids.dims, weight.dims, out.dims
            ));
        }
        Ok(Embed { ids, weight, out })
    }

    /// # Safety
    /// As for `Ew::run`.
    pub unsafe fn run(&self, slots: &[*mut u8]) -> Result<(), String> {
        let nd = self.ids.ndim();
        let (rows, d) = (self.weight.dims[0], self.weight.dims[1]);
        let layout = Layout::of(
            &[self.ids.dims.clone(), vec![1]].concat(),
            &[
                &[self.ids.strides.clone(), vec![0]].concat(),
                &self.out.strides[..nd + 1],
            ],
        );
        // SAFETY: checked views.
        let (ids, w, out) = unsafe {
            (
                self.ids.ptr(slots),
                self.weight.ptr(slots),
                self.out.ptr(slots),
            )
        };
        let esz = self.weight.dtype.size();
        let mut row = vec![0.0f32; d];
        let mut err = None;
        // The layout's last dim is the size-1 pad (or merged ids): walk ids one by one.
        let last = layout.dims.len() - 1;
        layout.for_each_row(|offs| {
            for k in 0..layout.dims[last] {
                let io = offs[0] + k * layout.strides[0][last];
                let oo = offs[1] + k * layout.strides[1][last];
                // SAFETY: one int64 of the checked ids view.
                let id = unsafe { (ids as *const i64).add(io).read_unaligned() };
                if id < 0 || id as usize >= rows {
                    err.get_or_insert(format!(
                        "embedding: token id {id} is out of range for a vocabulary of {rows}"
                    ));
                    continue;
                }
                let src = w.wrapping_add(id as usize * self.weight.strides[0] * esz);
                let dst = out.wrapping_add(oo * esz);
                // SAFETY: row `id` < rows of the checked weight view; output row inside the
                // checked output view; same dtype on both sides (checked in `new`).
                unsafe {
                    load_f32(src, self.weight.dtype, self.weight.strides[1], &mut row);
                    store_f32(dst, self.out.dtype, self.out.strides[nd], &row);
                }
            }
        });
        err.map_or(Ok(()), Err)
    }
}
