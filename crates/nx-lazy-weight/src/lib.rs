//! Lazy typed views of quantized tensors inside the mapping; block formats and quantized matmul.
//!
//! Layout of the crate, one concern per module:
//! - [`formats`]: block layouts and byte sizes of the supported ggml types, the
//!   activation type each weight type is multiplied with (`vec_dot_type`), and the
//!   formats that are one module each (Q4_1, Q5_1, Q8_1, Q2_K, Q3_K, IQ4_NL, IQ4_XS,
//!   MXFP4, TQ2_0, TQ1_0: layout, dequantization, scalar dot, quantizer) in one table.
//! - [`dequant`]: `dequantize_row` per type, bit-exact with ggml's dequantizers.
//! - [`quant`]: activation quantizers (Q8_0, Q8_K, F16, BF16), bit-exact with ggml's
//!   reference quantizers, and weight quantizers used to build fixtures.
//! - [`dot_scalar`]: scalar reference dot products in the float order of the reference
//!   engine's x86 kernels (`reduce`: the shared lane and reduction helpers).
//! - `avx2`, `avx512` (x86-64), `neon` (AArch64, a scalar fallback for now): SIMD
//!   twins of the quantized dot products, bit-identical to the scalar ones.
//! - [`tier`]: the process tier ([`active_tier`], from `nx_syscalls::cpu_tier`) and the
//!   tiers this CPU can run.
//! - [`dispatch`]: the kernel of a weight type for a [`CpuTier`], and [`dot_row`].
//! - [`plan`]: the kernel plan, the one place that decides which of the bit-identical
//!   implementations (tier, one-row or four-row, four tokens, groups, tiles, AMX) runs
//!   each format's decode and prefill matmuls; [`tune::tune`] times them on a model.
//! - [`mod@matmul`]: quantize activations once, then `y[t][r] = dot(w row r, xq[t])`.
//! - `tiled` (x86-64): the prefill matmul on AVX-512 VNNI with sixteen tokens per
//!   register, each output still bit-identical to the per-output kernels.
//! - [`lazy`]: [`LazyWeight`], a borrowed view of one tensor's bytes.
//! - `bounded`: [`BoundedHead`], the rows that can be among each token's few largest outputs
//!   (with their exact outputs) from one bounded pass, for LM head rows of greedy and
//!   top-k choices.
//!
//! Batch invariance: every output element is one call of a dot product whose
//! reduction order depends on the row length K alone, so the value of `y[t][r]`
//! does not depend on how many tokens or which weight rows are computed together.

// Block kernels index several arrays with one position (weights, quants, lanes) to
// mirror the block layouts; iterator chains would hide that correspondence.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "x86_64")]
mod act_tiles;
#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_rows4;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod bf16_x86;
#[cfg(target_arch = "x86_64")]
mod block32_x86;
mod bounded;
pub mod dequant;
pub mod dispatch;
pub mod dot_scalar;
mod error;
pub mod formats;
#[cfg(target_arch = "x86_64")]
mod grids_avx512;
#[cfg(target_arch = "x86_64")]
mod groups_avx2;
#[cfg(target_arch = "x86_64")]
mod kgroups_avx2;
pub mod lazy;
pub mod matmul;
#[cfg(target_arch = "x86_64")]
mod narrow;
#[cfg(target_arch = "x86_64")]
mod narrow_k;
#[cfg(target_arch = "aarch64")]
mod neon;
pub mod plan;
pub mod quant;
mod reduce;
#[cfg(target_arch = "x86_64")]
mod scalar_x86;
#[cfg(test)]
mod test_bits;
pub mod tier;
#[cfg(target_arch = "x86_64")]
mod tiled;
#[cfg(target_arch = "x86_64")]
mod transpose;
pub mod tune;

pub use bounded::{
    has_bounded_kernel, min_bounded_tokens, BoundedHead, BoundedKernel, BoundedScratch, Candidates,
    MAX_EXTRA_CANDIDATES,
};
pub use dequant::dequantize_row;
pub use dispatch::{
    dot_kernel4_for, dot_kernel_for, dot_kernel_rows4_for, dot_row, DotKernel4, DotKernelRows4,
};
pub use dot_scalar::DotKernel;
pub use error::LazyWeightError;
pub use formats::{is_supported_weight, row_bytes, vec_dot_type};
pub use lazy::LazyWeight;
pub use matmul::{
    matmul, matmul_batch_pool, matmul_pool, matmul_quantized, matmul_quantized_pool,
    matmul_quantized_pool_with, matmul_rows, uses_tiled_kernels, MatmulJob, QuantizedActs,
};
pub use nx_gguf::GgmlType;
pub use nx_syscalls::CpuTier;
pub use plan::{active_plan, KernelPlan, PlanError};
pub use quant::{quantize_row, quantize_row_q8_0, quantize_row_q8_k};
pub use tier::{active_tier, supported_tiers};
