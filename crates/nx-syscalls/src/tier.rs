//! CPU capability tier, detected once per process.

use std::sync::OnceLock;

/// The SIMD family every kernel in the process uses. Ordered: a higher tier can run
/// everything a lower one can (on the same architecture).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuTier {
    /// Portable scalar code: the reference every SIMD kernel is tested against.
    Scalar,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// x86-64 with AVX-512 F/BW/VL and VNNI (on top of everything `Avx2` needs).
    Avx512Vnni,
    /// AArch64 with NEON.
    Neon,
}

impl CpuTier {
    /// The name used by `NX_TIER` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            CpuTier::Scalar => "scalar",
            CpuTier::Avx2 => "avx2",
            CpuTier::Avx512Vnni => "avx512",
            CpuTier::Neon => "neon",
        }
    }
}

impl std::fmt::Display for CpuTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why `NX_TIER` could not be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TierError {
    #[error("NX_TIER={0:?} is not one of scalar, avx2, avx512, neon")]
    Unknown(String),
    #[error("NX_TIER={requested} asks for a tier this CPU lacks (detected: {detected})")]
    Unsupported {
        requested: CpuTier,
        detected: CpuTier,
    },
}

/// The best tier this CPU supports.
pub fn detect_tier() -> CpuTier {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c");
        let avx512 = avx2
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni");
        if avx512 {
            CpuTier::Avx512Vnni
        } else if avx2 {
            CpuTier::Avx2
        } else {
            CpuTier::Scalar
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        CpuTier::Neon
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        CpuTier::Scalar
    }
}

/// Applies an `NX_TIER` value to the detected tier: the result is the requested tier when
/// the CPU has it. Asking for a tier the CPU lacks, or one from another architecture, is
/// an error.
pub fn parse_tier_override(value: &str, detected: CpuTier) -> Result<CpuTier, TierError> {
    let requested = match value.trim().to_ascii_lowercase().as_str() {
        "scalar" => CpuTier::Scalar,
        "avx2" => CpuTier::Avx2,
        "avx512" | "avx512vnni" => CpuTier::Avx512Vnni,
        "neon" => CpuTier::Neon,
        _ => return Err(TierError::Unknown(value.to_string())),
    };
    let ok = match requested {
        CpuTier::Scalar => true,
        CpuTier::Neon => detected == CpuTier::Neon,
        CpuTier::Avx2 | CpuTier::Avx512Vnni => detected != CpuTier::Neon && requested <= detected,
    };
    if ok {
        Ok(requested)
    } else {
        Err(TierError::Unsupported {
            requested,
            detected,
        })
    }
}

static TIER: OnceLock<Result<CpuTier, TierError>> = OnceLock::new();

/// The tier for this process: detected once, lowered by `NX_TIER` when set. Every kernel
/// dispatches on this value, so one process never mixes tiers.
pub fn cpu_tier() -> Result<CpuTier, TierError> {
    TIER.get_or_init(|| {
        let detected = detect_tier();
        match std::env::var("NX_TIER") {
            Ok(v) if !v.trim().is_empty() => parse_tier_override(&v, detected),
            _ => Ok(detected),
        }
    })
    .clone()
}

/// Asks the kernel for permission to use the AMX tile data registers in this process
/// (Linux `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); true when granted.
/// Without it the first tile instruction raises SIGILL. Callers check the CPU's AMX
/// feature bits first; the permission is process-wide, so asking once is enough.
pub fn request_amx_tile_data() -> bool {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: arch_prctl with these arguments only changes this process's permitted
        // extended-state components; it reads and writes no memory of ours.
        let r = unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        };
        r == 0
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    {
        false
    }
}

/// The CPU's model name (the first `model name` of /proc/cpuinfo, with its `cpu family`
/// and `model` numbers where it has them), for reports and cache keys; `None` where the
/// system does not say.
pub fn cpu_model() -> Option<String> {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| cpu_model_from(&text))
}

/// The first `model name` value of a `/proc/cpuinfo` text, followed by
/// `(family F, model M)` when the text gives the x86 family and model numbers: virtual
/// machines often report only "AMD EPYC" or "Intel Xeon Processor", which names neither
/// the generation (Zen 4 and Zen 5 differ in their AVX-512 width) nor a fair key for a
/// tuned kernel plan.
pub fn cpu_model_from(cpuinfo: &str) -> Option<String> {
    let field = |key: &str| {
        cpuinfo
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().to_string())
    };
    let name = field("model name")?;
    Some(match (field("cpu family"), field("model")) {
        (Some(family), Some(model)) => format!("{name} (family {family}, model {model})"),
        _ => name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_only_lower() {
        assert_eq!(
            parse_tier_override("scalar", CpuTier::Avx2),
            Ok(CpuTier::Scalar)
        );
        assert_eq!(
            parse_tier_override("AVX2", CpuTier::Avx512Vnni),
            Ok(CpuTier::Avx2)
        );
        assert!(matches!(
            parse_tier_override("avx512", CpuTier::Avx2),
            Err(TierError::Unsupported { .. })
        ));
        assert!(matches!(
            parse_tier_override("neon", CpuTier::Avx2),
            Err(TierError::Unsupported { .. })
        ));
        assert!(matches!(
            parse_tier_override("sse9", CpuTier::Avx2),
            Err(TierError::Unknown(_))
        ));
    }

    #[test]
    fn detection_is_stable() {
        assert_eq!(detect_tier(), detect_tier());
        let t = cpu_tier();
        assert_eq!(t, cpu_tier());
    }
}
