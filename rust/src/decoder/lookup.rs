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
//! itself (free writing) pays for an extra verified row only now and then.

/// Longest and shortest suffix tried as a match.
pub const NGRAM_MAX: usize = 3;
pub const NGRAM_MIN: usize = 2;
/// Drafts proposed by a fresh sequence.
const FIRST_DRAFT: usize = 4;
/// Longest pause after drafts that were all rejected.
const MAX_PAUSE: usize = 16;

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

/// One sequence's draft size and pause, and what it proposed and had accepted.
#[derive(Clone, Debug)]
pub struct Lookup {
    max_draft: usize,
    k: usize,
    pause: usize,
    next_pause: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl Lookup {
    /// `max_draft == 0` turns prompt lookup off.
    pub fn new(max_draft: usize) -> Lookup {
        Lookup {
            max_draft,
            k: FIRST_DRAFT.min(max_draft),
            pause: 0,
            next_pause: 1,
            drafted: 0,
            accepted: 0,
        }
    }

    /// Drafts for the next step: at most `limit` (what the token budget and the context leave).
    pub fn next(&mut self, history: &[u32], limit: usize) -> Vec<u32> {
        if self.max_draft == 0 || limit == 0 {
            return Vec::new();
        }
        if self.pause > 0 {
            self.pause -= 1;
            return Vec::new();
        }
        propose(history, self.k.min(limit))
    }

    /// Records how many of `proposed` drafts verification kept.
    pub fn update(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        self.drafted += proposed;
        self.accepted += accepted;
        if accepted == proposed {
            self.k = (self.k * 2).min(self.max_draft);
        } else {
            self.k = (accepted + 1).min(self.max_draft);
        }
        if accepted == 0 {
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
        let mut l = Lookup::new(8);
        assert_eq!(l.next(&h, 100), vec![3, 1, 2]); // what followed "1 2"
        l.update(4, 4);
        assert_eq!(l.k, 8);
        l.update(8, 2);
        assert_eq!(l.k, 3);
        l.update(3, 0);
        assert_eq!(l.k, 1);
        assert!(l.next(&h, 100).is_empty()); // paused for one step
        assert!(!l.next(&h, 100).is_empty());
        l.update(1, 0);
        assert!(l.next(&h, 100).is_empty() && l.next(&h, 100).is_empty()); // two steps
        assert!(!l.next(&h, 100).is_empty());
        assert_eq!((l.drafted, l.accepted), (16, 6));
        assert!(Lookup::new(0).next(&h, 100).is_empty());
    }
}
