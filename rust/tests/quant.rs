//! 8-bit and 4-bit weights: the quantizers' error bounds and refusals, packing round trips, the
//! activation quantizer of every tier bit-identical to the scalar reference, and `quant_linear` of
//! every tier against a float64 linear of the dequantized weights and int8-rounded activations over
//! awkward shapes (m = 1..17 around the 2- and 8-row tiles, n = 1, 15, 16, 17, 63, 65 around the
//! 16-row panel, k = 64..1536), serial, threaded and on the decoder's pool.

mod common;

use common::Rng;
use kwker_kernels::isa;
use kwker_kernels::par::{Parallel, ScopedThreads, Serial};
use kwker_kernels::pool::SpinPool;
use kwker_kernels::quant::{
    kernel_name, quant_linear, quant_linear_amx_emulated, quant_linear_group,
    quant_linear_vnni_emulated, quantize, quantize_activations, quantize_block,
    super_amx_products_run, super_min_rows, super_unpacked_panels_run, tiled_acts_run, Format,
    GroupItem, QActs, QuantOptions, QuantWeight, LO, QSUB,
};

fn opts(format: Format) -> QuantOptions<'static> {
    QuantOptions {
        format,
        importance: None,
        threads: 2,
    }
}

/// The exact meaning of a call: dequantized weights times int8-rounded activations, in f64.
fn reference(x: &[f32], m: usize, w: &QuantWeight, bias: Option<&[f32]>) -> (Vec<f64>, Vec<f64>) {
    let (n, k) = (w.n(), w.k());
    let wd = w.unpack().dequantize();
    let mut xd = vec![0.0f64; m * k];
    let (mut q, mut q2) = ([0i8; QSUB], [0i8; QSUB]);
    for (b, xb) in x.chunks_exact(QSUB).enumerate() {
        let c = quantize_block(xb, &mut q, &mut q2);
        for t in 0..QSUB {
            // Q4, Q4K and Q6K read the coarse codes, Q8 the coarse and residual ones (module contract).
            xd[b * QSUB + t] = match w.format {
                Format::Q8 | Format::Q80 => {
                    (LO as f64 * q[t] as f64 + q2[t] as f64) * c.d_fine as f64
                }
                _ => q[t] as f64 * c.d as f64,
            };
        }
    }
    let (mut y, mut scale) = (vec![0.0f64; m * n], vec![0.0f64; m * n]);
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut a) = (
                bias.map_or(0.0, |b| b[j] as f64),
                bias.map_or(0.0, |b| b[j].abs() as f64),
            );
            for kk in 0..k {
                let p = xd[i * k + kk] * wd[j * k + kk] as f64;
                s += p;
                a += p.abs();
            }
            y[i * n + j] = s;
            scale[i * n + j] = a;
        }
    }
    (y, scale)
}

