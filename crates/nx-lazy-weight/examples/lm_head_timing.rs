//! Min-of-N timing of an LM-head-shaped matmul (Q8_0, K = 640, 262 144 rows: Gemma 3
//! 270M's tied head) for 1 to 16 token rows on the process pool: what verifying `k`
//! draft tokens (or decoding `k` sequences in one step) costs against one row.
//!
//! Run: `cargo run --release -p nx-lazy-weight --example lm_head_timing [ROWS…]`.

use std::hint::black_box;
use std::time::Instant;

use nx_lazy_weight::{
    matmul_quantized_pool, quantize_row, row_bytes, GgmlType, LazyWeight, QuantizedActs,
};
use nx_syscalls::ThreadPool;

fn main() {
    let (ty, n_rows, k) = (GgmlType::Q8_0, 262_144usize, 640usize);
    let rb = row_bytes(ty, k).unwrap();
    let mut w = vec![0u8; rb * n_rows];
    let row: Vec<f32> = (0..k)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 5000.0)
        .collect();
    for dst in w.chunks_exact_mut(rb) {
        quantize_row(ty, &row, dst).unwrap();
    }
    let weight = LazyWeight::from_parts(ty, &[k as u64, n_rows as u64], &w).unwrap();
    let pool = ThreadPool::global();
    // Row counts from the command line, else a spread from 1 to 16.
    let ns: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ns = if ns.is_empty() {
        vec![1, 2, 3, 4, 5, 8, 9, 12, 16]
    } else {
        ns
    };
    for n in ns {
        let x: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut xq = QuantizedActs::new();
        xq.quantize_for(&weight, &x, n).unwrap();
        let mut y = vec![0f32; n * n_rows];
        let mut best = f64::MAX;
        for _ in 0..10 {
            let t = Instant::now();
            matmul_quantized_pool(&weight, &xq, &mut y, &pool).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
            black_box(&y);
        }
        println!(
            "rows {n:>2}: {:6.2} ms  ({:5.2} ms per row, {} threads)",
            best * 1e3,
            best * 1e3 / n as f64,
            pool.n_threads()
        );
    }
}
