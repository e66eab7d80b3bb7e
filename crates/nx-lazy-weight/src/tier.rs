//! The CPU tier this process runs ([`active_tier`]) and the tiers this CPU can run.
//!
//! Its own module because both the kernel plan and the kernel dispatch ask it, and the
//! dispatch asks the plan.

use std::sync::OnceLock;

use nx_syscalls::CpuTier;

use crate::LazyWeightError;

/// The tier every kernel of this process uses: [`nx_syscalls::cpu_tier`] (detected
/// once, lowered by `NX_TIER`). An `NX_TIER` the CPU cannot honour is an error, reported
/// by every matmul; callers should check it once at model load.
pub fn active_tier() -> Result<CpuTier, LazyWeightError> {
    Ok(nx_syscalls::cpu_tier()?)
}

/// The best tier of this CPU, ignoring `NX_TIER` (cached).
fn detected_tier() -> CpuTier {
    static DETECTED: OnceLock<CpuTier> = OnceLock::new();
    *DETECTED.get_or_init(nx_syscalls::detect_tier)
}

/// True when this CPU can run kernels of `tier` (Scalar always; the x86 tiers up to
/// the detected one; Neon on AArch64).
pub fn tier_supported(tier: CpuTier) -> bool {
    // The rule of `nx_syscalls::parse_tier_override`, without its string handling (this
    // runs once per matmul call).
    let detected = detected_tier();
    match tier {
        CpuTier::Scalar => true,
        CpuTier::Neon => detected == CpuTier::Neon,
        CpuTier::Avx2 | CpuTier::Avx512Vnni => detected != CpuTier::Neon && tier <= detected,
    }
}

/// Every tier this CPU can run, lowest first (for tests and benchmarks).
pub fn supported_tiers() -> Vec<CpuTier> {
    [
        CpuTier::Scalar,
        CpuTier::Avx2,
        CpuTier::Avx512Vnni,
        CpuTier::Neon,
    ]
    .into_iter()
    .filter(|&t| tier_supported(t))
    .collect()
}

/// True when the CPU has the AVX-512 tier's features: AVX2, FMA and F16C, and AVX-512
/// F/BW/VL/VNNI. The one list the AVX-512 kernel modules check (`avx512`, and
/// `grids_avx512` on top of VBMI), kept here so that neither imports the other.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512_vnni_features() -> bool {
    crate::avx2::available()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}
