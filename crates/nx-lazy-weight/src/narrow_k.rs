//! Narrow token tiles for the K formats: 2 to 16 tokens of Q8_K activations as one
//! tile of 2, 4 or 8 (padded to a power of two) or two of eight, for batched decode
//! steps and draft verification on the AVX-512 VNNI tier, where too few tokens fill a
//! sixteen-token tile of [`crate::tiled`].
//!
//! The single-token Q4_K, Q5_K and Q6_K kernels keep eight integer lanes per super-block
//! (`Σ_g sc·quad(g, l)`, a quad being four products; Q4_K and Q5_K also four min lanes), fused
//! into float chains. Here a 512-bit register holds `L = 16 / T` of those lanes for each
//! of `T` tokens (element `t·L + s` is lane `L·i + s` of token `t` in register `i`), so
//! one `vpdpbusd` forms sixteen quads and one FMA advances sixteen chains — each chain
//! the single-token kernel's own, with the same final sums ([`crate::narrow`]'s
//! `lanes_sum`), so every output keeps its bits.
//!
//! The weight is the unsigned operand: the levels are `0..16` (Q4_K) or `0..64` (Q6_K)
//! as stored, so the activations stay signed and need no correction. A register's `L`
//! lanes are `4L` consecutive levels of a sub-block: for Q4_K and Q5_K, `4L` bytes of the
//! mapped row broadcast and decoded in place (nibble masks, fifth bits by byte masks);
//! Q6_K's levels are decoded 64 at a time as its four-token kernel does (nibbles, high
//! bits by shifts and one ternary-logic merge) and each register's placed by one
//! `vpermq`. With few tokens a pass is bound by its weight stream, and the wide tiles'
//! unpacked copy of the rows costs more than it saves. Two tiles of eight
//! share one pass over the rows, where the four-token kernel streams them once per four
//! tokens.
//!
//! Q2_K's levels are scaled by their sub-block's scale before they meet the activations
//! (`s·q ≤ 45`, a byte: [`crate::avx512::q2_k_scaled_levels`]), so its quads need no
//! scale step; its min lanes come from the bsum pairs Q6_K reads too. Q3_K's are too,
//! offset to an unsigned byte (`s·q + 127`, 3..=255:
//! [`crate::avx512::q3_k_scaled_levels`]); each register's lanes start from the
//! activations' `−127·Σx`, formed once per step on the first Q3_K call
//! ([`NarrowKTiles::q3_k_offsets`]).
//!
//! Sub-block scales multiply quads by `vpdpwssd`, so a quad must be a word: Q6_K's are
//! (at most `4·63·128` in magnitude), and two sub-blocks' share a dword (a shift and a
//! word blend) for one `vpdpwssd` with both scales. Q4_K's are small enough
//! (`4·15·128`) that two, biased to non-negative, share a dword and one `vpdpwssd`
//! multiplies both by the sub-block pair's scales.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use nx_gguf::GgmlType;
use nx_syscalls::AlignedBytes;

use crate::act_tiles::put_pair;
use crate::formats::{
    q2_k, q3_k, q4_k, q5_k, q6_k, q8_k, read_i16, scales_mins_k4_packed, Q4_K_BYTES,
};
use crate::narrow::{lanes_sum, HeldTokens};
use crate::tiled::join_quads;

/// Widest tile: two lanes of each token in a register.
const MAX_WIDTH: usize = 8;

/// The layout of one super-block of a tile of `t` tokens: the quads of every sub-block
/// and register (`8 × t/2` registers of 64 bytes, signed), the token scales `d_x` (one
/// per element), Q4_K's min-lane sum pairs `(S[2m], S[2m+1])` (`S` a 32-quant sum,
/// words; [`min_regs`] registers), then Q6_K's bsum pairs `(b[2l], b[2l+1])` per lane
/// (`t/2` registers).
const fn dx_at(t: usize) -> usize {
    8 * (t / 2) * 64
}
const fn mins_at(t: usize) -> usize {
    dx_at(t) + 64
}
const fn bsums_at(t: usize) -> usize {
    mins_at(t) + 64 * min_regs(t)
}
const fn sb_bytes(t: usize) -> usize {
    bsums_at(t) + 64 * (t / 2)
}
/// Registers of Q4_K's four min lanes: two lanes a register at eight tokens, else one
/// (at two tokens, lanes 4..8 of each token's eight elements stay zero).
const fn min_regs(t: usize) -> usize {
    if t == 8 {
        2
    } else {
        1
    }
}

/// The quantized Q8_K activations of 2 to 16 tokens, laid out for [`run`] as one tile
/// of `width` tokens or two of eight (the last padded with zero blocks, whose outputs
/// are never written), super-block after super-block, each tile's super-block apart.
#[derive(Debug, Clone, Default)]
pub(crate) struct NarrowKTiles {
    data: AlignedBytes,
    width: usize,
    n_tiles: usize,
    /// The real tokens.
    pub(crate) held: HeldTokens,
    /// Q3_K's lane offsets `−127·Σx` ([`NarrowKTiles::q3_k_offsets`]), formed on first
    /// need.
    q3_k_offsets: OnceLock<AlignedBytes>,
}

impl NarrowKTiles {
    /// Forgets the contents (keeps the buffer).
    pub(crate) fn clear(&mut self) {
        self.n_tiles = 0;
        self.held = HeldTokens::default();
        self.q3_k_offsets = OnceLock::new();
    }

    /// Per super-block, tile and register `i`: `−127·Σx` of each element's lane (four
    /// quants) summed over the eight groups, formed on the first call for these tokens
    /// (threads asking meanwhile wait for it). Q3_K's rows start each register's lane sums
    /// from it: their scaled levels `s·q + 127` are the unsigned operand
    /// ([`crate::avx512::q3_k_scaled_levels`]). The other formats never ask, so their
    /// layouts cost nothing more.
    fn q3_k_offsets(&self) -> &[u8] {
        self.q3_k_offsets.get_or_init(|| {
            let n = self.data.len() / sb_bytes(self.width);
            let mut out = AlignedBytes::default();
            out.resize(n * offsets_bytes(self.width));
            // SAFETY: only `run` asks, whose caller checked `available`.
            unsafe { q3_k_lane_offsets(&self.data, self.width, &mut out) };
            out
        })
    }

    /// Lays out Q8_K activation rows `first..n` of `rows` (`row_bytes` each): at least
    /// two and at most sixteen of them, else it leaves nothing.
    pub(crate) fn build(&mut self, rows: &[u8], first: usize, n: usize, row_bytes: usize) {
        self.clear();
        let Some(held) = HeldTokens::span(first, n, (row_bytes, q8_k::BYTES, rows.len())) else {
            return;
        };
        let count = held.n_tokens;
        let n_blocks = row_bytes / q8_k::BYTES;
        let n_tiles = count.div_ceil(MAX_WIDTH);
        let width = if n_tiles > 1 {
            MAX_WIDTH
        } else {
            count.next_power_of_two()
        };
        let tile_bytes = sb_bytes(width);
        self.data.clear();
        // Full tiles of eight tokens have every byte written by `lay_out_token`; padding
        // tokens and narrower tiles' unused min lanes need the zeroing.
        match count == n_tiles * width && width == MAX_WIDTH {
            true => self.data.resize_reusing(n_blocks * n_tiles * tile_bytes),
            false => self.data.resize(n_blocks * n_tiles * tile_bytes),
        }
        for (b, sb) in self.data.chunks_exact_mut(n_tiles * tile_bytes).enumerate() {
            for (k, tile) in sb.chunks_exact_mut(tile_bytes).enumerate() {
                let tokens = (first + k * width)..(first + count).min(first + (k + 1) * width);
                if tokens.len() == MAX_WIDTH && crate::tiled::available() {
                    let at = tokens.start * row_bytes + b * q8_k::BYTES;
                    // SAFETY: the CPU has AVX-512 F/BW (`available`).
                    unsafe { lay_out_8(&rows[at..], row_bytes, tile) };
                    continue;
                }
                for (t, token) in tokens.enumerate() {
                    let at = token * row_bytes + b * q8_k::BYTES;
                    lay_out_token(&rows[at..at + q8_k::BYTES], tile, t, width);
                }
            }
        }
        self.width = width;
        self.n_tiles = n_tiles;
        self.held = held;
    }
}

