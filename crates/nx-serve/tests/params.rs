//! Request parsing and validation, response shapes and SSE framing, without a server.

use nx_run::{SamplerConfig, StopReason};
use nx_serve::params::{build_requests, parse_body, parse_value, Endpoint, PromptInput};
use nx_serve::response::{self, TokenLogprob};
use nx_serve::ApiError;
use serde_json::{json, Value};

mod common;

fn chat(v: Value) -> Result<nx_serve::GenParams, ApiError> {
    parse_value(Endpoint::Chat, &v)
}

fn completion(v: Value) -> Result<nx_serve::GenParams, ApiError> {
    parse_value(Endpoint::Completion, &v)
}

/// Asserts a 400 whose message and `param` name `field`.
#[track_caller]
fn assert_field_error(result: Result<nx_serve::GenParams, ApiError>, field: &str) {
    let e = result.expect_err("expected an error");
    assert_eq!(e.status.as_u16(), 400, "{e}");
    assert!(
        e.message.contains(field),
        "message {:?} does not name {field}",
        e.message
    );
    assert_eq!(e.param.as_deref(), Some(field), "{e:?}");
    let body = e.body();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["param"], field);
}

fn msgs() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

#[test]
fn malformed_json_is_400() {
    for body in [&b"{"[..], b"not json", b"{\"prompt\": }", b""] {
        let e = parse_body(Endpoint::Completion, body).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.message.contains("JSON"), "{}", e.message);
    }
    let e = parse_body(Endpoint::Completion, b"[1, 2]").unwrap_err();
    assert_eq!(e.status.as_u16(), 400);
    assert!(e.message.contains("object"), "{}", e.message);
}

