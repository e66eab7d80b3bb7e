//! Token-tiled AVX-512 VNNI matmul for prefill: sixteen tokens in every 512-bit register.
//!
//! The per-output kernels ([`crate::avx512`]) spend their vector width on one output's
//! eight lanes. This module keeps exactly those lanes — the same integers, the same
//! `d_w·d_x` scale, the same fused multiply-add per lane and block, the same final sum —
//! but lays one lane of sixteen tokens across a register, so one `vpdpbusd` forms a lane
//! integer for sixteen outputs and one FMA advances sixteen float chains. Each output is
//! therefore bit-identical to the single-token kernel (and the scalar twin), which keeps
//! the matmul batch- and thread-invariant while prefill runs at GEMM speed.
//!
//! Two repackings make that possible, both done once and reused many times:
//! - [`ActTiles`]: the quantized activations of each group of sixteen tokens, interleaved
//!   so that 64 contiguous bytes hold the four quants of one lane for all sixteen tokens,
//!   stored as `x + 128` (unsigned, the operand `vpdpbusd` wants unsigned), with each
//!   token's block scale, and for Q8_K the group sums the K formats' extra terms need.
//! - the weight rows of one work chunk, unpacked per block to plain bytes with the
//!   per-lane correction `−128·Σw` (undoing the `+ 128`), and their scales as f32.
//!
//! | weight | lane integer of block / super-block | extra per lane |
//! |---|---|---|
//! | Q4_0, Q5_0, Q8_0 | `Σ (x+128)·w − 128·Σ w` (`w` signed) | — |
//! | Q4_1, Q5_1 (× Q8_1) | as Q4_0 (`w` the levels 0..15 / 0..31) | the offsets `m_w·s_x` in one chain, as the scalar twin |
//! | IQ4_NL | as Q4_0, `w` the table level | even and odd blocks in two chains, as the scalar twin |
//! | Q4_K | `Σ_g sc_g·Σ (x+128)·q − 128·Σ_g sc_g·Σ q` | four min lanes, as the scalar twin |
//! | Q5_K | as Q4_K with 5-bit `q` (a quad of `(x+128)·q` still fits 16 bits) | one min chain, as the scalar twin |
//! | Q2_K | `Σ (x+128)·(sc·q) − 128·Σ sc·q` (the levels scaled when unpacked: `sc·q ≤ 45` is a byte) | the min lanes `m·s + m·s` first, into the same chains |
//! | Q3_K | as Q2_K with `−sc·q` (levels −4..3, scales `sc − 32`: −128..124 is a byte), the lanes and `d` both negated; no min term | — |
//! | Q6_K | `Σ_g sc·Σ x·q − 32·(b·s + b·s)` (`x` back to signed by flipping the top bit, `q` the unsigned level as `vpdpbusd`'s unsigned operand) | — |
//! | IQ4_XS | `Σ_g ls_g·Σ (x+128)·w − 128·Σ_g ls_g·Σ w` (`ls_g` by a 32-bit multiply) | — |
//! | IQ2_XXS … IQ3_S | as IQ4_XS with a multiplier per 16 weights, times the format's final factor | — |

use std::arch::x86_64::*;
use std::cell::RefCell;

use nx_gguf::GgmlType;
use nx_syscalls::AlignedBytes;

use crate::act_tiles::{
    put_f32, put_i32, put_pair, ActTiles, ACT32_BLOCK, ACT81_BLOCK, ACT81_SUM, ACTK_BLOCK,
    ACTK_BSUMS, ACTK_DX, ACTK_MINS, TILE,
};
use crate::formats::grids::plain_grid;
#[cfg(test)]
use crate::formats::grids::GridBlock;
#[cfg(test)]
use crate::formats::q6_k::quads as q6_k_quads;
use crate::formats::{
    iq1_m, iq4_nl, iq4_xs, q2_k, q3_k, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, read_f16, read_u32,
    Q4_0_BYTES, Q4_K_BYTES, Q5_0_BYTES, Q6_K_BYTES, Q8_0_BYTES,
};

/// Unpacked 32-quant weight block: 32 signed quants, eight i32 corrections, `d_w` (f32).
const W32_BLOCK: usize = 32 + 32 + 4;
/// Unpacked Q4_1 / Q5_1 block: as [`W32_BLOCK`] (the levels unsigned), then `m_w` (f32).
const W32M_BLOCK: usize = W32_BLOCK + 4;
const W32M_M: usize = W32_BLOCK;
/// Unpacked Q4_K super-block: 256 quants, eight scales (i32), four min pairs, eight
/// corrections, `d_w` and `−dmin_w` (f32).
const WQ4K_BLOCK: usize = 256 + 32 + 16 + 32 + 8;
const WQ4K_SC: usize = 256;
const WQ4K_MINS: usize = WQ4K_SC + 32;
const WQ4K_CORR: usize = WQ4K_MINS + 16;
const WQ4K_D: usize = WQ4K_CORR + 32;
/// Unpacked Q2_K or Q3_K super-block: 256 scaled levels (Q2_K `sc·q`, 0..45; Q3_K
/// `−sc·q`, −128..124: each level times its sub-block's scale, see [`prescaled_lanes`]),
/// eight lane corrections, eight min pairs `(m[2l], m[2l+1])` (Q2_K), then `d` (Q3_K:
/// `−d`) and `−dmin` (f32, Q2_K).
const WQ2K_BLOCK: usize = WQ2K_D + 8;
const WQ2K_CORR: usize = 256;
const WQ2K_MINS: usize = WQ2K_CORR + 32;
const WQ2K_D: usize = WQ2K_MINS + 32;
/// Unpacked Q6_K super-block: 256 levels `q` (0..64, u8), eight scale pairs
/// `(sc[2g + h], sc[2g + 2 + h])` for the sub-block pairs (`g` = 0, 2, 4, 6, `h` = 0, 1;
/// see [`q6_k_tile`]), eight bsum-scale pairs `(−32·sc, −32·sc)`, `d_w` (f32).
const WQ6K_BLOCK: usize = 256 + 32 + 32 + 4;
const WQ6K_SC: usize = 256;
const WQ6K_BSUMS: usize = WQ6K_SC + 32;
const WQ6K_D: usize = WQ6K_BSUMS + 32;
/// Unpacked IQ4_XS or IQ2/IQ3 grid super-block: 256 signed levels (i8), sixteen
/// multipliers (i32, one per 16 weights: IQ4_XS's `ls − 32` twice per 32), eight
/// corrections `−128·Σ_g Σ m·(lane quad of group g)` (i32), `d_w` and the format's final
/// factor (f32; 1 for IQ4_XS).
const WGRID_BLOCK: usize = 256 + 64 + 32 + 8;
const WGRID_SC: usize = 256;
const WGRID_CORR: usize = WGRID_SC + 64;
const WGRID_D: usize = WGRID_CORR + 32;
const WGRID_POST: usize = WGRID_D + 4;
/// Unpacked IQ1_M super-block: the grid's 256 values times their multipliers
/// (i8: `(2·ls + 1)·{−1, 0, 1}`, at most 15 in magnitude), the 256 offset signs times
/// theirs (i8: `±(2·ls + 1)`), eight grid and eight offset corrections (i32), `d_w`
/// (f32). With the multipliers folded in, one `vpdpbusd` a lane and group forms
/// `Σ m·quad` (exact integers, so the single-token kernel's lanes).
const WIQ1M_BLOCK: usize = 512 + 32 + 32 + 4;
const WIQ1M_OFFSETS: usize = 256;
const WIQ1M_CORR: usize = 512;
const WIQ1M_OFFSET_CORR: usize = WIQ1M_CORR + 32;
const WIQ1M_D: usize = WIQ1M_OFFSET_CORR + 32;

/// True when this CPU can run the tiled kernels (the AVX-512 VNNI tier's features).
pub(crate) fn available() -> bool {
    crate::avx512::available()
}

/// Weight types with a tiled kernel. Their Q8_K activations are tiled twice where AMX
/// multiplies some of the weights beside them (raw quants for AMX, `x + 128` for these
/// VNNI tiles: `QuantizedActs::wide_tiles`).
pub(crate) fn has_kernel(weight_type: GgmlType) -> bool {
    matches!(
        weight_type,
        GgmlType::Q4_0
            | GgmlType::Q5_0
            | GgmlType::Q8_0
            | GgmlType::Q4_1
            | GgmlType::Q5_1
            | GgmlType::IQ4_NL
            | GgmlType::Q4_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_XS
            | GgmlType::IQ1_M
            | GgmlType::Q5_K
            | GgmlType::Q3_K
            | GgmlType::Q2_K
    ) || plain_grid(weight_type).is_some()
}

/// Bytes of one unpacked weight row of `n_blocks` blocks (or super-blocks).
fn unpacked_block_bytes(weight_type: GgmlType) -> (usize, usize) {
    match weight_type {
        GgmlType::Q4_0 => (Q4_0_BYTES, W32_BLOCK),
        GgmlType::Q5_0 => (Q5_0_BYTES, W32_BLOCK),
        GgmlType::Q8_0 => (Q8_0_BYTES, W32_BLOCK),
        GgmlType::Q4_1 => (q4_1::BYTES, W32M_BLOCK),
        GgmlType::Q5_1 => (q5_1::BYTES, W32M_BLOCK),
        GgmlType::IQ4_NL => (iq4_nl::BYTES, W32_BLOCK),
        GgmlType::Q4_K => (Q4_K_BYTES, WQ4K_BLOCK),
        GgmlType::Q5_K => (q5_k::BYTES, WQ4K_BLOCK),
        GgmlType::Q6_K => (Q6_K_BYTES, WQ6K_BLOCK),
        GgmlType::IQ4_XS => (iq4_xs::BYTES, WGRID_BLOCK),
        GgmlType::Q3_K => (q3_k::BYTES, WQ2K_BLOCK),
        GgmlType::Q2_K => (q2_k::BYTES, WQ2K_BLOCK),
        GgmlType::IQ1_M => (iq1_m::BYTES, WIQ1M_BLOCK),
        t => match plain_grid(t) {
            Some(grid) => (grid.block_bytes, WGRID_BLOCK),
            None => (1, 0),
        },
    }
}

/// The scalar twin of [`unpack_q4_k_avx512`]: the sub-block quants as unsigned nibbles,
/// the eight scales as i32, the mins as i16 pairs, the lane corrections
/// `−128·Σ_g s_g·(lane quad of sub-block g)`, then `d` and `−dmin` as f32.
#[cfg(test)]
fn unpack_q4_k(wb: &[u8], out: &mut [u8]) {
    for chunk in 0..4 {
        for l in 0..32 {
            let q = wb[q4_k::QS + 32 * chunk + l];
            out[64 * chunk + l] = q & 0x0F;
            out[64 * chunk + 32 + l] = q >> 4;
        }
    }
    let sc = put_q4_k_scales(wb, out);
    for l in 0..8 {
        let mut corr = 0i32;
        for g in 0..8 {
            let quad: i32 = (0..4).map(|k| out[32 * g + 4 * l + k] as i32).sum();
            corr += sc[g] * quad;
        }
        put_i32(out, WQ4K_CORR + 4 * l, -128 * corr);
    }
}

/// The scalar part of an unpacked Q4_K super-block, shared by [`unpack_q4_k_avx512`]
/// and its twin: the eight scales as i32, the mins as i16 pairs, `d` and `−dmin` as f32.
/// Returns the scales.
fn put_q4_k_scales(wb: &[u8], out: &mut [u8]) -> [i32; 8] {
    let (sc, mn) = q4_k::scales_mins(&wb[q4_k::SCALES..q4_k::SCALES + 12]);
    for (j, &s) in sc.iter().enumerate() {
        put_i32(out, WQ4K_SC + 4 * j, s);
    }
    for m in 0..4 {
        // Mins are 6-bit, so the i16 pairs hold them exactly.
        put_pair(
            out,
            WQ4K_MINS + 4 * m,
            mn[2 * m] as i16,
            mn[2 * m + 1] as i16,
        );
    }
    put_f32(out, WQ4K_D, read_f16(wb, 0));
    put_f32(out, WQ4K_D + 4, -read_f16(wb, q4_k::DMIN));
    sc
}

