//! Token sampling: greedy, temperature, top-k/p, min-p, penalties, logit bias, seeded
//! ChaCha RNG.
//!
//! [`Sampler`] turns one row of logits into a token id. It knows nothing about the
//! model: the caller feeds it logits and tells it which tokens were accepted (prompt
//! and generated) so the repetition penalties can see them. The semantics of each
//! stage follow llama.cpp's samplers (`src/llama-sampler.cpp`); the tie-breaking is
//! ours and fully deterministic: candidates are ordered by logit, higher first, and
//! equal logits by lower token id first.
//!
//! [`log_softmax_top`] and [`log_prob`] compute log-probabilities (in f64) for
//! reporting, independent of any sampler state.

mod config;

use std::collections::{HashMap, VecDeque};

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

pub use config::{ConfigError, SamplerConfig};

/// Why no token could be sampled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The logits row is empty.
    #[error("empty logits row")]
    EmptyLogits,
    /// Every logit is NaN or infinite (after the logit bias and penalties).
    #[error("no finite logit among {n_vocab} (all NaN or infinite)")]
    NoFiniteLogits {
        /// Length of the logits row.
        n_vocab: usize,
    },
    /// A choice from candidates was asked of a sampler that needs the whole row
    /// (penalties or a logit bias on, or no top-k).
    #[error(
        "this sampler needs every logit of the row (penalties or a logit bias on, or top-k off)"
    )]
    NeedsFullRow,
}

/// One candidate token during filtering.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Candidate {
    id: u32,
    logit: f32,
}

/// The candidate order: higher logit first, then lower id first. A total order on
/// finite logits, so every sort and selection is deterministic.
#[inline]
fn by_logit_desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Sorts the `k` best candidates (in [`by_logit_desc`] order) to the front.
fn sort_prefix(cands: &mut [Candidate], k: usize) {
    let k = k.min(cands.len());
    if k == 0 {
        return;
    }
    if k < cands.len() {
        cands.select_nth_unstable_by(k - 1, by_logit_desc);
    }
    cands[..k].sort_unstable_by(by_logit_desc);
}

/// Top-p never needs more than this many sorted candidates in the common case; when it
/// does, the rest is sorted too (the result is the same as sorting everything).
const TOP_P_FIRST_SORT: usize = 256;

/// A seeded sampler with a window of recent tokens for the penalties.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplerConfig,
    rng: ChaCha20Rng,
    /// The last `penalty_last_n` accepted tokens, oldest first.
    recent: VecDeque<u32>,
    /// Occurrences of each token in `recent`.
    counts: HashMap<u32, u32>,
    /// Reused candidate buffer (no allocation per token after the first).
    cands: Vec<Candidate>,
}

impl Sampler {
    /// A sampler for `config` (validated) with its generator seeded from `config.seed`.
    pub fn new(config: SamplerConfig) -> Result<Sampler, SamplerError> {
        config.validate()?;
        Ok(Sampler {
            rng: ChaCha20Rng::seed_from_u64(config.seed),
            recent: VecDeque::with_capacity(config.penalty_last_n.min(1 << 16)),
            counts: HashMap::new(),
            cands: Vec::new(),
            config,
        })
    }

