//! The kernel plan of an opened model on this machine: timed once, then read from
//! `$NX_CACHE/plans/`.
//!
//! The cache key is the CPU model, nx's version and kernels revision, the kernel tier,
//! whether AMX may run, the thread count and the model's matrix shapes, so a plan is
//! never reused where its timings do not hold. `NX_PLAN` (see `nx_lazy_weight::plan`)
//! forces choices on top of it; `NX_PLAN=default` skips timing, `NX_PLAN=retune` times
//! again and rewrites the cache. A plan only picks among bit-identical kernels: it changes speed, never output.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use nx_lazy_weight::plan;
use nx_lazy_weight::tune::{self, Timing};
use nx_lazy_weight::{GgmlType, KernelPlan, LazyWeight};
use nx_llama_stack::Model;

/// Where the plan in force came from.
#[derive(Debug, Clone)]
pub enum PlanSource {
    /// `NX_PLAN=default…`: the default rules, no timing.
    Defaults,
    /// Read from the cache file.
    Cached(PathBuf),
    /// Timed now (and written to the cache file when it could be).
    Tuned {
        path: PathBuf,
        seconds: f64,
        timings: Vec<Timing>,
    },
}

/// The plan installed for a model, and how it was made.
#[derive(Debug, Clone)]
pub struct PlanReport {
    pub plan: KernelPlan,
    pub source: PlanSource,
    /// The model's matrix formats, in file order of first use.
    pub formats: Vec<GgmlType>,
}

