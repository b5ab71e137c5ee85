//! The Kafka source and sink end to end: Apache Kafka itself per test
//! (`sluice_harness::kafka`: a KRaft node, or a cluster of three), the
//! real `sluice` binary, real plugins, and an outside client
//! (confluent-kafka, driven by `tests/fixtures/kafka_client.py`). Every
//! delivery check is set-based. TLS, SASL and ACLs are in
//! `connect_kafka_security.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use sluice_harness::kafka::KafkaServer;
use sluice_tests::edges::{
    Delivered, Duplicates, Upstream, check_exact_set, edge_pipeline, round_trip_under_faults,
    wait_for_deliveries,
};
use sluice_tests::{
    Daemon, Msg, TRACEPARENT, TRACESTATE, header, plugin, sluice_bin, write_pipeline,
};

const LONG: Duration = Duration::from_secs(240);

fn kafka() -> KafkaServer {
    KafkaServer::start().unwrap_or_else(|e| panic!("starting Kafka: {e:#}"))
}

/// Runs the outside client with `args`; its JSON answer, or why not.
fn try_client(args: &[&str]) -> Result<Value, String> {
    let script = sluice_harness::repo_root().join("tests/fixtures/kafka_client.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .map_err(|e| format!("running python3: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "kafka_client.py {args:?} failed: {}",
            err.lines().last().unwrap_or_default()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("not JSON: {e}"))
}

/// Runs the outside client with `args`; its JSON answer.
fn client(args: &[&str]) -> Value {
    sluice_tests::kafka_client(args)
}

fn create(brokers: &str, topic: &str, partitions: usize) {
    client(&["create", brokers, topic, &partitions.to_string()]);
}

/// [`create`] with three replicas, on a cluster of three.
fn create_replicated(brokers: &str, topic: &str, partitions: usize) {
    client(&["create", brokers, topic, &partitions.to_string(), "3"]);
}

fn produce(brokers: &str, topic: &str, from: usize, n: usize) {
    client(&["produce", brokers, topic, &from.to_string(), &n.to_string()]);
}

/// Every message of `topic`, from the beginning.
fn dump(brokers: &str, topic: &str) -> Vec<Value> {
    client(&["dump", brokers, topic])
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Partition -> offset, from a JSON object.
fn per_partition(value: &Value) -> BTreeMap<i32, i64> {
    value
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(p, v)| (p.parse().expect("partition"), v.as_i64().unwrap_or(-1)))
                .collect()
        })
        .unwrap_or_default()
}

/// The group's committed offset per partition (negative: none).
fn committed(brokers: &str, group: &str, topic: &str) -> BTreeMap<i32, i64> {
    per_partition(&client(&["committed", brokers, group, topic]))
}

/// The high watermark per partition.
fn watermarks(brokers: &str, topic: &str) -> BTreeMap<i32, i64> {
    per_partition(&client(&["watermarks", brokers, topic]))
}

/// The suite's upstream: topic `in` (4 partitions) read by the source,
/// topic `out` written by the sink.
struct Kafka {
    server: KafkaServer,
    brokers: String,
}

impl Kafka {
    fn new() -> Kafka {
        let server = kafka();
        let brokers = server.brokers();
        create(&brokers, "in", 4);
        create(&brokers, "out", 4);
        Kafka { server, brokers }
    }

    /// On a cluster of three nodes, topics with three replicas.
    fn cluster() -> Kafka {
        let server =
            KafkaServer::start_cluster().unwrap_or_else(|e| panic!("starting Kafka: {e:#}"));
        let brokers = server.brokers();
        create_replicated(&brokers, "in", 4);
        create_replicated(&brokers, "out", 4);
        Kafka { server, brokers }
    }
}

impl Upstream for Kafka {
    fn source_block(&self) -> String {
        format!(
            "kafka:\n  brokers: \"{}\"\n  topic: in\n  group: sluice\n  start: earliest\n  batch: 500\n  session_timeout: 6s\n",
            self.brokers
        )
    }

