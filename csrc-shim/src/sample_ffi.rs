//! The project's one sampler and draft policy from C (`rust/src/decoder/sample.rs`, `lookup.rs`), for
//! the Python callers that choose tokens outside the native loop: the server's per-request sampler,
//! draft-model speculation, and Hugging Face's prompt lookup under `decode.install()`.
//!
//! A generator is four u64 the caller keeps (`kwker_rng_seed` fills them, every draw advances them),
//! so a request's random stream lives with the request and a seed gives the native loop's stream.
//! A draft policy is a handle (`kwker_lookup_new`): one sequence's `Lookup` and its measured step
//! times, behind a lock. Token ids cross as i64 and are checked against u32.
use crate::decoder_handle::{raw_slice, size};
use crate::error::guarded;
use kwker_kernels::decoder::lookup::{propose, Lookup, StepCost};
use kwker_kernels::decoder::sample::{distribution, draw_from, sample, Rng, SampleParams};
use std::ffi::{c_char, c_void};
use std::sync::Mutex;

/// Sampling settings as C passes them (= `SampleArgs` in `kwker_torch/decoder/native.py`).
#[repr(C)]
pub struct KwkSampleParams {
    pub temperature: f64,
    pub top_k: i64,
    pub top_p: f64,
    pub min_p: f64,
}

fn params(p: *const KwkSampleParams) -> Result<SampleParams, String> {
    if p.is_null() {
        return Err("null sampling parameters".into());
    }
    // SAFETY: non-null and points to a KwkSampleParams (the caller's contract).
    let p = unsafe { &*p };
    let s = SampleParams {
        temperature: p.temperature as f32,
        top_k: size(p.top_k, "top_k")?,
        top_p: p.top_p as f32,
        min_p: p.min_p as f32,
        seed: 0,
    };
    s.check()?;
    Ok(s)
}

/// Runs `f` on the generator kept at `state` (4 u64) and stores its new state.
///
/// # Safety
/// `state` null or valid for reading and writing 4 u64.
unsafe fn with_rng<T>(state: *mut u64, f: impl FnOnce(&mut Rng) -> T) -> Result<T, String> {
    if state.is_null() {
        return Err("null generator state".into());
    }
    // SAFETY: valid for 4 reads and writes (caller's contract, null-checked).
    let s = unsafe { &mut *(state as *mut [u64; 4]) };
    let mut rng = Rng::from_state(*s);
    let out = f(&mut rng);
    *s = rng.state();
    Ok(out)
}

/// Chooses a token with the generator at `state` and writes it to `out`.
///
/// # Safety
/// `state` null or valid for reading and writing 4 u64; `out` null or writable.
unsafe fn token_into(
    state: *mut u64,
    out: *mut i64,
    choose: impl FnOnce(&mut Rng) -> u32,
) -> Result<(), String> {
    if out.is_null() {
        return Err("null output".into());
    }
    // SAFETY: forwarded contract.
    let tok = unsafe { with_rng(state, choose) }?;
    // SAFETY: writable (caller's contract, null-checked).
    unsafe { *out = i64::from(tok) };
    Ok(())
}

fn logits_of<'a>(logits: *const f32, n: i64) -> Result<&'a [f32], String> {
    let n = size(n, "the vocabulary size")?;
    if n == 0 || logits.is_null() {
        return Err("empty logits".into());
    }
    // SAFETY: `logits` holds `n` floats (caller's contract), non-null.
    Ok(unsafe { raw_slice(logits, n) })
}

/// Seeds a generator: writes its state (4 u64) to `state`.
///
/// # Safety
/// `state` valid for writing 4 u64.
#[no_mangle]
pub unsafe extern "C" fn kwker_rng_seed(seed: u64, state: *mut u64) {
    if !state.is_null() {
        // SAFETY: valid for 4 writes (caller's contract).
        unsafe { *(state as *mut [u64; 4]) = Rng::new(seed).state() };
    }
}

/// A uniform draw in [0, 1) from the generator at `state` (NaN when `state` is null).
///
/// # Safety
/// `state` valid for reading and writing 4 u64.
#[no_mangle]
pub unsafe extern "C" fn kwker_rng_uniform(state: *mut u64) -> f64 {
    // SAFETY: forwarded contract.
    unsafe { with_rng(state, |r| r.uniform()) }.unwrap_or(f64::NAN)
}

/// The next token from `n` logits under `p` (greedy when temperature is 0), drawn from the generator
/// at `state`, into `out`.
///
/// # Safety
/// `logits` holds `n` floats; `p` valid; `state` 4 u64 read and written; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn kwker_sample(
    logits: *const f32,
    n: i64,
    p: *const KwkSampleParams,
    state: *mut u64,
    out: *mut i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        let (lg, sp) = (logits_of(logits, n)?, params(p)?);
        // SAFETY: `state` and `out` as the caller's contract says.
        unsafe { token_into(state, out, |r| sample(lg, &sp, r)) }
    })
}

