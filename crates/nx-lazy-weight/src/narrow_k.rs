//! Narrow token tiles for the K formats: 5 to 16 tokens of Q8_K activations as one or
//! two tiles of eight, for batched decode steps and draft verification on the AVX-512
//! VNNI tier, where too few tokens fill a sixteen-token tile of [`crate::tiled`].
//!
//! The single-token Q4_K and Q6_K kernels keep eight integer lanes per super-block
//! (`Σ_g sc·quad(g, l)`, a quad being four products; Q4_K also four min lanes), fused
//! into float chains. Here a 512-bit register holds two of those lanes for eight tokens
//! (element `2t + s` is lane `2i + s` of token `t` in register `i`), so one `vpdpbusd`
//! forms sixteen quads and one FMA advances sixteen chains — each chain the
//! single-token kernel's own, with the same final sums, so every output keeps its bits.
//!
//! The weight is the unsigned operand: the levels are `0..16` (Q4_K) or `0..64` (Q6_K)
//! as stored, so the activations stay signed and need no correction. The eight levels of
//! a register's two lanes are eight consecutive bytes of a sub-block, so each register
//! is one qword of the mapped row broadcast and decoded in place (nibble masks; Q6_K's
//! high bits by shifts and one ternary-logic merge): with few tokens a pass is bound by
//! its weight stream, and the wide tiles' unpacked copy of the rows costs more than it
//! saves. Both tiles of sixteen tokens share one pass over the rows, where the
//! four-token kernel streams the rows once per four tokens.
//!
//! Sub-block scales multiply quads by `vpdpwssd`, so a quad must be a word: Q6_K's are
//! (at most `4·63·128` in magnitude) and each takes one. Q4_K's are small enough
//! (`4·15·128`) that two, biased to non-negative, share a dword and one `vpdpwssd`
//! multiplies both by the sub-block pair's scales.

use std::arch::x86_64::*;

use nx_gguf::GgmlType;
use nx_syscalls::AlignedBytes;

use crate::act_tiles::put_pair;
use crate::formats::{q4_k, q6_k, q8_k, read_i16, scales_mins_k4_packed, Q4_K_BYTES};

/// Tokens per tile: two lanes of each in a 512-bit register.
const WIDTH: usize = 8;

/// Bytes of one super-block of a tile: the quads of every sub-block and lane-pair
/// register (8 × 4 × 64, signed), the token scales `d_x` (one per element), the two
/// registers of Q4_K's min-lane sum pairs `(S[2m], S[2m+1])` (`S` a 32-quant sum,
/// words), then the four registers of Q6_K's bsum pairs `(b[2l], b[2l+1])` per lane.
const SB_BYTES: usize = BSUMS + 4 * 64;
const DX: usize = 8 * 4 * 64;
const MINS: usize = DX + 64;
const BSUMS: usize = MINS + 2 * 64;