    fn sink_block(&self) -> String {
        format!(
            "batch: {{max: 200, wait: 20ms}}\nkafka:\n  brokers: \"{}\"\n  topic: out\n",
            self.brokers
        )
    }

    fn produce(&mut self, from: usize, n: usize) {
        produce(&self.brokers, "in", from, n);
    }

    fn delivered(&mut self) -> Vec<Delivered> {
        // The broker may be restarting: nothing read this time (the suite
        // asks again, and prints Kafka's log if it never comes back).
        let all = match try_client(&["dump", &self.brokers, "out"]) {
            Ok(all) => all.as_array().cloned().unwrap_or_default(),
            Err(why) => {
                eprintln!("{why}");
                Vec::new()
            }
        };
        all.iter()
            .map(|m| Delivered {
                payload: m["payload"].as_str().unwrap_or_default().to_owned(),
                sluice_id: m["headers"]["sluice-id"].as_str().map(str::to_owned),
            })
            .collect()
    }

    fn restart(&mut self) {
        self.server.restart().expect("Kafka restarts");
    }

    fn log(&self) -> String {
        self.server.log()
    }
}

/// 20,000 messages through the uppercase stage while the daemon is
/// killed with SIGKILL twice and the broker restarted once: 0 lost, and
/// every duplicate carries the same `sluice-id`.
#[test]
fn twenty_thousand_round_trip_under_kill9_and_a_broker_restart() {
    let mut up = Kafka::new();
    let report = round_trip_under_faults(&mut up, 20_000, Duplicates::SameId);
    assert_eq!(report.distinct, 20_000);
    // What the sink wrote keeps the key and headers of the input.
    let sample = dump(&up.brokers, "out");
    let m = sample
        .iter()
        .find(|m| m["payload"] == "MSG-7")
        .expect("MSG-7 delivered");
    assert_eq!(m["key"], "k7", "{m}");
    assert_eq!(m["headers"]["n"], "7", "{m}");
    // The output's id: deterministic (a hash of the input's id, the stage
    // and the output's index), so a repeat carries the same one.
    assert!(
        m["headers"]["sluice-id"]
            .as_str()
            .is_some_and(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())),
        "{m}"
    );
}

/// A pipeline of one Kafka source (group `g`, on `protocol`) into the
/// Sluice topic `in`, nothing reading it: what the source made durable
/// stays there to be checked. Daemons here stop with SIGTERM, leaving the
/// group at once; the session timeout decides when a member that stopped
/// heartbeating is taken for dead.
fn group_pipeline(dir: &Path, brokers: &str, protocol: &str) -> PathBuf {
    let yaml = format!(
        r#"
name: grp
topics: [in]
sources:
  - name: src
    to: in
    kafka:
      brokers: "{brokers}"
      topic: in
      group: g
      group_protocol: {protocol}
      start: earliest
      batch: 100
      buffer: 300
      session_timeout: 10s
"#
    );
    write_pipeline(dir, "grp", &yaml)
}

/// The upstream positions (`(partition, offset)`) in `daemons`' topic
/// `in`, from the ids `src:<partition>:<offset>`.
fn durable(daemons: &[&Daemon]) -> BTreeSet<(i32, i64)> {
    let mut out = BTreeSet::new();
    for d in daemons {
        for m in d.read_all("in") {
            let id = m["id"].as_str().unwrap_or_default();
            let mut parts = id.split(':');
            assert_eq!(parts.next(), Some("src"), "{id}");
            let p: i32 = parts.next().and_then(|p| p.parse().ok()).expect(id);
            let o: i64 = parts.next().and_then(|o| o.parse().ok()).expect(id);
            out.insert((p, o));
        }
    }
    out
}

