//! `LazyWeight` over real GGUF tensors: one written in memory with `GgufWriter` (always
//! runs) and the default model (runs when it is in the cache, otherwise says so).

mod common;

use std::path::PathBuf;

use common::{assert_bits_eq, has_quantizer, random_row_bytes, Rng, WEIGHT_TYPES};
use nx_gguf::{Gguf, GgufWriter};
use nx_lazy_weight::{quantize_row, row_bytes, GgmlType, LazyWeight, QuantizedActs};

#[test]
fn views_tensors_of_a_written_gguf_without_copying() {
    const K: usize = 512;
    const N: usize = 5;
    let mut rng = Rng::new(17);
    let mut originals = Vec::new();
    let mut writer = GgufWriter::new();
    for ty in WEIGHT_TYPES {
        let x = rng.normals(K * N, 0.1);
        let rb = row_bytes(ty, K).unwrap();
        let mut data = vec![0u8; rb * N];
        if has_quantizer(ty) {
            for (xr, qr) in x.chunks_exact(K).zip(data.chunks_exact_mut(rb)) {
                quantize_row(ty, xr, qr).unwrap();
            }
        } else {
            data = random_row_bytes(&mut rng, ty, K * N);
        }
        writer.add_tensor(
            format!("w.{}", ty.name()),
            ty,
            vec![K as u64, N as u64],
            data.clone(),
        );
        originals.push((ty, data));
    }
    let gguf = Gguf::from_bytes(writer.to_bytes()).unwrap();
    let x = rng.normals(2 * K, 1.0);
    for (ty, data) in &originals {
        let info = gguf.tensor(&format!("w.{}", ty.name())).unwrap();
        let bytes = gguf.tensor_bytes(info);
        let w = LazyWeight::new(info, bytes).unwrap();
        // A view into the file's bytes, not a copy.
        assert_eq!(w.bytes().as_ptr(), bytes.as_ptr());
        assert_eq!(w.bytes(), &data[..]);
        assert_eq!((w.ggml_type(), w.row_len(), w.n_rows()), (*ty, K, N));
        let from_file = LazyWeight::try_from((info, bytes)).unwrap();
        let in_memory = LazyWeight::from_parts(*ty, &[K as u64, N as u64], data).unwrap();
        let (mut y1, mut y2) = (vec![0f32; 2 * N], vec![0f32; 2 * N]);
        from_file
            .matmul(&x, 2, &mut y1, &mut QuantizedActs::new())
            .unwrap();
        in_memory
            .matmul(&x, 2, &mut y2, &mut QuantizedActs::new())
            .unwrap();
        assert_bits_eq(&y1, &y2, ty.name());
    }
}

fn default_model() -> Option<PathBuf> {
    let cache = std::env::var_os("NX_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/nx")))?;
    let path = cache.join("models/gemma-3-270m-q4_k_m.gguf");
    path.is_file().then_some(path)
}

#[test]
#[cfg_attr(miri, ignore = "Miri does not support file-backed memory mappings")]
fn every_tensor_of_the_default_model_is_a_valid_view() {
    let Some(path) = default_model() else {
        eprintln!("default model not in the cache; skipped (cargo xtask fetch --model)");
        return;
    };
    let gguf = Gguf::open(&path).unwrap();
    let mut counts = std::collections::BTreeMap::new();
    for info in gguf.tensors() {
        let w = LazyWeight::new(info, gguf.tensor_bytes(info))
            .unwrap_or_else(|e| panic!("{}: {e}", info.name));
        assert_eq!(w.n_rows() as u64, info.n_rows());
        *counts.entry(info.ggml_type.name()).or_insert(0) += 1;
    }
    // The 270M Q4_K_M mix (see fixtures/dequant): F32 norms, Q5_0/Q8_0/Q4_K/Q6_K weights.
    for ty in ["F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K"] {
        assert!(counts.contains_key(ty), "no {ty} tensor: {counts:?}");
    }

    // One projection against its dequantized rows: the quantized matmul stays within
    // the activation quantization error of an f64 dot with the original activations.
    let info = gguf.tensor("blk.0.attn_q.weight").unwrap();
    let w = LazyWeight::new(info, gguf.tensor_bytes(info)).unwrap();
    assert_eq!(w.ggml_type(), GgmlType::Q5_0);
    let k = w.row_len();
    let x = Rng::new(1).normals(k, 1.0);
    let mut y = vec![0f32; w.n_rows()];
    w.matmul(&x, 1, &mut y, &mut QuantizedActs::new()).unwrap();
    let mut row = vec![0f32; k];
    let mut worst = 0f64;
    for (r, &yr) in y.iter().enumerate() {
        w.dequantize_row(r, &mut row).unwrap();
        let exact: f64 = row.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let scale: f64 = row
            .iter()
            .zip(&x)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        worst = worst.max((yr as f64 - exact).abs() / scale);
    }
    // Q8_0 activations: about 1/254 relative error per element, far less on the sum.
    assert!(worst < 4e-3, "worst relative error {worst}");
    eprintln!("default model: {counts:?}; attn_q worst relative error {worst:.2e}");
}
