//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): rank-ordered merges over the bytes of
//! each pre-tokenizer piece.
//!
//! The vocabulary stores tokens in the GPT-2 byte alphabet (each byte as one printable
//! code point). Merging works on token ids instead of strings: every text that can appear
//! as a symbol — the 256 byte symbols and both halves and the result of every merge — gets
//! an id (its vocabulary id, or a "virtual" id past the vocabulary when the vocabulary
//! lacks that text), and the merge table maps an id pair to `(rank, merged id)`. This is
//! exactly the string-keyed algorithm, without building strings in the hot loop.
//!
//! Per piece, the lowest-rank adjacent pair is merged first (ties: leftmost), using a
//! binary heap with lazy invalidation, so a piece of n bytes costs O(n log n).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::hash::{FxBuild, TextArena, TextIndex};
use crate::plan::SplitPlan;
use crate::pretok::{PreTokenizerConfig, SplitScratch};
use crate::unicode::{byte_to_unicode_table, unicode_to_byte_table, utf8_len_from_lead};
use crate::vocab::{keys, Vocab};
use crate::TokenizerError;

/// The merge rules and byte alphabet of a byte-level BPE vocabulary.
#[derive(Debug, Clone)]
pub struct BpeModel {
    pub pre: PreTokenizerConfig,
    plan: SplitPlan,
    /// Symbol id of each raw byte.
    byte_ids: [u32; 256],
    /// SentencePiece-style vocabularies ([`PreTokenizerConfig::raw_utf8`]): the ids of
    /// texts that appear in merges but not in the vocabulary, for looking up a
    /// character's symbol, and the `<0xNN>` token of each byte (its fallback).
    virtual_ids: HashMap<Vec<u8>, u32, FxBuild>,
    byte_fallback: [Option<u32>; 256],
    /// `(left << 32) | right` → `(rank << 32) | merged`.
    merges: HashMap<u64, u64, FxBuild>,
    /// Texts of virtual ids (`id - n_vocab`), in the byte alphabet.
    virtual_texts: Vec<Vec<u8>>,
    n_vocab: u32,
    /// Raw-byte form of every token whose text is entirely in the byte alphabet, so a
    /// piece can be looked up without re-encoding it (used by `ignore_merges`).
    raw_texts: TextArena,
    raw_ids: Vec<u32>,
    raw_index: TextIndex,
}

/// Decodes a text in the byte alphabet to raw bytes; `None` if some code point is not in
/// the alphabet.
pub fn alphabet_to_bytes(text: &[u8], inv: &[Option<u8>; 0x144]) -> Option<Vec<u8>> {
    let s = std::str::from_utf8(text).ok()?;
    let mut out = Vec::with_capacity(s.len());
    for ch in s.chars() {
        let b = inv.get(ch as usize).copied().flatten()?;
        out.push(b);
    }
    Some(out)
}

/// Symbol ids while the merges are read: a vocabulary token's own id, or a virtual id past
/// the vocabulary for a text that only the merges name.
struct Symbols<'v> {
    vocab: &'v Vocab,
    n_vocab: u32,
    virtual_ids: HashMap<Vec<u8>, u32, FxBuild>,
    virtual_texts: Vec<Vec<u8>>,
}

impl Symbols<'_> {
    /// The id of `text`, a new virtual one the first time a text outside the vocabulary
    /// is seen.
    fn intern(&mut self, text: &[u8]) -> u32 {
        if let Some(id) = self.vocab.id_of(text) {
            return id;
        }
        if let Some(&id) = self.virtual_ids.get(text) {
            return id;
        }
        let id = self.n_vocab + self.virtual_texts.len() as u32;
        self.virtual_texts.push(text.to_vec());
        self.virtual_ids.insert(text.to_vec(), id);
        id
    }
}

