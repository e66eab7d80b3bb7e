//! `cargo xtask loadtest`: `nx serve` and `llama-server` under the same concurrent streaming load.
//!
//! For every concurrency level (`--clients 1,2,4,8,16`) each server is started afresh on a
//! loopback port, sized for that level, warmed up with one short request, and then driven
//! by `L` client threads that share a fixed list of `--requests-per-level` requests: each
//! client takes the next unsent request, streams it to the end, and takes another, until
//! the list (or `--level-timeout`) is exhausted. Then the server is stopped and the other
//! one gets the same load. The two engines alternate level by level.
//!
//! - nx: `nx serve --model F --host 127.0.0.1 --port P --threads T --parallel N --ctx C`;
//! - llama.cpp: `llama-server -m F --host 127.0.0.1 --port P -np N -c N*C -t T` (it splits
//!   `-c` across its `-np` slots, so each slot gets `C` positions, as each nx request may).
//!
//! `N` is the level's client count unless `--parallel` fixes it. One server per level means
//! every level's peak RSS (`VmHWM`, a high-water mark) is that level's alone and each level
//! starts with an empty prefix cache. llama-server runs with its defaults (weight repacking
//! on); if it dies with them (the pinned build faults in its AMX kernels on some machines)
//! the build without AMX (`cargo xtask reference`'s `build-noamx`, built then if missing)
//! takes its place, repacking still on; only if that dies too is it restarted with
//! `--no-repack`. The report says which. Under `NX_TIER=avx2` (nx standing in for a CPU
//! without AVX-512) llama-server is built for AVX2 too, with AVX-VNNI where the CPU has it
//! (`build-avx2-vnni`, else `build-avx2`; built then if missing), and `--write` refuses:
//! the docs' section is the default tier's.
//!
//! Every request is `POST /v1/completions` with `stream: true`, greedy (`temperature: 0`,
//! `seed` fixed; with `--sampled`, `temperature` 0.8, `top_k` 40, `top_p` 0.95 and `min_p`
//! 0.05, written to a section of its own), `max_tokens` (and llama.cpp's `n_predict`) and
//! `ignore_eos: true`, over
//! prompts of about 170 tokens made of deterministic generated sentences, each request a
//! different prompt. Measured per level and engine: generated tokens per second over the
//! level's wall time, time to first token (request sent to the first non-empty text chunk)
//! and inter-token latency (gaps between text chunks) at p50 and p95, the server's peak
//! RSS, and failed requests. A second phase measures the prefix cache: one server per
//! engine with a single slot, the same ~400-token system prompt in front of different short
//! questions, sent one after another; the first request's TTFT (a miss) over the median of
//! the rest (hits) is the ratio reported.
//!
//! The SSE client is a few lines over `std::net::TcpStream` (HTTP/1.1, `Connection: close`,
//! chunked or close-delimited bodies); nothing here talks to anything but 127.0.0.1.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::fetch::default_model_path;
use crate::http;
use crate::machine::{cpu_model_from, load_average, target_dir, utc_date_time, vm_hwm_kib};
use crate::reference::llama_bin;
use crate::sections::{loadtest_markers, with_loadtest_section};
use crate::util::{cargo_command, duration_text, free_port, log_tail, run_checked, workspace_root};

/// Concurrency levels driven by default.
pub const DEFAULT_CLIENTS_TEXT: &str = "1,2,4,8,16";
/// Requests per level by default (shared by that level's clients).
pub const DEFAULT_REQUESTS_PER_LEVEL: usize = 16;
/// Tokens generated per request by default.
pub const DEFAULT_MAX_TOKENS: usize = 128;
/// Worker threads of both servers by default (the dev machines have two cores).
pub const DEFAULT_THREADS: usize = 2;
/// Positions per sequence by default.
pub const DEFAULT_CTX: usize = 1024;
/// Longest a level may run before its clients stop sending, by default (seconds).
pub const DEFAULT_LEVEL_TIMEOUT_S: u64 = 300;
/// Requests of the prefix-cache phase: one miss, then hits.
pub const PREFIX_REQUESTS: usize = 6;
/// Tokens generated per prefix-cache request (only the first one matters).
pub const PREFIX_MAX_TOKENS: usize = 8;
/// Seed sent with every request (sampling is greedy; the seed only pins what is left).
pub const SEED: u64 = 42;
/// The sampling settings of `--sampled` (llama-server's defaults, and nx's).
pub const SAMPLING: [(&str, f64); 4] = [
    ("temperature", 0.8),
    ("top_k", 40.0),
    ("top_p", 0.95),
    ("min_p", 0.05),
];

/// How long a server may take to load its model and answer `/health`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);
/// Longest wait for any single read from a server.
const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// The flag llama-server falls back to when it crashes with its defaults.
const NO_REPACK: &str = "--no-repack";

/// `cargo xtask loadtest` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadtestArgs {
    /// Concurrency levels: how many streaming clients send requests at once, one level
    /// after another (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "N,N,...", default_value = DEFAULT_CLIENTS_TEXT)]
    pub clients: Vec<usize>,
    /// Requests sent per level and engine, shared by that level's clients (each client
    /// takes the next unsent one when its previous one ends); at least the largest level.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_REQUESTS_PER_LEVEL)]
    pub requests_per_level: usize,
    /// Tokens generated per request (`max_tokens`, `ignore_eos: true`, so exactly this many).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_TOKENS)]
    pub max_tokens: usize,
    /// Worker threads of both servers (`nx serve --threads`, `llama-server -t`).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_THREADS)]
    pub threads: usize,
    /// Sequences each server runs at once (`nx serve --parallel`, `llama-server -np`);
    /// default: the level's client count, with each server restarted per level.
    #[arg(long, value_name = "N")]
    pub parallel: Option<usize>,
    /// Positions per sequence, prompt and generated tokens (`nx serve --ctx C`,
    /// `llama-server -c N*C`, which it splits across its N slots).
    #[arg(long, value_name = "C", default_value_t = DEFAULT_CTX)]
    pub ctx: usize,
    /// Skip llama-server: drive only nx serve (the llama.cpp columns stay empty).
    #[arg(long)]
    pub no_reference: bool,
    /// Write the results into their section of docs/benchmarks.md (replacing the previous
    /// loadtest section, leaving the rest of the file alone).
    #[arg(long)]
    pub write: bool,
    /// Use the existing target/release/nx instead of building it first.
    #[arg(long)]
    pub no_build: bool,
    /// Sample every token (`temperature` 0.8, `top_k` 40, `top_p` 0.95, `min_p` 0.05, the
    /// seed fixed) instead of greedy decoding; `--write` then fills its own section.
    #[arg(long)]
    pub sampled: bool,
    /// Longest one level may take per engine, in seconds; after it the clients send no
    /// new requests (requests not sent count as errors).
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_LEVEL_TIMEOUT_S)]
    pub level_timeout: u64,
    /// Runs per level and engine: nx, llama-server and llama-server `--no-repack` take
    /// turns this many times, and each keeps its median run (by tok/s), so a few minutes
    /// of a slower machine weigh on one run, not on the level's figures.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub reps: usize,
}

impl LoadtestArgs {
    fn validate(&self) -> Result<()> {
        if self.clients.is_empty() {
            bail!("--clients names no level");
        }
        if let Some(&0) = self.clients.iter().find(|&&c| c == 0) {
            bail!("--clients: every level needs at least 1 client");
        }
        let most = self.clients.iter().copied().max().unwrap_or(1);
        if self.requests_per_level < most {
            bail!(
                "--requests-per-level {} is below the largest level ({most} clients): every \
                 client must send at least one request",
                self.requests_per_level
            );
        }
        for (name, v) in [
            ("--max-tokens", self.max_tokens),
            ("--threads", self.threads),
            ("--ctx", self.ctx),
            ("--parallel", self.parallel.unwrap_or(1)),
        ] {
            if v == 0 {
                bail!("{name} must be at least 1");
            }
        }
        if self.level_timeout == 0 {
            bail!("--level-timeout must be at least 1 second");
        }
        if self.reps == 0 {
            bail!("--reps must be at least 1");
        }
        let longest = SYSTEM_PROMPT_TOKENS_ESTIMATE.max(PROMPT_TOKENS_ESTIMATE + self.max_tokens);
        if self.ctx < longest + 64 {
            bail!(
                "--ctx {} is too small: prompts of about {PROMPT_TOKENS_ESTIMATE} tokens plus \
                 --max-tokens {} (and the ~{SYSTEM_PROMPT_TOKENS_ESTIMATE}-token prefix-cache \
                 prompts) need at least {}",
                self.ctx,
                self.max_tokens,
                longest + 64
            );
        }
        Ok(())
    }

    /// The command line that reproduces this run.
    fn command_line(&self) -> String {
        let levels: Vec<String> = self.clients.iter().map(|c| c.to_string()).collect();
        let mut text = format!(
            "cargo xtask loadtest --clients {} --requests-per-level {} --max-tokens {} \
             --threads {} --ctx {}",
            levels.join(","),
            self.requests_per_level,
            self.max_tokens,
            self.threads,
            self.ctx
        );
        if let Some(n) = self.parallel {
            text.push_str(&format!(" --parallel {n}"));
        }
        if self.sampled {
            text.push_str(" --sampled");
        }
        if self.reps > 1 {
            text.push_str(&format!(" --reps {}", self.reps));
        }
        if self.no_reference {
            text.push_str(" --no-reference");
        }
        if self.write {
            text.push_str(" --write");
        }
        text
    }
}

/// Rough token counts of the generated prompts (checked against the servers' `usage`).
const PROMPT_TOKENS_ESTIMATE: usize = 170;
const SYSTEM_PROMPT_TOKENS_ESTIMATE: usize = 450;

// ---------------------------------------------------------------------------------------
// Prompts

const SUBJECTS: [&str; 16] = [
    "The old lighthouse keeper",
    "A young engineer",
    "The village baker",
    "Our new neighbour",
    "The quiet librarian",
    "A travelling musician",
    "The harbour master",
    "A curious student",
    "The night nurse",
    "An elderly farmer",
    "The station clerk",
    "A tired painter",
    "The museum guide",
    "A patient teacher",
    "The ferry captain",
    "A retired pilot",
];
const VERBS: [&str; 16] = [
    "carefully repaired",
    "slowly painted",
    "quietly studied",
    "happily described",
    "never forgot",
    "once discovered",
    "proudly showed us",
    "often visited",
    "secretly rebuilt",
    "gladly lent us",
    "nearly lost",
    "finally sold",
    "patiently measured",
    "calmly explained",
    "gently cleaned",
    "boldly photographed",
];
const OBJECTS: [&str; 16] = [
    "the wooden bridge",
    "a broken clock",
    "the copper kettle",
    "an ancient map",
    "the narrow staircase",
    "a blue bicycle",
    "the stone fountain",
    "a paper lantern",
    "the iron gate",
    "a small sailboat",
    "the garden wall",
    "a leather notebook",
    "the church bell",
    "a silver compass",
    "the rusty tractor",
    "a glass window",
];
const PLACES: [&str; 16] = [
    "near the river",
    "behind the market",
    "at the edge of town",
    "before the storm",
    "after the long winter",
    "during the festival",
    "on a foggy morning",
    "under the old oak",
    "beside the railway",
    "in the empty square",
    "at the top of the hill",
    "on the northern shore",
    "late in the evening",
    "next to the school",
    "across the valley",
    "in the early spring",
];

