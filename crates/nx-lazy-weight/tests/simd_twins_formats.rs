//! The SIMD kernels of every quantized weight format (`formats::BLOCK_FORMATS`) against
//! their scalar twins, on every tier this CPU supports: bit for bit, since every twin keeps the
//! reference engine's x86 float order.
//!
//! Three kinds of rows per weight type and tier: weights of random bytes with random
//! finite scales against activations from the real quantizer (realistic); the same
//! weights against activation rows of random bytes with random scales (every byte value,
//! −128 included); and weights whose quant bytes are all 0x00, 0xFF, 0x80 or 0x7F against
//! activations all −128, 127 or 0 (the saturation and sign corners of `maddubs`).
//! Row lengths include odd block counts (IQ4_NL's unpaired last block).

mod common;

use common::{random_row_bytes, Rng};
use nx_lazy_weight::dot_scalar::dot_kernel;
use nx_lazy_weight::formats::{f32_to_f16, q8_k, vec_dot_type, BLOCK_FORMATS};
use nx_lazy_weight::{dot_kernel_for, quantize_row, row_bytes, supported_tiers, CpuTier, GgmlType};

/// The weight types of the table (Q8_1 is an activation format).
fn weight_types() -> Vec<GgmlType> {
    BLOCK_FORMATS
        .iter()
        .filter(|f| f.dot.is_some())
        .map(|f| f.ggml_type)
        .collect()
}

/// Every supported tier, the scalar one too (on an x86 CPU with AVX2 and FMA its kernels
/// are the scalar source compiled a second time for them, which must give the plain
/// build's bits).
fn tiers_under_test() -> Vec<CpuTier> {
    supported_tiers()
}

fn lengths(ty: GgmlType) -> &'static [usize] {
    if ty.block_size() == 256 {
        &[256, 768, 2048]
    } else {
        &[32, 96, 672, 2048 + 32]
    }
}

