//! The wide tiles' activations: the quantized rows of sixteen tokens interleaved lane by
//! lane ([`ActTiles`]), the layout both [`crate::tiled`]'s VNNI kernels and
//! [`crate::amx`]'s tile kernels read.
//!
//! Kept apart from both so that neither kernel module depends on the other for the
//! layout: `tiled` chooses and calls the AMX kernels, and both read these offsets.

use std::arch::x86_64::*;
use std::ops::Range;

use nx_gguf::GgmlType;
use nx_syscalls::{AlignedBytes, ThreadPool};

use crate::formats::{f16_to_f32, q8_1, q8_k, read_f16, read_i16, Q8_0_BYTES, Q8_K_BYTES, QK_K};

/// Tokens per tile: one per f32 / i32 element of a 512-bit register.
pub(crate) const TILE: usize = 16;

/// The fewest tokens after the whole groups that get a padded group of their own (see
/// [`ActTiles::groups_for`]).
pub(crate) const PAD_FROM: usize = 8;

/// Bytes of one 32-quant block of a tile: lane quads (8 × 16 tokens × 4) then the
/// sixteen block scales (f32).
pub(crate) const ACT32_BLOCK: usize = 8 * 64 + 64;
/// Bytes of one 32-quant block of a Q8_1 tile: as [`ACT32_BLOCK`], then the sixteen
/// `s_x = d_x·Σx` (f32) the offset formats' `m_w·s_x` takes.
pub(crate) const ACT81_BLOCK: usize = ACT32_BLOCK + 64;
pub(crate) const ACT81_SUM: usize = ACT32_BLOCK;
/// Bytes of one super-block of a Q8_K tile: eight 32-quant groups of lane quads, the
/// scales, the min pairs `(s[2m], s[2m+1])` of 32-quant sums (4 × 16 dwords) and the
/// bsum pairs `(b[2l], b[2l+1])` (8 × 16 dwords).
pub(crate) const ACTK_BLOCK: usize = 8 * 512 + 64 + 4 * 64 + 8 * 64;
pub(crate) const ACTK_DX: usize = 8 * 512;
pub(crate) const ACTK_MINS: usize = ACTK_DX + 64;
pub(crate) const ACTK_BSUMS: usize = ACTK_MINS + 4 * 64;

/// Quantized activations of groups of [`TILE`] tokens, interleaved for the tiled
/// kernels (see the module docs): the whole groups, and for Q8_K and Q8_1 a last group
/// of at least [`PAD_FROM`] tokens padded with zero blocks (their outputs are never
/// written). Other tokens past the last whole group are not included.
#[derive(Debug, Clone, Default)]
pub(crate) struct ActTiles {
    data: AlignedBytes,
    n_groups: usize,
    /// Real tokens held (the rest of the last group is padding).
    n_tokens: usize,
    group_bytes: usize,
    /// Q8_K quants as they are, for the AMX kernels (else `x + 128`, for the VNNI ones).
    raw_k: bool,
}

impl ActTiles {
    /// Number of token groups held.
    pub(crate) fn n_groups(&self) -> usize {
        self.n_groups
    }

    /// Real tokens held: `n_groups()·16`, or fewer when the last group is padded.
    pub(crate) fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// Real tokens of group `g`.
    pub(crate) fn group_tokens(&self, g: usize) -> usize {
        (self.n_tokens - g * TILE).min(TILE)
    }

    /// Token groups [`ActTiles::build`] makes of `n` tokens of `act_type`: the whole
    /// ones, plus a padded one for Q8_K and Q8_1 when at least [`PAD_FROM`] tokens are
    /// left after at least one whole group. Those leftovers would go through the
    /// four-token kernels, which cost about twice the tiles per token once the unpacked
    /// weight rows serve several groups (`NX_PLAN=retune nx bench --show-plan`, Q4_K:
    /// 30.8 against 65.5 GB·tok/s on AMD EPYC family 25 model 17), so from half a group
    /// on the padded group is cheaper. A lone partial group is not padded: unpacking the
    /// rows for it alone cost more than it saved (batched decode steps of 8 and 12
    /// sequences, `nx bench --parallel 8,12`, means of three alternating runs: 275 and
    /// 299 tok/s padded, 305 and 320 not). Q8_0's leftovers take the narrow tiles instead.
    pub(crate) fn groups_for(act_type: GgmlType, n: usize) -> usize {
        let padded = act_type != GgmlType::Q8_0 && n > TILE && n % TILE >= PAD_FROM;
        n / TILE + padded as usize
    }

    /// True when Q8_K groups hold the raw quants (the AMX layout).
    pub(crate) fn raw_k(&self) -> bool {
        self.raw_k
    }

