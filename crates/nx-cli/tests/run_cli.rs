//! `nx run` and `nx bench` end to end on a tiny random-weight model written to a temp
//! dir: token-id prompts, JSON lines that parse and agree with each other, text prompts
//! from a flag and from stdin, and bad input (flags, model, context) exiting 2 with one
//! line.

mod common;

use common::{nx, tiny_model};

use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

use serde_json::Value;

fn scratch_dir() -> PathBuf {
    common::scratch_dir("run")
}

/// The tiny model, written once per test process.
fn model_path() -> &'static PathBuf {
    common::tiny_model_path("run")
}

fn run_ok(args: &[&str]) -> (String, String) {
    command_ok("run", args)
}

/// `nx <command> --model <tiny model> <args>`, which must succeed: its stdout and stderr.
fn command_ok(command: &str, args: &[&str]) -> (String, String) {
    let out = nx()
        .arg(command)
        .arg("--model")
        .arg(model_path())
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "nx {command} {args:?}: {stderr}");
    (stdout, stderr)
}

/// Exit code 2, exactly one line on stderr, no panic, and the line mentions `needle`.
fn assert_one_line_error(out: std::process::Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    assert!(
        stderr.contains(needle),
        "stderr should mention {needle:?}: {stderr}"
    );
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

#[test]
fn prompt_ids_with_json_lines() {
    let (stdout, _) = run_ok(&[
        "--prompt-ids",
        "10,11,12,13",
        "-n",
        "6",
        "--temp",
        "0",
        "--json",
        "--logprobs",
        "3",
    ]);
    let lines = json_lines(&stdout);
    let (last, tokens) = lines.split_last().unwrap();
    let stop = last["stop"].as_str().unwrap();
    assert!(stop == "max_tokens" || stop == "eos", "{last}");
    assert_eq!(
        last["generated_tokens"].as_u64().unwrap() as usize,
        tokens.len()
    );
    assert_eq!(last["prompt_tokens"], 4);
    for key in [
        "prompt_tps",
        "gen_tps",
        "ttft_ms",
        "prefill_secs",
        "decode_secs",
    ] {
        assert!(last[key].as_f64().unwrap() >= 0.0, "{key}: {last}");
    }
    if stop == "max_tokens" {
        assert_eq!(tokens.len(), 6);
    }
    let n_vocab = tiny_model::n_vocab() as u64;
    for t in tokens {
        let id = t["id"].as_u64().unwrap();
        assert!(id < n_vocab);
        assert!(t["text"].is_string());
        let lp = t["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        let top = t["top"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["id"].as_u64().unwrap(), id);
        assert!((top[0]["logprob"].as_f64().unwrap() - lp).abs() < 1e-6);
    }

    // Without --logprobs the alternatives are empty; the tokens are the same.
    let (stdout, _) = run_ok(&[
        "--prompt-ids",
        "10,11,12,13",
        "-n",
        "6",
        "--temp",
        "0",
        "--json",
    ]);
    let again = json_lines(&stdout);
    assert_eq!(again.len(), lines.len());
    for (a, b) in again.iter().zip(&lines).take(tokens.len()) {
        assert_eq!(a["id"], b["id"]);
        assert_eq!(a["top"].as_array().unwrap().len(), 0);
    }

    // Plain output is the concatenated token texts, and speeds go to stderr.
    let (text, stderr) = run_ok(&["--prompt-ids", "10,11,12,13", "-n", "6", "--temp", "0"]);
    let joined: String = lines.iter().map(|l| l["text"].as_str().unwrap()).collect();
    assert_eq!(text, joined);
    assert!(stderr.contains("tok/s"), "{stderr}");
}

#[test]
fn seeded_sampling_is_reproducible_from_the_command_line() {
    let args = [
        "--prompt-ids",
        "20,21,22",
        "-n",
        "10",
        "--temp",
        "1.0",
        "--seed",
        "7",
        "--json",
    ];
    let a = run_ok(&args).0;
    let b = run_ok(&args).0;
    let ids = |s: &str| -> Vec<Value> { json_lines(s).iter().map(|l| l["id"].clone()).collect() };
    assert_eq!(ids(&a), ids(&b));
    let chunked = run_ok(&[&args[..], &["--prefill-chunk", "1"]].concat()).0;
    assert_eq!(ids(&chunked), ids(&a));
    // Weights mapped instead of resident: every token line (id, text, log-prob) the same.
    let mapped = run_ok(&[&args[..], &["--mmap"]].concat()).0;
    let token_lines = |s: &str| -> Vec<Value> {
        let lines = json_lines(s);
        lines[..lines.len() - 1].to_vec()
    };
    assert_eq!(token_lines(&mapped), token_lines(&a));
}

#[test]
fn text_prompt_from_flag_and_from_stdin_agree() {
    let (from_flag, _) = run_ok(&[
        "--prompt",
        "the cat sat",
        "-n",
        "5",
        "--temp",
        "0",
        "--json",
    ]);
    let mut child = nx()
        .arg("run")
        .arg("--model")
        .arg(model_path())
        .args(["-f", "-", "-n", "5", "--temp", "0", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"the cat sat")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let from_stdin = String::from_utf8(out.stdout).unwrap();
    let strip = |s: &str| -> Vec<Value> {
        json_lines(s)
            .into_iter()
            .map(|mut v| {
                // Timings differ between runs.
                if let Some(o) = v.as_object_mut() {
                    o.retain(|k, _| {
                        !k.ends_with("_tps") && !k.ends_with("_secs") && k != "ttft_ms"
                    });
                }
                v
            })
            .collect()
    };
    assert_eq!(strip(&from_flag), strip(&from_stdin));
    // BOS was added: the prompt is longer than without it.
    let last = |s: &str| json_lines(s).pop().unwrap();
    let (no_bos, _) = run_ok(&[
        "--prompt",
        "the cat sat",
        "-n",
        "5",
        "--temp",
        "0",
        "--json",
        "--no-special",
    ]);
    assert_eq!(
        last(&from_flag)["prompt_tokens"].as_u64().unwrap(),
        last(&no_bos)["prompt_tokens"].as_u64().unwrap() + 1
    );
}

#[test]
fn bad_sampling_flags_exit_2_with_one_line() {
    let base = |extra: &[&str]| {
        nx().arg("run")
            .arg("--model")
            .arg(model_path())
            .args(["--prompt-ids", "10,11"])
            .args(extra)
            .output()
            .unwrap()
    };
    assert_one_line_error(base(&["--temp", "-1"]), "temperature");
    assert_one_line_error(base(&["--top-p", "1.5"]), "top_p");
    assert_one_line_error(base(&["--min-p", "2"]), "min_p");
    assert_one_line_error(base(&["--prefill-chunk", "0"]), "prefill-chunk");
    assert_one_line_error(base(&["--stop", ""]), "stop string");
    // Flags clap refuses get one line too.
    assert_one_line_error(base(&["--logit-bias", "5"]), "--logit-bias");
    assert_one_line_error(base(&["--logit-bias", "5+x"]), "--logit-bias");
    assert_one_line_error(base(&["-n", "abc"]), "--n-predict");
    assert_one_line_error(base(&["--no-such-flag"]), "--no-such-flag");
    let past = format!("{}-1", tiny_model::n_vocab());
    assert_one_line_error(base(&["--logit-bias", &past]), "logit bias token id");
}

/// `--logit-bias ID-100` bans the token greedy decoding chose first (and the answer
/// changes); a positive bias makes a token the greedy choice; the flag repeats.
#[test]
fn logit_bias_flags_ban_and_favour_tokens() {
    let ids = |extra: &[&str]| -> Vec<u64> {
        let args = [
            &[
                "--prompt-ids",
                "10,11,12,13",
                "-n",
                "6",
                "--temp",
                "0",
                "--json",
            ],
            extra,
        ]
        .concat();
        let lines = json_lines(&run_ok(&args).0);
        lines[..lines.len() - 1]
            .iter()
            .map(|l| l["id"].as_u64().unwrap())
            .collect()
    };
    let plain = ids(&[]);
    let ban = format!("{}-100", plain[0]);
    let banned = ids(&["--logit-bias", &ban]);
    assert!(!banned.contains(&plain[0]), "{plain:?} -> {banned:?}");
    let favoured = ids(&["-l", &ban, "-l", "3+100"]);
    assert!(favoured.iter().all(|&id| id == 3), "{favoured:?}");
}

#[test]
fn bad_prompts_exit_2_with_one_line() {
    let run = |args: &[&str]| {
        nx().arg("run")
            .arg("--model")
            .arg(model_path())
            .args(args)
            .output()
            .unwrap()
    };
    assert_one_line_error(run(&["--prompt-ids", "10,x"]), "\"x\"");
    let too_big = tiny_model::n_vocab().to_string();
    assert_one_line_error(run(&["--prompt-ids", &too_big]), &too_big);
    assert_one_line_error(run(&["--prompt-ids", ""]), "empty");
    assert_one_line_error(run(&["-n", "3"]), "no prompt");
    // 5 prompt tokens + 5 to generate do not fit in 8 positions.
    assert_one_line_error(
        run(&["--prompt-ids", "10,11,12,13,14", "-n", "5", "--ctx", "8"]),
        "context of 8",
    );
}

#[test]
fn missing_model_exits_2_with_one_line() {
    let out = nx()
        .args([
            "run",
            "--model",
            "/nonexistent/nx-model.gguf",
            "--prompt",
            "hi",
        ])
        .output()
        .unwrap();
    assert_one_line_error(out, "/nonexistent/nx-model.gguf");

    // No --model and no fetched default model.
    let empty_cache = scratch_dir().join("empty-cache");
    std::fs::create_dir_all(&empty_cache).unwrap();
    let out = nx()
        .args(["run", "--prompt", "hi"])
        .env("NX_CACHE", &empty_cache)
        .output()
        .unwrap();
    assert_one_line_error(out, "run `cargo xtask fetch`");
    let out = nx()
        .args(["bench", "-p", "4", "-n", "2"])
        .env("NX_CACHE", &empty_cache)
        .output()
        .unwrap();
    assert_one_line_error(out, "default model is not fetched");
}

#[test]
fn default_model_is_used_when_fetched() {
    let cache = scratch_dir().join("cache-with-model");
    std::fs::create_dir_all(cache.join("models")).unwrap();
    std::fs::copy(model_path(), cache.join("models/gemma-3-270m-q4_k_m.gguf")).unwrap();
    let out = nx()
        .args(["run", "--prompt-ids", "10,11", "-n", "2", "--json"])
        .env("NX_CACHE", &cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(json_lines(&String::from_utf8(out.stdout).unwrap()).len() >= 2);
}

#[test]
fn stop_string_ends_the_output() {
    let (full, _) = run_ok(&["--prompt-ids", "10,11,12", "-n", "12", "--temp", "0"]);
    // Stop at the third character of the output (if it has one).
    let Some((i, c)) = full.char_indices().nth(2) else {
        return;
    };
    let stop = c.to_string();
    let expected = &full[..full.find(&stop).unwrap()];
    assert!(expected.len() <= i);
    let (out, stderr) = run_ok(&[
        "--prompt-ids",
        "10,11,12",
        "-n",
        "12",
        "--temp",
        "0",
        "--stop",
        &stop,
    ]);
    assert_eq!(out, expected);
    assert!(stderr.contains("stop: stop_string"), "{stderr}");
}

#[test]
fn bench_parallel_reports_each_level_and_its_ratio_to_the_first() {
    let parallel = ["--parallel", "1,3", "--reps", "2", "--json", "-t", "1"];
    let args = [&["-p", "8", "-n", "4", "--no-probe"][..], &parallel[..]].concat();
    let (stdout, stderr) = command_ok("bench", &args);
    // The levels take turns: round 1 runs both, then round 2.
    let order: Vec<&str> = stderr.lines().filter(|l| l.contains(", round ")).collect();
    assert_eq!(order.len(), 4, "{stderr}");
    assert!(order[1].contains("3 sequences, round 1") && order[2].contains("1 sequences, round 2"));
    let v: Value = serde_json::from_str(&stdout).unwrap();
    let levels = v["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2, "{v}");
    assert_eq!(
        (levels[0]["n_seqs"].as_u64(), levels[1]["n_seqs"].as_u64()),
        (Some(1), Some(3))
    );
    assert_eq!(levels[0]["tg_vs_first"], 1.0, "{v}");
    for level in levels {
        for key in ["pp_tps", "tg_tps", "total_tps", "tg_vs_first"] {
            assert!(level[key].as_f64().unwrap() > 0.0, "{key}: {v}");
        }
    }
}

#[test]
fn bench_json_reports_every_field() {
    let args = [
        "-p",
        "16",
        "-n",
        "4",
        "--reps",
        "2",
        "--json",
        "-t",
        "1",
        "--no-probe",
    ];
    let (stdout, _) = command_ok("bench", &args);
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["pp_tokens"], 16);
    assert_eq!(v["tg_tokens"], 4);
    assert_eq!(v["reps"], 2);
    assert_eq!(v["threads"], 1);
    for key in ["pp_tps", "tg_tps", "ttft_ms", "peak_rss_mb"] {
        assert!(v[key].as_f64().unwrap() > 0.0, "{key}: {v}");
    }
    assert!(v["model"].as_str().unwrap().ends_with("tiny.gguf"));
    assert!(v["decode_bytes_per_token"].as_u64().unwrap() > 0, "{v}");
    assert!(v["decode_gbs"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["read_gbs"].is_null(), "--no-probe: {v}");
    assert!(v["kernel_plan"].is_string(), "{v}");
    // Resident where huge pages are on, else mapped: either is a name, with the time.
    assert!(
        ["resident", "mapped"].contains(&v["weights"].as_str().unwrap()),
        "{v}"
    );
    assert!(v["open_s"].as_f64().unwrap() >= 0.0, "{v}");
    assert_eq!(
        v["warmup"], true,
        "llama-bench's warm-up runs by default: {v}"
    );

    let args = ["-p", "8", "-n", "2", "--reps", "1", "--no-warmup", "--mmap"];
    let (table, _) = command_ok("bench", &args);
    assert!(table.contains("pp8") && table.contains("tg2"), "{table}");
    assert!(table.contains("warm-up: no"), "{table}");
    assert!(table.contains("weights: mapped"), "--mmap: {table}");
    assert!(table.contains("MB per token"), "{table}");
    assert!(table.contains("plain read (1024 MiB)"), "{table}");
}

#[test]
fn kernel_plan_is_timed_once_cached_and_forced_by_nx_plan() {
    let cache = scratch_dir().join("cache-plans");
    let _ = std::fs::remove_dir_all(&cache);
    let show = |plan: &str| {
        nx().arg("bench")
            .arg("--model")
            .arg(model_path())
            .args(["-p", "0", "-n", "0", "--show-plan", "--threads", "1"])
            .env("NX_CACHE", &cache)
            .env("NX_PLAN", plan)
            .output()
            .unwrap()
    };
    let stdout = |out: &std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout.clone()).unwrap()
    };
    // First open: timed, with every candidate listed, and written to the cache.
    let first = stdout(&show(""));
    assert!(first.contains("timed in"), "{first}");
    assert!(first.contains("timings (best of 3)"), "{first}");
    let files: Vec<_> = std::fs::read_dir(cache.join("plans")).unwrap().collect();
    assert_eq!(files.len(), 1, "{first}");
    // Second open: read back.
    let second = stdout(&show(""));
    assert!(second.contains("cached in"), "{second}");
    let lines = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.contains(" decode ") && l.contains(" prefill "))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(lines(&first), lines(&second));
    // Forced: the scalar kernels everywhere, no timing.
    let forced = stdout(&show("default,*.decode=scalar,*.prefill=per-token"));
    assert!(forced.contains("default rules"), "{forced}");
    for l in lines(&forced) {
        assert!(
            l.contains("decode scalar") && l.ends_with("prefill per-token"),
            "{l}"
        );
    }
    // A bad item is one line naming it.
    let out = show("q8_0.decode=avx7");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("q8_0.decode=avx7"), "{err}");
}
