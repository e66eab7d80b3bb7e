//! AVX2 dot kernels (x86-64 with AVX2, FMA and F16C) for the quantized weight types.
//!
//! Each kernel computes the same integers as its scalar twin in [`crate::dot_scalar`],
//! exactly, in the same eight i32 lanes (lane `l` holds quants `4l..4l+4` of every
//! 32-quant group, which is what `madd(maddubs(..))` yields), then goes to f32:
//!
//! | weight | lane integers (i32, exact) | how |
//! |---|---|---|
//! | Q4_0 | `Σ (q−8)·x` | `maddubs(q, x) − maddubs(8, x)` with q unsigned 0..15 |
//! | Q5_0 | `Σ (q−16)·x` | as Q4_0 with the fifth bit merged, q 0..31 |
//! | Q8_0 | `Σ w·x` | both sides widened to i16, `madd`, `hadd` (exact even for −128) |
//! | Q4_K / Q5_K | `Σ sc·Σ q·x`; mins `Σ m·bsum` in four lanes | `maddubs`, `madd` by the scale |
//! | Q6_K | `Σ sc·Σ q·x − 32·Σ sc·bsum` | q unsigned 0..63, offset from the bsums |
//! | Q4_1 / Q5_1 | `Σ q·x` (offset `m·s` apart, in f32) | `maddubs`, q unsigned 0..15 / 0..31 |
//! | IQ4_NL / IQ4_XS | `Σ KVALUES[i]·x` (XS: `Σ ls·…`) | table by `pshufb`, i16 `madd`, `hadd` |
//! | Q2_K | `Σ sc·Σ q·x`; mins `Σ m·bsum` in the same lanes | `maddubs`, `madd` by the scale |
//! | Q3_K | `Σ sc·Σ (low − 4·!high)·x` | two `maddubs`, difference, `madd` by the scale |
//! | MXFP4 | `Σ KVALUES[i]·x` | as IQ4_NL with its own table and the E8M0 scale |
//! | TQ2_0 / TQ1_0 | `Σ t·x − bsums` (`t` 0..2) | `maddubs` into i16, bsums off in i16, `madd` by ones |
//!
//! `maddubs` adds two u8×i8 products into an i16 with saturation; with the unsigned
//! weight ranges above (at most 63·128·2 = 16128) it never saturates, whatever the
//! activation bytes. The K formats read the Q8_K `bsums`, so they assume those are the
//! sums of the quants (as [`crate::quant`] writes them); the scalar twins do too.
//!
//! Float part, the scalar twins' `Lanes8` order: per block one FMA `acc = d·lanes + acc`
//! (`d = d_w·d_x`, see [`lanes8_chain`]); Q4_K adds the min lanes with `−d_x·dmin_w`
//! into four more lanes (Q5_K: one running f32, as ggml's AVX2 kernel); at the end the
//! lanes are summed `((0+4)+(2+6))+((1+5)+(3+7))` and `(m0+m2)+(m1+m3)`. So every kernel
//! gives its scalar twin's bits exactly. The order depends on the row length alone,
//! never on which rows or tokens are computed together (batch invariance).

use std::arch::x86_64::*;

use nx_gguf::GgmlType;

use crate::dot_scalar::DotKernel;
use crate::formats::DotKernel4;
use crate::formats::{
    iq4_nl, iq4_xs, mxfp4, q2_k, q3_k, q4_1, q4_k, q5_0, q5_1, q6_k, q8_1, q8_k, read_f32,
    read_u32, scales_mins_k4_packed, tq1_0, tq2_0, Q4_0_BYTES, Q4_K_BYTES, Q5_0_BYTES, Q5_K_BYTES,
    Q6_K_BYTES, Q8_0_BYTES, Q8_K_BYTES,
};

/// True when this CPU can run the kernels of this module.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// The AVX2 kernel of a weight type; `None` for types without one (the float types) or
/// when this CPU lacks AVX2, FMA or F16C.
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
        GgmlType::Q2_K => dot_q2_k_q8_k,
        GgmlType::Q3_K => dot_q3_k_q8_k,
        GgmlType::F32 => dot_f32_f32,
        GgmlType::F16 => dot_f16_f16,
        GgmlType::BF16 => return crate::bf16_x86::avx2_kernel(),
        GgmlType::IQ2_XXS => dot_iq2_xxs_q8_k,
        GgmlType::IQ2_XS => dot_iq2_xs_q8_k,
        GgmlType::IQ2_S => dot_iq2_s_q8_k,
        GgmlType::IQ3_XXS => dot_iq3_xxs_q8_k,
        GgmlType::IQ3_S => dot_iq3_s_q8_k,
        GgmlType::IQ1_S => dot_iq1_s_q8_k,
        GgmlType::IQ1_M => dot_iq1_m_q8_k,
        GgmlType::MXFP4 => dot_mxfp4_q8_0,
        GgmlType::TQ2_0 => dot_tq2_0_q8_k,
        GgmlType::TQ1_0 => dot_tq1_0_q8_k,
        _ => return None,
    };
    Some(k)
}

/// The ±1 bytes of each 7-bit IQ2 sign index (its eighth sign completing even parity,
/// as [`crate::formats::grids::parity_signs`]), the form `sign_epi8` takes.
static IQ2_SIGN_BYTES: [u64; 128] = {
    let mut table = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let signs = i as u32 | ((i as u32).count_ones() % 2) << 7;
        let mut j = 0;
        while j < 8 {
            let byte: u64 = if signs >> j & 1 != 0 { 0xff } else { 0x01 };
            table[i] |= byte << (8 * j);
            j += 1;
        }
        i += 1;
    }
    table
};

/// Safe one-token and four-token entry points of an `N`-row kernel `$imp`: fn pointers
/// to them leave this module only through [`kernel`] / [`kernel4`], which first check
/// the CPU features it is compiled for.
macro_rules! n_row_entries {
    ($imp:ident => $dot:ident, $dot4:ident) => {
        fn $dot(w: &[u8], x: &[u8]) -> f32 {
            // SAFETY: reachable only through `kernel`, which verified AVX2, FMA and F16C.
            let [y] = unsafe { $imp(w, [x]) };
            y
        }

        fn $dot4(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
            // SAFETY: reachable only through `kernel4`, which verified AVX2, FMA and F16C.
            unsafe { $imp(w, x) }
        }
    };
}

/// A grid format's kernel for `N` activation rows that decodes each weight block once
/// and straight into registers (ggml's way), not through a `GridBlock`: per group of 32,
/// `$group` (with the block `$b` and the group index `$g` in scope) gives the magnitudes,
/// the ±1 sign bytes and the multiplier (i16, both halves); the lanes are
/// `GridBlock::lanes`'s integers on the decoded block, and the float part is
/// `grids::grid_dot`'s, so the bits are the format's scalar `dot`'s, in about half the
/// instructions.
macro_rules! direct_grid_kernel {
    (
        $imp:ident,
        $dot:ident,
        $dot4:ident,
        $format:ident,
        $group_fn:ident,
        |$b:ident, $g:ident| $group:block
    ) => {
        /// Group `g` (0..8) of super-block `b`: the 32 magnitudes, their ±1 sign bytes
        /// and the two 16-weight multipliers (i16, one per 128-bit half). Also what the
        /// prefill tile's unpacking stores (`tiled::unpack_grid`).
        #[inline(always)]
        pub(crate) fn $group_fn($b: &[u8], $g: usize) -> (__m256i, __m256i, __m256i) {
            // SAFETY (features): AVX intrinsics, only inlined into AVX2 functions.
            #[allow(unused_unsafe)]
            unsafe {
                $group
            }
        }

        /// # Safety
        /// The CPU has AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $imp<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
            use crate::formats::$format::{BYTES, POST_SCALE};
            use crate::formats::{q8_k::QS as Q8_K_QS, read_f16, Q8_K_BYTES};
            let n_blocks = common_blocks(w, &xs, BYTES, Q8_K_BYTES);
            // The lanes' float chains in registers: `fma_block`'s per-lane FMAs, and
            // `hsum_ps` is `Lanes8::sum`'s order.
            let mut acc = [_mm256_setzero_ps(); N];
            for i in 0..n_blocks {
                // One length check for the block and one per activation block.
                let $b = &w[i * BYTES..(i + 1) * BYTES];
                let xb = block_of_each(&xs, i, Q8_K_BYTES);
                // Even and odd groups in two integer chains, added at the end (integer
                // sums: the order does not change a bit), so two groups' table lookups
                // overlap.
                let mut lanes = [_mm256_setzero_si256(); N];
                let mut odd_lanes = [_mm256_setzero_si256(); N];
                for pair in 0..4 {
                    let even = $group_fn($b, 2 * pair);
                    let odd = $group_fn($b, 2 * pair + 1);
                    for t in 0..N {
                        let x = |g: usize| {
                            // SAFETY: 32 bytes at Q8_K_QS + 32g + 32 ≤ 260, inside the
                            // 292-byte block.
                            unsafe {
                                _mm256_loadu_si256(xb[t].as_ptr().add(Q8_K_QS + 32 * g) as *const __m256i)
                            }
                        };
                        let term = |(q, s, m): (__m256i, __m256i, __m256i), x: __m256i| {
                            _mm256_madd_epi16(_mm256_maddubs_epi16(q, _mm256_sign_epi8(x, s)), m)
                        };
                        lanes[t] = _mm256_add_epi32(lanes[t], term(even, x(2 * pair)));
                        odd_lanes[t] = _mm256_add_epi32(odd_lanes[t], term(odd, x(2 * pair + 1)));
                    }
                }
                for t in 0..N {
                    lanes[t] = _mm256_add_epi32(lanes[t], odd_lanes[t]);
                }
                let d_w = read_f16($b, 0);
                for t in 0..N {
                    let d = _mm256_set1_ps(d_w * read_f32(xb[t], 0));
                    acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes[t]), acc[t]);
                }
            }
            let mut out = [0f32; N];
            for t in 0..N {
                out[t] = POST_SCALE * hsum_ps(acc[t]);
            }
            out
        }

        n_row_entries!($imp => $dot, $dot4);
    };
}

/// The ±1 sign bytes of octets `0..4` of a 32-bit word of four 7-bit IQ2/IQ3 sign
/// indices.
#[inline(always)]
fn sign_words(aux: u32) -> __m256i {
    let signs = |l: u32| IQ2_SIGN_BYTES[(aux >> (7 * l)) as usize & 127] as i64;
    // SAFETY (features): `_mm256_set_epi64x` is AVX; only inlined into the AVX2 kernels.
    unsafe { _mm256_set_epi64x(signs(3), signs(2), signs(1), signs(0)) }
}

// IQ2_XXS: a group of 32 is four grid indices (a byte each) and a word of four sign
// indices and the 4-bit scale.
direct_grid_kernel!(
    iq2_xxs_impl,
    dot_iq2_xxs_q8_k,
    dot4_iq2_xxs_q8_k,
    iq2_xxs,
    iq2_xxs_group,
    |b, g| {
        use crate::formats::{grids::IQ2XXS_GRID, iq2_xxs::QS};
        let grid = read_u32(b, QS + 8 * g);
        let aux = read_u32(b, QS + 8 * g + 4);
        let magnitudes =
            |l: u32| u64::from_le_bytes(IQ2XXS_GRID[(grid >> (8 * l)) as usize & 255]) as i64;
        (
            _mm256_set_epi64x(magnitudes(3), magnitudes(2), magnitudes(1), magnitudes(0)),
            sign_words(aux),
            _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16),
        )
    }
);

// IQ3_XXS: a group of 32 is eight grid indices (a byte per four weights) and a word of
// four sign indices and the 4-bit scale at the end of the block.
direct_grid_kernel!(
    iq3_xxs_impl,
    dot_iq3_xxs_q8_k,
    dot4_iq3_xxs_q8_k,
    iq3_xxs,
    iq3_xxs_group,
    |b, g| {
        use crate::formats::{
            grids::IQ3XXS_GRID,
            iq3_xxs::{QS, SCALES_SIGNS},
        };
        let index = &b[QS + 8 * g..QS + 8 * g + 8];
        let aux = read_u32(b, SCALES_SIGNS + 4 * g);
        let magnitudes = |j: usize| u32::from_le_bytes(IQ3XXS_GRID[index[j] as usize]) as i32;
        (
            _mm256_setr_epi32(
                magnitudes(0),
                magnitudes(1),
                magnitudes(2),
                magnitudes(3),
                magnitudes(4),
                magnitudes(5),
                magnitudes(6),
                magnitudes(7),
            ),
            sign_words(aux),
            _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16),
        )
    }
);

/// The ±1 bytes of 32 sign bits (bit `e` set: weight `e` negative), as `sign_epi8`
/// takes them.
#[inline(always)]
fn sign_bits_to_bytes(word: u32) -> __m256i {
    // SAFETY (features): AVX2 intrinsics, only inlined into the AVX2 kernels.
    unsafe {
        // Byte i takes byte i/8 of the word and tests bit i%8.
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let bits = _mm256_and_si256(
            _mm256_shuffle_epi8(_mm256_set1_epi32(word as i32), spread),
            bit,
        );
        _mm256_or_si256(_mm256_cmpeq_epi8(bits, bit), _mm256_set1_epi8(1))
    }
}

// IQ3_S: a group of 32 is eight 9-bit grid indices (a byte each and one bit of a high
// byte), four sign bytes, and a 4-bit scale.
direct_grid_kernel!(
    iq3_s_impl,
    dot_iq3_s_q8_k,
    dot4_iq3_s_q8_k,
    iq3_s,
    iq3_s_group,
    |b, g| {
        use crate::formats::{
            grids::IQ3S_GRID,
            iq3_s::{QH, QS, SCALES, SIGNS},
        };
        let index = &b[QS + 8 * g..QS + 8 * g + 8];
        let high = b[QH + g] as usize;
        let magnitudes = |j: usize| {
            u32::from_le_bytes(IQ3S_GRID[index[j] as usize | (high >> j & 1) << 8]) as i32
        };
        let scale = (b[SCALES + g / 2] >> (4 * (g % 2)) & 15) as i16;
        (
            _mm256_setr_epi32(
                magnitudes(0),
                magnitudes(1),
                magnitudes(2),
                magnitudes(3),
                magnitudes(4),
                magnitudes(5),
                magnitudes(6),
                magnitudes(7),
            ),
            sign_bits_to_bytes(read_u32(b, SIGNS + 4 * g)),
            _mm256_set1_epi16(2 * scale + 1),
        )
    }
);

/// The multipliers `2·ls + 1` of the two 16-weight halves of group `g`, from the 4-bit
/// scales of IQ2_XS / IQ2_S (low nibble first), one per 128-bit half.
#[inline(always)]
fn half_multipliers(scales: u8) -> __m256i {
    // SAFETY (features): AVX intrinsics, only inlined into the AVX2 kernels.
    unsafe {
        let m = |ls: u8| _mm_set1_epi16(2 * ls as i16 + 1);
        _mm256_setr_m128i(m(scales & 15), m(scales >> 4))
    }
}