    /// Forgets the contents (keeps the buffer).
    pub(crate) fn clear(&mut self) {
        self.n_groups = 0;
        self.n_tokens = 0;
        self.group_bytes = 0;
        self.raw_k = false;
    }

    /// Interleaves the whole groups of `n` quantized rows of `row_bytes` each from
    /// `rows` (`act_type` Q8_0 or Q8_K; anything else leaves no groups), the groups
    /// spread over `pool` when one is given. `raw_k` lays Q8_K groups out as the AMX
    /// kernels read them (the caller grants it only when the CPU can run those).
    pub(crate) fn build(
        &mut self,
        act_type: GgmlType,
        rows: &[u8],
        n: usize,
        row_bytes: usize,
        raw_k: bool,
        pool: Option<&ThreadPool>,
    ) {
        self.clear();
        let Some((src_block, tile_block)) = block_bytes(act_type) else {
            return;
        };
        let n_groups = Self::groups_for(act_type, n);
        if n_groups == 0 || row_bytes == 0 || rows.len() < n * row_bytes {
            return;
        }
        // The padding tokens' rows: zero quants and scales.
        let zeros = vec![0u8; if n_groups * TILE > n { row_bytes } else { 0 }];
        let n_blocks = row_bytes / src_block;
        let group_bytes = n_blocks * tile_block;
        // The AMX kernels multiply the raw (signed) quants; the VNNI ones `x + 128`.
        let raw_k = raw_k && act_type == GgmlType::Q8_K;
        self.raw_k = raw_k;
        self.group_bytes = group_bytes;
        self.n_groups = n_groups;
        self.n_tokens = n.min(n_groups * TILE);
        // `fill` writes every byte of every group (padding tokens from `zeros`), so the
        // buffer's old bytes need no zeroing pass (on a decode step's serial path).
        self.data.resize_reusing(n_groups * group_bytes);
        let simd = act_type != GgmlType::Q8_1 && crate::avx512::available();
        let fill = |groups: Range<usize>, tiles: &mut [u8]| {
            for (g, tile) in groups.zip(tiles.chunks_exact_mut(group_bytes)) {
                if simd && (g + 1) * TILE <= n {
                    let rows = &rows[g * TILE * row_bytes..(g + 1) * TILE * row_bytes];
                    // SAFETY: the CPU has AVX-512 F/BW and F16C (`avx512::available`).
                    unsafe { interleave_group(act_type, rows, row_bytes, tile, raw_k) };
                    continue;
                }
                for t in 0..TILE {
                    let token = g * TILE + t;
                    let row = match token < n {
                        true => &rows[token * row_bytes..(token + 1) * row_bytes],
                        false => &zeros[..],
                    };
                    for (xb, out) in row
                        .chunks_exact(src_block)
                        .zip(tile.chunks_exact_mut(tile_block))
                    {
                        if act_type == GgmlType::Q8_0 {
                            interleave_q8_0(xb, out, t);
                        } else if act_type == GgmlType::Q8_1 {
                            interleave_q8_1(xb, out, t);
                        } else {
                            interleave_q8_k(xb, out, t, raw_k);
                        }
                    }
                }
            }
        };
        match pool {
            Some(pool) if pool.n_threads() > 1 && n_groups > 1 => {
                let chunk = n_groups.div_ceil(pool.n_threads() * 2);
                pool.parallel_chunks_mut(
                    &mut self.data,
                    group_bytes,
                    chunk,
                    &mut vec![(); pool.n_threads()],
                    |_, groups, tiles| fill(groups, tiles),
                );
            }
            _ => fill(0..n_groups, &mut self.data),
        }
    }

    /// The interleaved bytes of token group `g`.
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        &self.data[g * self.group_bytes..(g + 1) * self.group_bytes]
    }
}

/// Bytes of one block of `act_type` activations and of its slots in a tile group;
/// `None` for types without tiles.
fn block_bytes(act_type: GgmlType) -> Option<(usize, usize)> {
    match act_type {
        GgmlType::Q8_0 => Some((Q8_0_BYTES, ACT32_BLOCK)),
        GgmlType::Q8_1 => Some((q8_1::BYTES, ACT81_BLOCK)),
        GgmlType::Q8_K => Some((Q8_K_BYTES, ACTK_BLOCK)),
        _ => None,
    }
}

