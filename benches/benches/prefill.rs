//! Criterion benchmarks of multi-token matmul (`y = x·Wᵀ` for a chunk of 64 tokens) per
//! weight type, through the dispatcher a prefill uses: the process's tier, with the tiled
//! (and, where the CPU has it, AMX) kernels where they apply. Reported as tokens/s.
//! Shapes are Gemma 3 270M's FFN (640 → 2048) and down projection (2048 → 640; also for
//! Q2_K and Q3_K, which Gemma's file does not use).
//! Run: `cargo bench -p nx-benches --bench prefill` (`NX_TIER=avx2`, `NX_AMX=0` for the
//! lower paths).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use nx_benches::{values, weights};
use nx_lazy_weight::{active_tier, matmul, GgmlType, LazyWeight, QuantizedActs};

const N_TOKENS: usize = 64;

fn bench_prefill(c: &mut Criterion) {
    let cases = [
        (GgmlType::F16, 640, 2048),
        (GgmlType::Q4_0, 640, 2048),
        (GgmlType::Q5_0, 640, 2048),
        (GgmlType::Q8_0, 640, 2048),
        (GgmlType::Q4_K, 2048, 640),
        (GgmlType::Q5_K, 2048, 640),
        (GgmlType::Q6_K, 2048, 640),
        (GgmlType::Q2_K, 2048, 640),
        (GgmlType::Q3_K, 2048, 640),
    ];
    let tier = active_tier().unwrap();
    for (ty, row_len, n_rows) in cases {
        let bytes = weights(ty, row_len, n_rows);
        let w = LazyWeight::from_parts(ty, &[row_len as u64, n_rows as u64], &bytes).unwrap();
        let x = values(7, N_TOKENS * row_len, 1.0);
        let mut y = vec![0f32; N_TOKENS * n_rows];
        let mut scratch = QuantizedActs::new();
        let mut group = c.benchmark_group(format!("prefill/{}/{row_len}x{n_rows}", ty.name()));
        group.throughput(Throughput::Elements(N_TOKENS as u64));
        group.bench_function(format!("{}x{N_TOKENS}", tier.name()), |b| {
            b.iter(|| {
                matmul(&w, black_box(&x), N_TOKENS, &mut y, &mut scratch).unwrap();
                black_box(&y);
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench_prefill);
criterion_main!(benches);