    /// The settings in use.
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Records an accepted token (prompt or generated) in the penalty window; the
    /// oldest token leaves once the window holds `penalty_last_n`. `sample` does not
    /// call this itself: call it for every token that enters the sequence, or use
    /// [`Sampler::sample_and_accept`].
    pub fn accept(&mut self, token: u32) {
        let window = self.config.penalty_last_n;
        if window == 0 {
            return;
        }
        if self.recent.len() >= window {
            if let Some(old) = self.recent.pop_front() {
                if let Some(c) = self.counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.recent.push_back(token);
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// [`Sampler::accept`] for each token in order (e.g. the prompt).
    pub fn accept_all(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.accept(t);
        }
    }

    /// The penalty window, oldest first.
    pub fn recent_tokens(&self) -> Vec<u32> {
        self.recent.iter().copied().collect()
    }

    /// Empties the penalty window and reseeds the generator from `config.seed`, so the
    /// sampler behaves as if freshly built.
    pub fn reset(&mut self) {
        self.recent.clear();
        self.counts.clear();
        self.rng = ChaCha20Rng::seed_from_u64(self.config.seed);
    }

    /// Applies the repetition, frequency and presence penalties to `logits` in place,
    /// llama.cpp's way: for each token with `count > 0` occurrences in the window
    /// (ids beyond `logits` are ignored), a logit `<= 0` is multiplied by
    /// `repeat_penalty` and a positive one divided by it, then
    /// `count·frequency_penalty + presence_penalty` is subtracted. Other logits are
    /// untouched. Does nothing when the penalties are off.
    pub fn apply_penalties(&self, logits: &mut [f32]) {
        penalise(&self.config, &self.counts, logits);
    }

    /// The candidate ids `sample` would draw from for these logits (penalties, then
    /// top-k, top-p and min-p), best first. `logits` are not modified. With
    /// temperature 0 this is the single argmax token.
    pub fn filtered_candidates(&self, logits: &[f32]) -> Result<Vec<u32>, SamplerError> {
        let mut penalised = logits.to_vec();
        adjust(&self.config, &self.counts, &mut penalised);
        if self.config.is_greedy() {
            return Ok(vec![argmax(&penalised)?]);
        }
        let mut cands = Vec::new();
        let sorted = filter(&self.config, &penalised, &mut cands)?;
        if !sorted {
            cands.sort_unstable_by(by_logit_desc);
        }
        Ok(cands.iter().map(|c| c.id).collect())
    }

    /// Picks the next token from `logits` (one row, `n_vocab` values).
    ///
    /// The logit bias and then the penalties are applied to `logits` in place first (the
    /// caller's row is modified). Then, with temperature 0, the highest logit wins (lowest id on ties)
    /// and no random number is used. Otherwise, over the finite logits: top-k, top-p,
    /// min-p, division by the temperature, softmax, and a draw from the ChaCha20
    /// generator (exactly one random number per call). NaN and infinite logits are
    /// never chosen.
    ///
    /// Does not record the token; see [`Sampler::accept`].
    pub fn sample(&mut self, logits: &mut [f32]) -> Result<u32, SamplerError> {
        let rng = &mut self.rng;
        Self::choose(&self.config, &self.counts, &mut self.cands, logits, || {
            uniform_f64(rng)
        })
    }

    /// [`Sampler::sample`] with the random number taken from the position of the token
    /// being chosen instead of the running generator: the ChaCha20 stream seeded from
    /// `config.seed`, at word `2·position` (one 64-bit draw per position). The token for
    /// a position then depends only on the seed, the position, the logits and the
    /// penalty window — not on how many draws came before — so plain decoding, a
    /// continued conversation, a recomputed sequence and speculative verification all
    /// draw the same number for the same position.
    pub fn sample_at(&mut self, logits: &mut [f32], position: u64) -> Result<u32, SamplerError> {
        let seed = self.config.seed;
        Self::choose(&self.config, &self.counts, &mut self.cands, logits, || {
            uniform_at(seed, position)
        })
    }

    /// The pipeline of [`Sampler::sample`], drawing its one uniform number (if any)
    /// from `uniform`.
    fn choose(
        config: &SamplerConfig,
        counts: &HashMap<u32, u32>,
        cands_buf: &mut Vec<Candidate>,
        logits: &mut [f32],
        uniform: impl FnOnce() -> f64,
    ) -> Result<u32, SamplerError> {
        if logits.is_empty() {
            return Err(SamplerError::EmptyLogits);
        }
        adjust(config, counts, logits);
        if config.is_greedy() {
            return argmax(logits);
        }
        let mut cands = std::mem::take(cands_buf);
        let result = filter(config, logits, &mut cands).map(|_| {
            for c in cands.iter_mut() {
                c.logit /= config.temperature;
            }
            draw(&cands, uniform())
        });
        *cands_buf = cands;
        result
    }

    /// Whether the choice depends on nothing but the row's largest logit (greedy
    /// without penalties or logit bias): then [`greedy_among`] makes it from the row's
    /// candidates.
    pub fn is_stateless_greedy(&self) -> bool {
        self.config.is_greedy() && !self.config.adjusts_logits()
    }

    /// How many of a row's largest logits decide the token, when nothing else does:
    /// 1 greedy, `top_k` when sampling with top-k; `None` with penalties or a logit
    /// bias (they move any logit) or sampling without top-k.
    /// [`Sampler::sample_among_at`] then chooses from candidates that hold those.
    pub fn top_needed(&self) -> Option<usize> {
        let c = &self.config;
        if c.adjusts_logits() {
            None
        } else if c.is_greedy() {
            Some(1)
        } else {
            (c.top_k > 0).then_some(c.top_k)
        }
    }

    /// The token [`Sampler::sample_at`] would choose from `logits`, when that choice
    /// depends on nothing but the row (greedy without penalties), else `None`. It takes
    /// `&self`, so rows can be decided on several threads before the tokens are
    /// accepted in order.
    pub fn stateless_choice(&self, logits: &[f32]) -> Option<Result<u32, SamplerError>> {
        if !self.is_stateless_greedy() {
            return None;
        }
        if logits.is_empty() {
            return Some(Err(SamplerError::EmptyLogits));
        }
        Some(argmax(logits))
    }

    /// [`Sampler::sample_at`] for a row known only by the entries that can be among its
    /// [`Sampler::top_needed`] largest logits (`(id, logit)`, in any order, holding
    /// every entry of the row's top ones with its exact logit; every other logit below
    /// that many of these): the same token. An error where the full row is needed.
    pub fn sample_among_at(
        &mut self,
        candidates: &[(u32, f32)],
        position: u64,
    ) -> Result<u32, SamplerError> {
        let config = &self.config;
        if config.adjusts_logits() {
            return Err(SamplerError::NeedsFullRow);
        }
        if config.is_greedy() {
            return greedy_among(candidates);
        }
        if config.top_k == 0 {
            return Err(SamplerError::NeedsFullRow);
        }
        let cands = &mut self.cands;
        cands.clear();
        cands.extend(
            candidates
                .iter()
                .filter(|c| c.1.is_finite())
                .map(|&(id, logit)| Candidate { id, logit }),
        );
        if cands.is_empty() {
            return Err(SamplerError::NoFiniteLogits {
                n_vocab: candidates.len(),
            });
        }
        // The order `finite_candidates` gives a full row: id order.
        cands.sort_unstable_by_key(|c| c.id);
        filter_finite(config, cands);
        for c in cands.iter_mut() {
            c.logit /= config.temperature;
        }
        Ok(draw(cands, uniform_at(config.seed, position)))
    }

    /// [`Sampler::sample`] followed by [`Sampler::accept`] of the chosen token.
    pub fn sample_and_accept(&mut self, logits: &mut [f32]) -> Result<u32, SamplerError> {
        let token = self.sample(logits)?;
        self.accept(token);
        Ok(token)
    }
}

/// What the chain does to a row before any filter, in llama.cpp's order: the logit bias,
/// then the penalties.
fn adjust(config: &SamplerConfig, counts: &HashMap<u32, u32>, logits: &mut [f32]) {
    for &(token, bias) in &config.logit_bias {
        if let Some(logit) = logits.get_mut(token as usize) {
            *logit += bias;
        }
    }
    penalise(config, counts, logits);
}

/// [`Sampler::apply_penalties`] for a config and a window's token counts.
fn penalise(config: &SamplerConfig, counts: &HashMap<u32, u32>, logits: &mut [f32]) {
    if !config.penalties_enabled() {
        return;
    }
    let c = config;
    for (&token, &count) in counts {
        let Some(logit) = logits.get_mut(token as usize) else {
            continue;
        };
        if *logit <= 0.0 {
            *logit *= c.repeat_penalty;
        } else {
            *logit /= c.repeat_penalty;
        }
        *logit -= count as f32 * c.frequency_penalty + c.presence_penalty;
    }
}

/// The greedy choice from a row known only by the entries that can hold its largest
/// logit (`(id, logit)` in any order; every other logit lower than the largest of
/// these): the token [`Sampler::stateless_choice`] picks from the full row — highest
/// finite logit, lowest id on ties.
pub fn greedy_among(candidates: &[(u32, f32)]) -> Result<u32, SamplerError> {
    let mut best: Option<(u32, f32)> = None;
    for &(id, logit) in candidates {
        if !logit.is_finite() {
            continue;
        }
        best = match best {
            Some((b, bl)) if bl > logit || (bl == logit && b < id) => Some((b, bl)),
            _ => Some((id, logit)),
        };
    }
    best.map(|b| b.0).ok_or(SamplerError::NoFiniteLogits {
        n_vocab: candidates.len(),
    })
}

/// Highest finite logit, lowest id on ties.
fn argmax(logits: &[f32]) -> Result<u32, SamplerError> {
    if logits.is_empty() {
        return Err(SamplerError::EmptyLogits);
    }
    // The first finite logit equal to the largest finite one, in two passes that run
    // sixteen lanes at a time (one pass that tracks the index stays scalar): the
    // maximum of each lane, then the first chunk holding it. Equal values (±0
    // included) keep the first.
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = logits.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &l) in lanes.iter_mut().zip(chunk) {
            *m = if l > *m && l.is_finite() { l } else { *m };
        }
    }
    let max = lanes
        .iter()
        .chain(chunks.remainder())
        .fold(f32::NEG_INFINITY, |m, &l| {
            if l > m && l.is_finite() {
                l
            } else {
                m
            }
        });
    // A finite logit is above −∞, so the maximum stays −∞ only when there is none.
    let none = SamplerError::NoFiniteLogits {
        n_vocab: logits.len(),
    };
    if max == f32::NEG_INFINITY {
        return Err(none);
    }
    let chunk = logits
        .chunks(LANES)
        .position(|c| c.iter().fold(false, |hit, &l| hit | (l == max)))
        .ok_or(none.clone())?;
    let within = logits[chunk * LANES..]
        .iter()
        .position(|&l| l == max)
        .ok_or(none)?;
    let at = chunk * LANES + within;
    Ok(at as u32)
}