/// Sixteen tokens' Q8_0 or Q8_K rows (`rows`, `row_bytes` apart) into a whole group
/// `tile`, in registers: each 32-byte run of quants (and Q8_K's sixteen bsums) is a 16 × 8
/// transpose of quads ([`crate::transpose::transpose_quads`]), the scales one load or
/// conversion of sixteen, Q8_K's min pairs two word sums of the bsum registers. Same bytes
/// as the per-token [`interleave_q8_0`] / [`interleave_q8_k`]
/// (`the_group_interleave_is_the_per_token_one`); a decode step of sixteen streams builds
/// its one group on the calling thread, where the byte loops took 2 % of its samples.
///
/// # Safety
/// The CPU has AVX-512 F/BW and F16C.
///
/// # Panics
/// Unless `act_type` is Q8_0 or Q8_K, `rows` holds sixteen rows of `row_bytes` and `tile`
/// a group of them.
#[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
unsafe fn interleave_group(
    act_type: GgmlType,
    rows: &[u8],
    row_bytes: usize,
    tile: &mut [u8],
    raw_k: bool,
) {
    let Some((src_block, tile_block)) =
        block_bytes(act_type).filter(|_| act_type != GgmlType::Q8_1)
    else {
        panic!("interleave_group: {act_type:?} activations");
    };
    let n_blocks = row_bytes / src_block;
    assert!(rows.len() >= TILE * row_bytes && tile.len() >= n_blocks * tile_block);
    // SAFETY: every load lies in one of the sixteen rows' block `b` and every store in
    // the tile's block `b` (asserted above); the features per the caller's contract.
    unsafe {
        let (p, o) = (rows.as_ptr(), tile.as_mut_ptr());
        let store = |at: usize, v: __m512i| _mm512_storeu_si512(o.add(at) as *mut _, v);
        let flip = _mm512_set1_epi8(0x80u8 as i8);
        for b in 0..n_blocks {
            let (xb, out) = (p.add(b * src_block), b * tile_block);
            if act_type == GgmlType::Q8_0 {
                let quads = crate::transpose::transpose_quads(xb.add(2), row_bytes);
                for (l, &q) in quads.iter().enumerate() {
                    store(out + 64 * l, _mm512_xor_si512(q, flip));
                }
                let bits: [i16; TILE] =
                    std::array::from_fn(|t| (xb.add(t * row_bytes) as *const i16).read_unaligned());
                let dx = _mm512_cvtph_ps(_mm256_loadu_si256(bits.as_ptr() as *const _));
                _mm512_storeu_ps(o.add(out + 512) as *mut f32, dx);
                continue;
            }
            let bias = if raw_k { _mm512_setzero_si512() } else { flip };
            for g in 0..8 {
                let quads = crate::transpose::transpose_quads(xb.add(q8_k::QS + 32 * g), row_bytes);
                for (l, &q) in quads.iter().enumerate() {
                    store(out + 512 * g + 64 * l, _mm512_xor_si512(q, bias));
                }
            }
            let d: [f32; TILE] =
                std::array::from_fn(|t| (xb.add(t * row_bytes) as *const f32).read_unaligned());
            _mm512_storeu_ps(
                o.add(out + ACTK_DX) as *mut f32,
                _mm512_loadu_ps(d.as_ptr()),
            );
            // Lane `t` of bsum register `l`: token `t`'s pair `(b[2l], b[2l + 1])`; the
            // min pair `m` is the word sums of registers `2m` and `2m + 1`, low and high.
            let bsums = crate::transpose::transpose_quads(xb.add(q8_k::BSUMS), row_bytes);
            for (l, &s) in bsums.iter().enumerate() {
                store(out + ACTK_BSUMS + 64 * l, s);
            }
            let ones = _mm512_set1_epi16(1);
            for m in 0..4 {
                let lo = _mm512_madd_epi16(bsums[2 * m], ones);
                let hi = _mm512_madd_epi16(bsums[2 * m + 1], ones);
                let pair = _mm512_or_si512(
                    _mm512_and_si512(lo, _mm512_set1_epi32(0xffff)),
                    _mm512_slli_epi32::<16>(hi),
                );
                store(out + ACTK_MINS + 64 * m, pair);
            }
        }
    }
}

/// Token `t`'s Q8_0 block `xb` into its slots of a tile block.
fn interleave_q8_0(xb: &[u8], out: &mut [u8], t: usize) {
    for l in 0..8 {
        for k in 0..4 {
            out[64 * l + 4 * t + k] = xb[2 + 4 * l + k] ^ 0x80;
        }
    }
    let dx = f16_to_f32(u16::from_le_bytes([xb[0], xb[1]]));
    out[512 + 4 * t..512 + 4 * t + 4].copy_from_slice(&dx.to_le_bytes());
}

/// Token `t`'s Q8_1 block `xb` into its slots of a tile block: as Q8_0's, then `s_x`.
fn interleave_q8_1(xb: &[u8], out: &mut [u8], t: usize) {
    for l in 0..8 {
        for k in 0..4 {
            out[64 * l + 4 * t + k] = xb[q8_1::QS + 4 * l + k] ^ 0x80;
        }
    }
    put_f32(out, 512 + 4 * t, read_f16(xb, 0));
    put_f32(out, ACT81_SUM + 4 * t, read_f16(xb, q8_1::S));
}

