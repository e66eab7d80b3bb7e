//! Helpers of the server tests: the tiny model, a scripted stand-in engine, an in-process
//! server on 127.0.0.1:0 and a minimal blocking HTTP/1.1 client.

#![allow(dead_code)]

// The tiny model builder is shared with nx-run's tests.
#[path = "../../../nx-run/tests/common/tiny_model.rs"]
pub mod tiny_model;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nx_gguf::Gguf;
use nx_run::{
    ChatTemplate, EngineConfig, EngineEvent, EngineMetrics, Model, Request, RunError, SeqId,
    StopReason, Tokenizer, Usage,
};
use nx_serve::{AppState, Backend, EngineHandle, ServeConfig};
use serde_json::Value;

/// The tiny model, its tokenizer and its chat template.
pub fn load() -> (Arc<Model>, Arc<Tokenizer>, ChatTemplate) {
    let gguf = Gguf::from_bytes(tiny_model::tiny_gguf(tiny_model::TinyOptions::default()))
        .expect("tiny GGUF parses");
    let tokenizer = Tokenizer::from_gguf(&gguf).expect("tiny tokenizer");
    let model = Model::from_gguf(gguf).expect("tiny model loads");
    let template =
        ChatTemplate::for_model(model.gguf().metadata(), &tokenizer, None).expect("template");
    (Arc::new(model), Arc::new(tokenizer), template)
}

/// A server config for tests: port 0, no request log, 256 positions, 1 s of grace.
pub fn test_config() -> ServeConfig {
    ServeConfig {
        port: 0,
        model_id: "tiny".into(),
        model_aliases: vec!["tiny-alias".into()],
        log_requests: false,
        shutdown_grace: Duration::from_secs(1),
        engine: EngineConfig {
            n_ctx: 256,
            kv_memory_bytes: 4 << 20,
            max_running: 4,
            max_queue: 16,
            ..EngineConfig::default()
        },
        ..ServeConfig::default()
    }
}

/// Token id of letter `c` in the tiny vocabulary.
pub fn letter_id(c: char) -> u32 {
    let (tokens, _) = tiny_model::vocab();
    tokens.iter().position(|t| t == &c.to_string()).unwrap() as u32
}

/// A scripted engine: every sequence emits `max_tokens` letters, one per step, choice
/// with seed `s` starting at letter `s % 26` ("abcd…" for seed 0), then ends with
/// `MaxTokens`. Seed 666 makes the step fail; seed 667 makes it panic.
pub struct FakeBackend {
    next: SeqId,
    seqs: Vec<FakeSeq>,
    max_queue: usize,
    step_delay: Duration,
    metrics: EngineMetrics,
    letter_a: u32,
}

struct FakeSeq {
    id: SeqId,
    request: Request,
    produced: usize,
    start: Instant,
}

impl FakeBackend {
    /// A stand-in that sleeps `step_delay` per step and holds at most `max_queue`
    /// sequences.
    pub fn new(max_queue: usize, step_delay: Duration) -> FakeBackend {
        FakeBackend {
            next: 1,
            seqs: Vec::new(),
            max_queue,
            step_delay,
            metrics: EngineMetrics::default(),
            letter_a: letter_id('a'),
        }
    }
}

impl Backend for FakeBackend {
    fn submit(&mut self, request: Request) -> Result<SeqId, RunError> {
        if request.prompt.is_empty() {
            return Err(RunError::EmptyPrompt);
        }
        if self.seqs.len() >= self.max_queue {
            return Err(RunError::QueueFull {
                max_queue: self.max_queue,
            });
        }
        let id = self.next;
        self.next += 1;
        self.metrics.requests_total += 1;
        self.metrics.prompt_tokens_total += request.prompt.len() as u64;
        self.seqs.push(FakeSeq {
            id,
            request,
            produced: 0,
            start: Instant::now(),
        });
        Ok(id)
    }

    fn step(&mut self) -> Result<Vec<EngineEvent>, RunError> {
        std::thread::sleep(self.step_delay);
        if self.seqs.iter().any(|s| s.request.sampler.seed == 666) {
            return Err(RunError::InvalidConfig("scripted step failure".into()));
        }
        if self.seqs.iter().any(|s| s.request.sampler.seed == 667) {
            panic!("scripted panic");
        }
        self.metrics.steps_total += 1;
        self.metrics.last_batch_seqs = self.seqs.len();
        self.metrics.last_batch_tokens = self.seqs.len();
        let mut events = Vec::new();
        let a = self.letter_a;
        for s in &mut self.seqs {
            if s.produced < s.request.max_tokens {
                let k = ((s.request.sampler.seed as usize + s.produced) % 26) as u32;
                let letter = char::from(b'a' + k as u8);
                let top: Vec<(u32, f32)> = (0..s.request.logprobs as u32)
                    .map(|j| (a + (k + j) % 26, -0.5 - j as f32))
                    .collect();
                events.push(EngineEvent::Token {
                    seq: s.id,
                    id: a + k,
                    text: letter.to_string(),
                    logprob: -0.5,
                    top,
                });
                s.produced += 1;
                self.metrics.generated_tokens_total += 1;
            }
            if s.produced >= s.request.max_tokens {
                let ms = s.start.elapsed().as_secs_f64() * 1000.0;
                events.push(EngineEvent::Done {
                    seq: s.id,
                    reason: StopReason::MaxTokens,
                    usage: Usage {
                        prompt_tokens: s.request.prompt.len(),
                        cached_prompt_tokens: 0,
                        generated_tokens: s.produced,
                        ttft_ms: ms,
                        total_ms: ms,
                        ..Usage::default()
                    },
                    flushed: String::new(),
                });
            }
        }
        self.seqs.retain(|s| s.produced < s.request.max_tokens);
        self.metrics.running = self.seqs.len();
        Ok(events)
    }

