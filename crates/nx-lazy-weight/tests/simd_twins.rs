//! Every SIMD dot kernel against its scalar twin, for every tier this CPU supports (the
//! scalar tier too: its AVX2 + FMA copies of the scalar source).
//!
//! Two properties per quantized weight type and tier:
//! 1. Integer parts exact. With all float scales 1.0 and small sub-block scales, every
//!    term and every partial sum is an integer below 2^24, so any f32 summation order is
//!    exact and the SIMD result must equal the scalar one bit for bit. The quant bytes
//!    themselves are unrestricted (full-range weights, activations including −128), so
//!    this checks the per-block integer sums for every byte pattern.
//! 2. Floats within a stated bound. With random finite scales and activations from the
//!    real quantizer, `|simd − scalar| ≤ 2·(n_blocks + 16)·ε·M`, where `M` is the sum of
//!    the magnitudes the kernels accumulate (`Σ|x|·(|d·sc·q| + |dmin·m|)` per element).
//!    Both kernels sum the same exact per-block integers in f32, each with at most
//!    `n_blocks + 16` roundings in any chain, so this is a worst-case bound, not a fit.
//!    The bound is checked to be tight enough to notice one flipped sub-block scale bit.
//! 3. Bits identical. Every scalar twin uses the x86 float order (`Lanes8`), so the SIMD
//!    result must equal it bit for bit on realistic and raw random rows: the tier never
//!    changes a model's output. (The formats of `formats::BLOCK_FORMATS` have their own
//!    twin test, `tests/simd_twins_formats.rs`.)

mod common;

use common::{random_row_bytes, Rng};
use nx_lazy_weight::dot_scalar::dot_kernel;
use nx_lazy_weight::formats::{f32_to_f16, pack_scale_min_k4, q4_k, q6_k, q8_k, vec_dot_type};
use nx_lazy_weight::{
    dequantize_row, dot_kernel_for, dot_row, quantize_row, row_bytes, supported_tiers, CpuTier,
    DotKernel, GgmlType,
};

/// The quantized weight types with SIMD kernels.
const QUANT_TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The tiers to test: every supported one, the scalar tier too (on an x86 CPU with AVX2
/// and FMA its kernels are the scalar source compiled a second time for them, which must
/// give the plain build's bits).
fn tiers_under_test() -> Vec<CpuTier> {
    let tiers = supported_tiers();
    eprintln!("tiers under test: {tiers:?}");
    tiers
}

/// Scalar twin and the tier's kernel; on x86 the tier's kernel must really be a
/// different function (so this file cannot pass by testing scalar against itself).
fn kernels(tier: CpuTier, ty: GgmlType) -> (DotKernel, DotKernel) {
    let scalar = dot_kernel(ty).unwrap();
    let simd = dot_kernel_for(tier, ty).unwrap();
    if matches!(tier, CpuTier::Avx2 | CpuTier::Avx512Vnni) {
        assert_ne!(
            scalar as usize, simd as usize,
            "{tier} {ty}: SIMD kernel is the scalar one"
        );
    }
    (scalar, simd)
}

const ONE_F16: [u8; 2] = [0x00, 0x3c];

/// A weight row with every float scale 1.0, sub-block scales and mins small (so sums
/// stay below 2^24), and every quant byte random.
fn unit_scale_weights(rng: &mut Rng, ty: GgmlType, row_len: usize) -> Vec<u8> {
    let mut row: Vec<u8> = (0..row_bytes(ty, row_len).unwrap())
        .map(|_| rng.byte())
        .collect();
    for block in row.chunks_exact_mut(ty.type_size()) {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
                block[0..2].copy_from_slice(&ONE_F16)
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                block[0..2].copy_from_slice(&ONE_F16);
                block[q4_k::DMIN..q4_k::DMIN + 2].copy_from_slice(&ONE_F16);
                let sc: [u8; 8] = std::array::from_fn(|_| rng.byte() % 4);
                let m: [u8; 8] = std::array::from_fn(|_| rng.byte() % 4);
                pack_scale_min_k4(&sc, &m, &mut block[q4_k::SCALES..q4_k::SCALES + 12]);
            }
            GgmlType::Q6_K => {
                block[q6_k::D..q6_k::D + 2].copy_from_slice(&ONE_F16);
                for s in &mut block[q6_k::SCALES..q6_k::SCALES + 16] {
                    *s = ((rng.byte() % 3) as i8 - 1) as u8; // −1, 0 or 1
                }
            }
            _ => unreachable!(),
        }
    }
    row
}

