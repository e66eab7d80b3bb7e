//! AVX-512 VNNI dot kernels (x86-64 with AVX-512 F/BW/VL/VNNI on top of AVX2, FMA, F16C).
//!
//! Same lane integers as the scalar twins in [`crate::dot_scalar`] (and as
//! [`crate::avx2`]), exactly; what changes is how they are formed:
//!
//! | weight | lane integers (i32, exact) | how |
//! |---|---|---|
//! | Q4_0 / Q5_0 | `Σ q·x − off·Σ x` | two `dpbusd` (u8×i8 → i32, no saturation) |
//! | Q8_0 | `Σ (w+128)·x − 128·Σ x` | bias the weights to u8, two `dpbusd` (exact for every byte) |
//! | Q4_K / Q5_K | `Σ sc·Σ q·x` | 64 quants per 512-bit `maddubs`, then `dpwssd` by the scales |
//! | Q6_K | `Σ sc·Σ q·x − 32·Σ sc·bsum` | as Q4_K, offset from the bsums |
//! | Q4_1 / Q5_1 | `Σ q·x` (offset `m·s` apart) | one `dpbusd` |
//! | IQ4_NL | `Σ (v+128)·x − 128·Σ x` | table biased to u8 by `pshufb`, two `dpbusd` |
//! | Q2_K (four rows) | `Σ sc·Σ q·x`; mins `Σ m·bsum` | `pshufb` from `[0, s, 2s, 3s]` gives `s·q`, one `dpbusd` |
//! | Q3_K (four rows) | `Σ sc·Σ q·x` | `dpbusd` of `q + 4` from `−4·Σ x`, `dpwssd` by the scale |
//!
//! The 32-element formats use 256-bit registers (one block each); the K formats use
//! 512-bit ones (two 32-quant groups per instruction, folded to eight lanes once per
//! super-block by [`fold_halves`]). The float part is [`crate::avx2`]'s, so Q4_0, Q5_0,
//! Q8_0, Q4_K and Q6_K are bit-identical to the scalar twins and to the AVX2 tier.

use std::arch::x86_64::*;

use nx_gguf::GgmlType;

use crate::avx2::{
    block_of_each, common_blocks, f16_scalar, f16_splat, f32_splat, hsum4_ps, hsum_epi32,
    hsum_epi32_8, hsum_ps, k4_min_lanes, lanes8_chain, lanes8_chain4, load16, load32,
    prefetch_ahead, q4_1_levels, Iq4nlAcc,
};
use crate::avx2_rows4::checked_entry_rows4;
use crate::dot_scalar::DotKernel;
use crate::formats::{
    iq4_nl, iq4_xs, mxfp4, q2_k, q3_k, q4_1, q4_k, q5_0, q5_1, q6_k, q8_1, q8_k, read_f32,
    read_u32, scales_mins_k4_packed, Q4_0_BYTES, Q4_K_BYTES, Q5_0_BYTES, Q5_K_BYTES, Q6_K_BYTES,
    Q8_0_BYTES, Q8_K_BYTES,
};
use crate::formats::{DotKernel4, DotKernelRows4};

/// True when this CPU can run the kernels of this module.
pub(crate) fn available() -> bool {
    crate::tier::has_avx512_vnni_features()
}

/// The AVX-512 VNNI kernel of a weight type (for BF16 the AVX512_BF16 one, where the CPU
/// has it); `None` for types without one (F32, F16: their AVX2 kernels serve) or when
/// this CPU lacks one of the features.
pub(crate) fn kernel(weight_type: GgmlType) -> Option<DotKernel> {
    if !available() {
        return None;
    }
    let k: DotKernel = match weight_type {
        GgmlType::Q4_0 => dot_q4_0_q8_0,
        GgmlType::Q5_0 => dot_q5_0_q8_0,
        GgmlType::Q8_0 => dot_q8_0_q8_0,
        GgmlType::Q4_K => dot_q4_k_q8_k,
        GgmlType::Q5_K => dot_q5_k_q8_k,
        GgmlType::Q6_K => dot_q6_k_q8_k,
        GgmlType::Q4_1 => dot_q4_1_q8_1,
        GgmlType::Q5_1 => dot_q5_1_q8_1,
        GgmlType::IQ4_NL => dot_iq4_nl_q8_0,
        GgmlType::IQ4_XS => dot_iq4_xs_q8_k,
        GgmlType::MXFP4 => dot_mxfp4_q8_0,
        GgmlType::BF16 => return crate::bf16_x86::avx512_kernel(),
        GgmlType::IQ2_XXS if crate::grids_avx512::available() => {
            crate::grids_avx512::dot_iq2_xxs_q8_k
        }
        GgmlType::IQ3_XXS if crate::grids_avx512::available() => {
            crate::grids_avx512::dot_iq3_xxs_q8_k
        }
        GgmlType::IQ3_S if crate::grids_avx512::available() => crate::grids_avx512::dot_iq3_s_q8_k,
        GgmlType::IQ2_XS if crate::grids_avx512::available() => {
            crate::grids_avx512::dot_iq2_xs_q8_k
        }
        _ => return None,
    };
    Some(k)
}

/// Safe entry points: fn pointers to them leave this module only through [`kernel`],
/// which first checks the CPU features the implementations are compiled for.
macro_rules! checked_entry {
    ($($name:ident => $imp:ident),* $(,)?) => {$(
        fn $name(w: &[u8], x: &[u8]) -> f32 {
            // SAFETY: reachable only through `kernel`, which verified AVX-512 F/BW/VL/VNNI,
            // AVX2, FMA and F16C on this CPU; the implementation reads only inside whole
            // blocks of `w` and `x`.
            unsafe { $imp(w, x) }
        }
    )*};
}

checked_entry! {
    dot_q4_0_q8_0 => q4_0_impl,
    dot_q5_0_q8_0 => q5_0_impl,
    dot_q8_0_q8_0 => q8_0_impl,
    dot_q4_k_q8_k => q4_k_impl,
    dot_q5_k_q8_k => q5_k_impl,
    dot_q6_k_q8_k => q6_k_impl,
    dot_q4_1_q8_1 => q4_1_impl,
    dot_q5_1_q8_1 => q5_1_impl,
    dot_iq4_nl_q8_0 => iq4_nl_impl,
    dot_iq4_xs_q8_k => iq4_xs_impl,
    dot_mxfp4_q8_0 => mxfp4_impl,
}

/// 64 bytes at `bytes[offset..offset + 64]`.
///
/// # Safety
/// `offset + 64 <= bytes.len()`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn load64(bytes: &[u8], offset: usize) -> __m512i {
    debug_assert!(offset + 64 <= bytes.len());
    // SAFETY: in bounds by the caller's contract; unaligned load.
    unsafe { _mm512_loadu_si512(bytes.as_ptr().add(offset) as *const _) }
}

/// The two 256-bit halves of sixteen i32 lanes added: lane `l` of the result is lanes
/// `l` and `l + 8`. The K kernels keep quads of the even 32-quant groups in the lower
/// half and of the odd groups in the upper one, so this gives the scalar twins' eight
/// lanes (lane `l` = quads `4l..4l+4` of every group) exactly.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn fold_halves(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// A 512-bit vector of 32 words: the lower 16 are `lo`, the upper 16 `hi`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn halves_epi16(lo: i16, hi: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(lo)),
        _mm256_set1_epi16(hi),
    )
}

/// A 512-bit vector of 32 words, eight per 128-bit quarter: quarter `i` is `first + i`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn quarters_epi16(first: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set_m128i(
            _mm_set1_epi16(first + 1),
            _mm_set1_epi16(first),
        )),
        _mm256_set_m128i(_mm_set1_epi16(first + 3), _mm_set1_epi16(first + 2)),
    )
}

/// Q4_0 × Q8_0.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_0_impl(w: &[u8], x: &[u8]) -> f32 {
    let low4 = _mm_set1_epi8(0x0F);
    let eights = _mm256_set1_epi8(8);
    let zero = _mm256_setzero_si256();
    lanes8_chain!(w, x, Q4_0_BYTES, Q8_0_BYTES, |wb, xb| {
        // SAFETY: qs is bytes 2..18 of an 18-byte block; x quants are 2..34 of 34.
        let (qs, xq) = unsafe { (load16(wb, 2), load32(xb, 2)) };
        let lo = _mm_and_si128(qs, low4);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
        let q = _mm256_set_m128i(hi, lo);
        let sumi = _mm256_sub_epi32(
            _mm256_dpbusd_epi32(zero, q, xq),
            _mm256_dpbusd_epi32(zero, eights, xq),
        );
        let d = _mm256_mul_ps(f16_splat(wb, 0), f16_splat(xb, 0));
        (d, _mm256_cvtepi32_ps(sumi))
    })
}

/// Q5_0 × Q8_0: the fifth bits come straight from `qh` as a byte mask.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_0_impl(w: &[u8], x: &[u8]) -> f32 {
    let low4 = _mm_set1_epi8(0x0F);
    let sixteens = opaque_256(_mm256_set1_epi8(16));
    let zero = _mm256_setzero_si256();
    lanes8_chain!(w, x, Q5_0_BYTES, Q8_0_BYTES, |wb, xb| {
        // SAFETY: qs is bytes 6..22 of a 22-byte block; x quants are 2..34 of 34.
        let (qs, xq) = unsafe { (load16(wb, q5_0::QS), load32(xb, 2)) };
        let lo = _mm_and_si128(qs, low4);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
        let q4 = _mm256_set_m128i(hi, lo);
        // Bit p of qh is byte p's fifth bit; nibbles are < 16, so adding 16 sets it.
        let q = _mm256_mask_add_epi8(q4, read_u32(wb, q5_0::QH), q4, sixteens);
        let sumi = _mm256_sub_epi32(
            _mm256_dpbusd_epi32(zero, q, xq),
            _mm256_dpbusd_epi32(zero, sixteens, xq),
        );
        let d = _mm256_mul_ps(f16_splat(wb, 0), f16_splat(xb, 0));
        (d, _mm256_cvtepi32_ps(sumi))
    })
}

/// Q8_0 × Q8_0: `w + 128` is an unsigned byte, so `Σ w·x = dpbusd(w ^ 0x80, x) −
/// dpbusd(128, x)`, exact for every pair of bytes.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_0_impl(w: &[u8], x: &[u8]) -> f32 {
    let bias = _mm256_set1_epi8(-128);
    let zero = _mm256_setzero_si256();
    lanes8_chain!(w, x, Q8_0_BYTES, Q8_0_BYTES, |wb, xb| {
        // SAFETY: quants are bytes 2..34 of 34-byte blocks.
        let (wq, xq) = unsafe { (load32(wb, 2), load32(xb, 2)) };
        let sumi = _mm256_sub_epi32(
            _mm256_dpbusd_epi32(zero, _mm256_xor_si256(wq, bias), xq),
            _mm256_dpbusd_epi32(zero, bias, xq),
        );
        let d = _mm256_mul_ps(f16_splat(wb, 0), f16_splat(xb, 0));
        (d, _mm256_cvtepi32_ps(sumi))
    })
}

/// Whole super-blocks shared by `R` weight rows of `bytes` bytes a block and an
/// activation row of Q8_K blocks.
fn k_rows_blocks<const R: usize>(w: &[&[u8]; R], x: &[u8], bytes: usize) -> usize {
    w.iter()
        .map(|wr| wr.len() / bytes)
        .fold(x.len() / Q8_K_BYTES, usize::min)
}

/// The per-super-block terms of Q4_K: `d_w·d_x` (eight lanes), `−d_x·dmin_w`
/// (four lanes, as the scalar twin forms it), the eight 6-bit scales as words, and the
/// four min lanes `m[2j]·S[2j] + m[2j+1]·S[2j+1]` (`S` from `avx2::k4_sub_block_sums`),
/// the scale field unpacked in vector registers (`avx2::k4_scales_mins`).
///
/// # Safety
/// The CPU has the features of this module; `wb` holds a whole Q4_K super-block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn k4_block_terms(
    wb: &[u8],
    dx: __m256,
    minus_dx: __m128,
    sub_block_sums: __m128i,
) -> (__m256, __m128, __m128i, __m128i) {
    // `d` and `dmin` (adjacent f16s) in one conversion, each then spread to its lanes.
    const _: () = assert!(q4_k::DMIN == 2);
    let header = _mm_cvtph_ps(_mm_cvtsi32_si128(read_u32(wb, 0) as i32));
    let d = _mm256_mul_ps(_mm256_broadcastss_ps(header), dx);
    let neg_dmin = _mm_mul_ps(minus_dx, _mm_permute_ps::<0b01_01_01_01>(header));
    // SAFETY: a whole super-block; the features per the contract.
    let (scales, mins) = unsafe { crate::avx2::k4_scales_mins(wb) };
    (d, neg_dmin, scales, _mm_madd_epi16(mins, sub_block_sums))
}

/// [`k4_block_terms`] with the scale field unpacked in general registers (Q5_K, whose
/// kernel is bound by vector work, not by its multiplies): `d_w·d_x` (eight lanes), `−d_x·dmin_w`
/// (four lanes, as the scalar twin forms it), the eight 6-bit scales packed in a `u64`,
/// and the four min lanes.
///
/// # Safety
/// The CPU has the features of this module; `wb` holds a whole Q4_K or Q5_K super-block
/// (their headers are the same) and `xb` a whole Q8_K block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn k4_block_terms_gpr(
    wb: &[u8],
    xb: &[u8],
    dx: __m256,
    minus_dx: __m128,
) -> (__m256, __m128, u64, __m128i) {
    let d = _mm256_mul_ps(f16_splat(wb, 0), dx);
    let neg_dmin = _mm_mul_ps(minus_dx, _mm256_castps256_ps128(f16_splat(wb, q4_k::DMIN)));
    let (sc, mn) = scales_mins_k4_packed(&wb[q4_k::SCALES..q4_k::SCALES + 12]);
    // SAFETY: xb is a whole Q8_K block (the caller's contract).
    let min_lanes = unsafe { k4_min_lanes(xb, mn) };
    (d, neg_dmin, sc, min_lanes)
}

