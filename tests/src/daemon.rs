//! [`Daemon`]: a real `sluice run` child, driven over its admin API.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{Backend, CACHE, Msg, sluice_bin, write_pipeline};

/// How long a daemon may take to print its ready line: it compiles its
/// plugins first, seconds each for a Python or JavaScript one.
const READY_LIMIT: Duration = Duration::from_secs(120);

/// How long [`Daemon::wait`] (and so [`Daemon::sigterm`]) gives the daemon
/// to exit: far past any test's `shutdown_timeout`, so only a shutdown
/// that hangs reaches it.
pub const EXIT_LIMIT: Duration = Duration::from_secs(120);

/// A running `sluice run`.
pub struct Daemon {
    child: Option<Child>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// The admin API's base URL as the daemon printed it:
    /// `http://127.0.0.1:PORT`, or `https://...` when it serves TLS.
    pub base: String,
    /// The admin listener's `HOST:PORT`, as bound (`0.0.0.0:PORT` when
    /// `--admin 0.0.0.0:0` was asked for).
    pub addr: String,
    log: Arc<Mutex<String>>,
    http: reqwest::blocking::Client,
    /// The directory of a daemon started by [`Daemon::with_yaml`]: its
    /// pipeline and data live as long as it does.
    _dir: Option<tempfile::TempDir>,
}

/// A daemon that exited, or never printed its ready line, instead of
/// starting.
#[derive(Debug)]
pub struct Exited {
    /// Everything it wrote to stderr.
    pub log: String,
    /// Its exit status; `None` when it did not start within the limit and
    /// was killed.
    pub status: Option<ExitStatus>,
}

/// What to start: `sluice run <files> --data-dir <data>`, then the broker,
/// extra arguments and environment. From [`Daemon::builder`] or
/// [`Daemon::with_yaml`].
#[must_use]
pub struct DaemonBuilder {
    files: Vec<PathBuf>,
    data: PathBuf,
    broker: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    dir: Option<tempfile::TempDir>,
}

impl DaemonBuilder {
    /// `--broker <url>`.
    pub fn broker(mut self, url: impl Into<String>) -> Self {
        self.broker = Some(url.into());
        self
    }

    /// The broker of `backend`: `--broker <url>` on NATS, none embedded.
    pub fn on(mut self, backend: &Backend) -> Self {
        self.broker = backend.broker_url();
        self
    }

    /// Extra arguments to `sluice run`. With `--admin` among them, the
    /// default `--admin 127.0.0.1:0` is left out.
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Extra environment variables (tokens, AWS credentials, limits).
    pub fn envs<K: AsRef<str>, V: AsRef<str>>(
        mut self,
        env: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.env.extend(
            env.into_iter()
                .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned())),
        );
        self
    }

    /// Starts it and waits until it is ready.
    ///
    /// # Panics
    ///
    /// When it exits instead, or is not ready in two minutes, with its log.
    pub fn start(self) -> Daemon {
        self.try_start().unwrap_or_else(|exited| {
            panic!(
                "daemon did not become ready (exit {:?}); log:\n{}",
                exited.status, exited.log
            )
        })
    }

    /// [`start`](Self::start), returning its log and exit status when it
    /// exits first: for a daemon that must refuse to start.
    pub fn try_start(self) -> Result<Daemon, Exited> {
        let mut args: Vec<String> = vec!["run".into()];
        args.extend(self.files.iter().map(|f| f.display().to_string()));
        args.extend(["--data-dir".into(), self.data.display().to_string()]);
        if !self.args.iter().any(|a| a == "--admin") {
            args.extend(["--admin".into(), "127.0.0.1:0".into()]);
        }
        if let Some(broker) = self.broker {
            args.extend(["--broker".into(), broker]);
        }
        args.extend(self.args);
        let http = client_for(&self.env);
        let mut daemon = Daemon {
            child: None,
            args,
            env: self.env,
            base: String::new(),
            addr: String::new(),
            log: Arc::default(),
            http,
            _dir: self.dir,
        };
        daemon.spawn()?;
        Ok(daemon)
    }
}

