//! Pre-tokenizers of byte-level BPE vocabularies: hand-written splitters equivalent to the
//! regexes named by `tokenizer.ggml.pre`, including the reference's edge-case behaviour.
//!
//! A splitter cuts a text fragment into pieces; BPE merges never cross a piece boundary.
//! Each splitter walks the code points once, looking at most one code point ahead except
//! over runs of white space. Invalid UTF-8 bytes are code points of no class (like the
//! U+FFFD they would decode to), so byte-level BPE can still encode them.
//!
//! The regexes (from the models' `tokenizer.json`):
//! - `gpt2`:   `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
//! - `llama3`: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//! - `qwen2`:  the `llama3` pattern with `\p{N}` (one digit per piece) instead of `\p{N}{1,3}`.
//! - `qwen35`: the `qwen2` pattern with `[\p{L}\p{M}]+` for letter runs and `\p{M}` also
//!   excluded from the punctuation run.
//! - `starcoder` (also `smollm`, `refact`, `command-r`, …): `\p{N}` (one digit a piece),
//!   then the `gpt2` pattern over each piece.
//! - `falcon`: `[\p{P}\$\+<=>\^~\|`]+`, the `gpt2` pattern, `[0-9][0-9][0-9]`, in sequence.
//! - `deepseek-coder`: `[\r\n]`, `\s?\p{L}+`, `\s?\p{P}+`, `[一-龥ࠀ-一가-퟿]+`, `\p{N}`, in
//!   sequence (the reference runs these through `std::regex`, with `\s` the ASCII white
//!   space plus every other `White_Space` code point).
//! - `deepseek-llm`: `[\r\n]`, `\s?[A-Za-zµÀ-Ö…]+` (the cased-letter ranges of
//!   [`DEEPSEEK_LLM_LETTERS`]), `\s?[!-/:-~！-／：-～‘-‟　-。]+`, `\s+$`, the CJK runs,
//!   `\p{N}+`, in sequence.
//! - `default`: four patterns applied in sequence, each splitting the pieces of the one
//!   before: `[\p{P}\$\+<=>\^~\|]+`, the `gpt2` pattern, `\p{N}+`, `[0-9][0-9][0-9]`.
//!
//! Where the reference's splitters deviate from a true regex engine (the `\s*[\r\n]+`
//! alternative takes all white space up to the last CR/LF of a run; a lone trailing space
//! is its own piece), these splitters follow the reference, because token ids must match.

use crate::unicode::{class_of, decode_at, DEFINED, LETTER, MARK, NUMBER, PUNCT, WHITESPACE};

/// Which splitting rules a byte-level BPE vocabulary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// GPT-2's pattern.
    Gpt2,
    /// Llama 3's pattern (digits in groups of up to three).
    Llama3,
    /// Qwen2's pattern (one digit per piece).
    Qwen2,
    /// Qwen3.5's: Qwen2's with combining marks (`\p{M}`) counted as letters.
    Qwen35,
    /// The reference's fallback sequence of four patterns.
    Default,
    /// Every digit its own piece, then GPT-2's pattern (StarCoder, SmolLM, Command-R, …).
    DigitsThenGpt2,
    /// Falcon's sequence: punctuation runs (with the backtick), GPT-2's pattern, then
    /// `[0-9][0-9][0-9]`.
    Falcon,
    /// DeepSeek Coder's sequence of five patterns (line breaks, letter runs, punctuation
    /// runs, CJK runs, single digits).
    DeepseekCoder,
    /// DeepSeek LLM's sequence of six patterns (line breaks, runs of cased letters, runs of
    /// ASCII and full-width punctuation, trailing white space, CJK runs, digit runs).
    DeepseekLlm,
    /// Runs of line feeds and runs of everything else (`[^\n]+|[\n]+`, Gemma 4).
    NewlineRuns,
    /// Digit runs cut into threes from the right, the leading one or two digits joined to
    /// the text before them (the reference's AFMoE digit splitter, also Tiny Aya's).
    AfmoeDigits,
    /// Kimi-K2's: runs of Han ideographs, then Llama 3's pattern with Han left out of the
    /// letter runs and contractions after them (the reference's custom splitter).
    KimiK2,
    /// The reference's list of split patterns ([`PreTokenizerConfig::patterns`]), run by
    /// the pattern engine.
    Patterns,
}

