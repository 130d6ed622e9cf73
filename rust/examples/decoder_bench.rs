//! Decoder timing without Python: a random-weight model with a published shape, decode steps and a
//! prompt step on the decoder's own pool, next to the same GEMVs run alone and a plain read-bandwidth
//! loop, so the gap between "the step" and "the weights it reads" can be split into its parts.
//!
//! Run: `cargo run --release -p kwker-kernels --example decoder_bench [135m|360m|0.5b|0.6b|1.7b] [threads] [bf16|q8|q8_0|q4|q4k] [steps [prompt]]`
//! (q8/q4/q4k: every layer matrix quantized, the tied embedding/lm_head as q8, or q6k beside q4k as int4 stores it).
//! The KV cache is each precision's default in `KwkDecoder` (int4 q8, int8 bf16, float f32).
//! Rates are bytes of weights per second (the memory-bound quantity) and tokens per second.

use std::time::Instant;

use kwker_kernels::bf16::f32_to_bf16;
use kwker_kernels::decoder::builder::{Builder, Data, Store};
use kwker_kernels::decoder::linear::lin;
use kwker_kernels::decoder::recipe::{
    Act, Biases, Block, KvFormat, LayerSpec, Limits, Mlp, Norm, NormKind, Placement, Positions,
    Recipe, Rope,
};
use kwker_kernels::decoder::tensors::Tensor;
use kwker_kernels::decoder::{Decoder, Logits, SeqStep};
use kwker_kernels::isa;
use kwker_kernels::linear::{linear, Weight};
use kwker_kernels::par::Parallel;
use kwker_kernels::pool::SpinPool;
use kwker_kernels::quant::Format;

struct Shape {
    hidden: usize,
    inter: usize,
    layers: usize,
    heads: usize,
    kv: usize,
    vocab: usize,
    head_dim: usize,
}

fn shape(name: &str) -> Shape {
    match name {
        "360m" => Shape {
            hidden: 960,
            inter: 2560,
            layers: 32,
            heads: 15,
            kv: 5,
            vocab: 49152,
            head_dim: 64,
        },
        "0.5b" => Shape {
            hidden: 896,
            inter: 4864,
            layers: 24,
            heads: 14,
            kv: 2,
            vocab: 151936,
            head_dim: 64,
        },
        "1.7b" => Shape {
            hidden: 2048,
            inter: 8192,
            layers: 24,
            heads: 32,
            kv: 32,
            vocab: 49152,
            head_dim: 64,
        },
        // Qwen3-0.6B: 16 heads of 128 (q wider than the hidden size), no q/k norms here.
        "0.6b" => Shape {
            hidden: 1024,
            inter: 3072,
            layers: 28,
            heads: 16,
            kv: 8,
            vocab: 151936,
            head_dim: 128,
        },
        _ => Shape {
            hidden: 576,
            inter: 1536,
            layers: 30,
            heads: 9,
            kv: 3,
            vocab: 49152,
            head_dim: 64,
        },
    }
}

fn random_bf16(n: usize, seed: u64) -> Vec<u16> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f32_to_bf16(((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04)
        })
        .collect()
}

/// A Llama-shaped recipe (RMSNorm, pre-norm, SwiGLU, full rotary, tied embeddings).
fn recipe(s: &Shape, d: usize) -> Recipe {
    Recipe {
        vocab: s.vocab,
        hidden: s.hidden,
        embed_dim: s.hidden,
        layers: s.layers,
        heads: s.heads,
        kv_heads: s.kv,
        head_dim: d,
        intermediate: s.inter,
        norm: Norm {
            kind: NormKind::Rms,
            eps: 1e-5,
            weight: true,
            bias: false,
        },
        placement: Placement::Pre,
        block: Block::Sequential,
        mlp: Mlp {
            gated: true,
            act: Act::Silu,
        },
        moe: None,
        bias: Biases::default(),
        qk_norm: None,
        clip_qkv: None,
        clip_after_norm: false,
        attn_softcap: None,
        final_softcap: None,
        embed_scale: 1.0,
        residual_scale: 1.0,
        logit_divisor: 1.0,
        final_norm: true,
        tied_embeddings: true,
        positions: Positions::Rotary {
            ropes: vec![Rope {
                inv_freq: (0..d / 2)
                    .map(|i| 1e4f32.powf(-((2 * i) as f32) / d as f32))
                    .collect(),
                scale: 1.0,
                long: None,
            }],
        },
        layer_specs: vec![
            LayerSpec {
                window: None,
                rope: 0,
                attn_scale: (d as f32).powf(-0.5),
                sparse: false,
            };
            s.layers
        ],
    }
}

