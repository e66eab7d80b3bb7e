//! Narrow token tiles: 2 to 16 tokens, as one or two tiles of 2, 4 or 8 (padded to a
//! power of two) per 512-bit register, for batched decode steps and draft verification,
//! where too few tokens fill a sixteen-token tile of [`crate::tiled`].
//!
//! The wide tiles give a register one lane of sixteen tokens. With `T` tokens a
//! register holds `16 / T` lanes of `T` tokens each, so one `vpdpbusd` still forms
//! sixteen lane integers and one FMA advances sixteen float chains — each chain the
//! single-token kernel's own (same lane integers, same `d_w·d_x`, same order of blocks,
//! same final lane sum), so every output keeps the per-output kernel's bits whatever
//! `T` is and wherever the padding lies.
//!
//! The operands are swapped against the wide tiles: the weight is the unsigned one,
//! `w + 128`, and the activations stay signed, so the correction `−128·Σx` of each lane
//! belongs to the activations and is computed once per step in [`NarrowTiles::build`]
//! instead of once per weight block. Putting a weight block's lanes where the tile
//! wants them is then one `vpermd` per register. Weight blocks are read straight from
//! the mapped file and decoded in registers (Q4_0 / Q5_0 nibbles, fifth bits), with the
//! rows prefetched ahead as the single-token kernels do: with few tokens the pass is
//! bound by streaming the weights, and an unpacked copy would cost a store and a load
//! per block for nothing.

use std::arch::x86_64::*;

use nx_gguf::GgmlType;
use nx_syscalls::AlignedBytes;

use crate::block32_x86::{
    block_bytes as block_bytes_of, format_code, signed_quants, Q4_0, Q5_0, Q8_0,
};
use crate::formats::{f16_to_f32, q5_0, read_u32, Q8_0_BYTES};
use crate::transpose::{each_twice, eight_pairs};

/// Bytes of one 32-quant block of a narrow tile: the lane quads of every token
/// (`T / 2` registers of 64 bytes), the lane corrections `−128·Σx` (as many again),
/// then the token scales repeated to fill 64 bytes.
fn block_bytes(width: usize) -> usize {
    2 * (width / 2) * 64 + 64
}

/// Widest tile built: sixteen tokens would need 32 accumulator registers for a pair of
/// rows and spill, so 9 to 16 tokens are two tiles of at most eight (measured by
/// `benches/batched`: two passes of eight beat one of sixteen for every format).
const MAX_WIDTH: usize = 8;

/// Which activation rows a narrow layout holds: `n_tokens` of them from row `first`
/// (nothing when `n_tokens` is 0). Shared by the Q8_0 tiles here and the K formats' of
/// [`crate::narrow_k`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HeldTokens {
    pub(crate) first: usize,
    pub(crate) n_tokens: usize,
}

impl HeldTokens {
    /// True when these are all `n` rows.
    pub(crate) fn all_of(&self, n: usize) -> bool {
        self.first == 0 && self.n_tokens == n
    }

    /// How many rows are held when they start at row `t0` (none held, or held from
    /// elsewhere: `None`).
    pub(crate) fn from(&self, t0: usize) -> Option<usize> {
        (self.n_tokens > 0 && self.first == t0).then_some(self.n_tokens)
    }

    /// The rows `first..n` a narrow layout takes: two to sixteen whole rows of
    /// `row_bytes`, a whole number of `block_bytes` blocks each, within `rows_len`
    /// bytes; else `None`.
    pub(crate) fn span(
        first: usize,
        n: usize,
        (row_bytes, block_bytes, rows_len): (usize, usize, usize),
    ) -> Option<Self> {
        let n_tokens = n.saturating_sub(first);
        let fits = (2..=16).contains(&n_tokens)
            && row_bytes > 0
            && row_bytes.is_multiple_of(block_bytes)
            && rows_len >= n * row_bytes;
        fits.then_some(HeldTokens { first, n_tokens })
    }
}

/// One tile of a [`NarrowTiles`]: its width `T`, real tokens and bytes in `data`.
#[derive(Debug, Clone, Copy, Default)]
struct Tile {
    width: usize,
    n_tokens: usize,
    /// Offset of its first block in `NarrowTiles::data`.
    at: usize,
}

