//! Thread invariance of the block: a layer run on pools of 1–4 threads gives a
//! bit-identical residual stream, for f16 and f32 caches, global and windowed attention,
//! over a prefill chunk, a second chunk and a decode step.

use nx_f32::RopeStyle;
use nx_kv_cache::{KvCache, KvDtype};
use nx_lazy_weight::{quantize_row, row_bytes, GgmlType, LazyWeight};
use nx_llama_block::{forward, BlockScratch, FfnActivation, FfnWeights, LayerConfig, LayerWeights};
use nx_syscalls::ThreadPool;

const N_EMBD: usize = 256;
const N_FF: usize = 512;
const N_HEAD: usize = 4;
const N_HEAD_KV: usize = 2;
const HEAD_DIM: usize = 64;
/// Chunk sizes fed in order: the first two are large enough for attention to be split
/// across threads, the last (decode) is not; every matmul here is split.
const CHUNKS: [usize; 3] = [9, 7, 1];

/// SplitMix64-based normals: deterministic test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // Sum of uniforms: roughly normal, bounded.
        let u = |s: u64| (s & 0xFFFF) as f32 / 65536.0 - 0.5;
        u(z) + u(z >> 16) + u(z >> 32) + u(z >> 48)
    }

    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// A `[k, n]` weight quantized to `ty` from random values.
fn weight_bytes(rng: &mut Rng, ty: GgmlType, k: usize, n: usize) -> Vec<u8> {
    let rb = row_bytes(ty, k).unwrap();
    let mut out = vec![0u8; rb * n];
    for row in out.chunks_exact_mut(rb) {
        quantize_row(ty, &rng.vec(k, 0.15), row).unwrap();
    }
    out
}

struct Tensors {
    norms: Vec<Vec<f32>>,
    mats: Vec<(GgmlType, usize, usize, Vec<u8>)>,
}

fn make_tensors(rng: &mut Rng) -> Tensors {
    let norms = (0..6)
        .map(|i| {
            let len = if i < 2 { HEAD_DIM } else { N_EMBD };
            rng.vec(len, 0.5).iter().map(|v| 1.0 + v).collect()
        })
        .collect();
    let q_dim = N_HEAD * HEAD_DIM;
    let kv_dim = N_HEAD_KV * HEAD_DIM;
    let shapes = [
        (GgmlType::Q8_0, N_EMBD, q_dim),  // wq
        (GgmlType::Q8_0, N_EMBD, kv_dim), // wk
        (GgmlType::Q5_0, N_EMBD, kv_dim), // wv
        (GgmlType::Q8_0, q_dim, N_EMBD),  // wo
        (GgmlType::Q4_K, N_EMBD, N_FF),   // gate
        (GgmlType::Q4_K, N_EMBD, N_FF),   // up
        (GgmlType::Q6_K, N_FF, N_EMBD),   // down
    ];
    let mats = shapes
        .iter()
        .map(|&(ty, k, n)| (ty, k, n, weight_bytes(rng, ty, k, n)))
        .collect();
    Tensors { norms, mats }
}

fn layer_weights(t: &Tensors) -> LayerWeights<'_> {
    let m = |i: usize| {
        let (ty, k, n, ref bytes) = t.mats[i];
        LazyWeight::from_parts(ty, &[k as u64, n as u64], bytes).unwrap()
    };
    LayerWeights {
        attn_norm: Some(&t.norms[2]),
        wq: m(0),
        wk: m(1),
        wv: m(2),
        bq: None,
        bk: None,
        bv: None,
        q_norm: Some(&t.norms[0]),
        k_norm: Some(&t.norms[1]),
        wo: m(3),
        post_attn_norm: Some(&t.norms[3]),
        ffn_norm: Some(&t.norms[4]),
        ffn: FfnWeights::Dense {
            gate: m(4),
            up: m(5),
            down: m(6),
        },
        post_ffn_norm: Some(&t.norms[5]),
        rope_freq_factors: None,
    }
}

fn config(window: Option<usize>) -> LayerConfig {
    LayerConfig {
        n_embd: N_EMBD,
        n_ff: N_FF,
        n_head: N_HEAD,
        n_head_kv: N_HEAD_KV,
        head_dim: HEAD_DIM,
        value_dim: HEAD_DIM,
        rms_eps: 1e-6,
        use_rope: true,
        rope_base: 10_000.0,
        rope_freq_scale: 1.0,
        rope_attn_factor: 1.0,
        rope_yarn_orig_ctx: None,
        rope_dim: HEAD_DIM,
        rope_style: RopeStyle::Neox,
        window,
        q_scale: 1.0 / (HEAD_DIM as f32).sqrt(),
        kq_scale: 1.0,
        attn_softcap: None,
        residual_scale: None,
        ffn_activation: FfnActivation::GeluTanh,
    }
}

/// The residual stream after each chunk, concatenated.
fn run(
    cfg: &LayerConfig,
    w: &LayerWeights<'_>,
    dtype: KvDtype,
    inputs: &[Vec<f32>],
    pool: &ThreadPool,
) -> Vec<f32> {
    let total: usize = CHUNKS.iter().sum();
    let mut cache = KvCache::new(1, total, N_HEAD_KV * HEAD_DIM, dtype).unwrap();
    let mut scratch = BlockScratch::default();
    let mut out = Vec::new();
    let mut pos = 0;
    for (x0, &n) in inputs.iter().zip(CHUNKS.iter()) {
        let mut x = x0.clone();
        forward(cfg, w, 0, &mut x, n, pos, &mut cache, &mut scratch, pool).unwrap();
        cache.advance(n).unwrap();
        pos += n;
        out.extend_from_slice(&x);
    }
    out
}

#[test]
fn block_output_is_bit_identical_for_any_thread_count() {
    let mut rng = Rng(42);
    let tensors = make_tensors(&mut rng);
    let w = layer_weights(&tensors);
    let inputs: Vec<Vec<f32>> = CHUNKS.iter().map(|&n| rng.vec(n * N_EMBD, 2.0)).collect();
    let pools: Vec<ThreadPool> = (1..=4).map(ThreadPool::new).collect();
    for dtype in [KvDtype::F16, KvDtype::F32] {
        for window in [None, Some(5)] {
            let cfg = config(window);
            let reference = run(&cfg, &w, dtype, &inputs, &pools[0]);
            assert!(reference.iter().all(|v| v.is_finite()));
            for pool in &pools[1..] {
                let got = run(&cfg, &w, dtype, &inputs, pool);
                for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "{dtype:?} window {window:?} threads {}: element {i}: {a:e} vs {b:e}",
                        pool.n_threads()
                    );
                }
            }
        }
    }
}
