//! Quantized dot products agree with "dequantize both sides, then an f64 dot".
//!
//! For every weight type, random raw blocks (random bytes with finite f16 scales) are
//! multiplied with random activations quantized to the type's `vec_dot_type`:
//! 1. against the dequantized activations the only differences are f32 roundings, so
//!    the error is bounded by a few ulps of the sum of the magnitudes involved;
//! 2. against the original f32 activations the error is bounded by the activation
//!    quantization error (half a step per element, read from the stored scales).
//!
//! Q4_1 and Q5_1 multiply their offset `m` with the Q8_1 block's stored sum `s`, an f16
//! of `d·Σq`: that rounding (computed exactly from the bytes) is added to both bounds.

mod common;

use common::{random_row_bytes, Rng, WEIGHT_TYPES};
use nx_lazy_weight::formats::{f16_to_f32, vec_dot_type};
use nx_lazy_weight::{dequantize_row, dot_row, quantize_row, row_bytes, GgmlType};
use proptest::prelude::*;

struct Case {
    w_deq: Vec<f32>,
    x: Vec<f32>,
    x_deq: Vec<f32>,
    x_step: Vec<f32>,
    /// `Σ |m_w|·|s_x − d_x·Σq_x|` over the blocks of a Q8_1 pairing (else 0).
    sum_rounding: f64,
    dot: f32,
}

fn make_case(ty: GgmlType, n_blocks: usize, seed: u64, x_scale_exp: i32) -> Case {
    let mut rng = Rng::new(seed);
    // Rows are a whole number of 256 so every type fits; the float types use fewer.
    let row_len = n_blocks * 256;
    let w = random_row_bytes(&mut rng, ty, row_len);
    let act = vec_dot_type(ty).unwrap();
    let mut x = rng.normals(row_len, 2f32.powi(x_scale_exp));
    // Some exact zeros and a spike, as real activations have.
    x[3] = 0.0;
    x[row_len / 2] *= 30.0;
    let mut xq = vec![0u8; row_bytes(act, row_len).unwrap()];
    quantize_row(act, &x, &mut xq).unwrap();
    let mut w_deq = vec![0f32; row_len];
    dequantize_row(ty, &w, &mut w_deq).unwrap();
    let mut x_deq = vec![0f32; row_len];
    dequantize_row(act, &xq, &mut x_deq).unwrap();
    let x_step: Vec<f32> = match act {
        GgmlType::Q8_0 => xq
            .chunks_exact(34)
            .flat_map(|b| {
                let d = f16_to_f32(u16::from_le_bytes([b[0], b[1]])).abs();
                // Half a step, plus the f16 rounding of d (at most 127·d·2^-11).
                std::iter::repeat_n(d * (0.5 + 127.0 / 2048.0), 32)
            })
            .collect(),
        GgmlType::Q8_1 => xq
            .chunks_exact(36)
            .flat_map(|b| {
                let d = f16_to_f32(u16::from_le_bytes([b[0], b[1]])).abs();
                std::iter::repeat_n(d * (0.5 + 127.0 / 2048.0), 32)
            })
            .collect(),
        GgmlType::Q8_K => xq
            .chunks_exact(292)
            .flat_map(|b| {
                let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]).abs();
                std::iter::repeat_n(d * 0.5, 256)
            })
            .collect(),
        GgmlType::F16 => x.iter().map(|v| v.abs() * 2f32.powi(-11)).collect(),
        GgmlType::BF16 => x.iter().map(|v| v.abs() * 2f32.powi(-8)).collect(),
        _ => vec![0.0; row_len],
    };
    let sum_rounding = if act == GgmlType::Q8_1 {
        let f16_at = |b: &[u8], at: usize| f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]));
        w.chunks_exact(ty.type_size())
            .zip(xq.chunks_exact(36))
            .map(|(wb, xb)| {
                let sum_q: i32 = xb[4..].iter().map(|&q| q as i8 as i32).sum();
                let exact = f16_at(xb, 0) as f64 * sum_q as f64;
                f16_at(wb, 2).abs() as f64 * (f16_at(xb, 2) as f64 - exact).abs()
            })
            .sum()
    } else {
        0.0
    };
    let dot = dot_row(ty, &w, &xq, row_len).unwrap();
    Case {
        w_deq,
        x,
        x_deq,
        x_step,
        sum_rounding,
        dot,
    }
}

