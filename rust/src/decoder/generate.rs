//! The native generation loop: prompts of several slots are read in one ragged step, then every
//! unfinished sequence advances by one token per step, all sequences in one batch, until each meets a
//! stop token, its token budget, its slot's context limit, or the caller's callback says stop.
//!
//! Contract: with temperature 0 the tokens are the argmax of the decoder's logits at every step, so
//! they equal a step-by-step greedy loop over `Decoder::step`. A stop token is returned as the last
//! token of its sequence (its K/V is not written: nothing follows it).

use super::forward::{Logits, SeqStep};
use super::sample::{sample, Rng, SampleParams};
use super::Decoder;
use crate::isa::Isa;
use crate::par::Parallel;

/// Settings shared by every sequence of a call.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub max_new: usize,
    pub sample: SampleParams,
    pub stop: Vec<u32>,
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    Callback,
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
) -> Result<Vec<(Vec<u32>, Finish)>, String> {
    params.sample.check()?;
    let vocab = dec.config().vocab;
    let ctx = dec.config().max_context;
    let batch: Vec<SeqStep<'_>> = seqs
        .iter()
        .map(|&(slot, tokens)| SeqStep {
            slot,
            tokens,
            logits: Logits::Last,
        })
        .collect();
    dec.check_batch(&batch)?;
    let mut out: Vec<(Vec<u32>, Option<Finish>)> = vec![(Vec::new(), None); seqs.len()];
    if params.max_new == 0 {
        return Ok(out.into_iter().map(|(t, _)| (t, Finish::Length)).collect());
    }
    let mut rngs: Vec<Rng> = (0..seqs.len())
        .map(|i| Rng::new(params.sample.seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect();
    let mut logits = vec![0.0f32; seqs.len() * vocab];
    dec.step(isa, par, &batch, &mut logits)?;
    let mut active: Vec<usize> = (0..seqs.len()).collect();
    loop {
        // `logits` holds one row per active sequence, in `active` order.
        let mut next_active = Vec::with_capacity(active.len());
        let mut feed = Vec::with_capacity(active.len());
        for (row, &i) in active.iter().enumerate() {
            let tok = sample(
                &logits[row * vocab..(row + 1) * vocab],
                &params.sample,
                &mut rngs[i],
            );
            out[i].0.push(tok);
            let slot = seqs[i].0;
            let finish = if !on_token(i, tok) {
                Some(Finish::Callback)
            } else if params.stop.contains(&tok) {
                Some(Finish::Stop)
            } else if out[i].0.len() >= params.max_new || dec.slot_len(slot)? >= ctx {
                Some(Finish::Length)
            } else {
                None
            };
            match finish {
                Some(f) => out[i].1 = Some(f),
                None => {
                    next_active.push(i);
                    feed.push(tok);
                }
            }
        }
        if next_active.is_empty() {
            break;
        }
        active = next_active;
        let steps: Vec<SeqStep<'_>> = active
            .iter()
            .zip(&feed)
            .map(|(&i, tok)| SeqStep {
                slot: seqs[i].0,
                tokens: std::slice::from_ref(tok),
                logits: Logits::Last,
            })
            .collect();
        logits.truncate(active.len() * vocab);
        dec.step(isa, par, &steps, &mut logits)?;
    }
    Ok(out
        .into_iter()
        .map(|(t, f)| (t, f.unwrap_or(Finish::Length)))
        .collect())
}