/// The scalar twin of [`unpack_q6_k_avx512`]: the quants as unsigned 6-bit values, the
/// sixteen scales as `(s, 0)` word pairs, the pairs `−32·s`, then `d` as f32.
#[cfg(test)]
fn unpack_q6_k(wb: &[u8], out: &mut [u8]) {
    for half in 0..2 {
        let ql = &wb[q6_k::QL + 64 * half..q6_k::QL + 64 * half + 64];
        let qh = &wb[q6_k::QH + 32 * half..q6_k::QH + 32 * half + 32];
        for l in 0..32 {
            for (k, &q) in q6_k_quads(ql, qh, l).iter().enumerate() {
                // q6_k_quads yields q − 32; the lanes multiply the unsigned q.
                out[128 * half + 32 * k + l] = (q + 32) as u8;
            }
        }
    }
    put_q6_k_scales(wb, out);
}

/// The scalar part of an unpacked Q6_K super-block, shared by [`unpack_q6_k_avx512`]
/// and its twin: the sixteen scales as the tile's word pairs (two sub-blocks' scales a
/// dword, see [`WQ6K_BLOCK`]), the pairs `−32·s`, `d`.
fn put_q6_k_scales(wb: &[u8], out: &mut [u8]) {
    let sc: [i16; 16] = std::array::from_fn(|j| wb[q6_k::SCALES + j] as i8 as i16);
    // Scales per 16 weights: sub-block g (32 weights) has sc[2g] for lanes 0..4 and
    // sc[2g + 1] for lanes 4..8; the tile pairs sub-blocks g and g + 1 in one dword.
    for pair in 0..4 {
        for h in 0..2 {
            let (g_lo, g_hi) = (4 * pair + h, 4 * pair + 2 + h);
            put_pair(out, WQ6K_SC + 4 * (2 * pair + h), sc[g_lo], sc[g_hi]);
        }
    }
    for l in 0..8 {
        put_pair(
            out,
            WQ6K_BSUMS + 4 * l,
            -32 * sc[2 * l],
            -32 * sc[2 * l + 1],
        );
    }
    put_f32(out, WQ6K_D, read_f16(wb, q6_k::D));
}

/// Unpacks whole rows of `w_rows` (`row_bytes` each) into `out` (resized), returning
/// the unpacked row stride (0 for a type without tiles).
///
/// # Safety
/// [`available`] is true.
unsafe fn unpack_rows(
    weight_type: GgmlType,
    w_rows: &[u8],
    row_bytes: usize,
    out: &mut AlignedBytes,
) -> usize {
    let (src, dst) = unpacked_block_bytes(weight_type);
    let unpack: fn(&[u8], &mut [u8]) = match weight_type {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => {
            let stride = row_bytes / src * dst;
            out.resize(w_rows.len() / row_bytes * stride);
            // SAFETY: the caller guarantees the features; whole blocks in and out.
            unsafe { unpack_rows32_avx512(weight_type, w_rows, row_bytes, out, stride) };
            return stride;
        }
        // SAFETY (both): the caller guarantees the features (AVX-512 F/BW/VNNI).
        GgmlType::Q4_K => |wb, ob| unsafe { unpack_q4_k_avx512(wb, ob) },
        GgmlType::Q6_K => |wb, ob| unsafe { unpack_q6_k_avx512(wb, ob) },
        GgmlType::Q5_K => unpack_q5_k,
        GgmlType::Q4_1 => |wb, ob| unpack_offset32(wb, ob, q4_1::levels),
        GgmlType::Q5_1 => |wb, ob| unpack_offset32(wb, ob, q5_1::levels),
        GgmlType::IQ4_XS => unpack_iq4_xs,
        GgmlType::Q3_K => unpack_q3_k,
        GgmlType::Q2_K => unpack_q2_k,
        GgmlType::IQ1_M => unpack_iq1_m,
        GgmlType::IQ2_XXS => |wb, ob| unpack_grid(GgmlType::IQ2_XXS, wb, ob),
        GgmlType::IQ2_XS => |wb, ob| unpack_grid(GgmlType::IQ2_XS, wb, ob),
        GgmlType::IQ2_S => |wb, ob| unpack_grid(GgmlType::IQ2_S, wb, ob),
        GgmlType::IQ3_XXS => |wb, ob| unpack_grid(GgmlType::IQ3_XXS, wb, ob),
        GgmlType::IQ3_S => |wb, ob| unpack_grid(GgmlType::IQ3_S, wb, ob),
        _ => return 0,
    };
    let stride = row_bytes / src * dst;
    out.resize(w_rows.len() / row_bytes * stride);
    for (r, (row, dst_row)) in w_rows
        .chunks_exact(row_bytes)
        .zip(out.chunks_exact_mut(stride))
        .enumerate()
    {
        for (b, (wb, ob)) in row
            .chunks_exact(src)
            .zip(dst_row.chunks_exact_mut(dst))
            .enumerate()
        {
            // The chunk's rows are read once, straight from the mapping, and the
            // hardware prefetcher stops at every 4 KiB page: stream them ahead as
            // decoding does (the loads took 84 % of this loop without it).
            let at = r * row_bytes + b * src;
            for line in (0..src).step_by(64) {
                crate::avx2::prefetch_ahead(w_rows, at + line);
            }
            unpack(wb, ob);
        }
    }
    stride
}

/// One IQ4_XS super-block `wb` unpacked into `out` (the [`WGRID_BLOCK`] layout, each
/// sub-block scale as the multiplier of both its halves, final factor 1). Plain code: a
/// row is unpacked once per chunk and then read by every token group.
fn unpack_iq4_xs(wb: &[u8], out: &mut [u8]) {
    // SAFETY: the tiled kernels run only where AVX-512 (and so AVX2) is available.
    unsafe { unpack_iq4_xs_avx2(wb, out) }
}

/// [`unpack_iq4_xs`] with AVX2: a sub-block's 32 levels from one `vpshufb` of the
/// table, its scale from `avx2::iq4_xs_scales`, the corrections' lane sums by
/// `maddubs` by ones and `madd` by the scale.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_iq4_xs_avx2(wb: &[u8], out: &mut [u8]) {
    assert!(wb.len() >= iq4_xs::BYTES && out.len() >= WGRID_BLOCK);
    // SAFETY: every load is inside the super-block and every store inside `out`
    // (asserted); the features of this function.
    unsafe {
        let half = _mm_loadu_si128(iq4_nl::KVALUES.as_ptr() as *const __m128i);
        let table = _mm256_setr_m128i(half, half);
        let (low4, ones) = (_mm_set1_epi8(0x0F), _mm256_set1_epi8(1));
        let scales = crate::avx2::iq4_xs_scales(wb);
        let p = out.as_mut_ptr();
        let mut corr = _mm256_setzero_si256();
        for g in 0..8 {
            let qs = _mm_loadu_si128(wb.as_ptr().add(iq4_xs::QS + 16 * g) as *const __m128i);
            let nibbles = _mm256_setr_m128i(
                _mm_and_si128(qs, low4),
                _mm_and_si128(_mm_srli_epi16::<4>(qs), low4),
            );
            let levels = _mm256_shuffle_epi8(table, nibbles);
            _mm256_storeu_si256(p.add(32 * g) as *mut __m256i, levels);
            // The scale as 16-bit words: its i32 lane g (|ls| ≤ 32) repeated.
            let ls = _mm256_permutevar8x32_epi32(scales, _mm256_set1_epi32(g as i32));
            let ls = _mm256_packs_epi32(ls, ls);
            corr = _mm256_add_epi32(
                corr,
                _mm256_madd_epi16(_mm256_maddubs_epi16(ones, levels), ls),
            );
        }
        // Each sub-block's scale twice, as i32: one per 16 weights.
        let twice = |at: usize, idx: __m256i| {
            _mm256_storeu_si256(
                p.add(at) as *mut __m256i,
                _mm256_permutevar8x32_epi32(scales, idx),
            );
        };
        twice(WGRID_SC, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
        twice(WGRID_SC + 32, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
        let corr = _mm256_mullo_epi32(corr, _mm256_set1_epi32(-128));
        _mm256_storeu_si256(p.add(WGRID_CORR) as *mut __m256i, corr);
    }
    put_f32(out, WGRID_D, read_f16(wb, 0));
    put_f32(out, WGRID_POST, 1.0);
}

/// The scalar unpacking [`unpack_iq4_xs_avx2`] replaces, kept as its twin for the
/// tests.
#[cfg(test)]
fn unpack_iq4_xs_scalar(wb: &[u8], out: &mut [u8]) {
    assert!(wb.len() >= iq4_xs::BYTES && out.len() >= WGRID_BLOCK);
    let scales = iq4_xs::scales(wb);
    let mut corr = [0i32; 8];
    for (g, &ls) in scales.iter().enumerate() {
        let q = iq4_nl::levels(&wb[iq4_xs::QS + 16 * g..iq4_xs::QS + 16 * g + 16]);
        for (l, quad) in q.chunks_exact(4).enumerate() {
            corr[l] += ls * quad.iter().sum::<i32>();
        }
        for (o, &v) in out[32 * g..32 * g + 32].iter_mut().zip(&q) {
            *o = v as i8 as u8;
        }
        put_i32(out, WGRID_SC + 8 * g, ls);
        put_i32(out, WGRID_SC + 8 * g + 4, ls);
    }
    finish_grid_block(out, corr, read_f16(wb, 0), 1.0);
}

/// One Q4_1 / Q5_1 block `wb` unpacked into `out` (the [`W32M_BLOCK`] layout: its
/// levels, the lane corrections `−128·Σ quad`, `d_w`, `m_w`). Plain code.
fn unpack_offset32(wb: &[u8], out: &mut [u8], levels: fn(&[u8]) -> [i32; 32]) {
    assert!(out.len() >= W32M_BLOCK);
    let q = levels(wb);
    for (l, quad) in q.chunks_exact(4).enumerate() {
        put_i32(out, 32 + 4 * l, -128 * quad.iter().sum::<i32>());
    }
    for (o, &v) in out[..32].iter_mut().zip(&q) {
        *o = v as u8;
    }
    // Q4_1 and Q5_1 keep `d` at 0 and `m` at the same offset.
    put_f32(out, 64, read_f16(wb, 0));
    put_f32(out, W32M_M, read_f16(wb, q4_1::M));
}

/// One Q3_K super-block `wb` unpacked into `out` (the [`WQ2K_BLOCK`] layout without
/// the min terms). The scaled levels are negated: `sc·q` reaches 128 (scale −32, level
/// −4), one past a signed byte, while `−sc·q` stays in −128..124. The lanes then hold
/// the negated sums and `d` is stored negated too: `(−d_x·d_w)·(−Σ)` is the same
/// product, rounded the same, as `d_x·d_w·Σ` (negation is exact in the conversion and
/// the multiplies), so the FMA gives the single-token kernel's bits. Plain code.
fn unpack_q3_k(wb: &[u8], out: &mut [u8]) {
    assert!(wb.len() >= q3_k::BYTES && out.len() >= WQ2K_BLOCK);
    let scales = q3_k::scales(&wb[q3_k::SCALES..q3_k::SCALES + 12]);
    let levels = q3_k::levels(wb);
    let corr = put_scaled_levels(out, &levels, |j| -scales[j]);
    for (l, c) in corr.into_iter().enumerate() {
        put_i32(out, WQ2K_CORR + 4 * l, -128 * c);
    }
    put_f32(out, WQ2K_D, -read_f16(wb, q3_k::D));
}

/// Writes the 256 levels times their sub-block's `scale(j)` (one per 16 weights, each
/// product a signed byte) as [`WQ2K_BLOCK`]'s first 256 bytes; returns each lane's sum
/// of them (lane `l`: weights `4l..4l + 4` of every group of 32).
fn put_scaled_levels(out: &mut [u8], levels: &[i8; 256], scale: impl Fn(usize) -> i32) -> [i32; 8] {
    let out = &mut out[..256];
    // Sub-block by sub-block, each a plain loop the compiler vectorizes.
    for (j, (o, q)) in out
        .chunks_exact_mut(16)
        .zip(levels.chunks_exact(16))
        .enumerate()
    {
        let s = scale(j) as i16;
        for (o, &q) in o.iter_mut().zip(q) {
            *o = (s * q as i16) as i8 as u8;
        }
    }
    let mut corr = [0i32; 8];
    for group in out.chunks_exact(32) {
        for (c, quad) in corr.iter_mut().zip(group.chunks_exact(4)) {
            *c += quad.iter().map(|&v| v as i8 as i32).sum::<i32>();
        }
    }
    corr
}

/// One Q2_K super-block `wb` unpacked into `out` (the [`WQ2K_BLOCK`] layout). Plain
/// code.
fn unpack_q2_k(wb: &[u8], out: &mut [u8]) {
    assert!(wb.len() >= q2_k::BYTES && out.len() >= WQ2K_BLOCK);
    let levels = q2_k::levels(wb);
    let min = |j: usize| (wb[j] >> 4) as i16;
    // 15·3 ≤ 45: the scaled levels are bytes.
    let corr = put_scaled_levels(out, &levels, |j| (wb[j] & 0x0F) as i32);
    for (l, c) in corr.into_iter().enumerate() {
        put_i32(out, WQ2K_CORR + 4 * l, -128 * c);
        put_pair(out, WQ2K_MINS + 4 * l, min(2 * l), min(2 * l + 1));
    }
    put_f32(out, WQ2K_D, read_f16(wb, q2_k::D));
    put_f32(out, WQ2K_D + 4, -read_f16(wb, q2_k::DMIN));
}

/// One Q5_K super-block `wb` unpacked into `out` (the [`WQ4K_BLOCK`] layout of
/// [`unpack_q4_k`], the quants with their fifth bits: 0..31). Plain code.
fn unpack_q5_k(wb: &[u8], out: &mut [u8]) {
    assert!(wb.len() >= q5_k::BYTES && out.len() >= WQ4K_BLOCK);
    let qh = &wb[q5_k::QH..q5_k::QH + 32];
    for chunk in 0..4 {
        let qs = &wb[q5_k::QS + 32 * chunk..q5_k::QS + 32 * chunk + 32];
        for l in 0..32 {
            let fifth = |k: usize| ((qh[l] >> (2 * chunk + k)) & 1) << 4;
            out[64 * chunk + l] = (qs[l] & 0x0F) | fifth(0);
            out[64 * chunk + 32 + l] = (qs[l] >> 4) | fifth(1);
        }
    }
    let sc = put_q4_k_scales(wb, out);
    let mut corr = [0i32; 8];
    for (g, q) in out[..256].chunks_exact(32).enumerate() {
        for (l, quad) in q.chunks_exact(4).enumerate() {
            corr[l] += sc[g] * quad.iter().map(|&v| v as i32).sum::<i32>();
        }
    }
    for (l, c) in corr.into_iter().enumerate() {
        put_i32(out, WQ4K_CORR + 4 * l, -128 * c);
    }
}

/// The tail of a [`WGRID_BLOCK`]: corrections, `d_w` and the final factor.
#[cfg(test)]
fn finish_grid_block(out: &mut [u8], corr: [i32; 8], d: f32, post_scale: f32) {
    for (l, c) in corr.into_iter().enumerate() {
        put_i32(out, WGRID_CORR + 4 * l, -128 * c);
    }
    put_f32(out, WGRID_D, d);
    put_f32(out, WGRID_POST, post_scale);
}

/// Byte `j` of entry `s` is 0xff when bit `j` of `s` is set.
#[cfg(test)]
static BYTE_MASKS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut s = 0;
    while s < 256 {
        let mut j = 0;
        while j < 8 {
            if s >> j & 1 != 0 {
                t[s] |= 0xff << (8 * j);
            }
            j += 1;
        }
        s += 1;
    }
    t
};

