//! nx's activation quantizers and dot kernels against the reference engine's own, bit
//! for bit, on every tier this CPU runs.
//!
//! `fixtures/dot/TYPE.json` (written by `cargo xtask golden dot`) holds weight rows, f32
//! activations, the activations as llama.cpp's CPU backend quantizes them for that
//! weight type (`from_float` of its `vec_dot_type`: the x86 Q8_0/Q8_1 quantizers, the
//! reference Q8_K one) and the f32 its `vec_dot` returns. Here:
//! 1. nx's matmul activation quantizer must give the same bytes;
//! 2. every tier's kernel on the reference's quantized activations must give the same
//!    f32 bits.

mod common;

use std::path::PathBuf;

use common::{hex_bytes, type_by_name};
use nx_lazy_weight::{dot_kernel_for, supported_tiers, QuantizedActs};
use serde_json::Value;

#[test]
fn quantizers_and_kernels_match_the_reference_engine() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/dot");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask golden dot`)", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    names.sort();
    assert!(names.len() >= 12, "expected a fixture per weight type");
    let tiers = supported_tiers();
    let mut failures = Vec::new();
    for path in &names {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let ty = type_by_name(doc["type"].as_str().unwrap());
        let act_type = type_by_name(doc["act_type"].as_str().unwrap());
        let cases = doc["cases"].as_array().unwrap();
        let (mut quant_ok, mut exact, mut worst_rel) = (0, 0, 0f64);
        for (i, case) in cases.iter().enumerate() {
            let row_len = case["row_len"].as_u64().unwrap() as usize;
            let w = hex_bytes(case["weights_hex"].as_str().unwrap());
            let acts: Vec<f32> = hex_bytes(case["acts_f32_le_hex"].as_str().unwrap())
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let reference_xq = hex_bytes(case["acts_quantized_hex"].as_str().unwrap());
            let reference_dot = f32::from_bits(
                u32::from_str_radix(case["dot_f32_bits"].as_str().unwrap(), 16).unwrap(),
            );
            let mut xq = QuantizedActs::new();
            xq.quantize(act_type, &acts, 1, row_len).unwrap();
            if xq.get_row(0).unwrap() == reference_xq.as_slice() {
                quant_ok += 1;
            } else {
                failures.push(format!(
                    "{ty} case {i}: {act_type} activations differ from the reference's"
                ));
            }
            let mut all_exact = true;
            for &tier in &tiers {
                let kernel = dot_kernel_for(tier, ty).unwrap();
                let got = kernel(&w, &reference_xq);
                if got.to_bits() != reference_dot.to_bits() {
                    all_exact = false;
                    let rel = ((got - reference_dot) as f64).abs()
                        / (reference_dot.abs() as f64).max(1e-30);
                    worst_rel = worst_rel.max(rel);
                    failures.push(format!(
                        "{ty} case {i} ({}, K={row_len}) on {tier}: {got:e} ({:08x}), llama.cpp {reference_dot:e} ({:08x})",
                        case["weights"].as_str().unwrap(),
                        got.to_bits(),
                        reference_dot.to_bits()
                    ));
                }
            }
            if all_exact {
                exact += 1;
            }
        }
        println!(
            "{:>6} × {act_type}: quantized activations equal in {quant_ok}/{n}, dot bit-exact on {} tier(s) in {exact}/{n}{}",
            ty.name(),
            tiers.len(),
            if worst_rel > 0.0 { format!(" (worst relative difference {worst_rel:.1e})") } else { String::new() },
            n = cases.len()
        );
    }
    assert!(
        failures.is_empty(),
        "{} differences:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