/// The quantized Q8_0 activations of up to sixteen tokens, laid out for the narrow
/// kernels (see the module docs) as one or two tiles of at most [`MAX_WIDTH`] tokens:
/// in a tile of `T`, token `t`, lane `l` sits in register `l / (16 / T)`, element
/// `t·(16 / T) + l % (16 / T)`: each token's lanes of a register lie side by side.
#[derive(Debug, Clone, Default)]
pub(crate) struct NarrowTiles {
    data: AlignedBytes,
    /// The tiles in token order (`n_tiles` of them hold tokens).
    tiles: [Tile; 2],
    n_tiles: usize,
    /// The real tokens (the rest of each tile is padding, whose outputs are never
    /// written).
    pub(crate) held: HeldTokens,
}

impl NarrowTiles {
    /// Forgets the contents (keeps the buffer).
    pub(crate) fn clear(&mut self) {
        self.n_tiles = 0;
        self.held = HeldTokens::default();
    }

    /// Lays out Q8_0 activation rows `first..n` of `rows` (`row_bytes` each); at most
    /// sixteen of them and at least two, else it leaves nothing.
    pub(crate) fn build(&mut self, rows: &[u8], first: usize, n: usize, row_bytes: usize) {
        self.clear();
        let Some(held) = HeldTokens::span(first, n, (row_bytes, Q8_0_BYTES, rows.len())) else {
            return;
        };
        let count = held.n_tokens;
        let n_blocks = row_bytes / Q8_0_BYTES;
        // Eight tokens, then the rest (one left over is padded to a tile of two).
        let counts = [count.min(MAX_WIDTH), count.saturating_sub(MAX_WIDTH)];
        self.data.clear();
        let mut token = first;
        for (i, &c) in counts.iter().enumerate().filter(|(_, &c)| c > 0) {
            let width = c.next_power_of_two().max(2);
            let at = self.data.len();
            // A tile without padding tokens has every byte written by `lay_out`; only
            // padding needs the zeroing (a pass over the tile on the step's serial path).
            match c == width {
                true => self.data.resize_reusing(at + n_blocks * block_bytes(width)),
                false => self.data.resize(at + n_blocks * block_bytes(width)),
            }
            let out = &mut self.data[at..];
            match c == MAX_WIDTH && crate::tiled::available() {
                // SAFETY: the CPU has AVX-512 F/BW/VL/VNNI and F16C (`available`).
                true => unsafe { lay_out_8(out, rows, token, row_bytes) },
                false => lay_out(out, rows, token, c, width, row_bytes),
            }
            self.tiles[i] = Tile {
                width,
                n_tokens: c,
                at,
            };
            self.n_tiles = i + 1;
            token += c;
        }
        self.held = held;
    }
}

/// One tile of `width` tokens: rows `first..first + count` of `rows` into `out` (`n_blocks`
/// tile blocks), every byte of the `count` tokens' lanes written; padding tokens' bytes are
/// left as they are (zeroed by the caller: zero quants, correction and scale).
fn lay_out(
    out: &mut [u8],
    rows: &[u8],
    first: usize,
    count: usize,
    width: usize,
    row_bytes: usize,
) {
    let bb = block_bytes(width);
    let nreg = width / 2;
    let per_reg = 16 / width;
    for (b, out) in out.chunks_exact_mut(bb).enumerate() {
        for t in 0..count {
            let at = (first + t) * row_bytes + b * Q8_0_BYTES;
            let xb = &rows[at..at + Q8_0_BYTES];
            let (quads, dx) = (&xb[2..], f16_to_f32(u16::from_le_bytes([xb[0], xb[1]])));
            for l in 0..8 {
                let e = (l / per_reg) * 16 + t * per_reg + l % per_reg;
                let quad = &quads[4 * l..4 * l + 4];
                out[4 * e..4 * e + 4].copy_from_slice(quad);
                let sum: i32 = quad.iter().map(|&q| q as i8 as i32).sum();
                let corr = 4 * (nreg * 16 + e);
                out[corr..corr + 4].copy_from_slice(&(-128 * sum).to_le_bytes());
            }
            for k in 0..per_reg {
                let at = 2 * nreg * 64 + 4 * (t * per_reg + k);
                out[at..at + 4].copy_from_slice(&dx.to_le_bytes());
            }
        }
    }
}