// IQ2_XS: a group of 32 is four 16-bit words, each a 9-bit grid index and a 7-bit sign
// index; a scale per 16 weights.
direct_grid_kernel!(
    iq2_xs_impl,
    dot_iq2_xs_q8_k,
    dot4_iq2_xs_q8_k,
    iq2_xs,
    iq2_xs_group,
    |b, g| {
        use crate::formats::{
            grids::IQ2XS_GRID,
            iq2_xs::{QS, SCALES},
        };
        let word =
            |l: usize| u16::from_le_bytes([b[QS + 8 * g + 2 * l], b[QS + 8 * g + 2 * l + 1]]);
        let magnitudes = |l: usize| u64::from_le_bytes(IQ2XS_GRID[(word(l) & 511) as usize]) as i64;
        let signs = |l: usize| IQ2_SIGN_BYTES[(word(l) >> 9) as usize] as i64;
        (
            _mm256_set_epi64x(magnitudes(3), magnitudes(2), magnitudes(1), magnitudes(0)),
            _mm256_set_epi64x(signs(3), signs(2), signs(1), signs(0)),
            half_multipliers(b[SCALES + g]),
        )
    }
);

// IQ2_S: a group of 32 is four 10-bit grid indices (a byte each, two bits of a high
// byte), four sign bytes, and a scale per 16 weights.
direct_grid_kernel!(
    iq2_s_impl,
    dot_iq2_s_q8_k,
    dot4_iq2_s_q8_k,
    iq2_s,
    iq2_s_group,
    |b, g| {
        use crate::formats::{
            grids::IQ2S_GRID,
            iq2_s::{QH, QS, SCALES, SIGNS},
        };
        let high = b[QH + g] as usize;
        let magnitudes = |l: usize| {
            let index = b[QS + 4 * g + l] as usize | (high >> (2 * l) & 3) << 8;
            u64::from_le_bytes(IQ2S_GRID[index]) as i64
        };
        (
            _mm256_set_epi64x(magnitudes(3), magnitudes(2), magnitudes(1), magnitudes(0)),
            sign_bits_to_bytes(read_u32(b, SIGNS + 4 * g)),
            half_multipliers(b[SCALES + g]),
        )
    }
);

/// IQ1_M × Q8_K for `N` activation rows, each weight block decoded once and straight
/// into registers: per group of 32 the grid values (−1, 0, 1 bytes) and the offset signs
/// (±1 bytes per eight weights) sign the activations, `maddubs` by ones pairs them, and
/// `madd` by the two 16-weight multipliers gives the two sets of lanes of
/// `formats::iq1_m::dot` (the same integers as `GridBlock::lanes` on its decoded
/// blocks), fused and summed as there: the same bits.
///
/// The block's fields are unpacked for all eight groups at once (`Iq1mFields`): the 32
/// grid indices, the 32 offset-sign bytes and the 16 multipliers take a few vector
/// operations per block instead of shifts and masks per octet, so a group costs its
/// four table reads and the arithmetic on the activations.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1_m_impl<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    use crate::formats::iq1_m::{scale_words, super_scale, BYTES};
    use crate::formats::iq1_s::DELTA;
    use crate::formats::{q8_k::QS as Q8_K_QS, Q8_K_BYTES};
    let n_blocks = common_blocks(w, &xs, BYTES, Q8_K_BYTES);
    // In registers, as `direct_grid_kernel!`'s.
    let mut grid_acc = [_mm256_setzero_ps(); N];
    let mut offset_acc = [_mm256_setzero_ps(); N];
    let ones = _mm256_set1_epi8(1);
    let controls = Iq1mControls::new();
    for i in 0..n_blocks {
        // One length check for the block and one per activation block.
        let b = &w[i * BYTES..(i + 1) * BYTES];
        let xb = block_of_each(&xs, i, Q8_K_BYTES);
        let fields = Iq1mFields::of(b);
        let mut grid_lanes = [_mm256_setzero_si256(); N];
        let mut offset_lanes = [_mm256_setzero_si256(); N];
        // A loop the compiler cannot unroll: unrolled, it hoists the eight groups'
        // activation loads and table reads and spills them to the stack.
        for g in 0..std::hint::black_box(8usize).min(8) {
            let q = fields.grid_values(g);
            let s = _mm256_shuffle_epi8(fields.signs[g / 4], controls.signs[g % 4]);
            let m = _mm256_shuffle_epi8(fields.multipliers, controls.multipliers[g]);
            for t in 0..N {
                // SAFETY: 32 bytes at Q8_K_QS + 32g + 32 ≤ 260, inside the 292-byte block.
                let x = unsafe {
                    _mm256_loadu_si256(xb[t].as_ptr().add(Q8_K_QS + 32 * g) as *const __m256i)
                };
                let grid = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(x, q));
                let offsets = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(x, s));
                grid_lanes[t] = _mm256_add_epi32(grid_lanes[t], _mm256_madd_epi16(grid, m));
                offset_lanes[t] = _mm256_add_epi32(offset_lanes[t], _mm256_madd_epi16(offsets, m));
            }
        }
        let d_w = super_scale(&scale_words(b));
        for t in 0..N {
            let d = _mm256_set1_ps(read_f32(xb[t], 0) * d_w);
            grid_acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(grid_lanes[t]), grid_acc[t]);
            offset_acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(offset_lanes[t]), offset_acc[t]);
        }
    }
    let mut out = [0f32; N];
    for t in 0..N {
        out[t] = hsum_ps(grid_acc[t]) + DELTA * hsum_ps(offset_acc[t]);
    }
    out
}

/// `vpshufb` controls that spread [`Iq1mFields`] over a group of 32 weights.
pub(crate) struct Iq1mControls {
    /// For groups `g ≡ k (mod 4)`: each of the group's four sign bytes eight times (the
    /// octets `4k..4k+4` of a 16-byte half of the sign bytes, in both 128-bit halves).
    pub(crate) signs: [__m256i; 4],
    /// For group `g = 2k + h`: its first half's multiplier (word `4h + k` of the low
    /// 128 bits) eight times, then its second half's (the same word of the high bits).
    pub(crate) multipliers: [__m256i; 8],
}

impl Iq1mControls {
    #[inline(always)]
    pub(crate) fn new() -> Self {
        // SAFETY (features): AVX intrinsics, only inlined into AVX2 functions.
        unsafe {
            let spread = |k: i8| {
                let b = |j: i8| _mm_set1_epi8(4 * k + j);
                let half = |j: i8| _mm_unpacklo_epi64(b(j), b(j + 1));
                _mm256_setr_m128i(half(0), half(2))
            };
            let word = |g: i16| {
                let byte = 8 * (g % 2) + 2 * (g / 2);
                _mm256_set1_epi16(((byte + 1) << 8) | byte)
            };
            Self {
                signs: [spread(0), spread(1), spread(2), spread(3)],
                multipliers: std::array::from_fn(|g| word(g as i16)),
            }
        }
    }
}

/// One IQ1_M block's fields unpacked with vector operations (layout in
/// `formats::iq1_m`).
pub(crate) struct Iq1mFields {
    /// Octet `k`'s 11-bit grid index (the low byte, and the low three bits of its
    /// `qh` nibble above it).
    index: [u16; 32],
    /// Octet `k`'s offset sign as a byte, −1 (bit 3 of its nibble set) or +1: octets
    /// 0..16 in both 128-bit halves of the first, 16..32 of the second.
    pub(crate) signs: [__m256i; 2],
    /// The multipliers `2·ls + 1` as words: 64-bit lane `j` holds scale `j / 2` of the
    /// 32-weight blocks `2k + j % 2` in word `k` (lanes 0, 1 the first half of each block,
    /// lanes 2, 3 the second).
    pub(crate) multipliers: __m256i,
}

impl Iq1mFields {
    #[inline(always)]
    pub(crate) fn of(b: &[u8]) -> Self {
        use crate::formats::iq1_m::{BYTES, QH, QS, SCALES};
        assert!(b.len() >= BYTES);
        // SAFETY: every read is inside the block (asserted); only inlined into AVX2
        // functions.
        unsafe {
            let p = b.as_ptr();
            let low4 = _mm_set1_epi8(0x0F);
            let qh = _mm_loadu_si128(p.add(QH) as *const __m128i);
            let (lo, hi) = (
                _mm_and_si128(qh, low4),
                _mm_and_si128(_mm_srli_epi16::<4>(qh), low4),
            );
            // Octet k's nibble at byte k: low nibble of qh[k / 2] for even k.
            let nibbles = [_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)];
            let mut index = [0u16; 32];
            for (half, &nib) in nibbles.iter().enumerate() {
                let qs = _mm_loadu_si128(p.add(QS + 16 * half) as *const __m128i);
                let high = _mm_and_si128(nib, _mm_set1_epi8(7));
                let at = index.as_mut_ptr().add(16 * half) as *mut __m128i;
                _mm_storeu_si128(at, _mm_unpacklo_epi8(qs, high));
                _mm_storeu_si128(at.add(1), _mm_unpackhi_epi8(qs, high));
            }
            let sign = |nib: __m128i| {
                let eight = _mm_set1_epi8(8);
                let negative = _mm_cmpeq_epi8(_mm_and_si128(nib, eight), eight);
                let byte = _mm_or_si128(negative, _mm_set1_epi8(1));
                _mm256_setr_m128i(byte, byte)
            };
            let words = _mm256_set1_epi64x(std::ptr::read_unaligned(p.add(SCALES) as *const i64));
            let scales = _mm256_and_si256(
                _mm256_srlv_epi64(words, _mm256_setr_epi64x(0, 6, 3, 9)),
                _mm256_set1_epi16(7),
            );
            Self {
                index,
                signs: [sign(nibbles[0]), sign(nibbles[1])],
                multipliers: _mm256_add_epi16(
                    _mm256_add_epi16(scales, scales),
                    _mm256_set1_epi16(1),
                ),
            }
        }
    }

    /// Group `g`'s 32 grid values (−1, 0, 1 bytes).
    #[inline(always)]
    pub(crate) fn grid_values(&self, g: usize) -> __m256i {
        use crate::formats::grids::IQ1S_GRID;
        let v = |l: usize| {
            // An 11-bit index: always inside the 2048-entry table.
            u64::from_le_bytes(IQ1S_GRID[(self.index[4 * g + l] & 0x7FF) as usize]) as i64
        };
        // SAFETY (features): AVX intrinsics, only inlined into AVX2 functions.
        unsafe { _mm256_set_epi64x(v(3), v(2), v(1), v(0)) }
    }
}

n_row_entries!(iq1_m_impl => dot_iq1_m_q8_k, dot4_iq1_m_q8_k);

/// IQ1_S × Q8_K for `N` activation rows, each weight block decoded once and straight
/// into registers: per group of 32 the grid values (−1, 0, 1 bytes) sign the
/// activations, `maddubs` by ones pairs them and `madd` by the group's multiplier gives
/// the lanes of `formats::iq1_s::dot` (`GridBlock::lanes`' integers on its decoded
/// block); the offset term is its integer from the bsums, fused as there: the same bits.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1_s_impl<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    use crate::formats::iq1_s::{octet, qh, BYTES, DELTA};
    use crate::formats::{q8_k::BSUMS, q8_k::QS as Q8_K_QS, read_f16, read_i16, Q8_K_BYTES};
    let n_blocks = common_blocks(w, &xs, BYTES, Q8_K_BYTES);
    // In registers, as `direct_grid_kernel!`'s.
    let mut acc = [_mm256_setzero_ps(); N];
    let mut offsets = [0.0f32; N];
    let ones = _mm256_set1_epi8(1);
    for i in 0..n_blocks {
        // One length check for the block and one per activation block.
        let b = &w[i * BYTES..(i + 1) * BYTES];
        let xb = block_of_each(&xs, i, Q8_K_BYTES);
        let mut lanes = [_mm256_setzero_si256(); N];
        let mut signed_scales = [0i32; 8];
        for g in 0..8 {
            let h = qh(b, g);
            let mult = 2 * ((h >> 12) & 7) as i32 + 1;
            signed_scales[g] = if h & 0x8000 != 0 { -mult } else { mult };
            // Loops, not closures (see `iq1_m_impl`).
            let mut values = [0i64; 4];
            for l in 0..4 {
                values[l] = u64::from_le_bytes(*octet(b, 4 * g + l)) as i64;
            }
            let q = _mm256_set_epi64x(values[3], values[2], values[1], values[0]);
            let m = _mm256_set1_epi16(mult as i16);
            for t in 0..N {
                // SAFETY: 32 bytes at Q8_K_QS + 32g + 32 ≤ 260, inside the 292-byte block.
                let x = unsafe {
                    _mm256_loadu_si256(xb[t].as_ptr().add(Q8_K_QS + 32 * g) as *const __m256i)
                };
                let pairs = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(x, q));
                lanes[t] = _mm256_add_epi32(lanes[t], _mm256_madd_epi16(pairs, m));
            }
        }
        let d_w = read_f16(b, 0);
        for t in 0..N {
            let mut offset_sum = 0i32;
            for g in 0..8 {
                let pair = read_i16(xb[t], BSUMS + 4 * g) as i32
                    + read_i16(xb[t], BSUMS + 4 * g + 2) as i32;
                offset_sum += pair * signed_scales[g];
            }
            let d = read_f32(xb[t], 0) * d_w;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes[t]), acc[t]);
            offsets[t] = d.mul_add(offset_sum as f32, offsets[t]);
        }
    }
    let mut out = [0f32; N];
    for t in 0..N {
        out[t] = hsum_ps(acc[t]) + DELTA * offsets[t];
    }
    out
}

n_row_entries!(iq1_s_impl => dot_iq1_s_q8_k, dot4_iq1_s_q8_k);

