//! Narrow token tiles for the K formats: 5 to 16 tokens of Q8_K activations as one or
//! two tiles of eight, for batched decode steps and draft verification on the AVX-512
//! VNNI tier, where too few tokens fill a sixteen-token tile of [`crate::tiled`].
//!
//! The single-token Q4_K kernel keeps eight integer lanes per super-block
//! (`Σ_g sc_g·quad(g, l)`, a quad being four products) and four min lanes, fused into
//! eight and four float chains. Here a 512-bit register holds two of those lanes for
//! eight tokens (element `2t + s` is lane `2i + s` of token `t` in register `i`), so one
//! `vpdpbusd` forms sixteen quads and one FMA advances sixteen chains — each chain the
//! single-token kernel's own, with the same final sums, so every output keeps its bits.
//!
//! The weight is the unsigned operand: Q4_K's levels are `0..16` as stored, so the
//! activations stay signed and no lane needs a correction. A quad is then at most
//! `4·15·128` in magnitude and fits the low word that `vpdpwssd` multiplies by the
//! sub-block's scale (the scale's high word is zero). Weight rows are read straight from
//! the mapped file and decoded in registers, one `vpermd` placing each register's pair
//! of lanes, as the block-32 narrow tiles of [`crate::narrow`] do: with few tokens a
//! pass is bound by its weight stream, and the wide tiles' unpacked copy of the rows
//! costs more than it saves. Both tiles of sixteen tokens share one pass over the rows.

use std::arch::x86_64::*;

use nx_gguf::GgmlType;
use nx_syscalls::AlignedBytes;

use crate::formats::{q4_k, q8_k, read_i16, scales_mins_k4_packed, Q4_K_BYTES};

/// Tokens per tile: two lanes of each in a 512-bit register.
const WIDTH: usize = 8;

/// Bytes of one super-block of a tile: the quads of every sub-block and lane-pair
/// register (8 × 4 × 64, signed), the token scales `d_x` (one per element), then the
/// two registers of min-lane sum pairs `(S[2m], S[2m+1])` (`S` a 32-quant sum, words).
const SB_BYTES: usize = MINS + 2 * 64;
const DX: usize = 8 * 4 * 64;
const MINS: usize = DX + 64;

/// The quantized Q8_K activations of 2 to 16 tokens, laid out for [`run`] as one or two
/// tiles of [`WIDTH`] tokens (the last padded with zero blocks, whose outputs are never
/// written), super-block after super-block, each tile's super-block apart.
#[derive(Debug, Clone, Default)]
pub(crate) struct NarrowKTiles {
    data: AlignedBytes,
    n_tiles: usize,
    /// Real tokens in all.
    n_tokens: usize,
    /// First token held, counted in the activation rows.
    first: usize,
}

impl NarrowKTiles {
    /// Real tokens held (0 when empty).
    pub(crate) fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// First token held.
    pub(crate) fn first(&self) -> usize {
        self.first
    }

    /// Forgets the contents (keeps the buffer).
    pub(crate) fn clear(&mut self) {
        self.n_tiles = 0;
        self.n_tokens = 0;
        self.first = 0;
    }

    /// Lays out Q8_K activation rows `first..n` of `rows` (`row_bytes` each): at least
    /// [`MIN_TOKENS`] and at most sixteen of them, else it leaves nothing.
    pub(crate) fn build(&mut self, rows: &[u8], first: usize, n: usize, row_bytes: usize) {
        self.clear();
        let count = n.saturating_sub(first);
        if !(MIN_TOKENS..=2 * WIDTH).contains(&count)
            || row_bytes == 0
            || !row_bytes.is_multiple_of(q8_k::BYTES)
            || rows.len() < n * row_bytes
        {
            return;
        }
        let n_blocks = row_bytes / q8_k::BYTES;
        let n_tiles = count.div_ceil(WIDTH);
        self.data.clear();
        self.data.resize(n_blocks * n_tiles * SB_BYTES);
        for (b, sb) in self.data.chunks_exact_mut(n_tiles * SB_BYTES).enumerate() {
            for (k, tile) in sb.chunks_exact_mut(SB_BYTES).enumerate() {
                let tokens = (first + k * WIDTH)..(first + count).min(first + (k + 1) * WIDTH);
                for (t, token) in tokens.enumerate() {
                    let at = token * row_bytes + b * q8_k::BYTES;
                    lay_out_token(&rows[at..at + q8_k::BYTES], tile, t);
                }
            }
        }
        self.n_tiles = n_tiles;
        self.n_tokens = count;
        self.first = first;
    }
}