fn case(format: Format, m: usize, n: usize, k: usize, bias: bool, rng: &mut Rng) {
    let x = rng.vec(m * k);
    let wf = rng.vec(n * k);
    let b = bias.then(|| rng.vec(n));
    let w = QuantWeight::pack(&quantize(&wf, n, k, &opts(format)).unwrap());
    let (want, scale) = reference(&x, m, &w, b.as_deref());
    let check = |got: &[f32], what: &str, threads: usize| {
        for (i, ((g, r), s)) in got.iter().zip(&want).zip(&scale).enumerate() {
            assert!(
                (*g as f64 - r).abs() <= 2e-6 * s + 1e-30,
                "{what} {format:?} m={m} n={n} k={k} bias={bias} threads={threads}: element {i}: {g} vs {r}"
            );
        }
    };
    // The super-block formats' contract is exact integer sums and a fixed float epilogue: every tier on
    // that path (all but the AVX2 tier's own tiles), tile and split gives the scalar tier's bits.
    let mut scalar = vec![f32::NAN; m * n];
    quant_linear(
        isa::Isa::Generic,
        &Serial,
        &x,
        m,
        &w,
        b.as_deref(),
        &mut scalar,
    );
    // The nibble formats (Q4, Q40, Q50) use that contract's fused epilogue on every tier (their prompts run on
    // the super-block path from its min_rows): the scalar bits everywhere, the AVX2 tiles included.
    let same = |got: &[f32], what: &str| {
        if format.is_nibbles() || (format.is_super() && !what.contains("(avx2)")) {
            assert_eq!(
                got,
                &scalar[..],
                "{what} {format:?} m={m} n={n} k={k}: not the scalar bits"
            );
        }
    };
    for threads in [1, 3] {
        let par: &dyn Parallel = if threads == 1 {
            &Serial
        } else {
            &ScopedThreads(threads)
        };
        for tier in isa::supported() {
            let mut got = vec![f32::NAN; m * n];
            quant_linear(tier, par, &x, m, &w, b.as_deref(), &mut got);
            let what = format!("{} ({})", tier.name(), kernel_name(tier));
            check(&got, &what, threads);
            same(&got, &what);
        }
        // The AVX-VNNI tier's kernels over an exact AVX2 emulation of vpdpbusd, wherever AVX2 is
        // (the instruction itself runs above as the avxvnni tier where the CPU has it).
        if isa::Isa::Avx2.is_supported() {
            let mut got = vec![f32::NAN; m * n];
            quant_linear_vnni_emulated(par, &x, m, &w, b.as_deref(), &mut got);
            check(&got, "avxvnni kernels (emulated vpdpbusd)", threads);
            same(&got, "avxvnni kernels (emulated vpdpbusd)");
        }
        // The AMX tier's super-block path over an exact emulation of the AMX-INT8 tiles (tdpbsud), on
        // any CPU: from 16 rows the products run (proved by their count), below it the scalar tiles.
        // The scalar epilogue, and the AVX-512 one the hardware tier runs where this CPU has AVX-512.
        for simd in [false, true] {
            if simd && !isa::Isa::Avx512.is_supported() {
                continue;
            }
            let before = super_amx_products_run();
            let mut got = vec![f32::NAN; m * n];
            quant_linear_amx_emulated(simd, par, &x, m, &w, b.as_deref(), &mut got);
            let what = format!("amx kernels (emulated tdpbsud, simd epilogue {simd})");
            check(&got, &what, threads);
            same(&got, &what);
            if format.is_super() && format != Format::Q6K16 && m >= 16 && threads == 1 {
                assert!(
                    super_amx_products_run() > before,
                    "{format:?} m={m} n={n} k={k}: the AMX path did not run"
                );
            }
        }
    }
}

#[test]
fn every_tier_matches_the_reference_on_awkward_shapes() {
    let mut rng = Rng::new(21);
    for format in [
        Format::Q8,
        Format::Q80,
        Format::Q4,
        Format::Q40,
        Format::Q50,
    ] {
        // The 32-value formats also at k of an odd number of 32-blocks (Q8's block is 64).
        let ks: &[usize] = match format {
            Format::Q8 => &[64, 128, 576],
            _ => &[32, 96, 128, 576],
        };
        for &n in &[1, 15, 16, 17, 63, 65] {
            for &k in ks {
                for &m in &[1, 2, 3, 8, 9, 17] {
                    case(format, m, n, k, n % 2 == 1, &mut rng);
                }
            }
        }
        case(format, 70, 96, 1536, true, &mut rng);
    }
}

#[test]
fn super_block_formats_match_the_reference_in_every_tier() {
    // k around the 256-value super-block: only a tail (32, 96), whole (256, 512), whole plus a tail
    // of 1, 2, 4 or 6 sub-blocks (288, 576, 896, 960); m around the packed tiles (1-8 rows) and the
    // unpacked ones (from 6 rows: 6-row tiles over 2 panels, 3- and 4-row ones); n around the 2-panel
    // groups (1, 2, 3, 5 panels).
    let mut rng = Rng::new(27);
    for format in [Format::Q4K, Format::Q6K, Format::Q6K16] {
        for &n in &[1, 15, 16, 17, 33, 65] {
            for &k in &[32, 96, 256, 288, 512, 576, 896, 960] {
                for &m in &[1, 2, 3, 5, 6, 7, 8, 9, 13, 17] {
                    case(format, m, n, k, n % 2 == 1, &mut rng);
                }
            }
        }
        case(format, 70, 96, 1536, true, &mut rng);
        // More rows than one row block of the many-rows path holds at this k (96 at k = 4096).
        case(format, 101, 40, 4096, false, &mut rng);
    }
}