/// The one-row and four-row entry points of a K format's `<const R>` row kernel
/// (`$rows`, blocks of `$bytes`).
macro_rules! k_row_entries {
    ($one:ident, $rows:ident, $bytes:expr, $name:literal) => {
        #[doc = concat!($name, " × Q8_K, one row (see [`", stringify!($rows), "`]).")]
        ///
        /// # Safety
        /// The CPU has the features of this module.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $one(w: &[u8], x: &[u8]) -> f32 {
            let n_blocks = k_rows_blocks(&[w], x, $bytes);
            // SAFETY: the same features; whole blocks.
            let [sum] = unsafe { $rows([w], x, n_blocks) };
            sum
        }
    };
    ($one:ident, $four:ident, $rows:ident, $bytes:expr, $name:literal) => {
        k_row_entries!($one, $rows, $bytes, $name);

        #[doc = concat!($name, " × Q8_K for four weight rows and one token (see [`", stringify!($rows), "`]).")]
        ///
        /// # Safety
        /// The CPU has the features of this module.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $four(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
            let n_blocks = k_rows_blocks(&w, x, $bytes);
            // SAFETY: the same features; whole blocks of every row.
            unsafe { $rows(w, x, n_blocks) }
        }
    };
}

/// `(first & 0xFFFF) | (second << SHIFT)` per dword, for a `second` that holds its quad
/// sums times `2^(16 − SHIFT)`: two sets' quad sums, each of which fits a word, as the
/// word pairs `(first, second / 2^(16 − SHIFT))` that one `vpdpwssd` multiplies by a pair
/// of scales (exact: the shift only drops bits that pass the top of the dword).
///
/// (`inline(always)`, not a `target_feature` function: see `avx2_rows4::scale_products4`.)
///
/// # Safety
/// The CPU has AVX-512 F and VL.
#[inline(always)]
unsafe fn word_pairs_shifted<const SHIFT: i32>(first: __m256i, second: __m256i) -> __m256i {
    // SAFETY: the features per the contract.
    unsafe {
        _mm256_ternarylogic_epi32::<0xF8>(
            _mm256_slli_epi32::<SHIFT>(second),
            first,
            _mm256_set1_epi32(0xFFFF),
        )
    }
}

/// [`word_pairs_shifted`]`::<16>` on 512-bit registers.
///
/// # Safety
/// The CPU has AVX-512 F.
#[inline(always)]
unsafe fn word_pairs_512(first: __m512i, second: __m512i) -> __m512i {
    // SAFETY: the features per the contract.
    unsafe {
        _mm512_ternarylogic_epi32::<0xF8>(
            _mm512_slli_epi32::<16>(second),
            first,
            _mm512_set1_epi32(0xFFFF),
        )
    }
}

/// `$acc += ` the pair products of the words `$p` with the word pair at `$scale`
/// (a `*const u32`, broadcast to every dword by the instruction itself): `vpdpwssd` with
/// an embedded broadcast. Written out because the compiler otherwise turns the broadcast
/// into two shuffles and the `vpdpwssd` into a multiply and an add.
///
/// # Safety
/// Inside a function with AVX-512 VL and VNNI enabled; `$scale` is valid for a 4-byte
/// read.
macro_rules! dpwssd_scale {
    ($acc:expr, $p:expr, $scale:expr) => {
        std::arch::asm!(
            "vpdpwssd {acc}, {p}, dword ptr [{s}]{{1to8}}",
            acc = inout(ymm_reg) $acc,
            p = in(ymm_reg) $p,
            s = in(reg) $scale,
            options(pure, readonly, nostack, preserves_flags),
        )
    };
}

/// `$body` for `$r` in `0..$n`, written out four times when `$n` is 4 (the four-row
/// kernels), so that each row's accumulators stay in registers instead of being stored
/// and reloaded by a loop over the rows.
macro_rules! each_row {
    ($n:expr, |$r:ident| $body:block) => {
        if $n == 4 {
            {
                let $r = 0;
                $body
            }
            {
                let $r = 1;
                $body
            }
            {
                let $r = 2;
                $body
            }
            {
                let $r = 3;
                $body
            }
        } else {
            for $r in 0..$n $body
        }
    };
}

/// The eight lane integers `Σ_sub s_sub·Q_sub` of the Q4_K super-block `$wb` against the
/// Q8_K quants `$xq` (`[__m256i; 8]`), the scale pair of chunk c at `$scale_pairs.add(c)`
/// (a `*const u32`). Chunk c holds sub-blocks 2c (low nibbles) and 2c + 1 (high
/// nibbles): each one `vpdpbusd` gives its eight quad sums Q (|Q| ≤ 4·15·128, a word), the
/// two interleave as word pairs (Q[2c], Q[2c + 1]) and one `vpdpwssd` applies both
/// scales: twelve multiplies per super-block instead of sixteen. The high nibbles stay in
/// place: `qs & 0xF0` is 16·nibble (≤ 240, still an unsigned byte), its quad sums 16·Q (a
/// dword), and shifting those left by 12 instead of 16 puts Q in the high word exactly.
/// The lane integers are exact, so their order does not matter. (A macro: its `asm!`
/// needs the features of the kernel it is written into.)
///
/// # Safety
/// Inside a kernel with this module's features; `$wb` is a whole super-block and
/// `$scale_pairs` valid for reading four dwords.
macro_rules! q4_k_sums {
    ($wb:expr, $xq:expr, $scale_pairs:expr) => {{
        let low4 = _mm256_set1_epi8(0x0F);
        let high4 = _mm256_set1_epi8(0xF0u8 as i8);
        let mut sums = [_mm256_setzero_si256(); 2];
        for chunk in 0..4 {
            let qs = load32($wb, q4_k::QS + 32 * chunk);
            let lo = _mm256_and_si256(qs, low4);
            let hi16 = _mm256_and_si256(qs, high4);
            let zero = _mm256_setzero_si256();
            let q_lo = _mm256_dpbusd_epi32(zero, lo, $xq[2 * chunk]);
            let q_hi16 = _mm256_dpbusd_epi32(zero, hi16, $xq[2 * chunk + 1]);
            let pairs = word_pairs_shifted::<12>(q_lo, q_hi16);
            dpwssd_scale!(sums[chunk % 2], pairs, $scale_pairs.add(chunk));
        }
        _mm256_add_epi32(sums[0], sums[1])
    }};
}

/// Q4_K × Q8_K for `R` weight rows and one token: per 32-byte chunk of `qs`, its two
/// sub-blocks (low and high nibbles) in 256-bit registers, their quad sums by `vpdpbusd`
/// and both scales by one `vpdpwssd` (see the loop): the integer multiplies are what
/// bounds this kernel, and this form needs twelve per super-block where `maddubs` +
/// `madd` per sub-block need sixteen (`benches/gemv`, Q4_K 2048×640 four rows, AMD EPYC
/// family 25 model 17: 18.7 → 22.1 GiB/s with the scale unpacking of
/// [`k4_block_terms`]). The activation block is loaded once for the `R` rows; each row
/// keeps the one-row kernel's own chains (eight `d·lanes` FMA lanes, four min lanes), so
/// row `r`'s result has the bits of the one-row kernel on `(w[r], x)`, and `R`
/// independent chains and weight streams run side by side.
///
/// # Safety
/// The CPU has the features of this module; every row holds `n_blocks` super-blocks and
/// `x` as many Q8_K blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k_rows<const R: usize>(w: [&[u8]; R], x: &[u8], n_blocks: usize) -> [f32; R] {
    const B: usize = Q4_K_BYTES;
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc_min = [_mm_setzero_ps(); R];
    for b in 0..n_blocks {
        let xb = &x[b * Q8_K_BYTES..(b + 1) * Q8_K_BYTES];
        // SAFETY: x quants 4+32s..36+32s of 292.
        let xq: [__m256i; 8] =
            [0, 1, 2, 3, 4, 5, 6, 7].map(|s| unsafe { load32(xb, q8_k::QS + 32 * s) });
        let dx = f32_splat(xb, 0);
        let minus_dx = _mm_set1_ps(-read_f32(xb, 0));
        // SAFETY: xb is a whole Q8_K block.
        let sub_block_sums = unsafe { crate::avx2::k4_sub_block_sums(xb) };
        each_row!(R, |r| {
            let wb = &w[r][b * B..(b + 1) * B];
            crate::avx2::prefetch_block(w[r], b * B, B, R);
            // SAFETY: wb is a whole super-block.
            let (d, neg_dmin, sc16, min_lanes) =
                unsafe { k4_block_terms(wb, dx, minus_dx, sub_block_sums) };
            acc_min[r] = _mm_fmadd_ps(neg_dmin, _mm_cvtepi32_ps(min_lanes), acc_min[r]);
            // The scale pairs (s[2c], s[2c + 1]) as dwords: chunk c's pair comes by an
            // embedded broadcast of dword c.
            let mut scale_pairs = [0u32; 4];
            // SAFETY: one 16-byte store into 16 bytes.
            unsafe { _mm_storeu_si128(scale_pairs.as_mut_ptr() as *mut __m128i, sc16) };
            // SAFETY: a whole super-block; four scale pairs.
            let sumi = unsafe { q4_k_sums!(wb, xq, scale_pairs.as_ptr()) };
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[r]);
        });
    }
    std::array::from_fn(|r| hsum_ps(acc[r]) + hsum4_ps(acc_min[r]))
}

k_row_entries!(q4_k_impl, q4_k_rows, Q4_K_BYTES, "Q4_K");

/// Q4_K × Q8_K for four weight rows and one token: [`q4_k_rows`] with the per-block
/// terms of the four rows worked out together, each row in one 128-bit lane of a
/// 512-bit register. A super-block's first 16 bytes (`d`, `dmin`, the 12-byte scale
/// field) are all those terms need, so one load per row feeds the scale and min
/// unpacking (the shuffles of `avx2::k4_scales_mins`, lane by lane), one `vcvtph2ps`
/// gives the four rows' `d` and `dmin`, and the min lanes of all four rows advance in
/// one FMA. Each row keeps its own chains (eight `d·lanes` FMA lanes, four min lanes in
/// its 128-bit lane), so every result has the bits of the one-row kernel; the terms
/// were over a quarter of this kernel's time (`benches/gemv`, Q4_K 2048×640 four rows).
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k_rows4_impl(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
    const B: usize = Q4_K_BYTES;
    const _: () = assert!(q4_k::DMIN == 2 && q4_k::SCALES == 4 && q4_k::QS == 16);
    let n_blocks = k_rows_blocks(&w, x, B);
    let header_terms = Rows4Header::new();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut acc_min = _mm512_setzero_ps();
    for b in 0..n_blocks {
        let xb = &x[b * Q8_K_BYTES..(b + 1) * Q8_K_BYTES];
        // SAFETY: x quants 4+32s..36+32s of 292.
        let xq: [__m256i; 8] =
            [0, 1, 2, 3, 4, 5, 6, 7].map(|s| unsafe { load32(xb, q8_k::QS + 32 * s) });
        let dx = read_f32(xb, 0);
        // [d_x, −d_x] per row: `d_w·d_x` and `−d_x·dmin_w` in one multiply.
        let dx_pairs = _mm256_setr_ps(dx, -dx, dx, -dx, dx, -dx, dx, -dx);
        // SAFETY: xb is a whole Q8_K block.
        let sub_block_sums = _mm512_broadcast_i32x4(unsafe { crate::avx2::k4_sub_block_sums(xb) });
        // (No closures here: they would be compiled without this function's features.)
        let range = b * B..(b + 1) * B;
        let wbs = [
            &w[0][range.clone()],
            &w[1][range.clone()],
            &w[2][range.clone()],
            &w[3][range],
        ];
        for row in w {
            crate::avx2::prefetch_block(row, b * B, B, 4);
        }
        // SAFETY: the first 16 bytes of each whole super-block.
        let heads = unsafe {
            let v = _mm512_castsi128_si512(load16(wbs[0], 0));
            let v = _mm512_inserti32x4::<1>(v, load16(wbs[1], 0));
            let v = _mm512_inserti32x4::<2>(v, load16(wbs[2], 0));
            _mm512_inserti32x4::<3>(v, load16(wbs[3], 0))
        };
        // SAFETY: this function enables the helper's features.
        let (scales, min_lanes, products, neg_dmin) =
            unsafe { header_terms.terms(heads, sub_block_sums, dx_pairs) };
        acc_min = _mm512_fmadd_ps(neg_dmin, _mm512_cvtepi32_ps(min_lanes), acc_min);
        // Row r's scale pairs (s[2c], s[2c + 1]) are dwords 4r..4r + 4, stored lane by
        // lane, as the one-row kernel stores its 16 bytes for its 4-byte broadcasts to
        // read (one 64-byte store measured 3 % slower: `benches/gemv`, 26.0 against
        // 26.9 GiB/s).
        let mut scale_pairs = [0u32; 16];
        let lanes = [
            _mm512_extracti32x4_epi32::<0>(scales),
            _mm512_extracti32x4_epi32::<1>(scales),
            _mm512_extracti32x4_epi32::<2>(scales),
            _mm512_extracti32x4_epi32::<3>(scales),
        ];
        for (r, lane) in lanes.into_iter().enumerate() {
            // SAFETY: 16 bytes into dwords 4r..4r + 4 of 16.
            unsafe { _mm_storeu_si128(scale_pairs.as_mut_ptr().add(4 * r) as *mut __m128i, lane) };
        }
        each_row!(4, |r| {
            let d = _mm256_permutexvar_ps(_mm256_set1_epi32(2 * r as i32), products);
            // SAFETY: a whole super-block; row r's four scale pairs.
            let sumi = unsafe { q4_k_sums!(wbs[r], xq, scale_pairs.as_ptr().add(4 * r)) };
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[r]);
        });
    }
    let mins = [
        _mm512_extractf32x4_ps::<0>(acc_min),
        _mm512_extractf32x4_ps::<1>(acc_min),
        _mm512_extractf32x4_ps::<2>(acc_min),
        _mm512_extractf32x4_ps::<3>(acc_min),
    ];
    std::array::from_fn(|r| hsum_ps(acc[r]) + hsum4_ps(mins[r]))
}

