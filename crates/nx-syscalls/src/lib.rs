//! Operating-system services for nx: read-only file mapping, aligned scratch buffers,
//! the CPU capability tier and the worker pool ([`ThreadPool`]).
//!
//! The key design choice: nothing here knows a file format. A [`MappedFile`] hands out
//! bytes; the tier is detected once per process so every kernel family agrees on it.

mod aligned;
mod mapped;
mod pool;
mod tier;

pub use aligned::AlignedBuf;
pub use mapped::{Advice, MappedFile};
pub use pool::{threads_from_env, ThreadPool};
pub use tier::{
    cpu_tier, detect_tier, parse_tier_override, request_amx_tile_data, CpuTier, TierError,
};
