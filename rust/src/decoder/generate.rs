//! The native generation loop: prompts of several slots are read in one ragged step, then every
//! unfinished sequence advances by one or more tokens per step, all sequences in one batch, until each
//! meets a stop token, its token budget, its slot's context limit, or the caller's callback says stop.
//!
//! Speculative steps (prompt lookup, `lookup.rs`): a sequence whose recent tokens occurred earlier in
//! its text feeds its pending token plus up to `max_draft` drafts in one step, with logits for each
//! ("token t sees keys up to S - T + t", the prompt rule), and keeps the drafts the model agrees with
//! (`sample::verify`) plus the model's own next token; the slot is truncated to what was kept.
//!
//! Contract: with temperature 0 the tokens are the argmax of the decoder's logits at every position,
//! so they equal a step-by-step greedy loop over `Decoder::step`, drafts or not. A verified row's
//! logits are the same bits as that row's in a one-token step (every linear, attention and
//! quantized kernel computes a row as it would alone; the one exception is the `amx` tier's bf16
//! GEMM for linears of many rows, whose tiles sum in their own order), and sampling with drafts
//! keeps the model's distribution (not the seed's exact text). A
//! sequence's slot ends holding its prompt and every new token but the last (a stop token's K/V is
//! not written: nothing follows it), whether or not drafts were tried.

use super::forward::{Logits, SeqStep};
use super::lookup::{Lookup, StepCost};
use super::sample::{sample, verify, Rng, SampleParams};
use super::Decoder;
use crate::isa::Isa;
use crate::par::Parallel;

/// Settings shared by every sequence of a call.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub max_new: usize,
    pub sample: SampleParams,
    pub stop: Vec<u32>,
    /// Most drafts per speculative step (prompt lookup); 0 = off.
    pub max_draft: usize,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    Callback,
}

/// What `generate` returns per sequence.
#[derive(Clone, Debug)]
pub struct Generated {
    pub tokens: Vec<u32>,
    pub finish: Finish,
    /// Draft tokens proposed and kept (prompt lookup).
    pub drafted: usize,
    pub accepted: usize,
}

/// One unfinished sequence: its index, the token it feeds next (chosen, K/V not yet written; unused
/// before the first decode step) and the drafts that follow it in this step.
struct Live {
    seq: usize,
    pending: u32,
    drafts: Vec<u32>,
}

