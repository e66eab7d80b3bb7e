//! AVX2 twins of the f16 attention helpers, bit-identical to their [`crate::scalar`] references.
//!
//! [`crate::scalar::dot_f16`] keeps eight lanes (lane `l` sums `a[i]·b[i]` for
//! `i ≡ l (mod 8)`, a multiply then an add, never fused) and combines them in a fixed
//! order, then adds the tail in order. One AVX2 register of eight f32 lanes does exactly
//! that: `acc = acc + a·f32(b)` with separate `mul`/`add`, then the same lane
//! combination and tail. F16C's conversion is exact, like `half`'s. So the results equal
//! the scalar ones bit for bit and the tier choice never changes an attention output.

use std::arch::x86_64::*;

use half::f16;

/// True when this CPU has AVX2 and F16C.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
}

/// [`crate::scalar::dot_f16`] with AVX2.
///
/// # Safety
/// The CPU has AVX2 and F16C ([`available`]).
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    debug_assert_eq!(a.len(), b.len(), "dot_f16: length mismatch");
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let full = n / 8 * 8;
    let mut acc = _mm256_setzero_ps();
    for i in (0..full).step_by(8) {
        // SAFETY: i + 8 <= full <= n for both slices; f16 is a 2-byte plain value, so 8
        // of them are 16 readable bytes; both loads are unaligned.
        let (av, bv) = unsafe {
            (
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(i) as *const __m128i)),
            )
        };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(av, bv));
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 f32; unaligned store.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    // The scalar reference's lane combination, in its order.
    let mut sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    for (x, y) in a[full..].iter().zip(&b[full..]) {
        sum += x * y.to_f32();
    }
    sum
}

/// [`crate::scalar::axpy_f16`] with AVX2: `y[i] += alpha·f32(x[i])`, multiply then add.
///
/// # Safety
/// The CPU has AVX2 and F16C ([`available`]).
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn axpy_f16(y: &mut [f32], alpha: f32, x: &[f16]) {
    debug_assert_eq!(y.len(), x.len(), "axpy_f16: length mismatch");
    let n = y.len().min(x.len());
    let full = n / 8 * 8;
    let alpha8 = _mm256_set1_ps(alpha);
    for i in (0..full).step_by(8) {
        // SAFETY: i + 8 <= full <= n for both slices (16 bytes of f16); unaligned
        // accesses; `y` is exclusively borrowed.
        unsafe {
            let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i) as *const __m128i));
            let yp = y.as_mut_ptr().add(i);
            _mm256_storeu_ps(
                yp,
                _mm256_add_ps(_mm256_loadu_ps(yp), _mm256_mul_ps(alpha8, xv)),
            );
        }
    }
    for (yi, xi) in y[full..n].iter_mut().zip(&x[full..n]) {
        *yi += alpha * xi.to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scalar;

    /// Values that exercise the conversion: normals of several magnitudes, f16
    /// subnormals, zeros of both signs, the largest finite f16, infinities.
    fn f16_values(n: usize, seed: u64) -> Vec<f16> {
        let mut state = seed;
        (0..n)
            .map(|i| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = (state >> 33) as u32;
                match i % 17 {
                    3 => f16::from_bits(0x0001 + (r & 0x3ff) as u16), // subnormal
                    5 => f16::from_bits(0x8000),
                    7 => f16::MAX,
                    _ => f16::from_bits((r & 0x7bff) as u16 | ((r >> 16) as u16 & 0x8000)),
                }
            })
            .collect()
    }

    fn f32_values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
            })
            .collect()
    }

    #[test]
    fn dot_f16_is_bit_identical_to_scalar() {
        if !available() {
            eprintln!("skipped: no AVX2/F16C");
            return;
        }
        for n in (0..80).chain([255, 256, 257, 1024]) {
            for seed in 0..20 {
                let a = f32_values(n, seed);
                let b = f16_values(n, seed + 1000);
                let want = scalar::dot_f16(&a, &b);
                // SAFETY: checked `available()` above.
                let got = unsafe { dot_f16(&a, &b) };
                assert!(
                    want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                    "n={n} seed={seed}: scalar {want} avx2 {got}"
                );
            }
        }
    }

    #[test]
    fn axpy_f16_is_bit_identical_to_scalar() {
        if !available() {
            eprintln!("skipped: no AVX2/F16C");
            return;
        }
        for n in (0..40).chain([256, 1000]) {
            for seed in 0..10 {
                let x = f16_values(n, seed);
                let y0 = f32_values(n, seed + 77);
                let alpha = f32_values(1, seed + 5)[0];
                let mut want = y0.clone();
                scalar::axpy_f16(&mut want, alpha, &x);
                let mut got = y0.clone();
                // SAFETY: checked `available()` above.
                unsafe { axpy_f16(&mut got, alpha, &x) };
                for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                    assert!(
                        w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan()),
                        "n={n} seed={seed} i={i}: scalar {w} avx2 {g}"
                    );
                }
            }
        }
    }
}
