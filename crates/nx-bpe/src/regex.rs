//! A backtracking regex engine that splits text the way the reference (llama.cpp's
//! `unicode_regex_split`) does for the pre-tokenizer patterns it hands to `std::regex`.
//!
//! Why not an ordinary Unicode regex engine: the reference does not run these patterns
//! as Unicode regexes. When a pattern names a Unicode category (`\p{L}`, `\p{N}`, ...), it
//! first *collapses* the text to one `char` per code point (ASCII stays; non-ASCII white
//! space becomes `\v`; every other code point becomes a byte standing for its category),
//! rewrites each `\p{X}` into that byte plus the category's ASCII members, and runs
//! libstdc++'s `std::regex` (ECMAScript grammar, `optimize | nosubs`) over the bytes.
//! Patterns without a category run as `std::wregex` over the code points (non-ASCII white
//! space again replaced by `\v`). The splits carry quirks no Unicode engine reproduces:
//! `\p{Lu}` means any letter, `[^a-z]` matches every non-ASCII letter, `\s` and `\w` know
//! only ASCII, a loop whose body matched empty may run once more at the same position
//! (libstdc++'s rule, not the ECMAScript one), lookaheads inherit the match flags of
//! `std::regex_iterator`'s retry after an empty match.
//!
//! So this module parses the same ECMAScript subset the way libstdc++'s scanner does,
//! builds an NFA shaped like libstdc++'s (same alternation order, same loop and counted
//! repeat structure, same per-loop "visited here already" counters), and walks it
//! depth-first in the same order, with an explicit backtrack stack so that long inputs
//! cost heap rather than call stack (only lookahead nesting, a property of the pattern,
//! recurses). [`split_with`] then iterates matches over each piece exactly as
//! `std::regex_iterator` and the reference's `unicode_regex_split_stl` do, empty matches
//! included. A piece whose matching gets expensive switches to exact memoisation of
//! loop nodes (linear rescans where the reference is quadratic), and every piece runs
//! under a step budget; see [`split_with`] for what happens when an input exhausts it.
//!
//! Unsupported (an error, never used by the reference's table): back references,
//! `[.x.]` and `[=x=]` inside brackets. The C++ "C" locale is assumed for `\s`, `\w`,
//! `\d` and `[:class:]` (ASCII only), as in a program that never sets a C++ locale.

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

use crate::unicode::is_white_space;

/// Why a pattern could not be compiled (`at` counts pattern units: code points, or bytes
/// of the category-rewritten pattern).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RegexError {
    /// The reference refuses a pattern that uses a Unicode category and also contains a
    /// non-ASCII character (it cannot collapse both).
    #[error("regex uses a unicode category and non-ASCII characters together")]
    CategoryWithNonAscii,
    /// The pattern is malformed (where `std::regex` would throw `regex_error`).
    #[error("regex syntax error at unit {at}: {what}")]
    Syntax { at: usize, what: &'static str },
    /// Valid for `std::regex`, but this engine does not implement it.
    #[error("regex construct not supported at unit {at}: {what}")]
    Unsupported { at: usize, what: &'static str },
    /// The NFA would exceed libstdc++'s own state limit (counted repeats expand).
    #[error("regex needs more than {limit} NFA states")]
    TooLarge { limit: usize },
}

/// libstdc++ refuses NFAs above this many states (`_GLIBCXX_REGEX_STATE_LIMIT`).
const MAX_STATES: usize = 100_000;
/// Deepest nesting of groups, lookaheads and stacked quantifiers the parser accepts; it
/// bounds the recursion of parsing, compiling and lookahead evaluation.
const MAX_DEPTH: usize = 64;
/// Backtracking steps one piece may take: a fixed allowance plus this much per code point.
const STEP_BUDGET_BASE: u64 = 1 << 22;
const STEP_BUDGET_PER_UNIT: u64 = 2048;
/// Steps a piece takes before memoisation starts (ordinary text needs a few dozen per
/// code point and never gets there).
const MEMO_AFTER_BASE: u64 = 1 << 14;
const MEMO_AFTER_PER_UNIT: u64 = 128;
/// At most this many memo entries per piece (about 100 MiB).
const MEMO_MAX_ENTRIES: usize = 1 << 22;

/// Which text a pattern runs over, as in the reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `std::regex` over the category-collapsed text: units are signed `char` values.
    Collapsed,
    /// `std::wregex` over the code points: units are `wchar_t` values.
    Wide,
}

/// The categories the reference rewrites: the pattern text, the byte a non-ASCII code
/// point of that category collapses to, and the category's ASCII members as bracket
/// content (exactly the reference's strings).
const CATEGORIES: [(&[u8], u8, &[u8]); 10] = [
    (b"\\p{N}", COLLAPSED_NUMBER, b"0-9"),
    (b"\\p{L}", COLLAPSED_LETTER, b"A-Za-z"),
    (b"\\p{P}", COLLAPSED_PUNCT, br"!-#%-*,-/:-;?-@\[-\]_\{\}"),
    (b"\\p{M}", COLLAPSED_MARK, b""),
    (b"\\p{S}", COLLAPSED_SYMBOL, br"\$\+<->^`\|\~"),
    (b"\\p{Lu}", COLLAPSED_LETTER, b"A-Za-z"),
    (b"\\p{Ll}", COLLAPSED_LETTER, b"A-Za-z"),
    (b"\\p{Lt}", COLLAPSED_LETTER, b"A-Za-z"),
    (b"\\p{Lm}", COLLAPSED_LETTER, b"A-Za-z"),
    (b"\\p{Lo}", COLLAPSED_LETTER, b"A-Za-z"),
];

const COLLAPSED_OTHER: u8 = 0xD0;
const COLLAPSED_NUMBER: u8 = 0xD1;
const COLLAPSED_LETTER: u8 = 0xD2;
const COLLAPSED_PUNCT: u8 = 0xD3;
const COLLAPSED_MARK: u8 = 0xD4;
const COLLAPSED_SYMBOL: u8 = 0xD5;
/// What non-ASCII white space becomes in both texts (`\v`, which `\s` matches).
const WHITESPACE_STANDIN: u8 = 0x0B;

/// A byte as the signed `char` libstdc++ compares.
fn signed(b: u8) -> i32 {
    i32::from(b as i8)
}

/// One code point of the collapsed text.
fn collapsed_unit(cp: u32) -> i32 {
    if cp < 128 {
        return cp as i32;
    }
    if is_white_space(cp) {
        return signed(WHITESPACE_STANDIN);
    }
    let byte = match char::from_u32(cp).map(get_general_category) {
        Some(Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber) => COLLAPSED_NUMBER,
        Some(
            Gc::UppercaseLetter
            | Gc::LowercaseLetter
            | Gc::TitlecaseLetter
            | Gc::ModifierLetter
            | Gc::OtherLetter,
        ) => COLLAPSED_LETTER,
        Some(
            Gc::ConnectorPunctuation
            | Gc::DashPunctuation
            | Gc::OpenPunctuation
            | Gc::ClosePunctuation
            | Gc::InitialPunctuation
            | Gc::FinalPunctuation
            | Gc::OtherPunctuation,
        ) => COLLAPSED_PUNCT,
        Some(Gc::NonspacingMark | Gc::SpacingMark | Gc::EnclosingMark) => COLLAPSED_MARK,
        Some(Gc::MathSymbol | Gc::CurrencySymbol | Gc::ModifierSymbol | Gc::OtherSymbol) => {
            COLLAPSED_SYMBOL
        }
        _ => COLLAPSED_OTHER,
    };
    signed(byte)
}

/// One code point of the wide text (`wchar_t` is a signed 32-bit int).
fn wide_unit(cp: u32) -> i32 {
    if cp > 0x7F && is_white_space(cp) {
        i32::from(WHITESPACE_STANDIN)
    } else {
        cp as i32
    }
}

// ---------------------------------------------------------------------------------------
// Character classes: the "C" locale's ctype, which is ASCII-only for char and wchar_t.

const C_UPPER: u16 = 1;
const C_LOWER: u16 = 2;
const C_DIGIT: u16 = 4;
const C_XDIGIT: u16 = 8;
const C_SPACE: u16 = 16;
const C_PRINT: u16 = 32;
const C_CNTRL: u16 = 64;
const C_PUNCT: u16 = 128;
const C_BLANK: u16 = 256;
/// libstdc++'s extra bit of `\w`: the underscore.
const C_UNDER: u16 = 512;
const C_ALPHA: u16 = C_UPPER | C_LOWER;
const C_ALNUM: u16 = C_ALPHA | C_DIGIT;
const C_WORD: u16 = C_ALNUM | C_UNDER;

