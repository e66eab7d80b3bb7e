//! Criterion benchmarks of a batched decode step's matmul: 1, 2, 4, 8 and 16 tokens
//! (one per sequence) through `matmul_pool` on two threads, as a serving step or a draft
//! verification runs it (narrow tiles for the block-32 formats and for Q2_K, Q3_K, Q4_K,
//! Q5_K and five or more Q6_K tokens; four-token kernels otherwise),
//! reported as GB/s of weight bytes read per step — the step streams every weight once,
//! so the ideal is the one-token rate at any width.
//!
//! Shapes are Gemma 3 270M's: the tied Q8_0 LM head [640, 262144] (178 MB, streamed
//! from memory), a Q8_0, a Q5_0 and a Q4_0 FFN projection (640 → 2048, in cache: the
//! kernels' own speed) and a Q4_K / Q5_K / Q6_K / Q2_K / Q3_K down projection (2048 → 640).
//! `bounded/…` and `bounded-top40/…` time the LM head's bounded pass for greedy and
//! top-40 rows (`BoundedHead`) at the same widths, as an engine runs it (AMX above eight
//! tokens where the CPU has it); `bounded-vnni/…` and `bounded-amx/…` each pass at every
//! width; `bounded-cached/…` the pass on one thread over the head's first 8192 rows (5.3
//! MB, in the cache): its own speed, apart from streaming the head from memory.
//! Run: `cargo bench -p nx-benches --bench batched` (a filter
//! such as `Q8_0` narrows it; `NX_TIER=avx2` for the lower tier).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nx_benches::{values, weights};
use nx_lazy_weight::{
    matmul_pool, BoundedHead, BoundedKernel, BoundedScratch, GgmlType, LazyWeight, QuantizedActs,
};
use nx_syscalls::ThreadPool;

const WIDTHS: [usize; 5] = [1, 2, 4, 8, 16];

fn bench_batched(c: &mut Criterion) {
    // (weight type, K = row length, N = rows)
    let cases = [
        (GgmlType::Q8_0, 640, 262_144),
        (GgmlType::Q8_0, 640, 2048),
        (GgmlType::Q5_0, 640, 2048),
        (GgmlType::Q4_0, 640, 2048),
        (GgmlType::Q4_K, 2048, 640),
        (GgmlType::Q5_K, 2048, 640),
        (GgmlType::Q6_K, 2048, 640),
        (GgmlType::Q2_K, 2048, 640),
        (GgmlType::Q3_K, 2048, 640),
    ];
    let pool = ThreadPool::new(2);
    for (ty, row_len, n_rows) in cases {
        let bytes = weights(ty, row_len, n_rows);
        let w = LazyWeight::from_parts(ty, &[row_len as u64, n_rows as u64], &bytes).unwrap();
        let mut group = c.benchmark_group(format!("batched/{}/{row_len}x{n_rows}", ty.name()));
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        if bytes.len() > 64 << 20 {
            group.sample_size(10);
            group.measurement_time(Duration::from_secs(4));
        }
        for n_tokens in WIDTHS {
            let x = values(7, n_tokens * row_len, 1.0);
            let mut y = vec![0f32; n_tokens * n_rows];
            let mut scratch = QuantizedActs::new();
            group.bench_function(BenchmarkId::from_parameter(n_tokens), |b| {
                b.iter(|| {
                    matmul_pool(&w, black_box(&x), n_tokens, &mut y, &mut scratch, &pool).unwrap();
                    black_box(&y);
                })
            });
        }
        group.finish();
    }
}

/// The LM head's bounded pass (`BoundedHead::candidates`: a bound for every row, exact
/// outputs for the few that can be among the top) at the same widths, for greedy rows
/// (`bounded/…/N`) and top-40 rows (`bounded-top40/…/N`), against the full matmul above.
fn bench_bounded(c: &mut Criterion) {
    bench_bounded_on(
        c,
        262_144,
        ThreadPool::new(2),
        &["bounded", "bounded-top40", "bounded-vnni", "bounded-amx"],
    );
    bench_bounded_on(c, 8192, ThreadPool::new(1), &["bounded-cached"]);
}

/// [`bench_bounded`]'s passes named in `names`, over the head's first `n_rows` rows on
/// `pool`.
fn bench_bounded_on(c: &mut Criterion, n_rows: usize, pool: ThreadPool, names: &[&str]) {
    let (ty, row_len) = (GgmlType::Q8_0, 640);
    let bytes = weights(ty, row_len, n_rows);
    let w = LazyWeight::from_parts(ty, &[row_len as u64, n_rows as u64], &bytes).unwrap();
    let passes = [
        ("bounded", BoundedHead::new(&w, &pool), 1),
        ("bounded-cached", BoundedHead::new(&w, &pool), 1),
        ("bounded-top40", BoundedHead::new(&w, &pool), 40),
        (
            "bounded-vnni",
            BoundedHead::with_kernel(&w, &pool, BoundedKernel::Vnni),
            1,
        ),
        (
            "bounded-amx",
            BoundedHead::with_kernel(&w, &pool, BoundedKernel::Amx),
            1,
        ),
    ];
    for (name, head, k) in passes {
        if !names.contains(&name) {
            continue;
        }
        let Some(head) = head else {
            continue; // no such pass on this CPU and tier
        };
        let mut group = c.benchmark_group(format!("{name}/{}/{row_len}x{n_rows}", ty.name()));
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.sample_size(10);
        group.measurement_time(Duration::from_secs(4));
        for n_tokens in WIDTHS {
            let x = values(7, n_tokens * row_len, 1.0);
            let top = vec![k; n_tokens];
            let mut scratch = BoundedScratch::default();
            group.bench_function(BenchmarkId::from_parameter(n_tokens), |b| {
                b.iter(|| {
                    let got = head.candidates(&w, black_box(&x), &top, &mut scratch, &pool);
                    black_box(got.unwrap());
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_batched, bench_bounded);
criterion_main!(benches);
