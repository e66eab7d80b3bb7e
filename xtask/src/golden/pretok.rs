//! `cargo xtask golden pretok`: the reference's token ids for every `tokenizer.ggml.pre`
//! name nx reads, and its end-of-generation sets, from vocab-only files.
//!
//! Each recipe of [`recipes`] names a vocabulary of the pinned tree's `models/` and the
//! changes made to its metadata (a `tokenizer.ggml.pre` name, a tokenizer model, extra
//! tokens): the split of every pre-tokenizer name is exercised through the Llama 3
//! vocabulary's merges (different splits give different ids), Gemma 4's through its own.
//! The derived files are written under `$NX_CACHE/derived/vocab/`, and
//! `xtask/scripts/ref_tokenize.c`, compiled against the cached llama.cpp build, loads each
//! one (`vocab_only`) and prints its EOG ids, its `add_bos` and the ids of every text:
//! the `.inp` test texts of all vocabularies in the tree plus [`EXTRA_TEXTS`].
//! The answers go to `fixtures/tokenizer/pretok_golden.json`, which GOLD-TOK-PRE
//! (`crates/nx-bpe/tests/gold_tok_pre.rs`) compares with nx-bpe, deriving the same
//! metadata in memory. `--check` regenerates in memory and compares.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use nx_gguf::{Gguf, GgufWriter, Value};
use serde_json::{json, Value as Json};

use super::dequant::TempDir;
use crate::fetch::{cache_dir, llama_src_dir, vocab_path};
use crate::reference::{build_dir, ensure_reference, DEFAULT_JOBS};
use crate::util::{hex, run_checked, workspace_root};

/// The committed answers, relative to the workspace root.
pub const GOLDEN_PATH: &str = "fixtures/tokenizer/pretok_golden.json";

/// Texts beyond the test vectors, aimed at the patterns' corners: digit grouping, CJK and
/// kana runs, combining marks, case changes inside words (tekken, gpt-4o), contractions in
/// both cases, line breaks with slashes, long space runs (jais-2), chameleon's sentinels.
pub const EXTRA_TEXTS: &[&str] = &[
    "1234567890 12 123 1234 12345 123456",
    "x12345y ab1234 9,999,999.50",
    "HelloWorld camelCaseWord ALLCAPS McDonald's iPhone",
    "I'M YOU'RE they've WE'LL it'S don't",
    "path/to/file\r\nnext/line/\n\n\nend",
    "tabs\tand\t\tspaces          end   ",
    "                                                                     sixty-nine spaces",
    "日本語のテキストとカタカナ、漢字。",
    "中文句子，带标点。以及English混合",
    "Say 你好 and 再见 to 世界, 東京 and 北京's",
    " 中文 中文 中文的 我们 他们 你们 大家 一个 这个",
    "한국어 문장입니다. ㄱㄴㄷ ㄅㄆㄇ",
    "हिन्दी में लिखा गया पाठ",
    "ภาษาไทยไม่มีช่องว่าง",
    "Ünïcödé äccents café naïve résumé",
    "e\u{301}\u{302} combining a\u{308}",
    "<sentinel:12> IMGIMGABCZ IMGIMGAZ",
    "$+<=>^`|~ !#%&*,-./:;?@[]_{} “quotes” ‘single’ — …",
    "math: 3×4=12, x²+y²=z², ½ ⅓ ① ⑳",
    "emoji 🙂👍🏽 and ZWJ 👨‍👩‍👧",
    "\u{3000}ideographic\u{3000}space\u{a0}nbsp\u{2028}line sep",
    "mixed123abc456DEF",
    "' ' '' 's 't 're 've 'm 'll 'd",
    "\n",
    " ",
    "",
];

