//! BF16 × BF16 dot kernels for x86-64 in the order of [`crate::dot_scalar::dot_bf16`]
//! (ggml's AVX512_BF16 `vec_dot_bf16`): `vdpbf16ps` itself where the CPU has AVX512_BF16,
//! and an AVX2 + FMA copy of what that instruction computes elsewhere.
//!
//! `vdpbf16ps` adds, per f32 lane, the product of its odd BF16 pair and then that of its
//! even pair, each in one rounding, reading subnormal inputs as zero and writing a
//! subnormal result as zero whatever MXCSR says. The AVX2 copy widens the pairs with a
//! mask and a shift, flushes with a compare, and runs the two fused multiply-adds: the same
//! bits (`tests/simd_twins.rs` checks both against the scalar twin, which a unit test
//! checks against the instruction).

use std::arch::x86_64::*;

use crate::dot_scalar::{bf16_sum, DotKernel};

/// BF16 values per step: two 512-bit registers of pairs, as the reference's loop.
const CHUNK: usize = 64;

/// The `vdpbf16ps` kernel, where the CPU has AVX-512 F and BF16.
pub(crate) fn avx512_kernel() -> Option<DotKernel> {
    let ok = std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bf16");
    ok.then_some(dot_dpbf16 as DotKernel)
}

/// The AVX2 + FMA copy, where the CPU has those (and F16C, as the AVX2 tier).
pub(crate) fn avx2_kernel() -> Option<DotKernel> {
    let ok = std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c");
    ok.then_some(dot_emulated as DotKernel)
}

fn dot_dpbf16(w: &[u8], x: &[u8]) -> f32 {
    // SAFETY: reachable only through `avx512_kernel`, which checked AVX-512 F and BF16;
    // the kernel reads only inside the whole values of `w` and `x`.
    unsafe { dpbf16_impl(w, x) }
}

fn dot_emulated(w: &[u8], x: &[u8]) -> f32 {
    // SAFETY: reachable only through `avx2_kernel`, which checked AVX2, FMA and F16C;
    // the kernel reads only inside the whole values of `w` and `x`.
    unsafe { emulated_impl(w, x) }
}

/// # Safety
/// The CPU has AVX-512 F and BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dpbf16_impl(w: &[u8], x: &[u8]) -> f32 {
    let n = (w.len() / 2).min(x.len() / 2);
    let whole = n / CHUNK * CHUNK;
    let mut regs = [[0f32; 16]; 2];
    // SAFETY: every load is of 64 bytes inside the first `whole` values of `w` and `x`;
    // `__m512bh` and `__m512i` are both 64 bytes of plain data.
    unsafe {
        let mut c = [_mm512_setzero_ps(); 2];
        for start in (0..whole).step_by(CHUNK) {
            for (half, c) in c.iter_mut().enumerate() {
                let at = 2 * (start + 32 * half);
                let wv = _mm512_loadu_si512(w.as_ptr().add(at).cast());
                let xv = _mm512_loadu_si512(x.as_ptr().add(at).cast());
                *c = _mm512_dpbf16_ps(
                    *c,
                    std::mem::transmute::<__m512i, __m512bh>(wv),
                    std::mem::transmute::<__m512i, __m512bh>(xv),
                );
            }
        }
        _mm512_storeu_ps(regs[0].as_mut_ptr(), c[0]);
        _mm512_storeu_ps(regs[1].as_mut_ptr(), c[1]);
    }
    bf16_sum(&regs, (w, x), (whole, n))
}

/// `v` with every subnormal (or zero) lane replaced by a zero of its sign.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn flush(v: __m256i) -> __m256i {
    let exponent = _mm256_set1_epi32(0x7f80_0000);
    let magnitude = _mm256_set1_epi32(0x7fff_ffff);
    let tiny = _mm256_cmpeq_epi32(_mm256_and_si256(v, exponent), _mm256_setzero_si256());
    _mm256_andnot_si256(_mm256_and_si256(tiny, magnitude), v)
}

/// Eight lanes of `vdpbf16ps`: `acc` plus the odd then the even products of the BF16
/// pairs in `w` and `x`.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dpbf16_lanes(acc: __m256, w: __m256i, x: __m256i) -> __m256 {
    let high = _mm256_set1_epi32(0xffff_0000u32 as i32);
    let odd = |v: __m256i| _mm256_castsi256_ps(flush(_mm256_and_si256(v, high)));
    let even = |v: __m256i| _mm256_castsi256_ps(flush(_mm256_slli_epi32::<16>(v)));
    let acc = _mm256_fmadd_ps(odd(w), odd(x), acc);
    let acc = _mm256_castsi256_ps(flush(_mm256_castps_si256(acc)));
    let acc = _mm256_fmadd_ps(even(w), even(x), acc);
    _mm256_castsi256_ps(flush(_mm256_castps_si256(acc)))
}

