//! AVX2 four-row decode kernels (one token, four weight rows) for the 32-quant formats
//! paired with Q8_0: each activation block is prepared once for the four rows, the four
//! rows' f16 scales are converted and multiplied by `d_x` in one 128-bit step, and the
//! four accumulators are independent chains that hide the FMA latency one row waits on.
//!
//! Output `r` has the bits of the one-row kernel of [`crate::avx2`] on `(w[r], x)`: the
//! same exact integer lanes (formed by other but exact integer steps), the same
//! `d_w·d_x` product, one FMA per block in block order, and the same lane sum.

use std::arch::x86_64::*;

use nx_gguf::GgmlType;

use crate::avx2::{available, f16_scalar, hsum_ps, load16, load32, prefetch_block, q5_0_high_bits};
use crate::formats::DotKernelRows4;
use crate::formats::{q5_0, read_u32, Q4_0_BYTES, Q5_0_BYTES, Q8_0_BYTES};

/// Safe four-row entry points of a tier module (`name => implementation`), handed out
/// only by that module's `kernel_rows4`.
macro_rules! checked_entry_rows4 {
    ($($name:ident => $imp:ident),* $(,)?) => {$(
        fn $name(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
            // SAFETY: reachable only through this module's `kernel_rows4`, which verified
            // the CPU features the module's kernels need; the implementation reads only
            // inside whole blocks of every `w` and of `x`.
            unsafe { $imp(w, x) }
        }
    )*};
}
pub(crate) use checked_entry_rows4;

/// The four-row kernel of `weight_type`, when this module has one and the CPU can run it.
pub(crate) fn kernel_rows4(weight_type: GgmlType) -> Option<DotKernelRows4> {
    if !available() {
        return None;
    }
    let k: DotKernelRows4 = match weight_type {
        GgmlType::Q4_0 => dot_rows4_q4_0_q8_0,
        GgmlType::Q5_0 => dot_rows4_q5_0_q8_0,
        GgmlType::Q8_0 => dot_rows4_q8_0_q8_0,
        _ => return None,
    };
    Some(k)
}

checked_entry_rows4! {
    dot_rows4_q4_0_q8_0 => q4_0_rows4_impl,
    dot_rows4_q5_0_q8_0 => q5_0_rows4_impl,
    dot_rows4_q8_0_q8_0 => q8_0_rows4_impl,
}

/// The f16 bits at the start of `block` (two bytes at least).
#[inline(always)]
pub(crate) fn f16_bits(block: &[u8]) -> u16 {
    u16::from_le_bytes([block[0], block[1]])
}

/// Four weight rows of `BYTES`-byte blocks, cut to the whole blocks that every row and
/// the activation row hold, handed out one block index at a time under the four-row
/// kernels' prefetch rule. The AVX2 and the AVX-512 four-row kernels walk their rows
/// with it.
///
/// (No closures or `array::map` in the per-block path: they are not inlined into a
/// function with other target features, and a call per block costs more than the
/// block.)
pub(crate) struct Rows4<'a, const BYTES: usize> {
    rows: [&'a [u8]; 4],
    n_blocks: usize,
    /// Blocks until the next prefetch (a countdown: `b % PREFETCH_EVERY` costs a
    /// multiplication per block).
    until_prefetch: usize,
}

impl<'a, const BYTES: usize> Rows4<'a, BYTES> {
    /// One prefetch per row every `PREFETCH_EVERY` blocks still asks for every line (the
    /// stride stays under 64 bytes) with fewer instructions for small blocks.
    const PREFETCH_EVERY: usize = if BYTES >= 64 { 1 } else { 64 / BYTES };

