//! Speculative decoding that never changes the answer: drafters and the draft length.
//!
//! A drafter guesses the next tokens of a sequence; the engine then runs the last token
//! and the guesses through the target model in one forward pass, samples every position
//! from its own logits row exactly as plain decoding would (the same sampler, penalty
//! window and position-keyed draw), and keeps the guesses up to the first one that differs
//! from what was sampled. Because a position's logits do not depend on how many tokens
//! share the forward pass, the kept tokens, their log-probabilities and every later token
//! are bit-identical to plain decoding, for greedy and for seeded sampling alike (gate
//! EQUIV-4). The drafts only decide how many positions one pass gets through.
//!
//! Two drafters: prompt lookup ([`DraftSource::Ngram`]: the longest recent n-gram that
//! occurred before, n from [`NGRAM_MAX`] down to 1, proposes what followed it) and a
//! draft model ([`DraftSource::Model`]: a smaller model with the same vocabulary, set with
//! [`crate::Engine::with_draft_model`], greedy). The draft length adapts per sequence:
//! it doubles while every guess is kept and falls back to one more than the guesses kept,
//! and after a pass whose guesses were all wrong the sequence decodes a while without
//! drafting (1, 2, 4, … up to [`MAX_PAUSE`] passes), since checking guesses costs a wider
//! forward pass.

use nx_gguf::Gguf;
use nx_kv_cache::BlockTable;

use crate::RunError;

/// Longest n-gram prompt lookup tries.
pub const NGRAM_MAX: usize = 4;

/// Where draft tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftSource {
    /// Prompt lookup: n-gram matches over the prompt and the text generated so far.
    Ngram,
    /// The engine's draft model ([`crate::Engine::with_draft_model`]).
    Model,
}

impl DraftSource {
    /// `"ngram"` or `"draft"`.
    pub fn name(self) -> &'static str {
        match self {
            DraftSource::Ngram => "ngram",
            DraftSource::Model => "draft",
        }
    }

    /// Parses `"ngram"` or `"draft"`.
    pub fn from_name(name: &str) -> Option<DraftSource> {
        match name {
            "ngram" => Some(DraftSource::Ngram),
            "draft" => Some(DraftSource::Model),
            _ => None,
        }
    }
}

/// Speculative decoding for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    /// The drafter.
    pub source: DraftSource,
    /// Most draft tokens verified in one forward pass (1 to 32).
    pub draft_max: usize,
}

/// Longest draft one pass verifies.
pub const MAX_DRAFT: usize = 32;

impl Speculation {
    /// Checks the draft length.
    pub fn validate(&self) -> Result<(), RunError> {
        if !(1..=MAX_DRAFT).contains(&self.draft_max) {
            return Err(RunError::InvalidConfig(format!(
                "draft_max {} is not in 1..={MAX_DRAFT}",
                self.draft_max
            )));
        }
        Ok(())
    }
}

/// A sequence's speculation state.
#[derive(Debug)]
pub(crate) struct SpecState {
    pub(crate) spec: Speculation,
    /// Draft length of the next pass.
    k: usize,
    /// Tokens drafted and accepted so far.
    pub(crate) drafted: usize,
    pub(crate) accepted: usize,
    /// The draft model's cache of this sequence's first tokens.
    pub(crate) draft_table: BlockTable,
    /// Passes left to decode without drafts, and the length of the last such pause:
    /// after a pass whose drafts were all wrong the pause doubles (up to
    /// [`MAX_PAUSE`]), so text where drafts fail costs little more than plain decoding.
    pause_left: usize,
    pause: usize,
    /// Prompt-lookup passes by match length `n` (index), and how many of them had their
    /// first guess kept: a length whose guesses are seldom right stops drafting.
    ngram_passes: [u32; NGRAM_MAX + 1],
    ngram_first_kept: [u32; NGRAM_MAX + 1],
    /// The match length of the prompt-lookup guesses that [`SpecState::record`] is
    /// told about next.
    last_ngram: Option<usize>,
    /// Guesses kept and first misses, both decaying by a tenth per pass: the chance a
    /// guess is kept is about `(kept + 2) / (kept + missed + 3)`.
    kept_recent: f64,
    missed_recent: f64,
}

/// A running mean of a duration in seconds (exponentially weighted), `None` until the
/// first sample.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ewma(Option<f64>);

