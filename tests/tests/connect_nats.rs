//! The NATS source and sink end to end: a real nats-server 2.15 per test
//! (`sluice_harness::nats`), the real `sluice` binary on its embedded
//! broker, real plugins, and nats-py (`tests/fixtures/nats_client.py`) as
//! the outside producer and reader. Every delivery check is set-based.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use sluice_harness::nats::NatsServer;
use sluice_tests::edges::{
    Delivered, Duplicates, Upstream, round_trip_over_tls, round_trip_under_faults,
};
use sluice_tests::{Daemon, Msg, write_pipeline};

const LONG: Duration = Duration::from_secs(240);

fn server() -> NatsServer {
    NatsServer::start().unwrap_or_else(|e| panic!("starting nats-server: {e:#}"))
}

fn script() -> PathBuf {
    sluice_harness::repo_root().join("tests/fixtures/nats_client.py")
}

/// Runs the nats-py client with `args`; its JSON lines, or why it failed.
fn py(args: &[&str]) -> Result<Vec<Value>, String> {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nats_client.py {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

fn must(args: &[&str]) -> Vec<Value> {
    py(args).unwrap_or_else(|e| panic!("{e}"))
}

/// A file-backed stream `name` on `subject`, with a 10-minute duplicate
/// window (covering every redelivery of a test).
fn create_stream(url: &str, name: &str, subject: &str) {
    must(&["stream", url, name, subject, "600"]);
}

fn produce(url: &str, subject: &str, from: usize, n: usize) {
    must(&["produce", url, subject, &from.to_string(), &n.to_string()]);
}

/// A stream's messages from `from` on: `(seq, payload, headers)`.
fn dump(url: &str, stream: &str, from: u64) -> Result<Vec<(u64, String, Value)>, String> {
    let lines = py(&["dump", url, stream, &from.to_string()])?;
    Ok(lines
        .into_iter()
        .filter_map(|l| {
            Some((
                l["seq"].as_u64()?,
                l["payload"].as_str()?.to_owned(),
                l["headers"].clone(),
            ))
        })
        .collect())
}

/// The server's view of a consumer (`/jsz`): `(num_pending,
/// num_ack_pending)`.
fn consumer_state(server: &NatsServer, stream: &str, consumer: &str) -> Option<(u64, u64)> {
    let jsz = server
        .monitor_json("/jsz?consumers=true")
        .expect("GET /jsz");
    for account in jsz["account_details"].as_array()? {
        for s in account["stream_detail"].as_array().into_iter().flatten() {
            if s["name"] != stream {
                continue;
            }
            for c in s["consumer_detail"].as_array().into_iter().flatten() {
                if c["name"] == consumer {
                    return Some((c["num_pending"].as_u64()?, c["num_ack_pending"].as_u64()?));
                }
            }
        }
    }
    None
}

fn metrics(daemon: &Daemon) -> String {
    reqwest::blocking::get(format!("{}/metrics", daemon.admin_url()))
        .expect("GET /metrics")
        .text()
        .expect("metrics text")
}

/// The edge suite's upstream: stream `IN` (subject `edge.in`) read by the
/// source, stream `OUT` (subject `edge.out`) written by the sink.
struct Nats {
    server: NatsServer,
    /// What `OUT` held at the last look, and the next sequence to read.
    seen: Vec<Delivered>,
    next: u64,
    /// The CA file the daemon trusts, when it connects over TLS.
    tls_ca: Option<PathBuf>,
}

impl Nats {
    /// Streams `IN` and `OUT` on `server`.
    fn on(server: NatsServer) -> Nats {
        create_stream(&server.url(), "IN", "edge.in");
        create_stream(&server.url(), "OUT", "edge.out");
        Nats {
            server,
            seen: Vec::new(),
            next: 1,
            tls_ca: None,
        }
    }

    /// The URL the daemon connects to, and its TLS line.
    fn daemon_url(&self) -> String {
        match &self.tls_ca {
            Some(ca) => format!(
                "\"{}\"\n  tls_ca: {}",
                self.server.tls_url().expect("a TLS server"),
                ca.display()
            ),
            None => format!("\"{}\"", self.server.url()),
        }
    }
}

impl Upstream for Nats {
    fn source_block(&self) -> String {
        format!(
            "nats:\n  url: {}\n  subject: edge.in\n  stream: IN\n  ack_wait: 10s\n  batch: 200\n",
            self.daemon_url()
        )
    }

    fn sink_block(&self) -> String {
        format!(
            "batch: {{max: 100, wait: 20ms}}\nnats:\n  url: {}\n  subject: edge.out\n",
            self.daemon_url()
        )
    }

    fn produce(&mut self, from: usize, n: usize) {
        produce(&self.server.url(), "edge.in", from, n);
    }

    fn delivered(&mut self) -> Vec<Delivered> {
        // While the server restarts, what was seen so far.
        if let Ok(got) = dump(&self.server.url(), "OUT", self.next) {
            for (seq, payload, headers) in got {
                self.next = seq + 1;
                self.seen.push(Delivered {
                    payload,
                    sluice_id: headers["sluice-id"].as_str().map(str::to_owned),
                });
            }
        }
        self.seen.clone()
    }

    fn restart(&mut self) {
        self.server.restart().expect("nats-server restarted");
    }

    fn log(&self) -> String {
        self.server.log()
    }
}

#[test]
fn over_tls_every_message_arrives_and_an_untrusted_server_is_held_and_said() {
    let certs = sluice_tests::TestCert::new();
    let server = NatsServer::start_with_tls(&certs.cert, &certs.key)
        .unwrap_or_else(|e| panic!("starting nats-server with TLS: {e:#}"));
    let mut up = Nats::on(server);
    up.tls_ca = Some(certs.ca_file.clone());
    let untrusted = format!(
        "nats:\n  url: \"{}\"\n  subject: edge.never\n",
        up.server.tls_url().expect("a TLS server")
    );
    round_trip_over_tls(&mut up, 500, Duplicates::None, &untrusted);
}

#[test]
fn twenty_thousand_messages_survive_two_kills_and_a_server_restart() {
    let mut up = Nats::on(server());
    let report = round_trip_under_faults(&mut up, 20_000, Duplicates::None);
    assert_eq!(report.distinct, 20_000);
    assert_eq!(report.duplicates, 0);
    // Every message of OUT carries its Sluice id as `Nats-Msg-Id` too.
    let out = dump(&up.server.url(), "OUT", 1).expect("dump OUT");
    assert_eq!(out.len(), 20_000, "OUT holds one copy of each");
    for (_, _, headers) in &out {
        assert_eq!(headers["Nats-Msg-Id"], headers["sluice-id"], "{headers}");
    }
}

/// Source `src` -> topic `in` -> sink `out`, no stage: the blocks (and
/// the sink's stage knobs) as given.
fn bridge(dir: &Path, source: &str, sink: &str) -> PathBuf {
    let yaml = format!(
        "name: np\ntopics: [in]\nsources:\n  - name: src\n    to: in\n{source}sinks:\n  - name: out\n    subscribe: in\n{sink}",
        source = sluice_tests::edges::indent(source, 4),
        sink = sluice_tests::edges::indent(sink, 4),
    );
    write_pipeline(dir, "np", &yaml)
}

#[test]
fn headers_keys_and_ids_travel_and_every_message_is_acked_after_its_publish() {
    let server = server();
    let url = server.url();
    create_stream(&url, "IN", "orders.in");
    create_stream(&url, "OUT", "orders.out");
    produce(&url, "orders.in", 0, 600);
    let dir = tempfile::tempdir().expect("dir");
    let file = bridge(
        dir.path(),
        &format!("nats: {{url: \"{url}\", subject: orders.in, stream: IN, durable: bridge}}\n"),
        &format!("batch: {{max: 50, wait: 10ms}}\nnats: {{url: \"{url}\", subject: orders.out}}\n"),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("600 in OUT", LONG, |_| {
        dump(&url, "OUT", 1).is_ok_and(|d| d.len() >= 600)
    });
    daemon.wait_until("every message acked upstream", LONG, |_| {
        consumer_state(&server, "IN", "bridge") == Some((0, 0))
    });
    let out = dump(&url, "OUT", 1).expect("dump");
    assert_eq!(out.len(), 600);
    let mut by_payload = BTreeMap::new();
    for (_, payload, headers) in &out {
        let i: usize = payload
            .strip_prefix("msg-")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{payload}"));
        // The upstream header `n` travelled as a header.
        assert_eq!(headers["n"], i.to_string(), "{headers}");
        // The key: `Sluice-Key` upstream, the message's key, `Sluice-Key`
        // again downstream.
        if i.is_multiple_of(3) {
            assert_eq!(headers["Sluice-Key"], format!("k{}", i % 5), "{headers}");
        } else {
            assert!(headers.get("Sluice-Key").is_none(), "{headers}");
        }
        // Ids: `<source>:<stream sequence>`, as Nats-Msg-Id and sluice-id.
        let id = headers["sluice-id"].as_str().expect("sluice-id");
        assert!(id.starts_with("src:"), "{id}");
        assert_eq!(headers["Nats-Msg-Id"], id);
        by_payload.insert(payload.clone(), id.to_owned());
    }
    assert_eq!(by_payload.len(), 600, "each once");
    // The topic's ids are the stream sequences 1..=600.
    let mut seqs: Vec<u64> = by_payload
        .values()
        .filter_map(|id| id.strip_prefix("src:")?.parse().ok())
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=600).collect::<Vec<u64>>());
    // The lag is the consumer's num_pending.
    daemon.wait_until("a source lag gauge", LONG, |d| {
        metrics(d)
            .lines()
            .any(|l| l.starts_with("sluice_source_lag{") && l.contains("source=\"src\""))
    });
    let status = daemon.cli(&["status", "--json", "--sources"], &[]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("nats stream `IN` subject `orders.in`"),
        "{text}"
    );
}

#[test]
fn a_core_subject_is_read_at_most_once_and_validate_says_so() {
    let server = server();
    let url = server.url();
    let dir = tempfile::tempdir().expect("dir");
    let file = bridge(
        dir.path(),
        &format!("nats: {{url: \"{url}\", subject: core.in}}\n"),
        &format!("nats: {{url: \"{url}\", subject: core.out, jetstream: false}}\n"),
    );
    let validated = Command::new(sluice_tests::sluice_bin())
        .args(["validate", "--no-plugins"])
        .arg(&file)
        .output()
        .expect("sluice validate");
    let err = String::from_utf8_lossy(&validated.stderr);
    assert!(validated.status.success(), "{err}");
    assert!(
        err.contains("warning:") && err.contains("source `src`") && err.contains("at most once"),
        "{err}"
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    assert!(daemon.log().contains("at most once"), "{}", daemon.log());
    // The source subscribes in its first read.
    daemon.wait_until("the source's subscription", LONG, |_| {
        server
            .monitor_json("/subsz?subs=1")
            .is_ok_and(|s| s.to_string().contains("core.in"))
    });
    let mut listener = Command::new("python3")
        .arg(script())
        .args(["listen", &url, "core.out", "10"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("listen");
    let mut lines = BufReader::new(listener.stdout.take().expect("stdout")).lines();
    let ready = lines.next().expect("a ready line").expect("read");
    assert!(ready.contains("ready"), "{ready}");
    must(&["core", &url, "core.in", "0", "200"]);
    let got: Vec<Value> = lines
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    let _ = listener.wait();
    let payloads: std::collections::BTreeSet<&str> =
        got.iter().filter_map(|m| m["payload"].as_str()).collect();
    assert_eq!(payloads.len(), 200, "{got:?}");
    for m in &got {
        // A fresh id per message (UUIDv7): at most once, no stable id.
        let id = m["headers"]["sluice-id"].as_str().expect("sluice-id");
        assert!(id.starts_with("src:") && id.len() > 30, "{id}");
        assert!(m["headers"].get("Nats-Msg-Id").is_none(), "{m}");
    }
}

#[test]
fn a_subject_no_stream_captures_is_dead_lettered_with_the_reason() {
    let server = server();
    let url = server.url();
    create_stream(&url, "IN", "orders.in");
    produce(&url, "orders.in", 0, 3);
    let dir = tempfile::tempdir().expect("dir");
    let file = bridge(
        dir.path(),
        &format!("nats: {{url: \"{url}\", subject: orders.in, stream: IN}}\n"),
        &format!(
            "retry: {{max_attempts: 2, backoff: {{initial: 50ms, max: 100ms}}}}\nnats: {{url: \"{url}\", subject: nowhere.out}}\n"
        ),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("three dead letters", LONG, |d| d.depth("np.out.dlq") >= 3);
    for m in daemon.read_all("np.out.dlq") {
        let text = m.to_string();
        assert!(text.contains("retry"), "{text}");
        assert!(
            text.contains("no JetStream stream captures the subject"),
            "{text}"
        );
    }
    assert_eq!(daemon.readiness().0, "ready", "a refusal is not an outage");
}

#[test]
fn a_server_outage_is_shown_spends_no_attempts_and_never_shows_the_password() {
    let mut server = server();
    let port = server.port();
    let plain = server.url();
    let url = format!("nats://app:hunter2@127.0.0.1:{port}");
    create_stream(&plain, "IN", "orders.in");
    create_stream(&plain, "OUT", "orders.out");
    produce(&plain, "orders.in", 0, 2_000);
    let dir = tempfile::tempdir().expect("dir");
    let file = bridge(
        dir.path(),
        &format!("nats: {{url: \"{url}\", subject: orders.in, stream: IN, batch: 50}}\n"),
        // One attempt: had the outage spent any, messages would be
        // dead-lettered.
        &format!(
            "retry: {{max_attempts: 1}}\nnats: {{url: \"nats://127.0.0.1:{port}\", subject: orders.out, token: s3cr3t-t0ken}}\n"
        ),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("some output", LONG, |_| {
        dump(&plain, "OUT", 1).is_ok_and(|d| d.len() > 100)
    });
    server.stop().expect("nats-server stopped");
    // Messages for the sink while NATS is down: held, not dead-lettered.
    let ingested: Vec<Msg> = (0..100)
        .map(|i| Msg::new(format!("ingest-{i}"), format!("ingested-{i}")))
        .collect();
    daemon.publish("in", &ingested);
    daemon.wait_until("readiness names both connectors", LONG, |d| {
        let (status, reasons) = d.readiness();
        status == "degraded" && reasons.contains("np/src") && reasons.contains("np/out")
    });
    let (_, reasons) = daemon.readiness();
    assert!(reasons.contains("nats://app:***@127.0.0.1"), "{reasons}");
    let sources = daemon.cli(&["status", "--json", "--sources"], &[]);
    let sources: Value = serde_json::from_slice(&sources.stdout).expect("status JSON");
    assert_eq!(sources[0]["up"], false, "{sources}");
    let sources = sources.to_string();
    let status = daemon.get("/v1/status").to_string();
    let ready = daemon.get("/health/ready").to_string();
    std::thread::sleep(Duration::from_secs(2));
    server.restart().expect("nats-server back");
    produce(&plain, "orders.in", 2_000, 500);
    daemon.wait_until("2,600 in OUT", LONG, |_| {
        dump(&plain, "OUT", 1).is_ok_and(|d| d.len() >= 2_600)
    });
    daemon.wait_until("ready again", LONG, |d| d.readiness().0 == "ready");
    std::thread::sleep(Duration::from_secs(1));
    let out = dump(&plain, "OUT", 1).expect("dump");
    let distinct: std::collections::BTreeSet<&str> =
        out.iter().map(|(_, p, _)| p.as_str()).collect();
    assert_eq!(distinct.len(), 2_600);
    assert_eq!(out.len(), 2_600, "no duplicates in OUT");
    assert!(distinct.contains("ingested-99") && distinct.contains("msg-2499"));
    assert_eq!(daemon.depth("np.out.dlq"), 0, "the outage spent attempts");
    let log = daemon.log();
    for (what, text) in [
        ("ready", &ready),
        ("status", &status),
        ("sources", &sources),
        ("log", &log),
    ] {
        assert!(
            !text.contains("hunter2"),
            "{what} shows the password: {text}"
        );
        assert!(
            !text.contains("s3cr3t-t0ken"),
            "{what} shows the token: {text}"
        );
    }
    assert!(sources.contains("nats://app:***@127.0.0.1"), "{sources}");
    assert!(status.contains("\"up\":false"), "{status}");
    let outages = metrics(&daemon)
        .lines()
        .filter(|l| l.starts_with("sluice_connector_outages_total{connector=\"np/"))
        .count();
    assert_eq!(outages, 2, "{}", metrics(&daemon));
}

/// A daemon whose broker is NATS (`--broker nats://...`) runs the NATS
/// connector too: the connector has its own connection, here to another
/// server.
#[test]
fn a_daemon_on_the_nats_broker_bridges_another_server() {
    let backend = sluice_tests::Backend::nats();
    let upstream = server();
    let url = upstream.url();
    create_stream(&url, "IN", "orders.in");
    create_stream(&url, "OUT", "orders.out");
    produce(&url, "orders.in", 0, 300);
    let dir = tempfile::tempdir().expect("dir");
    let file = bridge(
        dir.path(),
        &format!("nats: {{url: \"{url}\", subject: orders.in, stream: IN}}\n"),
        &format!("nats: {{url: \"{url}\", subject: orders.out}}\n"),
    );
    let daemon = Daemon::start_on(&backend, &[&file], &dir.path().join("data"));
    daemon.wait_until("300 in OUT", LONG, |_| {
        dump(&url, "OUT", 1).is_ok_and(|d| d.len() >= 300)
    });
    std::thread::sleep(Duration::from_secs(1));
    let out = dump(&url, "OUT", 1).expect("dump");
    let distinct: std::collections::BTreeSet<&str> =
        out.iter().map(|(_, p, _)| p.as_str()).collect();
    assert_eq!((out.len(), distinct.len()), (300, 300));
}
