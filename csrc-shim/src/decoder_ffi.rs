//! `kwker_decoder_*`: C entry points of the whole-model decoder (called from
//! `kwker_torch/decoder.py` through ctypes, which releases the GIL for the call).
//!
//! A decoder is built in three moves: `kwker_decoder_builder` (config), one `kwker_decoder_set` per
//! tensor (copied in), `kwker_decoder_build`. Every call returns 0 or a non-zero code with a message
//! in `err`; panics are caught. Each decoder has its own lock: calls from several threads on one
//! decoder run one after another; different decoders run concurrently. Steps run on the process's
//! decoder pool (`pool.rs`), sized by KWKER_NUM_THREADS or torch's thread count
//! (`KWKER_DECODER_POOL=torch` uses torch's intra-op pool instead, to compare the two).
use crate::config::{current_isa, thread_cap};
use crate::error::guarded;
use crate::torch_pool::TorchPool;
use kwker_kernels::decoder::builder::{Builder, Data, Kind, Store};
use kwker_kernels::decoder::config::Config;
use kwker_kernels::decoder::generate::{generate, Finish, GenParams};
use kwker_kernels::decoder::sample::SampleParams;
use kwker_kernels::decoder::weights::Mat;
use kwker_kernels::decoder::{Decoder, Logits, SeqStep};
use kwker_kernels::par::Parallel;
use kwker_kernels::pool::SpinPool;
use kwker_kernels::quant::Format;
use std::ffi::{c_char, c_void};
use std::sync::{Arc, Mutex};

/// The configuration as C passes it (field order = `_DecoderConfig` in decoder.py).
#[repr(C)]
pub struct KwkDecoderConfig {
    pub vocab: i64,
    pub hidden: i64,
    pub layers: i64,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub intermediate: i64,
    /// 0 = no sliding window.
    pub sliding_window: i64,
    pub tied_embeddings: i64,
    pub slots: i64,
    pub max_context: i64,
    pub chunk_rows: i64,
    pub rms_eps: f64,
    pub attn_scale: f64,
    pub rope_scale: f64,
    /// head_dim / 2 floats.
    pub inv_freq: *const f32,
}

/// Generation settings as C passes them (= `_GenParams` in decoder.py).
#[repr(C)]
pub struct KwkGenParams {
    pub max_new: i64,
    pub temperature: f64,
    pub top_k: i64,
    pub top_p: f64,
    pub seed: u64,
    /// Most drafts per step (prompt lookup); 0 = off.
    pub max_draft: i64,
}

type TokenCallback = Option<extern "C" fn(seq: i64, token: i64, user: *mut c_void) -> i32>;

/// `len` values at `ptr`, or an empty slice when `len` is 0 (then `ptr` may be null: an empty torch
/// tensor's data pointer is).
///
/// # Safety
/// When `len > 0`, `ptr` must be valid for `len` reads of T for the returned lifetime.
unsafe fn raw_slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if len == 0 || ptr.is_null() {
        return &[];
    }
    // SAFETY: non-null and valid for len reads (the caller's contract).
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

fn size(v: i64, what: &str) -> Result<usize, String> {
    usize::try_from(v).map_err(|_| format!("{what} must be >= 0, got {v}"))
}

/// The process's decoder pool, rebuilt when the wanted thread count changes.
fn pool() -> Arc<SpinPool> {
    static POOL: Mutex<Option<Arc<SpinPool>>> = Mutex::new(None);
    let want = match thread_cap() {
        0 => crate::torch_pool::torch_threads(),
        n => n,
    }
    .max(1);
    let mut g = POOL.lock().unwrap_or_else(|p| p.into_inner());
    match &*g {
        Some(p) if p.threads() == want => Arc::clone(p),
        _ => {
            let p = Arc::new(SpinPool::new(want));
            *g = Some(Arc::clone(&p));
            p
        }
    }
}

/// Runs `f` on the decoder's pool, or on torch's intra-op pool when `KWKER_DECODER_POOL=torch` (read at
/// every step, ~0.2 us, so a benchmark can switch within one process to measure one against the other).
fn with_pool<R>(f: impl FnOnce(&dyn Parallel) -> R) -> R {
    let torch = std::env::var_os("KWKER_DECODER_POOL").is_some_and(|v| v == "torch");
    if torch {
        f(&TorchPool::new())
    } else {
        f(&*pool())
    }
}

