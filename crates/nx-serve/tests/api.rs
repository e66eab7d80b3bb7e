//! The HTTP API end to end over a scripted stand-in engine (`common::FakeBackend`):
//! routing, error statuses and bodies, response and stream shapes, `n`, log-probabilities,
//! cancellation on disconnect, engine failures. These need no real engine.

mod common;

use std::time::Duration;

use common::{read_until, send_request, test_config, TestServer};
use serde_json::{json, Value};

#[track_caller]
fn assert_error(r: &common::HttpResponse, status: u16, needle: &str) -> Value {
    assert_eq!(r.status, status, "{}", r.body);
    assert!(
        r.header("content-type")
            .unwrap_or("")
            .starts_with("application/json"),
        "{:?}",
        r.headers
    );
    let v = r.json();
    let message = v["error"]["message"].as_str().expect("error.message");
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    assert!(v["error"]["type"].is_string());
    v
}

#[test]
fn health_models_tokenize_detokenize_metrics() {
    let s = TestServer::fake(test_config());
    let r = s.get("/health");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"status": "ok"}));

    let m = s.get("/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "tiny");
    assert_eq!(m["data"][0]["object"], "model");
    assert_eq!(m["data"][1]["id"], "tiny-alias");

    let t = s
        .post_json("/tokenize", &json!({"content": "the cat"}))
        .json();
    let ids: Vec<u64> = t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(!ids.is_empty());
    let with_bos = s
        .post_json(
            "/tokenize",
            &json!({"content": "the cat", "add_special": true}),
        )
        .json();
    assert_eq!(with_bos["tokens"][0], common::tiny_model::BOS);
    let d = s.post_json("/detokenize", &json!({"tokens": ids})).json();
    assert_eq!(d["content"], " the cat");

    let text = s.get("/metrics").body;
    for name in [
        "nx_requests_total",
        "nx_prompt_tokens_total",
        "nx_generated_tokens_total",
        "nx_requests_waiting",
        "nx_requests_running",
        "nx_kv_blocks_used",
        "nx_kv_blocks_free",
        "nx_prefix_cache_hit_tokens_total",
        "nx_batch_tokens",
        "nx_batch_sequences",
        "nx_preemptions_total",
        "nx_steps_total",
        "nx_http_requests_total",
    ] {
        common::metric(&text, name);
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} has no TYPE"
        );
    }
    assert!(text.contains("# TYPE nx_http_errors_total counter"));
}

#[test]
fn tokenize_errors() {
    let s = TestServer::fake(test_config());
    assert_error(&s.post_json("/tokenize", &json!({})), 400, "content");
    assert_error(
        &s.post_json("/tokenize", &json!({"content": 5})),
        400,
        "content",
    );
    assert_error(
        &s.post_json("/tokenize", &json!({"content": "x", "add_special": "y"})),
        400,
        "add_special",
    );
    assert_error(
        &s.post_json("/detokenize", &json!({"tokens": "x"})),
        400,
        "tokens",
    );
    assert_error(
        &s.post_json("/detokenize", &json!({"tokens": [1, 99999]})),
        400,
        "tokens[1]",
    );
    assert_error(&s.post("/tokenize", "{oops"), 400, "JSON");
}

#[test]
fn error_statuses() {
    let mut config = test_config();
    config.max_body_bytes = 1024;
    let s = TestServer::fake(config);
    // Malformed JSON.
    assert_error(&s.post("/v1/completions", "{\"prompt\": "), 400, "JSON");
    assert_error(&s.post("/v1/chat/completions", "nope"), 400, "JSON");
    // Wrong type, out of range.
    let v = assert_error(
        &s.post_json(
            "/v1/completions",
            &json!({"prompt": "x", "temperature": "hot"}),
        ),
        400,
        "temperature",
    );
    assert_eq!(v["error"]["param"], "temperature");
    assert_error(
        &s.post_json("/v1/chat/completions", &json!({"messages": [], "n": 1})),
        400,
        "messages",
    );
    assert_error(
        &s.post_json("/v1/completions", &json!({"prompt": "x", "n": 99})),
        400,
        "n must be",
    );
    // Context overflow names both numbers.
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "max_tokens": 300}),
    );
    let v = assert_error(&r, 400, "300");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("10 tokens") && m.contains("256"), "{m}");
    // Unknown model.
    let v = assert_error(
        &s.post_json("/v1/completions", &json!({"prompt": "x", "model": "gpt-4"})),
        404,
        "gpt-4",
    );
    assert_eq!(v["error"]["code"], "model_not_found");
    // The alias works.
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "x", "model": "tiny-alias", "max_tokens": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // Too large.
    let big = json!({"prompt": "x".repeat(2000)}).to_string();
    assert_error(&s.post("/v1/completions", &big), 413, "1024");
    // Unknown route, wrong method.
    assert_error(&s.get("/v1/nothing"), 404, "/v1/nothing");
    assert_error(&s.post("/nothing", "{}"), 404, "/nothing");
    let r = s.get("/v1/completions");
    assert_error(&r, 405, "method");
    assert_error(&s.post("/health", "{}"), 405, "method");

    let metrics = s.get("/metrics").body;
    assert!(
        metrics.contains("nx_http_errors_total{status=\"400\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("nx_http_errors_total{status=\"404\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("nx_http_errors_total{status=\"405\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("nx_http_errors_total{status=\"413\"}"),
        "{metrics}"
    );
}

#[test]
fn queue_full_is_429_and_cancels_the_rest() {
    let mut config = test_config();
    config.engine.max_queue = 2;
    let s = TestServer::fake(config);
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "x", "n": 3, "max_tokens": 200}),
    );
    let v = assert_error(&r, 429, "queue");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(r.header("retry-after"), Some("1"), "{:?}", r.headers);
    s.wait_metric("nx_requests_running", 0.0, 10);
}

