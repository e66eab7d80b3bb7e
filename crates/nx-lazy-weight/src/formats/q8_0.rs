//! Q8_0: 32 weights (or activations) as signed bytes with one scale, `w = d·q`; the
//! activation type of the 32-element formats, and a weight format multiplied with
//! itself.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..34 | `qs[32]` i8 |

use nx_gguf::GgmlType;

use super::block::dot32_rows;
use super::block::{f32_to_f16, nearest_int, read_f16, BlockFormat};

/// Bytes of one block.
pub const BYTES: usize = super::block::Q8_0_BLOCK_BYTES;
/// `qs[32]` i8.
pub const QS: usize = 2;
const _: () = assert!(QS + 32 == BYTES && GgmlType::Q8_0.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::Q8_0,
    block_len: 32,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_0, dot)),
    dot4: Some(dot4),
    quantize_block: Some(quantize_block),
};

/// `y = q·d` (ggml's `dequantize_row_q8_0`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[QS..QS + 32]) {
        *v = q as i8 as f32 * d;
    }
}

/// Q8_0 × Q8_0 in the order of ggml's x86 kernel (as Q4_0's).
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    dot32_rows(w, BYTES, [x], quants)[0]
}

/// [`dot`] for four activation rows, each weight block read once: row `t`'s result is
/// `dot(w, x[t])`, bit for bit.
#[inline(always)]
pub fn dot4(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    dot32_rows(w, BYTES, x, quants)
}

/// The quants of one block, widened.
#[inline(always)]
fn quants(wb: &[u8]) -> [i32; 32] {
    let mut wq = [0i32; 32];
    for (q, &b) in wq.iter_mut().zip(&wb[QS..QS + 32]) {
        *q = b as i8 as i32;
    }
    wq
}

/// ggml's `quantize_row_q8_0_ref`: `d = amax/127`, `id = 1/d` (0 when d is 0),
/// `q = round_half_away(x·id)`.
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        // ggml's MAX(a, b) is `a > b ? a : b`: keep the running max unless beaten.
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    for (o, &v) in b[QS..QS + 32].iter_mut().zip(x) {
        // `round` is half away from zero, as C's roundf.
        *o = (v * id).round() as i8 as u8;
    }
}

/// Q8_0 for activations, the way ggml's x86 build quantizes them before a Q4_0/Q5_0/Q8_0
/// dot product: the multiplier is `127/amax` (not `1/(amax/127)`) and rounding is to
/// nearest-even. It differs from the reference quantizer in the last bit of rare
/// elements; using the same one as the reference engine keeps our logits next to its.
pub(crate) fn quantize_acts_block(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    b[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    for (o, &v) in b[QS..QS + 32].iter_mut().zip(x) {
        *o = nearest_int(v * id).clamp(-128, 127) as i8 as u8;
    }
}
