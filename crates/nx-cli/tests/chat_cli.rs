//! `nx chat` end to end on the tiny random-weight model, driven through stdin: two
//! turns (the second reusing the cache), `/reset`, `/exit` and end of input, a full
//! context that keeps the program running, `nx run --chat` agreeing with the first
//! turn, and bad flags exiting 2 with one line.

mod common;

use common::nx;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::sync::OnceLock;

fn scratch_dir() -> PathBuf {
    common::scratch_dir("chat")
}

/// The tiny model, written once per test process.
fn model_path() -> &'static PathBuf {
    common::tiny_model_path("chat")
}

/// A template in the tiny vocabulary's characters: per message, a line with the role's
/// first letter, then the content and a newline; the generation prompt is `a\n`.
fn template_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let p = scratch_dir().join("plain.jinja");
        std::fs::write(
            &p,
            "{% for m in messages %}{{ m.role[0] }}\n{{ m.content }}\n{% endfor %}\
             {% if add_generation_prompt %}a\n{% endif %}",
        )
        .unwrap();
        p
    })
}

/// Runs `nx chat` on the tiny model with `args`, feeding `input` on stdin.
fn chat(args: &[&str], input: &str) -> Output {
    let mut child = nx()
        .arg("chat")
        .arg("--model")
        .arg(model_path())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // nx may exit before reading its input (a bad flag): a closed pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    child.wait_with_output().unwrap()
}

fn chat_ok(args: &[&str], input: &str) -> (String, String) {
    let out = chat(args, input);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "nx chat {args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    (stdout, stderr)
}

/// The `[prompt: …]` lines of `--verbose`: (total, reused, new) prompt tokens.
fn turn_stats(stderr: &str) -> Vec<(usize, usize, usize)> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[prompt: "))
        .map(|l| {
            let nums: Vec<usize> = l
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .take(3)
                .map(|s| s.parse().unwrap())
                .collect();
            (nums[0], nums[1], nums[2])
        })
        .collect()
}

/// Greedy, at most 5 tokens per answer, the plain template, statistics on stderr.
fn base_args() -> Vec<String> {
    vec![
        "--temp".into(),
        "0".into(),
        "-n".into(),
        "5".into(),
        "--chat-template".into(),
        template_path().to_str().unwrap().into(),
        "--verbose".into(),
    ]
}