/// Safe entry points: fn pointers to them leave this module only through [`kernel`],
/// which first checks the CPU features the implementations are compiled for.
macro_rules! checked_entry {
    ($($name:ident => $imp:path),* $(,)?) => {$(
        fn $name(w: &[u8], x: &[u8]) -> f32 {
            // SAFETY: reachable only through `kernel`, which verified AVX2, FMA and F16C
            // on this CPU; the implementation reads only inside whole blocks of `w`, `x`.
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
    dot_iq4_nl_q8_0 => table_impl::<IQ4_NL>,
    dot_mxfp4_q8_0 => table_impl::<MXFP4>,
    dot_tq2_0_q8_k => tq2_0_impl,
    dot_tq1_0_q8_k => tq1_0_impl,
    dot_iq4_xs_q8_k => iq4_xs_impl,
    dot_q2_k_q8_k => q2_k_impl,
    dot_q3_k_q8_k => q3_k_impl,
    dot_f32_f32 => f32_impl,
    dot_f16_f16 => f16_impl,
}

/// The f16 at `bytes[offset..offset + 2]` as f32, in all eight lanes (F16C).
///
/// Broadcasting before converting writes whole registers: a scalar `cvtph` lets the
/// compiler merge into a stale register (the accumulator), which chained every block's
/// scale to the previous block's FMA and ran several times slower.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16_splat(bytes: &[u8], offset: usize) -> __m256 {
    let bits = u16::from_le_bytes([bytes[offset], bytes[offset + 1]]);
    _mm256_cvtph_ps(_mm_set1_epi16(bits as i16))
}

/// The f16 at `bytes[offset..offset + 2]` as an f32 scalar, converted by F16C (the same
/// value as [`crate::formats::read_f16`], without its software path).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16_scalar(bytes: &[u8], offset: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([bytes[offset], bytes[offset + 1]]))
}

/// The f16 `bits` as f32, converted by F16C from a register that `vmovd` fills whole.
///
/// Written as intrinsics, the compiler sees that only element 0 of the converted vector
/// is used and inserts the 16 bits into whatever register is at hand (`vpinsrw`), which
/// makes the conversion wait for that register's last writer: inside a kernel loop that
/// is often an accumulator, which turned a throughput-bound loop into one bound by the
/// FMA chain's latency (the four-row Q8_0 kernel: 23 → 28 GiB/s in cache).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16_bits_to_f32(bits: u16) -> f32 {
    let v: __m128i;
    // SAFETY: `vmovd` (SSE2, baseline on x86_64) only copies a general register into a
    // vector register, zeroing the rest; it touches no memory and no flags.
    unsafe {
        std::arch::asm!(
            "vmovd {v}, {b:e}",
            v = out(xmm_reg) v,
            b = in(reg) u32::from(bits),
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    _mm_cvtss_f32(_mm_cvtph_ps(v))
}

/// The little-endian f32 at `bytes[offset..offset + 4]`, in all eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f32_splat(bytes: &[u8], offset: usize) -> __m256 {
    _mm256_set1_ps(read_f32(bytes, offset))
}

/// How far ahead of the block being read the dot kernels prefetch a weight row.
/// Matrix rows are consecutive in the file, so this reaches into the rows that come
/// next: decoding (one token, every row read once) streams the weights ahead of use.
/// `cargo xtask bench`: Gemma 3 decode 36 → 53 t/s with it on this machine.
pub(crate) const WEIGHT_PREFETCH_BYTES: usize = 8192;

/// Prefetches the cache line [`WEIGHT_PREFETCH_BYTES`] past `row[offset]`. A prefetch
/// never faults, so the address may lie past the row (or the mapping); nothing is read.
#[inline(always)]
pub(crate) fn prefetch_ahead(row: &[u8], offset: usize) {
    let p = row.as_ptr().wrapping_add(offset + WEIGHT_PREFETCH_BYTES);
    // SAFETY: prefetch is a hint that reads nothing and cannot fault (SSE, baseline on
    // x86_64).
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) };
}

/// The decode kernels' weight prefetch, called once per weight block with the block's
/// offset in its row, its size, and the number of weight rows the kernel streams side by
/// side. The rule, measured against one L1 prefetch per block for every kernel
/// (`NX_PLAN=retune nx bench -p 0 -n 0 --show-plan -t 1` timings and `nx bench -p 0
/// -n 64`, AMD EPYC):
/// - One row of blocks of at most 64 bytes (Q8_0, Q5_0, Q4_0, …): one L1 prefetch per
///   block ([`prefetch_ahead`]) already asks for every line, and stays (the default
///   model's Q8_0 LM head: 23 GB/s either way; 20 with the rule below).
/// - Larger blocks (the K formats, IQ4_XS) or several rows: every cache line of the
///   block's bytes [`WEIGHT_PREFETCH_BYTES`] ahead, into L2. One prefetch per 144-byte
///   Q4_K or 210-byte Q6_K block left most lines to the hardware prefetcher, and four
///   rows' L1 prefetches crowd each other out: Q6_K matrices 19.6 → 25.6 GB/s (now with
///   the four-row kernel), the four-row Q8_0 kernel 9 → 25 GB/s; one-thread decode of
///   the Qwen2.5-1.5B shapes 18.2 → 21.2 t/s and of the Qwen3-MoE file 39.4 → 45.6 t/s.
/// - Several rows side by side whose group spans more than [`WEIGHT_PREFETCH_BYTES`]
///   (`row` must then be exactly one row): that distance past the group's end, i.e.
///   `(streams − 1)` rows further. Rows run in parallel, so a fixed distance from each
///   row's position lands inside the next row, which is being read already, and the
///   group after gets no lead at all (the FFN down projections: Q4_K rows of 5040 bytes,
///   Q6_K of 7350 in the Qwen2.5-1.5B shapes). `nx bench -p 0 -n 64`, alternating
///   pairs, AMD EPYC family 25 model 17: Qwen2.5-0.5B shapes 46–48 → 52–53 t/s on one
///   thread and 76–77 → 80–83 on two, the 1.5B shapes 22–23 → 23–24 and 40.4–40.6 →
///   41.8–42.5, Qwen3-MoE two threads 78–82 → 87–90; Gemma 3 270M (no group that long)
///   unchanged. Applied to every group instead, the shorter ones (Gemma's) lost 2 %: a
///   chunk's last rows prefetch further into rows another thread reads.
#[inline(always)]
pub(crate) fn prefetch_block(row: &[u8], offset: usize, bytes: usize, streams: usize) {
    if streams == 1 && bytes <= 64 {
        prefetch_ahead(row, offset);
        return;
    }
    // (`row.len()` is one row's bytes wherever `streams > 1`.)
    let group = streams * row.len();
    let ahead = if streams > 1 && group > WEIGHT_PREFETCH_BYTES {
        WEIGHT_PREFETCH_BYTES + group - row.len()
    } else {
        WEIGHT_PREFETCH_BYTES
    };
    let start = row.as_ptr().wrapping_add(offset + ahead);
    // A fixed count per block size (no branch to mispredict): lines that straddle two
    // blocks are asked for twice, which costs an instruction, not a read.
    for line in 0..bytes.div_ceil(64) {
        // SAFETY: prefetch is a hint that reads nothing and cannot fault (SSE, baseline
        // on x86_64); the address may lie past the row or the mapping.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(64 * line) as *const i8) };
    }
}

/// 32 bytes at `bytes[offset..offset + 32]`.
///
/// # Safety
/// `offset + 32 <= bytes.len()`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load32(bytes: &[u8], offset: usize) -> __m256i {
    debug_assert!(offset + 32 <= bytes.len());
    // SAFETY: in bounds by the caller's contract; unaligned load.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().add(offset) as *const __m256i) }
}

/// 16 bytes at `bytes[offset..offset + 16]`.
///
/// # Safety
/// `offset + 16 <= bytes.len()`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load16(bytes: &[u8], offset: usize) -> __m128i {
    debug_assert!(offset + 16 <= bytes.len());
    // SAFETY: in bounds by the caller's contract; unaligned load.
    unsafe { _mm_loadu_si128(bytes.as_ptr().add(offset) as *const __m128i) }
}

/// Sum of the eight lanes: (0+4, 1+5, 2+6, 3+7), then pairs, then the two halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// `madd` of 16 i16 lanes with 1: pairwise i32 sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pair_sums(v: __m256i) -> __m256i {
    _mm256_madd_epi16(v, _mm256_set1_epi16(1))
}

/// Runs a per-block expression over the whole blocks of `$w` and `$x` (`$wbytes` and
/// `$xbytes` bytes each). The block gives `(d, lanes)`, both `__m256`; each is fused
/// into one accumulator in block order (`acc = d·lanes + acc`), whose lanes are summed
/// at the end by [`hsum_ps`] — the float order of `dot_scalar`'s `Lanes8`.
macro_rules! lanes8_chain {
    ($w:expr, $x:expr, $wbytes:expr, $xbytes:expr, |$wb:ident, $xb:ident| $block:block) => {{
        let mut acc = _mm256_setzero_ps();
        for (b, ($wb, $xb)) in $w
            .chunks_exact($wbytes)
            .zip($x.chunks_exact($xbytes))
            .enumerate()
        {
            crate::avx2::prefetch_block($w, b * $wbytes, $wbytes, 1);
            let (d, lanes): (__m256, __m256) = $block;
            acc = _mm256_fmadd_ps(d, lanes, acc);
        }
        hsum_ps(acc)
    }};
}
pub(crate) use lanes8_chain;

/// The number of whole blocks the single-token kernels would visit for each of the `N`
/// pairs `(w, x[t])`; the multi-token kernels visit the smallest (all equal in a matmul).
#[inline]
pub(crate) fn common_blocks<const N: usize>(
    w: &[u8],
    x: &[&[u8]; N],
    w_bytes: usize,
    x_bytes: usize,
) -> usize {
    x.iter()
        .map(|xt| xt.len() / x_bytes)
        .fold(w.len() / w_bytes, usize::min)
}

/// Runs a per-block, per-token expression over the whole blocks of `$w` and four
/// activation rows `$x`. `$weight` decodes the weight block `$wb` once (into the named
/// values); `$token` then
/// gives `(d, lanes)` for token block `$xb`, fused into that token's own accumulator
/// exactly as [`lanes8_chain`] does for one token, so each output has the single-token
/// kernel's bits.
macro_rules! lanes8_chain4 {
    ($w:expr, $x:expr, $wbytes:expr, $xbytes:expr,
     |$wb:ident| ($($wv:ident),*) = $weight:block, |$xb:ident| $token:block) => {{
        let n_blocks = common_blocks($w, &$x, $wbytes, $xbytes);
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..n_blocks {
            prefetch_ahead($w, b * $wbytes);
            let $wb = &$w[b * $wbytes..(b + 1) * $wbytes];
            let ($($wv),*) = $weight;
            for t in 0..4 {
                let $xb = &$x[t][b * $xbytes..(b + 1) * $xbytes];
                let (d, lanes): (__m256, __m256) = $token;
                acc[t] = _mm256_fmadd_ps(d, lanes, acc[t]);
            }
        }
        [
            hsum_ps(acc[0]),
            hsum_ps(acc[1]),
            hsum_ps(acc[2]),
            hsum_ps(acc[3]),
        ]
    }};
}
pub(crate) use lanes8_chain4;

/// The four-token loop of a K format whose super-block is decoded once (`$decode(wb)`)
/// and then taken per token (`$token(&block, xb) -> (d, lanes)`), each token's lanes
/// fused into its own accumulator as [`lanes8_chain`] does for one.
macro_rules! decoded_chain4 {
    ($w:expr, $x:expr, $wbytes:expr, $decode:ident, $token:ident) => {{
        let n_blocks = common_blocks($w, &$x, $wbytes, Q8_K_BYTES);
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..n_blocks {
            // SAFETY: a whole super-block.
            let block = unsafe { $decode(&$w[b * $wbytes..(b + 1) * $wbytes]) };
            for (t, xb) in block_of_each(&$x, b, Q8_K_BYTES).into_iter().enumerate() {
                // SAFETY: a whole Q8_K block.
                let (d, lanes) = unsafe { $token(&block, xb) };
                acc[t] = _mm256_fmadd_ps(d, lanes, acc[t]);
            }
        }
        std::array::from_fn(|t| hsum_ps(acc[t]))
    }};
}

/// Q4_0 × Q8_0. Per block `Σ (q−8)·x = Σ q·x − 8·Σ x`, both in i16 pair sums
/// (|15·128·2| and |8·128·2| are far from saturation).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_impl(w: &[u8], x: &[u8]) -> f32 {
    let low4 = _mm_set1_epi8(0x0F);
    let eights = _mm256_set1_epi8(8);
    lanes8_chain!(w, x, Q4_0_BYTES, Q8_0_BYTES, |wb, xb| {
        // SAFETY: qs is bytes 2..18 of an 18-byte block; x quants are 2..34 of 34.
        let (qs, xq) = unsafe { (load16(wb, 2), load32(xb, 2)) };
        let lo = _mm_and_si128(qs, low4);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
        let q = _mm256_set_m128i(hi, lo);
        let p16 = _mm256_sub_epi16(
            _mm256_maddubs_epi16(q, xq),
            _mm256_maddubs_epi16(eights, xq),
        );
        let d = _mm256_mul_ps(f16_splat(wb, 0), f16_splat(xb, 0));
        (d, _mm256_cvtepi32_ps(pair_sums(p16)))
    })
}

/// 32 bytes, byte `p` = 0x10 when bit `p` of `qh` is set, else 0: the Q5_0 fifth bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn q5_0_high_bits(qh: u32) -> __m256i {
    // Byte p takes qh byte p/8 (within each 128-bit lane: lane 0 bytes 0, 1; lane 1
    // bytes 2, 3), then tests bit p mod 8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(qh as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0x0000_0000_0000_0000,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Q5_0 × Q8_0: q = nibble | fifth bit (0..31), `Σ q·x − 16·Σ x` in i16 pair sums.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_impl(w: &[u8], x: &[u8]) -> f32 {
    let low4 = _mm_set1_epi8(0x0F);
    let sixteens = _mm256_set1_epi8(16);
    lanes8_chain!(w, x, Q5_0_BYTES, Q8_0_BYTES, |wb, xb| {
        // SAFETY: qs is bytes 6..22 of a 22-byte block; x quants are 2..34 of 34.
        let (qs, xq) = unsafe { (load16(wb, q5_0::QS), load32(xb, 2)) };
        let lo = _mm_and_si128(qs, low4);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
        let q = _mm256_or_si256(
            _mm256_set_m128i(hi, lo),
            q5_0_high_bits(read_u32(wb, q5_0::QH)),
        );
        let p16 = _mm256_sub_epi16(
            _mm256_maddubs_epi16(q, xq),
            _mm256_maddubs_epi16(sixteens, xq),
        );
        let d = _mm256_mul_ps(f16_splat(wb, 0), f16_splat(xb, 0));
        (d, _mm256_cvtepi32_ps(pair_sums(p16)))
    })
}

/// F32 × F32 (a MoE router): [`crate::dot_scalar::dot_f32`]'s 64 running fused
/// multiply-adds as eight 8-lane registers (lane `l` in register `l / 8`), stored and
/// reduced by the same code, then the tail element by element. Same bits.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_impl(w: &[u8], x: &[u8]) -> f32 {
    let n = (w.len() / 4).min(x.len() / 4);
    // SAFETY: the CPU has the features (caller's contract).
    let (mut sum, whole) = unsafe { lanes64_sum::<F32s>(w, x, n) };
    for i in whole..n {
        sum += read_f32(w, 4 * i) * read_f32(x, 4 * i);
    }
    sum
}

/// F16 × F16: [`crate::dot_scalar::dot_f16`]'s 64 running fused multiply-adds as eight
/// 8-lane registers of values widened by F16C (lane `l` in register `l / 8`), reduced by
/// the same code, then the tail element by element in f64. Same bits.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_impl(w: &[u8], x: &[u8]) -> f32 {
    let n = (w.len() / 2).min(x.len() / 2);
    // SAFETY: the CPU has the features (caller's contract). The reduction of all-zero
    // lanes is +0, as the scalar twin's.
    let (sum, whole) = unsafe { lanes64_sum::<F16s>(w, x, n) };
    let mut sum = f64::from(sum);
    for i in whole..n {
        sum += f64::from(f16_scalar(w, 2 * i) * f16_scalar(x, 2 * i));
    }
    sum as f32
}

