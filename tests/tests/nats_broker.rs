//! The NATS broker at the trait level, against a real nats-server 2.15:
//! start-up provisioning (idempotent, drift fixed or refused clearly), the
//! JetStream objects it makes, header filters, nak/term/dead-letter, and the
//! plain-NATS shape of what it stores.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer, stream::RetentionPolicy};
use sluice::broker::nats::{NatsBroker, NatsOptions, durable_name, stream_name};
use sluice::broker::{Broker, BrokerError, ConsumerSpec, Message, Readiness, TopicSpec};
use sluice_harness::nats::{FlagServer, NatsServer};

const WAIT: Duration = Duration::from_secs(2);

async fn connect(server: &NatsServer) -> std::sync::Arc<NatsBroker> {
    NatsBroker::connect(
        NatsOptions::parse(&server.url()).expect("url"),
        Duration::from_secs(10),
    )
    .await
    .expect("connect")
}

fn consumer(name: &str, topic: &str, ack_wait: Duration) -> ConsumerSpec {
    ConsumerSpec {
        name: name.into(),
        topic: topic.into(),
        filter: BTreeMap::new(),
        ack_wait,
        max_ack_pending: Some(100),
        max_deliver: Some(13),
    }
}

fn subscribed(name: &str) -> TopicSpec {
    TopicSpec {
        subscribed: true,
        ..TopicSpec::new(name)
    }
}

async fn server_consumer(b: &NatsBroker, topic: &str, name: &str) -> PullConsumer {
    jetstream::new(b.client().clone())
        .get_stream(stream_name(topic))
        .await
        .expect("stream")
        .get_consumer(&durable_name(name))
        .await
        .expect("consumer")
}

#[tokio::test]
async fn provisioning_is_idempotent_and_puts_drift_back() {
    let server = NatsServer::start().expect("nats-server");
    let b = connect(&server).await;
    let spec = TopicSpec {
        retention: Some(Duration::from_secs(3600)),
        duplicate_window: Some(Duration::from_secs(300)),
        ..subscribed("orders.in")
    };
    b.ensure_topic(&spec).await.expect("topic");
    b.ensure_topic(&spec).await.expect("the same again");
    b.ensure_consumer(&consumer(
        "orders.route",
        "orders.in",
        Duration::from_secs(30),
    ))
    .await
    .expect("consumer");

    let js = jetstream::new(b.client().clone());
    let mut stream = js.get_stream("SLUICE_orders_in").await.expect("stream");
    let config = stream.info().await.expect("info").config.clone();
    assert_eq!(
        config.subjects,
        ["orders.in", "_sluice.delay.SLUICE_orders_in.>"],
        "the topic, and the subjects its delayed messages wait under"
    );
    assert!(config.allow_message_schedules);
    assert_eq!(config.retention, RetentionPolicy::Interest);
    assert_eq!(config.max_age, Duration::from_secs(3600));
    assert_eq!(config.duplicate_window, Duration::from_secs(300));
    // A stage reads it: the server holds every producer to the headroom.
    let limit = b.client().max_payload() - sluice::broker::nats::DEAD_LETTER_HEADROOM;
    assert_eq!(
        usize::try_from(config.max_message_size).ok(),
        Some(limit),
        "max_msg_size"
    );

    let mut pull = server_consumer(&b, "orders.in", "orders.route").await;
    let info = pull.info().await.expect("consumer info").clone();
    assert_eq!(info.name, "orders_route");
    assert_eq!(info.config.ack_wait, Duration::from_secs(30));
    assert_eq!(info.config.max_deliver, 13);
    assert_eq!(info.config.max_ack_pending, 100);
    assert_eq!(info.config.filter_subject, "orders.in");

    // An operator changes ack_wait and retention in YAML and restarts.
    let b2 = connect(&server).await;
    b2.ensure_topic(&TopicSpec {
        retention: Some(Duration::from_secs(7200)),
        ..spec.clone()
    })
    .await
    .expect("drifted topic");
    b2.ensure_consumer(&consumer(
        "orders.route",
        "orders.in",
        Duration::from_secs(10),
    ))
    .await
    .expect("drifted consumer");
    let config = stream.info().await.expect("info").config.clone();
    assert_eq!(config.max_age, Duration::from_secs(7200));
    let info = pull.info().await.expect("consumer info").clone();
    assert_eq!(info.config.ack_wait, Duration::from_secs(10));

    // A stream made before streams carried the limit gets it on start.
    let mut unlimited = config.clone();
    unlimited.max_message_size = -1;
    js.update_stream(unlimited).await.expect("lift the limit");
    let lifted = stream.info().await.expect("info").config.max_message_size;
    assert_eq!(lifted, -1, "the limit was lifted");
    b2.ensure_topic(&TopicSpec {
        retention: Some(Duration::from_secs(7200)),
        ..spec.clone()
    })
    .await
    .expect("the limit put back");
    let config = stream.info().await.expect("info").config.clone();
    assert_eq!(
        usize::try_from(config.max_message_size).ok(),
        Some(limit),
        "max_msg_size put back"
    );
}