/// [`lay_out`] of a whole tile of eight tokens, in registers: per block, the eight
/// tokens' 32 quant bytes are an 8 × 4 transpose of 8-byte pairs of quads (token `t`'s
/// pair `i` is register `i`'s element pair `t`), the corrections one `vpdpbusd` of each
/// register against ones, the scales one conversion of the eight f16 scales. Same bytes
/// as [`lay_out`] (`the_eight_token_layout_is_the_scalar_ones`); on the serial path of
/// every decode step of eight or sixteen streams, where the scalar loop's per-quad copies
/// took about 1 % of a step's samples.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI and F16C.
///
/// # Panics
/// Unless `out` holds a tile of eight tokens for `row_bytes` and `rows` its eight rows
/// from row `first`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
unsafe fn lay_out_8(out: &mut [u8], rows: &[u8], first: usize, row_bytes: usize) {
    const W: usize = MAX_WIDTH;
    let (n_blocks, bb) = (row_bytes / Q8_0_BYTES, block_bytes(W));
    assert!(out.len() >= n_blocks * bb && rows.len() >= (first + W) * row_bytes);
    // SAFETY: every load lies in the eight rows' block `b` and every store in the tile's
    // block `b` (asserted above); the features per the caller's contract.
    unsafe {
        let ones = _mm512_set1_epi8(1);
        for b in 0..n_blocks {
            let block = rows.as_ptr().add(first * row_bytes + b * Q8_0_BYTES);
            let regs = eight_pairs(block.add(2), row_bytes);
            let tile = out.as_mut_ptr().add(b * bb);
            for (i, &r) in regs.iter().enumerate() {
                _mm512_storeu_si512(tile.add(64 * i) as *mut _, r);
                let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, r);
                let corr = _mm512_mullo_epi32(sums, _mm512_set1_epi32(-128));
                _mm512_storeu_si512(tile.add(64 * (W / 2 + i)) as *mut _, corr);
            }
            let scale = |t: usize| (block.add(t * row_bytes) as *const i16).read_unaligned();
            let bits: [i16; 8] = std::array::from_fn(scale);
            let bits = _mm_loadu_si128(bits.as_ptr() as *const _);
            let dx = _mm512_castps256_ps512(_mm256_cvtph_ps(bits));
            _mm512_storeu_ps(tile.add(64 * W) as *mut f32, each_twice(dx));
        }
    }
}

/// Weight types the narrow kernels take (with Q8_0 activations).
pub(crate) fn has_kernel(weight_type: GgmlType) -> bool {
    matches!(
        weight_type,
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0
    )
}

/// Whether a single group of sixteen tokens goes through the narrow tiles (two passes
/// of eight) rather than the wide ones for weights of `weight_type`. Q8_0 does: read
/// straight from the file, its rows need no unpacking, and the wide tiles' unpacked copy
/// costs a store and a load per block for one group's use (`benches/batched`, the
/// Gemma 3 LM head at sixteen tokens, AMD EPYC family 25 model 17: 7.5 GiB/s narrow,
/// 6.3 wide). Q5_0 and Q4_0 do not: two passes decode their nibbles twice (Q5_0
/// 640×2048: 4.2 GiB/s narrow, 5.2 wide).
pub(crate) fn takes_group(weight_type: GgmlType) -> bool {
    weight_type == GgmlType::Q8_0
}