#[test]
fn wrong_types_name_the_field() {
    let cases = [
        (
            json!({"messages": msgs(), "temperature": "hot"}),
            "temperature",
        ),
        (json!({"messages": msgs(), "top_p": []}), "top_p"),
        (json!({"messages": msgs(), "top_k": 1.5}), "top_k"),
        (json!({"messages": msgs(), "min_p": "x"}), "min_p"),
        (
            json!({"messages": msgs(), "max_tokens": "10"}),
            "max_tokens",
        ),
        (
            json!({"messages": msgs(), "max_completion_tokens": true}),
            "max_completion_tokens",
        ),
        (json!({"messages": msgs(), "stream": "yes"}), "stream"),
        (
            json!({"messages": msgs(), "stream_options": 3}),
            "stream_options",
        ),
        (
            json!({"messages": msgs(), "stream_options": {"include_usage": "y"}}),
            "stream_options.include_usage",
        ),
        (json!({"messages": msgs(), "seed": "s"}), "seed"),
        (json!({"messages": msgs(), "seed": 1.5}), "seed"),
        (json!({"messages": msgs(), "n": "2"}), "n"),
        (json!({"messages": msgs(), "stop": 5}), "stop"),
        (json!({"messages": msgs(), "stop": ["a", 1]}), "stop"),
        (json!({"messages": msgs(), "logprobs": 1}), "logprobs"),
        (json!({"messages": msgs(), "ignore_eos": 1}), "ignore_eos"),
        (json!({"messages": msgs(), "model": 3}), "model"),
        (
            json!({"messages": msgs(), "presence_penalty": "p"}),
            "presence_penalty",
        ),
        (
            json!({"messages": msgs(), "frequency_penalty": {}}),
            "frequency_penalty",
        ),
        (
            json!({"messages": msgs(), "repeat_penalty": "r"}),
            "repeat_penalty",
        ),
        (json!({"messages": "hi"}), "messages"),
        (json!({}), "messages"),
        (json!({"messages": [3]}), "messages[0]"),
        (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
        (
            json!({"messages": [{"role": "user", "content": 3}]}),
            "messages[0].content",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content[0].type",
        ),
    ];
    for (body, field) in cases {
        assert_field_error(chat(body), field);
    }
    let cases = [
        (json!({}), "prompt"),
        (json!({"prompt": {}}), "prompt"),
        (json!({"prompt": [1, "a"]}), "prompt"),
        (json!({"prompt": [1, -2]}), "prompt"),
        (json!({"prompt": ["a", "b"]}), "prompt"),
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": "x", "logprobs": "2"}), "logprobs"),
        (
            json!({"prompt": "x", "parse_special": "no"}),
            "parse_special",
        ),
    ];
    for (body, field) in cases {
        assert_field_error(completion(body), field);
    }
}

#[test]
fn out_of_range_values_name_the_field() {
    let cases = [
        (
            json!({"messages": msgs(), "temperature": -0.1}),
            "temperature",
        ),
        (
            json!({"messages": msgs(), "temperature": 2.5}),
            "temperature",
        ),
        (json!({"messages": msgs(), "top_p": 0}), "top_p"),
        (json!({"messages": msgs(), "top_p": 1.5}), "top_p"),
        (json!({"messages": msgs(), "min_p": 1.5}), "min_p"),
        (json!({"messages": msgs(), "top_k": -1}), "top_k"),
        (json!({"messages": msgs(), "max_tokens": 0}), "max_tokens"),
        (
            json!({"messages": msgs(), "max_completion_tokens": -5}),
            "max_completion_tokens",
        ),
        (json!({"messages": msgs(), "n": 0}), "n"),
        (json!({"messages": msgs(), "n": 17}), "n"),
        (
            json!({"messages": msgs(), "presence_penalty": 2.5}),
            "presence_penalty",
        ),
        (
            json!({"messages": msgs(), "frequency_penalty": -3}),
            "frequency_penalty",
        ),
        (
            json!({"messages": msgs(), "repeat_penalty": 0}),
            "repeat_penalty",
        ),
        (
            json!({"messages": msgs(), "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            json!({"messages": msgs(), "top_logprobs": 2}),
            "top_logprobs",
        ),
        (json!({"messages": msgs(), "stop": [""]}), "stop"),
        (json!({"messages": msgs(), "stop": vec!["x"; 17]}), "stop"),
    ];
    for (body, field) in cases {
        assert_field_error(chat(body), field);
    }
    assert_field_error(
        completion(json!({"prompt": "x", "logprobs": 6})),
        "logprobs",
    );
    assert_field_error(
        completion(json!({"prompt": "x", "logprobs": -1})),
        "logprobs",
    );
}

#[test]
fn defaults_and_accepted_forms() {
    let p = chat(json!({"messages": msgs(), "unknown_field": {"x": 1}, "user": "me"})).unwrap();
    assert_eq!(p.sampler, SamplerConfig::default());
    assert_eq!(p.n, 1);
    assert!(!p.stream && !p.include_usage);
    assert_eq!(p.logprobs, None);
    assert_eq!(p.max_tokens, None);
    assert!(p.stop.is_empty());
    assert_eq!(
        p.prompt,
        PromptInput::Messages(vec![nx_run::ChatMessage::user("hi")])
    );

    // null counts as absent.
    let p = chat(json!({"messages": msgs(), "temperature": null, "stop": null})).unwrap();
    assert_eq!(p.sampler.temperature, SamplerConfig::default().temperature);

    let p = chat(json!({
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null},
        ],
        "temperature": 0, "top_p": 0.5, "top_k": 3, "min_p": 0.1, "seed": 42,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repeat_penalty": 1.1,
        "max_completion_tokens": 7, "max_tokens": 99, "n": 3, "stream": true,
        "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 4,
        "ignore_eos": true, "model": "tiny",
    }))
    .unwrap();
    let PromptInput::Messages(m) = &p.prompt else {
        panic!()
    };
    assert_eq!(m[1].content, "ab");
    assert_eq!(m[2].content, "");
    assert_eq!(p.sampler.temperature, 0.0);
    assert_eq!(p.sampler.top_p, 0.5);
    assert_eq!(p.sampler.top_k, 3);
    assert_eq!(p.sampler.min_p, 0.1);
    assert_eq!(p.sampler.seed, 42);
    assert_eq!(p.sampler.presence_penalty, 0.5);
    assert_eq!(p.sampler.frequency_penalty, -0.5);
    assert_eq!(p.sampler.repeat_penalty, 1.1);
    assert_eq!(p.max_tokens, Some(7), "max_completion_tokens wins");
    assert_eq!(p.n, 3);
    assert!(p.stream && p.include_usage && p.ignore_eos);
    assert_eq!(p.logprobs, Some(4));
    assert_eq!(p.model.as_deref(), Some("tiny"));

    let p = chat(json!({"messages": msgs(), "logprobs": true})).unwrap();
    assert_eq!(p.logprobs, Some(0));
    let p = chat(json!({"messages": msgs(), "max_tokens": 5.0, "seed": -1})).unwrap();
    assert_eq!(p.max_tokens, Some(5));
    assert_eq!(p.sampler.seed, u64::MAX);

    let p = completion(json!({"prompt": "hello", "logprobs": 2})).unwrap();
    assert_eq!(p.prompt, PromptInput::Text("hello".into()));
    assert_eq!(p.logprobs, Some(2));
    let p = completion(json!({"prompt": ["hello"], "logprobs": false})).unwrap();
    assert_eq!(p.prompt, PromptInput::Text("hello".into()));
    assert_eq!(p.logprobs, None);
    let p = completion(json!({"prompt": [1, 5, 7], "parse_special": true})).unwrap();
    assert_eq!(p.prompt, PromptInput::Ids(vec![1, 5, 7]));
    assert!(p.parse_special);
}

#[test]
fn stop_as_string_or_list() {
    let p = completion(json!({"prompt": "x", "stop": "\n"})).unwrap();
    assert_eq!(p.stop, vec!["\n".to_string()]);
    let p = completion(json!({"prompt": "x", "stop": ["a", "bc"]})).unwrap();
    assert_eq!(p.stop, vec!["a".to_string(), "bc".to_string()]);
    let p = completion(json!({"prompt": "x", "stop": vec!["s"; 16]})).unwrap();
    assert_eq!(p.stop.len(), 16);
    let reqs = build_requests(&p, &[1, 2], 64, 100).unwrap();
    assert_eq!(reqs[0].stop_strings.len(), 16);
}

#[test]
fn n_choices_get_consecutive_seeds() {
    let p = completion(json!({"prompt": "x", "n": 3, "seed": 10, "max_tokens": 5,
                              "logprobs": 2, "ignore_eos": true}))
    .unwrap();
    let reqs = build_requests(&p, &[1, 2, 3], 64, 100).unwrap();
    assert_eq!(reqs.len(), 3);
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.sampler.seed, 10 + i as u64);
        assert_eq!(r.prompt, vec![1, 2, 3]);
        assert_eq!(r.max_tokens, 5);
        assert_eq!(r.logprobs, 2);
        assert!(r.ignore_eos);
        assert_eq!(r.max_bytes, None);
    }
}