/// The class bits of a unit in the "C" locale (none outside ASCII).
fn ctype_bits(u: i32) -> u16 {
    let Ok(b) = u8::try_from(u) else {
        return 0;
    };
    if b >= 128 {
        return 0;
    }
    let mut m = 0;
    if b.is_ascii_uppercase() {
        m |= C_UPPER;
    }
    if b.is_ascii_lowercase() {
        m |= C_LOWER;
    }
    if b.is_ascii_digit() {
        m |= C_DIGIT;
    }
    if b.is_ascii_hexdigit() {
        m |= C_XDIGIT;
    }
    if matches!(b, 0x09..=0x0D | b' ') {
        m |= C_SPACE;
    }
    if (0x20..0x7F).contains(&b) {
        m |= C_PRINT;
    }
    if b < 0x20 || b == 0x7F {
        m |= C_CNTRL;
    }
    if b.is_ascii_punctuation() {
        m |= C_PUNCT;
    }
    if b == b' ' || b == b'\t' {
        m |= C_BLANK;
    }
    if b == b'_' {
        m |= C_UNDER;
    }
    m
}

/// `isctype`: does the unit have any of the bits of `mask`?
fn ctype_is(mask: u16, u: i32) -> bool {
    ctype_bits(u) & mask != 0
}

fn is_word(u: i32) -> bool {
    ctype_is(C_WORD, u)
}

/// The classes `[:name:]` may name (libstdc++'s `lookup_classname`).
fn class_by_name(name: &[i32]) -> Option<u16> {
    let mut s = [0u8; 8];
    if name.len() > s.len() {
        return None;
    }
    for (d, &u) in s.iter_mut().zip(name) {
        *d = u8::try_from(u)
            .ok()
            .filter(u8::is_ascii)?
            .to_ascii_lowercase();
    }
    Some(match &s[..name.len()] {
        b"d" | b"digit" => C_DIGIT,
        b"w" => C_WORD,
        b"s" | b"space" => C_SPACE,
        b"alnum" => C_ALNUM,
        b"alpha" => C_ALPHA,
        b"blank" => C_BLANK,
        b"cntrl" => C_CNTRL,
        b"graph" => C_ALNUM | C_PUNCT,
        b"lower" => C_LOWER,
        b"print" => C_PRINT,
        b"punct" => C_PUNCT,
        b"upper" => C_UPPER,
        b"xdigit" => C_XDIGIT,
        _ => return None,
    })
}

/// A bracket expression (or `\d`-style class), ready to test units.
#[derive(Clone, Debug)]
struct CharSet {
    /// Final membership of the units `0..256` (wide mode) or of every signed byte, indexed
    /// by the byte's bit pattern (collapsed mode).
    table: [u64; 4],
    /// The listed characters and ranges, sorted and merged (for wide units past 255).
    ranges: Vec<(i32, i32)>,
    /// A negated class (`\S`, `\W`, `\D` inside brackets) matches every non-ASCII unit.
    neg_class: bool,
    negated: bool,
}

/// A bracket expression being parsed.
#[derive(Default)]
struct SetBuilder {
    negated: bool,
    ranges: Vec<(i32, i32)>,
    classes: u16,
    neg_classes: Vec<u16>,
}

impl SetBuilder {
    fn add_char(&mut self, c: i32) {
        self.ranges.push((c, c));
    }

    fn finish(mut self, mode: Mode) -> CharSet {
        self.ranges.sort_unstable();
        let mut merged: Vec<(i32, i32)> = Vec::with_capacity(self.ranges.len());
        for (lo, hi) in self.ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        let mut set = CharSet {
            table: [0; 4],
            ranges: merged,
            neg_class: !self.neg_classes.is_empty(),
            negated: self.negated,
        };
        for idx in 0..256usize {
            let u = match mode {
                Mode::Collapsed => signed(idx as u8),
                Mode::Wide => idx as i32,
            };
            let member = set.in_ranges(u)
                || ctype_is(self.classes, u)
                || self.neg_classes.iter().any(|&m| !ctype_is(m, u));
            if member != set.negated {
                set.table[idx / 64] |= 1 << (idx % 64);
            }
        }
        set
    }

    /// `[:name:]`, `\d`, `\S`, ... inside brackets.
    fn add_class(&mut self, mask: u16, negated: bool) {
        if negated {
            self.neg_classes.push(mask);
        } else {
            self.classes |= mask;
        }
    }
}

impl CharSet {
    fn in_ranges(&self, u: i32) -> bool {
        let i = self.ranges.partition_point(|&(lo, _)| lo <= u);
        i > 0 && self.ranges[i - 1].1 >= u
    }

