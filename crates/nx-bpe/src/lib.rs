//! Tokenizers from GGUF metadata: byte-level BPE and SentencePiece.
//!
//! [`Tokenizer::from_gguf`] reads `tokenizer.ggml.*` and builds either
//! - **byte-level BPE** (`tokenizer.ggml.model = "gpt2"`): the text is cut by the
//!   pre-tokenizer that `tokenizer.ggml.pre` names ([`PreTokenizer`]), and each piece's
//!   bytes are merged by rank (`tokenizer.ggml.merges`); or
//! - **SentencePiece** (`"llama"`): spaces become U+2581, characters merge by token score
//!   (`tokenizer.ggml.scores`), characters outside the vocabulary fall back to `<0xNN>`.
//!
//! Both first cut the input around special tokens ([`EncodeOptions::parse_special`]).
//! Token ids match llama.cpp's tokenizer for the same GGUF, including its edge cases.
//!
//! Decoding: [`Tokenizer::decode`] concatenates token pieces (raw bytes);
//! [`StreamDecoder`] yields text only once characters are complete.
//!
//! Round trip: `decode(encode(s)) == s` for byte-level BPE. For SentencePiece with
//! `add_space_prefix` (the metadata flag, default true), a non-empty text — and every
//! text fragment after a special token — gains one leading space:
//! `decode(encode(s)) == " " + s`. SentencePiece also reads a literal U+2581 in the input
//! as the space it stands for, so such a character decodes as `' '`.

mod bpe;
mod decode;
mod error;
mod hash;
mod plan;
mod pretok;
mod regex;
mod special;
mod spm;
mod unicode;
mod vocab;

use nx_gguf::{Gguf, Metadata};

pub use decode::{DetachedDecoder, StreamDecoder};
pub use error::TokenizerError;
pub use plan::NAMES as PRE_TOKENIZER_NAMES;
pub use pretok::{PreTokenizer, PreTokenizerConfig, SplitScratch};
pub use vocab::TokenType;

use bpe::{alphabet_to_bytes, BpeModel, BpeWork};
use hash::TextArena;
use special::{Fragment, SpecialMatcher};
use spm::{SpmModel, SpmWork, SPACE_MARK};
use unicode::unicode_to_byte_table;
use vocab::{attr, keys, optional, parse_byte_token, Vocab};

/// The longest input one encode call accepts.
pub const MAX_INPUT_BYTES: usize = (i32::MAX / 3) as usize;

/// Options for [`Tokenizer::encode`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add BOS / EOS as the vocabulary asks (`tokenizer.ggml.add_bos_token`, ...).
    pub add_special: bool,
    /// Match control and unknown tokens (e.g. `<|im_start|>`, `<start_of_turn>`) written
    /// in the text as those tokens. Without it they are plain text. User-defined tokens
    /// are matched either way.
    pub parse_special: bool,
}

/// Which algorithm a tokenizer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// Byte-level BPE with the named pre-tokenizer.
    ByteLevelBpe(PreTokenizer),
    /// SentencePiece BPE.
    SentencePiece,
}

#[derive(Debug, Clone)]
enum Model {
    Bpe(Box<BpeModel>),
    Spm(Box<SpmModel>),
}