/// Token `t`'s Q8_K super-block `xb` into its elements of a tile super-block (`out`,
/// zeroed beforehand).
fn lay_out_token(xb: &[u8], out: &mut [u8], t: usize) {
    let qs = &xb[q8_k::QS..q8_k::QS + 256];
    for s in 0..2 {
        let e = 2 * t + s;
        for g in 0..8 {
            for i in 0..4 {
                let lane = 2 * i + s;
                let at = (4 * g + i) * 64 + 4 * e;
                out[at..at + 4].copy_from_slice(&qs[32 * g + 4 * lane..32 * g + 4 * lane + 4]);
            }
        }
        out[DX + 4 * e..DX + 4 * e + 4].copy_from_slice(&xb[0..4]);
        // Min lane m = 2j + s multiplies the 32-quant sums S[2m], S[2m+1] (|S| ≤ 4096).
        let bsum = |k: usize| read_i16(xb, q8_k::BSUMS + 2 * k);
        for j in 0..2 {
            let m = 2 * j + s;
            let lo = bsum(4 * m) + bsum(4 * m + 1);
            let hi = bsum(4 * m + 2) + bsum(4 * m + 3);
            let at = MINS + 64 * j + 4 * e;
            out[at..at + 2].copy_from_slice(&lo.to_le_bytes());
            out[at + 2..at + 4].copy_from_slice(&hi.to_le_bytes());
        }
    }
}

/// Added to every quad (`|quad| ≤ 4·15·128 = 7680`) so that two of them share a dword
/// as non-negative words for one `vpdpwssd` with both sub-blocks' scales.
const QUAD_BIAS: i32 = 7680;

/// Fewest tokens laid out: two to four go through the four-token kernel in one pass
/// over the weights, which costs less than a tile of eight (`benches/batched`, Q4_K
/// 2048×640, AMD EPYC family 25 model 17: 2 and 4 tokens 61 and 71 µs there, 72 to 88
/// here; eight tokens 119 µs as two four-token passes, 78 to 94 here).
const MIN_TOKENS: usize = 5;

/// True when this CPU can run the narrow K kernels: the tiled kernels' AVX-512 VNNI and
/// VBMI2's double shift, which joins two quads into one dword.
pub(crate) fn available() -> bool {
    crate::tiled::available() && std::arch::is_x86_feature_detected!("avx512vbmi2")
}

/// Weight types the narrow K kernels take (with Q8_K activations).
pub(crate) fn has_kernel(weight_type: GgmlType) -> bool {
    weight_type == GgmlType::Q4_K
}

/// For the tokens of `tiles` and every row of `w_rows` (`row_bytes` each, of
/// `weight_type`), computes the dot products — the single-token kernel's bits — and
/// writes row `r`'s output for token `t` (`t` counted from `tiles.first()`, rows from
/// the start of `w_rows`) to `out_ptr[t·out_stride + r]`.
///
/// # Safety
/// [`crate::tiled::available`] must be true, [`has_kernel`] true for `weight_type`,
/// and `tiles` built from Q8_K activations of the weight's row length; `out_ptr` must
/// be valid for writes at every such index (`t < tiles.n_tokens()`), with no other
/// thread accessing them during the call.
pub(crate) unsafe fn run(
    weight_type: GgmlType,
    w_rows: &[u8],
    row_bytes: usize,
    tiles: &NarrowKTiles,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    if tiles.n_tokens == 0 || row_bytes == 0 || !has_kernel(weight_type) {
        return;
    }
    let n_blocks = tiles.data.len() / (tiles.n_tiles * SB_BYTES);
    let rows = w_rows.chunks_exact(row_bytes);
    let out = (out_ptr, out_stride, tiles.n_tokens);
    // SAFETY: the caller guarantees the CPU features and the output range; every row
    // holds the tiles' super-blocks (the activations fit the weight).
    unsafe {
        match tiles.n_tiles {
            1 => q4_k_rows::<1>(rows, &tiles.data, n_blocks, out),
            _ => q4_k_rows::<2>(rows, &tiles.data, n_blocks, out),
        }
    }
}

