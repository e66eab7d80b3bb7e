//! IQ1_S (1.56 bits a weight): 256 weights; each group of 8 is an 11-bit index into the
//! 2048-entry `IQ1S_GRID` of −1/0/+1 vectors; per group of 32 a u16 holds the four
//! high index parts, a 3-bit scale and the sign of a shared offset,
//! `w = d·(2·ls + 1)·(grid ± 0.125)`; multiplied with Q8_K activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..34 | low eight index bits, one byte per 8 weights |
//! | 34..50 | `qh[8]` u16: bits `3l..3l+3` high index bits of group `l`, 12..15 `ls`, 15 the offset's sign (set: −) |

use nx_gguf::GgmlType;

use super::block::{read_f16, read_f32, BlockFormat, Q8_K_BLOCK_BYTES, Q8_K_BSUMS, Q8_K_QS};
use super::grids::{common_blocks, GridBlock, IQ1S_GRID};
use crate::reduce::Lanes8;

/// Bytes of one super-block.
pub const BYTES: usize = 50;
/// Low index bytes.
pub const QS: usize = 2;
/// `qh[8]` u16.
pub const QH: usize = 34;
const _: () = assert!(QH + 16 == BYTES && GgmlType::IQ1_S.type_size() == BYTES);

/// ggml's `IQ1S_DELTA` (and `IQ1M_DELTA`): the offset added to every grid value.
pub(crate) const DELTA: f32 = 0.125;

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::IQ1_S,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: None,
    quantize_block: None,
};

/// The `qh` word of group of 32 `g`.
#[inline(always)]
pub(crate) fn qh(b: &[u8], g: usize) -> u32 {
    u16::from_le_bytes([b[QH + 2 * g], b[QH + 2 * g + 1]]) as u32
}

/// The values (−1, 0, 1 as bytes) of weights `8k..8k+8`.
#[inline(always)]
pub(crate) fn octet(b: &[u8], k: usize) -> &'static [u8; 8] {
    let high = ((qh(b, k / 4) >> (3 * (k % 4))) & 7) as usize;
    &IQ1S_GRID[b[QS + k] as usize | high << 8]
}

/// `y = (d·(2·ls + 1))·(grid + delta)` (ggml's `dequantize_row_iq1_s`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for k in 0..32 {
        let h = qh(b, k / 4);
        let dl = d * (2 * ((h >> 12) & 7) + 1) as f32;
        let delta = if h & 0x8000 != 0 { -DELTA } else { DELTA };
        for (j, &v) in octet(b, k).iter().enumerate() {
            y[8 * k + j] = dl * (v as i8 as f32 + delta);
        }
    }
}

/// Stores grid values (bytes of −1, 0, +1) as magnitude and sign (`mul_add_epi8` takes
/// `|g|` times the activation signed by `g`).
#[inline(always)]
pub(crate) fn put_ternary8(block: &mut GridBlock, k: usize, grid: &[u8; 8]) {
    let g = u64::from_le_bytes(*grid);
    // Bytes 0xff, 0, 1: the low bit is the magnitude, the top bit the sign; the multiply
    // gathers the eight top bits into the top byte (bit j from byte j, no carries).
    let signs =
        (((g >> 7) & 0x0101_0101_0101_0101).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8;
    block.put_word(k, g & 0x0101_0101_0101_0101, signs);
}

/// IQ1_S × Q8_K in the order of ggml's AVX2 kernel: the grid part as eight lanes
/// (`GridBlock::lanes`, multipliers `2·ls + 1`) fused into running lanes with
/// `d_x·d_w`; the offset part as one integer per super-block, `Σ ±(2·ls + 1)·bsum`,
/// added into a scalar as `acc = fma(d, sum, acc)` (the C source writes `acc += d·sum`;
/// GCC contracts it, which the IQ1_S dot fixture, with block scales kept within one
/// octave, tells apart: unfused, 5 of its 24 cases differ in the last bit); at the end
/// `hsum_float_8(lanes) + 0.125·acc`.
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    let mut lanes = Lanes8::default();
    let mut offsets = 0.0f32;
    let mut block = GridBlock::new();
    let mut signed_scales = [0i32; 8];
    for i in 0..common_blocks(w, BYTES, &[x]) {
        // An exact block: one length check spares one per field read below.
        let wb = &w[i * BYTES..(i + 1) * BYTES];
        for g in 0..8 {
            let h = qh(wb, g);
            let mult = 2 * ((h >> 12) & 7) as i32 + 1;
            block.scales[2 * g] = mult;
            block.scales[2 * g + 1] = mult;
            signed_scales[g] = if h & 0x8000 != 0 { -mult } else { mult };
            for l in 0..4 {
                put_ternary8(&mut block, 4 * g + l, octet(wb, 4 * g + l));
            }
        }
        let xb = &x[i * Q8_K_BLOCK_BYTES..(i + 1) * Q8_K_BLOCK_BYTES];
        let bsum = |s: usize| {
            i16::from_le_bytes([xb[Q8_K_BSUMS + 2 * s], xb[Q8_K_BSUMS + 2 * s + 1]]) as i32
        };
        let offset_sum: i32 = (0..8)
            .map(|g| (bsum(2 * g) + bsum(2 * g + 1)) * signed_scales[g])
            .sum();
        let d = read_f32(xb, 0) * read_f16(wb, 0);
        lanes.fma_block(d, &block.lanes(&xb[Q8_K_QS..Q8_K_QS + 256]));
        offsets = d.mul_add(offset_sum as f32, offsets);
    }
    lanes.sum() + DELTA * offsets
}