/// Q2_K × Q8_K for four weight rows and one token. A sub-block scale (≤ 15) times a level
/// (≤ 3) fits a byte, so one `vpshufb` from a table `[0, s, 2s, 3s]` per 16 weights turns
/// 64 levels into scaled levels ([`q2_k_scaled_levels`]), and one `dpbusd` gives their
/// sums four weights a lane: per 64 weights a shift, a mask, a shuffle and one product,
/// where the AVX2 kernel spends a `maddubs` and a scale `madd` per 32. The lanes hold the
/// AVX2 kernel's integers exactly (`Σ s·Σ q·x` over the same four weights of every group,
/// groups `k` and `k + 4` in the two halves, folded once per super-block), and each row
/// keeps its float chain (the min FMA, then the scale FMA, eight lanes, two rows per
/// 512-bit register): the bits of [`crate::avx2`]'s `q2_k_impl`. The tuner measured the
/// AVX2 kernel at about 15 GB/s on the Qwen2.5-1.5B shapes (AMD EPYC family 25 model 17),
/// bound by its instructions, not by memory.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q2_k_rows4_impl(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
    const B: usize = q2_k::BYTES;
    let n_blocks = k_rows_blocks(&w, x, B);
    let consts = Q2kConsts::new();
    let mut acc = [_mm512_setzero_ps(); 2];
    for b in 0..n_blocks {
        let xb = &x[b * Q8_K_BYTES..(b + 1) * Q8_K_BYTES];
        // SAFETY: a whole Q8_K block.
        let (xq, bsums) = unsafe { (x_group_pairs(xb), load32(xb, q8_k::BSUMS)) };
        let bsums = _mm512_broadcast_i64x4(bsums);
        let dx = read_f32(xb, 0);
        for (p, acc) in acc.iter_mut().enumerate() {
            let mut sums = [_mm512_setzero_si512(); 2];
            let mut mins = [_mm256_setzero_si256(); 2];
            let mut d = [0f32; 2];
            let mut neg_dmin = [0f32; 2];
            for e in 0..2 {
                let row = w[2 * p + e];
                crate::avx2::prefetch_block(row, b * B, B, 4);
                let wb = &row[b * B..(b + 1) * B];
                // SAFETY: a whole super-block.
                let (levels, row_mins) = unsafe { q2_k_scaled_levels(wb, &consts) };
                sums[e] = levels_dot(levels, xq, _mm512_setzero_si512());
                mins[e] = row_mins;
                d[e] = dx * f16_scalar(wb, q2_k::D);
                neg_dmin[e] = -dx * f16_scalar(wb, q2_k::DMIN);
            }
            let sumi = fold_row_pair(sums);
            let min_lanes = _mm512_madd_epi16(
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(mins[0]), mins[1]),
                bsums,
            );
            *acc = _mm512_fmadd_ps(halves_of(neg_dmin), _mm512_cvtepi32_ps(min_lanes), *acc);
            *acc = _mm512_fmadd_ps(halves_of(d), _mm512_cvtepi32_ps(sumi), *acc);
        }
    }
    row_pair_sums(acc)
}

/// Q2_K × Q8_K for four tokens: each super-block's scaled levels ([`q2_k_scaled_levels`])
/// formed once, then per token four `dpbusd`, the fold to eight lanes and the AVX2
/// kernel's two FMAs (its bits, as [`q2_k_rows4_impl`]).
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q2_k_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    const B: usize = q2_k::BYTES;
    let n_blocks = common_blocks(w, &x, B, Q8_K_BYTES);
    let consts = Q2kConsts::new();
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..n_blocks {
        prefetch_ahead(w, b * B);
        let wb = &w[b * B..(b + 1) * B];
        // SAFETY: a whole super-block.
        let (levels, mins) = unsafe { q2_k_scaled_levels(wb, &consts) };
        let (d_w, dmin_w) = (f16_scalar(wb, q2_k::D), f16_scalar(wb, q2_k::DMIN));
        for (t, xb) in block_of_each(&x, b, Q8_K_BYTES).into_iter().enumerate() {
            // SAFETY: a whole Q8_K block.
            let (xq, bsums) = unsafe { (x_group_pairs(xb), load32(xb, q8_k::BSUMS)) };
            let sumi = fold_halves_epi32(levels_dot(levels, xq, _mm512_setzero_si512()));
            let min_lanes = _mm256_madd_epi16(mins, bsums);
            let dx = read_f32(xb, 0);
            let neg_dmin = _mm256_set1_ps(-dx * dmin_w);
            acc[t] = _mm256_fmadd_ps(neg_dmin, _mm256_cvtepi32_ps(min_lanes), acc[t]);
            let d = _mm256_set1_ps(dx * d_w);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[t]);
        }
    }
    [
        hsum_ps(acc[0]),
        hsum_ps(acc[1]),
        hsum_ps(acc[2]),
        hsum_ps(acc[3]),
    ]
}

/// The Q8_K quants of groups `k` and `k + 4` side by side for `k = 0..4`: the layout of
/// the Q2_K / Q3_K level registers (a shift `2k` of the 64 packed bytes gives both).
///
/// # Safety
/// `xb` is a whole Q8_K block; the CPU has AVX-512 F and AVX2.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn x_group_pairs(xb: &[u8]) -> [__m512i; 4] {
    let mut xq = [_mm512_setzero_si512(); 4];
    for (k, xq) in xq.iter_mut().enumerate() {
        // SAFETY: groups k and k + 4 of the quants, 4..260 of 292.
        *xq = unsafe {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(load32(xb, q8_k::QS + 32 * k)),
                load32(xb, q8_k::QS + 32 * (k + 4)),
            )
        };
    }
    xq
}

/// `start + Σ_k dpbusd(levels[k], xq[k])`: unsigned levels against signed quants.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
fn levels_dot(levels: [__m512i; 4], xq: [__m512i; 4], start: __m512i) -> __m512i {
    let mut s = start;
    for (levels, xq) in levels.into_iter().zip(xq) {
        s = _mm512_dpbusd_epi32(s, levels, xq);
    }
    s
}

/// The low eight lanes of `v` plus its high eight.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold_halves_epi32(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// The constants of [`q2_k_scaled_levels`].
pub(crate) struct Q2kConsts {
    steps: __m512i,
    low4_dwords: __m512i,
    low4: __m128i,
    lane_tables: __m512i,
    three: __m512i,
}

impl Q2kConsts {
    /// The constants.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(crate) fn new() -> Self {
        Self {
            // Scale j's table as a dword: bytes [0, s, 2s, 3s] (3·15 < 256: no carries).
            steps: _mm512_set1_epi32(0x0302_0100),
            low4_dwords: _mm512_set1_epi32(0x0F),
            low4: _mm_set1_epi8(0x0F),
            // The level register of shift k holds group k (weights 32k.., scales 2k,
            // 2k + 1) in its low 256 bits and group k + 4 (scales 2k + 8, 2k + 9) in its
            // high ones; 128-bit lane m of the tables gathers in dword k the table that
            // lane meets at shift k, so the levels index it as `q + 4k`.
            lane_tables: _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15),
            three: _mm512_set1_epi8(3),
        }
    }
}

/// One Q2_K super-block's levels times their sub-block scales (`s·q`, bytes), as four
/// registers of groups `k | k + 4` ([`x_group_pairs`]' layout), and its sixteen mins as
/// words.
///
/// # Safety
/// `wb` is a whole Q2_K super-block; the CPU has the features of this module.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
pub(crate) unsafe fn q2_k_scaled_levels(wb: &[u8], c: &Q2kConsts) -> ([__m512i; 4], __m256i) {
    const _: () = assert!(q2_k::QS == 16 && q2_k::QS + 64 == q2_k::D);
    // SAFETY: the scales are bytes 0..16 of 84, the levels 16..80.
    let (packed, bits) = unsafe {
        (
            load16(wb, 0),
            _mm512_loadu_si512(wb.as_ptr().add(q2_k::QS) as *const _),
        )
    };
    let scales = _mm512_and_si512(_mm512_cvtepu8_epi32(packed), c.low4_dwords);
    let tables = _mm512_permutexvar_epi32(c.lane_tables, _mm512_mullo_epi32(scales, c.steps));
    // Levels `q` of shift k, or'ed with `4k`: byte `q` of dword k in each lane's tables.
    let shifted = [
        bits,
        _mm512_srli_epi16::<2>(bits),
        _mm512_srli_epi16::<4>(bits),
        _mm512_srli_epi16::<6>(bits),
    ];
    let mut scaled = [_mm512_setzero_si512(); 4];
    for (k, (scaled, shifted)) in scaled.iter_mut().zip(shifted).enumerate() {
        let index = _mm512_or_si512(
            _mm512_and_si512(shifted, c.three),
            _mm512_set1_epi8(4 * k as i8),
        );
        *scaled = _mm512_shuffle_epi8(tables, index);
    }
    let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), c.low4));
    (scaled, mins)
}

/// Q3_K × Q8_K for four weight rows and one token. A level `q` (−4..3) is read as
/// `u = q + 4` (its two low bits and its high bit side by side, 0..7), one `dpbusd` per
/// 64 weights starts from `−4·Σx` of each four-weight lane, which leaves `Σ q·x` per lane
/// (|·| ≤ 2048, a word), and one `dpwssd` by the lane's scale (a word, zero above)
/// scales it: two products per 64 weights where the AVX2 kernel spends two `maddubs`, a
/// subtraction and a `madd` per 32. The sixteen 6-bit scales unpack in one register
/// (variable shifts), not byte by byte ([`q3_k_levels`]). The lanes hold the AVX2
/// kernel's integers exactly (groups `k` and `k + 4` in the two halves, folded once per
/// super-block), and each row keeps its float chain (eight lanes, two rows per 512-bit
/// register): the bits of [`crate::avx2`]'s `q3_k_impl`.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q3_k_rows4_impl(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
    const B: usize = q3_k::BYTES;
    let n_blocks = k_rows_blocks(&w, x, B);
    let consts = Q3kRows4::new();
    let mut acc = [_mm512_setzero_ps(); 2];
    for b in 0..n_blocks {
        let xb = &x[b * Q8_K_BYTES..(b + 1) * Q8_K_BYTES];
        // SAFETY: a whole Q8_K block.
        let xq = unsafe { x_group_pairs(xb) };
        let minus4 = minus4_sums(xq, consts.four);
        let dx = read_f32(xb, 0);
        for (p, acc) in acc.iter_mut().enumerate() {
            let mut sums = [_mm512_setzero_si512(); 2];
            let mut d = [0f32; 2];
            for e in 0..2 {
                let row = w[2 * p + e];
                crate::avx2::prefetch_block(row, b * B, B, 4);
                let wb = &row[b * B..(b + 1) * B];
                // SAFETY: a whole super-block.
                let (levels, scales) = unsafe { q3_k_levels(wb, &consts) };
                sums[e] = q3_k_scaled_sums(levels, scales, xq, minus4);
                d[e] = dx * f16_scalar(wb, q3_k::D);
            }
            let sumi = fold_row_pair(sums);
            *acc = _mm512_fmadd_ps(halves_of(d), _mm512_cvtepi32_ps(sumi), *acc);
        }
    }
    row_pair_sums(acc)
}

/// Q3_K × Q8_K for four tokens: each super-block's levels and lane scales
/// ([`q3_k_levels`]) formed once, then per token the products of [`q3_k_scaled_sums`],
/// the fold to eight lanes and the AVX2 kernel's FMA (its bits, as [`q3_k_rows4_impl`]).
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q3_k_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    const B: usize = q3_k::BYTES;
    let n_blocks = common_blocks(w, &x, B, Q8_K_BYTES);
    let consts = Q3kRows4::new();
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..n_blocks {
        prefetch_ahead(w, b * B);
        let wb = &w[b * B..(b + 1) * B];
        // SAFETY: a whole super-block.
        let (levels, scales) = unsafe { q3_k_levels(wb, &consts) };
        let dw = f16_splat(wb, q3_k::D);
        for (t, xb) in block_of_each(&x, b, Q8_K_BYTES).into_iter().enumerate() {
            // SAFETY: a whole Q8_K block.
            let xq = unsafe { x_group_pairs(xb) };
            let minus4 = minus4_sums(xq, consts.four);
            let sumi = fold_halves_epi32(q3_k_scaled_sums(levels, scales, xq, minus4));
            let d = _mm256_mul_ps(f32_splat(xb, 0), dw);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[t]);
        }
    }
    [
        hsum_ps(acc[0]),
        hsum_ps(acc[1]),
        hsum_ps(acc[2]),
        hsum_ps(acc[3]),
    ]
}

/// One Q3_K super-block as four registers of `u = q + 4` (groups `k | k + 4`,
/// [`x_group_pairs`]' layout) and the four registers of each dword lane's scale (a word,
/// zero above).
///
/// # Safety
/// `wb` is a whole Q3_K super-block; the CPU has the features of this module.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
unsafe fn q3_k_levels(wb: &[u8], c: &Q3kRows4) -> ([__m512i; 4], [__m512i; 4]) {
    // SAFETY: forwarded contract.
    let (levels, scale_words) = unsafe { (q3_k_level_regs(wb, c), q3_k_scale_words(wb, c)) };
    let scales = std::array::from_fn(|k| _mm512_permutexvar_epi32(c.lane_scales[k], scale_words));
    (levels, scales)
}