/// An activation row in `act` (Q8_0 or Q8_K) with scale 1.0 and random quant bytes
/// (every value −128..=127); Q8_K bsums are the sums of the quants, as the kernels need.
fn unit_scale_acts(rng: &mut Rng, act: GgmlType, row_len: usize) -> Vec<u8> {
    let mut row: Vec<u8> = (0..row_bytes(act, row_len).unwrap())
        .map(|_| rng.byte())
        .collect();
    for block in row.chunks_exact_mut(act.type_size()) {
        match act {
            GgmlType::Q8_0 => block[0..2].copy_from_slice(&ONE_F16),
            GgmlType::Q8_K => {
                block[0..4].copy_from_slice(&1.0f32.to_le_bytes());
                fill_bsums(block);
            }
            _ => unreachable!(),
        }
    }
    row
}

/// Writes the Q8_K bsums (sum of each 16 quants) of a block.
fn fill_bsums(block: &mut [u8]) {
    for j in 0..16 {
        let s: i16 = block[q8_k::QS + 16 * j..q8_k::QS + 16 * j + 16]
            .iter()
            .map(|&b| b as i8 as i16)
            .sum();
        block[q8_k::BSUMS + 2 * j..q8_k::BSUMS + 2 * j + 2].copy_from_slice(&s.to_le_bytes());
    }
}

/// Upper bound on `Σ|term|` of one block under [`unit_scale_weights`]'s restrictions,
/// counting every integer either kernel accumulates (Q6_K's SIMD forms `Σ sc·q·x` and
/// `32·Σ sc·bsum` separately, q ≤ 63).
fn unit_block_bound(ty: GgmlType) -> u64 {
    match ty {
        GgmlType::Q4_0 => 32 * 8 * 128,
        GgmlType::Q5_0 => 32 * 16 * 128,
        GgmlType::Q8_0 => 32 * 128 * 128,
        GgmlType::Q4_K => 256 * (15 * 3 + 3) * 128,
        GgmlType::Q5_K => 256 * (31 * 3 + 3) * 128,
        GgmlType::Q6_K => 256 * (63 + 32) * 128,
        _ => unreachable!(),
    }
}

#[test]
fn integer_parts_are_exact_for_every_byte_pattern() {
    for tier in tiers_under_test() {
        for ty in QUANT_TYPES {
            let (scalar, simd) = kernels(tier, ty);
            let act = vec_dot_type(ty).unwrap();
            // 768 elements: 3 super-blocks or 24 small blocks; then single blocks.
            for row_len in [768usize, ty.block_size()] {
                let n_blocks = row_len / ty.block_size();
                assert!(
                    n_blocks as u64 * unit_block_bound(ty) < 1 << 24,
                    "{ty}: test rows too long for exact f32 sums"
                );
                let mut rng = Rng::new(ty.id() as u64 * 1000 + row_len as u64);
                for case in 0..200 {
                    let w = unit_scale_weights(&mut rng, ty, row_len);
                    let x = unit_scale_acts(&mut rng, act, row_len);
                    let (a, b) = (scalar(&w, &x), simd(&w, &x));
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "{tier} {ty} K={row_len} case {case}: scalar {a} simd {b}"
                    );
                }
            }
        }
    }
}

