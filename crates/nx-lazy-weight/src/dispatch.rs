//! Kernel dispatch: the dot kernel of a weight type for a CPU tier.
//!
//! Which of a format's kernels runs is the kernel plan's choice (`crate::plan`); this
//! module hands out the kernels of a tier. A plan may mix tiers (an AVX2 decode kernel
//! under the AVX-512 tier) because every kernel gives the same bits: for every
//! quantized type every tier gives the scalar reference's bits exactly, which are the
//! reference engine's (`tests/simd_twins.rs`, `tests/simd_twins_formats.rs`,
//! `tests/dot_reference.rs`); so do the float types' (F32 and F16 have AVX2 kernels,
//! BF16 an AVX-512 BF16 one and an AVX2 copy of it: `crate::bf16_x86`).

use nx_gguf::GgmlType;
use nx_syscalls::CpuTier;

use crate::dot_scalar::{self, DotKernel};
use crate::formats::{row_bytes, vec_dot_type};
pub use crate::formats::{DotKernel4, DotKernelRows4};
use crate::tier::tier_supported;
use crate::LazyWeightError;

/// The dot kernel of `weight_type` at `tier`: the tier's SIMD kernel when it has one,
/// else the scalar one (the float types, and every type on Neon for now). `None` when
/// the type has no dot product or this CPU cannot run `tier`.
pub fn dot_kernel_for(tier: CpuTier, weight_type: GgmlType) -> Option<DotKernel> {
    if !tier_supported(tier) {
        return None;
    }
    let simd = match tier {
        #[cfg(target_arch = "x86_64")]
        CpuTier::Scalar => crate::scalar_x86::kernel(weight_type),
        #[cfg(not(target_arch = "x86_64"))]
        CpuTier::Scalar => None,
        #[cfg(target_arch = "x86_64")]
        CpuTier::Avx2 => crate::avx2::kernel(weight_type),
        #[cfg(target_arch = "x86_64")]
        // The formats without an AVX-512 kernel of their own run their AVX2 one (every
        // AVX-512 VNNI CPU has AVX2, FMA and F16C; both give the scalar twin's bits).
        CpuTier::Avx512Vnni => {
            crate::avx512::kernel(weight_type).or_else(|| crate::avx2::kernel(weight_type))
        }
        #[cfg(target_arch = "aarch64")]
        CpuTier::Neon => crate::neon::kernel(weight_type),
        #[allow(unreachable_patterns)] // tiers of other architectures are unsupported above
        _ => None,
    };
    simd.or_else(|| dot_scalar::dot_kernel(weight_type))
}

/// The four-token kernel of `weight_type` at `tier`, when the tier has one (Q4_0,
/// Q5_0, Q8_0, Q4_K, Q5_K, Q6_K on every x86 tier, scalar included, and more formats of
/// `formats::BLOCK_FORMATS` on AVX2 and AVX-512 VNNI). `None` otherwise: callers then use
/// [`dot_kernel_for`] per token, which gives the same bits.
pub fn dot_kernel4_for(tier: CpuTier, weight_type: GgmlType) -> Option<DotKernel4> {
    if !tier_supported(tier) {
        return None;
    }
    match tier {
        CpuTier::Scalar => {
            #[cfg(target_arch = "x86_64")]
            let copy = crate::scalar_x86::kernel4(weight_type);
            #[cfg(not(target_arch = "x86_64"))]
            let copy = None;
            copy.or_else(|| crate::formats::block_format(weight_type).and_then(|f| f.dot4))
        }
        #[cfg(target_arch = "x86_64")]
        CpuTier::Avx2 => crate::avx2::kernel4(weight_type),
        #[cfg(target_arch = "x86_64")]
        CpuTier::Avx512Vnni => {
            crate::avx512::kernel4(weight_type).or_else(|| crate::avx2::kernel4(weight_type))
        }
        _ => None,
    }
}

/// The four-row kernel of `weight_type` at `tier`, when the tier has one (most block and
/// K formats on AVX-512 VNNI, Q4_0, Q5_0 and Q8_0 on AVX2). `None` otherwise: callers then use
/// [`dot_kernel_for`] per row, which gives the same bits.
pub fn dot_kernel_rows4_for(tier: CpuTier, weight_type: GgmlType) -> Option<DotKernelRows4> {
    if !tier_supported(tier) {
        return None;
    }
    match tier {
        #[cfg(target_arch = "x86_64")]
        CpuTier::Avx512Vnni => crate::avx512::kernel_rows4(weight_type),
        #[cfg(target_arch = "x86_64")]
        CpuTier::Avx2 => crate::avx2_rows4::kernel_rows4(weight_type),
        _ => None,
    }
}

