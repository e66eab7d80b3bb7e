//! Min-of-N timing of prefill-shaped quantized matmuls on one thread, in chunks of 16
//! weight rows as the thread pool hands them out: Q4_K and Q6_K with K = 2048, 640
//! rows; Q5_0 and Q8_0 with K = 640, 2048 rows (Gemma 3 270M's FFN shapes); Q4_K with
//! K = 8960, 256 rows (a slice of Qwen2.5-1.5B's down projection: a long row, whose
//! activation tiles outgrow L2 at 512 tokens); 64 and 512 tokens.
//!
//! Run: `cargo run --release -p nx-lazy-weight --example matmul_timing`.

use std::hint::black_box;
use std::time::Instant;

use nx_lazy_weight::{matmul_rows, quantize_row, row_bytes, GgmlType, LazyWeight, QuantizedActs};

fn main() {
    for n in [64, 512] {
        run(n);
    }
}

fn run(n: usize) {
    for (ty, n_rows, k) in [
        (GgmlType::Q4_K, 640, 2048),
        (GgmlType::Q6_K, 640, 2048),
        (GgmlType::Q5_0, 2048, 640),
        (GgmlType::Q8_0, 2048, 640),
        (GgmlType::Q4_K, 256, 8960),
    ] {
        let vals: Vec<f32> = (0..n_rows * k)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 5000.0)
            .collect();
        let rb = row_bytes(ty, k).unwrap();
        let mut w = vec![0u8; rb * n_rows];
        for (src, dst) in vals.chunks_exact(k).zip(w.chunks_exact_mut(rb)) {
            quantize_row(ty, src, dst).unwrap();
        }
        let weight = LazyWeight::from_parts(ty, &[k as u64, n_rows as u64], &w).unwrap();
        let x: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut xq = QuantizedActs::new();
        xq.quantize_for(&weight, &x, n).unwrap();
        let mut y = vec![0f32; n * n_rows];
        let mut best = f64::MAX;
        for _ in 0..20 {
            let t = Instant::now();
            for (c, out) in y.chunks_exact_mut(16 * n).enumerate() {
                matmul_rows(&weight, black_box(&xq), 16 * c..16 * (c + 1), out).unwrap();
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let checksum: f64 = y.iter().map(|&v| v as f64).sum();
        println!(
            "{:5} {n_rows}x{k} n={n}: {:8.3} ms  {:6.1} GMAC/s  (checksum {checksum:.6e})",
            ty.name(),
            best * 1e3,
            (n * n_rows * k) as f64 / best / 1e9
        );
    }
}