/// Extreme bytes: every weight quant byte 0x00, 0xFF or 0x80, activations all −128 or
/// all 127 (the saturation and sign corner cases of `maddubs`/`dpbusd`).
#[test]
fn integer_parts_are_exact_at_the_extremes() {
    for tier in tiers_under_test() {
        for ty in QUANT_TYPES {
            let (scalar, simd) = kernels(tier, ty);
            let act = vec_dot_type(ty).unwrap();
            let row_len = ty.block_size();
            let mut rng = Rng::new(7);
            for w_fill in [0x00u8, 0xFF, 0x80, 0x7F] {
                for x_fill in [0x80u8, 0x7F, 0x00] {
                    let mut w = unit_scale_weights(&mut rng, ty, row_len);
                    let keep_scales = unit_scale_weights(&mut rng, ty, row_len);
                    w.fill(w_fill);
                    restore_scales(ty, &mut w, &keep_scales);
                    let mut x = unit_scale_acts(&mut rng, act, row_len);
                    let qs = if act == GgmlType::Q8_K { q8_k::QS } else { 2 };
                    x[qs..qs + row_len].fill(x_fill);
                    if act == GgmlType::Q8_K {
                        fill_bsums(&mut x);
                    }
                    let (a, b) = (scalar(&w, &x), simd(&w, &x));
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "{tier} {ty} w={w_fill:#x} x={x_fill:#x}: scalar {a} simd {b}"
                    );
                }
            }
        }
    }
}

/// Copies the scale fields of one block from `from` into `block`.
fn restore_scales(ty: GgmlType, block: &mut [u8], from: &[u8]) {
    let scales = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => 0..2,
        GgmlType::Q4_K | GgmlType::Q5_K => 0..16,
        GgmlType::Q6_K => 192..210,
        _ => unreachable!(),
    };
    block[scales.clone()].copy_from_slice(&from[scales]);
}

/// `M = Σ|x|·(|d·sc·q| + |dmin·m|)`: the magnitudes the kernels accumulate. The two
/// parts of a K-format weight come from dequantizing with `dmin` or `d` zeroed.
fn magnitude(ty: GgmlType, w: &[u8], x_deq: &[f32]) -> f64 {
    let row_len = x_deq.len();
    let parts: Vec<Vec<u8>> = match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let mut scale_part = w.to_vec();
            let mut min_part = w.to_vec();
            for (s, m) in scale_part
                .chunks_exact_mut(ty.type_size())
                .zip(min_part.chunks_exact_mut(ty.type_size()))
            {
                s[q4_k::DMIN..q4_k::DMIN + 2].fill(0);
                m[0..2].fill(0);
            }
            vec![scale_part, min_part]
        }
        _ => vec![w.to_vec()],
    };
    let mut total = 0f64;
    for part in parts {
        let mut deq = vec![0f32; row_len];
        dequantize_row(ty, &part, &mut deq).unwrap();
        total += deq
            .iter()
            .zip(x_deq)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum::<f64>();
    }
    total
}

fn tolerance(ty: GgmlType, row_len: usize, m: f64) -> f64 {
    let n_blocks = (row_len / ty.block_size()) as f64;
    2.0 * (n_blocks + 16.0) * f32::EPSILON as f64 * m
}

/// Random realistic rows: weights of random bytes with random finite scales,
/// activations from the real quantizer.
fn realistic_case(rng: &mut Rng, ty: GgmlType, row_len: usize) -> (Vec<u8>, Vec<u8>, Vec<f32>) {
    let act = vec_dot_type(ty).unwrap();
    let w = random_row_bytes(rng, ty, row_len);
    let mut x = rng.normals(row_len, 1.0);
    x[row_len / 3] *= 40.0;
    x[1] = 0.0;
    let mut xq = vec![0u8; row_bytes(act, row_len).unwrap()];
    quantize_row(act, &x, &mut xq).unwrap();
    let mut x_deq = vec![0f32; row_len];
    dequantize_row(act, &xq, &mut x_deq).unwrap();
    (w, xq, x_deq)
}

