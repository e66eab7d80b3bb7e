//! What the IQ1–IQ3 grid formats share: their lattice tables expanded to bytes, the
//! parity-completed sign bytes, and the lane reduction of ggml's AVX2 kernels.
//!
//! A grid format stores, per group of 8 (IQ2, IQ1) or 4 (IQ3) weights, an index into a
//! fixed table of magnitude vectors, plus signs and small scales. The tables are data
//! from `ggml-common.h` (`grid_tables.rs`, written by `cargo xtask golden grids`, as
//! level indices); [`expand8`] and [`expand4`] turn them into bytes at compile time.

use nx_gguf::GgmlType;

use super::block::{Q8_K_BLOCK_BYTES, Q8_K_QS};
use super::grid_tables::{
    IQ1S_CODES, IQ2S_CODES, IQ2XS_CODES, IQ2XXS_CODES, IQ3S_CODES, IQ3XXS_CODES,
};
use super::{iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs};
use crate::reduce::Lanes8;

/// The magnitudes of the IQ2 grids (level indices 0, 1, 2).
const IQ2_LEVELS: [u8; 3] = [0x08, 0x19, 0x2b];
/// `iq2xxs_grid`: 256 vectors of 8 magnitudes.
pub(crate) static IQ2XXS_GRID: [[u8; 8]; 256] = expand8(&IQ2XXS_CODES, IQ2_LEVELS);
/// `iq2xs_grid`: 512 vectors of 8 magnitudes.
pub(crate) static IQ2XS_GRID: [[u8; 8]; 512] = expand8(&IQ2XS_CODES, IQ2_LEVELS);
/// `iq2s_grid`: 1024 vectors of 8 magnitudes.
pub(crate) static IQ2S_GRID: [[u8; 8]; 1024] = expand8(&IQ2S_CODES, IQ2_LEVELS);
/// `iq3xxs_grid`: 256 vectors of 4 magnitudes.
pub(crate) static IQ3XXS_GRID: [[u8; 4]; 256] = expand4(
    &IQ3XXS_CODES,
    [0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e],
);
/// `iq3s_grid`: 512 vectors of 4 magnitudes.
pub(crate) static IQ3S_GRID: [[u8; 4]; 512] = expand4(
    &IQ3S_CODES,
    [0x01, 0x03, 0x05, 0x07, 0x09, 0x0b, 0x0d, 0x0f],
);
/// `iq1s_grid`: 2048 vectors of 8 values in −1, 0, +1 (as the bytes 0xff, 0, 1).
pub(crate) static IQ1S_GRID: [[u8; 8]; 2048] = expand8(&IQ1S_CODES, [0xff, 0x00, 0x01]);

/// Eight elements at two bits of level index each.
const fn expand8<const N: usize>(codes: &[u16; N], levels: [u8; 3]) -> [[u8; 8]; N] {
    let mut out = [[0u8; 8]; N];
    let mut i = 0;
    while i < N {
        let mut j = 0;
        while j < 8 {
            out[i][j] = levels[((codes[i] >> (2 * j)) & 3) as usize];
            j += 1;
        }
        i += 1;
    }
    out
}

/// Four elements at three bits of level index each.
const fn expand4<const N: usize>(codes: &[u16; N], levels: [u8; 8]) -> [[u8; 4]; N] {
    let mut out = [[0u8; 4]; N];
    let mut i = 0;
    while i < N {
        let mut j = 0;
        while j < 4 {
            out[i][j] = levels[((codes[i] >> (3 * j)) & 7) as usize];
            j += 1;
        }
        i += 1;
    }
    out
}

/// The sign byte of a 7-bit sign index (ggml's `ksigns_iq2xs`): bit `j` set means
/// element `j` is negative; the eighth sign is implied, making the count of negatives
/// even.
#[inline(always)]
pub(crate) fn parity_signs(index: u32) -> u8 {
    let i = (index & 127) as u8;
    i | (((i.count_ones() & 1) as u8) << 7)
}

