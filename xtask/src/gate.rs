//! `cargo xtask gate`: fmt, clippy, the API docs (no rustdoc warnings), fetch, the
//! workspace tests, every named gate, then the quick Miri subset.
//!
//! Every step runs even after an earlier one failed, so one run shows all problems. Each
//! step prints a header, then PASS/FAIL with its duration; the run ends with a recap and
//! exactly one line `N passed, N failed` on stdout, and the process exits non-zero when
//! anything failed.

use crate::gates::{Gate, GATES};
use crate::util::{cargo_command, display_command, duration_text, run_status};
use anyhow::{bail, Result};
use std::process::Command;
use std::time::{Duration, Instant};

/// What one step does.
#[derive(Debug, Clone)]
pub enum StepKind {
    /// `cargo ARGS` in the workspace root.
    Cargo(Vec<&'static str>),
    /// `cargo xtask fetch` then `cargo xtask synth`, in process.
    Fetch,
    /// A named gate from [`GATES`].
    Named(Gate),
    /// `cargo xtask miri --quick`, in process.
    Miri,
}

/// One step of the gate.
#[derive(Debug, Clone)]
pub struct Step {
    /// Name shown in reports and accepted by `--only`.
    pub name: String,
    /// What it runs.
    pub kind: StepKind,
}

/// All steps, in the order they run.
pub fn all_steps() -> Vec<Step> {
    let cargo = |name: &str, args: &[&'static str]| Step {
        name: name.to_string(),
        kind: StepKind::Cargo(args.to_vec()),
    };
    let mut steps = vec![
        cargo("fmt", &["fmt", "--all", "--", "--check"]),
        cargo(
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        ),
        // Broken or private intra-doc links fail here rather than rot unseen.
        cargo(
            "doc",
            &[
                "--config",
                "build.rustdocflags=[\"-D\", \"warnings\"]",
                "doc",
                "--workspace",
                "--no-deps",
            ],
        ),
        Step {
            name: "fetch".to_string(),
            kind: StepKind::Fetch,
        },
        cargo("test", &["test", "--workspace", "--release"]),
    ];
    steps.extend(GATES.iter().map(|gate| Step {
        name: gate.name.to_string(),
        kind: StepKind::Named(*gate),
    }));
    steps.push(Step {
        name: "miri".to_string(),
        kind: StepKind::Miri,
    });
    steps
}

/// The steps to run: all of them, or the one named by `only` (case-insensitive).
pub fn select_steps(steps: Vec<Step>, only: Option<&str>) -> Result<Vec<Step>> {
    let Some(only) = only else { return Ok(steps) };
    let names: Vec<String> = steps.iter().map(|s| s.name.clone()).collect();
    match steps
        .into_iter()
        .find(|s| s.name.eq_ignore_ascii_case(only))
    {
        Some(step) => Ok(vec![step]),
        None => bail!(
            "no gate step named {only:?}; steps are: {}",
            names.join(", ")
        ),
    }
}

/// The command a cargo or named-gate step runs (`None` for in-process steps).
pub fn step_command(step: &Step) -> Option<Command> {
    match &step.kind {
        StepKind::Cargo(args) => {
            let mut cmd = cargo_command();
            cmd.args(args);
            Some(cmd)
        }
        StepKind::Named(gate) => {
            let mut cmd = cargo_command();
            cmd.args(["test", "--release", "-p", gate.package, "--test", gate.test])
                .args(["--", "--include-ignored"]);
            cmd.envs(gate.env.iter().copied());
            Some(cmd)
        }
        StepKind::Fetch | StepKind::Miri => None,
    }
}

fn execute(step: &Step) -> Result<()> {
    match &step.kind {
        // The fixture models are derived from fetched vocabularies; the gates need both.
        StepKind::Fetch => {
            crate::fetch::run(crate::fetch::FetchArgs::default())?;
            crate::synth::run(&crate::synth::SynthArgs::default())
        }
        StepKind::Miri => crate::miri::run_all(crate::miri::QUICK, crate::miri::QUICK_FLAGS),
        _ => {
            let mut cmd = step_command(step).expect("cargo steps have a command");
            let env_text: String = cmd
                .get_envs()
                .filter_map(|(k, v)| Some(format!("{}={} ", k.to_str()?, v?.to_str()?)))
                .collect();
            eprintln!("$ {env_text}{}", display_command(&cmd));
            let status = run_status(&mut cmd)?;
            if !status.success() {
                bail!("exited with {status}");
            }
            Ok(())
        }
    }
}

/// How one step ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub name: String,
    pub passed: bool,
    pub duration: Duration,
}