impl Ewma {
    /// Adds one sample.
    pub(crate) fn add(&mut self, x: f64) {
        self.0 = Some(self.0.map_or(x, |m| m + 0.2 * (x - m)));
    }

    /// The mean so far.
    pub(crate) fn get(self) -> Option<f64> {
        self.0
    }
}

/// What one more row of a verification pass costs, as a share of a one-row pass
/// (measured on the default model: 2 rows ≈ 1.2×, 8 rows ≈ 2×).
pub(crate) const VERIFY_ROW_COST: f64 = 0.15;

/// A draft-model pass must promise at least this many tokens per unit of plain decode
/// time, else the sequence decodes without drafts for a while.
const MIN_DRAFT_GAIN: f64 = 1.02;

/// The draft length `1..=k` that gives the most tokens per unit of time when each guess
/// is kept with probability `p` (and the rest of the pass follows the first miss), a
/// draft-model pass costs `ratio` of a plain decode step, and each verified row
/// [`VERIFY_ROW_COST`]; with that gain (tokens per plain-step time).
fn best_draft_len(k: usize, p: f64, ratio: f64) -> (usize, f64) {
    let mut best = (0, 1.0);
    let mut tokens = 1.0; // the pass's own token
    let mut reach = 1.0; // chance that guess j is reached and kept
    for j in 1..=k {
        reach *= p;
        tokens += reach;
        let gain = tokens / (1.0 + j as f64 * (VERIFY_ROW_COST + ratio));
        if gain > best.1 {
            best = (j, gain);
        }
    }
    best
}

/// A pass of `k` guesses costs more than a one-token pass (on the default model a
/// two-row pass about 1.2× a one-row pass): prompt lookup drafts from an n-gram length
/// while, by its record in this sequence, at least this share (percent) of its passes
/// keep their first guess.
pub const NGRAM_MIN_FIRST_KEPT_PCT: u32 = 30;

/// The record each n-gram length starts with, `(first guesses kept, passes)`: one-token
/// matches are weak evidence (on ordinary text an eighth of their guesses were right),
/// longer ones strong, so a single miss stops one-token drafting until it is proven and
/// longer matches get a few chances.
const NGRAM_PRIOR: [(u32, u32); 2] = [(1, 3), (2, 3)];

/// Longest pause from drafting, in passes.
pub const MAX_PAUSE: usize = 32;

impl SpecState {
    pub(crate) fn new(spec: Speculation) -> SpecState {
        SpecState {
            spec,
            k: spec.draft_max.min(4),
            drafted: 0,
            accepted: 0,
            draft_table: BlockTable::new(),
            pause_left: 0,
            pause: 0,
            ngram_passes: [0; NGRAM_MAX + 1],
            ngram_first_kept: [0; NGRAM_MAX + 1],
            last_ngram: None,
            kept_recent: 0.0,
            missed_recent: 0.0,
        }
    }

    /// How many guesses to ask of the draft model (at most `k`) when its pass costs
    /// `ratio` of a plain decode step (`None`: not measured or not weighed, `k`): the
    /// length with the best expected tokens per unit of time. When even that promises
    /// less than plain decoding, none, and drafting pauses as after a wholly wrong pass.
    pub(crate) fn model_draft_len(&mut self, k: usize, ratio: Option<f64>) -> usize {
        let Some(ratio) = ratio else {
            return k;
        };
        let p = (self.kept_recent + 2.0) / (self.kept_recent + self.missed_recent + 3.0);
        let (len, gain) = best_draft_len(k, p, ratio);
        if gain < MIN_DRAFT_GAIN {
            self.pause = (self.pause * 2).clamp(1, MAX_PAUSE);
            self.pause_left = self.pause;
            return 0;
        }
        len
    }

    /// Up to `k` prompt-lookup guesses for the next pass over `tokens` (the sequence so
    /// far): none when the matching n-gram's length has a poor record in this sequence.
    pub(crate) fn ngram_drafts(&mut self, tokens: &[u32], k: usize) -> Vec<u32> {
        self.last_ngram = None;
        let Some((n, drafts)) = ngram_lookup(tokens, NGRAM_MAX, k) else {
            return Vec::new();
        };
        let (prior_kept, prior_passes) = NGRAM_PRIOR[usize::from(n > 1)];
        let kept = self.ngram_first_kept[n] + prior_kept;
        let passes = self.ngram_passes[n] + prior_passes;
        if kept * 100 < NGRAM_MIN_FIRST_KEPT_PCT * passes {
            return Vec::new();
        }
        self.last_ngram = Some(n);
        drafts
    }