/// One Q3_K super-block's four registers of `u = q + 4` (groups `k | k + 4`,
/// [`x_group_pairs`]' layout).
///
/// # Safety
/// `wb` is a whole Q3_K super-block; the CPU has the features of this module.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
unsafe fn q3_k_level_regs(wb: &[u8], c: &Q3kRows4) -> [__m512i; 4] {
    const _: () = assert!(q3_k::QS == 32 && q3_k::SCALES == 96 && q3_k::D == 108);
    // SAFETY: hmask is bytes 0..32 of 110, the low bits 32..96.
    let (hmask, bits) = unsafe {
        (
            load32(wb, 0),
            _mm512_loadu_si512(wb.as_ptr().add(q3_k::QS) as *const _),
        )
    };
    // Bit k of each byte: group k's high bits (low half), group k + 4's (high half).
    let high = _mm512_srlv_epi16(_mm512_broadcast_i64x4(hmask), c.high_half_by_4);
    // Per shift k: the low bits at 0..2 and the high bit moved to bit 2.
    let parts = [
        (bits, _mm512_slli_epi16::<2>(high)),
        (_mm512_srli_epi16::<2>(bits), _mm512_slli_epi16::<1>(high)),
        (_mm512_srli_epi16::<4>(bits), high),
        (_mm512_srli_epi16::<6>(bits), _mm512_srli_epi16::<1>(high)),
    ];
    parts.map(|(low, high)| {
        _mm512_or_si512(
            _mm512_and_si512(low, c.three),
            _mm512_and_si512(high, c.four),
        )
    })
}

/// One Q3_K super-block's sixteen scales `sc − 32`, scale `j` in dword `j` as a word
/// (zero above): a `vpdpwssd` operand.
///
/// # Safety
/// `wb` is a whole Q3_K super-block; the CPU has the features of this module.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
unsafe fn q3_k_scale_words(wb: &[u8], c: &Q3kRows4) -> __m512i {
    // SAFETY: the scales are bytes 96..108 of 110 (read as 94..110).
    c.scale_words(unsafe { load16(wb, q3_k::SCALES - 2) })
}

/// One Q3_K super-block's levels times their sub-block scales, plus 127: `s·q + 127`
/// (`s` in −32..32, `q` in −4..4, so 3..=255: an unsigned byte), as four registers of
/// groups `k | k + 4` ([`x_group_pairs`]' layout). A lane's `vpdpbusd` then leaves
/// `Σ s·q·x + 127·Σx`, and no scale step is left: the narrow Q3_K tiles start each lane
/// from `−127·Σx`.
///
/// Each 128-bit lane of a level register meets one scale; two such lanes' tables of
/// eight bytes (`127 + s·(u − 4)` for `u = q + 4`) share a 128-bit lane of a table
/// register, so one `vpshufb` per register scales its levels. The tables are formed
/// modulo 256 (their values fit a byte): `127 − 4s`, plus `s`, `2s`, `4s` where byte
/// `u`'s bits say.
///
/// # Safety
/// `wb` is a whole Q3_K super-block; the CPU has the features of this module.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
pub(crate) unsafe fn q3_k_scaled_levels(wb: &[u8], c: &Q3kRows4) -> [__m512i; 4] {
    // SAFETY: forwarded contract.
    let (levels, scale_words) = unsafe { (q3_k_level_regs(wb, c), q3_k_scale_words(wb, c)) };
    // Scale j as a byte (the low byte of its word), in every 128-bit lane.
    let scale_bytes = _mm512_broadcast_i32x4(_mm512_cvtepi32_epi8(scale_words));
    // Table register p, 128-bit lane m, byte 8h + u: the table of scale
    // 4p + 2h + m % 2 + 8·(m / 2), the scale lane m of shift 2p + h meets.
    let which = [
        _mm512_set_epi64(
            0x0b0b_0b0b_0b0b_0b0b,
            0x0909_0909_0909_0909,
            0x0a0a_0a0a_0a0a_0a0a,
            0x0808_0808_0808_0808,
            0x0303_0303_0303_0303,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0000_0000_0000_0000,
        ),
        _mm512_set_epi64(
            0x0f0f_0f0f_0f0f_0f0f,
            0x0d0d_0d0d_0d0d_0d0d,
            0x0e0e_0e0e_0e0e_0e0e,
            0x0c0c_0c0c_0c0c_0c0c,
            0x0707_0707_0707_0707,
            0x0505_0505_0505_0505,
            0x0606_0606_0606_0606,
            0x0404_0404_0404_0404,
        ),
    ];
    let tables = which.map(|which| {
        let s = _mm512_shuffle_epi8(scale_bytes, which);
        let s2 = _mm512_add_epi8(s, s);
        let s4 = _mm512_add_epi8(s2, s2);
        let t = _mm512_sub_epi8(_mm512_set1_epi8(127), s4);
        // Byte u of each table (u = position mod 8) adds u·s.
        let t = _mm512_mask_add_epi8(t, 0xAAAA_AAAA_AAAA_AAAA, t, s);
        let t = _mm512_mask_add_epi8(t, 0xCCCC_CCCC_CCCC_CCCC, t, s2);
        _mm512_mask_add_epi8(t, 0xF0F0_F0F0_F0F0_F0F0, t, s4)
    });
    let eights = _mm512_set1_epi8(8);
    [
        _mm512_shuffle_epi8(tables[0], levels[0]),
        _mm512_shuffle_epi8(tables[0], _mm512_or_si512(levels[1], eights)),
        _mm512_shuffle_epi8(tables[1], levels[2]),
        _mm512_shuffle_epi8(tables[1], _mm512_or_si512(levels[3], eights)),
    ]
}

/// `−4·Σx` of each four-quant lane of the registers `xq` (`four`: 4 in every byte).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
fn minus4_sums(xq: [__m512i; 4], four: __m512i) -> [__m512i; 4] {
    let zero = _mm512_setzero_si512();
    let mut out = [zero; 4];
    for (out, xq) in out.iter_mut().zip(xq) {
        *out = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, four, xq));
    }
    out
}

/// `Σ_k sc·(Σ u·x − 4·Σx)` per lane: each `dpbusd` starts from `−4·Σx` of its lanes
/// ([`minus4_sums`]), leaving `Σ q·x` (a word), which one `dpwssd` scales.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn q3_k_scaled_sums(
    levels: [__m512i; 4],
    scales: [__m512i; 4],
    xq: [__m512i; 4],
    minus4: [__m512i; 4],
) -> __m512i {
    let mut s = _mm512_setzero_si512();
    for k in 0..4 {
        let lanes = _mm512_dpbusd_epi32(minus4[k], levels[k], xq[k]);
        s = _mm512_dpwssd_epi32(s, lanes, scales[k]);
    }
    s
}

/// The constants of [`q3_k_rows4_impl`] and of the Q3_K decoding it shares
/// ([`q3_k_levels`], [`q3_k_scaled_levels`]), wherever that runs.
pub(crate) struct Q3kRows4 {
    three: __m512i,
    /// 4 in every byte: the mask of `u`'s high bit, and the multiplier of `4·Σx`.
    four: __m512i,
    high_half_by_4: __m512i,
    /// Per shift k, the scale of each dword lane: 128-bit lane m of the level register
    /// holds 16 weights of scale 2k, 2k + 1, 2k + 8, 2k + 9 for m = 0..4.
    lane_scales: [__m512i; 4],
    low_source: __m128i,
    top_source: __m128i,
    low_shifts: __m512i,
    top_shifts: __m512i,
}

impl Q3kRows4 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(crate) fn new() -> Self {
        // Lane m of shift k: scale 2k + m % 2 + 8·(m / 2). Literals, so the constants
        // come from memory rather than being built on every call (the four-token kernel
        // makes one call per weight row).
        let lane_scales = [
            _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 8, 8, 8, 8, 9, 9, 9, 9),
            _mm512_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3, 10, 10, 10, 10, 11, 11, 11, 11),
            _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 12, 12, 12, 12, 13, 13, 13, 13),
            _mm512_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7, 14, 14, 14, 14, 15, 15, 15, 15),
        ];
        Self {
            three: _mm512_set1_epi8(3),
            four: _mm512_set1_epi8(4),
            high_half_by_4: _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4)),
            lane_scales,
            // Scale bytes b0..b11 are bytes 2..14 of the 16 read: scale j's low nibble
            // is in b[j % 8] (shifted by 4 for j ≥ 8), its top two bits in b[8 + j % 4]
            // at 2·(j / 4).
            low_source: _mm_setr_epi8(2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9),
            top_source: _mm_setr_epi8(
                10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13,
            ),
            low_shifts: _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4),
            top_shifts: _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6),
        }
    }

    /// The sixteen scales `sc − 32` as dwords whose low word is the scale and whose
    /// high word is zero (a `dpwssd` operand), from the 16 bytes that end the scales.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    fn scale_words(&self, bytes: __m128i) -> __m512i {
        let low = _mm512_srlv_epi32(
            _mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, self.low_source)),
            self.low_shifts,
        );
        let top = _mm512_srlv_epi32(
            _mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, self.top_source)),
            self.top_shifts,
        );
        let stored = _mm512_or_si512(
            _mm512_and_si512(low, _mm512_set1_epi32(0x0F)),
            _mm512_slli_epi32::<4>(_mm512_and_si512(top, _mm512_set1_epi32(3))),
        );
        _mm512_and_si512(
            _mm512_sub_epi32(stored, _mm512_set1_epi32(32)),
            _mm512_set1_epi32(0xFFFF),
        )
    }
}

/// Two rows' sixteen lanes (each row's groups `k` and `k + 4` in its two halves) as
/// `[row 2p | row 2p + 1]`, each half the sum of that row's halves: its eight lanes over
/// all eight groups.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold_row_pair(sums: [__m512i; 2]) -> __m512i {
    _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0b01_00_01_00>(sums[0], sums[1]),
        _mm512_shuffle_i64x2::<0b11_10_11_10>(sums[0], sums[1]),
    )
}

/// The four rows' results of two row-pair chains (`[row 2p | row 2p + 1]`, eight lanes
/// each): each row's lanes summed as [`hsum_ps`] sums the one-row kernel's.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn row_pair_sums(acc: [__m512; 2]) -> [f32; 4] {
    let [low0, high0] = halves_ps(acc[0]);
    let [low1, high1] = halves_ps(acc[1]);
    [hsum_ps(low0), hsum_ps(high0), hsum_ps(low1), hsum_ps(high1)]
}

/// `v[0]` in the low eight lanes, `v[1]` in the high ones.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves_of(v: [f32; 2]) -> __m512 {
    _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(v[0]), _mm512_set1_ps(v[1]))
}

/// The shuffle and index constants with which [`q4_k_rows4_impl`] turns four rows'
/// super-block headers (one row per 128-bit lane) into their scale and min terms.
struct Rows4Header {
    abc_index: __m512i,
    low_mask: __m512i,
    ab_index: __m512i,
    top2: __m512i,
    header_index: __m512i,
    dmin_index: __m512i,
}

impl Rows4Header {
    #[target_feature(enable = "avx512f,avx512bw")]
    fn new() -> Self {
        Rows4Header {
            // Per 128-bit lane, bytes 0..4 are the header and a, b, c the scale field's
            // thirds at 4..8, 8..12, 12..16 (see `avx2::k4_scales_mins`): [a, c, b, c] for
            // the low parts, and the top two bits of a and of b under scales and mins 4..8.
            abc_index: _mm512_broadcast_i32x4(_mm_setr_epi8(
                4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15,
            )),
            low_mask: _mm512_broadcast_i32x4(_mm_setr_epi8(
                63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15,
            )),
            ab_index: _mm512_broadcast_i32x4(_mm_setr_epi8(
                -1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11,
            )),
            top2: _mm512_set1_epi8(0xC0u8 as i8),
            // Dword 0 (the header) of each row's lane; then each row's dmin over its lane.
            header_index: _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
            dmin_index: _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 5, 5, 5, 5, 7, 7, 7, 7),
        }
    }

    /// From four rows' headers `heads`: per lane the eight scales as words, the four
    /// min lanes `Σ min·sub-block sum` (`sub_block_sums` the activation's), the products
    /// `[d_0·d_x, −dmin_0·d_x, d_1·d_x, …]` (`dx_pairs` = `[d_x, −d_x, …]`) and each
    /// row's `−dmin·d_x` over its lane.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW, AVX2 and F16C (inlined into [`q4_k_rows4_impl`]).
    #[inline(always)]
    unsafe fn terms(
        &self,
        heads: __m512i,
        sub_block_sums: __m512i,
        dx_pairs: __m256,
    ) -> (__m512i, __m512i, __m256, __m512) {
        // SAFETY (features): the caller's contract.
        unsafe {
            let abc = _mm512_shuffle_epi8(heads, self.abc_index);
            let low = _mm512_and_si512(
                _mm512_mask_blend_epi16(0xC0C0_C0C0, abc, _mm512_srli_epi16::<4>(abc)),
                self.low_mask,
            );
            let ab = _mm512_shuffle_epi8(heads, self.ab_index);
            let high = _mm512_srli_epi16::<2>(_mm512_and_si512(ab, self.top2));
            let scales_mins = _mm512_or_si512(low, high);
            // Per lane: the eight scales, then the eight mins, as words.
            let zero = _mm512_setzero_si512();
            let scales = _mm512_unpacklo_epi8(scales_mins, zero);
            let mins = _mm512_unpackhi_epi8(scales_mins, zero);
            let min_lanes = _mm512_madd_epi16(mins, sub_block_sums);
            // [d_0, dmin_0, d_1, dmin_1, …] times [d_x, −d_x, …].
            let header = _mm512_castsi512_si128(_mm512_permutexvar_epi32(self.header_index, heads));
            let products = _mm256_mul_ps(_mm256_cvtph_ps(header), dx_pairs);
            let neg_dmin = _mm512_permutexvar_ps(self.dmin_index, _mm512_castps256_ps512(products));
            (scales, min_lanes, products, neg_dmin)
        }
    }
}