/// Fills `cands` with the finite logits and applies top-k, top-p and min-p. Returns
/// whether `cands` ended up sorted best first.
fn filter(
    config: &SamplerConfig,
    logits: &[f32],
    cands: &mut Vec<Candidate>,
) -> Result<bool, SamplerError> {
    finite_candidates(logits, cands)?;
    Ok(filter_finite(config, cands))
}

/// Top-k, top-p and min-p over the finite candidates `cands`. Returns whether `cands`
/// ended up sorted best first.
fn filter_finite(config: &SamplerConfig, cands: &mut Vec<Candidate>) -> bool {
    let mut sorted = top_k(config.top_k, cands);
    if config.top_p < 1.0 {
        top_p(config.top_p, cands, sorted);
        sorted = true;
    }
    if config.min_p > 0.0 {
        min_p(config.min_p, cands);
    }
    sorted
}

/// `cands` = the finite logits of `logits` with their ids, in id order.
fn finite_candidates(logits: &[f32], cands: &mut Vec<Candidate>) -> Result<(), SamplerError> {
    if logits.is_empty() {
        return Err(SamplerError::EmptyLogits);
    }
    cands.clear();
    cands.extend(
        logits
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, &logit)| Candidate {
                id: i as u32,
                logit,
            }),
    );
    if cands.is_empty() {
        return Err(SamplerError::NoFiniteLogits {
            n_vocab: logits.len(),
        });
    }
    Ok(())
}

