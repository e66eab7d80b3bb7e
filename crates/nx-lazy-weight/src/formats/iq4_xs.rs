//! IQ4_XS: 256 weights as 4-bit indices into IQ4_NL's non-linear table, eight sub-blocks
//! of 32 with 6-bit scales, `w = d·(ls − 32)·KVALUES[i]`; multiplied with Q8_K
//! activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..4 | `scales_h` u16: bits 2j, 2j+1 are the top two bits of sub-block j's scale |
//! | 4..8 | `scales_l[4]`: low nibble sub-block 2k, high nibble 2k+1 (low four bits) |
//! | 8..136 | `qs[128]`: 16 bytes a sub-block, as an IQ4_NL block's |

use nx_gguf::GgmlType;

use super::block::{
    f16_to_f32, f32_to_f16, nearest_int, read_f16, read_f32, signed_abs_max, BlockFormat,
    Q8_K_BLOCK_BYTES, Q8_K_QS,
};
use super::iq4_nl::{self, nibble_indices};
use crate::reduce::{k_quad_lanes, Lanes8};

/// Bytes of one super-block.
pub const BYTES: usize = 136;
/// `scales_h` u16.
pub const SCALES_H: usize = 2;
/// `scales_l[4]`.
pub const SCALES_L: usize = 4;
/// `qs[128]`.
pub const QS: usize = 8;
const _: () = assert!(QS + 128 == BYTES && GgmlType::IQ4_XS.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::IQ4_XS,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: None,
    quantize_block: Some(quantize_block),
};

/// The eight sub-block scales `ls − 32` (−32..31).
#[inline(always)]
pub(crate) fn scales(b: &[u8]) -> [i32; 8] {
    let sh = u16::from_le_bytes([b[SCALES_H], b[SCALES_H + 1]]) as i32;
    let mut ls = [0i32; 8];
    for (j, s) in ls.iter_mut().enumerate() {
        let low = (b[SCALES_L + j / 2] >> (4 * (j % 2))) & 0x0F;
        *s = (low as i32 | (((sh >> (2 * j)) & 3) << 4)) - 32;
    }
    ls
}

/// `y = (d·(ls − 32))·KVALUES[i]` (ggml's `dequantize_row_iq4_xs`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for (j, ls) in scales(b).into_iter().enumerate() {
        let dl = d * ls as f32;
        let q = iq4_nl::levels(&b[QS + 16 * j..QS + 16 * j + 16]);
        for (v, q) in y[32 * j..32 * j + 32].iter_mut().zip(q) {
            *v = dl * q as f32;
        }
    }
}

/// IQ4_XS × Q8_K in the order of ggml's AVX2 kernel: per super-block eight integer lanes
/// (lane `l` = `Σ_j ls_j·Σ w·x` over positions `4l..4l+4` of each sub-block), one
/// `fma(d_w·d_x, lane)` each, then the eight lanes summed.
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (wb, xb) in w.chunks_exact(BYTES).zip(x.chunks_exact(Q8_K_BLOCK_BYTES)) {
        let mut wq = [0i8; 256];
        for j in 0..8 {
            let q = iq4_nl::levels(&wb[QS + 16 * j..QS + 16 * j + 16]);
            for (o, q) in wq[32 * j..32 * j + 32].iter_mut().zip(q) {
                *o = q as i8;
            }
        }
        let lanes = k_quad_lanes(&wq, &xb[Q8_K_QS..Q8_K_QS + 256], &scales(wb), 32);
        acc.fma_block(read_f16(wb, 0) * read_f32(xb, 0), &lanes);
    }
    acc.sum()
}

/// A simple quantizer for fixtures (not ggml's search): each sub-block's step is
/// `max/−127` of its own elements, the steps are quantized to 6-bit multiples of one
/// `d`, and each weight takes the nearest table level.
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let mut steps = [0.0f32; 8];
    for (s, sub) in steps.iter_mut().zip(x.chunks_exact(32)) {
        *s = signed_abs_max(sub) / -127.0;
    }
    let max_step = steps.iter().fold(0.0f32, |m, &s| m.max(s.abs()));
    let d_bits = f32_to_f16(max_step / 31.0);
    let d = f16_to_f32(d_bits);
    b[..2].copy_from_slice(&d_bits.to_le_bytes());
    let mut sh = 0u16;
    b[SCALES_L..SCALES_L + 4].fill(0);
    for (j, sub) in x.chunks_exact(32).enumerate() {
        let ls = if d > 0.0 {
            nearest_int(steps[j] / d).clamp(-32, 31)
        } else {
            0
        };
        let stored = (ls + 32) as u8;
        b[SCALES_L + j / 2] |= (stored & 0x0F) << (4 * (j % 2));
        sh |= ((stored >> 4) as u16) << (2 * j);
        let dl = d * ls as f32;
        nibble_indices(sub, dl, &mut b[QS + 16 * j..QS + 16 * j + 16]);
    }
    b[SCALES_H..SCALES_H + 2].copy_from_slice(&sh.to_le_bytes());
}
