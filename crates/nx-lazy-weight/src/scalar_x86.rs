//! The scalar tier's kernels (every weight format's one-token kernel, the common formats'
//! four-token ones) compiled a second time, for x86 CPUs with AVX2 and FMA: the same
//! source as [`crate::formats`]' and [`crate::dot_scalar`]'s scalar kernels, handed out by
//! the dispatch for the scalar tier wherever the CPU can run them.
//!
//! Why: the scalar kernels keep the reference's float order with fused multiply-adds
//! (`f32::mul_add`), which baseline x86-64 code reaches through a library call per lane,
//! and the compiler may not vectorize their integer lanes without SSE4.1. Compiled with
//! AVX2 and FMA enabled, each fused multiply-add is one instruction. Rust never
//! reassociates or contracts float operations, so each copy gives the plain kernel's
//! bits (checked below and by `tests/simd_twins*.rs`); the scalar tier still runs no hand-written SIMD, so
//! `NX_TIER=scalar` keeps testing the portable code. On an Intel Xeon (family 6,
//! model 207) it took the kernel plan's Q5_0 prefill timing from 15.5 to 3.6 ms and the
//! gate's scalar-tier steps from 21 to 7 minutes (with the four-token kernels and the
//! attention's copy in `nx-f32`).

use nx_gguf::GgmlType;

use crate::formats::{DotKernel, DotKernel4};

/// One module per kernel: the one-token kernel of every weight format (and the
/// four-token kernel of the formats that have one), compiled for AVX2 + FMA.
macro_rules! compiled_for_avx2_fma {
    (
        four: [$($ty4:ident => $format:ident),* $(,)?],
        one: [$($ty1:ident => $name:ident = $dot:path),* $(,)?] $(,)?
    ) => {
        $(
            mod $format {
                /// # Safety
                /// The CPU must have AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                unsafe fn dot4_impl(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
                    crate::formats::$format::dot4(w, x)
                }

                pub(super) fn dot4(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
                    // SAFETY: handed out by `kernel4` only when the CPU has AVX2 and FMA.
                    unsafe { dot4_impl(w, x) }
                }
            }
        )*
        $(
            mod $name {
                /// # Safety
                /// The CPU must have AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                unsafe fn dot_impl(w: &[u8], x: &[u8]) -> f32 {
                    $dot(w, x)
                }

                pub(super) fn dot(w: &[u8], x: &[u8]) -> f32 {
                    // SAFETY: handed out by `kernel` only when the CPU has AVX2 and FMA.
                    unsafe { dot_impl(w, x) }
                }
            }
        )*

        /// The copy of `ty`'s scalar one-token kernel, when the CPU has AVX2 and FMA.
        pub(crate) fn kernel(ty: GgmlType) -> Option<DotKernel> {
            if !available() {
                return None;
            }
            match ty {
                $(GgmlType::$ty1 => Some($name::dot),)*
                _ => None,
            }
        }

        /// The copy of `ty`'s scalar four-token kernel, when there is one and the CPU
        /// has AVX2 and FMA.
        pub(crate) fn kernel4(ty: GgmlType) -> Option<DotKernel4> {
            if !available() {
                return None;
            }
            match ty {
                $(GgmlType::$ty4 => Some($format::dot4),)*
                _ => None,
            }
        }
    };
}

compiled_for_avx2_fma!(
    four: [
        Q4_0 => q4_0,
        Q5_0 => q5_0,
        Q8_0 => q8_0,
        Q4_K => q4_k,
        Q5_K => q5_k,
        Q6_K => q6_k,
    ],
    one: [
        F32 => f32_dot = crate::dot_scalar::dot_f32,
        F16 => f16_dot = crate::dot_scalar::dot_f16,
        BF16 => bf16_dot = crate::dot_scalar::dot_bf16,
        Q4_0 => q4_0_dot = crate::formats::q4_0::dot,
        Q4_1 => q4_1_dot = crate::formats::q4_1::dot,
        Q5_0 => q5_0_dot = crate::formats::q5_0::dot,
        Q5_1 => q5_1_dot = crate::formats::q5_1::dot,
        Q8_0 => q8_0_dot = crate::formats::q8_0::dot,
        Q2_K => q2_k_dot = crate::formats::q2_k::dot,
        Q3_K => q3_k_dot = crate::formats::q3_k::dot,
        Q4_K => q4_k_dot = crate::formats::q4_k::dot,
        Q5_K => q5_k_dot = crate::formats::q5_k::dot,
        Q6_K => q6_k_dot = crate::formats::q6_k::dot,
        IQ2_XXS => iq2_xxs_dot = crate::formats::iq2_xxs::dot,
        IQ2_XS => iq2_xs_dot = crate::formats::iq2_xs::dot,
        IQ3_XXS => iq3_xxs_dot = crate::formats::iq3_xxs::dot,
        IQ1_S => iq1_s_dot = crate::formats::iq1_s::dot,
        IQ4_NL => iq4_nl_dot = crate::formats::iq4_nl::dot,
        IQ3_S => iq3_s_dot = crate::formats::iq3_s::dot,
        IQ2_S => iq2_s_dot = crate::formats::iq2_s::dot,
        IQ4_XS => iq4_xs_dot = crate::formats::iq4_xs::dot,
        IQ1_M => iq1_m_dot = crate::formats::iq1_m::dot,
        TQ1_0 => tq1_0_dot = crate::formats::tq1_0::dot,
        TQ2_0 => tq2_0_dot = crate::formats::tq2_0::dot,
        MXFP4 => mxfp4_dot = crate::formats::mxfp4::dot,
    ],
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