#[test]
fn floats_agree_within_the_rounding_bound() {
    for tier in tiers_under_test() {
        for ty in QUANT_TYPES {
            let (scalar, simd) = kernels(tier, ty);
            // Gemma-like K (640, 2048) and odd block counts; K formats need 256s.
            let lens: &[usize] = if ty.block_size() == 256 {
                &[256, 768, 2048, 4096]
            } else {
                &[32, 96, 640, 2048, 4096 + 32]
            };
            let mut worst = 0f64;
            for &row_len in lens {
                let mut rng = Rng::new(ty.id() as u64 * 7919 + row_len as u64);
                for case in 0..40 {
                    let (w, xq, x_deq) = realistic_case(&mut rng, ty, row_len);
                    let (a, b) = (scalar(&w, &xq) as f64, simd(&w, &xq) as f64);
                    let m = magnitude(ty, &w, &x_deq);
                    let tol = tolerance(ty, row_len, m);
                    assert!(
                        (a - b).abs() <= tol,
                        "{tier} {ty} K={row_len} case {case}: scalar {a} simd {b} tol {tol}"
                    );
                    worst = worst.max((a - b).abs() / (f32::EPSILON as f64 * m));
                }
            }
            eprintln!("{tier} {ty}: worst |simd − scalar| = {worst:.3}·ε·M");
        }
    }
}

/// The weight types whose scalar twin uses the x86 float order (`Lanes8`): all of them,
/// so the SIMD kernels are bit-identical to scalar and the tier never changes an output.
const BIT_IDENTICAL_TYPES: [GgmlType; 6] = QUANT_TYPES;

/// An activation row with random scales and random quant bytes (−128 included); Q8_K
/// bsums consistent with the quants.
fn random_acts(rng: &mut Rng, act: GgmlType, row_len: usize) -> Vec<u8> {
    let mut row = unit_scale_acts(rng, act, row_len);
    for block in row.chunks_exact_mut(act.type_size()) {
        let d = rng.signed_pow2(-10.0, 0.0);
        match act {
            GgmlType::Q8_0 => block[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes()),
            _ => block[0..4].copy_from_slice(&d.to_le_bytes()),
        }
    }
    row
}

#[test]
fn x86_order_types_are_bit_identical_to_scalar() {
    for tier in tiers_under_test() {
        for ty in BIT_IDENTICAL_TYPES {
            let (scalar, simd) = kernels(tier, ty);
            let act = vec_dot_type(ty).unwrap();
            let lens: &[usize] = if ty.block_size() == 256 {
                &[256, 768, 2048, 4096]
            } else {
                &[32, 96, 640, 2048, 4096 + 32]
            };
            for &row_len in lens {
                let mut rng = Rng::new(ty.id() as u64 * 31 + row_len as u64);
                for case in 0..40 {
                    let (w, xq, _) = realistic_case(&mut rng, ty, row_len);
                    let (a, b) = (scalar(&w, &xq), simd(&w, &xq));
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "{tier} {ty} K={row_len} realistic case {case}: scalar {a:e} simd {b:e}"
                    );
                    let x_raw = random_acts(&mut rng, act, row_len);
                    let (a, b) = (scalar(&w, &x_raw), simd(&w, &x_raw));
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "{tier} {ty} K={row_len} raw case {case}: scalar {a:e} simd {b:e}"
                    );
                }
            }
        }
    }
}

