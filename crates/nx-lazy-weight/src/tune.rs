//! Kernel tuning: times every eligible candidate of the kernel plan on a model's own
//! weights and keeps the fastest per format and role.
//!
//! Apart from [`crate::plan`] so that the plan (data, rules, the active plan) does not
//! depend on the matmuls that read it; only this module runs them to time a choice.

use std::time::Instant;

use nx_gguf::GgmlType;
use nx_syscalls::ThreadPool;

use crate::lazy::LazyWeight;
use crate::matmul::{matmul_quantized_pool_with, QuantizedActs};
use crate::plan::{decode_candidates, prefill_candidates, FormatPlan, KernelPlan, Role};
use crate::tier::active_tier;
use crate::LazyWeightError;

/// One timed candidate of [`tune`].
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// The weight format.
    pub format: GgmlType,
    /// Decode or prefill.
    pub role: Role,
    /// The kernel's name.
    pub kernel: String,
    /// Best of the timed passes, in seconds.
    pub seconds: f64,
    /// Weight bytes one pass reads.
    pub bytes: usize,
    /// Tokens per pass.
    pub tokens: usize,
}

/// The result of [`tune`]: the plan and what was measured.
#[derive(Debug, Clone)]
pub struct Tuned {
    /// The fastest candidates (the default where nothing beat it clearly).
    pub plan: KernelPlan,
    /// Every candidate timed.
    pub timings: Vec<Timing>,
    /// Wall time of the whole tuning, in seconds.
    pub seconds: f64,
}

/// Most weight bytes a decode candidate streams per pass: enough to leave the caches
/// on most CPUs for the large matrices, bounded so tuning stays short.
const TUNE_DECODE_BYTES: usize = 96 << 20;
/// Weight rows and tokens of a prefill candidate's pass.
const TUNE_PREFILL_ROWS: usize = 128;
const TUNE_PREFILL_TOKENS: usize = 256;
/// Timed passes per candidate (after one untimed warm-up), taken round-robin across the
/// candidates; the best counts.
const TUNE_PASSES: usize = 3;
/// A candidate replaces the default only when it is at least this much faster, so noise
/// does not flip choices between runs.
const TUNE_MARGIN: f64 = 0.03;

