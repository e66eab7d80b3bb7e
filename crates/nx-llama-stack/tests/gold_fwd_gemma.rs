//! GOLD-FWD-GEMMA: nx against llama.cpp's recorded answers on the default model, Gemma 3
//! 270M Q4_K_M (`cargo xtask fetch`, `cargo xtask golden forward`): 12 prompts of prose,
//! code, numbers and four other languages, 48 greedy tokens each, one prompt longer than
//! the 512-token sliding window.

mod common;

use common::*;

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn gold_fwd_gemma() {
    let tally = check_golden(
        "GOLD-FWD-GEMMA",
        "gemma3-270m",
        &default_model(),
        "cargo xtask fetch",
    );
    assert!(tally.passed(), "GOLD-FWD-GEMMA failed");
}