/// Q5_K × Q8_K for `R` weight rows and one token: Q4_K plus the fifth bits, added under a
/// byte mask tested from `qh`. The activation block is loaded once for the `R` rows; each
/// row keeps the one-row kernel's chains (as [`q4_k_rows`]).
///
/// # Safety
/// The CPU has the features of this module; every row holds `n_blocks` super-blocks and
/// `x` as many Q8_K blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_k_rows<const R: usize>(w: [&[u8]; R], x: &[u8], n_blocks: usize) -> [f32; R] {
    const B: usize = Q5_K_BYTES;
    let low4 = _mm512_set1_epi8(0x0F);
    let sixteens = opaque_512(_mm512_set1_epi8(16));
    let nibble_shift = halves_epi16(0, 4);
    let scale_index: [__m512i; 4] =
        std::array::from_fn(|c| halves_epi16(2 * c as i16, 2 * c as i16 + 1));
    // Sub-block 2c (lower half) takes bit 2c of each qh byte, 2c+1 the next.
    let qh_bit: [__m512i; 4] = std::array::from_fn(|c| {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi8(1 << (2 * c))),
            _mm256_set1_epi8(1 << (2 * c + 1)),
        )
    });
    let mut acc = [_mm256_setzero_ps(); R];
    let mut summs = [0.0f32; R];
    for b in 0..n_blocks {
        let xb = &x[b * Q8_K_BYTES..(b + 1) * Q8_K_BYTES];
        // SAFETY: x quants 4+64c..68+64c of 292.
        let xq: [__m512i; 4] = [0, 1, 2, 3].map(|c| unsafe { load64(xb, q8_k::QS + 64 * c) });
        let dx = f32_splat(xb, 0);
        let minus_dx = _mm_set1_ps(-read_f32(xb, 0));
        each_row!(R, |r| {
            let wb = &w[r][b * B..(b + 1) * B];
            crate::avx2::prefetch_block(w[r], b * B, B, R);
            // SAFETY: wb is a whole super-block, xb a whole Q8_K block.
            let (d, neg_dmin, sc, min_lanes) = unsafe { k4_block_terms_gpr(wb, xb, dx, minus_dx) };
            // One running f32 for the min terms, as the scalar twin (and ggml's AVX2 kernel).
            let sumi_min = hsum_epi32(min_lanes);
            summs[r] = _mm_cvtss_f32(neg_dmin).mul_add(sumi_min as f32, summs[r]);
            let scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
            // SAFETY: qh is bytes 16..48 of 176.
            let qh = _mm512_broadcast_i64x4(unsafe { load32(wb, q4_k::Q5_QH) });
            let mut sumi = _mm512_setzero_si512();
            for chunk in 0..4 {
                // SAFETY: qs chunk is bytes 48+32c..80+32c of 176.
                let qs = unsafe { load32(wb, q4_k::Q5_QS + 32 * chunk) };
                let q4 = _mm512_and_si512(
                    _mm512_srlv_epi16(_mm512_broadcast_i64x4(qs), nibble_shift),
                    low4,
                );
                let high = _mm512_test_epi8_mask(qh, qh_bit[chunk]);
                let q = _mm512_mask_add_epi8(q4, high, q4, sixteens);
                let scale = _mm512_permutexvar_epi16(scale_index[chunk], scales);
                sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q, xq[chunk]), scale);
            }
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold_halves(sumi)), acc[r]);
        });
    }
    std::array::from_fn(|r| hsum_ps(acc[r]) + summs[r])
}

k_row_entries!(q5_k_impl, q5_k_rows4_impl, q5_k_rows, Q5_K_BYTES, "Q5_K");

/// Q6_K × Q8_K for `R` weight rows and one token: per half super-block, 64 `ql` bytes in
/// one register give two sets of 64 quants (low nibbles, high nibbles), each completed by
/// two bits of `qh`. The activation block is loaded once for the `R` rows; each row keeps
/// the one-row kernel's chain (as [`q4_k_rows`]).
///
/// # Safety
/// The CPU has the features of this module; every row holds `n_blocks` super-blocks and
/// `x` as many Q8_K blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k_rows<const R: usize>(w: [&[u8]; R], x: &[u8], n_blocks: usize) -> [f32; R] {
    const B: usize = Q6_K_BYTES;
    let low4 = _mm512_set1_epi8(0x0F);
    let bits45 = _mm512_set1_epi8(0x30);
    // Quants 0..32 / 32..64 of a half take qh bits 0,1 / 2,3 (shift left 4 / 2 to
    // bits 4,5); quants 64..96 / 96..128 take bits 4,5 / 6,7 (shift right 0 / 2).
    let shift_first = halves_epi16(4, 2);
    let shift_second = halves_epi16(0, 2);
    // Quarter i (16 quants, four quad lanes) of half h takes the scale pair of dword
    // 4h + i of `scale_pairs` below.
    let pair_index: [__m512i; 2] = std::array::from_fn(|h| {
        let q = |i: i32| _mm_set1_epi32(4 * h as i32 + i);
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set_m128i(q(1), q(0))),
            _mm256_set_m128i(q(3), q(2)),
        )
    });
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..n_blocks {
        let xb = &x[b * Q8_K_BYTES..(b + 1) * Q8_K_BYTES];
        // SAFETY: x quants are bytes 4..260 of 292 (64 at 4 + 64i); bsums 260..292.
        let (xq, bsums) = unsafe {
            (
                [0, 1, 2, 3].map(|i| load64(xb, q8_k::QS + 64 * i)),
                load32(xb, q8_k::BSUMS),
            )
        };
        let dx = f32_splat(xb, 0);
        each_row!(R, |r| {
            let wb = &w[r][b * B..(b + 1) * B];
            crate::avx2::prefetch_block(w[r], b * B, B, R);
            let d = _mm256_mul_ps(dx, f16_splat(wb, q6_k::D));
            // SAFETY: scales are bytes 192..208 of 210.
            let sc16 = _mm256_cvtepi8_epi16(unsafe { load16(wb, q6_k::SCALES) });
            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16));
            // Dword 4h + i: the scales of quarter i of half h's first and second quants,
            // (sc[8h + i], sc[8h + 4 + i]), as a word pair.
            let scale_pairs =
                _mm512_castsi256_si512(_mm256_unpacklo_epi16(sc16, _mm256_srli_si256::<8>(sc16)));
            let mut sumi = _mm512_setzero_si512();
            for half in 0..2 {
                // SAFETY: ql half is bytes 64h..64h+64 and qh half 128+32h..160+32h of 210.
                let (ql, qh) = unsafe {
                    (
                        load64(wb, q6_k::QL + 64 * half),
                        _mm512_broadcast_i64x4(load32(wb, q6_k::QH + 32 * half)),
                    )
                };
                let q_first = _mm512_or_si512(
                    _mm512_and_si512(ql, low4),
                    _mm512_and_si512(_mm512_sllv_epi16(qh, shift_first), bits45),
                );
                let q_second = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4),
                    _mm512_and_si512(_mm512_srlv_epi16(qh, shift_second), bits45),
                );
                // Quad sums of both sets (|Q| ≤ 4·63·128, a word), interleaved as word
                // pairs (first, second) and scaled by one `vpdpwssd`: six multiplies per
                // half where `maddubs` + `madd` per set need eight (see `q4_k_rows`).
                let zero = _mm512_setzero_si512();
                let q_first = _mm512_dpbusd_epi32(zero, q_first, xq[2 * half]);
                let q_second = _mm512_dpbusd_epi32(zero, q_second, xq[2 * half + 1]);
                // SAFETY: this module's features.
                let pairs = unsafe { word_pairs_512(q_first, q_second) };
                let scale = _mm512_permutexvar_epi32(pair_index[half], scale_pairs);
                sumi = _mm512_dpwssd_epi32(sumi, pairs, scale);
            }
            let lanes = _mm256_sub_epi32(fold_halves(sumi), offset);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[r]);
        });
    }
    std::array::from_fn(|r| hsum_ps(acc[r]))
}

k_row_entries!(q6_k_impl, q6_k_rows4_impl, q6_k_rows, Q6_K_BYTES, "Q6_K");

/// The AVX-512 VNNI four-token kernel of a weight type (see
/// [`crate::formats::DotKernel4`]); `None` for types without one or when this CPU
/// lacks one of the features.
pub(crate) fn kernel4(weight_type: GgmlType) -> Option<DotKernel4> {
    if !available() {
        return None;
    }
    let k: DotKernel4 = match weight_type {
        GgmlType::Q4_0 => dot4_q4_0_q8_0,
        GgmlType::Q5_0 => dot4_q5_0_q8_0,
        GgmlType::Q8_0 => dot4_q8_0_q8_0,
        GgmlType::Q4_K => dot4_q4_k_q8_k,
        GgmlType::Q6_K => dot4_q6_k_q8_k,
        GgmlType::Q4_1 => dot4_q4_1_q8_1,
        GgmlType::Q5_1 => dot4_q5_1_q8_1,
        GgmlType::IQ4_NL => dot4_iq4_nl_q8_0,
        GgmlType::Q2_K => dot4_q2_k_q8_k,
        GgmlType::Q3_K => dot4_q3_k_q8_k,
        GgmlType::IQ2_XXS if crate::grids_avx512::available() => {
            crate::grids_avx512::dot4_iq2_xxs_q8_k
        }
        GgmlType::IQ3_XXS if crate::grids_avx512::available() => {
            crate::grids_avx512::dot4_iq3_xxs_q8_k
        }
        GgmlType::IQ3_S if crate::grids_avx512::available() => crate::grids_avx512::dot4_iq3_s_q8_k,
        GgmlType::IQ2_XS if crate::grids_avx512::available() => {
            crate::grids_avx512::dot4_iq2_xs_q8_k
        }
        _ => return None,
    };
    Some(k)
}

/// Safe four-token entry points, handed out only by [`kernel4`].
macro_rules! checked_entry4 {
    ($($name:ident => $imp:ident),* $(,)?) => {$(
        fn $name(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
            // SAFETY: reachable only through `kernel4`, which verified AVX-512 F/BW/VL/VNNI,
            // AVX2, FMA and F16C on this CPU; the implementation reads only inside whole
            // blocks of `w` and of every `x`.
            unsafe { $imp(w, x) }
        }
    )*};
}

checked_entry4! {
    dot4_q4_1_q8_1 => q4_1_x4_impl,
    dot4_q5_1_q8_1 => q5_1_x4_impl,
    dot4_iq4_nl_q8_0 => iq4_nl_x4_impl,
    dot4_q4_0_q8_0 => q4_0_x4_impl,
    dot4_q5_0_q8_0 => q5_0_x4_impl,
    dot4_q8_0_q8_0 => q8_0_x4_impl,
    dot4_q4_k_q8_k => q4_k_x4_impl,
    dot4_q6_k_q8_k => q6_k_x4_impl,
    dot4_q2_k_q8_k => q2_k_x4_impl,
    dot4_q3_k_q8_k => q3_k_x4_impl,
}

/// The four-row kernel (one token, four weight rows) of `weight_type`, when this module
/// has one and the CPU can run it.
pub(crate) fn kernel_rows4(weight_type: GgmlType) -> Option<DotKernelRows4> {
    if !available() {
        return None;
    }
    let k: DotKernelRows4 = match weight_type {
        GgmlType::Q4_0 => dot_rows4_q4_0_q8_0,
        GgmlType::Q5_0 => dot_rows4_q5_0_q8_0,
        GgmlType::Q8_0 => dot_rows4_q8_0_q8_0,
        GgmlType::Q4_1 => dot_rows4_q4_1_q8_1,
        GgmlType::Q5_1 => dot_rows4_q5_1_q8_1,
        GgmlType::IQ4_NL => dot_rows4_iq4_nl_q8_0,
        GgmlType::IQ4_XS => dot_rows4_iq4_xs_q8_k,
        GgmlType::MXFP4 => dot_rows4_mxfp4_q8_0,
        GgmlType::Q4_K => dot_rows4_q4_k_q8_k,
        GgmlType::Q5_K => dot_rows4_q5_k_q8_k,
        GgmlType::Q6_K => dot_rows4_q6_k_q8_k,
        GgmlType::Q2_K => dot_rows4_q2_k_q8_k,
        GgmlType::Q3_K => dot_rows4_q3_k_q8_k,
        _ => return None,
    };
    Some(k)
}

checked_entry_rows4! {
    dot_rows4_q4_0_q8_0 => q4_0_rows4_impl,
    dot_rows4_q5_0_q8_0 => q5_0_rows4_impl,
    dot_rows4_q8_0_q8_0 => q8_0_rows4_impl,
    dot_rows4_q4_1_q8_1 => q4_1_rows4_impl,
    dot_rows4_q5_1_q8_1 => q5_1_rows4_impl,
    dot_rows4_iq4_nl_q8_0 => iq4_nl_rows4_impl,
    dot_rows4_iq4_xs_q8_k => iq4_xs_rows4_impl,
    dot_rows4_mxfp4_q8_0 => mxfp4_rows4_impl,
    dot_rows4_q4_k_q8_k => q4_k_rows4_impl,
    dot_rows4_q5_k_q8_k => q5_k_rows4_impl,
    dot_rows4_q6_k_q8_k => q6_k_rows4_impl,
    dot_rows4_q2_k_q8_k => q2_k_rows4_impl,
    dot_rows4_q3_k_q8_k => q3_k_rows4_impl,
}

/// Runs a per-block expression over the whole blocks of four weight rows `$w` and one
/// activation row `$x`, two rows per 512-bit register (row `2p` in the low 256 bits, row
/// `2p + 1` in the high ones). The activation block is prepared once, in both halves
/// (`$act`: its quants and the negated per-lane correction, which `$pair` takes as the
/// start of its `dpbusd` so that no subtraction follows); `$pair` gives a pair of rows'
/// integer lanes. Each row keeps its own eight-lane FMA chain with the single-token
/// kernel's exact operations (`d_w·d_x`, then one FMA per block), so output `r` has the
/// bits of [`lanes8_chain`] on `(w[r], x)`: a 512-bit FMA is eight-lane FMAs side by
/// side. One instruction serves two rows, which halves the work per byte; the two
/// independent chains also hide the FMA latency a single row waits on. The four rows'
/// f16 scales (each at the start of its block) are converted and multiplied by `d_x` in
/// one 128-bit step, then spread to the pairs' halves.
macro_rules! lanes8_rows4 {
    ($w:expr, $x:expr, $wbytes:expr, |$xb:ident| ($xq:ident, $base:ident) = $act:block,
     |$lo:ident, $hi:ident| $pair:block) => {{
        let mut rows = crate::avx2_rows4::Rows4::<{ $wbytes }>::new($w, $x.len() / Q8_0_BYTES);
        let spread = [
            _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi32(1)),
            _mm512_inserti64x4::<1>(_mm512_set1_epi32(2), _mm256_set1_epi32(3)),
        ];
        let mut acc = [_mm512_setzero_ps(); 2];
        for b in 0..rows.n_blocks() {
            let $xb = &$x[b * Q8_0_BYTES..(b + 1) * Q8_0_BYTES];
            let ($xq, $base): (__m512i, __m512i) = $act;
            let [b0, b1, b2, b3] = rows.block(b);
            // d_w·d_x of rows 0..4: the single-token kernels' product, lane by lane.
            // SAFETY: this module's kernels run on CPUs with AVX2 and F16C.
            let d4 = _mm512_castps128_ps512(unsafe {
                crate::avx2_rows4::scale_products4([b0, b1, b2, b3], $xb)
            });
            {
                let ($lo, $hi) = (b0, b1);
                let sumi: __m512i = $pair;
                let d = _mm512_permutexvar_ps(spread[0], d4);
                acc[0] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc[0]);
            }
            {
                let ($lo, $hi) = (b2, b3);
                let sumi: __m512i = $pair;
                let d = _mm512_permutexvar_ps(spread[1], d4);
                acc[1] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc[1]);
            }
        }
        let [low0, high0] = halves_ps(acc[0]);
        let [low1, high1] = halves_ps(acc[1]);
        [hsum_ps(low0), hsum_ps(high0), hsum_ps(low1), hsum_ps(high1)]
    }};
}

