//! Criterion benchmarks of the whole model on the tiny random-weight fixture (2 layers,
//! n_embd 64, the tests' model): one decode step with 64 positions cached, and one
//! 64-token prefill chunk. They measure per-step overhead (scratch, dispatch, thread
//! hand-offs) more than arithmetic; model-sized figures come from `cargo xtask bench`.
//! Run: `cargo bench -p nx-benches --bench forward`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use nx_gguf::Gguf;
use nx_llama_stack::{tiny_fixture, ForwardState, KvDtype, Model};

const N_PREFILL: usize = 64;

fn bench_forward(c: &mut Criterion) {
    let bytes = tiny_fixture::tiny_gguf(Default::default());
    let model = Model::from_gguf(Gguf::from_bytes(bytes).unwrap()).unwrap();
    let n_vocab = model.config().n_vocab as u32;
    let prompt: Vec<u32> = (0..N_PREFILL as u32)
        .map(|i| 3 + i % (n_vocab - 3))
        .collect();
    let mut state = ForwardState::default();
    let mut logits = Vec::new();
    let mut group = c.benchmark_group("forward/tiny");

    group.throughput(Throughput::Elements(N_PREFILL as u64));
    group.bench_function(format!("prefill{N_PREFILL}"), |b| {
        let mut cache = model.new_cache(N_PREFILL, KvDtype::F16).unwrap();
        b.iter(|| {
            cache.truncate(0);
            let last = [N_PREFILL - 1];
            model
                .forward(&prompt, 0, &mut cache, &last, &mut state, &mut logits)
                .unwrap();
            black_box(&logits);
        })
    });

    group.throughput(Throughput::Elements(1));
    group.bench_function(format!("decode_at{N_PREFILL}"), |b| {
        let mut cache = model.new_cache(N_PREFILL + 1, KvDtype::F16).unwrap();
        model
            .forward(&prompt, 0, &mut cache, &[], &mut state, &mut logits)
            .unwrap();
        b.iter(|| {
            cache.truncate(N_PREFILL);
            model
                .forward(&[5], N_PREFILL, &mut cache, &[0], &mut state, &mut logits)
                .unwrap();
            black_box(&logits);
        })
    });
    group.finish();
}

criterion_group!(benches, bench_forward);
criterion_main!(benches);