struct Handle {
    dec: Mutex<Decoder>,
}

/// # Safety
/// `h` must be a live handle from `kwker_decoder_build`.
unsafe fn handle<'a>(h: *mut c_void) -> Result<&'a Handle, String> {
    if h.is_null() {
        return Err("the decoder handle is null".into());
    }
    // SAFETY: a live handle (caller's contract).
    Ok(unsafe { &*(h as *const Handle) })
}

fn lock(h: &Handle) -> std::sync::MutexGuard<'_, Decoder> {
    h.dec.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts a decoder from its configuration; returns a builder handle, or null with a message.
///
/// # Safety
/// `cfg` must point to a valid config whose `inv_freq` holds `head_dim / 2` floats.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_builder(
    cfg: *const KwkDecoderConfig,
    err: *mut c_char,
    err_len: usize,
) -> *mut c_void {
    let mut out: *mut c_void = std::ptr::null_mut();
    guarded(err, err_len, || {
        if cfg.is_null() {
            return Err("the config is null".into());
        }
        // SAFETY: a valid config (caller's contract).
        let c = unsafe { &*cfg };
        let head_dim = size(c.head_dim, "head_dim")?;
        if c.inv_freq.is_null() {
            return Err("the rotary inverse frequencies are missing".into());
        }
        // SAFETY: inv_freq holds head_dim / 2 floats (caller's contract).
        let inv_freq = unsafe { raw_slice(c.inv_freq, head_dim / 2) }.to_vec();
        let cfg = Config {
            vocab: size(c.vocab, "vocab_size")?,
            hidden: size(c.hidden, "hidden_size")?,
            layers: size(c.layers, "num_hidden_layers")?,
            heads: size(c.heads, "num_attention_heads")?,
            kv_heads: size(c.kv_heads, "num_key_value_heads")?,
            head_dim,
            intermediate: size(c.intermediate, "intermediate_size")?,
            rms_eps: c.rms_eps as f32,
            attn_scale: c.attn_scale as f32,
            inv_freq,
            rope_scale: c.rope_scale as f32,
            sliding_window: match size(c.sliding_window, "sliding_window")? {
                0 => None,
                w => Some(w),
            },
            tied_embeddings: c.tied_embeddings != 0,
            slots: size(c.slots, "max_batch")?,
            max_context: size(c.max_context, "max_context")?,
            chunk_rows: size(c.chunk_rows, "chunk_rows")?,
        };
        out = Box::into_raw(Box::new(Builder::new(cfg)?)) as *mut c_void;
        Ok(())
    });
    out
}

/// The checked arguments of `kwker_decoder_set` / `kwker_decoder_set_quant`, handed to `put`.
///
/// # Safety
/// `b` must be a live builder handle; `data` must hold `rows * cols` elements of `dtype`.
#[allow(clippy::too_many_arguments)]
unsafe fn with_tensor(
    b: *mut c_void,
    kind: i32,
    layer: i64,
    dtype: i32,
    data: *const c_void,
    rows: i64,
    cols: i64,
    put: impl FnOnce(&mut Builder, Kind, usize, Data<'_>, usize, usize) -> Result<(), String>,
) -> Result<(), String> {
    if b.is_null() || data.is_null() {
        return Err("null builder or tensor data".into());
    }
    // SAFETY: a live builder (caller's contract), used by one thread at a time.
    let builder = unsafe { &mut *(b as *mut Builder) };
    let kind = Kind::from_code(kind).ok_or_else(|| format!("unknown tensor kind {kind}"))?;
    let (rows, cols) = (size(rows, "rows")?, size(cols, "cols")?);
    let n = rows.checked_mul(cols).ok_or("the tensor size overflows")?;
    // SAFETY: data holds rows * cols elements of dtype (caller's contract).
    let d = unsafe {
        match dtype {
            0 => Data::F32(raw_slice(data as *const f32, n)),
            1 => Data::Bf16(raw_slice(data as *const u16, n)),
            _ => return Err(format!("unsupported dtype code {dtype}")),
        }
    };
    put(builder, kind, size(layer, "layer")?, d, rows, cols)
}

/// Copies one tensor into a builder. dtype 0 = f32, 1 = bf16.
///
/// # Safety
/// `b` must be a live builder handle; `data` must hold `rows * cols` elements of `dtype`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_decoder_set(
    b: *mut c_void,
    kind: i32,
    layer: i64,
    dtype: i32,
    data: *const c_void,
    rows: i64,
    cols: i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantees.
        unsafe {
            with_tensor(
                b,
                kind,
                layer,
                dtype,
                data,
                rows,
                cols,
                |bd, k, l, d, r, c| bd.set(k, l, d, r, c, Store::AsGiven),
            )
        }
    })
}

