//! A tiny random-weight llama model with a small SentencePiece vocabulary, written in
//! memory with `GgufWriter`, for runner and CLI tests.
//!
//! Shared by `crates/nx-run/tests` and `crates/nx-cli/tests/run_cli.rs` (included there
//! with `#[path]`). Weights come from a seeded SplitMix64, so every build of the file is
//! byte-identical; the matrices are Q8_0, the embeddings, head and norms F32.

#![allow(dead_code)]

use nx_gguf::{GgmlType, GgufWriter, Value};

pub const N_EMBD: usize = 64;
pub const N_FF: usize = 96;
pub const N_HEAD: usize = 4;
pub const N_HEAD_KV: usize = 2;
pub const HEAD_DIM: usize = 16;
pub const N_LAYERS: usize = 2;
pub const N_CTX_TRAIN: u32 = 512;

pub const UNK: u32 = 0;
pub const BOS: u32 = 1;
pub const EOS: u32 = 2;

/// Options of [`tiny_gguf`].
#[derive(Debug, Clone, Copy)]
pub struct TinyOptions {
    /// `tokenizer.ggml.eos_token_id` (the weights do not depend on it).
    pub eos_id: u32,
    /// Put a NaN into this row of `output.weight` (its logit becomes NaN).
    pub nan_output_row: Option<u32>,
}

impl Default for TinyOptions {
    fn default() -> Self {
        TinyOptions {
            eos_id: EOS,
            nan_output_row: None,
        }
    }
}

/// The vocabulary: `<unk>`, `<s>`, `</s>`, three byte tokens (newline and the two bytes
/// of "é"), single characters and a few words (SentencePiece spelling, U+2581 for space).
pub fn vocab() -> (Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in ["<0x0A>", "<0xC3>", "<0xA9>"] {
        tokens.push(b.into());
        types.push(6);
    }
    tokens.push("\u{2581}".into());
    types.push(1);
    for c in 'a'..='z' {
        tokens.push(c.to_string());
        types.push(1);
    }
    for p in [".", ",", "!", "?"] {
        tokens.push(p.into());
        types.push(1);
    }
    for w in [
        "the", "cat", "sat", "on", "mat", "dog", "ran", "far", "away", "and", "then", "it", "was",
        "good", "day", "sun", "moon", "star", "sky", "blue",
    ] {
        tokens.push(format!("\u{2581}{w}"));
        types.push(1);
    }
    (tokens, types)
}

/// Number of tokens in [`vocab`].
pub fn n_vocab() -> usize {
    vocab().0.len()
}

/// SplitMix64; one stream per tensor.
struct Rng(u64);