#[tokio::test]
async fn what_jetstream_cannot_change_is_refused_with_what_to_do() {
    let server = NatsServer::start().expect("nats-server");
    let b = connect(&server).await;
    b.ensure_topic(&TopicSpec::new("events"))
        .await
        .expect("limits topic");
    let err = b
        .ensure_topic(&subscribed("events"))
        .await
        .expect_err("retention cannot change in place");
    let text = err.to_string();
    assert!(matches!(err, BrokerError::Provision(_)), "{err:?}");
    assert!(
        text.contains("retention") && text.contains("nats stream rm SLUICE_events"),
        "{text}"
    );

    // Two topics that map to one stream name.
    b.ensure_topic(&TopicSpec::new("a.b")).await.expect("a.b");
    let err = b
        .ensure_topic(&TopicSpec::new("a_b"))
        .await
        .expect_err("name clash");
    assert!(err.to_string().contains("already exists"), "{err}");

    let err = b
        .ensure_topic(&TopicSpec::new("a..b"))
        .await
        .expect_err("not a subject");
    assert!(err.to_string().contains("valid NATS subject"), "{err}");
}

/// A broker on `server` with topic `in` (subscribed), its DLQ topic
/// `in.dlq`, and the stage consumer `spec` on `in`.
async fn stage_with_dlq(server: &NatsServer, spec: &ConsumerSpec) -> std::sync::Arc<NatsBroker> {
    let b = connect(server).await;
    b.ensure_topic(&subscribed("in")).await.expect("in");
    b.ensure_topic(&TopicSpec::new("in.dlq"))
        .await
        .expect("dlq");
    b.ensure_consumer(spec).await.expect("consumer");
    b
}

/// A pause is JetStream's own: a second broker (another daemon) sees it,
/// a lease already out can still be answered, provisioning again (a restart)
/// keeps it, and a resume delivers what waited.
#[tokio::test]
async fn a_pause_holds_for_every_daemon_and_survives_provisioning() {
    let server = NatsServer::start().expect("nats-server");
    let spec = consumer("p.s", "in", Duration::from_secs(30));
    let b = stage_with_dlq(&server, &spec).await;
    b.publish(vec![Message::new("a", "in", "first")])
        .await
        .expect("publish");
    let held = b.fetch("p.s", 1, WAIT).await.expect("fetch");
    assert_eq!(held.len(), 1);
    b.set_paused("p.s", true).await.expect("pause");
    b.publish(vec![
        Message::new("b", "in", "second"),
        Message::new("c", "in", "third"),
    ])
    .await
    .expect("publish");
    assert!(b.fetch("p.s", 10, WAIT).await.expect("fetch").is_empty());
    b.ack(&held[0].receipt)
        .await
        .expect("a lease out is answered");

    let other = stage_with_dlq(&server, &spec).await;
    assert!(other.consumer_stats("p.s").await.expect("stats").paused);
    assert!(
        other
            .fetch("p.s", 10, WAIT)
            .await
            .expect("fetch")
            .is_empty(),
        "another daemon fetched from a paused stage"
    );
    other.set_paused("p.s", false).await.expect("resume");
    let mut got = Vec::new();
    for _ in 0..10 {
        got.extend(b.fetch("p.s", 10, WAIT).await.expect("fetch"));
        if got.len() >= 2 {
            break;
        }
    }
    let ids: Vec<&str> = got.iter().map(|d| d.message.id.as_str()).collect();
    assert_eq!(ids, ["b", "c"]);
    assert!(!b.consumer_stats("p.s").await.expect("stats").paused);
}

