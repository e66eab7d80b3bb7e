//! `cargo xtask demo ["PROMPT"]`: fetch the default model and show what nx makes of it.
//!
//! For now it runs `nx inspect` on the model; text generation from PROMPT comes later.

use crate::fetch::ensure_model;
use crate::util::{cargo_command, display_command, run_checked};
use anyhow::Result;

/// Entry point of `cargo xtask demo`.
pub fn run(prompt: Option<&str>) -> Result<()> {
    let model = ensure_model()?;
    if let Some(prompt) = prompt {
        eprintln!("demo: text generation is not wired up yet; ignoring prompt {prompt:?}");
    }
    let mut cmd = cargo_command();
    cmd.args([
        "run",
        "--release",
        "-p",
        "nx-cli",
        "--bin",
        "nx",
        "--",
        "inspect",
    ])
    .arg(&model);
    eprintln!("$ {}", display_command(&cmd));
    run_checked(&mut cmd)
}
