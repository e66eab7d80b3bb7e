//! Row conversions between f32 and the 16-bit float formats (IEEE f16, bfloat16).
//!
//! Narrowing rounds to nearest, ties to even (as ggml's `FP32_TO_FP16` with F16C and its
//! `FP32_TO_BF16` do). f16 rows convert with F16C's instructions directly where the tier
//! allows (sixteen values per instruction when widening on the AVX-512 tier, eight
//! otherwise), else through `half`'s slice routines: the same exact conversions, bit for
//! bit (`f16_rows_widen_every_bit_pattern_exactly`, `f32_rows_narrow_to_f16_exactly`);
//! bfloat16 rows always go through `half`. Mismatched lengths are a caller bug: a
//! `debug_assert!` in debug builds, the common prefix otherwise.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// `dst[i] = f32(src[i])`.
pub fn f16_to_f32_row(src: &[f16], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len(), "f16_to_f32_row: length mismatch");
    let n = src.len().min(dst.len());
    #[cfg(target_arch = "x86_64")]
    if crate::use_avx512() {
        // SAFETY: `use_avx512` verified AVX-512 F and F16C on this CPU.
        return unsafe { widen_f16_avx512(&src[..n], &mut dst[..n]) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::use_avx2() {
        // SAFETY: `use_avx2` verified AVX2 and F16C on this CPU.
        return unsafe { widen_f16_f16c(&src[..n], &mut dst[..n]) };
    }
    src[..n].convert_to_f32_slice(&mut dst[..n]);
}

/// `dst[i] = f32(src[i])` (the common length) by `vcvtph2ps`, eight at a time: the AVX2
/// tier's [`widen_f16_avx512`]. (`half`'s slice routine checks the CPU and converts
/// through a buffer per eight values: 1.3 % of Gemma's pp512 on that tier.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
fn widen_f16_f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let whole = n / 8 * 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= whole <= both lengths; f16 is two bytes.
        unsafe {
            let bits = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(bits));
        }
    }
    for (d, &x) in dst[whole..n].iter_mut().zip(&src[whole..n]) {
        *d = x.to_f32();
    }
}

/// `dst[i] = f32(src[i])` (the common length) by `vcvtph2ps`, sixteen at a time: the
/// exact conversion, as `half`'s. Here rather than in `avx512.rs`, which reads cache rows
/// through `kv_rows` (and so, below it, this module).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
#[inline]
pub(crate) fn widen_f16_avx512(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let whole = n / 16 * 16;
    for i in (0..whole).step_by(16) {
        // SAFETY: i + 16 <= whole <= both lengths; f16 is two bytes.
        unsafe {
            let bits = _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i);
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(bits));
        }
    }
    for (d, &x) in dst[whole..n].iter_mut().zip(&src[whole..n]) {
        *d = x.to_f32();
    }
}

/// `dst[i] = f16(src[i])`, round to nearest even.
pub fn f32_to_f16_row(src: &[f32], dst: &mut [f16]) {
    debug_assert_eq!(src.len(), dst.len(), "f32_to_f16_row: length mismatch");
    let n = src.len().min(dst.len());
    #[cfg(target_arch = "x86_64")]
    if crate::use_avx2() {
        // SAFETY: `use_avx2` verified AVX2 and F16C on this CPU.
        return unsafe { narrow_f16_f16c(&src[..n], &mut dst[..n]) };
    }
    dst[..n].convert_from_f32_slice(&src[..n]);
}

/// `dst[i] = f16(src[i])` (the common length) by `vcvtps2ph`, eight at a time, rounding
/// to nearest even: the conversion `half` makes, without its per-call CPU check and
/// per-eight buffer (a batched decode step writes its new K and V rows through here,
/// on the calling thread: about a fifth of the step's serial samples at eight streams).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
fn narrow_f16_f16c(src: &[f32], dst: &mut [f16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len());
    let whole = n / 8 * 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: i + 8 <= whole <= both lengths; f16 is two bytes.
        unsafe {
            let v = _mm256_loadu_ps(src.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
        }
    }
    for (d, &x) in dst[whole..n].iter_mut().zip(&src[whole..n]) {
        *d = f16::from_f32(x);
    }
}

/// `dst[i] = f32(src[i])` for bfloat16 (exact).
pub fn bf16_to_f32_row(src: &[bf16], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len(), "bf16_to_f32_row: length mismatch");
    let n = src.len().min(dst.len());
    src[..n].convert_to_f32_slice(&mut dst[..n]);
}

/// `dst[i] = bf16(src[i])`, round to nearest even.
pub fn f32_to_bf16_row(src: &[f32], dst: &mut [bf16]) {
    debug_assert_eq!(src.len(), dst.len(), "f32_to_bf16_row: length mismatch");
    let n = src.len().min(dst.len());
    dst[..n].convert_from_f32_slice(&src[..n]);
}

/// Decodes little-endian f16 bytes (e.g. a GGUF F16 row) to f32. Uses
/// `min(bytes.len() / 2, dst.len())` elements.
pub fn f16_le_bytes_to_f32_row(bytes: &[u8], dst: &mut [f32]) {
    debug_assert_eq!(bytes.len(), dst.len() * 2, "f16 bytes: length mismatch");
    for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
        *d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

/// Decodes little-endian bf16 bytes (e.g. a GGUF BF16 row) to f32. Uses
/// `min(bytes.len() / 2, dst.len())` elements.
pub fn bf16_le_bytes_to_f32_row(bytes: &[u8], dst: &mut [f32]) {
    debug_assert_eq!(bytes.len(), dst.len() * 2, "bf16 bytes: length mismatch");
    for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
        *d = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Every f16 bit pattern through each x86 widening this CPU has, at a length with a
    /// tail after the wide steps, against `f16::to_f32` (the process tier runs only one
    /// of them in `tests/kernels.rs`).
    #[test]
    fn each_x86_widening_gives_every_bit_pattern_exactly() {
        let all: Vec<f16> = (0..=u16::MAX)
            .map(f16::from_bits)
            .chain([f16::ONE; 7])
            .collect();
        let want: Vec<u32> = all.iter().map(|h| h.to_f32().to_bits()).collect();
        let mut wide = vec![0.0f32; all.len()];
        let check = |wide: &[f32], name: &str| {
            for (i, (w, &bits)) in wide.iter().zip(&want).enumerate() {
                assert_eq!(
                    w.to_bits(),
                    bits,
                    "{name}: f16 bits {:#06x}",
                    all[i].to_bits()
                );
            }
        };
        if std::arch::is_x86_feature_detected!("avx") && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: the features were just detected.
            unsafe { widen_f16_f16c(&all, &mut wide) };
            check(&wide, "f16c");
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            wide.fill(0.0);
            // SAFETY: the features were just detected.
            unsafe { widen_f16_avx512(&all, &mut wide) };
            check(&wide, "avx512");
        }
    }
}