#[test]
fn super_block_bytes_are_what_the_format_says() {
    let mut rng = Rng::new(28);
    for (format, bits) in [
        (Format::Q4K, 4.5),
        (Format::Q6K, 6.3125),
        (Format::Q6K16, 6.5625),
    ] {
        assert_eq!(format.bits_per_weight(), bits);
        let w = QuantWeight::pack(&quantize(&rng.vec(32 * 512), 32, 512, &opts(format)).unwrap());
        assert_eq!(w.bytes() * 8, (bits * 32.0 * 512.0) as usize, "{format:?}");
        // 576 = 2 super-blocks + 2 sub-blocks: the tail costs its header, not a bigger format.
        let w = QuantWeight::pack(&quantize(&rng.vec(16 * 576), 16, 576, &opts(format)).unwrap());
        let per = w.bytes() as f64 * 8.0 / (16.0 * 576.0);
        assert!(
            per > bits && per < bits + 0.25,
            "{format:?}: {per} bits per weight"
        );
    }
}

#[test]
fn split_across_the_decoders_pool_equals_serial() {
    let mut rng = Rng::new(22);
    let pool = SpinPool::new(3);
    for format in Format::ALL {
        // The last shape is big enough (67200 values) for its activations to be quantized in two tasks.
        for &(m, n, k) in &[
            (1, 4096, 256),
            (8, 1000, 576),
            (40, 520, 320),
            (210, 40, 320),
        ] {
            let x = rng.vec(m * k);
            let w = QuantWeight::pack(&quantize(&rng.vec(n * k), n, k, &opts(format)).unwrap());
            for tier in isa::supported() {
                let (mut serial, mut split) = (vec![0.0f32; m * n], vec![f32::NAN; m * n]);
                quant_linear(tier, &Serial, &x, m, &w, None, &mut serial);
                quant_linear(tier, &pool, &x, m, &w, None, &mut split);
                assert_eq!(
                    serial,
                    split,
                    "{} {format:?} m={m} n={n} k={k}",
                    tier.name()
                );
            }
        }
    }
}

#[test]
fn activation_codes_are_bit_identical_in_every_tier() {
    // Random rows; a row whose max is 127 (so x * 127 / max|x| = x exactly) holding .5 ties, which
    // round to even; zeros; a spike beside tiny values; 40 blocks so every vector loop has a tail.
    let mut rng = Rng::new(23);
    let mut x = rng.vec(QSUB * 40);
    for t in 0..QSUB {
        x[QSUB + t] = if t == 0 { 127.0 } else { t as f32 - 15.5 };
        x[2 * QSUB + t] = 0.0;
        x[3 * QSUB + t] = if t == 5 { 1e30 } else { 1e-3 * t as f32 };
        x[5 * QSUB + t] = 1e-38 * (t as f32 - 16.0); // 127 / max|x| overflows: coded as zeros
                                                     // The same in a tail that is not a whole group of blocks (tiers find scales 16 blocks at once).
        x[37 * QSUB + t] = 0.0;
        x[38 * QSUB + t] = 1e-38 * (t as f32 - 16.0);
    }
    let mut want = QActs {
        q: vec![0; x.len()],
        q2: vec![0; x.len()],
        ..QActs::default()
    };
    let blocks = x
        .chunks_exact(QSUB)
        .zip(want.q.chunks_exact_mut(QSUB))
        .zip(want.q2.chunks_exact_mut(QSUB));
    for (b, ((xb, qb), q2b)) in blocks.enumerate() {
        let c = quantize_block(xb, qb, q2b);
        let sum = |q: &[i8]| q.iter().map(|&c| c as i32).sum::<i32>();
        assert_eq!(
            (c.s, c.s_fine),
            (sum(qb), LO * sum(qb) + sum(q2b)),
            "block {b}: sums of its codes"
        );
        // The fine representation is within half a fine step of x.
        for t in 0..QSUB {
            let back = (LO * qb[t] as i32 + q2b[t] as i32) as f32 * c.d_fine;
            assert!(
                (back - xb[t]).abs() <= 0.5001 * c.d_fine + 1e-30,
                "block {b}[{t}]: {back} vs {}",
                xb[t]
            );
        }
        want.d.push(c.d);
        want.s.push(c.s as f32);
        want.d_fine.push(c.d_fine);
        want.s_fine.push(c.s_fine);
    }
    assert_eq!(&want.q[QSUB..QSUB + 4], &[127, -14, -14, -12]); // -14.5 -> -14, -13.5 -> -14 (even)
    assert_eq!((want.d[2], want.s[2]), (0.0, 0.0));
    for b in [5, 38] {
        assert!(want.q[b * QSUB..(b + 1) * QSUB].iter().all(|&c| c == 0) && want.d[b] == 0.0);
    }
    for tier in isa::supported() {
        let mut got = QActs::default();
        quantize_activations(tier, &x, &mut got);
        assert_eq!(got.q, want.q, "{}: codes", tier.name());
        assert_eq!(got.d, want.d, "{}: scales", tier.name());
        assert_eq!(got.s, want.s, "{}: sums", tier.name());
        assert_eq!(got.q2, want.q2, "{}: residual codes", tier.name());
        assert_eq!(got.d_fine, want.d_fine, "{}: fine scales", tier.name());
        assert_eq!(got.s_fine, want.s_fine, "{}: fine sums", tier.name());
        if kernel_name(tier) == "avx2" {
            // The AVX2 tier's one-i16 form of both codes, what its Q8 kernel reads.
            let fine: Vec<i16> = (want.q.iter().zip(&want.q2))
                .map(|(&q, &q2)| (LO * q as i32 + q2 as i32) as i16)
                .collect();
            assert_eq!(got.fine, fine, "avx2: fine codes");
        }
    }
}