/// One IQ2/IQ3 grid super-block `wb` of `ty` unpacked into `out` (the [`WGRID_BLOCK`]
/// layout).
fn unpack_grid(ty: GgmlType, wb: &[u8], out: &mut [u8]) {
    // SAFETY: the tiled kernels run only where AVX-512 (and so AVX2) is available.
    unsafe { unpack_grid_avx2(ty, wb, out) }
}

/// [`unpack_grid`] with AVX2, over the single-token kernels' own group decoders
/// (`avx2::*_group`): a group's magnitudes signed in one `vpsignb`, and the
/// corrections' lane sums formed by `maddubs`/`madd` with the multipliers.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_grid_avx2(ty: GgmlType, wb: &[u8], out: &mut [u8]) {
    use crate::avx2::{iq2_s_group, iq2_xs_group, iq2_xxs_group, iq3_s_group, iq3_xxs_group};
    use crate::formats::{iq2_s, iq2_xs, iq2_xxs, iq3_s, iq3_xxs};
    // One format's block, group decoder and final factor.
    macro_rules! groups {
        ($format:ident, $group:ident) => {
            // SAFETY: the forwarded features.
            unsafe { unpack_grid_groups(&wb[..$format::BYTES], out, $group, $format::POST_SCALE) }
        };
    }
    match ty {
        GgmlType::IQ2_XXS => groups!(iq2_xxs, iq2_xxs_group),
        GgmlType::IQ2_XS => groups!(iq2_xs, iq2_xs_group),
        GgmlType::IQ2_S => groups!(iq2_s, iq2_s_group),
        GgmlType::IQ3_XXS => groups!(iq3_xxs, iq3_xxs_group),
        GgmlType::IQ3_S => groups!(iq3_s, iq3_s_group),
        _ => {}
    }
}

/// The body of [`unpack_grid_avx2`] for one format's group decoder.
///
/// # Safety
/// The CPU has AVX2; only inlined into [`unpack_grid_avx2`].
#[inline(always)]
unsafe fn unpack_grid_groups(
    wb: &[u8],
    out: &mut [u8],
    group: impl Fn(&[u8], usize) -> (__m256i, __m256i, __m256i),
    post_scale: f32,
) {
    assert!(out.len() >= WGRID_BLOCK);
    // SAFETY: the caller's features; every store is inside `out` (asserted).
    unsafe {
        let ones = _mm256_set1_epi8(1);
        let mut corr = _mm256_setzero_si256();
        for g in 0..8 {
            let (magnitudes, signs, m) = group(wb, g);
            let levels = _mm256_sign_epi8(magnitudes, signs);
            _mm256_storeu_si256(out.as_mut_ptr().add(32 * g) as *mut __m256i, levels);
            corr = _mm256_add_epi32(
                corr,
                _mm256_madd_epi16(_mm256_maddubs_epi16(ones, levels), m),
            );
            // `(m, m)` word pairs for `vpdpwssd` over `vpmaddubsw`'s pair sums (m ≤ 31).
            let (first, second) = (
                _mm256_extract_epi16::<0>(m) as i16,
                _mm256_extract_epi16::<8>(m) as i16,
            );
            put_pair(out, WGRID_SC + 8 * g, first, first);
            put_pair(out, WGRID_SC + 8 * g + 4, second, second);
        }
        let corr = _mm256_mullo_epi32(corr, _mm256_set1_epi32(-128));
        _mm256_storeu_si256(out.as_mut_ptr().add(WGRID_CORR) as *mut __m256i, corr);
    }
    put_f32(out, WGRID_D, crate::formats::read_f16(wb, 0));
    put_f32(out, WGRID_POST, post_scale);
}

/// The scalar unpacking [`unpack_grid_avx2`] replaces, by the format's own decoder,
/// kept as its twin for the tests.
#[cfg(test)]
fn unpack_grid_scalar(ty: GgmlType, wb: &[u8], out: &mut [u8]) {
    assert!(out.len() >= WGRID_BLOCK);
    let Some(grid) = plain_grid(ty) else {
        return;
    };
    let mut block = GridBlock::new();
    let d = (grid.decode)(&wb[..grid.block_bytes], &mut block);
    let corr = put_signed_levels(&block, &mut out[..256]);
    for (s, &m) in block.scales.iter().enumerate() {
        put_pair(out, WGRID_SC + 4 * s, m as i16, m as i16);
    }
    finish_grid_block(out, corr, d, grid.post_scale);
}

/// One IQ1_M super-block `wb` unpacked into `out` (the [`WIQ1M_BLOCK`] layout).
fn unpack_iq1_m(wb: &[u8], out: &mut [u8]) {
    // SAFETY: the tiled kernels run only where AVX-512 (and so AVX2) is available.
    unsafe { unpack_iq1_m_avx2(wb, out) }
}

/// [`unpack_iq1_m`] with AVX2: the block's fields unpacked once
/// (`avx2::Iq1mFields`, as the single-token kernel does), the values and offset signs
/// signed onto their multipliers and stored a group of 32 at a time, and the
/// corrections' lane sums formed by `maddubs` by ones.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_iq1_m_avx2(wb: &[u8], out: &mut [u8]) {
    use crate::avx2::{Iq1mControls, Iq1mFields};
    assert!(wb.len() >= iq1_m::BYTES && out.len() >= WIQ1M_BLOCK);
    let fields = Iq1mFields::of(wb);
    let controls = Iq1mControls::new();
    let (ones, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    let (mut corr, mut offset_corr) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    let p = out.as_mut_ptr();
    for g in 0..8 {
        // The group's two multipliers as bytes (each 128-bit half one of them).
        let m = _mm256_shuffle_epi8(fields.multipliers, controls.multipliers[g]);
        let m = _mm256_packs_epi16(m, m);
        let levels = _mm256_sign_epi8(m, fields.grid_values(g));
        let signs = _mm256_sign_epi8(
            m,
            _mm256_shuffle_epi8(fields.signs[g / 4], controls.signs[g % 4]),
        );
        // SAFETY: 32 bytes at 32g and at WIQ1M_OFFSETS + 32g, inside `out` (asserted).
        unsafe {
            _mm256_storeu_si256(p.add(32 * g) as *mut __m256i, levels);
            _mm256_storeu_si256(p.add(WIQ1M_OFFSETS + 32 * g) as *mut __m256i, signs);
        }
        let lane_sums = |v: __m256i| _mm256_madd_epi16(_mm256_maddubs_epi16(ones, v), ones16);
        corr = _mm256_add_epi32(corr, lane_sums(levels));
        offset_corr = _mm256_add_epi32(offset_corr, lane_sums(signs));
    }
    let minus_128 = _mm256_set1_epi32(-128);
    // SAFETY: eight i32 each, inside `out` (asserted).
    unsafe {
        let at = |o: usize| p.add(o) as *mut __m256i;
        _mm256_storeu_si256(at(WIQ1M_CORR), _mm256_mullo_epi32(corr, minus_128));
        _mm256_storeu_si256(
            at(WIQ1M_OFFSET_CORR),
            _mm256_mullo_epi32(offset_corr, minus_128),
        );
    }
    put_f32(out, WIQ1M_D, iq1_m::super_scale(&iq1_m::scale_words(wb)));
}

/// The scalar unpacking [`unpack_iq1_m_avx2`] replaces, kept as its twin for the tests.
#[cfg(test)]
fn unpack_iq1_m_scalar(wb: &[u8], out: &mut [u8]) {
    assert!(out.len() >= WIQ1M_BLOCK);
    let (mut grid, mut offsets) = (GridBlock::new(), GridBlock::new());
    let d = iq1_m::decode(wb, &mut grid, &mut offsets);
    let corr = put_signed_levels(&grid, &mut out[..256]);
    let offset_corr = put_signed_levels(&offsets, &mut out[WIQ1M_OFFSETS..WIQ1M_OFFSETS + 256]);
    // Each value times its multiplier (one per 16 weights); put_signed_levels' lane
    // sums already carry them.
    for (k, byte) in out[..512].iter_mut().enumerate() {
        let m = grid.scales[(k % 256) / 16];
        *byte = (*byte as i8 as i32 * m) as i8 as u8;
    }
    for l in 0..8 {
        put_i32(out, WIQ1M_CORR + 4 * l, -128 * corr[l]);
        put_i32(out, WIQ1M_OFFSET_CORR + 4 * l, -128 * offset_corr[l]);
    }
    put_f32(out, WIQ1M_D, d);
}