/// Top-k: keeps the `k` best by (logit desc, id asc), sorted; `k = 0` keeps all
/// unsorted. Returns whether `cands` is now sorted best first.
fn top_k(k: usize, cands: &mut Vec<Candidate>) -> bool {
    if k > 0 && k < cands.len() {
        sort_prefix(cands, k);
        cands.truncate(k);
        true
    } else if k > 0 {
        cands.sort_unstable_by(by_logit_desc);
        true
    } else {
        false
    }
}

/// Top-p: softmax over the current set (f32, as llama.cpp), then the shortest
/// best-first prefix whose cumulative probability reaches `p` (at least one), left
/// sorted. Only as much of an unsorted set is sorted as the prefix needs.
fn top_p(p: f32, cands: &mut Vec<Candidate>, sorted: bool) {
    let max = max_logit(cands);
    let mut total = 0.0f32;
    for c in cands.iter() {
        total += (c.logit - max).exp();
    }
    let mut n_sorted = if sorted {
        cands.len()
    } else {
        let k = TOP_P_FIRST_SORT.min(cands.len());
        sort_prefix(cands, k);
        k
    };
    let mut cum = 0.0f32;
    let mut keep = cands.len();
    let mut i = 0;
    while i < cands.len() {
        if i == n_sorted {
            // The sorted prefix did not reach p: sort the remainder too.
            cands[n_sorted..].sort_unstable_by(by_logit_desc);
            n_sorted = cands.len();
        }
        cum += (cands[i].logit - max).exp() / total;
        if cum >= p {
            keep = i + 1;
            break;
        }
        i += 1;
    }
    // Either the loop broke inside the sorted prefix or it sorted everything.
    cands.truncate(keep);
}

/// Min-p: keeps the logits within ln(min_p) of the best (p_i >= min_p·p_max), in order.
fn min_p(min_p: f32, cands: &mut Vec<Candidate>) {
    let min_logit = max_logit(cands) + min_p.ln();
    cands.retain(|c| c.logit >= min_logit);
}

/// The largest logit of `cands` (−∞ for none).
fn max_logit(cands: &[Candidate]) -> f32 {
    cands
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max)
}

/// A uniform double in `[0, 1)` from the top 53 bits of one 64-bit output.
/// The uniform number of `position` in the stream of `seed` (see [`Sampler::sample_at`]).
fn uniform_at(seed: u64, position: u64) -> f64 {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    rng.set_word_pos(u128::from(position) * 2);
    uniform_f64(&mut rng)
}