/// What a `tokenizer.ggml.pre` name selects (a row of [`crate::plan::NAMES`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreTokenizerConfig {
    /// The `tokenizer.ggml.pre` name.
    pub name: &'static str,
    /// The splitter; [`PreTokenizer::Patterns`] when the split is the reference's list of
    /// patterns in [`PreTokenizerConfig::patterns`].
    pub pre: PreTokenizer,
    /// The reference's split patterns, applied in order, each to the pieces of the one
    /// before (empty unless `pre` is [`PreTokenizer::Patterns`]).
    pub patterns: &'static [&'static str],
    /// A piece that is itself a vocabulary token is emitted whole, without merging.
    pub ignore_merges: bool,
    /// Whether BOS is added by default (before `tokenizer.ggml.add_bos_token` overrides it).
    pub add_bos_default: bool,
    /// SentencePiece-style BPE (Gemma 4): spaces become U+2581 before splitting, merges run
    /// over UTF-8 characters rather than the GPT-2 byte alphabet, and characters outside the
    /// vocabulary fall back to `<0xNN>` tokens.
    pub raw_utf8: bool,
}

impl PreTokenizer {
    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            PreTokenizer::Gpt2 => "gpt2",
            PreTokenizer::Llama3 => "llama3",
            PreTokenizer::Qwen2 => "qwen2",
            PreTokenizer::Qwen35 => "qwen35",
            PreTokenizer::Default => "default",
            PreTokenizer::DigitsThenGpt2 => "starcoder",
            PreTokenizer::Falcon => "falcon",
            PreTokenizer::DeepseekCoder => "deepseek-coder",
            PreTokenizer::DeepseekLlm => "deepseek-llm",
            PreTokenizer::NewlineRuns => "newline runs",
            PreTokenizer::AfmoeDigits => "afmoe digits",
            PreTokenizer::KimiK2 => "kimi-k2",
            PreTokenizer::Patterns => "patterns",
        }
    }

    /// Splits `text` into pieces and calls `emit(start, end)` with the byte range of each,
    /// in order; the pieces cover the text exactly.
    pub fn split(
        self,
        text: &[u8],
        scratch: &mut SplitScratch,
        emit: &mut impl FnMut(usize, usize),
    ) {
        scratch.decode(text);
        let s = &*scratch;
        let n = s.cps.len();
        let mut to_bytes = |a: usize, b: usize| emit(s.offs[a] as usize, s.offs[b] as usize);
        self.split_range(s, 0, n, &mut to_bytes);
    }

    /// Splits the code points `lo..hi` of decoded text, emitting code-point ranges.
    /// [`PreTokenizer::Patterns`] has no splitter of its own and emits the range whole.
    pub(crate) fn split_range(
        self,
        s: &SplitScratch,
        lo: usize,
        hi: usize,
        emit: &mut impl FnMut(usize, usize),
    ) {
        match self {
            PreTokenizer::Gpt2 => split_gpt2(s, lo, hi, emit),
            PreTokenizer::Llama3 => split_llama3_like(s, lo, hi, 3, LETTER, emit),
            PreTokenizer::Qwen2 => split_llama3_like(s, lo, hi, 1, LETTER, emit),
            PreTokenizer::Qwen35 => split_llama3_like(s, lo, hi, 1, LETTER | MARK, emit),
            PreTokenizer::Default => split_default(s, lo, hi, false, emit),
            PreTokenizer::Falcon => split_default(s, lo, hi, true, emit),
            PreTokenizer::DeepseekCoder => split_deepseek(s, lo, hi, false, emit),
            PreTokenizer::DeepseekLlm => split_deepseek(s, lo, hi, true, emit),
            PreTokenizer::DigitsThenGpt2 => split_digits_then_gpt2(s, lo, hi, emit),
            PreTokenizer::NewlineRuns => {
                split_runs(lo, hi, |i| s.cps[i] == '\n' as u32, emit);
            }
            PreTokenizer::AfmoeDigits => split_afmoe_digits(s, lo, hi, emit),
            PreTokenizer::KimiK2 => split_kimi_k2(s, lo, hi, emit),
            PreTokenizer::Patterns => {
                if hi > lo {
                    emit(lo, hi)
                }
            }
        }
    }
}