/// Token `t`'s Q8_K super-block `xb` into its elements of a super-block of a tile of
/// `width` tokens (`out`; zeroed beforehand unless the tile is eight tokens, all present,
/// whose every byte this writes).
fn lay_out_token(xb: &[u8], out: &mut [u8], t: usize, width: usize) {
    let qs = &xb[q8_k::QS..q8_k::QS + 256];
    let per_reg = 16 / width;
    let bsum = |k: usize| read_i16(xb, q8_k::BSUMS + 2 * k);
    for s in 0..per_reg {
        let e = t * per_reg + s;
        for g in 0..8 {
            for i in 0..width / 2 {
                let lane = per_reg * i + s;
                let at = ((width / 2) * g + i) * 64 + 4 * e;
                out[at..at + 4].copy_from_slice(&qs[32 * g + 4 * lane..32 * g + 4 * lane + 4]);
            }
        }
        out[dx_at(width) + 4 * e..dx_at(width) + 4 * e + 4].copy_from_slice(&xb[0..4]);
        // Min lane m multiplies the 32-quant sums S[2m], S[2m+1] (|S| ≤ 4096).
        for j in 0..min_regs(width) {
            let m = per_reg * j + s;
            if m < 4 {
                let lo = bsum(4 * m) + bsum(4 * m + 1);
                let hi = bsum(4 * m + 2) + bsum(4 * m + 3);
                put_pair(out, mins_at(width) + 64 * j + 4 * e, lo, hi);
            }
        }
        for i in 0..width / 2 {
            let l = per_reg * i + s;
            let at = bsums_at(width) + 64 * i + 4 * e;
            put_pair(out, at, bsum(2 * l), bsum(2 * l + 1));
        }
    }
}

/// [`lay_out_token`] of eight tokens at once into a whole tile of eight, in registers:
/// each group of 32 quants and the sixteen bsums are an 8 × 4 transpose of 8-byte pairs
/// ([`crate::transpose::eight_pairs`]), the min-lane pairs two word sums and a word
/// permutation of the bsum registers. Same bytes as eight [`lay_out_token`] calls
/// (`the_eight_token_layout_is_the_scalar_ones`).
///
/// # Safety
/// The CPU has AVX-512 F/BW.
///
/// # Panics
/// Unless `rows` holds the eight tokens' super-blocks, `row_bytes` apart from its start,
/// and `out` a super-block of a tile of eight.
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn lay_out_8(rows: &[u8], row_bytes: usize, out: &mut [u8]) {
    const W: usize = MAX_WIDTH;
    assert!(rows.len() >= (W - 1) * row_bytes + q8_k::BYTES && out.len() >= sb_bytes(W));
    // SAFETY: every load lies in one of the eight super-blocks and every store in `out`
    // (asserted above); the features per the caller's contract.
    unsafe {
        let (p, o) = (rows.as_ptr(), out.as_mut_ptr());
        let store = |at: usize, v: __m512i| _mm512_storeu_si512(o.add(at) as *mut _, v);
        for g in 0..8 {
            let regs = crate::transpose::eight_pairs(p.add(q8_k::QS + 32 * g), row_bytes);
            for (i, &r) in regs.iter().enumerate() {
                store(((W / 2) * g + i) * 64, r);
            }
        }
        let d = |t: usize| (p.add(t * row_bytes) as *const f32).read_unaligned();
        let dx = _mm512_setr_ps(
            d(0),
            d(1),
            d(2),
            d(3),
            d(4),
            d(5),
            d(6),
            d(7),
            0.,
            0.,
            0.,
            0.,
            0.,
            0.,
            0.,
            0.,
        );
        _mm512_storeu_ps(
            o.add(dx_at(W)) as *mut f32,
            crate::transpose::each_twice(dx),
        );
        let bsums = crate::transpose::eight_pairs(p.add(q8_k::BSUMS), row_bytes);
        for (i, &r) in bsums.iter().enumerate() {
            store(bsums_at(W) + 64 * i, r);
        }
        // Bsum register `i`, summed by word pairs, holds the 32-quant sums `S[2i + s]` in
        // element `2t + s`; min register `j` wants `(S[4j + 2s], S[4j + 2s + 1])` there:
        // the low words of bsum register `2j + s`'s elements `2t` and `2t + 1`.
        let ones = _mm512_set1_epi16(1);
        let idx: [i16; 32] = std::array::from_fn(|w| {
            let (t, k) = (w / 4, w % 4);
            (4 * t + 2 * (k % 2) + 32 * (k / 2)) as i16
        });
        let idx = _mm512_loadu_si512(idx.as_ptr() as *const _);
        for j in 0..min_regs(W) {
            let (a, b) = (
                _mm512_madd_epi16(bsums[2 * j], ones),
                _mm512_madd_epi16(bsums[2 * j + 1], ones),
            );
            store(mins_at(W) + 64 * j, _mm512_permutex2var_epi16(a, idx, b));
        }
    }
}

/// Added to every Q4_K quad (`|quad| ≤ 4·15·128 = 7680`) so that two of them share a
/// dword as non-negative words for one `vpdpwssd` with both sub-blocks' scales.
const QUAD_BIAS: i32 = 7680;
/// The same for Q5_K (`|quad| ≤ 4·31·128 = 15872`; biased, at most `15748 + 15872 < 2¹⁵`).
const QUAD_BIAS_Q5: i32 = 15872;

/// True when this CPU can run the narrow K kernels: the tiled kernels' AVX-512 VNNI
/// features.
pub(crate) fn available() -> bool {
    crate::tiled::available()
}

/// Whether the narrow K kernels take `n_tokens` tokens of Q8_K activations against
/// weights of `weight_type`: Q4_K, Q5_K, Q2_K and Q3_K always (Q2_K: `nx bench --parallel
/// 2,4,8` on the Qwen2.5-1.5B Q2_K file, AMD EPYC family 25 model 17, two alternating
/// runs: 37.5–37.8 / 56.1–58.2 / 61.1–64.9 t/s on the AVX-512 four-token kernel, 42.6–43.1
/// / 62.4–65.0 / 70.6–72.7 here; Q3_K: `benches/batched` 2048×640, three alternating
/// runs, 2 / 4 / 8 / 16 tokens 53–54 / 73–82 / 143–160 / 274–359 µs on the four-token
/// kernel, 47–55 / 63–80 / 95–125 / 171–207 here); Q6_K from five on, where the four-token kernel
/// would stream the rows twice. Below that the four-token kernel costs less than a tile
/// (`benches/batched`, 2048×640 in cache, two threads, AMD EPYC family 25 model 17, three
/// alternating runs each: Q6_K 4 tokens 51–65 µs against 76–108 narrow, 2 tokens 47–55
/// against 50–51; Q4_K 2 tokens 53–61 against 36–42, 4 tokens 55–70 against 50–59,
/// 8 tokens 102–121 against 80–87).
pub(crate) fn has_kernel(weight_type: GgmlType, n_tokens: usize) -> bool {
    match weight_type {
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q2_K | GgmlType::Q3_K => true,
        GgmlType::Q6_K => n_tokens > 4,
        _ => false,
    }
}