/// The harness's own client: it sends the daemon's full token, if the
/// daemon was given one (`SLUICE_ADMIN_TOKEN`), so its reads and publishes
/// work on a daemon that requires one.
fn client_for(env: &[(String, String)]) -> reqwest::blocking::Client {
    let mut builder = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60));
    if let Some((_, token)) = env.iter().find(|(k, _)| k == "SLUICE_ADMIN_TOKEN") {
        let mut headers = reqwest::header::HeaderMap::new();
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .expect("a token a header can carry");
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
        builder = builder.default_headers(headers);
    }
    builder.build().expect("http client")
}

/// How long [`Daemon::publish`] keeps resending a chunk the daemon
/// answers `503`.
const PUBLISH_PATIENCE: Duration = Duration::from_secs(60);

impl Daemon {
    /// A daemon running `files` with its data in `data`; see
    /// [`DaemonBuilder`] for the rest.
    pub fn builder(files: &[&Path], data: &Path) -> DaemonBuilder {
        DaemonBuilder {
            files: files.iter().map(|f| f.to_path_buf()).collect(),
            data: data.to_owned(),
            broker: None,
            args: Vec::new(),
            env: Vec::new(),
            dir: None,
        }
    }

    /// A daemon running the one pipeline `yaml`, written with its data
    /// into a temporary directory the daemon keeps until it is dropped.
    pub fn with_yaml(yaml: &str) -> DaemonBuilder {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = write_pipeline(dir.path(), "pipeline", yaml);
        let data = dir.path().join("data");
        DaemonBuilder {
            dir: Some(dir),
            ..Daemon::builder(&[&file], &data)
        }
    }

    /// Starts `sluice run <files> --data-dir <data>` on a free port and waits
    /// until it is ready.
    pub fn start(files: &[&Path], data: &Path) -> Daemon {
        Daemon::builder(files, data).start()
    }

    /// [`start`](Self::start) on `backend`: with `--broker <url>` on NATS.
    pub fn start_on(backend: &Backend, files: &[&Path], data: &Path) -> Daemon {
        Daemon::builder(files, data).on(backend).start()
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
        let builder = Daemon::builder(files, data).envs(env);
        match broker {
            Some(broker) => builder.broker(broker),
            None => builder,
        }
        .start()
    }