    /// The rows `w`, against an activation row of `x_blocks` blocks.
    #[inline(always)]
    pub(crate) fn new(w: [&'a [u8]; 4], x_blocks: usize) -> Self {
        let mut n_blocks = x_blocks;
        for row in &w {
            n_blocks = n_blocks.min(row.len() / BYTES);
        }
        let whole = n_blocks * BYTES;
        Rows4 {
            rows: [
                &w[0][..whole],
                &w[1][..whole],
                &w[2][..whole],
                &w[3][..whole],
            ],
            n_blocks,
            until_prefetch: 0,
        }
    }

    /// Whole blocks of every row.
    #[inline(always)]
    pub(crate) fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Block `b` (`< n_blocks`) of the four rows, prefetching ahead on the way.
    #[inline(always)]
    pub(crate) fn block(&mut self, b: usize) -> [&'a [u8]; 4] {
        assert!(b < self.n_blocks);
        let at = b * BYTES;
        if self.until_prefetch == 0 {
            self.until_prefetch = Self::PREFETCH_EVERY;
            prefetch_block(self.rows[0], at, BYTES, 4);
            prefetch_block(self.rows[1], at, BYTES, 4);
            prefetch_block(self.rows[2], at, BYTES, 4);
            prefetch_block(self.rows[3], at, BYTES, 4);
        }
        self.until_prefetch -= 1;
        let rows = &self.rows;
        // SAFETY: `at + BYTES <= n_blocks·BYTES` (asserted), the length of every row.
        unsafe {
            [
                std::slice::from_raw_parts(rows[0].as_ptr().add(at), BYTES),
                std::slice::from_raw_parts(rows[1].as_ptr().add(at), BYTES),
                std::slice::from_raw_parts(rows[2].as_ptr().add(at), BYTES),
                std::slice::from_raw_parts(rows[3].as_ptr().add(at), BYTES),
            ]
        }
    }
}

/// `d_w·d_x` for four weight blocks (an f16 scale at the start of each) and the Q8_0
/// activation block `xb`, lane `r` for block `r`: each the one-row kernels' product, the
/// four scales converted in one instruction.
///
/// (Not a `target_feature` function: those are not inlined reliably, and a call per
/// block costs more than the block.)
///
/// # Safety
/// The CPU has AVX2 and F16C (the callers are kernels that checked them).
#[inline(always)]
pub(crate) unsafe fn scale_products4(blocks: [&[u8]; 4], xb: &[u8]) -> __m128 {
    let packed = u64::from(f16_bits(blocks[0]))
        | u64::from(f16_bits(blocks[1])) << 16
        | u64::from(f16_bits(blocks[2])) << 32
        | u64::from(f16_bits(blocks[3])) << 48;
    // SAFETY: F16C and AVX2 per the contract.
    unsafe {
        _mm_mul_ps(
            _mm_cvtph_ps(_mm_cvtsi64_si128(packed as i64)),
            _mm_set1_ps(f16_scalar(xb, 0)),
        )
    }
}

/// Runs the four rows `$w` (blocks of `$wbytes`, an f16 scale first) against one Q8_0
/// activation row `$x`: `$act` prepares the activation block `$xb` once (into the named
/// values), `$row` gives the exact integer lanes of weight block `$wb` with it.
macro_rules! lanes8_rows4_avx2 {
    ($w:expr, $x:expr, $wbytes:expr, |$xb:ident| ($($xv:ident),*) = $act:block,
     |$wb:ident| $row:block) => {{
        let mut rows = Rows4::<{ $wbytes }>::new($w, $x.len() / Q8_0_BYTES);
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..rows.n_blocks() {
            let $xb = &$x[b * Q8_0_BYTES..(b + 1) * Q8_0_BYTES];
            let ($($xv),*) = $act;
            let blocks = rows.block(b);
            // SAFETY: the kernels of this module run on CPUs with AVX2 and F16C.
            let d4 = _mm256_castps128_ps256(unsafe { scale_products4(blocks, $xb) });
            let mut r = 0;
            while r < 4 {
                let $wb = blocks[r];
                let lanes: __m256i = $row;
                let d = _mm256_permutevar8x32_ps(d4, _mm256_set1_epi32(r as i32));
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[r]);
                r += 1;
            }
        }
        [hsum_ps(acc[0]), hsum_ps(acc[1]), hsum_ps(acc[2]), hsum_ps(acc[3])]
    }};
}

/// Q8_0 × Q8_0 for four weight rows: the activation's sign-extended even and odd bytes
/// formed once per block; per row `Σ w·x` per quad as `madd(even) + madd(odd)`, exact.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_rows4_impl(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
    lanes8_rows4_avx2!(
        w,
        x,
        Q8_0_BYTES,
        |xb| (x_even, x_odd) = {
            // SAFETY: x quants are bytes 2..34 of a 34-byte block.
            let xq = unsafe { load32(xb, 2) };
            (
                _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(xq)),
                _mm256_srai_epi16::<8>(xq),
            )
        },
        |wb| {
            // SAFETY: quants are bytes 2..34 of a 34-byte block.
            let wq = unsafe { load32(wb, 2) };
            let w_even = _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(wq));
            let w_odd = _mm256_srai_epi16::<8>(wq);
            _mm256_add_epi32(
                _mm256_madd_epi16(w_even, x_even),
                _mm256_madd_epi16(w_odd, x_odd),
            )
        }
    )
}

/// Q4_0 × Q8_0 for four weight rows: `maddubs(8, x)` formed once per block, subtracted
/// from each row's `maddubs(q, x)` (pair sums of at most 3840 in size: exact in i16).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_rows4_impl(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
    let low4 = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    lanes8_rows4_avx2!(
        w,
        x,
        Q4_0_BYTES,
        |xb| (xq, corr) = {
            // SAFETY: x quants are bytes 2..34 of a 34-byte block.
            let xq = unsafe { load32(xb, 2) };
            (xq, _mm256_maddubs_epi16(_mm256_set1_epi8(8), xq))
        },
        |wb| {
            // SAFETY: qs is bytes 2..18 of an 18-byte block.
            let qs = unsafe { load16(wb, 2) };
            let lo = _mm_and_si128(qs, low4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
            let q = _mm256_set_m128i(hi, lo);
            _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q, xq), corr), ones)
        }
    )
}

/// Q5_0 × Q8_0 for four weight rows: [`q4_0_rows4_impl`] with the fifth bits and
/// `maddubs(16, x)` (pair sums of at most 7936 in size).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_rows4_impl(w: [&[u8]; 4], x: &[u8]) -> [f32; 4] {
    let low4 = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    lanes8_rows4_avx2!(
        w,
        x,
        Q5_0_BYTES,
        |xb| (xq, corr) = {
            // SAFETY: x quants are bytes 2..34 of a 34-byte block.
            let xq = unsafe { load32(xb, 2) };
            (xq, _mm256_maddubs_epi16(_mm256_set1_epi8(16), xq))
        },
        |wb| {
            // SAFETY: qs is bytes 6..22 of a 22-byte block.
            let qs = unsafe { load16(wb, q5_0::QS) };
            let lo = _mm_and_si128(qs, low4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(qs), low4);
            let qh = read_u32(wb, q5_0::QH);
            let q = _mm256_or_si256(_mm256_set_m128i(hi, lo), q5_0_high_bits(qh));
            _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q, xq), corr), ones)
        }
    )
}