/// Copies one matrix into a builder, quantized: format 1 = q8, 2 = q4; `importance` is null or holds
/// `cols` f32 values (the mean square of each input column over a calibration text). Quantizing runs
/// on as many threads as the decoder pool has (`KWKER_NUM_THREADS`, or torch's count).
///
/// # Safety
/// As `kwker_decoder_set`; `importance`, when not null, holds `cols` f32s.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_decoder_set_quant(
    b: *mut c_void,
    kind: i32,
    layer: i64,
    dtype: i32,
    data: *const c_void,
    rows: i64,
    cols: i64,
    format: i32,
    importance: *const f32,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        let format = match format {
            1 => Format::Q8,
            2 => Format::Q4,
            _ => return Err(format!("unknown weight format code {format}")),
        };
        let k = size(cols, "cols")?;
        // SAFETY: importance, when not null, holds cols f32s (caller's contract).
        let imp = (!importance.is_null()).then(|| unsafe { raw_slice(importance, k) });
        let threads = pool().threads();
        // SAFETY: forwarded caller guarantees.
        unsafe {
            with_tensor(
                b,
                kind,
                layer,
                dtype,
                data,
                rows,
                cols,
                |bd, k, l, d, r, c| {
                    bd.set_threads(threads);
                    bd.set(k, l, d, r, c, Store::Quant(format, imp))
                },
            )
        }
    })
}

/// Builds the decoder, consuming (and freeing) the builder either way; null with a message on error.
///
/// # Safety
/// `b` must be a live builder handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_build(
    b: *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> *mut c_void {
    let mut out: *mut c_void = std::ptr::null_mut();
    guarded(err, err_len, || {
        if b.is_null() {
            return Err("the builder handle is null".into());
        }
        // SAFETY: ownership returns from Box::into_raw in kwker_decoder_builder.
        let builder = unsafe { Box::from_raw(b as *mut Builder) };
        let dec = builder.build()?;
        out = Box::into_raw(Box::new(Handle {
            dec: Mutex::new(dec),
        })) as *mut c_void;
        Ok(())
    });
    out
}

/// Frees an unbuilt builder (null is ignored).
///
/// # Safety
/// `b` must be a builder handle not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_builder_free(b: *mut c_void) {
    if !b.is_null() {
        // SAFETY: ownership returns from Box::into_raw.
        drop(unsafe { Box::from_raw(b as *mut Builder) });
    }
}

/// Frees a decoder (null is ignored).
///
/// # Safety
/// `h` must be a decoder handle not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_free(h: *mut c_void) {
    if !h.is_null() {
        // SAFETY: ownership returns from Box::into_raw in kwker_decoder_build.
        drop(unsafe { Box::from_raw(h as *mut Handle) });
    }
}

fn logits_mode(c: i32) -> Result<Logits, String> {
    match c {
        0 => Ok(Logits::None),
        1 => Ok(Logits::Last),
        2 => Ok(Logits::All),
        _ => Err(format!("unknown logits mode {c}")),
    }
}

