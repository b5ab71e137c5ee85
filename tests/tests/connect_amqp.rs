//! The RabbitMQ source and sink end to end: private `rabbitmq-server`
//! nodes (`sluice_harness::rabbitmq`), the real `sluice` binary, and pika
//! (`fixtures/amqp_client.py`) as the outside producer and consumer.
//!
//! - the edge suite's fault scenario (20,000 messages, two kill -9s of the
//!   daemon, one broker restart, after which consuming and the prefetch
//!   are back), exact set, duplicates only with one `sluice-id`;
//! - an unroutable publish dead-lettered as `rejected` with the broker's
//!   reason, a poison message in the source's DLQ, an outage shown by
//!   readiness and status without spending attempts, and the password
//!   never shown;
//! - the consumer's prefetch lowered to the room under the topic's
//!   high-water mark.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_harness::rabbitmq::RabbitNode;
use sluice_tests::edges::{
    Delivered, Duplicates, Upstream, edge_pipeline, round_trip_over_tls, round_trip_under_faults,
};
use sluice_tests::{Daemon, TRACEPARENT, TRACESTATE, header};

const LONG: Duration = Duration::from_secs(240);
/// The source's prefetch in these tests.
const PREFETCH: u16 = 200;

fn node() -> RabbitNode {
    let node = RabbitNode::start().unwrap_or_else(|e| panic!("starting rabbitmq: {e:#}"));
    eprintln!(
        "rabbitmq node {} started in {:?}",
        node.name(),
        node.started_in()
    );
    node
}

fn script() -> PathBuf {
    sluice_harness::repo_root().join("tests/fixtures/amqp_client.py")
}

/// Runs the pika client; its standard output.
fn client(args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "amqp_client.py {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Takes every message in `queue` now (acked: they are gone from it).
fn drain(url: &str, queue: &str) -> Vec<Value> {
    client(&["drain", url, queue])
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// The consumers of `queue` and their prefetch, from `rabbitmqctl`.
fn consumers(node: &RabbitNode, queue: &str) -> Vec<u64> {
    let Ok(text) = node.ctl(&["list_consumers", "queue_name", "prefetch_count"]) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            (cols.next()? == queue).then_some(())?;
            cols.next()?.parse().ok()
        })
        .collect()
}

/// The broker, the pipeline's queues and the test's pika client.
struct Rabbit {
    node: RabbitNode,
    /// Everything taken from `out` so far.
    taken: Vec<Delivered>,
    /// The prefetch seen after each restart.
    restored: Vec<u64>,
    /// The CA file the daemon trusts, when it connects over TLS.
    tls_ca: Option<PathBuf>,
}

impl Rabbit {
    /// The suite's queues and exchange on `node`.
    fn on(node: RabbitNode) -> Rabbit {
        client(&["setup", &node.url()]);
        Rabbit {
            node,
            taken: Vec::new(),
            restored: Vec::new(),
            tls_ca: None,
        }
    }

    /// The URL the daemon connects to, and its TLS line.
    fn daemon_url(&self) -> String {
        match &self.tls_ca {
            Some(ca) => format!(
                "\"{}\"\n  tls_ca: {}",
                self.node.tls_url().expect("a TLS listener"),
                ca.display()
            ),
            None => format!("\"{}\"", self.node.url()),
        }
    }
}

impl Upstream for Rabbit {
    fn source_block(&self) -> String {
        format!(
            "amqp:\n  url: {}\n  queue: in\n  prefetch: {PREFETCH}\n",
            self.daemon_url()
        )
    }

    fn sink_block(&self) -> String {
        format!(
            "batch: {{max: 100, wait: 10ms}}\namqp:\n  url: {}\n  exchange: edge-out\n  routing_key: out\n",
            self.daemon_url()
        )
    }

    fn produce(&mut self, from: usize, n: usize) {
        client(&[
            "produce",
            &self.node.url(),
            "in",
            &from.to_string(),
            &n.to_string(),
        ]);
    }

    fn delivered(&mut self) -> Vec<Delivered> {
        for m in drain(&self.node.url(), "out") {
            let sluice_id = m["sluice_id"].as_str().map(str::to_owned);
            // The sink sets `message-id` to the Sluice id too.
            assert_eq!(
                m["message_id"].as_str(),
                sluice_id.as_deref(),
                "message-id and sluice-id differ: {m}"
            );
            assert_eq!(m["delivery_mode"], 2, "not persistent: {m}");
            self.taken.push(Delivered {
                payload: m["payload"].as_str().unwrap_or_default().to_owned(),
                sluice_id,
            });
        }
        self.taken.clone()
    }

