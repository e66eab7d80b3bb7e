//! Code-point classes the pre-tokenizers split on, UTF-8 helpers, and the GPT-2 byte↔unicode table.
//!
//! The pre-tokenizer regexes of byte-level BPE vocabularies only ask five questions of a
//! code point: is it a letter (`\p{L}`), a number (`\p{N}`), white space (`\s`),
//! punctuation (`\p{P}`, used by the `default` splitter) or a mark (`\p{M}`, Qwen3.5). Each class is one bit; every
//! code point of the input also carries [`DEFINED`], so a splitter can tell "a code point
//! of some other class" (bits = `DEFINED`) from "past the end of the piece" (bits = 0).

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

/// `\p{L}`: any letter category (Lu, Ll, Lt, Lm, Lo).
pub const LETTER: u8 = 1;
/// `\p{N}`: any number category (Nd, Nl, No).
pub const NUMBER: u8 = 2;
/// `\s`: the Unicode `White_Space` property.
pub const WHITESPACE: u8 = 4;
/// `\p{P}`: any punctuation category.
pub const PUNCT: u8 = 8;
/// `\p{M}`: any mark category (Mn, Mc, Me; the combining accents of Qwen3.5's pattern).
pub const MARK: u8 = 16;
/// Set on every code point inside the text; absent only past the end.
pub const DEFINED: u8 = 0x80;

/// The 25 code points with the Unicode `White_Space` property.
pub(crate) fn is_white_space(cp: u32) -> bool {
    matches!(
        cp,
        0x09..=0x0D
            | 0x20
            | 0x85
            | 0xA0
            | 0x1680
            | 0x2000..=0x200A
            | 0x2028
            | 0x2029
            | 0x202F
            | 0x205F
            | 0x3000
    )
}

const fn ascii_class(b: u8) -> u8 {
    let mut c = DEFINED;
    if b.is_ascii_alphabetic() {
        c |= LETTER;
    } else if b.is_ascii_digit() {
        c |= NUMBER;
    } else if matches!(b, 0x09..=0x0D | b' ') {
        c |= WHITESPACE;
    } else if matches!(
        b,
        b'!' | b'"'
            | b'#'
            | b'%'
            | b'&'
            | b'\''
            | b'('
            | b')'
            | b'*'
            | b','
            | b'-'
            | b'.'
            | b'/'
            | b':'
            | b';'
            | b'?'
            | b'@'
            | b'['
            | b'\\'
            | b']'
            | b'_'
            | b'{'
            | b'}'
    ) {
        c |= PUNCT;
    }
    c
}

static ASCII_CLASS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = ascii_class(i as u8);
        i += 1;
    }
    t
};

/// The class bits of one code point (`DEFINED` is always set).
#[inline]
pub fn class_of(cp: u32) -> u8 {
    if cp < 128 {
        return ASCII_CLASS[cp as usize];
    }
    let mut c = DEFINED;
    if is_white_space(cp) {
        c |= WHITESPACE;
    }
    let Some(ch) = char::from_u32(cp) else {
        return c;
    };
    c | match get_general_category(ch) {
        Gc::UppercaseLetter
        | Gc::LowercaseLetter
        | Gc::TitlecaseLetter
        | Gc::ModifierLetter
        | Gc::OtherLetter => LETTER,
        Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber => NUMBER,
        Gc::ConnectorPunctuation
        | Gc::DashPunctuation
        | Gc::OpenPunctuation
        | Gc::ClosePunctuation
        | Gc::InitialPunctuation
        | Gc::FinalPunctuation
        | Gc::OtherPunctuation => PUNCT,
        Gc::NonspacingMark | Gc::SpacingMark | Gc::EnclosingMark => MARK,
        _ => 0,
    }
}

/// Length of the UTF-8 sequence a lead byte announces, the way SentencePiece splits
/// text into symbols: continuation and invalid lead bytes count as one.
#[inline]
pub fn utf8_len_from_lead(b: u8) -> usize {
    match b >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    }
}

