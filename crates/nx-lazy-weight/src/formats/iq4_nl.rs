//! IQ4_NL: 32 weights as 4-bit indices into a fixed non-linear table of 16 levels, with
//! one scale, `w = d·KVALUES[i]`; multiplied with Q8_0 activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | `d` f16 |
//! | 2..18 | `qs[16]`: low nibbles index weights 0..16, high nibbles 16..32 |

use nx_gguf::GgmlType;

use super::block::{
    best_index_int8, f16_to_f32, f32_to_f16, read_f16, signed_abs_max, BlockFormat,
    Q8_0_BLOCK_BYTES,
};
use crate::reduce::{quad_lanes, Lanes8};

/// Bytes of one block.
pub const BYTES: usize = 18;
/// `qs[16]`.
pub const QS: usize = 2;
const _: () = assert!(QS + 16 == BYTES && GgmlType::IQ4_NL.type_size() == BYTES);

/// The 16 levels (ggml's `kvalues_iq4nl`), shared with IQ4_XS.
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::IQ4_NL,
    block_len: 32,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_0, dot)),
    dot4: None,
    quantize_block: Some(quantize_block),
};

/// The 32 weights of a 16-byte nibble field as table levels, in weight order.
#[inline(always)]
pub(crate) fn levels(qs: &[u8]) -> [i32; 32] {
    let mut q = [0i32; 32];
    for j in 0..16 {
        q[j] = KVALUES[(qs[j] & 0x0F) as usize] as i32;
        q[j + 16] = KVALUES[(qs[j] >> 4) as usize] as i32;
    }
    q
}

/// `y = d·KVALUES[i]` (ggml's `dequantize_row_iq4_nl`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = read_f16(b, 0);
    for (v, q) in y.iter_mut().zip(levels(&b[QS..QS + 16])) {
        *v = d * q as f32;
    }
}

/// IQ4_NL × Q8_0 in the order of ggml's AVX2 kernel: blocks in pairs, even blocks in one
/// set of eight lanes and odd blocks in another (`fma(d_x·d_w, lane)` each), the two
/// added lane-wise and then summed; an odd last block is added after, as one fused
/// multiply-add of its scale with its integer sum.
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    paired_table_dot(w, x, BYTES, |wb| {
        (read_f16(wb, 0), levels(&wb[QS..QS + 16]))
    })
}

/// The paired-block loop of ggml's AVX2 kernels for 32-weight table formats against
/// Q8_0 (IQ4_NL, MXFP4): `decode` gives a weight block's scale and its 32 levels; block
/// `ib` of a pair goes into lane set `ib % 2` as `fma(d_x·d_w, lane)`, the two sets are
/// added lane-wise and summed (`hsum_float_8`), and an odd last block is added after as
/// one fused multiply-add of its scale with its integer sum.
#[inline(always)]
pub(crate) fn paired_table_dot(
    w: &[u8],
    x: &[u8],
    block_bytes: usize,
    decode: impl Fn(&[u8]) -> (f32, [i32; 32]),
) -> f32 {
    let mut acc = [Lanes8::default(); 2];
    let n_blocks = w.len() / block_bytes;
    let paired = n_blocks & !1;
    let blocks = w
        .chunks_exact(block_bytes)
        .zip(x.chunks_exact(Q8_0_BLOCK_BYTES));
    let mut tail = None;
    for (ib, (wb, xb)) in blocks.enumerate() {
        let (d_w, q) = decode(wb);
        let d = read_f16(xb, 0) * d_w;
        let lanes = quad_lanes(&q, &xb[2..]);
        if ib < paired {
            acc[ib % 2].fma_block(d, &lanes);
        } else {
            tail = Some((d, lanes.iter().sum::<i32>()));
        }
    }
    let sumf = acc[0].plus(&acc[1]).sum();
    match tail {
        Some((d, sumi)) => d.mul_add(sumi as f32, sumf),
        None => sumf,
    }
}

/// A simple quantizer for fixtures (not ggml's search): `d = max/−127` from the element
/// of largest magnitude, each weight the nearest table level of `x/d`.
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let d_bits = f32_to_f16(signed_abs_max(x) / -127.0);
    b[..2].copy_from_slice(&d_bits.to_le_bytes());
    nibble_indices(x, f16_to_f32(d_bits), &mut b[QS..QS + 16]);
}

/// Writes the nearest-level indices of 32 weights for step `d` into a nibble field.
pub(crate) fn nibble_indices(x: &[f32], d: f32, qs: &mut [u8]) {
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let index = |v: f32| best_index_int8(&KVALUES, v * id) as u8;
    for j in 0..16 {
        qs[j] = index(x[j]) | (index(x[j + 16]) << 4);
    }
}