/// The normalised distribution `kwker_sample` draws from, one f64 per token, into `out` (`n` values).
///
/// # Safety
/// `logits` holds `n` floats; `p` valid; `out` writable for `n` f64.
#[no_mangle]
pub unsafe extern "C" fn kwker_sample_distribution(
    logits: *const f32,
    n: i64,
    p: *const KwkSampleParams,
    out: *mut f64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        let (lg, sp) = (logits_of(logits, n)?, params(p)?);
        if out.is_null() {
            return Err("null output".into());
        }
        // SAFETY: writable for n values (caller's contract), non-null.
        let dst = unsafe { std::slice::from_raw_parts_mut(out, lg.len()) };
        distribution(lg, &sp, dst);
        Ok(())
    })
}

/// A token drawn from `n` non-negative weights (`probs`) with the generator at `state`, into `out`.
///
/// # Safety
/// `probs` holds `n` f64; `state` 4 u64 read and written; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn kwker_sample_draw(
    probs: *const f64,
    n: i64,
    state: *mut u64,
    out: *mut i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        let n = size(n, "the vocabulary size")?;
        if n == 0 || probs.is_null() {
            return Err("empty weights".into());
        }
        // SAFETY: `probs` holds n values (caller's contract), non-null.
        let w = unsafe { raw_slice(probs, n) };
        if w.iter().any(|&x| !(x >= 0.0 && x.is_finite())) || w.iter().sum::<f64>() <= 0.0 {
            return Err(
                "the weights to draw from must be finite, non-negative and not all zero".into(),
            );
        }
        // SAFETY: `state` and `out` as the caller's contract says.
        unsafe { token_into(state, out, |r| draw_from(w, r)) }
    })
}

/// Token ids from C, checked to fit u32.
fn ids(history: *const i64, n: i64) -> Result<Vec<u32>, String> {
    let n = size(n, "the history's length")?;
    // SAFETY: `history` holds n values (caller's contract); empty when n is 0.
    let h = unsafe { raw_slice(history, n) };
    h.iter()
        .map(|&t| u32::try_from(t).map_err(|_| format!("token id {t} is out of range")))
        .collect()
}

/// Writes `drafts` to `out` (room for `cap`) and their number to `out_n`.
///
/// # Safety
/// `out` writable for `cap` i64; `out_n` writable.
unsafe fn write_ids(
    drafts: &[u32],
    out: *mut i64,
    cap: i64,
    out_n: *mut i64,
) -> Result<(), String> {
    let cap = size(cap, "the output's room")?;
    if out_n.is_null() || (!drafts.is_empty() && out.is_null()) || drafts.len() > cap {
        return Err("the drafts' output is null or too small".into());
    }
    for (i, &t) in drafts.iter().enumerate() {
        // SAFETY: i < drafts.len() <= cap, and `out` is writable for cap values.
        unsafe { *out.add(i) = i64::from(t) };
    }
    // SAFETY: writable (caller's contract, null-checked).
    unsafe { *out_n = drafts.len() as i64 };
    Ok(())
}

/// Prompt lookup's proposal (`lookup::propose`): at most `limit` drafts from `history`, into `out`.
///
/// # Safety
/// `history` holds `n` i64; `out` writable for `limit` i64; `out_n` writable.
#[no_mangle]
pub unsafe extern "C" fn kwker_lookup_propose(
    history: *const i64,
    n: i64,
    limit: i64,
    out: *mut i64,
    out_n: *mut i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        let d = propose(&ids(history, n)?, size(limit, "limit")?);
        // SAFETY: forwarded contract (room for `limit`).
        unsafe { write_ids(&d, out, limit, out_n) }
    })
}

/// One sequence's draft policy and the step times it has measured.
struct Policy {
    lookup: Lookup,
    cost: StepCost,
}

/// A new draft policy (at most `max_draft` drafts a step; `pauses` 0 turns off the pause after
/// drafts that were all rejected). Free it with `kwker_lookup_free`.
#[no_mangle]
pub extern "C" fn kwker_lookup_new(max_draft: i64, pauses: i32) -> *mut c_void {
    let mut lookup = Lookup::new(max_draft.max(0) as usize);
    if pauses == 0 {
        lookup = lookup.without_pauses();
    }
    let cost = StepCost::default();
    Box::into_raw(Box::new(Mutex::new(Policy { lookup, cost }))) as *mut c_void
}