    #[inline]
    fn matches(&self, u: i32, mode: Mode) -> bool {
        let idx = match mode {
            Mode::Collapsed => Some(u as u8 as usize),
            Mode::Wide => usize::try_from(u).ok().filter(|&i| i < 256),
        };
        match idx {
            Some(i) => self.table[i / 64] >> (i % 64) & 1 != 0,
            None => (self.in_ranges(u) || self.neg_class) != self.negated,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Parsing: the ECMAScript grammar as libstdc++'s scanner and compiler read it.

/// What a single-unit state tests.
#[derive(Clone, Copy, Debug)]
enum Matcher {
    Lit(i32),
    /// ECMAScript `.`: anything but a line terminator.
    Any,
    Set(u32),
}

#[derive(Clone, Copy, Debug)]
enum Quant {
    Star,
    Plus,
    Opt,
    /// `{min}`, `{min,}` (`max` = None) and `{min,max}`.
    Count {
        min: u32,
        max: Option<u32>,
    },
}

#[derive(Debug)]
enum Node {
    Empty,
    Match(Matcher),
    Concat(Vec<Node>),
    Alt(Vec<Node>),
    Repeat {
        node: Box<Node>,
        quant: Quant,
        greedy: bool,
    },
    LineBegin,
    LineEnd,
    WordBoundary {
        negated: bool,
    },
    Look {
        node: Box<Node>,
        negated: bool,
    },
}

/// One escape sequence, as `_M_eat_escape_ecma` reads it.
enum Escape {
    Char(i32),
    Class {
        mask: u16,
        negated: bool,
    },
    /// `\b` or `\B` outside brackets (an assertion; `term` reads those itself).
    WordBoundary,
}

/// A token inside brackets.
enum BracketToken {
    Char(i32),
    Class { mask: u16, negated: bool },
    Dash,
    End,
}

struct Parser<'a> {
    p: &'a [i32],
    i: usize,
    mode: Mode,
    sets: Vec<CharSet>,
}

fn is(u: Option<i32>, c: u8) -> bool {
    u == Some(i32::from(c))
}

impl Parser<'_> {
    fn peek(&self) -> Option<i32> {
        self.p.get(self.i).copied()
    }

    fn peek_at(&self, k: usize) -> Option<i32> {
        self.p.get(self.i + k).copied()
    }

    fn syntax(&self, what: &'static str) -> RegexError {
        RegexError::Syntax { at: self.i, what }
    }

    fn eat(&mut self, c: u8) -> bool {
        if is(self.peek(), c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn parse(&mut self) -> Result<Node, RegexError> {
        let node = self.disjunction(0)?;
        if self.i != self.p.len() {
            return Err(self.syntax("unmatched ')' or misplaced quantifier"));
        }
        Ok(node)
    }

    fn disjunction(&mut self, depth: usize) -> Result<Node, RegexError> {
        if depth > MAX_DEPTH {
            return Err(RegexError::Unsupported {
                at: self.i,
                what: "nesting too deep",
            });
        }
        let mut alts = vec![self.alternative(depth)?];
        while self.eat(b'|') {
            alts.push(self.alternative(depth)?);
        }
        Ok(if alts.len() == 1 {
            alts.pop().unwrap_or(Node::Empty)
        } else {
            Node::Alt(alts)
        })
    }

    fn alternative(&mut self, depth: usize) -> Result<Node, RegexError> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == i32::from(b'|') || c == i32::from(b')') {
                break;
            }
            items.push(self.term(depth)?);
        }
        Ok(match items.len() {
            0 => Node::Empty,
            1 => items.pop().unwrap_or(Node::Empty),
            _ => Node::Concat(items),
        })
    }

    /// An assertion, or an atom with any quantifiers after it.
    fn term(&mut self, depth: usize) -> Result<Node, RegexError> {
        let c = self.peek();
        if is(c, b'^') {
            self.i += 1;
            return Ok(Node::LineBegin);
        }
        if is(c, b'$') {
            self.i += 1;
            return Ok(Node::LineEnd);
        }
        if is(c, b'\\') && (is(self.peek_at(1), b'b') || is(self.peek_at(1), b'B')) {
            let negated = is(self.peek_at(1), b'B');
            self.i += 2;
            return Ok(Node::WordBoundary { negated });
        }
        if is(c, b'(') && is(self.peek_at(1), b'?') {
            let kind = self.peek_at(2);
            if is(kind, b'=') || is(kind, b'!') {
                self.i += 3;
                let node = self.disjunction(depth + 1)?;
                if !self.eat(b')') {
                    return Err(self.syntax("lookahead is not closed"));
                }
                return Ok(Node::Look {
                    node: Box::new(node),
                    negated: is(kind, b'!'),
                });
            }
        }
        let mut node = self.atom(depth)?;
        let mut stacked = depth;
        while let Some(quant) = self.quantifier()? {
            stacked += 1;
            if stacked > MAX_DEPTH {
                return Err(RegexError::Unsupported {
                    at: self.i,
                    what: "too many stacked quantifiers",
                });
            }
            let greedy = !self.eat(b'?');
            node = Node::Repeat {
                node: Box::new(node),
                quant,
                greedy,
            };
        }
        Ok(node)
    }

    fn quantifier(&mut self) -> Result<Option<Quant>, RegexError> {
        let c = self.peek();
        let quant = if is(c, b'*') {
            Quant::Star
        } else if is(c, b'+') {
            Quant::Plus
        } else if is(c, b'?') {
            Quant::Opt
        } else if is(c, b'{') {
            self.i += 1;
            let min = self
                .number()?
                .ok_or_else(|| self.syntax("expected a count after '{'"))?;
            let max = if self.eat(b',') {
                self.number()?
            } else {
                Some(min)
            };
            if !self.eat(b'}') {
                return Err(self.syntax("expected '}'"));
            }
            if max.is_some_and(|m| m < min) {
                return Err(self.syntax("repeat range {n,m} with m < n"));
            }
            return Ok(Some(Quant::Count { min, max }));
        } else {
            return Ok(None);
        };
        self.i += 1;
        Ok(Some(quant))
    }

    /// Decimal digits inside braces.
    fn number(&mut self) -> Result<Option<u32>, RegexError> {
        let mut v: Option<u32> = None;
        while let Some(d) = self.peek().and_then(|u| u8::try_from(u).ok()) {
            if !d.is_ascii_digit() {
                break;
            }
            let next = v
                .unwrap_or(0)
                .checked_mul(10)
                .and_then(|x| x.checked_add(u32::from(d - b'0')))
                .filter(|&x| x <= i32::MAX as u32)
                .ok_or_else(|| self.syntax("repeat count too large"))?;
            v = Some(next);
            self.i += 1;
        }
        Ok(v)
    }

    fn atom(&mut self, depth: usize) -> Result<Node, RegexError> {
        let Some(c) = self.peek() else {
            return Err(self.syntax("unexpected end of pattern"));
        };
        let Ok(b) = u8::try_from(c) else {
            self.i += 1;
            return Ok(Node::Match(Matcher::Lit(c)));
        };
        match b {
            b'.' => {
                self.i += 1;
                Ok(Node::Match(Matcher::Any))
            }
            b'(' => {
                self.i += 1;
                if self.eat(b'?') && !self.eat(b':') {
                    return Err(self.syntax("invalid '(?' group"));
                }
                // With `nosubs`, a capturing group is a plain group.
                let node = self.disjunction(depth + 1)?;
                if !self.eat(b')') {
                    return Err(self.syntax("group is not closed"));
                }
                Ok(node)
            }
            b'[' => {
                self.i += 1;
                self.bracket()
            }
            b'*' | b'+' | b'?' | b'{' => Err(self.syntax("quantifier without anything to repeat")),
            b'\\' => {
                self.i += 1;
                match self.escape(false)? {
                    Escape::Char(c) => Ok(Node::Match(Matcher::Lit(c))),
                    Escape::Class { mask, negated } => {
                        let mut set = SetBuilder {
                            negated,
                            ..SetBuilder::default()
                        };
                        set.add_class(mask, false);
                        Ok(self.push_set(set))
                    }
                    // `term` handles `\b` and `\B` before atoms.
                    Escape::WordBoundary => Err(self.syntax("misplaced word boundary")),
                }
            }
            _ => {
                self.i += 1;
                Ok(Node::Match(Matcher::Lit(c)))
            }
        }
    }

    fn push_set(&mut self, set: SetBuilder) -> Node {
        self.sets.push(set.finish(self.mode));
        Node::Match(Matcher::Set((self.sets.len() - 1) as u32))
    }

    /// The escape after a backslash (already consumed).
    fn escape(&mut self, in_bracket: bool) -> Result<Escape, RegexError> {
        let Some(c) = self.peek() else {
            return Err(self.syntax("pattern ends in a backslash"));
        };
        self.i += 1;
        let Some(b) = u8::try_from(c).ok().filter(u8::is_ascii) else {
            return Ok(Escape::Char(c));
        };
        let class = |mask| Escape::Class {
            mask,
            negated: b.is_ascii_uppercase(),
        };
        Ok(match b {
            b'0' => Escape::Char(0),
            b'b' if in_bracket => Escape::Char(0x08),
            b'b' => Escape::WordBoundary,
            b'B' if in_bracket => {
                return Err(self.syntax("\\B inside brackets"));
            }
            b'B' => Escape::WordBoundary,
            b'f' => Escape::Char(0x0C),
            b'n' => Escape::Char(0x0A),
            b'r' => Escape::Char(0x0D),
            b't' => Escape::Char(0x09),
            b'v' => Escape::Char(0x0B),
            b'd' | b'D' => class(C_DIGIT),
            b's' | b'S' => class(C_SPACE),
            b'w' | b'W' => class(C_WORD),
            // libstdc++ reads `\cX` as the character X.
            b'c' => {
                let Some(x) = self.peek() else {
                    return Err(self.syntax("pattern ends after \\c"));
                };
                self.i += 1;
                Escape::Char(x)
            }
            b'x' | b'u' => {
                let n = if b == b'x' { 2 } else { 4 };
                let mut v: u32 = 0;
                for _ in 0..n {
                    let digit = self
                        .peek()
                        .and_then(|u| u32::try_from(u).ok())
                        .and_then(char::from_u32)
                        .and_then(|ch| ch.to_digit(16))
                        .ok_or_else(|| self.syntax("bad hex escape"))?;
                    v = v * 16 + digit;
                    self.i += 1;
                }
                // Converted to the pattern's character type, as libstdc++ does.
                Escape::Char(match self.mode {
                    Mode::Collapsed => signed(v as u8),
                    Mode::Wide => v as i32,
                })
            }
            b'1'..=b'9' => {
                return Err(RegexError::Unsupported {
                    at: self.i - 1,
                    what: "back reference (the reference compiles with nosubs)",
                });
            }
            _ => Escape::Char(c),
        })
    }

    fn bracket_token(&mut self) -> Result<BracketToken, RegexError> {
        let Some(c) = self.peek() else {
            return Err(self.syntax("bracket expression is not closed"));
        };
        self.i += 1;
        if c == i32::from(b'-') {
            return Ok(BracketToken::Dash);
        }
        if c == i32::from(b']') {
            return Ok(BracketToken::End);
        }
        if c == i32::from(b'\\') {
            return Ok(match self.escape(true)? {
                Escape::Char(c) => BracketToken::Char(c),
                Escape::Class { mask, negated } => BracketToken::Class { mask, negated },
                Escape::WordBoundary => return Err(self.syntax("\\B inside brackets")),
            });
        }
        if c == i32::from(b'[') {
            let next = self.peek();
            if next.is_none() {
                return Err(self.syntax("bracket expression is not closed"));
            }
            if is(next, b':') {
                self.i += 1;
                let start = self.i;
                loop {
                    match self.peek() {
                        None => return Err(self.syntax("unterminated [: :] class")),
                        Some(u) if u == i32::from(b':') => break,
                        Some(_) => self.i += 1,
                    }
                }
                let end = self.i;
                self.i += 1;
                if !self.eat(b']') {
                    return Err(self.syntax("unterminated [: :] class"));
                }
                let mask = class_by_name(&self.p[start..end])
                    .ok_or_else(|| self.syntax("unknown character class name"))?;
                return Ok(BracketToken::Class {
                    mask,
                    negated: false,
                });
            }
            if is(next, b'.') || is(next, b'=') {
                return Err(RegexError::Unsupported {
                    at: self.i - 1,
                    what: "collating symbols and equivalence classes",
                });
            }
        }
        Ok(BracketToken::Char(c))
    }

    /// The bracket expression after `[` (libstdc++'s `_M_insert_bracket_matcher` and
    /// `_M_expression_term`, including its handling of `-`).
    fn bracket(&mut self) -> Result<Node, RegexError> {
        let mut set = SetBuilder {
            negated: self.eat(b'^'),
            ..SetBuilder::default()
        };
        // The character a following `-` may start a range from.
        enum Last {
            None,
            Char(i32),
            Class,
        }
        let mut last = Last::None;
        let mut pending = None;
        // A character or dash first is a plain character.
        match self.bracket_token()? {
            BracketToken::Char(c) => last = Last::Char(c),
            BracketToken::Dash => last = Last::Char(i32::from(b'-')),
            other => pending = Some(other),
        }
        loop {
            let tok = match pending.take() {
                Some(t) => t,
                None => self.bracket_token()?,
            };
            match tok {
                BracketToken::End => break,
                BracketToken::Char(c) => {
                    if let Last::Char(p) = last {
                        set.add_char(p);
                    }
                    last = Last::Char(c);
                }
                BracketToken::Class { mask, negated } => {
                    if let Last::Char(p) = last {
                        set.add_char(p);
                    }
                    last = Last::Class;
                    set.add_class(mask, negated);
                }
                BracketToken::Dash => {
                    let next = self.bracket_token()?;
                    match (&last, next) {
                        (_, BracketToken::End) => {
                            if let Last::Char(p) = last {
                                set.add_char(p);
                            }
                            set.add_char(i32::from(b'-'));
                            last = Last::None;
                            break;
                        }
                        (Last::Class, _) => {
                            return Err(self.syntax("range starts at a character class"));
                        }
                        (Last::Char(lo), BracketToken::Char(hi)) => {
                            self.range(&mut set, *lo, hi)?;
                            last = Last::None;
                        }
                        (Last::Char(lo), BracketToken::Dash) => {
                            self.range(&mut set, *lo, i32::from(b'-'))?;
                            last = Last::None;
                        }
                        (Last::Char(_), BracketToken::Class { .. }) => {
                            return Err(self.syntax("range ends at a character class"));
                        }
                        (Last::None, other) => {
                            // A dash after a range or class-free start: a plain '-'.
                            last = Last::Char(i32::from(b'-'));
                            pending = Some(other);
                        }
                    }
                }
            }
        }
        if let Last::Char(p) = last {
            set.add_char(p);
        }
        Ok(self.push_set(set))
    }

    fn range(&self, set: &mut SetBuilder, lo: i32, hi: i32) -> Result<(), RegexError> {
        if lo > hi {
            return Err(self.syntax("range out of order in bracket expression"));
        }
        set.ranges.push((lo, hi));
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The NFA, shaped like libstdc++'s.

#[derive(Clone, Copy, Debug)]
enum State {
    Match {
        m: Matcher,
        next: u32,
    },
    /// Alternation: try `alt`, then `next`.
    Split {
        alt: u32,
        next: u32,
    },
    /// libstdc++'s repeat node: `body` is "once more", `next` is "stop"; greedy tries the
    /// body first. `slot` indexes its (position, visits) counter.
    Repeat {
        body: u32,
        next: u32,
        greedy: bool,
        slot: u32,
    },
    LineBegin {
        next: u32,
    },
    LineEnd {
        next: u32,
    },
    WordBoundary {
        negated: bool,
        next: u32,
    },
    Look {
        body: u32,
        negated: bool,
        next: u32,
    },
    Accept,
}

const ACCEPT: u32 = 0;
const UNPATCHED: u32 = u32::MAX;

struct Compiler {
    states: Vec<State>,
    slots: u32,
}

impl Compiler {
    fn push(&mut self, s: State) -> Result<u32, RegexError> {
        if self.states.len() >= MAX_STATES {
            return Err(RegexError::TooLarge { limit: MAX_STATES });
        }
        self.states.push(s);
        Ok((self.states.len() - 1) as u32)
    }

    fn repeat(&mut self, body: u32, next: u32, greedy: bool) -> Result<u32, RegexError> {
        let slot = self.slots;
        self.slots += 1;
        self.push(State::Repeat {
            body,
            next,
            greedy,
            slot,
        })
    }

    fn patch_body(&mut self, rep: u32, new_body: u32) {
        if let Some(State::Repeat { body, .. }) = self.states.get_mut(rep as usize) {
            *body = new_body;
        }
    }

    /// A loop: the repeat node, whose body leads back to it. Returns (repeat, body entry).
    fn looped(&mut self, node: &Node, next: u32, greedy: bool) -> Result<(u32, u32), RegexError> {
        let rep = self.repeat(UNPATCHED, next, greedy)?;
        let body = self.compile(node, rep)?;
        self.patch_body(rep, body);
        Ok((rep, body))
    }

    /// Compiles `node` so that it continues to `next`; returns its entry state.
    fn compile(&mut self, node: &Node, next: u32) -> Result<u32, RegexError> {
        match node {
            Node::Empty => Ok(next),
            Node::Match(m) => self.push(State::Match { m: *m, next }),
            Node::Concat(items) => {
                let mut entry = next;
                for item in items.iter().rev() {
                    entry = self.compile(item, entry)?;
                }
                Ok(entry)
            }
            Node::Alt(alts) => {
                let Some((last, rest)) = alts.split_last() else {
                    return Ok(next);
                };
                let mut entry = self.compile(last, next)?;
                for alt in rest.iter().rev() {
                    let a = self.compile(alt, next)?;
                    entry = self.push(State::Split {
                        alt: a,
                        next: entry,
                    })?;
                }
                Ok(entry)
            }
            Node::LineBegin => self.push(State::LineBegin { next }),
            Node::LineEnd => self.push(State::LineEnd { next }),
            Node::WordBoundary { negated } => self.push(State::WordBoundary {
                negated: *negated,
                next,
            }),
            Node::Look { node, negated } => {
                let body = self.compile(node, ACCEPT)?;
                self.push(State::Look {
                    body,
                    negated: *negated,
                    next,
                })
            }
            Node::Repeat {
                node,
                quant,
                greedy,
            } => match *quant {
                // `x*`: the repeat node first.
                Quant::Star => Ok(self.looped(node, next, *greedy)?.0),
                // `x+`: the body, then a repeat node looping back to that same body.
                Quant::Plus => Ok(self.looped(node, next, *greedy)?.1),
                Quant::Opt => {
                    let body = self.compile(node, next)?;
                    self.repeat(body, next, *greedy)
                }
                // Counted: `min` copies, then a loop on a further copy (`{n,}`) or
                // `max - min` nested optional copies, each one's "stop" leading past all.
                Quant::Count { min, max } => {
                    let mut entry = next;
                    match max {
                        None => entry = self.looped(node, next, *greedy)?.0,
                        Some(max) => {
                            for _ in min..max {
                                let body = self.compile(node, entry)?;
                                entry = self.repeat(body, next, *greedy)?;
                            }
                        }
                    }
                    for _ in 0..min {
                        entry = self.compile(node, entry)?;
                    }
                    Ok(entry)
                }
            },
        }
    }
}

/// One pattern of a reference pre-tokenizer list, compiled the way the reference runs it.
#[derive(Clone)]
pub(crate) struct RefRegex {
    pattern: String,
    mode: Mode,
    states: Vec<State>,
    sets: Vec<CharSet>,
    start: u32,
    slots: usize,
}

impl std::fmt::Debug for RefRegex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefRegex")
            .field("pattern", &self.pattern)
            .field("mode", &self.mode)
            .field("states", &self.states.len())
            .finish_non_exhaustive()
    }
}

impl RefRegex {
    /// Whether code unit `u` matches `m` (ECMAScript `.` stops at line terminators,
    /// which in the collapsed mode are only `\n` and `\r`).
    #[inline]
    fn matches(&self, m: Matcher, u: i32) -> bool {
        match m {
            Matcher::Lit(c) => u == c,
            Matcher::Any => {
                u != 0x0A
                    && u != 0x0D
                    && (self.mode == Mode::Collapsed || (u != 0x2028 && u != 0x2029))
            }
            Matcher::Set(s) => self
                .sets
                .get(s as usize)
                .is_some_and(|set| set.matches(u, self.mode)),
        }
    }