/// `tokenizer.ggml.merges` as `(left << 32) | right` → `(rank << 32) | merged`, the first
/// rule for a pair winning; a line without a separating space is skipped.
fn read_merges(
    md: &nx_gguf::Metadata,
    symbols: &mut Symbols<'_>,
) -> Result<HashMap<u64, u64, FxBuild>, TokenizerError> {
    let merges_list = md.get_str_array(keys::MERGES)?;
    let mut merges = HashMap::with_capacity_and_hasher(merges_list.len(), FxBuild::default());
    let mut joined = Vec::new();
    for (rank, line) in merges_list.iter().enumerate() {
        // "left right": split at the first space after the first byte.
        let bytes = line.as_bytes();
        let Some(sp) = bytes.iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
            continue;
        };
        let (left, right) = (&bytes[..sp], &bytes[sp + 1..]);
        let l = symbols.intern(left);
        let r = symbols.intern(right);
        joined.clear();
        joined.extend_from_slice(left);
        joined.extend_from_slice(right);
        let m = symbols.intern(&joined);
        merges
            .entry(((l as u64) << 32) | r as u64)
            .or_insert(((rank as u64) << 32) | m as u64);
    }
    if symbols.n_vocab as usize + symbols.virtual_texts.len() >= u32::MAX as usize {
        return Err(TokenizerError::BadMetadata {
            key: keys::MERGES,
            reason: "too many distinct merge texts".into(),
        });
    }
    Ok(merges)
}

/// With `ignore_merges`, the raw-byte form of every token whose text is entirely in the
/// byte alphabet, its id, and an index over those forms (all empty otherwise).
fn raw_tokens(vocab: &Vocab, ignore_merges: bool) -> (TextArena, Vec<u32>, TextIndex) {
    let inv = unicode_to_byte_table();
    let (n_raw, raw_bytes) = if ignore_merges {
        (vocab.len(), vocab.texts.total_bytes())
    } else {
        (0, 0)
    };
    let mut raw_texts = TextArena::with_capacity(n_raw, raw_bytes);
    let mut raw_ids = Vec::with_capacity(n_raw);
    for id in 0..vocab.len() as u32 * ignore_merges as u32 {
        if let Some(raw) = alphabet_to_bytes(vocab.text(id), &inv) {
            if !raw_texts.push(&raw) {
                break;
            }
            raw_ids.push(id);
        }
    }
    let mut raw_index = TextIndex::with_capacity(raw_ids.len());
    for i in 0..raw_ids.len() as u32 {
        raw_index.insert_last_wins(&raw_texts, i);
    }
    (raw_texts, raw_ids, raw_index)
}

impl BpeModel {
    pub fn new(
        md: &nx_gguf::Metadata,
        vocab: &Vocab,
        pre: PreTokenizerConfig,
    ) -> Result<BpeModel, TokenizerError> {
        let n_vocab = vocab.len() as u32;
        let mut symbols = Symbols {
            vocab,
            n_vocab,
            virtual_ids: HashMap::default(),
            virtual_texts: Vec::new(),
        };
        let table = byte_to_unicode_table();
        let mut byte_ids = [0u32; 256];
        for (b, ch) in table.iter().enumerate() {
            let mut buf = [0u8; 4];
            byte_ids[b] = symbols.intern(ch.encode_utf8(&mut buf).as_bytes());
        }
        let merges = read_merges(md, &mut symbols)?;
        let plan = SplitPlan::new(&pre)?;
        let Symbols {
            mut virtual_ids,
            virtual_texts,
            ..
        } = symbols;
        let mut byte_fallback = [None; 256];
        if pre.raw_utf8 {
            for (b, slot) in byte_fallback.iter_mut().enumerate() {
                *slot = vocab.id_of(format!("<0x{b:02X}>").as_bytes());
            }
        } else {
            // Only SentencePiece-style vocabularies look characters up by text.
            virtual_ids = HashMap::default();
        }
        let (raw_texts, raw_ids, raw_index) = raw_tokens(vocab, pre.ignore_merges);
        Ok(BpeModel {
            pre,
            plan,
            byte_ids,
            virtual_ids,
            byte_fallback,
            merges,
            virtual_texts,
            n_vocab,
            raw_texts,
            raw_ids,
            raw_index,
        })
    }

    /// The vocabulary id of a raw byte string, if some token decodes to exactly it.
    fn raw_token(&self, piece: &[u8]) -> Option<u32> {
        self.raw_index
            .get(&self.raw_texts, piece)
            .map(|i| self.raw_ids[i as usize])
    }

