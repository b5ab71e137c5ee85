//! The SQS source and sink end to end: moto's server per test
//! (`sluice_harness::moto`, which serves SQS as well as S3), the real
//! `sluice` binary, real plugins, and boto3 as the outside producer and
//! consumer (`tests/fixtures/sqs_client.py`).
//!
//! moto's SQS scans every message of a queue on each call (its
//! `send_message` even computes the queue's attributes, three scans, per
//! message), so a call on a queue holding 10,000 messages takes seconds
//! (the harness removes the worst of it, a scan per received message; see
//! `sluice_harness::moto`).
//! The producer therefore keeps the input queue under a depth
//! ([`PRODUCE_DEPTH`]) and the consumer drains the output queue as it
//! fills: every message of the suite is still produced and consumed, at
//! the pace moto can serve.
//!
//! moto also forgets a FIFO deduplication id once its message is deleted
//! (real SQS remembers it for five minutes whatever happens to the
//! message), and the consumer deletes what it takes. So a message the sink
//! sent again after a kill -9 (sent, not yet acked in the topic) can
//! arrive twice from moto where SQS would have dropped it. The round trip
//! therefore asserts the exact set with [`Duplicates::SameId`], and then
//! that every repeated message carried the same `MessageDeduplicationId`
//! and was sent within SQS's five-minute deduplication interval of its
//! first copy: SQS would have delivered each once.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_harness::moto::MotoServer;
use sluice_tests::edges::{
    Delivered, Duplicates, Upstream, edge_pipeline, round_trip_under_faults,
};
use sluice_tests::{Daemon, sluice_bin};

const LONG: Duration = Duration::from_secs(240);
/// The most messages the producer lets wait in the input queue.
const PRODUCE_DEPTH: u64 = 100;
/// SQS's FIFO deduplication interval.
const DEDUP_INTERVAL_MS: i64 = 5 * 60 * 1000;

/// One message the consumer took from a queue.
#[derive(Debug, Clone)]
struct Taken {
    body: String,
    attributes: BTreeMap<String, Option<String>>,
    dedup_id: Option<String>,
    group_id: Option<String>,
    sent: i64,
    received: i64,
}

/// The boto3 client process, one JSON command and answer per line.
struct Boto {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Boto {
    fn start(moto: &MotoServer) -> Boto {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/sqs_client.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(moto.endpoint())
            .envs(moto.env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 tests/fixtures/sqs_client.py (boto3: `cargo xtask setup`)");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Boto {
            child,
            stdin,
            stdout,
        }
    }

    fn call(&mut self, command: &Value) -> Value {
        writeln!(self.stdin, "{command}").expect("writing to sqs_client.py");
        self.stdin.flush().expect("flush");
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("reading from sqs_client.py");
        let answer: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("sqs_client.py answered {line:?}: {e}"));
        match answer.get("ok") {
            Some(ok) => ok.clone(),
            None => panic!("sqs_client.py: {command} failed: {answer}"),
        }
    }
}

impl Drop for Boto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// moto and the outside client, with what the client took so far.
struct Sqs {
    moto: MotoServer,
    boto: Boto,
    /// Where the source reads, and where the sink writes.
    input: String,
    output: String,
    /// Everything taken from `output`.
    kept: Vec<Taken>,
    /// Extra source and sink lines (stage knobs before the sink block).
    source_extra: String,
    sink_knobs: String,
    sink_extra: String,
}

impl Sqs {
    /// moto, the client, and the queues `input` and `output` (created with
    /// `attributes`), with the client draining `output`.
    fn new(input: &str, output: &str, output_attributes: &Value) -> Sqs {
        let moto = MotoServer::start().unwrap_or_else(|e| panic!("starting moto: {e:#}"));
        let mut boto = Boto::start(&moto);
        // A FIFO input (`.fifo`) deduplicates by the producer's ids.
        let input_attributes = if input.ends_with(".fifo") {
            json!({"FifoQueue": "true"})
        } else {
            json!({})
        };
        let input = boto
            .call(&json!({"op": "create", "name": input, "attributes": input_attributes}))["url"]
            .as_str()
            .expect("url")
            .to_owned();
        let output = boto
            .call(&json!({"op": "create", "name": output, "attributes": output_attributes}))["url"]
            .as_str()
            .expect("url")
            .to_owned();
        boto.call(&json!({"op": "drain", "url": output}));
        Sqs {
            moto,
            boto,
            input,
            output,
            kept: Vec::new(),
            source_extra: String::new(),
            sink_knobs: String::new(),
            sink_extra: String::new(),
        }
    }