/// Reusable buffers: the decoded code points, their classes and byte offsets.
#[derive(Default, Debug)]
pub struct SplitScratch {
    pub(crate) cps: Vec<u32>,
    cls: Vec<u8>,
    /// Byte offset of each code point, plus one entry for the end of the text.
    pub(crate) offs: Vec<u32>,
}

/// Stands for an invalid byte: matches no character test.
const INVALID_CP: u32 = 0xFFFF_FFFE;

impl SplitScratch {
    pub(crate) fn decode(&mut self, text: &[u8]) {
        self.cps.clear();
        self.cls.clear();
        self.offs.clear();
        let mut i = 0;
        while i < text.len() {
            let b = text[i];
            if b < 0x80 {
                self.cps.push(b as u32);
                self.cls.push(class_of(b as u32));
                self.offs.push(i as u32);
                i += 1;
                continue;
            }
            let (cp, len) = decode_at(text, i);
            match cp {
                Some(cp) => {
                    self.cps.push(cp);
                    self.cls.push(class_of(cp));
                }
                None => {
                    self.cps.push(INVALID_CP);
                    self.cls.push(DEFINED);
                }
            }
            self.offs.push(i as u32);
            i += len;
        }
        self.offs.push(text.len() as u32);
    }

    #[inline]
    fn class(&self, i: usize, hi: usize) -> u8 {
        if i < hi {
            self.cls[i]
        } else {
            0
        }
    }

    #[inline]
    fn cp(&self, i: usize, hi: usize) -> u32 {
        if i < hi {
            self.cps[i]
        } else {
            u32::MAX
        }
    }
}

#[inline]
fn ascii_lower(cp: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&cp) {
        cp + 32
    } else {
        cp
    }
}

/// Length of an English contraction (`'s 't 'm 'd 're 've 'll`) at `pos`, or 0.
#[inline]
fn contraction_len(s: &SplitScratch, pos: usize, hi: usize, case_insensitive: bool) -> usize {
    if s.cps[pos] != '\'' as u32 || pos + 1 >= hi {
        return 0;
    }
    let fold = |c: u32| if case_insensitive { ascii_lower(c) } else { c };
    let c1 = fold(s.cps[pos + 1]);
    if [b's', b't', b'm', b'd'].iter().any(|&x| c1 == x as u32) {
        return 2;
    }
    if pos + 2 < hi {
        let c2 = fold(s.cps[pos + 2]);
        let pair = |a: u8, b: u8| c1 == a as u32 && c2 == b as u32;
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return 3;
        }
    }
    0
}

const WS_L_N: u8 = WHITESPACE | LETTER | NUMBER;

/// The Llama 3 / Qwen2 / Qwen3.5 splitter over code points `lo..hi`; `max_digits` is 3 or
/// 1; `letters` the classes a letter run takes (`LETTER`, or `LETTER | MARK`).
fn split_llama3_like(
    s: &SplitScratch,
    lo: usize,
    hi: usize,
    max_digits: usize,
    letters: u8,
    emit: &mut impl FnMut(usize, usize),
) {
    let ws_l_n = WHITESPACE | NUMBER | letters;
    let mut pos = lo;
    while pos < hi {
        let start = pos;
        let c = s.cps[pos];
        let f = s.cls[pos];

        let k = contraction_len(s, pos, hi, true);
        if k > 0 {
            emit(start, pos + k);
            pos += k;
            continue;
        }

        // [^\r\n\p{L}\p{N}]?\p{L}+
        let is_crlf = c == '\r' as u32 || c == '\n' as u32;
        if !(is_crlf || f & NUMBER != 0)
            && (f & letters != 0 || s.class(pos + 1, hi) & letters != 0)
        {
            pos += 1;
            while s.class(pos, hi) & letters != 0 {
                pos += 1;
            }
            emit(start, pos);
            continue;
        }

        pos = split_llama3_rest(s, pos, hi, max_digits, ws_l_n, emit);
    }
}