/// For the tokens of `tiles` and every row of `w_rows` (`row_bytes` each, of
/// `weight_type`), computes the dot products — the single-token kernel's bits — and
/// writes row `r`'s output for token `t` (`t` counted from `tiles.first()`, rows from
/// the start of `w_rows`) to `out_ptr[t·out_stride + r]`.
///
/// # Safety
/// [`available`] must be true, [`has_kernel`] true for `weight_type` and the tokens, and `tiles` built
/// from Q8_K activations of the weight's row length; `out_ptr` must be valid for writes
/// at every such index (`t < tiles.n_tokens()`), with no other thread accessing them
/// during the call.
pub(crate) unsafe fn run(
    weight_type: GgmlType,
    w_rows: &[u8],
    row_bytes: usize,
    tiles: &NarrowKTiles,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    if tiles.held.n_tokens == 0 || row_bytes == 0 {
        return;
    }
    let n_blocks = tiles.data.len() / (tiles.n_tiles * sb_bytes(tiles.width));
    let args = (
        w_rows.chunks_exact(row_bytes),
        &tiles.data[..],
        n_blocks,
        (out_ptr, out_stride, tiles.held.n_tokens),
    );
    macro_rules! widths {
        ($rows:ident $(, $five:expr)?) => {
            // SAFETY: the caller guarantees the CPU features and the output range;
            // every row holds the tiles' super-blocks (the activations fit the weight).
            unsafe {
                match (tiles.width, tiles.n_tiles) {
                    (2, _) => $rows::<2, 1 $(, $five)?>(args),
                    (4, _) => $rows::<4, 1 $(, $five)?>(args),
                    (_, 1) => $rows::<8, 1 $(, $five)?>(args),
                    _ => $rows::<8, 2 $(, $five)?>(args),
                }
            }
        };
    }
    match weight_type {
        GgmlType::Q4_K => widths!(q4_k_rows, false),
        GgmlType::Q5_K => widths!(q4_k_rows, true),
        GgmlType::Q6_K => widths!(q6_k_rows),
        GgmlType::Q2_K => widths!(q2_k_rows),
        GgmlType::Q3_K => {
            let offsets = tiles.q3_k_offsets();
            // SAFETY: as for the other formats; `offsets` are the tiles' lane offsets.
            unsafe {
                match (tiles.width, tiles.n_tiles) {
                    (2, _) => q3_k_rows::<2, 1>(args, offsets),
                    (4, _) => q3_k_rows::<4, 1>(args, offsets),
                    (_, 1) => q3_k_rows::<8, 1>(args, offsets),
                    _ => q3_k_rows::<8, 2>(args, offsets),
                }
            }
        }
        _ => {}
    }
}

/// Bytes of Q3_K's lane offsets per tile super-block: a register per register `i`.
const fn offsets_bytes(t: usize) -> usize {
    (t / 2) * 64
}

/// [`NarrowKTiles::q3_k_offsets`] of `data` (tile super-blocks of a tile of `width`
/// tokens) into `out`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q3_k_lane_offsets(data: &[u8], width: usize, out: &mut [u8]) {
    let (sb, regs) = (sb_bytes(width), width / 2);
    let n = data.len() / sb;
    assert!(out.len() >= n * offsets_bytes(width) && regs >= 1);
    let (zero, weight) = (_mm512_setzero_si512(), _mm512_set1_epi8(127));
    for s in 0..n {
        for i in 0..regs {
            let mut sum = zero;
            for g in 0..8 {
                // SAFETY: register i of group g of super-block s lies inside `data`.
                let q = unsafe {
                    _mm512_loadu_si512(data.as_ptr().add(s * sb + (regs * g + i) * 64).cast())
                };
                sum = _mm512_dpbusd_epi32(sum, weight, q);
            }
            // SAFETY: inside `out` (asserted above).
            unsafe {
                _mm512_storeu_si512(
                    out.as_mut_ptr().add((s * regs + i) * 64).cast(),
                    _mm512_sub_epi32(zero, sum),
                )
            };
        }
    }
}

/// A run's arguments: the weight rows, the tiles, their super-blocks, and where token
/// `t` (over all tiles) of row `r` goes: `out.0[t·out.1 + r]` for `t < out.2`.
type RowsArgs<'a> = (
    std::slice::ChunksExact<'a, u8>,
    &'a [u8],
    usize,
    (*mut f32, usize, usize),
);

/// Q4_K (or, with `Q5`, Q5_K) rows against `NT` tiles of `T` tokens (see
/// [`RowsArgs`]).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; every row holds the tiles' super-blocks of
/// Q4_K (Q5_K); the writes are valid.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn q4_k_rows<const T: usize, const NT: usize, const Q5: bool>(
    (rows, x, n_blocks, out): RowsArgs<'_>,
) {
    let sb = sb_bytes(T);
    let block = if Q5 { q5_k::BYTES } else { Q4_K_BYTES };
    assert!(x.len() >= n_blocks * NT * sb && out.2 <= NT * T);
    for (r, row) in rows.enumerate() {
        assert!(row.len() >= n_blocks * block);
        let mut acc = [[_mm512_setzero_ps(); 4]; NT];
        let mut acc_min = [[_mm512_setzero_ps(); 2]; NT];
        for b in 0..n_blocks {
            crate::avx2::prefetch_block(row, b * block, block, 1);
            let wb = &row[b * block..(b + 1) * block];
            let xs = &x[b * NT * sb..(b + 1) * NT * sb];
            // SAFETY: `wb` a whole super-block, `xs` the tiles' super-blocks; features
            // per this function's contract.
            unsafe { q4_k_super_block::<T, NT, Q5>(wb, xs, &mut acc, &mut acc_min) };
        }
        for k in 0..NT {
            // Q5_K's min term is one chain per token (element t·16/T), added last.
            // SAFETY: the features per this function's contract.
            let y = unsafe {
                let mins = if Q5 {
                    acc_min[k][0]
                } else {
                    mins_sum::<T>(&acc_min[k])
                };
                _mm512_add_ps(lanes_sum::<T>(&acc[k]), mins)
            };
            // SAFETY: the caller's contract on `out`.
            unsafe { put_tokens::<T>(y, k, out, r) };
        }
    }
}