/// For the tokens of `tiles` and every row of `w_rows` (`row_bytes` each, of
/// `weight_type`), computes the dot products — the single-token kernel's bits — and
/// writes row `r`'s output for token `t` (`t` counted from `tiles.held.first`, rows from
/// the start of `w_rows`) to `out_ptr[t·out_stride + r]`.
///
/// # Safety
/// [`crate::tiled::available`] must be true, [`has_kernel`] true for `weight_type`,
/// and `tiles` built from Q8_0 activations of the weight's row length; `out_ptr` must
/// be valid for writes at every such index (`t < tiles.held.n_tokens`), with no other
/// thread accessing them during the call.
pub(crate) unsafe fn run(
    weight_type: GgmlType,
    w_rows: &[u8],
    row_bytes: usize,
    tiles: &NarrowTiles,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    if tiles.held.n_tokens == 0 || w_rows.len() < row_bytes || row_bytes == 0 {
        return;
    }
    let mut t0 = 0;
    for part in &tiles.tiles[..tiles.n_tiles] {
        let data = &tiles.data[part.at..];
        let n_blocks = row_bytes_blocks(weight_type, row_bytes);
        let args = (
            w_rows,
            row_bytes,
            &data[..n_blocks * block_bytes(part.width)],
            part.n_tokens,
        );
        let out = out_ptr.wrapping_add(t0 * out_stride);
        macro_rules! widths {
            ($fmt:expr) => {
                // SAFETY: the caller guarantees the CPU features and the output range
                // (this tile's tokens start `t0` token rows in); `w_rows` holds whole
                // rows of the tiles' block count.
                unsafe {
                    match part.width {
                        2 => tile::<2, { $fmt }>(args, out, out_stride),
                        4 => tile::<4, { $fmt }>(args, out, out_stride),
                        _ => tile::<8, { $fmt }>(args, out, out_stride),
                    }
                }
            };
        }
        match format_code(weight_type) {
            Some(Q8_0) => widths!(Q8_0),
            Some(Q4_0) => widths!(Q4_0),
            Some(Q5_0) => widths!(Q5_0),
            _ => {}
        }
        t0 += part.n_tokens;
    }
}

/// Blocks of 32 quants in a weight row of `row_bytes` bytes of `weight_type`.
fn row_bytes_blocks(weight_type: GgmlType, row_bytes: usize) -> usize {
    format_code(weight_type).map_or(0, |f| row_bytes / block_bytes_of(f))
}

/// A weight block's 32 quants plus 128 as unsigned bytes (the signed quants of
/// [`signed_quants`] with the sign bit flipped) and `d_w`, decoded with AVX-512 BW: the
/// centring folds into the flip (Q4_0 `n + 120`, Q5_0 `n + 16·h + 112`) and Q5_0's fifth
/// bits are one masked add.
///
/// # Safety
/// The CPU has AVX-512 BW/VL and F16C; `wb` holds a whole block of `FMT` (asserted).
#[inline(always)]
unsafe fn unsigned_quants<const FMT: u8>(wb: &[u8]) -> (__m256i, f32) {
    if FMT == Q8_0 {
        // SAFETY: forwarded contract.
        let (q, dw) = unsafe { signed_quants::<FMT>(wb) };
        return (_mm256_xor_si256(q, _mm256_set1_epi8(0x80u8 as i8)), dw);
    }
    assert!(wb.len() >= block_bytes_of(FMT));
    // SAFETY: every read is inside the block (asserted); the features per the contract.
    unsafe {
        let p = wb.as_ptr();
        let bits = std::ptr::read_unaligned(p as *const u16);
        let dw = crate::avx2::f16_bits_to_f32(bits);
        let qs_at = if FMT == Q5_0 { q5_0::QS } else { 2 };
        let qs = _mm_loadu_si128(p.add(qs_at) as *const __m128i);
        let low4 = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(qs, low4);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
        let n = _mm256_set_m128i(hi, lo);
        if FMT == Q4_0 {
            return (_mm256_add_epi8(n, _mm256_set1_epi8(120)), dw);
        }
        let centred = _mm256_add_epi8(n, _mm256_set1_epi8(112));
        let qh = read_u32(wb, q5_0::QH);
        (
            _mm256_mask_add_epi8(centred, qh, centred, _mm256_set1_epi8(16)),
            dw,
        )
    }
}

/// The weight lane that element `e` of register `i` takes in a tile of `width` tokens:
/// a register holds `16 / width` consecutive lanes, repeated once per token.
const fn lane_index(width: usize) -> [[i32; 16]; 8] {
    let mut idx = [[0i32; 16]; 8];
    let per_reg = 16 / width;
    let mut i = 0;
    while i < 8 {
        let mut e = 0;
        while e < 16 {
            idx[i][e] = (i * per_reg + e % per_reg) as i32;
            e += 1;
        }
        i += 1;
    }
    idx
}

static LANE_INDEX: [[[i32; 16]; 8]; 3] = [lane_index(2), lane_index(4), lane_index(8)];