/// # Safety
/// `h` from `kwker_lookup_new`, not yet freed (or null).
#[no_mangle]
pub unsafe extern "C" fn kwker_lookup_free(h: *mut c_void) {
    if !h.is_null() {
        // SAFETY: made by Box::into_raw in kwker_lookup_new and freed once (caller's contract).
        drop(unsafe { Box::from_raw(h as *mut Mutex<Policy>) });
    }
}

/// Runs `f` on the policy behind `h`.
///
/// # Safety
/// `h` from `kwker_lookup_new`, not freed.
unsafe fn policy<T>(h: *mut c_void, f: impl FnOnce(&mut Policy) -> T) -> Result<T, String> {
    if h.is_null() {
        return Err("null draft policy".into());
    }
    // SAFETY: a live Mutex<Policy> (caller's contract); the lock serialises callers.
    let m = unsafe { &*(h as *const Mutex<Policy>) };
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    Ok(f(&mut g))
}

/// Prompt-lookup drafts for the next step (`Lookup::next`): at most `limit`, for a step of `batch`
/// sequences and `rows` rows without them; into `out` (room for `limit`).
///
/// # Safety
/// `h` live; `history` holds `n` i64; `out` writable for `limit` i64; `out_n` writable.
#[no_mangle]
pub unsafe extern "C" fn kwker_lookup_next(
    h: *mut c_void,
    history: *const i64,
    n: i64,
    limit: i64,
    batch: i64,
    rows: i64,
    out: *mut i64,
    out_n: *mut i64,
    err: *mut c_char,
    err_len: usize,
) -> i32 {
    guarded(err, err_len, || {
        let hist = ids(history, n)?;
        let (lim, b, r) = (
            size(limit, "limit")?,
            size(batch, "batch")?,
            size(rows, "rows")?,
        );
        // SAFETY: `h` live (caller's contract).
        let d = unsafe {
            policy(h, |p| {
                p.lookup.next(&hist, lim, &p.cost, b.max(1), r.max(1))
            })
        }?;
        // SAFETY: forwarded contract (room for `limit`).
        unsafe { write_ids(&d, out, limit, out_n) }
    })
}

/// How many tokens a draft model should make for the next step (`Lookup::size`); -1 for a null handle.
///
/// # Safety
/// `h` live.
#[no_mangle]
pub unsafe extern "C" fn kwker_lookup_size(
    h: *mut c_void,
    limit: i64,
    batch: i64,
    rows: i64,
) -> i64 {
    let (lim, b, r) = (
        limit.max(0) as usize,
        batch.max(1) as usize,
        rows.max(1) as usize,
    );
    // SAFETY: `h` live (caller's contract).
    unsafe { policy(h, |p| p.lookup.size(lim, &p.cost, b, r) as i64) }.unwrap_or(-1)
}

/// Records a verification: `proposed` drafts, `accepted` of them kept.
///
/// # Safety
/// `h` live.
#[no_mangle]
pub unsafe extern "C" fn kwker_lookup_update(h: *mut c_void, proposed: i64, accepted: i64) {
    let (p, a) = (
        proposed.max(0) as usize,
        accepted.clamp(0, proposed.max(0)) as usize,
    );
    // SAFETY: `h` live (caller's contract).
    let _ = unsafe { policy(h, |pol| pol.lookup.update(p, a)) };
}

/// Records the seconds a step of `rows` rows took, and (when `draft_secs` > 0) the seconds one draft
/// token took to make.
///
/// # Safety
/// `h` live.
#[no_mangle]
pub unsafe extern "C" fn kwker_lookup_record(
    h: *mut c_void,
    rows: i64,
    secs: f64,
    draft_secs: f64,
) {
    // SAFETY: `h` live (caller's contract).
    let _ = unsafe {
        policy(h, |p| {
            if rows > 0 && secs.is_finite() && secs > 0.0 {
                p.cost.record(rows as usize, secs);
            }
            if draft_secs.is_finite() && draft_secs > 0.0 {
                p.lookup.record_draft(draft_secs);
            }
        })
    };
}

/// The drafts proposed and accepted so far, into `out[0]` and `out[1]`.
///
/// # Safety
/// `h` live; `out` writable for 2 i64.
#[no_mangle]
pub unsafe extern "C" fn kwker_lookup_counts(h: *mut c_void, out: *mut i64) {
    if out.is_null() {
        return;
    }
    // SAFETY: `h` live (caller's contract).
    if let Ok((d, a)) = unsafe { policy(h, |p| (p.lookup.drafted, p.lookup.accepted)) } {
        // SAFETY: writable for 2 values (caller's contract).
        unsafe {
            *out = d as i64;
            *out.add(1) = a as i64
        };
    }
}