    fn fifo_out() -> Value {
        json!({"FifoQueue": "true", "ContentBasedDeduplication": "false"})
    }

    /// Takes what the client drained since the last call.
    fn take(&mut self) -> &[Taken] {
        let got = self.boto.call(&json!({"op": "taken", "url": self.output}));
        for m in got["messages"].as_array().expect("messages") {
            self.kept.push(Taken {
                body: m["body"].as_str().unwrap_or_default().to_owned(),
                attributes: m["attributes"]
                    .as_object()
                    .map(|a| {
                        a.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().map(str::to_owned)))
                            .collect()
                    })
                    .unwrap_or_default(),
                dedup_id: m["dedup_id"].as_str().map(str::to_owned),
                group_id: m["group_id"].as_str().map(str::to_owned),
                sent: m["sent"].as_i64().unwrap_or(0),
                received: m["received"].as_i64().unwrap_or(0),
            });
        }
        let status = self.boto.call(&json!({"op": "status"}));
        assert!(
            status["errors"].as_array().is_none_or(Vec::is_empty),
            "the outside client failed: {status}"
        );
        &self.kept
    }

    /// One SendMessageBatch into the input queue, each entry a body and
    /// its string attributes.
    fn send(&mut self, entries: &[(&str, &[(&str, &str)])]) {
        let entries: Vec<Value> = entries
            .iter()
            .map(|(body, attrs)| {
                let attributes: BTreeMap<&str, &str> = attrs.iter().copied().collect();
                json!({"body": body, "attributes": attributes})
            })
            .collect();
        let out = self
            .boto
            .call(&json!({"op": "send", "url": self.input, "entries": entries}));
        assert!(out["failed"].as_array().is_none_or(Vec::is_empty), "{out}");
    }

    /// One SendMessageBatch into a FIFO input queue: (body, group).
    fn send_grouped(&mut self, entries: &[(&str, &str)]) {
        let entries: Vec<Value> = entries
            .iter()
            .map(|(body, group)| json!({"body": body, "group": group}))
            .collect();
        let out = self
            .boto
            .call(&json!({"op": "send", "url": self.input, "entries": entries}));
        assert!(out["failed"].as_array().is_none_or(Vec::is_empty), "{out}");
    }

    fn block(&self, url: &str, extra: &str) -> String {
        format!(
            "sqs:\n  queue_url: {url}\n  endpoint: {}\n  region: {}\n{}",
            self.moto.endpoint(),
            sluice_harness::moto::REGION,
            sluice_tests::edges::indent(extra, 2)
        )
    }

    fn daemon(&self, dir: &std::path::Path) -> Daemon {
        let file = edge_pipeline(dir, &self.source_block(), &self.sink_block());
        Daemon::builder(&[&file], &dir.join("data"))
            .envs(self.env())
            .start()
    }

    /// Waits until `n` distinct bodies were taken (a standard queue may
    /// deliver a message twice).
    fn wait_taken(&mut self, daemon: &Daemon, n: usize) {
        let started = Instant::now();
        while self
            .take()
            .iter()
            .map(|t| t.body.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            < n
        {
            assert!(
                started.elapsed() < LONG,
                "{} of {n} taken; daemon log:\n{}\nmoto:\n{}",
                self.kept.len(),
                daemon.log(),
                tail(&self.moto.log())
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Upstream for Sqs {
    fn source_block(&self) -> String {
        self.block(&self.input, &self.source_extra)
    }

    fn sink_block(&self) -> String {
        format!(
            "{}{}",
            self.sink_knobs,
            self.block(&self.output, &self.sink_extra)
        )
    }

    fn produce(&mut self, from: usize, n: usize) {
        self.boto.call(&json!({
            "op": "produce", "url": self.input, "from": from, "n": n, "depth": PRODUCE_DEPTH
        }));
    }

    fn delivered(&mut self) -> Vec<Delivered> {
        self.take()
            .iter()
            .map(|t| Delivered {
                payload: t.body.clone(),
                sluice_id: t.attributes.get("sluice-id").cloned().flatten(),
            })
            .collect()
    }

    fn restart(&mut self) {
        // moto keeps nothing across a restart: a pause stands in for it,
        // as long as an outage (the fault itself, not a check).
        self.moto.pause().expect("SIGSTOP moto");
        std::thread::sleep(Duration::from_secs(5));
        self.moto.resume().expect("SIGCONT moto");
    }

    fn log(&self) -> String {
        format!("moto (tail):\n{}", tail(&self.moto.log()))
    }

    fn env(&self) -> Vec<(String, String)> {
        self.moto.env()
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn metrics(daemon: &Daemon) -> String {
    reqwest::blocking::get(format!("{}/metrics", daemon.base))
        .expect("GET /metrics")
        .text()
        .expect("metrics text")
}

/// The suite's scenario: 20,000 messages from a standard queue through the
/// uppercase stage into a FIFO queue, two kill -9 of the daemon and one
/// pause of moto mid-run; nothing lost, and no copy SQS would keep.
#[test]
fn twenty_thousand_messages_survive_kills_and_a_paused_server() {
    let n: usize = std::env::var("SLUICE_SQS_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let mut up = Sqs::new("in", "out.fifo", &Sqs::fifo_out());
    // Full batches: moto's cost is per call, whatever the batch holds.
    up.sink_knobs = "batch: {max: 10, wait: 250ms}\n".into();
    let started = Instant::now();
    let report = round_trip_under_faults(&mut up, n, Duplicates::SameId);
    // Each repeat carried the deduplication id of its first copy and was
    // sent within SQS's interval: SQS would have delivered it once.
    let mut by_body: BTreeMap<&str, Vec<&Taken>> = BTreeMap::new();
    for t in &up.kept {
        by_body.entry(t.body.as_str()).or_default().push(t);
    }
    for (body, copies) in &by_body {
        let first = copies[0];
        assert!(first.dedup_id.is_some(), "{body}: no deduplication id");
        assert_eq!(first.group_id.as_deref(), Some("sluice"), "{body}");
        for copy in &copies[1..] {
            assert_eq!(copy.dedup_id, first.dedup_id, "{body}: {copies:?}");
            assert!(
                (copy.sent - first.sent).abs() < DEDUP_INTERVAL_MS,
                "{body}: sent again after SQS's deduplication interval: {copies:?}"
            );
        }
    }
    eprintln!(
        "sqs round trip: {n} messages, {} distinct, {} copies moto kept that SQS would have \
         dropped (same deduplication id within 5 min), {:.0} s",
        report.distinct,
        report.duplicates,
        started.elapsed().as_secs_f64()
    );
}

/// A standard queue: the `delay` attribute (a header after the source)
/// delays its message by that many seconds; the others go at once.
#[test]
fn a_delay_header_delays_its_message_on_a_standard_queue() {
    let mut up = Sqs::new("in", "later", &json!({}));
    up.source_extra = "wait_time: 1s\n".into();
    up.sink_extra = "delay_header: delay\n".into();
    let dir = tempfile::tempdir().expect("dir");
    let daemon = up.daemon(dir.path());
    up.send(&[
        ("now-0", &[]),
        ("late-0", &[("delay", "4")]),
        ("now-1", &[("other", "x")]),
        ("late-1", &[("delay", "4s")]),
    ]);
    up.wait_taken(&daemon, 4);
    let kept = up.kept.clone();
    for t in &kept {
        // Attributes came through as headers and went out as attributes,
        // with the Sluice id beside them.
        assert!(
            t.attributes
                .get("sluice-id")
                .is_some_and(|v| v.as_deref().is_some_and(|id| !id.is_empty())),
            "{t:?}"
        );
        let waited = t.received - t.sent;
        if t.body.starts_with("LATE") {
            assert!(t.attributes.contains_key("delay"), "{t:?}");
            assert!(
                waited >= 3_500,
                "{} was received {waited} ms after it was sent",
                t.body
            );
        }
    }
    let late = kept
        .iter()
        .filter(|t| t.body.starts_with("LATE"))
        .map(|t| t.received)
        .min()
        .unwrap_or(0);
    let now = kept
        .iter()
        .filter(|t| t.body.starts_with("NOW"))
        .map(|t| t.received)
        .max()
        .unwrap_or(i64::MAX);
    assert!(
        now < late,
        "the undelayed messages came after the delayed: {kept:?}"
    );
    assert_eq!(
        kept.iter()
            .find(|t| t.body == "NOW-1")
            .and_then(|t| t.attributes.get("other").cloned().flatten())
            .as_deref(),
        Some("x")
    );
    daemon.term();
}

/// FIFO to FIFO: the input's `MessageGroupId` is the key, which the sink
/// sends as the output's `MessageGroupId`. (Order within a group through
/// the suite's stage is not asserted: its `upper` stage runs 4 workers
/// without `ordering`.)
#[test]
fn a_fifo_group_travels_as_the_key() {
    let mut up = Sqs::new(
        "in.fifo",
        "out.fifo",
        &json!({"FifoQueue": "true", "ContentBasedDeduplication": "false"}),
    );
    up.source_extra = "wait_time: 1s\n".into();
    up.sink_knobs = "batch: {max: 10, wait: 50ms}\n".into();
    let dir = tempfile::tempdir().expect("dir");
    let daemon = up.daemon(dir.path());
    let mut sent = Vec::new();
    for i in 0..30 {
        sent.push((format!("g{}-{i:02}", i % 3), format!("g{}", i % 3)));
    }
    for chunk in sent.chunks(10) {
        let entries: Vec<(&str, &str)> = chunk
            .iter()
            .map(|(b, g)| (b.as_str(), g.as_str()))
            .collect();
        up.send_grouped(&entries);
    }
    up.wait_taken(&daemon, 30);
    let kept = up.kept.clone();
    for group in ["g0", "g1", "g2"] {
        let bodies: Vec<&str> = kept
            .iter()
            .filter(|t| t.group_id.as_deref() == Some(group))
            .map(|t| t.body.as_str())
            .collect();
        assert_eq!(bodies.len(), 10, "{group}: {kept:?}");
        assert!(
            bodies.iter().all(|b| b.starts_with(&group.to_uppercase())),
            "{bodies:?}"
        );
    }
    daemon.term();
}

/// One batch where SQS fails one entry (a delay over 15 minutes), and one
/// that SQS refuses as a whole because one message is too large for the
/// queue: only the guilty entries are dead-lettered, with SQS's code; the
/// others are delivered. A poison upstream message goes to the source's
/// dead-letter topic.
#[test]
fn failed_batch_entries_are_dead_lettered_with_their_code_and_the_rest_delivered() {
    let mut up = Sqs::new("in", "small", &json!({"MaximumMessageSize": "1024"}));
    up.source_extra = "wait_time: 1s\n".into();
    up.sink_knobs = "batch: {max: 10, wait: 300ms}\nretry: {max_attempts: 3, backoff: {initial: 50ms, max: 200ms}}\n".into();
    up.sink_extra = "delay_header: delay\n".into();
    let dir = tempfile::tempdir().expect("dir");
    let daemon = up.daemon(dir.path());
    up.send(&[
        ("ok-0", &[]),
        ("ok-1", &[]),
        ("too-late", &[("delay", "1000")]),
        ("ok-2", &[]),
        ("poison", &[("bad", "line\nbreak")]),
    ]);
    let big = "x".repeat(2_000);
    up.send(&[("ok-3", &[]), (big.as_str(), &[]), ("ok-4", &[])]);
    up.wait_taken(&daemon, 5);
    daemon.wait_until("two rejected writes in edge.out.dlq", LONG, |d| {
        d.depth("edge.out.dlq") >= 2
    });
    std::thread::sleep(Duration::from_secs(1));
    let mut bodies: Vec<String> = up.take().iter().map(|t| t.body.clone()).collect();
    bodies.sort();
    assert_eq!(bodies, ["OK-0", "OK-1", "OK-2", "OK-3", "OK-4"]);
    let dead = daemon.read_all("edge.out.dlq");
    assert_eq!(dead.len(), 2, "{dead:?}");
    let text = |m: &Value| m.to_string();
    let late = dead
        .iter()
        .find(|m| text(m).contains("TOO-LATE"))
        .unwrap_or_else(|| panic!("{dead:?}"));
    assert!(text(late).contains("rejected"), "{late}");
    assert!(text(late).contains("InvalidParameterValue"), "{late}");
    assert!(text(late).contains("DelaySeconds"), "{late}");
    let large = dead
        .iter()
        .find(|m| !text(m).contains("TOO-LATE"))
        .unwrap_or_else(|| panic!("{dead:?}"));
    assert!(text(large).contains("rejected"), "{large}");
    assert!(text(large).contains("InvalidParameterValue"), "{large}");
    assert!(text(large).contains("1024"), "{large}");
    // An SQS message no broker header can carry (a line break in an
    // attribute) is dead-lettered by the source with the reason, and
    // deleted upstream like the others.
    daemon.wait_until("the poison message in edge.src.dlq", LONG, |d| {
        d.depth("edge.src.dlq") >= 1
    });
    let poison = daemon.read_all("edge.src.dlq");
    assert_eq!(poison.len(), 1, "{poison:?}");
    assert!(text(&poison[0]).contains("bad"), "{}", poison[0]);
    assert!(text(&poison[0]).contains("rejected"), "{}", poison[0]);
    let input = up.input.clone();
    daemon.wait_until("the input queue empty", LONG, |_| {
        let a = up.boto.call(&json!({"op": "attributes", "url": input}));
        a["ApproximateNumberOfMessages"] == "0" && a["ApproximateNumberOfMessagesNotVisible"] == "0"
    });
    daemon.term();
}

/// moto paused (SIGSTOP) mid-run: readiness and status show the source
/// and the sink down, no attempt is spent (one attempt allowed, yet
/// nothing is dead-lettered), everything arrives once moto is back, and
/// the secret access key never shows.
#[test]
fn an_outage_is_shown_spends_no_attempts_and_loses_nothing() {
    let mut up = Sqs::new("in", "out", &json!({}));
    up.source_extra = "wait_time: 1s\n".into();
    up.sink_knobs = "batch: {max: 10, wait: 20ms}\nretry: {max_attempts: 1}\n".into();
    let dir = tempfile::tempdir().expect("dir");
    let daemon = up.daemon(dir.path());
    up.produce(0, 400);
    up.wait_taken(&daemon, 50);
    up.moto.pause().expect("SIGSTOP moto");
    daemon.wait_until("readiness degraded by the source", LONG, |d| {
        let ready = d.get("/health/ready");
        ready["status"] == "degraded" && ready.to_string().contains("edge/src")
    });
    let sources = daemon.get("/v1/sources").to_string();
    assert!(sources.contains("\"up\":false"), "{sources}");
    assert!(
        metrics(&daemon).contains("sluice_connector_up{connector=\"edge/src\"} 0"),
        "{}",
        metrics(&daemon)
    );
    // Long enough for the sink's writes in flight to time out too: the
    // quiet window is the check that an outage this long is held, not
    // dead-lettered or crashed, which leaves no event to wait for.
    std::thread::sleep(Duration::from_secs(12));
    let ready = daemon.get("/health/ready").to_string();
    up.moto.resume().expect("SIGCONT moto");
    up.wait_taken(&daemon, 400);
    daemon.wait_until("ready again", LONG, |d| {
        d.get("/health/ready")["status"] == "ready"
    });
    std::thread::sleep(Duration::from_secs(2));
    // A standard queue has no deduplication: a send that timed out while
    // moto was paused, and was taken when it resumed, is there twice,
    // each copy with the same `sluice-id`.
    let mut ids: BTreeMap<&str, Vec<Option<&str>>> = BTreeMap::new();
    for t in up.take() {
        ids.entry(t.body.as_str())
            .or_default()
            .push(t.attributes.get("sluice-id").and_then(Option::as_deref));
    }
    assert_eq!(ids.len(), 400);
    for (body, copies) in &ids {
        assert!(
            copies.iter().all(|id| id.is_some() && *id == copies[0]),
            "{body}: {copies:?}"
        );
    }
    eprintln!(
        "outage: 400 delivered, {} copies on the standard queue (same sluice-id)",
        ids.values().map(|c| c.len() - 1).sum::<usize>()
    );
    assert_eq!(
        daemon.depth("edge.out.dlq"),
        0,
        "an outage spent an attempt"
    );
    let status = daemon.get("/v1/status").to_string();
    let log = daemon.log();
    for (what, text) in [("ready", &ready), ("status", &status), ("log", &log)] {
        assert!(
            !text.contains(sluice_harness::moto::SECRET_ACCESS_KEY),
            "{what} shows the secret access key: {text}"
        );
    }
    assert!(
        ready.contains("ReceiveMessage") || ready.contains("sqs"),
        "{ready}"
    );
    daemon.term();
}

/// The example pipeline passes `validate`.
#[test]
fn the_example_pipeline_validates() {
    let file = sluice_harness::repo_root().join("pipelines/sqs.yaml");
    let out = Command::new(sluice_bin())
        .args(["validate", "--no-plugins"])
        .arg(&file)
        .output()
        .expect("sluice validate");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