/// How the float dots read eight values into a register.
trait FloatLoad {
    /// Bytes per value.
    const BYTES: usize;
    /// Eight values from `p`, widened to f32.
    ///
    /// # Safety
    /// `p` is valid for reading `8 · BYTES` bytes; the CPU has AVX2 and F16C.
    unsafe fn load8(p: *const u8) -> __m256;
}

/// F32 values.
struct F32s;

impl FloatLoad for F32s {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 32 readable bytes (caller's contract); unaligned load.
        unsafe { _mm256_loadu_ps(p.cast()) }
    }
}

/// F16 values, widened by F16C.
struct F16s;

impl FloatLoad for F16s {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        // SAFETY: 16 readable bytes (caller's contract); unaligned load.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
}

/// The float dots' 64 running fused multiply-adds over the whole 64-value chunks of the
/// first `n` values of `w` and `x` (lane `l` in register `l / 8`), reduced; returns the
/// sum and how many values it covers (the tail is the caller's).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` and `x` hold at least `n` values of `L`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn lanes64_sum<L: FloatLoad>(w: &[u8], x: &[u8], n: usize) -> (f32, usize) {
    const LANES: usize = 64;
    let whole = n / LANES * LANES;
    let chunk = LANES * L::BYTES;
    let mut acc = [_mm256_setzero_ps(); LANES / 8];
    for (cw, cx) in w[..whole * L::BYTES]
        .chunks_exact(chunk)
        .zip(x[..whole * L::BYTES].chunks_exact(chunk))
    {
        for (k, acc) in acc.iter_mut().enumerate() {
            // SAFETY: both chunks hold 64 values; register k reads values 8k..8k+8.
            let (a, b) = unsafe {
                (
                    L::load8(cw.as_ptr().add(8 * k * L::BYTES)),
                    L::load8(cx.as_ptr().add(8 * k * L::BYTES)),
                )
            };
            *acc = _mm256_fmadd_ps(a, b, *acc);
        }
    }
    let sum = if whole > 0 { reduce_lanes_64(acc) } else { 0.0 };
    (sum, whole)
}

/// Eight 8-lane registers of running sums (lane `l` in register `l / 8`) reduced as
/// [`nx_f32::scalar::reduce_lanes_64`] reduces the 64 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce_lanes_64(acc: [__m256; 8]) -> f32 {
    let mut lanes = [0f32; 64];
    for (k, acc) in acc.iter().enumerate() {
        // SAFETY: `lanes` holds 64 f32; register k fills lanes 8k..8k+8.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * k), *acc) };
    }
    nx_f32::scalar::reduce_lanes_64(&lanes)
}

/// Q8_0 × Q8_0: both sides split into their even and odd bytes, sign-extended in place
/// to i16 by shifts, and multiplied with `madd` (pairs of products fit i32 for every byte
/// value, −128·−128 included). Even and odd pair sums of dword `l` add up to bytes
/// `4l..4l+4`, the scalar twin's lane, in lane order: no shuffle, so on CPUs with one
/// shuffle port (Intel) the block costs shifts and multiplies on the two vector ALUs
/// instead of seven shuffles on one.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_impl(w: &[u8], x: &[u8]) -> f32 {
    lanes8_chain!(w, x, Q8_0_BYTES, Q8_0_BYTES, |wb, xb| {
        // SAFETY: quants are bytes 2..34 of 34-byte blocks.
        let (wq, xq) = unsafe { (load32(wb, 2), load32(xb, 2)) };
        let d = _mm256_mul_ps(f16_splat(wb, 0), f16_splat(xb, 0));
        (d, _mm256_cvtepi32_ps(quad_sums_i8(wq, xq)))
    })
}

/// Dword `l` = `Σ_{k<4} a[4l+k]·b[4l+k]` over signed bytes, exactly for every value:
/// the even bytes of each word sign-extended by `<< 8 >> 8`, the odd ones by `>> 8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn quad_sums_i8(a: __m256i, b: __m256i) -> __m256i {
    let even = |v: __m256i| _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(v));
    let odd = |v: __m256i| _mm256_srai_epi16::<8>(v);
    _mm256_add_epi32(
        _mm256_madd_epi16(even(a), even(b)),
        _mm256_madd_epi16(odd(a), odd(b)),
    )
}

/// `set1_epi16` of word `j` of a 128-bit lane (both lanes hold the same 8 words).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn word_broadcast(words: __m256i, j: i16) -> __m256i {
    _mm256_shuffle_epi8(words, _mm256_set1_epi16(((2 * j + 1) << 8) | (2 * j)))
}

/// The Q4_K/Q5_K min term's integer part as four i32 lanes, lane `m` =
/// `m_{2m}·(b_{4m} + b_{4m+1}) + m_{2m+1}·(b_{4m+2} + b_{4m+3})` over the bsums `b` (the
/// scalar twin's lanes). Each min is duplicated so one `madd` pairs it with both bsums
/// of its sub-block, exactly in i32 for any bsum values; `hadd` joins neighbours.
///
/// # Safety
/// `xb` is a whole Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn k4_min_lanes(xb: &[u8], mins: u64) -> __m128i {
    let m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins as i64));
    let dup = _mm256_set_m128i(_mm_unpackhi_epi16(m16, m16), _mm_unpacklo_epi16(m16, m16));
    // SAFETY: bsums are bytes 260..292 of a 292-byte block.
    let bsums = unsafe { load32(xb, q8_k::BSUMS) };
    let per_sub_block = _mm256_madd_epi16(bsums, dup);
    _mm_hadd_epi32(
        _mm256_castsi256_si128(per_sub_block),
        _mm256_extracti128_si256::<1>(per_sub_block),
    )
}

/// The pair sums `bsum[2s] + bsum[2s+1]` of a Q8_K block's sixteen 16-quant sums, as
/// eight words: sub-block `s`'s activation sum, which its 6-bit min multiplies (see
/// [`k4_scales_mins`]).
///
/// (`inline(always)`, not a `target_feature` function: see `avx2_rows4::scale_products4`.)
///
/// # Safety
/// The CPU has AVX2; `xb` is a whole Q8_K block.
#[inline(always)]
pub(crate) unsafe fn k4_sub_block_sums(xb: &[u8]) -> __m128i {
    // SAFETY: bsums are bytes 260..292 of a 292-byte block; AVX2 per the contract.
    unsafe {
        let bsums = load32(xb, q8_k::BSUMS);
        // |bsum| ≤ 16·128, so a pair sum fits a word and the pack never saturates.
        let pairs = _mm256_madd_epi16(bsums, _mm256_set1_epi16(1));
        _mm_packs_epi32(
            _mm256_castsi256_si128(pairs),
            _mm256_extracti128_si256::<1>(pairs),
        )
    }
}

/// The eight 6-bit scales and the eight 6-bit mins of a Q4_K / Q5_K super-block, as
/// words, unpacked in vector registers: two byte shuffles put each byte of the 12-byte
/// field beside the one that lends it its high bits. `_mm_madd_epi16(mins,
/// k4_sub_block_sums(xb))` is then [`k4_min_lanes`]'s four lanes (the same integers).
/// In general registers this unpacking was a third of the AVX-512 Q4_K kernel's time.
///
/// # Safety
/// The CPU has AVX2; `wb` is a whole super-block (asserted).
#[inline(always)]
pub(crate) unsafe fn k4_scales_mins(wb: &[u8]) -> (__m128i, __m128i) {
    assert!(wb.len() >= q4_k::SCALES + 16);
    // SAFETY: 16 bytes from the scale field on, inside the block (asserted); AVX2 per
    // the contract.
    unsafe {
        let v = _mm_loadu_si128(wb.as_ptr().add(q4_k::SCALES) as *const __m128i);
        // Bytes a = v[0..4], b = v[4..8], c = v[8..12]. Low parts [a, c, b, c >> 4]:
        // scales 0..4 are a & 63, 4..8 c & 15; mins 0..4 are b & 63, 4..8 c >> 4.
        let abc = _mm_shuffle_epi8(
            v,
            _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11),
        );
        let low = _mm_and_si128(
            _mm_blend_epi16::<0b1100_0000>(abc, _mm_srli_epi16::<4>(abc)),
            _mm_setr_epi8(
                63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15,
            ),
        );
        // High bits of scales and mins 4..8: the top two bits of a and of b, at bits 4, 5.
        let ab = _mm_shuffle_epi8(
            v,
            _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7),
        );
        let high = _mm_srli_epi16::<2>(_mm_and_si128(ab, _mm_set1_epi8(0xC0u8 as i8)));
        let scales_mins = _mm_or_si128(low, high);
        (
            _mm_cvtepu8_epi16(scales_mins),
            _mm_cvtepu8_epi16(_mm_srli_si128::<8>(scales_mins)),
        )
    }
}

/// The sum of four i32 lanes (exact for the min terms: |Σ| < 2^31).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_epi32(v: __m128i) -> i32 {
    let s = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s)))
}

/// `(v0 + v2) + (v1 + v3)`: the scalar twins' sum of the four min lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum4_ps(v: __m128) -> f32 {
    let s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
}

/// Q4_K × Q8_K.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_impl(w: &[u8], x: &[u8]) -> f32 {
    let low4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut acc_min = _mm_setzero_ps();
    for (b, (wb, xb)) in w
        .chunks_exact(Q4_K_BYTES)
        .zip(x.chunks_exact(Q8_K_BYTES))
        .enumerate()
    {
        prefetch_block(w, b * Q4_K_BYTES, Q4_K_BYTES, 1);
        let dx = f32_splat(xb, 0);
        let d = _mm256_mul_ps(f16_splat(wb, 0), dx);
        // −d_x·dmin_w, as the scalar twin forms it.
        let neg_dmin = _mm_mul_ps(
            _mm_set1_ps(-read_f32(xb, 0)),
            _mm256_castps256_ps128(f16_splat(wb, q4_k::DMIN)),
        );
        // SAFETY: whole blocks; AVX2 per the contract.
        let (sc16, min_lanes) = unsafe {
            let (sc16, mins) = k4_scales_mins(wb);
            (sc16, _mm_madd_epi16(mins, k4_sub_block_sums(xb)))
        };
        acc_min = _mm_fmadd_ps(neg_dmin, _mm_cvtepi32_ps(min_lanes), acc_min);
        let scales = _mm256_set_m128i(sc16, sc16);
        let mut sumi = _mm256_setzero_si256();
        for chunk in 0..4 {
            // SAFETY: qs chunk is bytes 16+32c..48+32c of 144; x quants 4+64c..68+64c of 292.
            let (qs, x0, x1) = unsafe {
                (
                    load32(wb, q4_k::QS + 32 * chunk),
                    load32(xb, q8_k::QS + 64 * chunk),
                    load32(xb, q8_k::QS + 64 * chunk + 32),
                )
            };
            let lo = _mm256_and_si256(qs, low4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qs), low4);
            let j = 2 * chunk as i16;
            let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), word_broadcast(scales, j));
            let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), word_broadcast(scales, j + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) + hsum4_ps(acc_min)
}

/// Q5_K × Q8_K: Q4_K plus a fifth bit per weight from `qh`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_impl(w: &[u8], x: &[u8]) -> f32 {
    let low4 = _mm256_set1_epi8(0x0F);
    let bit4 = _mm256_set1_epi8(0x10);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for (b, (wb, xb)) in w
        .chunks_exact(Q5_K_BYTES)
        .zip(x.chunks_exact(Q8_K_BYTES))
        .enumerate()
    {
        prefetch_block(w, b * Q5_K_BYTES, Q5_K_BYTES, 1);
        let dx = f32_splat(xb, 0);
        let d = _mm256_mul_ps(f16_splat(wb, 0), dx);
        // −d_x·dmin_w, as the scalar twin forms it.
        let neg_dmin = _mm_mul_ps(
            _mm_set1_ps(-read_f32(xb, 0)),
            _mm256_castps256_ps128(f16_splat(wb, q4_k::DMIN)),
        );
        let (sc, mn) = scales_mins_k4_packed(&wb[q4_k::SCALES..q4_k::SCALES + 12]);
        // SAFETY: xb is a whole Q8_K block.
        let min_lanes = unsafe { k4_min_lanes(xb, mn) };
        // One running f32 for the min terms, as the scalar twin (and ggml's AVX2 kernel).
        let sumi_min = hsum_epi32(min_lanes);
        summs = _mm_cvtss_f32(neg_dmin).mul_add(sumi_min as f32, summs);
        let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
        let scales = _mm256_set_m128i(sc16, sc16);
        // SAFETY: qh is bytes 16..48 of 176.
        let mut qh = unsafe { load32(wb, q4_k::Q5_QH) };
        let mut sumi = _mm256_setzero_si256();
        for chunk in 0..4 {
            // SAFETY: qs chunk is bytes 48+32c..80+32c of 176; x quants as in Q4_K.
            let (qs, x0, x1) = unsafe {
                (
                    load32(wb, q4_k::Q5_QS + 32 * chunk),
                    load32(xb, q8_k::QS + 64 * chunk),
                    load32(xb, q8_k::QS + 64 * chunk + 32),
                )
            };
            // Bits 0 and 1 of each (shifted) qh byte are this chunk's two fifth bits;
            // the 16-bit shifts only move bits across bytes outside the 0x10 mask.
            let h_lo = _mm256_and_si256(_mm256_slli_epi16::<4>(qh), bit4);
            let h_hi = _mm256_and_si256(_mm256_slli_epi16::<3>(qh), bit4);
            qh = _mm256_srli_epi16::<2>(qh);
            let lo = _mm256_or_si256(_mm256_and_si256(qs, low4), h_lo);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(qs), low4), h_hi);
            let j = 2 * chunk as i16;
            let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), word_broadcast(scales, j));
            let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), word_broadcast(scales, j + 1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) + summs
}

