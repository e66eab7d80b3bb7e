//! Seed inputs per target, built from the fixtures the tests use (the tiny model file,
//! the built-in chat templates, request bodies as the OpenAI client sends them).
//!
//! They are made by code rather than committed so that they follow the formats as those
//! change; `cargo xtask fuzz` writes them into the corpus directory before a run, and the
//! smoke test replays them with the committed regressions.

use nx_gguf::{GgmlType, GgufWriter, Value};
use nx_llama_stack::tiny_fixture::{tiny_gguf, TinyOptions};
use nx_run::chat::BuiltinTemplate;

/// The seeds of target `name` (empty for an unknown name).
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    match name {
        "gguf_header" => {
            let mut s = model_files();
            s.push(small_header());
            s
        }
        "model_open" => model_files(),
        "tokenizer" => tokenizer_seeds(),
        "chat_template" => chat_template_seeds(),
        "sampler" => sampler_seeds(),
        "api_request" => api_request_seeds(),
        _ => Vec::new(),
    }
}

fn model_files() -> Vec<Vec<u8>> {
    vec![
        tiny_gguf(TinyOptions::default()),
        tiny_gguf(TinyOptions {
            nan_output_row: Some(5),
            ..TinyOptions::default()
        }),
    ]
}

/// A file with one value of every metadata type and a few tensor types.
fn small_header() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()));
    w.add_metadata("general.alignment", Value::U32(32));
    w.add_metadata("a.u8", Value::U8(1));
    w.add_metadata("a.i8", Value::I8(-1));
    w.add_metadata("a.u16", Value::U16(2));
    w.add_metadata("a.i16", Value::I16(-2));
    w.add_metadata("a.i32", Value::I32(-3));
    w.add_metadata("a.f32", Value::F32(0.5));
    w.add_metadata("a.bool", Value::Bool(true));
    w.add_metadata("a.u64", Value::U64(4));
    w.add_metadata("a.i64", Value::I64(-4));
    w.add_metadata("a.f64", Value::F64(0.25));
    w.add_tensor("f32", GgmlType::F32, vec![4, 2], vec![0; 32]);
    w.add_tensor("q8", GgmlType::Q8_0, vec![32], vec![0; 34]);
    w.add_tensor("q4k", GgmlType::Q4_K, vec![256], vec![0; 144]);
    w.to_bytes()
}

fn tokenizer_seeds() -> Vec<Vec<u8>> {
    let texts = [
        "",
        "Hello, world!",
        "  leading spaces and\ttabs\r\n\n",
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "<s>[INST] question [/INST]</s>",
        "numbers 1234567 and 3.14159, code: fn main() { println!(\"x\"); }",
        "Grüße, 日本語のテキスト, эмодзи 🦀👩‍💻, العربية",
        "\u{2581}spm space\u{2581}mark",
        "don't I'll we've THEY'RE",
    ];
    let mut seeds = Vec::new();
    for flags in 0..8u8 {
        for t in texts {
            let mut s = vec![flags];
            s.extend_from_slice(t.as_bytes());
            seeds.push(s);
        }
    }
    seeds
}

fn chat_template_seeds() -> Vec<Vec<u8>> {
    let messages = "\0You are terse.\0Hello!\0Hi. How can I help?\0Say one word.";
    let mut seeds: Vec<Vec<u8>> = BuiltinTemplate::ALL
        .iter()
        .map(|t| format!("{}{messages}", t.source()).into_bytes())
        .collect();
    for hostile in [
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{{ 'x' * 99999999 }}{{ 'y' * 99999999 }}",
        "{{ raise_exception('no system role') }}",
        "{% for m in messages %}{{ m.role | upper }}: {{ m.content.strip() }}\n{% endfor %}",
        "{{ messages | tojson }}{{ bos_token ~ eos_token }}",
    ] {
        seeds.push(format!("{hostile}{messages}").into_bytes());
    }
    seeds
}

fn sampler_seeds() -> Vec<Vec<u8>> {
    let head = |t: f32, top_p: f32, min_p: f32, rep: f32, top_k: u16, last_n: u16| {
        let mut h = Vec::new();
        for v in [t, top_p, min_p, rep, 0.0, 0.0] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        h.extend_from_slice(&top_k.to_le_bytes());
        h.extend_from_slice(&last_n.to_le_bytes());
        h.extend_from_slice(&42u64.to_le_bytes());
        h
    };
    let logits = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let rows: [&[f32]; 5] = [
        &[1.0, 2.0, 3.0, -1.0, 0.5, 0.25, 7.0, -3.0],
        &[0.0; 8],
        &[f32::NAN, 1.0, f32::INFINITY, f32::NEG_INFINITY],
        &[f32::NEG_INFINITY; 4],
        &[],
    ];
    let mut seeds = Vec::new();
    for h in [
        head(0.8, 0.95, 0.05, 1.0, 40, 64),
        head(0.0, 1.0, 0.0, 1.0, 0, 0),
        head(1.5, 0.5, 0.2, 1.3, 3, 8),
    ] {
        for r in rows {
            let mut s = h.clone();
            s.extend(logits(r));
            seeds.push(s);
        }
    }
    seeds
}

fn api_request_seeds() -> Vec<Vec<u8>> {
    [
        r#"{"model":"nx","messages":[{"role":"user","content":"Hi"}]}"#,
        r#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":8,"temperature":0.7,"top_p":0.9,"seed":7,"stop":["\n"],"logprobs":true,"top_logprobs":3,"n":2}"#,
        r#"{"prompt":"Once upon a time","max_tokens":16,"temperature":0,"logprobs":2,"echo":false}"#,
        r#"{"prompt":[1,2,3,4],"max_tokens":4,"ignore_eos":true,"parse_special":true}"#,
        r#"{"prompt":"x","frequency_penalty":0.5,"presence_penalty":-0.5,"top_k":20,"min_p":0.1,"repeat_penalty":1.1}"#,
        r#"{"messages":[],"max_tokens":-1}"#,
        r#"{"prompt":"x","logit_bias":{"1":2}}"#,
        "[]",
        "",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}