/// One Q4_K super-block `wb` against the same super-block of `NT` tiles (`xs`): its
/// integer lanes by sub-block scale, fused into `acc` with `d_w·d_x`, and its min lanes
/// into `acc_min` with `−d_x·dmin_w`, as the single-token kernel does. With `Q5`, a
/// Q5_K super-block: each level's fifth bit from `qh`, and the four min lanes summed
/// into one chain per token (`acc_min[k][0]`), as its single-token kernel keeps them.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI and F16C; `wb` is a whole super-block and `xs`
/// holds `NT` tile super-blocks.
#[inline(always)]
unsafe fn q4_k_super_block<const T: usize, const NT: usize, const Q5: bool>(
    wb: &[u8],
    xs: &[u8],
    acc: &mut [[__m512; 4]; NT],
    acc_min: &mut [[__m512; 2]; NT],
) {
    let sb = sb_bytes(T);
    let (qs_at, quad_bias) = if Q5 {
        (q5_k::QS, QUAD_BIAS_Q5)
    } else {
        (q4_k::QS, QUAD_BIAS)
    };
    assert!(wb.len() >= qs_at + 128 && xs.len() >= NT * sb);
    let low4 = _mm512_set1_epi8(0x0F);
    let sixteen = crate::avx512::opaque_512(_mm512_set1_epi8(16));
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
    let mut ints = [[_mm512_set1_epi32(-quad_bias * sc_sum); 4]; NT];
    let bias = _mm512_set1_epi32(quad_bias);
    for c in 0..4 {
        // Sub-blocks 2c and 2c + 1: the low and high nibbles of the chunk's 32 bytes,
        // scaled by the word pair (sc[2c], sc[2c+1]).
        let scale = _mm512_set1_epi32(
            (sc >> (16 * c)) as i32 & 0xFF | ((sc >> (16 * c + 8)) as i32 & 0xFF) << 16,
        );
        for i in 0..T / 2 {
            // Register i's lanes of both sub-blocks: 16 / T · 4 bytes of the chunk.
            // SAFETY: inside the chunk, bytes 32c .. 32c + 32 of the quants.
            let wq = unsafe { broadcast_lanes::<T>(wb.as_ptr().add(qs_at + 32 * c), i) };
            let mut w_lo = _mm512_and_si512(wq, low4);
            let mut w_hi = _mm512_and_si512(_mm512_srli_epi16::<4>(wq), low4);
            if Q5 {
                // Bits 2c and 2c + 1 of the same lanes' qh bytes: 16 more where set.
                // SAFETY: qh is bytes 16..48 of 176.
                let qh = unsafe { broadcast_lanes::<T>(wb.as_ptr().add(q5_k::QH), i) };
                let bit = |b: usize| _mm512_test_epi8_mask(qh, _mm512_set1_epi8(1 << b));
                w_lo = _mm512_mask_add_epi8(w_lo, bit(2 * c), w_lo, sixteen);
                w_hi = _mm512_mask_add_epi8(w_hi, bit(2 * c + 1), w_hi, sixteen);
            }
            for k in 0..NT {
                // SAFETY: inside tile `k`'s super-block.
                let reg = |g: usize| unsafe { quads::<T>(xs, k, g, i) };
                // (quad_hi + bias)·2¹⁶ + (quad_lo + bias): two non-negative words.
                let hi = _mm512_dpbusd_epi32(bias, w_hi, reg(2 * c + 1));
                // (A shift and an OR, not VBMI2's double shift `vpshldd`, which on Zen 4
                // takes the slot of a product: `benches/pipes`.)
                let hi_up = _mm512_or_si512(_mm512_slli_epi32::<16>(hi), bias);
                let both = _mm512_dpbusd_epi32(hi_up, w_lo, reg(2 * c));
                ints[k][i] = _mm512_dpwssd_epi32(ints[k][i], both, scale);
            }
        }
    }
    // SAFETY: the features per the caller's contract.
    let mins = unsafe { q4_k_min_pairs::<T>(mn) };
    for k in 0..NT {
        let tile = &xs[k * sb..(k + 1) * sb];
        // SAFETY: inside the tile's super-block.
        let dx = unsafe { _mm512_loadu_ps(tile.as_ptr().add(dx_at(T)).cast()) };
        let d = _mm512_mul_ps(_mm512_set1_ps(dw), dx);
        for i in 0..T / 2 {
            acc[k][i] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(ints[k][i]), acc[k][i]);
        }
        let neg_dmin = _mm512_mul_ps(dx, _mm512_set1_ps(-dmin));
        // SAFETY: a whole tile super-block; the features per the caller's contract.
        unsafe { q4_k_min_chains::<T, Q5>(tile, &mins, neg_dmin, &mut acc_min[k]) };
    }
}

/// The word pairs `(mn[2m], mn[2m+1])` of a Q4_K / Q5_K super-block's packed mins `mn`
/// where each register element of a tile of `T` wants min lane `m`.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn q4_k_min_pairs<const T: usize>(mn: u64) -> [__m512i; 2] {
    let zero = _mm512_setzero_si512();
    let pair = |m: usize| ((mn >> (16 * m)) & 0xFF | ((mn >> (16 * m + 8)) & 0xFF) << 16) as i32;
    let all_pairs = _mm_set_epi32(pair(3), pair(2), pair(1), pair(0));
    match T {
        8 => [
            _mm512_set1_epi64((pair(0) as u32 as i64) | (pair(1) as i64) << 32),
            _mm512_set1_epi64((pair(2) as u32 as i64) | (pair(3) as i64) << 32),
        ],
        4 => [_mm512_broadcast_i32x4(all_pairs), zero],
        // Elements 4..8 of each token's eight hold no min lane.
        _ => [_mm512_maskz_broadcast_i32x4(0x0F0F, all_pairs), zero],
    }
}

/// A tile super-block's min lanes (its 32-quant sum pairs by `mins`) fused into the
/// tile's min chains with `neg_dmin = −d_x·dmin_w`: Q4_K's four lanes each into its own
/// chain, Q5_K's (`Q5`) summed into one chain per token (`acc_min[0]`).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI and FMA; `tile` is a whole tile super-block of width `T`.
#[inline(always)]
unsafe fn q4_k_min_chains<const T: usize, const Q5: bool>(
    tile: &[u8],
    mins: &[__m512i; 2],
    neg_dmin: __m512,
    acc_min: &mut [__m512; 2],
) {
    assert!(tile.len() >= sb_bytes(T));
    let zero = _mm512_setzero_si512();
    let mut lanes = [zero; 2];
    for j in 0..min_regs(T) {
        // SAFETY: inside the tile's super-block (asserted above).
        let sums = unsafe { _mm512_loadu_si512(tile.as_ptr().add(mins_at(T) + 64 * j).cast()) };
        lanes[j] = _mm512_dpwssd_epi32(zero, sums, mins[j]);
    }
    if Q5 {
        let total = min_lanes_total::<T>(lanes);
        acc_min[0] = _mm512_fmadd_ps(neg_dmin, _mm512_cvtepi32_ps(total), acc_min[0]);
    } else {
        for j in 0..min_regs(T) {
            acc_min[j] = _mm512_fmadd_ps(neg_dmin, _mm512_cvtepi32_ps(lanes[j]), acc_min[j]);
        }
    }
}

/// The row loop of the narrow K kernels whose super-blocks write only the lane chains
/// `acc` (Q2_K, Q3_K, Q6_K): per row, each super-block `wb` (number `b`, prefetched
/// ahead as decoding does) goes through `$block`, then each tile's lanes are summed and
/// its tokens' outputs written. A macro rather than a function taking the block step:
/// a closure is not compiled with the calling kernel's target features.
macro_rules! narrow_rows {
    ($args:expr, $bytes:expr, $t:ident, $nt:ident, |$wb:ident, $b:ident, $acc:ident| $block:block) => {{
        let (rows, _, n_blocks, out) = $args;
        for (r, row) in rows.enumerate() {
            assert!(row.len() >= n_blocks * $bytes);
            let mut $acc = [[_mm512_setzero_ps(); 4]; $nt];
            for $b in 0..n_blocks {
                crate::avx2::prefetch_block(row, $b * $bytes, $bytes, 1);
                let $wb = &row[$b * $bytes..($b + 1) * $bytes];
                $block
            }
            for k in 0..$nt {
                // SAFETY: the calling kernel's features.
                let y = unsafe { lanes_sum::<$t>(&$acc[k]) };
                // SAFETY: the calling kernel's contract on `out`.
                unsafe { put_tokens::<$t>(y, k, out, r) };
            }
        }
    }};
}

