//! IQ3_S (3.44 bits a weight): 256 weights; each group of 4 has a 9-bit index into the
//! 512-entry `IQ3S_GRID` (a byte plus one high bit), every weight a stored sign bit,
//! and a 4-bit scale per 32, `w = d·(1 + 2·ls)·grid·sign`; multiplied with Q8_K
//! activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..66 | low eight index bits, one byte per 4 weights |
//! | 66..74 | `qh[8]`: bit `m` is the high index bit of quad `m` of 32-block `g` |
//! | 74..106 | `signs[32]`: bit `j` of byte `k` is the sign of weight `8k + j` |
//! | 106..110 | `scales[4]`: low nibble 32-block `2i`, high nibble `2i + 1` |

use nx_gguf::GgmlType;

use super::block::{read_f16, BlockFormat};
use super::grids::{grid_dot, GridBlock, IQ3S_GRID};

/// Bytes of one super-block.
pub const BYTES: usize = 110;
/// Low index bytes.
pub const QS: usize = 2;
/// `qh[8]`.
pub const QH: usize = 66;
/// `signs[32]`.
pub const SIGNS: usize = 74;
/// `scales[4]`.
pub const SCALES: usize = 106;
const _: () = assert!(SCALES + 4 == BYTES && GgmlType::IQ3_S.type_size() == BYTES);

/// The factor ggml's kernel applies to the final sum.
pub(crate) const POST_SCALE: f32 = 1.0;

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::IQ3_S,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: None,
    quantize_block: None,
};

/// The magnitudes of weights `4m..4m+4`.
#[inline(always)]
fn quad(b: &[u8], m: usize) -> &'static [u8; 4] {
    let high = ((b[QH + m / 8] as usize) << (8 - m % 8)) & 256;
    &IQ3S_GRID[b[QS + m] as usize | high]
}

/// The 4-bit scale of 32-block `g`.
#[inline(always)]
fn group_scale(b: &[u8], g: usize) -> u32 {
    (b[SCALES + g / 2] >> (4 * (g % 2)) & 15) as u32
}

/// `y = (d·(1 + 2·ls))·grid·(±1)` (ggml's `dequantize_row_iq3_s`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for m in 0..64 {
        let db = d * (1 + 2 * group_scale(b, m / 8)) as f32;
        let signs = b[SIGNS + m / 2] >> (4 * (m % 2));
        for (j, &mag) in quad(b, m).iter().enumerate() {
            let sign = if signs >> j & 1 != 0 { -1.0 } else { 1.0 };
            y[4 * m + j] = db * mag as f32 * sign;
        }
    }
}

/// IQ3_S × Q8_K in the order of ggml's AVX2 kernel (`grid_dot` with multipliers
/// `2·ls + 1` and no final factor).
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
        block.put4x2(k, quad(b, 2 * k), quad(b, 2 * k + 1), b[SIGNS + k]);
    }
    for g in 0..8 {
        let mult = 2 * group_scale(b, g) as i32 + 1;
        block.scales[2 * g] = mult;
        block.scales[2 * g + 1] = mult;
    }
    read_f16(b, 0)
}
