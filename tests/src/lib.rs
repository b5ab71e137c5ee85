//! The end-to-end fixture: the real `sluice` binary as a daemon
//! ([`Daemon`]), driven over its admin API, with real plugins built from
//! source, on either broker ([`Backend`]). The tests themselves are in
//! `tests/`, one test binary per file.

pub mod jetstream;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::SystemTime;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_harness::nats::NatsServer;

/// Two `#[test]`s per body: `embedded::<name>` and `nats::<name>`. Each
/// body is a `fn(&Backend)` at the root of the test file.
#[macro_export]
macro_rules! on_both_brokers {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[test]
                fn $name() {
                    super::$name(&$crate::Backend::embedded());
                }
            )*
        }
        mod nats {
            $(
                #[test]
                fn $name() {
                    super::$name(&$crate::Backend::nats());
                }
            )*
        }
    };
}

/// The `sluice` binary the tests run: `$SLUICE_BIN` when set, else the one
/// cargo built beside this test executable, `target/<profile>/sluice`.
///
/// Only the binary's own package gets `CARGO_BIN_EXE_sluice`, and a
/// fixture that ran cargo itself would build `sluice` with this package's
/// features, not the workspace's; so the tests take the binary the build
/// that compiled them made. `cargo test --workspace` builds it (the runtime
/// package has integration tests, which need it); `cargo test -p
/// sluice-tests` alone does not.
///
/// # Panics
///
/// When the binary is missing, or older than a file it is built from
/// (see [`SOURCES`]): a stale binary would silently test old code. A
/// binary named by `$SLUICE_BIN` is taken as it is.
pub fn sluice_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(find_sluice_bin).clone()
}

/// What the `sluice` binary is compiled from in this repository, relative
/// to its root: a file here newer than the binary means the binary is out
/// of date. The manifests and `Cargo.lock` are left out: editing them does
/// not always relink the binary (adding a workspace member does not), and
/// the staleness check must never fail a binary cargo calls fresh.
pub const SOURCES: &[&str] = &["runtime/src", "author/src", "wit"];

fn find_sluice_bin() -> PathBuf {
    let how = "build it with `cargo build -p sluice` (same profile as the tests), \
               or run `cargo test --workspace`, which builds it; \
               or set SLUICE_BIN to a sluice binary";
    if let Some(bin) = std::env::var_os("SLUICE_BIN").filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        assert!(bin.is_file(), "SLUICE_BIN={} is not a file", bin.display());
        return bin;
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    // The test executable is target/<profile>/deps/<name>-<hash>.
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("{} is not in target/<profile>/deps", exe.display()));
    let bin = profile.join(format!("sluice{}", std::env::consts::EXE_SUFFIX));
    let Ok(built) = std::fs::metadata(&bin).and_then(|m| m.modified()) else {
        panic!("no sluice binary at {}: {how}", bin.display());
    };
    let root = sluice_harness::repo_root();
    let newest = SOURCES
        .iter()
        .filter_map(|dir| newest_file(&root.join(dir)))
        .max_by_key(|(_, modified)| *modified);
    if let Some((source, modified)) = newest
        && modified > built
    {
        panic!(
            "the sluice binary {} is older than {}: it would test old code; {how}",
            bin.display(),
            source.display()
        );
    }
    bin
}

/// The most recently modified file under `path` (or `path` itself).
fn newest_file(path: &Path) -> Option<(PathBuf, SystemTime)> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_dir() {
        return Some((path.to_owned(), meta.modified().ok()?));
    }
    std::fs::read_dir(path)
        .ok()?
        .filter_map(|entry| newest_file(&entry.ok()?.path()))
        .max_by_key(|(_, modified)| *modified)
}

/// One compile cache for the whole test binary, as a daemon host has one.
pub static CACHE: LazyLock<tempfile::TempDir> =
    LazyLock::new(|| tempfile::tempdir().expect("a cache dir"));

/// The path of a plugin built from `plugins/`, as text for YAML.
pub fn plugin(name: &str) -> String {
    sluice_harness::plugin(name).display().to_string()
}

/// Writes `yaml` as `pipeline.yaml` in `dir` and returns its path.
pub fn write_pipeline(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).expect("write pipeline");
    path
}

/// The broker a test's daemons run on.
pub enum Backend {
    /// The embedded broker, in each daemon's `--data-dir`.
    Embedded,
    /// A real nats-server of this test's own (killed on drop), passed as
    /// `--broker nats://...`.
    Nats(Box<NatsServer>),
}

impl Backend {
    /// The embedded broker.
    pub fn embedded() -> Backend {
        Backend::Embedded
    }

    /// A fresh nats-server with JetStream for this test.
    pub fn nats() -> Backend {
        let server = NatsServer::start().unwrap_or_else(|e| panic!("starting nats-server: {e:#}"));
        Backend::Nats(Box::new(server))
    }