/// Q6_K × Q8_K: unsigned quants 0..63 into `maddubs`, scaled per 16 weights, minus
/// `32·Σ_j sc_j·bsum_j` once per super-block.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_impl(w: &[u8], x: &[u8]) -> f32 {
    lanes8_chain!(w, x, Q6_K_BYTES, Q8_K_BYTES, |wb, xb| {
        let d = _mm256_mul_ps(f16_splat(wb, q6_k::D), f32_splat(xb, 0));
        // SAFETY: scales are bytes 192..208 of 210; bsums 260..292 of 292.
        let (sc8, bsums) = unsafe { (load16(wb, q6_k::SCALES), load32(xb, q8_k::BSUMS)) };
        let sc16 = _mm256_cvtepi8_epi16(sc8);
        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16));
        let mut sumi = _mm256_setzero_si256();
        for half in 0..2 {
            let scales = q6_k_half_scales(sc16, half);
            // SAFETY: a whole super-block.
            let q = unsafe { q6_k_half_levels(wb, half) };
            for (k, &qk) in q.iter().enumerate() {
                // SAFETY: x quants 4+128h+32k..36+128h+32k of 292.
                let xk = unsafe { load32(xb, q8_k::QS + 128 * half + 32 * k) };
                // Lane 0 (weights 0..16 of the 32) uses scale 2k of this half, lane 1
                // scale 2k+1.
                let k = k as i16;
                let ctrl = _mm256_set_m128i(
                    _mm_set1_epi16(((4 * k + 3) << 8) | (4 * k + 2)),
                    _mm_set1_epi16(((4 * k + 1) << 8) | (4 * k)),
                );
                let scale = _mm256_shuffle_epi8(scales, ctrl);
                sumi =
                    _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(qk, xk), scale));
            }
        }
        let sumi = _mm256_sub_epi32(sumi, offset);
        (d, _mm256_cvtepi32_ps(sumi))
    })
}

/// The eight scales (words) of half `half` of a Q6_K super-block's sixteen `sc16`, in
/// both 128-bit lanes.
///
/// # Safety
/// The CPU has AVX2 (only inlined into functions enabling it).
#[inline(always)]
pub(crate) unsafe fn q6_k_half_scales(sc16: __m256i, half: usize) -> __m256i {
    // SAFETY: AVX2 per the contract.
    unsafe {
        let sc_half = match half {
            0 => _mm256_castsi256_si128(sc16),
            _ => _mm256_extracti128_si256::<1>(sc16),
        };
        _mm256_set_m128i(sc_half, sc_half)
    }
}

/// The 128 levels (0..64) of half `half` of a Q6_K super-block `wb`, as four registers
/// of 32 (quants `32k..32k+32` of the half in register `k`): the low four bits from `ql`,
/// bits `2k, 2k+1` of each `qh` byte on top.
///
/// # Safety
/// The CPU has AVX2 (only inlined into functions enabling it); `wb` is a whole block and
/// `half` 0 or 1.
#[inline(always)]
pub(crate) unsafe fn q6_k_half_levels(wb: &[u8], half: usize) -> [__m256i; 4] {
    assert!(wb.len() >= Q6_K_BYTES && half < 2);
    // SAFETY: ql half is bytes 64h..64h+64, qh half 128+32h..160+32h, of 210; AVX2 per the
    // contract.
    unsafe {
        let low4 = _mm256_set1_epi8(0x0F);
        let bits45 = _mm256_set1_epi8(0x30);
        let ql0 = load32(wb, q6_k::QL + 64 * half);
        let ql1 = load32(wb, q6_k::QL + 64 * half + 32);
        let qh = load32(wb, q6_k::QH + 32 * half);
        [
            _mm256_or_si256(
                _mm256_and_si256(ql0, low4),
                _mm256_and_si256(_mm256_slli_epi16::<4>(qh), bits45),
            ),
            _mm256_or_si256(
                _mm256_and_si256(ql1, low4),
                _mm256_and_si256(_mm256_slli_epi16::<2>(qh), bits45),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low4),
                _mm256_and_si256(qh, bits45),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(qh), bits45),
            ),
        ]
    }
}

// ---------------------------------------------------------------------------------------
// The formats of `crate::formats::BLOCK_FORMATS`: twins of the scalar kernels in their
// modules (same lane integers, same float order, so the same bits). Each is split into a
// weight-block decoder and a per-token step shared by the one-token kernel and its
// four-token variant, so the two compute the same arithmetic.

/// The 32 nibble levels of a Q4_1 block (weights 0..16 low, 16..32 high).
///
/// # Safety
/// `wb` is a whole Q4_1 block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_1_levels(wb: &[u8]) -> __m256i {
    let low4 = _mm_set1_epi8(0x0F);
    // SAFETY: qs is bytes 4..20 of a 20-byte block.
    let qs = unsafe { load16(wb, q4_1::QS) };
    let lo = _mm_and_si128(qs, low4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
    _mm256_set_m128i(hi, lo)
}

/// The 32 five-bit levels of a Q5_1 block.
///
/// # Safety
/// `wb` is a whole Q5_1 block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_1_levels(wb: &[u8]) -> __m256i {
    let low4 = _mm_set1_epi8(0x0F);
    // SAFETY: qs is bytes 8..24 of a 24-byte block.
    let qs = unsafe { load16(wb, q5_1::QS) };
    let lo = _mm_and_si128(qs, low4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
    _mm256_or_si256(
        _mm256_set_m128i(hi, lo),
        q5_0_high_bits(read_u32(wb, q5_1::QH)),
    )
}

/// One Q4_1/Q5_1 block against one Q8_1 block: `acc = fma(d_w·d_x, lanes, acc)` and
/// `summs = fma(m_w, s_x, summs)` (levels unsigned ≤ 31: `maddubs` never saturates).
///
/// # Safety
/// `xb` is a whole Q8_1 block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
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
    let lanes = _mm256_cvtepi32_ps(pair_sums(_mm256_maddubs_epi16(q, xq)));
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(d_w, f16_splat(xb, 0)), lanes, *acc);
}

/// Q4_1 / Q5_1 × Q8_1, one token: levels from `levels`, one `fma(d_w·d_x, lanes)` per
/// block; the offset terms `m_w·s_x` fused into a scalar f32 chain in block order, added
/// after the lane sum.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offset32_dot(
    w: &[u8],
    x: &[u8],
    w_bytes: usize,
    levels: unsafe fn(&[u8]) -> __m256i,
) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for (b, (wb, xb)) in w
        .chunks_exact(w_bytes)
        .zip(x.chunks_exact(q8_1::BYTES))
        .enumerate()
    {
        prefetch_block(w, b * w_bytes, w_bytes, 1);
        // SAFETY: whole blocks of both rows (chunks_exact).
        unsafe {
            let q = levels(wb);
            q8_1_step(
                q,
                f16_splat(wb, 0),
                f16_scalar(wb, q4_1::M),
                xb,
                &mut acc,
                &mut summs,
            );
        }
    }
    hsum_ps(acc) + summs
}

/// [`offset32_dot`] for four tokens, each weight block decoded once.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offset32_dot4(
    w: &[u8],
    x: [&[u8]; 4],
    w_bytes: usize,
    levels: unsafe fn(&[u8]) -> __m256i,
) -> [f32; 4] {
    let n_blocks = common_blocks(w, &x, w_bytes, q8_1::BYTES);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut summs = [0.0f32; 4];
    for b in 0..n_blocks {
        let wb = &w[b * w_bytes..(b + 1) * w_bytes];
        let xb = block_of_each(&x, b, q8_1::BYTES);
        // SAFETY: whole blocks of every row.
        unsafe {
            let q = levels(wb);
            let (d_w, m_w) = (f16_splat(wb, 0), f16_scalar(wb, q4_1::M));
            for t in 0..4 {
                q8_1_step(q, d_w, m_w, xb[t], &mut acc[t], &mut summs[t]);
            }
        }
    }
    std::array::from_fn(|t| hsum_ps(acc[t]) + summs[t])
}

/// Q4_1 × Q8_1.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_impl(w: &[u8], x: &[u8]) -> f32 {
    // SAFETY: same features.
    unsafe { offset32_dot(w, x, q4_1::BYTES, q4_1_levels) }
}

/// Q5_1 × Q8_1.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_impl(w: &[u8], x: &[u8]) -> f32 {
    // SAFETY: same features.
    unsafe { offset32_dot(w, x, q5_1::BYTES, q5_1_levels) }
}

/// Q4_1 × Q8_1 for four tokens.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    // SAFETY: same features.
    unsafe { offset32_dot4(w, x, q4_1::BYTES, q4_1_levels) }
}

/// Q5_1 × Q8_1 for four tokens.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    // SAFETY: same features.
    unsafe { offset32_dot4(w, x, q5_1::BYTES, q5_1_levels) }
}

/// 32 IQ4_NL-coded weights (a 16-byte nibble field) as two vectors of i16 levels:
/// weights 0..16 and 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_levels16(qs: __m128i) -> [__m256i; 2] {
    table_levels16(qs, &iq4_nl::KVALUES)
}

/// 32 weights of a 16-byte nibble field, each nibble an index into `table`, as two
/// vectors of i16 levels: weights 0..16 and 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn table_levels16(qs: __m128i, table: &[i8; 16]) -> [__m256i; 2] {
    let low4 = _mm_set1_epi8(0x0F);
    // SAFETY: the table is 16 bytes; unaligned load.
    let table = unsafe { _mm_loadu_si128(table.as_ptr() as *const __m128i) };
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, low4));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(qs), low4));
    [_mm256_cvtepi8_epi16(lo), _mm256_cvtepi8_epi16(hi)]
}

/// Lane integers of 32 i16 levels with the activation bytes `x[at..at + 32]`: lane `l` =
/// `Σ w_k·x_k` over `k` in `4l..4l+4`. Both sides in i16 with `madd` (exact for every
/// byte, −128 included), `hadd` joins the pairs into quads and a 64-bit permute restores
/// their order, as in [`q8_0_impl`].
///
/// # Safety
/// `at + 32 <= x.len()`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quads16(w: &[__m256i; 2], x: &[u8], at: usize) -> __m256i {
    // SAFETY: in bounds by the caller's contract.
    let (x0, x1) = unsafe { (load16(x, at), load16(x, at + 16)) };
    let pairs0 = _mm256_madd_epi16(w[0], _mm256_cvtepi8_epi16(x0));
    let pairs1 = _mm256_madd_epi16(w[1], _mm256_cvtepi8_epi16(x1));
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(pairs0, pairs1))
}

/// The sum of eight i32 lanes (exact for block sums).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_epi32_8(v: __m256i) -> i32 {
    hsum_epi32(_mm_add_epi32(
        _mm256_castsi256_si128(v),
        _mm256_extracti128_si256::<1>(v),
    ))
}

/// The Q8_0 activation quantizer ([`crate::formats::q8_0`]'s `quantize_acts_block` per
/// block) eight values at a time: the largest magnitude by `vmaxps` (exact, so the
/// scalar fold's value whatever the order), the `127/amax` multiplier, the scalar's
/// magic-number rounding and clamp, `d` by the same f16 conversion; the same bytes.
/// Blocks with a NaN (which the scalar fold skips) take the scalar path. On the serial
/// path of every decode step (one to sixteen rows, quantized on the calling thread),
/// where the scalar loop took about 1 % of an eight-stream step's samples.
///
/// # Safety
/// [`available`] is true; `out` holds `x.len() / 32` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_0_acts(x: &[f32], out: &mut [u8]) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        // SAFETY: xb holds 32 f32, four registers.
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xb.as_ptr().add(8 * i)) });
        let nan = v.iter().fold(_mm256_setzero_ps(), |m, &r| {
            _mm256_or_ps(m, _mm256_cmp_ps::<_CMP_UNORD_Q>(r, r))
        });
        if _mm256_movemask_ps(nan) != 0 {
            crate::formats::q8_0::quantize_acts_block(xb, ob);
            continue;
        }
        let abs = |r: __m256| _mm256_and_ps(r, abs_mask);
        let m = _mm256_max_ps(
            _mm256_max_ps(abs(v[0]), abs(v[1])),
            _mm256_max_ps(abs(v[2]), abs(v[3])),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        ob[..2].copy_from_slice(&crate::formats::f32_to_f16(d).to_le_bytes());
        let (id, magic) = (_mm256_set1_ps(id), _mm256_set1_ps(12_582_912.0));
        let q: [__m256i; 4] = v.map(|r| {
            // Not fused: the product is rounded before the shift, as in the scalar.
            let shifted = _mm256_add_ps(_mm256_mul_ps(r, id), magic);
            let q = _mm256_sub_epi32(
                _mm256_and_si256(_mm256_castps_si256(shifted), _mm256_set1_epi32(0x007f_ffff)),
                _mm256_set1_epi32(0x0040_0000),
            );
            _mm256_max_epi32(
                _mm256_min_epi32(q, _mm256_set1_epi32(127)),
                _mm256_set1_epi32(-128),
            )
        });
        // Saturating packs keep the clamped values; they interleave the 128-bit halves,
        // which the final dword permutation puts back in order.
        let words = [
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        ];
        let bytes = _mm256_packs_epi16(words[0], words[1]);
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: the block's 32 quant bytes follow its 2-byte scale.
        unsafe { _mm256_storeu_si256(ob.as_mut_ptr().add(2) as *mut __m256i, bytes) };
    }
}

/// The Q8_K activation quantizer ([`crate::formats::q8_k::quantize_block`] per block) eight values
/// at a time, as [`crate::avx512::quantize_q8_k`] does sixteen: the first value of the
/// largest magnitude, the `−127/max` multiplier, magic-number rounding, the same group
/// sums; the same bytes. Blocks with a NaN or no non-zero magnitude take the scalar
/// path.
///
/// # Safety
/// [`available`] is true; `out` holds `x.len() / 256` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(Q8_K_BYTES)) {
        // SAFETY: xb holds 256 f32: 32 registers of eight.
        let at = |i: usize| unsafe { _mm256_loadu_ps(xb.as_ptr().add(8 * i)) };
        let mut amax_v = _mm256_and_ps(at(0), abs_mask);
        let mut nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(at(0), at(0));
        for i in 1..32 {
            let v = at(i);
            amax_v = _mm256_max_ps(amax_v, _mm256_and_ps(v, abs_mask));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        }
        let amax = hmax_ps(amax_v);
        if _mm256_movemask_ps(nan) != 0 || amax <= 0.0 {
            crate::formats::q8_k::quantize_block(xb, ob);
            continue;
        }
        // The first value of that magnitude, with its sign (the scalar's strict `>`).
        let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0f32 / max;
        let iscale_v = _mm256_set1_ps(iscale);
        let magic = _mm256_set1_ps(12_582_912.0);
        ob[..4].copy_from_slice(&(1.0f32 / iscale).to_le_bytes());
        let quant = |v: __m256| {
            let shifted = _mm256_add_ps(_mm256_mul_ps(iscale_v, v), magic);
            let q = _mm256_sub_epi32(
                _mm256_and_si256(_mm256_castps_si256(shifted), _mm256_set1_epi32(0x007f_ffff)),
                _mm256_set1_epi32(0x0040_0000),
            );
            _mm256_min_epi32(q, _mm256_set1_epi32(127))
        };
        for j in 0..16 {
            // Sixteen quants: the group of one bsum.
            let (lo, hi) = (quant(at(2 * j)), quant(at(2 * j + 1)));
            // In [−127, 127] (the multiplier maps the largest magnitude to −127), so
            // the saturating packs are exact; they interleave the 128-bit halves, which
            // the permute puts back in order.
            let words = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(lo, hi));
            let bytes = _mm_packs_epi16(
                _mm256_castsi256_si128(words),
                _mm256_extracti128_si256::<1>(words),
            );
            // SAFETY: quants 16·j..16·j + 16 of the block's 256.
            unsafe {
                _mm_storeu_si128(
                    ob.as_mut_ptr().add(q8_k::QS + 16 * j) as *mut __m128i,
                    bytes,
                )
            };
            let sum = hsum_epi32_8(_mm256_add_epi32(lo, hi)) as i16;
            let at = q8_k::BSUMS + 2 * j;
            ob[at..at + 2].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

