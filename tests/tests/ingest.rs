//! The ingest API against the real thing: the `sluice run` binary with real
//! plugins, on both brokers (`embedded::<name>` and `nats::<name>`, a fresh
//! nats-server per test), driven over plain HTTP as any producer would.
//!
//! - a flood of producers far faster than the stage drains meets 429 with a
//!   `Retry-After`, retries after it, and in the end every message is
//!   processed exactly once, while the daemon's memory stays bounded;
//! - bad input gets a clear 4xx with a JSON error and enqueues nothing;
//! - a repeated `Idempotency-Key` (or batch `id`) is answered 202 with the
//!   same id but stored, and processed, once;
//! - `sluice publish` goes through the ingest API with key, headers and id.
//!
//! Every check is set-based, by message id. Nothing asserts on timing:
//! waits are generous, so a loaded machine makes these slower, never flaky.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::blocking::{Client, Response};
use reqwest::header::HeaderValue;
use serde_json::{Value, json};
use sluice::engine::emit_id;
use sluice_tests::{
    Backend, Daemon, counts, header, on_both_brokers, plugin, sluice_bin, write_pipeline,
};

const LONG: Duration = Duration::from_secs(180);

/// A producer's view of one daemon: raw HTTP, statuses and headers intact.
struct Producer {
    base: String,
    http: Client,
}