/// A small deterministic generator (SplitMix64), so prompts are the same on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn pick<'a>(&mut self, words: &[&'a str]) -> &'a str {
        words[(self.next() % words.len() as u64) as usize]
    }
}

/// `n` generated sentences from stream `seed`.
fn sentences(seed: u64, n: usize) -> String {
    let mut rng = SplitMix(seed);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(format!(
            "{} {} {} {}.",
            rng.pick(&SUBJECTS),
            rng.pick(&VERBS),
            rng.pick(&OBJECTS),
            rng.pick(&PLACES)
        ));
    }
    out.join(" ")
}

/// Load prompt `i` (about 170 tokens); different `i` differ from their first tokens on.
pub fn load_prompt(i: usize) -> String {
    format!(
        "Story number {i}. {} Then",
        sentences(0x1000 + i as u64, 12)
    )
}

/// The shared system prompt of the prefix-cache phase (about 400 tokens).
pub fn system_prompt() -> String {
    format!(
        "You are a careful assistant who answers questions about the following notes. \
         Notes: {}\n\n",
        sentences(0xcafe, 32)
    )
}

/// Prefix-cache request `k`: the system prompt, then a short question of its own.
pub fn prefix_prompt(k: usize) -> String {
    format!(
        "{}Question {k}: what did {} do {}? Answer:",
        system_prompt(),
        SUBJECTS[k % SUBJECTS.len()].to_lowercase(),
        PLACES[(k * 7) % PLACES.len()]
    )
}

// ---------------------------------------------------------------------------------------
// Percentiles

/// The `p`-th percentile (0..=100) of `values`, interpolating linearly between the two
/// nearest ranks (as numpy's default); `None` when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = p.clamp(0.0, 100.0) / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

// ---------------------------------------------------------------------------------------
// HTTP and SSE

/// Incremental decoder of a `Transfer-Encoding: chunked` body; yields whole chunks.
#[derive(Debug, Default)]
pub struct ChunkedDecoder {
    buf: Vec<u8>,
    done: bool,
}

impl ChunkedDecoder {
    /// Feeds received bytes; returns the body bytes of every chunk now complete.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<u8>> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut pos = 0;
        while !self.done {
            let rest = &self.buf[pos..];
            let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
                break;
            };
            let line = std::str::from_utf8(&rest[..line_end]).context("chunk size is not text")?;
            let size_text = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size_text, 16)
                .with_context(|| format!("bad chunk size {size_text:?}"))?;
            if size == 0 {
                self.done = true;
                pos = self.buf.len();
                break;
            }
            let data_start = line_end + 2;
            if rest.len() < data_start + size + 2 {
                break;
            }
            if &rest[data_start + size..data_start + size + 2] != b"\r\n" {
                bail!("chunk of {size} bytes not followed by CRLF");
            }
            out.extend_from_slice(&rest[data_start..data_start + size]);
            pos += data_start + size + 2;
        }
        self.buf.drain(..pos);
        Ok(out)
    }

    /// True after the last (zero-size) chunk.
    pub fn is_done(&self) -> bool {
        self.done
    }
}

/// Incremental parser of a `text/event-stream`: yields the data of each complete event
/// (its `data:` lines joined by newlines). Comments and other fields are skipped.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: Vec<String>,
}

impl SseParser {
    /// Feeds body bytes; returns the data of every event now complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut pos = 0;
        while let Some(nl) = self.buf[pos..].iter().position(|&b| b == b'\n') {
            let mut line = &self.buf[pos..pos + nl];
            pos += nl + 1;
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            if line.is_empty() {
                if !self.data.is_empty() {
                    events.push(std::mem::take(&mut self.data).join("\n"));
                }
                continue;
            }
            let text = String::from_utf8_lossy(line);
            if let Some(value) = text.strip_prefix("data:") {
                self.data
                    .push(value.strip_prefix(' ').unwrap_or(value).to_string());
            }
        }
        self.buf.drain(..pos);
        events
    }
}

/// What one streamed event says.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventInfo {
    /// Generated text in this event (empty for none).
    pub text: String,
    /// `[DONE]`.
    pub done: bool,
    /// An error object's message.
    pub error: Option<String>,
    /// `usage.completion_tokens`, `usage.prompt_tokens`, cached prompt tokens.
    pub completion_tokens: Option<usize>,
    pub prompt_tokens: Option<usize>,
    pub cached_tokens: Option<usize>,
}

/// Interprets one event's data: an OpenAI completion chunk, `[DONE]` or an error.
pub fn parse_event(data: &str) -> Result<EventInfo> {
    let data = data.trim();
    if data == "[DONE]" {
        return Ok(EventInfo {
            done: true,
            ..EventInfo::default()
        });
    }
    let v: Value = serde_json::from_str(data)
        .with_context(|| format!("event is not JSON: {}", &data[..data.len().min(200)]))?;
    let mut info = EventInfo::default();
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        info.error = Some(
            err.get("message")
                .and_then(Value::as_str)
                .map_or_else(|| err.to_string(), str::to_string),
        );
    }
    if let Some(choices) = v.get("choices").and_then(Value::as_array) {
        for c in choices {
            if let Some(t) = c.get("text").and_then(Value::as_str) {
                info.text.push_str(t);
            }
        }
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        let count = |key: &str| u.get(key).and_then(Value::as_u64).map(|n| n as usize);
        info.completion_tokens = count("completion_tokens");
        info.prompt_tokens = count("prompt_tokens");
        info.cached_tokens = u
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .map(|n| n as usize);
    }
    Ok(info)
}

/// The status code and headers of a response head (the bytes before the blank line).
pub fn parse_head(head: &[u8]) -> Result<(u16, Vec<(String, String)>)> {
    let head = std::str::from_utf8(head).context("response headers are not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        bail!("bad status line {status_line:?}");
    };
    if !version.starts_with("HTTP/1.") {
        bail!("bad status line {status_line:?}");
    }
    let status = code
        .parse()
        .with_context(|| format!("bad status code in {status_line:?}"))?;
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            bail!("bad header line {line:?}");
        };
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    Ok((status, headers))
}

/// One streamed request as the client saw it.
#[derive(Debug, Clone, Default)]
pub struct Streamed {
    /// When each non-empty text event arrived, from the request being sent.
    pub token_times: Vec<Duration>,
    /// The server's `usage`, when it sent one.
    pub completion_tokens: Option<usize>,
    pub prompt_tokens: Option<usize>,
    pub cached_tokens: Option<usize>,
    /// Whole request, from sending to the end of the stream.
    pub total: Duration,
}

impl Streamed {
    /// Tokens generated: the server's count, else the text events seen.
    pub fn tokens(&self) -> usize {
        self.completion_tokens.unwrap_or(self.token_times.len())
    }

    /// Time to the first text event.
    pub fn ttft(&self) -> Option<Duration> {
        self.token_times.first().copied()
    }

    /// Tokens per second after the first: the tokens after the first over the time from
    /// the first text event to the last (`None` with fewer than two events).
    pub fn decode_rate(&self) -> Option<f64> {
        let (first, last) = (self.token_times.first()?, self.token_times.last()?);
        let span = (*last - *first).as_secs_f64();
        (self.token_times.len() >= 2 && span > 0.0)
            .then(|| self.tokens().saturating_sub(1) as f64 / span)
    }

    /// Gaps between consecutive text events.
    pub fn gaps(&self) -> impl Iterator<Item = Duration> + '_ {
        self.token_times.windows(2).map(|w| w[1] - w[0])
    }
}

/// A request that went wrong, with what arrived before.
#[derive(Debug)]
pub struct Failed {
    pub message: String,
    pub partial: Streamed,
}

/// Sends `POST path` with `body` to 127.0.0.1:`port` and reads the event stream to its
/// end, timestamping each event when the read that completed it returned.
pub fn stream_post(port: u16, path: &str, body: &Value) -> Result<Streamed, Failed> {
    let started = Instant::now();
    let mut got = Streamed::default();
    let result = stream_events(port, path, body, &mut got);
    got.total = started.elapsed();
    match result {
        Ok(()) => Ok(got),
        Err(message) => Err(Failed {
            message,
            partial: got,
        }),
    }
}

/// `stream_post`'s steps: send, read the head, then the events into `got`.
fn stream_events(port: u16, path: &str, body: &Value, got: &mut Streamed) -> Result<(), String> {
    let (mut stream, sent) = send_post(port, path, body)?;
    let mut buf = vec![0u8; 16 * 1024];
    let (status, chunked, rest) = read_head(&mut stream, &mut buf)?;
    if status != 200 {
        return Err(error_body(&mut stream, status, chunked, rest));
    }
    read_events(&mut stream, &mut buf, chunked, rest, sent, got)
}

/// Connects to 127.0.0.1:`port` and writes the request; returns the socket and when the
/// request was sent (the clock every event time counts from).
fn send_post(port: u16, path: &str, body: &Value) -> Result<(TcpStream, Instant), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    stream
        .set_read_timeout(Some(READ_TIMEOUT))
        .and_then(|_| stream.set_write_timeout(Some(READ_TIMEOUT)))
        .map_err(|e| format!("socket options: {e}"))?;
    let payload = serde_json::to_vec(body).unwrap_or_default();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Accept: text/event-stream\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        payload.len()
    )
    .into_bytes();
    request.extend_from_slice(&payload);
    let sent = Instant::now();
    stream
        .write_all(&request)
        .map_err(|e| format!("cannot send the request: {e}"))?;
    Ok((stream, sent))
}

/// Reads up to the end of the response head: its status, whether the body is chunked, and
/// the body bytes that came with the head.
fn read_head(stream: &mut TcpStream, buf: &mut [u8]) -> Result<(u16, bool, Vec<u8>), String> {
    let mut raw = Vec::new();
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let (status, headers) = parse_head(&raw[..end]).map_err(|e| format!("{e:#}"))?;
            let chunked = headers.iter().any(|(k, v)| {
                k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked")
            });
            return Ok((status, chunked, raw[end + 4..].to_vec()));
        }
        match stream.read(buf) {
            Ok(0) => return Err("connection closed before the headers".into()),
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("reading the headers: {e}")),
        }
    }
}

/// The message for a non-200 answer: its status and the start of its body, read to the
/// end (bounded by the read timeout).
fn error_body(stream: &mut TcpStream, status: u16, chunked: bool, mut rest: Vec<u8>) -> String {
    let _ = stream.read_to_end(&mut rest);
    let body = if chunked {
        let mut d = ChunkedDecoder::default();
        d.push(&rest).unwrap_or(rest)
    } else {
        rest
    };
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    format!("HTTP {status}: {}", text.trim())
}

