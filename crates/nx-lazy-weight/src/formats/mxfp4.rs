//! MXFP4 (OCP microscaling FP4): 32 weights as 4-bit E2M1 codes with one shared
//! power-of-two scale, `w = 2^(e−128)·KVALUES[i]` (the table holds the E2M1 values
//! doubled, hence the halved scale); multiplied with Q8_0 activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0 | `e` u8: E8M0 exponent, scale `2^(e−127)` (halved here: `2^(e−128)`) |
//! | 1..17 | `qs[16]`: low nibbles index weights 0..16, high nibbles 16..32 |

use nx_gguf::GgmlType;

use super::block::BlockFormat;
use super::iq4_nl::paired_table_dot;

/// Bytes of one block.
pub const BYTES: usize = 17;
/// `e` u8.
pub const E: usize = 0;
/// `qs[16]`.
pub const QS: usize = 1;
const _: () = assert!(E + 1 == QS && QS + 16 == BYTES && GgmlType::MXFP4.type_size() == BYTES);

/// The 16 E2M1 values, doubled (ggml's `kvalues_mxfp4`): codes 8..16 are the negatives
/// of 0..8 (code 8 is −0, stored as 0).
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::MXFP4,
    block_len: 32,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_0, dot)),
    dot4: None,
    quantize_block: Some(quantize_block),
};

/// Half the E8M0 scale `2^(e−127)`, i.e. `2^(e−128)`, exactly (ggml's
/// `ggml_e8m0_to_fp32_half`): `e` 0 and 1 give the subnormals 2^−128 and 2^−127; 255
/// gives 2^127 (ggml does not treat it as NaN).
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// The 32 weights of a 16-byte nibble field as table values, in weight order.
#[inline(always)]
fn levels(qs: &[u8]) -> [i32; 32] {
    let mut q = [0i32; 32];
    for j in 0..16 {
        q[j] = KVALUES[(qs[j] & 0x0F) as usize] as i32;
        q[j + 16] = KVALUES[(qs[j] >> 4) as usize] as i32;
    }
    q
}

/// `y = KVALUES[i]·2^(e−128)` (ggml's `dequantize_row_mxfp4`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    let d = e8m0_to_f32_half(b[E]);
    for (v, q) in y.iter_mut().zip(levels(&b[QS..QS + 16])) {
        *v = q as f32 * d;
    }
}

/// MXFP4 × Q8_0 in the order of ggml's AVX2 kernel, which is IQ4_NL's with the block
/// scale `d_x·2^(e−128)`: blocks in pairs into two sets of eight lanes
/// (`fma(d, lane)`), added lane-wise and summed; an odd last block added after as one
/// fused multiply-add (see `paired_table_dot`).
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    paired_table_dot(w, x, BYTES, |wb| {
        (e8m0_to_f32_half(wb[E]), levels(&wb[QS..QS + 16]))
    })
}

/// ggml's `quantize_row_mxfp4_ref`: `e = floor(log2(amax)) − 2 + 127` (0 for an all-zero
/// block), so the largest magnitude lands in the top of the table's range, then each
/// weight the table entry of least `|KVALUES[i]·d − x|` (the first one on ties).
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let amax = x
        .iter()
        .fold(0.0f32, |a, &v| if a < v.abs() { v.abs() } else { a });
    let e = if amax > 0.0 {
        // Out-of-range exponents saturate (C leaves them undefined).
        (amax.log2().floor() - 2.0 + 127.0) as u8
    } else {
        0
    };
    let d = e8m0_to_f32_half(e);
    b[E] = e;
    for j in 0..16 {
        b[QS + j] = best_index(x[j], d) | (best_index(x[j + 16], d) << 4);
    }
}

/// The index of the table entry nearest to `x` at scale `d` (ggml's `best_index_mxfp4`).
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (KVALUES[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        for e in 0..=255u8 {
            assert_eq!(e8m0_to_f32_half(e), (e as f32 - 128.0).exp2(), "e={e}");
        }
    }

    #[test]
    fn quantizer_round_trips_table_values() {
        // Every table value at scale 1/4 (e = 126): amax 12/4 = 3 gives floor(log2 3) = 1,
        // e = 1 − 2 + 127 = 126, d = 2^−2.
        let x: Vec<f32> = (0..32).map(|i| KVALUES[i % 16] as f32 * 0.25).collect();
        let mut b = [0u8; BYTES];
        quantize_block(&x, &mut b);
        assert_eq!(b[E], 126);
        let mut y = [0f32; 32];
        dequantize_block(&b, &mut y);
        assert_eq!(&y[..], &x[..]);
    }
}