impl Producer {
    fn of(daemon: &Daemon) -> Producer {
        Producer {
            base: daemon.base.clone(),
            http: Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(120))
                .build()
                .expect("http client"),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST /v1/topics/{topic}/messages` with `headers` and `body`.
    fn message(
        &self,
        topic: &str,
        headers: &[(&str, HeaderValue)],
        body: impl Into<reqwest::blocking::Body>,
    ) -> Response {
        let mut request = self
            .http
            .post(self.url(&format!("/v1/topics/{topic}/messages")))
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, value.clone());
        }
        request.send().expect("POST messages")
    }

    /// `POST /v1/topics/{topic}/batch` with an optional content type.
    fn batch(&self, topic: &str, content_type: Option<&str>, body: &str) -> Response {
        let mut request = self
            .http
            .post(self.url(&format!("/v1/topics/{topic}/batch")))
            .body(body.to_owned());
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        request.send().expect("POST batch")
    }

    /// `GET /v1/topics/{topic}`: depth, first and last seq.
    fn topic(&self, topic: &str) -> Value {
        let response = self
            .http
            .get(self.url(&format!("/v1/topics/{topic}")))
            .send()
            .expect("GET topic");
        assert_eq!(response.status(), 200, "GET /v1/topics/{topic}");
        response.json().expect("topic JSON")
    }
}

fn id_header(id: &str) -> (&'static str, HeaderValue) {
    (
        "idempotency-key",
        HeaderValue::from_str(id).expect("a valid header value"),
    )
}

/// Asserts a JSON error with `status` and `code`, and returns its body.
fn expect_error(response: Response, status: u16, code: &str, what: &str) -> Value {
    let got = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = response.text().unwrap_or_default();
    assert_eq!(got, status, "{what}: {text}");
    assert!(
        content_type.starts_with("application/json"),
        "{what}: content type {content_type:?}"
    );
    let body: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
    assert_eq!(body["code"], code, "{what}: {body}");
    let message = body["error"].as_str().unwrap_or_default();
    assert!(
        message.len() > 10,
        "{what}: a message people can act on: {body}"
    );
    body
}

/// The daemon's resident set size, from `/proc/<pid>/status`.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A pipeline `name`: topic `in` (with `high_water_mark` when given) ->
/// stage `work` running `plugin` with `config` -> topic `out`, and a topic
/// `side` that no stage reads (what is published there stays readable).
fn pipeline(dir: &Path, name: &str, hwm: Option<u64>, plugin_name: &str, config: &str) -> PathBuf {
    let hwm = hwm.map_or_else(String::new, |n| format!("\n    high_water_mark: {n}"));
    let yaml = format!(
        r#"
name: {name}
topics:
  - name: in{hwm}
  - out
  - side
stages:
  - name: work
    subscribe: in
    plugin: {plugin}
    concurrency: 1
    config: {config}
    publish: [out]
"#,
        plugin = plugin(plugin_name),
    );
    write_pipeline(dir, name, &yaml)
}

/// Waits until `topic` stores at least `n` messages, then a little longer so
/// that a duplicate arriving late would be seen, and reads them all.
fn wait_and_read(daemon: &Daemon, topic: &str, n: usize) -> Vec<Value> {
    daemon.wait_until(&format!("{n} messages in {topic}"), LONG, |d| {
        d.depth(topic) >= n
    });
    std::thread::sleep(Duration::from_secs(2));
    daemon.read_all(topic)
}

/// Asserts `got` holds each id of `expected` exactly once and nothing else.
fn assert_exactly_once(topic: &str, got: &[Value], expected: &BTreeSet<String>) {
    let ids = counts(got.iter().map(|m| m["id"].as_str().unwrap_or_default()));
    let dupes: Vec<_> = ids.iter().filter(|(_, c)| **c > 1).collect();
    assert!(dupes.is_empty(), "{topic}: duplicates {dupes:?}");
    let got: BTreeSet<String> = ids.keys().map(|s| (*s).to_owned()).collect();
    let missing: Vec<_> = expected.difference(&got).take(5).collect();
    let unexpected: Vec<_> = got.difference(expected).take(5).collect();
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "{topic}: {} of {} missing (e.g. {missing:?}), {} unexpected (e.g. {unexpected:?})",
        expected.difference(&got).count(),
        expected.len(),
        got.difference(expected).count(),
    );
}

// ---------------------------------------------------------------- flood

/// Producers at many times the stage's drain rate, into a topic with a
/// `high_water_mark`: 429 with a sane `Retry-After` once it is reached,
/// depth bounded by the mark plus the requests in flight, memory bounded,
/// and every message (each producer retries after `Retry-After` until it is
/// accepted) processed exactly once.
fn a_flood_meets_429_with_retry_after_and_every_accepted_message_is_processed_once(
    backend: &Backend,
) {
    const MESSAGES: usize = 1_200;
    const PRODUCERS: usize = 16;
    const HWM: u64 = 100;
    // The stage works 10 ms per message, one at a time: it drains at most
    // 100 messages a second, while each producer posts back to back.
    let dir = tempfile::tempdir().expect("dir");
    let file = pipeline(dir.path(), "flood", Some(HWM), "sleepy", "{ms: 10}");
    let daemon = Daemon::start_on(backend, &[file.as_path()], &dir.path().join("data"));
    let pid = daemon.pid().expect("running");
    let producer = Arc::new(Producer::of(&daemon));
    let payload = vec![b'f'; 1024];

    let next = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(Mutex::new(Vec::<String>::new()));
    let attempts = Arc::new(AtomicU64::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let retry_afters = Arc::new(Mutex::new(BTreeSet::<u64>::new()));
    let done = Arc::new(AtomicBool::new(false));

    // Memory and depth, sampled from outside for as long as the flood and
    // the drain last.
    let sampler = {
        let done = done.clone();
        let producer = producer.clone();
        std::thread::spawn(move || {
            let mut rss = Vec::new();
            let mut max_depth = 0u64;
            while !done.load(Ordering::Relaxed) {
                if let Some(bytes) = rss_bytes(pid) {
                    rss.push(bytes);
                }
                let depth = producer.topic("in")["depth"].as_u64().expect("depth");
                max_depth = max_depth.max(depth);
                std::thread::sleep(Duration::from_millis(100));
            }
            (rss, max_depth)
        })
    };

    let started = Instant::now();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|_| {
            let (next, accepted, attempts, rejected, retry_afters, producer, payload) = (
                next.clone(),
                accepted.clone(),
                attempts.clone(),
                rejected.clone(),
                retry_afters.clone(),
                producer.clone(),
                payload.clone(),
            );
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= MESSAGES {
                        return;
                    }
                    let id = format!("flood-{i}");
                    // The same id on every retry: a producer that never
                    // heard back may safely send it again.
                    loop {
                        attempts.fetch_add(1, Ordering::Relaxed);
                        let response = producer.message("in", &[id_header(&id)], payload.clone());
                        match response.status().as_u16() {
                            202 => {
                                let receipt: Value = response.json().expect("receipt");
                                assert_eq!(receipt["id"], id.as_str(), "{receipt}");
                                assert_eq!(receipt["topic"], "in", "{receipt}");
                                accepted.lock().expect("lock").push(id);
                                break;
                            }
                            429 => {
                                rejected.fetch_add(1, Ordering::Relaxed);
                                let after = response
                                    .headers()
                                    .get("retry-after")
                                    .expect("a 429 carries Retry-After")
                                    .to_str()
                                    .expect("Retry-After is text")
                                    .parse::<u64>()
                                    .expect("Retry-After is whole seconds");
                                assert!(
                                    (1..=60).contains(&after),
                                    "Retry-After {after} is not a sane wait"
                                );
                                let body: Value = response.json().expect("JSON error");
                                assert_eq!(body["code"], "backpressure", "{body}");
                                retry_afters.lock().expect("lock").insert(after);
                                std::thread::sleep(Duration::from_secs(after));
                            }
                            status => panic!(
                                "unexpected {status}: {}",
                                response.text().unwrap_or_default()
                            ),
                        }
                    }
                }
            })
        })
        .collect();
    for p in producers {
        p.join().expect("a producer panicked");
    }
    let flood_time = started.elapsed();

    let expected: BTreeSet<String> = accepted
        .lock()
        .expect("lock")
        .iter()
        .map(|id| emit_id("flood", "work", id, 0))
        .collect();
    assert_eq!(expected.len(), MESSAGES, "every message was accepted once");
    let outputs = wait_and_read(&daemon, "out", MESSAGES);
    let drain_time = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let (rss, max_depth) = sampler.join().expect("sampler");

    assert_exactly_once("out", &outputs, &expected);
    assert_eq!(daemon.depth("flood.work.dlq"), 0, "nothing dead-lettered");

    let attempts = attempts.load(Ordering::Relaxed);
    let rejected = rejected.load(Ordering::Relaxed);
    eprintln!(
        "flood: {MESSAGES} messages, {PRODUCERS} producers, {attempts} POSTs ({rejected} answered 429, Retry-After {:?}) in {flood_time:.1?}; drained by {drain_time:.1?}; deepest `in` {max_depth} (mark {HWM}); RSS {} samples, max {} MiB",
        retry_afters.lock().expect("lock"),
        rss.len(),
        rss.iter().max().copied().unwrap_or_default() >> 20,
    );
    assert!(rejected > 0, "the flood never met backpressure");
    // A request checks the mark and then publishes, so at most the requests
    // in flight at once can pass it together.
    assert!(
        max_depth < HWM + PRODUCERS as u64,
        "`in` held {max_depth} messages; the mark is {HWM} with {PRODUCERS} producers"
    );

    // Memory: a generous absolute bound, and no growth from the first half
    // of the run to the second (a leak per message or per 429 would show).
    assert!(rss.len() >= 4, "too few RSS samples: {rss:?}");
    let max = rss.iter().max().copied().unwrap_or_default();
    assert!(
        max < 300 << 20,
        "the daemon's RSS reached {} MiB",
        max >> 20
    );
    let (first, second) = rss.split_at(rss.len() / 2);
    let first_max = first.iter().max().copied().unwrap_or_default();
    let second_max = second.iter().max().copied().unwrap_or_default();
    assert!(
        second_max <= first_max + (32 << 20),
        "RSS kept growing: max {} MiB in the first half, {} MiB in the second",
        first_max >> 20,
        second_max >> 20
    );
}

// ---------------------------------------------------------------- bad input

/// Each kind of bad input gets its 4xx with a JSON error, and nothing is
/// enqueued: the topic's last sequence and depth do not move.
fn bad_input_gets_a_json_4xx_and_enqueues_nothing(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = pipeline(dir.path(), "bad", None, "identity", "{}");
    let daemon = Daemon::start_on(backend, &[file.as_path()], &dir.path().join("data"));
    let p = Producer::of(&daemon);
    // `side` has no stage, so whatever was enqueued would stay there.
    let before = p.topic("side");
    let unchanged = |what: &str| {
        let now = p.topic("side");
        assert_eq!(
            now["last_seq"], before["last_seq"],
            "{what} enqueued: {now}"
        );
        assert_eq!(now["depth"], before["depth"], "{what} enqueued: {now}");
    };

    expect_error(
        p.message("side", &[], Vec::new()),
        400,
        "bad_request",
        "empty body",
    );
    unchanged("an empty body");
    expect_error(
        p.batch("side", Some("application/x-ndjson"), ""),
        400,
        "bad_request",
        "empty batch",
    );
    unchanged("an empty batch");

    let line = "{\"payload\":\"x\"}\n";
    for content_type in [Some("application/json"), Some("text/plain"), None] {
        let what = format!("batch as {content_type:?}");
        let body = expect_error(
            p.batch("side", content_type, line),
            415,
            "unsupported_media_type",
            &what,
        );
        assert!(
            body["error"]
                .as_str()
                .unwrap_or_default()
                .contains("application/x-ndjson"),
            "{what}: says what to send: {body}"
        );
        unchanged(&what);
    }

    for path in ["/v1/topics/nope/messages", "/v1/topics/nope/batch"] {
        let response = p
            .http
            .post(p.url(path))
            .header("content-type", "application/x-ndjson")
            .body(line)
            .send()
            .expect("POST");
        let body = expect_error(response, 404, "unknown_topic", path);
        assert!(
            body["error"].as_str().unwrap_or_default().contains("nope"),
            "{body}"
        );
    }
    unchanged("an unknown topic");

    // Over the admin server's body limit (64 MiB) with no claim check:
    // refused by its Content-Length. The body is announced but not sent;
    // sending it all can end in a broken pipe instead of the answer, since
    // the server stops reading once it has answered.
    let (status, raw) = sluice_tests::announce(
        &p.base,
        "/v1/topics/side/messages",
        sluice::admin::DEFAULT_BODY_LIMIT + 1,
    );
    assert_eq!(status, 413, "oversized: {raw}");
    let body = sluice_tests::raw_json_body(&raw);
    assert_eq!(body["code"], "payload_too_large", "oversized: {body}");
    assert!(
        raw.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "oversized: {raw}"
    );
    unchanged("an oversized payload");

    // On NATS, without a claim check, a message must also fit the server's
    // max_payload (1 MiB by default): 413, not a broker failure, also for
    // a batch whose other lines fit.
    if backend.nats_server().is_some() {
        let over = vec![b'n'; 2 << 20];
        expect_error(
            p.message("side", &[], over),
            413,
            "payload_too_large",
            "over NATS max_payload",
        );
        unchanged("a payload over NATS max_payload");
        let text = "n".repeat(2 << 20);
        let body = format!("{line}{}\n", json!({"payload": text}));
        expect_error(
            p.batch("side", Some("application/x-ndjson"), &body),
            413,
            "payload_too_large",
            "a batch line over NATS max_payload",
        );
        unchanged("a batch with a line over NATS max_payload");
    }

    let long = "k".repeat(sluice::admin::MAX_ID_BYTES + 1);
    let malformed: [(&str, HeaderValue); 4] = [
        ("empty", HeaderValue::from_static("")),
        ("too long", HeaderValue::from_str(&long).expect("value")),
        ("a control character", HeaderValue::from_static("a\tb")),
        (
            "not UTF-8",
            HeaderValue::from_bytes(b"id-\xff\xfe").expect("obs-text is a valid value"),
        ),
    ];
    for (what, value) in malformed {
        let response = p.message("side", &[("idempotency-key", value)], "x");
        let body = expect_error(response, 400, "bad_request", what);
        assert!(
            body["error"]
                .as_str()
                .unwrap_or_default()
                .contains("Idempotency-Key"),
            "{what}: names the header: {body}"
        );
        unchanged(&format!("an Idempotency-Key that is {what}"));
    }
    // The same rules for a batch line's id; a bad line fails the batch.
    for id in [json!(""), json!(long), json!("a\u{1}b")] {
        let body = format!("{line}{}\n", json!({"payload": "y", "id": id}));
        let body = expect_error(
            p.batch("side", Some("application/x-ndjson"), &body),
            400,
            "bad_request",
            "a bad batch id",
        );
        assert!(
            body["error"]
                .as_str()
                .unwrap_or_default()
                .starts_with("line 2:"),
            "{body}"
        );
        unchanged("a batch with a bad id");
    }

    // A key or header every broker cannot carry (NATS headers hold no line
    // breaks, and names are printable ASCII without `:`).
    for bad in [
        json!({"payload": "x", "key": "a\nb"}),
        json!({"payload": "x", "headers": {"note": "a\r\nb"}}),
        json!({"payload": "x", "headers": {"a b": "v"}}),
        json!({"payload": "x", "headers": [["a:b", "v"]]}),
    ] {
        let what = format!("batch line {bad}");
        expect_error(
            p.batch("side", Some("application/x-ndjson"), &format!("{bad}\n")),
            400,
            "bad_request",
            &what,
        );
        unchanged(&what);
    }

    // The control: good input moves the counters these checks watch.
    let ok = p.message("side", &[id_header("good-1")], "fine");
    assert_eq!(ok.status(), 202);
    let after = p.topic("side");
    assert_eq!(
        after["last_seq"].as_u64(),
        before["last_seq"].as_u64().map(|s| s + 1),
        "{after}"
    );
}

// ---------------------------------------------------------------- dedup

/// A repeated `Idempotency-Key`, or a repeated batch `id`, within the
/// window: 202 with the same id, stored once, processed once downstream,
/// also when the repeat comes after the first copy was processed.
fn a_repeated_idempotency_key_is_accepted_but_enqueued_and_processed_once(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = pipeline(dir.path(), "dup", None, "identity", "{}");
    let daemon = Daemon::start_on(backend, &[file.as_path()], &dir.path().join("data"));
    let p = Producer::of(&daemon);
    let last_seq = |topic: &str| p.topic(topic)["last_seq"].as_u64().expect("last_seq");
    let start = last_seq("in");

    let mut receipts = Vec::new();
    for body in ["first", "second", "third"] {
        let response = p.message("in", &[id_header("order-1")], body);
        assert_eq!(response.status(), 202);
        receipts.push(response.json::<Value>().expect("receipt"));
    }
    for r in &receipts {
        assert_eq!(r["id"], "order-1", "{r}");
        assert_eq!(r["seq"], receipts[0]["seq"], "the original's seq: {r}");
    }
    let duplicates: Vec<_> = receipts.iter().map(|r| r["duplicate"].clone()).collect();
    assert_eq!(duplicates, [json!(false), json!(true), json!(true)]);
    assert_eq!(last_seq("in"), start + 1, "stored once");

    // A batch repeating ids among its own lines and the message above.
    let batch = ["a", "b", "a", "order-1", "c", "b"]
        .iter()
        .map(|id| json!({"id": id, "payload": format!("p-{id}")}).to_string() + "\n")
        .collect::<String>();
    let response = p.batch("in", Some("application/x-ndjson"), &batch);
    assert_eq!(response.status(), 202);
    let receipt: Value = response.json().expect("receipt");
    assert_eq!(receipt["published"], 3, "{receipt}");
    assert_eq!(receipt["duplicates"], 3, "{receipt}");
    let lines = receipt["messages"].as_array().expect("messages");
    let flags: Vec<bool> = lines.iter().map(|l| l["duplicate"] == true).collect();
    assert_eq!(flags, [false, false, true, true, false, true], "{receipt}");
    assert_eq!(lines[0]["seq"], lines[2]["seq"], "{receipt}");
    assert_eq!(lines[3]["seq"], receipts[0]["seq"], "{receipt}");
    assert_eq!(last_seq("in"), start + 4, "a, b and c stored once each");

    let expected: BTreeSet<String> = ["order-1", "a", "b", "c"]
        .iter()
        .map(|id| emit_id("dup", "work", id, 0))
        .collect();
    let outputs = wait_and_read(&daemon, "out", expected.len());
    assert_exactly_once("out", &outputs, &expected);
    let first = outputs
        .iter()
        .find(|m| m["id"] == emit_id("dup", "work", "order-1", 0).as_str())
        .expect("order-1's output");
    assert_eq!(first["payload"], "first", "the first copy is the one kept");

    // After the first copy was processed and acked, the id is still within
    // the window: a late retry is still a duplicate.
    let response = p.message("in", &[id_header("order-1")], "late");
    assert_eq!(response.status(), 202);
    let late: Value = response.json().expect("receipt");
    assert_eq!(late["duplicate"], true, "{late}");
    assert_eq!(late["seq"], receipts[0]["seq"], "{late}");
    let response = p.batch(
        "in",
        Some("application/jsonl"),
        "{\"id\":\"c\",\"payload\":\"late\"}",
    );
    let late: Value = response.json().expect("receipt");
    assert_eq!(late["duplicates"], 1, "{late}");
    assert_eq!(last_seq("in"), start + 4, "nothing more stored");
    let outputs = wait_and_read(&daemon, "out", expected.len());
    assert_exactly_once("out", &outputs, &expected);
}

// ---------------------------------------------------------------- the CLI

fn sluice(daemon: &Daemon, args: &[&str], stdin: Option<&Path>) -> Output {
    let mut command = Command::new(sluice_bin());
    command
        .args(args)
        .env("SLUICE_ADMIN", &daemon.base)
        .env_remove("SLUICE_BROKER");
    if let Some(path) = stdin {
        command.stdin(std::fs::File::open(path).expect("stdin file"));
    }
    command.output().expect("run sluice")
}

/// `sluice publish` against a daemon goes through the ingest API: `--id`
/// is the idempotency key, `--key` and `--header` arrive as given, and any
/// payload bytes survive.
fn sluice_publish_goes_through_the_ingest_api(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = pipeline(dir.path(), "cli", None, "identity", "{}");
    let daemon = Daemon::start_on(backend, &[file.as_path()], &dir.path().join("data"));
    let stdout = |out: &Output| {
        assert!(
            out.status.success(),
            "sluice publish failed: {}; daemon log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            daemon.log()
        );
        serde_json::from_slice::<Value>(&out.stdout).expect("a JSON receipt")
    };

    let args = [
        "publish",
        "side",
        "--data",
        "hello",
        "--key",
        "cust-7",
        "--header",
        "trace=abc",
        "--header",
        "source=cli",
        "--id",
        "cli-1",
    ];
    let first = stdout(&sluice(&daemon, &args, None));
    assert_eq!(first["id"], "cli-1");
    assert_eq!(first["topic"], "side");
    assert_eq!(first["duplicate"], false);
    let again = stdout(&sluice(&daemon, &args, None));
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["seq"], first["seq"]);

    // Bytes that are not text, from stdin; a header name with capitals and
    // values HTTP headers do not carry exactly (a tab), which go as a batch
    // line instead.
    let bin = dir.path().join("payload.bin");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    std::fs::write(&bin, &bytes).expect("write");
    let binary = stdout(&sluice(
        &daemon,
        &["publish", "side", "-", "--id", "cli-2"],
        Some(&bin),
    ));
    assert_eq!(binary["id"], "cli-2");
    let odd = stdout(&sluice(
        &daemon,
        &[
            "publish",
            "side",
            "--data",
            "odd",
            "--header",
            "Region=eu",
            "--header",
            "note=two\tcols",
            "--key",
            "cust\t7",
        ],
        None,
    ));
    let odd_id = odd["id"].as_str().expect("a fresh id").to_owned();
    assert!(!odd_id.is_empty());

    // What the daemon refuses comes back as its error, exit 2: an empty id;
    // a line break in a header value, which NATS headers cannot carry (so
    // it is refused on both brokers).
    let refused = |args: &[&str]| {
        let out = sluice(&daemon, args, None);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        stderr
    };
    refused(&["publish", "side", "--data", "x", "--id", ""]);
    let stderr = refused(&["publish", "side", "--data", "x", "--header", "note=a\nb"]);
    assert!(stderr.contains("line break"), "{stderr}");
    let out = sluice(&daemon, &["publish", "nope", "--data", "x"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown topic `nope`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let stored = daemon.read_all("side");
    assert_eq!(
        stored.len(),
        3,
        "cli-1 once, cli-2, the odd one: {stored:?}"
    );
    let m = &stored[0];
    assert_eq!(
        (m["id"].as_str(), m["payload"].as_str()),
        (Some("cli-1"), Some("hello"))
    );
    assert_eq!(m["key"], "cust-7");
    assert_eq!(header(m, "trace"), Some("abc"));
    assert_eq!(header(m, "source"), Some("cli"));
    let m = &stored[1];
    assert_eq!(m["id"], "cli-2");
    let decoded = base64_decode(m["payload_base64"].as_str().expect("binary payload"));
    assert_eq!(decoded, bytes, "the payload bytes survive");
    let m = &stored[2];
    assert_eq!(m["id"], odd_id.as_str());
    assert_eq!(m["key"], "cust\t7");
    assert_eq!(header(m, "Region"), Some("eu"), "{m}");
    assert_eq!(header(m, "note"), Some("two\tcols"), "{m}");
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64")
}

on_both_brokers!(
    a_flood_meets_429_with_retry_after_and_every_accepted_message_is_processed_once,
    bad_input_gets_a_json_4xx_and_enqueues_nothing,
    a_repeated_idempotency_key_is_accepted_but_enqueued_and_processed_once,
    sluice_publish_goes_through_the_ingest_api,
);