/// The alternatives Llama 3's pattern shares with Kimi-K2's after the letter runs, at
/// `pos` (`\p{N}{1,max_digits}`, the punctuation run, then the three white-space ones, else
/// one code point); emits what matched and returns where the next match starts.
fn split_llama3_rest(
    s: &SplitScratch,
    mut pos: usize,
    hi: usize,
    max_digits: usize,
    ws_l_n: u8,
    emit: &mut impl FnMut(usize, usize),
) -> usize {
    let start = pos;
    let c = s.cps[pos];
    let f = s.cls[pos];
    // \p{N}{1,max_digits}
    if f & NUMBER != 0 {
        let mut group = pos;
        while s.class(pos, hi) & NUMBER != 0 {
            pos += 1;
            if pos - group >= max_digits {
                emit(group, pos);
                group = pos;
            }
        }
        if pos > group {
            emit(group, pos);
        }
        return pos;
    }

    // ' '?[^\s\p{L}\p{N}]+[\r\n]*
    let f2 = if c == ' ' as u32 {
        s.class(pos + 1, hi)
    } else {
        f
    };
    if f2 & ws_l_n == 0 && f != 0 {
        if c == ' ' as u32 {
            pos += 1;
        }
        while s.class(pos, hi) & ws_l_n == 0 && s.class(pos, hi) != 0 {
            pos += 1;
        }
        while s.cp(pos, hi) == '\r' as u32 || s.cp(pos, hi) == '\n' as u32 {
            pos += 1;
        }
        emit(start, pos);
        return pos;
    }

    // \s*[\r\n]+ | \s+(?!\S) | \s+
    let mut n_ws = 0;
    let mut end_after_crlf = 0;
    while s.class(pos + n_ws, hi) & WHITESPACE != 0 {
        let c2 = s.cps[pos + n_ws];
        if c2 == '\r' as u32 || c2 == '\n' as u32 {
            end_after_crlf = pos + n_ws + 1;
        }
        n_ws += 1;
    }
    pos = if end_after_crlf > 0 {
        end_after_crlf
    } else {
        after_whitespace(pos, n_ws, hi)
    };
    emit(start, pos);
    pos
}

/// Where `\s+(?!\S) | \s+` (or the single code point after no whitespace) ends for a
/// run of `n_ws` whitespace code points at `pos`: a run followed by more text leaves its
/// last space to the next word.
fn after_whitespace(pos: usize, n_ws: usize, hi: usize) -> usize {
    if n_ws > 1 && pos + n_ws < hi {
        pos + n_ws - 1
    } else if n_ws > 0 {
        pos + n_ws
    } else {
        pos + 1
    }
}

