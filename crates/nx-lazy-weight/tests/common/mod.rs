//! Shared helpers for nx-lazy-weight's integration tests: a seeded RNG and random blocks.
#![allow(dead_code)]

use nx_lazy_weight::formats::{f32_to_bf16, f32_to_f16};
use nx_lazy_weight::{
    dot_row, matmul, quantize_row, row_bytes, GgmlType, LazyWeight, QuantizedActs,
};

/// SplitMix64: small, seeded, good enough to make test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Approximately standard normal (sum of uniforms).
    pub fn normal(&mut self) -> f32 {
        (0..12).map(|_| self.uniform()).sum::<f32>() - 6.0
    }

    pub fn byte(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }

    /// A random signed value of magnitude 2^[lo, hi).
    pub fn signed_pow2(&mut self, lo: f32, hi: f32) -> f32 {
        let e = lo + (hi - lo) * self.uniform();
        let s = if self.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
        s * e.exp2()
    }

    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

/// The weight types nx computes with.
pub const WEIGHT_TYPES: [GgmlType; 25] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
    GgmlType::TQ2_0,
    GgmlType::TQ1_0,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

/// Offsets of the f16 scale fields inside a block of `ty`.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::TQ2_0 => &[64],
        GgmlType::TQ1_0 => &[52],
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => &[0],
        GgmlType::IQ3_XXS | GgmlType::IQ3_S | GgmlType::IQ1_S => &[0],
        _ => &[],
    }
}

/// A row of `row_len` elements of `ty` made of random raw block bytes, with every
/// f16 scale a finite value of magnitude 2^[-12, 0) (random sign), an MXFP4 E8M0
/// scale 2^[-13, 0), and float elements random finite values.
pub fn random_row_bytes(rng: &mut Rng, ty: GgmlType, row_len: usize) -> Vec<u8> {
    match ty {
        GgmlType::F32 => (0..row_len)
            .flat_map(|_| rng.normal().to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..row_len)
            .flat_map(|_| f32_to_f16(rng.normal()).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..row_len)
            .flat_map(|_| f32_to_bf16(rng.normal()).to_le_bytes())
            .collect(),
        _ => {
            let n_blocks = row_len / ty.block_size();
            let mut out = Vec::with_capacity(n_blocks * ty.type_size());
            for _ in 0..n_blocks {
                let mut block: Vec<u8> = (0..ty.type_size()).map(|_| rng.byte()).collect();
                for &off in scale_offsets(ty) {
                    let s = f32_to_f16(rng.signed_pow2(-12.0, 0.0));
                    block[off..off + 2].copy_from_slice(&s.to_le_bytes());
                }
                if ty == GgmlType::MXFP4 {
                    // The E8M0 scale byte: 2^(e−128) in 2^[−13, 0) like the f16 scales.
                    block[0] = 115 + rng.byte() % 13;
                }
                if ty == GgmlType::IQ1_M {
                    set_iq1_m_scale(&mut block, f32_to_f16(rng.signed_pow2(-12.0, 0.0)));
                }
                out.extend_from_slice(&block);
            }
            out
        }
    }
}

/// True when nx can quantize values to `ty` (the grid formats it only reads).
pub fn has_quantizer(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
        || nx_lazy_weight::formats::block_format(ty).is_some_and(|f| f.quantize_block.is_some())
}

/// Writes IQ1_M's f16 super-block scale, whose four nibbles are the top nibbles of the
/// u16 scale words at bytes 48..56.
pub fn set_iq1_m_scale(block: &mut [u8], bits: u16) {
    for k in 0..4 {
        let at = 49 + 2 * k;
        block[at] = (block[at] & 0x0f) | (((bits >> (4 * k)) & 0xf) as u8) << 4;
    }
}

/// Bitwise equality of f32 slices, with the first difference in the message.
pub fn assert_bits_eq(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            x.to_bits() == y.to_bits(),
            "{what}: element {i} differs: {x:e} ({:08x}) vs {y:e} ({:08x})",
            x.to_bits(),
            y.to_bits()
        );
    }
}

/// A weight row: raw random block bytes (finite scales), or the quantizer's output
/// (random bytes for the types nx cannot quantize to).
pub fn weight_row(rng: &mut Rng, ty: GgmlType, k: usize, via_quantizer: bool) -> Vec<u8> {
    if via_quantizer && has_quantizer(ty) {
        let x = rng.normals(k, 0.05);
        let mut row = vec![0u8; row_bytes(ty, k).unwrap()];
        quantize_row(ty, &x, &mut row).unwrap();
        row
    } else {
        random_row_bytes(rng, ty, k)
    }
}

/// `matmul` of `ty` weights (35 rows: two whole blocks of 16 and a rest; K = 3
/// blocks) by `n` tokens for each `n` in `ns`, against `dot_row` element by element,
/// bit for bit. Tokens carry outliers so some quants reach ±127 / −128.
pub fn check_matmul_against_dot_row(ty: GgmlType, ns: &[usize]) {
    check_matmul_against_dot_row_blocks(ty, ns, 3);
}

/// [`check_matmul_against_dot_row`] with rows of `n_blocks` blocks.
pub fn check_matmul_against_dot_row_blocks(ty: GgmlType, ns: &[usize], n_blocks: usize) {
    const N_ROWS: usize = 35;
    let k = n_blocks * ty.block_size();
    let mut rng = Rng::new(ty.id() as u64 + 7);
    let w_bytes: Vec<u8> = (0..N_ROWS)
        .flat_map(|r| weight_row(&mut rng, ty, k, r % 2 == 0))
        .collect();
    let w = LazyWeight::from_parts(ty, &[k as u64, N_ROWS as u64], &w_bytes).unwrap();
    for &n in ns {
        let x: Vec<f32> = (0..n)
            .flat_map(|t| {
                let mut row = rng.normals(k, 0.1 * (t % 5 + 1) as f32);
                if t % 3 == 1 {
                    row[(7 * t) % k] = -40.0;
                }
                row
            })
            .collect();
        let mut xq = QuantizedActs::new();
        let mut y = vec![0f32; n * N_ROWS];
        matmul(&w, &x, n, &mut y, &mut xq).unwrap();
        let mut want = Vec::with_capacity(n * N_ROWS);
        for t in 0..n {
            let x_row = xq.get_row(t).unwrap();
            for r in 0..N_ROWS {
                let w_row = &w_bytes[r * w.row_bytes()..(r + 1) * w.row_bytes()];
                want.push(dot_row(ty, w_row, x_row, k).unwrap());
            }
        }
        assert!(want.iter().any(|&v| v != 0.0), "{ty} n={n}: all zero");
        assert_bits_eq(&y, &want, &format!("{ty} matmul n={n}"));
    }
}

/// Bytes of a hex string (fixture files).
pub fn hex_bytes(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The ggml type called `name` (fixture files).
pub fn type_by_name(name: &str) -> GgmlType {
    GgmlType::ALL
        .iter()
        .copied()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("unknown type {name}"))
}
