//! A small xorshift generator for the crate's unit tests (reproducible, no dependency).

/// xorshift64: the state's next value.
pub(crate) struct Bits(pub(crate) u64);

impl Bits {
    /// The next 64 bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