#[test]
fn non_streaming_completion_and_chat() {
    let s = TestServer::fake(test_config());
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "the cat", "max_tokens": 4}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "tiny");
    assert!(v["created"].as_u64().unwrap() > 0);
    assert_eq!(v["choices"][0]["text"], "abcd");
    assert_eq!(v["choices"][0]["index"], 0);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["logprobs"], Value::Null);
    let prompt_len = s
        .post_json(
            "/tokenize",
            &json!({"content": "the cat", "add_special": true, "parse_special": false}),
        )
        .json()["tokens"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(v["usage"]["prompt_tokens"], prompt_len);
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(v["usage"]["total_tokens"], prompt_len + 4);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    let r = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "bcd");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 3);

    // Token-id prompts are used as given.
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": [1, 9, 10], "max_tokens": 2}),
    );
    assert_eq!(r.json()["usage"]["prompt_tokens"], 3);
    // Defaults: max_tokens runs to the end of the context.
    let r = s.post_json("/v1/completions", &json!({"prompt": vec![1; 250]}));
    assert_eq!(r.json()["usage"]["completion_tokens"], 6);
}

#[test]
fn streaming_completion_framing() {
    let s = TestServer::fake(test_config());
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "the", "max_tokens": 5, "stream": true}),
    );
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = r.sse();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "abcde");
    for c in &chunks {
        assert_eq!(c["object"], "text_completion");
        assert!(c.get("usage").is_none());
    }
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));
}

#[test]
fn streaming_chat_with_usage() {
    let s = TestServer::fake(test_config());
    let r = s.post_json(
        "/v1/chat/completions",
        &json!({
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 3,
            "stream": true,
            "stream_options": {"include_usage": true},
        }),
    );
    assert_eq!(r.status, 200);
    let events = r.sse();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    let body = &chunks[..chunks.len() - 1];
    assert!(body
        .iter()
        .all(|c| c["usage"].is_null() && c.as_object().unwrap().contains_key("usage")));
    let text: String = body
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "abc");
    let finish = body.last().unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!(finish["choices"][0]["delta"], json!({}));
}

#[test]
fn n_choices() {
    let s = TestServer::fake(test_config());
    let v = s
        .post_json(
            "/v1/completions",
            &json!({"prompt": "x", "max_tokens": 3, "n": 3, "seed": 0}),
        )
        .json();
    let texts: Vec<&str> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            assert_eq!(c["index"], i);
            c["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(texts, ["abc", "bcd", "cde"]);
    assert_eq!(v["usage"]["completion_tokens"], 9);

    let r = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "n": 2,
                "seed": 5, "stream": true}),
    );
    let events = r.sse();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let mut texts = [String::new(), String::new()];
    let mut finished = [false, false];
    let mut roles = [0, 0];
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        if choice["delta"]["role"] == "assistant" {
            roles[i] += 1;
        }
        if let Some(t) = choice["delta"]["content"].as_str() {
            texts[i].push_str(t);
        }
        if choice["finish_reason"] == "length" {
            finished[i] = true;
        }
    }
    assert_eq!(texts, ["fghi".to_string(), "ghij".to_string()]);
    assert_eq!(finished, [true, true]);
    assert_eq!(roles, [1, 1]);
}

