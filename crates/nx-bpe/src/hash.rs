//! Fast non-cryptographic hashing for token lookups, and an index from token text to id.
//!
//! Token texts are hashed on every merge step, so the hash is a multiply-rotate over
//! 8-byte words (the scheme rustc's `FxHasher` uses). The inputs are a model's own
//! vocabulary and the user's text; flooding attacks are not a concern for a tokenizer
//! that runs in-process.

use std::hash::{BuildHasherDefault, Hasher};

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// Multiply-rotate hasher over 8-byte words.
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// `BuildHasher` for std maps keyed by integers.
pub type FxBuild = BuildHasherDefault<FxHasher>;

/// Hash of a byte string (length folded in).
#[inline]
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(bytes);
    h.add(bytes.len() as u64);
    // Final avalanche so the top bits (used for the slot) depend on every input bit.
    let mut x = h.hash;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

/// All token texts in one buffer: text `i` is `bytes[offsets[i]..offsets[i + 1]]`.
#[derive(Debug, Clone, Default)]
pub struct TextArena {
    bytes: Vec<u8>,
    offsets: Vec<u32>,
}

impl TextArena {
    pub fn with_capacity(n: usize, total_bytes: usize) -> TextArena {
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        TextArena {
            bytes: Vec::with_capacity(total_bytes),
            offsets,
        }
    }

    /// Appends a text; returns false if the arena would exceed 4 GiB.
    pub fn push(&mut self, text: &[u8]) -> bool {
        let end = self.bytes.len() + text.len();
        let Ok(end32) = u32::try_from(end) else {
            return false;
        };
        self.bytes.extend_from_slice(text);
        self.offsets.push(end32);
        true
    }

    #[inline]
    pub fn get(&self, i: usize) -> &[u8] {
        &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    pub fn total_bytes(&self) -> usize {
        self.bytes.len()
    }
}

/// Open-addressing map from byte strings to ids; the strings live in a [`TextArena`] the
/// caller passes to every lookup, so the index itself holds only ids and hash tags.
#[derive(Debug, Clone, Default)]
pub struct TextIndex {
    /// `(tag, id)`; `id == u32::MAX` marks an empty slot. The tag is the low 32 bits of the
    /// hash, compared before the text to skip most mismatches cheaply.
    slots: Vec<(u32, u32)>,
    shift: u32,
}

const EMPTY: u32 = u32::MAX;

impl TextIndex {
    /// An index with room for `n` entries at a load factor of at most one half.
    pub fn with_capacity(n: usize) -> TextIndex {
        let cap = (n.max(4) * 2).next_power_of_two();
        TextIndex {
            slots: vec![(0, EMPTY); cap],
            shift: 64 - cap.trailing_zeros(),
        }
    }

    #[inline]
    fn slot_of(&self, h: u64) -> usize {
        (h >> self.shift) as usize
    }

    /// Inserts `id` for the text `arena.get(id)`; a text already present is re-pointed to
    /// the new id (the last of several identical texts wins, as in the reference).
    pub fn insert_last_wins(&mut self, arena: &TextArena, id: u32) {
        let text = arena.get(id as usize);
        let h = hash_bytes(text);
        let tag = h as u32;
        let mask = self.slots.len() - 1;
        let mut i = self.slot_of(h);
        loop {
            let (t, sid) = self.slots[i];
            if sid == EMPTY {
                self.slots[i] = (tag, id);
                return;
            }
            if t == tag && arena.get(sid as usize) == text {
                self.slots[i].1 = id;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// The id whose text equals `text`, if any.
    #[inline]
    pub fn get(&self, arena: &TextArena, text: &[u8]) -> Option<u32> {
        let h = hash_bytes(text);
        let tag = h as u32;
        let mask = self.slots.len() - 1;
        let mut i = self.slot_of(h);
        loop {
            let (t, sid) = self.slots[i];
            if sid == EMPTY {
                return None;
            }
            if t == tag && arena.get(sid as usize) == text {
                return Some(sid);
            }
            i = (i + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_finds_every_text_and_last_duplicate_wins() {
        let words: Vec<String> = (0..1000)
            .map(|i| format!("w{i}"))
            .chain(["w7".to_string()])
            .collect();
        let mut arena = TextArena::with_capacity(words.len(), 0);
        for w in &words {
            assert!(arena.push(w.as_bytes()));
        }
        let mut idx = TextIndex::with_capacity(words.len());
        for id in 0..words.len() as u32 {
            idx.insert_last_wins(&arena, id);
        }
        for (i, w) in words.iter().enumerate().take(1000) {
            let expect = if w == "w7" { 1000 } else { i as u32 };
            assert_eq!(idx.get(&arena, w.as_bytes()), Some(expect));
        }
        assert_eq!(idx.get(&arena, b"nope"), None);
        assert_eq!(idx.get(&arena, b""), None);
    }

    #[test]
    fn hash_depends_on_length_and_tail() {
        assert_ne!(hash_bytes(b"a"), hash_bytes(b"a\0"));
        assert_ne!(hash_bytes(b"abcdefgh1"), hash_bytes(b"abcdefgh2"));
    }
}