/// One row's lane registers summed as the single-token kernels sum their eight lanes,
/// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, for the `T` tokens: token `t`'s sum in
/// element `t·16/T` of the result.
///
/// # Safety
/// Only inlined into functions enabling AVX-512 F.
#[inline(always)]
pub(crate) unsafe fn lanes_sum<const T: usize>(a: &[__m512]) -> __m512 {
    // Within a token's run of `16 / T` elements: swap neighbours (1 ↔ 0), pairs of
    // neighbours (2,3 ↔ 0,1) and, for two tokens, the 128-bit halves of its 256 bits.
    const SWAP_1: i32 = 0b10_11_00_01;
    const SWAP_2: i32 = 0b01_00_11_10;
    // SAFETY (features): the caller's contract.
    unsafe {
        match T {
            // Register i: lanes 2i, 2i+1 of token t in elements 2t, 2t+1.
            8 => {
                let s = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
                _mm512_add_ps(s, _mm512_permute_ps::<SWAP_1>(s))
            }
            // Register i: lanes 4i..4i+4 of token t in elements 4t..4t+4.
            4 => {
                let s = _mm512_add_ps(a[0], a[1]);
                let s = _mm512_add_ps(s, _mm512_permute_ps::<SWAP_2>(s));
                _mm512_add_ps(s, _mm512_permute_ps::<SWAP_1>(s))
            }
            // One register: lanes 0..8 of token t in elements 8t..8t+8.
            _ => {
                let s = _mm512_add_ps(a[0], _mm512_shuffle_f32x4::<SWAP_1>(a[0], a[0]));
                let s = _mm512_add_ps(s, _mm512_permute_ps::<SWAP_2>(s));
                _mm512_add_ps(s, _mm512_permute_ps::<SWAP_1>(s))
            }
        }
    }
}

/// A weight block's `T / 2` lane registers (`w + 128`, decoded in registers by
/// [`unsigned_quants`], then placed by one `vpermd` each) and `d_w`. (For Q8_0,
/// broadcasting each register's bytes from memory and flipping their sign bits instead
/// measured 2–6 % slower on one thread in cache, Q8_0 640×2048, 2 to 8 tokens.)
///
/// # Safety
/// As [`unsigned_quants`]; AVX-512 F as well.
#[inline(always)]
unsafe fn block_lanes<const T: usize, const FMT: u8>(
    wb: &[u8],
    idx: &[__m512i; 8],
) -> ([__m512i; 4], f32) {
    // SAFETY: forwarded contract.
    let (wu, dw) = unsafe { unsigned_quants::<FMT>(wb) };
    let wu = _mm512_castsi256_si512(wu);
    let mut regs = [_mm512_setzero_si512(); 4];
    for (reg, idx) in regs.iter_mut().zip(idx).take(T / 2) {
        *reg = _mm512_permutexvar_epi32(*idx, wu);
    }
    (regs, dw)
}

/// The weight rows `w` (`row_bytes` each, blocks of format `FMT`) against a narrow
/// tile of `T` tokens, of which the first `n_tokens` are written: row `r`, token `t` to
/// `out[t·out_stride + r]`. Rows go four at a time under eight tokens, two at a time at
/// eight (more would spill), then the rest in pairs and one by one, so the tile's
/// registers are loaded once for each group of rows.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI and F16C; every row of `w` holds as many blocks as
/// `x` has tile blocks of width `T`; `out` is valid for those writes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,fma,f16c")]
unsafe fn tile<const T: usize, const FMT: u8>(
    (w, row_bytes, x, n_tokens): (&[u8], usize, &[u8], usize),
    out: *mut f32,
    out_stride: usize,
) {
    let n_blocks = x.len() / block_bytes(T);
    let rows = w.len() / row_bytes;
    assert!(rows >= 1 && row_bytes >= n_blocks * block_bytes_of(FMT));
    assert!(n_tokens <= T);
    let table = &LANE_INDEX[T.trailing_zeros() as usize - 1];
    let mut idx = [_mm512_setzero_si512(); 8];
    for (reg, lanes) in idx.iter_mut().zip(table) {
        // SAFETY: sixteen i32.
        *reg = unsafe { _mm512_loadu_si512(lanes.as_ptr() as *const _) };
    }
    let args = (x, n_blocks, &idx);
    let mut r = 0;
    while r < rows {
        let block = &w[r * row_bytes..];
        let mut sums = [_mm512_setzero_ps(); 4];
        // SAFETY: whole rows from `r` on (`rows` counts them), the features per this
        // function's contract.
        let n = unsafe {
            if T < 8 && rows - r >= 4 {
                row_sums::<T, FMT, 4>(block, row_bytes, args, &mut sums);
                4
            } else if rows - r >= 2 {
                row_sums::<T, FMT, 2>(block, row_bytes, args, &mut sums);
                2
            } else {
                row_sums::<T, FMT, 1>(block, row_bytes, args, &mut sums);
                1
            }
        };
        for (k, sum) in sums.iter().enumerate().take(n) {
            let mut y = [0f32; 16];
            // SAFETY: sixteen f32.
            unsafe { _mm512_storeu_ps(y.as_mut_ptr(), *sum) };
            for t in 0..n_tokens {
                // SAFETY: the caller's contract on `out`.
                unsafe { *out.add(t * out_stride + r + k) = y[t * (16 / T)] };
            }
        }
        r += n;
    }
}