/// Generates for each (slot, prompt); `on_token(seq, token)` sees every token as it is chosen and
/// returns false to end that sequence. Returns the new tokens and finish reason of each sequence.
pub fn generate(
    dec: &mut Decoder,
    isa: Isa,
    par: &dyn Parallel,
    seqs: &[(usize, &[u32])],
    params: &GenParams,
    on_token: &mut dyn FnMut(usize, u32) -> bool,
) -> Result<Vec<Generated>, String> {
    params.sample.check()?;
    let vocab = dec.recipe().vocab;
    let ctx = dec.limits().max_context;
    let batch: Vec<SeqStep<'_>> = seqs
        .iter()
        .map(|&(slot, tokens)| SeqStep {
            slot,
            tokens,
            logits: Logits::Last,
        })
        .collect();
    dec.check_batch(&batch)?;
    let n = seqs.len();
    let mut out: Vec<(Vec<u32>, Option<Finish>)> = vec![(Vec::new(), None); n];
    let mut looks: Vec<Lookup> = (0..n).map(|_| Lookup::new(params.max_draft)).collect();
    let finish_all = |out: Vec<(Vec<u32>, Option<Finish>)>, looks: &[Lookup]| -> Vec<Generated> {
        out.into_iter()
            .zip(looks)
            .map(|((tokens, f), l)| Generated {
                tokens,
                finish: f.unwrap_or(Finish::Length),
                drafted: l.drafted,
                accepted: l.accepted,
            })
            .collect()
    };
    if params.max_new == 0 {
        return Ok(finish_all(out, &looks));
    }
    let mut rngs: Vec<Rng> = (0..n)
        .map(|i| Rng::new(params.sample.seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect();
    let mut logits = vec![0.0f32; n * vocab];
    dec.step(isa, par, &batch, &mut logits)?;
    // The drafts' source: what each slot holds (its prompt, after anything kept) and the new tokens.
    let mut history: Vec<Vec<u32>> = if params.max_draft > 0 {
        seqs.iter()
            .map(|&(slot, _)| dec.slot_tokens(slot).map(|t| t.to_vec()))
            .collect::<Result<_, _>>()?
    } else {
        vec![Vec::new(); n]
    };
    // Before the first decode step every sequence has one row of logits and nothing pending.
    let mut live: Vec<Live> = (0..n)
        .map(|seq| Live {
            seq,
            pending: u32::MAX,
            drafts: Vec::new(),
        })
        .collect();
    let mut first = true;
    let mut cost = StepCost::default();
    loop {
        // `logits` holds, per live sequence in order, 1 + drafts.len() rows: row j follows the
        // pending token and the first j drafts.
        let mut next: Vec<Live> = Vec::with_capacity(live.len());
        let mut row = 0usize;
        let mut drafted_rows = 0usize; // drafts already given to sequences of the next step
        for l in &live {
            let (i, slot) = (l.seq, seqs[l.seq].0);
            // The slot holds its text up to the pending token, the pending token and the drafts.
            let fed = dec.slot_len(slot)?;
            let before = fed - if first { 0 } else { 1 + l.drafts.len() };
            let mut kept = None;
            let mut taken = 0usize;
            for j in 0..=l.drafts.len() {
                let lg = &logits[row * vocab..(row + 1) * vocab];
                row += 1;
                if kept.is_some() {
                    continue; // rows after the end of this sequence's step: skip
                }
                let (tok, agreed) = match l.drafts.get(j) {
                    Some(&d) => verify(lg, &params.sample, &mut rngs[i], d),
                    None => (sample(lg, &params.sample, &mut rngs[i]), false),
                };
                out[i].0.push(tok);
                if params.max_draft > 0 {
                    history[i].push(tok);
                }
                // What the slot keeps if the sequence goes on from here: everything before `tok`.
                let held = before + if first { 0 } else { 1 + j };
                let finish = if !on_token(i, tok) {
                    Some(Finish::Callback)
                } else if params.stop.contains(&tok) {
                    Some(Finish::Stop)
                } else if out[i].0.len() >= params.max_new || held >= ctx {
                    Some(Finish::Length)
                } else {
                    None
                };
                if let Some(f) = finish {
                    out[i].1 = Some(f);
                    kept = Some(held);
                } else if !agreed {
                    kept = Some(held);
                    let limit = (params.max_new - out[i].0.len() - 1).min(ctx - held - 1);
                    let b = live.len(); // at most this many sequences in the next step
                    let drafts = looks[i].next(&history[i], limit, &cost, b, b + drafted_rows);
                    drafted_rows += drafts.len();
                    next.push(Live {
                        seq: i,
                        pending: tok,
                        drafts,
                    });
                } else {
                    taken += 1;
                }
            }
            looks[i].update(l.drafts.len(), taken);
            if let Some(k) = kept {
                if k < fed {
                    dec.truncate(slot, k)?;
                }
            }
        }
        if next.is_empty() {
            break;
        }
        first = false;
        live = next;
        let feeds: Vec<Vec<u32>> = live
            .iter()
            .map(|l| {
                std::iter::once(l.pending)
                    .chain(l.drafts.iter().copied())
                    .collect()
            })
            .collect();
        let steps: Vec<SeqStep<'_>> = live
            .iter()
            .zip(&feeds)
            .map(|(l, f)| SeqStep {
                slot: seqs[l.seq].0,
                tokens: f,
                logits: if l.drafts.is_empty() {
                    Logits::Last
                } else {
                    Logits::All
                },
            })
            .collect();
        let rows: usize = feeds
            .iter()
            .zip(&live)
            .map(|(f, l)| if l.drafts.is_empty() { 1 } else { f.len() })
            .sum();
        logits.resize(rows * vocab, 0.0);
        let t0 = std::time::Instant::now();
        dec.step(isa, par, &steps, &mut logits)?;
        cost.record(feeds.iter().map(Vec::len).sum(), t0.elapsed().as_secs_f64());
    }
    Ok(finish_all(out, &looks))
}