/// The one-row kernel of `weight_type` the active kernel plan decodes with.
pub fn active_dot_kernel(weight_type: GgmlType) -> Result<DotKernel, LazyWeightError> {
    let tier = crate::plan::active_plan()?.get(weight_type).decode.tier();
    dot_kernel_for(tier, weight_type).ok_or(LazyWeightError::UnsupportedType {
        ggml_type: weight_type,
        op: "dot",
    })
}

/// Dot product of a weight row (`weight_type`, `row_len` elements) with an activation
/// row already quantized to the weight's [`vec_dot_type`], with the active tier's
/// kernel: bit-identical to the matching element of a [`crate::matmul()`].
///
/// Errors when the type is unsupported, either slice has the wrong length, or
/// `NX_TIER` asks for a tier this CPU lacks.
pub fn dot_row(
    weight_type: GgmlType,
    w_row: &[u8],
    x_row: &[u8],
    row_len: usize,
) -> Result<f32, LazyWeightError> {
    let act_type = vec_dot_type(weight_type).ok_or(LazyWeightError::UnsupportedType {
        ggml_type: weight_type,
        op: "dot",
    })?;
    let w_bytes = row_bytes(weight_type, row_len)?;
    let x_bytes = row_bytes(act_type, row_len)?;
    if w_row.len() != w_bytes {
        return Err(LazyWeightError::LengthMismatch {
            what: "dot_row: weight row bytes",
            expected: w_bytes,
            actual: w_row.len(),
        });
    }
    if x_row.len() != x_bytes {
        return Err(LazyWeightError::LengthMismatch {
            what: "dot_row: activation row bytes",
            expected: x_bytes,
            actual: x_row.len(),
        });
    }
    Ok(active_dot_kernel(weight_type)?(w_row, x_row))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::supported_tiers;

    #[test]
    fn scalar_is_always_supported_and_matches_dot_scalar() {
        assert!(tier_supported(CpuTier::Scalar));
        assert_eq!(supported_tiers()[0], CpuTier::Scalar);
        let k = dot_kernel_for(CpuTier::Scalar, GgmlType::Q4_K).unwrap();
        let scalar = dot_scalar::dot_kernel(GgmlType::Q4_K).unwrap();
        // Function-pointer identity is not guaranteed (Miri gives every reification of a
        // function its own address), so check what the two compute, and identity natively.
        let mut w = [0x5Au8; crate::formats::Q4_K_BYTES];
        w[0..2].copy_from_slice(&0x3c00u16.to_le_bytes());
        w[2..4].copy_from_slice(&0x3800u16.to_le_bytes());
        let mut x = [0x11u8; crate::formats::Q8_K_BYTES];
        x[0..4].copy_from_slice(&0.5f32.to_le_bytes());
        assert_eq!(k(&w, &x).to_bits(), scalar(&w, &x).to_bits());
        // The same kernel, unless this x86 CPU runs the scalar source's AVX2 + FMA copy.
        #[cfg(target_arch = "x86_64")]
        let copied = crate::scalar_x86::kernel(GgmlType::Q4_K).is_some();
        #[cfg(not(target_arch = "x86_64"))]
        let copied = false;
        if !cfg!(miri) && !copied {
            assert_eq!(k as usize, scalar as usize);
        }
        assert!(dot_kernel_for(CpuTier::Scalar, GgmlType::Q8_K).is_none());
    }

    #[test]
    fn unsupported_tiers_give_no_kernel() {
        for tier in [CpuTier::Avx2, CpuTier::Avx512Vnni, CpuTier::Neon] {
            assert_eq!(
                dot_kernel_for(tier, GgmlType::Q8_0).is_some(),
                tier_supported(tier),
                "{tier}"
            );
        }
        // One process never runs both x86 and Arm tiers.
        assert!(!(tier_supported(CpuTier::Neon) && tier_supported(CpuTier::Avx2)));
        // Same answers as nx-syscalls' NX_TIER rule.
        for tier in [CpuTier::Avx2, CpuTier::Avx512Vnni, CpuTier::Neon] {
            assert_eq!(
                tier_supported(tier),
                nx_syscalls::parse_tier_override(tier.name(), nx_syscalls::detect_tier()).is_ok(),
                "{tier}"
            );
        }
    }

    #[test]
    fn dot_row_checks_lengths() {
        let w = [0u8; crate::formats::Q4_K_BYTES];
        let x = [0u8; crate::formats::Q8_K_BYTES];
        assert_eq!(dot_row(GgmlType::Q4_K, &w, &x, 256).unwrap(), 0.0);
        assert!(dot_row(GgmlType::Q4_K, &w, &x[..100], 256).is_err());
        assert!(dot_row(GgmlType::Q4_K, &w[..100], &x, 256).is_err());
        assert!(dot_row(GgmlType::Q4_K, &w, &x, 32).is_err());
        assert!(matches!(
            dot_row(GgmlType::Q8_K, &x, &x, 256),
            Err(LazyWeightError::UnsupportedType { .. })
        ));
    }
}
