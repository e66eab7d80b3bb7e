//! IQ2_XXS (2.06 bits a weight): 256 weights in eight groups of 32; each group of 8 is
//! one byte of index into the 256-entry `IQ2XXS_GRID` of magnitudes, with 7 sign bits
//! (the eighth by parity) and one 4-bit scale per 32,
//! `w = d·(0.5 + ls)·0.25·grid·sign`; multiplied with Q8_K activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..66 | per group of 32, two u32: the first holds four grid indices (a byte each), the second four 7-bit sign indices (bits `7l..7l+7`) and `ls` (bits 28..32) |

use nx_gguf::GgmlType;

use super::block::{read_f16, read_u32, BlockFormat};
use super::grids::{grid_dot, parity_signs, GridBlock, IQ2XXS_GRID};

/// Bytes of one super-block.
pub const BYTES: usize = 66;
/// The group words.
pub const QS: usize = 2;
const _: () = assert!(QS + 64 == BYTES && GgmlType::IQ2_XXS.type_size() == BYTES);

/// The factor ggml's kernel applies to the final sum.
pub(crate) const POST_SCALE: f32 = 0.125;

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::IQ2_XXS,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: None,
    quantize_block: None,
};

/// Group `g`'s magnitudes, sign bytes (eight weights each) and `ls`.
#[inline(always)]
fn group(b: &[u8], g: usize) -> ([&'static [u8; 8]; 4], [u8; 4], u32) {
    let grid = read_u32(b, QS + 8 * g);
    let aux = read_u32(b, QS + 8 * g + 4);
    let mut mags = [&IQ2XXS_GRID[0]; 4];
    let mut signs = [0u8; 4];
    for l in 0..4 {
        mags[l] = &IQ2XXS_GRID[(grid >> (8 * l)) as usize & 255];
        signs[l] = parity_signs(aux >> (7 * l));
    }
    (mags, signs, aux >> 28)
}

/// `y = (d·(0.5 + ls)·0.25)·grid·(±1)` (ggml's `dequantize_row_iq2_xxs`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for g in 0..8 {
        let (mags, signs, ls) = group(b, g);
        let db = d * (0.5 + ls as f32) * 0.25;
        for l in 0..4 {
            for j in 0..8 {
                let sign = if signs[l] >> j & 1 != 0 { -1.0 } else { 1.0 };
                y[32 * g + 8 * l + j] = db * mags[l][j] as f32 * sign;
            }
        }
    }
}

/// IQ2_XXS × Q8_K in the order of ggml's AVX2 kernel (`grid_dot` with multipliers
/// `2·ls + 1` and a final `0.125`).
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    grid_dot(w, x, BYTES, POST_SCALE, Grid)
}

super::grids::grid_decoder!();

/// Fills `block` from one super-block; returns `d`.
#[inline(always)]
pub(crate) fn decode(b: &[u8], block: &mut GridBlock) -> f32 {
    // One length check here spares one per field read below.
    let b = &b[..BYTES];
    for g in 0..8 {
        let (mags, signs, ls) = group(b, g);
        for l in 0..4 {
            block.put8(4 * g + l, mags[l], signs[l]);
        }
        block.scales[2 * g] = 2 * ls as i32 + 1;
        block.scales[2 * g + 1] = 2 * ls as i32 + 1;
    }
    read_f16(b, 0)
}