/// The KV cache each precision gets by default in `KwkDecoder` (`DEFAULT_KV_CACHE`): int4 q8, int8 bf16.
fn kv_format(format: Option<Format>) -> KvFormat {
    match format {
        Some(Format::Q4K | Format::Q4) => KvFormat::Q8,
        Some(_) => KvFormat::Bf16,
        None => KvFormat::F32,
    }
}

fn build(s: &Shape, format: Option<Format>) -> Decoder {
    let d = s.head_dim;
    let limits = Limits {
        slots: 8,
        max_context: 1024,
        chunk_rows: 512,
        kv: kv_format(format),
    };
    let mut b = Builder::new(recipe(s, d), limits).unwrap();
    b.set_threads(std::thread::available_parallelism().map_or(1, |n| n.get()));
    let h = s.hidden;
    let qkv = (s.heads + 2 * s.kv) * d;
    let ones = vec![1.0f32; h];
    let mut seed = 1;
    let mut mat = |b: &mut Builder, t: Tensor, l: usize, rows: usize, cols: usize| {
        seed += 1;
        let w = random_bf16(rows * cols, seed);
        let store = match (t, format) {
            (_, None) => Store::AsGiven,
            (Tensor::Embed, Some(Format::Q4K)) => Store::Quant(Format::Q6K, None),
            (Tensor::Embed, Some(_)) => Store::Quant(Format::Q8, None),
            (_, Some(f)) => Store::Quant(f, None),
        };
        b.set(t.spec().name, l, 0, Data::Bf16(&w), rows, cols, store)
            .unwrap();
    };
    mat(&mut b, Tensor::Embed, 0, s.vocab, h);
    let vec = |b: &mut Builder, name: &str, l: usize| {
        b.set(name, l, 0, Data::F32(&ones), 1, h, Store::AsGiven)
            .unwrap()
    };
    vec(&mut b, "final_norm", 0);
    for l in 0..s.layers {
        vec(&mut b, "attn_norm", l);
        vec(&mut b, "mlp_norm", l);
        mat(&mut b, Tensor::Qkv, l, qkv, h);
        mat(&mut b, Tensor::O, l, h, s.heads * d);
        mat(&mut b, Tensor::Up, l, 2 * s.inter, h);
        mat(&mut b, Tensor::Down, l, h, s.inter);
    }
    b.build().unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map(String::as_str).unwrap_or("135m");
    let threads: usize = args.get(2).and_then(|t| t.parse().ok()).unwrap_or(2);
    let s = shape(name);
    let isa = isa::detect();
    let pool = SpinPool::new(threads);
    let format = match args.get(3).map(String::as_str) {
        Some("q8") => Some(Format::Q8),
        Some("q8_0") => Some(Format::Q80),
        Some("q4") => Some(Format::Q4),
        Some("q4k") => Some(Format::Q4K),
        _ => None,
    };
    let mut dec = build(&s, format);
    let bytes = dec.weights().bytes_per_token(0) as f64;
    println!(
        "{name}: {:.0} MB of weights per token, tier {}, {threads} threads, {:?} KV cache",
        bytes / 1e6,
        isa.name(),
        kv_format(format)
    );

    // Read bandwidth: sum a 512 MB buffer with the same pool.
    let big = vec![1u16; 256 << 20];
    let mut rb = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let parts = pool.num_threads();
        let chunk = big.len() / parts;
        let sums: Vec<std::sync::atomic::AtomicU64> = (0..parts).map(|_| 0.into()).collect();
        pool.run(parts, &|i| {
            let s: u64 = big[i * chunk..(i + 1) * chunk]
                .iter()
                .map(|&x| x as u64)
                .sum();
            sums[i].store(s, std::sync::atomic::Ordering::Relaxed);
        });
        rb.push(big.len() as f64 * 2.0 / t.elapsed().as_secs_f64());
    }
    println!("read bandwidth (sum of u16): {:.1} GB/s", median(rb) / 1e9);

    // The model's linears alone, in model order (every matrix once per "token"), on the panel
    // layout and on the row-major layout of `linear` (interleaved, for m = 1, 8 and 64 rows).
    let w = dec.weights();
    let mut mats: Vec<&kwker_kernels::decoder::weights::Mat> = Vec::new();
    for l in 0..w.n_layers() {
        mats.extend([Tensor::Qkv, Tensor::O, Tensor::Up, Tensor::Down].map(|t| w.mat(t, l)));
    }
    mats.push(w.lm_head());
    let rowmajor: Vec<Vec<u16>> = mats
        .iter()
        .map(|m| {
            let (n, k) = (m.rows(), m.cols());
            let mut r = vec![0f32; k];
            let mut out = vec![0u16; n * k];
            for j in 0..n {
                m.row_f32(j, &mut r);
                for kk in 0..k {
                    out[j * k + kk] = f32_to_bf16(r[kk]);
                }
            }
            out
        })
        .collect();
    let maxk = s.hidden.max(s.inter);
    let maxn = s.vocab.max(2 * s.inter);
    // A fourth argument `steps` skips to the decode and prompt steps (for a profiler).
    let only_steps = args.get(4).map(String::as_str) == Some("steps");
    for rows in [1usize, 8, 64, 512].into_iter().filter(|_| !only_steps) {
        let x = vec![0.01f32; maxk * rows];
        let mut y = vec![0.0f32; maxn * rows];
        let (mut tp, mut tr) = (Vec::new(), Vec::new());
        for _ in 0..if rows >= 64 { 2 } else { 15 } {
            let t = Instant::now();
            for m in &mats {
                let (n, k) = (m.rows(), m.cols());
                let (x, y) = (&x[..rows * k], &mut y[..rows * n]);
                lin(isa, &pool, x, rows, m, None, y);
            }
            tp.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            for (m, r) in mats.iter().zip(&rowmajor) {
                let (n, k) = (m.rows(), m.cols());
                linear(
                    isa,
                    &pool,
                    &x[..rows * k],
                    rows,
                    k,
                    Weight::Bf16(r),
                    n,
                    None,
                    &mut y[..rows * n],
                );
            }
            tr.push(t.elapsed().as_secs_f64());
        }
        let (p, r) = (median(tp), median(tr));
        println!(
            "linears alone, {rows} row(s): panel {:.2} ms ({:.1} GB/s), row-major {:.2} ms ({:.1} GB/s)",
            p * 1e3,
            bytes / p / 1e9,
            r * 1e3,
            bytes / r / 1e9
        );
    }

    // Decode steps (batch 1), then 8 sequences per step.
    let vocab = s.vocab;
    let prompt: Vec<u32> = (0..64).map(|i| (i * 7 + 3) as u32 % vocab as u32).collect();
    let mut logits = vec![0.0f32; 8 * vocab];
    // `prompt` (after `steps`): only prompt steps, 20 of them (a profile of the prompt alone).
    let only_prompt = args.get(5).map(String::as_str) == Some("prompt");
    // `batch` (after `steps`): only 8-sequence decode steps, 640 of them at 64-127 tokens of context (a
    // profile of a batched step).
    let only_batch = args.get(5).map(String::as_str) == Some("batch");
    let sizes: &[usize] = match (only_prompt, only_batch) {
        (true, _) => &[],
        (_, true) => &[8],
        _ => &[1, 8],
    };
    for &bsz in sizes {
        for slot in 0..bsz {
            dec.truncate(slot, 0).unwrap();
            let one = [SeqStep {
                slot,
                tokens: &prompt,
                logits: Logits::None,
            }];
            dec.step(isa, &pool, &one, &mut []).unwrap();
        }
        let mut ts = Vec::new();
        for i in 0..if only_batch { 640 } else { 64 } {
            if i > 0 && i % 64 == 0 {
                // Back to the 64-token prompts (untimed): every timed step sees 64-127 earlier tokens.
                for slot in 0..bsz {
                    dec.truncate(slot, prompt.len()).unwrap();
                }
            }
            let toks: Vec<[u32; 1]> = (0..bsz).map(|b| [((i * 31 + b) % vocab) as u32]).collect();
            let batch: Vec<SeqStep<'_>> = (0..bsz)
                .map(|b| SeqStep {
                    slot: b,
                    tokens: &toks[b],
                    logits: Logits::Last,
                })
                .collect();
            let t = Instant::now();
            dec.step(isa, &pool, &batch, &mut logits[..bsz * vocab])
                .unwrap();
            ts.push(t.elapsed().as_secs_f64());
        }
        let step = median(ts);
        println!(
            "decode, {bsz} sequence(s): {:.2} ms/step, {:.1} tokens/s, {:.1} GB/s of weights",
            step * 1e3,
            bsz as f64 / step,
            bytes / step / 1e9
        );
    }
    if only_batch {
        println!("pool stalls: {}", pool.stalls());
        return;
    }
    // Prompt of 512 tokens.
    let p512: Vec<u32> = (0..512)
        .map(|i| (i * 13 + 5) as u32 % vocab as u32)
        .collect();
    let mut ts = Vec::new();
    for _ in 0..if only_prompt { 20 } else { 3 } {
        dec.truncate(0, 0).unwrap();
        let one = [SeqStep {
            slot: 0,
            tokens: &p512,
            logits: Logits::Last,
        }];
        let t = Instant::now();
        dec.step(isa, &pool, &one, &mut logits[..vocab]).unwrap();
        ts.push(t.elapsed().as_secs_f64());
    }
    let best = ts.iter().copied().fold(f64::INFINITY, f64::min);
    let prompt_s = median(ts);
    println!(
        "prompt 512: {:.0} tokens/s (median), {:.0} (best)",
        512.0 / prompt_s,
        512.0 / best
    );
    if format.is_some() {
        // The activation quantization every quantized linear of a prompt step starts with (one thread).
        let x = vec![0.37f32; 512 * s.inter];
        let mut acts = kwker_kernels::quant::QActs::default();
        let t = Instant::now();
        for _ in 0..10 {
            kwker_kernels::quant::quantize_activations(isa, &x, &mut acts);
        }
        let per = t.elapsed().as_secs_f64() / 10.0;
        println!(
            "activation quantization, 512 x {}: {:.2} ms; all of a prompt step's: ~{:.0}% of it",
            s.inter,
            per * 1e3,
            100.0 * per * (3.0 * s.hidden as f64 / s.inter as f64 + 1.0) * s.layers as f64
                / prompt_s
        );
    }
    println!("pool stalls: {}", pool.stalls());
    act_check();
}

#[allow(dead_code)]
fn act_check() {
    use kwker_kernels::vmath::{act_mul, Act};
    let n = 1536;
    let g: Vec<f32> = (0..512 * n)
        .map(|i| ((i % 97) as f32 - 48.0) * 0.1)
        .collect();
    let mut out = vec![0.0f32; 512 * n];
    for act in [Act::Silu, Act::GeluTanh, Act::GeluErf] {
        for isa in kwker_kernels::isa::supported() {
            let t = Instant::now();
            act_mul(isa, act, &g, &g, &mut out);
            println!(
                "{act:?} x up, 512 x {n}, {}: {:.2} ms",
                isa.name(),
                t.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}