/// Runs every step with `exec`, printing headers and results, and never stopping early.
pub fn run_steps(steps: &[Step], mut exec: impl FnMut(&Step) -> Result<()>) -> Vec<Outcome> {
    let total = steps.len();
    let mut outcomes = Vec::with_capacity(total);
    for (index, step) in steps.iter().enumerate() {
        eprintln!();
        eprintln!("==> gate [{}/{total}] {}", index + 1, step.name);
        let started = Instant::now();
        let result = exec(step);
        let duration = started.elapsed();
        let passed = match result {
            Ok(()) => true,
            Err(err) => {
                eprintln!("{}: {err:#}", step.name);
                false
            }
        };
        eprintln!(
            "<== {} {} ({})",
            if passed { "PASS" } else { "FAIL" },
            step.name,
            duration_text(duration)
        );
        outcomes.push(Outcome {
            name: step.name.clone(),
            passed,
            duration,
        });
    }
    outcomes
}

/// The final line: `N passed, N failed`.
pub fn summary_line(outcomes: &[Outcome]) -> String {
    let passed = outcomes.iter().filter(|o| o.passed).count();
    format!("{passed} passed, {} failed", outcomes.len() - passed)
}

/// Entry point of `cargo xtask gate`; returns the process exit code.
pub fn run(only: Option<&str>, list: bool) -> Result<i32> {
    let steps = select_steps(all_steps(), only)?;
    if list {
        for step in &steps {
            match step_command(step) {
                Some(cmd) => println!("{:<20} {}", step.name, display_command(&cmd)),
                None => {
                    let what = match step.kind {
                        StepKind::Miri => "cargo xtask miri --quick",
                        _ => "cargo xtask fetch && cargo xtask synth",
                    };
                    println!("{:<20} (in process) {what}", step.name)
                }
            }
        }
        return Ok(0);
    }
    let started = Instant::now();
    let outcomes = run_steps(&steps, execute);
    eprintln!();
    eprintln!("gate recap ({} total):", duration_text(started.elapsed()));
    for outcome in &outcomes {
        eprintln!(
            "  {}  {:<20} {}",
            if outcome.passed { "PASS" } else { "FAIL" },
            outcome.name,
            duration_text(outcome.duration)
        );
    }
    println!("{}", summary_line(&outcomes));
    Ok(if outcomes.iter().all(|o| o.passed) {
        0
    } else {
        1
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_run_in_the_documented_order() {
        let names: Vec<String> = all_steps().into_iter().map(|s| s.name).collect();
        assert_eq!(names[..5], ["fmt", "clippy", "doc", "fetch", "test"]);
        let gate_names: Vec<&str> = GATES.iter().map(|g| g.name).collect();
        assert_eq!(names[5..names.len() - 1], gate_names);
        assert_eq!(names.last().map(String::as_str), Some("miri"));
    }

    #[test]
    fn only_selects_one_step_and_rejects_unknown_names() {
        let picked = select_steps(all_steps(), Some("CLIPPY")).unwrap();
        assert_eq!(picked.len(), 1);
        assert_eq!(picked[0].name, "clippy");
        let err = select_steps(all_steps(), Some("nope"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"nope\"") && err.contains("fmt, clippy, doc, fetch, test"),
            "{err}"
        );
    }

    #[test]
    fn named_gate_command_runs_ignored_tests_in_release_with_env() {
        let step = Step {
            name: "DEMO".into(),
            kind: StepKind::Named(Gate::new("DEMO", "nx-bpe", "gold").with_env(&[("K", "v")])),
        };
        let cmd = step_command(&step).unwrap();
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "test",
                "--release",
                "-p",
                "nx-bpe",
                "--test",
                "gold",
                "--",
                "--include-ignored"
            ]
        );
        let envs: Vec<_> = cmd.get_envs().collect();
        assert_eq!(envs.len(), 1);
        assert_eq!(envs[0].0, "K");
        assert_eq!(envs[0].1.unwrap(), "v");
    }

    #[test]
    fn failures_do_not_stop_the_run_and_are_counted() {
        let steps: Vec<Step> = ["a", "b", "c"]
            .iter()
            .map(|n| Step {
                name: n.to_string(),
                kind: StepKind::Fetch,
            })
            .collect();
        let mut seen = Vec::new();
        let outcomes = run_steps(&steps, |step| {
            seen.push(step.name.clone());
            if step.name == "b" {
                bail!("broken on purpose")
            }
            Ok(())
        });
        assert_eq!(seen, ["a", "b", "c"]);
        let passed: Vec<bool> = outcomes.iter().map(|o| o.passed).collect();
        assert_eq!(passed, [true, false, true]);
        assert_eq!(summary_line(&outcomes), "2 passed, 1 failed");
    }
}
