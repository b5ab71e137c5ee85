//! The OTLP receiver the trace tests and the trace benchmark start
//! (`tests/otlp/receiver.py`, built on the official `opentelemetry-proto`
//! types; no collector binary can be had here).

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running receiver, killed when dropped.
pub struct OtlpReceiver {
    child: Child,
    port: u16,
}

impl OtlpReceiver {
    /// Starts one that keeps every span for [`OtlpReceiver::spans`].
    pub fn start() -> OtlpReceiver {
        Self::spawn(false, None)
    }

    /// Starts one like [`OtlpReceiver::start`] on `port` (one a daemon was
    /// told of before anything listened there).
    pub fn start_on(port: u16) -> OtlpReceiver {
        Self::spawn(false, Some(port))
    }

    /// Starts one that answers every export and keeps nothing (decodes
    /// nothing), for benchmarks.
    pub fn discarding() -> OtlpReceiver {
        Self::spawn(true, None)
    }

    fn spawn(discard: bool, port: Option<u16>) -> OtlpReceiver {
        let script = sluice_harness::repo_root().join("tests/otlp/receiver.py");
        let mut command = Command::new("python3");
        command.arg(&script);
        if discard {
            command.arg("--discard");
        }
        if let Some(port) = port {
            command.arg("--port").arg(port.to_string());
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs the OTLP receiver");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the receiver's first line");
        let port = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "the OTLP receiver did not start (is opentelemetry-proto installed? \
                     `cargo xtask setup`): {line:?}"
                )
            });
        OtlpReceiver { child, port }
    }

    /// Its base URL: the value of `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment that turns a daemon's export on, to this receiver,
    /// with spans sent a tenth of a second after they end.
    pub fn env(&self) -> [(&'static str, String); 2] {
        [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ]
    }

    /// Every span received so far, as the receiver's JSON (`trace_id`,
    /// `span_id`, `parent_span_id`, `name`, `kind`, `attributes`,
    /// `status`, `links`, `service`).
    pub fn spans(&self) -> Vec<Value> {
        self.get()["spans"].as_array().cloned().unwrap_or_default()
    }

    /// The export requests received so far.
    pub fn requests(&self) -> u64 {
        self.get()["requests"].as_u64().unwrap_or_default()
    }

    fn get(&self) -> Value {
        reqwest::blocking::get(format!("{}/spans", self.endpoint()))
            .and_then(reqwest::blocking::Response::json)
            .expect("the receiver answers")
    }

    /// The spans received, once `done` holds of them.
    ///
    /// # Panics
    ///
    /// When it does not within a minute, with the spans received.
    pub fn wait_for(&self, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not received in a minute; spans: {}",
                serde_json::to_string_pretty(&spans).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
