//! Block layouts and byte sizes of the ggml types this crate computes with, and the one
//! table that answers every per-type question.
//!
//! All blocks are packed little-endian byte records (no padding), exactly as
//! ggml writes them, so a tensor inside the mapped file is used in place.
//!
//! A format is one module: its layout (with compile-time size checks against
//! `nx_gguf::GgmlType`), dequantization, activation type, scalar dot product in the
//! reference engine's x86 float order and a quantizer, gathered in its [`BlockFormat`]
//! row of [`BLOCK_FORMATS`]. Adding a format is one module and one row; its SIMD kernels
//! then go beside the others in the tier files, each tested against the scalar twin.
//! Every quantized format is one: [`q4_0`], [`q5_0`], [`q8_0`], [`q4_k`], [`q5_k`],
//! [`q6_k`], [`q8_k`], [`q4_1`], [`q5_1`], [`q8_1`], [`q2_k`], [`q3_k`], [`iq4_nl`],
//! [`iq4_xs`], [`mxfp4`], [`tq2_0`], [`tq1_0`], and the grid formats [`iq2_xxs`],
//! [`iq2_xs`], [`iq2_s`], [`iq3_xxs`], [`iq3_s`], [`iq1_s`], [`iq1_m`] (their lattice
//! tables and shared lane reduction in `grids`). The float types (F32, F16, BF16) are
//! the only `match` arms left in `dequant.rs`, `dot_scalar.rs` and `quant.rs`.
//!
//! | type | elements | bytes | fields (byte offsets) |
//! |---|---|---|---|
//! | F32 / F16 / BF16 | 1 | 4 / 2 / 2 | the value |
//! | Q4_0 | 32 | 18 | `d` f16 @0, `qs[16]` @2 |
//! | Q5_0 | 32 | 22 | `d` f16 @0, `qh` u32 @2, `qs[16]` @6 |
//! | Q8_0 | 32 | 34 | `d` f16 @0, `qs[32]` i8 @2 |
//! | Q4_K | 256 | 144 | `d` f16 @0, `dmin` f16 @2, `scales[12]` @4, `qs[128]` @16 |
//! | Q5_K | 256 | 176 | `d` @0, `dmin` @2, `scales[12]` @4, `qh[32]` @16, `qs[128]` @48 |
//! | Q6_K | 256 | 210 | `ql[128]` @0, `qh[64]` @128, `scales[16]` i8 @192, `d` f16 @208 |
//! | Q8_K | 256 | 292 | `d` f32 @0, `qs[256]` i8 @4, `bsums[16]` i16 @260 |
//! | Q4_1 | 32 | 20 | `d` f16 @0, `m` f16 @2, `qs[16]` @4 |
//! | Q5_1 | 32 | 24 | `d` @0, `m` @2, `qh` u32 @4, `qs[16]` @8 |
//! | Q8_1 | 32 | 36 | `d` f16 @0, `s` f16 @2, `qs[32]` i8 @4 |
//! | Q2_K | 256 | 84 | `scales[16]` @0, `qs[64]` @16, `d` f16 @80, `dmin` f16 @82 |
//! | Q3_K | 256 | 110 | `hmask[32]` @0, `qs[64]` @32, `scales[12]` @96, `d` f16 @108 |
//! | IQ4_NL | 32 | 18 | `d` f16 @0, `qs[16]` @2 (indices into a 16-level table) |
//! | IQ4_XS | 256 | 136 | `d` f16 @0, `scales_h` u16 @2, `scales_l[4]` @4, `qs[128]` @8 |
//! | MXFP4 | 32 | 17 | `e` u8 @0 (E8M0 scale), `qs[16]` @1 (E2M1 codes) |
//! | TQ2_0 | 256 | 66 | `qs[64]` @0 (2-bit levels), `d` f16 @64 |
//! | TQ1_0 | 256 | 54 | `qs[48]` @0 (five base-3 digits a byte), `qh[4]` @48 (four), `d` f16 @52 |
//! | IQ2_XXS | 256 | 66 | `d` f16 @0, `qs[32]` u16 @2 (grid bytes, sign indices, scales) |
//! | IQ2_XS | 256 | 74 | `d` f16 @0, `qs[32]` u16 @2 (9-bit grid index, 7 sign bits), `scales[8]` @66 |
//! | IQ2_S | 256 | 82 | `d` f16 @0, `qs[32]` @2, `signs[32]` @34, `qh[8]` @66, `scales[8]` @74 |
//! | IQ3_XXS | 256 | 98 | `d` f16 @0, `qs[64]` @2, scale-and-sign words `[8]` u32 @66 |
//! | IQ3_S | 256 | 110 | `d` f16 @0, `qs[64]` @2, `qh[8]` @66, `signs[32]` @74, `scales[4]` @106 |
//! | IQ1_S | 256 | 50 | `d` f16 @0, `qs[32]` @2, `qh[8]` u16 @34 |
//! | IQ1_M | 256 | 56 | `qs[32]` @0, `qh[16]` @32, `scales[4]` u16 @48 (with `d` in their top nibbles) |