    #[inline]
    fn merge_of(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.merges
            .get(&(((left as u64) << 32) | right as u64))
            .map(|&v| ((v >> 32) as u32, v as u32))
    }

    /// Pushes the ids of a symbol; a virtual id falls back to the single-byte tokens of its
    /// text, skipping bytes that have none (what the reference does).
    fn push_symbol(&self, vocab: &Vocab, id: u32, out: &mut Vec<u32>) {
        if id < self.n_vocab {
            out.push(id);
            return;
        }
        let text = &self.virtual_texts[(id - self.n_vocab) as usize];
        for &b in text {
            if let Some(t) = vocab.id_of(&[b]) {
                out.push(t);
            }
        }
    }

    /// Encodes one raw text fragment (no special tokens in it).
    pub fn encode_fragment(
        &self,
        vocab: &Vocab,
        text: &[u8],
        work: &mut BpeWork,
        out: &mut Vec<u32>,
    ) {
        if self.pre.raw_utf8 {
            // SentencePiece-style: every space is U+2581 before the text is split.
            let mut escaped = Vec::with_capacity(text.len() + text.len() / 4);
            for &b in text {
                if b == b' ' {
                    escaped.extend_from_slice(SPACE_MARK);
                } else {
                    escaped.push(b);
                }
            }
            return self.encode_pieces(vocab, &escaped, work, out);
        }
        self.encode_pieces(vocab, text, work, out)
    }

    fn encode_pieces(&self, vocab: &Vocab, text: &[u8], work: &mut BpeWork, out: &mut Vec<u32>) {
        let BpeWork { split, merge } = work;
        // Long texts repeat their words; a per-call cache maps a piece to the ids it
        // produced earlier (a range of `out`), keyed by slices of the input itself.
        let mut cache: Option<HashMap<&[u8], (u32, u32), FxBuild>> = (text.len() >= CACHE_MIN_TEXT)
            .then(|| HashMap::with_capacity_and_hasher(1024, FxBuild::default()));
        self.plan.split(text, split, &mut |a, b| {
            let piece = &text[a..b];
            if piece.len() == 1 && !self.pre.raw_utf8 {
                self.push_symbol(vocab, self.byte_ids[piece[0] as usize], out);
                return;
            }
            let Some(cache) = cache.as_mut() else {
                self.encode_piece(vocab, piece, merge, out);
                return;
            };
            if let Some(&(start, len)) = cache.get(piece) {
                out.extend_from_within(start as usize..(start + len) as usize);
                return;
            }
            let start = out.len();
            self.encode_piece(vocab, piece, merge, out);
            if cache.len() < CACHE_MAX_ENTRIES && out.len() <= u32::MAX as usize {
                cache.insert(piece, (start as u32, (out.len() - start) as u32));
            }
        });
    }

    /// BPE-merges one pre-tokenizer piece.
    fn encode_piece(&self, vocab: &Vocab, piece: &[u8], w: &mut MergeWork, out: &mut Vec<u32>) {
        if self.pre.raw_utf8 {
            return self.encode_piece_utf8(vocab, piece, w, out);
        }
        if self.pre.ignore_merges {
            if let Some(id) = self.raw_token(piece) {
                out.push(id);
                return;
            }
        }
        let n = piece.len();
        w.syms.clear();
        for (i, &b) in piece.iter().enumerate() {
            w.syms.push(Sym {
                id: self.byte_ids[b as usize],
                len: 1,
                prev: i as i32 - 1,
                next: if i + 1 < n { i as i32 + 1 } else { -1 },
            });
        }
        self.merge_symbols(w);
        let mut i = 0i32;
        while i >= 0 {
            let s = w.syms[i as usize];
            self.push_symbol(vocab, s.id, out);
            i = s.next;
        }
    }