/// A super-block's scaled level registers (groups `k | k + 4`, Q2_K's and Q3_K's layout)
/// kept on the stack, from which [`lane_register`] broadcasts.
type StoredLevels = [[u8; 64]; 4];

/// `levels` stored for [`lane_register`].
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn store_levels(levels: &[__m512i; 4]) -> StoredLevels {
    let mut stored = [[0u8; 64]; 4];
    for (out, v) in stored.iter_mut().zip(levels) {
        // SAFETY: 64 bytes; the caller's features.
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), *v) };
    }
    stored
}

/// Register `i` of group `g` in a tile of `T` tokens: the group's lanes `L·i..L·i + L`
/// (`L = 16 / T`, `4L` bytes) repeated for every token, by one broadcast load. A
/// broadcast from memory takes the load ports; the `vpermd` it replaces took the
/// shuffle pipe (LLVM even makes that an extract and a broadcast), which these kernels'
/// products wait on.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn lane_register<const T: usize>(stored: &StoredLevels, g: usize, i: usize) -> __m512i {
    let bytes = &stored[g % 4][32 * (g / 4) + 4 * (16 / T) * i..];
    // SAFETY: `4·(16/T)·(i + 1) ≤ 32` for `i < T / 2`, so the bytes read lie inside the
    // group's half of the register (sliced above); the caller's features.
    unsafe {
        match T {
            8 => _mm512_set1_epi64((bytes.as_ptr() as *const i64).read_unaligned()),
            4 => _mm512_broadcast_i32x4(_mm_loadu_si128(bytes.as_ptr().cast())),
            _ => _mm512_broadcast_i64x4(_mm256_loadu_si256(bytes.as_ptr().cast())),
        }
    }
}

/// Q2_K rows against `NT` tiles of `T` tokens (see [`RowsArgs`]).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; every row holds the tiles' super-blocks of Q2_K;
/// the writes are valid.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q2_k_rows<const T: usize, const NT: usize>(args: RowsArgs<'_>) {
    let (_, x, n_blocks, out) = args;
    let sb = sb_bytes(T);
    assert!(x.len() >= n_blocks * NT * sb && out.2 <= NT * T);
    let consts = crate::avx512::Q2kConsts::new();
    let lane_index = q2_k_lane_index::<T>();
    narrow_rows!(args, q2_k::BYTES, T, NT, |wb, b, acc| {
        let xs = &x[b * NT * sb..(b + 1) * NT * sb];
        // SAFETY: `wb` a whole super-block, `xs` the tiles' super-blocks; features per
        // this function's contract.
        unsafe { q2_k_super_block::<T, NT>(wb, xs, (&consts, &lane_index), &mut acc) };
    });
}

/// For register `i` (of `T / 2`) and element `e`: the lane `L·i + e mod L` (`L = 16/T`)
/// that element holds, the dword of Q2_K's min pairs it takes.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn q2_k_lane_index<const T: usize>() -> [__m512i; 4] {
    let per_reg = 16 / T;
    let mut index = [_mm512_setzero_si512(); 4];
    for (i, index) in index.iter_mut().enumerate().take(T / 2) {
        let mut lanes = [0i32; 16];
        for (e, lane) in lanes.iter_mut().enumerate() {
            *lane = (per_reg * i + e % per_reg) as i32;
        }
        // SAFETY: sixteen i32; the caller's features.
        *index = unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) };
    }
    index
}

/// One Q2_K super-block `wb` against the same super-block of `NT` tiles (`xs`): per
/// super-block first the min lanes `m[2l]·b[2l] + m[2l+1]·b[2l+1]` fused with
/// `−d_x·dmin_w`, then the level lanes `Σ_g Σ (s·q)·x` (the levels scaled by their
/// sub-block's scale, a byte: [`crate::avx512::q2_k_scaled_levels`]) fused with
/// `d_x·d_w`, into the same chains, as the single-token kernel does. The scaled levels
/// are the unsigned operand, the activations signed: no correction.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI and F16C; `wb` is a whole super-block and `xs` holds
/// `NT` tile super-blocks.
#[inline(always)]
unsafe fn q2_k_super_block<const T: usize, const NT: usize>(
    wb: &[u8],
    xs: &[u8],
    (consts, lane_index): (&crate::avx512::Q2kConsts, &[__m512i; 4]),
    acc: &mut [[__m512; 4]; NT],
) {
    let sb = sb_bytes(T);
    assert!(wb.len() >= q2_k::BYTES && xs.len() >= NT * sb);
    let zero = _mm512_setzero_si512();
    // SAFETY: a whole super-block; the caller's features.
    let (scaled, mins) = unsafe { crate::avx512::q2_k_scaled_levels(wb, consts) };
    // SAFETY: the caller's features.
    let scaled = unsafe { store_levels(&scaled) };
    let d_w = crate::avx2::f16_bits_to_f32(u16::from_le_bytes([wb[q2_k::D], wb[q2_k::D + 1]]));
    let dmin_w =
        crate::avx2::f16_bits_to_f32(u16::from_le_bytes([wb[q2_k::DMIN], wb[q2_k::DMIN + 1]]));
    // Min pair (m[2l], m[2l+1]) of lane l as dword l.
    let min_pairs = _mm512_castsi256_si512(mins);
    for i in 0..T / 2 {
        let min_pair = _mm512_permutexvar_epi32(lane_index[i], min_pairs);
        let mut sums = [zero; NT];
        for g in 0..8 {
            // Group g is the low (g < 4) or high half of register g % 4.
            // SAFETY: i < T / 2; the caller's features.
            let w = unsafe { lane_register::<T>(&scaled, g, i) };
            for (k, sum) in sums.iter_mut().enumerate() {
                // SAFETY: inside the tiles' super-blocks (asserted above).
                *sum = _mm512_dpbusd_epi32(*sum, w, unsafe { quads::<T>(xs, k, g, i) });
            }
        }
        for (k, (acc, sum)) in acc.iter_mut().zip(sums).enumerate() {
            // SAFETY: inside the tiles' super-blocks (asserted above).
            let (dx, bsum_pairs) = unsafe {
                let at = xs.as_ptr().add(k * sb);
                (
                    _mm512_loadu_ps(at.add(dx_at(T)).cast()),
                    _mm512_loadu_si512(at.add(bsums_at(T) + 64 * i).cast()),
                )
            };
            let min_lanes = _mm512_dpwssd_epi32(zero, bsum_pairs, min_pair);
            let neg_dmin = _mm512_mul_ps(dx, _mm512_set1_ps(-dmin_w));
            acc[i] = _mm512_fmadd_ps(neg_dmin, _mm512_cvtepi32_ps(min_lanes), acc[i]);
            let d = _mm512_mul_ps(dx, _mm512_set1_ps(d_w));
            acc[i] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc[i]);
        }
    }
}