#[test]
fn context_limits() {
    let p = completion(json!({"prompt": "x"})).unwrap();
    // Default max_tokens: the rest of the context.
    let reqs = build_requests(&p, &[1; 10], 64, 100).unwrap();
    assert_eq!(reqs[0].max_tokens, 54);
    // A prompt that fills the context leaves no room.
    let e = build_requests(&p, &[1; 64], 64, 100).unwrap_err();
    assert_eq!(e.status.as_u16(), 400);
    assert!(e.message.contains("64"), "{}", e.message);

    let p = completion(json!({"prompt": "x", "max_tokens": 300})).unwrap();
    let e = build_requests(&p, &[1; 10], 256, 100).unwrap_err();
    assert_eq!(e.status.as_u16(), 400);
    for number in ["10", "300", "256"] {
        assert!(e.message.contains(number), "{} lacks {number}", e.message);
    }
    assert!(e.message.contains("max_tokens"), "{}", e.message);
    assert_eq!(e.code, Some("context_length_exceeded"));
    // Exactly full is fine.
    let p = completion(json!({"prompt": "x", "max_tokens": 246})).unwrap();
    assert!(build_requests(&p, &[1; 10], 256, 100).is_ok());

    let p = chat(json!({"messages": msgs(), "max_completion_tokens": 300})).unwrap();
    let e = build_requests(&p, &[1; 10], 256, 100).unwrap_err();
    assert!(e.message.contains("max_completion_tokens"), "{}", e.message);

    // Token ids outside the vocabulary, empty prompts.
    let p = completion(json!({"prompt": [1, 500]})).unwrap();
    let e = build_requests(&p, &[1, 500], 256, 100).unwrap_err();
    assert!(
        e.message.contains("prompt[1]") && e.message.contains("500"),
        "{}",
        e.message
    );
    let e = build_requests(&p, &[], 256, 100).unwrap_err();
    assert_eq!(e.status.as_u16(), 400);
}

#[test]
fn sse_framing_of_a_chunk() {
    let env = response::Envelope {
        id: "cmpl-1".into(),
        created: 7,
        model: "tiny".into(),
        endpoint: Endpoint::Completion,
    };
    let chunk = env.chunk(0, Some("a\nb"), false, Value::Null, None, false);
    let framed = response::sse_data(&chunk);
    assert!(framed.starts_with("data: {"));
    assert!(framed.ends_with("}\n\n"));
    assert_eq!(
        framed.matches('\n').count(),
        2,
        "one line per event: {framed:?}"
    );
    let back: Value = serde_json::from_str(&framed["data: ".len()..framed.len() - 2]).unwrap();
    assert_eq!(back["choices"][0]["text"], "a\nb");
    assert_eq!(back["object"], "text_completion");
    assert_eq!(back["choices"][0]["finish_reason"], Value::Null);
    assert_eq!(response::SSE_DONE, "data: [DONE]\n\n");

    let env = response::Envelope {
        endpoint: Endpoint::Chat,
        id: "chatcmpl-1".into(),
        ..env
    };
    let first = env.chunk(2, Some("hi"), true, Value::Null, None, true);
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["index"], 2);
    assert_eq!(
        first["choices"][0]["delta"],
        json!({"role": "assistant", "content": "hi"})
    );
    assert_eq!(first["usage"], Value::Null);
    assert!(first.as_object().unwrap().contains_key("usage"));
    let last = env.chunk(0, None, false, Value::Null, Some("length"), false);
    assert_eq!(last["choices"][0]["delta"], json!({}));
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(!last.as_object().unwrap().contains_key("usage"));
    let usage = env.usage_chunk(response::usage_json(3, 4, 1));
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
               "prompt_tokens_details": {"cached_tokens": 1}})
    );
}

