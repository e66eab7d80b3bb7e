//! IQ1_M (1.75 bits a weight): 256 weights; each group of 8 is an 11-bit index into the
//! 2048-entry `IQ1S_GRID` with its own offset sign; a 3-bit scale per 16, and the f16
//! super-block scale spread over the top nibbles of the scale words,
//! `w = d·(2·ls + 1)·(grid ± 0.125)`; multiplied with Q8_K activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..32 | low eight index bits, one byte per 8 weights |
//! | 32..48 | `qh[16]`: per 8 weights a nibble, bits 0..3 the high index bits, bit 3 the offset's sign (set: −) |
//! | 48..56 | `scales` as four u16: bits `6h + 3i..6h + 3i + 3` scale `i` of 32-block `2k + h` of word `k`; bits 12..16 of the four words the f16 `d` |

use nx_gguf::GgmlType;

use super::block::{f16_to_f32, read_f32, BlockFormat, Q8_K_BLOCK_BYTES, Q8_K_QS};
use super::grids::{common_blocks, GridBlock, IQ1S_GRID};
use super::iq1_s::{put_ternary8, DELTA};
use crate::reduce::Lanes8;

/// Bytes of one super-block.
pub const BYTES: usize = 56;
/// Low index bytes.
pub const QS: usize = 0;
/// `qh[16]`.
pub const QH: usize = 32;
/// Scale words.
pub const SCALES: usize = 48;
const _: () = assert!(SCALES + 8 == BYTES && GgmlType::IQ1_M.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::IQ1_M,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: None,
    quantize_block: None,
};

/// The four scale words.
#[inline(always)]
pub(crate) fn scale_words(b: &[u8]) -> [u32; 4] {
    std::array::from_fn(|k| u16::from_le_bytes([b[SCALES + 2 * k], b[SCALES + 2 * k + 1]]) as u32)
}

/// The super-block scale, from the top nibbles of the scale words.
#[inline(always)]
pub(crate) fn super_scale(sc: &[u32; 4]) -> f32 {
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    f16_to_f32(bits as u16)
}

/// The multiplier `2·ls + 1` of weights `16s..16s+16`.
#[inline(always)]
pub(crate) fn multiplier(sc: &[u32; 4], s: usize) -> u32 {
    let g = s / 2;
    2 * ((sc[g / 2] >> (6 * (g % 2) + 3 * (s % 2))) & 7) + 1
}

/// Weights `8k..8k+8`: grid values, and whether their offset is negative.
#[inline(always)]
pub(crate) fn octet(b: &[u8], k: usize) -> (&'static [u8; 8], bool) {
    let nibble = (b[QH + k / 2] >> (4 * (k % 2))) & 15;
    let index = b[QS + k] as usize | ((nibble as usize & 7) << 8);
    (&IQ1S_GRID[index], nibble & 8 != 0)
}

/// `y = (d·(2·ls + 1))·(grid + delta)` (ggml's `dequantize_row_iq1_m`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let sc = scale_words(b);
    let d = super_scale(&sc);
    for k in 0..32 {
        let dl = d * multiplier(&sc, k / 2) as f32;
        let (grid, negative) = octet(b, k);
        let delta = if negative { -DELTA } else { DELTA };
        for (j, &v) in grid.iter().enumerate() {
            y[8 * k + j] = dl * (v as i8 as f32 + delta);
        }
    }
}

/// IQ1_M × Q8_K in the order of ggml's AVX2 kernel: two sets of eight lanes, the grid
/// part (`GridBlock::lanes`) and the offset part (the activations signed by each
/// group's offset sign, same multipliers), each fused into running lanes with
/// `d_x·d`; at the end `hsum_float_8(grid) + 0.125·hsum_float_8(offsets)`.
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    let mut grid_lanes = Lanes8::default();
    let mut offset_lanes = Lanes8::default();
    let mut grid = GridBlock::new();
    let mut offsets = GridBlock::new();
    for i in 0..common_blocks(w, BYTES, &[x]) {
        let d_w = decode(&w[i * BYTES..(i + 1) * BYTES], &mut grid, &mut offsets);
        let xb = &x[i * Q8_K_BLOCK_BYTES..(i + 1) * Q8_K_BLOCK_BYTES];
        let d = read_f32(xb, 0) * d_w;
        let xq = &xb[Q8_K_QS..Q8_K_QS + 256];
        grid_lanes.fma_block(d, &grid.lanes(xq));
        offset_lanes.fma_block(d, &offsets.lanes(xq));
    }
    grid_lanes.sum() + DELTA * offset_lanes.sum()
}

/// Fills `grid` (the −1/0/+1 values) and `offsets` (magnitude 1, each group of eight
/// signed by its offset's sign) from one super-block, both with the multipliers
/// `2·ls + 1`; returns `d`.
#[inline(always)]
pub(crate) fn decode(wb: &[u8], grid: &mut GridBlock, offsets: &mut GridBlock) -> f32 {
    // One length check here spares one per field read below.
    let wb = &wb[..BYTES];
    let sc = scale_words(wb);
    for s in 0..16 {
        let m = multiplier(&sc, s) as i32;
        grid.scales[s] = m;
        offsets.scales[s] = m;
    }
    for k in 0..32 {
        let (values, negative) = octet(wb, k);
        put_ternary8(grid, k, values);
        offsets.put_word(k, 0x0101_0101_0101_0101, if negative { 0xff } else { 0 });
    }
    super_scale(&sc)
}