/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn emulated_impl(w: &[u8], x: &[u8]) -> f32 {
    let n = (w.len() / 2).min(x.len() / 2);
    let whole = n / CHUNK * CHUNK;
    let mut regs = [[0f32; 16]; 2];
    // SAFETY: every load is of 32 bytes inside the first `whole` values of `w` and `x`.
    unsafe {
        // Register `half`'s lanes 0..8 and 8..16.
        let mut c = [[_mm256_setzero_ps(); 2]; 2];
        for start in (0..whole).step_by(CHUNK) {
            for (half, c) in c.iter_mut().enumerate() {
                for (part, c) in c.iter_mut().enumerate() {
                    let at = 2 * (start + 32 * half + 16 * part);
                    let wv = _mm256_loadu_si256(w.as_ptr().add(at).cast());
                    let xv = _mm256_loadu_si256(x.as_ptr().add(at).cast());
                    *c = dpbf16_lanes(*c, wv, xv);
                }
            }
        }
        for (reg, c) in regs.iter_mut().zip(&c) {
            _mm256_storeu_ps(reg.as_mut_ptr(), c[0]);
            _mm256_storeu_ps(reg.as_mut_ptr().add(8), c[1]);
        }
    }
    bf16_sum(&regs, (w, x), (whole, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dot_scalar::dpbf16_step;
    use crate::test_bits::Bits;

    /// A BF16 value of kind `kind`: any bits, or exponents near the bottom of the range
    /// (subnormal included), or near one.
    fn value(bits: &mut Bits, kind: usize) -> u16 {
        let r = bits.next();
        let sign_mantissa = (r as u16) & 0x807f;
        match kind {
            0 => r as u16,
            1 => sign_mantissa | (((r >> 16) as u16 % 6) << 7),
            _ => sign_mantissa | ((((r >> 16) as u16 % 40) + 107) << 7),
        }
    }

    /// The scalar step (what every kernel here and the scalar twin compute) against the
    /// instruction itself, on accumulators and pairs down to subnormals: where the CPU has
    /// AVX512_BF16. A step that skipped one of its flushes fails this.
    #[test]
    fn the_scalar_step_is_the_instruction() {
        if !std::arch::is_x86_feature_detected!("avx512bf16") {
            eprintln!("skipped: no AVX512_BF16 here");
            return;
        }
        let mut bits = Bits(0x9e37_79b9_7f4a_7c15);
        for round in 0..20_000 {
            let kind = round % 3;
            let w: Vec<u16> = (0..32).map(|_| value(&mut bits, kind)).collect();
            let x: Vec<u16> = (0..32).map(|_| value(&mut bits, kind)).collect();
            let acc: Vec<f32> = (0..16)
                .map(|_| {
                    let r = bits.next() as u32;
                    let exponent = match round % 4 {
                        0 => r >> 23 & 0xff,
                        1 => r >> 23 & 3,
                        _ => 100 + (r >> 23) % 60,
                    };
                    f32::from_bits(r & 0x807f_ffff | exponent << 23)
                })
                .collect();
            let mut hw = [0f32; 16];
            // SAFETY: AVX512_BF16 checked above (every such CPU has AVX-512 F); the
            // loads read the 64 bytes of `w`, `x` and `acc`.
            unsafe { hardware_step(&acc, &w, &x, &mut hw) };
            for l in 0..16 {
                let bf = crate::formats::bf16_to_f32;
                let step = dpbf16_step(acc[l], bf(w[2 * l + 1]), bf(x[2 * l + 1]));
                let step = dpbf16_step(step, bf(w[2 * l]), bf(x[2 * l]));
                assert!(
                    step.to_bits() == hw[l].to_bits() || step.is_nan() && hw[l].is_nan(),
                    "round {round} lane {l}: scalar {step:e} instruction {:e}",
                    hw[l]
                );
            }
        }
    }

    /// # Safety
    /// The CPU has AVX-512 F and BF16; `w` and `x` hold 32 values, `acc` 16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn hardware_step(acc: &[f32], w: &[u16], x: &[u16], out: &mut [f32; 16]) {
        // SAFETY: the caller's contract.
        unsafe {
            let c = _mm512_loadu_ps(acc.as_ptr());
            let wv = _mm512_loadu_si512(w.as_ptr().cast());
            let xv = _mm512_loadu_si512(x.as_ptr().cast());
            let r = _mm512_dpbf16_ps(
                c,
                std::mem::transmute::<__m512i, __m512bh>(wv),
                std::mem::transmute::<__m512i, __m512bh>(xv),
            );
            _mm512_storeu_ps(out.as_mut_ptr(), r);
        }
    }
}
