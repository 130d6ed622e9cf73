//! `linear` tests: every supported tier against the generic tier and an f64 reference, both
//! paths (GEMV and GEMM) at all shapes, runners, edge sizes and size validation.
//!
//! Tolerances. Each y element is an f32 sum of k products. Two f32 summation orders differ by
//! at most ~k * 2^-24 * sum|x*w| in the worst case and ~sqrt(k) * 2^-24 * sum|x*w| typically
//! (<= 1.5e-6 relative for k <= 576). We allow TOL_REL = 1e-5 of sum|x*w| (plus 1e-6 of |bias|,
//! which is added once): rounding-order differences pass, any indexing/packing/masking bug
//! (an error of the size of a whole product) fails.

mod common;

use common::Rng;
use kwker_kernels::bf16::bf16_to_f32;
use kwker_kernels::isa::{self, Isa};
use kwker_kernels::linear::{bf16_dot_calls, bf16_dot_usable, linear, linear_path, Weight};
use kwker_kernels::par::{Parallel, ScopedThreads, Serial};

const TOL_REL: f64 = 1e-5;

enum W {
    Bf16(Vec<u16>),
    F32(Vec<f32>),
}

impl W {
    fn view(&self) -> Weight<'_> {
        match self {
            W::Bf16(w) => Weight::Bf16(w),
            W::F32(w) => Weight::F32(w),
        }
    }
    fn f64_at(&self, i: usize) -> f64 {
        match self {
            W::Bf16(w) => bf16_to_f32(w[i]) as f64,
            W::F32(w) => w[i] as f64,
        }
    }
}

struct Case {
    m: usize,
    k: usize,
    n: usize,
    x: Vec<f32>,
    w: W,
    bias: Option<Vec<f32>>,
}

impl Case {
    fn new(seed: u64, m: usize, k: usize, n: usize, bf16: bool, bias: bool) -> Case {
        let mut rng = Rng::new(seed);
        let x = rng.vec(m * k);
        let w = if bf16 {
            W::Bf16(rng.bf16_vec(n * k))
        } else {
            W::F32(rng.vec(n * k))
        };
        let bias = bias.then(|| rng.vec(n));
        Case {
            m,
            k,
            n,
            x,
            w,
            bias,
        }
    }

    fn run(&self, isa: Isa, par: &dyn Parallel) -> Vec<f32> {
        let mut y = vec![f32::NAN; self.m * self.n];
        let b = self.bias.as_deref();
        linear(
            isa,
            par,
            &self.x,
            self.m,
            self.k,
            self.w.view(),
            self.n,
            b,
            &mut y,
        );
        y
    }

    fn run_path(&self, isa: Isa, gemm: bool) -> Vec<f32> {
        let mut y = vec![f32::NAN; self.m * self.n];
        let b = self.bias.as_deref();
        let (x, w) = (&self.x, self.w.view());
        linear_path(isa, gemm, x, self.m, self.k, w, self.n, b, &mut y);
        y
    }

    /// Exact-ish result and the scale sum|x*w| of each element, in f64.
    fn reference(&self) -> (Vec<f64>, Vec<f64>) {
        let (m, k, n) = (self.m, self.k, self.n);
        let mut y = vec![0.0; m * n];
        let mut scale = vec![0.0; m * n];
        for j in 0..n {
            let wrow: Vec<f64> = (0..k).map(|kk| self.w.f64_at(j * k + kk)).collect();
            let b = self.bias.as_ref().map_or(0.0, |b| b[j] as f64);
            for i in 0..m {
                let (mut s, mut a) = (0.0f64, 0.0f64);
                for (kk, &wv) in wrow.iter().enumerate() {
                    let p = self.x[i * k + kk] as f64 * wv;
                    s += p;
                    a += p.abs();
                }
                y[i * n + j] = s + b;
                scale[i * n + j] = a * TOL_REL + b.abs() * 1e-6;
            }
        }
        (y, scale)
    }
}

fn assert_close(what: &str, got: &[f32], want: &[f64], tol: &[f64]) {
    for (idx, ((&g, &w), &t)) in got.iter().zip(want).zip(tol).enumerate() {
        let diff = (g as f64 - w).abs();
        assert!(
            diff <= t,
            "{what}: element {idx}: got {g}, want {w}, |diff| {diff:e} > tol {t:e}"
        );
    }
}