fn uniform_f64(rng: &mut ChaCha20Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Softmax over the candidates' logits and inverse-CDF selection with `u` in
/// `[0, 1)`: the first candidate whose running probability mass reaches `u·total`.
/// Exponentials in f32 (as llama.cpp), sums in f64. `cands` is non-empty.
fn draw(cands: &[Candidate], u: f64) -> u32 {
    let max = cands
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::INFINITY {
        // A tiny temperature overflowed the best logits to +∞: they share all the mass
        // and the limit of the distribution is a pick among them; take the first.
        if let Some(c) = cands.iter().find(|c| c.logit == f32::INFINITY) {
            return c.id;
        }
    }
    let total: f64 = cands.iter().map(|c| f64::from((c.logit - max).exp())).sum();
    let target = total * u;
    let mut running = 0.0f64;
    for c in cands {
        let p = f64::from((c.logit - max).exp());
        running += p;
        // `p > 0` keeps a zero-probability candidate from being picked when u = 0.
        if running >= target && p > 0.0 {
            return c.id;
        }
    }
    // Rounding left the target above the running sum: take the last likely candidate.
    cands
        .iter()
        .rev()
        .find(|c| (c.logit - max).exp() > 0.0)
        .unwrap_or(&cands[0])
        .id
}

/// The largest non-NaN value of `xs` (−∞ when there is none), sixteen lanes at a time.
fn max_skipping_nan(xs: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &l) in lanes.iter_mut().zip(chunk) {
            *m = if l > *m { l } else { *m };
        }
    }
    lanes
        .iter()
        .chain(chunks.remainder())
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m })
}

/// Log-sum-exp of the non-NaN logits in f64, or `None` if there are none (the
/// normalizer of [`log_prob`], for callers that compute it apart: [`log_prob_given`]).
pub fn log_sum_exp(logits: &[f32]) -> Option<f64> {
    // `l > m` is false for NaN, so NaNs are skipped. Sixteen lane maxima combined give
    // the same maximum as one pass (only the sign of a zero maximum may differ, and
    // `l − (±0)` and `±0 + ln Σ` come out the same either way), and they vectorize
    // where a single running maximum does not. The f32 maximum widened is the f64 one.
    let max = f64::from(max_skipping_nan(logits));
    if max == f64::NEG_INFINITY {
        // Empty, all NaN, or all −∞: no distribution.
        return None;
    }
    if max == f64::INFINITY {
        return Some(f64::INFINITY);
    }
    let sum = exp_sum(logits, max);
    Some(max + sum.ln())
}

/// `Σ e^(l − max)` over the non-NaN logits: eight partial sums (element `i` into sum
/// `i mod 8`) added as a fixed tree, each term [`exp_nonpositive`]. With AVX-512 the
/// eight sums are one register and the same arithmetic runs eight terms at a time
/// (no fused multiply-adds, the same roundings), so the bits never depend on the CPU.
fn exp_sum(logits: &[f32], max: f64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    match exp_width() {
        // SAFETY: `exp_width` checked the CPU's features.
        ExpWidth::Avx512 => return unsafe { exp_sum_avx512(logits, max) },
        // SAFETY: as above.
        ExpWidth::Avx2 => return unsafe { exp_sum_avx2(logits, max) },
        ExpWidth::Portable => {}
    }
    exp_sum_portable(logits, max)
}

/// Which build of [`exp_sum`] runs (all give the same bits).
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExpWidth {
    Portable,
    Avx2,
    Avx512,
}

/// The widest [`exp_sum`] build that the process tier (`nx_syscalls::cpu_tier`, lowered
/// by `NX_TIER`) and the CPU allow, so that a pinned tier measures what a CPU of that
/// tier runs; an unusable `NX_TIER` picks the portable build (the matmul reports it).
#[cfg(target_arch = "x86_64")]
fn exp_width() -> ExpWidth {
    use nx_syscalls::CpuTier;
    static WIDTH: std::sync::OnceLock<ExpWidth> = std::sync::OnceLock::new();
    *WIDTH.get_or_init(|| match nx_syscalls::cpu_tier() {
        Ok(CpuTier::Avx512Vnni) if std::arch::is_x86_feature_detected!("avx512f") => {
            ExpWidth::Avx512
        }
        Ok(CpuTier::Avx2 | CpuTier::Avx512Vnni) if std::arch::is_x86_feature_detected!("avx2") => {
            ExpWidth::Avx2
        }
        _ => ExpWidth::Portable,
    })
}