/// One step over `n_seqs` sequences: sequence i appends `n_tokens[i]` tokens (concatenated in
/// `tokens`) to slot `slots[i]` and returns the logits its `modes[i]` asks for (0 none, 1 last, 2 all)
/// into `logits` (`logits_len` floats = rows wanted * vocab).
///
/// # Safety
/// `h` a live decoder; `slots`, `n_tokens`, `modes` hold `n_seqs` values; `tokens` holds their sum;
/// `logits` holds `logits_len` floats.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_decoder_step(
    h: *mut c_void,
    n_seqs: i64,
    slots: *const i64,
    n_tokens: *const i64,
    tokens: *const i64,
    modes: *const i32,
    logits: *mut f32,
    logits_len: i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantees.
        let h = unsafe { handle(h)? };
        let n = size(n_seqs, "the number of sequences")?;
        // SAFETY: n values each (caller's contract).
        let (slots, counts, modes) = unsafe {
            (
                raw_slice(slots, n),
                raw_slice(n_tokens, n),
                raw_slice(modes, n),
            )
        };
        let total = counts
            .iter()
            .try_fold(0usize, |a, &c| size(c, "a token count").map(|c| a + c))?;
        // SAFETY: `total` token ids (caller's contract).
        let ids = unsafe { raw_slice(tokens, total) };
        let ids: Vec<u32> = ids
            .iter()
            .map(|&t| u32::try_from(t).map_err(|_| format!("token id {t} is out of range")))
            .collect::<Result<_, _>>()?;
        let mut batch = Vec::with_capacity(n);
        let mut at = 0;
        for i in 0..n {
            let c = counts[i] as usize;
            batch.push(SeqStep {
                slot: size(slots[i], "a slot")?,
                tokens: &ids[at..at + c],
                logits: logits_mode(modes[i])?,
            });
            at += c;
        }
        let len = size(logits_len, "the logits length")?;
        let out: &mut [f32] = if len == 0 {
            &mut []
        } else {
            // SAFETY: `len` writable floats (caller's contract).
            unsafe { std::slice::from_raw_parts_mut(logits, len) }
        };
        let mut dec = lock(h);
        with_pool(|par| dec.step(current_isa(), par, &batch, out))
    })
}

/// Length of a slot (tokens it holds), or -1 for a slot that does not exist.
///
/// # Safety
/// `h` a live decoder.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_slot_len(h: *mut c_void, slot: i64) -> i64 {
    // SAFETY: forwarded caller guarantee.
    let Ok(h) = (unsafe { handle(h) }) else {
        return -1;
    };
    let Ok(slot) = usize::try_from(slot) else {
        return -1;
    };
    lock(h).slot_len(slot).map(|n| n as i64).unwrap_or(-1)
}

/// Copies up to `cap` of a slot's tokens into `out`.
///
/// # Safety
/// `h` a live decoder; `out` holds `cap` values.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_slot_tokens(
    h: *mut c_void,
    slot: i64,
    out: *mut i64,
    cap: i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantees.
        let h = unsafe { handle(h)? };
        let dec = lock(h);
        let toks = dec.slot_tokens(size(slot, "slot")?)?;
        let n = toks.len().min(size(cap, "cap")?);
        for (i, &t) in toks[..n].iter().enumerate() {
            // SAFETY: i < cap (caller's contract).
            unsafe { *out.add(i) = t as i64 };
        }
        Ok(())
    })
}

/// Keeps the first `len` tokens of a slot.
///
/// # Safety
/// `h` a live decoder.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_truncate(
    h: *mut c_void,
    slot: i64,
    len: i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantee.
        let h = unsafe { handle(h)? };
        lock(h).truncate(size(slot, "slot")?, size(len, "length")?)
    })
}

/// Sets the rotary position of the first token of an empty slot.
///
/// # Safety
/// `h` a live decoder.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_set_position(
    h: *mut c_void,
    slot: i64,
    pos: i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantee.
        let h = unsafe { handle(h)? };
        lock(h).set_next_pos(size(slot, "slot")?, size(pos, "position")?)
    })
}

/// Makes slot `dst` hold the first `len` tokens of slot `src`.
///
/// # Safety
/// `h` a live decoder.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_copy_prefix(
    h: *mut c_void,
    src: i64,
    dst: i64,
    len: i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantee.
        let h = unsafe { handle(h)? };
        lock(h).copy_prefix(size(src, "src")?, size(dst, "dst")?, size(len, "length")?)
    })
}