#[test]
fn quantizers_stay_within_their_error_bounds_and_packing_round_trips() {
    let mut rng = Rng::new(24);
    let (n, k) = (37, 448);
    let w = rng.vec(n * k);
    for format in Format::ALL {
        let q = quantize(&w, n, k, &opts(format)).unwrap();
        let back = QuantWeight::pack(&q).unpack();
        assert_eq!(back, q, "{format:?}: pack then unpack");
        let d = q.dequantize();
        let bs = format.block().min(64);
        for j in 0..n {
            for b in 0..k / bs {
                let blk = j * k + b * bs..j * k + (b + 1) * bs;
                // The super-block formats' scales are multiples of their super-block's.
                let sup = j * k + (b * bs) / 256 * 256
                    ..(j * k + (b * bs) / 256 * 256 + 256).min(j * k + k);
                let amax = w[blk.clone()].iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let smax = w[sup].iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let err = blk
                    .clone()
                    .map(|i| (w[i] - d[i]).abs())
                    .fold(0.0f32, f32::max);
                // Q8: half a step of the unshrunk grid plus the largest clip (2 %); Q4: one step of
                // a 15-step grid over [min, max], which is at most 2 * amax wide.
                let bound = match format {
                    Format::Q8 | Format::Q80 => 0.5 * amax / 127.0 + 0.021 * amax,
                    Format::Q4 => 2.0 * amax / 15.0,
                    // d = s * max / -z gives the largest value the grid's longer end: a value of the
                    // other sign is clipped at most to (2z - 1) / (2z) * s * amax (s >= 0.85).
                    Format::Q40 => (1.0 - 0.85 * 7.0 / 8.0) * amax + 1e-6,
                    Format::Q50 => (1.0 - 0.85 * 15.0 / 16.0) * amax + 1e-6,
                    Format::Q4K => 2.2 * smax / 15.0,
                    Format::Q6K | Format::Q6K16 => 1.5 * smax / 31.0,
                };
                assert!(
                    err <= bound,
                    "{format:?} row {j} block {b}: error {err} > {bound}"
                );
            }
        }
        let mut row = vec![0.0f32; k];
        let packed = QuantWeight::pack(&q);
        packed.row_f32(5, &mut row);
        assert_eq!(&row[..], &d[5 * k..6 * k]);
    }
    let rms = |f: Format| {
        let d = quantize(&w, n, k, &opts(f)).unwrap().dequantize();
        (w.iter().zip(&d).map(|(a, b)| (a - b).powi(2)).sum::<f32>() / w.len() as f32).sqrt()
    };
    // Uniform weights on [-1, 1): a 16-level grid's rounding alone gives 2 / 15 / sqrt(12) = 0.0385;
    // Q4K's 6-bit sub-block scales cost little over Q4's f16 ones; a 64-level grid's rounding gives
    // 2 / 63 / sqrt(12) = 0.0092.
    let (q4, q4k, q6k) = (rms(Format::Q4), rms(Format::Q4K), rms(Format::Q6K));
    assert!(
        q4 < 0.036 && q4k < 0.037 && q6k < 0.0100,
        "{q4} {q4k} {q6k}"
    );
    // A scale per 16 values fits no worse than one per 32.
    let q6k16 = rms(Format::Q6K16);
    assert!(q6k16 <= q6k * 1.001, "{q6k16} {q6k}");
    // Q40 / Q50: grids of 16 and 32 levels with step about amax / 8 and amax / 16 (0.036 and 0.018 of
    // rounding alone).
    let (q40, q50) = (rms(Format::Q40), rms(Format::Q50));
    assert!(q40 < 0.040 && q50 < 0.020, "{q40} {q50}");
}