/// Reads server-sent events to `[DONE]`, timestamping each text event when the read that
/// completed it returned.
fn read_events(
    stream: &mut TcpStream,
    buf: &mut [u8],
    chunked: bool,
    mut pending: Vec<u8>,
    sent: Instant,
    got: &mut Streamed,
) -> Result<(), String> {
    let mut chunks = ChunkedDecoder::default();
    let mut sse = SseParser::default();
    let mut done = false;
    loop {
        let now = sent.elapsed();
        let body = if chunked {
            chunks.push(&pending).map_err(|e| format!("{e:#}"))?
        } else {
            std::mem::take(&mut pending)
        };
        pending.clear();
        for data in sse.push(&body) {
            let info = parse_event(&data).map_err(|e| format!("{e:#}"))?;
            if let Some(err) = info.error {
                return Err(format!("stream error: {err}"));
            }
            if !info.text.is_empty() {
                got.token_times.push(now);
            }
            if info.completion_tokens.is_some() {
                got.completion_tokens = info.completion_tokens;
                got.prompt_tokens = info.prompt_tokens;
                got.cached_tokens = info.cached_tokens;
            }
            done |= info.done;
        }
        if done || (chunked && chunks.is_done()) {
            break;
        }
        match stream.read(buf) {
            Ok(0) => break,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("reading the stream: {e}")),
        }
    }
    if done {
        Ok(())
    } else {
        Err("the stream ended without [DONE]".into())
    }
}

// ---------------------------------------------------------------------------------------
// Servers

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Engine {
    Nx,
    Llama,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Nx => "nx serve",
            Engine::Llama => "llama-server",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Engine::Nx => "nx",
            Engine::Llama => "llama",
        }
    }

    /// The streaming completion request for `prompt`, greedy or sampled.
    pub fn request_body(self, prompt: &str, max_tokens: usize, sampled: bool) -> Value {
        let mut body = json!({
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "seed": SEED,
            "stream": true,
            "stream_options": {"include_usage": true},
            "ignore_eos": true,
        });
        if sampled {
            // Both servers' own names for these (nx's extras `top_k`, `min_p`).
            for (k, v) in SAMPLING {
                body[k] = json!(v);
            }
        }
        if self == Engine::Llama {
            // llama.cpp's own names: `n_predict` wins over `max_tokens`; reuse the slot's
            // cached prefix (its default, spelled out).
            body["n_predict"] = json!(max_tokens);
            body["cache_prompt"] = json!(true);
        }
        body
    }
}

/// The server flags (without model, host and port) for `n` slots of `ctx` positions.
pub fn server_args(
    engine: Engine,
    threads: usize,
    n: usize,
    ctx: usize,
    extra: &[String],
) -> Vec<String> {
    let mut args: Vec<String> = match engine {
        Engine::Nx => vec![
            "--threads".into(),
            threads.to_string(),
            "--parallel".into(),
            n.to_string(),
            "--ctx".into(),
            ctx.to_string(),
        ],
        Engine::Llama => vec![
            "-np".into(),
            n.to_string(),
            "-c".into(),
            (n * ctx).to_string(),
            "-t".into(),
            threads.to_string(),
        ],
    };
    args.extend(extra.iter().cloned());
    args
}

