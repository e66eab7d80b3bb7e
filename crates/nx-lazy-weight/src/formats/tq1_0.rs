//! TQ1_0 (ternary, BitNet b1.58 / TriLM, 1.69 bits per weight): 256 weights as base-3
//! digits packed five to a byte (four in `qh`), with one scale, `w = d·(t − 1)` for a
//! digit `t` in 0..=2; multiplied with Q8_K activations.
//!
//! | bytes | field |
//! |---|---|
//! | 0..48 | `qs[48]`: five digits a byte; bytes 0..32 hold weights `32n + m` (byte `m`, digit `n`), bytes 32..48 weights `160 + 16n + m` |
//! | 48..52 | `qh[4]`: four digits a byte, weight `240 + 4n + j` (byte `j`, digit `n`) |
//! | 52..54 | `d` f16 |
//!
//! A byte stores its digits as the fraction `⌈256·v/243⌉` of their base-3 number `v`
//! (first digit most significant); digit `n` is the top two bits of `3·(byte·3^n mod
//! 256)`, i.e. `((byte·3^n mod 256)·3) >> 8`.

use nx_gguf::GgmlType;

use super::block::{read_f16, BlockFormat};
use super::tq2_0::{ternary_dequantize, ternary_dot, ternary_levels};

/// Bytes of one super-block.
pub const BYTES: usize = 54;
/// `qs[48]`.
pub const QS: usize = 0;
/// `qh[4]`.
pub const QH: usize = 48;
/// `d` f16.
pub const D: usize = 52;
const _: () =
    assert!(QS + 48 == QH && QH + 4 == D && D + 2 == BYTES && GgmlType::TQ1_0.type_size() == BYTES);

/// The table row.
pub const FORMAT: BlockFormat = BlockFormat {
    ggml_type: GgmlType::TQ1_0,
    block_len: 256,
    block_bytes: BYTES,
    dequantize_block,
    dot: Some((GgmlType::Q8_K, dot)),
    dot4: None,
    quantize_block: Some(quantize_block),
};

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Digit `n` (0 = most significant) of a packed byte: 0, 1 or 2.
#[inline(always)]
fn digit(byte: u8, n: usize) -> u8 {
    let q = byte.wrapping_mul(POW3[n]);
    ((q as u16 * 3) >> 8) as u8
}

/// The 256 digits (0..=2, the weight plus one), in weight order.
#[inline(always)]
fn levels(b: &[u8]) -> [u8; 256] {
    let mut q = [0u8; 256];
    for n in 0..5 {
        for m in 0..32 {
            q[32 * n + m] = digit(b[QS + m], n);
        }
        for m in 0..16 {
            q[160 + 16 * n + m] = digit(b[QS + 32 + m], n);
        }
    }
    for n in 0..4 {
        for j in 0..4 {
            q[240 + 4 * n + j] = digit(b[QH + j], n);
        }
    }
    q
}

/// `y = (t − 1)·d` (ggml's `dequantize_row_tq1_0`).
pub fn dequantize_block(b: &[u8], y: &mut [f32]) {
    ternary_dequantize(read_f16(b, D), &levels(b), y);
}

/// TQ1_0 × Q8_K in the order of ggml's AVX2 kernel, which decodes the digits to bytes in
/// weight order and then reduces exactly as TQ2_0's (`ternary_dot`).
// Inlined into `scalar_x86`'s copy compiled for AVX2 + FMA.
#[inline(always)]
pub fn dot(w: &[u8], x: &[u8]) -> f32 {
    ternary_dot(w, x, BYTES, |wb| (read_f16(wb, D), levels(wb)))
}

/// Packs base-3 digits (first most significant) as ggml does: `⌈256·v/243⌉` of their
/// number `v`, four-digit groups shifted up one digit first.
fn pack(digits: impl Iterator<Item = u8>, count: usize) -> u8 {
    let mut v = 0u16;
    for t in digits.take(count) {
        v = v * 3 + t as u16;
    }
    if count == 4 {
        v *= 3;
    }
    (v * 256).div_ceil(243) as u8
}

/// ggml's `quantize_row_tq1_0_ref`: the TQ2_0 levels (`d = amax`,
/// `round_half_away(x/amax) + 1`), packed five digits a byte (four in `qh`).
pub fn quantize_block(x: &[f32], b: &mut [u8]) {
    let (d, q) = ternary_levels(x);
    for m in 0..32 {
        b[QS + m] = pack((0..5).map(|n| q[32 * n + m]), 5);
    }
    for m in 0..16 {
        b[QS + 32 + m] = pack((0..5).map(|n| q[160 + 16 * n + m]), 5);
    }
    for j in 0..4 {
        b[QH + j] = pack((0..4).map(|n| q[240 + 4 * n + j]), 4);
    }
    b[D..D + 2].copy_from_slice(&d.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_packed_digit_string_decodes_to_itself() {
        // All 3^5 five-digit and 3^4 four-digit strings.
        for v in 0..243u16 {
            let digits: Vec<u8> = (0..5).rev().map(|i| (v / 3u16.pow(i) % 3) as u8).collect();
            let byte = pack(digits.iter().copied(), 5);
            let back: Vec<u8> = (0..5).map(|n| digit(byte, n)).collect();
            assert_eq!(back, digits, "v={v}");
            if v < 81 {
                let byte = pack(digits[1..].iter().copied(), 4);
                let back: Vec<u8> = (0..4).map(|n| digit(byte, n)).collect();
                assert_eq!(back, &digits[1..], "v={v} (four digits)");
            }
        }
    }
}
