//! Criterion benchmark of one draw from a row of 262 144 logits (Gemma 3's vocabulary):
//! greedy, and llama.cpp's default chain (top-k 40, top-p 0.95, min-p 0.05, temperature
//! 0.8) with a seeded, position-keyed draw.
//! Run: `cargo bench -p nx-benches --bench sampler`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use nx_benches::values;
use nx_sampler::{Sampler, SamplerConfig};

const N_VOCAB: usize = 262_144;

fn bench_sampler(c: &mut Criterion) {
    let logits = values(5, N_VOCAB, 3.0);
    let mut group = c.benchmark_group(format!("sampler/{N_VOCAB}"));
    for (name, config) in [
        ("greedy", SamplerConfig::greedy()),
        ("default", SamplerConfig::default()),
    ] {
        let mut sampler = Sampler::new(config).unwrap();
        let mut row = logits.clone();
        let mut position = 0u64;
        group.bench_function(name, |b| {
            b.iter(|| {
                row.copy_from_slice(&logits);
                position += 1;
                black_box(sampler.sample_at(&mut row, position).unwrap())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_sampler);
criterion_main!(benches);
