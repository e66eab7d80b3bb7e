//! The named-gate table points at real, ignored integration-test targets.

use serde_json::Value;
use xtask::gates::{GATES, IGNORE_REASON};

fn test_target<'m>(meta: &'m Value, package: &str, test: &str) -> Option<&'m Value> {
    let package = meta["packages"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == package)?;
    package["targets"].as_array()?.iter().find(|t| {
        t["name"] == test
            && t["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "test"))
    })
}

#[test]
fn every_gate_names_a_test_target() {
    let meta = xtask::util::cargo_metadata().expect("cargo metadata");
    for gate in GATES {
        let target = test_target(&meta, gate.package, gate.test).unwrap_or_else(|| {
            panic!(
                "gate {} names `-p {} --test {}`, which is not a test target",
                gate.name, gate.package, gate.test
            )
        });
        let src_path = target["src_path"].as_str().expect("src_path");
        let source = std::fs::read_to_string(src_path).expect("read gate test source");
        // A gate either needs fetched files (its tests are ignored with the gate reason, so
        // plain `cargo test` does not need them) or needs nothing and runs everywhere.
        let marker = format!("#[ignore = \"{IGNORE_REASON}\"]");
        let has_tests = source.contains("#[test]") || source.contains("proptest!");
        assert!(has_tests, "gate {}: {src_path} holds no test", gate.name);
        if source.contains("#[ignore") {
            assert!(
                source.contains(&marker),
                "gate {}: {src_path} ignores tests without the gate reason {marker}",
                gate.name
            );
        }
    }
}