/// Token `t`'s Q8_K super-block `xb` into its slots of a tile super-block: the quants
/// as they are (`raw`, for [`crate::amx`]) or as `x + 128`.
fn interleave_q8_k(xb: &[u8], out: &mut [u8], t: usize, raw: bool) {
    let qs = &xb[q8_k::QS..q8_k::QS + QK_K];
    let bias = if raw { 0 } else { 0x80 };
    for g in 0..8 {
        for l in 0..8 {
            for k in 0..4 {
                out[512 * g + 64 * l + 4 * t + k] = qs[32 * g + 4 * l + k] ^ bias;
            }
        }
    }
    out[ACTK_DX + 4 * t..ACTK_DX + 4 * t + 4].copy_from_slice(&xb[0..4]);
    let bsum = |j: usize| read_i16(xb, q8_k::BSUMS + 2 * j);
    for m in 0..4 {
        // Sums of 32 quants (|Σ| ≤ 4096) fit i16, as the scalar twin's pair sums.
        let lo = bsum(4 * m) + bsum(4 * m + 1);
        let hi = bsum(4 * m + 2) + bsum(4 * m + 3);
        put_pair(out, ACTK_MINS + 64 * m + 4 * t, lo, hi);
    }
    for l in 0..8 {
        put_pair(
            out,
            ACTK_BSUMS + 64 * l + 4 * t,
            bsum(2 * l),
            bsum(2 * l + 1),
        );
    }
}

/// Two i16 as one little-endian dword (the word pairs `vpdpwssd` multiplies).
pub(crate) fn put_pair(out: &mut [u8], at: usize, lo: i16, hi: i16) {
    out[at..at + 2].copy_from_slice(&lo.to_le_bytes());
    out[at + 2..at + 4].copy_from_slice(&hi.to_le_bytes());
}

pub(crate) fn put_i32(out: &mut [u8], at: usize, v: i32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_f32(out: &mut [u8], at: usize, v: f32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-token byte loops for the whole groups of `n` rows (the reference).
    fn per_token(
        act_type: GgmlType,
        rows: &[u8],
        n: usize,
        row_bytes: usize,
        raw: bool,
    ) -> Vec<u8> {
        let (src_block, tile_block) = block_bytes(act_type).unwrap();
        let group_bytes = row_bytes / src_block * tile_block;
        let mut out = vec![0u8; n / TILE * group_bytes];
        for (g, tile) in out.chunks_exact_mut(group_bytes).enumerate() {
            for t in 0..TILE {
                let row = &rows[(g * TILE + t) * row_bytes..][..row_bytes];
                for (xb, o) in row
                    .chunks_exact(src_block)
                    .zip(tile.chunks_exact_mut(tile_block))
                {
                    match act_type {
                        GgmlType::Q8_0 => interleave_q8_0(xb, o, t),
                        _ => interleave_q8_k(xb, o, t, raw),
                    }
                }
            }
        }
        out
    }

    #[test]
    fn the_group_interleave_is_the_per_token_one() {
        if !crate::avx512::available() {
            return;
        }
        // Two whole groups and a padded third (Q8_K), quantized from values of every
        // spread, built over a buffer of other bytes.
        let n = 2 * TILE + 9;
        for (act_type, row_len) in [(GgmlType::Q8_0, 160), (GgmlType::Q8_K, 512)] {
            let x: Vec<f32> = (0..n * row_len)
                .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.01 * (1 + i % 7) as f32)
                .collect();
            let row_bytes = crate::formats::row_bytes(act_type, row_len).unwrap();
            let mut rows = vec![0u8; n * row_bytes];
            for (xr, qr) in x
                .chunks_exact(row_len)
                .zip(rows.chunks_exact_mut(row_bytes))
            {
                crate::quant::quantize_row(act_type, xr, qr).unwrap();
            }
            for raw in [false, true] {
                let mut tiles = ActTiles::default();
                tiles.build(
                    act_type,
                    &vec![0x5Au8; n * row_bytes],
                    n,
                    row_bytes,
                    raw,
                    None,
                );
                tiles.build(act_type, &rows, n, row_bytes, raw, None);
                let want = per_token(act_type, &rows, 2 * TILE, row_bytes, tiles.raw_k());
                assert!(
                    tiles.data[..want.len()] == want[..],
                    "{act_type:?} raw {raw}"
                );
                // The padded group too: every byte as a build into a fresh buffer.
                let mut fresh = ActTiles::default();
                fresh.build(act_type, &rows, n, row_bytes, raw, None);
                assert!(
                    tiles.data[..] == fresh.data[..],
                    "{act_type:?} raw {raw}: reused"
                );
            }
        }
    }
}