impl Rng {
    fn new(name: &str) -> Rng {
        // FNV-1a of the tensor name.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        Rng(h)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Roughly standard normal (sum of four uniforms, unit variance).
    fn normal(&mut self) -> f32 {
        let mut s = 0.0f32;
        for _ in 0..4 {
            s += (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        }
        (s - 2.0) * 1.732_050_8
    }
}

fn values(name: &str, n: usize, std: f32, mean: f32) -> Vec<f32> {
    let mut rng = Rng::new(name);
    (0..n).map(|_| mean + std * rng.normal()).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn q8_0_bytes(v: &[f32], row_len: usize) -> Vec<u8> {
    let row_bytes = GgmlType::Q8_0
        .row_bytes(row_len as u64)
        .expect("row length is a multiple of 32") as usize;
    let mut out = vec![0u8; v.len() / row_len * row_bytes];
    for (row, dst) in v.chunks_exact(row_len).zip(out.chunks_exact_mut(row_bytes)) {
        nx_lazy_weight::quantize_row(GgmlType::Q8_0, row, dst).expect("quantize");
    }
    out
}

/// The file's bytes.
pub fn tiny_gguf(opts: TinyOptions) -> Vec<u8> {
    let (tokens, types) = vocab();
    let n_vocab = tokens.len();
    let mut w = GgufWriter::new();
    let md = |w: &mut GgufWriter, k: &str, v: Value| w.add_metadata(k, v);
    md(
        &mut w,
        "general.architecture",
        Value::String("llama".into()),
    );
    md(&mut w, "general.name", Value::String("nx-run tiny".into()));
    md(&mut w, "llama.block_count", Value::U32(N_LAYERS as u32));
    md(&mut w, "llama.embedding_length", Value::U32(N_EMBD as u32));
    md(&mut w, "llama.feed_forward_length", Value::U32(N_FF as u32));
    md(
        &mut w,
        "llama.attention.head_count",
        Value::U32(N_HEAD as u32),
    );
    md(
        &mut w,
        "llama.attention.head_count_kv",
        Value::U32(N_HEAD_KV as u32),
    );
    md(
        &mut w,
        "llama.attention.layer_norm_rms_epsilon",
        Value::F32(1e-5),
    );
    md(&mut w, "llama.context_length", Value::U32(N_CTX_TRAIN));
    md(&mut w, "llama.rope.freq_base", Value::F32(10_000.0));
    md(
        &mut w,
        "tokenizer.ggml.model",
        Value::String("llama".into()),
    );
    md(&mut w, "tokenizer.ggml.tokens", Value::str_array(&tokens));
    let scores: Vec<f32> = (0..n_vocab).map(|i| -(i as f32)).collect();
    md(&mut w, "tokenizer.ggml.scores", Value::f32_array(&scores));
    md(
        &mut w,
        "tokenizer.ggml.token_type",
        Value::i32_array(&types),
    );
    md(&mut w, "tokenizer.ggml.bos_token_id", Value::U32(BOS));
    md(
        &mut w,
        "tokenizer.ggml.eos_token_id",
        Value::U32(opts.eos_id),
    );
    md(&mut w, "tokenizer.ggml.unknown_token_id", Value::U32(UNK));
    md(&mut w, "tokenizer.ggml.add_bos_token", Value::Bool(true));

    let q_dim = N_HEAD * HEAD_DIM;
    let kv_dim = N_HEAD_KV * HEAD_DIM;
    let dense = |w: &mut GgufWriter, name: &str, k: usize, n: usize| {
        let v = values(name, k * n, 1.0 / (k as f32).sqrt(), 0.0);
        w.add_tensor(
            name,
            GgmlType::Q8_0,
            vec![k as u64, n as u64],
            q8_0_bytes(&v, k),
        );
    };
    let norm = |w: &mut GgufWriter, name: &str| {
        let v = values(name, N_EMBD, 0.1, 1.0);
        w.add_tensor(name, GgmlType::F32, vec![N_EMBD as u64], f32_bytes(&v));
    };
    let embd = values("token_embd.weight", N_EMBD * n_vocab, 1.0, 0.0);
    w.add_tensor(
        "token_embd.weight",
        GgmlType::F32,
        vec![N_EMBD as u64, n_vocab as u64],
        f32_bytes(&embd),
    );
    for l in 0..N_LAYERS {
        norm(&mut w, &format!("blk.{l}.attn_norm.weight"));
        dense(&mut w, &format!("blk.{l}.attn_q.weight"), N_EMBD, q_dim);
        dense(&mut w, &format!("blk.{l}.attn_k.weight"), N_EMBD, kv_dim);
        dense(&mut w, &format!("blk.{l}.attn_v.weight"), N_EMBD, kv_dim);
        dense(
            &mut w,
            &format!("blk.{l}.attn_output.weight"),
            q_dim,
            N_EMBD,
        );
        norm(&mut w, &format!("blk.{l}.ffn_norm.weight"));
        dense(&mut w, &format!("blk.{l}.ffn_gate.weight"), N_EMBD, N_FF);
        dense(&mut w, &format!("blk.{l}.ffn_up.weight"), N_EMBD, N_FF);
        dense(&mut w, &format!("blk.{l}.ffn_down.weight"), N_FF, N_EMBD);
    }
    norm(&mut w, "output_norm.weight");
    // Logits of a unit-RMS state have a standard deviation of about 3: peaked enough for
    // clear greedy choices, flat enough that sampling varies.
    let mut head = values(
        "output.weight",
        N_EMBD * n_vocab,
        3.0 / (N_EMBD as f32).sqrt(),
        0.0,
    );
    if let Some(row) = opts.nan_output_row {
        head[row as usize * N_EMBD] = f32::NAN;
    }
    w.add_tensor(
        "output.weight",
        GgmlType::F32,
        vec![N_EMBD as u64, n_vocab as u64],
        f32_bytes(&head),
    );
    w.to_bytes()
}
