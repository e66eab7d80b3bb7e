//! The marked sections of `docs/benchmarks.md` that other commands own, so that each
//! command rewrites its own and keeps the others': the loadtest's, `--spec`'s (one per
//! tier) and the tiers a bench run may be pinned to.

use anyhow::{Context, Result};

/// Markers around `cargo xtask loadtest --write`'s section.
pub const LOADTEST_BEGIN: &str =
    "<!-- loadtest:begin (written by `cargo xtask loadtest --write`) -->";
pub const LOADTEST_END: &str = "<!-- loadtest:end -->";
/// Markers around `cargo xtask loadtest --sampled --write`'s section.
pub const LOADTEST_SAMPLED_BEGIN: &str =
    "<!-- loadtest-sampled:begin (written by `cargo xtask loadtest --sampled --write`) -->";
pub const LOADTEST_SAMPLED_END: &str = "<!-- loadtest-sampled:end -->";

/// The markers of the greedy loadtest's section, or of the sampled one's.
pub fn loadtest_markers(sampled: bool) -> (&'static str, &'static str) {
    if sampled {
        (LOADTEST_SAMPLED_BEGIN, LOADTEST_SAMPLED_END)
    } else {
        (LOADTEST_BEGIN, LOADTEST_END)
    }
}

/// The (greedy) loadtest section of `doc` (markers included, and its trailing newline),
/// if any.
pub fn loadtest_section(doc: &str) -> Option<&str> {
    crate::util::doc_section(doc, LOADTEST_BEGIN, LOADTEST_END)
}

/// `doc` with its loadtest section (the sampled one if `sampled`) replaced by `section`,
/// or `section` appended.
pub fn with_loadtest_section(doc: &str, section: &str, sampled: bool) -> String {
    let (begin, end) = loadtest_markers(sampled);
    crate::util::replace_doc_section(doc, begin, end, section)
}

/// Markers around `cargo xtask bench --spec`'s section (its native-tier one).
pub const SPEC_BEGIN: &str = "<!-- spec:begin (written by `cargo xtask bench --spec`) -->";
pub const SPEC_END: &str = "<!-- spec:end -->";

/// The lower tiers a run may be pinned to with `NX_TIER` (each gets its own section).
pub const PINNED_TIERS: [&str; 2] = ["avx2", "scalar"];

/// The `--spec` section markers of a run with `NX_TIER` = `tier` (`None`: the CPU's best tier).
pub fn spec_markers(tier: Option<&str>) -> (String, String) {
    match tier {
        None => (SPEC_BEGIN.to_string(), SPEC_END.to_string()),
        Some(t) => (
            format!("<!-- spec-{t}:begin (written by `NX_TIER={t} NX_AMX=0 cargo xtask bench --spec`) -->"),
            format!("<!-- spec-{t}:end -->"),
        ),
    }
}

/// The `NX_TIER` this run is pinned to, if one of [`PINNED_TIERS`].
pub(crate) fn pinned_tier() -> Result<Option<&'static str>> {
    match std::env::var("NX_TIER") {
        Err(_) => Ok(None),
        Ok(t) if t.is_empty() || t == "native" => Ok(None),
        Ok(t) => PINNED_TIERS
            .iter()
            .find(|&&p| p == t)
            .map(|&p| Some(p))
            .with_context(|| format!("NX_TIER={t}: the bench pins only {PINNED_TIERS:?}")),
    }
}
