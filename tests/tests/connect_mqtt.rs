//! The MQTT source and sink end to end: a real `mosquitto` per test
//! (`sluice_harness::mosquitto`), the real `sluice` binary, real plugins,
//! and paho-mqtt (`fixtures/mqtt_client.py`) as the outside producer and
//! the persistent subscriber that reads what the sink published.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use sluice_harness::mosquitto::{Mosquitto, Options};
use sluice_tests::Daemon;
use sluice_tests::edges::{
    Delivered, Duplicates, Upstream, distinct, edge_pipeline, round_trip_over_tls,
    round_trip_under_faults,
};

const LONG: Duration = Duration::from_secs(240);

fn broker() -> Mosquitto {
    Mosquitto::start().unwrap_or_else(|e| panic!("starting mosquitto: {e:#}"))
}

fn script() -> String {
    sluice_harness::repo_root()
        .join("tests/fixtures/mqtt_client.py")
        .display()
        .to_string()
}

/// Runs the paho client to its end; panics with its output on failure.
fn py(args: &[&str]) {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .expect("run python3 (with paho-mqtt: `cargo xtask setup`)");
    assert!(
        out.status.success(),
        "mqtt_client.py {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Publishes `msg-<i>` for `i` in `from..from + n`, QoS 1, round-robin
/// over `topics` (comma-separated), with these user properties.
fn produce(port: u16, topics: &str, from: usize, n: usize, props: &[&str], v311: bool) {
    let port = port.to_string();
    let (from, n) = (from.to_string(), n.to_string());
    let mut args = vec![
        "produce", "--port", &port, "--topics", topics, "--start", &from, "--count", &n,
    ];
    for p in props {
        args.push("--prop");
        args.push(p);
    }
    if v311 {
        args.push("--v311");
    }
    py(&args);
}

/// Creates `client_id`'s persistent session with a QoS 1 subscription to
/// `filter`, as if that client had run before: what is published from
/// now on waits for it.
fn prime(port: u16, client_id: &str, filter: &str, v311: bool) {
    let port = port.to_string();
    let mut args = vec![
        "prime",
        "--port",
        &port,
        "--client-id",
        client_id,
        "--topic",
        filter,
    ];
    if v311 {
        args.push("--v311");
    }
    py(&args);
}

/// One message the persistent subscriber received.
#[derive(Debug, Clone)]
struct Got {
    topic: String,
    payload: String,
    props: BTreeMap<String, String>,
}

/// A persistent QoS 1 subscriber (its own session) running in the
/// background, reconnecting across broker restarts, writing what it
/// receives to a file.
struct Subscriber {
    child: Child,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Subscriber {
    fn start(port: u16, client_id: &str, filter: &str, v311: bool) -> Subscriber {
        let dir = tempfile::tempdir().expect("dir");
        let out = dir.path().join("received.jsonl");
        let mut cmd = Command::new("python3");
        cmd.arg(script())
            .args(["subscribe", "--port", &port.to_string()])
            .args(["--client-id", client_id, "--topic", filter])
            .arg("--out")
            .arg(&out)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if v311 {
            cmd.arg("--v311");
        }
        let mut child = cmd.spawn().expect("run python3 (with paho-mqtt)");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the subscriber's first line");
        assert_eq!(
            line.trim(),
            "subscribed",
            "the subscriber did not subscribe"
        );
        Subscriber {
            child,
            out,
            _dir: dir,
        }
    }

    fn received(&self) -> Vec<Got> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|v| Got {
                topic: v["topic"].as_str().unwrap_or_default().to_owned(),
                payload: v["payload"].as_str().unwrap_or_default().to_owned(),
                props: v["props"]
                    .as_object()
                    .map(|o| {
                        o.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect()
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// mosquitto and paho as the suite's upstream: the source reads `in/+`
/// (producers write `in/0`..`in/2`), the sink writes `out/all`, a
/// persistent subscriber reads `out/#`.
struct MqttUpstream {
    broker: Mosquitto,
    reader: Subscriber,
    v311: bool,
    sink_extra: String,
    /// The CA file the daemon trusts, when it connects over TLS.
    tls_ca: Option<PathBuf>,
    _certs: Option<sluice_tests::TestCert>,
}

const SOURCE_CLIENT: &str = "sluice-edge-src";

impl MqttUpstream {
    fn new(v311: bool) -> MqttUpstream {
        MqttUpstream::on(broker(), v311)
    }

    /// The daemon connects over TLS (`mqtts://`, trusting the broker's
    /// self-signed certificate); outside clients use the plain port.
    fn over_tls() -> MqttUpstream {
        let certs = sluice_tests::TestCert::new();
        let broker = Mosquitto::start_with(&Options {
            tls: Some((certs.cert.clone(), certs.key.clone())),
            ..Options::default()
        })
        .unwrap_or_else(|e| panic!("starting mosquitto with TLS: {e:#}"));
        let mut up = MqttUpstream::on(broker, false);
        up.tls_ca = Some(certs.ca_file.clone());
        up._certs = Some(certs);
        up
    }

    fn on(broker: Mosquitto, v311: bool) -> MqttUpstream {
        // The daemon's session exists before it first runs, so what is
        // produced before it starts waits for it.
        prime(broker.port(), SOURCE_CLIENT, "in/+", v311);
        let reader = Subscriber::start(broker.port(), "edge-reader", "out/#", v311);
        MqttUpstream {
            broker,
            reader,
            v311,
            sink_extra: String::new(),
            tls_ca: None,
            _certs: None,
        }
    }

    /// The URL the daemon connects to, and its TLS lines.
    fn daemon_url(&self) -> String {
        match &self.tls_ca {
            Some(ca) => format!(
                "{}\n  tls_ca: {}",
                self.broker.tls_url().expect("a TLS listener"),
                ca.display()
            ),
            None => self.broker.url(),
        }
    }

    fn version(&self) -> &'static str {
        if self.v311 { "3.1.1" } else { "5" }
    }
}

impl Upstream for MqttUpstream {
    fn source_block(&self) -> String {
        format!(
            "mqtt:\n  url: {}\n  topic: in/+\n  client_id: {SOURCE_CLIENT}\n  version: {}\n",
            self.daemon_url(),
            self.version()
        )
    }

    fn sink_block(&self) -> String {
        format!(
            "batch: {{max: 100, wait: 20ms}}\n{}mqtt:\n  url: {}\n  topic: out/all\n  version: {}\n",
            self.sink_extra,
            self.daemon_url(),
            self.version()
        )
    }

    fn produce(&mut self, from: usize, n: usize) {
        produce(
            self.broker.port(),
            "in/0,in/1,in/2",
            from,
            n,
            &[],
            self.v311,
        );
    }

    fn delivered(&mut self) -> Vec<Delivered> {
        self.reader
            .received()
            .into_iter()
            .map(|g| Delivered {
                payload: g.payload,
                sluice_id: g.props.get("sluice-id").cloned(),
            })
            .collect()
    }

    fn restart(&mut self) {
        self.broker.restart().expect("mosquitto back");
    }

    fn log(&self) -> String {
        format!("mosquitto log:\n{}", self.broker.log())
    }
}

#[test]
fn over_tls_every_message_arrives_and_an_untrusted_broker_is_held_and_said() {
    let mut up = MqttUpstream::over_tls();
    let untrusted = format!(
        "mqtt:\n  url: {}\n  topic: out/never\n",
        up.broker.tls_url().expect("a TLS listener")
    );
    round_trip_over_tls(&mut up, 500, Duplicates::None, &untrusted);
}

#[test]
fn twenty_thousand_round_trip_under_kills_and_a_broker_restart() {
    let mut up = MqttUpstream::new(false);
    let report = round_trip_under_faults(&mut up, 20_000, Duplicates::Allowed);
    eprintln!(
        "mqtt: {} distinct, {} duplicates (MQTT has no stable message id: a message the broker \
         sent again after a crash is a new message)",
        report.distinct, report.duplicates
    );
    assert_eq!(report.distinct, 20_000);
    // Copies with one id are the sink's (written again after a crash
    // before the stage's ack); copies with a new id are the source's (the
    // broker sent the message again).
    let mut ids: BTreeMap<String, std::collections::BTreeSet<Option<String>>> = BTreeMap::new();
    for d in up.delivered() {
        ids.entry(d.payload).or_default().insert(d.sluice_id);
    }
    let new_ids: usize = ids.values().map(|v| v.len() - 1).sum();
    eprintln!(
        "mqtt: of the {} duplicates, {new_ids} carry a new id (sent again upstream), {} repeat an id \
         (written again by the sink)",
        report.duplicates,
        report.duplicates - new_ids
    );
    for d in up.delivered() {
        assert!(
            d.sluice_id.as_deref().is_some_and(|id| !id.is_empty()),
            "{d:?}"
        );
    }
}

#[test]
fn messages_published_while_the_daemon_is_down_arrive_after_it_starts() {
    let broker = broker();
    let port = broker.port();
    let reader = Subscriber::start(port, "offline-reader", "out/#", false);
    let dir = tempfile::tempdir().expect("dir");
    let file = edge_pipeline(
        dir.path(),
        &format!("mqtt:\n  url: {}\n  topic: \"in/#\"\n", broker.url()),
        &format!("mqtt:\n  url: {}\n  topic: \"out/{{key}}\"\n", broker.url()),
    );
    let mut daemon = Daemon::start(&[&file], &dir.path().join("data"));
    // The first run creates the session (default client id
    // `sluice-edge-src`); a message proves the subscription is there.
    daemon.wait_until("the first message through", LONG, |_| {
        produce(port, "in/first", 0, 1, &["sluice-key=k1"], false);
        std::thread::sleep(Duration::from_millis(300));
        !reader.received().is_empty()
    });
    daemon.kill9();
    let before = distinct_payloads(&reader.received());
    produce(
        port,
        "in/a,in/b/c",
        100,
        500,
        &["sluice-key=k1", "trace=t1"],
        false,
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        distinct_payloads(&reader.received()),
        before,
        "nothing moves while the daemon is down"
    );
    daemon.restart();
    daemon.wait_until("the 500 published while down", LONG, |_| {
        distinct_payloads(&reader.received()) >= before + 500
    });
    let got = reader.received();
    for i in 100..600 {
        let m = got
            .iter()
            .find(|g| g.payload == format!("MSG-{i}"))
            .unwrap_or_else(|| panic!("MSG-{i} lost"));
        // The key chose the topic; the source's topic and the producer's
        // user property travelled as headers; every write carries its id.
        assert_eq!(m.topic, "out/k1");
        assert_eq!(m.props.get("trace").map(String::as_str), Some("t1"));
        let from = m.props.get("mqtt-topic").map(String::as_str);
        assert!(matches!(from, Some("in/a" | "in/b/c")), "{m:?}");
        assert_eq!(m.props.get("sluice-key").map(String::as_str), Some("k1"));
        assert!(
            m.props.get("sluice-id").is_some_and(|id| !id.is_empty()),
            "{m:?}"
        );
    }
}

fn distinct_payloads(got: &[Got]) -> usize {
    distinct(
        &got.iter()
            .map(|g| Delivered {
                payload: g.payload.clone(),
                sluice_id: None,
            })
            .collect::<Vec<_>>(),
    )
}

#[test]
fn refused_keys_denied_topics_and_bad_headers_are_dead_lettered_with_the_reason() {
    let acl = "topic readwrite in/#\ntopic write out/ok\ntopic read out/#\n";
    let broker = Mosquitto::start_with(&Options {
        acl: Some(acl.into()),
        ..Options::default()
    })
    .unwrap_or_else(|e| panic!("starting mosquitto: {e:#}"));
    let port = broker.port();
    prime(port, "sluice-edge-src", "in/#", false);
    let reader = Subscriber::start(port, "dlq-reader", "out/#", false);
    produce(port, "in/x", 0, 3, &["sluice-key=ok"], false);
    produce(port, "in/x", 3, 1, &["sluice-key=a/b"], false);
    produce(port, "in/x", 4, 1, &["sluice-key=denied"], false);
    produce(port, "in/x", 5, 1, &["bad name=x"], false);
    let dir = tempfile::tempdir().expect("dir");
    let file = edge_pipeline(
        dir.path(),
        &format!("mqtt:\n  url: {}\n  topic: \"in/#\"\n", broker.url()),
        &format!(
            "retry: {{max_attempts: 2, backoff: {{initial: 10ms, max: 50ms}}}}\nmqtt:\n  url: {}\n  topic: \"out/{{key}}\"\n",
            broker.url()
        ),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("two refused writes in edge.out.dlq", LONG, |d| {
        d.depth("edge.out.dlq") >= 2
    });
    daemon.wait_until("the bad header in edge.src.dlq", LONG, |d| {
        d.depth("edge.src.dlq") >= 1
    });
    daemon.wait_until("three written", LONG, |_| reader.received().len() >= 3);
    let refused: Vec<String> = daemon
        .read_all("edge.out.dlq")
        .iter()
        .map(Value::to_string)
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused
            .iter()
            .any(|t| t.contains("rejected") && t.contains("levels")),
        "{refused:?}"
    );
    assert!(
        refused
            .iter()
            .any(|t| t.contains("rejected") && t.contains("NotAuthorized")),
        "{refused:?}"
    );
    let poison = daemon.read_all("edge.src.dlq");
    assert_eq!(poison.len(), 1, "{poison:?}");
    assert!(poison[0].to_string().contains("bad name"), "{poison:?}");
    let got = reader.received();
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got.iter().all(|g| g.topic == "out/ok"), "{got:?}");
}

#[test]
fn an_outage_is_shown_spends_no_attempts_and_the_password_never_shows() {
    let mut broker = Mosquitto::start_with(&Options {
        password: Some(("sluice".into(), "hunter2".into())),
        ..Options::default()
    })
    .unwrap_or_else(|e| panic!("starting mosquitto: {e:#}"));
    let port = broker.port();
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("mqtt://sluice:hunter2@127.0.0.1:{port}");
    let file = edge_pipeline(
        dir.path(),
        &format!("mqtt:\n  url: {url}\n  topic: \"in/#\"\n"),
        &format!(
            "retry: {{max_attempts: 2, backoff: {{initial: 10ms, max: 50ms}}}}\nmqtt:\n  url: {url}\n  topic: out\n"
        ),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("ready", LONG, |d| d.readiness().0 == "ready");
    broker.stop();
    daemon.wait_until("readiness names the source", LONG, |d| {
        let (status, reasons) = d.readiness();
        status == "degraded" && reasons.contains("edge/src")
    });
    let (_, reasons) = daemon.readiness();
    let status = daemon.get("/v1/status").to_string();
    let log = daemon.log();
    for (what, text) in [("ready", &reasons), ("status", &status), ("log", &log)] {
        assert!(
            !text.contains("hunter2"),
            "{what} shows the password: {text}"
        );
    }
    assert!(reasons.contains("mqtt://sluice:***@127.0.0.1"), "{reasons}");
    assert!(status.contains("mqtt://sluice:***@127.0.0.1"), "{status}");
    // `sluice status` lists the source as down, without the password.
    let sources = daemon.get("/v1/sources");
    let src = sources
        .as_array()
        .and_then(|a| a.iter().find(|s| s["source"] == "src"))
        .unwrap_or_else(|| panic!("{sources}"));
    assert_eq!(src["up"], false, "{src}");
    let cli = daemon.cli(&["status"], &[]);
    let table = String::from_utf8_lossy(&cli.stdout);
    assert!(cli.status.success(), "{table}");
    assert!(
        table.contains("edge/src (mqtt)") && table.contains("DOWN") && !table.contains("hunter2"),
        "{table}"
    );
    broker.start_again().expect("mosquitto back");
    daemon.wait_until("ready again", LONG, |d| d.readiness().0 == "ready");

    // A wrong password: an outage, shown without the password.
    let dir2 = tempfile::tempdir().expect("dir");
    let wrong = format!("mqtt://sluice:wrong-secret@127.0.0.1:{port}");
    let file2 = edge_pipeline(
        dir2.path(),
        &format!("mqtt:\n  url: {wrong}\n  topic: \"in/#\"\n"),
        &format!("mqtt:\n  url: {wrong}\n  topic: out\n"),
    );
    let other = Daemon::start(&[&file2], &dir2.path().join("data"));
    other.wait_until("the refused login is shown", LONG, |d| {
        d.readiness().1.contains("edge/src")
    });
    let (_, reasons) = other.readiness();
    assert!(!reasons.contains("wrong-secret"), "{reasons}");
    assert!(reasons.contains("***"), "{reasons}");
    assert!(!other.log().contains("wrong-secret"));
}

/// The sink held through a broker outage: with two attempts per message,
/// an outage that spent attempts would dead-letter them.
#[test]
fn a_broker_outage_holds_sink_writes_without_spending_attempts() {
    let mut up = MqttUpstream::new(false);
    up.sink_extra = "retry: {max_attempts: 2, backoff: {initial: 10ms, max: 50ms}}\n".into();
    let dir = tempfile::tempdir().expect("dir");
    let file = edge_pipeline(dir.path(), &up.source_block(), &up.sink_block());
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    up.produce(0, 2_000);
    daemon.wait_until("some delivered", LONG, |_| distinct(&up.delivered()) >= 200);
    up.broker.stop();
    // The outage lasts: the sink's 2 attempts (backoff up to 50 ms) would
    // be spent many times over in it, so an outage that spent attempts
    // would dead-letter (checked at the end). Part of the fault.
    std::thread::sleep(Duration::from_secs(3));
    daemon.wait_until("the outage shown", LONG, |d| d.readiness().0 == "degraded");
    up.broker.start_again().expect("back");
    daemon.wait_until("all 2000 delivered", LONG, |_| {
        distinct(&up.delivered()) >= 2_000
    });
    assert_eq!(daemon.depth("edge.out.dlq"), 0, "an outage spent attempts");
}

#[test]
fn mqtt_3_1_1_carries_payloads_both_ways() {
    let mut up = MqttUpstream::new(true);
    let dir = tempfile::tempdir().expect("dir");
    let file = edge_pipeline(dir.path(), &up.source_block(), &up.sink_block());
    up.produce(0, 300);
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("300 delivered", LONG, |_| distinct(&up.delivered()) >= 300);
    let got = up.delivered();
    // 3.1.1 has no properties: no sluice-id travels.
    assert!(got.iter().all(|d| d.sluice_id.is_none()), "{got:?}");
    assert_eq!(distinct(&got), 300);
}
