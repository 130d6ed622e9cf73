//! Prompt lookup: draft tokens copied from the text a sequence has already seen (its prompt and its
//! output so far), for the generation loop to verify in one multi-token step (`generate.rs`).
//!
//! The proposal: the longest suffix of the history, from `NGRAM_MAX` down to `NGRAM_MIN` tokens,
//! that occurred earlier; the tokens that followed its most recent earlier occurrence are the drafts.
//! Nothing here decides which tokens are emitted, so it cannot change the text: verification keeps
//! only what the model itself would have chosen.
//!
//! How many to propose adapts per sequence: a draft accepted in full doubles the next one (up to
//! `max_draft`); a partly accepted draft sets it to what was accepted plus one; a draft of which
//! nothing was accepted also pauses proposing for 1, 2, 4, .. 16 steps, so text that does not repeat
//! itself (free writing) pays for an extra verified row only now and then. Within that cap the
//! count k maximises expected tokens per second, (B - 1 + E(k)) / t(R + k) for a batch of B sequences
//! and R rows: E(k) = (1 - a^(k+1)) / (1 - a) with the sequence's acceptance rate a (kept / (kept +
//! rejections), decayed), and t the measured time of a step by rows (`StepCost`): on a CPU extra rows
//! are not free (a 9-row step of SmolLM2-135M costs 1.8x a 1-row step in bf16, 2.6x in int4).
//!
//! The same sizing serves drafts that cost time to make (a draft model, `decoder/speculative.py`):
//! `Lookup::size` adds the measured seconds per draft token to the step's time, k t_draft + t(R + k).
//! This is the project's one draft policy: the native loop, the server, Hugging Face's
//! `prompt_lookup_num_tokens` under `decode.install()` and draft-model speculation all size and
//! propose through it (C entry points in `csrc-shim/src/sample_ffi.rs`).

/// Longest and shortest suffix tried as a match.
pub const NGRAM_MAX: usize = 3;
pub const NGRAM_MIN: usize = 2;
/// Drafts proposed by a fresh sequence.
const FIRST_DRAFT: usize = 4;
/// Longest pause after drafts that were all rejected.
const MAX_PAUSE: usize = 16;
/// Step times are kept for up to this many rows.
const COST_ROWS: usize = 96;

/// Measured seconds of a decoder step by its number of rows (decayed means).
#[derive(Clone, Debug)]
pub struct StepCost {
    secs: Vec<f64>,
}

impl Default for StepCost {
    fn default() -> Self {
        StepCost {
            secs: vec![0.0; COST_ROWS + 1],
        }
    }
}

impl StepCost {
    /// Every row count costs the same (for tests: the draft size is then only the cap's).
    pub fn flat() -> StepCost {
        StepCost {
            secs: vec![1.0; COST_ROWS + 1],
        }
    }

    pub fn record(&mut self, rows: usize, secs: f64) {
        if let Some(s) = self.secs.get_mut(rows) {
            *s = if *s == 0.0 {
                secs
            } else {
                0.8 * *s + 0.2 * secs
            };
        }
    }

    /// The measured time of `rows`, else 15 % more per row than one row (a prior until measured).
    pub fn time(&self, rows: usize) -> f64 {
        match self.secs.get(rows) {
            Some(&s) if s > 0.0 => s,
            _ => {
                let one = if self.secs[1] > 0.0 {
                    self.secs[1]
                } else {
                    1.0
                };
                one * (1.0 + 0.15 * (rows.max(1) - 1) as f64)
            }
        }
    }
}

