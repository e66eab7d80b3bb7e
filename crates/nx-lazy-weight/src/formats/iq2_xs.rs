//! IQ2_XS (2.31 bits a weight): 256 weights; each group of 8 is a u16 holding a 9-bit
//! index into the 512-entry `IQ2XS_GRID` and 7 sign bits (the eighth by parity), with
//! a 4-bit scale per 16, `w = d·(0.5 + ls)·0.25·grid·sign`; multiplied with Q8_K
//! activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..66 | `qs[32]` u16: index (bits 0..9) and sign index (bits 9..16) of eight weights |
//! | 66..74 | `scales[8]`: low nibble the first 16 of group `g`, high nibble the second |

use nx_gguf::GgmlType;

use super::block::{read_f16, BlockFormat};
use super::grids::{grid_dot, octets16, parity_signs, GridBlock, IQ2XS_GRID};

/// Bytes of one super-block.
pub const BYTES: usize = 74;
/// `qs[32]` u16.
pub const QS: usize = 2;
/// `scales[8]`.
pub const SCALES: usize = 66;
const _: () = assert!(SCALES + 8 == BYTES && GgmlType::IQ2_XS.type_size() == BYTES);

/// The factor ggml's kernel applies to the final sum.
pub(crate) const POST_SCALE: f32 = 0.125;

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::IQ2_XS,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: None,
    quantize_block: None,
};

/// Eight weights `8k..8k+8`: magnitudes and sign byte.
#[inline(always)]
fn octet(b: &[u8], k: usize) -> (&'static [u8; 8], u8) {
    let q = u16::from_le_bytes([b[QS + 2 * k], b[QS + 2 * k + 1]]) as u32;
    (&IQ2XS_GRID[(q & 511) as usize], parity_signs(q >> 9))
}

/// `y = (d·(0.5 + ls)·0.25)·grid·(±1)` (ggml's `dequantize_row_iq2_xs`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    octets16::dequantize(read_f16(b, 0), &b[SCALES..SCALES + 8], y, |k| octet(b, k));
}

/// IQ2_XS × Q8_K in the order of ggml's AVX2 kernel (`grid_dot` with multipliers
/// `2·ls + 1` per 16 and a final `0.125`).
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
    octets16::decode(&b[SCALES..], block, |k| octet(b, k));
    read_f16(b, 0)
}
