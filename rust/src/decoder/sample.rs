//! Choosing the next token from a row of logits: greedy (argmax; the first of equal maxima, as
//! `torch.argmax`), or sampling with temperature, top-k, top-p (nucleus) and min-p, applied in that
//! order as Hugging Face's logits warpers are, from a seeded generator (xoshiro256**, so a seed gives
//! the same text on every machine and tier). This is the one sampler of the project: the native
//! generation loop, the server (`serve/sampling.py`) and speculative decoding with a draft model
//! (`decoder/speculative.py`) all choose through it (C entry points in `csrc-shim/src/sample_ffi.rs`).
//!
//! Contract: probabilities are computed in f64 from the f32 logits (max subtracted). With a cut
//! (top-k, top-p < 1 or min-p > 0), tokens whose probability is below 1e-12 of the most likely one
//! are never kept (they cannot change which tokens reach the top-p mass, only the renormalisation at
//! the 1e-12 level).

/// Sampling settings. `temperature == 0` means greedy.
#[derive(Clone, Copy, Debug)]
pub struct SampleParams {
    pub temperature: f32,
    /// 0 = no top-k cut.
    pub top_k: usize,
    /// 1.0 = no top-p cut.
    pub top_p: f32,
    /// 0.0 = no min-p cut; else tokens below `min_p` times the most likely one's probability go.
    pub min_p: f32,
    pub seed: u64,
}

impl SampleParams {
    pub fn greedy() -> SampleParams {
        SampleParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
        }
    }

    pub fn check(&self) -> Result<(), String> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(format!(
                "temperature must be >= 0 (0 = greedy), got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        Ok(())
    }
}

/// xoshiro256** seeded through splitmix64.
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let out = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// The generator's state (for a caller that keeps it between calls, as the server does per request).
    pub fn state(&self) -> [u64; 4] {
        self.0
    }

    /// A generator that goes on from `state` (as `state` returned it).
    pub fn from_state(state: [u64; 4]) -> Rng {
        Rng(state)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Index of the largest logit (the first one among equals; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut val = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > val {
            val = v;
            best = i;
        }
    }
    best as u32
}

/// The next token under `p`, drawing from `rng` when sampling.
pub fn sample(logits: &[f32], p: &SampleParams, rng: &mut Rng) -> u32 {
    if p.temperature == 0.0 || p.top_k == 1 {
        return argmax(logits);
    }
    let (cand, probs) = warped(logits, p);
    draw(&cand, &probs, rng, None)
}

/// Verifies one draft token against `logits`: the token to emit, and whether it is the draft.
/// Greedy: the argmax, so the text is the plain greedy text. Sampling: the draft is kept with its
/// probability q under `p`'s distribution; else a token is drawn from that distribution without the
/// draft, renormalised (the residual of a proposal that puts all its mass on the draft). Each token
/// x then comes out with probability q for the draft and (1 - q) p(x) / (1 - q) = p(x) otherwise:
/// exactly `sample`'s distribution (the random stream, so the text for a seed, differs).
pub fn verify(logits: &[f32], p: &SampleParams, rng: &mut Rng, draft: u32) -> (u32, bool) {
    if p.temperature == 0.0 || p.top_k == 1 {
        let tok = argmax(logits);
        return (tok, tok == draft);
    }
    let (cand, probs) = warped(logits, p);
    let total: f64 = probs.iter().sum();
    let q = cand
        .iter()
        .position(|&c| c == draft)
        .map_or(0.0, |i| probs[i] / total);
    if rng.uniform() < q {
        return (draft, true);
    }
    (draw(&cand, &probs, rng, Some(draft)), false)
}

/// The distribution `sample` draws from, normalised, into `out` (one value per token; 0 for the tokens
/// the cuts remove). Greedy parameters give probability 1 to the argmax.
pub fn distribution(logits: &[f32], p: &SampleParams, out: &mut [f64]) {
    out.fill(0.0);
    if p.temperature == 0.0 || p.top_k == 1 {
        out[argmax(logits) as usize] = 1.0;
        return;
    }
    let (cand, probs) = warped(logits, p);
    let total: f64 = probs.iter().sum();
    for (&tok, pr) in cand.iter().zip(&probs) {
        out[tok as usize] = pr / total;
    }
}

/// A draw from a distribution over the vocabulary (`probs`, one non-negative weight per token, not
/// necessarily normalised; tokens in index order), as `sample` draws from its candidates.
pub fn draw_from(probs: &[f64], rng: &mut Rng) -> u32 {
    let ids: Vec<u32> = (0..probs.len() as u32).collect();
    draw(&ids, probs, rng, None)
}