use nx_gguf::GgmlType;

use crate::LazyWeightError;

mod block;
pub(crate) mod grid_tables;
pub(crate) mod grids;
pub mod iq1_m;
pub mod iq1_s;
pub mod iq2_s;
pub mod iq2_xs;
pub mod iq2_xxs;
pub mod iq3_s;
pub mod iq3_xxs;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod mxfp4;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_1;
pub mod q8_k;
pub mod tq1_0;
pub mod tq2_0;

pub use block::{
    best_index_int8, bf16_to_f32, f16_bits_at_least, f16_to_f32, f32_to_bf16, f32_to_f16,
    nearest_int, read_f16, read_f32, read_i16, read_u32, signed_abs_max, BlockFormat, DotKernel,
    DotKernel4, DotKernelRows4,
};

/// The quantized formats, one module each.
pub const BLOCK_FORMATS: &[BlockFormat] = &[
    q4_0::FORMAT,
    q5_0::FORMAT,
    q8_0::FORMAT,
    q4_k::FORMAT,
    q5_k::FORMAT,
    q6_k::FORMAT,
    q8_k::FORMAT,
    q4_1::FORMAT,
    q5_1::FORMAT,
    q8_1::FORMAT,
    q2_k::FORMAT,
    q3_k::FORMAT,
    iq4_nl::FORMAT,
    iq4_xs::FORMAT,
    mxfp4::FORMAT,
    tq2_0::FORMAT,
    tq1_0::FORMAT,
    iq2_xxs::FORMAT,
    iq2_xs::FORMAT,
    iq2_s::FORMAT,
    iq3_xxs::FORMAT,
    iq3_s::FORMAT,
    iq1_s::FORMAT,
    iq1_m::FORMAT,
];

/// The table row of `ggml_type`, if it is one of [`BLOCK_FORMATS`].
pub fn block_format(ggml_type: GgmlType) -> Option<&'static BlockFormat> {
    BLOCK_FORMATS.iter().find(|f| f.ggml_type == ggml_type)
}

/// Elements per block of the 32-element formats (Q4_0, Q5_0, Q8_0).
pub const QK32: usize = 32;
/// Elements per super-block of the K formats (Q4_K, Q5_K, Q6_K, Q8_K).
pub const QK_K: usize = 256;

/// Bytes of one Q4_0 block.
pub const Q4_0_BYTES: usize = q4_0::BYTES;
/// Bytes of one Q5_0 block.
pub const Q5_0_BYTES: usize = q5_0::BYTES;
/// Bytes of one Q8_0 block.
pub const Q8_0_BYTES: usize = q8_0::BYTES;
/// Bytes of one Q4_K super-block.
pub const Q4_K_BYTES: usize = q4_k::BYTES;
/// Bytes of one Q5_K super-block.
pub const Q5_K_BYTES: usize = q5_k::BYTES;
/// Bytes of one Q6_K super-block.
pub const Q6_K_BYTES: usize = q6_k::BYTES;
/// Bytes of one Q8_K super-block.
pub const Q8_K_BYTES: usize = q8_k::BYTES;

