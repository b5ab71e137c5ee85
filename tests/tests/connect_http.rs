//! The HTTP webhook sink against the real thing: the `sluice run` binary
//! delivering to a real HTTP server of the test's own (hyper on
//! `127.0.0.1`, plain or TLS), which records every request with its
//! arrival time and answers as the test tells it to.
//!
//! - every good message is delivered (one distinct `Idempotency-Key` with a
//!   2xx each) through 503s, 429s with `Retry-After`, and requests that
//!   hang past the timeout; no retry after a 429 comes before its
//!   `Retry-After`; each `bad` message is dead-lettered as `rejected` with
//!   the status and the body; every signature verifies with the Python
//!   snippet of `docs/connectors/http.md`, run as it is;
//! - an unreachable target holds messages without spending attempts, with
//!   readiness `degraded` naming the sink, and all arrive once it is up;
//! - the request carries the method, content type, key, message headers
//!   and configured headers, and a message's W3C `traceparent` as its own;
//! - `ordering` keeps per-key order with concurrency 4, and `batch` works;
//! - `tls_ca` trusts a self-signed receiver; an untrusted one is held and
//!   said so; a CA file that holds no certificate refuses start-up;
//! - the URL's password, the secret and header values are never shown.
//!
//! Checks are set-based by message id; waits are generous, nothing
//! asserts on speed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::receiver::{Behaviour, Hit, Hits, Receiver, Reply, always};
use sluice_tests::{Backend, Daemon, Msg, on_both_brokers, sluice_to_exit, write_pipeline};

/// A port nothing listens on (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// The distinct `Idempotency-Key`s answered 2xx (on `path`, when given).
fn delivered(hits: &[Hit], path: Option<&str>) -> BTreeSet<String> {
    hits.iter()
        .filter(|h| (200..300).contains(&h.status))
        .filter(|h| path.is_none_or(|p| h.path == p))
        .map(Hit::key)
        .collect()
}

fn wait_for(what: &str, daemon: &Daemon, mut done: impl FnMut() -> bool) {
    daemon.wait_until(what, Duration::from_secs(120), |_| done());
}

