//! Batch invariance of the quantized matmul: `y[t][r]` is bit-identical whether token
//! `t` is computed alone or inside a batch, and whatever range of weight rows is
//! computed together; the quantized-activation holder is reusable across weights.

mod common;

use common::{assert_bits_eq, has_quantizer, random_row_bytes, Rng, WEIGHT_TYPES};
use nx_lazy_weight::{
    dot_row, matmul, matmul_quantized, matmul_rows, quantize_row, GgmlType, LazyWeight,
    LazyWeightError, QuantizedActs,
};

const K: usize = 512;
const N: usize = 13;
const N_TOKENS: usize = 7;

fn weight_bytes(rng: &mut Rng, ty: GgmlType, via_quantizer: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..N {
        if via_quantizer && has_quantizer(ty) {
            let x = rng.normals(K, 0.05);
            let mut row = vec![0u8; nx_lazy_weight::row_bytes(ty, K).unwrap()];
            quantize_row(ty, &x, &mut row).unwrap();
            out.extend_from_slice(&row);
        } else {
            out.extend_from_slice(&random_row_bytes(rng, ty, K));
        }
    }
    out
}

#[test]
fn token_alone_equals_token_in_batch_for_every_type() {
    for ty in WEIGHT_TYPES {
        for via_quantizer in [false, true] {
            let mut rng = Rng::new(ty.id() as u64 * 100 + via_quantizer as u64);
            let bytes = weight_bytes(&mut rng, ty, via_quantizer);
            let w = LazyWeight::from_parts(ty, &[K as u64, N as u64], &bytes).unwrap();
            let x = rng.normals(N_TOKENS * K, 1.0);

            let mut scratch = QuantizedActs::new();
            let mut y_batch = vec![0f32; N_TOKENS * N];
            matmul(&w, &x, N_TOKENS, &mut y_batch, &mut scratch).unwrap();
            assert!(
                y_batch.iter().all(|v| v.is_finite()),
                "{ty}: non-finite output"
            );
            assert!(y_batch.iter().any(|&v| v != 0.0), "{ty}: all-zero output");

            // Each token alone (n = 1), with a fresh holder.
            for t in 0..N_TOKENS {
                let mut alone = QuantizedActs::new();
                let mut y1 = vec![0f32; N];
                w.matmul(&x[t * K..(t + 1) * K], 1, &mut y1, &mut alone)
                    .unwrap();
                assert_bits_eq(
                    &y1,
                    &y_batch[t * N..(t + 1) * N],
                    &format!("{ty} token {t} alone"),
                );
            }

            // A sub-batch in a different position (tokens 2..5).
            let mut y_sub = vec![0f32; 3 * N];
            matmul(&w, &x[2 * K..5 * K], 3, &mut y_sub, &mut scratch).unwrap();
            assert_bits_eq(&y_sub, &y_batch[2 * N..5 * N], &format!("{ty} sub-batch"));

            // Weight rows split in uneven ranges, as threads would, then scattered.
            scratch.quantize_for(&w, &x, N_TOKENS).unwrap();
            let mut y_split = vec![0f32; N_TOKENS * N];
            for range in [0..1, 1..6, 6..6, 6..N] {
                let width = range.len();
                let mut part = vec![0f32; N_TOKENS * width];
                matmul_rows(&w, &scratch, range.clone(), &mut part).unwrap();
                for t in 0..N_TOKENS {
                    y_split[t * N + range.start..t * N + range.end]
                        .copy_from_slice(&part[t * width..(t + 1) * width]);
                }
            }
            assert_bits_eq(&y_split, &y_batch, &format!("{ty} row ranges"));

            // And every element is exactly one dot_row call.
            for t in 0..N_TOKENS {
                for r in 0..N {
                    let d = dot_row(ty, w.row(r), scratch.get_row(t).unwrap(), K).unwrap();
                    assert_eq!(
                        d.to_bits(),
                        y_batch[t * N + r].to_bits(),
                        "{ty} t={t} r={r}"
                    );
                    assert_eq!(w.dot(r, &scratch, t).unwrap().to_bits(), d.to_bits());
                }
            }
        }
    }
}

