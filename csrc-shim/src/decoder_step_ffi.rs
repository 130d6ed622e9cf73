//! Running a built decoder from C: one step over a ragged batch (`kwker_decoder_step`), the slot verbs
//! (length, tokens, truncate, position, copy a prefix) and the native generation loop
//! (`kwker_decoder_generate`, with a per-token callback). Steps run on the process's decoder pool
//! (`decoder_handle::with_pool`); each decoder's lock serialises calls on it.
use crate::config::current_isa;
use crate::decoder_handle::{handle, lock, pool, raw_slice, size, with_pool};
use crate::error::guarded;
use kwker_kernels::decoder::generate::{generate, Finish, GenParams};
use kwker_kernels::decoder::sample::SampleParams;
use kwker_kernels::decoder::{Logits, Output, SeqStep};
use std::ffi::{c_char, c_void};

/// Logits modes of `kwker_decoder_step` (handed to Python by `kwker_decoder_abi`).
pub const LOGITS_CODES: [(&str, i32); 3] = [("none", 0), ("last", 1), ("all", 2)];
/// What `kwker_decoder_step` writes for the rows asked for: logits, or the final normed hidden rows
/// (likewise).
pub const OUTPUT_CODES: [(&str, i32); 2] = [("logits", 0), ("hidden", 1)];
/// Finish reasons of `kwker_decoder_generate` (likewise).
pub const FINISH_CODES: [(&str, i32); 3] = [("stop", 0), ("length", 1), ("callback", 2)];

/// Generation settings as C passes them (= `_GenParams` in native.py).
#[repr(C)]
pub struct KwkGenParams {
    pub max_new: i64,
    pub temperature: f64,
    pub top_k: i64,
    pub top_p: f64,
    pub seed: u64,
    /// Most drafts per step (prompt lookup); 0 = off.
    pub max_draft: i64,
    /// 0 = no min-p cut.
    pub min_p: f64,
}

type TokenCallback = Option<extern "C" fn(seq: i64, token: i64, user: *mut c_void) -> i32>;

fn logits_mode(c: i32) -> Result<Logits, String> {
    let name = LOGITS_CODES.iter().find(|(_, v)| *v == c).map(|(n, _)| *n);
    match name {
        Some("none") => Ok(Logits::None),
        Some("last") => Ok(Logits::Last),
        Some("all") => Ok(Logits::All),
        _ => Err(format!("unknown logits mode {c}")),
    }
}

fn output_kind(c: i32) -> Result<Output, String> {
    let name = OUTPUT_CODES.iter().find(|(_, v)| *v == c).map(|(n, _)| *n);
    match name {
        Some("logits") => Ok(Output::Logits),
        Some("hidden") => Ok(Output::Hidden),
        _ => Err(format!("unknown step output {c}")),
    }
}

fn finish_code(f: Finish) -> i32 {
    let name = match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::Callback => "callback",
    };
    FINISH_CODES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(-1, |(_, c)| *c)
}

/// One step over `n_seqs` sequences: sequence i appends `n_tokens[i]` tokens (concatenated in
/// `tokens`) to slot `slots[i]` and returns, for the rows its `modes[i]` asks for (`LOGITS_CODES`),
/// what `output` names (`OUTPUT_CODES`: logits, or the final normed hidden rows) into `logits`
/// (`logits_len` floats = rows wanted * vocab, or * the hidden width).
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
    output: i32,
    logits: *mut f32,
    logits_len: i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        // SAFETY: forwarded caller guarantees.
        let h = unsafe { handle(h)? };
        let output = output_kind(output)?;
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
        with_pool(|par| dec.step_as(current_isa(), par, &batch, output, out))
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

/// The shortest length other than 0 a slot can keep (`truncate`, `copy_prefix`): its windowed layers
/// hold only their window and a few older keys. -1 for a bad handle or slot.
///
/// # Safety
/// `h` a live decoder.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_slot_min_len(h: *mut c_void, slot: i64) -> i64 {
    // SAFETY: forwarded caller guarantee.
    let Ok(h) = (unsafe { handle(h) }) else {
        return -1;
    };
    let Ok(slot) = usize::try_from(slot) else {
        return -1;
    };
    lock(h).slot_min_len(slot).map(|n| n as i64).unwrap_or(-1)
}

/// Bytes of the KV cache: `per_token` = 0 gives one slot's at max_context, 1 what each token adds.
/// -1 for a bad handle.
///
/// # Safety
/// `h` a live decoder.
#[no_mangle]
pub unsafe extern "C" fn kwker_decoder_kv_bytes(h: *mut c_void, per_token: i32) -> i64 {
    // SAFETY: forwarded caller guarantee.
    let Ok(h) = (unsafe { handle(h) }) else {
        return -1;
    };
    let (slot, token) = lock(h).kv_bytes();
    (if per_token != 0 { token } else { slot }) as i64
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

/// Times the decoder pool gave up waiting for a descheduled worker (for benchmarks).
#[no_mangle]
pub extern "C" fn kwker_decoder_pool_stalls() -> i64 {
    pool().stalls() as i64
}

/// Generates for `n_seqs` (slot, prompt) pairs; prompt i has `n_prompt[i]` tokens (concatenated in
/// `prompt`). New tokens go to `out` (row i at `i * max_new`), their counts to `out_len[i]`, finish
/// reasons to `out_finish[i]` (`FINISH_CODES`), drafts proposed and kept (prompt
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
                min_p: p.min_p as f32,
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
                *out_finish.add(i) = finish_code(finish);
                *out_drafts.add(2 * i) = g.drafted as i64;
                *out_drafts.add(2 * i + 1) = g.accepted as i64;
            }
        }
        Ok(())
    })
}
