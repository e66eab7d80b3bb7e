//! Splitting input text around special tokens (control, user-defined, unknown) before
//! the tokenizer proper sees it.
//!
//! The reference's rule: take the matchable special tokens longest text first; for each,
//! cut every remaining plain-text fragment at that token's leftmost non-overlapping
//! occurrences. User-defined tokens are always matchable; control and unknown tokens only
//! with `parse_special`. Running that loop over all of Gemma's 6 414 special tokens would
//! scan the text thousands of times, so this matcher first finds which special tokens
//! occur at all (one pass with a byte trie), then runs the same loop over just those,
//! with a substring search limited to the gaps left between tokens already placed.

use memchr::memmem;

use crate::vocab::{attr, Vocab};

/// A piece of partitioned input: plain text (a byte range) or a special token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment {
    Text { start: usize, end: usize },
    Token(u32),
}

#[derive(Debug, Clone, Default)]
struct Node {
    /// Sorted by byte.
    children: Vec<(u8, u32)>,
    /// Index into `SpecialMatcher::tokens` of the special token ending here, or `u32::MAX`.
    special: u32,
}

/// Finds special tokens in text.
#[derive(Debug, Clone)]
pub struct SpecialMatcher {
    /// `(id, matchable without parse_special)`, in priority order: longer text first,
    /// then lower id.
    tokens: Vec<(u32, bool)>,
    nodes: Vec<Node>,
    /// Child of the root for each first byte (`u32::MAX` if none).
    root: [u32; 256],
}

const NONE: u32 = u32::MAX;

impl SpecialMatcher {
    pub fn new(vocab: &Vocab) -> SpecialMatcher {
        let mut tokens: Vec<(u32, bool)> = (0..vocab.len() as u32)
            .filter(|&id| vocab.attrs[id as usize] & attr::SPECIAL_MATCHABLE != 0)
            .map(|id| {
                let a = vocab.attrs[id as usize];
                (id, a & (attr::CONTROL | attr::UNKNOWN) == 0)
            })
            .collect();
        tokens.sort_by(|a, b| {
            vocab
                .text(b.0)
                .len()
                .cmp(&vocab.text(a.0).len())
                .then(a.0.cmp(&b.0))
        });

        let mut nodes = vec![Node {
            children: Vec::new(),
            special: NONE,
        }];
        for (k, &(id, _)) in tokens.iter().enumerate() {
            let mut cur = 0usize;
            for &b in vocab.text(id) {
                cur = match nodes[cur].children.binary_search_by_key(&b, |c| c.0) {
                    Ok(i) => nodes[cur].children[i].1 as usize,
                    Err(i) => {
                        let new = nodes.len() as u32;
                        nodes.push(Node {
                            children: Vec::new(),
                            special: NONE,
                        });
                        nodes[cur].children.insert(i, (b, new));
                        new as usize
                    }
                };
            }
            // Identical texts: the first in priority order claims every occurrence.
            if nodes[cur].special == NONE {
                nodes[cur].special = k as u32;
            }
        }
        let mut root = [NONE; 256];
        for &(b, child) in &nodes[0].children {
            root[b as usize] = child;
        }
        SpecialMatcher {
            tokens,
            nodes,
            root,
        }
    }

    /// Splits `text` into plain-text fragments and special tokens, in order.
    pub fn partition(
        &self,
        vocab: &Vocab,
        text: &[u8],
        parse_special: bool,
        out: &mut Vec<Fragment>,
    ) {
        out.clear();
        if text.is_empty() {
            return;
        }
        let Some(present) = self.present(text, parse_special) else {
            out.push(Fragment::Text {
                start: 0,
                end: text.len(),
            });
            return;
        };
        let placed = self.place(vocab, text, &present);
        let mut pos = 0usize;
        for &(s, e, id) in &placed {
            if s > pos {
                out.push(Fragment::Text { start: pos, end: s });
            }
            out.push(Fragment::Token(id));
            pos = e;
        }
        if pos < text.len() {
            out.push(Fragment::Text {
                start: pos,
                end: text.len(),
            });
        }
    }

    /// Pass 1: which special tokens occur anywhere in `text` (bit `k` = `tokens[k]`), among
    /// those allowed (all with `parse_special`, else the always-parsed ones); `None` when
    /// none does.
    fn present(&self, text: &[u8], parse_special: bool) -> Option<Vec<u64>> {
        let mut present = vec![0u64; self.tokens.len().div_ceil(64)];
        let mut any = false;
        for i in 0..text.len() {
            let mut node = self.root[text[i] as usize];
            let mut j = i + 1;
            while node != NONE {
                let n = &self.nodes[node as usize];
                if n.special != NONE {
                    let k = n.special as usize;
                    if parse_special || self.tokens[k].1 {
                        present[k / 64] |= 1 << (k % 64);
                        any = true;
                    }
                }
                if j >= text.len() {
                    break;
                }
                node = match n.children.binary_search_by_key(&text[j], |c| c.0) {
                    Ok(c) => n.children[c].1,
                    Err(_) => NONE,
                };
                j += 1;
            }
        }
        any.then_some(present)
    }

    /// Pass 2: in priority order, each present token placed at its leftmost
    /// non-overlapping occurrences inside the gaps between the tokens already placed, as
    /// `(start, end, id)` in text order.
    fn place(&self, vocab: &Vocab, text: &[u8], present: &[u64]) -> Vec<(usize, usize, u32)> {
        let mut placed: Vec<(usize, usize, u32)> = Vec::new();
        let mut next: Vec<(usize, usize, u32)> = Vec::new();
        for (word, bits) in present.iter().enumerate() {
            let mut bits = *bits;
            while bits != 0 {
                let k = word * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let id = self.tokens[k].0;
                let needle = vocab.text(id);
                let finder = memmem::Finder::new(needle);
                next.clear();
                let mut gap_start = 0usize;
                for idx in 0..=placed.len() {
                    let gap_end = placed.get(idx).map_or(text.len(), |p| p.0);
                    let mut pos = gap_start;
                    while gap_end - pos >= needle.len() {
                        match finder.find(&text[pos..gap_end]) {
                            Some(off) => {
                                next.push((pos + off, pos + off + needle.len(), id));
                                pos += off + needle.len();
                            }
                            None => break,
                        }
                    }
                    if let Some(&p) = placed.get(idx) {
                        next.push(p);
                        gap_start = p.1;
                    }
                }
                std::mem::swap(&mut placed, &mut next);
            }
        }
        placed
    }
}