/// The quantized Q8_K activations of 5 to 16 tokens, laid out for [`run`] as one or two
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
            put_pair(out, at, lo, hi);
        }
        for i in 0..4 {
            let l = 2 * i + s;
            put_pair(out, BSUMS + 64 * i + 4 * e, bsum(2 * l), bsum(2 * l + 1));
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
    matches!(weight_type, GgmlType::Q4_K | GgmlType::Q6_K)
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
    if tiles.n_tokens == 0 || row_bytes == 0 {
        return;
    }
    let n_blocks = tiles.data.len() / (tiles.n_tiles * SB_BYTES);
    let rows = w_rows.chunks_exact(row_bytes);
    let out = (out_ptr, out_stride, tiles.n_tokens);
    // SAFETY: the caller guarantees the CPU features and the output range; every row
    // holds the tiles' super-blocks (the activations fit the weight).
    unsafe {
        match (weight_type, tiles.n_tiles) {
            (GgmlType::Q4_K, 1) => q4_k_rows::<1>(rows, &tiles.data, n_blocks, out),
            (GgmlType::Q4_K, _) => q4_k_rows::<2>(rows, &tiles.data, n_blocks, out),
            (GgmlType::Q6_K, 1) => q6_k_rows::<1>(rows, &tiles.data, n_blocks, out),
            (GgmlType::Q6_K, _) => q6_k_rows::<2>(rows, &tiles.data, n_blocks, out),
            _ => {}
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
            let y = unsafe { token_sums(&acc[k], Some(&acc_min[k])) };
            // SAFETY: the caller's contract on `out`.
            unsafe { put_tokens(y, k, (out, out_stride, n_tokens), r) };
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

/// Q6_K rows against `NT` tiles of `x`, as [`q4_k_rows`].
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; every row holds `n_blocks` Q6_K super-blocks; the
/// writes are valid.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
unsafe fn q6_k_rows<const NT: usize>(
    rows: std::slice::ChunksExact<'_, u8>,
    x: &[u8],
    n_blocks: usize,
    (out, out_stride, n_tokens): (*mut f32, usize, usize),
) {
    assert!(x.len() >= n_blocks * NT * SB_BYTES && n_tokens <= NT * WIDTH);
    for (r, row) in rows.enumerate() {
        assert!(row.len() >= n_blocks * q6_k::BYTES);
        let mut acc = [[_mm512_setzero_ps(); 4]; NT];
        for b in 0..n_blocks {
            crate::avx2::prefetch_block(row, b * q6_k::BYTES, q6_k::BYTES, 1);
            let wb = &row[b * q6_k::BYTES..(b + 1) * q6_k::BYTES];
            let xs = &x[b * NT * SB_BYTES..(b + 1) * NT * SB_BYTES];
            // SAFETY: `wb` a whole super-block, `xs` the tiles' super-blocks; features
            // per this function's contract.
            unsafe { q6_k_super_block::<NT>(wb, xs, &mut acc) };
        }
        for k in 0..NT {
            // SAFETY: the features per this function's contract.
            let y = unsafe { token_sums(&acc[k], None) };
            // SAFETY: the caller's contract on `out`.
            unsafe { put_tokens(y, k, (out, out_stride, n_tokens), r) };
        }
    }
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
unsafe fn q6_k_super_block<const NT: usize>(wb: &[u8], xs: &[u8], acc: &mut [[__m512; 4]; NT]) {
    assert!(wb.len() >= q6_k::BYTES && xs.len() >= NT * SB_BYTES);
    let zero = _mm512_setzero_si512();
    let low4 = _mm512_set1_epi8(0x0F);
    let bits45 = _mm512_set1_epi8(0x30);
    let dw = crate::avx2::f16_bits_to_f32(u16::from_le_bytes([wb[q6_k::D], wb[q6_k::D + 1]]));
    let sc = |j: usize| wb[q6_k::SCALES + j] as i8 as i16;
    // Each lane starts at −32·(b·s + b·s): register i's elements hold lanes 2i, 2i + 1.
    let offset_pairs = |i: usize| {
        let pair = |l: usize| {
            (-32 * sc(2 * l)) as u16 as u64 | ((-32 * sc(2 * l + 1)) as u16 as u64) << 16
        };
        _mm512_set1_epi64((pair(2 * i) | pair(2 * i + 1) << 32) as i64)
    };
    let mut ints = [[zero; 4]; NT];
    for i in 0..4 {
        let pairs = offset_pairs(i);
        for k in 0..NT {
            // SAFETY: inside tile `k`'s super-block.
            let b = unsafe {
                _mm512_loadu_si512(xs.as_ptr().add(k * SB_BYTES + BSUMS + 64 * i).cast())
            };
            ints[k][i] = _mm512_dpwssd_epi32(zero, b, pairs);
        }
    }
    // (sc, 0) as a word pair: the quad's low word by the scale.
    let scale = |j: usize| _mm512_set1_epi32(sc(j) as u16 as i32);
    let qword = |at: usize| {
        // SAFETY: callers stay inside the 210-byte super-block.
        _mm512_set1_epi64(unsafe { std::ptr::read_unaligned(wb.as_ptr().add(at).cast::<i64>()) })
    };
    for half in 0..2 {
        for i in 0..4 {
            // Lanes 2i, 2i + 1 of the half's four groups: weights 8i..8i + 8 of each,
            // from ql bytes 8i.. (groups 0, 2), 32 + 8i.. (groups 1, 3) and qh 8i...
            let ql_a = qword(q6_k::QL + 64 * half + 8 * i);
            let ql_b = qword(q6_k::QL + 64 * half + 32 + 8 * i);
            let qh = qword(q6_k::QH + 32 * half + 8 * i);
            // Low nibble | the two high bits moved to bits 4 and 5: A | (B & C).
            const OR_MASKED: i32 = 0xF8;
            let levels = [
                _mm512_ternarylogic_epi32::<OR_MASKED>(
                    _mm512_and_si512(ql_a, low4),
                    _mm512_slli_epi16::<4>(qh),
                    bits45,
                ),
                _mm512_ternarylogic_epi32::<OR_MASKED>(
                    _mm512_and_si512(ql_b, low4),
                    _mm512_slli_epi16::<2>(qh),
                    bits45,
                ),
                _mm512_ternarylogic_epi32::<OR_MASKED>(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql_a), low4),
                    qh,
                    bits45,
                ),
                _mm512_ternarylogic_epi32::<OR_MASKED>(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql_b), low4),
                    _mm512_srli_epi16::<2>(qh),
                    bits45,
                ),
            ];
            for (u, w) in levels.into_iter().enumerate() {
                let g = 4 * half + u;
                let scale = scale(2 * g + i / 2);
                for k in 0..NT {
                    // SAFETY: inside tile `k`'s super-block.
                    let xq = unsafe {
                        _mm512_loadu_si512(xs.as_ptr().add(k * SB_BYTES + (4 * g + i) * 64).cast())
                    };
                    let quad = _mm512_dpbusd_epi32(zero, w, xq);
                    ints[k][i] = _mm512_dpwssd_epi32(ints[k][i], quad, scale);
                }
            }
        }
    }
    for k in 0..NT {
        // SAFETY: inside the tile's super-block.
        let dx = unsafe { _mm512_loadu_ps(xs.as_ptr().add(k * SB_BYTES + DX).cast()) };
        let d = _mm512_mul_ps(dx, _mm512_set1_ps(dw));
        for i in 0..4 {
            acc[k][i] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(ints[k][i]), acc[k][i]);
        }
    }
}