/// Q4_K rows against `NT` tiles of `x` (`n_blocks` super-blocks each, tiles side by
/// side): token `t` (over all tiles) of row `r` to `out.0[t·out.1 + r]` for
/// `t < out.2`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; every row holds `n_blocks` Q4_K super-blocks; the
/// writes are valid.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi2,fma,f16c")]
unsafe fn q4_k_rows<const NT: usize>(
    rows: std::slice::ChunksExact<'_, u8>,
    x: &[u8],
    n_blocks: usize,
    (out, out_stride, n_tokens): (*mut f32, usize, usize),
) {
    assert!(x.len() >= n_blocks * NT * SB_BYTES && n_tokens <= NT * WIDTH);
    for (r, row) in rows.enumerate() {
        assert!(row.len() >= n_blocks * Q4_K_BYTES);
        let mut acc = [[_mm512_setzero_ps(); 4]; NT];
        let mut acc_min = [[_mm512_setzero_ps(); 2]; NT];
        for b in 0..n_blocks {
            crate::avx2::prefetch_block(row, b * Q4_K_BYTES, Q4_K_BYTES, 1);
            let wb = &row[b * Q4_K_BYTES..(b + 1) * Q4_K_BYTES];
            let xs = &x[b * NT * SB_BYTES..(b + 1) * NT * SB_BYTES];
            // SAFETY: `wb` a whole super-block, `xs` the tiles' super-blocks; features
            // per this function's contract.
            unsafe { q4_k_super_block::<NT>(wb, xs, &mut acc, &mut acc_min) };
        }
        for k in 0..NT {
            // SAFETY: the features per this function's contract.
            let y = unsafe { token_sums(&acc[k], &acc_min[k]) };
            let mut ys = [0f32; 16];
            // SAFETY: sixteen f32.
            unsafe { _mm512_storeu_ps(ys.as_mut_ptr(), y) };
            for t in 0..n_tokens.saturating_sub(k * WIDTH).min(WIDTH) {
                // SAFETY: the caller's contract on `out`.
                unsafe { *out.add((k * WIDTH + t) * out_stride + r) = ys[2 * t] };
            }
        }
    }
}

/// One Q4_K super-block `wb` against the same super-block of `NT` tiles (`xs`): its
/// integer lanes by sub-block scale, fused into `acc` with `d_w·d_x`, and its min lanes
/// into `acc_min` with `−d_x·dmin_w`, as the single-token kernel does.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI and F16C; `wb` is a whole super-block and `xs` holds
/// `NT` tile super-blocks.
#[inline(always)]
unsafe fn q4_k_super_block<const NT: usize>(
    wb: &[u8],
    xs: &[u8],
    acc: &mut [[__m512; 4]; NT],
    acc_min: &mut [[__m512; 2]; NT],
) {
    assert!(wb.len() >= Q4_K_BYTES && xs.len() >= NT * SB_BYTES);
    let zero = _mm512_setzero_si512();
    let low4 = _mm512_set1_epi8(0x0F);
    let dw = crate::avx2::f16_bits_to_f32(u16::from_le_bytes([wb[0], wb[1]]));
    let dmin =
        crate::avx2::f16_bits_to_f32(u16::from_le_bytes([wb[q4_k::DMIN], wb[q4_k::DMIN + 1]]));
    let (sc, mn) = scales_mins_k4_packed(&wb[q4_k::SCALES..q4_k::SCALES + 12]);
    // Each quad biased by QUAD_BIAS into 0..2¹⁵, the bias times every scale taken off
    // at the start.
    let sc_sum = {
        let pairs = (sc & 0x00FF_00FF_00FF_00FF) + ((sc >> 8) & 0x00FF_00FF_00FF_00FF);
        (pairs.wrapping_mul(0x0001_0001_0001_0001) >> 48) as i32
    };
    let mut ints = [[_mm512_set1_epi32(-QUAD_BIAS * sc_sum); 4]; NT];
    let bias = _mm512_set1_epi32(QUAD_BIAS);
    let bias_high = _mm512_set1_epi32(QUAD_BIAS << 16);
    for c in 0..4 {
        // Sub-blocks 2c and 2c + 1: the low and high nibbles of the chunk's 32 bytes,
        // scaled by the word pair (sc[2c], sc[2c+1]).
        let scale = _mm512_set1_epi32(
            (sc >> (16 * c)) as i32 & 0xFF | ((sc >> (16 * c + 8)) as i32 & 0xFF) << 16,
        );
        for i in 0..4 {
            // Lanes 2i, 2i + 1 of both sub-blocks: one qword of the chunk, broadcast.
            // SAFETY: bytes 16 + 32c + 8i .. + 8 of 144.
            let wq = _mm512_set1_epi64(unsafe {
                std::ptr::read_unaligned(wb.as_ptr().add(q4_k::QS + 32 * c + 8 * i).cast::<i64>())
            });
            let w_lo = _mm512_and_si512(wq, low4);
            let w_hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wq), low4);
            for k in 0..NT {
                let reg = |g: usize| {
                    // SAFETY: inside tile `k`'s super-block.
                    unsafe {
                        _mm512_loadu_si512(xs.as_ptr().add(k * SB_BYTES + (4 * g + i) * 64).cast())
                    }
                };
                // (quad_hi + bias)·2¹⁶ + (quad_lo + bias): two non-negative words.
                let hi = _mm512_dpbusd_epi32(bias, w_hi, reg(2 * c + 1));
                let both =
                    _mm512_dpbusd_epi32(_mm512_shldi_epi32::<16>(hi, bias_high), w_lo, reg(2 * c));
                ints[k][i] = _mm512_dpwssd_epi32(ints[k][i], both, scale);
            }
        }
    }
    // Min lanes 2j, 2j+1: the word pairs (mn[2m], mn[2m+1]) for m = 2j and 2j + 1.
    let mn_pair = |m: usize| (mn >> (16 * m)) & 0xFF | ((mn >> (16 * m + 8)) & 0xFF) << 16;
    let mins = [
        _mm512_set1_epi64((mn_pair(0) | mn_pair(1) << 32) as i64),
        _mm512_set1_epi64((mn_pair(2) | mn_pair(3) << 32) as i64),
    ];
    for k in 0..NT {
        let tile = &xs[k * SB_BYTES..(k + 1) * SB_BYTES];
        // SAFETY: inside the tile's super-block.
        let dx = unsafe { _mm512_loadu_ps(tile.as_ptr().add(DX).cast()) };
        let d = _mm512_mul_ps(_mm512_set1_ps(dw), dx);
        for i in 0..4 {
            acc[k][i] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(ints[k][i]), acc[k][i]);
        }
        let neg_dmin = _mm512_mul_ps(dx, _mm512_set1_ps(-dmin));
        for j in 0..2 {
            // SAFETY: inside the tile's super-block.
            let sums = unsafe { _mm512_loadu_si512(tile.as_ptr().add(MINS + 64 * j).cast()) };
            let lane = _mm512_dpwssd_epi32(zero, sums, mins[j]);
            acc_min[k][j] = _mm512_fmadd_ps(neg_dmin, _mm512_cvtepi32_ps(lane), acc_min[k][j]);
        }
    }
}