#[test]
fn finish_reasons() {
    assert_eq!(response::finish_reason(StopReason::Eos), "stop");
    assert_eq!(response::finish_reason(StopReason::StopString), "stop");
    assert_eq!(response::finish_reason(StopReason::MaxTokens), "length");
    assert_eq!(response::finish_reason(StopReason::MaxBytes), "length");
}

#[test]
fn logprobs_shapes() {
    let (_, tok, _) = common::load();
    let a = common::letter_id('a');
    let b = common::letter_id('b');
    let tokens = vec![
        TokenLogprob {
            id: a,
            logprob: -0.25,
            top: vec![(a, -0.25), (b, -2.0)],
        },
        TokenLogprob {
            id: b,
            logprob: f32::NEG_INFINITY,
            top: vec![(b, -0.5), (a, -1.0)],
        },
    ];
    let chat = response::chat_logprobs(&tok, &tokens);
    assert_eq!(chat["refusal"], Value::Null);
    let content = chat["content"].as_array().unwrap();
    assert_eq!(content.len(), 2);
    assert_eq!(content[0]["token"], "a");
    assert_eq!(content[0]["logprob"], -0.25);
    assert_eq!(content[0]["bytes"], json!([b'a']));
    assert_eq!(
        content[0]["top_logprobs"],
        json!([{"token": "a", "logprob": -0.25, "bytes": [97]},
               {"token": "b", "logprob": -2.0, "bytes": [98]}])
    );
    assert!(
        content[1]["logprob"].as_f64().unwrap() < -1000.0,
        "−∞ is a finite number"
    );

    let c = response::completion_logprobs(&tok, &tokens, 2, 5);
    assert_eq!(c["tokens"], json!(["a", "b"]));
    assert_eq!(c["token_logprobs"][0], -0.25);
    assert_eq!(c["top_logprobs"][0], json!({"a": -0.25, "b": -2.0}));
    assert_eq!(c["text_offset"], json!([5, 6]));
    assert_eq!(c["token_ids"], json!([a, b]));
    let c = response::completion_logprobs(&tok, &tokens, 0, 0);
    assert_eq!(c["top_logprobs"], json!([null, null]));
}

#[test]
fn submit_errors_map_to_statuses() {
    use nx_run::RunError;
    assert_eq!(
        ApiError::from_submit(&RunError::QueueFull { max_queue: 3 })
            .status
            .as_u16(),
        429
    );
    let e = ApiError::from_submit(&RunError::ContextOverflow {
        cached: 0,
        prompt_tokens: 10,
        max_tokens: 300,
        n_ctx: 256,
    });
    assert_eq!(e.status.as_u16(), 400);
    assert!(e.message.contains("10") && e.message.contains("300") && e.message.contains("256"));
    assert_eq!(
        ApiError::from_submit(&RunError::EmptyPrompt)
            .status
            .as_u16(),
        400
    );
}

#[test]
fn fields_nx_does_not_implement_are_refused_by_name() {
    for (field, value) in [
        ("echo", serde_json::json!(true)),
        ("suffix", serde_json::json!("end")),
        ("best_of", serde_json::json!(3)),
        ("tools", serde_json::json!([{"type": "function"}])),
        (
            "response_format",
            serde_json::json!({"type": "json_schema", "json_schema": {"name": "x"}}),
        ),
    ] {
        let mut body = serde_json::json!({"prompt": "hi"});
        body[field] = value;
        let err = nx_serve::params::parse_value(nx_serve::params::Endpoint::Completion, &body)
            .err()
            .unwrap_or_else(|| panic!("{field} accepted"));
        let text = format!("{err:?}");
        assert!(
            text.contains(field) && text.contains("not supported"),
            "{text}"
        );
    }
    // Their neutral values are fine.
    let body = serde_json::json!({"prompt": "hi", "echo": false, "logit_bias": {}, "best_of": 1,
        "response_format": {"type": "text"}, "suffix": null});
    assert!(nx_serve::params::parse_value(nx_serve::params::Endpoint::Completion, &body).is_ok());
}