/// The offsets below `commits` (per partition) that are in no Sluice
/// topic: what was committed past a message not made durable.
fn uncovered(commits: &BTreeMap<i32, i64>, held: &BTreeSet<(i32, i64)>) -> Vec<(i32, i64)> {
    let mut out = Vec::new();
    for (p, c) in commits {
        out.extend(
            (0..*c)
                .filter(|o| !held.contains(&(*p, *o)))
                .take(5)
                .map(|o| (*p, o)),
        );
    }
    out
}

/// Asserts that for each partition every offset below `commits` is in
/// `held`: nothing was committed past a message not in a Sluice topic.
fn assert_commits_covered(commits: &BTreeMap<i32, i64>, held: &BTreeSet<(i32, i64)>, when: &str) {
    let missing = uncovered(commits, held);
    assert!(
        missing.is_empty(),
        "{when}: committed {commits:?}, yet (partition, offset) {missing:?} are in no Sluice topic"
    );
}

/// Two daemons in one group on `protocol`. B joins while A reads, B stops
/// and starts again, then A does, while more is produced: partitions move
/// each time, with reads in flight. After each move the group's commits
/// are read, then the daemons' topics, and every committed offset must
/// already be durable (a partition revoked mid-read is committed only up
/// to what reached the topic). At the end: 0 lost, and the commits reach
/// the end.
fn two_daemons_hand_partitions_over(protocol: &str) {
    let server = kafka();
    let brokers = server.brokers();
    create(&brokers, "in", 4);
    let first = 4_000;
    let more = 4_000;
    produce(&brokers, "in", 0, first);
    let dir = tempfile::tempdir().expect("dir");
    let file = group_pipeline(dir.path(), &brokers, protocol);
    let debug = [(
        "SLUICE_LOG",
        "warn,sluice=info,sluice::connect::kafka=debug",
    )];
    let mut a = Daemon::builder(&[&file], &dir.path().join("a"))
        .envs(debug)
        .start();
    a.wait_until("A reads", LONG, |d| d.depth("in") >= 300);
    let mut b = Daemon::builder(&[&file], &dir.path().join("b"))
        .envs(debug)
        .start();
    // More arrives while partitions move.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let brokers = brokers.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = first;
            while i < first + more && !stop.load(Ordering::Relaxed) {
                produce(&brokers, "in", i, 250);
                i += 250;
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    b.wait_until("B takes partitions over", LONG, |d| d.depth("in") >= 100);
    // While both run: committed (read first) is covered by the topics
    // (read after).
    let commits = committed(&brokers, "g", "in");
    assert_commits_covered(&commits, &durable(&[&a, &b]), "both running");

    // B stops (its partitions go back to A), then starts again.
    let (status, took) = b.sigterm();
    assert!(status.success(), "B exited {status:?} after {took:?}");
    let commits_b_down = committed(&brokers, "g", "in");
    b.restart();
    assert_commits_covered(&commits_b_down, &durable(&[&a, &b]), "after B stopped");
    let b_before = b.depth("in");
    b.wait_until("B reads again", LONG, |d| d.depth("in") > b_before);
    let commits = committed(&brokers, "g", "in");
    assert_commits_covered(&commits, &durable(&[&a, &b]), "after B came back");

    // Then A stops and starts again.
    let (status, took) = a.sigterm();
    assert!(status.success(), "A exited {status:?} after {took:?}");
    let commits_a_down = committed(&brokers, "g", "in");
    a.restart();
    assert_commits_covered(&commits_a_down, &durable(&[&a, &b]), "after A stopped");

    producer.join().expect("producer");
    stop.store(true, Ordering::Relaxed);
    let total = first + more;
    let high = watermarks(&brokers, "in");
    assert_eq!(high.values().sum::<i64>(), total as i64, "{high:?}");
    wait_or_say(&a, &b, &server, "every message in a Sluice topic", || {
        let held = durable(&[&a, &b]);
        let mut per_partition: BTreeMap<i32, usize> = BTreeMap::new();
        for (p, _) in &held {
            *per_partition.entry(*p).or_default() += 1;
        }
        (
            held.len() >= total,
            format!("held per partition {per_partition:?} of {high:?}"),
        )
    });
    // 0 lost: every upstream position is in a Sluice topic.
    let held = durable(&[&a, &b]);
    for (p, h) in &high {
        let missing: Vec<i64> = (0..*h)
            .filter(|o| !held.contains(&(*p, *o)))
            .take(5)
            .collect();
        assert!(missing.is_empty(), "partition {p}: lost {missing:?}");
    }
    // The commits catch up with everything, and never pass it.
    wait_or_say(
        &a,
        &b,
        &server,
        "commits reach the end of every partition",
        || {
            let commits = committed(&brokers, "g", "in");
            (
                commits == high,
                format!("committed {commits:?} of {high:?}"),
            )
        },
    );
    // Both daemons read (the group shared the partitions).
    assert!(a.depth("in") > 0 && b.depth("in") > 0);
    // Per-partition lag is reported by a daemon that holds partitions.
    let sources: Vec<String> = [&a, &b]
        .iter()
        .map(|d| d.get("/v1/sources").to_string())
        .collect();
    assert!(
        sources.iter().any(|s| s.contains("partition_lag")),
        "{sources:?}"
    );
}

#[test]
fn two_daemons_in_one_group_hand_partitions_over_losing_and_committing_nothing_early() {
    two_daemons_hand_partitions_over("classic");
}

/// The same on Kafka 4's own group protocol (KIP-848), where the
/// brokers assign the partitions.
#[test]
fn two_daemons_in_one_group_on_the_consumer_protocol_lose_and_commit_nothing_early() {
    two_daemons_hand_partitions_over("consumer");
}

/// Waits until `check` says done; on a timeout, panics with what it
/// last said (how far each partition got), the group's commits, and both
/// daemons' and Kafka's logs: a partition nobody reads after a rebalance
/// shows across them, not in one log.
fn wait_or_say(
    a: &Daemon,
    b: &Daemon,
    server: &KafkaServer,
    what: &str,
    check: impl Fn() -> (bool, String),
) {
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let (done, state) = check();
        if done {
            return;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "timed out after {LONG:?} waiting for {what}: {state}; committed {:?}\n\
                 --- daemon A ---\n{}\n--- daemon B ---\n{}\n{}",
                committed(&server.brokers(), "g", "in"),
                a.log(),
                b.log(),
                server.log()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// On a cluster of three, one broker is killed with SIGKILL mid-run and
/// started again, while messages flow in and out: the sink produces
/// with `acks=all` and the idempotent producer, topics keep two replicas
/// in sync, and the source's group moves to another coordinator if it
/// must. 0 lost; duplicates carry one `sluice-id`.
#[test]
fn a_broker_killed_in_a_three_node_cluster_loses_nothing() {
    let mut up = Kafka::cluster();
    let n = 10_000;
    let half = n / 2;
    up.produce(0, half);
    let dir = tempfile::tempdir().expect("dir");
    let file = edge_pipeline(dir.path(), &up.source_block(), &up.sink_block());
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    wait_for_deliveries(&daemon, &mut up, n / 10, "before the broker is killed");
    up.server.kill_node(1);
    up.produce(half, n - half);
    wait_for_deliveries(&daemon, &mut up, n * 7 / 10, "while a broker is down");
    up.server
        .start_node(1)
        .expect("the killed broker starts again");
    wait_for_deliveries(&daemon, &mut up, n, "at the end");
    // The quiet window is the check: a duplicate redelivered late would
    // land in it, after the last first delivery; none leaves no event.
    std::thread::sleep(Duration::from_secs(3));
    let got = up.delivered();
    let report = check_exact_set(&got, n, Duplicates::SameId, &|| {
        format!("{}\n{}", daemon.log(), up.log())
    });
    assert_eq!(report.distinct, n);
    daemon.term();
}

#[test]
fn the_trace_context_goes_from_the_source_through_a_stage_to_the_sink() {
    let server = kafka();
    let brokers = server.brokers();
    create(&brokers, "in", 1);
    create(&brokers, "out", 1);
    let headers = json!({"traceparent": TRACEPARENT, "tracestate": TRACESTATE}).to_string();
    client(&["produce-with-headers", &brokers, "in", &headers, "traced"]);
    let dir = tempfile::tempdir().expect("dir");
    let file = edge_pipeline(
        dir.path(),
        &format!("kafka: {{brokers: \"{brokers}\", topic: in, group: g, start: earliest}}\n"),
        &format!("kafka: {{brokers: \"{brokers}\", topic: out}}\n"),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    let mut out = Vec::new();
    daemon.wait_until("the message in `out`", LONG, |_| {
        out = dump(&brokers, "out");
        !out.is_empty()
    });
    let m = &out[0];
    assert_eq!(m["payload"], "TRACED", "{m}");
    assert_eq!(m["headers"]["traceparent"], TRACEPARENT, "{m}");
    assert_eq!(m["headers"]["tracestate"], TRACESTATE, "{m}");
}

#[test]
fn poison_messages_are_dead_lettered_with_the_reason() {
    let server = kafka();
    let brokers = server.brokers();
    create(&brokers, "in", 1);
    create(&brokers, "out", 1);
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: kp
topics: [in, big]
sources:
  - name: src
    to: in
    kafka: {{brokers: "{brokers}", topic: in, group: g, start: earliest}}
sinks:
  - name: out
    subscribe: big
    kafka: {{brokers: "{brokers}", topic: out, max_message_bytes: 1000}}
"#
    );
    let file = write_pipeline(dir.path(), "kp", &yaml);
    // A key that is not UTF-8 cannot become a Sluice key.
    client(&["produce-raw-key", &brokers, "in"]);
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.publish(
        "big",
        &[
            Msg::new("small", "fits"),
            Msg::new("large", "x".repeat(5_000)),
        ],
    );
    daemon.wait_until("the large message in kp.out.dlq", LONG, |d| {
        d.depth("kp.out.dlq") >= 1
    });
    let rejected = daemon.read_all("kp.out.dlq");
    let text = rejected[0].to_string();
    assert!(text.contains("rejected"), "{text}");
    assert!(text.to_lowercase().contains("too large"), "{text}");
    daemon.wait_until("the small one delivered", LONG, |_| {
        dump(&brokers, "out").iter().any(|m| m["payload"] == "fits")
    });
    daemon.wait_until("the bad key in kp.src.dlq", LONG, |d| {
        d.depth("kp.src.dlq") >= 1
    });
    let poison = daemon.read_all("kp.src.dlq");
    let text = poison[0].to_string();
    assert!(text.contains("key is not UTF-8"), "{text}");
    assert_eq!(header(&poison[0], "n"), Some("0"));
}

#[test]
fn an_outage_is_shown_by_readiness_and_status_and_the_password_never_appears() {
    // A loopback port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let brokers = format!("127.0.0.1:{port}");
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: kd
topics: [in]
sources:
  - name: src
    to: in
    kafka:
      brokers: "{brokers}"
      topic: in
      group: g
      security: sasl_plaintext
      sasl: {{mechanism: SCRAM-SHA-256, username: alice, password: hunter2}}
sinks:
  - name: out
    subscribe: in
    kafka:
      brokers: "{brokers}"
      topic: out
      delivery_timeout: 2s
      security: sasl_plaintext
      sasl: {{mechanism: PLAIN, username: alice, password: hunter2}}
"#
    );
    let file = write_pipeline(dir.path(), "kd", &yaml);
    let validated = Command::new(sluice_bin())
        .args(["validate"])
        .arg(&file)
        .output()
        .expect("sluice validate");
    assert!(validated.status.success(), "{validated:?}");
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.publish("in", &[Msg::new("held-1", "waits for the brokers")]);
    daemon.wait_until("readiness names both", LONG, |d| {
        let (status, reasons) = d.readiness();
        status == "degraded" && reasons.contains("kd/src") && reasons.contains("kd/out")
    });
    let status = daemon.get("/v1/status");
    let sink = status
        .as_array()
        .and_then(|s| s.iter().find(|s| s["stage"] == "out"))
        .cloned()
        .expect("the sink's status");
    assert_eq!(sink["up"], false, "{sink}");
    let sources = daemon.get("/v1/sources");
    assert!(sources.to_string().contains("\"up\":false"), "{sources}");
    // The held message spends no attempts: nothing in the DLQ. The quiet
    // window is the check: a held message leaves no event to wait for.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(daemon.depth("kd.out.dlq"), 0);
    let ready = daemon.get("/health/ready").to_string();
    let shown = format!(
        "{ready}\n{status}\n{sources}\n{}\n{}",
        daemon.log(),
        String::from_utf8_lossy(&validated.stdout)
    );
    assert!(!shown.contains("hunter2"), "the password shows:\n{shown}");
    let cli = daemon.cli(&["status"], &[]);
    let text = String::from_utf8_lossy(&cli.stdout);
    assert!(text.contains("DOWN"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[test]
fn the_example_pipeline_validates() {
    assert!(Path::new(&plugin("uppercase")).is_file());
    let out = Command::new(sluice_bin())
        .arg("validate")
        .arg(sluice_harness::repo_root().join("pipelines/kafka.yaml"))
        .output()
        .expect("sluice validate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A source whose topic stays full (its stage paused, the topic at its
/// high-water mark) for longer than the group's session stops fetching
/// and stays a member: no rebalance, nothing committed past what the topic
/// holds; resumed, every message arrives once.
#[test]
fn a_source_held_at_a_full_topic_stays_in_its_group_and_loses_nothing() {
    const N: usize = 2_000;
    let server = kafka();
    let brokers = server.brokers();
    create(&brokers, "in", 2);
    produce(&brokers, "in", 0, N);
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: kp
topics:
  - {{name: in, high_water_mark: 50}}
  - out
sources:
  - name: src
    to: in
    kafka: {{brokers: "{brokers}", topic: in, group: held, start: earliest, batch: 10, buffer: 20, session_timeout: 6s}}
stages:
  - name: pass
    subscribe: in
    plugin: {identity}
    publish: [out]
"#,
        identity = plugin("identity"),
    );
    let file = write_pipeline(dir.path(), "kp", &yaml);
    let daemon = Daemon::builder(&[&file], &dir.path().join("data"))
        .envs([("SLUICE_LOG", "warn,sluice=debug")])
        .start();
    daemon.post("/v1/stages/kp/pass/pause", json!({}));
    daemon.wait_until("the topic at its mark", LONG, |d| d.depth("in") >= 50);
    // Twice the session: a member that stopped polling would be gone. The
    // quiet window is the check (the log is read for it below).
    std::thread::sleep(Duration::from_secs(12));
    let held = daemon.depth("in");
    assert!(held <= 50 + 10, "the mark holds: {held} in the topic");
    let log = daemon.log();
    assert!(
        log.contains("fetching paused"),
        "the source paused its partitions:\n{log}"
    );
    assert!(
        !log.contains("partitions revoked"),
        "no rebalance while it was held:\n{log}"
    );
    let commits = committed(&brokers, "held", "in");
    // A partition with no commit yet answers a negative sentinel.
    let total: i64 = commits.values().filter(|o| **o > 0).sum();
    assert!(
        usize::try_from(total).expect("a count") <= daemon.depth("in") + daemon.depth("out"),
        "nothing committed past what the topics hold: {commits:?}"
    );
    daemon.post("/v1/stages/kp/pass/resume", json!({}));
    daemon.wait_until("every message through", LONG, |d| d.depth("out") >= N);
    let out = daemon.read_all("out");
    let payloads: BTreeSet<String> = out
        .iter()
        .map(|m| m["payload"].as_str().expect("text").to_owned())
        .collect();
    assert_eq!(out.len(), N, "each once");
    assert_eq!(payloads.len(), N, "each once");
}
