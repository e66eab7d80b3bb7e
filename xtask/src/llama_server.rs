//! A `llama-server` child process on loopback, started for recording goldens and killed
//! when dropped.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::http;
use crate::reference::llama_bin;
use crate::util::{free_port, log_tail};

/// How long a server may take to load its model.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);

/// A running `llama-server` on 127.0.0.1; killed when dropped (also on errors).
pub struct LlamaServer {
    child: Child,
    /// The loopback port it listens on.
    pub port: u16,
}

impl LlamaServer {
    /// Starts `llama-server -m model --host 127.0.0.1 --port P ARGS`, logging to `log_path`,
    /// and waits until `/health` answers. `label` prefixes progress lines.
    pub fn start(label: &str, model: &Path, args: &[&str], log_path: &Path) -> Result<Self> {
        let bin = llama_bin("llama-server");
        if !bin.is_file() {
            bail!("{} is missing; run `cargo xtask reference`", bin.display());
        }
        // A port taken between our probe and the server's bind makes the server exit;
        // try a few fresh ports before giving up.
        let mut last_err = None;
        for _attempt in 0..3 {
            let port = free_port()?;
            match Self::start_on(label, &bin, model, args, port, log_path) {
                Ok(server) => return Ok(server),
                Err(err) => {
                    eprintln!("{label}: llama-server on port {port}: {err:#}");
                    last_err = Some(err);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow!("llama-server did not start")))
    }

    fn start_on(
        label: &str,
        bin: &Path,
        model: &Path,
        args: &[&str],
        port: u16,
        log_path: &Path,
    ) -> Result<Self> {
        let log = fs::File::create(log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        let child = Command::new(bin)
            .arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let mut server = LlamaServer { child, port };
        let started = Instant::now();
        loop {
            if let Some(status) = server.child.try_wait()? {
                bail!(
                    "exited ({status}) while loading; log:\n{}",
                    log_tail(log_path)
                );
            }
            match http::get(port, "/health", Duration::from_secs(5)) {
                Ok(r) if r.status == 200 => break,
                Ok(r) if r.status == 503 => {} // still loading
                Ok(r) => bail!("/health answered HTTP {}", r.status),
                Err(_) => {} // not listening yet
            }
            if started.elapsed() > STARTUP_TIMEOUT {
                bail!(
                    "not healthy after {STARTUP_TIMEOUT:?}; log:\n{}",
                    log_tail(log_path)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "{label}: llama-server ready on 127.0.0.1:{port} in {:.1} s (log {})",
            started.elapsed().as_secs_f64(),
            log_path.display()
        );
        Ok(server)
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        // Only the child we started, by its handle.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