/// True for the weight types this crate can dequantize and multiply with.
pub fn is_supported_weight(ggml_type: GgmlType) -> bool {
    matches!(ggml_type, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
        || block_format(ggml_type).is_some_and(|f| f.dot.is_some())
}

/// The names of the weight types nx computes with, comma-separated, in ggml id order.
pub fn supported_weight_names() -> String {
    let names: Vec<&str> = GgmlType::ALL
        .iter()
        .filter(|&&t| is_supported_weight(t))
        .map(|t| t.name())
        .collect();
    names.join(", ")
}

/// True for the types [`crate::dequantize_row`] accepts: the weight types plus the
/// activation types Q8_K and Q8_1.
pub fn can_dequantize(ggml_type: GgmlType) -> bool {
    is_supported_weight(ggml_type) || block_format(ggml_type).is_some()
}

/// The activation type a weight type's dot product consumes, as in ggml's CPU backend:
/// Q8_0 for the 32-element formats (Q8_1 for Q4_1 and Q5_1, whose offset term needs the
/// activations' sum), Q8_K for the K and ternary formats, and for the float types
/// the weight's own type (F32 activations stay F32; for F16 and BF16 weights the
/// activations are rounded to F16 / BF16 first: see [`crate::dot_scalar`] for the
/// order each is summed in).
pub fn vec_dot_type(weight_type: GgmlType) -> Option<GgmlType> {
    match weight_type {
        GgmlType::F32 => Some(GgmlType::F32),
        GgmlType::F16 => Some(GgmlType::F16),
        GgmlType::BF16 => Some(GgmlType::BF16),
        _ => block_format(weight_type)
            .and_then(|f| f.dot)
            .map(|(act, _)| act),
    }
}

/// Bytes of one row of `row_len` elements of `ggml_type`.
///
/// Errors when `row_len` is not a whole number of blocks or the size overflows.
pub fn row_bytes(ggml_type: GgmlType, row_len: usize) -> Result<usize, LazyWeightError> {
    let block_size = ggml_type.block_size();
    if !row_len.is_multiple_of(block_size) {
        return Err(LazyWeightError::NotBlockMultiple {
            ggml_type,
            row_len: row_len as u64,
            block_size,
        });
    }
    (row_len / block_size)
        .checked_mul(ggml_type.type_size())
        .ok_or(LazyWeightError::BadShape {
            ne: vec![row_len as u64],
            reason: "row byte size overflows usize",
        })
}

/// Scale and min (both 6-bit) of sub-block `j` (0..8) from a Q4_K/Q5_K `scales[12]`.
///
/// Sub-blocks 0..4 keep their six bits in the low bits of bytes j (scale) and j+4
/// (min); sub-blocks 4..8 take four low bits from byte j+4 (scale: low nibble, min:
/// high nibble) and their top two bits from the spare top bits of bytes j-4 and j.
#[inline(always)]
pub fn scale_min_k4(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// All eight 6-bit scales and mins of a Q4_K/Q5_K `scales[12]` at once, as two u64
/// whose byte `j` is sub-block `j`'s value: `(scales, mins)`. Same values as
/// [`scale_min_k4`], computed with three u32 words instead of per-byte branches (the
/// SIMD kernels load the results straight into vectors).
#[inline(always)]
pub fn scales_mins_k4_packed(scales: &[u8]) -> (u64, u64) {
    let a = read_u32(scales, 0);
    let b = read_u32(scales, 4);
    let c = read_u32(scales, 8);
    let sc_lo = a & 0x3f3f_3f3f;
    let mn_lo = b & 0x3f3f_3f3f;
    let sc_hi = (c & 0x0f0f_0f0f) | (((a >> 6) & 0x0303_0303) << 4);
    let mn_hi = ((c >> 4) & 0x0f0f_0f0f) | (((b >> 6) & 0x0303_0303) << 4);
    (
        sc_lo as u64 | (sc_hi as u64) << 32,
        mn_lo as u64 | (mn_hi as u64) << 32,
    )
}

/// Inverse of [`scale_min_k4`]: pack eight 6-bit scales and mins into `scales[12]`.
pub fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8], out: &mut [u8]) {
    for j in 0..4 {
        out[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        out[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        out[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_agree_with_nx_gguf() {
        let table = [
            (GgmlType::Q4_0, QK32, Q4_0_BYTES),
            (GgmlType::Q5_0, QK32, Q5_0_BYTES),
            (GgmlType::Q8_0, QK32, Q8_0_BYTES),
            (GgmlType::Q4_K, QK_K, Q4_K_BYTES),
            (GgmlType::Q5_K, QK_K, Q5_K_BYTES),
            (GgmlType::Q6_K, QK_K, Q6_K_BYTES),
            (GgmlType::Q8_K, QK_K, Q8_K_BYTES),
        ];
        for (t, bs, bytes) in table {
            assert_eq!(t.block_size(), bs, "{t}");
            assert_eq!(t.type_size(), bytes, "{t}");
        }
        // Field offsets add up to the block sizes.
        assert_eq!(q4_k::QS + 128, Q4_K_BYTES);
        assert_eq!(q4_k::Q5_QS + 128, Q5_K_BYTES);
        assert_eq!(q6_k::D + 2, Q6_K_BYTES);
        assert_eq!(q8_k::BSUMS + 32, Q8_K_BYTES);
        assert_eq!(q5_0::QS + 16, Q5_0_BYTES);
    }

    #[test]
    fn scale_min_pack_round_trips_every_value() {
        // Every 6-bit value in every slot, scales and mins independent.
        for v in 0..64u8 {
            for slot in 0..8 {
                let mut sc = [(slot as u8 * 7 + 3) & 63; 8];
                let mut m = [(slot as u8 * 11 + 5) & 63; 8];
                sc[slot] = v;
                m[(slot + 3) % 8] = 63 - v;
                let mut packed = [0u8; 12];
                pack_scale_min_k4(&sc, &m, &mut packed);
                for j in 0..8 {
                    assert_eq!(
                        scale_min_k4(j, &packed),
                        (sc[j], m[j]),
                        "v={v} slot={slot} j={j}"
                    );
                }
            }
        }
    }

    #[test]
    fn packed_scales_mins_match_per_byte_decoder() {
        // Random 12-byte fields (a fixed LCG), plus all-ones and all-zeros.
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut fields: Vec<[u8; 12]> = vec![[0xff; 12], [0; 12]];
        for _ in 0..2000 {
            let mut f = [0u8; 12];
            for b in f.iter_mut() {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *b = (state >> 56) as u8;
            }
            fields.push(f);
        }
        for f in fields {
            let (sc, mn) = scales_mins_k4_packed(&f);
            for j in 0..8 {
                let (s, m) = scale_min_k4(j, &f);
                assert_eq!((sc >> (8 * j)) as u8, s, "{f:?} scale {j}");
                assert_eq!((mn >> (8 * j)) as u8, m, "{f:?} min {j}");
            }
        }
    }

    #[test]
    fn row_bytes_rejects_partial_blocks() {
        assert_eq!(row_bytes(GgmlType::Q4_K, 512).unwrap(), 288);
        assert!(matches!(
            row_bytes(GgmlType::Q4_K, 640),
            Err(LazyWeightError::NotBlockMultiple { .. })
        ));
        assert_eq!(row_bytes(GgmlType::F16, 7).unwrap(), 14);
        assert!(row_bytes(GgmlType::F32, usize::MAX).is_err());
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // Exactly halfway between two bf16 values: ties to even.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(bf16_to_f32(0xc000), -2.0);
        let nan = f32_to_bf16(f32::from_bits(0x7f80_0001));
        assert!(bf16_to_f32(nan).is_nan());
    }
}
