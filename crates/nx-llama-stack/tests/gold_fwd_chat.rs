//! GOLD-FWD-CHAT: nx against llama.cpp's recorded answers on the default chat model,
//! SmolLM2-135M-Instruct Q4_1 (`cargo xtask fetch`, `cargo xtask golden forward`): a real
//! published file in Q4_1 (with a Q8_0 embedding), the `llama` architecture and the
//! `smollm` byte-level BPE, on the tiny fixtures' nine prompts, 32 greedy tokens each.

mod common;

use common::*;

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn gold_fwd_chat() {
    let tally = check_golden(
        "GOLD-FWD-CHAT",
        "smollm2-135m-q4_1",
        &cache_dir().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        "cargo xtask fetch",
    );
    assert!(tally.passed(), "GOLD-FWD-CHAT failed");
}