/// The largest of eight f32 lanes (no NaN among them).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hmax_ps(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m));
    _mm_cvtss_f32(m)
}

/// IQ4_NL's float order for one token: paired blocks alternate between two accumulators
/// (added lane-wise, then summed), an odd last block is one fused multiply-add of its
/// scale with its integer sum. The two accumulators are named fields chosen by a branch,
/// not an array indexed by `ib % 2`: a dynamic index kept them in memory, a store and a
/// reload on every block's chain.
pub(crate) struct Iq4nlAcc {
    even: __m256,
    odd: __m256,
    tail: Option<(f32, i32)>,
}

impl Iq4nlAcc {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn new() -> Iq4nlAcc {
        Iq4nlAcc {
            even: _mm256_setzero_ps(),
            odd: _mm256_setzero_ps(),
            tail: None,
        }
    }

    /// Block `ib` of `paired` paired blocks (or the unpaired last one).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn add(&mut self, ib: usize, paired: usize, d: f32, lanes: __m256i) {
        if ib < paired {
            let d = _mm256_set1_ps(d);
            let lanes = _mm256_cvtepi32_ps(lanes);
            if ib.is_multiple_of(2) {
                self.even = _mm256_fmadd_ps(d, lanes, self.even);
            } else {
                self.odd = _mm256_fmadd_ps(d, lanes, self.odd);
            }
        } else {
            self.tail = Some((d, hsum_epi32_8(lanes)));
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn finish(&self) -> f32 {
        let sumf = hsum_ps(_mm256_add_ps(self.even, self.odd));
        match self.tail {
            Some((d, sumi)) => d.mul_add(sumi as f32, sumf),
            None => sumf,
        }
    }
}

/// The IQ4_NL-ordered table formats of [`table_impl`]: a 16-level table indexed by
/// nibbles, paired with Q8_0.
const IQ4_NL: bool = false;
/// MXFP4: its own table and an E8M0 scale.
const MXFP4: bool = true;

/// Block bytes, nibble offset, table and weight scale of a table format (`MX`: MXFP4).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn table_format<const MX: bool>() -> (usize, usize, &'static [i8; 16]) {
    if MX {
        (mxfp4::BYTES, mxfp4::QS, &mxfp4::KVALUES)
    } else {
        (iq4_nl::BYTES, iq4_nl::QS, &iq4_nl::KVALUES)
    }
}

/// A table format's block scale `d_w`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn table_scale<const MX: bool>(wb: &[u8]) -> f32 {
    if MX {
        mxfp4::e8m0_to_f32_half(wb[mxfp4::E])
    } else {
        f16_scalar(wb, 0)
    }
}

/// IQ4_NL (or MXFP4, `MX`) × Q8_0 in the paired order of [`Iq4nlAcc`] (MXFP4's scalar
/// twin shares IQ4_NL's, `paired_table_dot`).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn table_impl<const MX: bool>(w: &[u8], x: &[u8]) -> f32 {
    let (bytes, qs_at, table) = table_format::<MX>();
    let n_blocks = (w.len() / bytes).min(x.len() / Q8_0_BYTES);
    let paired = n_blocks & !1;
    let mut acc = Iq4nlAcc::new();
    for ib in 0..n_blocks {
        prefetch_block(w, ib * bytes, bytes, 1);
        let wb = &w[ib * bytes..(ib + 1) * bytes];
        let xb = &x[ib * Q8_0_BYTES..(ib + 1) * Q8_0_BYTES];
        // SAFETY: the nibbles are 16 bytes at `qs_at` of a whole block; x quants 2..34
        // of 34.
        let lanes = unsafe { quads16(&table_levels16(load16(wb, qs_at), table), xb, 2) };
        acc.add(ib, paired, f16_scalar(xb, 0) * table_scale::<MX>(wb), lanes);
    }
    acc.finish()
}

/// [`table_impl`] for four tokens, each weight block decoded once.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn table_x4_impl<const MX: bool>(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let (bytes, qs_at, table) = table_format::<MX>();
    let n_blocks = common_blocks(w, &x, bytes, Q8_0_BYTES);
    let paired = n_blocks & !1;
    let mut acc = [
        Iq4nlAcc::new(),
        Iq4nlAcc::new(),
        Iq4nlAcc::new(),
        Iq4nlAcc::new(),
    ];
    for ib in 0..n_blocks {
        let wb = &w[ib * bytes..(ib + 1) * bytes];
        // SAFETY: the nibbles are 16 bytes at `qs_at` of a whole block.
        let levels = table_levels16(unsafe { load16(wb, qs_at) }, table);
        let d_w = table_scale::<MX>(wb);
        for (t, xb) in block_of_each(&x, ib, Q8_0_BYTES).into_iter().enumerate() {
            // SAFETY: x quants 2..34 of 34.
            let lanes = unsafe { quads16(&levels, xb, 2) };
            acc[t].add(ib, paired, f16_scalar(xb, 0) * d_w, lanes);
        }
    }
    std::array::from_fn(|t| acc[t].finish())
}

/// A ternary super-block decoded: the 256 levels (0..=3, the weight plus one) as eight
/// vectors of 32 bytes in weight order, and `d_w`.
struct TernaryBlock {
    levels: [__m256i; 8],
    d: __m256,
}

/// Digit `n` of each of 32 bytes packed as TQ1_0 packs them, `((byte·3^n mod 256)·3) >>
/// 8`, with `pow3` holding `3^n` in every 16-bit lane (both bytes of a lane take the same
/// power). The products are formed per byte in 16-bit lanes: the low byte from the
/// lane's product, the high byte from its own.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn ternary_digits(bytes: __m256i, pow3: __m256i) -> __m256i {
    let low = _mm256_set1_epi16(0x00FF);
    let high = _mm256_set1_epi16(0xFF00u16 as i16);
    let three = _mm256_set1_epi16(3);
    let q_lo = _mm256_and_si256(_mm256_mullo_epi16(bytes, pow3), low);
    let q_hi = _mm256_and_si256(
        _mm256_mullo_epi16(_mm256_and_si256(bytes, high), pow3),
        high,
    );
    // (q·3) >> 8 for q < 256 is the high half of (q << 8)·3.
    let d_lo = _mm256_mulhi_epu16(_mm256_slli_epi16::<8>(q_lo), three);
    let d_hi = _mm256_slli_epi16::<8>(_mm256_mulhi_epu16(q_hi, three));
    _mm256_or_si256(d_lo, d_hi)
}

/// # Safety
/// `wb` is a whole TQ2_0 super-block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tq2_0_decode(wb: &[u8]) -> TernaryBlock {
    let three = _mm256_set1_epi8(3);
    // SAFETY: qs is bytes 0..64 of 66.
    let halves = unsafe { [load32(wb, tq2_0::QS), load32(wb, tq2_0::QS + 32)] };
    // Weight 128h + 32k + m is bits 2k..2k+2 of byte 32h + m.
    let mut levels = [_mm256_setzero_si256(); 8];
    for (h, &half) in halves.iter().enumerate() {
        levels[4 * h] = _mm256_and_si256(half, three);
        levels[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16::<2>(half), three);
        levels[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16::<4>(half), three);
        levels[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16::<6>(half), three);
    }
    TernaryBlock {
        levels,
        d: _mm256_set1_ps(f16_scalar(wb, tq2_0::D)),
    }
}

/// # Safety
/// `wb` is a whole TQ1_0 super-block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tq1_0_decode(wb: &[u8]) -> TernaryBlock {
    const POW3: [i16; 5] = [1, 3, 9, 27, 81];
    // SAFETY: qs is bytes 0..48 of 54.
    let (head, tail) = unsafe { (load32(wb, tq1_0::QS), load16(wb, tq1_0::QS + 32)) };
    let qh = read_u32(wb, tq1_0::QH) as i32;
    let mut levels = [_mm256_setzero_si256(); 8];
    // Weights 0..160: digit n of byte m is weight 32n + m.
    for (n, &p) in POW3.iter().enumerate() {
        levels[n] = ternary_digits(head, _mm256_set1_epi16(p));
    }
    // Weights 160..240: digit n of byte 32 + m is weight 160 + 16n + m, so each vector's
    // halves take two digits of the same sixteen bytes. Weights 240..256: digit n of qh
    // byte j is weight 240 + 4n + j.
    let tail2 = _mm256_set_m128i(tail, tail);
    let halves = |lo: i16, hi: i16| _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
    levels[5] = ternary_digits(tail2, halves(POW3[0], POW3[1]));
    levels[6] = ternary_digits(tail2, halves(POW3[2], POW3[3]));
    let qh_pow3 = _mm_set_epi16(27, 27, 9, 9, 3, 3, 1, 1);
    levels[7] = ternary_digits(
        _mm256_set_m128i(_mm_set1_epi32(qh), tail),
        _mm256_set_m128i(qh_pow3, _mm_set1_epi16(POW3[4])),
    );
    TernaryBlock {
        levels,
        d: _mm256_set1_ps(f16_scalar(wb, tq1_0::D)),
    }
}

/// One token's step of a ternary super-block: the lanes of `Σ t·x − bsums`, formed in
/// 16-bit lanes as the scalar twin (`reduce::offset_pair_lanes`) forms them (exact: at
/// most 8·2·3·128 + 16·128 in magnitude), and `d_x·d_w`.
///
/// # Safety
/// `xb` is a whole Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ternary_token(block: &TernaryBlock, xb: &[u8]) -> (__m256, __m256) {
    let mut s16 = _mm256_setzero_si256();
    for (c, &levels) in block.levels.iter().enumerate() {
        // SAFETY: chunk c's x quants are 4+32c..36+32c of 292.
        let xq = unsafe { load32(xb, q8_k::QS + 32 * c) };
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(levels, xq));
    }
    // SAFETY: bsums are bytes 260..292 of 292.
    let s16 = _mm256_sub_epi16(s16, unsafe { load32(xb, q8_k::BSUMS) });
    let lanes = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    (
        _mm256_mul_ps(f32_splat(xb, 0), block.d),
        _mm256_cvtepi32_ps(lanes),
    )
}

/// A ternary format's single-token and four-token kernels: its decoder, then the
/// shared step [`ternary_token`] (one `fma(d_x·d_w, lanes)` per super-block).
macro_rules! ternary_kernels {
    ($imp:ident, $imp4:ident, $format:ident, $decode:ident) => {
        /// # Safety
        /// The CPU has AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $imp(w: &[u8], x: &[u8]) -> f32 {
            lanes8_chain!(w, x, $format::BYTES, Q8_K_BYTES, |wb, xb| {
                // SAFETY: whole blocks (chunks_exact).
                unsafe { ternary_token(&$decode(wb), xb) }
            })
        }

        /// # Safety
        /// The CPU has AVX2, FMA and F16C.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $imp4(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
            // SAFETY: same features; the decoder and the step read whole blocks only.
            decoded_chain4!(w, x, $format::BYTES, $decode, ternary_token)
        }
    };
}

ternary_kernels!(tq2_0_impl, tq2_0_x4_impl, tq2_0, tq2_0_decode);
// TQ1_0: TQ2_0's step once the base-3 digits are decoded.
ternary_kernels!(tq1_0_impl, tq1_0_x4_impl, tq1_0, tq1_0_decode);

/// An IQ4_XS super-block decoded: the eight sub-blocks' i16 levels and scales `ls − 32`.
struct Iq4xsBlock {
    levels: [[__m256i; 2]; 8],
    scales: [__m256i; 8],
    d: __m256,
}

/// The eight sub-block scales `ls − 32` of an IQ4_XS super-block as i32 lanes: each
/// lane shifts the low-nibble word and the high-bit word by its own amount, so the
/// eight come out of a few vector operations instead of a scalar extraction each.
///
/// # Safety
/// The CPU has AVX2; `wb` holds a whole super-block (asserted).
#[inline(always)]
pub(crate) unsafe fn iq4_xs_scales(wb: &[u8]) -> __m256i {
    assert!(wb.len() >= iq4_xs::BYTES);
    // SAFETY: the scale fields lie inside the super-block (asserted); the caller's
    // features.
    unsafe {
        let p = wb.as_ptr();
        let low = std::ptr::read_unaligned(p.add(iq4_xs::SCALES_L) as *const i32);
        let high = std::ptr::read_unaligned(p.add(iq4_xs::SCALES_H) as *const u16) as i32;
        let low = _mm256_and_si256(
            _mm256_srlv_epi32(
                _mm256_set1_epi32(low),
                _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
            ),
            _mm256_set1_epi32(0x0F),
        );
        let high = _mm256_and_si256(
            _mm256_srlv_epi32(
                _mm256_set1_epi32(high),
                _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
            ),
            _mm256_set1_epi32(3),
        );
        _mm256_sub_epi32(
            _mm256_or_si256(low, _mm256_slli_epi32::<4>(high)),
            _mm256_set1_epi32(32),
        )
    }
}

/// # Safety
/// `wb` is a whole IQ4_XS super-block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs_decode(wb: &[u8]) -> Iq4xsBlock {
    // SAFETY: a whole super-block; the features of this function.
    let scales = unsafe { iq4_xs_scales(wb) };
    // Plain loops: `array::from_fn` closures are compiled without the target features.
    let mut block = Iq4xsBlock {
        levels: [[_mm256_setzero_si256(); 2]; 8],
        scales: [_mm256_setzero_si256(); 8],
        d: f16_splat(wb, 0),
    };
    for j in 0..8 {
        block.scales[j] = _mm256_permutevar8x32_epi32(scales, _mm256_set1_epi32(j as i32));
        // SAFETY: sub-block j's qs are bytes 8+16j..24+16j of 136.
        block.levels[j] = iq4_levels16(unsafe { load16(wb, iq4_xs::QS + 16 * j) });
    }
    block
}

/// One decoded IQ4_XS super-block against one Q8_K block: `(d_w·d_x, lanes)`, lane `l` =
/// `Σ_j ls_j·quad_j,l` (`mullo`, exact: |quad·ls| < 2^21).
///
/// # Safety
/// `xb` is a whole Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs_token(block: &Iq4xsBlock, xb: &[u8]) -> (__m256, __m256) {
    let mut sumi = _mm256_setzero_si256();
    for j in 0..8 {
        // SAFETY: sub-block j's x quants are 4+32j..36+32j of 292.
        let quads = unsafe { quads16(&block.levels[j], xb, q8_k::QS + 32 * j) };
        sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(quads, block.scales[j]));
    }
    (
        _mm256_mul_ps(block.d, f32_splat(xb, 0)),
        _mm256_cvtepi32_ps(sumi),
    )
}

