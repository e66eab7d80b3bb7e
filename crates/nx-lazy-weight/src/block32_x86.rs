//! The 32-quant weight formats (Q4_0, Q5_0, Q8_0) decoded in registers, shared by the
//! multi-token kernels that read weight blocks straight from the mapping
//! ([`crate::narrow`], [`crate::groups_avx2`]).

use std::arch::x86_64::*;

use nx_gguf::GgmlType;

use crate::avx2::q5_0_high_bits;
use crate::formats::{q5_0, read_u32, Q4_0_BYTES, Q5_0_BYTES, Q8_0_BYTES};

/// The formats as const-generic parameters of the kernels.
pub(crate) const Q8_0: u8 = 0;
pub(crate) const Q4_0: u8 = 1;
pub(crate) const Q5_0: u8 = 2;

/// The const-generic code of `weight_type`, if it is one of the three.
pub(crate) fn format_code(weight_type: GgmlType) -> Option<u8> {
    match weight_type {
        GgmlType::Q8_0 => Some(Q8_0),
        GgmlType::Q4_0 => Some(Q4_0),
        GgmlType::Q5_0 => Some(Q5_0),
        _ => None,
    }
}

/// Bytes of one weight block of format `fmt`.
pub(crate) const fn block_bytes(fmt: u8) -> usize {
    match fmt {
        Q8_0 => Q8_0_BYTES,
        Q4_0 => Q4_0_BYTES,
        _ => Q5_0_BYTES,
    }
}

/// A weight block's 32 quants as signed bytes (quant `j` in byte `j`: Q4_0 `n − 8`,
/// Q5_0 `n + 16·h − 16` with low nibbles for quants 0..16 and high ones for 16..32,
/// Q8_0 as stored) and `d_w`.
///
/// # Safety
/// The CPU has AVX2 and F16C; `wb` holds a whole block of `FMT` (asserted).
#[inline(always)]
pub(crate) unsafe fn signed_quants<const FMT: u8>(wb: &[u8]) -> (__m256i, f32) {
    assert!(wb.len() >= block_bytes(FMT));
    // SAFETY: every read is inside the block (asserted); the features per the contract.
    unsafe {
        let p = wb.as_ptr();
        let bits = std::ptr::read_unaligned(p as *const u16);
        let dw = crate::avx2::f16_bits_to_f32(bits);
        let low4 = _mm_set1_epi8(0x0F);
        let nibbles = |qs: __m128i| {
            let lo = _mm_and_si128(qs, low4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
            _mm256_set_m128i(hi, lo)
        };
        let q = match FMT {
            Q8_0 => _mm256_loadu_si256(p.add(2) as *const __m256i),
            Q4_0 => _mm256_sub_epi8(
                nibbles(_mm_loadu_si128(p.add(2) as *const __m128i)),
                _mm256_set1_epi8(8),
            ),
            _ => _mm256_sub_epi8(
                _mm256_or_si256(
                    nibbles(_mm_loadu_si128(p.add(q5_0::QS) as *const __m128i)),
                    q5_0_high_bits(read_u32(wb, q5_0::QH)),
                ),
                _mm256_set1_epi8(16),
            ),
        };
        (q, dw)
    }
}