#[test]
fn importance_moves_the_error_to_the_columns_that_do_not_matter() {
    let mut rng = Rng::new(25);
    let (n, k) = (64, 128);
    let w = rng.vec(n * k);
    let imp: Vec<f32> = (0..k)
        .map(|c| if c % 4 == 0 { 100.0 } else { 0.01 })
        .collect();
    let weighted =
        |q: &[f32]| -> f32 { (0..n * k).map(|i| imp[i % k] * (w[i] - q[i]).powi(2)).sum() };
    for format in [Format::Q4, Format::Q4K, Format::Q6K, Format::Q6K16] {
        let plain = quantize(&w, n, k, &opts(format)).unwrap().dequantize();
        let fitted = quantize(
            &w,
            n,
            k,
            &QuantOptions {
                format,
                importance: Some(&imp),
                threads: 1,
            },
        )
        .unwrap()
        .dequantize();
        assert!(
            weighted(&fitted) < 0.8 * weighted(&plain),
            "{format:?}: {} vs {}",
            weighted(&fitted),
            weighted(&plain)
        );
    }
}

#[test]
fn bad_matrices_are_refused_with_a_reason() {
    let o8 = opts(Format::Q8);
    let err = quantize(&vec![0.5; 3 * 96], 3, 96, &o8).unwrap_err();
    assert!(
        err.contains("k = 96 is not a multiple of the q8 block (64 values)"),
        "{err}"
    );
    let mut w = vec![0.5; 2 * 64];
    w[70] = f32::NAN;
    let err = quantize(&w, 2, 64, &o8).unwrap_err();
    assert!(err.contains("weight [1, 6] is NaN"), "{err}");
    let err = quantize(&[0.0; 10], 2, 64, &o8).unwrap_err();
    assert!(err.contains("10 values for a [2, 64] matrix"), "{err}");
    let imp = [1.0; 3];
    let bad_imp = QuantOptions {
        format: Format::Q4,
        importance: Some(&imp),
        threads: 1,
    };
    assert!(quantize(&[0.0; 64], 2, 32, &bad_imp)
        .unwrap_err()
        .contains("expected k = 32"));
    let huge: Vec<f32> = (0..64).map(|i| i as f32 * 1e5).collect();
    let err = quantize(&huge, 2, 32, &opts(Format::Q4)).unwrap_err();
    assert!(err.contains("too large for q4's f16 scales"), "{err}");
    assert!(quantize(&huge, 1, 64, &o8).is_ok());
    let err = quantize(&[0.5; 2 * 48], 2, 48, &opts(Format::Q4K)).unwrap_err();
    assert!(
        err.contains("k = 48 is not a multiple of the q4k block (32 values)"),
        "{err}"
    );
    // Constant and all-zero blocks are exact.
    for format in Format::ALL {
        let q = quantize(&[0.0; 128], 2, 64, &opts(format)).unwrap();
        assert!(q.dequantize().iter().all(|&v| v == 0.0));
    }
    let q = quantize(&[0.25; 64], 2, 32, &opts(Format::Q4)).unwrap();
    assert!(q.dequantize().iter().all(|&v| v == 0.25));
}

