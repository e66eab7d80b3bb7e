//! 64-byte aligned growable buffers for kernel scratch space.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u8 {}
}

/// The element types of [`Aligned`]: plain numbers whose size divides 64, valid for every
/// bit pattern, with zero as all-zero bytes.
pub trait Element: Copy + sealed::Sealed {}
impl Element for f32 {}
impl Element for u8 {}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A growable buffer of `T` whose first element sits on a 64-byte (cache line) boundary,
/// so SIMD loads at multiples of 64 bytes from its start never split a line (`Vec` promises
/// no more than the allocator's 16 bytes, so where a buffer fell changed from run to run).
/// New elements are zero (unless asked for by [`Aligned::resize_reusing`]); the allocation
/// never shrinks, so a scratch buffer reused across calls stops allocating once it has
/// seen its largest size.
pub struct Aligned<T: Element> {
    lines: Vec<Line>,
    len: usize,
    element: PhantomData<T>,
}

/// 64-byte aligned f32 scratch.
pub type AlignedBuf = Aligned<f32>;
/// 64-byte aligned byte scratch: the kernels' interleaved tiles and unpacked weight rows.
pub type AlignedBytes = Aligned<u8>;

impl<T: Element> Aligned<T> {
    const PER_LINE: usize = 64 / std::mem::size_of::<T>();

    /// A zeroed buffer of `len` elements.
    pub fn zeros(len: usize) -> Self {
        let mut buf = Self::default();
        buf.resize(len);
        buf
    }

    /// Resizes to `len` elements; new elements are zero. Never shrinks the allocation.
    pub fn resize(&mut self, len: usize) {
        self.reserve_lines(len);
        if len > self.len {
            let size = std::mem::size_of::<T>();
            let bytes = self.lines.as_mut_ptr().cast::<u8>();
            // SAFETY: elements `self.len..len` lie within the `need` lines (64 bytes each,
            // `PER_LINE` elements per line); zero bytes are a zero `T` (`Element`).
            unsafe {
                std::ptr::write_bytes(bytes.add(self.len * size), 0, (len - self.len) * size)
            };
        }
        self.len = len;
    }

    /// Resizes to `len` elements without zeroing those that come back into use: they
    /// hold whatever they held last (zero where never written). For a caller that writes
    /// every element before reading any, where [`Self::resize`]'s zeroing is a second
    /// pass over the buffer for nothing.
    pub fn resize_reusing(&mut self, len: usize) {
        self.reserve_lines(len);
        // Every byte of every line is initialized (lines start zeroed and only ever hold
        // elements written since), and every bit pattern is a valid `T` (`Element`).
        self.len = len;
    }

    /// Grows the allocation (zeroed lines) to hold `len` elements.
    fn reserve_lines(&mut self, len: usize) {
        let need = len.div_ceil(Self::PER_LINE);
        if need > self.lines.len() {
            self.lines.resize(need, Line([0; 64]));
        }
    }

    /// Empties the buffer (keeps the allocation).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Element> Default for Aligned<T> {
    fn default() -> Self {
        Aligned {
            lines: Vec::new(),
            len: 0,
            element: PhantomData,
        }
    }
}

impl<T: Element> Clone for Aligned<T> {
    fn clone(&self) -> Self {
        Aligned {
            lines: self.lines.clone(),
            len: self.len,
            element: PhantomData,
        }
    }
}

impl<T: Element> Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `Line` is 64 initialised bytes at a 64-byte boundary with no padding, so
        // `lines` is a contiguous run of `PER_LINE · lines.len()` values of `T` (`Element`:
        // its size divides 64, any bit pattern is valid), and `len` never exceeds that.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Element> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; we hold `&mut self`, so the slice is unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Element> std::fmt::Debug for Aligned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aligned").field("len", &self.len).finish()
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
        b[99] = 7;
        b.clear();
        b.resize(200);
        assert_eq!((b[70], b[99]), (0, 0), "regrown bytes are zero");
        assert_eq!(b.as_ptr() as usize % 64, 0);
    }

    #[test]
    fn reused_bytes_keep_what_they_held() {
        let mut b = AlignedBytes::zeros(100);
        b[70] = 5;
        b.clear();
        b.resize_reusing(130);
        assert_eq!(
            (b.len(), b[70], b[129]),
            (130, 5, 0),
            "old bytes kept, new ones zero"
        );
        assert_eq!(b.as_ptr() as usize % 64, 0);
    }
}