/// `R` consecutive weight rows (from the start of `w`, `row_bytes` apart) against the
/// tile `x` of `n_blocks` blocks: row `k`'s [`lanes_sum`] into `sums[k]`.
///
/// # Safety
/// As [`tile`], with `R` whole rows in `w`.
#[inline(always)]
unsafe fn row_sums<const T: usize, const FMT: u8, const R: usize>(
    w: &[u8],
    row_bytes: usize,
    (x, n_blocks, idx): (&[u8], usize, &[__m512i; 8]),
    sums: &mut [__m512; 4],
) {
    let nreg = T / 2;
    let bb = block_bytes(T);
    let wb_bytes = block_bytes_of(FMT);
    assert!(w.len() >= (R - 1) * row_bytes + n_blocks * wb_bytes);
    assert!(x.len() >= n_blocks * bb);
    let mut acc = [[_mm512_setzero_ps(); 8]; R];
    for b in 0..n_blocks {
        let xt = x[b * bb..].as_ptr();
        // SAFETY (loads): inside the tile block of `bb` bytes (asserted above).
        let (dx, xq, xc) = unsafe {
            let mut xq = [_mm512_setzero_si512(); 4];
            let mut xc = [_mm512_setzero_si512(); 4];
            for i in 0..nreg {
                xq[i] = _mm512_loadu_si512(xt.add(64 * i) as *const _);
                xc[i] = _mm512_loadu_si512(xt.add(64 * (nreg + i)) as *const _);
            }
            (_mm512_loadu_ps(xt.add(128 * nreg) as *const f32), xq, xc)
        };
        for (k, acc) in acc.iter_mut().enumerate() {
            let row = &w[k * row_bytes..(k + 1) * row_bytes];
            // Every row is read once per step: stream ahead, as decoding does.
            crate::avx2::prefetch_block(row, b * wb_bytes, wb_bytes, R);
            // SAFETY: inside the row's blocks (asserted above); the caller's features.
            unsafe {
                // w + 128 as unsigned bytes: Σ(w+128)·x − 128·Σx = Σ w·x exactly.
                let (wl, dw) = block_lanes::<T, FMT>(&row[b * wb_bytes..], idx);
                let d = _mm512_mul_ps(_mm512_set1_ps(dw), dx);
                for i in 0..nreg {
                    let lane = _mm512_dpbusd_epi32(xc[i], wl[i], xq[i]);
                    acc[i] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lane), acc[i]);
                }
            }
        }
    }
    for (sum, acc) in sums.iter_mut().zip(&acc) {
        // SAFETY: the caller's features.
        *sum = unsafe { lanes_sum::<T>(acc) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` tokens of `n_blocks` Q8_0 blocks, every byte from `seed` (scales included).
    fn token_rows(n: usize, n_blocks: usize, seed: u8) -> Vec<u8> {
        (0..n * n_blocks * Q8_0_BYTES)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn the_eight_token_layout_is_the_scalar_ones() {
        if !crate::tiled::available() {
            return;
        }
        for (n_blocks, n_rows, first) in [(1, 8, 0), (3, 8, 0), (20, 11, 2), (7, 16, 8)] {
            let row_bytes = n_blocks * Q8_0_BYTES;
            let mut rows = token_rows(n_rows, n_blocks, 3);
            // Scales of every magnitude but no NaN (activations' scales are never NaN).
            for (i, row) in rows.chunks_exact_mut(Q8_0_BYTES).enumerate() {
                row[..2].copy_from_slice(
                    &crate::formats::f32_to_f16(i as f32 * 0.37 - 5.0).to_le_bytes(),
                );
            }
            let len = n_blocks * block_bytes(8);
            let (mut scalar, mut simd) = (vec![0u8; len], vec![0xAAu8; len]);
            lay_out(&mut scalar, &rows, first, 8, 8, row_bytes);
            // SAFETY: the CPU has the features (`tiled::available`).
            unsafe { lay_out_8(&mut simd, &rows, first, row_bytes) };
            assert!(scalar == simd, "{n_blocks} blocks from row {first}");
        }
    }

    #[test]
    fn a_build_over_an_old_layout_gives_a_fresh_build() {
        // Every token count (full tiles skip the zeroing, padded ones keep it), each
        // built over a layout of other bytes and of every other count.
        let n_blocks = 3;
        let row_bytes = n_blocks * Q8_0_BYTES;
        // (The layouts hold two to sixteen tokens.)
        for n in 2..=16 {
            let rows = token_rows(n, n_blocks, 7);
            let mut fresh = NarrowTiles::default();
            fresh.build(&rows, 0, n, row_bytes);
            for old in 2..=16 {
                let mut used = NarrowTiles::default();
                used.build(&token_rows(old, n_blocks, 200), 0, old, row_bytes);
                used.build(&rows, 0, n, row_bytes);
                assert!(used.data[..] == fresh.data[..], "{n} tokens over {old}");
            }
        }
    }

    #[test]
    fn tile_bytes_cover_quads_corrections_and_scales() {
        assert_eq!(block_bytes(16), 8 * 64 * 2 + 64);
        assert_eq!(block_bytes(2), 64 * 2 + 64);
    }

    #[test]
    fn build_places_each_lane_once_and_pads_with_zero() {
        // Three tokens of one block: token t's quant k is t·32 + k (as i8).
        let mut rows = vec![0u8; 3 * Q8_0_BYTES];
        for t in 0..3 {
            let xb = &mut rows[t * Q8_0_BYTES..(t + 1) * Q8_0_BYTES];
            xb[..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // 1.0
            for k in 0..32 {
                xb[2 + k] = (t * 32 + k) as u8;
            }
        }
        let mut tiles = NarrowTiles::default();
        tiles.build(&rows, 0, 3, Q8_0_BYTES);
        assert_eq!(
            (
                tiles.n_tiles,
                tiles.tiles[0].width,
                tiles.held.n_tokens,
                tiles.held.first
            ),
            (1, 4, 3, 0)
        );
        let d = &tiles.data;
        let dword = |e: usize| &d[4 * e..4 * e + 4];
        // Register 1 holds lanes 4..8; lane 5 of token 2 is element 16 + 2·4 + 1.
        assert_eq!(dword(16 + 2 * 4 + 1), &[84, 85, 86, 87]);
        // Token 3 is padding: zero quants, zero correction, zero scale.
        assert_eq!(dword(3 * 4), &[0, 0, 0, 0]);
        let corr =
            |e: usize| i32::from_le_bytes(d[4 * (32 + e)..4 * (32 + e) + 4].try_into().unwrap());
        assert_eq!(corr(16 + 2 * 4 + 1), -128 * (84 + 85 + 86 + 87));
        assert_eq!(corr(3 * 4), 0);
        let scale =
            |e: usize| f32::from_le_bytes(d[256 + 4 * e..256 + 4 * e + 4].try_into().unwrap());
        // Token t's scale fills elements 4t..4t+4.
        assert_eq!(
            (scale(2 * 4), scale(3 * 4), scale(2 * 4 + 3)),
            (1.0, 0.0, 1.0)
        );
        // One token or more than sixteen: nothing.
        tiles.build(&rows, 2, 3, Q8_0_BYTES);
        assert_eq!(tiles.held, HeldTokens::default());
    }
}