    /// `false` while drafting is paused (and counts the pass).
    pub(crate) fn take_turn(&mut self) -> bool {
        if self.pause_left > 0 {
            self.pause_left -= 1;
            return false;
        }
        true
    }

    /// Draft tokens to ask for when `remaining` more tokens may be generated (the
    /// pass also yields one token of its own, so at most `remaining − 1`).
    pub(crate) fn next_len(&self, remaining: usize) -> usize {
        self.k.min(remaining.saturating_sub(1))
    }

    /// Records one verification: `drafted` guesses, `kept` of them kept.
    pub(crate) fn record(&mut self, drafted: usize, kept: usize) {
        self.drafted += drafted;
        self.accepted += kept;
        self.kept_recent = 0.9 * self.kept_recent + kept as f64;
        self.missed_recent = 0.9 * self.missed_recent + f64::from(u8::from(kept < drafted));
        if let Some(n) = self.last_ngram.take() {
            self.ngram_passes[n] += 1;
            self.ngram_first_kept[n] += u32::from(kept > 0);
        }
        self.k = if kept == drafted {
            (self.k * 2).min(self.spec.draft_max)
        } else {
            (kept + 1).min(self.spec.draft_max)
        };
        if kept == 0 {
            self.pause = (self.pause * 2).clamp(1, MAX_PAUSE);
            self.pause_left = self.pause;
        } else {
            self.pause = 0;
        }
    }
}

/// Prompt lookup: for n from `max_n` down to 1, the most recent earlier occurrence of
/// the last n tokens proposes the (up to `k`) tokens that followed it.
pub fn ngram_draft(tokens: &[u32], max_n: usize, k: usize) -> Vec<u32> {
    ngram_lookup(tokens, max_n, k).map_or_else(Vec::new, |(_, drafts)| drafts)
}

/// [`ngram_draft`] with the length `n` of the n-gram that matched.
pub fn ngram_lookup(tokens: &[u32], max_n: usize, k: usize) -> Option<(usize, Vec<u32>)> {
    if k == 0 {
        return None;
    }
    let len = tokens.len();
    for n in (1..=max_n.min(len.saturating_sub(1))).rev() {
        let suffix = &tokens[len - n..];
        // An occurrence starting at `start` must end before the suffix itself starts
        // being compared with itself, and be followed by at least one token.
        for start in (0..len - n).rev() {
            if &tokens[start..start + n] == suffix {
                let follow = &tokens[start + n..(start + n + k).min(len)];
                if !follow.is_empty() {
                    return Some((n, follow.to_vec()));
                }
            }
        }
    }
    None
}

