//! Quick min-of-N timing of one dot product per quantized type and CPU tier (rows of
//! K = 4096 that stay in cache), plus nx-f32's f16 attention helpers, scalar vs dispatched.
//!
//! The minimum over many repetitions is robust on a busy machine, where criterion's
//! means drift with other load. Run: `cargo run --release -p nx-lazy-weight --example dot_timing`.

use std::hint::black_box;
use std::time::Instant;

use nx_lazy_weight::{
    dot_kernel_for, quantize_row, row_bytes, supported_tiers, vec_dot_type, GgmlType,
};

/// Best time per call, in seconds, of `f` over 200 rounds of `reps` calls.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..200 {
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
    }
    best
}

fn main() {
    let k = 4096;
    let vals: Vec<f32> = (0..k)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 5000.0)
        .collect();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        let mut w = vec![0u8; row_bytes(ty, k).unwrap()];
        quantize_row(ty, &vals, &mut w).unwrap();
        let act = vec_dot_type(ty).unwrap();
        let mut x = vec![0u8; row_bytes(act, k).unwrap()];
        quantize_row(act, &vals, &mut x).unwrap();
        let mut line = format!("{:5} K={k}", ty.name());
        let mut scalar_time = 0.0;
        for tier in supported_tiers() {
            let kernel = dot_kernel_for(tier, ty).unwrap();
            let t = best_of(20, || {
                black_box(kernel(black_box(&w), black_box(&x)));
            });
            if scalar_time == 0.0 {
                scalar_time = t;
            }
            line += &format!(
                "  {}: {:7.1} ns {:5.1} GB/s {:5.1}×",
                tier.name(),
                t * 1e9,
                w.len() as f64 / t / 1e9,
                scalar_time / t
            );
        }
        println!("{line}");
    }

    let n = 256;
    let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    let b: Vec<nx_f32::f16> = (0..n)
        .map(|i| nx_f32::f16::from_f32((i as f32 * 0.11).cos()))
        .collect();
    let mut y = vec![0f32; n];
    let dot_scalar = best_of(100, || {
        black_box(nx_f32::scalar::dot_f16(black_box(&a), &b));
    });
    let dot_root = best_of(100, || {
        black_box(nx_f32::dot_f16(black_box(&a), &b));
    });
    let axpy_scalar = best_of(100, || nx_f32::scalar::axpy_f16(black_box(&mut y), 0.5, &b));
    let axpy_root = best_of(100, || nx_f32::axpy_f16(black_box(&mut y), 0.5, &b));
    println!(
        "f16 n={n}: dot_f16 scalar {:.1} ns, dispatched {:.1} ns ({:.1}×); axpy_f16 scalar {:.1} ns, dispatched {:.1} ns ({:.1}×)",
        dot_scalar * 1e9,
        dot_root * 1e9,
        dot_scalar / dot_root,
        axpy_scalar * 1e9,
        axpy_root * 1e9,
        axpy_scalar / axpy_root
    );
}