#[test]
fn packed_bytes_round_trip_and_damage_is_refused() {
    let mut rng = Rng::new(26);
    let (n, k) = (20, 128);
    for format in Format::ALL {
        let w = QuantWeight::pack(&quantize(&rng.vec(n * k), n, k, &opts(format)).unwrap());
        let bytes = w.packed_bytes().to_vec();
        let back = QuantWeight::from_packed(format, n, k, bytes.clone()).unwrap();
        assert_eq!(back.unpack(), w.unpack(), "{format:?}");
        let short = QuantWeight::from_packed(format, n, k, bytes[..bytes.len() - 1].to_vec());
        assert!(short.unwrap_err().contains("bytes of"), "{format:?}");
        let mut nan = bytes.clone();
        // The first row's first scale: an f32 NaN (q8) or an f16 NaN (q8_0, q4 and the super-blocks).
        match format {
            Format::Q8 => nan[..4].copy_from_slice(&f32::NAN.to_le_bytes()),
            _ => nan[..2].copy_from_slice(&0x7e00u16.to_le_bytes()),
        }
        let err = QuantWeight::from_packed(format, n, k, nan).unwrap_err();
        let want = if format.is_super() {
            "rows 0.. super-block 0 have a non-finite scale"
        } else {
            "row 0 block 0 has a non-finite scale"
        };
        assert!(err.contains(want), "{err}");
    }
}

#[test]
fn a_group_equals_each_linear_alone_in_every_tier() {
    // Items of awkward shapes (an empty one among them), as a mixture's experts: each item's output is
    // bit-identical to quant_linear of that item, serial or on two threads.
    let mut rng = Rng::new(41);
    let shapes = [
        (1, 17, 64),
        (3, 65, 128),
        (0, 16, 64),
        (5, 1, 192),
        (2, 33, 64),
    ];
    for format in Format::ALL {
        let ws: Vec<QuantWeight> = shapes
            .iter()
            .map(|&(_, n, k)| {
                QuantWeight::pack(&quantize(&rng.vec(n * k), n, k, &opts(format)).unwrap())
            })
            .collect();
        let xs: Vec<Vec<f32>> = shapes.iter().map(|&(m, _, k)| rng.vec(m * k)).collect();
        for tier in isa::supported() {
            let alone: Vec<Vec<f32>> = shapes
                .iter()
                .zip(&ws)
                .zip(&xs)
                .map(|((&(m, n, _), w), x)| {
                    let mut y = vec![0.0f32; m * n];
                    quant_linear(tier, &Serial, x, m, w, None, &mut y);
                    y
                })
                .collect();
            for threads in [1, 2] {
                let mut ys: Vec<Vec<f32>> = shapes
                    .iter()
                    .map(|&(m, n, _)| vec![f32::NAN; m * n])
                    .collect();
                let mut items: Vec<GroupItem<'_>> = shapes
                    .iter()
                    .zip(&ws)
                    .zip(&xs)
                    .zip(ys.iter_mut())
                    .map(|(((&(m, _, _), w), x), y)| GroupItem { x, m, w, y })
                    .collect();
                quant_linear_group(tier, &ScopedThreads(threads), &mut items);
                assert_eq!(
                    ys,
                    alone,
                    "{format:?} tier {} threads {threads}",
                    tier.name()
                );
            }
        }
    }
}

