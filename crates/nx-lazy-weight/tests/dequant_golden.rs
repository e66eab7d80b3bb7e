//! Bit-exact dequantization against fixtures made by an independent oracle.
//!
//! `fixtures/dequant/*.json` were written by `xtask/scripts/dequant_golden.py` with the
//! Python `gguf` package (`gguf.quants.dequantize`, 0.19.0): the first and last rows
//! of one tensor of each type in the default model, plus synthetic random blocks of
//! every supported type. Raw bytes are in the JSON, so neither Python nor the model is
//! needed here. Regenerate with `cargo xtask golden dequant`.
//!
//! `q8_0_quantize.json` holds random rows quantized by `gguf.quants.quantize(.., Q8_0)`,
//! which mirrors ggml's `quantize_row_q8_0_ref`; our activation quantizer must produce
//! the same bytes. `q4_1_quantize.json` and `q5_1_quantize.json` do the same for the
//! Q4_1 and Q5_1 weight quantizers (ggml's `quantize_row_q4_1_ref` / `q5_1_ref`, what
//! `llama-quantize` runs for those types without an importance matrix), and
//! `mxfp4_quantize.json`, `tq2_0_quantize.json` and `tq1_0_quantize.json` for the
//! MXFP4, TQ2_0 and TQ1_0 ones (the only quantizers ggml has for them).

mod common;

use std::path::PathBuf;

use common::{hex_bytes, type_by_name};
use nx_lazy_weight::{dequantize_row, quantize_row, GgmlType};
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/dequant")
}

fn load(name: &str) -> Value {
    let path = fixture_dir().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask golden dequant`)", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn dequantize_matches_gguf_python_bit_for_bit() {
    let types = [
        "F32", "F16", "BF16", "Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_1", "Q5_1",
        "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4", "TQ2_0", "TQ1_0", "IQ2_XXS", "IQ2_XS",
        "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
    ];
    let mut summary = Vec::new();
    for name in types {
        let doc = load(&format!("{}.json", name.to_lowercase()));
        assert_eq!(doc["type"].as_str(), Some(name));
        let ty = type_by_name(name);
        assert_eq!(doc["type_id"].as_u64(), Some(ty.id() as u64));
        let rows = doc["rows"].as_array().expect("rows");
        let (mut model_rows, mut synthetic_rows, mut values) = (0, 0, 0);
        for row in rows {
            let origin = row["origin"].as_str().expect("origin");
            let raw = hex_bytes(row["raw_hex"].as_str().expect("raw_hex"));
            let expected: Vec<u32> = row["values_f32_bits"]
                .as_array()
                .expect("values")
                .iter()
                .map(|v| u32::from_str_radix(v.as_str().expect("hex"), 16).expect("u32"))
                .collect();
            assert_eq!(row["row_len"].as_u64(), Some(expected.len() as u64));
            let mut out = vec![0f32; expected.len()];
            dequantize_row(ty, &raw, &mut out).unwrap();
            for (i, (got, want)) in out.iter().zip(&expected).enumerate() {
                assert!(
                    got.to_bits() == *want,
                    "{name} {origin} row {}: element {i}: got {got:e} ({:08x}), gguf says {:e} ({want:08x})",
                    row["row"],
                    got.to_bits(),
                    f32::from_bits(*want)
                );
            }
            if origin.starts_with("model:") {
                model_rows += 1;
            } else {
                synthetic_rows += 1;
            }
            values += expected.len();
        }
        assert!(synthetic_rows > 0, "{name}: no synthetic rows");
        summary.push(format!(
            "{name:>6}: {model_rows} model rows + {synthetic_rows} synthetic rows, {values} values"
        ));
    }
    // Types present in the default model must have come from it.
    for name in ["F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K"] {
        let line = summary
            .iter()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap();
        assert!(!line.contains(" 0 model rows"), "{line}");
    }
    println!("dequant golden (gguf.quants.dequantize), bit-exact:");
    for line in &summary {
        println!("  {line}");
    }
}

/// Quantizes every row of fixture `name` to `ty` and requires the bytes under
/// `key`, naming the first differing byte.
fn check_quantize_fixture(name: &str, key: &str, ty: GgmlType) {
    let doc = load(name);
    let row_len = doc["row_len"].as_u64().unwrap() as usize;
    let rows = doc["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    for (r, row) in rows.iter().enumerate() {
        let x: Vec<f32> = row["input_f32_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| f32::from_bits(u32::from_str_radix(v.as_str().unwrap(), 16).unwrap()))
            .collect();
        assert_eq!(x.len(), row_len);
        let expected = hex_bytes(row[key].as_str().unwrap());
        let mut got = vec![0u8; expected.len()];
        quantize_row(ty, &x, &mut got).unwrap();
        if let Some(b) = (0..got.len()).find(|&b| got[b] != expected[b]) {
            let block = ty.type_size();
            panic!(
                "{ty} row {r}: byte {b} (block {}, offset {}): got {:02x}, gguf says {:02x}",
                b / block,
                b % block,
                got[b],
                expected[b]
            );
        }
    }
    println!(
        "{ty} quantize golden: {} rows of {row_len}, byte-exact",
        rows.len()
    );
}

#[test]
fn q8_0_activation_quantizer_matches_gguf_python() {
    check_quantize_fixture("q8_0_quantize.json", "q8_0_hex", GgmlType::Q8_0);
}

#[test]
fn q4_1_and_q5_1_weight_quantizers_match_gguf_python() {
    check_quantize_fixture("q4_1_quantize.json", "quantized_hex", GgmlType::Q4_1);
    check_quantize_fixture("q5_1_quantize.json", "quantized_hex", GgmlType::Q5_1);
}

#[test]
fn mxfp4_and_ternary_weight_quantizers_match_gguf_python() {
    check_quantize_fixture("mxfp4_quantize.json", "quantized_hex", GgmlType::MXFP4);
    check_quantize_fixture("tq2_0_quantize.json", "quantized_hex", GgmlType::TQ2_0);
    check_quantize_fixture("tq1_0_quantize.json", "quantized_hex", GgmlType::TQ1_0);
}
