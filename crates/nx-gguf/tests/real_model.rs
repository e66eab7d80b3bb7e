//! Parses the default model when it has been fetched (gate: needs `cargo xtask fetch`).

use nx_gguf::{GgmlType, Gguf};
use std::collections::BTreeMap;

fn model_path() -> std::path::PathBuf {
    let cache = std::env::var_os("NX_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/nx")
        });
    cache.join("models/gemma-3-270m-q4_k_m.gguf")
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn default_model_header_matches_reference_md() {
    let g = Gguf::open(model_path()).expect("open default model");
    let m = g.metadata();
    assert_eq!(g.architecture().unwrap(), "gemma3");
    assert_eq!(m.get_u32("gemma3.block_count").unwrap(), 18);
    assert_eq!(m.get_u32("gemma3.embedding_length").unwrap(), 640);
    assert_eq!(m.get_u32("gemma3.feed_forward_length").unwrap(), 2048);
    assert_eq!(m.get_u32("gemma3.attention.head_count").unwrap(), 4);
    assert_eq!(m.get_u32("gemma3.attention.head_count_kv").unwrap(), 1);
    assert_eq!(m.get_u32("gemma3.attention.sliding_window").unwrap(), 512);
    assert_eq!(
        m.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        262_144
    );
    let mut per_type = BTreeMap::new();
    for t in g.tensors() {
        *per_type.entry(t.ggml_type).or_insert(0) += 1;
        assert_eq!(g.tensor_bytes(t).len() as u64, t.n_bytes);
    }
    let expect = BTreeMap::from([
        (GgmlType::F32, 109),
        (GgmlType::Q5_0, 81),
        (GgmlType::Q4_K, 27),
        (GgmlType::Q8_0, 10),
        (GgmlType::Q6_K, 9),
    ]);
    assert_eq!(per_type, expect);
}