    fn cancel(&mut self, seq: SeqId) -> bool {
        let before = self.seqs.len();
        self.seqs.retain(|s| s.id != seq);
        self.metrics.running = self.seqs.len();
        before != self.seqs.len()
    }

    fn has_work(&self) -> bool {
        !self.seqs.is_empty()
    }

    fn metrics(&self) -> EngineMetrics {
        EngineMetrics {
            running: self.seqs.len(),
            ..self.metrics
        }
    }
}

/// A server running on its own thread and runtime; dropping it shuts it down.
pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    /// Serves `engine` with `config` on 127.0.0.1 (a free port).
    pub fn start(config: ServeConfig, engine: EngineHandle) -> TestServer {
        let (_, tokenizer, template) = load();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                let state = AppState::new(config, tokenizer, template, engine);
                nx_serve::serve(listener, state.clone(), async {
                    let _ = stop_rx.await;
                })
                .await
                .unwrap();
                let st = state.clone();
                let _ = tokio::task::spawn_blocking(move || st.engine().shutdown()).await;
            });
        });
        let addr = addr_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("server bound");
        TestServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// A server over a [`FakeBackend`] (10 ms per step), ready.
    pub fn fake(config: ServeConfig) -> TestServer {
        Self::fake_with_delay(config, Duration::from_millis(10))
    }

    /// A server over a [`FakeBackend`] with `delay` per step, ready.
    pub fn fake_with_delay(config: ServeConfig, delay: Duration) -> TestServer {
        let max_queue = config.engine.max_queue;
        let engine = EngineHandle::spawn(move || Ok(FakeBackend::new(max_queue, delay))).unwrap();
        let server = TestServer::start(config, engine);
        server.wait_healthy();
        server
    }

    /// A server over the real engine on the tiny model, ready.
    pub fn real(config: ServeConfig) -> TestServer {
        let (model, tokenizer, _) = load();
        let engine = nx_serve::spawn_engine(model, tokenizer, config.engine.clone(), None).unwrap();
        let server = TestServer::start(config, engine);
        server.wait_healthy();
        server
    }

    /// Polls `/health` until 200 (panics after 30 s or on an engine error).
    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = self.get("/health");
            if r.status == 200 {
                return;
            }
            assert!(
                r.status == 503 && r.json()["status"] == "loading",
                "health: {} {}",
                r.status,
                r.body
            );
            assert!(Instant::now() < deadline, "the server never became healthy");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn get(&self, path: &str) -> HttpResponse {
        http(self.addr, "GET", path, None)
    }

    pub fn post(&self, path: &str, body: &str) -> HttpResponse {
        http(self.addr, "POST", path, Some(body))
    }

    pub fn post_json(&self, path: &str, body: &Value) -> HttpResponse {
        self.post(path, &body.to_string())
    }

    /// The value of metric `name` (without labels) in `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        metric(&self.get("/metrics").body, name)
    }

    /// Waits until metric `name` equals `value` (panics after `secs`).
    pub fn wait_metric(&self, name: &str, value: f64, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.metric(name);
            if v == value {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} stayed at {v}, expected {value}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Value of `name` in Prometheus text (`nx_name 3`); panics when absent.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(name)?;
            rest.strip_prefix(' ')?.trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
}

/// A parsed HTTP response.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body, checking the framing (`data: …\n\n`).
    pub fn sse(&self) -> Vec<String> {
        sse_payloads(&self.body)
    }
}

/// Splits an SSE body into `data:` payloads, asserting each event is `data: X\n\n`.
pub fn sse_payloads(body: &str) -> Vec<String> {
    assert!(
        body.ends_with("\n\n"),
        "SSE body does not end an event: {body:?}"
    );
    body.split_terminator("\n\n")
        .map(|event| {
            let payload = event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("event without `data: `: {event:?}"));
            assert!(!payload.contains('\n'), "multi-line event {event:?}");
            payload.to_string()
        })
        .collect()
}

/// Writes a request (Connection: close) and returns the open stream.
pub fn send_request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(req.as_bytes()).expect("write request");
    stream
}

/// One request, the whole response read.
pub fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> HttpResponse {
    let mut stream = send_request(addr, method, path, body);
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read response");
    parse_response(&raw)
}

/// Parses a complete HTTP/1.1 response (chunked or not).
pub fn parse_response(raw: &[u8]) -> HttpResponse {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body);
    }
    HttpResponse {
        status,
        headers,
        body: String::from_utf8(body).expect("UTF-8 body"),
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = data.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
            .unwrap_or_else(|_| panic!("bad chunk size {size_text:?}"));
        data = &data[eol + 2..];
        if size == 0 {
            break;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
    out
}

/// Reads from `stream` until `needle` has been seen (or the stream ends); returns what
/// was read.
pub fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if String::from_utf8_lossy(&got).contains(needle) {
            break;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}
