//! Register transposes of quantized rows shared by the kernels that lay rows out side by
//! side: sixteen rows' quads one row per 32-bit lane (the bound pass's row lanes, the wide
//! activation tiles), eight tokens' quad pairs (the narrow tiles of eight).

use std::arch::x86_64::*;

/// The 32 quant bytes at `p`, `p + row_bytes`, … of sixteen rows as eight
/// registers: lane `k` of register `j` is row `k`'s quad `j`.
///
/// # Safety
/// AVX-512 F enabled; 32 bytes readable at each of the sixteen rows.
#[inline(always)]
pub(crate) unsafe fn transpose_quads(p: *const u8, row_bytes: usize) -> [__m512i; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        let row = |k: usize| _mm256_loadu_si256(p.add(k * row_bytes) as *const __m256i);
        // Register `i < 4`: rows `i` and `i + 4` in its halves; `i ≥ 4`: `i + 4` and `i + 8`.
        let halves =
            |a: usize, b: usize| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(row(a)), row(b));
        let a = [
            halves(0, 4),
            halves(1, 5),
            halves(2, 6),
            halves(3, 7),
            halves(8, 12),
            halves(9, 13),
            halves(10, 14),
            halves(11, 15),
        ];
        // Within each 128-bit lane (a row's quads 0–3 or 4–7), a 4×4 transpose of four
        // registers: `u[i]`'s lane holds element `i` of the four rows.
        let u = transpose_lanes4(a);
        // `u[i]`'s lanes: quad `i` of rows 0–3, quad `4 + i` of rows 0–3, quad `i` of
        // rows 4–7, quad `4 + i` of rows 4–7; `u[4 + i]` the same for rows 8–15.
        let low = |i: usize| _mm512_shuffle_i64x2::<0x88>(u[i], u[i + 4]);
        let high = |i: usize| _mm512_shuffle_i64x2::<0xdd>(u[i], u[i + 4]);
        [
            low(0),
            low(1),
            low(2),
            low(3),
            high(0),
            high(1),
            high(2),
            high(3),
        ]
    }
}

/// Within every 128-bit lane, a 4×4 transpose of dwords across registers `h..h + 4`, for
/// `h` = 0 and 4: lane `l` of output `h + i` holds dword `i` of lane `l` of inputs
/// `h..h + 4`, in their order.
///
/// # Safety
/// AVX-512 F enabled.
#[inline(always)]
pub(crate) unsafe fn transpose_lanes4(a: [__m512i; 8]) -> [__m512i; 8] {
    // SAFETY: the caller's contract.
    unsafe {
        let mut u = [_mm512_setzero_si512(); 8];
        for h in [0, 4] {
            let t0 = _mm512_unpacklo_epi32(a[h], a[h + 1]);
            let t1 = _mm512_unpackhi_epi32(a[h], a[h + 1]);
            let t2 = _mm512_unpacklo_epi32(a[h + 2], a[h + 3]);
            let t3 = _mm512_unpackhi_epi32(a[h + 2], a[h + 3]);
            u[h] = _mm512_unpacklo_epi64(t0, t2);
            u[h + 1] = _mm512_unpackhi_epi64(t0, t2);
            u[h + 2] = _mm512_unpacklo_epi64(t1, t3);
            u[h + 3] = _mm512_unpackhi_epi64(t1, t3);
        }
        u
    }
}

/// Eight tokens' 32 bytes at `p`, `p + stride`, … as four registers: register `i` holds
/// each token's bytes `8i..8i + 8`, token `t`'s at bytes `8t..8t + 8` (an 8 × 4
/// transpose of 8-byte pairs: a quad pair per token and register, the element pair
/// `2t, 2t + 1` of a tile of eight tokens).
///
/// # Safety
/// AVX-512 F enabled; 32 bytes readable at each of the eight addresses.
#[inline(always)]
pub(crate) unsafe fn eight_pairs(p: *const u8, stride: usize) -> [__m512i; 4] {
    // SAFETY: the caller's contract.
    unsafe {
        let bytes = |t: usize| _mm256_loadu_si256(p.add(t * stride) as *const __m256i);
        let two =
            |t: usize| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bytes(t)), bytes(t + 4));
        let a = [two(0), two(1), two(2), two(3)];
        // `lo01 = unpacklo(a0, a1)` holds pairs 0 and 2 of tokens 0, 1, 4, 5 (as
        // t0p0, t1p0, t0p2, t1p2, t4p0, …); picking from it and `lo23` makes pairs 0
        // and 2 of all eight tokens, from the `hi` unpacks pairs 1 and 3.
        let even = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
        let odd = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
        let (lo01, hi01) = (
            _mm512_unpacklo_epi64(a[0], a[1]),
            _mm512_unpackhi_epi64(a[0], a[1]),
        );
        let (lo23, hi23) = (
            _mm512_unpacklo_epi64(a[2], a[3]),
            _mm512_unpackhi_epi64(a[2], a[3]),
        );
        [
            _mm512_permutex2var_epi64(lo01, even, lo23),
            _mm512_permutex2var_epi64(hi01, even, hi23),
            _mm512_permutex2var_epi64(lo01, odd, lo23),
            _mm512_permutex2var_epi64(hi01, odd, hi23),
        ]
    }
}

/// Eight values (the low half of `v`) each twice in a row: `v0, v0, v1, v1, …`.
///
/// # Safety
/// AVX-512 F enabled.
#[inline(always)]
pub(crate) unsafe fn each_twice(v: __m512) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        let twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        _mm512_permutexvar_ps(twice, v)
    }
}
