//! IQ3_XXS (3.06 bits a weight): 256 weights; each group of 4 is a byte of index into the
//! 256-entry `IQ3XXS_GRID` of magnitudes; per group of 32 one u32 holds four 7-bit
//! sign indices (one per 8 weights, the eighth sign by parity) and a 4-bit scale,
//! `w = d·(0.5 + ls)·0.5·grid·sign`; multiplied with Q8_K activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..66 | grid indices, one per 4 weights |
//! | 66..98 | per group of 32 a u32: sign indices (bits `7l..7l+7`) and `ls` (bits 28..32) |

use nx_gguf::GgmlType;

use super::block::{read_f16, read_u32, BlockFormat};
use super::grids::{grid_dot, parity_signs, GridBlock, IQ3XXS_GRID};

/// Bytes of one super-block.
pub const BYTES: usize = 98;
/// Grid indices.
pub const QS: usize = 2;
/// Scale-and-sign words.
pub const SCALES_SIGNS: usize = 66;
const _: () = assert!(SCALES_SIGNS + 32 == BYTES && GgmlType::IQ3_XXS.type_size() == BYTES);

/// The factor ggml's kernel applies to the final sum.
pub(crate) const POST_SCALE: f32 = 0.25;

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::IQ3_XXS,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: None,
    quantize_block: None,
};

/// Weights `8k..8k+8` as two magnitude quads, and their sign byte.
#[inline(always)]
fn octet(b: &[u8], k: usize) -> ([&'static [u8; 4]; 2], u8) {
    let aux = read_u32(b, SCALES_SIGNS + 4 * (k / 4));
    let signs = parity_signs(aux >> (7 * (k % 4)));
    (
        [
            &IQ3XXS_GRID[b[QS + 2 * k] as usize],
            &IQ3XXS_GRID[b[QS + 2 * k + 1] as usize],
        ],
        signs,
    )
}

/// The 4-bit scale of group of 32 `g`.
#[inline(always)]
fn group_scale(b: &[u8], g: usize) -> u32 {
    read_u32(b, SCALES_SIGNS + 4 * g) >> 28
}

/// `y = (d·(0.5 + ls)·0.5)·grid·(±1)` (ggml's `dequantize_row_iq3_xxs`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for k in 0..32 {
        let db = d * (0.5 + group_scale(b, k / 4) as f32) * 0.5;
        let (quads, signs) = octet(b, k);
        for j in 0..8 {
            let sign = if signs >> j & 1 != 0 { -1.0 } else { 1.0 };
            y[8 * k + j] = db * quads[j / 4][j % 4] as f32 * sign;
        }
    }
}

/// IQ3_XXS × Q8_K in the order of ggml's AVX2 kernel (`grid_dot` with multipliers
/// `2·ls + 1` and a final `0.25`).
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
    for k in 0..32 {
        let (quads, signs) = octet(b, k);
        block.put4x2(k, quads[0], quads[1], signs);
    }
    for g in 0..8 {
        let m = 2 * group_scale(b, g) as i32 + 1;
        block.scales[2 * g] = m;
        block.scales[2 * g + 1] = m;
    }
    read_f16(b, 0)
}