fn exp_term(l: f32, max: f64) -> f64 {
    if l.is_nan() {
        0.0
    } else {
        exp_nonpositive(f64::from(l) - max)
    }
}

fn sums_tree(sums: &[f64; 8]) -> f64 {
    ((sums[0] + sums[4]) + (sums[2] + sums[6])) + ((sums[1] + sums[5]) + (sums[3] + sums[7]))
}

/// [`exp_sum`] one term at a time.
fn exp_sum_portable(logits: &[f32], max: f64) -> f64 {
    let mut sums = [0f64; 8];
    for (i, &l) in logits.iter().enumerate() {
        sums[i % 8] += exp_term(l, max);
    }
    sums_tree(&sums)
}

/// [`exp_sum`] eight terms at a time: [`exp_nonpositive`] step for step on the lanes.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn exp_sum_avx512(logits: &[f32], max: f64) -> f64 {
    use std::arch::x86_64::*;
    let c = |v: f64| _mm512_set1_pd(v);
    let (log2e, shift) = (c(EXP_LOG2E), c(EXP_SHIFT));
    let (ln2_hi, ln2_lo) = (c(exp_ln2_hi()), c(exp_ln2_lo()));
    let shift_bits = _mm512_set1_epi64(EXP_SHIFT.to_bits() as i64);
    let bias = _mm512_set1_epi64(1023);
    let mut acc = _mm512_setzero_pd();
    let mut chunks = logits.chunks_exact(8);
    for ch in &mut chunks {
        // SAFETY: eight f32.
        let l = _mm512_cvtps_pd(unsafe { _mm256_loadu_ps(ch.as_ptr()) });
        let x = _mm512_sub_pd(l, c(max));
        // In range: not NaN (ordered compare) and not below −708.
        let ok = _mm512_cmp_pd_mask::<_CMP_GE_OQ>(x, c(-708.0));
        let x = _mm512_mask_blend_pd(ok, c(-708.0), x);
        let shifted = _mm512_add_pd(_mm512_mul_pd(x, log2e), shift);
        let k = _mm512_sub_pd(shifted, shift);
        let r = _mm512_sub_pd(
            _mm512_sub_pd(x, _mm512_mul_pd(k, ln2_hi)),
            _mm512_mul_pd(k, ln2_lo),
        );
        let mut p = c(EXP_TAYLOR[0]);
        for &inv in &EXP_TAYLOR[1..] {
            p = _mm512_add_pd(_mm512_mul_pd(p, r), c(inv));
        }
        let k_int = _mm512_sub_epi64(_mm512_castpd_si512(shifted), shift_bits);
        let scale = _mm512_castsi512_pd(_mm512_slli_epi64::<52>(_mm512_add_epi64(k_int, bias)));
        acc = _mm512_add_pd(acc, _mm512_maskz_mul_pd(ok, p, scale));
    }
    let mut sums = [0f64; 8];
    // SAFETY: eight f64.
    unsafe { _mm512_storeu_pd(sums.as_mut_ptr(), acc) };
    for (s, &l) in sums.iter_mut().zip(chunks.remainder()) {
        *s += exp_term(l, max);
    }
    sums_tree(&sums)
}

/// [`exp_sum`] eight terms at a time in two AVX2 registers (sums 0–3 and 4–7):
/// [`exp_sum_avx512`] with a blend for the range mask and an AND for the masked
/// product, the same operations in the same order otherwise.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_sum_avx2(logits: &[f32], max: f64) -> f64 {
    use std::arch::x86_64::*;
    let c = |v: f64| _mm256_set1_pd(v);
    let (log2e, shift) = (c(EXP_LOG2E), c(EXP_SHIFT));
    let (ln2_hi, ln2_lo) = (c(exp_ln2_hi()), c(exp_ln2_lo()));
    let shift_bits = _mm256_set1_epi64x(EXP_SHIFT.to_bits() as i64);
    let bias = _mm256_set1_epi64x(1023);
    let floor = c(-708.0);
    let term = |l: __m128| {
        let x = _mm256_sub_pd(_mm256_cvtps_pd(l), c(max));
        // In range: not NaN (ordered compare) and not below −708.
        let ok = _mm256_cmp_pd::<_CMP_GE_OQ>(x, floor);
        let x = _mm256_blendv_pd(floor, x, ok);
        let shifted = _mm256_add_pd(_mm256_mul_pd(x, log2e), shift);
        let k = _mm256_sub_pd(shifted, shift);
        let r = _mm256_sub_pd(
            _mm256_sub_pd(x, _mm256_mul_pd(k, ln2_hi)),
            _mm256_mul_pd(k, ln2_lo),
        );
        let mut p = c(EXP_TAYLOR[0]);
        for &inv in &EXP_TAYLOR[1..] {
            p = _mm256_add_pd(_mm256_mul_pd(p, r), c(inv));
        }
        let k_int = _mm256_sub_epi64(_mm256_castpd_si256(shifted), shift_bits);
        let scale = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_add_epi64(k_int, bias)));
        _mm256_and_pd(_mm256_mul_pd(p, scale), ok)
    };
    let (mut lo, mut hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let mut chunks = logits.chunks_exact(8);
    for ch in &mut chunks {
        // SAFETY: eight f32.
        let (l_lo, l_hi) = unsafe { (_mm_loadu_ps(ch.as_ptr()), _mm_loadu_ps(ch.as_ptr().add(4))) };
        lo = _mm256_add_pd(lo, term(l_lo));
        hi = _mm256_add_pd(hi, term(l_hi));
    }
    let mut sums = [0f64; 8];
    // SAFETY: four f64 each.
    unsafe {
        _mm256_storeu_pd(sums.as_mut_ptr(), lo);
        _mm256_storeu_pd(sums.as_mut_ptr().add(4), hi);
    }
    for (s, &l) in sums.iter_mut().zip(chunks.remainder()) {
        *s += exp_term(l, max);
    }
    sums_tree(&sums)
}