/// Q3_K rows against `NT` tiles of `T` tokens (see [`RowsArgs`]), with the tiles' lane
/// offsets ([`NarrowKTiles::q3_k_offsets`]).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; every row holds the tiles' super-blocks of Q3_K;
/// `offsets` holds their lane offsets; the writes are valid.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q3_k_rows<const T: usize, const NT: usize>(args: RowsArgs<'_>, offsets: &[u8]) {
    let (_, x, n_blocks, out) = args;
    let sb = sb_bytes(T);
    assert!(x.len() >= n_blocks * NT * sb && out.2 <= NT * T);
    let per_block = NT * offsets_bytes(T);
    assert!(offsets.len() >= n_blocks * per_block);
    let consts = crate::avx512::Q3kRows4::new();
    narrow_rows!(args, q3_k::BYTES, T, NT, |wb, b, acc| {
        let xs = (
            &x[b * NT * sb..(b + 1) * NT * sb],
            &offsets[b * per_block..(b + 1) * per_block],
        );
        // SAFETY: `wb` a whole super-block, `xs` the tiles' super-blocks and their lane
        // offsets; features per this function's contract.
        unsafe { q3_k_super_block::<T, NT>(wb, xs, &consts, &mut acc) };
    });
}

/// One Q3_K super-block `wb` against the same super-block of `NT` tiles (`xs`: the tiles
/// and their lane offsets `−127·Σx`): lane `l` is `Σ_g Σ (s·q)·x`, the scaled levels
/// `s·q + 127` ([`crate::avx512::q3_k_scaled_levels`]) meeting the activations by one
/// `vpdpbusd` per group and register from the lane's offset, fused into `acc` with
/// `d_x·d_w`, as the single-token kernel does (the same lane integers: sums of exact
/// products).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI and F16C; `wb` is a whole super-block and `xs`
/// holds `NT` tile super-blocks and their lane offsets.
#[inline(always)]
unsafe fn q3_k_super_block<const T: usize, const NT: usize>(
    wb: &[u8],
    (xs, offsets): (&[u8], &[u8]),
    consts: &crate::avx512::Q3kRows4,
    acc: &mut [[__m512; 4]; NT],
) {
    let sb = sb_bytes(T);
    assert!(wb.len() >= q3_k::BYTES && xs.len() >= NT * sb);
    assert!(offsets.len() >= NT * offsets_bytes(T));
    // SAFETY: a whole super-block; the caller's features.
    let scaled = unsafe { store_levels(&crate::avx512::q3_k_scaled_levels(wb, consts)) };
    let d_w = crate::avx2::f16_bits_to_f32(u16::from_le_bytes([wb[q3_k::D], wb[q3_k::D + 1]]));
    for i in 0..T / 2 {
        // SAFETY: inside the lane offsets (asserted above).
        let mut sums: [__m512i; NT] = std::array::from_fn(|k| unsafe {
            _mm512_loadu_si512(offsets.as_ptr().add(k * offsets_bytes(T) + 64 * i).cast())
        });
        for g in 0..8 {
            // Group g is the low (g < 4) or high half of register g % 4.
            // SAFETY: i < T / 2; the caller's features.
            let w = unsafe { lane_register::<T>(&scaled, g, i) };
            for (k, sum) in sums.iter_mut().enumerate() {
                // SAFETY: inside the tiles' super-blocks (asserted above).
                *sum = _mm512_dpbusd_epi32(*sum, w, unsafe { quads::<T>(xs, k, g, i) });
            }
        }
        for (k, (acc, sum)) in acc.iter_mut().zip(sums).enumerate() {
            // SAFETY: inside the tiles' super-blocks (asserted above).
            let dx = unsafe { _mm512_loadu_ps(xs.as_ptr().add(k * sb + dx_at(T)).cast()) };
            let d = _mm512_mul_ps(dx, _mm512_set1_ps(d_w));
            acc[i] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc[i]);
        }
    }
}

/// Q6_K rows against `NT` tiles of `T` tokens (see [`RowsArgs`]).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; every row holds the tiles' super-blocks of Q6_K;
/// the writes are valid.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn q6_k_rows<const T: usize, const NT: usize>(args: RowsArgs<'_>) {
    let (_, x, n_blocks, out) = args;
    let sb = sb_bytes(T);
    assert!(x.len() >= n_blocks * NT * sb && out.2 <= NT * T);
    narrow_rows!(args, q6_k::BYTES, T, NT, |wb, b, acc| {
        let xs = &x[b * NT * sb..(b + 1) * NT * sb];
        // SAFETY: `wb` a whole super-block, `xs` the tiles' super-blocks; features per
        // this function's contract.
        unsafe { q6_k_super_block::<T, NT>(wb, xs, &mut acc) };
    });
}

/// One Q6_K super-block `wb` against the same super-block of `NT` tiles (`xs`): lane
/// `l` is `Σ_g sc·quad(g, l) − 32·(b[2l]·sc[2l] + b[2l+1]·sc[2l+1])` (a scale per 16
/// weights: lanes 0..4 of a 32-quant group take its first, lanes 4..8 its second),
/// fused into `acc` with `d_x·d_w`, as the single-token kernel does. The 6-bit levels
/// `0..64` are the unsigned operand; a quad is at most `4·63·128 < 2¹⁵` in magnitude.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI and F16C; `wb` is a whole super-block and `xs` holds
/// `NT` tile super-blocks.
#[inline(always)]
unsafe fn q6_k_super_block<const T: usize, const NT: usize>(
    wb: &[u8],
    xs: &[u8],
    acc: &mut [[__m512; 4]; NT],
) {
    let sb = sb_bytes(T);
    assert!(wb.len() >= q6_k::BYTES && xs.len() >= NT * sb);
    let zero = _mm512_setzero_si512();
    let lane_index = q6_k_lane_index::<T>();
    let dw = crate::avx2::f16_bits_to_f32(u16::from_le_bytes([wb[q6_k::D], wb[q6_k::D + 1]]));
    // SAFETY: a whole super-block and NT tile super-blocks (asserted above).
    let mut ints = unsafe { q6_k_offset_lanes::<T, NT>(wb, xs) };
    for half in 0..2 {
        // SAFETY: a whole super-block (asserted above).
        let levels = unsafe { q6_k_half_levels(wb, half) };
        for (v, levels) in levels.into_iter().enumerate() {
            // Groups g and g + 1 (the register's two halves of levels) in one pass: their
            // quads share a dword as words, so one `vpdpwssd` multiplies both.
            let g = 4 * half + 2 * v;
            for i in 0..T / 2 {
                // Register i's lanes of groups g and g + 1, repeated for every token.
                let w_lo = _mm512_permutexvar_epi64(lane_index[0][i], levels);
                let w_hi = _mm512_permutexvar_epi64(lane_index[1][i], levels);
                // SAFETY: scales are bytes 192..208 of the super-block.
                let scale = unsafe { q6_k_scale_pair::<T>(wb, g, i) };
                for k in 0..NT {
                    // SAFETY: inside tile `k`'s super-block.
                    let (x_lo, x_hi) =
                        unsafe { (quads::<T>(xs, k, g, i), quads::<T>(xs, k, g + 1, i)) };
                    // SAFETY: the caller's features.
                    let both = unsafe {
                        join_quads(
                            _mm512_dpbusd_epi32(zero, w_lo, x_lo),
                            _mm512_dpbusd_epi32(zero, w_hi, x_hi),
                        )
                    };
                    ints[k][i] = _mm512_dpwssd_epi32(ints[k][i], both, scale);
                }
            }
        }
    }
    for k in 0..NT {
        // SAFETY: inside the tile's super-block.
        let dx = unsafe { _mm512_loadu_ps(xs.as_ptr().add(k * sb + dx_at(T)).cast()) };
        let d = _mm512_mul_ps(dx, _mm512_set1_ps(dw));
        for i in 0..T / 2 {
            acc[k][i] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(ints[k][i]), acc[k][i]);
        }
    }
}