/// Times every eligible candidate of every format among `weights` on `pool` and returns
/// the fastest per format and role. For each format the largest of its weights is used:
/// decode streams up to `TUNE_DECODE_BYTES` of its rows, prefill multiplies 256 tokens (a
/// prefill chunk) by 128 of its rows. Reads the weights' bytes (touching those pages).
pub fn tune(weights: &[LazyWeight<'_>], pool: &ThreadPool) -> Result<Tuned, LazyWeightError> {
    let start = Instant::now();
    let tier = active_tier()?;
    let mut plan = KernelPlan::default_rules(tier);
    let mut timings = Vec::new();
    let mut formats: Vec<GgmlType> = weights.iter().map(|w| w.ggml_type()).collect();
    formats.sort();
    formats.dedup();
    for ty in formats {
        let Some(w) = weights
            .iter()
            .filter(|w| w.ggml_type() == ty)
            .max_by_key(|w| w.bytes().len())
        else {
            continue;
        };
        let decode_rows = (TUNE_DECODE_BYTES / w.row_bytes().max(1)).clamp(1, w.n_rows());
        let dw = w.row_range(0..decode_rows)?;
        let pw = w.row_range(0..TUNE_PREFILL_ROWS.min(w.n_rows()))?;
        let mut best = plan.get(ty);
        let default = best;
        let decode = time_round_robin(
            decode_candidates(tier, ty),
            |k| FormatPlan {
                decode: k,
                ..default
            },
            (&plan, ty, &dw, 1),
            pool,
        )?;
        best.decode = fastest(&decode, default.decode);
        let prefill = time_round_robin(
            prefill_candidates(tier, ty),
            |k| FormatPlan {
                prefill: k,
                ..default
            },
            (&plan, ty, &pw, TUNE_PREFILL_TOKENS),
            pool,
        )?;
        best.prefill = fastest(&prefill, default.prefill);
        timings.extend(decode.into_iter().map(|(_, t)| t));
        timings.extend(prefill.into_iter().map(|(_, t)| t));
        plan.set(ty, best)?;
    }
    Ok(Tuned {
        plan,
        timings,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The fastest of `timed`, keeping `default` unless another is [`TUNE_MARGIN`] faster.
fn fastest<K: Copy + PartialEq>(timed: &[(K, Timing)], default: K) -> K {
    let default_secs = timed
        .iter()
        .find(|(k, _)| *k == default)
        .map(|(_, t)| t.seconds);
    let Some((k, t)) = timed
        .iter()
        .min_by(|a, b| a.1.seconds.total_cmp(&b.1.seconds))
    else {
        return default;
    };
    match default_secs {
        Some(d) if t.seconds > d * (1.0 - TUNE_MARGIN) => default,
        _ => *k,
    }
}

/// Times `kernels` (each set by `with` on top of the format's default) on `w` times `n`
/// tokens: every candidate is prepared first, then the passes go round-robin (one pass
/// of each candidate in turn, [`TUNE_PASSES`] rounds after an untimed one) and each
/// keeps its best. Timed one after another, a burst of other work on the machine lands
/// on one candidate and can crown a slower kernel for good (the plan is cached);
/// interleaved, such a burst costs every candidate alike.
fn time_round_robin<K: Copy>(
    kernels: Vec<K>,
    with: impl Fn(K) -> FormatPlan,
    (base, ty, w, n): (&KernelPlan, GgmlType, &LazyWeight<'_>, usize),
    pool: &ThreadPool,
) -> Result<Vec<(K, Timing)>, LazyWeightError> {
    let mut prepared = kernels
        .into_iter()
        .map(|k| Prepared::new(base, ty, with(k), w, n, pool).map(|p| (k, p)))
        .collect::<Result<Vec<_>, _>>()?;
    for round in 0..=TUNE_PASSES {
        for (_, p) in prepared.iter_mut() {
            let secs = p.pass(w, pool)?;
            if round > 0 {
                p.best = p.best.min(secs);
            }
        }
    }
    Ok(prepared
        .into_iter()
        .map(|(k, p)| {
            let role = if n == 1 { Role::Decode } else { Role::Prefill };
            let timing = Timing {
                format: ty,
                role,
                kernel: match role {
                    Role::Decode => p.candidate.decode.name(),
                    Role::Prefill => p.candidate.prefill.name(),
                },
                seconds: p.best,
                bytes: w.bytes().len(),
                tokens: n,
            };
            (k, timing)
        })
        .collect())
}

/// One candidate of [`time_round_robin`], ready to time: `ty`'s kernels set to
/// `candidate` on top of the base plan, activations quantized under that plan.
struct Prepared {
    candidate: FormatPlan,
    plan: KernelPlan,
    xq: QuantizedActs,
    y: Vec<f32>,
    /// Best pass so far, in seconds.
    best: f64,
}

impl Prepared {
    fn new(
        base: &KernelPlan,
        ty: GgmlType,
        candidate: FormatPlan,
        w: &LazyWeight<'_>,
        n: usize,
        pool: &ThreadPool,
    ) -> Result<Prepared, LazyWeightError> {
        let mut plan = base.clone();
        plan.set(ty, candidate)?;
        // Activations of unit size with a little variation: the kernels' speed does not
        // depend on the values.
        let x: Vec<f32> = (0..n * w.row_len())
            .map(|i| ((i * 7919) % 257) as f32 / 128.0 - 1.0)
            .collect();
        let mut xq = QuantizedActs::new();
        xq.quantize_with_plan(&plan, w.vec_dot_type(), &x, n, w.row_len(), Some(pool))?;
        Ok(Prepared {
            candidate,
            plan,
            xq,
            y: vec![0f32; n * w.n_rows()],
            best: f64::INFINITY,
        })
    }

    /// One timed matmul, in seconds.
    fn pass(&mut self, w: &LazyWeight<'_>, pool: &ThreadPool) -> Result<f64, LazyWeightError> {
        let t0 = Instant::now();
        matmul_quantized_pool_with(&self.plan, w, &self.xq, &mut self.y, pool)?;
        Ok(t0.elapsed().as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fastest_keeps_the_default_within_the_margin() {
        let t = |s: f64| Timing {
            format: GgmlType::Q8_0,
            role: Role::Decode,
            kernel: String::new(),
            seconds: s,
            bytes: 0,
            tokens: 1,
        };
        assert_eq!(fastest(&[(1, t(1.0)), (2, t(0.99))], 1), 1);
        assert_eq!(fastest(&[(1, t(1.0)), (2, t(0.9))], 1), 2);
        assert_eq!(fastest(&[(1, t(1.0)), (2, t(1.5))], 1), 1);
    }

    #[test]
    fn every_candidate_is_timed_once_and_the_choice_is_one_of_them() {
        let tier = active_tier().unwrap();
        let (ty, row_len, n_rows) = (GgmlType::Q8_0, 256, 160);
        let rb = crate::row_bytes(ty, row_len).unwrap();
        let mut bytes = vec![0u8; rb * n_rows];
        for (r, row) in bytes.chunks_exact_mut(rb).enumerate() {
            let x: Vec<f32> = (0..row_len)
                .map(|i| ((r * 31 + i) % 17) as f32 - 8.0)
                .collect();
            crate::quant::quantize_row(ty, &x, row).unwrap();
        }
        let w = LazyWeight::from_parts(ty, &[row_len as u64, n_rows as u64], &bytes).unwrap();
        let tuned = tune(&[w], &ThreadPool::new(2)).unwrap();
        let named = |role: Role| -> Vec<String> {
            tuned
                .timings
                .iter()
                .filter(|t| t.role == role)
                .inspect(|t| assert!(t.seconds.is_finite() && t.seconds > 0.0, "{t:?}"))
                .map(|t| t.kernel.clone())
                .collect()
        };
        let decode: Vec<String> = decode_candidates(tier, ty)
            .iter()
            .map(|k| k.name())
            .collect();
        let prefill: Vec<String> = prefill_candidates(tier, ty)
            .iter()
            .map(|k| k.name())
            .collect();
        assert_eq!(named(Role::Decode), decode);
        assert_eq!(named(Role::Prefill), prefill);
        let chosen = tuned.plan.get(ty);
        assert!(decode.contains(&chosen.decode.name()));
        assert!(prefill.contains(&chosen.prefill.name()));
    }
}