const EXP_LOG2E: f64 = std::f64::consts::LOG2_E;
/// 1.5·2⁵²: adding and removing it rounds to an integer (exact for |v| < 2⁵¹).
const EXP_SHIFT: f64 = 6_755_399_441_055_744.0;
/// ln 2 split so that k·hi is exact for |k| < 2^11.
fn exp_ln2_hi() -> f64 {
    f64::from_bits(0x3fe6_2e42_fee0_0000)
}
fn exp_ln2_lo() -> f64 {
    f64::from_bits(0x3dea_39ef_3579_3c76)
}
/// 1/n! for n = 13 down to 0: the Horner coefficients of e^r.
const EXP_TAYLOR: [f64; 14] = [
    1.0 / 6_227_020_800.0,
    1.0 / 479_001_600.0,
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// `e^x` for `x <= 0` (NaN or anything below −708 gives 0): Cody–Waite reduction
/// `x = k·ln 2 + r`, `|r| <= ln 2 / 2`, a degree-13 Taylor polynomial for `e^r` (error
/// below 2⁻⁵²), then `2^k` by the exponent bits. Within two ulps of the true value;
/// plain arithmetic only, so it vectorizes and is the same on every CPU.
#[inline(always)]
fn exp_nonpositive(x: f64) -> f64 {
    if x.is_nan() || x < -708.0 {
        return 0.0;
    }
    // Round to nearest by adding and removing 1.5·2⁵²: plain arithmetic, where
    // `f64::round` is a libm call on baseline x86-64.
    let shifted = x * EXP_LOG2E + EXP_SHIFT;
    let k = shifted - EXP_SHIFT;
    let r = (x - k * exp_ln2_hi()) - k * exp_ln2_lo();
    let mut p = EXP_TAYLOR[0];
    for &inv in &EXP_TAYLOR[1..] {
        p = p * r + inv;
    }
    // k is in [-1022, 0]: a normal power of two. `shifted` is 1.5·2⁵² + k with a unit
    // last place, so its bits minus those of 1.5·2⁵² are k.
    let k_int = shifted.to_bits().wrapping_sub(EXP_SHIFT.to_bits());
    p * f64::from_bits(k_int.wrapping_add(1023) << 52)
}

/// The `k` most likely tokens with their log-probabilities under `softmax(logits)`,
/// best first (equal logits: lower id first). Computed in f64; NaN logits are skipped,
/// −∞ logits have log-probability −∞. Empty if there is no distribution (empty row,
/// all NaN or all −∞).
pub fn log_softmax_top(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let Some(lse) = log_sum_exp(logits) else {
        return Vec::new();
    };
    let mut cands: Vec<Candidate> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_nan())
        .map(|(i, &logit)| Candidate {
            id: i as u32,
            logit,
        })
        .collect();
    sort_prefix(&mut cands, k);
    cands.truncate(k);
    cands
        .iter()
        .map(|c| (c.id, (f64::from(c.logit) - lse) as f32))
        .collect()
}

/// Log-probability of token `id` under `softmax(logits)`, computed in f64. `None` when
/// `id` is out of range, its logit is NaN, or there is no distribution.
pub fn log_prob(logits: &[f32], id: u32) -> Option<f32> {
    log_prob_given(logits, id, log_sum_exp(logits))
}

