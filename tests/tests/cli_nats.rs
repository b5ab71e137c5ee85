//! `sluice publish`, `tail` and `dlq` straight against NATS JetStream
//! (`--broker nats://...`), with no daemon running: the real binary against
//! a real nats-server from the harness (a free port, a temporary store).
//!
//! Topics are set up the way a daemon would leave them, through
//! `NatsBroker::ensure_topic`, and dead letters are seeded as the engine
//! writes them (the original message stamped with `Provenance::stamp`).
//! `SLUICE_ADMIN` points at a port nothing listens on, so a command that
//! wrongly went through a daemon would fail instead of finding one.
//!
//! Nothing asserts on timing except that an unreachable server is reported
//! within a bound far above the CLI's connect timeout.

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;
use sluice::broker::nats::{NatsBroker, NatsOptions};
use sluice::broker::{Broker, ConsumerSpec, Message, Stored, TopicSpec};
use sluice::dlq::{self, Provenance};
use sluice_harness::nats::NatsServer;
use sluice_tests::sluice_bin;

/// A nats-server and a broker connected to it, for setting up and checking.
struct Nats {
    _server: NatsServer,
    url: String,
    broker: Arc<NatsBroker>,
}

impl Nats {
    async fn start() -> Nats {
        let server = NatsServer::start().expect("start nats-server");
        let url = server.url();
        let options = NatsOptions::parse(&url).expect("url");
        let broker = NatsBroker::connect(options, Duration::from_secs(30))
            .await
            .expect("connect");
        Nats {
            _server: server,
            url,
            broker,
        }
    }

    /// A topic no stage reads: messages are kept by age (an output, a DLQ).
    async fn topic(&self, name: &str) {
        self.broker
            .ensure_topic(&TopicSpec::new(name))
            .await
            .expect("ensure topic");
    }

    /// A topic a stage reads, with that stage's consumer, as a daemon
    /// running the stage declares them.
    async fn subscribed_topic(&self, name: &str, consumer: &str) {
        self.broker
            .ensure_topic(&TopicSpec {
                subscribed: true,
                ..TopicSpec::new(name)
            })
            .await
            .expect("ensure topic");
        self.broker
            .ensure_consumer(&ConsumerSpec {
                name: consumer.into(),
                topic: name.into(),
                filter: Default::default(),
                ack_wait: Duration::from_secs(60),
                max_ack_pending: None,
                max_deliver: None,
            })
            .await
            .expect("ensure consumer");
    }

    async fn read_all(&self, topic: &str) -> Vec<Stored> {
        self.broker
            .read(topic, 1, 1000, Duration::ZERO)
            .await
            .expect("read")
    }

    async fn depth(&self, topic: &str) -> u64 {
        self.broker.topic_stats(topic).await.expect("stats").depth
    }

    /// Runs `sluice ARGS --broker <this server>`.
    fn sluice(&self, args: &[&str]) -> Output {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--broker", &self.url]);
        sluice(&all)
    }
}

/// Runs the real binary with no broker or daemon from the environment.
fn sluice(args: &[&str]) -> Output {
    command(args).output().expect("run sluice")
}