/// Decodes one code point at `bytes[i..]`. Returns the code point and its length, or
/// `None` with length 1 for a byte that does not start a valid sequence.
#[inline]
pub fn decode_at(bytes: &[u8], i: usize) -> (Option<u32>, usize) {
    let b0 = bytes[i];
    if b0 < 0x80 {
        return (Some(b0 as u32), 1);
    }
    let len = match b0 {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return (None, 1),
    };
    if i + len > bytes.len() {
        return (None, 1);
    }
    match std::str::from_utf8(&bytes[i..i + len]) {
        Ok(s) => (s.chars().next().map(|c| c as u32), len),
        Err(_) => (None, 1),
    }
}

/// The GPT-2 byte-level alphabet: every byte maps to one printable code point. Bytes that
/// are printable Latin-1 (`!`..`~`, `¡`..`¬`, `®`..`ÿ`) map to themselves; the other 68
/// take the code points from U+0100 upwards, in byte order.
pub fn byte_to_unicode_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next_extra = 256u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let cp = if printable {
            b
        } else {
            let cp = next_extra;
            next_extra += 1;
            cp
        };
        // Every value used here is below U+0144, a valid scalar value.
        table[b as usize] = char::from_u32(cp).unwrap_or('\u{FFFD}');
    }
    table
}

/// The inverse of [`byte_to_unicode_table`], for code points below 0x144 (`None` elsewhere).
pub fn unicode_to_byte_table() -> [Option<u8>; 0x144] {
    let mut inv = [None; 0x144];
    for (b, ch) in byte_to_unicode_table().iter().enumerate() {
        inv[*ch as usize] = Some(b as u8);
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_of_common_code_points() {
        assert_eq!(class_of('a' as u32), DEFINED | LETTER);
        assert_eq!(class_of('7' as u32), DEFINED | NUMBER);
        assert_eq!(class_of(' ' as u32), DEFINED | WHITESPACE);
        assert_eq!(class_of('\n' as u32), DEFINED | WHITESPACE);
        assert_eq!(class_of('!' as u32), DEFINED | PUNCT);
        assert_eq!(class_of('$' as u32), DEFINED);
        assert_eq!(class_of('`' as u32), DEFINED);
        assert_eq!(class_of('é' as u32), DEFINED | LETTER);
        assert_eq!(class_of('Ж' as u32), DEFINED | LETTER);
        assert_eq!(class_of('中' as u32), DEFINED | LETTER);
        assert_eq!(class_of('½' as u32), DEFINED | NUMBER);
        assert_eq!(class_of(0x3000), DEFINED | WHITESPACE);
        assert_eq!(class_of(0xA0), DEFINED | WHITESPACE);
        assert_eq!(class_of('…' as u32), DEFINED | PUNCT);
        assert_eq!(class_of('😀' as u32), DEFINED);
        assert_eq!(class_of(0x0301), DEFINED | MARK); // combining acute: a mark, not a letter
        assert_eq!(class_of(0x0903), DEFINED | MARK); // Devanagari visarga (Mc)
    }

    #[test]
    fn byte_table_is_a_bijection_onto_printable_code_points() {
        let t = byte_to_unicode_table();
        let inv = unicode_to_byte_table();
        let mut seen = std::collections::HashSet::new();
        for b in 0..256usize {
            assert!(seen.insert(t[b]));
            assert_eq!(inv[t[b] as usize], Some(b as u8));
        }
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
    }

    #[test]
    fn decode_at_rejects_bad_sequences() {
        assert_eq!(decode_at("é".as_bytes(), 0), (Some(0xE9), 2));
        assert_eq!(decode_at(&[0xFF, 0x41], 0), (None, 1));
        assert_eq!(decode_at(&[0xE2, 0x82], 0), (None, 1));
        assert_eq!(decode_at(&[0xED, 0xA0, 0x80], 0), (None, 1)); // surrogate
        assert_eq!(utf8_len_from_lead(0xF0), 4);
        assert_eq!(utf8_len_from_lead(0x80), 1);
    }
}