/// `v` itself, but a value the optimiser cannot see into. A nibble masked to 4 bits
/// plus a known 16 is also their OR, and LLVM rewrites `_mm512_mask_add_epi8(q4, k, q4,
/// sixteens)` (one masked `vpaddb`) as a `vporq` and a masked byte move: two vector
/// instructions where one does. With the sixteens opaque the add stays an add:
/// `benches/gemv` Q5_0 `avx512-rows4` 50.4–51.7 → 46.9–47.5 µs (AMD EPYC family 25
/// model 17, three alternating runs).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn opaque_512(mut v: __m512i) -> __m512i {
    // SAFETY: the template is a comment: it only names the register, which it leaves as
    // it is, and touches no memory, stack or flags.
    unsafe {
        std::arch::asm!(
            "/* {0} */",
            inout(zmm_reg) v,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    v
}

/// [`opaque_512`] for a 256-bit register.
#[inline]
#[target_feature(enable = "avx")]
pub(crate) fn opaque_256(mut v: __m256i) -> __m256i {
    // SAFETY: as in `opaque_512`.
    unsafe {
        std::arch::asm!(
            "/* {0} */",
            inout(ymm_reg) v,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    v
}

/// The low and the high eight lanes of `v`.
#[inline]
#[target_feature(enable = "avx512f")]
fn halves_ps(v: __m512) -> [__m256; 2] {
    let high = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v));
    [_mm512_castps512_ps256(v), _mm256_castpd_ps(high)]
}

/// 32 bytes at `bytes[offset..offset + 32]`, in both halves of a 512-bit register.
///
/// # Safety
/// `offset + 32 <= bytes.len()`.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn load32_both(bytes: &[u8], offset: usize) -> __m512i {
    // SAFETY: the caller's contract.
    _mm512_broadcast_i64x4(unsafe { load32(bytes, offset) })
}

/// 32 bytes at `offset` of `lo` (low half) and of `hi` (high half).
///
/// # Safety
/// `offset + 32` is within both.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn load32_pair(lo: &[u8], hi: &[u8], offset: usize) -> __m512i {
    // SAFETY: the caller's contract.
    let (l, h) = unsafe { (load32(lo, offset), load32(hi, offset)) };
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(l), h)
}

/// The 32 nibbles of the 16 bytes at `offset` of `lo` and of `hi` as bytes, each half in
/// the single-row kernels' order (the low nibbles, then the high ones).
///
/// # Safety
/// `offset + 16` is within both.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
unsafe fn nibbles_pair(lo: &[u8], hi: &[u8], offset: usize) -> __m512i {
    // SAFETY: the caller's contract.
    let (l, h) = unsafe { (load16(lo, offset), load16(hi, offset)) };
    // 128-bit lanes [l, l, h, h] as two broadcast loads (the second masked to the high
    // half), which need no shuffle unit; then shifted right by 0, 4, 0, 4 bits.
    let spread = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(l), 0xFF00, h);
    let shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    _mm512_and_si512(_mm512_srlv_epi64(spread, shifts), _mm512_set1_epi8(0x0F))
}

/// Q4_0 × Q8_0 for four weight rows and one token: [`q4_0_impl`] with the activation's
/// `8·Σx` lanes formed once per block for the four rows.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_0_rows4_impl(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
    let eights = _mm512_set1_epi8(8);
    let zero = _mm512_setzero_si512();
    lanes8_rows4!(
        w,
        x,
        Q4_0_BYTES,
        |xb| (xq, base) = {
            // SAFETY: x quants are bytes 2..34 of a 34-byte block.
            let xq = unsafe { load32_both(xb, 2) };
            (
                xq,
                _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, eights, xq)),
            )
        },
        |lo, hi| {
            // SAFETY: qs is bytes 2..18 of an 18-byte block.
            let q = unsafe { nibbles_pair(lo, hi, 2) };
            _mm512_dpbusd_epi32(base, q, xq)
        }
    )
}

/// Q5_0 × Q8_0 for four weight rows and one token: [`q5_0_impl`] with the activation's
/// `16·Σx` lanes formed once per block for the four rows.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_0_rows4_impl(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
    let sixteens = opaque_512(_mm512_set1_epi8(16));
    let zero = _mm512_setzero_si512();
    lanes8_rows4!(
        w,
        x,
        Q5_0_BYTES,
        |xb| (xq, base) = {
            // SAFETY: x quants are bytes 2..34 of a 34-byte block.
            let xq = unsafe { load32_both(xb, 2) };
            (
                xq,
                _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, sixteens, xq)),
            )
        },
        |lo, hi| {
            // SAFETY: qs is bytes 6..22 of a 22-byte block.
            let q4 = unsafe { nibbles_pair(lo, hi, q5_0::QS) };
            // The fifth bits: bit i of each half's qh adds 16 to its quant i.
            let qh = u64::from(read_u32(lo, q5_0::QH)) | u64::from(read_u32(hi, q5_0::QH)) << 32;
            let q = _mm512_mask_add_epi8(q4, qh, q4, sixteens);
            _mm512_dpbusd_epi32(base, q, xq)
        }
    )
}

/// Q8_0 × Q8_0 for four weight rows and one token: [`q8_0_impl`] with the activation's
/// `128·Σx` lanes formed once per block for the four rows.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_0_rows4_impl(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
    let bias = _mm512_set1_epi8(-128);
    let zero = _mm512_setzero_si512();
    lanes8_rows4!(
        w,
        x,
        Q8_0_BYTES,
        |xb| (xq, base) = {
            // SAFETY: x quants are bytes 2..34 of a 34-byte block.
            let xq = unsafe { load32_both(xb, 2) };
            (
                xq,
                _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, xq)),
            )
        },
        |lo, hi| {
            // SAFETY: quants are bytes 2..34 of a 34-byte block.
            let wq = _mm512_xor_si512(unsafe { load32_pair(lo, hi, 2) }, bias);
            _mm512_dpbusd_epi32(base, wq, xq)
        }
    )
}

/// Q4_0 × Q8_0 for four tokens: [`q4_0_impl`] with the nibbles unpacked once per block.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_0_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let low4 = _mm_set1_epi8(0x0F);
    let eights = _mm256_set1_epi8(8);
    let zero = _mm256_setzero_si256();
    lanes8_chain4!(
        w,
        x,
        Q4_0_BYTES,
        Q8_0_BYTES,
        |wb| (q, dw) = {
            // SAFETY: qs is bytes 2..18 of an 18-byte block.
            let qs = unsafe { load16(wb, 2) };
            let lo = _mm_and_si128(qs, low4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
            (_mm256_set_m128i(hi, lo), f16_splat(wb, 0))
        },
        |xb| {
            // SAFETY: x quants are bytes 2..34 of a 34-byte block.
            let xq = unsafe { load32(xb, 2) };
            let sumi = _mm256_sub_epi32(
                _mm256_dpbusd_epi32(zero, q, xq),
                _mm256_dpbusd_epi32(zero, eights, xq),
            );
            let d = _mm256_mul_ps(dw, f16_splat(xb, 0));
            (d, _mm256_cvtepi32_ps(sumi))
        }
    )
}

/// Q5_0 × Q8_0 for four tokens: [`q5_0_impl`] with the weight quants decoded once per
/// block.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_0_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let low4 = _mm_set1_epi8(0x0F);
    let sixteens = opaque_256(_mm256_set1_epi8(16));
    let zero = _mm256_setzero_si256();
    lanes8_chain4!(
        w,
        x,
        Q5_0_BYTES,
        Q8_0_BYTES,
        |wb| (q, dw) = {
            // SAFETY: qs is bytes 6..22 of a 22-byte block.
            let qs = unsafe { load16(wb, q5_0::QS) };
            let lo = _mm_and_si128(qs, low4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
            let q4 = _mm256_set_m128i(hi, lo);
            (
                _mm256_mask_add_epi8(q4, read_u32(wb, q5_0::QH), q4, sixteens),
                f16_splat(wb, 0),
            )
        },
        |xb| {
            // SAFETY: x quants are bytes 2..34 of a 34-byte block.
            let xq = unsafe { load32(xb, 2) };
            let sumi = _mm256_sub_epi32(
                _mm256_dpbusd_epi32(zero, q, xq),
                _mm256_dpbusd_epi32(zero, sixteens, xq),
            );
            let d = _mm256_mul_ps(dw, f16_splat(xb, 0));
            (d, _mm256_cvtepi32_ps(sumi))
        }
    )
}

/// Q8_0 × Q8_0 for four tokens: [`q8_0_impl`] with the biased weights formed once per
/// block.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_0_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let bias = _mm256_set1_epi8(-128);
    let zero = _mm256_setzero_si256();
    lanes8_chain4!(
        w,
        x,
        Q8_0_BYTES,
        Q8_0_BYTES,
        |wb| (wq, dw) = {
            // SAFETY: quants are bytes 2..34 of a 34-byte block.
            (
                _mm256_xor_si256(unsafe { load32(wb, 2) }, bias),
                f16_splat(wb, 0),
            )
        },
        |xb| {
            // SAFETY: quants are bytes 2..34 of a 34-byte block.
            let xq = unsafe { load32(xb, 2) };
            let sumi = _mm256_sub_epi32(
                _mm256_dpbusd_epi32(zero, wq, xq),
                _mm256_dpbusd_epi32(zero, bias, xq),
            );
            let d = _mm256_mul_ps(dw, f16_splat(xb, 0));
            (d, _mm256_cvtepi32_ps(sumi))
        }
    )
}

/// Q4_K × Q8_K for four tokens: [`q4_k_impl`] with the quants, scales and mins of each
/// super-block decoded once; per token the same integer lanes and the same two FMA
/// chains (`acc`, `acc_min`) as the single-token kernel.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_k_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let low4 = _mm512_set1_epi8(0x0F);
    let nibble_shift = halves_epi16(0, 4);
    let n_blocks = common_blocks(w, &x, Q4_K_BYTES, Q8_K_BYTES);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut acc_min = [_mm_setzero_ps(); 4];
    for b in 0..n_blocks {
        prefetch_ahead(w, b * Q4_K_BYTES);
        let wb = &w[b * Q4_K_BYTES..(b + 1) * Q4_K_BYTES];
        let dw = f16_splat(wb, 0);
        let dmin_w = _mm256_castps256_ps128(f16_splat(wb, q4_k::DMIN));
        let (sc, mn) = scales_mins_k4_packed(&wb[q4_k::SCALES..q4_k::SCALES + 12]);
        let scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let mut q = [_mm512_setzero_si512(); 4];
        let mut scale = [_mm512_setzero_si512(); 4];
        for chunk in 0..4 {
            // SAFETY: qs chunk is bytes 16+32c..48+32c of 144.
            let qs = unsafe { load32(wb, q4_k::QS + 32 * chunk) };
            q[chunk] = _mm512_and_si512(
                _mm512_srlv_epi16(_mm512_broadcast_i64x4(qs), nibble_shift),
                low4,
            );
            let j = 2 * chunk as i16;
            scale[chunk] = _mm512_permutexvar_epi16(halves_epi16(j, j + 1), scales);
        }
        let xbs = block_of_each(&x, b, Q8_K_BYTES);
        for (t, xb) in xbs.into_iter().enumerate() {
            let d = _mm256_mul_ps(dw, f32_splat(xb, 0));
            let neg_dmin = _mm_mul_ps(_mm_set1_ps(-read_f32(xb, 0)), dmin_w);
            // SAFETY: xb is a whole Q8_K block.
            let min_lanes = unsafe { k4_min_lanes(xb, mn) };
            acc_min[t] = _mm_fmadd_ps(neg_dmin, _mm_cvtepi32_ps(min_lanes), acc_min[t]);
            let mut sumi = _mm512_setzero_si512();
            for chunk in 0..4 {
                // SAFETY: x quants 4+64c..68+64c of 292.
                let xq = unsafe { load64(xb, q8_k::QS + 64 * chunk) };
                sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q[chunk], xq), scale[chunk]);
            }
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold_halves(sumi)), acc[t]);
        }
    }
    [
        hsum_ps(acc[0]) + hsum4_ps(acc_min[0]),
        hsum_ps(acc[1]) + hsum4_ps(acc_min[1]),
        hsum_ps(acc[2]) + hsum4_ps(acc_min[2]),
        hsum_ps(acc[3]) + hsum4_ps(acc_min[3]),
    ]
}