fn command(args: &[&str]) -> Command {
    let mut command = Command::new(sluice_bin());
    command
        .args(args)
        .env_remove("SLUICE_BROKER")
        .env("SLUICE_ADMIN", "127.0.0.1:1")
        .stdin(Stdio::null());
    command
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Value {
    assert!(output.status.success(), "{}", stderr(output));
    serde_json::from_str(stdout(output).trim()).expect("JSON on stdout")
}

/// A DLQ entry for stage `p/s` as the engine writes it.
async fn seed_dead_letter(nats: &Nats, id: &str, payload: &str, source_topic: &str) -> u64 {
    let mut entry = Message::new(id, "p.s.dlq", payload.as_bytes().to_vec());
    entry.key = Some("k1".into());
    entry.headers.push(("trace".into(), "t-1".into()));
    Provenance {
        pipeline: "p".into(),
        stage: "s".into(),
        source_topic: source_topic.into(),
        source_seq: 7,
        original_id: id.into(),
        attempts: 3,
        kind: "rejected".into(),
        error: "rejected: handler said no".into(),
        first_failure: 1_700_000_000_000,
        last_failure: 1_700_000_060_000,
    }
    .stamp(&mut entry);
    nats.broker.publish(vec![entry]).await.expect("seed")[0].seq
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_and_tail_work_on_nats_without_a_daemon() {
    let nats = Nats::start().await;
    nats.topic("orders.in").await;
    // An outside NATS client, subscribed before anything is published.
    let outside = async_nats::connect(&nats.url)
        .await
        .expect("outside client");
    let mut seen = outside.subscribe("orders.in").await.expect("subscribe");
    outside.flush().await.expect("flush");

    let args = [
        "publish",
        "orders.in",
        "--data",
        "x",
        "--id",
        "a",
        "--key",
        "k",
        "--header",
        "source=cli",
    ];
    let first = json(&nats.sluice(&args));
    assert_eq!(
        first,
        serde_json::json!({"id": "a", "topic": "orders.in", "seq": 1, "duplicate": false})
    );
    let again = json(&nats.sluice(&args));
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["seq"], 1, "{again}");

    // Another message, from stdin and through SLUICE_BROKER this time.
    let mut child = command(&["publish", "orders.in", "-"])
        .env("SLUICE_BROKER", &nats.url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sluice");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), b"from stdin")
        .expect("write stdin");
    let out = child.wait_with_output().expect("output");
    assert_eq!(json(&out)["seq"], 2);
    assert_eq!(
        nats.depth("orders.in").await,
        2,
        "the duplicate is not stored"
    );

    // What the outside client saw: a plain NATS message.
    let plain = tokio::time::timeout(Duration::from_secs(30), seen.next())
        .await
        .expect("the outside client sees the publish")
        .expect("a message");
    assert_eq!(&plain.payload[..], b"x");
    let headers = plain.headers.expect("headers");
    assert_eq!(headers.get("Nats-Msg-Id").map(|v| v.as_str()), Some("a"));
    assert_eq!(headers.get("Sluice-Key").map(|v| v.as_str()), Some("k"));
    assert_eq!(headers.get("source").map(|v| v.as_str()), Some("cli"));

    let out = nats.sluice(&["tail", "orders.in", "--from-start", "--count", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", stdout(&out));
    assert_eq!(lines[0]["seq"], 1);
    assert_eq!(lines[0]["id"], "a");
    assert_eq!(lines[0]["topic"], "orders.in");
    assert_eq!(lines[0]["payload"], "x");
    assert_eq!(lines[0]["key"], "k");
    assert_eq!(lines[0]["headers"], serde_json::json!([["source", "cli"]]));
    assert_eq!(lines[1]["payload"], "from stdin");

    // Without --from-start, tail follows new messages only: publish from
    // the outside client until the follower has printed one.
    let mut follower = command(&["tail", "orders.in", "--count", "1", "--broker", &nats.url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sluice tail");
    let js = async_nats::jetstream::new(outside.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while follower.try_wait().expect("try_wait").is_none() {
        assert!(
            Instant::now() < deadline,
            "tail never printed a new message"
        );
        js.publish("orders.in", "new".into())
            .await
            .expect("publish")
            .await
            .expect("ack");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = follower.wait_with_output().expect("output");
    let line = json(&out);
    assert_eq!(line["payload"], "new");
    assert!(line["seq"].as_u64().expect("seq") > 2, "{line}");
    // A message from a plain NATS client gets an id from its place.
    assert_eq!(
        line["id"],
        format!("SLUICE_orders_in:{}", line["seq"].as_u64().expect("seq"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_list_show_redrive_and_purge_work_on_nats_without_a_daemon() {
    let nats = Nats::start().await;
    nats.subscribed_topic("p.in", "p.s").await;
    nats.topic("p.s.dlq").await;
    let m1 = seed_dead_letter(&nats, "m1", "bad order", "p.in").await;
    seed_dead_letter(&nats, "m2", "worse order", "p.in").await;
    // Dead-lettered from a topic that is gone: a redrive cannot route it.
    let orphan = seed_dead_letter(&nats, "m3", "orphan", "gone.topic").await;

    let out = nats.sluice(&["dlq", "list", "p/s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let mut lines = text.lines();
    let header = lines.next().expect("header");
    assert!(
        header.starts_with("SEQ") && header.contains("KIND"),
        "{text}"
    );
    let row = lines.next().expect("a row");
    assert!(row.starts_with(&m1.to_string()), "{text}");
    assert!(
        row.contains("m1") && row.contains("rejected: handler said no"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 4, "{text}");

    let list = json(&nats.sluice(&["dlq", "list", "p/s", "--json", "--limit", "2"]));
    assert_eq!(list["topic"], "p.s.dlq");
    assert_eq!(list["depth"], 3);
    assert_eq!(list["entries"].as_array().expect("entries").len(), 2);

    let entry = json(&nats.sluice(&["dlq", "show", "p/s", &m1.to_string()]));
    assert_eq!(entry["payload"], "bad order");
    assert_eq!(entry["source_topic"], "p.in");
    assert_eq!(entry["key"], "k1");

    // The same entry as a test case, and replayed against a plugin, straight
    // from NATS: the message as its handler saw it.
    let out = nats.sluice(&["dlq", "show", "p/s", &m1.to_string(), "--as-case"]);
    let case = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        case.contains(r#"payload: "bad order""#)
            && case.contains(r#"key: "k1""#)
            && case.contains(r#""trace": "t-1""#)
            && case.contains("attempt: 3")
            && !case.contains("sluice-dlq"),
        "{case}"
    );
    let uppercase = sluice_harness::plugin("uppercase");
    let from = format!("p/s/{m1}");
    let out = nats.sluice(&[
        "plugin",
        "test",
        uppercase.to_str().expect("utf-8"),
        "--from-dlq",
        &from,
    ]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(
        stderr(&out).contains("which failed with rejected after 3 attempt(s)"),
        "{}",
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("1 passed, 0 failed"),
        "{}",
        stdout(&out)
    );

    // A dry run changes nothing.
    let out = nats.sluice(&["dlq", "redrive", "p/s", "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("would redrive 2 messages from the DLQ of p/s"),
        "{}",
        stdout(&out)
    );
    assert_eq!(nats.depth("p.s.dlq").await, 3);
    assert_eq!(nats.depth("p.in").await, 0);

    // One, then the rest, paced.
    let out = nats.sluice(&["dlq", "redrive", "p/s", "--limit", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("redrove 1 message from the DLQ of p/s\n  m1~r1@p/s\n"),
        "{}",
        stdout(&out)
    );
    let out = nats.sluice(&["dlq", "redrive", "p/s", "--rate", "20"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("redrove 1 message from the DLQ of p/s\n  m2~r1@p/s\n"),
        "{text}"
    );
    assert!(
        text.contains("skipped 1 entry (left in the DLQ):"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "seq {orphan} (m3): its source topic `gone.topic` does not exist on the broker"
        )),
        "{text}"
    );

    // Back on the source topic, for stage p/s only, and out of the DLQ.
    let redriven = nats.read_all("p.in").await;
    let ids: Vec<&str> = redriven.iter().map(|s| s.message.id.as_str()).collect();
    assert_eq!(ids, ["m1~r1@p/s", "m2~r1@p/s"]);
    let first = &redriven[0].message;
    assert_eq!(&first.payload[..], b"bad order");
    assert_eq!(first.key.as_deref(), Some("k1"));
    assert_eq!(first.header(dlq::REDRIVE_TO), Some("p/s"));
    assert_eq!(first.header(dlq::REDRIVES), Some("1"));
    assert_eq!(first.header("trace"), Some("t-1"));
    assert_eq!(
        first.header(dlq::SOURCE_TOPIC),
        None,
        "provenance is stripped"
    );
    let left: Vec<u64> = nats
        .read_all("p.s.dlq")
        .await
        .iter()
        .map(|s| s.seq)
        .collect();
    assert_eq!(left, [orphan], "only the unroutable entry stays");

    // Purge: say how many, then they are gone.
    seed_dead_letter(&nats, "m4", "again", "p.in").await;
    let out = nats.sluice(&["dlq", "purge", "p/s"]);
    assert_eq!(out.status.code(), Some(2), "purge without a count");
    let out = nats.sluice(&["dlq", "purge", "p/s", "--limit", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "purged 1 entry from the DLQ of p/s");
    // Without --pipelines no `dlq: {archive}` is known: said, not silent.
    assert!(
        stderr(&out).contains("the purged entries are not archived"),
        "{}",
        stderr(&out)
    );
    assert_eq!(nats.depth("p.s.dlq").await, 1);
    let out = nats.sluice(&["dlq", "purge", "p/s", "--all"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "purged 1 entry from the DLQ of p/s");
    assert_eq!(nats.depth("p.s.dlq").await, 0);
    let out = nats.sluice(&["dlq", "list", "p/s"]);
    assert_eq!(stdout(&out).trim(), "the DLQ of p/s (p.s.dlq) is empty");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_files_name_a_custom_dlq_topic() {
    let nats = Nats::start().await;
    nats.subscribed_topic("orders", "shop.route").await;
    nats.topic("shop.dead").await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("shop.yaml");
    std::fs::write(
        &file,
        "name: shop\ntopics: [orders, shop.dead]\nstages:\n  - name: route\n    subscribe: orders\n    plugin: route.wasm\n    dlq: shop.dead\n",
    )
    .expect("write pipeline");
    let mut entry = Message::new("d1", "shop.dead", "bad".as_bytes().to_vec());
    Provenance {
        pipeline: "shop".into(),
        stage: "route".into(),
        source_topic: "orders".into(),
        source_seq: 1,
        original_id: "d1".into(),
        attempts: 1,
        kind: "rejected".into(),
        error: "no".into(),
        first_failure: 1,
        last_failure: 2,
    }
    .stamp(&mut entry);
    nats.broker.publish(vec![entry]).await.expect("seed");

    // By convention the stage's DLQ would be shop.route.dlq, which NATS
    // does not have.
    let out = nats.sluice(&["dlq", "list", "shop/route"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no dead-letter topic `shop.route.dlq`"),
        "{}",
        stderr(&out)
    );

    let pipelines = file.to_str().expect("utf8");
    let out = nats.sluice(&["dlq", "redrive", "shop/route", "--pipelines", pipelines]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("redrove 1 message from the DLQ of shop/route"),
        "{}",
        stdout(&out)
    );
    assert_eq!(nats.depth("shop.dead").await, 0);
    let ids: Vec<String> = nats
        .read_all("orders")
        .await
        .into_iter()
        .map(|s| s.message.id)
        .collect();
    assert_eq!(ids, ["d1~r1@shop/route"]);

    // With the files, only their topics are accepted, as by their daemon.
    nats.topic("elsewhere").await;
    let out = nats.sluice(&[
        "publish",
        "elsewhere",
        "--data",
        "x",
        "--pipelines",
        pipelines,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("error: unknown topic `elsewhere`"),
        "{}",
        stderr(&out)
    );
    // A file with a problem is a wrong input.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "name: [").expect("write");
    let out = nats.sluice(&["tail", "orders", "--pipelines", bad.to_str().expect("utf8")]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("bad.yaml"), "{}", stderr(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_topics_and_stages_exit_2_with_a_clear_message() {
    let nats = Nats::start().await;
    for args in [
        vec!["publish", "nope", "--data", "x"],
        vec!["tail", "nope", "--from-start", "--count", "1"],
        vec!["tail", "nope"],
    ] {
        let out = nats.sluice(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).starts_with("error: unknown topic `nope`: the broker has no such topic"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(stdout(&out).is_empty(), "{args:?}");
    }
    for args in [
        vec!["dlq", "list", "p/nope"],
        vec!["dlq", "redrive", "p/nope"],
        vec!["dlq", "purge", "p/nope", "--all"],
        vec!["dlq", "show", "p/nope", "1"],
    ] {
        let out = nats.sluice(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).starts_with(
                "error: unknown stage `p/nope`: the broker has no dead-letter topic `p.nope.dlq`"
            ),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // The payload is checked before anything is published.
    nats.topic("t").await;
    let out = nats.sluice(&["publish", "t"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(nats.depth("t").await, 0);
    // A broker that is not a URL this CLI knows.
    for broker in ["nats://127.0.0.1:notaport", "kafka://127.0.0.1:9092"] {
        let out = sluice(&["publish", "t", "--data", "x", "--broker", broker]);
        assert_eq!(out.status.code(), Some(2), "{broker}: {}", stderr(&out));
    }
    // Status is the daemon's only.
    let out = nats.sluice(&["status"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("status needs a running daemon"),
        "{}",
        stderr(&out)
    );
    // --pipelines means nothing to a daemon.
    let out = sluice(&["publish", "t", "--data", "x", "--pipelines", "x.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--pipelines"), "{}", stderr(&out));
}

#[test]
fn an_unreachable_nats_exits_1_promptly() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    for args in [
        vec!["publish", "t", "--data", "x"],
        vec!["tail", "t"],
        vec!["dlq", "list", "p/s"],
        vec!["dlq", "redrive", "p/s"],
    ] {
        let started = Instant::now();
        let mut all = args.clone();
        all.extend(["--broker", url.as_str()]);
        let out = sluice(&all);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&format!("NATS at {url}")) && err.contains("no connection within"),
            "{args:?}: {err}"
        );
        assert!(stdout(&out).is_empty(), "{args:?}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
}

/// `sluice stage pause --broker nats://...`, no daemon in between: a
/// one-topic stage by its name alone (the consumer is found on the
/// server); a stage with priority lanes with `--pipelines` (a consumer per
/// lane, every one paused), and without them a clear error saying so.
#[test]
fn stage_pause_straight_to_nats_finds_the_consumers_and_every_lane() {
    use sluice_tests::{Backend, Daemon, plugin, write_pipeline};
    let backend = Backend::nats();
    let url = backend.broker_url().expect("a NATS url");
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        "name: lp\ntopics: [hi, lo, a, out]\nstages:\n  - name: lanes\n    \
         subscribe: {{topics: [hi, lo], priority: strict}}\n    plugin: {p}\n    \
         publish: [out]\n  - name: one\n    subscribe: a\n    plugin: {p}\n    publish: [out]\n",
        p = plugin("identity")
    );
    let file = write_pipeline(dir.path(), "lp", &yaml);
    let daemon = Daemon::start_on(&backend, &[&file], &dir.path().join("data"));
    let paused = |stage: &str| {
        daemon
            .get("/v1/status")
            .as_array()
            .expect("stages")
            .iter()
            .any(|s| s["stage"] == stage && s["paused"] == true)
    };
    let pipelines = file.to_str().expect("utf-8 path");

    let one = sluice(&["stage", "pause", "lp/one", "--broker", &url]);
    assert!(one.status.success(), "{}", stderr(&one));
    assert!(paused("one"), "{}", daemon.get("/v1/status"));

    let lanes = sluice(&["stage", "pause", "lp/lanes", "--broker", &url]);
    assert_eq!(lanes.status.code(), Some(2), "{}", stdout(&lanes));
    assert!(
        stderr(&lanes).contains("pass --pipelines"),
        "{}",
        stderr(&lanes)
    );
    assert!(!paused("lanes"), "nothing paused by a refusal");

    let lanes = sluice(&[
        "stage",
        "pause",
        "lp/lanes",
        "--broker",
        &url,
        "--pipelines",
        pipelines,
    ]);
    assert!(lanes.status.success(), "{}", stderr(&lanes));
    assert!(paused("lanes"), "{}", daemon.get("/v1/status"));
    // Each lane's consumer holds the pause: a message on either waits.
    daemon.publish("hi", &[sluice_tests::Msg::new("h", "x")]);
    daemon.publish("lo", &[sluice_tests::Msg::new("l", "x")]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(daemon.depth("out"), 0, "a paused lane delivered");

    for stage in ["lp/one", "lp/lanes"] {
        let resumed = sluice(&[
            "stage",
            "resume",
            stage,
            "--broker",
            &url,
            "--pipelines",
            pipelines,
        ]);
        assert!(resumed.status.success(), "{}", stderr(&resumed));
    }
    daemon.wait_until("both lanes' messages", Duration::from_secs(60), |d| {
        d.depth("out") == 2
    });
}