/// One stored tensor of a built decoder, for saving: writes its format (0 f32, 1 bf16, 2 q8, 3 q4
/// packed matrix; 4 f32 vector; -1 absent, e.g. a bias the model does not have), its shape and the byte
/// count to `fmt`, `rows`, `cols`, `needed`, and copies the bytes into `buf` when `buf` is not null
/// (an error if `buf_len` is too small).
///
/// # Safety
/// `h` a live decoder; the out-pointers valid; `buf` null or holding `buf_len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_decoder_export(
    h: *mut c_void,
    kind: i32,
    layer: i64,
    fmt: *mut i32,
    rows: *mut i64,
    cols: *mut i64,
    buf: *mut u8,
    buf_len: usize,
    needed: *mut usize,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantee.
        let h = unsafe { handle(h)? };
        if fmt.is_null() || rows.is_null() || cols.is_null() || needed.is_null() {
            return Err("null output pointer".into());
        }
        let kind = Kind::from_code(kind).ok_or_else(|| format!("unknown tensor kind {kind}"))?;
        let dec = lock(h);
        let w = dec.weights();
        let layer = size(layer, "layer")?;
        let l = w.layers.get(layer);
        let need_layer = || {
            format!(
                "layer {layer} does not exist (the model has {})",
                w.layers.len()
            )
        };
        enum T<'a> {
            M(&'a Mat),
            V(&'a [f32]),
            None,
        }
        let t = match kind {
            Kind::Embed => T::M(&w.embed),
            Kind::LmHead => w.lm_head.as_ref().map_or(T::None, T::M),
            Kind::FinalNorm => T::V(&w.final_norm),
            _ => {
                let l = l.ok_or_else(need_layer)?;
                match kind {
                    Kind::AttnNorm => T::V(&l.attn_norm),
                    Kind::Wqkv => T::M(&l.wqkv),
                    Kind::Bqkv => l.bqkv.as_deref().map_or(T::None, T::V),
                    Kind::Wo => T::M(&l.wo),
                    Kind::Bo => l.bo.as_deref().map_or(T::None, T::V),
                    Kind::FfnNorm => T::V(&l.ffn_norm),
                    Kind::WGateUp => T::M(&l.w_gate_up),
                    Kind::BGateUp => l.b_gate_up.as_deref().map_or(T::None, T::V),
                    Kind::WDown => T::M(&l.w_down),
                    _ => l.b_down.as_deref().map_or(T::None, T::V),
                }
            }
        };
        let (code, r, c, bytes): (i32, usize, usize, Vec<u8>) = match t {
            T::M(m) => (m.format_code(), m.rows(), m.cols(), m.packed_bytes()),
            T::V(v) => (
                4,
                1,
                v.len(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            T::None => (-1, 0, 0, Vec::new()),
        };
        // SAFETY: valid out-pointers (caller's contract, null-checked above).
        unsafe {
            *fmt = code;
            *rows = r as i64;
            *cols = c as i64;
            *needed = bytes.len();
            if !buf.is_null() {
                if buf_len < bytes.len() {
                    return Err(format!(
                        "the buffer holds {buf_len} bytes, the tensor needs {}",
                        bytes.len()
                    ));
                }
                // SAFETY: buf holds buf_len >= bytes.len() bytes (caller's contract).
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len());
            }
        }
        Ok(())
    })
}

/// Copies one saved packed matrix (format 0-3 of `kwker_decoder_export`) into a builder.
///
/// # Safety
/// `b` a live builder handle; `data` holds `len` bytes.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_decoder_set_packed(
    b: *mut c_void,
    kind: i32,
    layer: i64,
    fmt: i32,
    data: *const u8,
    len: usize,
    rows: i64,
    cols: i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        if b.is_null() {
            return Err("null builder".into());
        }
        // SAFETY: a live builder (caller's contract), used by one thread at a time.
        let builder = unsafe { &mut *(b as *mut Builder) };
        let kind = Kind::from_code(kind).ok_or_else(|| format!("unknown tensor kind {kind}"))?;
        // SAFETY: data holds len bytes (caller's contract); null only when len is 0.
        let bytes = unsafe { raw_slice(data, len) };
        let (rows, cols) = (size(rows, "rows")?, size(cols, "cols")?);
        builder.set_packed(kind, size(layer, "layer")?, fmt, rows, cols, bytes)
    })
}

/// Weight bytes the decoder reads per decode step.
///
/// # Safety
/// `h` a live decoder.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_weight_bytes(h: *mut c_void) -> i64 {
    // SAFETY: forwarded caller guarantee.
    match unsafe { handle(h) } {
        Ok(h) => lock(h).weights().bytes_per_token() as i64,
        Err(_) => -1,
    }
}

