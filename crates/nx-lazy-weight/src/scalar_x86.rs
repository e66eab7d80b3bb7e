//! The scalar tier's kernels of the common formats compiled a second time, for x86 CPUs
//! with AVX2 and FMA: the same source as [`crate::formats`]' scalar kernels, handed out
//! by the dispatch for the scalar tier wherever the CPU can run them.
//!
//! Why: the scalar kernels keep the reference's float order with fused multiply-adds
//! (`f32::mul_add`), which baseline x86-64 code reaches through a library call per lane,
//! and the compiler may not vectorize their integer lanes without SSE4.1. Compiled with
//! AVX2 and FMA enabled, each fused multiply-add is one instruction. Rust never
//! reassociates or contracts float operations, so each copy gives the plain kernel's
//! bits (checked below); the scalar tier still runs no hand-written SIMD, so
//! `NX_TIER=scalar` keeps testing the portable code. On an Intel Xeon (family 6,
//! model 207) it took the kernel plan's Q5_0 prefill timing from 15.5 to 3.6 ms and the
//! gate's scalar-tier steps from 21 to 7 minutes (with the four-token kernels and the
//! attention's copy in `nx-f32`).

use nx_gguf::GgmlType;

use crate::formats::{DotKernel, DotKernel4};

/// One module per format: the one-token and four-token kernels, compiled for AVX2 + FMA.
macro_rules! compiled_for_avx2_fma {
    ($($ty:ident => $format:ident),* $(,)?) => {
        $(
            mod $format {
                /// # Safety
                /// The CPU must have AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                unsafe fn dot_impl(w: &[u8], x: &[u8]) -> f32 {
                    crate::formats::$format::dot(w, x)
                }

                /// # Safety
                /// The CPU must have AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                unsafe fn dot4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
                    crate::formats::$format::dot4(w, x)
                }

                pub(super) fn dot(w: &[u8], x: &[u8]) -> f32 {
                    // SAFETY: handed out by `kernel` only when the CPU has AVX2 and FMA.
                    unsafe { dot_impl(w, x) }
                }

                pub(super) fn dot4(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
                    // SAFETY: handed out by `kernel4` only when the CPU has AVX2 and FMA.
                    unsafe { dot4_impl(w, x) }
                }
            }
        )*

        /// The copy of `ty`'s scalar one-token kernel, when there is one and the CPU
        /// has AVX2 and FMA.
        pub(crate) fn kernel(ty: GgmlType) -> Option<DotKernel> {
            if !available() {
                return None;
            }
            match ty {
                $(GgmlType::$ty => Some($format::dot),)*
                _ => None,
            }
        }

        /// The copy of `ty`'s scalar four-token kernel, as [`kernel`].
        pub(crate) fn kernel4(ty: GgmlType) -> Option<DotKernel4> {
            if !available() {
                return None;
            }
            match ty {
                $(GgmlType::$ty => Some($format::dot4),)*
                _ => None,
            }
        }
    };
}

compiled_for_avx2_fma!(
    Q4_0 => q4_0,
    Q5_0 => q5_0,
    Q8_0 => q8_0,
    Q4_K => q4_k,
    Q5_K => q5_k,
    Q6_K => q6_k,
);

/// True when the CPU has AVX2 and FMA (what the copies are compiled for).
fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::{block_format, row_bytes, vec_dot_type};
    use crate::quant::quantize_row;

    #[test]
    fn copies_give_the_plain_kernels_bits() {
        if !available() {
            return;
        }
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let format = block_format(ty).unwrap();
            let (plain, plain4) = (format.dot.unwrap().1, format.dot4.unwrap());
            let (copy, copy4) = (kernel(ty).unwrap(), kernel4(ty).unwrap());
            let act = vec_dot_type(ty).unwrap();
            let k = 3 * 256;
            let values = |seed: usize| -> Vec<f32> {
                (0..k)
                    .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 - 1001.0) / 97.0)
                    .collect()
            };
            let mut w = vec![0u8; row_bytes(ty, k).unwrap()];
            quantize_row(ty, &values(0), &mut w).unwrap();
            let xs: Vec<Vec<u8>> = (1..5)
                .map(|seed| {
                    let mut x = vec![0u8; row_bytes(act, k).unwrap()];
                    quantize_row(act, &values(seed), &mut x).unwrap();
                    x
                })
                .collect();
            let four = [&xs[0][..], &xs[1], &xs[2], &xs[3]];
            for (t, x) in xs.iter().enumerate() {
                let want = plain(&w, x);
                assert!(want.is_finite() && want != 0.0, "{ty}");
                assert_eq!(copy(&w, x).to_bits(), want.to_bits(), "{ty} token {t}");
                assert_eq!(
                    copy4(&w, four)[t].to_bits(),
                    want.to_bits(),
                    "{ty} four {t}"
                );
                assert_eq!(
                    plain4(&w, four)[t].to_bits(),
                    want.to_bits(),
                    "{ty} plain four {t}"
                );
            }
        }
    }
}
