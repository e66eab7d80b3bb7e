//! Q8_1: 32 activations as signed bytes with a scale and their scaled sum; what Q4_1 and
//! Q5_1 weights are multiplied with (the sum carries the weights' offset term).
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..4 | `s` f16: `d·Σq` |
//! | 4..36 | `qs[32]` i8 |

use nx_gguf::GgmlType;

use super::block::{f32_to_f16, nearest_int, read_f16, BlockFormat};

/// Bytes of one block.
pub const BYTES: usize = 36;
/// `s` f16.
pub const S: usize = 2;
/// `qs[32]` i8.
pub const QS: usize = 4;
const _: () = assert!(QS + 32 == BYTES && GgmlType::Q8_1.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::Q8_1,
    block_len: 32,
    block_bytes: BYTES,
    dequantize_block,
    dot: None,
    dot4: None,
    quantize_block: Some(quantize_block),
};

/// `y = d·q` (ggml has no Q8_1 dequantizer; this one is for tests).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[QS..QS + 32]) {
        *v = q as i8 as f32 * d;
    }
}

/// Quantizes 32 activations the way ggml's x86 build does before a Q4_1/Q5_1 dot
/// product (`quantize_row_q8_1` with AVX2): multiplier `127/amax`, rounding to nearest
/// even, `s = f16(d·Σq)` with the integer sum taken exactly.
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (o, &v) in b[QS..QS + 32].iter_mut().zip(x) {
        let q = nearest_int(v * id).clamp(-128, 127);
        sum += q;
        *o = q as i8 as u8;
    }
    b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    b[S..S + 2].copy_from_slice(&f32_to_f16(d * sum as f32).to_le_bytes());
}