/// Qword indices of register `i`'s lanes (`[h][i]`) in a register of 64 Q6_K levels:
/// the group's half `h` (qwords `4h..4h + 4`), `16/T·4` bytes per register, repeated for
/// every token.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn q6_k_lane_index<const T: usize>() -> [[__m512i; 4]; 2] {
    let per = (16 / T) / 2;
    let repeat = _mm512_and_si512(
        _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi64(per as i64 - 1),
    );
    let mut lane_index = [[_mm512_setzero_si512(); 4]; 2];
    for h in 0..2 {
        for i in 0..T / 2 {
            let first = _mm512_set1_epi64((4 * h + per * i) as i64);
            lane_index[h][i] = _mm512_add_epi64(first, repeat);
        }
    }
    lane_index
}

/// Each tile's lane integers started at `−32·(b[2l]·sc[2l] + b[2l+1]·sc[2l+1])`: the
/// bsum pairs of the tiles against `(−32·sc[2l], −32·sc[2l+1])` word pairs.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI; `wb` is a whole Q6_K super-block and `xs` holds `NT`
/// tile super-blocks.
#[inline(always)]
unsafe fn q6_k_offset_lanes<const T: usize, const NT: usize>(
    wb: &[u8],
    xs: &[u8],
) -> [[__m512i; 4]; NT] {
    let zero = _mm512_setzero_si512();
    // SAFETY: the sixteen scales are bytes 192..208 of 210 (the caller's contract).
    let sc16 =
        _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(wb.as_ptr().add(q6_k::SCALES).cast()) });
    // Dword l: (−32·sc[2l], −32·sc[2l+1]).
    let offsets = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<5>(sc16));
    let mut ints = [[zero; 4]; NT];
    for i in 0..T / 2 {
        let pairs = match T {
            8 => _mm512_permutexvar_epi64(
                _mm512_set1_epi64(i as i64),
                _mm512_castsi256_si512(offsets),
            ),
            4 => _mm512_broadcast_i32x4(if i == 0 {
                _mm256_castsi256_si128(offsets)
            } else {
                _mm256_extracti128_si256::<1>(offsets)
            }),
            _ => _mm512_broadcast_i64x4(offsets),
        };
        for k in 0..NT {
            // SAFETY: inside tile `k`'s super-block (the caller's contract).
            let b = unsafe {
                _mm512_loadu_si512(
                    xs.as_ptr()
                        .add(k * sb_bytes(T) + bsums_at(T) + 64 * i)
                        .cast(),
                )
            };
            ints[k][i] = _mm512_dpwssd_epi32(zero, b, pairs);
        }
    }
    ints
}

/// Half `half` of a Q6_K super-block's 256 levels, 64 to a register in activation order:
/// groups 0 and 1 (the low nibbles of ql 0..32 and 32..64 with qh bits 0-1 and 2-3), then
/// groups 2 and 3 (the high nibbles with bits 4-5 and 6-7).
///
/// # Safety
/// The CPU has AVX-512 F/BW; `wb` is a whole super-block.
#[inline(always)]
unsafe fn q6_k_half_levels(wb: &[u8], half: usize) -> [__m512i; 2] {
    let low4 = _mm512_set1_epi8(0x0F);
    let bits45 = _mm512_set1_epi8(0x30);
    // qh's bits for groups 0, 1 (shifted up by 4 and 2 into bits 4, 5) and 2, 3 (by 0
    // and down by 2): one shift count per 256-bit half.
    let halves = |lo: i16, hi: i16| {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi16(lo)),
            _mm256_set1_epi16(hi),
        )
    };
    // SAFETY: ql half bytes 64h..64h + 64, qh half 128 + 32h.. + 32 of 210.
    let (ql, qh) = unsafe {
        (
            _mm512_loadu_si512(wb.as_ptr().add(q6_k::QL + 64 * half).cast()),
            _mm512_broadcast_i64x4(_mm256_loadu_si256(
                wb.as_ptr().add(q6_k::QH + 32 * half).cast(),
            )),
        )
    };
    // Low nibble | the two high bits moved to bits 4 and 5: A | (B & C).
    const OR_MASKED: i32 = 0xF8;
    [
        _mm512_ternarylogic_epi32::<OR_MASKED>(
            _mm512_and_si512(ql, low4),
            _mm512_sllv_epi16(qh, halves(4, 2)),
            bits45,
        ),
        _mm512_ternarylogic_epi32::<OR_MASKED>(
            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4),
            _mm512_srlv_epi16(qh, halves(0, 2)),
            bits45,
        ),
    ]
}

/// The scale word pairs `(sc(g), sc(g + 1))` for register `i` of groups `g` and `g + 1`:
/// each group's one scale for the register's lanes, or at two tokens its two (lanes
/// 0..4 and 4..8, in the register's two halves).
///
/// # Safety
/// The CPU has AVX-512 F; `wb` holds the super-block's scales.
#[inline(always)]
unsafe fn q6_k_scale_pair<const T: usize>(wb: &[u8], g: usize, i: usize) -> __m512i {
    let word = |j: usize| wb[q6_k::SCALES + j] as i8 as i16 as u16 as i32;
    // Scale j of group g pairs with scale j + 2 (group g + 1).
    let pair = |j: usize| word(j) | word(j + 2) << 16;
    match T {
        8 => _mm512_set1_epi32(pair(2 * g + i / 2)),
        4 => _mm512_set1_epi32(pair(2 * g + i)),
        _ => _mm512_broadcast_i64x4(_mm256_set_m128i(
            _mm_set1_epi32(pair(2 * g + 1)),
            _mm_set1_epi32(pair(2 * g)),
        )),
    }
}

/// Register `i`'s weight bytes, `4·16/T` of them from `chunk + 4·16/T·i`, repeated
/// across the register: its lanes for every token.
///
/// # Safety
/// The CPU has AVX-512 F; those bytes are readable.
#[inline(always)]
unsafe fn broadcast_lanes<const T: usize>(chunk: *const u8, i: usize) -> __m512i {
    let p = chunk.wrapping_add(4 * (16 / T) * i);
    // SAFETY: the caller's contract.
    unsafe {
        match T {
            8 => _mm512_set1_epi64(std::ptr::read_unaligned(p.cast::<i64>())),
            4 => _mm512_broadcast_i32x4(_mm_loadu_si128(p.cast())),
            _ => _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast())),
        }
    }
}

/// Register `i` of group `g`'s quads in tile `k` of the super-block `xs`.
///
/// # Safety
/// The CPU has AVX-512 F; `xs` holds at least `k + 1` tile super-blocks of width `T`.
#[inline(always)]
unsafe fn quads<const T: usize>(xs: &[u8], k: usize, g: usize, i: usize) -> __m512i {
    let at = k * sb_bytes(T) + ((T / 2) * g + i) * 64;
    debug_assert!(at + 64 <= xs.len());
    // SAFETY: the caller's contract.
    unsafe { _mm512_loadu_si512(xs.as_ptr().add(at).cast()) }
}

/// The four integer min lanes of each token summed (an exact sum, so in any order), in
/// every element of the token's.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn min_lanes_total<const T: usize>(m: [__m512i; 2]) -> __m512i {
    const SWAP_1: _MM_PERM_ENUM = 0b10_11_00_01;
    const SWAP_2: _MM_PERM_ENUM = 0b01_00_11_10;
    let s = match T {
        8 => _mm512_add_epi32(m[0], m[1]),
        _ => _mm512_add_epi32(m[0], _mm512_shuffle_epi32::<SWAP_2>(m[0])),
    };
    _mm512_add_epi32(s, _mm512_shuffle_epi32::<SWAP_1>(s))
}

