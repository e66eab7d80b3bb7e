//! Small shared helpers: running commands with clear errors, paths, byte and time formatting.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

/// The workspace root (the directory holding the top-level `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    // xtask lives one level below the root; this is fixed at compile time, so it works
    // from any current directory.
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| manifest_dir.to_path_buf())
}

/// The cargo that launched us (`$CARGO` under `cargo run`), else `cargo` from `PATH`.
pub fn cargo_program() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"))
}

/// A `cargo` command with the workspace root as its current directory.
pub fn cargo_command() -> Command {
    let mut cmd = Command::new(cargo_program());
    cmd.current_dir(workspace_root());
    cmd
}

/// The command line as a person would type it (for messages).
pub fn display_command(cmd: &Command) -> String {
    // `$CARGO` is an absolute toolchain path; people type `cargo`.
    let program = cmd.get_program();
    let mut text = if program == cargo_program() {
        "cargo".to_string()
    } else {
        program.to_string_lossy().into_owned()
    };
    for arg in cmd.get_args() {
        text.push(' ');
        let arg = arg.to_string_lossy();
        if arg.is_empty() || arg.contains(char::is_whitespace) {
            text.push_str(&format!("'{arg}'"));
        } else {
            text.push_str(&arg);
        }
    }
    text
}

/// Spawns `cmd` with inherited stdio and waits; a missing program is reported by name.
pub fn run_status(cmd: &mut Command) -> Result<ExitStatus> {
    match cmd.status() {
        Ok(status) => Ok(status),
        Err(err) if err.kind() == ErrorKind::NotFound => bail!(
            "`{}` not found on PATH (while running `{}`)",
            cmd.get_program().to_string_lossy(),
            display_command(cmd)
        ),
        Err(err) => Err(err).with_context(|| format!("could not run `{}`", display_command(cmd))),
    }
}

/// Runs `cmd` with inherited stdio and fails unless it exits with status 0.
pub fn run_checked(cmd: &mut Command) -> Result<()> {
    let status = run_status(cmd)?;
    if !status.success() {
        bail!("`{}` failed ({status})", display_command(cmd));
    }
    Ok(())
}

/// `cargo metadata --format-version 1 --no-deps` of this workspace, parsed.
pub fn cargo_metadata() -> Result<serde_json::Value> {
    let mut cmd = cargo_command();
    cmd.args(["metadata", "--format-version", "1", "--no-deps"]);
    let out = cmd
        .output()
        .with_context(|| format!("could not run `{}`", display_command(&cmd)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            display_command(&cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).context("cargo metadata printed invalid JSON")
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        text.push(DIGITS[usize::from(b >> 4)] as char);
        text.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    text
}

/// `123456789 bytes = 117.7 MiB`: exact for checking, rounded for reading.
pub fn bytes_text(n: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if n < 1024 * 1024 {
        format!("{n} bytes")
    } else {
        format!("{n} bytes = {:.1} MiB", n as f64 / MIB)
    }
}

/// `0.4 s`, `12.3 s`, `3 min 05 s`.
pub fn duration_text(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 100.0 {
        format!("{secs:.1} s")
    } else {
        let whole = d.as_secs();
        format!("{} min {:02} s", whole / 60, whole % 60)
    }
}

/// A name unique to this process and call, for temporary files next to their targets.
pub fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}-{n}", std::process::id())
}

/// A scratch directory under the system temp dir, removed on drop (tests only).
#[cfg(test)]
pub struct TestDir(PathBuf);

#[cfg(test)]
impl TestDir {
    pub fn new(label: &str) -> TestDir {
        let dir = std::env::temp_dir().join(format!("nx-xtask-{label}-{}", unique_suffix()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create test dir");
        TestDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

#[cfg(test)]
impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> anyhow::Result<u16> {
    use anyhow::Context;
    let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .context("cannot bind a loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// The last few KiB of a log file, for error messages.
pub fn log_tail(path: &std::path::Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::from("(no log)");
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(4096)));
    let mut text = Vec::new();
    let _ = file.read_to_end(&mut text);
    String::from_utf8_lossy(&text).into_owned()
}

/// The part of `doc` from the line `begin` through the line `end` (with its newline), if
/// both markers are there in that order: a generated section of a document.
pub fn doc_section<'a>(doc: &'a str, begin: &str, end: &str) -> Option<&'a str> {
    let from = doc.find(begin)?;
    let end_at = doc[from..].find(end)? + from;
    let mut to = end_at + end.len();
    if doc[to..].starts_with('\n') {
        to += 1;
    }
    Some(&doc[from..to])
}

/// The markers of every marked section of `doc`, in order: each line that opens with
/// `<!-- KEY:begin` (the rest of the line included) and the `<!-- KEY:end -->` it needs.
pub fn doc_section_markers(doc: &str) -> Vec<(String, String)> {
    doc.lines()
        .filter_map(|line| {
            let key = line.strip_prefix("<!-- ")?.split_once(":begin")?.0;
            let valid = !key.is_empty() && !key.contains(char::is_whitespace);
            valid.then(|| (line.to_string(), format!("<!-- {key}:end -->")))
        })
        .collect()
}

/// `doc` with its section between `begin` and `end` replaced by `section` (which carries
/// the markers), or `section` appended when `doc` has none.
pub fn replace_doc_section(doc: &str, begin: &str, end: &str, section: &str) -> String {
    if let Some(old) = doc_section(doc, begin, end) {
        let from = doc.find(old).unwrap_or(0);
        return format!("{}{section}{}", &doc[..from], &doc[from + old.len()..]);
    }
    let mut out = doc.trim_end().to_string();
    if !out.is_empty() {
        out.push_str("\n\n");
    }
    out.push_str(section);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_markers_are_found_in_order_with_their_ends() {
        let doc = "# Title\n<!-- a:begin (x) -->\nA\n<!-- a:end -->\ntext <!-- no:begin -->\n\
                   <!-- bench-avx2-threads1:begin -->\nB\n<!-- bench-avx2-threads1:end -->\n\
                   <!-- a comment:begin -->\n";
        assert_eq!(
            doc_section_markers(doc),
            [
                (
                    "<!-- a:begin (x) -->".to_string(),
                    "<!-- a:end -->".to_string()
                ),
                (
                    "<!-- bench-avx2-threads1:begin -->".to_string(),
                    "<!-- bench-avx2-threads1:end -->".to_string()
                ),
            ]
        );
    }

    #[test]
    fn hex_matches_known_bytes() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn bytes_text_is_exact_and_readable() {
        assert_eq!(bytes_text(512), "512 bytes");
        assert_eq!(bytes_text(253_113_024), "253113024 bytes = 241.4 MiB");
    }

    #[test]
    fn duration_text_switches_to_minutes() {
        assert_eq!(duration_text(Duration::from_millis(400)), "0.4 s");
        assert_eq!(duration_text(Duration::from_secs(185)), "3 min 05 s");
    }

    #[test]
    fn missing_program_is_named() {
        let err = run_status(&mut Command::new("nx-definitely-not-a-program")).unwrap_err();
        assert!(
            err.to_string().contains("nx-definitely-not-a-program"),
            "{err}"
        );
        assert!(err.to_string().contains("not found"), "{err}");
    }

    #[test]
    fn workspace_root_holds_the_workspace_manifest() {
        let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
        assert!(manifest.contains("[workspace]"));
    }
}
