//! SentencePiece BPE (`tokenizer.ggml.model = "llama"`): score-driven merges over the
//! characters of a whole text fragment, spaces escaped as U+2581, `<0xNN>` byte fallback.
//!
//! Starting from one symbol per UTF-8 character, the adjacent pair whose concatenation is
//! the vocabulary token with the highest score is merged first (ties: leftmost), until no
//! adjacent pair forms a token. A remaining symbol that is not a token (a character
//! outside the vocabulary) is emitted as its bytes' `<0xNN>` tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::unicode::utf8_len_from_lead;
use crate::vocab::Vocab;
use crate::TokenizerError;

/// U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's stand-in for a space.
pub const SPACE_MARK: &[u8] = "\u{2581}".as_bytes();

/// Byte fallback and space handling of a SentencePiece vocabulary.
#[derive(Debug, Clone)]
pub struct SpmModel {
    /// Token for each byte: `<0xNN>`, else the byte itself as a one-byte token.
    byte_ids: [Option<u32>; 256],
    /// Prefix a space to text at the start and after each special token.
    pub add_space_prefix: bool,
}

#[derive(Clone, Copy, Debug)]
struct Sym {
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
    /// Token id once merged; `u32::MAX` for an unmerged character (looked up at the end).
    id: u32,
}

#[derive(Clone, Copy, Debug)]
struct Cand {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
    id: u32,
}

impl PartialEq for Cand {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Cand {}
impl PartialOrd for Cand {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Cand {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Reusable buffers for encoding.
#[derive(Default, Debug)]
pub struct SpmWork {
    text: Vec<u8>,
    syms: Vec<Sym>,
    heap: BinaryHeap<Cand>,
}

impl SpmModel {
    pub fn new(vocab: &Vocab, add_space_prefix: bool) -> SpmModel {
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = vocab
                .id_of(hex.as_bytes())
                .or_else(|| vocab.id_of(&[b as u8]));
        }
        SpmModel {
            byte_ids,
            add_space_prefix,
        }
    }

    /// Encodes one text fragment (valid UTF-8, no special tokens in it).
    pub fn encode_fragment(
        &self,
        vocab: &Vocab,
        fragment: &[u8],
        space_prefix: bool,
        w: &mut SpmWork,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        w.text.clear();
        if space_prefix {
            w.text.extend_from_slice(SPACE_MARK);
        }
        for &b in fragment {
            if b == b' ' {
                w.text.extend_from_slice(SPACE_MARK);
            } else {
                w.text.push(b);
            }
        }
        let text = &w.text;
        let n_bytes = text.len();
        if n_bytes > i32::MAX as usize {
            return Err(TokenizerError::InputTooLong {
                len: fragment.len(),
            });
        }

        char_symbols(text, &mut w.syms);
        merge_best_pairs(vocab, text, &mut w.syms, &mut w.heap);

        if w.syms.is_empty() {
            return Ok(());
        }
        let mut i = 0i32;
        while i >= 0 {
            let s = w.syms[i as usize];
            i = s.next;
            if s.id != u32::MAX {
                out.push(s.id);
                continue;
            }
            let piece = &text[s.start as usize..(s.start + s.len) as usize];
            if let Some(id) = vocab.id_of(piece) {
                out.push(id);
                continue;
            }
            for &b in piece {
                match self.byte_ids[b as usize].or(vocab.unk) {
                    Some(id) => out.push(id),
                    None => return Err(TokenizerError::NoByteToken { byte: b }),
                }
            }
        }
        Ok(())
    }
}

/// One symbol per UTF-8 character of `text` (a truncated last character keeps the bytes
/// that are there), linked to its neighbours.
fn char_symbols(text: &[u8], syms: &mut Vec<Sym>) {
    let n_bytes = text.len();
    syms.clear();
    let mut off = 0usize;
    while off < n_bytes {
        let len = utf8_len_from_lead(text[off]).min(n_bytes - off);
        let idx = syms.len() as i32;
        syms.push(Sym {
            start: off as u32,
            len: len as u32,
            prev: idx - 1,
            next: if off + len < n_bytes { idx + 1 } else { -1 },
            id: u32::MAX,
        });
        off += len;
    }
}

/// Merges neighbouring symbols, best-scored pair first, while a merge forms a vocabulary
/// token; a merged-away symbol keeps length 0 and a stale candidate is skipped.
fn merge_best_pairs(vocab: &Vocab, text: &[u8], syms: &mut [Sym], heap: &mut BinaryHeap<Cand>) {
    heap.clear();
    for i in 1..syms.len() {
        push_pair(vocab, text, syms, heap, i - 1, i);
    }
    while let Some(c) = heap.pop() {
        let (left, right) = (c.left as usize, c.right as usize);
        let (ll, rl) = (syms[left].len, syms[right].len);
        if ll == 0 || rl == 0 || ll + rl != c.size {
            continue; // stale
        }
        syms[left].len = ll + rl;
        syms[left].id = c.id;
        syms[right].len = 0;
        let next = syms[right].next;
        syms[left].next = next;
        if next >= 0 {
            syms[next as usize].prev = left as i32;
        }
        let prev = syms[left].prev;
        if prev >= 0 {
            push_pair(vocab, text, syms, heap, prev as usize, left);
        }
        if next >= 0 {
            push_pair(vocab, text, syms, heap, left, next as usize);
        }
    }
}

#[inline]
fn push_pair(
    vocab: &Vocab,
    text: &[u8],
    syms: &[Sym],
    heap: &mut BinaryHeap<Cand>,
    left: usize,
    right: usize,
) {
    let (l, r) = (&syms[left], &syms[right]);
    let size = l.len + r.len;
    let start = l.start as usize;
    if let Some(id) = vocab.id_of(&text[start..start + size as usize]) {
        heap.push(Cand {
            score: vocab.scores[id as usize],
            left: left as u32,
            right: right as u32,
            size,
            id,
        });
    }
}