/// Activations of random bytes with a random scale per block (Q8_0: `d`; Q8_1: `d` and
/// `s`; Q8_K: `d`, bsums the sums of the quants, as the quantizer writes them).
fn random_acts(rng: &mut Rng, act: GgmlType, row_len: usize, fill: Option<u8>) -> Vec<u8> {
    let mut row: Vec<u8> = (0..row_bytes(act, row_len).unwrap())
        .map(|_| rng.byte())
        .collect();
    for block in row.chunks_exact_mut(act.type_size()) {
        let d = rng.signed_pow2(-10.0, 0.0);
        match act {
            GgmlType::Q8_0 => {
                block[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                if let Some(v) = fill {
                    block[2..].fill(v);
                }
            }
            GgmlType::Q8_1 => {
                block[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
                let s = rng.signed_pow2(-6.0, 6.0);
                block[2..4].copy_from_slice(&f32_to_f16(s).to_le_bytes());
                if let Some(v) = fill {
                    block[4..].fill(v);
                }
            }
            GgmlType::Q8_K => {
                block[0..4].copy_from_slice(&d.to_le_bytes());
                if let Some(v) = fill {
                    block[q8_k::QS..q8_k::BSUMS].fill(v);
                }
                for j in 0..16 {
                    let at = q8_k::QS + 16 * j;
                    let sum: i16 = block[at..at + 16].iter().map(|&b| b as i8 as i16).sum();
                    let to = q8_k::BSUMS + 2 * j;
                    block[to..to + 2].copy_from_slice(&sum.to_le_bytes());
                }
            }
            _ => unreachable!("{act}"),
        }
    }
    row
}

fn check(tier: CpuTier, ty: GgmlType, w: &[u8], x: &[u8], what: &str) {
    let scalar = dot_kernel(ty).unwrap();
    let simd = dot_kernel_for(tier, ty).unwrap();
    let (a, b) = (scalar(w, x), simd(w, x));
    assert!(
        a.to_bits() == b.to_bits(),
        "{tier} {ty} {what}: scalar {a:e} ({:08x}) simd {b:e} ({:08x})",
        a.to_bits(),
        b.to_bits()
    );
}

#[test]
fn every_tier_has_its_own_kernel() {
    let types = weight_types();
    assert_eq!(types.len(), 22, "{types:?}");
    for tier in tiers_under_test() {
        for &ty in &types {
            let scalar = dot_kernel(ty).unwrap();
            let simd = dot_kernel_for(tier, ty).unwrap();
            if matches!(tier, CpuTier::Avx2 | CpuTier::Avx512Vnni) {
                assert_ne!(
                    scalar as usize, simd as usize,
                    "{tier} {ty}: the scalar kernel"
                );
            }
        }
    }
}

#[test]
fn simd_kernels_are_bit_identical_to_their_scalar_twins() {
    for tier in tiers_under_test() {
        for ty in weight_types() {
            let act = vec_dot_type(ty).unwrap();
            for &row_len in lengths(ty) {
                let mut rng = Rng::new(ty.id() as u64 * 131 + row_len as u64);
                for case in 0..40 {
                    let w = random_row_bytes(&mut rng, ty, row_len);
                    let mut values = rng.normals(row_len, 1.0);
                    values[row_len / 3] *= 40.0;
                    values[1] = 0.0;
                    let mut xq = vec![0u8; row_bytes(act, row_len).unwrap()];
                    quantize_row(act, &values, &mut xq).unwrap();
                    check(tier, ty, &w, &xq, &format!("K={row_len} realistic {case}"));
                    let raw = random_acts(&mut rng, act, row_len, None);
                    check(tier, ty, &w, &raw, &format!("K={row_len} raw {case}"));
                }
            }
        }
    }
}

#[test]
fn simd_kernels_are_bit_identical_at_the_byte_extremes() {
    for tier in tiers_under_test() {
        for ty in weight_types() {
            let act = vec_dot_type(ty).unwrap();
            let row_len = 2 * ty.block_size();
            let mut rng = Rng::new(7 + ty.id() as u64);
            for w_fill in [0x00u8, 0xFF, 0x80, 0x7F] {
                // Random scale fields (finite), every other byte `w_fill`.
                let scaled = random_row_bytes(&mut rng, ty, row_len);
                let filled: Vec<u8> = vec![w_fill; scaled.len()];
                let w = restore_scale_fields(ty, &filled, &scaled);
                for x_fill in [0x80u8, 0x7F, 0x00] {
                    let x = random_acts(&mut rng, act, row_len, Some(x_fill));
                    check(tier, ty, &w, &x, &format!("w={w_fill:#x} x={x_fill:#x}"));
                }
            }
        }
    }
}

/// `filled` with the f16 scale fields of `scaled` copied in (so the extreme quant bytes
/// meet finite scales).
fn restore_scale_fields(ty: GgmlType, filled: &[u8], scaled: &[u8]) -> Vec<u8> {
    let fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        // MXFP4's scale is a byte: the fill bytes 0x00, 0x7F, 0x80, 0xFF are valid ones.
        GgmlType::MXFP4 => &[],
        GgmlType::TQ2_0 => &[64],
        GgmlType::TQ1_0 => &[52],
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => &[0],
        GgmlType::IQ3_XXS | GgmlType::IQ3_S | GgmlType::IQ1_S => &[0],
        // IQ1_M's scale is four nibbles: its scale words are copied whole.
        GgmlType::IQ1_M => &[48, 50, 52, 54],
        _ => unreachable!("{ty}"),
    };
    let mut out = filled.to_vec();
    for (o, s) in out
        .chunks_exact_mut(ty.type_size())
        .zip(scaled.chunks_exact(ty.type_size()))
    {
        for &at in fields {
            o[at..at + 2].copy_from_slice(&s[at..at + 2]);
        }
    }
    out
}