/// Han ideographs as the reference's Kimi-K2 splitter counts them (the CJK unified
/// ideographs, extensions A to F and the compatibility blocks).
fn is_han(cp: u32) -> bool {
    matches!(
        cp,
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2EBEF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

/// Kimi-K2's splitter over `lo..hi`: runs of Han ideographs; then Llama 3's letter runs
/// with Han left out and an optional trailing contraction (either case); then the rest of
/// Llama 3's pattern.
fn split_kimi_k2(s: &SplitScratch, lo: usize, hi: usize, emit: &mut impl FnMut(usize, usize)) {
    let letter_not_han = |i: usize| s.class(i, hi) & LETTER != 0 && !is_han(s.cps[i]);
    let mut pos = lo;
    while pos < hi {
        let start = pos;
        let c = s.cps[pos];
        let f = s.cls[pos];
        if is_han(c) {
            while pos < hi && is_han(s.cps[pos]) {
                pos += 1;
            }
            emit(start, pos);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?[letters but Han]+('s|'t|'re|'ve|'m|'ll|'d)?
        let can_lead = !(c == '\r' as u32 || c == '\n' as u32 || f & (LETTER | NUMBER) != 0);
        if letter_not_han(pos) || (can_lead && letter_not_han(pos + 1)) {
            pos += 1;
            while letter_not_han(pos) {
                pos += 1;
            }
            if s.cp(pos, hi) == '\'' as u32 {
                pos += contraction_len(s, pos, hi, true);
            }
            emit(start, pos);
            continue;
        }
        pos = split_llama3_rest(s, pos, hi, 3, WS_L_N, emit);
    }
}

/// The GPT-2 splitter over code points `lo..hi`.
fn split_gpt2(s: &SplitScratch, lo: usize, hi: usize, emit: &mut impl FnMut(usize, usize)) {
    let mut pos = lo;
    while pos < hi {
        let start = pos;
        let c = s.cps[pos];

        let k = contraction_len(s, pos, hi, false);
        if k > 0 {
            emit(start, pos + k);
            pos += k;
            continue;
        }

        let lead_space = c == ' ' as u32;
        let f2 = if lead_space {
            s.class(pos + 1, hi)
        } else {
            s.cls[pos]
        };
        // ' '?\p{L}+ and ' '?\p{N}+
        if f2 & LETTER != 0 || f2 & NUMBER != 0 {
            let class = if f2 & LETTER != 0 { LETTER } else { NUMBER };
            pos += lead_space as usize;
            while s.class(pos, hi) & class != 0 {
                pos += 1;
            }
            emit(start, pos);
            continue;
        }
        // ' '?[^\s\p{L}\p{N}]+
        if f2 & WS_L_N == 0 && f2 != 0 {
            pos += lead_space as usize;
            while s.class(pos, hi) & WS_L_N == 0 && s.class(pos, hi) != 0 {
                pos += 1;
            }
            emit(start, pos);
            continue;
        }
        // \s+(?!\S) | \s+
        let mut n_ws = 0;
        while s.class(pos + n_ws, hi) & WHITESPACE != 0 {
            n_ws += 1;
        }
        pos = after_whitespace(pos, n_ws, hi);
        emit(start, pos);
    }
}

/// Splits `lo..hi` into maximal runs of code points that satisfy `matches` and the gaps
/// between them, emitting both in order (a regex `X+` used as a splitter).
fn split_runs(
    lo: usize,
    hi: usize,
    matches: impl Fn(usize) -> bool,
    emit: &mut impl FnMut(usize, usize),
) {
    let mut pos = lo;
    while pos < hi {
        let start = pos;
        let m = matches(pos);
        while pos < hi && matches(pos) == m {
            pos += 1;
        }
        emit(start, pos);
    }
}

/// The reference's AFMoE digit splitter: each run of `\p{N}` is cut into threes from the
/// right; the leading one or two digits (or, when the run's length is a multiple of
/// three, its first three) close the piece that began after the previous cut, so text
/// before a number joins the number's first group. Text after the last number is one piece.
fn split_afmoe_digits(s: &SplitScratch, lo: usize, hi: usize, emit: &mut impl FnMut(usize, usize)) {
    let mut piece_start = lo;
    let mut pos = lo;
    while pos < hi {
        if s.cls[pos] & NUMBER == 0 {
            pos += 1;
            continue;
        }
        let run_start = pos;
        while pos < hi && s.cls[pos] & NUMBER != 0 {
            pos += 1;
        }
        let lead = (pos - run_start) % 3;
        let mut cut = run_start;
        if lead > 0 {
            cut += lead;
            emit(piece_start, cut);
            piece_start = cut;
        }
        while cut < pos {
            cut += 3;
            emit(piece_start, cut);
            piece_start = cut;
        }
    }
    if piece_start < hi {
        emit(piece_start, hi);
    }
}

/// `\p{N}` (each digit alone; the text between digits one piece), then GPT-2's pattern
/// within each piece.
fn split_digits_then_gpt2(
    s: &SplitScratch,
    lo: usize,
    hi: usize,
    emit: &mut impl FnMut(usize, usize),
) {
    let mut gap_start = lo;
    for i in lo..hi {
        if s.cls[i] & NUMBER != 0 {
            if i > gap_start {
                split_gpt2(s, gap_start, i, emit);
            }
            emit(i, i + 1);
            gap_start = i + 1;
        }
    }
    if hi > gap_start {
        split_gpt2(s, gap_start, hi, emit);
    }
}

/// Splits each piece of `pieces` by the leftmost-longest matches of one pattern:
/// `match_at(i, hi)` is the end of the match starting at `i` within a piece ending at `hi`
/// (`None`: no match there). Matches and the gaps between them become the new pieces, as
/// a regex iterator over each piece makes them.
fn split_stage(
    pieces: &[(usize, usize)],
    match_at: impl Fn(usize, usize) -> Option<usize>,
) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(pieces.len());
    for &(lo, hi) in pieces {
        let (mut gap, mut i) = (lo, lo);
        while i < hi {
            match match_at(i, hi) {
                Some(end) if end > i => {
                    if i > gap {
                        out.push((gap, i));
                    }
                    out.push((i, end));
                    (gap, i) = (end, end);
                }
                _ => i += 1,
            }
        }
        if hi > gap {
            out.push((gap, hi));
        }
    }
    out
}

/// The letter class of DeepSeek LLM's second pattern, as inclusive code-point ranges in
/// ascending order (from the model's `tokenizer.json`).
pub const DEEPSEEK_LLM_LETTERS: &[(u32, u32)] = &[
    (0x0041, 0x005A),
    (0x0061, 0x007A),
    (0x00B5, 0x00B5),
    (0x00C0, 0x00D6),
    (0x00D8, 0x00F6),
    (0x00F8, 0x01BA),
    (0x01BC, 0x01BF),
    (0x01C4, 0x0293),
    (0x0295, 0x02AF),
    (0x0370, 0x0373),
    (0x0376, 0x0376),
    (0x0377, 0x0377),
    (0x037B, 0x037D),
    (0x037F, 0x037F),
    (0x0386, 0x0386),
    (0x0388, 0x038A),
    (0x038C, 0x038C),
    (0x038E, 0x03A1),
    (0x03A3, 0x03F5),
    (0x03F7, 0x0481),
    (0x048A, 0x052F),
    (0x0531, 0x0556),
    (0x10A0, 0x10C5),
    (0x13A0, 0x13F5),
    (0x13F8, 0x13FD),
    (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B),
    (0x1D6B, 0x1D77),
    (0x1D79, 0x1D9A),
    (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45),
    (0x1F48, 0x1F4D),
    (0x1F50, 0x1F57),
    (0x1F59, 0x1F59),
    (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D),
    (0x1F80, 0x1FB4),
    (0x1FB6, 0x1FBC),
    (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4),
    (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3),
    (0x1FD6, 0x1FDB),
    (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4),
    (0x1FF6, 0x1FFC),
    (0x2102, 0x2102),
    (0x2107, 0x2107),
    (0x210A, 0x2113),
    (0x2115, 0x2115),
    (0x2119, 0x211D),
    (0x2124, 0x2124),
    (0x2126, 0x2126),
    (0x2128, 0x2128),
    (0x212A, 0x212D),
    (0x212F, 0x2134),
    (0x2139, 0x2139),
    (0x213C, 0x213F),
    (0x2145, 0x2149),
    (0x214E, 0x214E),
    (0x2183, 0x2183),
    (0x2184, 0x2184),
    (0x2C00, 0x2C7B),
    (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE),
    (0x2CF2, 0x2CF2),
    (0x2CF3, 0x2CF3),
    (0xA640, 0xA66D),
    (0xA680, 0xA69B),
    (0xA722, 0xA76F),
    (0xA771, 0xA787),
    (0xA78B, 0xA78E),
    (0xAB70, 0xABBF),
    (0xFB00, 0xFB06),
    (0xFB13, 0xFB17),
    (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A),
    (0x10400, 0x1044F),
    (0x104B0, 0x104D3),
    (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2),
    (0x10CC0, 0x10CF2),
    (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
];

/// DeepSeek's CJK stage: `[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+`'s set.
fn deepseek_cjk(cp: u32) -> bool {
    (0x4E00..=0x9FA5).contains(&cp)
        || (0x0800..=0x4E00).contains(&cp)
        || (0xAC00..=0xD7FF).contains(&cp)
}

/// DeepSeek LLM's letter set ([`DEEPSEEK_LLM_LETTERS`], sorted disjoint ranges).
fn deepseek_llm_letter(cp: u32) -> bool {
    DEEPSEEK_LLM_LETTERS
        .binary_search_by(|&(a, b)| {
            if b < cp {
                std::cmp::Ordering::Less
            } else if a > cp {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// DeepSeek LLM's punctuation set.
fn deepseek_llm_punct(cp: u32) -> bool {
    matches!(cp, 0x21..=0x2F | 0x3A..=0x7E | 0xFF01..=0xFF0F | 0xFF1A..=0xFF5E
        | 0x2018..=0x201F | 0x3000..=0x3002)
}

/// DeepSeek Coder's five patterns, or (with `llm`) DeepSeek LLM's six, in sequence.
fn split_deepseek(
    s: &SplitScratch,
    lo: usize,
    hi: usize,
    llm: bool,
    emit: &mut impl FnMut(usize, usize),
) {
    let is = |i: usize, hi: usize, class: u8| s.class(i, hi) & class != 0;
    let in_set = |i: usize, hi: usize, set: &dyn Fn(u32) -> bool| i < hi && set(s.cps[i]);
    let is_crlf = |i: usize| s.cps[i] == '\r' as u32 || s.cps[i] == '\n' as u32;
    // `\s?X+`: an optional white-space code point, then a run of X.
    let ws_then_run = |set: &dyn Fn(u32, u8) -> bool, i: usize, hi: usize| {
        let x = |j: usize| j < hi && set(s.cps[j], s.cls[j]);
        let start = if is(i, hi, WHITESPACE) && x(i + 1) {
            i + 1
        } else if x(i) {
            i
        } else {
            return None;
        };
        let mut end = start;
        while x(end) {
            end += 1;
        }
        Some(end)
    };
    let llm_letter = |cp: u32, _: u8| deepseek_llm_letter(cp);
    let llm_punct = |cp: u32, _: u8| deepseek_llm_punct(cp);
    let mut pieces = vec![(lo, hi)];
    pieces = split_stage(&pieces, |i, _| is_crlf(i).then_some(i + 1));
    if llm {
        pieces = split_stage(&pieces, |i, hi| ws_then_run(&llm_letter, i, hi));
        pieces = split_stage(&pieces, |i, hi| ws_then_run(&llm_punct, i, hi));
        // `\s+$`: white space running to the end of the piece.
        pieces = split_stage(&pieces, |i, hi| {
            let mut end = i;
            while is(end, hi, WHITESPACE) {
                end += 1;
            }
            (end > i && end == hi).then_some(end)
        });
    } else {
        pieces = split_stage(&pieces, |i, hi| ws_then_run(&|_, c| c & LETTER != 0, i, hi));
        pieces = split_stage(&pieces, |i, hi| ws_then_run(&|_, c| c & PUNCT != 0, i, hi));
    }
    pieces = split_stage(&pieces, |i, hi| {
        let mut end = i;
        while in_set(end, hi, &deepseek_cjk) {
            end += 1;
        }
        (end > i).then_some(end)
    });
    pieces = split_stage(&pieces, |i, hi| {
        if !is(i, hi, NUMBER) {
            return None;
        }
        let mut end = i + 1;
        // Coder: `\p{N}`, one digit a piece; LLM: `\p{N}+`.
        while llm && is(end, hi, NUMBER) {
            end += 1;
        }
        Some(end)
    });
    for (a, b) in pieces {
        emit(a, b);
    }
}

/// The reference's `default` sequence of four splitting patterns, or with `falcon`
/// Falcon's three (the backtick joins the first pattern's set; no `\p{N}+` stage).
fn split_default(
    s: &SplitScratch,
    lo: usize,
    hi: usize,
    falcon: bool,
    emit: &mut impl FnMut(usize, usize),
) {
    // Stage 1: [\p{P}\$\+<=>\^~\|]+ (falcon: and `)
    let is_stage1 = |i: usize| {
        let c = s.cps[i];
        s.cls[i] & PUNCT != 0
            || [b'$', b'+', b'<', b'=', b'>', b'^', b'~', b'|']
                .iter()
                .any(|&x| c == x as u32)
            || (falcon && c == '`' as u32)
    };
    let is_digit = |i: usize| s.cls[i] & NUMBER != 0;
    let is_ascii_digit = |i: usize| (b'0' as u32..=b'9' as u32).contains(&s.cps[i]);
    // Last stage: [0-9][0-9][0-9], leftmost non-overlapping matches.
    let triples = |e: usize, f: usize, emit: &mut dyn FnMut(usize, usize)| {
        let mut gap_start = e;
        let mut i = e;
        while i + 3 <= f {
            if is_ascii_digit(i) && is_ascii_digit(i + 1) && is_ascii_digit(i + 2) {
                if i > gap_start {
                    emit(gap_start, i);
                }
                emit(i, i + 3);
                i += 3;
                gap_start = i;
            } else {
                i += 1;
            }
        }
        if f > gap_start {
            emit(gap_start, f);
        }
    };
    split_runs(lo, hi, is_stage1, &mut |a, b| {
        split_gpt2(s, a, b, &mut |c, d| {
            if falcon {
                triples(c, d, emit);
            } else {
                // Stage 3: \p{N}+
                split_runs(c, d, is_digit, &mut |e, f| triples(e, f, emit));
            }
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(pre: PreTokenizer, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut scratch = SplitScratch::default();
        pre.split(text.as_bytes(), &mut scratch, &mut |a, b| {
            out.push(text[a..b].to_string())
        });
        out
    }

    #[test]
    fn llama3_groups_digits_by_three_and_keeps_contractions() {
        assert_eq!(
            pieces(PreTokenizer::Llama3, "I'VE 12345 cats"),
            ["I", "'VE", " ", "123", "45", " cats"]
        );
        assert_eq!(
            pieces(PreTokenizer::Qwen2, "ab 123"),
            ["ab", " ", "1", "2", "3"]
        );
    }

    #[test]
    fn llama3_whitespace_rules() {
        // \s*[\r\n]+ takes the white space up to the last newline of the run.
        assert_eq!(
            pieces(PreTokenizer::Llama3, "a \n\n  b"),
            ["a", " \n\n", " ", " b"]
        );
        // \s+(?!\S) leaves the last space to prefix the next word.
        assert_eq!(pieces(PreTokenizer::Llama3, "a   b"), ["a", "  ", " b"]);
        // Trailing white space is one piece.
        assert_eq!(pieces(PreTokenizer::Llama3, "a   "), ["a", "   "]);
        // Punctuation takes an optional leading space and trailing newlines.
        assert_eq!(
            pieces(PreTokenizer::Llama3, "x !!\n\ny"),
            ["x", " !!\n\n", "y"]
        );
    }

    #[test]
    fn gpt2_rules() {
        assert_eq!(
            pieces(PreTokenizer::Gpt2, "Hello world's 42!!"),
            ["Hello", " world", "'s", " 42", "!!"]
        );
        // Case-sensitive contractions: 'S is not one.
        assert_eq!(pieces(PreTokenizer::Gpt2, "IT'S"), ["IT", "'", "S"]);
        assert_eq!(pieces(PreTokenizer::Gpt2, "a  \n b"), ["a", "  \n", " b"]);
    }

    #[test]
    fn default_sequence() {
        assert_eq!(
            pieces(PreTokenizer::Default, "x=1234567;"),
            ["x", "=", "123", "456", "7", ";"]
        );
    }

    #[test]
    fn invalid_bytes_are_kept_in_pieces() {
        let text = b"ab\xFF\xFEcd";
        let mut out = Vec::new();
        let mut scratch = SplitScratch::default();
        PreTokenizer::Qwen2.split(text, &mut scratch, &mut |a, b| {
            out.push(text[a..b].to_vec())
        });
        assert_eq!(out.concat(), text.to_vec());
        assert_eq!(out, [b"ab".to_vec(), b"\xFF\xFE".to_vec(), b"cd".to_vec()]);
    }

    #[test]
    fn names_map_to_splitters() {
        assert_eq!(
            PreTokenizer::from_name("qwen2").unwrap().pre,
            PreTokenizer::Qwen2
        );
        assert!(PreTokenizer::from_name("llama-bpe").unwrap().ignore_merges);
        assert!(PreTokenizer::from_name("no-such-pre").is_none());
    }
}