#[test]
fn logprobs_in_responses() {
    let s = TestServer::fake(test_config());
    let v = s
        .post_json(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
                    "logprobs": true, "top_logprobs": 2}),
        )
        .json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    assert_eq!(content[0]["token"], "a");
    assert_eq!(content[0]["logprob"], -0.5);
    assert_eq!(content[0]["bytes"], json!([97]));
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(content[1]["top_logprobs"][1]["token"], "c");

    let v = s
        .post_json(
            "/v1/completions",
            &json!({"prompt": "x", "max_tokens": 3, "logprobs": 2}),
        )
        .json();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(["a", "b", "c"]));
    assert_eq!(lp["token_logprobs"], json!([-0.5, -0.5, -0.5]));
    assert_eq!(lp["top_logprobs"][0], json!({"a": -0.5, "b": -1.5}));
    assert_eq!(lp["text_offset"], json!([0, 1, 2]));

    // Streamed: each token chunk carries its own entry.
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 2, "logprobs": 1, "stream": true}),
    );
    let events = r.sse();
    let c1: Value = serde_json::from_str(&events[1]).unwrap();
    assert_eq!(c1["choices"][0]["logprobs"]["tokens"], json!(["b"]));
    assert_eq!(c1["choices"][0]["logprobs"]["text_offset"], json!([1]));
}

#[test]
fn disconnect_mid_stream_cancels() {
    let s = TestServer::fake_with_delay(test_config(), Duration::from_millis(20));
    let body = json!({"prompt": "x", "max_tokens": 200, "stream": true}).to_string();
    let mut stream = send_request(s.addr, "POST", "/v1/completions", Some(&body));
    let got = read_until(&mut stream, "data: ");
    assert!(got.contains("200 OK"), "{got}");
    assert_eq!(s.metric("nx_requests_running"), 1.0);
    drop(stream);
    s.wait_metric("nx_requests_running", 0.0, 10);
    // The server goes on serving.
    let r = s.post_json("/v1/completions", &json!({"prompt": "x", "max_tokens": 1}));
    assert_eq!(r.status, 200);
}

#[test]
fn disconnect_while_waiting_cancels() {
    let s = TestServer::fake_with_delay(test_config(), Duration::from_millis(20));
    let body = json!({"prompt": "x", "max_tokens": 240}).to_string();
    let stream = send_request(s.addr, "POST", "/v1/completions", Some(&body));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.metric("nx_requests_running") == 0.0 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(stream);
    s.wait_metric("nx_requests_running", 0.0, 15);
}

#[test]
fn step_error_fails_requests_and_keeps_serving() {
    let s = TestServer::fake(test_config());
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 3, "seed": 666}),
    );
    assert_error(&r, 500, "scripted step failure");
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 3, "seed": 666, "stream": true}),
    );
    assert_eq!(r.status, 200);
    let events = r.sse();
    assert!(
        events.iter().any(|e| e.contains("scripted step failure")),
        "{events:?}"
    );
    assert_eq!(events.last().unwrap(), "[DONE]");
    let r = s.post_json("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}));
    assert_eq!(r.json()["choices"][0]["text"], "ab");
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn engine_panic_is_503_not_a_hang() {
    let s = TestServer::fake(test_config());
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 3, "seed": 667}),
    );
    assert!(
        r.status == 500 || r.status == 503,
        "{} {}",
        r.status,
        r.body
    );
    let r = s.post_json("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}));
    assert_error(&r, 503, "engine");
    let h = s.get("/health");
    assert_eq!(h.status, 503);
    assert_eq!(h.json()["status"], "error");
}

#[test]
fn health_is_loading_until_the_engine_is_ready() {
    let (release, wait) = std::sync::mpsc::channel::<()>();
    let engine = nx_serve::EngineHandle::spawn(move || {
        let _ = wait.recv();
        Ok(common::FakeBackend::new(8, Duration::from_millis(1)))
    })
    .unwrap();
    let s = TestServer::start(test_config(), engine);
    let r = s.get("/health");
    assert_eq!(r.status, 503);
    assert_eq!(r.json(), json!({"status": "loading"}));
    assert_error(
        &s.post_json("/v1/completions", &json!({"prompt": "x"})),
        503,
        "loading",
    );
    release.send(()).unwrap();
    s.wait_healthy();
    let r = s.post_json("/v1/completions", &json!({"prompt": "x", "max_tokens": 1}));
    assert_eq!(r.status, 200);
}

#[test]
fn engine_start_failure_shows_in_health() {
    let engine = nx_serve::EngineHandle::spawn(|| {
        Err::<common::FakeBackend, _>("the KV pool does not fit".to_string())
    })
    .unwrap();
    let s = TestServer::start(test_config(), engine);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let h = s.get("/health");
        if h.json()["status"] == "error" {
            assert_eq!(h.status, 503);
            assert!(h.body.contains("KV pool"));
            break;
        }
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn concurrent_requests() {
    let s = TestServer::fake(test_config());
    let addr = s.addr;
    let handles: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({"prompt": "x", "max_tokens": 5, "seed": i}).to_string();
                common::http(addr, "POST", "/v1/completions", Some(&body)).json()["choices"][0]
                    ["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
        })
        .collect();
    let texts: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(texts, ["abcde", "bcdef", "cdefg", "defgh"]);
}