/// A delayed message is a JetStream schedule in the topic's stream: kept
/// (an interest stream would drop it, but for the keeper consumer),
/// counted as delayed, never delivered early, delivered with its id and
/// without its delay header, also when the server is killed meanwhile.
/// A stream made before delays gains them on the next provisioning.
#[tokio::test]
async fn delayed_messages_are_schedules_that_survive_a_server_kill_and_keep_their_ids() {
    let mut server = NatsServer::start().expect("nats-server");
    // A stream as Sluice made it before delays existed.
    {
        let client = async_nats::connect(server.url()).await.expect("connect");
        jetstream::new(client)
            .create_stream(jetstream::stream::Config {
                name: stream_name("in"),
                description: Some("Sluice topic `in`".into()),
                subjects: vec!["in".into()],
                retention: RetentionPolicy::Interest,
                allow_direct: true,
                ..Default::default()
            })
            .await
            .expect("an old stream");
    }
    let spec = consumer("p.s", "in", Duration::from_secs(30));
    let b = stage_with_dlq(&server, &spec).await;
    let start = sluice::broker::now_millis();
    let delayed = |id: &str, name: &str, value: String| {
        let mut m = Message::new(id, "in", format!("payload {id}"));
        m.headers = vec![("keep".into(), "1".into()), (name.into(), value)];
        m
    };
    let acks = b
        .publish(vec![
            Message::new("now", "in", "x"),
            delayed("soon", "Sluice-Delay", "2s".into()),
            delayed(
                "later",
                "sluice-deliver-at",
                sluice::timestamp::format_rfc3339_millis(start + 6_000),
            ),
        ])
        .await
        .expect("publish");
    assert_eq!(acks[1].seq, 0, "a delayed message has no place yet");
    let refused = b
        .publish(vec![delayed("bad", "sluice-delay", "whenever".into())])
        .await;
    assert!(
        matches!(refused, Err(BrokerError::BadMessage(_))),
        "{refused:?}"
    );
    let stats = b.topic_stats("in").await.expect("stats");
    assert_eq!((stats.depth, stats.delayed), (1, 2), "{stats:?}");
    // The earlier of the two, read from the schedules' headers.
    let next = stats.next_due.expect("the next due time");
    assert!(
        next >= start + 2_000 && next < start + 6_000,
        "next due {} ms after the start, not `soon`'s",
        next.saturating_sub(start)
    );
    // Republishing a delayed id is a duplicate, as for any message.
    let again = b
        .publish(vec![delayed("soon", "sluice-delay", "2s".into())])
        .await
        .expect("republish");
    assert!(again[0].duplicate);

    let first = b.fetch("p.s", 10, WAIT).await.expect("fetch");
    let ids: Vec<&str> = first.iter().map(|d| d.message.id.as_str()).collect();
    assert_eq!(ids, ["now"]);
    b.ack(&first[0].receipt).await.expect("ack");

    // The server dies with both schedules pending, and comes back.
    server.kill().expect("kill");
    server.restart().expect("restart");
    let b = stage_with_dlq(&server, &spec).await;
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < 2 && std::time::Instant::now() < deadline {
        for d in b.fetch("p.s", 10, WAIT).await.unwrap_or_default() {
            let now = sluice::broker::now_millis();
            if d.message.id == "now" {
                // Its ack may have died with the server: at least once.
                b.ack(&d.receipt).await.expect("ack");
                continue;
            }
            let due = if d.message.id == "soon" {
                start + 2_000
            } else {
                start + 6_000
            };
            assert!(
                now >= due,
                "{} delivered {} ms early",
                d.message.id,
                due - now
            );
            assert_eq!(d.message.headers, [("keep".into(), "1".into())]);
            assert_eq!(d.message.payload, format!("payload {}", d.message.id));
            b.ack(&d.receipt).await.expect("ack");
            seen.push(d.message.id.clone());
        }
    }
    assert_eq!(seen, ["soon", "later"]);
    let stats = b.topic_stats("in").await.expect("stats");
    assert_eq!((stats.delayed, stats.next_due), (0, None), "{stats:?}");
}

