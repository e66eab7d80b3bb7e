//! 64-byte aligned f32 and byte buffers for kernel scratch space.

use std::ops::{Deref, DerefMut};

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A growable f32 buffer whose first element sits on a 64-byte (cache line) boundary,
/// so SIMD loads of its rows never split a line at the start.
#[derive(Clone, Default)]
pub struct AlignedBuf {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` floats.
    pub fn zeros(len: usize) -> AlignedBuf {
        AlignedBuf {
            lines: vec![Line([0.0; 16]); len.div_ceil(16)],
            len,
        }
    }

    /// Resizes to `len` floats; new elements are zero. Never shrinks the allocation, so a
    /// scratch buffer reused across calls stops allocating once it has seen its largest size.
    pub fn resize(&mut self, len: usize) {
        let need = len.div_ceil(16);
        if need > self.lines.len() {
            self.lines.resize(need, Line([0.0; 16]));
        }
        if len > self.len {
            let old = self.len;
            self.len = len;
            self[old..].fill(0.0);
        }
        self.len = len;
    }

    /// Number of floats.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no floats.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Deref for AlignedBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `Line` is repr(C) of 16 f32s with no padding, so `lines` is a contiguous
        // run of `16 * lines.len()` initialised f32s and `len` never exceeds that.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`; we hold `&mut self`, so the slice is unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish()
    }
}

/// A growable byte buffer whose first byte sits on a 64-byte (cache line) boundary: the
/// kernels' interleaved tiles and unpacked weight rows, read with 64-byte loads at
/// multiples of 64 from the start, so no load splits a line (`Vec<u8>` promises no more
/// than the allocator's 16 bytes, so where a buffer fell changed from run to run).
#[derive(Clone, Default)]
pub struct AlignedBytes {
    lines: Vec<ByteLine>,
    len: usize,
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct ByteLine([u8; 64]);

impl AlignedBytes {
    /// Resizes to `len` bytes; new bytes are zero. Never shrinks the allocation.
    pub fn resize(&mut self, len: usize) {
        let need = len.div_ceil(64);
        if need > self.lines.len() {
            self.lines.resize(need, ByteLine([0; 64]));
        }
        if len > self.len {
            let old = self.len;
            self.len = len;
            self[old..].fill(0);
        }
        self.len = len;
    }

    /// Empties the buffer (keeps the allocation).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl Deref for AlignedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ByteLine` is repr(C) of 64 bytes with no padding, so `lines` is a
        // contiguous run of `64 * lines.len()` initialised bytes and `len` never exceeds it.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) }
    }
}

impl DerefMut for AlignedBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; we hold `&mut self`, so the slice is unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBytes")
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let mut b = AlignedBuf::zeros(33);
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert!(b.iter().all(|&x| x == 0.0));
        b[32] = 5.0;
        b.resize(10);
        b.resize(40);
        assert_eq!(b.len(), 40);
        assert_eq!(b[32], 0.0, "regrown elements are zero");
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert!(AlignedBuf::default().is_empty());
    }

    #[test]
    fn bytes_aligned_and_zeroed() {
        let mut b = AlignedBytes::default();
        b.resize(100);
        assert_eq!((b.len(), b.as_ptr() as usize % 64), (100, 0));
        assert!(b.iter().all(|&x| x == 0));
        b[70] = 5;
        b.clear();
        b.resize(200);
        assert_eq!(b[70], 0, "regrown bytes are zero");
        assert_eq!(b.as_ptr() as usize % 64, 0);
    }
}
