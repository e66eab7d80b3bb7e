//! IQ2_S (2.56 bits a weight): 256 weights; each group of 8 has a 10-bit index into the
//! 1024-entry `IQ2S_GRID` (a byte plus two high bits) and a full sign byte, with a
//! 4-bit scale per 16, `w = d·(0.5 + ls)·0.25·grid·sign`; multiplied with Q8_K
//! activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..34 | low eight index bits of the 32 groups of 8 |
//! | 34..66 | their sign bytes |
//! | 66..74 | `qh[8]`: bits `2l..2l+2` are the high index bits of group `l` of 32-block `g` |
//! | 74..82 | `scales[8]`: low nibble the first 16 of 32-block `g`, high nibble the second |

use nx_gguf::GgmlType;

use super::block::{read_f16, BlockFormat};
use super::grids::{grid_dot, octets16, GridBlock, IQ2S_GRID};

/// Bytes of one super-block.
pub const BYTES: usize = 82;
/// Low index bytes.
pub const QS: usize = 2;
/// Sign bytes.
pub const SIGNS: usize = 34;
/// `qh[8]`.
pub const QH: usize = 66;
/// `scales[8]`.
pub const SCALES: usize = 74;
const _: () = assert!(SCALES + 8 == BYTES && GgmlType::IQ2_S.type_size() == BYTES);

/// The factor ggml's kernel applies to the final sum.
pub(crate) const POST_SCALE: f32 = 0.125;

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::IQ2_S,
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
    let high = ((b[QH + k / 4] as usize) << (8 - 2 * (k % 4))) & 0x300;
    (&IQ2S_GRID[b[QS + k] as usize | high], b[SIGNS + k])
}

/// `y = (d·(0.5 + ls)·0.25)·grid·(±1)` (ggml's `dequantize_row_iq2_s`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    octets16::dequantize(read_f16(b, 0), &b[SCALES..SCALES + 8], y, |k| octet(b, k));
}

/// IQ2_S × Q8_K in the order of ggml's AVX2 kernel (`grid_dot` with multipliers
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