/// Writes a block's 256 signed levels (i8) into `out` and returns the eight lane sums
/// `Σ_g Σ m·w` over each lane's quads (what `x + 128` adds, once divided by 128).
#[cfg(test)]
fn put_signed_levels(block: &GridBlock, out: &mut [u8]) -> [i32; 8] {
    let mut corr = [0i32; 8];
    for (k, &magnitudes) in block.octets.iter().enumerate() {
        // Negate the bytes whose sign bit is set: `(m ^ 0xff) + 1`, never carrying
        // into the next byte (every magnitude is 1..=62 or 0 with its sign clear).
        let mask = BYTE_MASKS[block.signs[k] as usize];
        let signed = ((magnitudes ^ mask) + (mask & 0x0101_0101_0101_0101)).to_le_bytes();
        out[8 * k..8 * k + 8].copy_from_slice(&signed);
        let m = block.scales[k / 2];
        let quad = |q: &[u8]| q.iter().map(|&b| b as i8 as i32).sum::<i32>();
        corr[2 * (k % 4)] += m * quad(&signed[..4]);
        corr[2 * (k % 4) + 1] += m * quad(&signed[4..]);
    }
    corr
}

/// Lane quad sums of 64 unsigned quant bytes: dword `i` is the sum of bytes `4i..4i+4`.
#[inline(always)]
fn quad_sums(q: __m512i) -> __m512i {
    // SAFETY (features): only called from functions that enable AVX-512 F/VNNI.
    unsafe { _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, _mm512_set1_epi8(1)) }
}

/// One Q4_K super-block `wb` unpacked into `out` (the layout of [`unpack_q4_k`], which
/// is its scalar twin: integer data only, so the bytes are the same).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn unpack_q4_k_avx512(wb: &[u8], out: &mut [u8]) {
    assert!(wb.len() >= Q4_K_BYTES && out.len() >= WQ4K_BLOCK);
    let low4 = _mm512_set1_epi8(0x0F);
    let sc = put_q4_k_scales(wb, out);
    let mut corr = _mm512_setzero_si512();
    for half in 0..2 {
        // SAFETY: qs is bytes 16..144 of the 144-byte block (asserted); `out` holds
        // WQ4K_BLOCK bytes (asserted), of which the quants are 0..256.
        unsafe {
            let q = _mm512_loadu_si512(wb.as_ptr().add(q4_k::QS + 64 * half) as *const _);
            let lo = _mm512_and_si512(q, low4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), low4);
            // Chunk c's low nibbles are sub-block 2c, its high ones sub-block 2c + 1.
            let first = _mm512_shuffle_i64x2::<0b01_00_01_00>(lo, hi);
            let second = _mm512_shuffle_i64x2::<0b11_10_11_10>(lo, hi);
            for (k, v) in [first, second].into_iter().enumerate() {
                let g = 4 * half + 2 * k;
                _mm512_storeu_si512(out.as_mut_ptr().add(32 * g) as *mut _, v);
                // Dwords 0..8 are sub-block g's lane quads, 8..16 sub-block g + 1's.
                let s =
                    _mm512_inserti64x4::<1>(_mm512_set1_epi32(sc[g]), _mm256_set1_epi32(sc[g + 1]));
                corr = _mm512_add_epi32(corr, _mm512_mullo_epi32(quad_sums(v), s));
            }
        }
    }
    let sum = _mm256_add_epi32(
        _mm512_castsi512_si256(corr),
        _mm512_extracti64x4_epi64::<1>(corr),
    );
    let corr = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<7>(sum));
    // SAFETY: the corrections are bytes WQ4K_CORR..+32 of `out` (asserted length).
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(WQ4K_CORR) as *mut _, corr) };
}

/// One Q6_K super-block `wb` unpacked into `out` (the layout of [`unpack_q6_k`], its
/// scalar twin).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn unpack_q6_k_avx512(wb: &[u8], out: &mut [u8]) {
    assert!(wb.len() >= Q6_K_BYTES && out.len() >= WQ6K_BLOCK);
    let low4 = _mm256_set1_epi8(0x0F);
    let two_bits = _mm256_set1_epi8(0x30);
    for half in 0..2 {
        // SAFETY: ql is bytes 0..128 and qh 128..192 of the 210-byte block, the quants
        // bytes 0..256 of `out` (both asserted).
        unsafe {
            let at = |o: usize| _mm256_loadu_si256(wb.as_ptr().add(o) as *const _);
            let ql0 = at(q6_k::QL + 64 * half);
            let ql1 = at(q6_k::QL + 64 * half + 32);
            let h = at(q6_k::QH + 32 * half);
            // Quant k of lane l: a nibble of ql[l] or ql[l + 32], and bits 2k, 2k + 1 of
            // qh[l] as its bits 4 and 5 (16-bit shifts, then masks keep each byte's own).
            let quants = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, low4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(h), two_bits),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, low4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(h), two_bits),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4),
                    _mm256_and_si256(h, two_bits),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(h), two_bits),
                ),
            ];
            for (k, pair) in quants.chunks_exact(2).enumerate() {
                let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(pair[0]), pair[1]);
                _mm512_storeu_si512(out.as_mut_ptr().add(128 * half + 64 * k) as *mut _, v);
            }
        }
    }
    put_q6_k_scales(wb, out);
}

/// [`unpack_rows`] for Q4_0 / Q5_0 / Q8_0: per block the 32 quants as signed bytes
/// (Q4_0 `q − 8`, Q5_0 `q − 16` with the fifth bits from `qh`, Q8_0 as stored), the
/// eight lane corrections `−128·Σ` of each lane's four quants, and `d_w` as f32.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `out` holds `w_rows.len() / row_bytes` rows of
/// `stride` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn unpack_rows32_avx512(
    weight_type: GgmlType,
    w_rows: &[u8],
    row_bytes: usize,
    out: &mut [u8],
    stride: usize,
) {
    let (src, _) = unpacked_block_bytes(weight_type);
    let low4 = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi8(1);
    let zero = _mm256_setzero_si256();
    // SAFETY: sixteen bytes.
    let levels = unsafe { _mm_loadu_si128(iq4_nl::KVALUES.as_ptr() as *const __m128i) };
    for (row, dst_row) in w_rows
        .chunks_exact(row_bytes)
        .zip(out.chunks_exact_mut(stride))
    {
        for (b, (wb, ob)) in row
            .chunks_exact(src)
            .zip(dst_row.chunks_exact_mut(W32_BLOCK))
            .enumerate()
        {
            assert!(ob.len() >= W32_BLOCK);
            // As in `unpack_rows`: the rows come from memory once per call (a serving
            // step of sixteen tokens reads each weight once), so stream ahead as
            // decoding does; a block is at most 34 bytes, one prefetch a block.
            crate::avx2::prefetch_ahead(row, b * src);
            // SAFETY: every read is inside the block `wb` (18, 22 or 34 bytes).
            let w = unsafe {
                match weight_type {
                    GgmlType::Q8_0 => _mm256_loadu_si256(wb.as_ptr().add(2) as *const __m256i),
                    GgmlType::IQ4_NL => {
                        // Each nibble indexes the sixteen levels: one byte shuffle a half.
                        let qs = _mm_loadu_si128(wb.as_ptr().add(iq4_nl::QS) as *const __m128i);
                        let lo = _mm_shuffle_epi8(levels, _mm_and_si128(qs, low4));
                        let hi =
                            _mm_shuffle_epi8(levels, _mm_and_si128(_mm_srli_epi16::<4>(qs), low4));
                        _mm256_set_m128i(hi, lo)
                    }
                    _ => {
                        let qs_at = if weight_type == GgmlType::Q5_0 {
                            q5_0::QS
                        } else {
                            2
                        };
                        let qs = _mm_loadu_si128(wb.as_ptr().add(qs_at) as *const __m128i);
                        let lo = _mm_and_si128(qs, low4);
                        let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
                        let q4 = _mm256_set_m128i(hi, lo);
                        if weight_type == GgmlType::Q5_0 {
                            // Bit j of qh is quant j's fifth bit: add 16 there, then
                            // centre on 16.
                            let q = _mm256_mask_add_epi8(
                                q4,
                                read_u32(wb, q5_0::QH),
                                q4,
                                crate::avx512::opaque_256(_mm256_set1_epi8(16)),
                            );
                            _mm256_sub_epi8(q, _mm256_set1_epi8(16))
                        } else {
                            _mm256_sub_epi8(q4, _mm256_set1_epi8(8))
                        }
                    }
                }
            };
            // −128 · (sum of each lane's four signed quants).
            let sums = _mm256_dpbusd_epi32(zero, ones, w);
            let corr = _mm256_sub_epi32(zero, _mm256_slli_epi32::<7>(sums));
            // SAFETY: ob holds W32_BLOCK = 68 bytes: quants 0..32, corrections 32..64.
            unsafe {
                _mm256_storeu_si256(ob.as_mut_ptr() as *mut __m256i, w);
                _mm256_storeu_si256(ob.as_mut_ptr().add(32) as *mut __m256i, corr);
            }
            put_f32(ob, 64, read_f16(wb, 0));
        }
    }
}

thread_local! {
    /// Each worker's unpacked weight rows, kept between chunks so it is allocated once.
    static UNPACKED: RefCell<AlignedBytes> = RefCell::new(AlignedBytes::default());
}

/// Weight rows computed per token group before their outputs are written: each token's
/// outputs for them are then one contiguous run (one cache line for 16 rows).
const ROW_BLOCK: usize = 16;

/// For every whole token group of `tiles` and every row of `w_rows` (`row_bytes` each,
/// of `weight_type`), computes the dot products — the bits of the single-token kernel —
/// and writes row `r`'s output for token `t` (rows counted from the start of `w_rows`)
/// to `out_ptr[t·out_stride + r]`.
///
/// # Safety
/// [`available`] must be true, [`has_kernel`] true for `weight_type`, and `tiles` built
/// from activations of the weight's dot type and row length; `out_ptr` must be valid
/// for writes at every such index (`t` below `tiles.n_tokens()`), with no other
/// thread accessing them during the call.
pub(crate) unsafe fn run(
    weight_type: GgmlType,
    w_rows: &[u8],
    row_bytes: usize,
    tiles: &ActTiles,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    // SAFETY: the caller guarantees the CPU features (AVX-512 F for the stores).
    unsafe { run_avx512(weight_type, w_rows, row_bytes, tiles, out_ptr, out_stride) }
}

/// [`run`] compiled with the features its stores use.
///
/// # Safety
/// As [`run`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn run_avx512(
    weight_type: GgmlType,
    w_rows: &[u8],
    row_bytes: usize,
    tiles: &ActTiles,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    // Raw Q8_K tiles are built only when AMX is available (`ActTiles::build`), and only
    // the AMX kernels read them.
    if tiles.raw_k() && crate::amx::has_kernel(weight_type) {
        // SAFETY: forwarded contract; AMX is available.
        return unsafe { run_amx(weight_type, w_rows, row_bytes, tiles, out_ptr, out_stride) };
    }
    UNPACKED.with(|cell| {
        let mut buf = cell.borrow_mut();
        // SAFETY: the caller guarantees the features.
        let stride = unsafe { unpack_rows(weight_type, w_rows, row_bytes, &mut buf) };
        if stride == 0 {
            return;
        }
        let n_rows = buf.len() / stride;
        let (src, _) = unpacked_block_bytes(weight_type);
        let n_blocks = row_bytes / src;
        // [rows, tokens]; one spare row so a last odd row still borrows a pair.
        let mut out = [[0f32; TILE]; ROW_BLOCK + 1];
        for g in 0..tiles.n_groups() {
            let x = tiles.group(g);
            for r0 in (0..n_rows).step_by(ROW_BLOCK) {
                let rows_here = ROW_BLOCK.min(n_rows - r0);
                // The output lines these rows get for the sixteen tokens lie far apart
                // (one per token row) and are seldom cached: ask for them in exclusive
                // state now, so the stores after the kernels do not wait for them.
                for t in 0..tiles.group_tokens(g) {
                    let token = g * TILE + t;
                    // SAFETY: a prefetch never faults; the address is inside `out_ptr`'s
                    // range by the caller's contract (computed without dereferencing).
                    _mm_prefetch::<_MM_HINT_ET0>(
                        out_ptr.wrapping_add(token * out_stride + r0) as *const i8
                    );
                }
                let mut r = 0;
                while r < rows_here {
                    let pair = rows_here - r >= 2;
                    let w = &buf[(r0 + r) * stride..];
                    let dst: &mut [[f32; TILE]; 2] = (&mut out[r..r + 2]).try_into().expect("2");
                    // SAFETY: the caller guarantees the CPU features; `w` holds
                    // `n_blocks` unpacked blocks per row for one or two rows (`pair`), `x`
                    // `n_blocks` tile blocks of the same dot type.
                    unsafe { tile_rows(weight_type, pair, w, stride, x, n_blocks, dst) };
                    r += if pair { 2 } else { 1 };
                }
                let block: &[[f32; TILE]; ROW_BLOCK] =
                    (&out[..ROW_BLOCK]).try_into().expect("16 rows");
                // SAFETY: the caller's contract on `out_ptr` covers every token of the
                // whole groups and the rows of the chunk.
                let at = (g * TILE, r0);
                let tokens = tiles.group_tokens(g);
                unsafe { store_block(block, rows_here, tokens, out_ptr, out_stride, at) };
            }
        }
    });
}

