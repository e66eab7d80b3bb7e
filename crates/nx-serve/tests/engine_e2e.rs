//! End to end against the REAL engine (`nx_run::Engine`) on the tiny model.
//!
//! DEPENDS ON THE ENGINE: every test here fails (the engine thread panics on `todo!()`
//! and `/health` reports an error) until `nx_run::Engine` is implemented.

mod common;

use std::time::Duration;

use common::{read_until, send_request, test_config, TestServer};
use nx_run::ChatMessage;
use serde_json::{json, Value};

fn greedy_ids(s: &TestServer, prompt: &str, n: usize) -> Vec<u64> {
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 0,
                "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["logprobs"]["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn engine_health_models_tokenize_detokenize_metrics() {
    let s = TestServer::real(test_config());
    assert_eq!(s.get("/health").json(), json!({"status": "ok"}));
    assert_eq!(s.get("/v1/models").json()["data"][0]["id"], "tiny");
    let ids = s
        .post_json("/tokenize", &json!({"content": "the dog"}))
        .json()["tokens"]
        .clone();
    let d = s.post_json("/detokenize", &json!({"tokens": ids})).json();
    assert_eq!(d["content"], " the dog");
    let text = s.get("/metrics").body;
    assert!(common::metric(&text, "nx_kv_blocks_total") > 0.0, "{text}");
    assert_eq!(common::metric(&text, "nx_requests_running"), 0.0);
}

#[test]
fn engine_non_streaming_completion() {
    let s = TestServer::real(test_config());
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "the cat sat", "max_tokens": 8, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 8);
    let prompt = s
        .post_json(
            "/tokenize",
            &json!({"content": "the cat sat", "add_special": true, "parse_special": false}),
        )
        .json()["tokens"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(v["usage"]["prompt_tokens"], prompt);
    s.wait_metric("nx_generated_tokens_total", 8.0, 10);
}

#[test]
fn engine_chat_prompt_is_nx_chats() {
    let (_, tok, template) = common::load();
    let s = TestServer::real(test_config());
    let messages = [ChatMessage::user("the cat")];
    let expected = template.encode(&tok, &messages, true).unwrap();
    let r = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 4,
                "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["prompt_tokens"], expected.len());
}

#[test]
fn engine_streaming_completion() {
    let s = TestServer::real(test_config());
    let plain = s
        .post_json(
            "/v1/completions",
            &json!({"prompt": "the sun", "max_tokens": 10, "temperature": 0, "ignore_eos": true}),
        )
        .json();
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "the sun", "max_tokens": 10, "temperature": 0, "ignore_eos": true,
                "stream": true, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status, 200);
    let events = r.sse();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, plain["choices"][0]["text"].as_str().unwrap());
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 10);
}

#[test]
fn engine_greedy_is_deterministic_alone_and_concurrent() {
    let s = TestServer::real(test_config());
    let a = greedy_ids(&s, "the moon and the star", 16);
    let b = greedy_ids(&s, "the moon and the star", 16);
    assert_eq!(a.len(), 16);
    assert_eq!(a, b);
    let addr = s.addr;
    let handles: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let body = json!({"prompt": "the moon and the star", "max_tokens": 16,
                                  "temperature": 0, "logprobs": 0, "ignore_eos": true})
                .to_string();
                common::http(addr, "POST", "/v1/completions", Some(&body)).json()["choices"][0]
                    ["logprobs"]["token_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), a);
    }
}

#[test]
fn engine_disconnect_mid_stream_frees_the_sequence() {
    let s = TestServer::real(test_config());
    let body =
        json!({"prompt": "the", "max_tokens": 240, "stream": true, "ignore_eos": true}).to_string();
    let mut stream = send_request(s.addr, "POST", "/v1/completions", Some(&body));
    let got = read_until(&mut stream, "data: ");
    assert!(got.contains("200 OK"), "{got}");
    drop(stream);
    s.wait_metric("nx_requests_running", 0.0, 30);
    s.wait_metric("nx_requests_waiting", 0.0, 30);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(s.metric("nx_kv_blocks_used"), 0.0);
}

#[test]
fn engine_speculation_keeps_the_answer() {
    let plain = TestServer::real(test_config());
    let want = greedy_ids(&plain, "the cat sat on the mat and the cat sat on the", 24);
    drop(plain);
    let mut config = test_config();
    config.speculation = Some(nx_run::Speculation {
        source: nx_run::DraftSource::Ngram,
        draft_max: 4,
    });
    let spec = TestServer::real(config);
    let got = greedy_ids(&spec, "the cat sat on the mat and the cat sat on the", 24);
    assert_eq!(got, want);
}

#[test]
fn per_request_speculation_keeps_the_answer() {
    let s = TestServer::real(test_config());
    // A repetitive prompt, so prompt lookup finds drafts.
    let body = |spec: Value| {
        let mut b = json!({"prompt": "the cat sat on the mat. the cat sat on the mat. the cat",
                           "max_tokens": 16, "temperature": 0.8, "seed": 3, "ignore_eos": true,
                           "logprobs": 2});
        if !spec.is_null() {
            b["speculative"] = spec;
        }
        b
    };
    let plain = s.post_json("/v1/completions", &body(Value::Null));
    assert_eq!(plain.status, 200, "{}", plain.body);
    let plain = plain.json();
    for spec in [json!("ngram"), json!(false), json!("none")] {
        let r = s.post_json("/v1/completions", &body(spec.clone()));
        assert_eq!(r.status, 200, "{spec}: {}", r.body);
        let v = r.json();
        assert_eq!(v["choices"], plain["choices"], "{spec}");
    }
    let text = s.get("/metrics").body;
    assert!(
        common::metric(&text, "nx_drafted_tokens_total") > 0.0,
        "{text}"
    );
    // A draft model the server does not have is the client's mistake.
    let r = s.post_json("/v1/completions", &body(json!("draft")));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("draft model"), "{}", r.body);
}
