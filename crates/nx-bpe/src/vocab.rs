//! The token table read from `tokenizer.ggml.*`: texts, types, scores, special ids, and the
//! text→id index shared by both tokenizer kinds.

use nx_gguf::{GgufError, Metadata, Value};

use crate::hash::{TextArena, TextIndex};
use crate::TokenizerError;

/// Metadata keys read by this crate.
pub mod keys {
    pub const MODEL: &str = "tokenizer.ggml.model";
    pub const PRE: &str = "tokenizer.ggml.pre";
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    pub const SCORES: &str = "tokenizer.ggml.scores";
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    pub const MERGES: &str = "tokenizer.ggml.merges";
    pub const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
    pub const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
    pub const UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
    pub const PAD_ID: &str = "tokenizer.ggml.padding_token_id";
    pub const EOT_ID: &str = "tokenizer.ggml.eot_token_id";
    pub const EOM_ID: &str = "tokenizer.ggml.eom_token_id";
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    pub const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
}

/// The token type stored per token in `tokenizer.ggml.token_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0, or any value outside 1..=6.
    Undefined,
    /// 1: an ordinary piece of text.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token such as `<bos>` or `<|im_start|>`.
    Control,
    /// 4: a user-defined token, always matched whole in the input.
    UserDefined,
    /// 5: an unused slot.
    Unused,
    /// 6: a byte-fallback token `<0xNN>`.
    Byte,
}