/// One or two (`pair`) unpacked weight rows of `weight_type` against one token group's
/// tile blocks: the format's tile kernel, its outputs to `dst[0]` (and `dst[1]`).
///
/// # Safety
/// As [`run`]: the CPU has the tiled kernels' features; `w` holds `n_blocks` unpacked
/// blocks per row (rows `stride` bytes apart) for one or two rows, `x` `n_blocks` tile
/// blocks of the weight's dot type.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn tile_rows(
    weight_type: GgmlType,
    pair: bool,
    w: &[u8],
    stride: usize,
    x: &[u8],
    n_blocks: usize,
    dst: &mut [[f32; TILE]; 2],
) {
    // SAFETY (every arm): the contract, the format matched.
    unsafe {
        match (weight_type, pair) {
            (GgmlType::Q4_K, true) => q4_k_tile::<2, FOUR_MIN_LANES>(w, stride, x, n_blocks, dst),
            (GgmlType::Q4_K, false) => {
                q4_k_tile::<1, FOUR_MIN_LANES>(w, stride, x, n_blocks, first_mut(dst))
            }
            (GgmlType::Q5_K, true) => q4_k_tile::<2, ONE_MIN_CHAIN>(w, stride, x, n_blocks, dst),
            (GgmlType::Q5_K, false) => {
                q4_k_tile::<1, ONE_MIN_CHAIN>(w, stride, x, n_blocks, first_mut(dst))
            }
            (GgmlType::Q2_K, true) => q2_k_tile::<2, WITH_MINS>(w, stride, x, n_blocks, dst),
            (GgmlType::Q2_K, false) => {
                q2_k_tile::<1, WITH_MINS>(w, stride, x, n_blocks, first_mut(dst))
            }
            (GgmlType::Q3_K, true) => q2_k_tile::<2, NO_MINS>(w, stride, x, n_blocks, dst),
            (GgmlType::Q3_K, false) => {
                q2_k_tile::<1, NO_MINS>(w, stride, x, n_blocks, first_mut(dst))
            }
            (GgmlType::Q6_K, true) => q6_k_tile::<2>(w, stride, x, n_blocks, dst),
            (GgmlType::Q6_K, false) => q6_k_tile::<1>(w, stride, x, n_blocks, first_mut(dst)),
            (GgmlType::IQ1_M, _) => {
                let (first, second) = dst.split_at_mut(1);
                iq1_m_tile(w, x, n_blocks, &mut first[0]);
                if pair {
                    iq1_m_tile(&w[stride..], x, n_blocks, &mut second[0]);
                }
            }
            (GgmlType::IQ4_XS, true) => grid_tile::<QUAD_PRODUCTS, 2>(w, stride, x, n_blocks, dst),
            (GgmlType::IQ4_XS, false) => {
                let one = first_mut(dst);
                grid_tile::<QUAD_PRODUCTS, 1>(w, stride, x, n_blocks, one)
            }
            (t, true) if plain_grid(t).is_some() => {
                grid_tile::<PAIR_SUMS, 2>(w, stride, x, n_blocks, dst)
            }
            (t, false) if plain_grid(t).is_some() => {
                let one = first_mut(dst);
                grid_tile::<PAIR_SUMS, 1>(w, stride, x, n_blocks, one)
            }
            (GgmlType::Q4_1 | GgmlType::Q5_1, true) => {
                offset32_tile::<2>(w, stride, x, n_blocks, dst)
            }
            (GgmlType::Q4_1 | GgmlType::Q5_1, false) => {
                offset32_tile::<1>(w, stride, x, n_blocks, first_mut(dst))
            }
            (GgmlType::IQ4_NL, true) => iq4_nl_tile::<2>(w, stride, x, n_blocks, dst),
            (GgmlType::IQ4_NL, false) => iq4_nl_tile::<1>(w, stride, x, n_blocks, first_mut(dst)),
            (_, true) => block32_tile::<2>(w, stride, x, n_blocks, dst),
            (_, false) => block32_tile::<1>(w, stride, x, n_blocks, first_mut(dst)),
        }
    }
}

/// [`run`] for Q4_K / Q6_K through [`crate::amx`]: sixteen weight rows unpacked at a
/// time, then every token group against them.
///
/// # Safety
/// As [`run`], and [`crate::amx::available`] is true.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn run_amx(
    weight_type: GgmlType,
    w_rows: &[u8],
    row_bytes: usize,
    tiles: &ActTiles,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    let n_rows = w_rows.len() / row_bytes;
    let (src, _) = unpacked_block_bytes(weight_type);
    let n_sb = row_bytes / src;
    UNPACKED.with(|cell| {
        let mut buf = cell.borrow_mut();
        // SAFETY: AMX is available (caller).
        unsafe { crate::amx::tiles_begin() };
        let mut out = [[[0f32; TILE]; ROW_BLOCK]; 2];
        for r0 in (0..n_rows).step_by(crate::amx::ROWS) {
            let rows_here = crate::amx::ROWS.min(n_rows - r0);
            // SAFETY: AMX is available and the type is Q4_K or Q6_K.
            unsafe {
                crate::amx::unpack_block(
                    weight_type,
                    &w_rows[r0 * row_bytes..],
                    row_bytes,
                    &mut buf,
                )
            };
            let mut g = 0;
            while g < tiles.n_groups() {
                // SAFETY (both calls): tiles configured above; `buf` holds 16 unpacked rows
                // of `n_sb` super-blocks, each group `n_sb` raw tile super-blocks.
                let done = if tiles.n_groups() - g >= 2 {
                    let xs = [tiles.group(g), tiles.group(g + 1)];
                    unsafe { crate::amx::k_tile::<2>(weight_type, &buf, xs, n_sb, &mut out) };
                    2
                } else {
                    let one: &mut [_; 1] = (&mut out[..1]).try_into().expect("one group");
                    let xs = [tiles.group(g)];
                    unsafe { crate::amx::k_tile::<1>(weight_type, &buf, xs, n_sb, one) };
                    1
                };
                for (i, block) in out[..done].iter().enumerate() {
                    // SAFETY: the caller's contract on `out_ptr`.
                    unsafe {
                        let (at, tokens) = (((g + i) * TILE, r0), tiles.group_tokens(g + i));
                        store_block(block, rows_here, tokens, out_ptr, out_stride, at)
                    };
                }
                g += done;
            }
        }
        // SAFETY: as above.
        unsafe { crate::amx::tiles_end() };
    });
}

/// Writes `block[i][t]` (row `r0 + i`, token `t0 + t`) for the first `rows` rows and
/// the first `tokens` tokens to `out_ptr[(t0 + t)·out_stride + r0 + i]`: sixteen rows as
/// one transposed 64-byte store per token.
///
/// # Safety
/// The CPU has AVX-512 F; `out_ptr` is valid for those writes, unshared.
#[target_feature(enable = "avx512f")]
unsafe fn store_block(
    block: &[[f32; TILE]; ROW_BLOCK],
    rows: usize,
    tokens: usize,
    out_ptr: *mut f32,
    out_stride: usize,
    (t0, r0): (usize, usize),
) {
    if rows == ROW_BLOCK {
        // SAFETY: each block row is sixteen f32.
        let regs: [__m512; ROW_BLOCK] =
            std::array::from_fn(|i| unsafe { _mm512_loadu_ps(block[i].as_ptr()) });
        for (t, v) in transpose16(regs).into_iter().enumerate().take(tokens) {
            // SAFETY: the caller's contract.
            unsafe { _mm512_storeu_ps(out_ptr.add((t0 + t) * out_stride + r0), v) };
        }
    } else {
        for t in 0..tokens {
            for (i, row) in block[..rows].iter().enumerate() {
                // SAFETY: the caller's contract.
                unsafe { *out_ptr.add((t0 + t) * out_stride + r0 + i) = row[t] };
            }
        }
    }
}

/// A 16×16 transpose of registers: `result[t]` lane `i` = `r[i]` lane `t`.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    // Pairs of rows interleaved: within each 128-bit lane k, a[2i] holds columns
    // 4k, 4k+1 and a[2i+1] columns 4k+2, 4k+3 of rows 2i, 2i+1.
    let a: [__m512; 16] = std::array::from_fn(|j| {
        let (x, y) = (r[j & !1], r[j | 1]);
        if j % 2 == 0 {
            _mm512_unpacklo_ps(x, y)
        } else {
            _mm512_unpackhi_ps(x, y)
        }
    });
    // b[4j + c], lane k: rows 4j..4j+4 of column 4k + c.
    let b: [__m512; 16] = std::array::from_fn(|i| {
        let (j, c) = (i / 4, i % 4);
        let x = _mm512_castps_pd(a[4 * j + c / 2]);
        let y = _mm512_castps_pd(a[4 * j + 2 + c / 2]);
        _mm512_castpd_ps(if c % 2 == 0 {
            _mm512_unpacklo_pd(x, y)
        } else {
            _mm512_unpackhi_pd(x, y)
        })
    });
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        let (p, q, u, v) = (b[c], b[4 + c], b[8 + c], b[12 + c]);
        let e0 = _mm512_shuffle_f32x4::<0b01_00_01_00>(p, q);
        let e1 = _mm512_shuffle_f32x4::<0b11_10_11_10>(p, q);
        let f0 = _mm512_shuffle_f32x4::<0b01_00_01_00>(u, v);
        let f1 = _mm512_shuffle_f32x4::<0b11_10_11_10>(u, v);
        out[c] = _mm512_shuffle_f32x4::<0b10_00_10_00>(e0, f0);
        out[4 + c] = _mm512_shuffle_f32x4::<0b11_01_11_01>(e0, f0);
        out[8 + c] = _mm512_shuffle_f32x4::<0b10_00_10_00>(e1, f1);
        out[12 + c] = _mm512_shuffle_f32x4::<0b11_01_11_01>(e1, f1);
    }
    out
}

fn first_mut(out: &mut [[f32; TILE]; 2]) -> &mut [[f32; TILE]; 1] {
    let (first, _) = out.split_at_mut(1);
    first.try_into().expect("one row")
}

/// Sixteen lanes of i32 broadcast from the little-endian dword at `p`.
///
/// # Safety
/// `p..p + 4` is readable.
#[inline(always)]
unsafe fn splat_i32(p: *const u8) -> __m512i {
    // SAFETY: the caller's contract.
    _mm512_set1_epi32(unsafe { std::ptr::read_unaligned(p as *const i32) })
}

/// # Safety
/// `p..p + 4` is readable.
#[inline(always)]
unsafe fn splat_f32(p: *const u8) -> __m512 {
    // SAFETY: the caller's contract.
    _mm512_set1_ps(unsafe { std::ptr::read_unaligned(p as *const f32) })
}

