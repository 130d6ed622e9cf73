//! The tile operations of `Tiles` on AVX512-BF16 (`vdpbf16ps`), for CPUs without AMX: the AMX bf16 GEMM
//! (`bf16_gemm`, its splitting, packing and blocking) runs on them unchanged. A 16 x 16 float32 sum tile
//! is 16 zmm rows; a weight tile's row p (the pair k = 2p, 2p + 1 of 16 columns) is exactly the second
//! operand `vdpbf16ps` wants, and a broadcast of an activation row's pair the first: one `dp_bf16` is
//! 4 x 256 `vdpbf16ps`, run as 8 activation rows against both weight tiles at once (16 sums in flight,
//! each activation broadcast feeding two instructions, both weight rows loaded once per 8 rows: one
//! tile's 8 rows at a time kept only 8 sums in flight, below the instruction's latency x throughput,
//! and loaded a broadcast per instruction).
//!
//! The tiles live in memory: sums in a 4 KB array of this struct (loaded and stored once per row and
//! `dp_bf16`, an eighth of the instructions), the activation and weight tiles where the caller loaded
//! them from (`load_a` / `load_b` record their address, which the GEMM leaves unchanged until the
//! `dp_bf16` that reads them).
//!
//! Stamped twice over the dot instruction: `Real` (the instruction, where the CPU has AVX512-BF16) and,
//! for tests, `Emulated` (AVX-512F arithmetic with the instruction's semantics, exactly: per lane the odd
//! product, then the even one, each exact product added in float32 with one rounding, denormal inputs
//! read as zero and denormal results flushed), so the path is tested against the instruction where it
//! exists and everywhere AVX-512 is.
//!
//! Numerical contract: `amx`'s for `dp_bf16`, in the order above (the odd product of a pair first,
//! where AMX's emulation adds the even one first).

use std::arch::x86_64::*;

use super::{Tiles, ROWS, ROW_BYTES};

/// Whether this CPU has the instruction (and the AVX-512 the rest of the GEMM runs with).
pub fn usable() -> bool {
    crate::isa::Isa::Avx512.cpu_has() && std::arch::is_x86_feature_detected!("avx512bf16")
}

/// Two sum tiles' update with one `vdpbf16ps` (or its emulation): C0 += A x B0, C1 += A x B1 (see
/// `dp_rows!`).
pub(crate) trait Dot {
    unsafe fn dp_rows(
        c: [&mut [[f32; ROWS]; ROWS]; 2],
        a: (*const u8, usize),
        b: [(*const u8, usize); 2],
    );
}

/// Stamps `$name`: the rows of two sum tiles += one A tile x two B tiles, 8 activation rows at a time,
/// each row's pair broadcast once for both weight rows p, with `$dot` compiled under `$features` (so that
/// it inlines). Each sum takes its pairs in p order, as one tile at a time did: the same bits.
macro_rules! dp_rows {
    ($name:ident, $features:literal, $dot:ident) => {
        #[target_feature(enable = $features)]
        #[allow(clippy::needless_range_loop)] // acc[r][j], x[r] are register tiles indexed by constant bounds
        unsafe fn $name(
            c: [&mut [[f32; ROWS]; ROWS]; 2],
            a: (*const u8, usize),
            b: [(*const u8, usize); 2],
        ) {
            let [c0, c1] = c;
            for g in 0..ROWS / 8 {
                // 16 independent sums: enough to cover the instruction's latency at its throughput.
                let mut acc = [[_mm512_setzero_ps(); 2]; 8];
                let mut x = [std::ptr::null::<i32>(); 8];
                for r in 0..8 {
                    acc[r][0] = _mm512_loadu_ps(c0[8 * g + r].as_ptr());
                    acc[r][1] = _mm512_loadu_ps(c1[8 * g + r].as_ptr());
                    x[r] = a.0.add((8 * g + r) * a.1).cast::<i32>();
                }
                for p in 0..ROWS {
                    let w0 = _mm512_loadu_si512(b[0].0.add(p * b[0].1).cast());
                    let w1 = _mm512_loadu_si512(b[1].0.add(p * b[1].1).cast());
                    for r in 0..8 {
                        let xr = _mm512_set1_epi32(x[r].add(p).read_unaligned());
                        acc[r][0] = $dot(acc[r][0], xr, w0);
                        acc[r][1] = $dot(acc[r][1], xr, w1);
                    }
                }
                for r in 0..8 {
                    _mm512_storeu_ps(c0[8 * g + r].as_mut_ptr(), acc[r][0]);
                    _mm512_storeu_ps(c1[8 * g + r].as_mut_ptr(), acc[r][1]);
                }
            }
        }
    };
}

dp_rows!(
    dp_rows_real,
    "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16",
    dot_real
);
#[cfg(test)]
dp_rows!(
    dp_rows_emulated,
    "avx512f,avx512bw,avx512vl,avx512dq",
    dot_emulated
);

/// The instruction.
pub(crate) struct Real;