#[tokio::test]
async fn messages_are_plain_nats_messages_and_are_answered_as_asked() {
    let server = NatsServer::start().expect("nats-server");
    let mut spec = consumer("p.s", "in", Duration::from_secs(30));
    spec.filter = BTreeMap::from([("region".to_owned(), "eu".to_owned())]);
    let b = stage_with_dlq(&server, &spec).await;

    let mut eu = Message::new("m1", "in", "hello");
    eu.key = Some("k1".into());
    eu.headers = vec![("region".into(), "eu".into())];
    let mut us = Message::new("m2", "in", "skip me");
    us.headers = vec![("region".into(), "us".into())];
    let acks = b.publish(vec![eu, us]).await.expect("publish");
    assert_eq!((acks[0].seq, acks[0].duplicate), (1, false));
    let again = b
        .publish(vec![Message::new("m1", "in", "hello")])
        .await
        .expect("republish");
    assert!(again[0].duplicate, "the duplicate window drops a republish");

    // What an outside client sees: body = payload, the id and key in headers.
    let raw = jetstream::new(b.client().clone())
        .get_stream("SLUICE_in")
        .await
        .expect("stream")
        .get_raw_message(1)
        .await
        .expect("raw");
    assert_eq!(&raw.payload[..], b"hello");
    assert_eq!(
        raw.headers.get("Nats-Msg-Id").map(|v| v.as_str()),
        Some("m1")
    );
    assert_eq!(
        raw.headers.get("Sluice-Key").map(|v| v.as_str()),
        Some("k1")
    );

    // The filter: only the eu message is delivered; the us one is acked
    // unhandled, so nothing stays pending.
    let first = b.fetch("p.s", 10, WAIT).await.expect("fetch");
    assert_eq!(first.len(), 1, "{first:?}");
    let d = &first[0];
    assert_eq!((d.message.id.as_str(), d.attempt), ("m1", 1));
    assert_eq!(d.message.key.as_deref(), Some("k1"));

    // nak with a delay: back after it, as attempt 2.
    b.nak(&d.receipt, Duration::from_millis(300))
        .await
        .expect("nak");
    assert!(
        b.fetch("p.s", 10, Duration::from_millis(100))
            .await
            .expect("fetch")
            .is_empty()
    );
    let second = b.fetch("p.s", 10, WAIT).await.expect("fetch");
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].attempt, 2);

    // Dead-letter: the copy is in the DLQ, the source is gone for good.
    let mut entry = second[0].message.clone();
    entry.topic = "in.dlq".into();
    b.dead_letter(&second[0].receipt, entry)
        .await
        .expect("dead letter");
    b.flush().await.expect("flush");
    let dlq = b
        .read("in.dlq", 0, 10, Duration::ZERO)
        .await
        .expect("read dlq");
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].message.id, "m1");
    assert!(
        b.fetch("p.s", 10, Duration::from_millis(500))
            .await
            .expect("fetch")
            .is_empty()
    );
    let mut stats = b.consumer_stats("p.s").await.expect("stats");
    for _ in 0..50 {
        if stats.in_flight == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        stats = b.consumer_stats("p.s").await.expect("stats");
    }
    assert_eq!((stats.pending, stats.in_flight), (0, 0), "{stats:?}");
    // Interest retention: once the only consumer answered both, they are gone.
    let topic = b.topic_stats("in").await.expect("topic stats");
    assert_eq!(topic.depth, 0, "{topic:?}");
}

async fn try_connect(url: &str) -> Result<std::sync::Arc<NatsBroker>, BrokerError> {
    NatsBroker::connect(
        NatsOptions::parse(url).expect("url"),
        Duration::from_secs(3),
    )
    .await
}

#[tokio::test]
async fn user_password_and_token_logins_work_and_a_wrong_one_says_why() {
    let server = FlagServer::start(&["--user", "alice", "--pass", "s3cret"]).expect("nats-server");
    let port = server.port();
    let b = try_connect(&format!("nats://alice:s3cret@127.0.0.1:{port}"))
        .await
        .expect("user and password");
    b.ensure_topic(&TopicSpec::new("secured"))
        .await
        .expect("JetStream works once logged in");
    let err = try_connect(&format!("nats://alice:wrong@127.0.0.1:{port}"))
        .await
        .err()
        .expect("a wrong password is refused");
    let text = err.to_string();
    assert!(
        text.contains("no connection within") && text.contains("last error"),
        "{text}"
    );
    assert!(!text.contains("wrong"), "the password leaked: {text}");

    // The CLI takes the login from the environment instead of the URL.
    let out = std::process::Command::new(sluice_tests::sluice_bin())
        .args(["publish", "secured", "--data", "hi", "--id", "env-login"])
        .args(["--broker", &format!("nats://127.0.0.1:{port}")])
        .env("SLUICE_NATS_USER", "alice")
        .env("SLUICE_NATS_PASSWORD", "s3cret")
        .env_remove("SLUICE_BROKER")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("sluice publish");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(server);

    let server = FlagServer::start(&["--auth", "t0ken"]).expect("nats-server");
    let b = try_connect(&format!("nats://t0ken@127.0.0.1:{}", server.port()))
        .await
        .expect("token");
    b.ensure_topic(&TopicSpec::new("tokened"))
        .await
        .expect("JetStream works with a token");
    assert!(
        try_connect(&format!("nats://nope@127.0.0.1:{}", server.port()))
            .await
            .is_err(),
        "a wrong token is refused"
    );
}