    /// Spawns the child and waits for its ready line, `admin on URL;`.
    fn spawn(&mut self) -> Result<(), Exited> {
        let mut child = Command::new(sluice_bin())
            .args(&self.args)
            .env("SLUICE_CACHE_DIR", CACHE.path())
            .env("SLUICE_LOG", "warn,sluice=info")
            // The broker is chosen by `--broker` alone, and admin tokens by
            // the test alone, never by the environment the tests run in.
            .env_remove("SLUICE_BROKER")
            .env_remove("SLUICE_ADMIN_TOKEN")
            .env_remove("SLUICE_ADMIN_READ_TOKEN")
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
                if let Some(rest) = line.split("admin on ").nth(1) {
                    let url = rest.split(';').next().unwrap_or_default().to_owned();
                    let _ = ready_tx.send(url);
                }
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
        });
        let deadline = Instant::now() + READY_LIMIT;
        loop {
            if let Ok(url) = ready_rx.recv_timeout(Duration::from_millis(200)) {
                self.addr = url.split("://").nth(1).unwrap_or_default().to_owned();
                self.base = url;
                self.child = Some(child);
                return Ok(());
            }
            if let Ok(Some(status)) = child.try_wait() {
                // Let the reader thread take the last lines.
                std::thread::sleep(Duration::from_millis(300));
                return Err(Exited {
                    log: self.log(),
                    status: Some(status),
                });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Exited {
                    log: self.log(),
                    status: None,
                });
            }
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

    /// The CPU time (user and system, all threads) the daemon has used
    /// so far, from `/proc/<pid>/stat`, to 10 ms; zero once it is gone.
    /// Benches take the difference over a timed window.
    pub fn cpu_time(&self) -> Duration {
        /// `USER_HZ`, the unit of `/proc/<pid>/stat`'s times: 100 on every
        /// Linux architecture.
        const TICKS_PER_SECOND: u64 = 100;
        let Some(pid) = self.pid() else {
            return Duration::ZERO;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return Duration::ZERO;
        };
        // After the command name in parentheses (which may hold spaces):
        // state is field 3, utime 14, stime 15.
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let total = ticks(14 - 3) + ticks(15 - 3);
        Duration::from_millis(total * 1000 / TICKS_PER_SECOND)
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

    /// Sends SIGTERM and returns at once: the daemon drains while the test
    /// watches; [`wait`](Self::wait) for its exit.
    pub fn term(&self) {
        let pid = self.pid().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
    }

    /// Waits for the daemon to exit; its status.
    ///
    /// # Panics
    ///
    /// When it has not exited within [`EXIT_LIMIT`] (its shutdown hangs):
    /// it is killed, and the panic carries its log.
    pub fn wait(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if started.elapsed() > EXIT_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the daemon did not exit within {EXIT_LIMIT:?} of being asked to; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM; returns the exit status and how long it took to exit.
    pub fn sigterm(&mut self) -> (ExitStatus, Duration) {
        let started = Instant::now();
        self.term();
        let status = self.wait();
        (status, started.elapsed())
    }

    /// Starts it again with the same arguments and data.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        if let Err(exited) = self.spawn() {
            panic!(
                "daemon did not become ready again (exit {:?}); log:\n{}",
                exited.status, exited.log
            );
        }
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Runs the real CLI against this daemon (`SLUICE_ADMIN` is its URL)
    /// with `env`, and no broker or token from the environment the tests
    /// run in.
    pub fn cli(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        Command::new(sluice_bin())
            .args(args)
            .env("SLUICE_ADMIN", &self.base)
            .env_remove("SLUICE_BROKER")
            .env_remove("SLUICE_ADMIN_TOKEN")
            .env_remove("SLUICE_ADMIN_READ_TOKEN")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .expect("run sluice")
    }

    /// Publishes messages through the batch ingest endpoint, as a
    /// producer should: a chunk answered `503` (the broker cannot take it
    /// now: a JetStream stream electing its leader) is sent again after a
    /// pause, for up to [`PUBLISH_PATIENCE`]. Resending is safe: the ids
    /// collapse in the duplicate window.
    pub fn publish(&self, topic: &str, messages: &[Msg]) {
        for chunk in messages.chunks(1000) {
            let started = Instant::now();
            loop {
                match self.post_batch(topic, chunk) {
                    Ok(()) => break,
                    Err((Some(503), _)) if started.elapsed() < PUBLISH_PATIENCE => {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err((_, err)) => panic!("{err}"),
                }
            }
        }
    }

    /// [`publish`](Self::publish) without the patience, saying why it
    /// failed instead of panicking: for a daemon that may die while it is
    /// being fed.
    pub fn try_publish(&self, topic: &str, messages: &[Msg]) -> Result<(), String> {
        for chunk in messages.chunks(1000) {
            self.post_batch(topic, chunk).map_err(|(_, err)| err)?;
        }
        Ok(())
    }

    /// One `POST /v1/topics/{topic}/batch`; on failure the status (if
    /// there was an answer) and what went wrong.
    fn post_batch(&self, topic: &str, chunk: &[Msg]) -> Result<(), (Option<u16>, String)> {
        let body: String = chunk
            .iter()
            .map(|m| {
                let mut line = json!({"id": m.id, "payload": m.payload});
                if let Some(key) = &m.key {
                    line["key"] = json!(key);
                }
                if let Some(at) = &m.deliver_at {
                    line["deliver_at"] = json!(at);
                }
                if !m.headers.is_empty() {
                    line["headers"] = json!(m.headers);
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
            .map_err(|e| (None, format!("publish: {e}")))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        Err((
            Some(status.as_u16()),
            format!("publish: {status}: {}", response.text().unwrap_or_default()),
        ))
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

    /// `/health/ready` as `(status, its reasons joined by "; ")`.
    pub fn readiness(&self) -> (String, String) {
        let r = self.get("/health/ready");
        let reasons = r["reasons"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default();
        (r["status"].as_str().unwrap_or_default().to_owned(), reasons)
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

    /// The sum of a metric's samples in `/metrics` over all its labels
    /// (`sluice_source_messages_total`, say); zero when it has none.
    ///
    /// # Panics
    ///
    /// When `/metrics` does not answer.
    pub fn metric_sum(&self, name: &str) -> f64 {
        self.metrics_text()
            .lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// `/metrics` as Prometheus text.
    ///
    /// # Panics
    ///
    /// When `/metrics` does not answer.
    pub fn metrics_text(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .and_then(reqwest::blocking::Response::text)
            .unwrap_or_else(|e| panic!("GET /metrics: {e}"))
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