/// Q4_K's four min lanes summed as the single-token kernel sums them, `(m0+m2)+(m1+m3)`,
/// token `t`'s in element `t·16/T`.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn mins_sum<const T: usize>(m: &[__m512; 2]) -> __m512 {
    // Swap neighbouring elements, and pairs of them.
    const SWAP_1: i32 = 0b10_11_00_01;
    const SWAP_2: i32 = 0b01_00_11_10;
    let s = match T {
        // Register j: min lanes 2j, 2j+1 of token t in elements 2t, 2t+1.
        8 => _mm512_add_ps(m[0], m[1]),
        // One register: min lanes 0..4 of token t in its first four elements.
        _ => _mm512_add_ps(m[0], _mm512_permute_ps::<SWAP_2>(m[0])),
    };
    _mm512_add_ps(s, _mm512_permute_ps::<SWAP_1>(s))
}

/// Tile `k`'s token sums `y` (token `t` in element `t·16/T`) to
/// `out.0[(T·k + t)·out.1 + r]` for its real tokens (`T·k + t < out.2`).
///
/// # Safety
/// The CPU has AVX-512 F; the writes are valid.
#[inline(always)]
unsafe fn put_tokens<const T: usize>(
    y: __m512,
    k: usize,
    (out, out_stride, n_tokens): (*mut f32, usize, usize),
    r: usize,
) {
    let mut ys = [0f32; 16];
    // SAFETY: sixteen f32.
    unsafe { _mm512_storeu_ps(ys.as_mut_ptr(), y) };
    for t in 0..n_tokens.saturating_sub(k * T).min(T) {
        // SAFETY: the caller's contract on `out`.
        unsafe { *out.add((k * T + t) * out_stride + r) = ys[t * (16 / T)] };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::read_f32;

    /// Five tokens of one super-block: quant k of token t is (t + k) as i8, d_x = t + 1,
    /// bsum j = 10·t + j.
    fn rows() -> Vec<u8> {
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
        rows
    }

    #[test]
    fn the_eight_token_layout_is_the_scalar_ones() {
        if !crate::tiled::available() {
            return;
        }
        // Eleven tokens of three super-blocks, quantized (the bsums sum their quants);
        // the eight from token 2.
        let (n_blocks, n_tokens, first) = (3, 11, 2);
        let row_bytes = n_blocks * q8_k::BYTES;
        let x: Vec<f32> = (0..n_tokens * n_blocks * 256)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.01 * (1 + i % 5) as f32)
            .collect();
        let mut rows = vec![0u8; n_tokens * row_bytes];
        crate::quant::quantize_q8_k_scalar(&x, &mut rows);
        for b in 0..n_blocks {
            let mut scalar = vec![0u8; sb_bytes(MAX_WIDTH)];
            let mut simd = vec![0xAAu8; sb_bytes(MAX_WIDTH)];
            for t in 0..MAX_WIDTH {
                let at = (first + t) * row_bytes + b * q8_k::BYTES;
                lay_out_token(&rows[at..at + q8_k::BYTES], &mut scalar, t, MAX_WIDTH);
            }
            let at = first * row_bytes + b * q8_k::BYTES;
            // SAFETY: the CPU has the features (`tiled::available`).
            unsafe { lay_out_8(&rows[at..], row_bytes, &mut simd) };
            assert!(scalar == simd, "super-block {b}");
        }
    }

    #[test]
    fn a_build_over_an_old_layout_gives_a_fresh_build() {
        // Every token count (full tiles of eight skip the zeroing, the others keep it),
        // each built over a layout of other bytes and of every other count.
        let n_blocks = 2;
        let row_bytes = n_blocks * q8_k::BYTES;
        let token_rows = |n: usize, seed: u8| -> Vec<u8> {
            (0..n * row_bytes)
                .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
                .collect()
        };
        // (The layouts hold two to sixteen tokens.)
        for n in 2..=16 {
            let rows = token_rows(n, 3);
            let mut fresh = NarrowKTiles::default();
            fresh.build(&rows, 0, n, row_bytes);
            for old in 2..=16 {
                let mut used = NarrowKTiles::default();
                used.build(&token_rows(old, 100), 0, old, row_bytes);
                used.build(&rows, 0, n, row_bytes);
                assert!(used.data[..] == fresh.data[..], "{n} tokens over {old}");
            }
        }
    }

    #[test]
    fn build_places_lanes_scales_and_sums_and_pads_with_zero() {
        let rows = rows();
        let mut tiles = NarrowKTiles::default();
        tiles.build(&rows, 0, 5, q8_k::BYTES);
        assert_eq!(
            (
                tiles.width,
                tiles.n_tiles,
                tiles.held.n_tokens,
                tiles.held.first
            ),
            (8, 1, 5, 0)
        );
        let d = &tiles.data;
        let dword = |at: usize| &d[at..at + 4];
        // Sub-block 5, lane 3 (register 1, element 2·2 + 1) of token 2: quants
        // 32·5 + 12 .. + 16, plus 2.
        assert_eq!(
            dword((4 * 5 + 1) * 64 + 4 * (2 * 2 + 1)),
            &[174, 175, 176, 177]
        );
        // Token 5 is padding.
        assert_eq!(dword((4 * 5 + 1) * 64 + 4 * 10), &[0, 0, 0, 0]);
        assert_eq!(read_f32(d, dx_at(8) + 4 * (2 * 2 + 1)), 3.0);
        assert_eq!(read_f32(d, dx_at(8) + 4 * 10), 0.0);
        // Min lane 3 (register 1, element 2·1 + 1) of token 1: S[6] = b12 + b13,
        // S[7] = b14 + b15.
        let at = mins_at(8) + 64 + 4 * 3;
        assert_eq!(
            (read_i16(d, at), read_i16(d, at + 2)),
            (10 + 12 + 10 + 13, 10 + 14 + 10 + 15)
        );
        // Lane 5's bsum pair (register 2, element 2·1 + 1) of token 1: b10, b11.
        let at = bsums_at(8) + 2 * 64 + 4 * 3;
        assert_eq!((read_i16(d, at), read_i16(d, at + 2)), (10 + 10, 10 + 11));
        // One token, or more than sixteen: nothing.
        tiles.build(&rows, 4, 5, q8_k::BYTES);
        assert_eq!(tiles.held, HeldTokens::default());
    }

    #[test]
    fn two_tokens_fill_a_register_with_eight_lanes_each() {
        let rows = rows();
        let mut tiles = NarrowKTiles::default();
        tiles.build(&rows, 3, 5, q8_k::BYTES);
        assert_eq!(
            (tiles.width, tiles.held.n_tokens, tiles.held.first),
            (2, 2, 3)
        );
        let d = &tiles.data;
        // Sub-block 1's only register, lane 6 of token 1 (row 4): element 8 + 6.
        let at = 64 + 4 * (8 + 6);
        assert_eq!(&d[at..at + 4], &[4 + 56, 4 + 57, 4 + 58, 4 + 59]);
        // Min lanes fill elements 0..4 of each token; 4..8 stay zero.
        let at = mins_at(2) + 4 * (8 + 2);
        assert_eq!(read_i16(d, at), 40 + 8 + 40 + 9);
        assert_eq!(read_i16(d, mins_at(2) + 4 * (8 + 5)), 0);
        assert_eq!(sb_bytes(2), 8 * 64 + 64 + 64 + 64);
    }
}