/// A message must leave `DEAD_LETTER_HEADROOM` free under the server's
/// max_payload, so that its dead letter (plus provenance headers, the
/// error capped at `ERROR_MAX`) always fits: one that does not is refused
/// before anything is sent, an outside producer's is refused by the
/// server (the stream's max_msg_size, which counts headers too), and the
/// largest one allowed can be dead-lettered with a long error.
#[tokio::test]
async fn a_message_near_max_payload_is_refused_so_its_dead_letter_always_fits() {
    use sluice::broker::nats::DEAD_LETTER_HEADROOM;
    use sluice::dlq::Provenance;
    let server = NatsServer::start().expect("nats-server");
    let b = stage_with_dlq(&server, &consumer("p.s", "in", Duration::from_secs(30))).await;
    let max = b.client().max_payload();
    // "NATS/1.0\r\n\r\n" + "Nats-Msg-Id: big\r\n": the headers of a plain message.
    let overhead = 12 + "Nats-Msg-Id: big\r\n".len();

    let near = Message::new("near", "in", vec![b'n'; max - DEAD_LETTER_HEADROOM / 2]);
    match b.publish(vec![near]).await {
        Err(BrokerError::PayloadTooLarge(why)) => {
            assert!(why.contains("dead letter"), "{why}");
            assert!(why.contains(&max.to_string()), "{why}");
        }
        other => panic!("a message inside the headroom must be refused: {other:?}"),
    }

    // An outside producer, publishing to the subject with a plain client.
    let outside = jetstream::new(b.client().clone());
    let limit = max - DEAD_LETTER_HEADROOM;
    let mut padded = async_nats::HeaderMap::new();
    padded.insert("padding", "p".repeat(200).as_str());
    for (what, headers, body) in [
        (
            "a body inside the headroom",
            None,
            max - DEAD_LETTER_HEADROOM / 2,
        ),
        (
            "a body that fits, with headers that do not",
            Some(padded),
            limit - 100,
        ),
    ] {
        let ack = match headers {
            Some(headers) => {
                outside
                    .publish_with_headers("in", headers, vec![b'o'; body].into())
                    .await
            }
            None => outside.publish("in", vec![b'o'; body].into()).await,
        }
        .expect("the server takes the publish");
        let err = ack.await.expect_err(what);
        assert!(err.to_string().contains("maximum"), "{what}: {err}");
    }
    assert_eq!(
        b.topic_stats("in").await.expect("stats").depth,
        0,
        "the stream took a message over its limit"
    );

    let largest = vec![b'b'; max - DEAD_LETTER_HEADROOM - overhead];
    b.publish(vec![Message::new("big", "in", largest.clone())])
        .await
        .expect("the largest allowed message");
    let got = b.fetch("p.s", 1, WAIT).await.expect("fetch");
    assert_eq!(got.len(), 1);
    let mut entry = got[0].message.clone();
    entry.topic = "in.dlq".into();
    Provenance {
        pipeline: "p".into(),
        stage: "s".into(),
        source_topic: "in".into(),
        source_seq: got[0].seq,
        original_id: "big".into(),
        attempts: 5,
        kind: "rejected".into(),
        error: "a long reason ".repeat(500),
        first_failure: 1,
        last_failure: 2,
    }
    .stamp(&mut entry);
    b.dead_letter(&got[0].receipt, entry)
        .await
        .expect("its dead letter fits");
    let dlq = b.read("in.dlq", 0, 1, WAIT).await.expect("read dlq");
    assert_eq!(dlq[0].message.payload.len(), largest.len());
}

/// Readiness follows the connection, at once: ready while connected, not
/// ready with the reason while the server is down, ready again after it
/// is back. Storage errors stay 0 (storage is the server's).
#[tokio::test]
async fn readiness_follows_the_connection() {
    let mut server = NatsServer::start().expect("nats-server");
    let b = connect(&server).await;
    assert_eq!(b.readiness(), Readiness::Ready);
    server.stop().expect("stop nats-server");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match b.readiness() {
            Readiness::NotReady(why) => {
                assert!(why.contains("NATS connection"), "{why}");
                break;
            }
            other => assert!(
                std::time::Instant::now() < deadline,
                "still {other:?} with the server down"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.restart().expect("restart nats-server");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while b.readiness() != Readiness::Ready {
        assert!(
            std::time::Instant::now() < deadline,
            "not ready after the server came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(b.storage_errors(), 0);
}