/// The bound is tight enough to see (with a 10× margin) one flipped bit in the one
/// (sub-)block scale that governs the activation spike of a 2048-element row of
/// quantizer-made weights.
#[test]
fn bound_detects_a_flipped_scale_bit() {
    for tier in tiers_under_test() {
        for ty in QUANT_TYPES {
            let (scalar, simd) = kernels(tier, ty);
            let row_len = 2048;
            let mut rng = Rng::new(4242 + ty.id() as u64);
            let (_, xq, x_deq) = realistic_case(&mut rng, ty, row_len);
            // Weights from the real quantizer, so block scales are alike (random bytes
            // would let a few blocks dominate M); realistic_case puts a 40× activation
            // spike at element row_len / 3.
            let mut w = vec![0u8; row_bytes(ty, row_len).unwrap()];
            quantize_row(ty, &rng.normals(row_len, 0.05), &mut w).unwrap();
            let spike = row_len / 3;
            let block = (spike / ty.block_size()) * ty.type_size();
            let within = spike % ty.block_size();
            let (byte, bit) = match ty {
                // The top f16 mantissa bit of the block scale.
                GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => (1, 0x02),
                // Bit 5 of a 6-bit scale (sub-blocks 0..4), bit 3 of a low nibble (4..8).
                GgmlType::Q4_K | GgmlType::Q5_K => match within / 32 {
                    s @ 0..4 => (q4_k::SCALES + s, 0x20),
                    s => (q4_k::SCALES + s + 4, 0x08),
                },
                GgmlType::Q6_K => (q6_k::SCALES + within / 16, 0x20),
                _ => unreachable!(),
            };
            let mut w2 = w.clone();
            w2[block + byte] ^= bit;
            let tol = tolerance(ty, row_len, magnitude(ty, &w, &x_deq));
            let moved = (simd(&w2, &xq) as f64 - scalar(&w, &xq) as f64).abs();
            eprintln!(
                "{tier} {ty}: flipped scale bit moved the dot by {:.0}× tol",
                moved / tol
            );
            assert!(moved > 10.0 * tol, "{tier} {ty}: moved {moved}, tol {tol}");
        }
    }
}

/// `dot_row` uses the process tier's kernel (what matmul uses too).
#[test]
fn dot_row_is_the_active_tier_kernel() {
    let tier = nx_lazy_weight::active_tier().unwrap();
    eprintln!("active tier: {tier}");
    for ty in QUANT_TYPES {
        let mut rng = Rng::new(ty.id() as u64);
        let (w, xq, _) = realistic_case(&mut rng, ty, 512);
        let expected = dot_kernel_for(tier, ty).unwrap()(&w, &xq);
        let got = dot_row(ty, &w, &xq, 512).unwrap();
        assert_eq!(got.to_bits(), expected.to_bits(), "{ty}");
    }
}

/// The F32 kernel (MoE routers), the F16 one and the BF16 ones (`vdpbf16ps`, or its AVX2
/// copy) keep the scalar twin's running lanes and its tail: bit for bit on every length,
/// the whole-64 boundary and a lone tail included. BF16 also at magnitudes where products
/// and sums are subnormal, which that instruction flushes to zero.
#[test]
fn float_kernels_are_bit_identical_to_scalar() {
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let f16_bytes = |v: &[f32]| {
        v.iter()
            .flat_map(|&f| nx_lazy_weight::formats::f32_to_f16(f).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let bf16_bytes = |v: &[f32]| {
        v.iter()
            .flat_map(|&f| nx_lazy_weight::formats::f32_to_bf16(f).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    type Encode<'a> = &'a dyn Fn(&[f32]) -> Vec<u8>;
    let encodings: [(GgmlType, Encode, &[f32]); 3] = [
        (GgmlType::F32, &f32_bytes, &[1.0]),
        (GgmlType::F16, &f16_bytes, &[1.0]),
        (
            GgmlType::BF16,
            &bf16_bytes,
            &[1.0, 2f32.powi(-63), 2f32.powi(-70)],
        ),
    ];
    for tier in tiers_under_test() {
        for (ty, bytes, scales) in encodings {
            let (scalar, simd) = kernels(tier, ty);
            for n in [
                0usize,
                1,
                5,
                63,
                64,
                65,
                100,
                128,
                1024,
                1024 + 37,
                2048 + 63,
            ] {
                let mut rng = Rng::new(n as u64 + 7);
                for case in 0..20 {
                    // Values of mixed magnitude, so that a different order rounds
                    // differently.
                    let scale = scales[case % scales.len()];
                    let w: Vec<f32> = (0..n)
                        .map(|_| rng.normal() * rng.signed_pow2(-6.0, 6.0) * scale)
                        .collect();
                    let x: Vec<f32> = rng.normals(n, 3.0).iter().map(|v| v * scale).collect();
                    let (a, b) = (scalar(&bytes(&w), &bytes(&x)), simd(&bytes(&w), &bytes(&x)));
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "{tier} {ty} n={n} case {case}: scalar {a:e} simd {b:e}"
                    );
                }
            }
        }
    }
}