/// A tile's chains summed as the single-token kernel sums them: the eight lanes
/// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))` plus the four min lanes `(m0+m2)+(m1+m3)`;
/// token `t`'s output in element `2t`.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn token_sums(acc: &[__m512; 4], acc_min: &[__m512; 2]) -> __m512 {
    // Swap neighbouring elements: lane 2i + 1 of a token onto lane 2i.
    const SWAP_1: i32 = 0b10_11_00_01;
    let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
    let lanes = _mm512_add_ps(s, _mm512_permute_ps::<SWAP_1>(s));
    let m = _mm512_add_ps(acc_min[0], acc_min[1]);
    let mins = _mm512_add_ps(m, _mm512_permute_ps::<SWAP_1>(m));
    _mm512_add_ps(lanes, mins)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::read_f32;

    #[test]
    fn build_places_lanes_scales_and_min_sums_and_pads_with_zero() {
        // Five tokens of one super-block: quant k of token t is (t + k) as i8, d_x = t + 1,
        // bsum j = 10·t + j.
        let mut rows = vec![0u8; 5 * q8_k::BYTES];
        for t in 0..5 {
            let xb = &mut rows[t * q8_k::BYTES..(t + 1) * q8_k::BYTES];
            xb[..4].copy_from_slice(&(t as f32 + 1.0).to_le_bytes());
            for k in 0..256 {
                xb[q8_k::QS + k] = (t + k) as u8;
            }
            for j in 0..16 {
                let at = q8_k::BSUMS + 2 * j;
                xb[at..at + 2].copy_from_slice(&((10 * t + j) as i16).to_le_bytes());
            }
        }
        let mut tiles = NarrowKTiles::default();
        tiles.build(&rows, 0, 5, q8_k::BYTES);
        assert_eq!((tiles.n_tiles, tiles.n_tokens, tiles.first), (1, 5, 0));
        let d = &tiles.data;
        let dword = |at: usize| &d[at..at + 4];
        // Sub-block 5, lane 3 (register 1, element 2·2 + 1) of token 2: quants
        // 32·5 + 12 .. + 16, plus 2.
        let at = (4 * 5 + 1) * 64 + 4 * (2 * 2 + 1);
        assert_eq!(dword(at), &[174, 175, 176, 177]);
        // Token 5 is padding.
        assert_eq!(dword((4 * 5 + 1) * 64 + 4 * 10), &[0, 0, 0, 0]);
        assert_eq!(read_f32(d, DX + 4 * (2 * 2 + 1)), 3.0);
        assert_eq!(read_f32(d, DX + 4 * 10), 0.0);
        // Min lane 3 (register 1, element 2·1 + 1) of token 1: S[6] = b12 + b13,
        // S[7] = b14 + b15.
        let at = MINS + 64 + 4 * 3;
        assert_eq!(
            (read_i16(d, at), read_i16(d, at + 2)),
            (10 + 12 + 10 + 13, 10 + 14 + 10 + 15)
        );
        // Four tokens (the four-token kernel's): nothing.
        tiles.build(&rows, 1, 5, q8_k::BYTES);
        assert_eq!(tiles.n_tokens(), 0);
    }
}
