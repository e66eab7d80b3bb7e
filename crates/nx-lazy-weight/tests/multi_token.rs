//! The four-token and four-row dot kernels against the single-token ones, bit for bit.
//!
//! A four-token kernel decodes each weight block once for four activation rows; its
//! output `t` must be the very bits of the same tier's single-token kernel on
//! `(w, x[t])`, because the matmul mixes the two (groups of four, then the rest) and
//! the engine's logits must not depend on how many tokens a chunk holds (EQUIV-1).
//! Checked per type and per tier this CPU supports, on raw random weight blocks and on
//! quantizer-made ones, then through the matmul for several token counts against
//! `dot_row` element by element.

mod common;

use common::{
    assert_bits_eq, check_matmul_against_dot_row, check_matmul_against_dot_row_blocks, weight_row,
    Rng,
};
use nx_lazy_weight::{
    active_tier, dot_kernel4_for, dot_kernel_for, dot_kernel_rows4_for, quantize_row, row_bytes,
    supported_tiers, uses_tiled_kernels, vec_dot_type, CpuTier, GgmlType,
};

/// The types with four-token kernels on some tier.
const MULTI_TYPES: [GgmlType; 22] = [
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_M,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::IQ1_S,
    GgmlType::MXFP4,
    GgmlType::TQ2_0,
    GgmlType::TQ1_0,
];

/// The types with 16-token tiles on the AVX-512 VNNI tier (the first of [`MULTI_TYPES`]).
const TILED_TYPES: [GgmlType; 18] = [
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_M,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
];

/// An activation row quantized to `ty`'s dot type; the scale varies per row so the four
/// tokens of a group have different block scales. Some rows carry a large outlier so
/// quants reach ±127/−128.
fn act_row(rng: &mut Rng, ty: GgmlType, k: usize, t: usize) -> Vec<u8> {
    let act = vec_dot_type(ty).unwrap();
    let mut x = rng.normals(k, 0.1 * (t + 1) as f32);
    if t % 3 == 1 {
        x[t % k] = -40.0;
    }
    let mut row = vec![0u8; row_bytes(act, k).unwrap()];
    quantize_row(act, &x, &mut row).unwrap();
    row
}

#[test]
fn x86_tiers_have_four_token_kernels() {
    // Keeps the other tests from passing vacuously on a CPU that has these tiers.
    for tier in [CpuTier::Avx2, CpuTier::Avx512Vnni] {
        if supported_tiers().contains(&tier) {
            for ty in MULTI_TYPES {
                assert!(
                    dot_kernel4_for(tier, ty).is_some(),
                    "{tier} {ty}: no four-token kernel"
                );
            }
        }
    }
    // The scalar tier's: the formats of the common files (the default model's among them).
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        assert!(
            dot_kernel4_for(CpuTier::Scalar, ty).is_some(),
            "scalar {ty}: no four-token kernel"
        );
    }
    // No tier hands out a four-token kernel for a type without one.
    for tier in supported_tiers() {
        assert!(dot_kernel4_for(tier, GgmlType::F32).is_none(), "{tier}");
        assert!(dot_kernel4_for(tier, GgmlType::BF16).is_none(), "{tier}");
    }
}

#[test]
fn four_token_kernel_equals_single_token_kernel_bit_for_bit() {
    let mut checked = 0;
    for tier in supported_tiers() {
        for ty in MULTI_TYPES {
            let Some(four) = dot_kernel4_for(tier, ty) else {
                continue;
            };
            let single = dot_kernel_for(tier, ty).unwrap();
            let block = ty.block_size();
            for (case, n_blocks) in [1usize, 2, 3, 8, 17].into_iter().enumerate() {
                for via_quantizer in [false, true] {
                    let k = n_blocks * block;
                    let mut rng = Rng::new(
                        (ty.id() as u64) << 16 | (case as u64) << 1 | via_quantizer as u64,
                    );
                    let w = weight_row(&mut rng, ty, k, via_quantizer);
                    let xs: Vec<Vec<u8>> = (0..4).map(|t| act_row(&mut rng, ty, k, t)).collect();
                    let got = four(&w, [&xs[0], &xs[1], &xs[2], &xs[3]]);
                    let want: Vec<f32> = xs.iter().map(|x| single(&w, x)).collect();
                    assert!(
                        want.iter().all(|v| v.is_finite()),
                        "{tier} {ty}: non-finite"
                    );
                    assert!(want.iter().any(|&v| v != 0.0), "{tier} {ty}: all zero");
                    assert_bits_eq(
                        &got,
                        &want,
                        &format!("{tier} {ty} K={k} quantizer={via_quantizer}"),
                    );
                    // The same row in several slots, and token order, change nothing.
                    let got = four(&w, [&xs[3], &xs[0], &xs[3], &xs[1]]);
                    assert_bits_eq(
                        &got,
                        &[want[3], want[0], want[3], want[1]],
                        &format!("{tier} {ty} K={k} permuted"),
                    );
                    checked += 1;
                }
            }
        }
    }
    eprintln!("four-token cases checked: {checked}");
}