/// Checks that a draft model reads and writes the same tokens as the target: the same
/// vocabulary size, token texts and special tokens. The error names what differs.
pub(crate) fn check_same_vocab(target: &Gguf, draft: &Gguf) -> Result<(), RunError> {
    let (t, d) = (target.metadata(), draft.metadata());
    fn tokens<'m>(m: &'m nx_gguf::Metadata, which: &str) -> Result<Vec<&'m str>, RunError> {
        m.get_str_array("tokenizer.ggml.tokens")
            .map_err(|e| RunError::DraftVocab(format!("the {which} model has no vocabulary: {e}")))
    }
    let (tt, dt) = (tokens(t, "target")?, tokens(d, "draft")?);
    if tt.len() != dt.len() {
        return Err(RunError::DraftVocab(format!(
            "the target has {} tokens, the draft model {}",
            tt.len(),
            dt.len()
        )));
    }
    if let Some(i) = tt.iter().zip(&dt).position(|(a, b)| a != b) {
        return Err(RunError::DraftVocab(format!(
            "token {i} is {:?} in the target and {:?} in the draft model",
            tt[i], dt[i]
        )));
    }
    for k in [
        "tokenizer.ggml.model",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
    ] {
        let (a, b) = (t.get(k), d.get(k));
        if a != b {
            return Err(RunError::DraftVocab(format!(
                "{k} is {a:?} in the target and {b:?} in the draft model"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_recent_match_proposes_what_followed() {
        // "1 2 3 4 ... 1 2 3" → the 3-gram "1 2 3" was followed by "4 5".
        let t = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3];
        assert_eq!(ngram_draft(&t, 4, 2), vec![4, 5]);
        // The most recent occurrence wins.
        let t = [7, 1, 7, 2, 7];
        assert_eq!(ngram_draft(&t, 4, 1), vec![2]);
        // Nothing repeats: no draft.
        assert!(ngram_draft(&[1, 2, 3], 4, 3).is_empty());
        assert!(ngram_draft(&[5], 4, 3).is_empty());
        assert!(ngram_draft(&[5, 5], 4, 0).is_empty());
        // A run of one token drafts more of it.
        assert_eq!(ngram_draft(&[5, 5, 5], 4, 3), vec![5]);
    }

    #[test]
    fn an_ngram_length_whose_guesses_fail_stops_drafting() {
        let mut s = SpecState::new(Speculation {
            source: DraftSource::Ngram,
            draft_max: 8,
        });
        // Only one-token matches: "7" was followed by 2.
        let t = [7, 2, 9, 7];
        assert_eq!(ngram_lookup(&t, 4, 3), Some((1, vec![2, 9, 7])));
        assert_eq!(s.ngram_drafts(&t, 3), vec![2, 9, 7]);
        s.record(3, 0);
        assert!(
            s.ngram_drafts(&t, 3).is_empty(),
            "one miss ends one-token drafts"
        );
        // A two-token match still drafts, and keeps drafting through a miss.
        let t2 = [7, 2, 9, 7, 2];
        assert_eq!(s.ngram_drafts(&t2, 3), vec![9, 7, 2]);
        s.record(3, 0);
        assert_eq!(s.ngram_drafts(&t2, 3), vec![9, 7, 2]);
        s.record(3, 1);
        // Misses pile up: with the prior, 3 first guesses kept of 5 passes, then of 6,
        // …, of 10 (30 %: still drafting), of 11 (under 30 %: no more).
        for _ in 0..6 {
            assert!(!s.ngram_drafts(&t2, 3).is_empty());
            s.record(3, 0);
        }
        assert!(s.ngram_drafts(&t2, 3).is_empty());
    }

    #[test]
    fn a_draft_model_as_dear_as_the_target_is_not_asked() {
        // Free guesses that are usually right: draft the most.
        assert_eq!(best_draft_len(7, 0.9, 0.0).0, 7);
        // Guesses as dear as a plain step never pay, however good.
        assert!(best_draft_len(7, 0.99, 1.0).1 < MIN_DRAFT_GAIN);
        // Cheap but poor guesses: one at most.
        assert!(best_draft_len(7, 0.3, 0.05).0 <= 1);
        let mut s = SpecState::new(Speculation {
            source: DraftSource::Model,
            draft_max: 7,
        });
        assert!(s.model_draft_len(7, Some(0.05)) >= 2, "optimistic at first");
        assert_eq!(
            s.model_draft_len(7, None),
            7,
            "unweighed: the length as it is"
        );
        assert_eq!(s.model_draft_len(7, Some(1.0)), 0);
        assert!(!s.take_turn(), "and a pause follows");
        // Misses lower the estimate, and the length with it.
        for _ in 0..5 {
            s.record(4, 0);
        }
        assert!(s.model_draft_len(7, Some(0.05)) < 2);
    }

    #[test]
    fn the_draft_length_grows_on_success_and_shrinks_on_failure() {
        let mut s = SpecState::new(Speculation {
            source: DraftSource::Ngram,
            draft_max: 8,
        });
        assert_eq!(s.next_len(100), 4);
        s.record(4, 4);
        assert_eq!(s.next_len(100), 8);
        s.record(8, 8);
        assert_eq!(s.next_len(100), 8);
        s.record(8, 2);
        assert_eq!(s.next_len(100), 3);
        assert!(s.take_turn());
        s.record(3, 0);
        assert_eq!(s.next_len(100), 1);
        assert_eq!(s.next_len(1), 0, "the pass's own token is the last allowed");
        assert_eq!((s.drafted, s.accepted), (23, 14));
        // All wrong: one pass without drafts, then two, then four, …
        assert!(!s.take_turn());
        assert!(s.take_turn());
        s.record(1, 0);
        assert!(!s.take_turn() && !s.take_turn());
        assert!(s.take_turn());
        s.record(1, 1);
        assert!(s.take_turn(), "a kept draft ends the pauses");
    }
}
