//! Typed errors of nx-lazy-weight.

use nx_gguf::GgmlType;

/// Everything that can go wrong when viewing, dequantizing or multiplying a weight.
///
/// Bad input (a tensor whose bytes do not match its shape, a type nx cannot
/// compute with, buffers of the wrong length) is reported here, never by a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LazyWeightError {
    /// The ggml type is known to GGUF but this crate cannot do `op` with it.
    #[error("{op}: ggml type {} is not supported", .ggml_type.name())]
    UnsupportedType {
        /// The offending type.
        ggml_type: GgmlType,
        /// What was attempted ("dequantize", "matmul", "quantize", ...).
        op: &'static str,
    },
    /// A named tensor's type is one nx cannot compute with.
    #[error(
        "tensor `{name}` has ggml type {}, which nx cannot compute with (it reads {supported})",
        .ggml_type.name()
    )]
    UnsupportedTensorType {
        /// Tensor name.
        name: String,
        /// The tensor's type.
        ggml_type: GgmlType,
        /// The weight types nx computes with, comma-separated.
        supported: String,
    },
    /// A row length is not a whole number of the type's blocks.
    #[error("row length {row_len} is not a multiple of the {} block size {block_size}", .ggml_type.name())]
    NotBlockMultiple {
        /// The type whose block size applies.
        ggml_type: GgmlType,
        /// The row length (elements).
        row_len: u64,
        /// Elements per block of `ggml_type`.
        block_size: usize,
    },
    /// A tensor's byte slice does not have the length its shape and type imply.
    #[error("tensor `{name}`: {actual} bytes, but shape {ne:?} of type {} needs {expected}", .ggml_type.name())]
    TensorBytes {
        /// Tensor name (empty when built from parts).
        name: String,
        /// The tensor's type.
        ggml_type: GgmlType,
        /// The tensor's shape, `ne[0]` first.
        ne: Vec<u64>,
        /// Bytes the shape implies.
        expected: u64,
        /// Bytes given.
        actual: u64,
    },
    /// A tensor shape is unusable (no dimensions, more than four, a zero-sized
    /// dimension, or a size that overflows).
    #[error("bad shape {ne:?}: {reason}")]
    BadShape {
        /// The shape, `ne[0]` first.
        ne: Vec<u64>,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// A buffer passed to a function has the wrong length.
    #[error("{what}: expected length {expected}, got {actual}")]
    LengthMismatch {
        /// Which buffer.
        what: &'static str,
        /// The length required.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// Quantized activations of one type were given to a weight that needs another.
    #[error("activations are {}, but weights of type {} need {}", .actual.name(), .weight.name(), .expected.name())]
    ActivationType {
        /// The weight's type.
        weight: GgmlType,
        /// The activation type the weight's dot product needs.
        expected: GgmlType,
        /// The activation type given.
        actual: GgmlType,
    },
    /// `NX_TIER` asks for a kernel tier this CPU cannot run (or is not a tier name).
    #[error("kernel tier: {0}")]
    Tier(#[from] nx_syscalls::TierError),
    /// An `NX_PLAN` or kernel plan this process cannot use.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// A row index past the end of the tensor.
    #[error("row {row} out of range: tensor has {n_rows} rows")]
    RowOutOfRange {
        /// The requested row.
        row: usize,
        /// Rows in the tensor.
        n_rows: usize,
    },
    /// An [`crate::BoundedHead`] was given a weight other than the one it was built for.
    #[error("argmax head: built for another weight ({built} bytes at another address or of another shape)")]
    OtherWeight {
        /// Bytes of the weight it was built for.
        built: usize,
    },
}

/// A bad `NX_PLAN` item or a choice this CPU (or `NX_TIER`, `NX_AMX`) cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// An item that is not `FORMAT.ROLE=KERNEL`, or names no format, role or kernel.
    #[error("NX_PLAN item `{item}`: {reason}")]
    BadItem {
        /// The item as given.
        item: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A kernel that exists but cannot run here for this format.
    #[error("NX_PLAN: {kernel} cannot run {role} matmuls of {} here (eligible: {eligible})", .format.name())]
    NotEligible {
        /// The weight format.
        format: GgmlType,
        /// The role.
        role: &'static str,
        /// The kernel asked for.
        kernel: String,
        /// The kernels that can.
        eligible: String,
    },
}