/// [`log_prob`] with the row's [`log_sum_exp`] computed beforehand (`lse` must be
/// `log_sum_exp(logits)`): the same bits.
pub fn log_prob_given(logits: &[f32], id: u32, lse: Option<f64>) -> Option<f32> {
    let logit = *logits.get(id as usize)?;
    if logit.is_nan() {
        return None;
    }
    Some((f64::from(logit) - lse?) as f32)
}

#[cfg(test)]
mod argmax_tests {
    /// The one-pass definition: the first finite logit above every earlier one.
    fn naive(logits: &[f32]) -> Option<u32> {
        let mut best: Option<(usize, f32)> = None;
        for (i, &l) in logits.iter().enumerate() {
            if l.is_finite() && best.is_none_or(|(_, b)| l > b) {
                best = Some((i, l));
            }
        }
        best.map(|(i, _)| i as u32)
    }

    #[test]
    fn two_passes_choose_what_one_pass_does() {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1.0,
            -1.0,
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for case in 0..2000 {
            let n = 1 + case % 70;
            let logits: Vec<f32> = (0..n)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    if state.is_multiple_of(3) {
                        specials[(state >> 8) as usize % specials.len()]
                    } else {
                        ((state >> 40) % 9) as f32 - 4.0
                    }
                })
                .collect();
            assert_eq!(super::argmax(&logits).ok(), naive(&logits), "{logits:?}");
        }
    }

    #[test]
    fn the_candidates_choose_what_the_full_row_does() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for case in 0..2000 {
            let n = 1 + case % 70;
            // Few distinct values (ties everywhere), signed zeros among them.
            let logits: Vec<f32> = (0..n)
                .map(|_| match next() % 7 {
                    0 => -0.0,
                    v => v as f32 - 3.0,
                })
                .collect();
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            // Every entry within one of the maximum, in a scrambled order.
            let mut cands: Vec<(u32, f32)> = (0..n as u32)
                .map(|i| (i, logits[i as usize]))
                .filter(|c| c.1 >= max - 1.0)
                .collect();
            for i in (1..cands.len()).rev() {
                cands.swap(i, next() as usize % (i + 1));
            }
            let want = super::argmax(&logits).unwrap();
            assert_eq!(super::greedy_among(&cands).unwrap(), want, "{logits:?}");
        }
        assert!(super::greedy_among(&[]).is_err());
    }
}

#[cfg(test)]
mod exp_tests {
    #[test]
    #[cfg_attr(miri, ignore = "262 144 polynomial exps take minutes under Miri")]
    fn every_vector_width_sums_the_same_bits() {
        // Logits of a real vocabulary's size with NaNs, −∞ and a tail that is not a
        // multiple of eight.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let logits: Vec<f32> = (0..262_147)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                match i % 1000 {
                    7 => f32::NAN,
                    8 => f32::NEG_INFINITY,
                    _ => (state >> 40) as f32 / (1u64 << 24) as f32 * 40.0 - 30.0,
                }
            })
            .collect();
        let max = 10.0f64;
        let want = super::exp_sum_portable(&logits, max);
        assert!(want.is_finite() && want > 0.0);
        assert_eq!(super::exp_sum(&logits, max).to_bits(), want.to_bits());
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: checked just above.
                let v = unsafe { super::exp_sum_avx512(&logits, max) };
                assert_eq!(v.to_bits(), want.to_bits());
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: checked just above.
                let v = unsafe { super::exp_sum_avx2(&logits, max) };
                assert_eq!(v.to_bits(), want.to_bits(), "AVX2");
            }
        }
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri perturbs f64::exp by design (float non-determinism), so a two-ulp \
                  comparison with it proves nothing there; 52 000 points take minutes"
    )]
    fn the_polynomial_exp_is_within_two_ulps_of_libm() {
        let mut worst = 0u64;
        let mut x = 0.0f64;
        while x > -708.0 {
            let (a, b) = (super::exp_nonpositive(x), x.exp());
            worst = worst.max(a.to_bits().abs_diff(b.to_bits()));
            x -= 0.013_7;
        }
        assert!(worst <= 2, "{worst} ulps");
        assert_eq!(super::exp_nonpositive(0.0), 1.0);
        assert_eq!(super::exp_nonpositive(-800.0), 0.0);
        assert_eq!(super::exp_nonpositive(f64::NEG_INFINITY), 0.0);
        assert_eq!(super::exp_nonpositive(f64::NAN), 0.0);
    }
}
