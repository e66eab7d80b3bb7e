//! What every block format module provides, and the little-endian field readers they share.

use nx_gguf::GgmlType;

use crate::reduce::{blocks_at, common_blocks, quad_lanes, Lanes8};

/// Bytes of a Q8_0 activation block (`d` f16, `qs[32]` i8).
pub const Q8_0_BLOCK_BYTES: usize = 34;
/// Bytes of a Q8_K activation block (`d` f32 @0, `qs[256]` i8 @4, `bsums[16]` i16 @260).
pub const Q8_K_BLOCK_BYTES: usize = 292;
/// Offset of a Q8_K block's quants.
pub const Q8_K_QS: usize = 4;
/// Offset of a Q8_K block's `bsums`.
pub const Q8_K_BSUMS: usize = 260;

/// A dot kernel: weight row bytes, activation row bytes (same element count) → f32.
pub type DotKernel = fn(&[u8], &[u8]) -> f32;

/// A four-token dot kernel: `dot(w, x[t])` for four activation rows at once, each
/// weight block decoded once. Output `t` is bit-identical to the same tier's
/// single-token [`DotKernel`] on `(w, x[t])`: same integer lanes, same per-block FMA
/// chain per token, same final reduction (see `tests/multi_token.rs`).
pub type DotKernel4 = fn(w: &[u8], x: [&[u8]; 4]) -> [f32; 4];

/// A four-row dot kernel: `dot(w[r], x)` for four weight rows and one activation row
/// (matrix-vector products, as in decoding). Output `r` is bit-identical to the same
/// tier's single-token [`DotKernel`] on `(w[r], x)` (see `tests/multi_token.rs`).
pub type DotKernelRows4 = fn(w: [&[u8]; 4], x: &[u8]) -> [f32; 4];

/// Quantizes one block of values into one block's bytes.
pub type QuantizeBlock = fn(&[f32], &mut [u8]);

/// Dequantizes one block's bytes into its values.
pub type DequantizeBlock = fn(&[u8], &mut [f32]);

/// One block format: its layout, dequantization, activation pairing and scalar kernels.
/// Each format module defines one as `FORMAT`; [`crate::formats::BLOCK_FORMATS`] lists
/// them, and every per-type question (is it supported, which activation type, which
/// scalar kernel) is answered from that table.
#[derive(Debug, Clone, Copy)]
pub struct BlockFormat {
    /// The ggml type.
    pub ggml_type: GgmlType,
    /// Elements per block.
    pub block_len: usize,
    /// Bytes per block.
    pub block_bytes: usize,
    /// Dequantizes one block (`block_bytes` bytes) into `block_len` values, bit-exact
    /// with ggml's `dequantize_row_*`.
    pub dequantize_block: DequantizeBlock,
    /// The activation type a weight row of this format is multiplied with, and the
    /// scalar dot kernel (in the float order of the reference engine's x86 kernel);
    /// `None` for activation-only formats.
    pub dot: Option<(GgmlType, DotKernel)>,
    /// The scalar four-token kernel (each weight block decoded once for four activation
    /// rows, every row's bits those of `dot`), where the format has one: the scalar
    /// tier's prefill.
    pub dot4: Option<DotKernel4>,
    /// Quantizes one block of values (weights for fixtures, or activations).
    pub quantize_block: Option<QuantizeBlock>,
}

/// IEEE half bits to f32 (exact).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 to IEEE half bits, round to nearest even (ggml's `GGML_FP32_TO_FP16`).
#[inline(always)]
pub fn f32_to_f16(value: f32) -> u16 {
    half::f16::from_f32(value).to_bits()
}

/// bfloat16 bits to f32 (exact: the bits are the f32's upper half).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to bfloat16 bits as ggml's `GGML_FP32_TO_BF16` does: NaN is forced quiet,
/// everything else rounds to nearest even (large finite values may round to inf).
#[inline(always)]
pub fn f32_to_bf16(value: f32) -> u16 {
    let u = value.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    // In u64 so the rounding increment cannot wrap.
    ((u as u64 + 0x7fff + ((u as u64 >> 16) & 1)) >> 16) as u16
}