/// Candidate tokens and their unnormalised probabilities after temperature, top-k and top-p.
fn warped(logits: &[f32], p: &SampleParams) -> (Vec<u32>, Vec<f64>) {
    let t = p.temperature as f64;
    let max = logits[argmax(logits) as usize] as f64;
    // Candidates: every token, or (with a cut) those that can matter, most likely first.
    let cut = p.top_k > 0 || p.top_p < 1.0 || p.min_p > 0.0;
    let mut cand: Vec<(f32, u32)> = if cut {
        let floor = max - 27.6 * t; // exp(-27.6) ~ 1e-12 of the top probability
        logits
            .iter()
            .enumerate()
            .filter(|(_, &v)| v as f64 >= floor)
            .map(|(i, &v)| (v, i as u32))
            .collect()
    } else {
        logits
            .iter()
            .enumerate()
            .map(|(i, &v)| (v, i as u32))
            .collect()
    };
    if cut {
        // Descending by logit, ties by index (deterministic).
        cand.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        if p.top_k > 0 {
            cand.truncate(p.top_k);
        }
    }
    let mut probs: Vec<f64> = cand
        .iter()
        .map(|&(v, _)| ((v as f64 - max) / t).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (i, pr) in probs.iter().enumerate() {
            acc += pr / total;
            if acc >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep);
        cand.truncate(keep);
    }
    if p.min_p > 0.0 {
        // Most likely first, and the most likely has probability 1 before normalisation.
        let keep = probs.partition_point(|&pr| pr >= p.min_p as f64).max(1);
        probs.truncate(keep);
        cand.truncate(keep);
    }
    (cand.into_iter().map(|c| c.1).collect(), probs)
}

/// A draw from `probs` (unnormalised) over `cand`, `skip` excluded.
fn draw(cand: &[u32], probs: &[f64], rng: &mut Rng, skip: Option<u32>) -> u32 {
    let live = |&(_, &tok): &(&f64, &u32)| Some(tok) != skip;
    let total: f64 = probs.iter().zip(cand).filter(live).map(|(p, _)| p).sum();
    let mut u = rng.uniform() * total;
    let mut last = None;
    for (pr, &tok) in probs.iter().zip(cand).filter(|x| live(x)) {
        if u < *pr {
            return tok;
        }
        u -= pr;
        last = Some(tok);
    }
    last.or(cand.first().copied()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sampling at temperature 1 with no cut.
    fn plain() -> SampleParams {
        SampleParams {
            temperature: 1.0,
            ..SampleParams::greedy()
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.2]), 1);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let logits = [0.1, 2.0, 1.9, -3.0];
        let mut rng = Rng::new(1);
        for _ in 0..100 {
            let k1 = SampleParams {
                top_k: 1,
                ..plain()
            };
            assert_eq!(sample(&logits, &k1, &mut rng), 1);
            let p = SampleParams {
                top_p: 1e-6,
                ..plain()
            };
            assert_eq!(sample(&logits, &p, &mut rng), 1);
        }
    }

    #[test]
    fn frequencies_follow_the_softmax() {
        let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln(), -50.0];
        let p = plain();
        let mut rng = Rng::new(7);
        let mut counts = [0usize; 4];
        let n = 60000;
        for _ in 0..n {
            counts[sample(&logits, &p, &mut rng) as usize] += 1;
        }
        for (i, want) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0, 0.0].iter().enumerate() {
            let got = counts[i] as f64 / n as f64;
            assert!((got - want).abs() < 0.01, "token {i}: {got} vs {want}");
        }
        // top-p 0.5: only tokens 2 (0.5) is needed to reach half the mass.
        let p = SampleParams { top_p: 0.5, ..p };
        for _ in 0..1000 {
            assert_eq!(sample(&logits, &p, &mut rng), 2);
        }
        // top-k 2: tokens 2 and 1 in ratio 3:2.
        let p = SampleParams {
            top_k: 2,
            top_p: 1.0,
            ..p
        };
        let mut c = [0usize; 4];
        for _ in 0..20000 {
            c[sample(&logits, &p, &mut rng) as usize] += 1;
        }
        assert_eq!(c[0] + c[3], 0);
        assert!((c[2] as f64 / 20000.0 - 0.6).abs() < 0.02);
        // min-p 0.5: token 0 (1/3 of the most likely) goes, token 1 (2/3) stays; the same 3:2.
        let p = SampleParams {
            top_k: 0,
            min_p: 0.5,
            ..p
        };
        let mut dist = [0.0f64; 4];
        distribution(&logits, &p, &mut dist);
        assert!(
            (dist[2] - 0.6).abs() < 1e-6 && (dist[1] - 0.4).abs() < 1e-6,
            "{dist:?}"
        );
        assert_eq!(dist[0] + dist[3], 0.0);
    }

    #[test]
    fn same_seed_same_draws() {
        let (mut a, mut b) = (Rng::new(42), Rng::new(42));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
    }

    #[test]
    fn verified_drafts_keep_the_distribution() {
        let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln(), -50.0];
        let p = plain();
        for draft in [0u32, 2, 3] {
            let mut rng = Rng::new(11 + draft as u64);
            let (mut counts, mut kept) = ([0usize; 4], 0usize);
            let n = 60000;
            for _ in 0..n {
                let (tok, ok) = verify(&logits, &p, &mut rng, draft);
                assert_eq!(ok, tok == draft);
                counts[tok as usize] += 1;
                kept += ok as usize;
            }
            for (i, want) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0, 0.0].iter().enumerate() {
                let got = counts[i] as f64 / n as f64;
                assert!(
                    (got - want).abs() < 0.01,
                    "draft {draft}, token {i}: {got} vs {want}"
                );
            }
            let q = [1.0 / 6.0, 0.0, 0.5, 0.0][draft as usize];
            assert!(
                (kept as f64 / n as f64 - q).abs() < 0.01,
                "draft {draft} kept {kept}"
            );
        }
        // Greedy: the argmax, accepted only when it is the draft.
        let g = SampleParams::greedy();
        let mut rng = Rng::new(0);
        assert_eq!(verify(&logits, &g, &mut rng, 2), (2, true));
        assert_eq!(verify(&logits, &g, &mut rng, 1), (2, false));
    }
}