/// A server child process on 127.0.0.1; killed when dropped (also on errors).
struct Server {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Server {
    /// Starts `program` (nx with `serve` first) on a free port and waits for `/health` 200.
    fn start(
        engine: Engine,
        program: &Path,
        model: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<Server> {
        // A port taken between our probe and the server's bind makes the server exit;
        // try a few fresh ports, but not after a crash (a signal), which would repeat.
        let mut last = None;
        for _attempt in 0..3 {
            let port = free_port()?;
            match Server::start_on(engine, program, model, args, port, log) {
                Ok(s) => return Ok(s),
                Err((crashed, e)) => {
                    eprintln!("loadtest: {} on port {port}: {e:#}", engine.name());
                    if crashed {
                        return Err(e);
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("{} did not start", engine.name())))
    }

    fn start_on(
        engine: Engine,
        program: &Path,
        model: &Path,
        args: &[String],
        port: u16,
        log: &Path,
    ) -> Result<Server, (bool, anyhow::Error)> {
        let failed = |e: anyhow::Error| (false, e);
        let file = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))
            .map_err(failed)?;
        let mut cmd = Command::new(program);
        match engine {
            Engine::Nx => cmd.arg("serve").arg("--model"),
            Engine::Llama => cmd.arg("-m"),
        };
        cmd.arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().map_err(|e| failed(e.into()))?)
            .stderr(file);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))
            .map_err(failed)?;
        let mut server = Server {
            child,
            port,
            log: log.to_path_buf(),
        };
        let started = Instant::now();
        loop {
            if let Some(status) = server.child.try_wait().map_err(|e| failed(e.into()))? {
                let e = anyhow::anyhow!(
                    "exited ({}) while loading\nlog tail:\n{}",
                    status_text(status),
                    log_tail(log)
                );
                return Err((status.signal().is_some(), e));
            }
            match http::get(port, "/health", Duration::from_secs(5)) {
                Ok(r) if r.status == 200 => break,
                Ok(r) if r.status == 503 => {}
                Ok(r) => {
                    return Err(failed(anyhow::anyhow!(
                        "/health answered HTTP {}",
                        r.status
                    )))
                }
                Err(_) => {}
            }
            if started.elapsed() > STARTUP_TIMEOUT {
                return Err(failed(anyhow::anyhow!(
                    "not healthy after {STARTUP_TIMEOUT:?}\nlog tail:\n{}",
                    log_tail(log)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "loadtest: {} ready on 127.0.0.1:{port} in {:.1} s (log {})",
            engine.name(),
            started.elapsed().as_secs_f64(),
            log.display()
        );
        Ok(server)
    }

    /// `Some(status)` once the process has exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Peak resident set so far (`VmHWM`), in KiB.
    fn peak_rss_kib(&self) -> Option<u64> {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|s| vm_hwm_kib(&s))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only the child we started, by its handle.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `exit code 1` or `SIGSEGV, signal 11`.
pub fn status_text(status: ExitStatus) -> String {
    if let Some(sig) = status.signal() {
        let name = match sig {
            4 => "SIGILL, ",
            6 => "SIGABRT, ",
            7 => "SIGBUS, ",
            9 => "SIGKILL, ",
            11 => "SIGSEGV, ",
            _ => "",
        };
        format!("{name}signal {sig}")
    } else {
        format!("exit code {}", status.code().unwrap_or(-1))
    }
}

// ---------------------------------------------------------------------------------------
// Running a level

/// Everything measured for one engine at one level.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct LevelStats {
    pub clients: usize,
    pub parallel: usize,
    pub requests_ok: usize,
    pub errors: usize,
    /// The first few error messages.
    pub error_samples: Vec<String>,
    pub tokens: usize,
    pub wall_s: f64,
    pub tok_per_s: f64,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub itl_p50_ms: Option<f64>,
    pub itl_p95_ms: Option<f64>,
    /// Aggregate decode rate: the mean over requests of each one's tokens after its
    /// first over the time from its first text event to its last, times the sequences
    /// decoding at once (the clients, at most the slots). Unlike `tok_per_s` it leaves
    /// out queueing and prefill, as `llama-batched-bench`'s decode rate does.
    #[serde(default)]
    pub decode_tok_per_s: Option<f64>,
    pub peak_rss_mb: Option<f64>,
    /// Mean prompt tokens as the server counted them.
    pub mean_prompt_tokens: Option<f64>,
    /// Requests that ended with fewer tokens than asked for.
    pub short_requests: usize,
}

/// Summarises one level's outcomes.
pub fn level_stats(
    clients: usize,
    parallel: usize,
    outcomes: &[Result<Streamed, Failed>],
    not_sent: usize,
    max_tokens: usize,
    wall: Duration,
) -> LevelStats {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut ttfts = Vec::new();
    let mut gaps = Vec::new();
    let mut decode_rates = Vec::new();
    let mut prompt_tokens = Vec::new();
    let mut s = LevelStats {
        clients,
        parallel,
        wall_s: wall.as_secs_f64(),
        errors: not_sent,
        ..LevelStats::default()
    };
    if not_sent > 0 {
        s.error_samples.push(format!(
            "{not_sent} requests not sent before the level timeout"
        ));
    }
    for outcome in outcomes {
        let streamed = match outcome {
            Ok(st) => {
                if st.tokens() < max_tokens {
                    s.short_requests += 1;
                    s.errors += 1;
                    if s.error_samples.len() < 5 {
                        s.error_samples
                            .push(format!("{} of {max_tokens} tokens", st.tokens()));
                    }
                } else {
                    s.requests_ok += 1;
                }
                st
            }
            Err(f) => {
                s.errors += 1;
                if s.error_samples.len() < 5 {
                    s.error_samples.push(f.message.clone());
                }
                &f.partial
            }
        };
        s.tokens += streamed.tokens();
        ttfts.extend(streamed.ttft().map(ms));
        gaps.extend(streamed.gaps().map(ms));
        decode_rates.extend(streamed.decode_rate());
        prompt_tokens.extend(streamed.prompt_tokens.map(|n| n as f64));
    }
    s.tok_per_s = if s.wall_s > 0.0 {
        s.tokens as f64 / s.wall_s
    } else {
        0.0
    };
    s.ttft_p50_ms = percentile(&ttfts, 50.0);
    s.ttft_p95_ms = percentile(&ttfts, 95.0);
    s.itl_p50_ms = percentile(&gaps, 50.0);
    s.itl_p95_ms = percentile(&gaps, 95.0);
    if !decode_rates.is_empty() {
        let mean = decode_rates.iter().sum::<f64>() / decode_rates.len() as f64;
        s.decode_tok_per_s = Some(mean * clients.min(parallel.max(1)) as f64);
    }
    if !prompt_tokens.is_empty() {
        s.mean_prompt_tokens = Some(prompt_tokens.iter().sum::<f64>() / prompt_tokens.len() as f64);
    }
    s
}

/// `clients` threads share `requests` requests (prompt `i` for request `i`).
fn drive(
    engine: Engine,
    port: u16,
    clients: usize,
    (requests, max_tokens, sampled): (usize, usize, bool),
    timeout: Duration,
) -> (Vec<Result<Streamed, Failed>>, usize, Duration) {
    let next = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + timeout;
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let next = Arc::clone(&next);
            let finished = Arc::clone(&finished);
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                loop {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= requests {
                        break;
                    }
                    let body = engine.request_body(&load_prompt(i), max_tokens, sampled);
                    mine.push(stream_post(port, "/v1/completions", &body));
                    let done = finished.fetch_add(1, Ordering::SeqCst) + 1;
                    if done * 4 / requests > (done - 1) * 4 / requests && done < requests {
                        eprintln!(
                            "loadtest:   {} {clients} clients: {done}/{requests} requests, {:.1} s",
                            engine.name(),
                            started.elapsed().as_secs_f64()
                        );
                    }
                }
                mine
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for h in handles {
        match h.join() {
            Ok(mine) => outcomes.extend(mine),
            Err(_) => outcomes.push(Err(Failed {
                message: "client thread panicked".into(),
                partial: Streamed::default(),
            })),
        }
    }
    let wall = started.elapsed();
    let not_sent = requests.saturating_sub(outcomes.len());
    (outcomes, not_sent, wall)
}

/// One short request so the first measured one does not pay for page faults and lazy
/// set-up; fails when the server does not answer with tokens.
fn warm_up(engine: Engine, port: u16) -> Result<()> {
    let body = engine.request_body("Warm-up: the weather today is", 8, false);
    stream_post(port, "/v1/completions", &body)
        .map(|_| ())
        .map_err(|f| anyhow::anyhow!("warm-up request failed: {}", f.message))
}

/// What a harness run needs to start servers.
struct Harness {
    nx: PathBuf,
    llama: PathBuf,
    model: PathBuf,
    log_dir: PathBuf,
    threads: usize,
    ctx: usize,
    /// Extra llama-server flags (empty, or `--no-repack` after a crash).
    llama_extra: Vec<String>,
    /// Why `llama_extra` is not empty.
    llama_fallback: Option<String>,
    /// Why `llama` is the build without AMX (the pinned one died with its defaults).
    llama_no_amx: Option<String>,
    /// The AVX2 build `llama` is under `NX_TIER=avx2`, described.
    llama_avx2: Option<&'static str>,
}

impl Harness {
    fn program(&self, engine: Engine) -> &Path {
        match engine {
            Engine::Nx => &self.nx,
            Engine::Llama => &self.llama,
        }
    }

    fn args(&self, engine: Engine, n: usize) -> Vec<String> {
        let extra: &[String] = match engine {
            Engine::Nx => &[],
            Engine::Llama => &self.llama_extra,
        };
        server_args(engine, self.threads, n, self.ctx, extra)
    }

    /// Starts `engine` with `n` slots and warms it up. When llama-server dies with its
    /// default flags, switches to the build without AMX (weight repacking still on) and,
    /// if that dies too, to `--no-repack`, and tries again.
    fn start_warm(&mut self, engine: Engine, n: usize, label: &str) -> Result<Server> {
        loop {
            let log = self.log_dir.join(format!("{}-{label}.log", engine.tag()));
            let args = self.args(engine, n);
            let attempt = Server::start(engine, self.program(engine), &self.model, &args, &log)
                .and_then(|mut s| match warm_up(engine, s.port) {
                    Ok(()) => Ok(s),
                    Err(e) => {
                        std::thread::sleep(Duration::from_millis(200));
                        match s.exited() {
                            Some(st) => bail!("{e:#}; the server exited ({})", status_text(st)),
                            None => Err(e),
                        }
                    }
                });
            match attempt {
                Ok(s) => return Ok(s),
                Err(e) if self.may_fall_back(engine) => {
                    self.fall_back(format!("{e:#}"), &log);
                }
                Err(e) => return Err(e.context(format!("{} {}", engine.name(), args.join(" ")))),
            }
        }
    }

    fn may_fall_back(&self, engine: Engine) -> bool {
        let no_amx_left = self.llama_no_amx.is_none() && self.llama_avx2.is_none();
        engine == Engine::Llama && (no_amx_left || self.llama_extra.is_empty())
    }

    /// Switches llama-server to the build without AMX (built now if missing: the pinned
    /// build faults in its AMX kernels on some machines, and `--no-repack` would switch
    /// off its fast layouts as well) or, when that is already the one, to `--no-repack`;
    /// keeps the failed run's log aside.
    fn fall_back(&mut self, why: String, log: &Path) {
        let first_line = why.lines().next().unwrap_or_default().to_string();
        // The AVX2 build has no AMX to leave out.
        let no_amx_left = self.llama_no_amx.is_none() && self.llama_avx2.is_none();
        let stage = if no_amx_left {
            "default-flags"
        } else {
            "no-amx"
        };
        let kept = log.with_extension(format!("{stage}.log"));
        let kept_text = match std::fs::rename(log, &kept) {
            Ok(()) => kept.display().to_string(),
            Err(_) => log.display().to_string(),
        };
        if no_amx_left {
            eprintln!(
                "loadtest: the pinned llama-server failed with its default flags \
                 ({first_line}); switching to the build without AMX (log of the failed \
                 run: {kept_text})"
            );
            self.llama_no_amx = Some(first_line.clone());
            match crate::reference::ensure_no_amx_server(crate::reference::DEFAULT_JOBS) {
                Ok(bin) => {
                    self.llama = bin;
                    return;
                }
                Err(e) => eprintln!("loadtest: the build without AMX failed: {e:#}"),
            }
        }
        eprintln!(
            "loadtest: llama-server failed with its default flags ({first_line}); retrying \
             with {NO_REPACK} (log of the failed run: {kept_text})"
        );
        self.llama_extra = vec![NO_REPACK.to_string()];
        self.llama_fallback = Some(first_line);
    }
}

/// Runs one level on one engine: fresh server, warm-up, load, peak RSS. `label` names
/// the server's log (`ENGINE-LABEL.log`).
fn run_level(
    cx: &mut Harness,
    engine: Engine,
    clients: usize,
    args: &LoadtestArgs,
    label: &str,
) -> Result<LevelStats> {
    let n = args.parallel.unwrap_or(clients);
    loop {
        let mut server = cx.start_warm(engine, n, label)?;
        eprintln!(
            "loadtest: {} {clients} clients, {} requests of {} tokens ...",
            engine.name(),
            args.requests_per_level,
            args.max_tokens
        );
        let (outcomes, not_sent, wall) = drive(
            engine,
            server.port,
            clients,
            (args.requests_per_level, args.max_tokens, args.sampled),
            Duration::from_secs(args.level_timeout),
        );
        let peak = server.peak_rss_kib();
        let crashed = server.exited();
        let mut stats = level_stats(clients, n, &outcomes, not_sent, args.max_tokens, wall);
        stats.peak_rss_mb = peak.map(|k| k as f64 / 1024.0);
        if let Some(status) = crashed {
            let why = format!(
                "exited ({}) during the {clients}-client level",
                status_text(status)
            );
            if cx.may_fall_back(engine) {
                cx.fall_back(why, &server.log);
                continue;
            }
            stats.error_samples.insert(0, format!("server {why}"));
        }
        eprintln!(
            "loadtest: {} {clients} clients: {}",
            engine.name(),
            stats_line(&stats)
        );
        for e in &stats.error_samples {
            eprintln!("loadtest:   error: {e}");
        }
        return Ok(stats);
    }
}

fn stats_line(s: &LevelStats) -> String {
    format!(
        "{:.1} tok/s ({} tokens in {:.1} s), TTFT p50 {} p95 {}, ITL p50 {} p95 {}, peak RSS {}, \
         {} errors",
        s.tok_per_s,
        s.tokens,
        s.wall_s,
        opt_ms(s.ttft_p50_ms),
        opt_ms(s.ttft_p95_ms),
        opt_ms(s.itl_p50_ms),
        opt_ms(s.itl_p95_ms),
        opt_mb(s.peak_rss_mb),
        s.errors
    )
}

/// The prefix-cache phase of one engine.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct PrefixStats {
    pub prompt_tokens: Option<usize>,
    pub miss_ttft_ms: Option<f64>,
    pub hit_ttft_p50_ms: Option<f64>,
    /// Miss TTFT over the median hit TTFT.
    pub ratio: Option<f64>,
    /// Cached prompt tokens the server reported for the hits (median).
    pub hit_cached_tokens: Option<f64>,
    pub errors: usize,
    pub error_samples: Vec<String>,
}

/// Summarises the prefix phase: the first outcome is the miss, the rest are hits.
pub fn prefix_stats(outcomes: &[Result<Streamed, Failed>]) -> PrefixStats {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut s = PrefixStats::default();
    let mut hits = Vec::new();
    let mut cached = Vec::new();
    for (i, o) in outcomes.iter().enumerate() {
        match o {
            Ok(st) => {
                if i == 0 {
                    s.miss_ttft_ms = st.ttft().map(ms);
                    s.prompt_tokens = st.prompt_tokens;
                } else {
                    hits.extend(st.ttft().map(ms));
                    cached.extend(st.cached_tokens.map(|n| n as f64));
                }
            }
            Err(f) => {
                s.errors += 1;
                if s.error_samples.len() < 5 {
                    s.error_samples.push(f.message.clone());
                }
            }
        }
    }
    s.hit_ttft_p50_ms = percentile(&hits, 50.0);
    s.hit_cached_tokens = percentile(&cached, 50.0);
    s.ratio = match (s.miss_ttft_ms, s.hit_ttft_p50_ms) {
        (Some(m), Some(h)) if h > 0.0 => Some(m / h),
        _ => None,
    };
    s
}

fn run_prefix(cx: &mut Harness, engine: Engine, args: &LoadtestArgs) -> Result<PrefixStats> {
    let n = args.parallel.unwrap_or(1);
    let server = cx.start_warm(engine, n, "prefix")?;
    eprintln!(
        "loadtest: {} prefix cache: {PREFIX_REQUESTS} requests sharing a system prompt, one at a time",
        engine.name()
    );
    let outcomes: Vec<_> = (0..PREFIX_REQUESTS)
        .map(|k| {
            let body = engine.request_body(&prefix_prompt(k), PREFIX_MAX_TOKENS, args.sampled);
            stream_post(server.port, "/v1/completions", &body)
        })
        .collect();
    let s = prefix_stats(&outcomes);
    eprintln!(
        "loadtest: {} prefix cache: miss {} , hits p50 {} ({} cached tokens), ratio {}",
        engine.name(),
        opt_ms(s.miss_ttft_ms),
        opt_ms(s.hit_ttft_p50_ms),
        s.hit_cached_tokens
            .map_or("-".into(), |c| format!("{c:.0}")),
        opt_ratio(s.ratio)
    );
    for e in &s.error_samples {
        eprintln!("loadtest:   error: {e}");
    }
    Ok(s)
}

// ---------------------------------------------------------------------------------------
// The report

/// One level of both engines.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LevelRow {
    pub clients: usize,
    pub nx: LevelStats,
    /// llama-server at its best: the faster (tok/s) of its runs with and without
    /// weight repacking (`best_llama`).
    pub llama: Option<LevelStats>,
    /// Whether `llama` is the `--no-repack` run.
    #[serde(default)]
    pub llama_no_repack: bool,
    /// The slower llama-server run, when both ran.
    #[serde(default)]
    pub llama_other: Option<LevelStats>,
    /// Every run's tok/s in the order they ran, per configuration (`--reps`): the rows
    /// above are each configuration's median run.
    #[serde(default)]
    pub runs: LevelRuns,
}

/// The tok/s of each run of one level, per configuration, in the order they ran.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LevelRuns {
    pub nx: Vec<f64>,
    /// llama-server with its defaults (or `--no-repack` where the defaults failed).
    pub llama: Vec<f64>,
    /// llama-server `--no-repack`, when both configurations ran.
    pub llama_no_repack: Vec<f64>,
}

/// The whole run, as written to `target/loadtest/loadtest-<date>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub command: String,
    pub date: String,
    pub time_utc: String,
    pub cpu: String,
    pub logical_cpus: usize,
    pub load_average_before: String,
    pub load_average_after: String,
    pub model: String,
    pub threads: usize,
    pub ctx: usize,
    pub requests_per_level: usize,
    pub max_tokens: usize,
    /// `--parallel`, or `None` when each level's server has as many slots as clients.
    pub parallel: Option<usize>,
    pub nx_flags: String,
    /// `None` with `--no-reference`.
    pub llama_flags: Option<String>,
    pub llama_fallback: Option<String>,
    /// Why llama-server is the build without AMX (`None`: the pinned build).
    #[serde(default)]
    pub llama_no_amx: Option<String>,
    /// Under `NX_TIER=avx2`: the AVX2 build llama-server is, described.
    #[serde(default)]
    pub llama_avx2: Option<String>,
    pub levels: Vec<LevelRow>,
    pub prefix_nx: PrefixStats,
    pub prefix_llama: Option<PrefixStats>,
    pub wall_s: f64,
    /// `--sampled`: every token sampled (`SAMPLING`), not greedy.
    #[serde(default)]
    pub sampled: bool,
    /// Runs per level and engine configuration (`--reps`); the table holds medians.
    #[serde(default = "one_rep")]
    pub reps: usize,
}

