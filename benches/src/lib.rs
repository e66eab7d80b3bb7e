//! The workspace's criterion suite. The benches live in `benches/benches/`, one file per
//! subject (`cargo bench -p nx-benches --bench NAME`): `gemv` (decode rows per weight type
//! and tier), `prefill` (multi-token tiles), `attention`, `forward` (a decode step and a
//! prefill chunk of the tiny model), `sampler`, `encode` (the tokenizer). The SIMD tier is
//! the process's (`NX_TIER=avx2` or `scalar` to bench a lower one; `NX_AMX=0` turns AMX
//! off). End-to-end speed against llama.cpp is `cargo xtask bench`, not this suite.

use nx_lazy_weight::{quantize_row, row_bytes, GgmlType};

/// SplitMix64 values mapped to roughly normal floats.
pub fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            let mut sum = 0f32;
            for _ in 0..4 {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                sum += (z >> 40) as f32 / (1u64 << 24) as f32;
            }
            (sum - 2.0) * scale
        })
        .collect()
}

/// `[n_rows, row_len]` weights of `ty`: up to 256 distinct quantized rows, tiled.
pub fn weights(ty: GgmlType, row_len: usize, n_rows: usize) -> Vec<u8> {
    let rb = row_bytes(ty, row_len).unwrap();
    let distinct = n_rows.min(256);
    let mut base = vec![0u8; rb * distinct];
    for (r, row) in base.chunks_exact_mut(rb).enumerate() {
        quantize_row(ty, &values(r as u64, row_len, 0.05), row).unwrap();
    }
    let mut out = Vec::with_capacity(rb * n_rows);
    while out.len() < rb * n_rows {
        let take = (rb * n_rows - out.len()).min(base.len());
        out.extend_from_slice(&base[..take]);
    }
    out
}

/// `[n_rows, row_len]` weights of a grid format (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
/// IQ3_XXS, IQ3_S), which nx has no quantizer for: random bytes are valid blocks of
/// each (every index, sign, scale and offset is some lattice point), given a finite
/// super-block scale, set here to 1/16. Up to 256 distinct rows, tiled.
///
/// # Panics
/// For any other type.
pub fn grid_weights(ty: GgmlType, row_len: usize, n_rows: usize) -> Vec<u8> {
    use GgmlType::*;
    assert!(
        matches!(
            ty,
            IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S
        ),
        "grid_weights: {ty:?} is not a grid format"
    );
    let block = ty.type_size();
    let rb = row_len / 256 * block;
    let distinct = n_rows.min(256);
    let mut state = 0x5EED_u64;
    let mut base: Vec<u8> = (0..rb * distinct)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let z = (state ^ (state >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            (z >> 56) as u8
        })
        .collect();
    let d = 0x2C00u16; // 1/16 as f16
    for b in base.chunks_exact_mut(block) {
        if ty == IQ1_M {
            // The f16 spread over the top nibbles of the four scale words.
            for k in 0..4 {
                let at = 48 + 2 * k + 1;
                b[at] = (b[at] & 0x0F) | ((((d >> (4 * k)) & 0xF) as u8) << 4);
            }
        } else {
            b[..2].copy_from_slice(&d.to_le_bytes());
        }
    }
    let mut out = Vec::with_capacity(rb * n_rows);
    while out.len() < rb * n_rows {
        let take = (rb * n_rows - out.len()).min(base.len());
        out.extend_from_slice(&base[..take]);
    }
    out
}
