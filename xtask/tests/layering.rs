//! Layering: workspace crates depend only on crates strictly below them in the fixed order.
//!
//! The order (lowest first) is the project's architecture; `xtask` and `nx-benches` may
//! depend on anything. Normal, dev and build dependencies all count.

use serde_json::Value;
use std::collections::BTreeSet;

/// Lowest first: a crate may depend only on crates earlier in this list.
const ORDER: &[&str] = &[
    "nx-syscalls",
    "nx-gguf",
    "nx-f32",
    "nx-lazy-weight",
    "nx-kv-cache",
    "nx-bpe",
    "nx-llama-block",
    "nx-llama-stack",
    "nx-sampler",
    "nx-run",
    "nx-serve",
    "nx-cli",
    "nx-fuzz",
    "xtask",
];

/// Workspace crates outside the order that may depend on anything (nothing may depend on
/// them).
const UNRESTRICTED: &[&str] = &["xtask", "nx-benches"];

fn metadata() -> Value {
    xtask::util::cargo_metadata().expect("cargo metadata")
}

/// Names of the workspace's packages (`packages` of `cargo metadata --no-deps`).
fn workspace_crates(meta: &Value) -> BTreeSet<String> {
    meta["packages"]
        .as_array()
        .expect("packages array")
        .iter()
        .map(|p| p["name"].as_str().expect("package name").to_string())
        .collect()
}

fn rank(name: &str) -> Option<usize> {
    ORDER.iter().position(|n| *n == name)
}

/// Every dependency edge between workspace crates that breaks the order, as
/// `"from -> to (kind)"`.
fn layering_violations(meta: &Value) -> Vec<String> {
    let members = workspace_crates(meta);
    let mut violations = Vec::new();
    for package in meta["packages"].as_array().expect("packages array") {
        let from = package["name"].as_str().expect("package name");
        if UNRESTRICTED.contains(&from) {
            continue;
        }
        for dep in package["dependencies"]
            .as_array()
            .expect("dependencies array")
        {
            let to = dep["name"].as_str().expect("dependency name");
            if !members.contains(to) {
                continue; // an external crate
            }
            let kind = dep["kind"].as_str().unwrap_or("normal");
            let allowed = match (rank(from), rank(to)) {
                (Some(from_rank), Some(to_rank)) => to_rank < from_rank,
                // A crate outside the order (and not unrestricted) must be placed first;
                // the other test says so. Depending on one is never allowed.
                _ => false,
            };
            if !allowed {
                violations.push(format!("{from} -> {to} ({kind} dependency)"));
            }
        }
    }
    violations
}

#[test]
fn workspace_dependencies_point_strictly_down() {
    let violations = layering_violations(&metadata());
    assert!(
        violations.is_empty(),
        "dependencies that break the layering order {ORDER:?}:\n  {}",
        violations.join("\n  ")
    );
}

#[test]
fn every_workspace_crate_is_placed_in_the_order() {
    let members = workspace_crates(&metadata());
    let placed: BTreeSet<String> = ORDER
        .iter()
        .chain(UNRESTRICTED)
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        ORDER.len() + UNRESTRICTED.iter().filter(|n| rank(n).is_none()).count(),
        placed.len(),
        "a crate appears twice in ORDER"
    );
    let unplaced: Vec<_> = members.difference(&placed).collect();
    let stale: Vec<_> = placed.difference(&members).collect();
    assert!(
        unplaced.is_empty() && stale.is_empty(),
        "crates in the workspace but not in the layering order: {unplaced:?}; \
         in the order but not in the workspace: {stale:?}"
    );
}

/// `(dependency, kind)`; kind `None` is a normal dependency.
type Dep<'a> = (&'a str, Option<&'a str>);

/// A minimal `cargo metadata` document: `(crate, [(dependency, kind)])`.
fn synthetic(packages: &[(&str, &[Dep<'_>])]) -> Value {
    let packages: Vec<Value> = packages
        .iter()
        .map(|(name, deps)| {
            let deps: Vec<Value> = deps
                .iter()
                .map(|(dep, kind)| serde_json::json!({ "name": dep, "kind": kind }))
                .collect();
            serde_json::json!({ "name": name, "dependencies": deps })
        })
        .collect();
    serde_json::json!({ "packages": packages })
}

#[test]
fn checker_names_upward_sideways_and_dev_edges() {
    let meta = synthetic(&[
        ("nx-syscalls", &[("libc", None)]),
        ("nx-gguf", &[("nx-syscalls", None), ("nx-f32", Some("dev"))]),
        (
            "nx-f32",
            &[("nx-syscalls", None), ("nx-f32", Some("build"))],
        ),
        ("nx-cli", &[("nx-gguf", None), ("nx-benches", None)]),
        ("nx-benches", &[("nx-cli", Some("dev"))]),
        ("xtask", &[("nx-cli", None)]),
    ]);
    assert_eq!(
        layering_violations(&meta),
        [
            "nx-gguf -> nx-f32 (dev dependency)",
            "nx-f32 -> nx-f32 (build dependency)",
            "nx-cli -> nx-benches (normal dependency)",
        ]
    );
}

#[test]
fn checker_accepts_a_clean_stack() {
    let meta = synthetic(&[
        ("nx-syscalls", &[]),
        ("nx-gguf", &[("nx-syscalls", None), ("thiserror", None)]),
        ("nx-run", &[("nx-gguf", None), ("nx-syscalls", Some("dev"))]),
    ]);
    assert!(layering_violations(&meta).is_empty());
}