/// The scalar twins' final lane sum, `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, for
/// sixteen tokens at once.
#[inline(always)]
fn lanes_sum(a: &[__m512; 8]) -> __m512 {
    // SAFETY (features): only called from functions enabling AVX-512 F.
    unsafe {
        _mm512_add_ps(
            _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
            _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
        )
    }
}

/// Q4_0 / Q5_0 / Q8_0 rows against one token group: `R` rows from `w` (stride
/// `stride`), `n_blocks` blocks each.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VNNI; `w` holds `R` rows of `n_blocks` unpacked blocks at
/// `stride`, `x` `n_blocks` tile blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn block32_tile<const R: usize>(
    w: &[u8],
    stride: usize,
    x: &[u8],
    n_blocks: usize,
    out: &mut [[f32; TILE]; R],
) {
    // SAFETY: the caller's contract.
    let acc = unsafe { block32_chains::<R>(w, stride, x, n_blocks, 0, 1) };
    for r in 0..R {
        // SAFETY: `out[r]` is sixteen f32.
        unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), lanes_sum(&acc[r])) };
    }
}

/// The eight lane chains of `R` rows over the blocks `first, first + step, …` below
/// `n_blocks`: per block `acc = fma(d_w·d_x, lane, acc)` for each lane, as the
/// single-token kernels.
///
/// # Safety
/// As [`block32_tile`]; only inlined into functions enabling AVX-512 F/BW/VNNI and FMA
/// (always inlined: as a call, its sixteen running lanes went back through memory on
/// every row pair of 896-wide rows).
#[inline(always)]
unsafe fn block32_chains<const R: usize>(
    w: &[u8],
    stride: usize,
    x: &[u8],
    n_blocks: usize,
    first: usize,
    step: usize,
) -> [[__m512; 8]; R] {
    assert!(w.len() >= (R - 1) * stride + n_blocks * W32_BLOCK);
    assert!(x.len() >= n_blocks * ACT32_BLOCK);
    let mut acc = [[_mm512_setzero_ps(); 8]; R];
    for b in (first..n_blocks).step_by(step) {
        let xt = x[b * ACT32_BLOCK..].as_ptr();
        // SAFETY: inside the tile block (asserted above).
        let xl: [__m512i; 8] =
            std::array::from_fn(|l| unsafe { _mm512_loadu_si512(xt.add(64 * l) as *const _) });
        // SAFETY: as above.
        let dx = unsafe { _mm512_loadu_ps(xt.add(512) as *const f32) };
        for r in 0..R {
            let wb = w[r * stride + b * W32_BLOCK..].as_ptr();
            // SAFETY: inside the unpacked block (asserted above).
            unsafe {
                let d = _mm512_mul_ps(splat_f32(wb.add(64)), dx);
                for l in 0..8 {
                    let lane = _mm512_dpbusd_epi32(
                        splat_i32(wb.add(32 + 4 * l)),
                        xl[l],
                        splat_i32(wb.add(4 * l)),
                    );
                    acc[r][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lane), acc[r][l]);
                }
            }
        }
    }
    acc
}

/// Q4_1 or Q5_1 rows against one Q8_1 token group, in the order of their single-token
/// kernel (`formats::q4_1::offset_dot`): [`block32_tile`]'s lanes, and the offset terms
/// `m_w·s_x` fused into one running float per token, added after the lane sum.
///
/// # Safety
/// As [`block32_tile`], with [`W32M_BLOCK`] unpacked blocks and [`ACT81_BLOCK`] tile
/// blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn offset32_tile<const R: usize>(
    w: &[u8],
    stride: usize,
    x: &[u8],
    n_blocks: usize,
    out: &mut [[f32; TILE]; R],
) {
    assert!(w.len() >= (R - 1) * stride + n_blocks * W32M_BLOCK);
    assert!(x.len() >= n_blocks * ACT81_BLOCK);
    let mut acc = [[_mm512_setzero_ps(); 8]; R];
    let mut offsets = [_mm512_setzero_ps(); R];
    for b in 0..n_blocks {
        let xt = x[b * ACT81_BLOCK..].as_ptr();
        // SAFETY (loads below): inside the tile block and the unpacked blocks (asserted
        // above).
        let xl: [__m512i; 8] =
            std::array::from_fn(|l| unsafe { _mm512_loadu_si512(xt.add(64 * l) as *const _) });
        // SAFETY: as above.
        let (dx, sx) = unsafe {
            (
                _mm512_loadu_ps(xt.add(512) as *const f32),
                _mm512_loadu_ps(xt.add(ACT81_SUM) as *const f32),
            )
        };
        for r in 0..R {
            let wb = w[r * stride + b * W32M_BLOCK..].as_ptr();
            // SAFETY: as above.
            unsafe {
                offsets[r] = _mm512_fmadd_ps(splat_f32(wb.add(W32M_M)), sx, offsets[r]);
                let d = _mm512_mul_ps(splat_f32(wb.add(64)), dx);
                for l in 0..8 {
                    let lane = _mm512_dpbusd_epi32(
                        splat_i32(wb.add(32 + 4 * l)),
                        xl[l],
                        splat_i32(wb.add(4 * l)),
                    );
                    acc[r][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lane), acc[r][l]);
                }
            }
        }
    }
    for r in 0..R {
        let sum = _mm512_add_ps(lanes_sum(&acc[r]), offsets[r]);
        // SAFETY: `out[r]` is sixteen f32.
        unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), sum) };
    }
}

/// IQ4_NL rows against one token group, in the order of their single-token kernel
/// (`formats::iq4_nl::dot`): blocks in pairs, even blocks into one set of eight lane
/// chains and odd blocks into another, the two sets added lane-wise and summed; an odd
/// last block then joins as one fused multiply-add of `d` with its whole integer sum.
/// The two sets are independent chains, so they are run one after the other: eight
/// lane registers a row at a time, which leaves room for two rows.
///
/// # Safety
/// As [`block32_tile`] (IQ4_NL blocks unpacked to signed levels).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn iq4_nl_tile<const R: usize>(
    w: &[u8],
    stride: usize,
    x: &[u8],
    n_blocks: usize,
    out: &mut [[f32; TILE]; R],
) {
    assert!(w.len() >= (R - 1) * stride + n_blocks * W32_BLOCK);
    assert!(x.len() >= n_blocks * ACT32_BLOCK);
    let paired = n_blocks & !1;
    // SAFETY: the caller's contract, for the first `paired` blocks.
    let (even, odd) = unsafe {
        (
            block32_chains::<R>(w, stride, x, paired, 0, 2),
            block32_chains::<R>(w, stride, x, paired, 1, 2),
        )
    };
    for r in 0..R {
        let both: [__m512; 8] = std::array::from_fn(|l| _mm512_add_ps(even[r][l], odd[r][l]));
        let mut sum = lanes_sum(&both);
        if paired < n_blocks {
            let xt = x[paired * ACT32_BLOCK..].as_ptr();
            let wb = w[r * stride + paired * W32_BLOCK..].as_ptr();
            // SAFETY: the last block of row r and of the tile (asserted above).
            unsafe {
                let d = _mm512_mul_ps(
                    splat_f32(wb.add(64)),
                    _mm512_loadu_ps(xt.add(512) as *const f32),
                );
                // Integer adds: exact in any order.
                let mut total = _mm512_setzero_si512();
                for l in 0..8 {
                    let lane = _mm512_dpbusd_epi32(
                        splat_i32(wb.add(32 + 4 * l)),
                        _mm512_loadu_si512(xt.add(64 * l) as *const _),
                        splat_i32(wb.add(4 * l)),
                    );
                    total = _mm512_add_epi32(total, lane);
                }
                sum = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(total), sum);
            }
        }
        // SAFETY: `out[r]` is sixteen f32.
        unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), sum) };
    }
}

/// [`grid_tile`] for IQ4_XS: its levels reach ±127, so even a pair of `(x+128)·w`
/// overflows 16 bits: quad sums by `vpdpbusd`, times the multiplier by a 32-bit multiply.
const QUAD_PRODUCTS: bool = false;
/// [`grid_tile`] for the IQ2/IQ3 grids (magnitudes ≤ 62): pair sums by `vpmaddubsw`,
/// times the multiplier and added by one `vpdpwssd`.
const PAIR_SUMS: bool = true;

/// IQ4_XS or IQ2/IQ3 grid rows against one token group, in the order of their
/// single-token kernels (`formats::iq4_xs::dot`, `formats::grids::grid_dot`): per
/// super-block eight integer lanes `Σ_g m·quad(g, l)` (the multiplier `m` of the quad's
/// 16 weights), one `fma(d_w·d_x, lane)` each, the lanes summed at the end and times the
/// format's final factor. The signed levels meet `x + 128`, the correction takes the 128
/// back off; the multiplier goes in as [`PAIR_SUMS`] or [`QUAD_PRODUCTS`] says. `R` rows
/// share each activation load (their float lanes wait in memory while the integer ones
/// run).
///
/// # Safety
/// As [`block32_tile`], with [`WGRID_BLOCK`] unpacked super-blocks and Q8_K tile
/// super-blocks (`x + 128`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn grid_tile<const PAIR_SUMS: bool, const R: usize>(
    w: &[u8],
    stride: usize,
    x: &[u8],
    n_blocks: usize,
    out: &mut [[f32; TILE]; R],
) {
    assert!(w.len() >= (R - 1) * stride + n_blocks * WGRID_BLOCK);
    assert!(x.len() >= n_blocks * ACTK_BLOCK);
    if n_blocks == 0 {
        *out = [[0.0; TILE]; R];
        return;
    }
    let mut acc = [[_mm512_setzero_ps(); 8]; R];
    let zero = _mm512_setzero_si512();
    for b in 0..n_blocks {
        let xt = x[b * ACTK_BLOCK..].as_ptr();
        let wbs: [*const u8; R] =
            std::array::from_fn(|r| w[r * stride + b * WGRID_BLOCK..].as_ptr());
        // SAFETY (every load below): inside the tile super-block and the unpacked
        // super-blocks (asserted above).
        let mut lanes: [[__m512i; 8]; R] = std::array::from_fn(|r| {
            std::array::from_fn(|l| unsafe { splat_i32(wbs[r].add(WGRID_CORR + 4 * l)) })
        });
        for g in 0..8 {
            for l in 0..8 {
                // SAFETY: as above.
                unsafe {
                    // One activation load for every row.
                    let xl = _mm512_loadu_si512(xt.add(512 * g + 64 * l) as *const _);
                    for r in 0..R {
                        let wq = splat_i32(wbs[r].add(32 * g + 4 * l));
                        let m = splat_i32(wbs[r].add(WGRID_SC + 8 * g + 4 * (l / 4)));
                        if PAIR_SUMS {
                            // Pairs of `(x+128)·w` with |w| ≤ 62 stay inside 16 bits
                            // (2·255·62), so `vpmaddubsw` never saturates; `vpdpwssd`
                            // by `(m, m)` adds both pairs times `m`.
                            let pairs = _mm512_maddubs_epi16(xl, wq);
                            lanes[r][l] = _mm512_dpwssd_epi32(lanes[r][l], pairs, m);
                        } else {
                            let quad = _mm512_dpbusd_epi32(zero, xl, wq);
                            lanes[r][l] =
                                _mm512_add_epi32(lanes[r][l], _mm512_mullo_epi32(quad, m));
                        }
                    }
                }
            }
        }
        // SAFETY: as above.
        let dx = unsafe { _mm512_loadu_ps(xt.add(ACTK_DX) as *const f32) };
        for r in 0..R {
            // SAFETY: as above.
            let d = _mm512_mul_ps(dx, unsafe { splat_f32(wbs[r].add(WGRID_D)) });
            for (a, &lane) in acc[r].iter_mut().zip(&lanes[r]) {
                *a = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lane), *a);
            }
        }
    }
    for r in 0..R {
        // SAFETY: the last block's factor (every block holds the same); `out[r]` is
        // sixteen f32.
        unsafe {
            let last = w[r * stride + (n_blocks - 1) * WGRID_BLOCK..].as_ptr();
            let post = splat_f32(last.add(WGRID_POST));
            _mm512_storeu_ps(out[r].as_mut_ptr(), _mm512_mul_ps(post, lanes_sum(&acc[r])));
        }
    }
}