fn args_ref(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn two_turns_then_exit_reuse_the_cache() {
    let args = base_args();
    let (stdout, stderr) = chat_ok(
        &args_ref(&args),
        "the cat sat\nthe dog ran\n/exit\nthe moon\n",
    );
    let turns = turn_stats(&stderr);
    // Two answers; the line after /exit is never read as a turn.
    assert_eq!(turns.len(), 2, "{stderr}");
    assert_eq!(
        turns[0].1, 0,
        "nothing cached before the first turn: {stderr}"
    );
    let (total1, _, _) = turns[0];
    let (total2, reused2, new2) = turns[1];
    assert_eq!(reused2 + new2, total2);
    // The whole first prompt is reused; the second turn prefills only what is new.
    assert!(reused2 >= total1, "{stderr}");
    assert!(new2 < total2, "{stderr}");
    // No `> ` prompt when stdin is not a terminal; each answer ends its line.
    assert!(!stdout.contains("> "), "{stdout:?}");
    assert!(stdout.ends_with('\n') || stdout.is_empty(), "{stdout:?}");
}

#[test]
fn end_of_input_quits_cleanly() {
    let args = base_args();
    let (_, stderr) = chat_ok(&args_ref(&args), "the cat sat\n");
    assert_eq!(turn_stats(&stderr).len(), 1, "{stderr}");
    let (_, stderr) = chat_ok(&args_ref(&args), "");
    assert_eq!(turn_stats(&stderr).len(), 0, "{stderr}");
}

#[test]
fn reset_starts_over_with_the_same_answer() {
    let args = base_args();
    let (stdout, stderr) = chat_ok(
        &args_ref(&args),
        "the cat sat\n/reset\nthe cat sat\n/bogus\n\n",
    );
    assert!(stderr.contains("[conversation reset]"), "{stderr}");
    assert!(stderr.contains("unknown command /bogus"), "{stderr}");
    let turns = turn_stats(&stderr);
    assert_eq!(turns.len(), 2, "{stderr}");
    // After the reset nothing is cached and the prompt is the first one again.
    assert_eq!(turns[1], turns[0], "{stderr}");
    assert_eq!(turns[1].1, 0);
    // Greedy: the same answer twice.
    let answers: Vec<&str> = stdout.lines().collect();
    assert_eq!(answers.len() % 2, 0, "{stdout:?}");
    let half = answers.len() / 2;
    assert_eq!(answers[..half], answers[half..], "{stdout:?}");
}

#[test]
fn first_answer_equals_nx_run_chat() {
    let args = base_args();
    let (stdout, _) = chat_ok(&args_ref(&args), "the cat sat\n");
    let out = nx()
        .arg("run")
        .arg("--model")
        .arg(model_path())
        .args(["--chat", "--chat-template"])
        .arg(template_path())
        .args(["--prompt", "the cat sat", "-n", "5", "--temp", "0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let run_text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.trim_end_matches('\n'),
        run_text.trim_end_matches('\n')
    );
}

#[test]
fn a_full_context_keeps_the_program_running() {
    // 40 positions: a few turns fit, then answers are cut and turns refused; /reset
    // makes room again.
    let args = vec![
        "--temp",
        "0",
        "--ctx",
        "40",
        "--chat-template",
        template_path().to_str().unwrap(),
        "--verbose",
    ];
    let input = "the cat sat on the mat\n".repeat(6) + "/reset\nthe cat sat on the mat\n";
    let (_, stderr) = chat_ok(&args, &input);
    assert!(stderr.contains("[context full"), "{stderr}");
    assert!(stderr.contains("/reset"), "{stderr}");
    // The turn after the reset was answered from an empty cache.
    let turns = turn_stats(&stderr);
    assert_eq!(turns.last().unwrap().1, 0, "{stderr}");
    assert!(turns.len() >= 2, "{stderr}");
}

#[test]
fn built_in_template_is_the_default() {
    // The tiny model is a plain llama without a template: ChatML is used.
    let (_, stderr) = chat_ok(&["--temp", "0", "-n", "3", "--verbose"], "the cat\n");
    assert!(
        stderr.contains("chat template: built-in chatml"),
        "{stderr}"
    );
    assert_eq!(turn_stats(&stderr).len(), 1, "{stderr}");
}

/// Exit code 2, exactly one line on stderr, no panic, and the line mentions `needle`.
fn assert_one_line_error(out: Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
    assert!(
        stderr.contains(needle),
        "stderr should mention {needle:?}: {stderr}"
    );
}

#[test]
fn bad_flags_are_one_line_errors() {
    assert_one_line_error(chat(&["--chat-template", "vicuna"], "hi\n"), "vicuna");
    assert_one_line_error(chat(&["--ctx", "0"], "hi\n"), "--ctx");
    assert_one_line_error(chat(&["-n", "0"], "hi\n"), "--n-predict");
    let bad = scratch_dir().join("bad.jinja");
    std::fs::write(&bad, "{% for m in messages %}").unwrap();
    assert_one_line_error(
        chat(&["--chat-template", bad.to_str().unwrap()], "hi\n"),
        "does not parse",
    );
}

/// Ctrl-C (SIGINT) during an answer stops that answer and the program goes on; at the
/// prompt it quits with status 130.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_the_answer_not_the_program() {
    use std::io::Read;

    // A long answer: no cap, so it runs until the 512-position context is full (about
    // a second on the tiny model) unless interrupted.
    let mut child = nx()
        .arg("chat")
        .arg("--model")
        .arg(model_path())
        .args(["--temp", "0", "--verbose", "--chat-template"])
        .arg(template_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    stdin.write_all(b"the cat sat\n").unwrap();
    stdin.flush().unwrap();
    // Wait for the answer to start streaming, then interrupt it.
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) with the id of our own child process and a valid signal number.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    // The program is still reading: a second turn is answered, then /exit.
    stdin.write_all(b"the dog ran\n/exit\n").unwrap();
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("[answer interrupted]"), "{stderr}");
    let first_turn = stderr.lines().find(|l| l.starts_with("[prompt: ")).unwrap();
    assert!(first_turn.ends_with("stop: callback]"), "{stderr}");
    let turns = turn_stats(&stderr);
    assert_eq!(turns.len(), 2, "{stderr}");
    // The interrupted answer stays in the conversation and the cache.
    assert!(turns[1].1 >= turns[0].0, "{stderr}");

    // At the prompt, Ctrl-C quits.
    let mut child = nx()
        .arg("chat")
        .arg("--model")
        .arg(model_path())
        .args(["--verbose"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    // The --verbose banner is printed once the handler is installed.
    let mut banner = [0u8; 1];
    stderr.read_exact(&mut banner).unwrap();
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) },
        0
    );
    let status = child.wait().unwrap();
    drop(stdin);
    assert_eq!(status.code(), Some(130), "{status:?}");
}