    /// A SentencePiece-style piece: a run of line feeds that is a token stays whole; else
    /// the symbols are its UTF-8 characters (by lead byte, as the reference cuts them), and
    /// a final symbol the vocabulary lacks falls back to the `<0xNN>` tokens of its bytes.
    fn encode_piece_utf8(
        &self,
        vocab: &Vocab,
        piece: &[u8],
        w: &mut MergeWork,
        out: &mut Vec<u32>,
    ) {
        if piece.iter().all(|&b| b == b'\n') {
            if let Some(id) = vocab.id_of(piece) {
                out.push(id);
                return;
            }
        }
        w.syms.clear();
        let mut at = 0;
        while at < piece.len() {
            let len = utf8_len_from_lead(piece[at]).min(piece.len() - at);
            let ch = &piece[at..at + len];
            let id = vocab
                .id_of(ch)
                .or_else(|| self.virtual_ids.get(ch).copied())
                .unwrap_or(NO_SYMBOL);
            let index = w.syms.len() as i32;
            w.syms.push(Sym {
                id,
                len: len as u32,
                prev: index - 1,
                next: if at + len < piece.len() {
                    index + 1
                } else {
                    -1
                },
            });
            at += len;
        }
        self.merge_symbols(w);
        // Symbols are contiguous in order, so each one's bytes start where the last ended.
        let mut at = 0usize;
        let mut i = 0i32;
        while i >= 0 {
            let s = w.syms[i as usize];
            let bytes = &piece[at..at + s.len as usize];
            if s.id < self.n_vocab {
                out.push(s.id);
            } else {
                out.extend(bytes.iter().filter_map(|&b| self.byte_fallback[b as usize]));
            }
            at += s.len as usize;
            i = s.next;
        }
    }

    /// Merges `w.syms` by rank (lowest first; ties leftmost), in place.
    fn merge_symbols(&self, w: &mut MergeWork) {
        w.heap.clear();
        for i in 0..w.syms.len().saturating_sub(1) {
            self.push_pair(w, i as u32, i as u32 + 1);
        }
        while let Some(Reverse(Cand {
            key,
            right,
            size,
            merged,
        })) = w.heap.pop()
        {
            let left = (key & 0xFFFF_FFFF) as usize;
            let right = right as usize;
            let (ll, rl) = (w.syms[left].len, w.syms[right].len);
            if ll == 0 || rl == 0 || ll + rl != size {
                continue; // stale: one side changed since this pair was queued
            }
            w.syms[left].id = merged;
            w.syms[left].len = ll + rl;
            w.syms[right].len = 0;
            let next = w.syms[right].next;
            w.syms[left].next = next;
            if next >= 0 {
                w.syms[next as usize].prev = left as i32;
            }
            let prev = w.syms[left].prev;
            if prev >= 0 {
                self.push_pair(w, prev as u32, left as u32);
            }
            if next >= 0 {
                self.push_pair(w, left as u32, next as u32);
            }
        }
    }

    #[inline]
    fn push_pair(&self, w: &mut MergeWork, left: u32, right: u32) {
        let (l, r) = (&w.syms[left as usize], &w.syms[right as usize]);
        if let Some((rank, merged)) = self.merge_of(l.id, r.id) {
            w.heap.push(Reverse(Cand {
                key: ((rank as u64) << 32) | left as u64,
                right,
                size: l.len + r.len,
                merged,
            }));
        }
    }
}

/// The symbol of a character that is neither a token nor part of any merge.
const NO_SYMBOL: u32 = u32::MAX;
/// U+2581, the space of SentencePiece-style vocabularies.
const SPACE_MARK: &[u8] = "\u{2581}".as_bytes();

/// Texts at least this long get a per-call piece cache (short texts would pay more for
/// the map than they save).
const CACHE_MIN_TEXT: usize = 2048;
/// Bound on the piece cache, so adversarial input cannot grow it without limit.
const CACHE_MAX_ENTRIES: usize = 1 << 16;

#[derive(Clone, Copy, Debug)]
struct Sym {
    id: u32,
    len: u32,
    prev: i32,
    next: i32,
}

/// A queued merge: ordered by rank, then by left position (both in `key`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Cand {
    key: u64,
    right: u32,
    size: u32,
    merged: u32,
}

#[derive(Default, Debug)]
struct MergeWork {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<Cand>>,
}

/// Reusable buffers for encoding.
#[derive(Default, Debug)]
pub struct BpeWork {
    split: SplitScratch,
    merge: MergeWork,
}
