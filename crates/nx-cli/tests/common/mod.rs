//! Shared helpers of the `nx` end-to-end tests: the binary, a per-process scratch
//! directory and the tiny random-weight model written into it once.

#![allow(dead_code)]

// The tiny model builder is shared with nx-run's tests.
#[path = "../../../nx-run/tests/common/tiny_model.rs"]
pub mod tiny_model;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The `nx` binary under test.
pub fn nx() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nx"))
}

/// A scratch directory for this test process (`label` keeps test binaries apart).
pub fn scratch_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nx-cli-{label}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The tiny model, written once per test process into `scratch_dir(label)`.
pub fn tiny_model_path(label: &str) -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let p = scratch_dir(label).join("tiny.gguf");
        std::fs::write(
            &p,
            tiny_model::tiny_gguf(tiny_model::TinyOptions::default()),
        )
        .unwrap();
        p
    })
}