/// Allowed f32 rounding difference: a few ulps of the summed magnitudes, plus one ulp
/// of `w_max·Σ|x|` for the dequantizer's own rounding of `d·sc·q − dmin·m`, whose
/// terms can be larger than the result. (Measured worst cases over these tests:
/// 0.6·ε·magnitude; the bound leaves a 10× margin and still catches an off-by-one
/// sub-block scale, see `bound_detects_a_wrong_sub_block`.)
fn rounding_tol(magnitude: f64, w_max: f64, x_abs: f64) -> f64 {
    f32::EPSILON as f64 * (6.0 * magnitude + w_max * x_abs)
}

fn check_case(ty: GgmlType, c: &Case) -> Result<(), TestCaseError> {
    let exact_deq: f64 = c
        .w_deq
        .iter()
        .zip(&c.x_deq)
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum();
    let magnitude: f64 = c
        .w_deq
        .iter()
        .zip(&c.x_deq)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum();
    let w_max = c.w_deq.iter().fold(0f64, |a, &v| a.max(v.abs() as f64));
    let x_abs: f64 = c.x_deq.iter().map(|&v| v.abs() as f64).sum();
    let tol = rounding_tol(magnitude, w_max, x_abs) + c.sum_rounding;
    prop_assert!(
        (c.dot as f64 - exact_deq).abs() <= tol,
        "{ty}: dot {} vs dequantized {} (tol {tol})",
        c.dot,
        exact_deq
    );
    let exact_f32x: f64 = c
        .w_deq
        .iter()
        .zip(&c.x)
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum();
    let quant_err: f64 = c
        .w_deq
        .iter()
        .zip(&c.x_step)
        .map(|(&a, &s)| (a as f64 * s as f64).abs())
        .sum();
    prop_assert!(
        (c.dot as f64 - exact_f32x).abs() <= quant_err * 1.001 + tol,
        "{ty}: dot {} vs f32 activations {} (bound {})",
        c.dot,
        exact_f32x,
        quant_err + tol
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 64 },
        ..ProptestConfig::default()
    })]

    #[test]
    fn quantized_dot_matches_dequantized(
        type_index in 0usize..WEIGHT_TYPES.len(),
        n_blocks in 1usize..5,
        seed in any::<u64>(),
        x_scale_exp in -12i32..8,
    ) {
        let ty = WEIGHT_TYPES[type_index];
        let c = make_case(ty, n_blocks, seed, x_scale_exp);
        check_case(ty, &c)?;
    }
}

/// Every type, a fixed spread of seeds (so each type is covered whatever proptest draws).
#[test]
fn every_type_many_seeds() {
    for ty in WEIGHT_TYPES {
        // Under Miri (thousands of times slower) a few seeds per type: every kernel still runs.
        for seed in 0..if cfg!(miri) { 3 } else { 40u64 } {
            let c = make_case(
                ty,
                1 + (seed as usize % 4),
                seed * 31 + ty.id() as u64,
                (seed % 13) as i32 - 6,
            );
            if let Err(e) = check_case(ty, &c) {
                panic!("{ty} seed {seed}: {e}");
            }
        }
    }
}

/// The bound is tight enough to catch a kernel that drops one sub-block's scale.
#[test]
fn bound_detects_a_wrong_sub_block() {
    let mut rng = Rng::new(99);
    let ty = GgmlType::Q4_K;
    let w = random_row_bytes(&mut rng, ty, 256);
    let x = rng.normals(256, 1.0);
    let mut xq = vec![0u8; 292];
    quantize_row(GgmlType::Q8_K, &x, &mut xq).unwrap();
    let good = dot_row(ty, &w, &xq, 256).unwrap() as f64;
    // Perturb the weight's first sub-block scale: the dot must move by more than tol.
    let mut w2 = w.clone();
    w2[4] ^= 1;
    let bad = dot_row(ty, &w2, &xq, 256).unwrap() as f64;
    let mut w_deq = vec![0f32; 256];
    dequantize_row(ty, &w, &mut w_deq).unwrap();
    let mut x_deq = vec![0f32; 256];
    dequantize_row(GgmlType::Q8_K, &xq, &mut x_deq).unwrap();
    let magnitude: f64 = w_deq
        .iter()
        .zip(&x_deq)
        .map(|(&a, &b)| (a as f64 * b as f64).abs())
        .sum();
    let w_max = w_deq.iter().fold(0f64, |a, &v| a.max(v.abs() as f64));
    let x_abs: f64 = x_deq.iter().map(|&v| v.abs() as f64).sum();
    let tol = rounding_tol(magnitude, w_max, x_abs);
    assert!(
        (good - bad).abs() > 10.0 * tol,
        "good {good} bad {bad} tol {tol}"
    );
}