fn as_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// Checks every tier and both paths of one case against generic and f64.
fn check_case(m: usize, k: usize, n: usize, bf16: bool, bias: bool) {
    let seed = (m * 1_000_003 + k * 1009 + n) as u64 * 2 + bf16 as u64;
    let case = Case::new(seed, m, k, n, bf16, bias);
    let (exact, tol) = case.reference();
    let oracle = case.run(Isa::Generic, &Serial);
    let tag = format!("m={m} k={k} n={n} bf16={bf16} bias={bias}");
    assert_close(&format!("generic vs f64, {tag}"), &oracle, &exact, &tol);
    for isa in isa::supported() {
        let y = case.run(isa, &Serial);
        // The oracle itself is within tol of exact, so tier-vs-oracle may use 2*tol.
        let tol2: Vec<f64> = tol.iter().map(|t| 2.0 * t).collect();
        assert_close(
            &format!("{} vs generic, {tag}", isa.name()),
            &y,
            &as_f64(&oracle),
            &tol2,
        );
        assert_close(&format!("{} vs f64, {tag}", isa.name()), &y, &exact, &tol);
        for gemm in [false, true] {
            let yp = case.run_path(isa, gemm);
            let path = if gemm { "gemm" } else { "gemv" };
            assert_close(
                &format!("{} {path} vs f64, {tag}", isa.name()),
                &yp,
                &exact,
                &tol,
            );
        }
    }
}

#[test]
fn small_m_all_shapes() {
    for m in [1, 2, 3, 4, 5, 7, 17] {
        for k in [1, 7, 63, 64, 65, 257, 576] {
            for n in [1, 15, 17, 63, 65, 576] {
                let bias = (m + k + n) % 2 == 0;
                check_case(m, k, n, true, bias);
                check_case(m, k, n, false, !bias);
            }
        }
    }
}

#[test]
fn large_m_shapes() {
    for m in [64, 130] {
        for k in [1, 63, 257, 576] {
            for n in [17, 65, 576] {
                check_case(m, k, n, true, n != 65);
                check_case(m, k, n, false, n == 65);
            }
        }
    }
}

#[test]
fn prompt_sized_gemm() {
    check_case(128, 576, 1536, true, false);
    check_case(128, 576, 1536, false, true);
}

/// A k longer than one k block (KC = 256) with a ragged tail, for the accumulate-into-y path.
#[test]
fn multi_k_block() {
    check_case(13, 1000, 70, true, true);
    check_case(2, 1000, 70, false, true);
}

/// Results must not depend on the runner or the number of threads (each element is computed
/// by the same code in the same order whatever the tiling), so equality is exact.
#[test]
fn runners_agree_exactly() {
    for &(m, k, n) in &[
        (1, 576, 1536),
        (4, 300, 100),
        (130, 576, 576),
        (300, 64, 40),
    ] {
        for bf16 in [false, true] {
            let case = Case::new(7, m, k, n, bf16, true);
            for isa in isa::supported() {
                let serial = case.run(isa, &Serial);
                for threads in [2, 3, 5] {
                    let par = case.run(isa, &ScopedThreads(threads));
                    assert!(
                        serial
                            .iter()
                            .zip(&par)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{} m={m} k={k} n={n}: {threads} threads differ from serial",
                        isa.name()
                    );
                }
            }
        }
    }
}