/// One IQ1_M row against one token group, in the order of its single-token kernel
/// (`formats::iq1_m::dot`): per super-block two sets of eight integer lanes, the grid's
/// and the offsets' (`Σ_g m·quad(g, l)`, one `vpdpbusd` each with the multipliers
/// folded into the unpacked bytes), each fused with `d_w·d_x` into its own running
/// lanes; at the end `sum(grid) + 0.125·sum(offsets)`.
///
/// # Safety
/// As [`block32_tile`] with `R` = 1, [`WIQ1M_BLOCK`] unpacked super-blocks and Q8_K
/// tile super-blocks (`x + 128`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn iq1_m_tile(w: &[u8], x: &[u8], n_blocks: usize, out: &mut [f32; TILE]) {
    assert!(w.len() >= n_blocks * WIQ1M_BLOCK);
    assert!(x.len() >= n_blocks * ACTK_BLOCK);
    let mut acc_grid = [_mm512_setzero_ps(); 8];
    let mut acc_offsets = [_mm512_setzero_ps(); 8];
    for b in 0..n_blocks {
        let xt = x[b * ACTK_BLOCK..].as_ptr();
        let wb = w[b * WIQ1M_BLOCK..].as_ptr();
        // SAFETY (every load below): inside the tile super-block and the unpacked
        // super-block (asserted above).
        let mut grid: [__m512i; 8] =
            std::array::from_fn(|l| unsafe { splat_i32(wb.add(WIQ1M_CORR + 4 * l)) });
        let mut offsets: [__m512i; 8] =
            std::array::from_fn(|l| unsafe { splat_i32(wb.add(WIQ1M_OFFSET_CORR + 4 * l)) });
        for g in 0..8 {
            for l in 0..8 {
                // SAFETY: as above.
                unsafe {
                    let xl = _mm512_loadu_si512(xt.add(512 * g + 64 * l) as *const _);
                    let at = 32 * g + 4 * l;
                    grid[l] = _mm512_dpbusd_epi32(grid[l], xl, splat_i32(wb.add(at)));
                    offsets[l] =
                        _mm512_dpbusd_epi32(offsets[l], xl, splat_i32(wb.add(WIQ1M_OFFSETS + at)));
                }
            }
        }
        // SAFETY: as above.
        let d = unsafe {
            _mm512_mul_ps(
                _mm512_loadu_ps(xt.add(ACTK_DX) as *const f32),
                splat_f32(wb.add(WIQ1M_D)),
            )
        };
        for l in 0..8 {
            acc_grid[l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(grid[l]), acc_grid[l]);
            acc_offsets[l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(offsets[l]), acc_offsets[l]);
        }
    }
    let delta = _mm512_set1_ps(crate::formats::iq1_s::DELTA);
    let sum = _mm512_add_ps(
        lanes_sum(&acc_grid),
        _mm512_mul_ps(delta, lanes_sum(&acc_offsets)),
    );
    // SAFETY: `out` is sixteen f32.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), sum) };
}

/// [`q4_k_tile`]'s min term as Q4_K's single-token kernel keeps it: four lanes of
/// `−dmin·(m·s + m·s)`, summed `(m0 + m2) + (m1 + m3)` at the end.
const FOUR_MIN_LANES: bool = false;
/// [`q4_k_tile`]'s min term as Q5_K's single-token kernel keeps it: the whole integer
/// `Σ m·s` of a super-block, fused with `−dmin` into one running float.
const ONE_MIN_CHAIN: bool = true;

/// Q4_K or Q5_K rows against one token group (see [`block32_tile`]): the two share the
/// lane integers (levels 0..15 or 0..31, sub-block scales by `vpdpwssd`) and differ in
/// how the min term is summed (`MIN_CHAIN`: [`FOUR_MIN_LANES`] or [`ONE_MIN_CHAIN`]).
///
/// # Safety
/// As [`block32_tile`], with Q4_K / Q5_K unpacked super-blocks and Q8_K tile
/// super-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn q4_k_tile<const R: usize, const MIN_CHAIN: bool>(
    w: &[u8],
    stride: usize,
    x: &[u8],
    n_blocks: usize,
    out: &mut [[f32; TILE]; R],
) {
    assert!(w.len() >= (R - 1) * stride + n_blocks * WQ4K_BLOCK);
    assert!(x.len() >= n_blocks * ACTK_BLOCK);
    let mut acc = [[_mm512_setzero_ps(); 8]; R];
    let mut acc_min = [[_mm512_setzero_ps(); 4]; R];
    let zero = _mm512_setzero_si512();
    for b in 0..n_blocks {
        let xt = x[b * ACTK_BLOCK..].as_ptr();
        let wbs: [*const u8; R] =
            std::array::from_fn(|r| w[r * stride + b * WQ4K_BLOCK..].as_ptr());
        // SAFETY: inside the tile and unpacked super-blocks (asserted above).
        let lanes = unsafe { scaled_lanes_paired::<R>(&wbs, xt, WQ4K_CORR, WQ4K_SC) };
        // SAFETY: inside the tile / unpacked super-blocks.
        unsafe {
            let dx = _mm512_loadu_ps(xt.add(ACTK_DX) as *const f32);
            for r in 0..R {
                let d = _mm512_mul_ps(dx, splat_f32(wbs[r].add(WQ4K_D)));
                for l in 0..8 {
                    acc[r][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes[r][l]), acc[r][l]);
                }
                let neg_dmin = _mm512_mul_ps(dx, splat_f32(wbs[r].add(WQ4K_D + 4)));
                let min_sum = |m: usize, acc: __m512i| {
                    let sums = _mm512_loadu_si512(xt.add(ACTK_MINS + 64 * m) as *const _);
                    _mm512_dpwssd_epi32(acc, sums, splat_i32(wbs[r].add(WQ4K_MINS + 4 * m)))
                };
                if MIN_CHAIN == ONE_MIN_CHAIN {
                    let total = (0..4).fold(zero, |acc, m| min_sum(m, acc));
                    acc_min[r][0] =
                        _mm512_fmadd_ps(neg_dmin, _mm512_cvtepi32_ps(total), acc_min[r][0]);
                } else {
                    for m in 0..4 {
                        let prod = min_sum(m, zero);
                        acc_min[r][m] =
                            _mm512_fmadd_ps(neg_dmin, _mm512_cvtepi32_ps(prod), acc_min[r][m]);
                    }
                }
            }
        }
    }
    for r in 0..R {
        let m = &acc_min[r];
        let mins = if MIN_CHAIN == ONE_MIN_CHAIN {
            m[0]
        } else {
            _mm512_add_ps(_mm512_add_ps(m[0], m[2]), _mm512_add_ps(m[1], m[3]))
        };
        // SAFETY: `out[r]` is sixteen f32.
        unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), _mm512_add_ps(lanes_sum(&acc[r]), mins)) };
    }
}

/// [`q2_k_tile`] with Q2_K's min term.
const WITH_MINS: bool = true;
/// [`q2_k_tile`] for Q3_K: the same lanes without a min term (`formats::q3_k::dot`).
const NO_MINS: bool = false;

/// Q2_K (or, without `MINS`, Q3_K) rows against one token group, in the order of its
/// single-token kernel (`formats::q2_k::dot`): per super-block first the min lanes
/// `m[2l]·s[2l] + m[2l+1]·s[2l+1]` fused with `−d_x·dmin`, then the level lanes
/// `Σ (x+128)·(sc·q) − 128·Σ sc·q` ([`prescaled_lanes`]) fused with `d_x·d_w`, into the
/// same eight running lanes.
///
/// # Safety
/// As [`block32_tile`], with [`WQ2K_BLOCK`] unpacked super-blocks and Q8_K tile
/// super-blocks (`x + 128`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn q2_k_tile<const R: usize, const MINS: bool>(
    w: &[u8],
    stride: usize,
    x: &[u8],
    n_blocks: usize,
    out: &mut [[f32; TILE]; R],
) {
    assert!(w.len() >= (R - 1) * stride + n_blocks * WQ2K_BLOCK);
    assert!(x.len() >= n_blocks * ACTK_BLOCK);
    let mut acc = [[_mm512_setzero_ps(); 8]; R];
    let zero = _mm512_setzero_si512();
    for b in 0..n_blocks {
        let xt = x[b * ACTK_BLOCK..].as_ptr();
        let wbs: [*const u8; R] =
            std::array::from_fn(|r| w[r * stride + b * WQ2K_BLOCK..].as_ptr());
        // SAFETY (every load below): inside the tile super-block and the unpacked
        // super-blocks (asserted above).
        let lanes = unsafe { prescaled_lanes::<R>(&wbs, xt) };
        // SAFETY: as above.
        unsafe {
            let dx = _mm512_loadu_ps(xt.add(ACTK_DX) as *const f32);
            for r in 0..R {
                let neg_dmin = _mm512_mul_ps(dx, splat_f32(wbs[r].add(WQ2K_D + 4)));
                for l in (0..8).filter(|_| MINS) {
                    let sums = _mm512_loadu_si512(xt.add(ACTK_BSUMS + 64 * l) as *const _);
                    let mins =
                        _mm512_dpwssd_epi32(zero, sums, splat_i32(wbs[r].add(WQ2K_MINS + 4 * l)));
                    acc[r][l] = _mm512_fmadd_ps(neg_dmin, _mm512_cvtepi32_ps(mins), acc[r][l]);
                }
                let d = _mm512_mul_ps(dx, splat_f32(wbs[r].add(WQ2K_D)));
                for l in 0..8 {
                    acc[r][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes[r][l]), acc[r][l]);
                }
            }
        }
    }
    for r in 0..R {
        // SAFETY: `out[r]` is sixteen f32.
        unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), lanes_sum(&acc[r])) };
    }
}

/// Each row's eight lanes started at its corrections (dwords at `corr_at`), which take
/// the activations' `+ 128` back off: the start of [`prescaled_lanes`] and
/// [`scaled_lanes_paired`].
///
/// # Safety
/// `wbs[r]` points at whole unpacked super-blocks; only inlined into functions enabling
/// AVX-512 F.
#[inline(always)]
unsafe fn corrected_lanes<const R: usize>(
    wbs: &[*const u8; R],
    corr_at: usize,
) -> [[__m512i; 8]; R] {
    // SAFETY: the caller's contract.
    std::array::from_fn(|r| {
        std::array::from_fn(|l| unsafe { splat_i32(wbs[r].add(corr_at + 4 * l)) })
    })
}

/// The eight integer lanes of `R` unpacked Q2_K / Q3_K super-blocks (`wbs`) against one
/// tile super-block (`xt`): each row's lane corrections plus `Σ_g quad(g, l)`, the quads
/// `Σ (x+128)·w` of the levels already multiplied by their scale when unpacked (a scale
/// per 16 weights, each product a byte: [`WQ2K_BLOCK`]). So one `vpdpbusd` per group and
/// lane is the whole integer part: no scale step, where scaling the quads afterwards
/// took a `vpdpwssd` per two groups and a shift to join them (their pipe is
/// `vpdpbusd`'s on Zen 4). The lane integers are the same: `Σ sc·q·x` in any grouping.
///
/// # Safety
/// `wbs[r]` and `xt` point at whole unpacked and tile super-blocks; only inlined into
/// functions enabling AVX-512 F/BW/VNNI.
#[inline(always)]
unsafe fn prescaled_lanes<const R: usize>(
    wbs: &[*const u8; R],
    xt: *const u8,
) -> [[__m512i; 8]; R] {
    // SAFETY (every load below): the caller's contract.
    let mut lanes = unsafe { corrected_lanes(wbs, WQ2K_CORR) };
    for g in 0..8 {
        for l in 0..8 {
            // SAFETY: as above.
            let x = unsafe { _mm512_loadu_si512(xt.add(512 * g + 64 * l) as *const _) };
            for r in 0..R {
                // SAFETY: as above.
                let w = unsafe { splat_i32(wbs[r].add(32 * g + 4 * l)) };
                lanes[r][l] = _mm512_dpbusd_epi32(lanes[r][l], x, w);
            }
        }
    }
    lanes
}

