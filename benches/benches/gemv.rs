//! Criterion benchmarks of one-token GEMV (`y[r] = dot(W row r, x)`) per weight type and
//! per CPU tier this machine supports (and the four-row kernels where a tier has one), reported as GB/s of weight bytes read.
//!
//! Shapes are Gemma 3 270M's: n_embd 640, n_ff 2048, vocabulary 262144 (the tied LM
//! head is Q8_0 [640, 262144], 178 MB). Weights come from the real quantizer; the LM
//! head tiles 256 distinct rows, so its bytes still stream from memory (the grid formats,
//! which nx cannot quantize, are random valid blocks). Run with
//! `cargo bench -p nx-benches --bench gemv` (add a filter such as `Q4_K` to narrow).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nx_benches::{grid_weights, values, weights};
use nx_lazy_weight::{
    dot_kernel_for, dot_kernel_rows4_for, quantize_row, row_bytes, supported_tiers, vec_dot_type,
    GgmlType,
};

fn bench_gemv(c: &mut Criterion) {
    // (weight type, K = row length, N = rows)
    let cases = [
        (GgmlType::Q5_0, 640, 2048),
        (GgmlType::BF16, 640, 2048),
        (GgmlType::Q8_0, 640, 2048),
        (GgmlType::Q4_0, 640, 2048),
        (GgmlType::IQ4_NL, 640, 2048),
        (GgmlType::IQ4_XS, 2048, 640),
        (GgmlType::Q4_K, 2048, 640),
        (GgmlType::Q5_K, 2048, 640),
        (GgmlType::Q6_K, 2048, 640),
        (GgmlType::Q2_K, 2048, 640),
        (GgmlType::Q3_K, 2048, 640),
        (GgmlType::Q8_0, 640, 262_144),
        // The tier-2 formats without a model in `cargo xtask bench`: gpt-oss's MXFP4 and
        // the BitNet ternary types.
        (GgmlType::MXFP4, 2048, 640),
        (GgmlType::TQ2_0, 2048, 640),
        (GgmlType::TQ1_0, 2048, 640),
        // The grids (random lattice points: nx has no quantizer for them).
        (GgmlType::IQ1_M, 2048, 640),
        (GgmlType::IQ1_S, 2048, 640),
        (GgmlType::IQ2_XXS, 2048, 640),
        (GgmlType::IQ2_XS, 2048, 640),
        (GgmlType::IQ2_S, 2048, 640),
        (GgmlType::IQ3_XXS, 2048, 640),
        (GgmlType::IQ3_S, 2048, 640),
    ];
    for (ty, row_len, n_rows) in cases {
        let act = vec_dot_type(ty).unwrap();
        let w = match ty {
            GgmlType::IQ1_S
            | GgmlType::IQ1_M
            | GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ2_S
            | GgmlType::IQ3_XXS
            | GgmlType::IQ3_S => grid_weights(ty, row_len, n_rows),
            _ => weights(ty, row_len, n_rows),
        };
        let mut xq = vec![0u8; row_bytes(act, row_len).unwrap()];
        quantize_row(act, &values(99, row_len, 1.0), &mut xq).unwrap();
        let rb = w.len() / n_rows;
        let mut y = vec![0f32; n_rows];

        let mut group = c.benchmark_group(format!("gemv/{}/{row_len}x{n_rows}", ty.name()));
        group.throughput(Throughput::Bytes(w.len() as u64));
        if w.len() > 64 << 20 {
            group.sample_size(10);
            group.measurement_time(Duration::from_secs(4));
        }
        for tier in supported_tiers() {
            let kernel = dot_kernel_for(tier, ty).unwrap();
            group.bench_function(BenchmarkId::from_parameter(tier.name()), |b| {
                b.iter(|| {
                    for (out, row) in y.iter_mut().zip(w.chunks_exact(rb)) {
                        *out = kernel(row, black_box(&xq));
                    }
                    black_box(&y);
                })
            });
            // The four-row kernel (each activation block prepared once for four rows).
            let Some(rows4) = dot_kernel_rows4_for(tier, ty) else {
                continue;
            };
            group.bench_function(
                BenchmarkId::from_parameter(format!("{}-rows4", tier.name())),
                |b| {
                    b.iter(|| {
                        for (out, rows) in y.chunks_exact_mut(4).zip(w.chunks_exact(4 * rb)) {
                            let r: [&[u8]; 4] =
                                std::array::from_fn(|i| &rows[i * rb..(i + 1) * rb]);
                            out.copy_from_slice(&rows4(r, black_box(&xq)));
                        }
                        black_box(&y);
                    })
                },
            );
        }
        group.finish();
    }
}

criterion_group!(benches, bench_gemv);
criterion_main!(benches);