impl TokenType {
    /// The type for a stored integer (unknown values are `Undefined`).
    pub fn from_i32(v: i32) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Effective attribute bits (a token can gain `CONTROL`, see [`Vocab::load`]).
pub mod attr {
    pub const NORMAL: u8 = 1;
    pub const UNKNOWN: u8 = 2;
    pub const CONTROL: u8 = 4;
    pub const USER_DEFINED: u8 = 8;
    pub const UNUSED: u8 = 16;
    pub const BYTE: u8 = 32;
    /// Tokens the special-token matcher considers at all.
    pub const SPECIAL_MATCHABLE: u8 = CONTROL | USER_DEFINED | UNKNOWN;
    /// Tokens rendered by their raw text when decoding.
    pub const RAW_TEXT: u8 = CONTROL | USER_DEFINED | UNKNOWN;
}

fn attr_of(t: TokenType) -> u8 {
    match t {
        TokenType::Undefined => 0,
        TokenType::Normal => attr::NORMAL,
        TokenType::Unknown => attr::UNKNOWN,
        TokenType::Control => attr::CONTROL,
        TokenType::UserDefined => attr::USER_DEFINED,
        TokenType::Unused => attr::UNUSED,
        TokenType::Byte => attr::BYTE,
    }
}

/// Texts that mark the end of a generation in common chat vocabularies. The reference
/// recognises them by text and forces them to be control tokens even when the file
/// types them otherwise, which also makes them matchable as special tokens.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Fill-in-the-middle marker texts by kind (the `tokenizer.ggml.fim_KIND_token_id` key),
/// forced to control like the above when the file does not name that kind's id.
const FIM_TEXTS: &[(&str, &[&str])] = &[
    (
        "pre",
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    ),
    (
        "suf",
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    ),
    (
        "mid",
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    ),
    (
        "pad",
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    ),
    (
        "rep",
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    ("sep", &["<|file_sep|>"]),
];

/// The token table.
#[derive(Debug, Clone)]
pub struct Vocab {
    /// Token texts as stored (an empty text becomes `[EMPTY_<id>]`, as in the reference).
    pub texts: TextArena,
    /// Text → id; among identical texts the highest id wins.
    pub index: TextIndex,
    pub types: Vec<TokenType>,
    pub attrs: Vec<u8>,
    pub scores: Vec<f32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub eot: Option<u32>,
    /// Ids that end a generation (EOS, EOT, EOM and the end-of-generation texts).
    pub eog: Vec<u32>,
}

/// Reads an optional key through a typed getter: `Ok(None)` when the key is absent.
pub fn optional<'m, T>(
    md: &'m Metadata,
    key: &str,
    get: impl FnOnce(&'m Metadata, &str) -> Result<T, GgufError>,
) -> Result<Option<T>, TokenizerError> {
    if md.contains(key) {
        Ok(Some(get(md, key)?))
    } else {
        Ok(None)
    }
}

fn read_scores(md: &Metadata) -> Result<Option<Vec<f32>>, TokenizerError> {
    let Some(v) = md.get(keys::SCORES) else {
        return Ok(None);
    };
    let Some(arr) = v.as_array() else {
        return Err(TokenizerError::BadMetadata {
            key: keys::SCORES,
            reason: format!("expected an array, found {}", v.type_description()),
        });
    };
    let mut out = Vec::with_capacity(arr.values.len());
    for x in &arr.values {
        let s = match x {
            Value::F32(f) => *f,
            Value::F64(f) => *f as f32,
            Value::I32(i) => *i as f32,
            other => {
                return Err(TokenizerError::BadMetadata {
                    key: keys::SCORES,
                    reason: format!(
                        "expected f32 or i32 elements, found {}",
                        other.type_description()
                    ),
                })
            }
        };
        out.push(s);
    }
    Ok(Some(out))
}

/// The reference's two corrections of the end-of-generation set, by token text:
/// - with `<|return|>` and `<|call|>` (o200k harmony), or `<|calls|>` and `<|flush|>`
///   (Solar Open), `<|end|>` only ends a message: it leaves the set and becomes
///   user-defined;
/// - with `<|tool_response>` (Gemma 4) or `<|plamo:eos|>`, `</s>` is ordinary text: it
///   leaves the set and becomes a normal token.
fn drop_conflicting_eog(
    texts: &TextArena,
    index: &TextIndex,
    eog: &mut Vec<u32>,
    attrs: &mut [u8],
) {
    let in_eog = |eog: &[u32], text: &str| {
        index
            .get(texts, text.as_bytes())
            .filter(|id| eog.binary_search(id).is_ok())
    };
    let mut drop = |eog: &mut Vec<u32>, id: u32, new_attr: u8| {
        eog.retain(|&e| e != id);
        attrs[id as usize] = new_attr;
    };
    if let Some(end) = in_eog(eog, "<|end|>") {
        let has = |t: &str| in_eog(eog, t).is_some();
        let has_call = has("<|call|>") || has("<|calls|>");
        if has_call && (has("<|return|>") || has("<|flush|>")) {
            drop(eog, end, attr::USER_DEFINED);
        }
    }
    if let Some(s) = in_eog(eog, "</s>") {
        if in_eog(eog, "<|tool_response>").is_some() || in_eog(eog, "<|plamo:eos|>").is_some() {
            drop(eog, s, attr::NORMAL);
        }
    }
}

/// The texts an end-of-turn token has when the file names none, in the reference's order.
const EOT_FALLBACK_TEXTS: [&str; 7] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "<|end_of_text|>",
];

/// `tokenizer.ggml.tokens` into an arena (an empty text becomes `[EMPTY_i]`, as in the
/// reference), and the vocabulary size; it must be non-zero and its ids fit in 31 bits.
fn token_texts(md: &Metadata) -> Result<(TextArena, usize), TokenizerError> {
    let tokens = md.get_str_array(keys::TOKENS)?;
    let n = tokens.len();
    if n == 0 || n > (u32::MAX / 2) as usize {
        return Err(TokenizerError::BadMetadata {
            key: keys::TOKENS,
            reason: format!("vocabulary size {n} is not usable"),
        });
    }
    let total: usize = tokens.iter().map(|t| t.len()).sum();
    let mut texts = TextArena::with_capacity(n, total);
    for (i, t) in tokens.iter().enumerate() {
        let ok = if t.is_empty() {
            texts.push(format!("[EMPTY_{i}]").as_bytes())
        } else {
            texts.push(t.as_bytes())
        };
        if !ok {
            return Err(TokenizerError::BadMetadata {
                key: keys::TOKENS,
                reason: "token texts exceed 4 GiB".into(),
            });
        }
    }
    Ok((texts, n))
}

/// The first `n` scores (zeros when the file has none); fewer than `n` is an error.
fn scores_for(md: &Metadata, n: usize) -> Result<Vec<f32>, TokenizerError> {
    match read_scores(md)? {
        Some(s) if s.len() < n => Err(TokenizerError::BadMetadata {
            key: keys::SCORES,
            reason: format!("{} scores for {n} tokens", s.len()),
        }),
        Some(mut s) => {
            s.truncate(n);
            Ok(s)
        }
        None => Ok(vec![0.0; n]),
    }
}

/// The first `n` token types (all normal when the file has none); fewer is an error.
fn types_for(md: &Metadata, n: usize) -> Result<Vec<TokenType>, TokenizerError> {
    match optional(md, keys::TOKEN_TYPE, Metadata::get_i32_array)? {
        Some(t) if t.len() < n => Err(TokenizerError::BadMetadata {
            key: keys::TOKEN_TYPE,
            reason: format!("{} token types for {n} tokens", t.len()),
        }),
        Some(t) => Ok(t[..n].iter().map(|&v| TokenType::from_i32(v)).collect()),
        None => Ok(vec![TokenType::Normal; n]),
    }
}

/// Marks control-looking tokens (end of generation, fill-in-the-middle) as control and a
/// few chat formats' structural tokens as user-defined, whatever their stored type, as
/// the reference does; returns the end-of-generation ids found this way. `found` looks a
/// text up in the vocabulary.
fn mark_control_tokens(
    md: &Metadata,
    n: usize,
    found: impl Fn(&str) -> Option<u32>,
    attrs: &mut [u8],
) -> Result<Vec<u32>, TokenizerError> {
    let mut eog = Vec::new();
    for text in END_OF_GENERATION_TEXTS {
        if let Some(id) = found(text) {
            attrs[id as usize] |= attr::CONTROL;
            eog.push(id);
        }
    }
    for (kind, candidates) in FIM_TEXTS {
        let key = format!("tokenizer.ggml.fim_{kind}_token_id");
        let mut id_of_kind = match optional(md, &key, Metadata::get_u32)? {
            Some(id) if (id as usize) < n => Some(id),
            _ => None,
        };
        if !md.contains(&key) {
            for text in *candidates {
                if let Some(id) = found(text) {
                    attrs[id as usize] |= attr::CONTROL;
                    id_of_kind = id_of_kind.or(Some(id));
                }
            }
        }
        // The padding, repository and file-separator markers also end a generation.
        if matches!(*kind, "pad" | "rep" | "sep") {
            eog.extend(id_of_kind);
        }
    }
    // A few chat formats' structural tokens are rendered and matched as user-defined.
    for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(id) = found(text) {
            attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    Ok(eog)
}

impl Vocab {
    /// Loads the token table. `default_bos`/`default_eos`/`default_unk` are the model
    /// kind's defaults, used when the file names no id (ids past the vocabulary are ignored).
    pub fn load(
        md: &Metadata,
        default_bos: Option<u32>,
        default_eos: Option<u32>,
        default_unk: Option<u32>,
    ) -> Result<Vocab, TokenizerError> {
        let (texts, n) = token_texts(md)?;
        let scores = scores_for(md, n)?;
        let types = types_for(md, n)?;
        let mut attrs: Vec<u8> = types.iter().map(|&t| attr_of(t)).collect();

        let mut index = TextIndex::with_capacity(n);
        for id in 0..n as u32 {
            index.insert_last_wins(&texts, id);
        }

        let special =
            |key: &'static str, default: Option<u32>| -> Result<Option<u32>, TokenizerError> {
                let default = default.filter(|&d| (d as usize) < n);
                match optional(md, key, Metadata::get_u32)? {
                    Some(id) if (id as usize) < n => Ok(Some(id)),
                    // The reference ignores an out-of-range id and keeps the default.
                    Some(_) => Ok(default),
                    None => Ok(default),
                }
            };
        let bos = special(keys::BOS_ID, default_bos)?;
        let eos = special(keys::EOS_ID, default_eos)?;
        let unk = special(keys::UNK_ID, default_unk)?;
        let pad = special(keys::PAD_ID, None)?;
        let mut eot = special(keys::EOT_ID, None)?;
        let eom = special(keys::EOM_ID, None)?;
        let found = |text: &str| index.get(&texts, text.as_bytes());
        let mut eog = mark_control_tokens(md, n, found, &mut attrs)?;
        if eot.is_none() {
            eot = EOT_FALLBACK_TEXTS.iter().find_map(|t| found(t));
        }
        eog.extend(eos.iter().chain(eot.iter()).chain(eom.iter()).copied());
        eog.sort_unstable();
        eog.dedup();
        drop_conflicting_eog(&texts, &index, &mut eog, &mut attrs);

        Ok(Vocab {
            texts,
            index,
            types,
            attrs,
            scores,
            bos,
            eos,
            unk,
            pad,
            eot,
            eog,
        })
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.types.len()
    }

    #[inline]
    pub fn text(&self, id: u32) -> &[u8] {
        self.texts.get(id as usize)
    }

    #[inline]
    pub fn id_of(&self, text: &[u8]) -> Option<u32> {
        self.index.get(&self.texts, text)
    }
}

/// Parses a byte-fallback token text `<0xNN>` (two hex digits; `<0x-1>`, `<0x+1>` or
/// `<0xZZ>` are not byte tokens, whatever type the file gives them, and decode as their
/// text).
pub fn parse_byte_token(text: &[u8]) -> Option<u8> {
    match text {
        [b'<', b'0', b'x', hi, lo, b'>'] if hi.is_ascii_hexdigit() && lo.is_ascii_hexdigit() => {
            let hex = |d: u8| (d as char).to_digit(16).map(|v| v as u8);
            Some(hex(*hi)? << 4 | hex(*lo)?)
        }
        _ => None,
    }
}
