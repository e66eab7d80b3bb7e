//! `nx tokenize`: token ids of a text (or the text of ids) with a GGUF model's tokenizer.
//!
//! `nx tokenize --model F [--add-special] [--parse-special] [--verbose] [--] TEXT|-`
//! prints the ids space-separated on one line; with `--verbose`, one line per token
//! follows with its id and piece. `-` reads the text from standard input (bytes as they
//! are, trailing newline included). `nx tokenize --model F --decode 1,2,3` prints the
//! decoded text followed by a newline. `--model` takes a full model or a vocab-only GGUF.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use nx_bpe::{EncodeOptions, Tokenizer};
use nx_gguf::Gguf;

/// Arguments of `nx tokenize`.
#[derive(clap::Args, Debug)]
pub struct TokenizeArgs {
    /// GGUF model or vocab-only file whose tokenizer to use.
    #[arg(long, short = 'm', value_name = "FILE")]
    pub model: PathBuf,
    /// Add BOS/EOS as the vocabulary asks (`tokenizer.ggml.add_bos_token`, ...).
    #[arg(long)]
    pub add_special: bool,
    /// Read special tokens written in the text (e.g. `<start_of_turn>`) as those tokens;
    /// without it they are plain text.
    #[arg(long)]
    pub parse_special: bool,
    /// Also print each token's id and piece, one per line.
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Decode these comma-separated ids instead of encoding text.
    #[arg(long, value_name = "IDS", conflicts_with_all = ["text", "add_special", "parse_special"])]
    pub decode: Option<String>,
    /// The text to encode, or `-` to read standard input.
    #[arg(value_name = "TEXT", required_unless_present = "decode")]
    pub text: Option<OsString>,
}

pub fn run(args: &TokenizeArgs) -> Result<()> {
    let gguf = Gguf::open(&args.model).with_context(|| format!("{}", args.model.display()))?;
    let tok = Tokenizer::from_gguf(&gguf)
        .with_context(|| format!("tokenizer of {}", args.model.display()))?;
    let mut stdout = std::io::stdout().lock();

    if let Some(list) = &args.decode {
        let ids = parse_ids(list)?;
        let mut bytes = tok.decode(&ids)?;
        bytes.push(b'\n');
        stdout.write_all(&bytes)?;
        return Ok(());
    }

    let text = match args.text.as_deref() {
        Some(t) if t == "-" => {
            let mut buf = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut buf)
                .context("reading standard input")?;
            buf
        }
        Some(t) => os_bytes(t),
        None => bail!("give a TEXT, `-` for standard input, or --decode IDS"),
    };
    let opts = EncodeOptions {
        add_special: args.add_special,
        parse_special: args.parse_special,
    };
    let ids = tok.encode_bytes(&text, opts)?;
    let line: Vec<String> = ids.iter().map(u32::to_string).collect();
    writeln!(stdout, "{}", line.join(" "))?;
    if args.verbose {
        for &id in &ids {
            writeln!(
                stdout,
                "{id:>7} '{}'",
                escape_piece(tok.token_to_piece(id)?)
            )?;
        }
    }
    Ok(())
}

/// The raw bytes of a command-line argument.
fn os_bytes(s: &std::ffi::OsStr) -> Vec<u8> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        s.as_bytes().to_vec()
    }
    #[cfg(not(unix))]
    {
        s.to_string_lossy().into_owned().into_bytes()
    }
}

/// Parses `1,2, 3` (commas and/or white space between ids).
fn parse_ids(list: &str) -> Result<Vec<u32>> {
    list.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .with_context(|| format!("--decode: {s:?} is not a token id"))
        })
        .collect()
}

/// A piece for display: printable text as is; control characters, quotes and bytes that
/// are not valid UTF-8 escaped.
fn escape_piece(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        for ch in chunk.valid().chars() {
            match ch {
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\\' => out.push_str("\\\\"),
                '\'' => out.push_str("\\'"),
                c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_with_commas_and_spaces() {
        assert_eq!(parse_ids("1,2, 3 4").unwrap(), vec![1, 2, 3, 4]);
        assert!(parse_ids("").unwrap().is_empty());
        let e = parse_ids("1,x").unwrap_err().to_string();
        assert!(e.contains("\"x\""), "{e}");
        assert!(parse_ids("-1").is_err());
    }

    #[test]
    fn pieces_are_escaped() {
        assert_eq!(escape_piece(b" hi\n"), " hi\\n");
        assert_eq!(escape_piece(b"\xE2\x82"), "\\xE2\\x82");
        assert_eq!(escape_piece("é'\u{1}".as_bytes()), "é\\'\\u{1}");
    }
}