#[test]
fn one_holder_serves_several_weights_with_the_same_k() {
    // Q5_0 and Q8_0 both take Q8_0 activations (like Gemma's attn_q and attn_v).
    let mut rng = Rng::new(5);
    let q_bytes = weight_bytes(&mut rng, GgmlType::Q5_0, true);
    let v_bytes = weight_bytes(&mut rng, GgmlType::Q8_0, true);
    let wq = LazyWeight::from_parts(GgmlType::Q5_0, &[K as u64, N as u64], &q_bytes).unwrap();
    let wv = LazyWeight::from_parts(GgmlType::Q8_0, &[K as u64, N as u64], &v_bytes).unwrap();
    let x = rng.normals(3 * K, 1.0);

    let mut shared = QuantizedActs::new();
    shared.quantize_for(&wq, &x, 3).unwrap();
    assert!(shared.fits(&wv));
    let (mut yq, mut yv) = (vec![0f32; 3 * N], vec![0f32; 3 * N]);
    matmul_quantized(&wq, &shared, &mut yq).unwrap();
    matmul_quantized(&wv, &shared, &mut yv).unwrap();

    let (mut yq2, mut yv2) = (vec![0f32; 3 * N], vec![0f32; 3 * N]);
    matmul(&wq, &x, 3, &mut yq2, &mut QuantizedActs::new()).unwrap();
    matmul(&wv, &x, 3, &mut yv2, &mut QuantizedActs::new()).unwrap();
    assert_bits_eq(&yq, &yq2, "shared holder, Q5_0");
    assert_bits_eq(&yv, &yv2, "shared holder, Q8_0");

    // A Q4_K weight needs Q8_K activations: a typed error, not a wrong answer.
    let k_bytes = weight_bytes(&mut rng, GgmlType::Q4_K, true);
    let wk = LazyWeight::from_parts(GgmlType::Q4_K, &[K as u64, N as u64], &k_bytes).unwrap();
    assert!(!shared.fits(&wk));
    assert!(matches!(
        matmul_quantized(&wk, &shared, &mut yq),
        Err(LazyWeightError::ActivationType {
            expected: GgmlType::Q8_K,
            actual: GgmlType::Q8_0,
            ..
        })
    ));
}

#[test]
fn shape_errors_are_typed() {
    let mut rng = Rng::new(9);
    let bytes = weight_bytes(&mut rng, GgmlType::Q8_0, true);
    let w = LazyWeight::from_parts(GgmlType::Q8_0, &[K as u64, N as u64], &bytes).unwrap();
    let x = rng.normals(2 * K, 1.0);
    let mut s = QuantizedActs::new();
    let mut y = vec![0f32; 2 * N];
    assert!(matches!(
        matmul(&w, &x[..K + 1], 2, &mut y, &mut s),
        Err(LazyWeightError::LengthMismatch { .. })
    ));
    assert!(matches!(
        matmul(&w, &x, 2, &mut y[..N], &mut s),
        Err(LazyWeightError::LengthMismatch { .. })
    ));
    s.quantize_for(&w, &x, 2).unwrap();
    assert!(matches!(
        matmul_rows(&w, &s, 5..N + 1, &mut [0f32; 2 * (N - 4)]),
        Err(LazyWeightError::RowOutOfRange { .. })
    ));
    // K = 512 activations for a K = 256 weight.
    let small = weight_bytes(&mut rng, GgmlType::Q8_0, true);
    let w_small = LazyWeight::from_parts(GgmlType::Q8_0, &[256, (2 * N) as u64], &small).unwrap();
    assert!(matches!(
        matmul_quantized(&w_small, &s, &mut [0f32; 2 * 2 * N]),
        Err(LazyWeightError::LengthMismatch { .. })
    ));
}