    /// The `--broker` value, `None` for the embedded broker.
    pub fn broker_url(&self) -> Option<String> {
        match self {
            Backend::Embedded => None,
            Backend::Nats(server) => Some(server.url()),
        }
    }

    /// The nats-server, when there is one.
    pub fn nats_server(&self) -> Option<&NatsServer> {
        match self {
            Backend::Embedded => None,
            Backend::Nats(server) => Some(server),
        }
    }
}

/// A running `sluice run`.
pub struct Daemon {
    child: Option<Child>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    log: Arc<Mutex<String>>,
    http: reqwest::blocking::Client,
}

impl Daemon {
    /// Starts `sluice run <files> --data-dir <data>` on a free port and waits
    /// until it is ready.
    pub fn start(files: &[&Path], data: &Path) -> Daemon {
        Daemon::start_with_broker(None, files, data)
    }

    /// [`start`](Self::start) on `backend`: with `--broker <url>` on NATS.
    pub fn start_on(backend: &Backend, files: &[&Path], data: &Path) -> Daemon {
        Daemon::start_with_broker(backend.broker_url(), files, data)
    }

    /// [`start`](Self::start) with `--broker <broker>` when given (any URL
    /// the daemon accepts, for example a cluster's seed list with
    /// `?replicas=3`).
    pub fn start_with_broker(broker: Option<String>, files: &[&Path], data: &Path) -> Daemon {
        Daemon::start_with_env(broker, files, data, Vec::new())
    }

    /// [`start_with_broker`](Self::start_with_broker) with extra environment
    /// variables for the daemon (say, AWS credentials for an S3 claim store).
    pub fn start_with_env(
        broker: Option<String>,
        files: &[&Path],
        data: &Path,
        env: Vec<(String, String)>,
    ) -> Daemon {
        let mut args: Vec<String> = vec!["run".into()];
        args.extend(files.iter().map(|f| f.display().to_string()));
        args.extend([
            "--data-dir".into(),
            data.display().to_string(),
            "--admin".into(),
            "127.0.0.1:0".into(),
        ]);
        if let Some(broker) = broker {
            args.extend(["--broker".into(), broker]);
        }
        let mut daemon = Daemon {
            child: None,
            args,
            env,
            base: String::new(),
            log: Arc::default(),
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("http client"),
        };
        daemon.spawn();
        daemon
    }

