//! Real Kafka-compatible brokers for end-to-end tests: [`TansuServer`]
//! runs `tansu` (a Kafka-compatible broker from crates.io) on a free
//! loopback port, with its data in SQLite in its own temporary directory
//! (so it survives a restart), accepts connections before it is handed
//! out, and is killed on drop, even when the test panicked.
//!
//! Apache Kafka's own jars cannot be had here; tansu speaks the protocol
//! (consumer groups, the idempotent producer, committed offsets).
//!
//! The binary is `$SLUICE_TANSU`, else `$HOME/.cache/sluice/tansu/bin/tansu`
//! (where `cargo xtask setup` installs it), else `tansu` on `$PATH`. A
//! missing binary is an error that says how to install it, never a
//! skipped test.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use sluice_harness::tansu::TansuServer;
//!
//! let mut server = TansuServer::start()?;
//! let brokers = server.brokers(); // 127.0.0.1:<free port>
//! server.restart()?; // stops, starts again on the same port with the same data
//! # Ok(()) }
//! ```

use crate::process::free_port;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a broker may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stop may take before the broker is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

/// A running `tansu` broker of this test's own.
pub struct TansuServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl TansuServer {
    /// Starts a broker on a free port, storing into SQLite in a fresh
    /// temporary directory, and waits until it accepts connections.
    ///
    /// # Errors
    ///
    /// When `tansu` cannot be found or run, or does not listen in time
    /// (the error quotes its log).
    pub fn start() -> anyhow::Result<TansuServer> {
        let dir = tempfile::tempdir().context("a temporary directory for tansu")?;
        let mut server = TansuServer {
            child: None,
            port: free_port()?,
            dir,
        };
        server.spawn()?;
        Ok(server)
    }

    /// The binary: `$SLUICE_TANSU`, else the one `cargo xtask setup`
    /// installs, else `tansu` on `$PATH`.
    pub fn binary() -> PathBuf {
        if let Some(path) = std::env::var_os("SLUICE_TANSU").filter(|p| !p.is_empty()) {
            return PathBuf::from(path);
        }
        if let Some(home) = std::env::var_os("HOME") {
            let cached = PathBuf::from(home).join(".cache/sluice/tansu/bin/tansu");
            if cached.is_file() {
                return cached;
            }
        }
        PathBuf::from("tansu")
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log_path = self.dir.path().join("tansu.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .context("tansu's log file")?;
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let child = Command::new(Self::binary())
            .arg("broker")
            .args(["--cluster-id", "sluice-test"])
            .args(["--listener-url", &url])
            .args(["--advertised-listener-url", &url])
            // Relative to the working directory: the temporary one.
            .args(["--storage-engine", "sqlite://tansu.db"])
            .current_dir(self.dir.path())
            .env(
                "RUST_LOG",
                std::env::var("SLUICE_TANSU_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| {
                format!(
                    "could not run `{}`; install it (`cargo xtask setup`, or `cargo install tansu \
                     --features libsql --root ~/.cache/sluice/tansu`) or set $SLUICE_TANSU",
                    Self::binary().display()
                )
            })?;
        self.child = Some(child);
        let started = Instant::now();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "tansu exited ({status}) on port {}; log:\n{}",
                    self.port,
                    self.log()
                );
            }
            if started.elapsed() > START_TIMEOUT {
                bail!(
                    "tansu did not listen on port {} within {START_TIMEOUT:?}; log:\n{}",
                    self.port,
                    self.log()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the broker (SIGTERM, then SIGKILL past [`STOP_TIMEOUT`]) and
    /// starts it again on the same port and data. Clients see dropped
    /// connections and refused connects meanwhile.
    ///
    /// # Errors
    ///
    /// When it cannot be started again.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.spawn()
    }

    /// Stops the broker; its data stays for [`start_again`](Self::start_again).
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            crate::process::terminate(child, STOP_TIMEOUT);
        }
    }

    /// Starts a stopped broker again on the same port and data.
    ///
    /// # Errors
    ///
    /// When it does not listen in time.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("tansu is still running");
        }
        self.spawn()
    }

    /// The broker's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("tansu.log")).unwrap_or_default()
    }
}

impl Drop for TansuServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            crate::process::kill(child);
        }
    }
}