fn one_rep() -> usize {
    1
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0} ms"))
}

fn opt_mb(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0} MB"))
}

fn opt_ratio(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// `p50 / p95` in milliseconds, with one decimal under 10 ms.
fn pair_ms(p50: Option<f64>, p95: Option<f64>) -> String {
    let f = |v: Option<f64>| match v {
        None => "-".to_string(),
        Some(v) if v < 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.0}"),
    };
    format!("{} / {} ms", f(p50), f(p95))
}

/// The per-level table in markdown.
pub fn levels_table(report: &Report) -> String {
    let mut out = String::from(
        "| clients | nx tok/s | llama-server tok/s | ratio | nx decode tok/s | llama-server \
         decode tok/s | decode ratio | nx TTFT p50 / p95 | llama-server TTFT p50 / p95 | nx \
         ITL p50 / p95 | llama-server ITL p50 / p95 | nx peak RSS | llama-server peak RSS | \
         errors nx / llama-server |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let dash = || "-".to_string();
    let rate = |v: Option<f64>| v.map_or_else(dash, |v| format!("{v:.1}"));
    let ratio = |nx: Option<f64>, l: Option<f64>| match (nx, l) {
        (Some(nx), Some(l)) if l > 0.0 => format!("{:.2}", nx / l),
        _ => dash(),
    };
    for row in &report.levels {
        let nx = &row.nx;
        let l = row.llama.as_ref();
        let l_tps = l.map_or_else(dash, |l| {
            let star = row.llama_no_repack && row.llama_other.is_some();
            format!("{:.1}{}", l.tok_per_s, if star { "*" } else { "" })
        });
        let l_decode = l.and_then(|l| l.decode_tok_per_s);
        out.push_str(&format!(
            "| {} | {:.1} | {l_tps} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} |\n",
            row.clients,
            nx.tok_per_s,
            ratio(Some(nx.tok_per_s), l.map(|l| l.tok_per_s)),
            rate(nx.decode_tok_per_s),
            rate(l_decode),
            ratio(nx.decode_tok_per_s, l_decode),
            pair_ms(nx.ttft_p50_ms, nx.ttft_p95_ms),
            l.map_or_else(dash, |l| pair_ms(l.ttft_p50_ms, l.ttft_p95_ms)),
            pair_ms(nx.itl_p50_ms, nx.itl_p95_ms),
            l.map_or_else(dash, |l| pair_ms(l.itl_p50_ms, l.itl_p95_ms)),
            opt_mb(nx.peak_rss_mb),
            l.map_or_else(dash, |l| opt_mb(l.peak_rss_mb)),
            nx.errors,
            l.map_or_else(dash, |l| l.errors.to_string()),
        ));
    }
    out
}

/// The prefix-cache table in markdown.
pub fn prefix_table(report: &Report) -> String {
    let mut out = String::from(
        "| engine | prompt tokens | miss TTFT | hit TTFT p50 | miss ÷ hit | cached tokens per hit | errors |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut row = |name: &str, p: &PrefixStats| {
        out.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} | {} |\n",
            p.prompt_tokens.map_or("-".into(), |n| n.to_string()),
            opt_ms(p.miss_ttft_ms),
            opt_ms(p.hit_ttft_p50_ms),
            opt_ratio(p.ratio),
            p.hit_cached_tokens
                .map_or("-".into(), |c| format!("{c:.0}")),
            p.errors
        ));
    };
    row("nx serve", &report.prefix_nx);
    if let Some(p) = &report.prefix_llama {
        row("llama-server", p);
    }
    out
}

/// The lines above the tables: machine, model, flags.
pub fn summary_lines(report: &Report) -> String {
    let slots = match report.parallel {
        Some(n) => format!("{n} (fixed by --parallel)"),
        None => "as many as the level's clients (one server per level)".to_string(),
    };
    let mut text = format!(
        "CPU: {} ({} logical CPUs)\ndate: {} {} UTC (end of run), {:.0} s in all\n\
         model: {}\nthreads: {}   slots: {slots}   context per sequence: {}\n\
         requests per level and engine: {} of {} tokens   load average before/after: {} / {}\n\
         nx serve flags: {}\n",
        report.cpu,
        report.logical_cpus,
        report.date,
        report.time_utc,
        report.wall_s,
        report.model,
        report.threads,
        report.ctx,
        report.requests_per_level,
        report.max_tokens,
        report.load_average_before,
        report.load_average_after,
        report.nx_flags,
    );
    match &report.llama_flags {
        Some(f) => text.push_str(&format!("llama-server flags: {f}")),
        None => text.push_str("llama-server: skipped (--no-reference)"),
    }
    if let Some(what) = &report.llama_avx2 {
        text.push_str(&format!(
            "\nllama-server build: {what} (nx on its AVX2 tier, NX_TIER=avx2), weight \
             repacking on"
        ));
    }
    if let Some(why) = &report.llama_no_amx {
        text.push_str(&format!(
            "\nllama-server build: the pinned one without AMX (`-mno-amx-*`, weight \
             repacking still on); the pinned build failed with its default flags: {why}"
        ));
    }
    if let Some(why) = &report.llama_fallback {
        text.push_str(&format!(
            "\nllama-server needed {NO_REPACK}: with its default flags it failed: {why}"
        ));
    }
    text
}

/// Per-level error messages, when there were any.
fn error_lines(report: &Report) -> String {
    let mut out = String::new();
    for row in &report.levels {
        let engines = [
            (Engine::Nx, Some(&row.nx)),
            (Engine::Llama, row.llama.as_ref()),
        ];
        for (engine, stats) in engines {
            let Some(s) = stats else { continue };
            for e in &s.error_samples {
                out.push_str(&format!(
                    "- {} clients, {}: {e}\n",
                    row.clients,
                    engine.name()
                ));
            }
        }
    }
    out
}

/// The section this command owns in `docs/benchmarks.md`, markers included.
pub fn doc_section(report: &Report) -> String {
    let errors = error_lines(report);
    let errors = if errors.is_empty() {
        "No request failed.\n".to_string()
    } else {
        format!("Failed or short requests:\n\n{errors}")
    };
    let llama_cmd = report.llama_flags.as_deref().map_or_else(
        || "(not run: `--no-reference`)".to_string(),
        |f| format!("`llama-server -m F --host 127.0.0.1 --port P {f}`"),
    );
    let (begin, end) = loadtest_markers(report.sampled);
    let (title, flag, decoding) = if report.sampled {
        let settings: Vec<String> = SAMPLING
            .iter()
            .map(|(k, v)| format!("`{k}: {v}`"))
            .collect();
        (
            ", sampled",
            " --sampled",
            format!("{}, `seed: {SEED}`", settings.join(", ")),
        )
    } else {
        ("", "", format!("`temperature: 0`, `seed: {SEED}`"))
    };
    format!(
        "{begin}\n\
         ## Serving under load{title}: nx serve vs llama-server\n\n\
         Generated by `cargo xtask loadtest{flag} --write` (this section is replaced on every \
         such run; raw figures in `target/loadtest/{json}`). {runs_note}\n\n\
         Command:\n\n```sh\n{command}\n```\n\n\
         ```text\n{summary}\n```\n\n\
         {table}\n\
         Columns: tok/s is every generated token of the level over its wall time (first \
         request sent to last stream ended); ratio is nx ÷ llama-server (above 1: nx \
         faster). Decode tok/s leaves queueing and prefill out: each request's tokens after \
         its first over the time from its first text chunk to its last, averaged over the \
         level's requests and multiplied by the streams decoding at once (the clients), as \
         `llama-batched-bench` reports decoding apart from prompt processing. TTFT is from sending a request to its first non-empty text chunk, queueing \
         and prefill included; ITL is the gap between consecutive text chunks of one \
         request, over all requests of the level; p50 / p95 interpolate between ranks. Peak \
         RSS is the server's `VmHWM` at the end of the level (MB = 2^20 bytes), mapped model \
         pages included. Errors count failed requests and requests that ended short of \
         {max_tokens} tokens.\n\n\
         ### Method\n\n\
         Each level starts each server afresh, nx first, with as many sequence slots as the \
         level has clients (unless `--parallel`), sends one untimed 8-token warm-up request, \
         then lets that many client threads share {requests} requests: each client streams \
         one request to its end and takes the next. Every request is `POST /v1/completions` \
         with `stream: true`, {decoding}, `max_tokens: {max_tokens}`, \
         `ignore_eos: true` (llama-server also gets `n_predict: {max_tokens}`) over a \
         different prompt of {prompt_tokens} (generated sentences, the same on every \
         run).\n\n\
         - nx: `target/release/nx serve --model F --host 127.0.0.1 --port P {nx}` (its other \
           settings at their defaults: f16 KV cache in a 256 MiB pool, prefix cache on, \
           prefill chunks of 256);\n\
         - llama.cpp: {llama_cmd} (`-c` is split across the `-np` slots, so each gets the same \
           {ctx} positions as an nx sequence; everything else at its defaults: continuous \
           batching, flash attention `auto`, f16 KV cache, prompt cache on{repack}).\n\n\
         {llama_runs}\
         {every_run}\
         Peak RSS: `nx serve` sizes its KV pool by `--kv-memory` (256 MiB by default), not \
         by slots × context, and takes it from zeroed memory, so only blocks that have been \
         written become resident: its RSS is the mapped model plus the blocks the level used; \
         llama-server allocates KV for its `-c` positions (fewer on Gemma 3's sliding-window \
         layers).\n\n\
         {errors}\n\
         ### Prefix cache\n\n\
         One more server per engine with one slot: {prefix_n} requests one after another, each \
         the same ~400-token system prompt followed by a different short question, \
         {prefix_tokens} tokens generated. The first request finds nothing cached (miss); the \
         others can reuse the system prompt's KV (hits). miss ÷ hit is the first request's \
         TTFT over the median of the others'.\n\n\
         {prefix}\n\
         {prefix_note}\
         **These numbers are noisy.** The machine is a shared VM with {cpus} logical CPUs; the \
         client threads run on the same cores as the servers; load average {load_before} \
         before and {load_after} after the run.\n\
         {end}\n",
        json = json_name(report),
        command = report.command,
        summary = summary_lines(report),
        table = levels_table(report),
        max_tokens = report.max_tokens,
        requests = report.requests_per_level,
        nx = report.nx_flags,
        ctx = report.ctx,
        prompt_tokens = report
            .levels
            .first()
            .and_then(|l| l.nx.mean_prompt_tokens)
            .map_or("about 170 tokens".to_string(), |m| format!(
                "{m:.0} tokens on average"
            )),
        repack = match &report.llama_fallback {
            Some(_) => format!(
                "; `{NO_REPACK}` only because it failed with its default weight repacking \
                 in the pinned build and in the build without AMX, see above"
            ),
            None => ", weight repacking on; and again with `--no-repack`, the faster of the \
                     two runs (by tok/s) being the one in the table, marked * where it is \
                     `--no-repack`'s"
                .to_string(),
        },
        llama_runs = llama_runs_lines(report),
        runs_note = match report.reps {
            1 => "One run, so read the ratios, not the absolute figures.".to_string(),
            n => format!(
                "Each engine's figures are its median run (by tok/s) of {n} per level, the \
                 engines taking turns; read the ratios, not the absolute figures."
            ),
        },
        every_run = every_run_lines(report),
        prefix_n = PREFIX_REQUESTS,
        prefix_tokens = PREFIX_MAX_TOKENS,
        prefix = prefix_table(report),
        prefix_note = llama_prefix_note(report),
        cpus = report.logical_cpus,
        load_before = report.load_average_before,
        load_after = report.load_average_after,
    )
}