    fn restart(&mut self) {
        self.node
            .restart()
            .unwrap_or_else(|e| panic!("restarting rabbitmq: {e:#}"));
        eprintln!("rabbitmq restarted in {:?}", self.node.started_in());
        // The source reconnects by itself: its consumer is back, with its
        // prefetch.
        let started = Instant::now();
        loop {
            let found = consumers(&self.node, "in");
            if let Some(prefetch) = found.first() {
                assert_eq!(found.len(), 1, "one consumer on `in`: {found:?}");
                self.restored.push(*prefetch);
                eprintln!(
                    "consumer back after {:?}, prefetch {prefetch}",
                    started.elapsed()
                );
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the source did not consume again after the restart"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn log(&self) -> String {
        self.node.log()
    }
}

#[test]
fn over_tls_every_message_arrives_and_an_untrusted_broker_is_held_and_said() {
    let certs = sluice_tests::TestCert::new();
    let node = RabbitNode::start_with_tls(&certs.cert, &certs.key)
        .unwrap_or_else(|e| panic!("starting rabbitmq with TLS: {e:#}"));
    let mut up = Rabbit::on(node);
    up.tls_ca = Some(certs.ca_file.clone());
    let untrusted = format!(
        "amqp:\n  url: \"{}\"\n  exchange: edge-out\n  routing_key: never\n",
        up.node.tls_url().expect("a TLS listener")
    );
    round_trip_over_tls(&mut up, 500, Duplicates::None, &untrusted);
}

#[test]
fn twenty_thousand_messages_survive_kills_and_a_broker_restart() {
    let mut up = Rabbit::on(node());
    let started = Instant::now();
    let report = round_trip_under_faults(&mut up, 20_000, Duplicates::SameId);
    eprintln!(
        "amqp round trip: {} distinct, {} duplicates, {:?}",
        report.distinct,
        report.duplicates,
        started.elapsed()
    );
    assert_eq!(report.distinct, 20_000);
    assert_eq!(up.restored, vec![u64::from(PREFETCH)], "prefetch restored");
    // Everything was acked upstream: `in` is empty, nothing unacked.
    let queues = up
        .node
        .ctl(&["list_queues", "name", "messages"])
        .expect("list_queues");
    assert!(
        queues.lines().any(|l| l.split_whitespace().eq(["in", "0"])),
        "{queues}"
    );
}

/// A pipeline reading `in` and publishing to `edge-out` with `routing_key`
/// (the suite's shape, without faults), as user `sluice`.
fn pipeline(dir: &std::path::Path, url: &str, routing_key: &str) -> PathBuf {
    edge_pipeline(
        dir,
        &format!("amqp:\n  url: \"{url}\"\n  queue: in\n  prefetch: {PREFETCH}\n"),
        &format!(
            "retry: {{max_attempts: 2, backoff: {{initial: 50ms, max: 100ms}}}}\n\
             amqp:\n  url: \"{url}\"\n  exchange: edge-out\n  routing_key: \"{routing_key}\"\n"
        ),
    )
}

#[test]
fn the_trace_context_goes_from_the_source_through_a_stage_to_the_sink() {
    let node = node();
    client(&["setup", &node.url()]);
    let headers = serde_json::json!({"traceparent": TRACEPARENT, "tracestate": TRACESTATE});
    client(&["raw", &node.url(), "in", &headers.to_string(), "traced"]);
    let dir = tempfile::tempdir().expect("dir");
    let file = pipeline(dir.path(), &node.url(), "out");
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    let mut out = Vec::new();
    daemon.wait_until("the message in `out`", LONG, |_| {
        out.extend(drain(&node.url(), "out"));
        !out.is_empty()
    });
    let m = &out[0];
    assert_eq!(m["payload"], "TRACED", "{m}");
    assert_eq!(m["headers"]["traceparent"], TRACEPARENT, "{m}");
    assert_eq!(m["headers"]["tracestate"], TRACESTATE, "{m}");
}

#[test]
fn unroutable_and_poison_messages_are_dead_lettered_and_an_outage_is_held() {
    let mut node = node();
    let password = "hunter2-amqp-secret";
    node.ctl(&["add_user", "sluice", password])
        .expect("add_user");
    node.ctl(&["set_permissions", "-p", "/", "sluice", ".*", ".*", ".*"])
        .expect("set_permissions");
    let url = format!("amqp://sluice:{password}@127.0.0.1:{}/%2f", node.port());
    client(&["setup", &node.url()]);
    // A message whose header is bytes that are not UTF-8: it cannot
    // become a Sluice message.
    client(&[
        "raw",
        &node.url(),
        "in",
        r#"{"bin": {"bytes_hex": "fffe"}, "ok": "yes"}"#,
        "poison",
    ]);
    client(&["produce", &node.url(), "in", "0", "5"]);
    let dir = tempfile::tempdir().expect("dir");
    // The routing key `{key}.nowhere`... the messages have no key; use a
    // fixed key no queue is bound for.
    let file = pipeline(dir.path(), &url, "nowhere");
    let mut daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("5 unroutable messages in edge.out.dlq", LONG, |d| {
        d.depth("edge.out.dlq") >= 5
    });
    daemon.wait_until("the poison message in edge.src.dlq", LONG, |d| {
        d.depth("edge.src.dlq") >= 1
    });
    for m in daemon.read_all("edge.out.dlq") {
        let text = m.to_string();
        assert!(text.contains("rejected"), "{text}");
        assert!(text.contains("312") && text.contains("NO_ROUTE"), "{text}");
        assert!(text.contains("nowhere"), "{text}");
    }
    let poison = daemon.read_all("edge.src.dlq");
    assert_eq!(poison.len(), 1, "{poison:?}");
    let text = poison[0].to_string();
    assert!(
        text.contains("header `bin`") && text.contains("not UTF-8"),
        "{text}"
    );
    assert_eq!(header(&poison[0], "ok"), Some("yes"));
    // The poison message was acked (dead-lettered, not requeued forever).
    let started = Instant::now();
    loop {
        let queues = node.ctl(&["list_queues", "name", "messages"]).expect("ls");
        if queues.lines().any(|l| l.split_whitespace().eq(["in", "0"])) {
            break;
        }
        assert!(
            started.elapsed() < LONG,
            "`in` still holds messages: {queues}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(drain(&node.url(), "out").is_empty());

    // Now a routable sink: restart the daemon with `routing_key: out`.
    daemon.term();
    let _ = daemon.wait_exit(Duration::from_secs(30));
    let file = pipeline(dir.path(), &url, "out");
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    client(&["produce", &node.url(), "in", "5", "5"]);
    let mut got = Vec::new();
    daemon.wait_until("5 routed messages", LONG, |_| {
        got.extend(drain(&node.url(), "out"));
        got.len() >= 5
    });

    // The broker goes away: readiness names both ends, without the
    // password; what the stage holds spends no attempts.
    node.stop();
    daemon.wait_until("readiness degraded for the source", LONG, |d| {
        let (status, reasons) = d.readiness();
        status == "degraded" && reasons.contains("edge/src")
    });
    let (_, reasons) = daemon.readiness();
    assert!(reasons.contains("amqp://sluice:***@127.0.0.1"), "{reasons}");
    let status = daemon.get("/v1/status").to_string();
    assert!(status.contains("amqp://sluice:***@127.0.0.1"), "{status}");
    // Messages the stage produced while the broker is down wait in `up`.
    daemon.publish("up", &[sluice_tests::Msg::new("held-1", "HELD")]);
    daemon.wait_until("the sink's outage shown", LONG, |d| {
        d.readiness().1.contains("edge/out")
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(daemon.depth("edge.out.dlq"), 5, "an outage spent attempts");
    node.start_again().expect("rabbitmq back");
    daemon.wait_until("the held message delivered", LONG, |_| {
        got.extend(drain(&node.url(), "out"));
        got.iter().any(|m| m["payload"] == "HELD")
    });
    daemon.wait_until("ready again", LONG, |d| d.readiness().0 == "ready");
    assert_eq!(daemon.depth("edge.out.dlq"), 5);
    let log = daemon.log();
    for (what, text) in [("readiness", &reasons), ("status", &status), ("log", &log)] {
        assert!(
            !text.contains(password),
            "{what} shows the password: {text}"
        );
    }
    assert!(log.contains("amqp://sluice:***@127.0.0.1"), "{log}");
    daemon.term();
}

#[test]
fn the_prefetch_is_bounded_by_the_room_under_the_high_water_mark() {
    let node = node();
    client(&["setup", &node.url()]);
    client(&["produce", &node.url(), "in", "0", "500"]);
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        "name: mark\n\
         topics:\n  - name: in\n    high_water_mark: 50\n\
         sources:\n  - name: src\n    to: in\n    amqp: {{url: \"{}\", queue: in, prefetch: {PREFETCH}}}\n",
        node.url()
    );
    let file = sluice_tests::write_pipeline(dir.path(), "mark", &yaml);
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("the topic at its mark", LONG, |d| d.depth("in") >= 50);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(daemon.depth("in"), 50, "the topic passed its mark");
    // The consumer's prefetch was lowered to the room.
    let prefetch = consumers(&node, "in");
    assert_eq!(prefetch.len(), 1, "{prefetch:?}");
    assert!(prefetch[0] <= 50, "prefetch {prefetch:?} above the room");
    let queues = node
        .ctl(&[
            "list_queues",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ])
        .expect("list_queues");
    let row: Vec<u64> = queues
        .lines()
        .find(|l| l.starts_with("in\t") || l.starts_with("in "))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    // 450 not in the topic: in the queue, or pushed to the daemon within
    // the lowered window (unacknowledged, not read), never the whole
    // prefetch of 200.
    assert_eq!(row.iter().sum::<u64>(), 450, "{queues}");
    assert!(row.get(1).is_some_and(|unacked| *unacked <= 50), "{queues}");
    daemon.term();
}