    fn spawn(&mut self) {
        let mut child = Command::new(sluice_bin())
            .args(&self.args)
            .env("SLUICE_CACHE_DIR", CACHE.path())
            .env("SLUICE_LOG", "warn,sluice=info")
            // The broker is chosen by `--broker` alone, never by the
            // environment the tests happen to run in.
            .env_remove("SLUICE_BROKER")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sluice run");
        let stderr = child.stderr.take().expect("stderr");
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<String>();
        let log = self.log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("admin on http://").nth(1) {
                    let addr = rest.split(';').next().unwrap_or_default().to_owned();
                    let _ = ready_tx.send(addr);
                }
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
        });
        self.child = Some(child);
        match ready_rx.recv_timeout(Duration::from_secs(120)) {
            Ok(addr) => self.base = format!("http://{addr}"),
            Err(_) => panic!("daemon did not become ready; log:\n{}", self.log()),
        }
    }

    /// The admin API's base URL, `http://127.0.0.1:PORT`.
    pub fn admin_url(&self) -> &str {
        &self.base
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything the daemon wrote to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits up to `limit` for the daemon to exit on its own (a crash
    /// hook); returns its exit status.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let started = Instant::now();
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return status;
            }
            assert!(
                started.elapsed() < limit,
                "the daemon did not exit within {limit:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM; returns the exit status and how long it took to exit.
    pub fn sigterm(&mut self) -> (ExitStatus, Duration) {
        let mut child = self.child.take().expect("running");
        let started = Instant::now();
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        let status = child.wait().expect("wait");
        (status, started.elapsed())
    }

    /// Starts it again with the same arguments and data.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        self.spawn();
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Publishes messages through the batch ingest endpoint.
    pub fn publish(&self, topic: &str, messages: &[Msg]) {
        if let Err(err) = self.try_publish(topic, messages) {
            panic!("{err}");
        }
    }

    /// [`publish`](Self::publish), saying why it failed instead of
    /// panicking: for a daemon that may die while it is being fed.
    pub fn try_publish(&self, topic: &str, messages: &[Msg]) -> Result<(), String> {
        for chunk in messages.chunks(1000) {
            let body: String = chunk
                .iter()
                .map(|m| {
                    let mut line = json!({"id": m.id, "payload": m.payload});
                    if let Some(key) = &m.key {
                        line["key"] = json!(key);
                    }
                    line.to_string() + "\n"
                })
                .collect();
            let response = self
                .http
                .post(self.url(&format!("/v1/topics/{topic}/batch")))
                .header("content-type", "application/x-ndjson")
                .body(body)
                .send()
                .map_err(|e| format!("publish: {e}"))?;
            let status = response.status();
            if !status.is_success() {
                return Err(format!(
                    "publish: {status}: {}",
                    response.text().unwrap_or_default()
                ));
            }
        }
        Ok(())
    }

    /// Publishes one message with raw bytes as its body.
    pub fn publish_bytes(&self, topic: &str, id: &str, payload: &[u8]) {
        let response = self
            .http
            .post(self.url(&format!("/v1/topics/{topic}/messages")))
            .header("idempotency-key", id)
            .body(payload.to_vec())
            .send()
            .expect("publish");
        let status = response.status();
        assert!(
            status.is_success(),
            "publish: {status}: {}",
            response.text().unwrap_or_default()
        );
    }

    /// Every message stored in `topic`, oldest first.
    pub fn read_all(&self, topic: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut from = 0u64;
        loop {
            let page: Value = self
                .http
                .get(self.url(&format!(
                    "/v1/topics/{topic}/messages?from={from}&max=1000&wait_ms=0"
                )))
                .send()
                .expect("read")
                .json()
                .expect("read json");
            let messages = page["messages"].as_array().cloned().unwrap_or_default();
            if messages.is_empty() {
                return out;
            }
            from = messages
                .last()
                .and_then(|m| m["seq"].as_u64())
                .expect("seq")
                + 1;
            out.extend(messages);
        }
    }

    /// How many messages `topic` stores now (`GET /v1/topics/{topic}`):
    /// cheap to poll, where [`read_all`](Self::read_all) reads everything.
    pub fn depth(&self, topic: &str) -> usize {
        let stats = self.get(&format!("/v1/topics/{topic}"));
        let depth = stats["depth"]
            .as_u64()
            .unwrap_or_else(|| panic!("topic stats without depth: {stats}"));
        usize::try_from(depth).expect("depth fits")
    }

    /// `GET path` as JSON.
    pub fn get(&self, path: &str) -> Value {
        self.http
            .get(self.url(path))
            .send()
            .expect("get")
            .json()
            .expect("json")
    }

    /// `POST path` with a JSON body, as JSON.
    pub fn post(&self, path: &str, body: Value) -> Value {
        let response = self
            .http
            .post(self.url(path))
            .json(&body)
            .send()
            .expect("post");
        let status = response.status();
        let value: Value = response.json().expect("json");
        assert!(status.is_success(), "POST {path}: {status}: {value}");
        value
    }

    /// Waits until `done` holds, polling; panics with the log after `limit`.
    pub fn wait_until(&self, what: &str, limit: Duration, mut done: impl FnMut(&Daemon) -> bool) {
        let started = Instant::now();
        while !done(self) {
            assert!(
                started.elapsed() < limit,
                "timed out waiting for {what}; daemon log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A message to publish.
#[derive(Debug, Clone)]
pub struct Msg {
    /// Its id.
    pub id: String,
    /// Its payload (text).
    pub payload: String,
    /// Its key.
    pub key: Option<String>,
}

impl Msg {
    /// A message without a key.
    pub fn new(id: impl Into<String>, payload: impl Into<String>) -> Msg {
        Msg {
            id: id.into(),
            payload: payload.into(),
            key: None,
        }
    }

    /// With a key.
    pub fn key(mut self, key: impl Into<String>) -> Msg {
        self.key = Some(key.into());
        self
    }
}

/// The value of header `name` of a message as the admin API returns it.
pub fn header<'a>(message: &'a Value, name: &str) -> Option<&'a str> {
    message["headers"].as_array()?.iter().find_map(|pair| {
        let pair = pair.as_array()?;
        (pair.first()?.as_str()? == name)
            .then(|| pair.get(1)?.as_str())
            .flatten()
    })
}

/// How many times each value occurs.
pub fn counts<'a>(values: impl IntoIterator<Item = &'a str>) -> BTreeMap<&'a str, usize> {
    let mut map = BTreeMap::new();
    for v in values {
        *map.entry(v).or_insert(0) += 1;
    }
    map
}

/// Announces a `POST` body of `len` bytes to `base` + `path` but sends
/// none, and returns the status and the raw response. A body over the
/// limit is refused by its Content-Length before it is read; sending it
/// all could end in a broken pipe instead of the answer, since the server
/// stops reading once it has answered.
pub fn announce(base: &str, path: &str, len: usize) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = base.trim_start_matches("http://").to_owned();
    let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    )
    .expect("send headers");
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, raw)
}

/// The JSON body of a raw HTTP response, or `Null`.
pub fn raw_json_body(raw: &str) -> Value {
    raw.split_once("\r\n\r\n")
        .and_then(|(_, body)| serde_json::from_str(body).ok())
        .unwrap_or(Value::Null)
}
