//! GOLD-FWD: nx against llama.cpp's recorded answers on the synthetic fixtures
//! (`cargo xtask synth`, `cargo xtask golden forward`).

mod common;

use common::*;

fn check_fixture(name: &str) -> Tally {
    check_golden("GOLD-FWD", name, &synth_model(name), "cargo xtask synth")
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn gold_fwd_synthetic_fixtures() {
    let mut failed = Vec::new();
    for name in SYNTH_FIXTURES {
        let t = check_fixture(name);
        if !t.passed() {
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "GOLD-FWD failed for {failed:?}");
}