/// The CPU's model name (or the architecture where the system does not say).
pub fn cpu_model() -> String {
    nx_syscalls::cpu_model().unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// FNV-1a, 64 bits: a stable file name for the cache key.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The cache key of `model` on this machine, as readable text.
fn cache_key(model: &Model, weights: &[LazyWeight<'_>], tier: nx_lazy_weight::CpuTier) -> String {
    let mut key = format!(
        "cpu: {}\nnx: {} (kernels revision {})\ntier: {tier}\namx: {}\nthreads: {}\n",
        cpu_model(),
        env!("CARGO_PKG_VERSION"),
        plan::KERNELS_REVISION,
        std::env::var("NX_AMX").unwrap_or_default(),
        model.threads()
    );
    let mut shapes: Vec<(GgmlType, usize, usize)> = weights
        .iter()
        .map(|w| (w.ggml_type(), w.row_len(), w.n_rows()))
        .collect();
    shapes.sort();
    shapes.dedup();
    for (t, k, n) in shapes {
        let _ = writeln!(key, "shape: {t} {k}x{n}");
    }
    // The candidates timed: a build with a new kernel (same version number) times again
    // rather than reading a plan that never saw it.
    let mut formats: Vec<GgmlType> = weights.iter().map(|w| w.ggml_type()).collect();
    formats.sort();
    formats.dedup();
    for t in formats {
        let decode: Vec<String> = plan::decode_candidates(tier, t)
            .into_iter()
            .map(|k| k.name())
            .collect();
        let prefill: Vec<String> = plan::prefill_candidates(tier, t)
            .into_iter()
            .map(|k| k.name())
            .collect();
        let _ = writeln!(
            key,
            "kernels: {t} decode {} prefill {}",
            decode.join(" "),
            prefill.join(" ")
        );
    }
    key
}

/// Makes the kernel plan for `model` and installs it for the process. Plans of models
/// opened earlier (a draft model) keep their formats' choices.
pub fn prepare(model: &Model) -> Result<PlanReport> {
    let tier = nx_lazy_weight::active_tier()?;
    let spec = std::env::var("NX_PLAN").unwrap_or_default();
    let (retune, spec) = match spec.trim().strip_prefix("retune") {
        Some(rest) => (true, rest.trim_start_matches(',').to_string()),
        None => (false, spec),
    };
    // Listed once: every tensor of the file is looked at to make it.
    let weights = model.matmul_weights();
    let mut formats: Vec<GgmlType> = Vec::new();
    for w in &weights {
        if !formats.contains(&w.ggml_type()) {
            formats.push(w.ggml_type());
        }
    }
    let mut probe = KernelPlan::default_rules(tier);
    if probe.apply_spec(&spec)? {
        plan::install(probe.clone())?;
        return Ok(PlanReport {
            plan: probe,
            source: PlanSource::Defaults,
            formats,
        });
    }
    let key = cache_key(model, &weights, tier);
    let path = crate::models::cache_dir()
        .join("plans")
        .join(format!("{:016x}.plan", fnv1a(&key)));
    let cached = if retune {
        None
    } else {
        read_cached(&path, tier)
    };
    let (mut tuned, source) = match cached {
        Some(plan) => (plan, PlanSource::Cached(path)),
        None => {
            let t = tune::tune(&weights, model.pool())?;
            if let Err(e) = write_cached(&path, &key, &t.plan) {
                eprintln!(
                    "nx: could not cache the kernel plan in {}: {e:#}",
                    path.display()
                );
            }
            let source = PlanSource::Tuned {
                path,
                seconds: t.seconds,
                timings: t.timings,
            };
            (t.plan, source)
        }
    };
    tuned.apply_spec(&spec)?;
    let plan = merged_with_active(tuned)?;
    plan::install(plan.clone())?;
    Ok(PlanReport {
        plan,
        source,
        formats,
    })
}

/// `new` on top of the plan already in force: formats it chose keep their choices.
fn merged_with_active(new: KernelPlan) -> Result<KernelPlan> {
    let active = nx_lazy_weight::active_plan()?;
    let mut merged = (*active).clone();
    if merged.chosen().is_empty() {
        return Ok(new);
    }
    for &(ty, fp) in new.chosen() {
        if !merged.chosen().iter().any(|(t, _)| *t == ty) {
            merged.set(ty, fp)?;
        }
    }
    Ok(merged)
}

/// The cached plan at `path`, when it exists and applies here.
fn read_cached(path: &std::path::Path, tier: nx_lazy_weight::CpuTier) -> Option<KernelPlan> {
    let text = std::fs::read_to_string(path).ok()?;
    let spec = text.lines().find(|l| !l.starts_with('#'))?;
    let mut plan = KernelPlan::default_rules(tier);
    plan.apply_spec(spec).ok()?;
    Some(plan)
}

/// Writes `plan` to `path` (the key as comments), atomically.
fn write_cached(path: &std::path::Path, key: &str, plan: &KernelPlan) -> Result<()> {
    let dir = path.parent().context("cache path has no folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
    let mut text =
        String::from("# nx kernel plan (NX_PLAN syntax); remove the file to time again\n");
    for line in key.lines() {
        let _ = writeln!(text, "# {line}");
    }
    let _ = writeln!(text, "{}", plan.to_spec());
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).with_context(|| format!("{}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("{}", path.display()))?;
    Ok(())
}

/// The plan as `nx bench --show-plan` prints it: one line per format of the model, then
/// the timings when it was timed now.
pub fn describe(report: &PlanReport) -> String {
    let mut out = String::new();
    let source = match &report.source {
        PlanSource::Defaults => "default rules (NX_PLAN=default)".to_string(),
        PlanSource::Cached(p) => format!("cached in {}", p.display()),
        PlanSource::Tuned { path, seconds, .. } => {
            format!(
                "timed in {:.0} ms, cached in {}",
                seconds * 1e3,
                path.display()
            )
        }
    };
    let _ = writeln!(
        out,
        "kernel plan ({}, tier {}): {source}",
        cpu_model(),
        report.plan.tier()
    );
    for &ty in &report.formats {
        let p = report.plan.get(ty);
        let _ = writeln!(
            out,
            "  {:<8} decode {:<14} prefill {}",
            ty.name(),
            p.decode.name(),
            p.prefill.name()
        );
    }
    if let PlanSource::Tuned { timings, .. } = &report.source {
        let _ = writeln!(out, "  timings (best of 3):");
        for t in timings {
            let rate = match t.role {
                plan::Role::Decode => format!("{:.1} GB/s", t.bytes as f64 / t.seconds / 1e9),
                plan::Role::Prefill => {
                    format!(
                        "{:.1} GB·tok/s",
                        (t.bytes * t.tokens) as f64 / t.seconds / 1e9
                    )
                }
            };
            let _ = writeln!(
                out,
                "    {:<8} {:<7} {:<14} {:>9.3} ms  {rate}",
                t.format.name(),
                t.role.name(),
                t.kernel,
                t.seconds * 1e3
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_is_stable() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
