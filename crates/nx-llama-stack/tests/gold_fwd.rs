//! GOLD-FWD: nx against llama.cpp's recorded answers on the synthetic fixtures
//! (`cargo xtask synth`, `cargo xtask golden forward`).

mod common;

use common::*;
use nx_llama_stack::Model;

fn check_fixture(name: &str) -> Tally {
    let golden = load_golden(&format!("forward-{name}.json"));
    let prompts = ref_prompts(&golden);
    let path = synth_model(name);
    let model = Model::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask synth`)", path.display()));
    let tally = compare_model(&model, &prompts, 32);
    println!("{}", tally.report(&format!("GOLD-FWD {name}")));
    for m in tally
        .top1_mismatches
        .iter()
        .chain(&tally.logprob_violations)
        .chain(&tally.free_running_mismatches)
        .take(10)
    {
        println!("  {m}");
    }
    tally
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn gold_fwd_synthetic_fixtures() {
    let mut failed = Vec::new();
    for name in ["qwen2-tiny", "llama-tiny", "qwen3-tiny"] {
        let t = check_fixture(name);
        if !t.passed() {
            failed.push(name);
        }
    }
    assert!(failed.is_empty(), "GOLD-FWD failed for {failed:?}");
}