fn dlq(daemon: &Daemon, pipeline: &str, sink: &str) -> Vec<Value> {
    daemon.get(&format!("/v1/dlq/{pipeline}/{sink}?limit=1000"))["entries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn ready(daemon: &Daemon) -> Value {
    daemon.get("/health/ready")
}

// ---------------------------------------------------------------------
// The signature snippet of docs/connectors/http.md
// ---------------------------------------------------------------------

/// The first ```python block of the connector's docs, as it is (the
/// README links to it), so what the docs show is what runs.
fn doc_snippet() -> String {
    let path = sluice_harness::repo_root().join("docs/connectors/http.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let start = doc.find("```python\n").expect("a ```python block") + "```python\n".len();
    let len = doc[start..].find("```").expect("the block ends");
    doc[start..start + len].to_owned()
}

/// Runs the docs' `verify` on each `(Sluice-Signature, body)`.
fn verify_with_doc_snippet(secret: &str, cases: &[(String, Vec<u8>)]) -> Vec<bool> {
    let script = format!(
        "{}\n\nimport json, sys\nsecret = sys.argv[1].encode()\nfor line in sys.stdin:\n    \
         case = json.loads(line)\n    \
         print('ok' if verify(secret, case['header'], bytes.fromhex(case['body'])) else 'bad')\n",
        doc_snippet()
    );
    let mut child = Command::new("python3")
        .args(["-c", &script, secret])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        for (header, body) in cases {
            let line = serde_json::json!({"header": header, "body": hex::encode(body)});
            writeln!(stdin, "{line}").expect("write a case");
        }
    }
    let out = child.wait_with_output().expect("python3 runs");
    assert!(
        out.status.success(),
        "the docs snippet failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdicts: Vec<bool> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l == "ok")
        .collect();
    assert_eq!(verdicts.len(), cases.len());
    verdicts
}

// ---------------------------------------------------------------------
// 1. 503s, 429s, 400s, hangs: everything good arrives, bad is dead-lettered
// ---------------------------------------------------------------------

const SECRET: &str = "whsec-Kp2mQ7vX";

on_both_brokers!(
    every_good_message_arrives_through_503_429_timeouts_and_bad_ones_are_rejected,
    an_unreachable_target_holds_messages_without_spending_attempts,
);

fn every_good_message_arrives_through_503_429_timeouts_and_bad_ones_are_rejected(
    backend: &Backend,
) {
    // First attempt of every message: 503. Then by payload: `bad-*` 400,
    // `later-*` 429 with Retry-After: 2 once, `slow-*` hangs past the
    // sink's 1s timeout once, the rest 200.
    let behaviour: Behaviour = Arc::new(|hit, earlier| {
        let body = hit.text();
        if earlier == 0 {
            return Reply::status(503).body("busy, try again");
        }
        if body.starts_with("bad") {
            return Reply::status(400).body(format!("bad payload: {body}\nrefused"));
        }
        if body.starts_with("later") && earlier == 1 {
            return Reply::status(429).header("retry-after", "2");
        }
        if body.starts_with("slow") && earlier == 1 {
            let mut reply = Reply::status(200);
            reply.hang = Some(Duration::from_secs(4));
            return reply;
        }
        Reply::status(200).body("thanks")
    });
    let receiver = Receiver::start(behaviour);
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(
        dir.path(),
        "hooks",
        &format!(
            "name: hooks\n\
             topics: [out]\n\
             sinks:\n\
             \x20 - name: notify\n\
             \x20   subscribe: out\n\
             \x20   concurrency: 4\n\
             \x20   retry: {{max_attempts: 10, backoff: {{initial: 100ms, max: 5s}}}}\n\
             \x20   http:\n\
             \x20     url: {}\n\
             \x20     secret: ${{HOOK_SECRET}}\n\
             \x20     timeout: 1s\n",
            receiver.url("http", "/hook")
        ),
    );
    let daemon = Daemon::start_with_env(
        backend.broker_url(),
        &[&pipeline],
        &dir.path().join("data"),
        vec![("HOOK_SECRET".into(), SECRET.into())],
    );

    let n = 60;
    let payload = |i: usize| match i {
        _ if i % 10 == 3 => format!("bad-{i}"),
        _ if i % 10 == 5 => format!("later-{i}"),
        _ if i % 20 == 7 => format!("slow-{i}"),
        _ => format!("good-{i}"),
    };
    let messages: Vec<Msg> = (0..n)
        .map(|i| Msg::new(format!("m{i:03}"), payload(i)))
        .collect();
    daemon.publish("out", &messages);
    let good: BTreeSet<String> = messages
        .iter()
        .filter(|m| !m.payload.starts_with("bad"))
        .map(|m| m.id.clone())
        .collect();
    let bad: BTreeSet<String> = messages
        .iter()
        .filter(|m| m.payload.starts_with("bad"))
        .map(|m| m.id.clone())
        .collect();
    assert_eq!((good.len(), bad.len()), (54, 6));

    wait_for(
        "every good message delivered and every bad one dead-lettered",
        &daemon,
        || {
            delivered(&receiver.hits(), None).len() == good.len()
                && dlq(&daemon, "hooks", "notify").len() == bad.len()
        },
    );
    let hits = receiver.hits();

    // Every good message delivered: the distinct keys with a 2xx.
    assert_eq!(delivered(&hits, None), good);

    // No retry after a 429 came sooner than its Retry-After (2 s; a small
    // slack for the two clocks' reading points).
    let mut after_429 = 0;
    for (i, hit) in hits.iter().enumerate() {
        if hit.status != 429 {
            continue;
        }
        let next = hits[i + 1..]
            .iter()
            .find(|h| h.key() == hit.key())
            .unwrap_or_else(|| panic!("no retry after the 429 of {}", hit.key()));
        let gap = next.at.duration_since(hit.at);
        assert!(
            gap >= Duration::from_millis(1950),
            "{} was retried {gap:?} after a 429 with Retry-After: 2",
            hit.key()
        );
        after_429 += 1;
    }
    assert_eq!(after_429, 6, "every `later` message met one 429");
    // The hung requests were left behind and tried again.
    let hung: BTreeSet<String> = hits
        .iter()
        .filter(|h| h.status == 0)
        .map(Hit::key)
        .collect();
    assert_eq!(hung.len(), 3, "{hung:?}");
    assert!(hung.is_subset(&good));

    // Each bad message is dead-lettered as rejected, with the status and
    // the body's first line of text; nothing else is.
    let entries = dlq(&daemon, "hooks", "notify");
    let ids: BTreeSet<String> = entries
        .iter()
        .map(|e| e["id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(ids, bad);
    for entry in &entries {
        let id = entry["id"].as_str().expect("id");
        let i: usize = id[1..].parse().expect("index");
        assert_eq!(entry["kind"], "rejected", "{entry}");
        let error = entry["error"].as_str().expect("error");
        assert_eq!(
            error,
            format!("HTTP 400: bad payload: bad-{i} refused"),
            "{entry}"
        );
    }

    // Every request was signed, and every signature verifies with the
    // docs' snippet; a changed body or another secret does not.
    let cases: Vec<(String, Vec<u8>)> = hits
        .iter()
        .map(|h| {
            (
                h.header("sluice-signature")
                    .unwrap_or_else(|| panic!("unsigned request {h:?}"))
                    .to_owned(),
                h.body.clone(),
            )
        })
        .collect();
    let verdicts = verify_with_doc_snippet(SECRET, &cases);
    assert!(verdicts.iter().all(|ok| *ok), "{verdicts:?}");
    let forged: Vec<(String, Vec<u8>)> = cases
        .iter()
        .take(3)
        .map(|(sig, body)| (sig.clone(), [body.as_slice(), b"!"].concat()))
        .collect();
    assert!(
        verify_with_doc_snippet(SECRET, &forged)
            .iter()
            .all(|ok| !ok)
    );
    assert!(
        verify_with_doc_snippet("another", &cases[..3])
            .iter()
            .all(|ok| !ok)
    );
    let old = format!(
        "t=1000000000,v1={}",
        hex::encode([0u8; 32]) // any v1: the timestamp alone refuses it
    );
    assert_eq!(
        verify_with_doc_snippet(SECRET, &[(old, Vec::new())]),
        vec![false]
    );
}

// ---------------------------------------------------------------------
// 2. An unreachable target: held, no attempt spent, degraded, then all
// ---------------------------------------------------------------------

fn an_unreachable_target_holds_messages_without_spending_attempts(backend: &Backend) {
    let port = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(
        dir.path(),
        "hooks",
        &format!(
            "name: hooks\n\
             topics: [out]\n\
             sinks:\n\
             \x20 - name: notify\n\
             \x20   subscribe: out\n\
             \x20   concurrency: 2\n\
             \x20   retry: {{max_attempts: 3, backoff: {{initial: 100ms, max: 500ms}}}}\n\
             \x20   http:\n\
             \x20     url: http://127.0.0.1:{port}/hook\n\
             \x20     timeout: 2s\n"
        ),
    );
    let daemon = Daemon::start_on(backend, &[&pipeline], &dir.path().join("data"));
    let batch = |from: usize| -> Vec<Msg> {
        (from..from + 10)
            .map(|i| Msg::new(format!("m{i:03}"), format!("hello {i}")))
            .collect()
    };
    let hits = Hits::default();

    // Not started yet.
    daemon.publish("out", &batch(0));
    wait_for("readiness degraded naming the sink", &daemon, || {
        let (status, reasons) = daemon.readiness();
        status == "degraded" && reasons.contains("hooks/notify")
    });
    // Many rounds of backoff (max 500ms) pass: with 3 attempts each, a
    // message whose attempts were spent would be dead-lettered by now. The
    // quiet window is the check: a held message leaves no event.
    std::thread::sleep(Duration::from_secs(4));
    assert!(dlq(&daemon, "hooks", "notify").is_empty());
    let (_, reasons) = daemon.readiness();
    assert!(reasons.contains("cannot connect"), "{reasons}");

    let mut receiver = Receiver::start_on(port, None, always(200), hits.clone());
    wait_for("the first ten delivered", &daemon, || {
        delivered(&receiver.hits(), None).len() == 10
    });
    wait_for("readiness back to ready", &daemon, || {
        daemon.readiness().0 == "ready"
    });

    // Stopped mid-run.
    receiver.stop();
    daemon.publish("out", &batch(10));
    wait_for("readiness degraded again", &daemon, || {
        let (status, reasons) = daemon.readiness();
        status == "degraded" && reasons.contains("hooks/notify")
    });
    // As above: the window outlasts three attempts' backoff many times,
    // and no dead letter is the check.
    std::thread::sleep(Duration::from_secs(4));
    assert!(dlq(&daemon, "hooks", "notify").is_empty());

    let receiver = Receiver::start_on(port, None, always(200), hits.clone());
    wait_for("all twenty delivered", &daemon, || {
        delivered(&receiver.hits(), None).len() == 20
    });
    let expected: BTreeSet<String> = (0..20).map(|i| format!("m{i:03}")).collect();
    assert_eq!(delivered(&receiver.hits(), None), expected);
    assert!(dlq(&daemon, "hooks", "notify").is_empty());
    assert!(
        daemon.log().contains("cannot reach the outside system"),
        "the outage is logged:\n{}",
        daemon.log()
    );
    // The outage was seen as such, and no attempt was spent on it.
    let processed = |outcome: &str| processed(&daemon, "hooks", "notify", outcome);
    // A delivery is counted once its ack is written, a moment after the
    // receiver saw the request.
    wait_for("every delivery acked", &daemon, || processed("ok") == 20);
    assert!(processed("unavailable") > 0);
    assert_eq!(processed("retry"), 0);
    assert_eq!(processed("dead-lettered"), 0);
    assert_eq!(processed("ok"), 20);
}

/// `sluice_messages_processed_total` of a stage for one outcome.
fn processed(daemon: &Daemon, pipeline: &str, stage: &str, outcome: &str) -> u64 {
    let text = reqwest::blocking::get(format!("{}/metrics", daemon.base))
        .and_then(|r| r.text())
        .expect("GET /metrics");
    let labels = [
        format!("pipeline=\"{pipeline}\""),
        format!("stage=\"{stage}\""),
        format!("outcome=\"{outcome}\""),
    ];
    text.lines()
        .filter(|l| l.starts_with("sluice_messages_processed_total{"))
        .filter(|l| labels.iter().all(|label| l.contains(label.as_str())))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

// ---------------------------------------------------------------------
// 3. What a request carries
// ---------------------------------------------------------------------

#[test]
fn the_request_carries_method_content_type_key_headers_and_configured_headers() {
    let receiver = Receiver::start(always(204));
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(
        dir.path(),
        "hooks",
        &format!(
            "name: hooks\n\
             topics: [out]\n\
             sinks:\n\
             \x20 - name: notify\n\
             \x20   subscribe: out\n\
             \x20   http:\n\
             \x20     url: {}\n\
             \x20     method: PUT\n\
             \x20     headers: {{X-Team: payments, User-Agent: billing-hooks/1}}\n",
            receiver
                .url("http", "/in?src=sluice")
                .replace("http://", "http://hooks:p%40ss@")
        ),
    );
    let daemon = Daemon::start(&[&pipeline], &dir.path().join("data"));
    // One through the single-message endpoint, headers as HTTP headers.
    let client = reqwest::blocking::Client::new();
    let response = client
        .post(format!("{}/v1/topics/out/messages", daemon.base))
        .header("idempotency-key", "h1")
        .header("sluice-key", "cust-42")
        .header("sluice-header-content-type", "application/json")
        .header("sluice-header-trace", "abc-123")
        .body(r#"{"total": 12}"#)
        .send()
        .expect("publish");
    assert!(response.status().is_success(), "{}", response.status());
    // One through the batch endpoint: no key, no content type, a header
    // name and a value HTTP cannot carry as they are, and a repeated one.
    let line = serde_json::json!({
        "id": "h2",
        "payload": "plain",
        "headers": [["trace(id)", "x y\u{1}z"], ["Tag", "a"], ["Tag", "b"]],
    });
    let response = client
        .post(format!("{}/v1/topics/out/batch", daemon.base))
        .header("content-type", "application/x-ndjson")
        .body(format!("{line}\n"))
        .send()
        .expect("publish");
    assert!(response.status().is_success(), "{}", response.status());

    wait_for("both delivered", &daemon, || {
        delivered(&receiver.hits(), None).len() == 2
    });
    let hits = receiver.hits();
    let h1 = hits.iter().find(|h| h.key() == "h1").expect("h1");
    assert_eq!(h1.method, "PUT");
    assert_eq!(h1.path, "/in");
    assert_eq!(h1.text(), r#"{"total": 12}"#);
    assert_eq!(h1.header("content-type"), Some("application/json"));
    assert_eq!(h1.header("sluice-key"), Some("cust-42"));
    assert_eq!(h1.header("sluice-header-trace"), Some("abc-123"));
    assert_eq!(
        h1.header("sluice-header-content-type"),
        Some("application/json")
    );
    assert_eq!(h1.header("x-team"), Some("payments"));
    assert_eq!(h1.header("user-agent"), Some("billing-hooks/1"));
    // The URL's user and password, as Basic credentials ("hooks:p@ss").
    assert_eq!(h1.header("authorization"), Some("Basic aG9va3M6cEBzcw=="));
    assert_eq!(
        h1.header("sluice-signature"),
        None,
        "no secret, no signature"
    );

    let h2 = hits.iter().find(|h| h.key() == "h2").expect("h2");
    assert_eq!(h2.text(), "plain");
    assert_eq!(h2.header("content-type"), Some("application/octet-stream"));
    assert_eq!(h2.header("sluice-key"), None);
    assert_eq!(h2.header("sluice-header-trace%28id%29"), Some("x y%01z"));
    let tags: Vec<&str> = h2
        .headers
        .iter()
        .filter(|(n, _)| n == "sluice-header-tag")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(tags, ["a", "b"]);
    assert_eq!(h2.header("x-team"), Some("payments"));
}

/// A W3C `traceparent` given to ingest arrives as the request's own
/// `traceparent` (and `tracestate`), through a stage whose handler drops
/// every header (the engine carries the context on).
#[test]
fn the_trace_context_arrives_as_the_requests_traceparent() {
    const PARENT: &str = sluice_tests::TRACEPARENT;
    let receiver = Receiver::start(always(204));
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(
        dir.path(),
        "hooks",
        &format!(
            "name: hooks\n\
             topics: [in, out]\n\
             stages:\n\
             \x20 - name: drop-headers\n\
             \x20   subscribe: in\n\
             \x20   plugin: {}\n\
             \x20   config: {{lines: 0}}\n\
             \x20   publish: [out]\n\
             sinks:\n\
             \x20 - name: notify\n\
             \x20   subscribe: out\n\
             \x20   http:\n\
             \x20     url: {}\n",
            sluice_tests::plugin("chatty"),
            receiver.url("http", "/in"),
        ),
    );
    let daemon = Daemon::start(&[&pipeline], &dir.path().join("data"));
    let client = reqwest::blocking::Client::new();
    for (id, parent) in [("traced", PARENT), ("broken", "00-nope-01")] {
        let response = client
            .post(format!("{}/v1/topics/in/messages", daemon.base))
            .header("idempotency-key", id)
            .header("traceparent", parent)
            .header("tracestate", sluice_tests::TRACESTATE)
            .body(id)
            .send()
            .expect("publish");
        assert_eq!(response.status(), 202, "{id}");
    }
    wait_for("both delivered", &daemon, || {
        receiver.hits().iter().filter(|h| h.status == 204).count() == 2
    });
    let hits = receiver.hits();
    let by_body = |body: &str| hits.iter().find(|h| h.text() == body).expect(body);
    let traced = by_body("traced");
    assert_eq!(traced.header("traceparent"), Some(PARENT));
    assert_eq!(traced.header("tracestate"), Some(sluice_tests::TRACESTATE));
    assert_eq!(traced.header("sluice-header-traceparent"), Some(PARENT));
    let broken = by_body("broken");
    assert_eq!(broken.header("traceparent"), None, "{broken:?}");
    assert_eq!(broken.header("tracestate"), None, "{broken:?}");
}

// ---------------------------------------------------------------------
// 4. Stage knobs on a sink: per-key order with concurrency 4, batches
// ---------------------------------------------------------------------

#[test]
fn ordering_keeps_per_key_order_with_concurrency_and_batches_deliver_everything() {
    // A small, varying delay shuffles what is not ordered.
    let behaviour: Behaviour = Arc::new(|_, _| {
        let mut reply = Reply::status(200);
        reply.delay = Some(Duration::from_millis(fastrand::u64(0..8)));
        reply
    });
    let receiver = Receiver::start(behaviour);
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(
        dir.path(),
        "knobs",
        &format!(
            "name: knobs\n\
             topics: [ordered, batched]\n\
             sinks:\n\
             \x20 - name: in-order\n\
             \x20   subscribe: ordered\n\
             \x20   concurrency: 4\n\
             \x20   ordering: {{key: key}}\n\
             \x20   http: {{url: '{}'}}\n\
             \x20 - name: in-batches\n\
             \x20   subscribe: batched\n\
             \x20   concurrency: 2\n\
             \x20   batch: {{max: 10, wait: 20ms}}\n\
             \x20   http: {{url: '{}'}}\n",
            receiver.url("http", "/ordered"),
            receiver.url("http", "/batched"),
        ),
    );
    let daemon = Daemon::start(&[&pipeline], &dir.path().join("data"));
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5"];
    let per_key = 25;
    let ordered: Vec<Msg> = (0..per_key)
        .flat_map(|seq| {
            keys.iter()
                .map(move |k| Msg::new(format!("{k}-{seq:03}"), format!("{k}:{seq}")).key(*k))
        })
        .collect();
    daemon.publish("ordered", &ordered);
    let batched: Vec<Msg> = (0..100)
        .map(|i| Msg::new(format!("b{i:03}"), format!("b{i}")))
        .collect();
    daemon.publish("batched", &batched);

    wait_for("everything delivered", &daemon, || {
        let hits = receiver.hits();
        delivered(&hits, Some("/ordered")).len() == ordered.len()
            && delivered(&hits, Some("/batched")).len() == batched.len()
    });
    let hits = receiver.hits();
    // Per key, the first arrival of each message is in publish order.
    let mut seen: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut first = BTreeSet::new();
    for hit in hits.iter().filter(|h| h.path == "/ordered") {
        if !first.insert(hit.key()) {
            continue;
        }
        let text = hit.text();
        let (key, seq) = text.split_once(':').expect("key:seq");
        assert_eq!(hit.header("sluice-key"), Some(key));
        seen.entry(key.to_owned())
            .or_default()
            .push(seq.parse().expect("seq"));
    }
    assert_eq!(seen.len(), keys.len());
    for (key, seqs) in &seen {
        let expected: Vec<usize> = (0..per_key).collect();
        assert_eq!(seqs, &expected, "key {key} arrived out of order");
    }
    let batched_ids: BTreeSet<String> = batched.iter().map(|m| m.id.clone()).collect();
    assert_eq!(delivered(&hits, Some("/batched")), batched_ids);
    assert!(dlq(&daemon, "knobs", "in-order").is_empty());
    assert!(dlq(&daemon, "knobs", "in-batches").is_empty());
}

// ---------------------------------------------------------------------
// 5. TLS
// ---------------------------------------------------------------------

fn tls_acceptor(cert: &rcgen::CertifiedKey<rcgen::KeyPair>) -> tokio_rustls::TlsAcceptor {
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(rustls_pki_types::PrivatePkcs8KeyDer::from(
        cert.signing_key.serialize_der(),
    ));
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .expect("server config");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

#[test]
fn tls_ca_trusts_a_self_signed_receiver_and_an_untrusted_one_is_held_and_said() {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("a self-signed certificate");
    let receiver = Receiver::start_on(0, Some(tls_acceptor(&cert)), always(200), Hits::default());
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("certs")).expect("mkdir");
    std::fs::write(dir.path().join("certs/ca.pem"), cert.cert.pem()).expect("write ca");
    let pipeline = write_pipeline(
        dir.path(),
        "secure",
        &format!(
            "name: secure\n\
             topics: [a, b]\n\
             sinks:\n\
             \x20 - name: trusted\n\
             \x20   subscribe: a\n\
             \x20   http:\n\
             \x20     url: {}\n\
             \x20     tls_ca: certs/ca.pem\n\
             \x20 - name: untrusted\n\
             \x20   subscribe: b\n\
             \x20   retry: {{max_attempts: 2, backoff: {{initial: 100ms, max: 500ms}}}}\n\
             \x20   http:\n\
             \x20     url: {}\n",
            receiver.url("https", "/trusted"),
            receiver.url("https", "/untrusted"),
        ),
    );
    // Started from elsewhere: `tls_ca` is relative to the pipeline file.
    let daemon = Daemon::start(&[&pipeline], &dir.path().join("data"));
    let msgs = |p: &str| -> Vec<Msg> {
        (0..5)
            .map(|i| Msg::new(format!("{p}{i}"), format!("secret-ish {i}")))
            .collect()
    };
    daemon.publish("a", &msgs("a"));
    daemon.publish("b", &msgs("b"));
    wait_for("the trusted sink delivers over TLS", &daemon, || {
        delivered(&receiver.hits(), Some("/trusted")).len() == 5
    });
    wait_for(
        "readiness says the certificate is not trusted",
        &daemon,
        || {
            let (status, reasons) = daemon.readiness();
            status == "degraded"
                && reasons.contains("secure/untrusted")
                && reasons.contains("not trusted")
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        dlq(&daemon, "secure", "untrusted").is_empty(),
        "held, not dead-lettered"
    );
    assert!(delivered(&receiver.hits(), Some("/untrusted")).is_empty());
    let log = daemon.log();
    assert!(
        log.contains("TLS certificate is not trusted") && log.contains("tls_ca"),
        "the log says why:\n{log}"
    );
    // Once per outage, not once per attempt.
    assert_eq!(log.matches("not trusted").count(), 1, "{log}");
}

/// [`tls_acceptor`] that also requires a client certificate issued by
/// (or equal to, when self-signed) `client_ca`.
fn tls_acceptor_requiring(
    cert: &rcgen::CertifiedKey<rcgen::KeyPair>,
    client_ca: &rcgen::CertifiedKey<rcgen::KeyPair>,
) -> tokio_rustls::TlsAcceptor {
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(rustls_pki_types::PrivatePkcs8KeyDer::from(
        cert.signing_key.serialize_der(),
    ));
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(client_ca.cert.der().clone()).expect("client CA");
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("client verifier");
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .expect("server config");
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

#[test]
fn a_receiver_that_requires_client_certificates_gets_tls_cert_and_one_without_is_held() {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("a self-signed certificate");
    let client = rcgen::generate_simple_self_signed(vec!["sluice-client".into()])
        .expect("a client certificate");
    let receiver = Receiver::start_on(
        0,
        Some(tls_acceptor_requiring(&cert, &client)),
        always(200),
        Hits::default(),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("certs")).expect("mkdir");
    std::fs::write(dir.path().join("certs/ca.pem"), cert.cert.pem()).expect("write ca");
    std::fs::write(dir.path().join("certs/client.pem"), client.cert.pem()).expect("write");
    std::fs::write(
        dir.path().join("certs/client.key"),
        client.signing_key.serialize_pem(),
    )
    .expect("write");
    let pipeline = write_pipeline(
        dir.path(),
        "mutual",
        &format!(
            "name: mutual\n\
             topics: [a, b]\n\
             sinks:\n\
             \x20 - name: with-cert\n\
             \x20   subscribe: a\n\
             \x20   http: {{url: '{}', tls_ca: certs/ca.pem, tls_cert: certs/client.pem, tls_key: certs/client.key}}\n\
             \x20 - name: anonymous\n\
             \x20   subscribe: b\n\
             \x20   retry: {{max_attempts: 2, backoff: {{initial: 100ms, max: 500ms}}}}\n\
             \x20   http: {{url: '{}', tls_ca: certs/ca.pem}}\n",
            receiver.url("https", "/with-cert"),
            receiver.url("https", "/anonymous"),
        ),
    );
    let daemon = Daemon::start(&[&pipeline], &dir.path().join("data"));
    let msgs = |p: &str| -> Vec<Msg> {
        (0..5)
            .map(|i| Msg::new(format!("{p}{i}"), format!("m {i}")))
            .collect()
    };
    daemon.publish("a", &msgs("a"));
    daemon.publish("b", &msgs("b"));
    wait_for("the sink with a certificate delivers", &daemon, || {
        delivered(&receiver.hits(), Some("/with-cert")).len() == 5
    });
    wait_for("readiness says to give tls_cert", &daemon, || {
        let (status, reasons) = daemon.readiness();
        status == "degraded" && reasons.contains("mutual/anonymous") && reasons.contains("tls_cert")
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        dlq(&daemon, "mutual", "anonymous").is_empty(),
        "held, not dead-lettered"
    );
    assert!(delivered(&receiver.hits(), Some("/anonymous")).is_empty());
}

#[test]
fn a_tls_ca_file_without_certificates_refuses_start_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("ca.pem"), "not a certificate\n").expect("write");
    let pipeline = write_pipeline(
        dir.path(),
        "secure",
        "name: secure\n\
         topics: [a]\n\
         sinks:\n\
         \x20 - name: hook\n\
         \x20   subscribe: a\n\
         \x20   http: {url: 'https://127.0.0.1:9/x', tls_ca: ca.pem}\n",
    );
    let data = dir.path().join("data");
    let out = sluice_to_exit(&[
        "run".as_ref(),
        pipeline.as_os_str(),
        "--data-dir".as_ref(),
        data.as_os_str(),
        "--admin".as_ref(),
        "127.0.0.1:0".as_ref(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hook") && err.contains("holds no PEM certificate"),
        "{err}"
    );
}

// ---------------------------------------------------------------------
// 6. Secrets are never shown
// ---------------------------------------------------------------------

#[test]
fn the_url_password_secret_and_header_values_never_show() {
    const PASSWORD: &str = "pw-Zq81xLm";
    const HOOK_SECRET: &str = "sk-Hm4rYyQ2";
    const TOKEN: &str = "tok-Vb6nCe0";
    let port = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(
        dir.path(),
        "hooks",
        &format!(
            "name: hooks\n\
             topics: [out]\n\
             sinks:\n\
             \x20 - name: notify\n\
             \x20   subscribe: out\n\
             \x20   retry: {{max_attempts: 3, backoff: {{initial: 100ms, max: 500ms}}}}\n\
             \x20   http:\n\
             \x20     url: http://hook:${{HOOK_PASSWORD}}@127.0.0.1:{port}/hook\n\
             \x20     secret: ${{HOOK_SECRET}}\n\
             \x20     headers: {{Authorization: 'Bearer ${{HOOK_TOKEN}}'}}\n"
        ),
    );
    let daemon = Daemon::start_with_env(
        None,
        &[&pipeline],
        &dir.path().join("data"),
        vec![
            ("HOOK_PASSWORD".into(), PASSWORD.into()),
            ("HOOK_SECRET".into(), HOOK_SECRET.into()),
            ("HOOK_TOKEN".into(), TOKEN.into()),
        ],
    );
    daemon.publish(
        "out",
        &[Msg::new("s1", "fine"), Msg::new("s2", "bad: refuse me")],
    );
    // Down first: the connect errors (which quote the URL) are logged and
    // shown in readiness.
    wait_for("readiness degraded", &daemon, || {
        daemon.readiness().0 == "degraded"
    });
    let down_ready = ready(&daemon).to_string();
    let down_status = daemon.get("/v1/status").to_string();

    let behaviour: Behaviour = Arc::new(|hit, _| {
        if hit.text().starts_with("bad") {
            Reply::status(400).body("no thanks")
        } else {
            Reply::status(200)
        }
    });
    let receiver = Receiver::start_on(port, None, behaviour, Hits::default());
    wait_for("one delivered, one dead-lettered", &daemon, || {
        delivered(&receiver.hits(), None).len() == 1 && dlq(&daemon, "hooks", "notify").len() == 1
    });
    // The receiver got them all: basic auth, token and signature.
    let hit = receiver
        .hits()
        .into_iter()
        .find(|h| h.key() == "s1")
        .expect("s1");
    assert_eq!(
        hit.header("authorization"),
        Some(&*format!("Bearer {TOKEN}"))
    );
    assert!(hit.header("sluice-signature").is_some());

    let shown = [
        down_ready,
        down_status,
        ready(&daemon).to_string(),
        daemon.get("/v1/status").to_string(),
        serde_json::to_string(&dlq(&daemon, "hooks", "notify")).expect("json"),
        daemon.log(),
    ];
    assert!(
        shown[0].contains("127.0.0.1"),
        "readiness names the target: {}",
        shown[0]
    );
    for text in &shown {
        for secret in [PASSWORD, HOOK_SECRET, TOKEN] {
            assert!(!text.contains(secret), "`{secret}` shown in:\n{text}");
        }
    }
}

// ---------------------------------------------------------------------
// Adaptive concurrency: a target that takes 4 requests at a time
// ---------------------------------------------------------------------

/// A target that serves 4 requests at once (20 ms each) and answers 503 to
/// any beyond. A sink with `concurrency: {max: 32, adaptive: true}` finds
/// the 4: every message arrives once, and fewer than one request in three
/// is refused. At a fixed 32 most would be (28 of every 32).
#[test]
fn an_adaptive_sink_finds_what_the_target_takes_and_is_seldom_refused() {
    const CAP: usize = 4;
    let serving: Arc<Mutex<std::collections::VecDeque<Instant>>> = Arc::default();
    let behaviour: Behaviour = Arc::new(move |_, _| {
        let mut serving = serving.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while serving
            .front()
            .is_some_and(|started| now.duration_since(*started) >= Duration::from_millis(20))
        {
            serving.pop_front();
        }
        if serving.len() >= CAP {
            return Reply::status(503).body("busy");
        }
        serving.push_back(now);
        let mut reply = Reply::status(200);
        reply.delay = Some(Duration::from_millis(20));
        reply
    });
    let receiver = Receiver::start(behaviour);
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(
        dir.path(),
        "adapt",
        &format!(
            "name: adapt\n\
             topics: [in]\n\
             sinks:\n\
             \x20 - name: out\n\
             \x20   subscribe: in\n\
             \x20   concurrency: {{max: 32, adaptive: true}}\n\
             \x20   retry: {{max_attempts: 100, backoff: {{initial: 10ms, max: 50ms}}}}\n\
             \x20   http: {{url: '{}'}}\n",
            receiver.url("http", "/in"),
        ),
    );
    let daemon = Daemon::start_with_env(
        None,
        &[&pipeline],
        &dir.path().join("data"),
        vec![(
            "SLUICE_LOG".into(),
            "warn,sluice=info,sluice::engine=debug".into(),
        )],
    );
    let n = 400;
    let messages: Vec<Msg> = (0..n).map(|i| Msg::new(format!("a{i:03}"), "x")).collect();
    daemon.publish("in", &messages);
    wait_for("everything delivered", &daemon, || {
        delivered(&receiver.hits(), Some("/in")).len() == n
    });
    let hits = receiver.hits();
    let refused = hits.iter().filter(|h| h.status == 503).count();
    let served = hits.iter().filter(|h| h.status == 200).count();
    assert_eq!(served, n, "each message served once");
    let limits: Vec<String> = daemon
        .log()
        .lines()
        .filter(|l| l.contains("adaptive concurrency"))
        .map(|l| l.rsplit("limit=").next().unwrap_or_default().to_owned())
        .collect();
    eprintln!(
        "{refused} of {} requests refused; the limit went: {limits:?}",
        hits.len()
    );
    assert!(
        refused * 10 < hits.len(),
        "{refused} of {} requests refused; the limit went: {limits:?}",
        hits.len()
    );
    let limit = daemon.metric_sum("sluice_concurrency_limit");
    assert!((1.0..=32.0).contains(&limit), "limit {limit}");
    let status = daemon.get("/v1/status");
    assert!(
        status[0]["concurrency_limit"].as_u64().is_some(),
        "{status}"
    );
}