/// The eight integer lanes of `R` unpacked K super-blocks with one scale per 32 weights
/// and levels `0..32` (Q4_K, Q5_K) against one tile super-block, with a
/// quarter fewer dot-product instructions: the quads of two groups share one dword, the
/// second one's shifted into the high word (`quad(g+1)·2¹⁶ + quad(g)`; a quad is at most
/// `255·31·4 < 2¹⁵`, so neither word overflows or turns negative), and one `vpdpwssd`
/// multiplies both by their scales `(sc_g, sc_g+1)` and adds them to the lane. The
/// lane integers are the same: integer sums in any order.
///
/// # Safety
/// `wbs[r]` and `xt` point at whole unpacked and tile super-blocks; only inlined into
/// functions enabling AVX-512 F/BW/VNNI; the levels are `0..32` and the scales (dwords at
/// `sc_at`) `0..64`.
#[inline(always)]
unsafe fn scaled_lanes_paired<const R: usize>(
    wbs: &[*const u8; R],
    xt: *const u8,
    corr_at: usize,
    sc_at: usize,
) -> [[__m512i; 8]; R] {
    let zero = _mm512_setzero_si512();
    // SAFETY (every load below): the caller's contract.
    let mut lanes = unsafe { corrected_lanes(wbs, corr_at) };
    for g in (0..8).step_by(2) {
        // SAFETY: as above.
        let sc: [__m512i; R] = std::array::from_fn(|r| unsafe {
            let lo = std::ptr::read_unaligned(wbs[r].add(sc_at + 4 * g) as *const u32);
            let hi = std::ptr::read_unaligned(wbs[r].add(sc_at + 4 * g + 4) as *const u32);
            _mm512_set1_epi32((lo | hi << 16) as i32)
        });
        for l in 0..8 {
            // SAFETY: as above.
            let (x_lo, x_hi) = unsafe {
                (
                    _mm512_loadu_si512(xt.add(512 * g + 64 * l) as *const _),
                    _mm512_loadu_si512(xt.add(512 * (g + 1) + 64 * l) as *const _),
                )
            };
            for r in 0..R {
                // SAFETY: as above.
                unsafe {
                    let hi = _mm512_dpbusd_epi32(
                        zero,
                        x_hi,
                        splat_i32(wbs[r].add(32 * (g + 1) + 4 * l)),
                    );
                    let both = _mm512_dpbusd_epi32(
                        _mm512_slli_epi32::<16>(hi),
                        x_lo,
                        splat_i32(wbs[r].add(32 * g + 4 * l)),
                    );
                    lanes[r][l] = _mm512_dpwssd_epi32(lanes[r][l], both, sc[r]);
                }
            }
        }
    }
    lanes
}

/// Two quads (each in `i16` range, signed) as the words of one dword, `lo` low, for one
/// `vpdpwssd` with both their scales: the high one moved up by a shift and the two
/// joined by a word blend, since a sum would borrow from the high word where `lo` is
/// negative. On Zen 4 the blend runs beside the products and the shift takes a third of
/// a product's slot (`benches/pipes`), where a second `vpdpwssd` would take a whole one.
///
/// # Safety
/// Only inlined into functions enabling AVX-512 F/BW.
#[inline(always)]
pub(crate) unsafe fn join_quads(lo: __m512i, hi: __m512i) -> __m512i {
    const HIGH_WORDS: __mmask32 = 0xAAAA_AAAA;
    _mm512_mask_blend_epi16(HIGH_WORDS, lo, _mm512_slli_epi32::<16>(hi))
}

/// Q6_K rows against one token group (see [`block32_tile`]).
///
/// # Safety
/// As [`block32_tile`], with Q6_K unpacked super-blocks and Q8_K tile super-blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn q6_k_tile<const R: usize>(
    w: &[u8],
    stride: usize,
    x: &[u8],
    n_blocks: usize,
    out: &mut [[f32; TILE]; R],
) {
    assert!(w.len() >= (R - 1) * stride + n_blocks * WQ6K_BLOCK);
    assert!(x.len() >= n_blocks * ACTK_BLOCK);
    let mut acc = [[_mm512_setzero_ps(); 8]; R];
    let zero = _mm512_setzero_si512();
    for b in 0..n_blocks {
        let xt = x[b * ACTK_BLOCK..].as_ptr();
        let wbs: [*const u8; R] =
            std::array::from_fn(|r| w[r * stride + b * WQ6K_BLOCK..].as_ptr());
        // The −32·(b·s + b·s) term starts each lane. (Loops, not `from_fn` closures:
        // a closure is compiled without this function's features, and this one was
        // called per block with its lanes returned through memory.)
        let mut lanes = [[zero; 8]; R];
        for (lanes, wb) in lanes.iter_mut().zip(wbs) {
            for (l, lane) in lanes.iter_mut().enumerate() {
                // SAFETY (every load below): inside the tile / unpacked super-blocks
                // (asserted above).
                *lane = unsafe {
                    _mm512_dpwssd_epi32(
                        zero,
                        _mm512_loadu_si512(xt.add(ACTK_BSUMS + 64 * l) as *const _),
                        splat_i32(wb.add(WQ6K_BSUMS + 4 * l)),
                    )
                };
            }
        }
        // SAFETY: inside the tile / unpacked super-blocks (asserted above).
        unsafe { add_paired_quads::<R>(&wbs, xt, WQ6K_SC, &mut lanes) };
        // SAFETY: inside the tile / unpacked super-blocks.
        unsafe {
            let dx = _mm512_loadu_ps(xt.add(ACTK_DX) as *const f32);
            for r in 0..R {
                let d = _mm512_mul_ps(dx, splat_f32(wbs[r].add(WQ6K_D)));
                for l in 0..8 {
                    acc[r][l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes[r][l]), acc[r][l]);
                }
            }
        }
    }
    for r in 0..R {
        // SAFETY: `out[r]` is sixteen f32.
        unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), lanes_sum(&acc[r])) };
    }
}

/// Adds `Σ_g sc·quad(g, l)` of `R` unpacked super-blocks (`wbs`: 256 one-byte levels, then
/// the scale word pairs at `sc_at`, `(sc[4p + h], sc[4p + 2 + h])` for group pair `p` and
/// lanes `4h..4h + 4`) against one tile super-block (`xt`) to each row's eight lanes.
/// The top bit of the tile's `x + 128` is flipped to give `x` back as a signed byte, so
/// the unsigned levels (Q6_K's `0..64`) can be `vpdpbusd`'s unsigned operand and the
/// quad `Σ x·q` (|·| ≤ 128·63·4 < 2¹⁵) needs no correction. Two groups' quads
/// of a lane share one dword as words ([`join_quads`]), so one `vpdpwssd` multiplies both
/// by their scales: three products on the pipe `vpdpbusd` and FMA share instead of four.
/// The lane integers are the same.
///
/// # Safety
/// `wbs[r]` and `xt` point at whole unpacked and tile super-blocks; only inlined into
/// functions enabling AVX-512 F/BW/VNNI.
#[inline(always)]
unsafe fn add_paired_quads<const R: usize>(
    wbs: &[*const u8; R],
    xt: *const u8,
    sc_at: usize,
    lanes: &mut [[__m512i; 8]; R],
) {
    let zero = _mm512_setzero_si512();
    let flip = _mm512_set1_epi8(i8::MIN);
    for pair in 0..4 {
        let g = 2 * pair;
        // (Loops, not `from_fn` closures: see `q6_k_tile`.)
        let mut sc = [[zero; 2]; R];
        for (sc, wb) in sc.iter_mut().zip(wbs) {
            for (h, sc) in sc.iter_mut().enumerate() {
                // SAFETY (every load below): the caller's contract.
                *sc = unsafe { splat_i32(wb.add(sc_at + 4 * (2 * pair + h))) };
            }
        }
        for l in 0..8 {
            // SAFETY: as above.
            let (x_lo, x_hi) = unsafe {
                (
                    _mm512_xor_si512(
                        _mm512_loadu_si512(xt.add(512 * g + 64 * l) as *const _),
                        flip,
                    ),
                    _mm512_xor_si512(
                        _mm512_loadu_si512(xt.add(512 * (g + 1) + 64 * l) as *const _),
                        flip,
                    ),
                )
            };
            for r in 0..R {
                // SAFETY: as above.
                let (w_lo, w_hi) = unsafe {
                    (
                        splat_i32(wbs[r].add(32 * g + 4 * l)),
                        splat_i32(wbs[r].add(32 * (g + 1) + 4 * l)),
                    )
                };
                // `vpdpbusd`'s first operand is the unsigned one.
                let (lo, hi) = (
                    _mm512_dpbusd_epi32(zero, w_lo, x_lo),
                    _mm512_dpbusd_epi32(zero, w_hi, x_hi),
                );
                // SAFETY: the caller's features.
                let both = unsafe { join_quads(lo, hi) };
                lanes[r][l] = _mm512_dpwssd_epi32(lanes[r][l], both, sc[r][l / 4]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SplitMix64 bytes.
    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                (z ^ (z >> 31)) as u8
            })
            .collect()
    }

    /// Random blocks with finite f16 scales (the unpackers copy them as they are).
    fn blocks(seed: u64, block: usize, scale_at: &[usize]) -> Vec<Vec<u8>> {
        (0..64)
            .map(|i| {
                let mut b = bytes(seed + i, block);
                for &at in scale_at {
                    b[at..at + 2].copy_from_slice(&0x3c00u16.wrapping_add(i as u16).to_le_bytes());
                }
                b
            })
            .collect()
    }

    #[test]
    fn simd_unpack_is_its_scalar_twin() {
        if !available() {
            return;
        }
        for wb in blocks(1, Q4_K_BYTES, &[0, q4_k::DMIN]) {
            let (mut a, mut b) = (vec![0u8; WQ4K_BLOCK], vec![0u8; WQ4K_BLOCK]);
            unpack_q4_k(&wb, &mut a);
            // SAFETY: `available` checked the features.
            unsafe { unpack_q4_k_avx512(&wb, &mut b) };
            assert_eq!(a, b, "Q4_K");
        }
        for wb in blocks(2, Q6_K_BYTES, &[q6_k::D]) {
            let (mut a, mut b) = (vec![0u8; WQ6K_BLOCK], vec![0u8; WQ6K_BLOCK]);
            unpack_q6_k(&wb, &mut a);
            // SAFETY: as above.
            unsafe { unpack_q6_k_avx512(&wb, &mut b) };
            assert_eq!(a, b, "Q6_K");
        }
        for wb in blocks(3, iq1_m::BYTES, &[]) {
            let (mut a, mut b) = (vec![0u8; WIQ1M_BLOCK], vec![0u8; WIQ1M_BLOCK]);
            unpack_iq1_m_scalar(&wb, &mut a);
            unpack_iq1_m(&wb, &mut b);
            assert_eq!(a, b, "IQ1_M");
        }
        for wb in blocks(9, iq4_xs::BYTES, &[0]) {
            let (mut a, mut b) = (vec![0u8; WGRID_BLOCK], vec![0u8; WGRID_BLOCK]);
            unpack_iq4_xs_scalar(&wb, &mut a);
            unpack_iq4_xs(&wb, &mut b);
            assert_eq!(a, b, "IQ4_XS");
        }
        let grids = [
            GgmlType::IQ2_XXS,
            GgmlType::IQ2_XS,
            GgmlType::IQ2_S,
            GgmlType::IQ3_XXS,
            GgmlType::IQ3_S,
        ];
        for (seed, ty) in (4..).zip(grids) {
            let block = plain_grid(ty).unwrap().block_bytes;
            for wb in blocks(seed, block, &[0]) {
                let (mut a, mut b) = (vec![0u8; WGRID_BLOCK], vec![0u8; WGRID_BLOCK]);
                unpack_grid_scalar(ty, &wb, &mut a);
                unpack_grid(ty, &wb, &mut b);
                assert_eq!(a, b, "{ty:?}");
            }
        }
    }
}