/// Q6_K × Q8_K for four tokens: [`q6_k_impl`] with the 6-bit quants and the scale
/// vectors of each super-block formed once.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let low4 = _mm512_set1_epi8(0x0F);
    let bits45 = _mm512_set1_epi8(0x30);
    let shift_first = halves_epi16(4, 2);
    let shift_second = halves_epi16(0, 2);
    let n_blocks = common_blocks(w, &x, Q6_K_BYTES, Q8_K_BYTES);
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..n_blocks {
        prefetch_ahead(w, b * Q6_K_BYTES);
        let wb = &w[b * Q6_K_BYTES..(b + 1) * Q6_K_BYTES];
        let dw = f16_splat(wb, q6_k::D);
        // SAFETY: scales are bytes 192..208 of 210.
        let sc16 = _mm256_cvtepi8_epi16(unsafe { load16(wb, q6_k::SCALES) });
        let scales = _mm512_castsi256_si512(sc16);
        // Quant vectors and their scales in the single-token kernel's order: half 0
        // first, half 0 second, half 1 first, half 1 second.
        let mut q = [_mm512_setzero_si512(); 4];
        let mut scale = [_mm512_setzero_si512(); 4];
        for half in 0..2 {
            // SAFETY: ql half is bytes 64h..64h+64 and qh half 128+32h..160+32h of 210.
            let (ql, qh) = unsafe {
                (
                    load64(wb, q6_k::QL + 64 * half),
                    _mm512_broadcast_i64x4(load32(wb, q6_k::QH + 32 * half)),
                )
            };
            q[2 * half] = _mm512_or_si512(
                _mm512_and_si512(ql, low4),
                _mm512_and_si512(_mm512_sllv_epi16(qh, shift_first), bits45),
            );
            q[2 * half + 1] = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4),
                _mm512_and_si512(_mm512_srlv_epi16(qh, shift_second), bits45),
            );
            let base = 8 * half as i16;
            scale[2 * half] = _mm512_permutexvar_epi16(quarters_epi16(base), scales);
            scale[2 * half + 1] = _mm512_permutexvar_epi16(quarters_epi16(base + 4), scales);
        }
        let xbs = block_of_each(&x, b, Q8_K_BYTES);
        for (t, xb) in xbs.into_iter().enumerate() {
            let d = _mm256_mul_ps(f32_splat(xb, 0), dw);
            // SAFETY: bsums are bytes 260..292 of 292.
            let bsums = unsafe { load32(xb, q8_k::BSUMS) };
            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16));
            let mut sumi = _mm512_setzero_si512();
            for v in 0..4 {
                // SAFETY: x quants 4+64v..68+64v of 292.
                let xq = unsafe { load64(xb, q8_k::QS + 64 * v) };
                sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q[v], xq), scale[v]);
            }
            let lanes = _mm256_sub_epi32(fold_halves(sumi), offset);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[t]);
        }
    }
    [
        hsum_ps(acc[0]),
        hsum_ps(acc[1]),
        hsum_ps(acc[2]),
        hsum_ps(acc[3]),
    ]
}

/// The Q8_K activation quantizer ([`crate::formats::q8_k::quantize_block`] per block) sixteen values
/// at a time: the same signed maximum (first of equal magnitudes), the same
/// `−127/max` multiplier and magic-number rounding, the same group sums; same bytes.
///
/// # Safety
/// The CPU has the features of this module; `out` holds `x.len() / 256` Q8_K blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        // SAFETY: xb holds 256 f32, sixteen registers.
        let v: [__m512; 16] =
            std::array::from_fn(|i| unsafe { _mm512_loadu_ps(xb.as_ptr().add(16 * i)) });
        let abs =
            |r: __m512| _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r), abs_mask));
        let mut amax_v = abs(v[0]);
        for r in &v[1..] {
            amax_v = _mm512_max_ps(amax_v, abs(*r));
        }
        let amax = _mm512_reduce_max_ps(amax_v);
        if amax.is_nan() || amax <= 0.0 {
            // All zero (or no finite magnitude): the scalar path decides.
            crate::formats::q8_k::quantize_block(xb, ob);
            continue;
        }
        // The first element of that magnitude, with its sign.
        let mut max = 0.0f32;
        for r in &v {
            let m = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(abs(*r), _mm512_set1_ps(amax));
            if m != 0 {
                let mut lanes = [0f32; 16];
                // SAFETY: lanes holds sixteen f32.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *r) };
                max = lanes[m.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0f32 / max;
        let iscale_v = _mm512_set1_ps(iscale);
        let magic = _mm512_set1_ps(12_582_912.0);
        ob[..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
        for (i, r) in v.iter().enumerate() {
            let shifted = _mm512_add_ps(_mm512_mul_ps(iscale_v, *r), magic);
            let q = _mm512_sub_epi32(
                _mm512_and_si512(_mm512_castps_si512(shifted), _mm512_set1_epi32(0x007f_ffff)),
                _mm512_set1_epi32(0x0040_0000),
            );
            let q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
            let bytes = _mm512_cvtepi32_epi8(q);
            // SAFETY: quants i·16..i·16+16 of the block's 256.
            unsafe {
                _mm_storeu_si128(
                    ob.as_mut_ptr().add(q8_k::QS + 16 * i) as *mut __m128i,
                    bytes,
                )
            };
            let sum = _mm512_reduce_add_epi32(q) as i16;
            let at = q8_k::BSUMS + 2 * i;
            ob[at..at + 2].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

// ---------------------------------------------------------------------------------------
// The formats of `crate::formats::BLOCK_FORMATS` (one row of Q2_K and Q3_K runs the AVX2
// kernel, four rows the four-row kernels above).
// Same lane integers and float order as the scalar twins and the AVX2 tier.

/// One Q4_1/Q5_1 block against one Q8_1 block, as `avx2::q8_1_step` with `dpbusd`.
///
/// # Safety
/// `xb` is a whole Q8_1 block; the CPU has the features of this module.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_1_step(
    q: __m256i,
    d_w: __m256,
    m_w: f32,
    xb: &[u8],
    acc: &mut __m256,
    summs: &mut f32,
) {
    *summs = m_w.mul_add(f16_scalar(xb, q8_1::S), *summs);
    // SAFETY: x quants are bytes 4..36 of 36.
    let xq = unsafe { load32(xb, q8_1::QS) };
    let lanes = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xq));
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(d_w, f16_splat(xb, 0)), lanes, *acc);
}

/// The one- and four-token kernels of an offset format (Q4_1, Q5_1) from its level
/// decoder: per block `fma(d_w·d_x, lanes)`, offsets `m_w·s_x` in one running f32.
macro_rules! offset32_kernels {
    ($single:ident, $four:ident, $bytes:expr, $levels:ident) => {
        /// # Safety
        /// The CPU has the features of this module.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $single(w: &[u8], x: &[u8]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let mut summs = 0.0f32;
            let blocks = w.chunks_exact($bytes).zip(x.chunks_exact(q8_1::BYTES));
            for (b, (wb, xb)) in blocks.enumerate() {
                crate::avx2::prefetch_block(w, b * $bytes, $bytes, 1);
                // SAFETY: whole blocks of both rows (chunks_exact).
                unsafe {
                    let q = $levels(wb);
                    let m_w = f16_scalar(wb, q4_1::M);
                    q8_1_step(q, f16_splat(wb, 0), m_w, xb, &mut acc, &mut summs);
                }
            }
            hsum_ps(acc) + summs
        }

        /// # Safety
        /// The CPU has the features of this module.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $four(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
            let n_blocks = common_blocks(w, &x, $bytes, q8_1::BYTES);
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut summs = [0.0f32; 4];
            for b in 0..n_blocks {
                let wb = &w[b * $bytes..(b + 1) * $bytes];
                let xb = block_of_each(&x, b, q8_1::BYTES);
                // SAFETY: whole blocks of every row.
                unsafe {
                    let q = $levels(wb);
                    let (d_w, m_w) = (f16_splat(wb, 0), f16_scalar(wb, q4_1::M));
                    for t in 0..4 {
                        q8_1_step(q, d_w, m_w, xb[t], &mut acc[t], &mut summs[t]);
                    }
                }
            }
            std::array::from_fn(|t| hsum_ps(acc[t]) + summs[t])
        }
    };
}

/// The 32 five-bit levels of a Q5_1 block: the nibbles, plus 16 where a `qh` bit is set
/// (one masked byte add, where `avx2::q5_1_levels` spreads the bits by shuffles).
///
/// # Safety
/// `wb` is a whole Q5_1 block; the CPU has the features of this module.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_1_levels_masked(wb: &[u8]) -> __m256i {
    let low4 = _mm_set1_epi8(0x0F);
    // SAFETY: qs is bytes 8..24 of a 24-byte block.
    let qs = unsafe { load16(wb, q5_1::QS) };
    let q4 = _mm256_set_m128i(
        _mm_and_si128(_mm_srli_epi16::<4>(qs), low4),
        _mm_and_si128(qs, low4),
    );
    _mm256_mask_add_epi8(
        q4,
        read_u32(wb, q5_1::QH),
        q4,
        opaque_256(_mm256_set1_epi8(16)),
    )
}

offset32_kernels!(q4_1_impl, q4_1_x4_impl, q4_1::BYTES, q4_1_levels);
offset32_kernels!(q5_1_impl, q5_1_x4_impl, q5_1::BYTES, q5_1_levels_masked);

/// Whole blocks every one of four rows and the activation row have.
#[inline]
fn rows4_blocks(w: &[&[u8]; 4], x: &[u8], w_bytes: usize, x_bytes: usize) -> usize {
    w.iter()
        .map(|wr| wr.len() / w_bytes)
        .fold(x.len() / x_bytes, usize::min)
}

/// The four-row kernel of an offset format (decoding: one activation row, four weight
/// rows, four independent chains that hide the FMA latency one row waits on); output `r`
/// has the one-token kernel's bits on `(w[r], x)`.
macro_rules! offset32_rows4 {
    ($name:ident, $bytes:expr, $levels:ident) => {
        /// # Safety
        /// The CPU has the features of this module.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $name(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
            let n_blocks = rows4_blocks(&w, x, $bytes, q8_1::BYTES);
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut summs = [0.0f32; 4];
            for b in 0..n_blocks {
                let xb = &x[b * q8_1::BYTES..(b + 1) * q8_1::BYTES];
                // The activation block's scale, sum and quants once for the four rows
                // (`q8_1_step`'s operations otherwise).
                let (d_x, s_x) = (f16_splat(xb, 0), f16_scalar(xb, q8_1::S));
                // SAFETY: x quants are bytes 4..36 of 36.
                let xq = unsafe { load32(xb, q8_1::QS) };
                for r in 0..4 {
                    crate::avx2::prefetch_block(w[r], b * $bytes, $bytes, 4);
                    let wb = &w[r][b * $bytes..(b + 1) * $bytes];
                    // SAFETY: whole blocks of every row.
                    let q = unsafe { $levels(wb) };
                    summs[r] = f16_scalar(wb, q4_1::M).mul_add(s_x, summs[r]);
                    let lanes =
                        _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), q, xq));
                    acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(f16_splat(wb, 0), d_x), lanes, acc[r]);
                }
            }
            std::array::from_fn(|r| hsum_ps(acc[r]) + summs[r])
        }
    };
}

offset32_rows4!(q4_1_rows4_impl, q4_1::BYTES, q4_1_levels);
offset32_rows4!(q5_1_rows4_impl, q5_1::BYTES, q5_1_levels_masked);

/// A level table plus 128: unsigned, so `dpbusd` can take it.
const fn biased(levels: &[i8; 16]) -> [u8; 16] {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (levels[i] as i16 + 128) as u8;
        i += 1;
    }
    t
}

/// IQ4_NL's levels plus 128 (1..241).
const KVALUES_BIASED: [u8; 16] = biased(&iq4_nl::KVALUES);
/// MXFP4's (doubled E2M1) levels plus 128 (116..140).
const MXFP4_BIASED: [u8; 16] = biased(&mxfp4::KVALUES);

/// 32 table-coded weights (a 16-byte nibble field) as biased levels `v + 128`, weights
/// 0..16 in the low 128 bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn iq4_biased(qs: __m128i) -> __m256i {
    table_biased(qs, &KVALUES_BIASED)
}

/// [`iq4_biased`] with the biased table `levels`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn table_biased(qs: __m128i, levels: &[u8; 16]) -> __m256i {
    let low4 = _mm_set1_epi8(0x0F);
    // SAFETY: the table is 16 bytes; unaligned load.
    let table = unsafe { _mm_loadu_si128(levels.as_ptr() as *const __m128i) };
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, low4));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(qs), low4));
    _mm256_set_m128i(hi, lo)
}

/// Lane integers of biased table levels with the activation bytes `x[at..at + 32]`:
/// `Σ (v+128)·x − 128·Σ x` per quad (two `dpbusd`, exact for every byte).
///
/// # Safety
/// `at + 32 <= x.len()`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4_quads(biased: __m256i, x: &[u8], at: usize) -> __m256i {
    // SAFETY: in bounds by the caller's contract.
    let xq = unsafe { load32(x, at) };
    let zero = _mm256_setzero_si256();
    _mm256_sub_epi32(
        _mm256_dpbusd_epi32(zero, biased, xq),
        _mm256_dpbusd_epi32(zero, _mm256_set1_epi8(-128), xq),
    )
}

/// Two consecutive table-coded blocks' biased levels `v + 128` in one register, 128-bit
/// lanes `[block 0 weights 0..16, 16..32, block 1 weights 0..16, 16..32]`, the nibbles
/// at `qs_at` of each block.
///
/// # Safety
/// `w0` and `w1` hold 16 bytes at `qs_at`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn biased_pair(w0: &[u8], w1: &[u8], qs_at: usize, table: __m512i) -> __m512i {
    // SAFETY: the caller's contract.
    let (q0, q1) = unsafe { (load16(w0, qs_at), load16(w1, qs_at)) };
    // 128-bit lanes [q0, q0, q1, q1] as two broadcast loads (no shuffle unit), shifted
    // right by 0, 4, 0, 4 bits: [lo0, hi0, lo1, hi1].
    let spread = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(q0), 0xFF00, q1);
    let shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    let nibbles = _mm512_and_si512(_mm512_srlv_epi64(spread, shifts), _mm512_set1_epi8(0x0F));
    _mm512_shuffle_epi8(table, nibbles)
}

/// `[a; 8]` in the low 256 bits, `[b; 8]` in the high ones.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn splat_pair(a: f32, b: f32) -> __m512 {
    let low = _mm512_castps256_ps512(_mm256_set1_ps(a));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castps_pd(low),
        _mm256_castps_pd(_mm256_set1_ps(b)),
    ))
}

