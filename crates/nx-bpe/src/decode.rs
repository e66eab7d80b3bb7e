//! Streaming detokenization that only ever yields complete UTF-8.
//!
//! A token's bytes can end in the middle of a character (byte-fallback tokens, or
//! byte-level BPE tokens that split a multi-byte character). The stream decoder holds such
//! an incomplete tail back until later tokens complete it, so a character split across
//! tokens is emitted whole and never as U+FFFD. Bytes that can never become valid UTF-8
//! are emitted as U+FFFD as soon as that is certain.

use crate::{Tokenizer, TokenizerError};

/// Turns a stream of token ids into text, one token at a time.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    pending: Vec<u8>,
}

/// [`StreamDecoder`] without the borrow: the tokenizer is passed to each
/// [`DetachedDecoder::push`], so the decoder can live beside an `Arc<Tokenizer>` (one per
/// sequence of a server).
#[derive(Debug, Clone, Default)]
pub struct DetachedDecoder {
    pending: Vec<u8>,
}

impl DetachedDecoder {
    /// An empty decoder.
    pub fn new() -> DetachedDecoder {
        DetachedDecoder::default()
    }

    /// Adds one token of `tokenizer`; returns the text that is now complete.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        let mut d = StreamDecoder {
            tokenizer,
            pending: std::mem::take(&mut self.pending),
        };
        let out = d.push(id);
        self.pending = d.pending;
        out
    }

    /// Ends the stream: any held-back incomplete character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

impl<'t> StreamDecoder<'t> {
    pub(crate) fn new(tokenizer: &'t Tokenizer) -> StreamDecoder<'t> {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let piece = self.tokenizer.token_to_piece(id)?;
        self.pending.extend_from_slice(piece);
        Ok(self.take_complete())
    }

    /// Bytes held back because they end in an incomplete character.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: any held-back incomplete character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `good` is the prefix from_utf8 validated, so this never falls back.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        // Invalid whatever follows: replace it and go on.
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &bad[n..];
                        }
                        // A valid prefix of a character: wait for more bytes.
                        None => {
                            rest = bad;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop_n = self.pending.len() - keep;
        self.pending.drain(..drop_n);
        out
    }
}