/// Tile `k`'s token sums `y` (token `t` in element `2t`) to `out.0[(8k + t)·out.1 + r]`
/// for its real tokens (`8k + t < out.2`).
///
/// # Safety
/// The CPU has AVX-512 F; the writes are valid.
#[inline(always)]
unsafe fn put_tokens(
    y: __m512,
    k: usize,
    (out, out_stride, n_tokens): (*mut f32, usize, usize),
    r: usize,
) {
    let mut ys = [0f32; 16];
    // SAFETY: sixteen f32.
    unsafe { _mm512_storeu_ps(ys.as_mut_ptr(), y) };
    for t in 0..n_tokens.saturating_sub(k * WIDTH).min(WIDTH) {
        // SAFETY: the caller's contract on `out`.
        unsafe { *out.add((k * WIDTH + t) * out_stride + r) = ys[2 * t] };
    }
}

/// A tile's eight lane chains summed as the single-token kernel sums them,
/// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, token `t`'s in element `2t`; with
/// Q4_K's four min lanes, `(m0+m2)+(m1+m3)` added to that.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn token_sums(acc: &[__m512; 4], acc_min: Option<&[__m512; 2]>) -> __m512 {
    // Swap neighbouring elements: lane 2i + 1 of a token onto lane 2i.
    const SWAP_1: i32 = 0b10_11_00_01;
    let pair_sum = |s: __m512| _mm512_add_ps(s, _mm512_permute_ps::<SWAP_1>(s));
    let lanes = pair_sum(_mm512_add_ps(
        _mm512_add_ps(acc[0], acc[2]),
        _mm512_add_ps(acc[1], acc[3]),
    ));
    match acc_min {
        Some(m) => _mm512_add_ps(lanes, pair_sum(_mm512_add_ps(m[0], m[1]))),
        None => lanes,
    }
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
