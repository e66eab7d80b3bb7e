//! Operating-system services for nx: read-only file mapping, aligned scratch buffers,
//! the CPU capability tier, the worker pool ([`ThreadPool`]) and a read-bandwidth probe.
//!
//! The key design choice: nothing here knows a file format. A [`MappedFile`] hands out
//! bytes; the tier is detected once per process so every kernel family agrees on it.

mod aligned;
mod bandwidth;
mod mapped;
mod pool;
mod tier;

pub use aligned::{Aligned, AlignedBuf, AlignedBytes, Element};
pub use bandwidth::{read_bandwidth, sum_words, ReadBandwidth, PROBE_BYTES};
pub use mapped::{Advice, MappedFile};
pub use pool::{threads_from_env, ThreadPool};
pub use tier::{
    cpu_model, cpu_model_from, cpu_tier, detect_tier, parse_tier_override, request_amx_tile_data,
    CpuTier, TierError,
};