/// IQ4_XS × Q8_K: one `fma(d_w·d_x, lanes)` per super-block.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs_impl(w: &[u8], x: &[u8]) -> f32 {
    lanes8_chain!(w, x, iq4_xs::BYTES, Q8_K_BYTES, |wb, xb| {
        // One sub-block at a time: a whole decoded super-block (levels widened to i16,
        // scales, `d`) is 25 registers, more than AVX2 has, and went through memory.
        // SAFETY: a whole super-block (chunks_exact); the features of this function.
        let scales = unsafe { iq4_xs_scales(wb) };
        let mut sumi = _mm256_setzero_si256();
        for j in 0..8 {
            let ls = _mm256_permutevar8x32_epi32(scales, _mm256_set1_epi32(j as i32));
            // SAFETY: sub-block j's qs are bytes 8+16j..24+16j of 136, its x quants
            // 4+32j..36+32j of 292 (whole blocks, chunks_exact).
            let quads = unsafe {
                let levels = iq4_levels16(load16(wb, iq4_xs::QS + 16 * j));
                quads16(&levels, xb, q8_k::QS + 32 * j)
            };
            sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(quads, ls));
        }
        let d = _mm256_mul_ps(f16_splat(wb, 0), f32_splat(xb, 0));
        (d, _mm256_cvtepi32_ps(sumi))
    })
}

/// IQ4_XS × Q8_K for four tokens.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    // SAFETY: same features; the decoder and the step read whole blocks only.
    decoded_chain4!(w, x, iq4_xs::BYTES, iq4_xs_decode, iq4_xs_token)
}

/// The 2-bit field `k` (bits `2k..2k+2`) of every byte of `bits`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn crumb(bits: __m256i, k: usize) -> __m256i {
    let shifted = _mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * k as i32));
    _mm256_and_si256(shifted, _mm256_set1_epi8(3))
}

/// A Q2_K super-block decoded: the eight groups' levels (0..3), their scale pairs, the
/// 16 mins as i16 and `d_w`, `dmin_w`.
struct Q2kBlock {
    levels: [__m256i; 8],
    scales: [__m256i; 8],
    mins: __m256i,
    d: f32,
    dmin: f32,
}

/// # Safety
/// `wb` is a whole Q2_K super-block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k_decode(wb: &[u8]) -> Q2kBlock {
    let low4 = _mm_set1_epi8(0x0F);
    // SAFETY: scales are bytes 0..16 of 84; qs halves 16..48 and 48..80.
    let (packed, bits) = unsafe {
        (
            load16(wb, 0),
            [load32(wb, q2_k::QS), load32(wb, q2_k::QS + 32)],
        )
    };
    let halves = scale_halves(_mm256_cvtepu8_epi16(_mm_and_si128(packed, low4)));
    let masks = group_scale_masks();
    let mut levels = [_mm256_setzero_si256(); 8];
    let mut scales = [_mm256_setzero_si256(); 8];
    for g in 0..8 {
        levels[g] = crumb(bits[g / 4], g % 4);
        scales[g] = group_scales(&halves, &masks, g);
    }
    Q2kBlock {
        levels,
        scales,
        mins: _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), low4)),
        d: f16_scalar(wb, q2_k::D),
        dmin: f16_scalar(wb, q2_k::DMIN),
    }
}

/// One decoded Q2_K super-block against one Q8_K block: first the min lanes (`madd` of
/// the 16 mins with the 16 bsums, lane `l` = `m[2l]·b[2l] + m[2l+1]·b[2l+1]`) fused with
/// `−d_x·dmin_w`, then the scaled level sums (`maddubs`, `madd` by the sub-block scales)
/// with `d_x·d_w`, both into `acc`.
///
/// # Safety
/// `xb` is a whole Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k_token(block: &Q2kBlock, xb: &[u8], acc: &mut __m256) {
    let dx = read_f32(xb, 0);
    // SAFETY: bsums are bytes 260..292 of 292.
    let min_lanes = _mm256_madd_epi16(block.mins, unsafe { load32(xb, q8_k::BSUMS) });
    *acc = _mm256_fmadd_ps(
        _mm256_set1_ps(-dx * block.dmin),
        _mm256_cvtepi32_ps(min_lanes),
        *acc,
    );
    let mut sumi = _mm256_setzero_si256();
    for g in 0..8 {
        // SAFETY: group g's x quants are 4+32g..36+32g of 292.
        let xq = unsafe { load32(xb, q8_k::QS + 32 * g) };
        let p16 = _mm256_maddubs_epi16(block.levels[g], xq);
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, block.scales[g]));
    }
    *acc = _mm256_fmadd_ps(_mm256_set1_ps(dx * block.d), _mm256_cvtepi32_ps(sumi), *acc);
}

/// The byte shuffles [`group_scales`] takes: mask `k` puts i16 scale `2k` of a
/// 128-bit half in the low half's eight words and scale `2k + 1` in the high half's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn group_scale_masks() -> [__m256i; 4] {
    std::array::from_fn(|k| {
        let j = 4 * k as i8;
        let low = _mm_set1_epi16(i16::from_le_bytes([j as u8, j as u8 + 1]));
        let high = _mm_set1_epi16(i16::from_le_bytes([j as u8 + 2, j as u8 + 3]));
        _mm256_set_m128i(high, low)
    })
}

/// The two i16 scales of group `g` from `halves` (`halves[0]`: scales 0..8 in both
/// 128-bit halves, `halves[1]`: 8..16) as a `madd` operand: the low 128 bits scale
/// `2g`, the high ones `2g + 1`. One in-lane byte shuffle by a mask of `masks`
/// ([`group_scale_masks`]).
#[inline(always)]
fn group_scales(halves: &[__m256i; 2], masks: &[__m256i; 4], g: usize) -> __m256i {
    // SAFETY (features): only called from functions enabling AVX2.
    unsafe { _mm256_shuffle_epi8(halves[g / 4], masks[g % 4]) }
}

/// Sixteen i16 scales as [`group_scales`] takes them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_halves(scales: __m256i) -> [__m256i; 2] {
    [
        _mm256_permute2x128_si256::<0x00>(scales, scales),
        _mm256_permute2x128_si256::<0x11>(scales, scales),
    ]
}

/// Q2_K × Q8_K, decoding in registers: per super-block first the min lanes (`madd` of
/// the 16 mins with the 16 bsums, lane `l` = `m[2l]·b[2l] + m[2l+1]·b[2l+1]`) fused with
/// `−d_x·dmin_w`, then the scaled level sums (`maddubs`, `madd` by the sub-block scales)
/// with `d_x·d_w`, both into one set of eight lanes.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k_impl(w: &[u8], x: &[u8]) -> f32 {
    let low4 = _mm_set1_epi8(0x0F);
    let masks = group_scale_masks();
    let mut acc = _mm256_setzero_ps();
    let blocks = w.chunks_exact(q2_k::BYTES).zip(x.chunks_exact(Q8_K_BYTES));
    for (b, (wb, xb)) in blocks.enumerate() {
        prefetch_block(w, b * q2_k::BYTES, q2_k::BYTES, 1);
        let dx = read_f32(xb, 0);
        // SAFETY: scales are bytes 0..16 of 84, qs 16..80; bsums 260..292 of 292.
        let (packed, bits, bsums) = unsafe {
            (
                load16(wb, 0),
                [load32(wb, q2_k::QS), load32(wb, q2_k::QS + 32)],
                load32(xb, q8_k::BSUMS),
            )
        };
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), low4));
        let min_lanes = _mm256_madd_epi16(mins, bsums);
        let neg_dmin = _mm256_set1_ps(-dx * f16_scalar(wb, q2_k::DMIN));
        acc = _mm256_fmadd_ps(neg_dmin, _mm256_cvtepi32_ps(min_lanes), acc);
        let scales = scale_halves(_mm256_cvtepu8_epi16(_mm_and_si128(packed, low4)));
        let mut sumi = _mm256_setzero_si256();
        for g in 0..8 {
            // SAFETY: group g's x quants are 4+32g..36+32g of 292.
            let xq = unsafe { load32(xb, q8_k::QS + 32 * g) };
            let levels = crumb(bits[g / 4], g % 4);
            let p16 = _mm256_maddubs_epi16(levels, xq);
            sumi = _mm256_add_epi32(
                sumi,
                _mm256_madd_epi16(p16, group_scales(&scales, &masks, g)),
            );
        }
        let d = _mm256_set1_ps(dx * f16_scalar(wb, q2_k::D));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// Q2_K × Q8_K for four tokens, each super-block decoded once.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let n_blocks = common_blocks(w, &x, q2_k::BYTES, Q8_K_BYTES);
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..n_blocks {
        // SAFETY: whole blocks of every row.
        let block = unsafe { q2_k_decode(&w[b * q2_k::BYTES..(b + 1) * q2_k::BYTES]) };
        for (t, xb) in block_of_each(&x, b, Q8_K_BYTES).into_iter().enumerate() {
            // SAFETY: a whole Q8_K block.
            unsafe { q2_k_token(&block, xb, &mut acc[t]) };
        }
    }
    std::array::from_fn(|t| hsum_ps(acc[t]))
}

/// A Q3_K super-block decoded: per group the low two bits and `4·(1 − high bit)` (both
/// unsigned ≤ 4, so `maddubs` never saturates), the scale pairs and `d_w`.
struct Q3kBlock {
    low: [__m256i; 8],
    minus4: [__m256i; 8],
    scales: [__m256i; 8],
    d: __m256,
}

/// # Safety
/// `wb` is a whole Q3_K super-block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_decode(wb: &[u8]) -> Q3kBlock {
    let ones = _mm256_set1_epi8(1);
    let halves = scale_halves(q3_k_scales16(wb));
    let masks = group_scale_masks();
    // SAFETY: hmask is bytes 0..32 of 110; qs halves 32..64 and 64..96.
    let (hmask, bits) = unsafe {
        (
            load32(wb, 0),
            [load32(wb, q3_k::QS), load32(wb, q3_k::QS + 32)],
        )
    };
    // Plain loops: `array::from_fn` closures are compiled without the target features.
    let mut block = Q3kBlock {
        low: [_mm256_setzero_si256(); 8],
        minus4: [_mm256_setzero_si256(); 8],
        scales: [_mm256_setzero_si256(); 8],
        d: f16_splat(wb, q3_k::D),
    };
    for g in 0..8 {
        block.low[g] = crumb(bits[g / 4], g % 4);
        let high = _mm256_and_si256(_mm256_srl_epi16(hmask, _mm_cvtsi32_si128(g as i32)), ones);
        block.minus4[g] = _mm256_slli_epi16::<2>(_mm256_xor_si256(high, ones));
        block.scales[g] = group_scales(&halves, &masks, g);
    }
    block
}

/// One decoded Q3_K super-block against one Q8_K block: `(d_x·d_w, lanes)` with lane
/// integers `Σ sc·(maddubs(low, x) − maddubs(4·!high, x))`.
///
/// # Safety
/// `xb` is a whole Q8_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_token(block: &Q3kBlock, xb: &[u8]) -> (__m256, __m256) {
    let mut sumi = _mm256_setzero_si256();
    for g in 0..8 {
        // SAFETY: group g's x quants are 4+32g..36+32g of 292.
        let xq = unsafe { load32(xb, q8_k::QS + 32 * g) };
        let p16 = _mm256_sub_epi16(
            _mm256_maddubs_epi16(block.low[g], xq),
            _mm256_maddubs_epi16(block.minus4[g], xq),
        );
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, block.scales[g]));
    }
    (
        _mm256_mul_ps(f32_splat(xb, 0), block.d),
        _mm256_cvtepi32_ps(sumi),
    )
}

/// Q3_K's sixteen 6-bit scales minus 32 as i16, from its 12 packed bytes as words: the
/// low nibbles of words 0 and 1 are scales 0..8, their high nibbles 8..16, and word 2
/// holds the top two bits of every scale, byte `j % 4` at bits `2·(j / 4)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q3_k_scales16(wb: &[u8]) -> __m256i {
    let word = |i: usize| read_u32(wb, q3_k::SCALES + 4 * i);
    let (a0, a1, top) = (word(0), word(1), word(2));
    let (nibbles, crumbs) = (0x0F0F_0F0Fu32, 0x0303_0303u32);
    let quarters = [
        (a0 & nibbles) | ((top & crumbs) << 4),
        (a1 & nibbles) | (((top >> 2) & crumbs) << 4),
        ((a0 >> 4) & nibbles) | (((top >> 4) & crumbs) << 4),
        ((a1 >> 4) & nibbles) | (((top >> 6) & crumbs) << 4),
    ];
    let bytes = _mm_setr_epi32(
        quarters[0] as i32,
        quarters[1] as i32,
        quarters[2] as i32,
        quarters[3] as i32,
    );
    _mm256_sub_epi16(_mm256_cvtepu8_epi16(bytes), _mm256_set1_epi16(32))
}

/// Q3_K × Q8_K, decoding in registers: one `fma(d_x·d_w, lanes)` per super-block, lane
/// integers `Σ sc·(maddubs(low, x) − maddubs(4·!high, x))` (as [`q3_k_token`]).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_impl(w: &[u8], x: &[u8]) -> f32 {
    let ones = _mm256_set1_epi8(1);
    let masks = group_scale_masks();
    lanes8_chain!(w, x, q3_k::BYTES, Q8_K_BYTES, |wb, xb| {
        // SAFETY: hmask is bytes 0..32 of 110, qs 32..96.
        let (hmask, bits) = unsafe {
            (
                load32(wb, 0),
                [load32(wb, q3_k::QS), load32(wb, q3_k::QS + 32)],
            )
        };
        let scales = scale_halves(q3_k_scales16(wb));
        let mut sumi = _mm256_setzero_si256();
        for g in 0..8 {
            // SAFETY: group g's x quants are 4+32g..36+32g of 292.
            let xq = unsafe { load32(xb, q8_k::QS + 32 * g) };
            let high = _mm256_and_si256(_mm256_srl_epi16(hmask, _mm_cvtsi32_si128(g as i32)), ones);
            let minus4 = _mm256_slli_epi16::<2>(_mm256_xor_si256(high, ones));
            let p16 = _mm256_sub_epi16(
                _mm256_maddubs_epi16(crumb(bits[g / 4], g % 4), xq),
                _mm256_maddubs_epi16(minus4, xq),
            );
            sumi = _mm256_add_epi32(
                sumi,
                _mm256_madd_epi16(p16, group_scales(&scales, &masks, g)),
            );
        }
        (
            _mm256_mul_ps(f32_splat(xb, 0), f16_splat(wb, q3_k::D)),
            _mm256_cvtepi32_ps(sumi),
        )
    })
}

/// Q3_K × Q8_K for four tokens.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    // SAFETY: same features; the decoder and the step read whole blocks only.
    decoded_chain4!(w, x, q3_k::BYTES, q3_k_decode, q3_k_token)
}