/// The table formats paired with Q8_0 in IQ4_NL's order: `MX` false for IQ4_NL (f16
/// scale), true for MXFP4 (E8M0 scale, its own table).
const IQ4_NL: bool = false;
const MXFP4: bool = true;

/// IQ4_NL (or MXFP4, `MX`) × Q8_0 for `R` weight rows and one token, in the order of
/// `avx2::Iq4nlAcc` with each pair of blocks in one 512-bit register: the even block's eight lanes in
/// the low half, the odd one's in the high half, so one FMA advances both chains (each
/// half its own, as the two accumulators of the order), and the halves are added
/// lane-wise at the end. An odd last block joins as one fused multiply-add of its scale
/// with its integer sum.
///
/// # Safety
/// The CPU has the features of this module; every row holds `n_blocks` blocks and `x`
/// as many Q8_0 blocks (see the callers).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn table_pairs<const R: usize, const MX: bool>(
    w: [&[u8]; R],
    x: &[u8],
    n_blocks: usize,
) -> [f32; R] {
    let (b, qs_at, levels) = if MX {
        (mxfp4::BYTES, mxfp4::QS, &MXFP4_BIASED)
    } else {
        (iq4_nl::BYTES, iq4_nl::QS, &KVALUES_BIASED)
    };
    let d_w = |wb: &[u8]| {
        if MX {
            mxfp4::e8m0_to_f32_half(wb[mxfp4::E])
        } else {
            f16_scalar(wb, 0)
        }
    };
    // SAFETY: the table is 16 bytes; unaligned load.
    let table =
        _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(levels.as_ptr() as *const __m128i) });
    let minus128 = _mm512_set1_epi8(-128);
    let zero = _mm512_setzero_si512();
    let paired = n_blocks & !1;
    let mut acc = [_mm512_setzero_ps(); R];
    for ib in (0..paired).step_by(2) {
        let (x0, x1) = (&x[ib * Q8_0_BYTES..], &x[(ib + 1) * Q8_0_BYTES..]);
        // SAFETY: x quants are bytes 2..34 of each 34-byte block.
        let xq = unsafe {
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(load32(x0, 2)), load32(x1, 2))
        };
        // The correction −128·Σx per quad, shared by the rows: each row's `dpbusd`
        // starts from it, so Σ(v+128)·x − 128·Σx needs no subtraction.
        let base = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, minus128, xq));
        let (dx0, dx1) = (f16_scalar(x0, 0), f16_scalar(x1, 0));
        each_row!(R, |r| {
            crate::avx2::prefetch_block(w[r], ib * b, b, R);
            let (w0, w1) = (
                &w[r][ib * b..(ib + 1) * b],
                &w[r][(ib + 1) * b..(ib + 2) * b],
            );
            // SAFETY: whole blocks (qs is 16 bytes at `qs_at`).
            let biased = unsafe { biased_pair(w0, w1, qs_at, table) };
            let lanes = _mm512_dpbusd_epi32(base, biased, xq);
            let d = splat_pair(dx0 * d_w(w0), dx1 * d_w(w1));
            acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), acc[r]);
        });
    }
    let mut out = [0f32; R];
    for r in 0..R {
        let even = _mm512_castps512_ps256(acc[r]);
        let odd = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[r])));
        let sumf = hsum_ps(_mm256_add_ps(even, odd));
        if paired < n_blocks {
            let xb = &x[paired * Q8_0_BYTES..];
            let wb = &w[r][paired * b..];
            // SAFETY: the last whole blocks.
            let lanes = unsafe { iq4_quads(table_biased(load16(wb, qs_at), levels), xb, 2) };
            let sumi = hsum_epi32_8(lanes);
            out[r] = (f16_scalar(xb, 0) * d_w(wb)).mul_add(sumi as f32, sumf);
        } else {
            out[r] = sumf;
        }
    }
    out
}

/// IQ4_NL × Q8_0 (the float order of `avx2::Iq4nlAcc`, see [`table_pairs`]).
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4_nl_impl(w: &[u8], x: &[u8]) -> f32 {
    let n_blocks = (w.len() / iq4_nl::BYTES).min(x.len() / Q8_0_BYTES);
    // SAFETY: the same features; whole blocks.
    let [sum] = unsafe { table_pairs::<1, IQ4_NL>([w], x, n_blocks) };
    sum
}

/// MXFP4 × Q8_0 (IQ4_NL's order, see [`table_pairs`]).
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn mxfp4_impl(w: &[u8], x: &[u8]) -> f32 {
    let n_blocks = (w.len() / mxfp4::BYTES).min(x.len() / Q8_0_BYTES);
    // SAFETY: the same features; whole blocks.
    let [sum] = unsafe { table_pairs::<1, MXFP4>([w], x, n_blocks) };
    sum
}

/// MXFP4 × Q8_0 for four weight rows and one token.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn mxfp4_rows4_impl(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
    let n_blocks = rows4_blocks(&w, x, mxfp4::BYTES, Q8_0_BYTES);
    // SAFETY: the same features; whole blocks of every row.
    unsafe { table_pairs::<4, MXFP4>(w, x, n_blocks) }
}

/// IQ4_XS × Q8_K for `R` weight rows and one token, in the order of its single-token
/// kernel (`avx2::iq4_xs_impl`): per super-block eight exact integer lanes
/// `Σ_j ls_j·quad_j,l`, one `fma(d_w·d_x, lanes)`. Two sub-blocks share a 512-bit
/// register (their 32 level bytes and 64 activation bytes are contiguous); the integer
/// halves are added at the end of the super-block (exact in any order).
///
/// # Safety
/// The CPU has the features of this module; every row holds `n_blocks` super-blocks and
/// `x` as many Q8_K blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4_xs_rows<const R: usize>(w: [&[u8]; R], x: &[u8], n_blocks: usize) -> [f32; R] {
    const B: usize = iq4_xs::BYTES;
    // SAFETY: the table is 16 bytes; unaligned load.
    let table = _mm512_broadcast_i32x4(unsafe {
        _mm_loadu_si128(KVALUES_BIASED.as_ptr() as *const __m128i)
    });
    let low4 = _mm256_set1_epi8(0x0F);
    let minus128 = _mm512_set1_epi8(-128);
    let zero = _mm512_setzero_si512();
    let pair_index: [__m512i; 4] = std::array::from_fn(|p| {
        _mm512_inserti64x4::<1>(
            _mm512_set1_epi32(2 * p as i32),
            _mm256_set1_epi32(2 * p as i32 + 1),
        )
    });
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..n_blocks {
        let xb = &x[b * Q8_K_BYTES..(b + 1) * Q8_K_BYTES];
        // SAFETY (loads): x quants are bytes 4..260 of 292; each pair of sub-blocks'
        // levels 32 bytes of 8..136 of 136.
        let xq: [__m512i; 4] = [0, 1, 2, 3].map(|p| unsafe { load64(xb, q8_k::QS + 64 * p) });
        let corr: [__m512i; 4] = [0, 1, 2, 3].map(|p| _mm512_dpbusd_epi32(zero, minus128, xq[p]));
        let dx = f32_splat(xb, 0);
        each_row!(R, |r| {
            let wb = &w[r][b * B..(b + 1) * B];
            crate::avx2::prefetch_block(w[r], b * B, B, R);
            // SAFETY: a whole super-block; the features of this function.
            let scales = _mm512_castsi256_si512(unsafe { crate::avx2::iq4_xs_scales(wb) });
            let mut sumi = zero;
            for p in 0..4 {
                // SAFETY: as above.
                let qs = unsafe { load32(wb, iq4_xs::QS + 32 * p) };
                let lo = _mm256_and_si256(qs, low4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qs), low4);
                // [lo j, lo j+1, hi j, hi j+1] → [lo j, hi j, lo j+1, hi j+1].
                let halves = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                let ordered = _mm512_shuffle_i64x2::<0b11_01_10_00>(halves, halves);
                let biased = _mm512_shuffle_epi8(table, ordered);
                let quads = _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, biased, xq[p]), corr[p]);
                // Sub-block 2p's scale in the low eight lanes, 2p + 1's in the high.
                let pair = _mm512_permutexvar_epi32(pair_index[p], scales);
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(quads, pair));
            }
            let lanes = _mm256_add_epi32(
                _mm512_castsi512_si256(sumi),
                _mm512_extracti64x4_epi64::<1>(sumi),
            );
            let d = _mm256_mul_ps(f16_splat(wb, 0), dx);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[r]);
        });
    }
    let mut out = [0f32; R];
    for r in 0..R {
        out[r] = hsum_ps(acc[r]);
    }
    out
}

/// IQ4_XS × Q8_K (see [`iq4_xs_rows`]).
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4_xs_impl(w: &[u8], x: &[u8]) -> f32 {
    let n_blocks = (w.len() / iq4_xs::BYTES).min(x.len() / Q8_K_BYTES);
    // SAFETY: the same features; whole blocks.
    let [sum] = unsafe { iq4_xs_rows([w], x, n_blocks) };
    sum
}

/// IQ4_XS × Q8_K for four weight rows and one token.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4_xs_rows4_impl(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
    let n_blocks = rows4_blocks(&w, x, iq4_xs::BYTES, Q8_K_BYTES);
    // SAFETY: the same features; whole blocks of every row.
    unsafe { iq4_xs_rows(w, x, n_blocks) }
}

/// IQ4_NL × Q8_0 for four tokens.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4_nl_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let n_blocks = common_blocks(w, &x, iq4_nl::BYTES, Q8_0_BYTES);
    let paired = n_blocks & !1;
    let mut acc = [
        Iq4nlAcc::new(),
        Iq4nlAcc::new(),
        Iq4nlAcc::new(),
        Iq4nlAcc::new(),
    ];
    for ib in 0..n_blocks {
        let wb = &w[ib * iq4_nl::BYTES..(ib + 1) * iq4_nl::BYTES];
        // SAFETY: qs is bytes 2..18 of an 18-byte block.
        let biased = iq4_biased(unsafe { load16(wb, iq4_nl::QS) });
        let d_w = f16_scalar(wb, 0);
        for (t, xb) in block_of_each(&x, ib, Q8_0_BYTES).into_iter().enumerate() {
            // SAFETY: x quants 2..34 of 34.
            let lanes = unsafe { iq4_quads(biased, xb, 2) };
            acc[t].add(ib, paired, f16_scalar(xb, 0) * d_w, lanes);
        }
    }
    std::array::from_fn(|t| acc[t].finish())
}

/// IQ4_NL × Q8_0 for four weight rows and one token.
///
/// # Safety
/// The CPU has the features of this module.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4_nl_rows4_impl(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
    // The order of `avx2::Iq4nlAcc` (see [`table_pairs`]): per row an even-block and an
    // odd-block chain of eight lanes, added lane-wise at the end. Here a register holds
    // one block of two rows (as in the Q4_0 four-row kernel), so the activation block
    // reaches both halves by a broadcast load, no lane crossing joins two blocks, and the
    // four rows' f16 scales convert in one instruction. (MXFP4's E8M0 scales convert one
    // by one, which made this layout slower for it than `table_pairs`.)
    let mut rows = crate::avx2_rows4::Rows4::<{ iq4_nl::BYTES }>::new(w, x.len() / Q8_0_BYTES);
    let n_blocks = rows.n_blocks();
    let paired = n_blocks & !1;
    // SAFETY: the table is 16 bytes; unaligned load.
    let table = _mm512_broadcast_i32x4(unsafe {
        _mm_loadu_si128(KVALUES_BIASED.as_ptr() as *const __m128i)
    });
    let minus128 = _mm512_set1_epi8(-128);
    let zero = _mm512_setzero_si512();
    let spread = [
        _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi32(1)),
        _mm512_inserti64x4::<1>(_mm512_set1_epi32(2), _mm256_set1_epi32(3)),
    ];
    // [even block: rows 0 and 1, rows 2 and 3; odd block: rows 0 and 1, rows 2 and 3]
    let mut acc = [_mm512_setzero_ps(); 4];
    for even in (0..paired).step_by(2) {
        for parity in 0..2 {
            let ib = even + parity;
            let xb = &x[ib * Q8_0_BYTES..(ib + 1) * Q8_0_BYTES];
            // SAFETY: x quants are bytes 2..34 of a 34-byte block.
            let xq = unsafe { load32_both(xb, 2) };
            // −128·Σx per quad, where each row's `dpbusd` starts.
            let base = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, minus128, xq));
            let blocks = rows.block(ib);
            // SAFETY: this module's kernels run on CPUs with AVX2 and F16C.
            let d4 =
                _mm512_castps128_ps512(unsafe { crate::avx2_rows4::scale_products4(blocks, xb) });
            for pair in 0..2 {
                // SAFETY: qs is 16 bytes at `iq4_nl::QS` of a whole block.
                let nibbles =
                    unsafe { nibbles_pair(blocks[2 * pair], blocks[2 * pair + 1], iq4_nl::QS) };
                let lanes = _mm512_dpbusd_epi32(base, _mm512_shuffle_epi8(table, nibbles), xq);
                let d = _mm512_permutexvar_ps(spread[pair], d4);
                let a = &mut acc[2 * parity + pair];
                *a = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lanes), *a);
            }
        }
    }
    let mut out = [0f32; 4];
    for (r, out) in out.iter_mut().enumerate() {
        let (pair, half) = (r / 2, r % 2);
        let even = halves_ps(acc[pair])[half];
        let odd = halves_ps(acc[2 + pair])[half];
        let sumf = hsum_ps(_mm256_add_ps(even, odd));
        *out = if paired < n_blocks {
            let xb = &x[paired * Q8_0_BYTES..];
            let wb = &w[r][paired * iq4_nl::BYTES..];
            // SAFETY: the last whole blocks.
            let lanes = unsafe { iq4_quads(iq4_biased(load16(wb, iq4_nl::QS)), xb, 2) };
            (f16_scalar(xb, 0) * f16_scalar(wb, 0)).mul_add(hsum_epi32_8(lanes) as f32, sumf)
        } else {
            sumf
        };
    }
    out
}
