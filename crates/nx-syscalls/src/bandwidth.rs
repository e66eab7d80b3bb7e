//! A plain read's bandwidth: the bound decoding is measured against.
//!
//! Decoding one token streams every weight once, so `weight bytes per token × tokens/s`
//! can at best reach what summing a buffer far larger than the caches reaches on the same
//! threads. `nx bench` and `cargo xtask bench` both report this probe beside decode.

use std::time::Instant;

/// Size of the buffer the probe sums by default: far larger than any cache.
pub const PROBE_BYTES: usize = 1 << 30;

/// Wrapping sum of `words`, with eight independent accumulators so the loop is limited by
/// memory, not by one dependency chain.
pub fn sum_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let chunks = words.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (a, w) in acc.iter_mut().zip(chunk) {
            *a = a.wrapping_add(*w);
        }
    }
    let mut total = acc.iter().fold(0u64, |s, a| s.wrapping_add(*a));
    for w in rest {
        total = total.wrapping_add(*w);
    }
    total
}

/// Best-of-3 read bandwidth (GB/s, 10^9 bytes per second) of summing `words`, split over
/// `threads` threads.
fn best_read_gbs(words: &[u64], threads: usize) -> f64 {
    let per_thread = words.len().div_ceil(threads.max(1)).max(1);
    let mut best = 0.0f64;
    for _ in 0..3 {
        let started = Instant::now();
        let total = std::thread::scope(|scope| {
            let handles: Vec<_> = words
                .chunks(per_thread)
                .map(|part| scope.spawn(move || sum_words(std::hint::black_box(part))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(total);
        let secs = started.elapsed().as_secs_f64();
        if secs > 0.0 {
            best = best.max(std::mem::size_of_val(words) as f64 / secs / 1e9);
        }
    }
    best
}

/// The read-bandwidth probe's result (GB/s = 10^9 bytes per second, best of 3 passes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadBandwidth {
    /// Bytes summed per pass.
    pub buffer_bytes: usize,
    /// One thread.
    pub single_thread_gbs: f64,
    /// Threads of the second measurement.
    pub threads: usize,
    /// `threads` threads.
    pub multi_thread_gbs: f64,
}

/// Sums a `bytes`-byte buffer of `u64` with 1 and with `threads` threads (best of 3 each).
pub fn read_bandwidth(bytes: usize, threads: usize) -> ReadBandwidth {
    // Non-zero contents: an all-zero allocation could be backed by the shared zero page
    // and never touch memory. On huge pages where the kernel has them, as the resident
    // weights are (`ResidentFile`): a plain read at its best.
    let n_words = bytes / 8;
    let mut words: Vec<u64> = Vec::with_capacity(n_words);
    crate::resident::advise_huge_pages(words.as_ptr().cast(), n_words * 8);
    words.extend((0..n_words).map(|i| i as u64 | 1));
    ReadBandwidth {
        buffer_bytes: words.len() * 8,
        single_thread_gbs: best_read_gbs(&words, 1),
        threads,
        multi_thread_gbs: best_read_gbs(&words, threads),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_words_matches_a_plain_sum() {
        for len in [0usize, 1, 7, 8, 9, 1000, 1003] {
            let words: Vec<u64> = (0..len as u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect();
            let plain = words.iter().fold(0u64, |s, w| s.wrapping_add(*w));
            assert_eq!(sum_words(&words), plain, "len {len}");
        }
    }

    #[test]
    fn probe_reports_positive_bandwidth() {
        let probe = read_bandwidth(8 << 20, 2);
        assert_eq!(probe.buffer_bytes, 8 << 20);
        assert!(probe.single_thread_gbs > 0.0 && probe.single_thread_gbs.is_finite());
        assert!(probe.multi_thread_gbs > 0.0 && probe.multi_thread_gbs.is_finite());
    }
}