#[test]
fn each_row_equals_that_row_alone_whatever_tile_it_falls_in() {
    // The server's exactness: a sequence's row in an m-row step (tiles of 2, 3, 4, 6 or 8 rows; from each
    // tier's threshold the super-block formats' many-rows path, with 2-panel groups and an odd last
    // panel here: 3 panels, k = 576 ends in a short super-block) gives the bits it gives alone (a 1-row
    // tile), in every tier and format.
    let mut rng = Rng::new(29);
    let (n, k) = (33, 576);
    for format in Format::ALL {
        let w = QuantWeight::pack(&quantize(&rng.vec(n * k), n, k, &opts(format)).unwrap());
        for m in [2, 3, 4, 5, 7, 9, 17, 25, 31] {
            let x = rng.vec(m * k);
            for tier in isa::supported() {
                // The nibble formats take the many-rows path on every tier with the super-block path
                // (all but AVX2, whose super-block formats run its own rows path).
                let nibbles = format.is_nibbles() && kernel_name(tier) != "avx2";
                let rows_path = (format.is_super() || nibbles) && m >= super_min_rows(tier);
                let mut all = vec![0.0; m * n];
                let (before, tiled_before) = (super_unpacked_panels_run(), tiled_acts_run());
                quant_linear(tier, &Serial, &x, m, &w, None, &mut all);
                assert_eq!(
                    super_unpacked_panels_run() - before,
                    if rows_path { 3 } else { 0 },
                    "{} {format:?} m = {m}: panels through the unpacked-codes path",
                    tier.name()
                );
                // Below that, the AVX-512 packed tiles read the rows from the tiled layout.
                let avx512 = ["avx512vnni", "amx-int8"].contains(&kernel_name(tier));
                let tiled = avx512 && format.is_super() && !rows_path;
                assert_eq!(
                    tiled_acts_run() - tiled_before,
                    usize::from(tiled),
                    "{} {format:?} m = {m}: activations tiled for the packed tiles",
                    tier.name()
                );
                for i in 0..m {
                    let mut one = vec![0.0; n];
                    quant_linear(tier, &Serial, &x[i * k..(i + 1) * k], 1, &w, None, &mut one);
                    assert_eq!(
                        &all[i * n..(i + 1) * n],
                        &one[..],
                        "{} {format:?}: row {i} of {m}",
                        tier.name()
                    );
                }
            }
            // The AMX tier over the emulated AMX-INT8 tiles (16 rows at a time from 16 rows, padded).
            let mut all = vec![0.0; m * n];
            let before = super_amx_products_run();
            quant_linear_amx_emulated(false, &Serial, &x, m, &w, None, &mut all);
            // Q6K16 does not run on AMX tiles (a scale per 16 values: the AVX-512 tiles take it).
            if format.is_super() && format != Format::Q6K16 {
                // 3 panels (2 + 1) x 18 sub-blocks (k = 576) per 16-row chunk.
                let chunks = if m >= 16 { m.div_ceil(16) } else { 0 };
                assert_eq!(
                    super_amx_products_run() - before,
                    chunks * 3 * 18,
                    "amx (emulated) {format:?} m = {m}: tile products"
                );
            }
            for i in 0..m {
                let mut one = vec![0.0; n];
                quant_linear_amx_emulated(
                    false,
                    &Serial,
                    &x[i * k..(i + 1) * k],
                    1,
                    &w,
                    None,
                    &mut one,
                );
                assert_eq!(
                    &all[i * n..(i + 1) * n],
                    &one[..],
                    "amx (emulated) {format:?}: row {i} of {m}"
                );
            }
            // The AVX-VNNI tier's kernels (its own unpacked-codes tiles from 6 rows) over the exact
            // emulation of vpdpbusd, on any AVX2 CPU.
            let rows_path = (format.is_super() || format.is_nibbles()) && m >= 6;
            if isa::Isa::Avx2.is_supported() {
                let mut all = vec![0.0; m * n];
                let before = super_unpacked_panels_run();
                quant_linear_vnni_emulated(&Serial, &x, m, &w, None, &mut all);
                assert_eq!(
                    super_unpacked_panels_run() - before,
                    if rows_path { 3 } else { 0 },
                    "avxvnni (emulated) {format:?} m = {m}: panels through the unpacked-codes path"
                );
                for i in 0..m {
                    let mut one = vec![0.0; n];
                    let xi = &x[i * k..(i + 1) * k];
                    quant_linear_vnni_emulated(&Serial, xi, 1, &w, None, &mut one);
                    assert_eq!(
                        &all[i * n..(i + 1) * n],
                        &one[..],
                        "avxvnni (emulated) {format:?}: row {i} of {m}"
                    );
                }
            }
        }
    }
}
