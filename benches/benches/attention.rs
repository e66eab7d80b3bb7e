//! Criterion benchmarks of attention over 512 cached positions through the process's
//! tier: one query head (Gemma 3 270M's head width 256) with an f32 and an f16 cache,
//! and the query heads that share one KV head (`attend_group`: Gemma 3 270M's four heads
//! of 256, Qwen2.5-1.5B's six of 128) over f16 rows, as a decode step reads its cache,
//! and over rows widened to f32, as a prefill chunk reads them.
//! Run: `cargo bench -p nx-benches --bench attention`.

use std::hint::black_box;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use nx_benches::values;
use nx_f32::attention::{
    attend_group, attend_group_scratch_len, attend_head, attend_scratch_len, CacheView, HeadRows,
    KvElem, KvPrecision,
};
use nx_f32::f16;

const HEAD_DIM: usize = 256;
const N_ROWS: usize = 512;

fn bench_attention(c: &mut Criterion) {
    let q = values(1, HEAD_DIM, 1.0);
    let k32 = values(2, N_ROWS * HEAD_DIM, 1.0);
    let v32 = values(3, N_ROWS * HEAD_DIM, 1.0);
    let k16: Vec<f16> = k32.iter().map(|&x| f16::from_f32(x)).collect();
    let v16: Vec<f16> = v32.iter().map(|&x| f16::from_f32(x)).collect();
    let mut out = vec![0f32; HEAD_DIM];
    let mut scratch = vec![0f32; attend_scratch_len(N_ROWS, HEAD_DIM)];
    let scale = 1.0 / (HEAD_DIM as f32).sqrt();
    let mut group = c.benchmark_group(format!("attention/head{HEAD_DIM}x{N_ROWS}"));
    group.throughput(Throughput::Elements(N_ROWS as u64));
    group.bench_function("f32", |b| {
        let keys = HeadRows::new(&k32, HEAD_DIM, 0, HEAD_DIM).unwrap();
        let vals = HeadRows::new(&v32, HEAD_DIM, 0, HEAD_DIM).unwrap();
        b.iter(|| {
            attend_head(
                black_box(&q),
                keys,
                vals,
                0..N_ROWS,
                scale,
                &mut out,
                &mut scratch,
            );
            black_box(&out);
        })
    });
    group.bench_function("f16", |b| {
        let keys = HeadRows::new(&k16, HEAD_DIM, 0, HEAD_DIM).unwrap();
        let vals = HeadRows::new(&v16, HEAD_DIM, 0, HEAD_DIM).unwrap();
        b.iter(|| {
            attend_head(
                black_box(&q),
                keys,
                vals,
                0..N_ROWS,
                scale,
                &mut out,
                &mut scratch,
            );
            black_box(&out);
        })
    });
    group.finish();
    for (heads, head_dim) in [(4, 256), (6, 128)] {
        bench_group(c, heads, head_dim);
    }
}

/// `heads` query heads of `head_dim` sharing one KV head of [`N_ROWS`] positions, stored
/// as f16 and widened to f32 (both with the f16 cache's rounding).
fn bench_group(c: &mut Criterion, heads: usize, head_dim: usize) {
    let qs = values(4, heads * head_dim, 1.0);
    let k16: Vec<f16> = values(5, N_ROWS * head_dim, 1.0)
        .iter()
        .map(|&x| f16::from_f32(x))
        .collect();
    let v16: Vec<f16> = values(6, N_ROWS * head_dim, 1.0)
        .iter()
        .map(|&x| f16::from_f32(x))
        .collect();
    let k32: Vec<f32> = k16.iter().map(|x| x.to_f32()).collect();
    let v32: Vec<f32> = v16.iter().map(|x| x.to_f32()).collect();
    let outs = vec![0f32; heads * head_dim];
    let scratch = vec![0f32; attend_group_scratch_len(heads, N_ROWS, head_dim)];
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut group = c.benchmark_group(format!("attention/group{heads}x{head_dim}x{N_ROWS}"));
    group.throughput(Throughput::Elements((heads * N_ROWS) as u64));
    let rows = |x| HeadRows::new(x, head_dim, 0, head_dim).unwrap();
    let stored = CacheView {
        keys: rows(&k16[..]),
        values: rows(&v16[..]),
        first_row: 0,
        precision: KvPrecision::F16,
    };
    let mut buffers = (outs, scratch);
    bench_view(&mut group, "f16", &qs, stored, scale, &mut buffers);
    let widened = CacheView {
        keys: HeadRows::new(&k32, head_dim, 0, head_dim).unwrap(),
        values: HeadRows::new(&v32, head_dim, 0, head_dim).unwrap(),
        first_row: 0,
        precision: KvPrecision::F16,
    };
    bench_view(&mut group, "widened", &qs, widened, scale, &mut buffers);
    group.finish();
}

/// One `attend_group` benchmark over `view` (`buffers`: outputs and scratch).
fn bench_view<T: KvElem>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    qs: &[f32],
    view: CacheView<'_, T>,
    scale: f32,
    (outs, scratch): &mut (Vec<f32>, Vec<f32>),
) {
    group.bench_function(name, |b| {
        b.iter(|| {
            attend_group(black_box(qs), view, 0..N_ROWS, scale, outs, scratch);
            black_box(&outs);
        })
    });
}

criterion_group!(benches, bench_attention);
criterion_main!(benches);