/// One derived vocabulary: a base file of the tree and what changes.
pub struct Recipe {
    /// Name in the golden file.
    pub name: String,
    /// `ggml-vocab-BASE.gguf` of the tree.
    pub base: &'static str,
    /// String keys set (or replaced).
    pub set_str: Vec<(&'static str, String)>,
    /// Tokens appended, with their token type.
    pub append: Vec<(&'static str, i32)>,
    /// Whether every text is tokenized (splits) or only [`SPECIAL_TEXTS`] (EOG sets).
    pub all_texts: bool,
}

/// Texts for the end-of-generation recipes, parsed with special tokens on.
pub const SPECIAL_TEXTS: &[&str] = &[
    "Hello<|end|>world<|return|><|call|></s>",
    "<|fim_pad|>x<|file_sep|><|repo_name|><|eot_id|>",
];

/// Every recipe, in golden-file order.
pub fn recipes() -> Vec<Recipe> {
    let mut out = Vec::new();
    for config in nx_bpe::PRE_TOKENIZER_NAMES {
        let (base, set_model) = match config.name {
            "gemma4" => ("gemma-4", None),
            _ if config.raw_utf8 => ("gemma-4", Some("gpt2")),
            _ => ("llama-bpe", None),
        };
        let mut set_str = vec![("tokenizer.ggml.pre", config.name.to_string())];
        if let Some(model) = set_model {
            set_str.push(("tokenizer.ggml.model", model.to_string()));
        }
        out.push(Recipe {
            name: format!("pre:{}", config.name),
            base,
            set_str,
            append: Vec::new(),
            all_texts: true,
        });
    }
    for base in VOCAB_FILES {
        out.push(Recipe {
            name: format!("file:{base}"),
            base,
            set_str: Vec::new(),
            append: Vec::new(),
            all_texts: false,
        });
    }
    let control = 3;
    let normal = 1;
    let eog_cases: [(&str, Vec<(&'static str, i32)>); 4] = [
        (
            "eog:harmony",
            vec![
                ("<|return|>", control),
                ("<|call|>", control),
                ("<|end|>", control),
            ],
        ),
        (
            "eog:solar",
            vec![
                ("<|calls|>", control),
                ("<|flush|>", control),
                ("<|end|>", control),
            ],
        ),
        (
            "eog:tool-response",
            vec![("<|tool_response>", normal), ("</s>", normal)],
        ),
        (
            "eog:fim",
            vec![
                ("<|fim_pad|>", normal),
                ("<|repo_name|>", normal),
                ("<|file_sep|>", normal),
            ],
        ),
    ];
    for (name, append) in eog_cases {
        out.push(Recipe {
            name: name.to_string(),
            base: "llama-bpe",
            set_str: Vec::new(),
            append,
            all_texts: false,
        });
    }
    out
}

/// The vocab files of the tree whose EOG sets are recorded (nx reads all but the
/// WordPiece ones).
pub const VOCAB_FILES: &[&str] = &[
    "aquila",
    "baichuan",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "gpt-neox",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// The test texts of every vocabulary in the tree, de-duplicated in first-seen order,
/// then [`EXTRA_TEXTS`].
pub fn texts() -> Result<Vec<String>> {
    let dir = llama_src_dir().join("models");
    let mut inputs: Vec<PathBuf> = fs::read_dir(&dir)
        .with_context(|| format!("read {} (run `cargo xtask fetch`)", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".gguf.inp"))
        .collect();
    inputs.sort();
    let mut out: Vec<String> = Vec::new();
    for path in inputs {
        let text = fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        for case in text.split("\n__ggml_vocab_test__\n") {
            if !out.iter().any(|t| t == case) {
                out.push(case.to_string());
            }
        }
    }
    for extra in EXTRA_TEXTS {
        if !out.iter().any(|t| t == extra) {
            out.push(extra.to_string());
        }
    }
    Ok(out)
}

/// Writes the derived vocabulary of `recipe` to `path`.
fn derive(recipe: &Recipe, path: &Path) -> Result<()> {
    let base = vocab_path(recipe.base);
    let gguf = Gguf::open(&base).with_context(|| format!("open {}", base.display()))?;
    let mut writer = GgufWriter::new();
    for (key, value) in gguf.metadata().iter() {
        writer.add_metadata(key, value.clone());
    }
    for (key, value) in &recipe.set_str {
        writer.add_metadata(*key, Value::String(value.clone()));
    }
    if !recipe.append.is_empty() {
        let md = gguf.metadata();
        let mut tokens = md.get_str_array("tokenizer.ggml.tokens")?;
        let mut types = md.get_i32_array("tokenizer.ggml.token_type")?;
        for (text, ty) in &recipe.append {
            tokens.push(text);
            types.push(*ty);
        }
        writer.add_metadata("tokenizer.ggml.tokens", Value::str_array(&tokens));
        writer.add_metadata("tokenizer.ggml.token_type", Value::i32_array(&types));
        if md.contains("tokenizer.ggml.scores") {
            let mut scores = md.get_f32_array("tokenizer.ggml.scores")?;
            scores.resize(tokens.len(), 0.0);
            writer.add_metadata("tokenizer.ggml.scores", Value::f32_array(&scores));
        }
    }
    let tmp = path.with_extension("gguf.tmp");
    fs::write(&tmp, writer.to_bytes()).with_context(|| format!("write {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))?;
    Ok(())
}

/// What the reference printed for one vocabulary.
struct Answer {
    add_bos: bool,
    eog: Vec<u32>,
    ids: Vec<Vec<u32>>,
}

fn ask_reference(harness: &Path, vocab: &Path, cases: &Path, n_cases: usize) -> Result<Answer> {
    let output = Command::new(harness)
        .arg(vocab)
        .arg(cases)
        .output()
        .with_context(|| format!("run {}", harness.display()))?;
    if !output.status.success() {
        bail!(
            "{} {} failed: {}",
            harness.display(),
            vocab.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8(output.stdout).context("harness output is not UTF-8")?;
    let mut add_bos = None;
    let mut eog = None;
    let mut ids = Vec::new();
    let numbers = |rest: &str| -> Result<Vec<u32>> {
        rest.split_whitespace()
            .map(|t| t.parse().with_context(|| format!("bad id {t:?}")))
            .collect()
    };
    for line in stdout.lines() {
        let (head, rest) = line.split_once(' ').unwrap_or((line, ""));
        match head {
            "n_vocab" => {}
            "add_bos" => add_bos = Some(rest == "1"),
            "eog" => eog = Some(numbers(rest)?),
            "ids" => ids.push(numbers(rest)?),
            "error" => bail!("{}: llama_tokenize failed ({rest})", vocab.display()),
            _ => bail!("unexpected harness line {line:?}"),
        }
    }
    if ids.len() != n_cases {
        bail!(
            "{}: {} answers for {n_cases} cases",
            vocab.display(),
            ids.len()
        );
    }
    Ok(Answer {
        add_bos: add_bos.context("no add_bos line")?,
        eog: eog.context("no eog line")?,
        ids,
    })
}

fn build_harness(tmp: &Path) -> Result<PathBuf> {
    let src = workspace_root().join("xtask/scripts/ref_tokenize.c");
    let out = tmp.join("ref_tokenize");
    let lib_dir = build_dir().join("bin");
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.arg("-O2")
        .arg("-I")
        .arg(llama_src_dir().join("include"))
        .arg("-I")
        .arg(llama_src_dir().join("ggml/include"))
        .arg(&src)
        .arg("-L")
        .arg(&lib_dir)
        .arg("-lllama")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-o")
        .arg(&out);
    run_checked(&mut cc)?;
    Ok(out)
}

/// Regenerates (or with `check` verifies) `fixtures/tokenizer/pretok_golden.json`.
pub fn run(check: bool) -> Result<()> {
    ensure_reference(DEFAULT_JOBS)?;
    let tmp = TempDir::new("pretok-golden")?;
    let harness = build_harness(tmp.path())?;
    let texts = texts()?;
    let all_cases: Vec<(bool, bool, &str)> = texts
        .iter()
        .map(|t| (false, false, t.as_str()))
        .chain(std::iter::once((true, false, "Hello world")))
        .collect();
    let special_cases: Vec<(bool, bool, &str)> = SPECIAL_TEXTS
        .iter()
        .map(|t| (true, true, *t))
        .chain(std::iter::once((false, false, "Hello world")))
        .collect();
    let write_cases = |name: &str, cases: &[(bool, bool, &str)]| -> Result<PathBuf> {
        let path = tmp.path().join(name);
        let mut body = String::new();
        for (add_special, parse_special, text) in cases {
            body.push_str(&format!(
                "{} {} {}\n",
                *add_special as u8,
                *parse_special as u8,
                hex(text.as_bytes())
            ));
        }
        fs::write(&path, body)?;
        Ok(path)
    };
    let all_path = write_cases("all.txt", &all_cases)?;
    let special_path = write_cases("special.txt", &special_cases)?;

    let derived_dir = cache_dir().join("derived/vocab");
    fs::create_dir_all(&derived_dir)?;
    let mut vocabs = Vec::new();
    for recipe in recipes() {
        let file = derived_dir.join(format!("{}.gguf", recipe.name.replace(':', "-")));
        derive(&recipe, &file)?;
        let (cases, path) = if recipe.all_texts {
            (&all_cases, &all_path)
        } else {
            (&special_cases, &special_path)
        };
        let answer = ask_reference(&harness, &file, path, cases.len())
            .with_context(|| format!("recipe {}", recipe.name))?;
        eprintln!(
            "golden pretok: {:<34} add_bos {} eog {:?}",
            recipe.name, answer.add_bos as u8, answer.eog
        );
        vocabs.push(json!({
            "name": recipe.name,
            "base": recipe.base,
            "set_str": recipe.set_str.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
            "append": recipe.append.iter().map(|(t, ty)| json!([t, ty])).collect::<Vec<_>>(),
            "all_texts": recipe.all_texts,
            "add_bos": answer.add_bos,
            "eog": answer.eog,
            "ids": answer.ids.iter().map(|ids| {
                ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
            }).collect::<Vec<_>>(),
        }));
    }
    let doc = json!({
        "generator": "cargo xtask golden pretok: llama.cpp libllama vocab_only + llama_tokenize (xtask/scripts/ref_tokenize.c)",
        "all_cases": all_cases.iter().map(|(a, p, t)| json!([a, p, t])).collect::<Vec<Json>>(),
        "special_cases": special_cases.iter().map(|(a, p, t)| json!([a, p, t])).collect::<Vec<Json>>(),
        "vocabs": vocabs,
    });
    let text = serde_json::to_string_pretty(&doc)? + "\n";
    let path = workspace_root().join(GOLDEN_PATH);
    if check {
        let committed = fs::read_to_string(&path).unwrap_or_default();
        if committed != text {
            bail!("{GOLDEN_PATH} differs from the reference's answers; run `cargo xtask golden pretok` to regenerate");
        }
        eprintln!("golden pretok: {GOLDEN_PATH} matches");
        return Ok(());
    }
    fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    eprintln!("golden pretok: wrote {GOLDEN_PATH}");
    Ok(())
}