/// A tokenizer built from GGUF metadata. Token ids are `u32` indices into the vocabulary.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    special: SpecialMatcher,
    /// Decoded bytes of each token.
    pieces: TextArena,
    add_bos: bool,
    add_eos: bool,
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file (a model or a vocab-only file) describes.
    pub fn from_gguf(gguf: &Gguf) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_metadata(gguf.metadata())
    }

    /// Builds the tokenizer from `tokenizer.ggml.*` metadata.
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let model_name = md.get_str(keys::MODEL)?;
        match model_name {
            "gpt2" | "gemma4" => {
                // A `gemma4` tokenizer always runs the Gemma 4 split, whatever the file's
                // `tokenizer.ggml.pre` says, and has no default special ids.
                let (pre_name, defaults) = if model_name == "gemma4" {
                    ("gemma4", None)
                } else {
                    let pre = optional(md, keys::PRE, Metadata::get_str)?.unwrap_or("default");
                    // The reference's defaults for byte-level BPE vocabularies (id 11 is
                    // GPT-2's historical BOS/EOS); the file normally overrides them.
                    (pre, Some(11))
                };
                let pre = PreTokenizer::from_name(pre_name).ok_or_else(|| {
                    TokenizerError::UnsupportedPreTokenizer {
                        name: pre_name.to_string(),
                        supported: plan::supported_names(),
                    }
                })?;
                let vocab = Vocab::load(md, defaults, defaults, None)?;
                let model = BpeModel::new(md, &vocab, pre)?;
                let mut add_bos =
                    optional(md, keys::ADD_BOS, Metadata::get_bool)?.unwrap_or(pre.add_bos_default);
                // The reference turns BOS on for Gemma 4's split even when the file says no.
                add_bos |= matches!(pre.name, "gemma4" | "granite-embed-multi-311m");
                let add_eos = optional(md, keys::ADD_EOS, Metadata::get_bool)?.unwrap_or(false);
                Ok(Tokenizer::assemble(
                    vocab,
                    Model::Bpe(Box::new(model)),
                    add_bos,
                    add_eos,
                ))
            }
            "llama" => {
                let vocab = Vocab::load(md, Some(1), Some(2), Some(0))?;
                let add_space_prefix =
                    optional(md, keys::ADD_SPACE_PREFIX, Metadata::get_bool)?.unwrap_or(true);
                let model = SpmModel::new(&vocab, add_space_prefix);
                let add_bos = optional(md, keys::ADD_BOS, Metadata::get_bool)?.unwrap_or(true);
                let add_eos = optional(md, keys::ADD_EOS, Metadata::get_bool)?.unwrap_or(false);
                Ok(Tokenizer::assemble(
                    vocab,
                    Model::Spm(Box::new(model)),
                    add_bos,
                    add_eos,
                ))
            }
            other => Err(TokenizerError::UnsupportedModel(other.to_string())),
        }
    }

    fn assemble(vocab: Vocab, model: Model, add_bos: bool, add_eos: bool) -> Tokenizer {
        let special = SpecialMatcher::new(&vocab);
        let pieces = build_pieces(&vocab, &model);
        Tokenizer {
            vocab,
            model,
            special,
            pieces,
            add_bos,
            add_eos,
        }
    }

    /// The algorithm (and pre-tokenizer) in use.
    pub fn kind(&self) -> TokenizerKind {
        match &self.model {
            Model::Bpe(m) => TokenizerKind::ByteLevelBpe(m.pre.pre),
            Model::Spm(_) => TokenizerKind::SentencePiece,
        }
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.vocab.bos
    }
    pub fn eos_id(&self) -> Option<u32> {
        self.vocab.eos
    }
    pub fn unk_id(&self) -> Option<u32> {
        self.vocab.unk
    }
    pub fn pad_id(&self) -> Option<u32> {
        self.vocab.pad
    }
    /// End-of-turn token (from metadata, else found by text such as `<end_of_turn>`).
    pub fn eot_id(&self) -> Option<u32> {
        self.vocab.eot
    }
    /// Tokens that end a generation: EOS, EOT, EOM and known end-of-generation texts.
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
    }
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }
    /// Whether `add_special` adds BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// Whether `add_special` adds EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    /// Whether SentencePiece prefixes a space (always false for byte-level BPE).
    pub fn add_space_prefix(&self) -> bool {
        matches!(&self.model, Model::Spm(m) if m.add_space_prefix)
    }

    fn check_id(&self, id: u32) -> Result<usize, TokenizerError> {
        if (id as usize) < self.vocab.len() {
            Ok(id as usize)
        } else {
            Err(TokenizerError::UnknownTokenId {
                id,
                n_vocab: self.vocab.len(),
            })
        }
    }

    /// The stored type of a token.
    pub fn token_type(&self, id: u32) -> Result<TokenType, TokenizerError> {
        Ok(self.vocab.types[self.check_id(id)?])
    }

    /// Whether a token is a control token (stored as such, or recognised by its text as an
    /// end-of-generation / fill-in-the-middle marker).
    pub fn is_control(&self, id: u32) -> Result<bool, TokenizerError> {
        Ok(self.vocab.attrs[self.check_id(id)?] & attr::CONTROL != 0)
    }

    /// The token's text as stored in the vocabulary (byte-level alphabet / U+2581 escaped).
    pub fn token_text(&self, id: u32) -> Result<&str, TokenizerError> {
        let i = self.check_id(id)?;
        // Texts come from GGUF strings, which are valid UTF-8.
        Ok(std::str::from_utf8(self.vocab.texts.get(i)).unwrap_or(""))
    }

    /// The token's score (0 when the vocabulary stores none).
    pub fn token_score(&self, id: u32) -> Result<f32, TokenizerError> {
        Ok(self.vocab.scores[self.check_id(id)?])
    }

    /// The id of the token whose stored text is `text` (e.g. `"<start_of_turn>"`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id_of(text.as_bytes())
    }

    /// The bytes a token stands for: its text for control, user-defined and unknown
    /// tokens, the byte for `<0xNN>`, the unescaped text otherwise, empty for unused slots.
    pub fn token_to_piece(&self, id: u32) -> Result<&[u8], TokenizerError> {
        Ok(self.pieces.get(self.check_id(id)?))
    }

    /// Concatenated pieces of `ids` (special tokens rendered as their text).
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.token_to_piece(id)?);
        }
        Ok(out)
    }

    /// A decoder that turns ids into text as they arrive.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }

    /// Encodes UTF-8 text.
    pub fn encode(&self, text: &str, opts: EncodeOptions) -> Result<Vec<u32>, TokenizerError> {
        self.encode_bytes(text.as_bytes(), opts)
    }

    /// Encodes bytes. Byte-level BPE accepts any bytes (invalid UTF-8 is encoded byte by
    /// byte); SentencePiece needs UTF-8 and reports the offset of the first invalid byte.
    pub fn encode_bytes(
        &self,
        text: &[u8],
        opts: EncodeOptions,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        self.encode_into(text, opts, &mut out)?;
        Ok(out)
    }

    /// Appends the ids of `text` to `out` (see [`Tokenizer::encode_bytes`]).
    pub fn encode_into(
        &self,
        text: &[u8],
        opts: EncodeOptions,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        // Positions inside the tokenizer are 32-bit, and SentencePiece's escaping can
        // triple a text's length.
        if text.len() > MAX_INPUT_BYTES {
            return Err(TokenizerError::InputTooLong { len: text.len() });
        }
        if let Model::Spm(_) = self.model {
            if let Err(e) = std::str::from_utf8(text) {
                return Err(TokenizerError::InvalidUtf8 {
                    offset: e.valid_up_to(),
                });
            }
        }
        if opts.add_special && self.add_bos {
            out.push(
                self.vocab
                    .bos
                    .ok_or(TokenizerError::MissingSpecialToken { which: "BOS" })?,
            );
        }
        let mut fragments = Vec::new();
        self.special
            .partition(&self.vocab, text, opts.parse_special, &mut fragments);
        match &self.model {
            Model::Bpe(m) => {
                let mut work = BpeWork::default();
                for f in &fragments {
                    match *f {
                        Fragment::Text { start, end } => {
                            m.encode_fragment(&self.vocab, &text[start..end], &mut work, out)
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            Model::Spm(m) => {
                let mut work = SpmWork::default();
                // The space prefix goes before the first text and after each special token.
                let mut after_special = true;
                for f in &fragments {
                    match *f {
                        Fragment::Text { start, end } => {
                            m.encode_fragment(
                                &self.vocab,
                                &text[start..end],
                                m.add_space_prefix && after_special,
                                &mut work,
                                out,
                            )?;
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    }
                }
            }
        }
        if opts.add_special && self.add_eos {
            out.push(
                self.vocab
                    .eos
                    .ok_or(TokenizerError::MissingSpecialToken { which: "EOS" })?,
            );
        }
        Ok(())
    }
}

/// The decoded bytes of every token.
fn build_pieces(vocab: &Vocab, model: &Model) -> TextArena {
    let inv = unicode_to_byte_table();
    let mut pieces = TextArena::with_capacity(vocab.len(), vocab.texts.total_bytes());
    let mut buf = Vec::new();
    for id in 0..vocab.len() as u32 {
        let text = vocab.text(id);
        let a = vocab.attrs[id as usize];
        buf.clear();
        if a & attr::RAW_TEXT != 0 {
            buf.extend_from_slice(text);
        } else if a & attr::NORMAL != 0 {
            match model {
                Model::Spm(_) => replace_all(text, SPACE_MARK, b" ", &mut buf),
                Model::Bpe(m) if m.pre.raw_utf8 => replace_all(text, SPACE_MARK, b" ", &mut buf),
                Model::Bpe(_) => match alphabet_to_bytes(text, &inv) {
                    Some(raw) => buf.extend_from_slice(&raw),
                    // A character outside the byte alphabet stands for itself.
                    None => {
                        let s = std::str::from_utf8(text).unwrap_or("");
                        for ch in s.chars() {
                            match inv.get(ch as usize).copied().flatten() {
                                Some(b) => buf.push(b),
                                None => {
                                    buf.extend_from_slice(ch.encode_utf8(&mut [0u8; 4]).as_bytes())
                                }
                            }
                        }
                    }
                },
            }
        } else if a & attr::BYTE != 0 {
            match parse_byte_token(text) {
                Some(b) => buf.push(b),
                None => buf.extend_from_slice(text),
            }
        }
        // Total piece bytes never exceed 4 GiB: the texts they come from fit in the
        // vocabulary arena and a piece is at most as long as its text.
        pieces.push(&buf);
    }
    pieces
}

fn replace_all(text: &[u8], from: &[u8], to: &[u8], out: &mut Vec<u8>) {
    let mut pos = 0;
    for i in memchr::memmem::find_iter(text, from) {
        out.extend_from_slice(&text[pos..i]);
        out.extend_from_slice(to);
        pos = i + from.len();
    }
    out.extend_from_slice(&text[pos..]);
}