/// The drafts after the most recent earlier occurrence of the history's last n tokens (longest n
/// first), at most `limit` of them; empty when no suffix of `NGRAM_MIN`.. tokens repeats.
pub fn propose(history: &[u32], limit: usize) -> Vec<u32> {
    if limit == 0 {
        return Vec::new();
    }
    let len = history.len();
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let pattern = &history[len - n..];
        // Occurrences starting at i < len - n, most recent first (the suffix itself is excluded).
        for i in (0..len - n).rev() {
            if &history[i..i + n] == pattern {
                let from = i + n;
                let to = (from + limit).min(len);
                return history[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

/// Most draft tokens a step verifies, whatever the caller asks: a rejected draft is truncated off its slot,
/// and sliding-window layers keep this many tokens past their window for that (`cache::KEEP`).
pub const MAX_DRAFT: usize = 64;

/// One sequence's draft size and pause, and what it proposed and had accepted.
#[derive(Clone, Debug)]
pub struct Lookup {
    max_draft: usize,
    k: usize,
    pause: usize,
    next_pause: usize,
    kept_w: f64,
    rejected_w: f64,
    idle: usize,
    /// Pause after drafts that were all rejected (off where extra rows cost little).
    pauses: bool,
    /// Measured seconds to make one draft token (decayed mean; 0 for prompt lookup).
    draft_secs: f64,
    pub drafted: usize,
    pub accepted: usize,
}

impl Lookup {
    /// `max_draft == 0` turns prompt lookup off; above `MAX_DRAFT` it is `MAX_DRAFT`.
    pub fn new(max_draft: usize) -> Lookup {
        let max_draft = max_draft.min(MAX_DRAFT);
        Lookup {
            max_draft,
            k: FIRST_DRAFT.min(max_draft),
            pause: 0,
            next_pause: 1,
            kept_w: 4.0, // prior: a = 0.8
            rejected_w: 1.0,
            idle: 0,
            pauses: true,
            draft_secs: 0.0,
            drafted: 0,
            accepted: 0,
        }
    }

    /// Without the pause after drafts that were all rejected.
    pub fn without_pauses(mut self) -> Lookup {
        self.pauses = false;
        self
    }

    /// Drafts for the next step: at most `limit` (what the token budget and the context leave), in a
    /// step of `batch` sequences that has `rows` rows without them.
    pub fn next(
        &mut self,
        history: &[u32],
        limit: usize,
        cost: &StepCost,
        batch: usize,
        rows: usize,
    ) -> Vec<u32> {
        if !self.ready(limit) {
            return Vec::new();
        }
        let mut d = propose(history, self.k.min(limit));
        if d.is_empty() {
            return d;
        }
        d.truncate(self.best(d.len(), cost, batch, rows));
        d
    }

    /// How many tokens a draft model should make for the next step (at most `limit`), by the same rule
    /// as `next` with each draft token's measured time (`record_draft`) added to the step's.
    pub fn size(&mut self, limit: usize, cost: &StepCost, batch: usize, rows: usize) -> usize {
        if !self.ready(limit) {
            return 0;
        }
        self.best(self.k.min(limit), cost, batch, rows)
    }

    /// Records the seconds one draft token took to make.
    pub fn record_draft(&mut self, secs: f64) {
        self.draft_secs = if self.draft_secs == 0.0 {
            secs
        } else {
            0.8 * self.draft_secs + 0.2 * secs
        };
    }

    /// Whether this step may draft at all (counts a paused step down).
    fn ready(&mut self, limit: usize) -> bool {
        if self.max_draft == 0 || limit == 0 {
            return false;
        }
        if self.pause > 0 {
            self.pause -= 1;
            return false;
        }
        true
    }

    /// The count in 0..=avail with the most expected tokens per second.
    fn best(&mut self, avail: usize, cost: &StepCost, batch: usize, rows: usize) -> usize {
        let a = (self.kept_w / (self.kept_w + self.rejected_w)).min(0.99);
        let rate = |k: usize| {
            let e = (1.0 - a.powi(k as i32 + 1)) / (1.0 - a);
            (batch as f64 - 1.0 + e) / (k as f64 * self.draft_secs + cost.time(rows + k))
        };
        let mut best = 0;
        for k in 1..=avail {
            if rate(k) > rate(best) {
                best = k;
            }
        }
        if best == 0 {
            self.idle += 1;
            best = usize::from(self.idle.is_multiple_of(8)).min(avail); // look again now and then
        }
        best
    }

    /// Records how many of `proposed` drafts verification kept.
    pub fn update(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        self.drafted += proposed;
        self.accepted += accepted;
        self.kept_w = 0.9 * self.kept_w + accepted as f64;
        self.rejected_w = 0.9 * self.rejected_w + f64::from(accepted < proposed);
        if accepted == proposed {
            self.k = (self.k * 2).min(self.max_draft);
        } else {
            self.k = (accepted + 1).min(self.max_draft);
        }
        if accepted == 0 && self.pauses {
            self.pause = self.next_pause;
            self.next_pause = (self.next_pause * 2).min(MAX_PAUSE);
        } else {
            self.next_pause = 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_what_followed_the_latest_match() {
        // "a b c d | x b c" -> the 2-gram "b c" last occurred at 1, followed by "d x b".
        let h = [1, 2, 3, 4, 9, 2, 3];
        assert_eq!(propose(&h, 3), vec![4, 9, 2]);
        assert_eq!(propose(&h, 1), vec![4]);
        // The 3-gram wins over a more recent 2-gram.
        let h = [5, 6, 7, 8, 0, 6, 7, 1, 5, 6, 7];
        assert_eq!(propose(&h, 2), vec![8, 0]);
        // Drafts stop at the end of the history.
        let h = [1, 2, 1, 2];
        assert_eq!(propose(&h, 8), vec![1, 2]);
    }

    #[test]
    fn nothing_without_a_repeat() {
        assert!(propose(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(propose(&[1, 1], 4).is_empty()); // shorter than NGRAM_MIN + 1
        assert!(propose(&[1, 2, 1, 2], 0).is_empty());
    }

    #[test]
    fn adapts_and_pauses() {
        let h = [1, 2, 3, 1, 2];
        let flat = StepCost::flat();
        let mut l = Lookup::new(8);
        assert_eq!(l.next(&h, 100, &flat, 1, 1), vec![3, 1, 2]); // what followed "1 2"
        l.update(4, 4);
        assert_eq!(l.k, 8);
        l.update(8, 2);
        assert_eq!(l.k, 3);
        l.update(3, 0);
        assert_eq!(l.k, 1);
        let next = |l: &mut Lookup| l.next(&h, 100, &flat, 1, 1);
        assert!(next(&mut l).is_empty()); // paused for one step
        assert!(!next(&mut l).is_empty());
        l.update(1, 0);
        assert!(next(&mut l).is_empty() && next(&mut l).is_empty()); // two steps
        assert!(!next(&mut l).is_empty());
        assert_eq!((l.drafted, l.accepted), (16, 6));
        assert!(next(&mut Lookup::new(0)).is_empty());
    }

    #[test]
    fn draft_size_follows_the_cost_of_rows_and_the_acceptance_rate() {
        let h: Vec<u32> = (0..40).chain(0..20).collect(); // "18 19" repeats: 20 tokens follow
        let mut cost = StepCost::default();
        cost.record(1, 1.0);
        for rows in 2..=9 {
            cost.record(rows, 1.0 + 0.2 * (rows - 1) as f64); // int4-like: +20 % per row
        }
        let mut l = Lookup::new(8);
        l.k = 8;
        // a = 0.8 (the prior): E(k) / t(1 + k) peaks at k = 4 (3.36 / 1.8 = 1.87; k = 3: 2.95 / 1.6).
        assert_eq!(l.next(&h, 100, &cost, 1, 1).len(), 4);
        // Rows that cost nothing: the whole cap.
        assert_eq!(l.next(&h, 100, &StepCost::flat(), 1, 1).len(), 8);
        // Rejections lower the rate: no draft pays, and only every 8th step looks again.
        for _ in 0..30 {
            l.update(4, 0);
        }
        l.pause = 0;
        l.k = 8;
        let sizes: Vec<usize> = (0..8).map(|_| l.next(&h, 100, &cost, 1, 1).len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 1, "{sizes:?}");
    }
}