/// Every run's tok/s per level and configuration, as a paragraph (empty for one run).
pub fn every_run_lines(report: &Report) -> String {
    if report.reps < 2 {
        return String::new();
    }
    let list = |v: &[f64]| {
        v.iter()
            .map(|t| format!("{t:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = format!(
        "Every run's tok/s, in the order they ran (each level: nx, llama-server, \
         llama-server `--no-repack`, {} times):\n\n",
        report.reps
    );
    for row in &report.levels {
        let r = &row.runs;
        text.push_str(&format!("- {} clients: nx {}", row.clients, list(&r.nx)));
        if !r.llama.is_empty() {
            text.push_str(&format!("; llama-server {}", list(&r.llama)));
        }
        if !r.llama_no_repack.is_empty() {
            text.push_str(&format!("; `--no-repack` {}", list(&r.llama_no_repack)));
        }
        text.push('\n');
    }
    text.push('\n');
    text
}

/// Both llama-server runs of every level where both ran, as a paragraph (empty when none).
pub fn llama_runs_lines(report: &Report) -> String {
    let mut lines = String::new();
    for row in &report.levels {
        let (Some(best), Some(other)) = (&row.llama, &row.llama_other) else {
            continue;
        };
        let (on, off) = match row.llama_no_repack {
            true => (other, best),
            false => (best, other),
        };
        lines.push_str(&format!(
            "- {} clients: repacking on {:.1} tok/s ({} errors), `--no-repack` {:.1} tok/s ({} errors)\n",
            row.clients, on.tok_per_s, on.errors, off.tok_per_s, off.errors
        ));
    }
    match lines.is_empty() {
        true => String::new(),
        false if report.reps > 1 => format!(
            "llama-server's two configurations per level (each its median run):\n\n{lines}\n"
        ),
        false => format!("llama-server's two runs per level:\n\n{lines}\n"),
    }
}

/// `loadtest-<date>-<HHMM>.json`: one file per run, a later run the same day keeps it.
pub fn json_name(report: &Report) -> String {
    format!(
        "loadtest-{}-{}{}.json",
        report.date,
        report.time_utc.replace(':', ""),
        if report.sampled { "-sampled" } else { "" }
    )
}

/// What the prefix phase says about llama-server, when it reused nothing.
fn llama_prefix_note(report: &Report) -> &'static str {
    match &report.prefix_llama {
        Some(p) if p.errors == 0 && p.hit_cached_tokens == Some(0.0) => {
            "llama-server reported 0 cached prompt tokens for every hit: with its default \
             cache, Gemma 3's sliding-window layers keep only the last window of positions, \
             so it cannot restore the shared prefix and evaluates each prompt in full \
             (`--swa-full`, a full-size cache on every layer, lets it reuse the prefix).\n\n"
        }
        _ => "",
    }
}

// ---------------------------------------------------------------------------------------
// Entry point

/// `cargo xtask loadtest`.
pub fn run(args: &LoadtestArgs) -> Result<()> {
    args.validate()?;
    let started = Instant::now();
    let load_before = load_average();
    let mut cx = harness(args)?;
    let mut levels = Vec::new();
    for &clients in &args.clients {
        levels.push(run_level_reps(&mut cx, clients, args)?);
    }
    let prefix_nx = run_prefix(&mut cx, Engine::Nx, args)?;
    let prefix_llama = if args.no_reference {
        None
    } else {
        Some(run_prefix(&mut cx, Engine::Llama, args)?)
    };
    let prefix = (prefix_nx, prefix_llama);
    let report = report_of(args, &cx, load_before, levels, prefix, started);
    write_outputs(&report, &cx.log_dir, args)?;
    eprintln!("loadtest: done in {}", duration_text(started.elapsed()));
    Ok(())
}

/// Runs one level `--reps` times, nx and llama-server taking turns, and keeps each
/// configuration's median run.
fn run_level_reps(cx: &mut Harness, clients: usize, args: &LoadtestArgs) -> Result<LevelRow> {
    let (mut nx, mut default, mut no_repack) = (Vec::new(), Vec::new(), Vec::new());
    let mut default_is_no_repack = false;
    for rep in 1..=args.reps {
        let label = match args.reps {
            1 => clients.to_string(),
            _ => format!("{clients}-run{rep}"),
        };
        nx.push(run_level(cx, Engine::Nx, clients, args, &label)?);
        if args.no_reference {
            continue;
        }
        let (run, off) = llama_runs(cx, clients, args, &label)?;
        default_is_no_repack = off.is_none();
        default.push(run);
        no_repack.extend(off);
    }
    let runs = LevelRuns {
        nx: nx.iter().map(|s| s.tok_per_s).collect(),
        llama: default.iter().map(|s| s.tok_per_s).collect(),
        llama_no_repack: no_repack.iter().map(|s| s.tok_per_s).collect(),
    };
    let nx = median_run(nx).expect("at least one run");
    let (llama, llama_no_repack, llama_other) = match (median_run(default), median_run(no_repack)) {
        (Some(on), Some(off)) => {
            let off_wins = off.tok_per_s > on.tok_per_s && off.errors <= on.errors;
            match off_wins {
                true => (Some(off), true, Some(on)),
                false => (Some(on), false, Some(off)),
            }
        }
        (run, _) => (run, default_is_no_repack, None),
    };
    Ok(LevelRow {
        clients,
        nx,
        llama,
        llama_no_repack,
        llama_other,
        runs,
    })
}

/// The run of median tok/s (the lower of the middle two for an even count).
pub fn median_run(mut runs: Vec<LevelStats>) -> Option<LevelStats> {
    runs.sort_by(|a, b| a.tok_per_s.total_cmp(&b.tok_per_s));
    let middle = runs.len().checked_sub(1)? / 2;
    Some(runs.swap_remove(middle))
}

/// Runs llama-server's level with its defaults (weight repacking on) and, unless those
/// already fell back to it, with `--no-repack` (`None` where they did): repacking is
/// llama.cpp's default, not always its fastest, and nx is compared with llama-server at
/// its best (the faster of the two, see [`run_level_reps`]).
fn llama_runs(
    cx: &mut Harness,
    clients: usize,
    args: &LoadtestArgs,
    label: &str,
) -> Result<(LevelStats, Option<LevelStats>)> {
    let default = run_level(cx, Engine::Llama, clients, args, label)?;
    if !cx.llama_extra.is_empty() {
        // Already `--no-repack`, after the defaults failed.
        return Ok((default, None));
    }
    cx.llama_extra = vec![NO_REPACK.to_string()];
    let off = run_level(
        cx,
        Engine::Llama,
        clients,
        args,
        &format!("{label}-no-repack"),
    );
    cx.llama_extra.clear();
    Ok((default, Some(off?)))
}

/// Checks that the model and llama-server are there, builds nx (unless `--no-build`)
/// and makes the log folder.
fn harness(args: &LoadtestArgs) -> Result<Harness> {
    let model = default_model_path();
    if !model.is_file() {
        bail!(
            "the default model {} is missing; run `cargo xtask fetch` first",
            model.display()
        );
    }
    // nx on its AVX2 tier stands in for a CPU without AVX-512: llama-server too.
    let avx2 = std::env::var("NX_TIER").is_ok_and(|t| t == "avx2") && !args.no_reference;
    if avx2 && args.write {
        bail!(
            "--write fills the default tier's section; under NX_TIER=avx2 the table is \
             printed only"
        );
    }
    let (llama, llama_avx2) = if avx2 {
        let (bin, build) = crate::reference::ensure_avx2_server(crate::reference::DEFAULT_JOBS)?;
        let what = build.describe();
        eprintln!(
            "loadtest: NX_TIER=avx2: llama-server built {what} ({})",
            bin.display()
        );
        (bin, Some(what))
    } else {
        (llama_bin("llama-server"), None)
    };
    if !args.no_reference && !llama.is_file() {
        bail!(
            "{} is missing; run `cargo xtask reference` to build it, or pass --no-reference \
             to test nx serve alone",
            llama.display()
        );
    }
    let target = target_dir()?;
    let nx = target.join("release").join("nx");
    if args.no_build {
        if !nx.is_file() {
            bail!("--no-build: {} does not exist", nx.display());
        }
    } else {
        eprintln!("loadtest: building nx (release)");
        run_checked(cargo_command().args(["build", "--release", "-p", "nx-cli", "--bin", "nx"]))?;
    }
    let log_dir = target.join("loadtest");
    std::fs::create_dir_all(&log_dir)
        .with_context(|| format!("cannot create {}", log_dir.display()))?;
    Ok(Harness {
        nx,
        llama,
        model,
        log_dir,
        threads: args.threads,
        ctx: args.ctx,
        llama_extra: Vec::new(),
        llama_fallback: None,
        llama_no_amx: None,
        llama_avx2,
    })
}

/// The report of a run started at `started`: its levels and its prefix-cache figures
/// (nx's, llama-server's).
fn report_of(
    args: &LoadtestArgs,
    cx: &Harness,
    load_before: String,
    levels: Vec<LevelRow>,
    (prefix_nx, prefix_llama): (PrefixStats, Option<PrefixStats>),
    started: Instant,
) -> Report {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (date, time_utc) = utc_date_time(now);
    let slots = args.parallel.map_or("N".to_string(), |n| n.to_string());
    let ctx_total = args
        .parallel
        .map_or(format!("N*{}", args.ctx), |n| (n * args.ctx).to_string());
    Report {
        command: args.command_line(),
        date: date.clone(),
        time_utc,
        cpu: std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| cpu_model_from(&t))
            .unwrap_or_else(|| "unknown CPU".into()),
        logical_cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average_before: load_before,
        load_average_after: load_average(),
        model: cx.model.file_name().map_or_else(
            || cx.model.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        ),
        threads: args.threads,
        ctx: args.ctx,
        requests_per_level: args.requests_per_level,
        max_tokens: args.max_tokens,
        parallel: args.parallel,
        nx_flags: format!(
            "--threads {} --parallel {slots} --ctx {}",
            args.threads, args.ctx
        ),
        llama_flags: (!args.no_reference).then(|| {
            let mut f = format!("-np {slots} -c {ctx_total} -t {}", args.threads);
            for e in &cx.llama_extra {
                f.push(' ');
                f.push_str(e);
            }
            f
        }),
        llama_fallback: cx.llama_fallback.clone(),
        llama_no_amx: cx.llama_no_amx.clone(),
        llama_avx2: cx.llama_avx2.map(str::to_string),
        levels,
        prefix_nx,
        prefix_llama,
        wall_s: started.elapsed().as_secs_f64(),
        sampled: args.sampled,
        reps: args.reps,
    }
}