#[test]
fn empty_sizes() {
    for isa in isa::supported() {
        // m = 0 or n = 0: nothing to write.
        let mut y: Vec<f32> = vec![];
        linear(
            isa,
            &Serial,
            &[],
            0,
            5,
            Weight::F32(&[0.0; 15]),
            3,
            None,
            &mut y,
        );
        linear(
            isa,
            &Serial,
            &[0.0; 10],
            2,
            5,
            Weight::Bf16(&[]),
            0,
            None,
            &mut y,
        );
        // k = 0: y is the bias (or zero).
        let mut y = vec![f32::NAN; 6];
        linear(
            isa,
            &Serial,
            &[],
            2,
            0,
            Weight::F32(&[]),
            3,
            Some(&[1.0, 2.0, 3.0]),
            &mut y,
        );
        assert_eq!(y, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
        let mut y = vec![f32::NAN; 6];
        linear(isa, &Serial, &[], 2, 0, Weight::Bf16(&[]), 3, None, &mut y);
        assert_eq!(y, [0.0; 6]);
    }
}

#[test]
#[should_panic(expected = "x has 5 elements")]
fn wrong_x_len_panics() {
    let mut y = vec![0.0; 6];
    linear(
        isa::detect(),
        &Serial,
        &[0.0; 5],
        2,
        3,
        Weight::F32(&[0.0; 9]),
        3,
        None,
        &mut y,
    );
}

#[test]
#[should_panic(expected = "w has 8 elements")]
fn wrong_w_len_panics() {
    let mut y = vec![0.0; 6];
    linear(
        isa::detect(),
        &Serial,
        &[0.0; 6],
        2,
        3,
        Weight::Bf16(&[0; 8]),
        3,
        None,
        &mut y,
    );
}

#[test]
#[should_panic(expected = "y has 5 elements")]
fn wrong_y_len_panics() {
    let mut y = vec![0.0; 5];
    linear(
        isa::detect(),
        &Serial,
        &[0.0; 6],
        2,
        3,
        Weight::F32(&[0.0; 9]),
        3,
        None,
        &mut y,
    );
}

#[test]
#[should_panic(expected = "bias has 2 elements")]
fn wrong_bias_len_panics() {
    let mut y = vec![0.0; 6];
    let w = Weight::F32(&[0.0; 9]);
    linear(
        isa::detect(),
        &Serial,
        &[0.0; 6],
        2,
        3,
        w,
        3,
        Some(&[0.0; 2]),
        &mut y,
    );
}

#[test]
fn unsupported_isa_panics_instead_of_faulting() {
    for isa in Isa::ALL.into_iter().filter(|i| !i.is_supported()) {
        let r = std::panic::catch_unwind(|| {
            let mut y = vec![0.0; 1];
            linear(
                isa,
                &Serial,
                &[1.0],
                1,
                1,
                Weight::F32(&[1.0]),
                1,
                None,
                &mut y,
            );
        });
        assert!(r.is_err(), "{} accepted on a CPU without it", isa.name());
    }
}

/// The AMX tier's tiles on the hardware (where the CPU has AMX; elsewhere the kernel is tested
/// through `amx::Emu` in the crate's unit tests). Its shapes against float64 are covered by
/// every test above, which loop over the supported tiers; this one proves the tiles ran: an
/// activation below 2^-126 is read as zero by `tdpbf16ps` (DAZ), where the FMA tiers keep it. AVX-512's
/// `vdpbf16ps` path reads it as zero too (the avx512 tier takes it on AVX512-BF16 CPUs), so the FMA
/// reference is the avx2 tier and the call must not have gone through `vdpbf16ps`.
#[test]
fn amx_tiles_ran_where_the_cpu_has_them() {
    if !Isa::Amx.is_supported() {
        eprintln!("skipped: this CPU (or KWKER_ISA_MAX) has no AMX tiles; the emulated tiles are tested in the unit tests");
        return;
    }
    let (m, k, n) = (32, 32, 16);
    let mut x = vec![0.0f32; m * k];
    x[0] = f32::from_bits(0x0001_0000); // a denormal float32 (about 9.2e-41), exact in bf16
    let w = vec![0x7e80u16; n * k]; // 2^126 in bf16: the product, 2^-7 or so, is a normal number
    let (mut amx, mut fma) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
    let dot_calls = bf16_dot_calls();
    linear(
        Isa::Amx,
        &Serial,
        &x,
        m,
        k,
        Weight::Bf16(&w),
        n,
        None,
        &mut amx,
    );
    assert_eq!(
        bf16_dot_calls(),
        dot_calls,
        "the amx tier ran vdpbf16ps instead of tiles"
    );
    linear(
        Isa::Avx2,
        &Serial,
        &x,
        m,
        k,
        Weight::Bf16(&w),
        n,
        None,
        &mut fma,
    );
    // Row 0 holds the denormal's products (one per column); every other row is zero.
    assert!(
        fma[..n].iter().all(|&v| v == 2f32.powi(-7)),
        "the avx2 FMA tier keeps the denormal's product: {}",
        fma[0]
    );
    assert!(
        amx[..n].iter().all(|&v| v == 0.0),
        "tdpbf16ps reads a denormal input as zero: {}",
        amx[0]
    );
    assert!(amx[n..].iter().chain(&fma[n..]).all(|&v| v == 0.0));
}

/// On AVX512-BF16 CPUs (without AMX), bf16 weights times bf16-valued activations of 32+ rows run on
/// `vdpbf16ps` tiles: within float32 summation error of float64 over awkward shapes, the path proven to
/// run, and float32 activations (not bf16 values) kept on the FMA GEMM. The instruction against its exact
/// emulation: `amx::bf16_gemm`'s unit tests.
#[test]
fn bf16_dot_tiles_ran_for_bf16_activations_where_the_cpu_has_them() {
    if !bf16_dot_usable() || !Isa::Avx512.is_supported() {
        eprintln!("skipped: this CPU has no AVX512-BF16 (the emulated instruction is tested in the unit tests)");
        return;
    }
    for &(m, k, n) in &[(32, 64, 32), (33, 65, 65), (70, 576, 96), (40, 1000, 17)] {
        let mut case = Case::new(m as u64 * 31 + k as u64, m, k, n, true, true);
        case.x
            .iter_mut()
            .for_each(|v| *v = bf16_to_f32(kwker_kernels::bf16::f32_to_bf16(*v)));
        let before = bf16_dot_calls();
        let got = case.run(Isa::Avx512, &ScopedThreads(2));
        assert_eq!(
            bf16_dot_calls() - before,
            1,
            "m{m} k{k} n{n}: not on the vdpbf16ps tiles"
        );
        let (want, scale) = case.reference();
        assert_close(&format!("vdpbf16ps m{m} k{k} n{n}"), &got, &want, &scale);
        // The same call with float32 activations: the FMA GEMM (three bf16 passes would be slower).
        let f32_case = Case::new(7, m, k, n, true, true);
        let before = bf16_dot_calls();
        f32_case.run(Isa::Avx512, &Serial);
        assert_eq!(
            bf16_dot_calls(),
            before,
            "float32 activations went to the bf16 tiles"
        );
    }
}