/// One super-block of a grid format, decoded for the dot product: the unsigned
/// magnitudes of every eight weights as one little-endian word, which weights are
/// negative, and the integer multiplier of every 16 weights (the `2·ls + 1` of the
/// format's sub-block scale).
pub(crate) struct GridBlock {
    /// Byte `j` of word `k` is the magnitude of weight `8k + j`.
    pub(crate) octets: [u64; 32],
    /// Bit `j` of byte `k` set when weight `8k + j` is negative (one plain byte store per
    /// eight weights while decoding: no read-modify-write chain).
    pub(crate) signs: [u8; 32],
    /// Multiplier of weights `16s..16s+16`.
    pub(crate) scales: [i32; 16],
}

impl GridBlock {
    /// All zero: no weight negative, every multiplier 0.
    pub(crate) fn new() -> Self {
        GridBlock {
            octets: [0; 32],
            signs: [0; 32],
            scales: [0; 16],
        }
    }

    /// Stores weights `8k..8k+8`: magnitudes `grid`, signs the bits of `signs`.
    #[inline(always)]
    pub(crate) fn put8(&mut self, k: usize, grid: &[u8; 8], signs: u8) {
        self.put_word(k, u64::from_le_bytes(*grid), signs);
    }

    /// [`GridBlock::put8`] with the magnitudes as one little-endian word.
    #[inline(always)]
    pub(crate) fn put_word(&mut self, k: usize, magnitudes: u64, signs: u8) {
        self.octets[k] = magnitudes;
        self.signs[k] = signs;
    }

    /// Stores weights `8k..8k+8` from two quads of magnitudes, signs the bits of `signs`.
    #[inline(always)]
    pub(crate) fn put4x2(&mut self, k: usize, low: &[u8; 4], high: &[u8; 4], signs: u8) {
        self.octets[k] = u32::from_le_bytes(*low) as u64 | (u32::from_le_bytes(*high) as u64) << 32;
        self.signs[k] = signs;
    }

    /// The sign bits of group of 32 `g`: bit `e % 32` set when weight `32g + e % 32` is
    /// negative.
    #[inline(always)]
    pub(crate) fn negative_word(&self, g: usize) -> u32 {
        u32::from_le_bytes([
            self.signs[4 * g],
            self.signs[4 * g + 1],
            self.signs[4 * g + 2],
            self.signs[4 * g + 3],
        ])
    }

    /// The magnitude of weight `e`.
    #[inline(always)]
    fn level(&self, e: usize) -> u8 {
        (self.octets[e / 8] >> (8 * (e % 8))) as u8
    }

    /// The eight 32-bit lanes ggml's AVX2 grid kernels form against Q8_K quants `xq`:
    /// the activation takes the weight's sign (`sign_epi8`, so −(−128) stays −128),
    /// `maddubs` multiplies it with the magnitude and adds pairs, `madd` by the
    /// 16-weight multiplier adds pairs of those, so lane `l` collects, over every group
    /// of 32, the weights at `4l..4l+4`. Every sum is exact in its width.
    #[inline(always)]
    pub(crate) fn lanes(&self, xq: &[u8]) -> [i32; 8] {
        let mut lanes = [0i32; 8];
        for g in 0..8 {
            let neg = self.negative_word(g);
            for (l, lane) in lanes.iter_mut().enumerate() {
                let first = 32 * g + 4 * l;
                let mut quad = 0i32;
                for k in first..first + 4 {
                    let x = xq[k] as i8;
                    let x = if neg >> (k % 32) & 1 != 0 {
                        x.wrapping_neg()
                    } else {
                        x
                    };
                    quad += self.level(k) as i32 * x as i32;
                }
                *lane += self.scales[first / 16] * quad;
            }
        }
        lanes
    }
}