/// The AVX2 four-token kernel of a weight type (see [`crate::formats::DotKernel4`]);
/// `None` for types without one or when this CPU lacks AVX2, FMA or F16C.
pub(crate) fn kernel4(weight_type: GgmlType) -> Option<DotKernel4> {
    if !available() {
        return None;
    }
    let k: DotKernel4 = match weight_type {
        GgmlType::Q4_0 => dot4_q4_0_q8_0,
        GgmlType::Q5_0 => dot4_q5_0_q8_0,
        GgmlType::Q8_0 => dot4_q8_0_q8_0,
        GgmlType::Q4_K => dot4_q4_k_q8_k,
        GgmlType::Q5_K => dot4_q5_k_q8_k,
        GgmlType::Q6_K => dot4_q6_k_q8_k,
        GgmlType::Q4_1 => dot4_q4_1_q8_1,
        GgmlType::Q5_1 => dot4_q5_1_q8_1,
        GgmlType::IQ4_NL => dot4_iq4_nl_q8_0,
        GgmlType::IQ4_XS => dot4_iq4_xs_q8_k,
        GgmlType::Q2_K => dot4_q2_k_q8_k,
        GgmlType::Q3_K => dot4_q3_k_q8_k,
        GgmlType::IQ2_XXS => dot4_iq2_xxs_q8_k,
        GgmlType::IQ2_XS => dot4_iq2_xs_q8_k,
        GgmlType::IQ2_S => dot4_iq2_s_q8_k,
        GgmlType::IQ3_XXS => dot4_iq3_xxs_q8_k,
        GgmlType::IQ3_S => dot4_iq3_s_q8_k,
        GgmlType::IQ1_S => dot4_iq1_s_q8_k,
        GgmlType::IQ1_M => dot4_iq1_m_q8_k,
        GgmlType::MXFP4 => dot4_mxfp4_q8_0,
        GgmlType::TQ2_0 => dot4_tq2_0_q8_k,
        GgmlType::TQ1_0 => dot4_tq1_0_q8_k,
        _ => return None,
    };
    Some(k)
}

/// Safe four-token entry points, handed out only by [`kernel4`].
macro_rules! checked_entry4 {
    ($($name:ident => $imp:path),* $(,)?) => {$(
        fn $name(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
            // SAFETY: reachable only through `kernel4`, which verified AVX2, FMA and F16C
            // on this CPU; the implementation reads only inside whole blocks of `w` and
            // of every `x`.
            unsafe { $imp(w, x) }
        }
    )*};
}

checked_entry4! {
    dot4_q5_k_q8_k => q5_k_x4_impl,
    dot4_q4_1_q8_1 => q4_1_x4_impl,
    dot4_q5_1_q8_1 => q5_1_x4_impl,
    dot4_iq4_nl_q8_0 => table_x4_impl::<IQ4_NL>,
    dot4_mxfp4_q8_0 => table_x4_impl::<MXFP4>,
    dot4_tq2_0_q8_k => tq2_0_x4_impl,
    dot4_tq1_0_q8_k => tq1_0_x4_impl,
    dot4_iq4_xs_q8_k => iq4_xs_x4_impl,
    dot4_q2_k_q8_k => q2_k_x4_impl,
    dot4_q3_k_q8_k => q3_k_x4_impl,
    dot4_q4_0_q8_0 => q4_0_x4_impl,
    dot4_q5_0_q8_0 => q5_0_x4_impl,
    dot4_q8_0_q8_0 => q8_0_x4_impl,
    dot4_q4_k_q8_k => q4_k_x4_impl,
    dot4_q6_k_q8_k => q6_k_x4_impl,
}

/// Block `b` (of `block_bytes` bytes) of each of `N` rows. A plain loop rather than
/// `array::from_fn`, which the compiler left as a call inside the kernels' loops.
#[inline(always)]
pub(crate) fn block_of_each<'a, const N: usize>(
    x: &[&'a [u8]; N],
    b: usize,
    block_bytes: usize,
) -> [&'a [u8]; N] {
    let mut blocks: [&[u8]; N] = [&[]; N];
    for (block, row) in blocks.iter_mut().zip(x) {
        *block = &row[b * block_bytes..(b + 1) * block_bytes];
    }
    blocks
}

/// Q4_0 × Q8_0 for four tokens: [`q4_0_impl`] with the nibbles unpacked once per block.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let low4 = _mm_set1_epi8(0x0F);
    let eights = _mm256_set1_epi8(8);
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
            let p16 = _mm256_sub_epi16(
                _mm256_maddubs_epi16(q, xq),
                _mm256_maddubs_epi16(eights, xq),
            );
            let d = _mm256_mul_ps(dw, f16_splat(xb, 0));
            (d, _mm256_cvtepi32_ps(pair_sums(p16)))
        }
    )
}

/// Q5_0 × Q8_0 for four tokens: [`q5_0_impl`] with the 5-bit quants formed once per
/// block.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let low4 = _mm_set1_epi8(0x0F);
    let sixteens = _mm256_set1_epi8(16);
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
            let q = _mm256_or_si256(
                _mm256_set_m128i(hi, lo),
                q5_0_high_bits(read_u32(wb, q5_0::QH)),
            );
            (q, f16_splat(wb, 0))
        },
        |xb| {
            // SAFETY: x quants are bytes 2..34 of a 34-byte block.
            let xq = unsafe { load32(xb, 2) };
            let p16 = _mm256_sub_epi16(
                _mm256_maddubs_epi16(q, xq),
                _mm256_maddubs_epi16(sixteens, xq),
            );
            let d = _mm256_mul_ps(dw, f16_splat(xb, 0));
            (d, _mm256_cvtepi32_ps(pair_sums(p16)))
        }
    )
}

/// Q8_0 × Q8_0 for four tokens: [`q8_0_impl`] with the weights widened to i16 once per
/// block.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    lanes8_chain4!(
        w,
        x,
        Q8_0_BYTES,
        Q8_0_BYTES,
        |wb| (w0, w1, dw) = {
            // SAFETY: quants are bytes 2..34 of a 34-byte block.
            let (w0, w1) = unsafe { (load16(wb, 2), load16(wb, 18)) };
            (
                _mm256_cvtepi8_epi16(w0),
                _mm256_cvtepi8_epi16(w1),
                f16_splat(wb, 0),
            )
        },
        |xb| {
            // SAFETY: quants are bytes 2..34 of a 34-byte block.
            let (x0, x1) = unsafe { (load16(xb, 2), load16(xb, 18)) };
            let pairs0 = _mm256_madd_epi16(w0, _mm256_cvtepi8_epi16(x0));
            let pairs1 = _mm256_madd_epi16(w1, _mm256_cvtepi8_epi16(x1));
            let quads =
                _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(pairs0, pairs1));
            let d = _mm256_mul_ps(dw, f16_splat(xb, 0));
            (d, _mm256_cvtepi32_ps(quads))
        }
    )
}

/// Q4_K × Q8_K for four tokens: [`q4_k_impl`] with each 32-byte chunk of quants and its
/// two scales decoded once for the four tokens. The i32 lane sums are the single-token
/// kernel's (integer adds give the same bits in any order); the float part, per token,
/// is its two FMA chains exactly.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let low4 = _mm256_set1_epi8(0x0F);
    let n_blocks = common_blocks(w, &x, Q4_K_BYTES, Q8_K_BYTES);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut acc_min = [_mm_setzero_ps(); 4];
    for b in 0..n_blocks {
        prefetch_ahead(w, b * Q4_K_BYTES);
        let wb = &w[b * Q4_K_BYTES..(b + 1) * Q4_K_BYTES];
        let xb = block_of_each(&x, b, Q8_K_BYTES);
        let (sc, mn) = scales_mins_k4_packed(&wb[q4_k::SCALES..q4_k::SCALES + 12]);
        let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
        let scales = _mm256_set_m128i(sc16, sc16);
        let mut sumi = [_mm256_setzero_si256(); 4];
        for chunk in 0..4 {
            // SAFETY: qs chunk is bytes 16+32c..48+32c of 144.
            let qs = unsafe { load32(wb, q4_k::QS + 32 * chunk) };
            let lo = _mm256_and_si256(qs, low4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qs), low4);
            let j = 2 * chunk as i16;
            let (s0, s1) = (word_broadcast(scales, j), word_broadcast(scales, j + 1));
            for t in 0..4 {
                // SAFETY: x quants 4+64c..68+64c of 292.
                let (x0, x1) = unsafe {
                    (
                        load32(xb[t], q8_k::QS + 64 * chunk),
                        load32(xb[t], q8_k::QS + 64 * chunk + 32),
                    )
                };
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), s0);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), s1);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
            }
        }
        let dw = f16_splat(wb, 0);
        let dmin_w = _mm256_castps256_ps128(f16_splat(wb, q4_k::DMIN));
        for t in 0..4 {
            let d = _mm256_mul_ps(dw, f32_splat(xb[t], 0));
            // −d_x·dmin_w, as the scalar twin forms it.
            let neg_dmin = _mm_mul_ps(_mm_set1_ps(-read_f32(xb[t], 0)), dmin_w);
            // SAFETY: xb[t] is a whole Q8_K block.
            let min_lanes = unsafe { k4_min_lanes(xb[t], mn) };
            acc_min[t] = _mm_fmadd_ps(neg_dmin, _mm_cvtepi32_ps(min_lanes), acc_min[t]);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    [
        hsum_ps(acc[0]) + hsum4_ps(acc_min[0]),
        hsum_ps(acc[1]) + hsum4_ps(acc_min[1]),
        hsum_ps(acc[2]) + hsum4_ps(acc_min[2]),
        hsum_ps(acc[3]) + hsum4_ps(acc_min[3]),
    ]
}

/// Q5_K × Q8_K for four tokens: [`q5_k_impl`] with each 32-byte chunk of quants, its
/// fifth bits and its two scales decoded once for the four tokens. Same i32 lanes, and per
/// token the same FMA chain and running min sum as the single-token kernel.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let low4 = _mm256_set1_epi8(0x0F);
    let bit4 = _mm256_set1_epi8(0x10);
    let n_blocks = common_blocks(w, &x, Q5_K_BYTES, Q8_K_BYTES);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut summs = [0.0f32; 4];
    for b in 0..n_blocks {
        prefetch_ahead(w, b * Q5_K_BYTES);
        let wb = &w[b * Q5_K_BYTES..(b + 1) * Q5_K_BYTES];
        let xb = block_of_each(&x, b, Q8_K_BYTES);
        let (sc, mn) = scales_mins_k4_packed(&wb[q4_k::SCALES..q4_k::SCALES + 12]);
        let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
        let scales = _mm256_set_m128i(sc16, sc16);
        // SAFETY: qh is bytes 16..48 of 176.
        let mut qh = unsafe { load32(wb, q4_k::Q5_QH) };
        let mut sumi = [_mm256_setzero_si256(); 4];
        for chunk in 0..4 {
            // SAFETY: qs chunk is bytes 48+32c..80+32c of 176.
            let qs = unsafe { load32(wb, q4_k::Q5_QS + 32 * chunk) };
            let h_lo = _mm256_and_si256(_mm256_slli_epi16::<4>(qh), bit4);
            let h_hi = _mm256_and_si256(_mm256_slli_epi16::<3>(qh), bit4);
            qh = _mm256_srli_epi16::<2>(qh);
            let lo = _mm256_or_si256(_mm256_and_si256(qs, low4), h_lo);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(qs), low4), h_hi);
            let j = 2 * chunk as i16;
            let (s0, s1) = (word_broadcast(scales, j), word_broadcast(scales, j + 1));
            for t in 0..4 {
                // SAFETY: x quants 4+64c..68+64c of 292.
                let (x0, x1) = unsafe {
                    (
                        load32(xb[t], q8_k::QS + 64 * chunk),
                        load32(xb[t], q8_k::QS + 64 * chunk + 32),
                    )
                };
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), s0);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), s1);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
            }
        }
        let dw = f16_splat(wb, 0);
        let dmin_w = _mm256_castps256_ps128(f16_splat(wb, q4_k::DMIN));
        for t in 0..4 {
            let d = _mm256_mul_ps(dw, f32_splat(xb[t], 0));
            // −d_x·dmin_w, as the scalar twin forms it.
            let neg_dmin = _mm_mul_ps(_mm_set1_ps(-read_f32(xb[t], 0)), dmin_w);
            // SAFETY: xb[t] is a whole Q8_K block.
            let sumi_min = hsum_epi32(unsafe { k4_min_lanes(xb[t], mn) });
            summs[t] = _mm_cvtss_f32(neg_dmin).mul_add(sumi_min as f32, summs[t]);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    [
        hsum_ps(acc[0]) + summs[0],
        hsum_ps(acc[1]) + summs[1],
        hsum_ps(acc[2]) + summs[2],
        hsum_ps(acc[3]) + summs[3],
    ]
}

/// Q6_K × Q8_K for four tokens: [`q6_k_impl`] with each 32-quant vector and its scales
/// formed once for the four tokens (same i32 lanes, same FMA chain per token).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_x4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    let n_blocks = common_blocks(w, &x, Q6_K_BYTES, Q8_K_BYTES);
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..n_blocks {
        prefetch_ahead(w, b * Q6_K_BYTES);
        let wb = &w[b * Q6_K_BYTES..(b + 1) * Q6_K_BYTES];
        let xb = block_of_each(&x, b, Q8_K_BYTES);
        // SAFETY: scales are bytes 192..208 of 210.
        let sc16 = _mm256_cvtepi8_epi16(unsafe { load16(wb, q6_k::SCALES) });
        let mut sumi = [_mm256_setzero_si256(); 4];
        for half in 0..2 {
            let scales = q6_k_half_scales(sc16, half);
            // SAFETY: a whole super-block.
            let q = unsafe { q6_k_half_levels(wb, half) };
            for (k, &qk) in q.iter().enumerate() {
                let k16 = k as i16;
                let ctrl = _mm256_set_m128i(
                    _mm_set1_epi16(((4 * k16 + 3) << 8) | (4 * k16 + 2)),
                    _mm_set1_epi16(((4 * k16 + 1) << 8) | (4 * k16)),
                );
                let scale = _mm256_shuffle_epi8(scales, ctrl);
                for t in 0..4 {
                    // SAFETY: x quants 4+128h+32k..36+128h+32k of 292.
                    let xk = unsafe { load32(xb[t], q8_k::QS + 128 * half + 32 * k) };
                    sumi[t] = _mm256_add_epi32(
                        sumi[t],
                        _mm256_madd_epi16(_mm256_maddubs_epi16(qk, xk), scale),
                    );
                }
            }
        }
        let dw = f16_splat(wb, q6_k::D);
        for t in 0..4 {
            // SAFETY: bsums are bytes 260..292 of 292.
            let bsums = unsafe { load32(xb[t], q8_k::BSUMS) };
            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16));
            let lanes = _mm256_sub_epi32(sumi[t], offset);
            let d = _mm256_mul_ps(dw, f32_splat(xb[t], 0));
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