    /// Compiles one pattern as written in the reference's table (custom-splitter patterns
    /// such as `\p{Han}+` are not regexes to it, and fail here).
    pub(crate) fn new(pattern: &str) -> Result<Self, RegexError> {
        let collapsed = CATEGORIES
            .iter()
            .any(|(name, _, _)| pattern.as_bytes().windows(name.len()).any(|w| w == *name));
        let (mode, units) = if collapsed {
            if !pattern.is_ascii() {
                return Err(RegexError::CategoryWithNonAscii);
            }
            let rewritten = rewrite_categories(pattern.as_bytes());
            (
                Mode::Collapsed,
                rewritten.into_iter().map(signed).collect::<Vec<_>>(),
            )
        } else {
            (Mode::Wide, pattern.chars().map(|c| c as i32).collect())
        };
        let mut parser = Parser {
            p: &units,
            i: 0,
            mode,
            sets: Vec::new(),
        };
        let ast = parser.parse()?;
        let sets = parser.sets;
        let mut compiler = Compiler {
            states: vec![State::Accept],
            slots: 0,
        };
        let start = compiler.compile(&ast, ACCEPT)?;
        Ok(RefRegex {
            pattern: pattern.to_owned(),
            mode,
            states: compiler.states,
            sets,
            start,
            slots: compiler.slots as usize,
        })
    }
}

/// The reference's rewrite of a category pattern: each known `\p{X}` becomes its collapsed
/// byte plus the category's ASCII members, wrapped in brackets unless it already stands
/// inside some. Bracket tracking is the reference's (a `[` or `]` counts unless the
/// character before it is a backslash), quirks included.
fn rewrite_categories(p: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(p.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < p.len() {
        let prev_is_backslash = i > 0 && p[i - 1] == b'\\';
        if p[i] == b'[' && !prev_is_backslash {
            out.push(b'[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && p[i] == b']' && !prev_is_backslash {
            out.push(b']');
            inside = false;
            i += 1;
            continue;
        }
        if p[i] == b'\\' && i + 3 < p.len() && p[i + 1] == b'p' && p[i + 2] == b'{' {
            let close = p[i + 3..]
                .iter()
                .position(|&b| b == b'}')
                .map(|k| i + 3 + k);
            if let Some(close) = close.filter(|&c| c <= i + 10) {
                let name = &p[i..=close];
                if let Some(&(_, byte, members)) = CATEGORIES.iter().find(|c| c.0 == name) {
                    if !inside {
                        out.push(b'[');
                    }
                    out.push(byte);
                    out.extend_from_slice(members);
                    if !inside {
                        out.push(b']');
                    }
                    i = close + 1;
                    continue;
                }
            }
        }
        out.push(p[i]);
        i += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------
// The matcher: libstdc++'s depth-first executor with an explicit stack.

/// The `match_flag_type` bits that change a match.
#[derive(Clone, Copy, Debug, Default)]
struct Flags {
    /// `match_not_null`: an empty match is no match.
    not_null: bool,
    /// `match_prev_avail`: the unit before the start exists (`^` fails there, `\b` looks).
    prev_avail: bool,
}

impl Flags {
    fn bits(self) -> u64 {
        u64::from(self.not_null) | u64::from(self.prev_avail) << 1
    }
}

/// "No loop entered yet on this path" for [`Cursor::last_rep`].
const NO_REP: usize = usize::MAX;

#[derive(Clone, Copy, Debug)]
enum Frame {
    /// Continue from `at` (the untried branch of an alternation or loop).
    Resume { at: Cursor },
    /// A lazy loop whose "stop" branch was tried first: now try once more.
    LazyMore { state: u32, pos: usize },
    /// Undo a loop counter change.
    Restore { slot: u32, saved: (usize, u8) },
    /// A memoised loop node being explored: popped on failure, drained on success.
    Enter { key: u64 },
}

/// Where a path of [`Exec::run_inner`] stands: its state, its position, and `last_rep`,
/// the position of the path's latest loop entry ([`NO_REP`] before any), which says
/// whether a loop node's outcome may be memoised.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    state: u32,
    pos: usize,
    last_rep: usize,
}

impl Cursor {
    /// The same path at another state.
    fn to(self, state: u32) -> Cursor {
        Cursor { state, ..self }
    }
}

/// What one step of [`Exec::run_inner`] did.
enum Step {
    /// The path goes on from the moved cursor.
    Went,
    /// The path cannot go on: backtrack.
    Failed,
    /// The whole pattern matched, ending here.
    Matched(usize),
}

/// The step budget ran out.
struct Exhausted;

/// Work limits of one split (see [`split_with`]).
#[derive(Clone, Copy, Debug)]
struct Limits {
    /// Steps a piece may take: `budget_base + budget_per_unit * len`.
    budget_base: u64,
    budget_per_unit: u64,
    /// Steps after which a piece starts memoising: `memo_base + memo_per_unit * len`.
    memo_base: u64,
    memo_per_unit: u64,
}

const LIMITS: Limits = Limits {
    budget_base: STEP_BUDGET_BASE,
    budget_per_unit: STEP_BUDGET_PER_UNIT,
    memo_base: MEMO_AFTER_BASE,
    memo_per_unit: MEMO_AFTER_PER_UNIT,
};

/// A cheap hasher for the memo's packed `u64` keys.
#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, v: u64) {
        let h = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

type Memo = std::collections::HashMap<u64, usize, std::hash::BuildHasherDefault<KeyHasher>>;
/// Memo value of a node from which no accept is reachable.
const MEMO_FAIL: usize = usize::MAX;

struct Exec<'a> {
    re: &'a RefRegex,
    /// The piece being split; positions are relative to it, as the reference's iterator
    /// sees only the piece.
    text: &'a [i32],
    /// Per repeat node: the position it was last entered at on the current path and how
    /// often (libstdc++'s `_M_rep_count`); 0 visits = unset.
    rep: Vec<(usize, u8)>,
    stack: Vec<Frame>,
    steps_left: u64,
    /// Memoisation starts once `steps_left` drops below this.
    memo_below: u64,
    /// Outcome of exploring a loop node at a position under given flags, where nothing
    /// else can change it (see `run_inner`): the end of the first accept, or `MEMO_FAIL`.
    memo: Memo,
}

impl Exec<'_> {
    /// Records a memo entry, unless the memo is full (it only saves work: leaving an
    /// entry out changes no result).
    fn remember(&mut self, key: u64, value: usize) {
        if self.memo.len() < MEMO_MAX_ENTRIES {
            self.memo.insert(key, value);
        }
    }

    /// libstdc++'s `_M_rep_once_more`: may the loop run its body again at `pos`? Records
    /// the visit (undone on backtrack) if so.
    fn once_more(&mut self, slot: u32, pos: usize) -> bool {
        let Some(&saved) = self.rep.get(slot as usize) else {
            return false;
        };
        let updated = if saved.1 == 0 || saved.0 != pos {
            (pos, 1)
        } else if saved.1 < 2 {
            (pos, saved.1 + 1)
        } else {
            return false;
        };
        self.stack.push(Frame::Restore { slot, saved });
        self.rep[slot as usize] = updated;
        true
    }

    /// One depth-first match attempt from `begin` (the executor's `_M_begin`), to the
    /// first accept: returns the end of the match.
    fn run(&mut self, start: u32, begin: usize, flags: Flags) -> Result<Option<usize>, Exhausted> {
        let base = self.stack.len();
        let result = self.run_inner(start, begin, flags, base);
        // Unwind what this attempt left, restoring loop counters (as the recursive
        // original does on its way out). On success every loop node still open lies on
        // the accepted path: its first accept is this one.
        let found = match result {
            Ok(Some(end)) => Some(end),
            _ => None,
        };
        while self.stack.len() > base {
            match self.stack.pop() {
                Some(Frame::Restore { slot, saved }) => {
                    if let Some(r) = self.rep.get_mut(slot as usize) {
                        *r = saved;
                    }
                }
                Some(Frame::Enter { key }) => {
                    if let Some(end) = found {
                        self.remember(key, end);
                    }
                }
                _ => {}
            }
        }
        result
    }

    /// The body of [`Exec::run`]: libstdc++'s recursive `_M_dfs`, with its call stack made
    /// explicit in `self.stack` (frames above `base` belong to this attempt).
    ///
    /// Memoisation: what exploring state `s` from `pos` yields depends on the text, the
    /// flags, `begin` (only through `^`, `\b` and the not-null check at `pos == begin`)
    /// and the loop counters recorded at `pos` (counters recorded earlier are reset
    /// when their loop is next entered, since positions only grow along a path). So at a
    /// loop node with `pos > begin` and no counter recorded at `pos` on the current path
    /// (`last_rep`, the position of the path's latest loop entry, is not `pos`), the
    /// outcome is a function of (state, pos, flags), shared by every attempt over the
    /// piece. That turns the rescans of e.g. `(?=(\d{3})+(?!\d))` or `\s+$` linear.
    fn run_inner(
        &mut self,
        start: u32,
        begin: usize,
        flags: Flags,
        base: usize,
    ) -> Result<Option<usize>, Exhausted> {
        let mut at = Cursor {
            state: start,
            pos: begin,
            last_rep: NO_REP,
        };
        loop {
            if self.steps_left == 0 {
                return Err(Exhausted);
            }
            self.steps_left -= 1;
            match self.step(&mut at, begin, flags)? {
                Step::Went => continue,
                Step::Matched(end) => return Ok(Some(end)),
                // Backtrack to the newest untried branch.
                Step::Failed => {
                    if !self.backtrack(&mut at, base) {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// One step of [`Exec::run_inner`] at `at`: moves `at` on when the state lets the
    /// path go on (pushing the untried branches), or says the path failed, or matched.
    #[inline]
    fn step(&mut self, at: &mut Cursor, begin: usize, flags: Flags) -> Result<Step, Exhausted> {
        let re = self.re;
        let text = self.text;
        let pos = at.pos;
        let went = match re
            .states
            .get(at.state as usize)
            .copied()
            .unwrap_or(State::Accept)
        {
            State::Match { m, next } => {
                let hit = text.get(pos).is_some_and(|&u| re.matches(m, u));
                if hit {
                    at.pos += 1;
                    at.state = next;
                }
                hit
            }
            State::Split { alt, next } => {
                self.stack.push(Frame::Resume { at: at.to(next) });
                at.state = alt;
                true
            }
            State::Repeat {
                body,
                next,
                greedy,
                slot,
            } => return Ok(self.enter_loop(at, (body, next, greedy, slot), begin, flags)),
            State::LineBegin { next } => {
                at.state = next;
                pos == begin && !flags.prev_avail
            }
            State::LineEnd { next } => {
                at.state = next;
                pos == text.len()
            }
            State::WordBoundary { negated, next } => {
                let left = (pos != begin || flags.prev_avail)
                    && pos > 0
                    && text.get(pos - 1).is_some_and(|&u| is_word(u));
                let right = text.get(pos).is_some_and(|&u| is_word(u));
                at.state = next;
                (left != right) != negated
            }
            State::Look {
                body,
                negated,
                next,
            } => {
                // A sub-executor starting here, with the same flags.
                let found = self.run(body, pos, flags)?.is_some();
                at.state = next;
                found != negated
            }
            State::Accept if !(flags.not_null && pos == begin) => return Ok(Step::Matched(pos)),
            State::Accept => false,
        };
        Ok(if went { Step::Went } else { Step::Failed })
    }

    /// A loop node at `at` (`body`, `next`, `greedy`, counter `slot`): a memoised outcome
    /// when there is one, else one more pass through the body first (greedy) or the
    /// way on first (lazy), the other choice pushed for backtracking.
    #[inline]
    fn enter_loop(
        &mut self,
        at: &mut Cursor,
        (body, next, greedy, slot): (u32, u32, bool, u32),
        begin: usize,
        flags: Flags,
    ) -> Step {
        let pos = at.pos;
        if self.steps_left < self.memo_below && pos > begin && at.last_rep != pos {
            let key = u64::from(at.state) << 40 | (pos as u64) << 2 | flags.bits();
            match self.memo.get(&key) {
                Some(&MEMO_FAIL) => return Step::Failed,
                Some(&end) => return Step::Matched(end),
                None => self.stack.push(Frame::Enter { key }),
            }
        }
        if !greedy {
            self.stack.push(Frame::LazyMore {
                state: at.state,
                pos,
            });
            at.state = next;
            return Step::Went;
        }
        self.stack.push(Frame::Resume { at: at.to(next) });
        if !self.once_more(slot, pos) {
            return Step::Failed;
        }
        at.last_rep = pos;
        at.state = body;
        Step::Went
    }

    /// Pops frames above `base` (undoing loop counters, marking memoised loop nodes as
    /// failed) down to the newest untried branch and moves `at` there; false when none
    /// is left.
    #[inline]
    fn backtrack(&mut self, at: &mut Cursor, base: usize) -> bool {
        while self.stack.len() > base {
            match self.stack.pop() {
                None => return false,
                Some(Frame::Restore { slot, saved }) => {
                    if let Some(r) = self.rep.get_mut(slot as usize) {
                        *r = saved;
                    }
                }
                Some(Frame::Enter { key }) => self.remember(key, MEMO_FAIL),
                Some(Frame::Resume { at: resume }) => {
                    *at = resume;
                    return true;
                }
                Some(Frame::LazyMore { state, pos }) => {
                    if let Some(&State::Repeat { body, slot, .. }) =
                        self.re.states.get(state as usize)
                    {
                        if self.once_more(slot, pos) {
                            *at = Cursor {
                                state: body,
                                pos,
                                last_rep: pos,
                            };
                            return true;
                        }
                    }
                }
            }
        }
        false
    }

    /// `regex_search` over `[start, end of piece)`: the first match, trying each start
    /// position in turn unless `continuous`.
    fn search(
        &mut self,
        start: usize,
        mut flags: Flags,
        continuous: bool,
    ) -> Result<Option<(usize, usize)>, Exhausted> {
        let entry = self.re.start;
        if let Some(end) = self.run(entry, start, flags)? {
            return Ok(Some((start, end)));
        }
        if continuous {
            return Ok(None);
        }
        flags.prev_avail = true;
        for begin in start + 1..=self.text.len() {
            if let Some(end) = self.run(entry, begin, flags)? {
                return Ok(Some((begin, end)));
            }
        }
        Ok(None)
    }

    /// The reference's `unicode_regex_split_stl` for one piece: the gap before each match,
    /// each match (even empty), and the tail, as lengths pushed onto `out`.
    fn split_piece(&mut self, out: &mut Vec<usize>) {
        let len = self.text.len();
        let mut start_idx = 0;
        let _ = self.iterate(&mut start_idx, out);
        if start_idx < len {
            out.push(len - start_idx);
        }
    }

    /// `std::regex_iterator` over the piece; stops early if the budget runs out.
    fn iterate(&mut self, start_idx: &mut usize, out: &mut Vec<usize>) -> Result<(), Exhausted> {
        let len = self.text.len();
        let mut flags = Flags::default();
        let mut found = self.search(0, flags, false)?;
        while let Some((m_start, m_end)) = found {
            if m_start > *start_idx {
                out.push(m_start - *start_idx);
            }
            out.push(m_end - m_start);
            *start_idx = m_end;
            // [re.regiter.incr]
            let mut next = m_end;
            if m_start == m_end {
                if next == len {
                    break;
                }
                let retry = Flags {
                    not_null: true,
                    ..flags
                };
                if let Some(m) = self.search(next, retry, true)? {
                    found = Some(m);
                    continue;
                }
                next += 1;
            }
            flags.prev_avail = true;
            found = self.search(next, flags, false)?;
        }
        Ok(())
    }
}

/// Splits as the reference's `unicode_regex_split` does for a list of patterns, without
/// its custom splitters: `cps` are the text's code points, `offsets` the lengths (in code
/// points) of the pieces earlier steps made (`vec![cps.len()]` for the whole text). Returns
/// the new pieces' lengths; zero-length pieces (empty matches) are kept, as the reference
/// keeps them.
///
/// Cost: a piece whose matching gets expensive (backtracking rescans, as a lookahead over
/// a long digit run makes) switches to memoised matching, which gives the same splits in
/// about linear time. As a last guard, each piece runs under a step budget (about four
/// million steps plus 2048 per code point) that the reference's patterns stay far below
/// on any text; a piece that exhausts it keeps the pieces found so far and ends with its
/// unmatched remainder as one piece. Offsets reaching past the text are cut at its end.
pub(crate) fn split_with(cps: &[u32], patterns: &[RefRegex], offsets: Vec<usize>) -> Vec<usize> {
    split_with_limits(cps, patterns, offsets, LIMITS)
}

fn split_with_limits(
    cps: &[u32],
    patterns: &[RefRegex],
    mut offsets: Vec<usize>,
    limits: Limits,
) -> Vec<usize> {
    let mut collapsed: Option<Vec<i32>> = None;
    let mut wide: Option<Vec<i32>> = None;
    for re in patterns {
        let text: &[i32] = match re.mode {
            Mode::Collapsed => {
                collapsed.get_or_insert_with(|| cps.iter().map(|&c| collapsed_unit(c)).collect())
            }
            Mode::Wide => wide.get_or_insert_with(|| cps.iter().map(|&c| wide_unit(c)).collect()),
        };
        let mut out = Vec::with_capacity(offsets.len() * 2);
        let mut exec = Exec {
            re,
            text: &[],
            rep: vec![(0, 0); re.slots],
            stack: Vec::new(),
            steps_left: 0,
            memo_below: 0,
            memo: Memo::default(),
        };
        let mut lo = 0usize;
        for &piece_len in &offsets {
            let hi = lo.saturating_add(piece_len).min(text.len());
            let len = (hi - lo) as u64;
            exec.text = &text[lo..hi];
            let budget = limits
                .budget_base
                .saturating_add(limits.budget_per_unit.saturating_mul(len));
            let memo_after = limits
                .memo_base
                .saturating_add(limits.memo_per_unit.saturating_mul(len));
            exec.steps_left = budget;
            exec.memo_below = budget.saturating_sub(memo_after);
            if !exec.memo.is_empty() {
                exec.memo.clear();
            }
            // Every run restores the loop counters and pops its frames, so `rep` and
            // `stack` are clean here.
            exec.split_piece(&mut out);
            lo = hi;
        }
        offsets = out;
    }
    offsets
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits `text` with the pattern list and returns the pieces as strings.
    fn split(patterns: &[&str], text: &str) -> Vec<String> {
        let res: Vec<RefRegex> = patterns.iter().map(|p| RefRegex::new(p).unwrap()).collect();
        let cps: Vec<u32> = text.chars().map(|c| c as u32).collect();
        let lens = split_with(&cps, &res, vec![cps.len()]);
        let chars: Vec<char> = text.chars().collect();
        let mut at = 0;
        let pieces = lens
            .iter()
            .map(|&n| {
                let s: String = chars[at..at + n].iter().collect();
                at += n;
                s
            })
            .collect();
        assert_eq!(at, chars.len(), "pieces must cover the text");
        pieces
    }

    fn check(patterns: &[&str], text: &str, expected: &[&str]) {
        assert_eq!(
            split(patterns, text),
            expected,
            "patterns {patterns:?} on {text:?}"
        );
    }

    // Patterns of the reference's table (src/llama-vocab.cpp), as the strings it holds.
    const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
    const CHATGLM4: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const BAILINGMOE: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
    const EXAONE_MOE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+";
    const SUPERBPE: [&str; 2] = [r"\p{N}+", r"(?=(\d{3})+(?!\d))"];
    const PORO: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";
    const VIKING: [&str; 2] = [PORO, r"\p{N}"];
    /// Chameleon's list without its last pattern (GPT-2's, a custom splitter).
    const CHAMELEON: [&str; 5] = [
        r"<sentinel:[0-9]+>",
        r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        "([\\t\\n]|    |  )",
        r"\p{N}",
        r"[\p{P}!-/:-@\[-`{-~]",
    ];
    const MINICPM5: [&str; 2] = [
        r"\p{N}{1,3}",
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ];
    /// Laguna's second pattern (the first, newline runs, is a custom splitter).
    const LAGUNA: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    /// AFMoE's third pattern; the reference's string holds a real CR and LF.
    const AFMOE: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
    const DEEPSEEK_V3: [&str; 3] = [
        r"\p{N}{1,3}",
        "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ];
    /// `default` without GPT-2's pattern (a custom splitter).
    const DEFAULT: [&str; 3] = [r"[\p{P}\$\+<=>\^~\|]+", r"\p{N}+", "[0-9][0-9][0-9]"];
    /// `starcoder` without GPT-2's pattern.
    const STARCODER: [&str; 1] = [r"\p{N}"];
    /// `falcon` without GPT-2's pattern.
    const FALCON: [&str; 2] = [r"[\p{P}\$\+<=>\^~\|`]+", "[0-9][0-9][0-9]"];

    // --- regex_iterator and the piece bookkeeping

    #[test]
    fn empty_matches_become_zero_length_pieces() {
        // Empty at 0; the not-null retry fails; "xx" from 1; empty at 3; gap "b"; empty
        // at the end, after which the iterator stops.
        check(&["x*"], "axxb", &["", "a", "xx", "", "b", ""]);
        check(&[""], "ab", &["", "a", "", "b", ""]);
    }

    #[test]
    fn retry_after_empty_match_is_anchored_and_non_null() {
        // Lazy loops match empty first; the retry at the same position takes one unit.
        check(&["a*?"], "aa", &["", "a", "", "a", ""]);
        check(&["a??"], "aa", &["", "a", "", "a", ""]);
    }

    #[test]
    fn retry_keeps_the_iterators_flags() {
        // The first match is empty at 1; the retry there runs without match_prev_avail,
        // so `^` holds at 1 and "bc" is one piece.
        check(&["(?=b)|^bc|c"], "abc", &["a", "", "bc"]);
    }

    #[test]
    fn lookahead_inherits_not_null() {
        // Normally `(?!a*)` never holds; in the not-null retry its body must be non-empty,
        // so it holds before "bb".
        check(&["(?!a*)bb|"], "bb", &["", "bb", ""]);
    }

    #[test]
    fn splits_every_piece_separately() {
        let re = [RefRegex::new("a+").unwrap()];
        let cps: Vec<u32> = "aaxaa".chars().map(|c| c as u32).collect();
        // Pieces "aa", "xa", "a": the first match of a piece starts afresh.
        assert_eq!(split_with(&cps, &re, vec![2, 2, 1]), vec![2, 1, 1, 1]);
        // A zero-length piece vanishes unless the pattern matches empty.
        assert_eq!(split_with(&cps, &re, vec![2, 0, 3]), vec![2, 1, 2]);
        let star = [RefRegex::new("a*").unwrap()];
        assert_eq!(split_with(&cps[..0], &star, vec![0]), vec![0]);
        // Lengths past the end are cut at the end.
        assert_eq!(split_with(&cps, &re, vec![4, 9]), vec![2, 1, 1, 1]);
    }

    // --- ECMAScript constructs (as libstdc++ runs them)

    #[test]
    fn alternatives_are_tried_in_order() {
        check(&["a|ab"], "ab", &["a", "b"]);
        check(&["ab|a"], "ab", &["ab"]);
    }

    #[test]
    fn greedy_and_lazy_quantifiers() {
        check(&["a+"], "aaab", &["aaa", "b"]);
        check(&["a+?"], "aaab", &["a", "a", "a", "b"]);
        check(&["a{2,3}"], "aaaaaaa", &["aaa", "aaa", "a"]);
        check(&["a{2}"], "aaaaa", &["aa", "aa", "a"]);
        check(&["a{2,}"], "aaaaab", &["aaaaa", "b"]);
        check(&["a{2,3}?"], "aaaaa", &["aa", "aa", "a"]);
    }

    #[test]
    fn loop_over_empty_body_follows_libstdcxx() {
        // ECMAScript rejects the empty iteration and matches "aa"; libstdc++ lets the
        // loop revisit its position once and accepts the empty match first.
        check(&["(?:|a)*"], "aa", &["", "a", "", "a", ""]);
        check(&["(?:a|)*"], "aa", &["aa", ""]);
    }

    #[test]
    fn lookaheads() {
        check(&["a(?=b)"], "aab", &["a", "a", "b"]);
        check(&["a(?!b)"], "aab", &["a", "ab"]);
    }

    #[test]
    fn anchors_and_word_boundaries() {
        // Later searches have match_prev_avail: `^` holds only at the piece start.
        check(&["^a"], "aaa", &["a", "aa"]);
        check(&["a$"], "aaa", &["aa", "a"]);
        check(&[r"\bx"], "xx x", &["x", "x ", "x"]);
        check(&[r"\Bx"], "xx x", &["x", "x", " x"]);
    }

    #[test]
    fn dot_escapes_and_classes() {
        check(&[".+"], "ab\ncd\re", &["ab", "\n", "cd", "\r", "e"]);
        check(&[r"\x41+"], "AAb", &["AA", "b"]);
        check(&[r"\u00e9"], "éa", &["é", "a"]);
        // The "C" locale: \s, \w, \d are ASCII; non-ASCII white space was replaced by \v.
        check(&[r"\s+"], "a\u{a0}\u{3000}b", &["a", "\u{a0}\u{3000}", "b"]);
        check(&[r"\s+"], "a\u{200b}b", &["a\u{200b}b"]);
        check(&[r"\w+"], "aé_b", &["a", "é", "_b"]);
        check(&[r"\d+"], "1٣2", &["1", "٣", "2"]);
    }

    #[test]
    fn bracket_expressions() {
        // ECMAScript: a dash after a range is a plain '-'.
        check(&["[a-c-e]+"], "abcd-e", &["abc", "d", "-e"]);
        check(&["[+--]+"], "+,-.", &["+,-", "."]);
        check(&["[^]+"], "ab", &["ab"]);
        check(&["[]"], "ab", &["ab"]);
        check(&[r"[\b]"], "a\u{8}", &["a", "\u{8}"]);
        check(&["[[:upper:][:digit:]]+"], "aB1c", &["a", "B1", "c"]);
    }

    // --- the category collapse

    #[test]
    fn categories_collapse_to_one_byte_each() {
        check(&[r"\p{L}+"], "Жé中a", &["Жé中a"]);
        check(&[r"\p{N}+"], "x1٣½Ⅻ", &["x", "1٣½Ⅻ"]);
        check(&[r"\p{P}+"], "a!。«", &["a", "!。«"]);
        check(&[r"\p{S}+"], "a$€©+", &["a", "$€©+"]);
        check(&[r"\p{M}+"], "a\u{301}\u{93f}", &["a", "\u{301}\u{93f}"]);
        check(
            &[r"\s+|\p{L}+"],
            "a\u{a0}\u{2028}b",
            &["a", "\u{a0}\u{2028}", "b"],
        );
        // U+200B (Cf) collapses to 0xD0, which \S matches.
        check(&[r"\S+|\p{L}"], "a\u{200b} b", &["a\u{200b}", " ", "b"]);
    }

    #[test]
    fn collapse_quirks_are_kept() {
        // Every letter sub-category means "any letter", ASCII lowercase included.
        check(&[r"\p{Lu}+"], "aBc1", &["aBc", "1"]);
        // A collapsed non-ASCII letter is outside a-z.
        check(&[r"[^a-z]+|\p{N}"], "abéÉc", &["ab", "éÉ", "c"]);
        // The rewrite ignores that the backslash before `\p` is escaped: `\\p{L}` becomes
        // `\[` + the letter class's text, a literal string.
        check(&[r"\\p{L}"], r"\a\p", &[r"\a\p"]);
        check(&[r"\\p{L}"], "x[éA-Za-z]y", &["x", "[éA-Za-z]", "y"]);
    }

    #[test]
    fn malformed_patterns_are_errors() {
        for p in [
            "(",
            ")",
            "a{2,1}",
            "a{",
            "a{,2}",
            "[z-a]",
            "*",
            "a|*",
            "\\",
            r"[\d-a]",
            "(?i:a)",
            "(?=a)*",
            "[a",
            r"\p{Han}+",
            r"\x4",
            "[[:foo:]]",
        ] {
            assert!(
                matches!(RefRegex::new(p), Err(RegexError::Syntax { .. })),
                "{p:?}"
            );
        }
        assert!(matches!(
            RefRegex::new(r"(a)\1"),
            Err(RegexError::Unsupported { .. })
        ));
        assert_eq!(
            RefRegex::new(r"\p{L}é").unwrap_err(),
            RegexError::CategoryWithNonAscii
        );
        assert!(matches!(
            RefRegex::new("(?:a{1000}){1000}"),
            Err(RegexError::TooLarge { .. })
        ));
        assert!(RefRegex::new(&"(".repeat(1000)).is_err());
        assert!(RefRegex::new(&format!("a{}", "*".repeat(1000))).is_err());
    }

    // --- the reference's pattern lists

    #[test]
    fn tekken() {
        check(&[TEKKEN], "Hello World", &["Hello", " World"]);
        // É collapses to a letter outside both a-z and A-Z: the first alternative takes
        // it alone, the all-caps rest goes to the second.
        check(&[TEKKEN], "ÉCOLE école", &["É", "COLE", " école"]);
        check(&[TEKKEN], "123abc", &["1", "2", "3", "abc"]);
    }

    #[test]
    fn gpt4o() {
        check(&[GPT4O], "I'm HERE'S", &["I'm", " HERE'S"]);
        check(&[GPT4O], "12345", &["123", "45"]);
        check(
            &[GPT4O],
            "hello\n\n  world",
            &["hello", "\n\n", " ", " world"],
        );
    }

    #[test]
    fn seed_coder() {
        check(
            &[SEED_CODER],
            "abc123 ++\n",
            &["abc", "1", "2", "3", " ++", "\n"],
        );
        check(&[SEED_CODER], "don't", &["don", "'t"]);
    }

    #[test]
    fn chatglm4() {
        check(
            &[CHATGLM4],
            "Hello, world! 12345",
            &["Hello", ",", " world", "!", " ", "123", "45"],
        );
    }

    #[test]
    fn bailingmoe() {
        check(
            &[BAILINGMOE],
            "we'LL 42\n\n",
            &["we", "'LL", " ", "4", "2", "\n\n"],
        );
    }

    #[test]
    fn exaone_moe() {
        check(&[EXAONE_MOE], "hello world 1", &["hello world", " ", "1"]);
        check(&[EXAONE_MOE], "e\u{301} x!/", &["e\u{301} x", "!/"]);
    }

    #[test]
    fn superbpe() {
        check(
            &SUPERBPE,
            "1234567 x 12",
            &["1", "", "234", "", "567", " x ", "12"],
        );
    }

    #[test]
    fn poro_bloom() {
        check(
            &[PORO],
            "Hello, world! (x|y)",
            &["Hello", ",", " world", "! (", "x", "|", "y", ")"],
        );
        check(&[PORO], "नमस्ते।", &["नमस्ते", "।"]);
        check(&[PORO], "a\u{3000}b", &["a", "\u{3000}", "b"]);
    }

    #[test]
    fn viking() {
        check(&VIKING, "abc123 x", &["abc", "1", "2", "3", " x"]);
    }

    #[test]
    fn chameleon() {
        check(
            &CHAMELEON,
            "<sentinel:12>IMGIMGABZ hi  x",
            &[
                "<",
                "sentinel",
                ":",
                "1",
                "2",
                ">",
                "IMGIMGABZ",
                " hi",
                "  ",
                "x",
            ],
        );
    }

    #[test]
    fn minicpm5() {
        check(&MINICPM5, "abc 12345", &["abc", " ", "123", "45"]);
    }

    #[test]
    fn laguna() {
        check(&[LAGUNA], "ab 12", &["ab", " ", "1", "2"]);
    }

    #[test]
    fn afmoe() {
        check(&[AFMOE], ".NET 3x", &[".NET", " ", "3x"]);
        check(&[AFMOE], "a\u{301}b!!\n", &["a\u{301}b", "!!\n"]);
    }

    #[test]
    fn deepseek_v3() {
        check(
            &DEEPSEEK_V3,
            "价格1234元 ok!",
            &["价格", "123", "4", "元", " ok", "!"],
        );
    }

    #[test]
    fn default_starcoder_falcon() {
        check(
            &DEFAULT,
            "a+b=1234567, ok",
            &["a", "+", "b", "=", "123", "456", "7", ",", " ok"],
        );
        check(&STARCODER, "x12٣", &["x", "1", "2", "٣"]);
        check(&FALCON, "`a`1234", &["`", "a", "`", "123", "4"]);
    }

    // --- long inputs

    #[test]
    fn long_runs_use_no_deep_recursion() {
        let n = 100_000;
        let letters = "a".repeat(n);
        assert_eq!(split(&[TEKKEN], &letters), [letters.as_str()]);
        let spaces = " ".repeat(n);
        assert_eq!(split(&[GPT4O], &spaces), [spaces.as_str()]);
        // Superbpe's lookahead rescans the rest of a digit run from every position, as
        // in the reference (quadratic there); memoised matching keeps it linear.
        // 100 000 = 1 + 3 * 33 333: a gap of one digit, then an empty match before each
        // triple but the last, which is the tail.
        let re: Vec<RefRegex> = SUPERBPE.iter().map(|p| RefRegex::new(p).unwrap()).collect();
        let cps = vec!['7' as u32; n];
        let mut expected = vec![1, 0];
        for _ in 0..33_332 {
            expected.extend([3, 0]);
        }
        expected.push(3);
        assert_eq!(split_with(&cps, &re, vec![n]), expected);
    }

    #[test]
    fn rescans_are_memoised_and_budget_bounds_the_rest() {
        // `\s+$` backtracks over the whole run from every start: quadratic unless
        // memoised. The right split is the run and "x", then the final spaces.
        let text = format!("{}x  ", " ".repeat(20_000));
        let cps: Vec<u32> = text.chars().map(|c| c as u32).collect();
        let re = [RefRegex::new(r"\s+$").unwrap()];
        assert_eq!(split_with(&cps, &re, vec![cps.len()]), vec![20_001, 2]);
        // Without memoisation and with a small budget, the search gives up: the piece
        // stays whole.
        let tight = Limits {
            budget_base: 10_000,
            budget_per_unit: 10,
            memo_base: u64::MAX,
            memo_per_unit: 0,
        };
        assert_eq!(
            split_with_limits(&cps, &re, vec![cps.len()], tight),
            vec![cps.len()]
        );
    }
}