/// Prints the tables, writes the JSON next to the logs and, with `--write`, the section
/// of `docs/benchmarks.md`.
fn write_outputs(report: &Report, log_dir: &std::path::Path, args: &LoadtestArgs) -> Result<()> {
    println!("{}\n", summary_lines(report));
    println!("{}", levels_table(report));
    println!(
        "Prefix cache (one slot, {PREFIX_REQUESTS} requests sharing a ~400-token system prompt):\n"
    );
    println!("{}", prefix_table(report));

    let json_path = log_dir.join(json_name(report));
    let json = serde_json::to_string_pretty(report).context("cannot encode the report")?;
    std::fs::write(&json_path, json + "\n")
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    eprintln!("loadtest: wrote {}", json_path.display());
    if args.write {
        let docs = workspace_root().join("docs").join("benchmarks.md");
        let old = std::fs::read_to_string(&docs).unwrap_or_default();
        std::fs::write(
            &docs,
            with_loadtest_section(&old, &doc_section(report), report.sampled),
        )
        .with_context(|| format!("cannot write {}", docs.display()))?;
        eprintln!(
            "loadtest: updated the loadtest section of {}",
            docs.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sections::loadtest_section;
    use crate::sections::{LOADTEST_BEGIN as SECTION_BEGIN, LOADTEST_END as SECTION_END};

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let v = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 50.0), Some(3.0));
        assert_eq!(percentile(&v, 100.0), Some(5.0));
        assert_eq!(percentile(&v, 25.0), Some(2.0));
        // numpy.percentile([1, 2, 3, 4], 95) = 3.85
        let p95 = percentile(&[4.0, 3.0, 2.0, 1.0], 95.0).unwrap();
        assert!((p95 - 3.85).abs() < 1e-12, "{p95}");
        assert_eq!(percentile(&[7.0], 95.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn sse_parser_handles_split_events_crlf_and_comments() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: {\"a\"").is_empty());
        assert_eq!(
            p.push(b":1}\n\n: ping\n\ndata: [DONE]\r\n"),
            vec!["{\"a\":1}"]
        );
        assert_eq!(p.push(b"\r\n"), vec!["[DONE]"]);
        // Two data lines make one event; other fields are ignored; no space after colon.
        assert_eq!(
            p.push(b"event: x\ndata:one\ndata: two\nid: 3\n\n"),
            vec!["one\ntwo"]
        );
        assert!(p.push(b"\n\n").is_empty());
    }

    #[test]
    fn chunked_decoder_yields_whole_chunks_across_reads() {
        let mut d = ChunkedDecoder::default();
        assert_eq!(d.push(b"5\r\nhel").unwrap(), b"");
        assert_eq!(d.push(b"lo\r\n3;ext=1\r\nabc\r\n").unwrap(), b"helloabc");
        assert!(!d.is_done());
        assert_eq!(d.push(b"0\r\n\r\n").unwrap(), b"");
        assert!(d.is_done());
        assert!(ChunkedDecoder::default().push(b"zz\r\n").is_err());
        assert!(ChunkedDecoder::default().push(b"2\r\nabcd").is_err());
    }

    #[test]
    fn events_give_text_usage_done_and_errors() {
        // A chunk as nx serve streams it, and its usage chunk.
        let nx = r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null}],"usage":null}"#;
        let e = parse_event(nx).unwrap();
        assert_eq!(e.text, " the");
        assert_eq!(e.completion_tokens, None);
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":150,"completion_tokens":128,"total_tokens":278,"prompt_tokens_details":{"cached_tokens":16}}}"#;
        let e = parse_event(usage).unwrap();
        assert_eq!(
            (
                e.text.as_str(),
                e.completion_tokens,
                e.prompt_tokens,
                e.cached_tokens
            ),
            ("", Some(128), Some(150), Some(16))
        );
        // llama-server's last chunk: empty text, finish_reason and usage together.
        let llama = r#"{"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"completion_tokens":128,"prompt_tokens":151,"total_tokens":279,"prompt_tokens_details":{"cached_tokens":0}},"timings":{}}"#;
        assert_eq!(parse_event(llama).unwrap().completion_tokens, Some(128));
        assert!(parse_event(" [DONE] ").unwrap().done);
        let err = r#"{"error":{"message":"out of KV blocks","type":"server_error"}}"#;
        assert_eq!(
            parse_event(err).unwrap().error.as_deref(),
            Some("out of KV blocks")
        );
        assert!(parse_event("not json").is_err());
    }

    #[test]
    fn heads_parse_and_reject_garbage() {
        let (status, headers) = parse_head(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked",
        )
        .unwrap();
        assert_eq!(status, 200);
        assert_eq!(headers[1], ("transfer-encoding".into(), "chunked".into()));
        assert!(parse_head(b"SMTP 220 hello").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nno colon").is_err());
    }

    fn streamed(ms: &[u64], usage: Option<usize>) -> Streamed {
        Streamed {
            token_times: ms.iter().map(|&m| Duration::from_millis(m)).collect(),
            completion_tokens: usage,
            prompt_tokens: Some(150),
            cached_tokens: Some(0),
            total: Duration::from_millis(ms.last().copied().unwrap_or(0)),
        }
    }

    #[test]
    fn level_stats_count_tokens_latencies_and_errors() {
        let outcomes = vec![
            Ok(streamed(&[100, 110, 120, 130], Some(4))),
            Ok(streamed(&[200, 220, 240, 260], None)),
            // Short: 2 of 4 tokens.
            Ok(streamed(&[300, 310], Some(2))),
            Err(Failed {
                message: "HTTP 429: queue full".into(),
                partial: Streamed::default(),
            }),
        ];
        let s = level_stats(4, 4, &outcomes, 1, 4, Duration::from_secs(2));
        assert_eq!(s.tokens, 10);
        assert_eq!(s.tok_per_s, 5.0);
        assert_eq!((s.requests_ok, s.errors, s.short_requests), (2, 3, 1));
        assert_eq!(s.ttft_p50_ms, Some(200.0));
        // Gaps: 10, 10, 10, 20, 20, 20, 10.
        assert_eq!(s.itl_p50_ms, Some(10.0));
        // Per request after the first token: 3 in 30 ms, 3 in 60 ms, 1 in 10 ms (the
        // failed one has no events); their mean rate, 83.3/s, times four streams.
        let decode = s.decode_tok_per_s.unwrap();
        assert!(
            (decode - 4.0 * (100.0 + 50.0 + 100.0) / 3.0).abs() < 1e-9,
            "{decode}"
        );
        assert!(s.error_samples.iter().any(|e| e.contains("429")));
        assert!(s.error_samples[0].contains("not sent"));
        assert_eq!(s.mean_prompt_tokens, Some(150.0));
    }

    #[test]
    fn prefix_stats_compare_the_miss_to_the_hits() {
        let mut hit = streamed(&[50], Some(8));
        hit.cached_tokens = Some(400);
        let outcomes = vec![
            Ok(streamed(&[400], Some(8))),
            Ok(hit.clone()),
            Ok(hit),
            Ok(streamed(&[150], Some(8))),
        ];
        let s = prefix_stats(&outcomes);
        assert_eq!(s.miss_ttft_ms, Some(400.0));
        assert_eq!(s.hit_ttft_p50_ms, Some(50.0));
        assert_eq!(s.ratio, Some(8.0));
        assert_eq!(s.hit_cached_tokens, Some(400.0));
    }

    #[test]
    fn prompts_are_deterministic_distinct_and_sized() {
        assert_eq!(load_prompt(3), load_prompt(3));
        assert_ne!(load_prompt(3), load_prompt(4));
        let words = load_prompt(0).split_whitespace().count();
        assert!((90..160).contains(&words), "{words} words");
        let sys = system_prompt();
        assert!(prefix_prompt(1).starts_with(&sys));
        assert_ne!(prefix_prompt(1), prefix_prompt(2));
        let words = sys.split_whitespace().count();
        assert!((250..400).contains(&words), "{words} words");
    }

    #[test]
    fn exit_statuses_name_their_signal() {
        use std::os::unix::process::ExitStatusExt;
        // Wait statuses: a signal in the low bits, an exit code in the second byte.
        assert_eq!(status_text(ExitStatus::from_raw(4)), "SIGILL, signal 4");
        assert_eq!(status_text(ExitStatus::from_raw(15)), "signal 15");
        assert_eq!(status_text(ExitStatus::from_raw(1 << 8)), "exit code 1");
    }

    #[test]
    fn request_bodies_and_server_flags() {
        let nx = Engine::Nx.request_body("p", 128, false);
        assert_eq!(nx["max_tokens"], 128);
        assert_eq!(nx["ignore_eos"], true);
        assert_eq!(nx["stream"], true);
        assert!(nx.get("n_predict").is_none());
        let llama = Engine::Llama.request_body("p", 128, false);
        assert_eq!(llama["n_predict"], 128);
        assert_eq!(llama["ignore_eos"], true);
        assert_eq!(
            server_args(Engine::Nx, 2, 4, 1024, &[]).join(" "),
            "--threads 2 --parallel 4 --ctx 1024"
        );
        assert_eq!(
            server_args(Engine::Llama, 2, 4, 1024, &["--no-repack".into()]).join(" "),
            "-np 4 -c 4096 -t 2 --no-repack"
        );
    }

    fn stats(tps: f64) -> LevelStats {
        LevelStats {
            clients: 2,
            parallel: 2,
            requests_ok: 16,
            tokens: 2048,
            wall_s: 2048.0 / tps,
            tok_per_s: tps,
            ttft_p50_ms: Some(120.0),
            ttft_p95_ms: Some(300.4),
            itl_p50_ms: Some(8.26),
            itl_p95_ms: Some(31.0),
            decode_tok_per_s: Some(1.5 * tps),
            peak_rss_mb: Some(320.0),
            ..LevelStats::default()
        }
    }

    fn report() -> Report {
        let mut failing = stats(50.0);
        failing.errors = 1;
        failing.error_samples = vec!["HTTP 500: boom".into()];
        Report {
            command: "cargo xtask loadtest".into(),
            date: "2026-12-01".into(),
            time_utc: "10:00".into(),
            cpu: "Some CPU".into(),
            logical_cpus: 2,
            load_average_before: "1 1 1".into(),
            load_average_after: "2 2 2".into(),
            model: "gemma.gguf".into(),
            threads: 2,
            ctx: 1024,
            requests_per_level: 16,
            max_tokens: 128,
            parallel: None,
            nx_flags: "--threads 2 --parallel N --ctx 1024".into(),
            llama_flags: Some("-np N -c N*1024 -t 2".into()),
            llama_fallback: None,
            llama_no_amx: None,
            llama_avx2: None,
            levels: vec![
                LevelRow {
                    clients: 1,
                    nx: stats(100.0),
                    llama: Some(failing),
                    llama_no_repack: false,
                    llama_other: None,
                    runs: LevelRuns::default(),
                },
                LevelRow {
                    clients: 2,
                    nx: stats(150.0),
                    llama: None,
                    llama_no_repack: false,
                    llama_other: None,
                    runs: LevelRuns::default(),
                },
            ],
            prefix_nx: PrefixStats {
                prompt_tokens: Some(430),
                miss_ttft_ms: Some(500.0),
                hit_ttft_p50_ms: Some(50.0),
                ratio: Some(10.0),
                hit_cached_tokens: Some(416.0),
                ..PrefixStats::default()
            },
            prefix_llama: Some(PrefixStats {
                hit_cached_tokens: Some(0.0),
                ..PrefixStats::default()
            }),
            wall_s: 60.0,
            sampled: false,
            reps: 1,
        }
    }

    #[test]
    fn tables_have_consistent_columns_and_ratios() {
        let r = report();
        let table = levels_table(&r);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        let cols = lines[0].matches('|').count();
        assert!(
            lines.iter().all(|l| l.matches('|').count() == cols),
            "{table}"
        );
        assert_eq!(
            lines[2],
            "| 1 | 100.0 | 50.0 | 2.00 | 150.0 | 75.0 | 2.00 | 120 / 300 ms | 120 / 300 ms \
             | 8.3 / 31 ms | 8.3 / 31 ms | 320 MB | 320 MB | 0 / 1 |"
        );
        assert!(
            lines[3].starts_with("| 2 | 150.0 | - | - | 225.0 | - | - |"),
            "{}",
            lines[3]
        );
        assert!(lines[3].ends_with("| 0 / - |"), "{}", lines[3]);
        let prefix = prefix_table(&r);
        assert!(
            prefix.contains("| nx serve | 430 | 500 ms | 50 ms | 10.00 | 416 | 0 |"),
            "{prefix}"
        );
        assert!(
            prefix.contains("| llama-server | - | - | - | - | 0 | 0 |"),
            "{prefix}"
        );
    }

    #[test]
    fn the_faster_llama_server_run_is_compared_and_both_are_listed() {
        let mut r = report();
        r.levels[1].llama = Some(stats(75.0));
        r.levels[1].llama_other = Some(stats(60.0));
        r.levels[1].llama_no_repack = true;
        let table = levels_table(&r);
        let row = table.lines().nth(3).unwrap();
        assert!(row.starts_with("| 2 | 150.0 | 75.0* | 2.00 |"), "{row}");
        let runs = llama_runs_lines(&r);
        assert!(
            runs.contains(
                "- 2 clients: repacking on 60.0 tok/s (0 errors), `--no-repack` 75.0 tok/s"
            ),
            "{runs}"
        );
        assert!(!runs.contains("- 1 clients"), "one run only at that level");
        let section = doc_section(&r);
        assert!(section.contains(&runs) && section.contains("marked * where it is"));
        r.levels[1].llama_other = None;
        assert_eq!(llama_runs_lines(&r), "");
    }

    #[test]
    fn median_run_takes_the_middle_tok_per_s_or_the_lower_middle() {
        let runs = |v: &[f64]| v.iter().map(|&t| stats(t)).collect::<Vec<_>>();
        assert_eq!(median_run(Vec::new()).map(|s| s.tok_per_s), None);
        assert_eq!(median_run(runs(&[7.0])).map(|s| s.tok_per_s), Some(7.0));
        let three = median_run(runs(&[300.0, 250.0, 367.0]));
        assert_eq!(three.map(|s| s.tok_per_s), Some(300.0));
        let four = median_run(runs(&[4.0, 1.0, 3.0, 2.0]));
        assert_eq!(four.map(|s| s.tok_per_s), Some(2.0));
    }

    #[test]
    fn every_run_is_listed_only_with_several_reps() {
        let mut r = report();
        assert_eq!(every_run_lines(&r), "");
        assert!(doc_section(&r).contains("One run, so read the ratios"));
        r.reps = 3;
        r.levels[0].runs = LevelRuns {
            nx: vec![100.0, 90.5, 110.0],
            llama: vec![50.0, 51.0, 49.0],
            llama_no_repack: vec![48.0, 47.0, 52.25],
        };
        let lines = every_run_lines(&r);
        assert!(lines.contains(
            "- 1 clients: nx 100.0, 90.5, 110.0; llama-server 50.0, 51.0, 49.0; \
             `--no-repack` 48.0, 47.0, 52.2\n"
        ));
        assert!(lines.contains("- 2 clients: nx \n"), "{lines}");
        let doc = doc_section(&r);
        assert!(doc.contains("median run (by tok/s) of 3 per level"));
        assert!(doc.contains(&lines));
    }

    #[test]
    fn doc_section_replaces_itself_and_keeps_the_rest() {
        let r = report();
        let section = doc_section(&r);
        assert!(
            section.starts_with(SECTION_BEGIN) && section.ends_with(&format!("{SECTION_END}\n"))
        );
        assert!(section.contains(&levels_table(&r)));
        assert!(section.contains("- 1 clients, llama-server: HTTP 500: boom"));
        assert!(section.contains("Some CPU"));
        assert!(section.contains("`target/loadtest/loadtest-2026-12-01-1000.json`"));
        // The fixture's llama-server prefix phase found nothing cached.
        assert!(
            section.contains("reported 0 cached prompt tokens"),
            "{section}"
        );
        let doc = "# Benchmarks\n\ntable\n";
        let once = with_loadtest_section(doc, &section, false);
        assert!(once.starts_with("# Benchmarks\n\ntable\n\n<!-- loadtest:begin"));
        // A regenerated bench table keeps the section.
        let kept = loadtest_section(&once).expect("section");
        let again = with_loadtest_section("# Benchmarks\n\nnew table\n", kept, false);
        assert_eq!(loadtest_section(&again), Some(kept));
        // Updating again replaces, never duplicates, and keeps text after the section.
        let with_tail = format!("{once}\n## Later\n");
        let twice =
            with_loadtest_section(&with_tail, &section.replace("Some CPU", "Other CPU"), false);
        assert_eq!(twice.matches(SECTION_BEGIN).count(), 1);
        assert!(twice.contains("Other CPU") && !twice.contains("Some CPU"));
        assert!(twice.ends_with("\n## Later\n"));
        assert!(twice.starts_with("# Benchmarks\n\ntable\n"));
        assert_eq!(with_loadtest_section("", &section, false), section);
        // A sampled run has its own section, beside the greedy one.
        let mut sampled = report();
        sampled.sampled = true;
        let other = doc_section(&sampled);
        assert!(other.starts_with(crate::sections::LOADTEST_SAMPLED_BEGIN));
        assert!(other.contains("`temperature: 0.8`, `top_k: 40`"), "{other}");
        assert!(other.contains("loadtest-2026-12-01-1000-sampled.json"));
        let both = with_loadtest_section(&twice, &other, true);
        assert!(both.contains(&other) && both.contains("Other CPU"));
        assert_eq!(both.matches(SECTION_BEGIN).count(), 1);
    }

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: LoadtestArgs,
    }

    #[test]
    fn flags_default_as_documented() {
        use clap::{CommandFactory, Parser};
        Cli::command().debug_assert();
        let a = Cli::try_parse_from(["loadtest"]).unwrap().args;
        assert_eq!(a.clients, [1, 2, 4, 8, 16]);
        assert_eq!(
            (
                a.requests_per_level,
                a.max_tokens,
                a.threads,
                a.ctx,
                a.parallel
            ),
            (16, 128, 2, 1024, None)
        );
        assert!(!a.no_reference && !a.write && !a.no_build);
        let a = Cli::try_parse_from([
            "loadtest",
            "--clients",
            "1,3",
            "--parallel",
            "4",
            "--no-reference",
            "--write",
        ])
        .unwrap()
        .args;
        assert_eq!((a.clients.as_slice(), a.parallel), (&[1, 3][..], Some(4)));
        assert!(a.no_reference && a.write);
        a.validate().unwrap();
    }

    #[test]
    fn args_are_checked() {
        let args = LoadtestArgs {
            clients: vec![1, 2, 4, 8, 16],
            requests_per_level: 16,
            max_tokens: 128,
            threads: 2,
            parallel: None,
            ctx: 1024,
            no_reference: false,
            write: false,
            no_build: false,
            level_timeout: 300,
            sampled: false,
            reps: 1,
        };
        args.validate().unwrap();
        assert!(LoadtestArgs {
            requests_per_level: 8,
            ..args.clone()
        }
        .validate()
        .is_err());
        assert!(LoadtestArgs {
            clients: vec![0],
            ..args.clone()
        }
        .validate()
        .is_err());
        assert!(LoadtestArgs {
            ctx: 256,
            ..args.clone()
        }
        .validate()
        .is_err());
        assert!(LoadtestArgs {
            threads: 0,
            ..args.clone()
        }
        .validate()
        .is_err());
        assert!(LoadtestArgs {
            reps: 0,
            ..args.clone()
        }
        .validate()
        .is_err());
        let three = LoadtestArgs {
            reps: 3,
            ..args.clone()
        };
        assert!(three.command_line().ends_with(" --ctx 1024 --reps 3"));
        assert_eq!(
            args.command_line(),
            "cargo xtask loadtest --clients 1,2,4,8,16 --requests-per-level 16 --max-tokens 128 \
             --threads 2 --ctx 1024"
        );
    }

    #[test]
    fn streams_over_loopback_with_chunked_and_close_delimited_bodies() {
        use std::net::TcpListener;
        for chunked in [true, false] {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            let port = listener.local_addr().unwrap().port();
            let server = std::thread::spawn(move || {
                let (mut conn, _) = listener.accept().unwrap();
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.ends_with(b"}") {
                    let n = conn.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                }
                let events = [
                    "data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
                    "data: {\"choices\":[{\"text\":\"\"}]}\n\n",
                    "data: {\"choices\":[{\"text\":\"b\"}],\"usage\":{\"completion_tokens\":2,\"prompt_tokens\":5}}\n\n",
                    "data: [DONE]\n\n",
                ];
                let te = if chunked {
                    "Transfer-Encoding: chunked\r\n"
                } else {
                    ""
                };
                conn.write_all(
                    format!("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n{te}\r\n")
                        .as_bytes(),
                )
                .unwrap();
                for e in events {
                    std::thread::sleep(Duration::from_millis(20));
                    let bytes = if chunked {
                        format!("{:x}\r\n{e}\r\n", e.len())
                    } else {
                        e.to_string()
                    };
                    conn.write_all(bytes.as_bytes()).unwrap();
                }
                if chunked {
                    conn.write_all(b"0\r\n\r\n").unwrap();
                }
                String::from_utf8(seen).unwrap()
            });
            let got = stream_post(port, "/v1/completions", &json!({"prompt": "x"})).unwrap();
            assert_eq!(got.token_times.len(), 2, "chunked {chunked}");
            assert_eq!((got.tokens(), got.prompt_tokens), (2, Some(5)));
            assert!(got.gaps().all(|g| g >= Duration::from_millis(20)));
            let seen = server.join().unwrap();
            assert!(
                seen.starts_with("POST /v1/completions HTTP/1.1\r\n"),
                "{seen}"
            );
            assert!(seen.ends_with("{\"prompt\":\"x\"}"), "{seen}");
        }
    }

    #[test]
    fn error_status_is_reported_with_its_body() {
        use std::net::TcpListener;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf).unwrap();
            conn.write_all(
                b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 10\r\n\r\nqueue full",
            )
            .unwrap();
        });
        let err = stream_post(port, "/v1/completions", &json!({})).unwrap_err();
        server.join().unwrap();
        assert_eq!(err.message, "HTTP 429: queue full");
    }
}
