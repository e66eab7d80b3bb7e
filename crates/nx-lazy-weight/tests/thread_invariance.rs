//! Thread invariance of the quantized matmul: splitting the weight rows over 1–4
//! threads gives results bit-identical to the single-threaded matmul, for every weight
//! type and for one, a few and many tokens.

mod common;

use common::{assert_bits_eq, random_row_bytes, Rng, WEIGHT_TYPES};
use nx_lazy_weight::{
    matmul, matmul_pool, matmul_quantized_pool, GgmlType, LazyWeight, LazyWeightError,
    QuantizedActs,
};
use nx_syscalls::ThreadPool;

const K: usize = 256;
/// Not a multiple of the 16-row chunk grain, so the last chunk is partial; large enough
/// (N·row bytes ≥ 32 KiB for every type even at one token) that the pool splits it.
const N: usize = 260;

fn random_weight(rng: &mut Rng, ty: GgmlType) -> Vec<u8> {
    (0..N).flat_map(|_| random_row_bytes(rng, ty, K)).collect()
}

#[test]
fn any_thread_count_matches_single_threaded_for_every_type() {
    let pools: Vec<ThreadPool> = (1..=4).map(ThreadPool::new).collect();
    for ty in WEIGHT_TYPES {
        let mut rng = Rng::new(0x7ead ^ ty.id() as u64);
        let bytes = random_weight(&mut rng, ty);
        let w = LazyWeight::from_parts(ty, &[K as u64, N as u64], &bytes).unwrap();
        for n in [1usize, 5, 33] {
            let x = rng.normals(n * K, 1.0);
            let mut scratch = QuantizedActs::new();
            let mut y_single = vec![0f32; n * N];
            matmul(&w, &x, n, &mut y_single, &mut scratch).unwrap();
            assert!(
                y_single.iter().all(|v| v.is_finite()) && y_single.iter().any(|&v| v != 0.0),
                "{ty} n={n}: degenerate reference output"
            );
            for pool in &pools {
                // NaN-filled: an element the threaded path forgot would show up.
                let mut y = vec![f32::NAN; n * N];
                matmul_pool(&w, &x, n, &mut y, &mut scratch, pool).unwrap();
                assert_bits_eq(
                    &y,
                    &y_single,
                    &format!("{ty} n={n} threads={}", pool.n_threads()),
                );
                if pool.n_threads() != 3 {
                    continue;
                }
                // The pre-quantized entry, reusing the holder as the block does.
                let mut yq = vec![f32::NAN; n * N];
                matmul_quantized_pool(&w, &scratch, &mut yq, pool).unwrap();
                assert_bits_eq(
                    &yq,
                    &y_single,
                    &format!("{ty} n={n} threads={} (quantized)", pool.n_threads()),
                );
            }
        }
    }
}

#[test]
fn threaded_matmul_validates_like_the_plain_one() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(5);
    let bytes = random_weight(&mut rng, GgmlType::Q8_0);
    let w = LazyWeight::from_parts(GgmlType::Q8_0, &[K as u64, N as u64], &bytes).unwrap();
    let x = rng.normals(3 * K, 1.0);
    let mut scratch = QuantizedActs::new();
    // Output one element short.
    let mut short = vec![0f32; 3 * N - 1];
    assert!(matches!(
        matmul_pool(&w, &x, 3, &mut short, &mut scratch, &pool),
        Err(LazyWeightError::LengthMismatch { .. })
    ));
    // Activations quantized for another type.
    scratch.quantize(GgmlType::F32, &x, 3, K).unwrap();
    let mut y = vec![0f32; 3 * N];
    assert!(matches!(
        matmul_quantized_pool(&w, &scratch, &mut y, &pool),
        Err(LazyWeightError::ActivationType { .. })
    ));
}
