//! Q3_K: 256 weights as signed 3-bit levels (−4..3) in sixteen sub-blocks of 16, each
//! with a signed 6-bit scale, `w = (d·(sc − 32))·q`; multiplied with Q8_K activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..32 | `hmask[32]`: bit `4h + k` of byte b is set when weight `128h + 32k + b` is ≥ 0 |
//! | 32..96 | `qs[64]`: low two bits of weight `128h + 32k + b` at bits `2k..2k+2` of byte `32h + b` |
//! | 96..108 | `scales[12]`: sixteen 6-bit scales, packed (see [`scales`]) |
//! | 108..110 | `d` f16 |

use nx_gguf::GgmlType;

use super::block::{
    f16_to_f32, f32_to_f16, nearest_int, read_f16, read_f32, signed_abs_max, BlockFormat,
    Q8_K_BLOCK_BYTES, Q8_K_QS,
};
use crate::reduce::{k_quad_lanes, Lanes8};

/// Bytes of one super-block.
pub const BYTES: usize = 110;
/// `qs[64]`.
pub const QS: usize = 32;
/// `scales[12]`.
pub const SCALES: usize = 96;
/// `d` f16.
pub const D: usize = 108;
const _: () = assert!(D + 2 == BYTES && GgmlType::Q3_K.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::Q3_K,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: None,
    quantize_block: Some(quantize_block),
};

/// The sixteen scales `sc − 32` (−32..31). Scale j keeps its low four bits in byte j
/// (j < 8, low nibble) or byte j − 8 (high nibble), its top two bits at bits
/// `2·(j/4)` of byte `8 + j%4`.
#[inline(always)]
pub fn scales(packed: &[u8]) -> [i32; 16] {
    let mut sc = [0i32; 16];
    for (j, s) in sc.iter_mut().enumerate() {
        let low = if j < 8 {
            packed[j] & 0x0F
        } else {
            packed[j - 8] >> 4
        };
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        *s = (low | (high << 4)) as i32 - 32;
    }
    sc
}

/// The 256 levels (−4..3), in weight order.
#[inline(always)]
pub(crate) fn levels(b: &[u8]) -> [i8; 256] {
    let mut q = [0i8; 256];
    for h in 0..2 {
        for k in 0..4 {
            for i in 0..32 {
                let low = ((b[QS + 32 * h + i] >> (2 * k)) & 3) as i8;
                let high_set = (b[i] >> (4 * h + k)) & 1 == 1;
                q[128 * h + 32 * k + i] = if high_set { low } else { low - 4 };
            }
        }
    }
    q
}

/// `y = (d·(sc − 32))·q` (ggml's `dequantize_row_q3_K`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, D);
    let sc = scales(&b[SCALES..SCALES + 12]);
    let q = levels(b);
    for (j, (ys, qs)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
        let dl = d * sc[j] as f32;
        for (v, &q) in ys.iter_mut().zip(qs) {
            *v = dl * q as f32;
        }
    }
}

/// Q3_K × Q8_K in the order of ggml's AVX2 kernel: per super-block eight integer lanes
/// of scaled level sums, one `fma(d_x·d_w, lane)` each, then the eight lanes summed.
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    let mut acc = Lanes8::default();
    for (wb, xb) in w.chunks_exact(BYTES).zip(x.chunks_exact(Q8_K_BLOCK_BYTES)) {
        let sc = scales(&wb[SCALES..SCALES + 12]);
        let lanes = k_quad_lanes(&levels(wb), &xb[Q8_K_QS..Q8_K_QS + 256], &sc, 16);
        acc.fma_block(read_f32(xb, 0) * read_f16(wb, D), &lanes);
    }
    acc.sum()
}

/// A simple quantizer for fixtures (not ggml's search): each sub-block's step is
/// `max/−4` of its own elements (so the extreme element is level −4), the steps are
/// quantized to signed 6-bit multiples of one `d`, and `q = round(x/step)` in −4..3.
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let mut steps = [0.0f32; 16];
    for (s, sub) in steps.iter_mut().zip(x.chunks_exact(16)) {
        *s = signed_abs_max(sub) / -4.0;
    }
    let max_step = steps.iter().fold(0.0f32, |m, &s| m.max(s.abs()));
    let d_bits = f32_to_f16(max_step / 31.0);
    let d = f16_to_f32(d_bits);
    b.fill(0);
    for (j, sub) in x.chunks_exact(16).enumerate() {
        let ls = if d > 0.0 {
            nearest_int(steps[j] / d).clamp(-32, 31)
        } else {
            0
        };
        let stored = (ls + 32) as u8;
        if j < 8 {
            b[SCALES + j] |= stored & 0x0F;
        } else {
            b[SCALES + j - 8] |= (stored & 0x0F) << 4;
        }
        b[SCALES + 8 + j % 4] |= (stored >> 4) << (2 * (j / 4));
        let step = d * ls as f32;
        for (i, &v) in sub.iter().enumerate() {
            let q = if step != 0.0 {
                nearest_int(v / step).clamp(-4, 3)
            } else {
                0
            };
            let e = 16 * j + i;
            let (h, k, bi) = (e / 128, (e % 128) / 32, e % 32);
            let (low, high) = if q >= 0 { (q, 1) } else { (q + 4, 0) };
            b[QS + 32 * h + bi] |= (low as u8) << (2 * k);
            b[bi] |= high << (4 * h + k);
        }
    }
    b[D..D + 2].copy_from_slice(&d_bits.to_le_bytes());
}