/// Times the decoder pool gave up waiting for a descheduled worker (for benchmarks).
#[no_mangle]
pub extern "C" fn kwker_decoder_pool_stalls() -> i64 {
    pool().stalls() as i64
}

/// Generates for `n_seqs` (slot, prompt) pairs; prompt i has `n_prompt[i]` tokens (concatenated in
/// `prompt`). New tokens go to `out` (row i at `i * max_new`), their counts to `out_len[i]`, finish
/// reasons to `out_finish[i]` (0 stop token, 1 length, 2 callback), drafts proposed and kept (prompt
/// lookup) to `out_drafts[2 * i]` and `out_drafts[2 * i + 1]`. `callback(seq, token, user)` is called
/// for every token (return non-zero to end that sequence).
///
/// # Safety
/// `h` a live decoder; arrays of the stated lengths; `out` holds `n_seqs * max_new` values,
/// `out_drafts` `2 * n_seqs`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn kwker_decoder_generate(
    h: *mut c_void,
    n_seqs: i64,
    slots: *const i64,
    n_prompt: *const i64,
    prompt: *const i64,
    params: *const KwkGenParams,
    stop: *const i64,
    n_stop: i64,
    out: *mut i64,
    out_len: *mut i64,
    out_finish: *mut i32,
    out_drafts: *mut i64,
    callback: TokenCallback,
    user: *mut c_void,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantees.
        let h = unsafe { handle(h)? };
        if params.is_null() {
            return Err("the generation parameters are null".into());
        }
        // SAFETY: a valid struct (caller's contract).
        let p = unsafe { &*params };
        let n = size(n_seqs, "the number of sequences")?;
        // SAFETY: n values each (caller's contract).
        let (slots, counts) = unsafe { (raw_slice(slots, n), raw_slice(n_prompt, n)) };
        let total = counts
            .iter()
            .try_fold(0usize, |a, &c| size(c, "a prompt length").map(|c| a + c))?;
        let to_u32 =
            |t: &i64| u32::try_from(*t).map_err(|_| format!("token id {t} is out of range"));
        // SAFETY: `total` prompt tokens and `n_stop` stop tokens (caller's contract).
        let ids: Vec<u32> = unsafe { raw_slice(prompt, total) }
            .iter()
            .map(to_u32)
            .collect::<Result<_, _>>()?;
        let stop: Vec<u32> = if n_stop > 0 {
            // SAFETY: as above.
            unsafe { raw_slice(stop, n_stop as usize) }
                .iter()
                .map(to_u32)
                .collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        let max_new = size(p.max_new, "max_new_tokens")?;
        let mut seqs = Vec::with_capacity(n);
        let mut at = 0;
        for i in 0..n {
            let c = counts[i] as usize;
            seqs.push((size(slots[i], "a slot")?, &ids[at..at + c]));
            at += c;
        }
        let params = GenParams {
            max_new,
            sample: SampleParams {
                temperature: p.temperature as f32,
                top_k: size(p.top_k, "top_k")?,
                top_p: p.top_p as f32,
                seed: p.seed,
            },
            stop,
            max_draft: size(p.max_draft, "the number of draft tokens")?,
        };
        let mut on_token = |seq: usize, tok: u32| match callback {
            Some(cb) => cb(seq as i64, tok as i64, user) == 0,
            None => true,
        };
        let mut dec = lock(h);
        let results =
            with_pool(|par| generate(&mut dec, current_isa(), par, &seqs, &params, &mut on_token))?;
        for (i, g) in results.iter().enumerate() {
            let (toks, finish) = (&g.tokens, g.finish);
            for (j, &t) in toks.iter().enumerate() {
                // SAFETY: j < max_new (generate never returns more) and out holds n * max_new.
                unsafe { *out.add(i * max_new + j) = t as i64 };
            }
            // SAFETY: n values each.
            unsafe {
                *out_len.add(i) = toks.len() as i64;
                *out_finish.add(i) = match finish {
                    Finish::Stop => 0,
                    Finish::Length => 1,
                    Finish::Callback => 2,
                };
                *out_drafts.add(2 * i) = g.drafted as i64;
                *out_drafts.add(2 * i + 1) = g.accepted as i64;
            }
        }
        Ok(())
    })
}