/// `response_format`: text (the default) or JSON mode, which reaches every choice's
/// request; any other type is a 400 naming the field.
#[test]
fn response_format_json_object_turns_on_json_mode() {
    let p = chat(json!({"messages": msgs(), "response_format": {"type": "json_object"}, "n": 2}))
        .unwrap();
    assert!(p.json_object);
    let reqs = build_requests(&p, &[1], 64, 100).unwrap();
    assert!(reqs.iter().all(|r| r.json_object));
    for off in [json!({"type": "text"}), Value::Null] {
        let p = chat(json!({"messages": msgs(), "response_format": off})).unwrap();
        assert!(!p.json_object);
        assert!(!build_requests(&p, &[1], 64, 100).unwrap()[0].json_object);
    }
    for bad in [
        json!({"type": "yaml"}),
        json!({}),
        json!("json_object"),
        json!(1),
    ] {
        assert_field_error(
            chat(json!({"messages": msgs(), "response_format": bad})),
            "response_format",
        );
    }
}

/// `logit_bias` as OpenAI takes it: token ids (decimal strings) to biases in
/// [-100, 100], into the sampler in id order; anything else a 400 naming the field, ids
/// past the vocabulary included.
#[test]
fn logit_bias_is_parsed_checked_and_reaches_the_sampler() {
    let p =
        completion(json!({"prompt": [1], "logit_bias": {"56": -100, "7": 2.5, "9": 0}})).unwrap();
    assert_eq!(p.sampler.logit_bias, [(7, 2.5), (9, 0.0), (56, -100.0)]);
    let reqs = build_requests(&p, &[1], 64, 100).unwrap();
    assert_eq!(reqs[0].sampler.logit_bias, p.sampler.logit_bias);
    let e = build_requests(&p, &[1], 64, 50).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("logit_bias"), "{e:?}");
    assert!(e.message.contains("56"), "{}", e.message);
    assert!(completion(json!({"prompt": "x", "logit_bias": null}))
        .unwrap()
        .sampler
        .logit_bias
        .is_empty());
    let too_many: serde_json::Map<String, Value> =
        (0..301).map(|i| (i.to_string(), json!(1))).collect();
    for bad in [
        json!([[56, -100]]),
        json!("56:-100"),
        json!({"x": 1}),
        json!({"-3": 1}),
        json!({"56": 101}),
        json!({"56": -100.5}),
        json!({"56": "ban"}),
        json!({"56": null}),
        Value::Object(too_many),
    ] {
        assert_field_error(
            completion(json!({"prompt": "x", "logit_bias": bad})),
            "logit_bias",
        );
    }
}

#[test]
fn speculative_is_per_request() {
    use nx_run::{DraftSource, Speculation};
    use nx_serve::params::SpeculationChoice;
    let server = Some(Speculation {
        source: DraftSource::Model,
        draft_max: 4,
    });
    let p = completion(json!({"prompt": "x"})).unwrap();
    assert_eq!(p.speculation, SpeculationChoice::ServerDefault);
    assert_eq!(p.speculation.resolve(server), server);
    for off in [json!(false), json!("none")] {
        let p = chat(json!({"messages": msgs(), "speculative": off})).unwrap();
        assert_eq!(p.speculation.resolve(server), None);
    }
    let p = completion(json!({"prompt": "x", "speculative": "ngram", "draft_max": 3})).unwrap();
    assert_eq!(
        p.speculation.resolve(server),
        Some(Speculation {
            source: DraftSource::Ngram,
            draft_max: 3
        })
    );
    let p = completion(json!({"prompt": "x", "speculative": "draft"})).unwrap();
    assert_eq!(
        p.speculation.resolve(None),
        Some(Speculation {
            source: DraftSource::Model,
            draft_max: nx_serve::params::DEFAULT_DRAFT_MAX
        })
    );
    assert_field_error(
        completion(json!({"prompt": "x", "speculative": "medusa"})),
        "speculative",
    );
    assert_field_error(
        completion(json!({"prompt": "x", "speculative": 1})),
        "speculative",
    );
    assert_field_error(
        completion(json!({"prompt": "x", "speculative": "ngram", "draft_max": 0})),
        "draft_max",
    );
    assert_field_error(
        completion(json!({"prompt": "x", "speculative": "ngram", "draft_max": 33})),
        "draft_max",
    );
    assert_field_error(
        completion(json!({"prompt": "x", "draft_max": 4})),
        "draft_max",
    );
}
