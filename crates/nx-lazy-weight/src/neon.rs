//! AArch64 NEON dot kernels: not written yet, so the `Neon` tier uses the scalar kernels.
//!
//! This is a deliberate, documented stub. NEON kernels would follow [`crate::avx2`]
//! (unsigned weights against signed activations with `vdotq_s32`/`vmull_s8` for the
//! integer part, per-block FMA into fixed f32 lanes), but this workspace has no AArch64
//! machine or emulator to test them against their scalar twins, and an untested kernel
//! is worse than a slow one. Until then [`kernel`] returns `None` for every type and
//! [`crate::dispatch::dot_kernel_for`] falls back to [`crate::dot_scalar`], which is
//! correct on every architecture.

use nx_gguf::GgmlType;

use crate::dot_scalar::DotKernel;

/// The NEON kernel of a weight type: none yet (see the module docs).
pub(crate) fn kernel(_weight_type: GgmlType) -> Option<DotKernel> {
    None
}
