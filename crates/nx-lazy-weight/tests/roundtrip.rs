//! Quantize → dequantize round trips stay within each format's resolution.
//!
//! Two checks per format: every element is within half a quantization step of its
//! block/sub-block (read back from the stored scales; a full step for Q4_0/Q5_0, whose
//! symmetric grid clamps the far extreme), and the RMS error relative to the data's
//! RMS is below a format-specific bound (so the stored steps are not absurdly large;
//! measured values on Gaussian data are about 0.75× the bounds).

mod common;

use common::Rng;
use nx_lazy_weight::formats::{f16_to_f32, scale_min_k4};
use nx_lazy_weight::{dequantize_row, quantize_row, row_bytes, GgmlType};

const K: usize = 1024;

fn round_trip(ty: GgmlType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut q = vec![0u8; row_bytes(ty, x.len()).unwrap()];
    quantize_row(ty, x, &mut q).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize_row(ty, &q, &mut y).unwrap();
    (q, y)
}

/// Allowed |x − x̂| for each element, from the stored scales.
fn per_element_bound(ty: GgmlType, q: &[u8], x: &[f32]) -> Vec<f32> {
    let f16_at = |b: &[u8], o: usize| f16_to_f32(u16::from_le_bytes([b[o], b[o + 1]]));
    let mut bound = vec![0f32; x.len()];
    match ty {
        GgmlType::F16 => {
            for (b, &v) in bound.iter_mut().zip(x) {
                // Half an ulp; below 2^-14 f16 is subnormal with a fixed ulp of 2^-24.
                *b = (v.abs() * 2f32.powi(-11)).max(2f32.powi(-25));
            }
        }
        GgmlType::BF16 => {
            for (b, &v) in bound.iter_mut().zip(x) {
                *b = v.abs() * 2f32.powi(-8);
            }
        }
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => {
            for (blk, b) in q
                .chunks_exact(ty.type_size())
                .zip(bound.chunks_exact_mut(32))
            {
                let d = f16_at(blk, 0).abs();
                b.fill(if ty == GgmlType::Q8_0 {
                    // ggml's Q8_0 picks quants with the unrounded d, then stores d as
                    // f16: add up to 127 times the f16 rounding of d (half an ulp,
                    // 2^-25 in the subnormal range).
                    0.5 * d + 127.0 * (d * 2f32.powi(-11)).max(2f32.powi(-25))
                } else {
                    // Symmetric grid: the extreme opposite the chosen sign clamps by
                    // up to one full step.
                    d
                });
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            for (blk, b) in q
                .chunks_exact(ty.type_size())
                .zip(bound.chunks_exact_mut(256))
            {
                let d = f16_at(blk, 0);
                for (j, sub) in b.chunks_exact_mut(32).enumerate() {
                    let (sc, _) = scale_min_k4(j, &blk[4..16]);
                    sub.fill(0.5 * d * sc as f32);
                }
            }
        }
        GgmlType::Q6_K => {
            for (blk, b) in q
                .chunks_exact(ty.type_size())
                .zip(bound.chunks_exact_mut(256))
            {
                let d = f16_at(blk, 208);
                for (j, sub) in b.chunks_exact_mut(16).enumerate() {
                    sub.fill(0.5 * d * (blk[192 + j] as i8) as f32);
                }
            }
        }
        _ => unreachable!(),
    }
    bound
}

fn check(ty: GgmlType, rms_bound: f64) {
    let mut rng = Rng::new(ty.id() as u64 * 7919 + 1);
    for case in 0..6 {
        // Vary the scale over many orders of magnitude, with outliers and zero blocks.
        let scale = 10f32.powi(case - 3);
        let mut x = rng.normals(K, scale);
        if case == 1 {
            x[5] *= 40.0;
            x[700] *= -25.0;
        }
        if case == 2 {
            x[256..512].fill(0.0);
            x[..32].iter_mut().for_each(|v| *v = v.abs()); // one-signed sub-block
        }
        let (q, y) = round_trip(ty, &x);
        let bound = per_element_bound(ty, &q, &x);
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        for i in 0..K {
            let err = (x[i] - y[i]).abs();
            let allowed = bound[i] * 1.001 + amax * 1e-6;
            assert!(
                err <= allowed,
                "{ty} case {case} element {i}: x={} x̂={} err={err} allowed={allowed}",
                x[i],
                y[i]
            );
        }
        if case == 1 {
            // Outliers set their blocks' steps; the RMS bound is for ordinary data.
            continue;
        }
        let (mut se, mut sx) = (0f64, 0f64);
        for i in 0..K {
            se += ((x[i] - y[i]) as f64).powi(2);
            sx += (x[i] as f64).powi(2);
        }
        let rel = (se / sx).sqrt();
        assert!(
            rel <= rms_bound,
            "{ty} case {case}: relative RMS error {rel} > {rms_bound}"
        );
        if case == 2 {
            assert!(
                y[256..512].iter().all(|&v| v == 0.0),
                "{ty}: zero block not zero"
            );
        }
    }
}

#[test]
fn f16_round_trip() {
    check(GgmlType::F16, 3e-4);
}

#[test]
fn bf16_round_trip() {
    check(GgmlType::BF16, 2.5e-3);
}

#[test]
fn q8_0_round_trip() {
    check(GgmlType::Q8_0, 0.0075);
}

#[test]
fn q4_0_round_trip() {
    check(GgmlType::Q4_0, 0.11);
}

#[test]
fn q5_0_round_trip() {
    check(GgmlType::Q5_0, 0.055);
}

#[test]
fn q4_k_round_trip() {
    check(GgmlType::Q4_K, 0.11);
}

#[test]
fn q5_k_round_trip() {
    check(GgmlType::Q5_K, 0.055);
}

#[test]
fn q6_k_round_trip() {
    check(GgmlType::Q6_K, 0.027);
}

#[test]
fn f32_round_trip_is_exact() {
    let x = Rng::new(3).normals(K, 1.0);
    let (_, y) = round_trip(GgmlType::F32, &x);
    common::assert_bits_eq(&x, &y, "F32");
}
