//! Criterion benchmark of one query head attending over 512 cached positions (Gemma 3
//! 270M's head width 256), with an f32 and an f16 cache, through the process's tier.
//! Run: `cargo bench -p nx-benches --bench attention`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use nx_benches::values;
use nx_f32::attention::{attend_head, attend_scratch_len, HeadRows};
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
}

criterion_group!(benches, bench_attention);
criterion_main!(benches);