#[test]
fn four_row_kernel_equals_single_token_kernel_bit_for_bit() {
    let mut checked = 0;
    for tier in supported_tiers() {
        if tier == CpuTier::Avx2 {
            for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
                assert!(dot_kernel_rows4_for(tier, ty).is_some(), "{tier} {ty}");
            }
        }
        if tier == CpuTier::Avx512Vnni {
            for ty in [
                GgmlType::Q4_0,
                GgmlType::Q5_0,
                GgmlType::Q8_0,
                GgmlType::Q4_1,
                GgmlType::Q5_1,
                GgmlType::IQ4_NL,
                GgmlType::IQ4_XS,
                GgmlType::MXFP4,
                GgmlType::Q4_K,
                GgmlType::Q5_K,
                GgmlType::Q6_K,
                GgmlType::Q2_K,
                GgmlType::Q3_K,
            ] {
                assert!(dot_kernel_rows4_for(tier, ty).is_some(), "{tier} {ty}");
            }
        }
        for ty in MULTI_TYPES {
            let Some(rows4) = dot_kernel_rows4_for(tier, ty) else {
                continue;
            };
            let single = dot_kernel_for(tier, ty).unwrap();
            let block = ty.block_size();
            for (case, n_blocks) in [1usize, 2, 3, 8, 17].into_iter().enumerate() {
                for via_quantizer in [false, true] {
                    let k = n_blocks * block;
                    let mut rng = Rng::new(
                        (ty.id() as u64) << 20 | (case as u64) << 1 | via_quantizer as u64,
                    );
                    let ws: Vec<Vec<u8>> = (0..4)
                        .map(|_| weight_row(&mut rng, ty, k, via_quantizer))
                        .collect();
                    let x = act_row(&mut rng, ty, k, case);
                    let got = rows4([&ws[0], &ws[1], &ws[2], &ws[3]], &x);
                    let want: Vec<f32> = ws.iter().map(|w| single(w, &x)).collect();
                    assert!(want.iter().any(|&v| v != 0.0), "{tier} {ty}: all zero");
                    assert_bits_eq(
                        &got,
                        &want,
                        &format!("{tier} {ty} K={k} quantizer={via_quantizer} rows4"),
                    );
                    checked += 1;
                }
            }
        }
    }
    eprintln!("four-row cases checked: {checked}");
}

#[test]
fn avx512_tier_tiles_every_multi_type() {
    // Keeps the token counts ≥ 16 below from passing without exercising the tiles.
    if active_tier().unwrap() == CpuTier::Avx512Vnni {
        // Where Q4_K / Q6_K take AMX, the other Q8_K formats read a second, VNNI layout
        // of the same activations: every tiled type takes its tiles.
        for ty in TILED_TYPES {
            assert!(uses_tiled_kernels(ty), "{ty}");
        }
    }
    // The formats of `formats::BLOCK_FORMATS` have no tiles yet (four-token kernels only).
    for ty in &MULTI_TYPES[TILED_TYPES.len()..] {
        assert!(!uses_tiled_kernels(*ty), "{ty}");
    }
    assert!(!uses_tiled_kernels(GgmlType::F32));
}

#[test]
fn matmul_with_grouped_tokens_equals_dot_row_per_element() {
    // 16 and more tokens take the tiled kernels (AVX-512 VNNI, or AMX for the K formats
    // where the CPU has it) for whole groups of 16; the 2 to 16 tokens after them take
    // the narrow tiles (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and, from five on, Q6_K on AVX-512
    // VNNI). On the AVX2 tier (gate
    // TOKENS-AVX2) every Q4_0/Q5_0/Q8_0 matmul of two or more tokens takes the token
    // groups of eight, and 2 or 3 tokens after the groups of four take the four-token
    // kernel padded. With Q8_K or Q8_1 activations, 8 to 15 tokens after a whole group
    // (24, 31) take a padded group of the tiles.
    for ty in MULTI_TYPES {
        check_matmul_against_dot_row(ty, &[1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 18, 24, 31, 33, 37]);
    }
    // IQ4_NL pairs its blocks (an odd last one is added apart): rows of an even count
    // of blocks too.
    check_matmul_against_dot_row_blocks(GgmlType::IQ4_NL, &[16, 33], 4);
}