/// The f16 at `offset` of `bytes`, as f32. Caller guarantees `offset + 2 <= len`.
#[inline(always)]
pub fn read_f16(bytes: &[u8], offset: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[offset], bytes[offset + 1]]))
}

/// The little-endian f32 at `offset` of `bytes`.
#[inline(always)]
pub fn read_f32(bytes: &[u8], offset: usize) -> f32 {
    f32::from_le_bytes([
        bytes[offset],
        bytes[offset + 1],
        bytes[offset + 2],
        bytes[offset + 3],
    ])
}

/// The little-endian u32 at `offset` of `bytes`.
#[inline(always)]
pub fn read_u32(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes([
        bytes[offset],
        bytes[offset + 1],
        bytes[offset + 2],
        bytes[offset + 3],
    ])
}

/// The little-endian i16 at `offset` of `bytes`.
#[inline(always)]
pub fn read_i16(bytes: &[u8], offset: usize) -> i16 {
    i16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

/// `x` rounded to the nearest integer, ties to even, the way ggml's `nearest_int` does
/// it: add 1.5·2^23 and read the low mantissa bits. Exact for |x| < 2^22 (quantizers
/// round values of at most about 127); a plain add, so no libm call on any tier. Also
/// what `_mm256_round_ps(_MM_ROUND_NEAREST)` gives in that range.
#[inline(always)]
pub fn nearest_int(x: f32) -> i32 {
    let shifted = x + 12_582_912.0;
    (shifted.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The index of the entry of the sorted `values` nearest to `x` (the lower one on a tie),
/// as ggml's `best_index_int8`.
#[inline(always)]
pub fn best_index_int8(values: &[i8], x: f32) -> usize {
    let n = values.len();
    if x <= values[0] as f32 {
        return 0;
    }
    if x >= values[n - 1] as f32 {
        return n - 1;
    }
    let (mut lo, mut hi) = (0usize, n - 1);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < values[mid] as f32 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - values[lo] as f32 <= values[hi] as f32 - x {
        lo
    } else {
        hi
    }
}

/// The element of largest magnitude, with its sign (first one on ties).
pub fn signed_abs_max(xs: &[f32]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in xs {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// f16 bits of the smallest f16 ≥ `v` (for non-negative finite `v`), so a scale
/// stored in f16 never shrinks the range it has to cover.
pub fn f16_bits_at_least(v: f32) -> u16 {
    let h = f32_to_f16(v);
    if f16_to_f32(h) < v {
        h + 1
    } else {
        h
    }
}

/// A 32-quant format (Q4_0, Q5_0, Q8_0: `d` f16 at byte 0 of each block, the signed
/// quants from `quants`) times `N` Q8_0 activation rows, each weight block decoded once
/// for the `N` rows. Row `t`'s float operations are those of `N = 1` in the same order
/// (one [`Lanes8`] per row), so every `N` gives the one-row kernel's bits.
#[inline(always)]
pub(super) fn dot32_rows<const N: usize>(
    w: &[u8],
    block_bytes: usize,
    xs: [&[u8]; N],
    quants: impl Fn(&[u8]) -> [i32; 32],
) -> [f32; N] {
    let n_blocks = common_blocks(w.len() / block_bytes, Q8_0_BLOCK_BYTES, &xs);
    let mut acc = [Lanes8::default(); N];
    for (b, wb) in w.chunks_exact(block_bytes).take(n_blocks).enumerate() {
        let wq = quants(wb);
        let d = read_f16(wb, 0);
        for (acc, xb) in acc.iter_mut().zip(blocks_at(&xs, b, Q8_0_BLOCK_BYTES)) {
            acc.fma_block(d * read_f16(xb, 0), &quad_lanes(&wq, &xb[2..]));
        }
    }
    acc.map(|a| a.sum())
}