/// The IQ2 formats with a 4-bit scale per 16 weights (IQ2_XS, IQ2_S): `octet(k)` gives
/// the magnitudes and sign byte of weights `8k..8k+8`, `scales` the format's eight scale
/// bytes (low nibble the first 16 of a group of 32, high nibble the second).
pub(crate) mod octets16 {
    use super::GridBlock;

    /// The 4-bit scale of weights `16s..16s+16`.
    #[inline(always)]
    pub(crate) fn nibble_scale(scales: &[u8], s: usize) -> u32 {
        (scales[s / 2] >> (4 * (s % 2)) & 15) as u32
    }

    /// `y = (d·(0.5 + ls)·0.25)·grid·(±1)` (ggml's `dequantize_row_iq2_xs` and `_iq2_s`).
    pub(crate) fn dequantize(
        d: f32,
        scales: &[u8],
        y: &mut [f32],
        octet: impl Fn(usize) -> (&'static [u8; 8], u8),
    ) {
        for k in 0..32 {
            let db = d * (0.5 + nibble_scale(scales, k / 2) as f32) * 0.25;
            let (mags, signs) = octet(k);
            for j in 0..8 {
                let sign = if signs >> j & 1 != 0 { -1.0 } else { 1.0 };
                y[8 * k + j] = db * mags[j] as f32 * sign;
            }
        }
    }

    /// Fills `block`: the octets, and the multipliers `2·ls + 1`.
    #[inline(always)]
    pub(crate) fn decode(
        scales: &[u8],
        block: &mut GridBlock,
        octet: impl Fn(usize) -> (&'static [u8; 8], u8),
    ) {
        for k in 0..32 {
            let (mags, signs) = octet(k);
            block.put8(k, mags, signs);
        }
        for s in 0..16 {
            block.scales[s] = 2 * nibble_scale(scales, s) as i32 + 1;
        }
    }
}

/// A grid format whose dot product is [`grid_dot`] alone (the IQ2 and IQ3 ones; the IQ1
/// formats add an offset term): block bytes, `post_scale` and decoder.
pub(crate) struct PlainGrid {
    /// Bytes of one super-block.
    pub(crate) block_bytes: usize,
    /// The factor on the final sum.
    #[cfg_attr(not(test), allow(dead_code))] // read by the tiled unpacking's scalar twin
    pub(crate) post_scale: f32,
    /// Fills a [`GridBlock`]; returns `d_w`.
    #[cfg_attr(not(test), allow(dead_code))] // as `post_scale`
    pub(crate) decode: fn(&[u8], &mut GridBlock) -> f32,
}

/// The [`PlainGrid`] of `ty`, if it is one.
pub(crate) fn plain_grid(ty: GgmlType) -> Option<PlainGrid> {
    let grid = |block_bytes, post_scale, decode| PlainGrid {
        block_bytes,
        post_scale,
        decode,
    };
    Some(match ty {
        GgmlType::IQ2_XXS => grid(iq2_xxs::BYTES, iq2_xxs::POST_SCALE, iq2_xxs::decode),
        GgmlType::IQ2_XS => grid(iq2_xs::BYTES, iq2_xs::POST_SCALE, iq2_xs::decode),
        GgmlType::IQ2_S => grid(iq2_s::BYTES, iq2_s::POST_SCALE, iq2_s::decode),
        GgmlType::IQ3_XXS => grid(iq3_xxs::BYTES, iq3_xxs::POST_SCALE, iq3_xxs::decode),
        GgmlType::IQ3_S => grid(iq3_s::BYTES, iq3_s::POST_SCALE, iq3_s::decode),
        _ => return None,
    })
}

/// Super-blocks every row holds: the weight row's, or fewer if an activation row is
/// shorter (the kernels' contract is equal lengths; this keeps them from reading past).
#[inline(always)]
pub(crate) fn common_blocks<const N: usize>(
    w: &[u8],
    block_bytes: usize,
    xs: &[&[u8]; N],
) -> usize {
    xs.iter()
        .map(|x| x.len() / Q8_K_BLOCK_BYTES)
        .fold(w.len() / block_bytes, usize::min)
}

/// A grid format's block decoder as a type: [`grid_dot`] calls it statically, so the
/// kernels inline it (a decoder passed as a function value stayed a call, and half the
/// decode time went to it).
pub(crate) trait Decoder {
    /// Fills `block` from one super-block `b`; returns `d_w`.
    fn decode(b: &[u8], block: &mut GridBlock) -> f32;
}

/// Implements [`Decoder`] for a format module's `Grid` by its `decode`.
macro_rules! grid_decoder {
    () => {
        /// This format's decoder as a type (see [`super::grids::Decoder`]).
        pub(crate) struct Grid;

        impl super::grids::Decoder for Grid {
            #[inline(always)]
            fn decode(b: &[u8], block: &mut GridBlock) -> f32 {
                decode(b, block)
            }
        }
    };
}
pub(crate) use grid_decoder;

/// The dot product of ggml's AVX2 IQ2/IQ3 kernels, the scalar twin of the SIMD tiers'
/// (`decoder` fills the block and returns its `d_w`): per super-block the
/// [`GridBlock::lanes`] times `d_w·d_x` fused into eight running lanes, `hsum_float_8` at
/// the end, times the format's constant `post_scale` (1/8 for IQ2, 1/4 for IQ3_XXS, 1
/// for IQ3_S).
#[inline(always)]
pub(crate) fn grid_dot<D: Decoder>(
    w: &[u8],
    x: &[u8],
    block_bytes: usize,
    post_scale: f32,
    _decoder: D,
) -> f32 {
    let mut acc = Lanes8::default();
    let mut block = GridBlock::new();
    for i in 0..common_blocks(w, block_bytes, &[x]) {
        let d_w = D::decode(&w[i * block_bytes..(i + 1) * block_bytes], &mut block);
        let xb = &x[i * Q8_K_BLOCK_BYTES..(i + 1) * Q8_K_BLOCK_BYTES];
        let d = d_w * f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
        acc.fma_block(d, &block.lanes(&xb[Q8_K_QS..Q8_K_QS + 256]));
    }
    post_scale * acc.sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_expand_to_ggml_entries() {
        // First and last entries of each table as ggml-common.h writes them.
        assert_eq!(u64::from_le_bytes(IQ2XXS_GRID[0]), 0x0808_0808_0808_0808);
        assert_eq!(u64::from_le_bytes(IQ2XXS_GRID[255]), 0x2b2b_2b19_0808_1908);
        assert_eq!(u64::from_le_bytes(IQ2XS_GRID[511]), 0x2b2b_2b2b_2b2b_2b2b);
        assert_eq!(u64::from_le_bytes(IQ2S_GRID[1023]), 0x2b2b_2b2b_2b2b_2b2b);
        assert_eq!(u32::from_le_bytes(IQ3XXS_GRID[0]), 0x0404_0404);
        assert_eq!(u32::from_le_bytes(IQ3XXS_GRID[255]), 0x3e34_1c04);
        assert_eq!(u32::from_le_bytes(IQ3S_GRID[511]), 0x0f0f_0101);
        assert_eq!(u64::from_le_bytes(IQ1S_GRID[0]), 0xffff_ffff_ffff_ffff);
        assert_eq!(u64::from_le_bytes(IQ1S_GRID[2047]), 0x0101_0101_0101_0101);
    }

    #[test]
    fn parity_signs_match_ggml_table_ends() {
        assert_eq!(parity_signs(0), 0x00);
        assert_eq!(parity_signs(1), 0x81);
        assert_eq!(parity_signs(3), 0x03);
        assert_eq!(parity_signs(127), 0xff);
        for i in 0..128 {
            assert_eq!(parity_signs(i).count_ones() % 2, 0, "{i}");
        }
    }
}
