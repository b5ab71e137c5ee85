//! The end-to-end fixture: the real `sluice` binary ([`sluice_bin`]) as a
//! daemon ([`Daemon`]), driven over its admin API, with real plugins built
//! from source, on either broker ([`Backend`]). The tests themselves are
//! in `tests/`, one test binary per file, and all start their daemons
//! here, so a change to how the daemon is run is made once.

pub mod bench;
mod daemon;
pub mod edges;
pub mod jetstream;
pub mod otlp;
pub mod plugins;
pub mod receiver;

pub use daemon::{Daemon, DaemonBuilder, Exited};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, SystemTime};

use serde_json::Value;
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

/// A blocking HTTP client for a test's own calls to the daemon: no proxy
/// from the environment (everything is on loopback), and `timeout` per
/// request so a hung daemon fails the test instead of stalling it.
///
/// # Panics
///
/// When the client cannot be built (no TLS backend).
pub fn http_client(timeout: Duration) -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .build()
        .expect("an HTTP client")
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
               or run `cargo xtask test`, which builds it before the tests; \
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

/// Runs `sluice ARGS` to its exit (killed, and the test failed, after 2
/// minutes), with the shared compile cache and no broker taken from the
/// environment: for commands that end by themselves, such as `data
/// check` or a `run` that must refuse to start.
pub fn sluice_to_exit<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    use std::process::{Command, Stdio};
    let mut child = Command::new(sluice_bin())
        .args(args)
        .env("SLUICE_CACHE_DIR", CACHE.path())
        .env_remove("SLUICE_BROKER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sluice");
    let started = std::time::Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
            panic!("sluice {shown:?} did not exit within 2 minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

/// The path of a plugin built from `plugins/`, as text for YAML.
pub fn plugin(name: &str) -> String {
    sluice_harness::plugin(name).display().to_string()
}

/// A self-signed certificate for `localhost` and `127.0.0.1`, as (cert
/// PEM, key PEM): the TLS tests' servers serve it, and the daemon trusts
/// it as its CA (`tls_ca`).
pub fn self_signed_certificate() -> (String, String) {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("a self-signed certificate");
    (cert.cert.pem(), cert.signing_key.serialize_pem())
}

/// A server certificate for the TLS tests ([`self_signed_certificate`]),
/// with its PEM also written to a file for the daemon's `tls_ca`.
pub struct TestCert {
    /// The certificate (PEM), for the server.
    pub cert: String,
    /// Its private key (PEM), for the server.
    pub key: String,
    /// The certificate as a file, for the daemon to trust.
    pub ca_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestCert {
    /// A fresh certificate and its CA file.
    pub fn new() -> TestCert {
        let (cert, key) = self_signed_certificate();
        let dir = tempfile::tempdir().expect("a directory for the CA");
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &cert).expect("writing the CA");
        TestCert {
            cert,
            key,
            ca_file,
            _dir: dir,
        }
    }
}

impl Default for TestCert {
    fn default() -> Self {
        TestCert::new()
    }
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
    /// `embedded` or `nats`, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Embedded => "embedded",
            Backend::Nats(_) => "nats",
        }
    }

    /// The embedded broker.
    pub fn embedded() -> Backend {
        Backend::Embedded
    }

    /// A fresh nats-server with JetStream for this test.
    pub fn nats() -> Backend {
        let server = NatsServer::start().unwrap_or_else(|e| panic!("starting nats-server: {e:#}"));
        Backend::Nats(Box::new(server))
    }

    /// [`nats`](Self::nats), its store on tmpfs
    /// ([`NatsServer::start_on_tmpfs`]): for tests that kill the daemon,
    /// not the server.
    pub fn nats_on_tmpfs() -> Backend {
        let server =
            NatsServer::start_on_tmpfs().unwrap_or_else(|e| panic!("starting nats-server: {e:#}"));
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

/// A message to publish.
#[derive(Debug, Clone)]
pub struct Msg {
    /// Its id.
    pub id: String,
    /// Its payload (text).
    pub payload: String,
    /// Its key.
    pub key: Option<String>,
    /// When it is to be delivered (RFC 3339), if delayed.
    pub deliver_at: Option<String>,
    /// Its headers, in order.
    pub headers: Vec<(String, String)>,
}

impl Msg {
    /// A message without a key.
    pub fn new(id: impl Into<String>, payload: impl Into<String>) -> Msg {
        Msg {
            id: id.into(),
            payload: payload.into(),
            key: None,
            deliver_at: None,
            headers: Vec::new(),
        }
    }

    /// With header `name` set to `value`.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Msg {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Delayed until `at_ms` (ms since the epoch).
    pub fn deliver_at(mut self, at_ms: u64) -> Msg {
        self.deliver_at = Some(sluice::timestamp::format_rfc3339_millis(at_ms));
        self
    }

    /// With a key.
    pub fn key(mut self, key: impl Into<String>) -> Msg {
        self.key = Some(key.into());
        self
    }
}

/// A producer's W3C trace context: the example of the Trace Context
/// recommendation (trace [`TRACE_ID`], parent span `00f067aa0ba902b7`).
pub const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// The trace id of [`TRACEPARENT`].
pub const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
/// A `tracestate` to go with [`TRACEPARENT`].
pub const TRACESTATE: &str = "congo=t61rcWkgMzE";

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

/// Runs the Kafka tests' outside client (`tests/fixtures/kafka_client.py`,
/// confluent-kafka) with `args`; its JSON answer.
///
/// # Panics
///
/// When the client fails or does not answer JSON.
pub fn kafka_client(args: &[&str]) -> Value {
    let script = sluice_harness::repo_root().join("tests/fixtures/kafka_client.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "kafka_client.py {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "kafka_client.py {args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}