impl Dot for Real {
    unsafe fn dp_rows(
        c: [&mut [[f32; ROWS]; ROWS]; 2],
        a: (*const u8, usize),
        b: [(*const u8, usize); 2],
    ) {
        dp_rows_real(c, a, b)
    }
}

#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
unsafe fn dot_real(acc: __m512, a: __m512i, b: __m512i) -> __m512 {
    // SAFETY: the 512-bit integer and bf16 vector types have the same size and no invalid bits.
    _mm512_dpbf16_ps(
        acc,
        std::mem::transmute::<__m512i, __m512bh>(a),
        std::mem::transmute::<__m512i, __m512bh>(b),
    )
}

/// The instruction's semantics in AVX-512F arithmetic (see the module header): what tests run it against.
#[cfg(test)]
pub(crate) struct Emulated;

#[cfg(test)]
impl Dot for Emulated {
    unsafe fn dp_rows(
        c: [&mut [[f32; ROWS]; ROWS]; 2],
        a: (*const u8, usize),
        b: [(*const u8, usize); 2],
    ) {
        dp_rows_emulated(c, a, b)
    }
}

/// The bf16 halves of each lane as float32 (`HIGH`: the odd element), denormals read as zero.
#[cfg(test)]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn half<const HIGH: bool>(v: __m512i) -> __m512 {
    let bits = if HIGH {
        _mm512_and_si512(v, _mm512_set1_epi32(0xffff_0000u32 as i32))
    } else {
        _mm512_slli_epi32::<16>(v)
    };
    // A denormal input reads as a zero of the same sign: the flush of results, applied to it.
    ftz(_mm512_castsi512_ps(bits))
}

/// Denormals (exponent zero) flushed to zero of the same sign.
#[cfg(test)]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn ftz(x: __m512) -> __m512 {
    let bits = _mm512_castps_si512(x);
    let denormal = _mm512_testn_epi32_mask(bits, _mm512_set1_epi32(0x7f80_0000));
    let signed_zero = _mm512_and_si512(bits, _mm512_set1_epi32(0x8000_0000u32 as i32));
    _mm512_castsi512_ps(_mm512_mask_mov_epi32(bits, denormal, signed_zero))
}

#[cfg(test)]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn dot_emulated(acc: __m512, a: __m512i, b: __m512i) -> __m512 {
    let odd = ftz(_mm512_fmadd_ps(half::<true>(a), half::<true>(b), acc));
    ftz(_mm512_fmadd_ps(half::<false>(a), half::<false>(b), odd))
}

/// The tiles (see the module header); `D` is the dot instruction.
pub(crate) struct Dpbf16<D> {
    c: Box<[[[f32; ROWS]; ROWS]; 4]>,
    a: [(*const u8, usize); 2],
    b: [(*const u8, usize); 2],
    dot: std::marker::PhantomData<D>,
}

impl<D: Dot> Dpbf16<D> {
    pub(crate) fn new() -> Dpbf16<D> {
        Dpbf16 {
            c: Box::new([[[0.0; ROWS]; ROWS]; 4]),
            a: [(std::ptr::null(), 0); 2],
            b: [(std::ptr::null(), 0); 2],
            dot: std::marker::PhantomData,
        }
    }
}

// SAFETY: the recorded pointers are only read by the thread that owns the tiles, within the GEMM call
// that loaded them (each task makes its own tiles).
unsafe impl<D> Send for Dpbf16<D> {}

impl<D: Dot> Tiles for Dpbf16<D> {
    unsafe fn configure(&mut self) {}
    unsafe fn release(&mut self) {}
    unsafe fn zero_c(&mut self) {
        self.c.iter_mut().for_each(|t| *t = [[0.0; ROWS]; ROWS]);
    }
    unsafe fn load_a(&mut self, i: usize, p: *const u8, stride: usize) {
        self.a[i] = (p, stride);
    }
    unsafe fn load_b(&mut self, j: usize, p: *const u8, stride: usize) {
        self.b[j] = (p, stride);
    }
    unsafe fn dp_bf16(&mut self) {
        // Sum tiles 2i and 2i + 1 are A tile i against B tiles 0 and 1.
        let [c0, c1, c2, c3] = &mut *self.c;
        for (i, c) in [[c0, c1], [c2, c3]].into_iter().enumerate() {
            // SAFETY: `usable` (or AVX-512 for the emulation) was checked by the caller; the recorded
            // tiles address ROWS rows of ROW_BYTES bytes (the `Tiles` contract of load_a / load_b).
            D::dp_rows(c, self.a[i], self.b);
        }
    }
    unsafe fn load_c(&mut self, t: usize, p: *const u8, stride: usize) {
        for (r, row) in self.c[t].iter_mut().enumerate() {
            std::ptr::copy_nonoverlapping(
                p.add(r * stride),
                row.as_mut_ptr().cast::<u8>(),
                ROW_BYTES,
            );
        }
    }
    unsafe fn store_c(&mut self, t: usize, p: *mut u8, stride: usize) {
        for (r, row) in self.c[t].iter().enumerate() {
            std::ptr::copy_nonoverlapping(row.as_ptr().cast::<u8>(), p.add(r * stride), ROW_BYTES);
        }
    }
}
