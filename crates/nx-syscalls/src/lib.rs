//! Operating-system services for nx: a read-only file mapping or a resident huge-page
//! copy of a file, aligned scratch buffers, the CPU capability tier, the worker pool
//! ([`ThreadPool`]) and a read-bandwidth probe.
//!
//! The key design choice: nothing here knows a file format. A [`MappedFile`] or a
//! [`ResidentFile`] hands out bytes; the tier is detected once per process so every kernel family agrees on it.

mod aligned;
mod bandwidth;
mod mapped;
mod pool;
mod resident;
mod tier;

pub use aligned::{Aligned, AlignedBuf, AlignedBytes, Element};
pub use bandwidth::{read_bandwidth, sum_words, ReadBandwidth, PROBE_BYTES};
pub use mapped::{Advice, MappedFile};
pub use pool::{threads_from_env, ThreadPool};
pub use resident::{Placement, ResidentFile, HUGE_PAGE};
pub use tier::{
    cpu_model, cpu_model_from, cpu_tier, detect_tier, parse_tier_override, request_amx_tile_data,
    CpuTier, TierError,
};
