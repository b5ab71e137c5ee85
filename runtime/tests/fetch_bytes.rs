//! `Broker::fetch_within` on both brokers: a fetch stops before the
//! message that would take its payloads past `max_bytes`, yet always takes
//! one message, however large, so that a stage's byte budget holds to
//! within one message and a message larger than the budget still runs.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::time::Duration;

use sluice::broker::embedded::{EmbeddedBroker, EmbeddedOptions};
use sluice::broker::nats::{NatsBroker, NatsOptions};
use sluice::broker::{Broker, ConsumerSpec, Message, TopicSpec};
use sluice_harness::nats::NatsServer;

const WAIT: Duration = Duration::from_secs(5);
const SIZE: usize = 100_000;

/// Publishes five messages of [`SIZE`] bytes to `in` and fetches them with
/// byte limits, through consumer `p.s`.
async fn fetches_stop_at_max_bytes_but_always_take_one(b: &dyn Broker) {
    b.ensure_topic(&TopicSpec {
        subscribed: true,
        ..TopicSpec::new("in")
    })
    .await
    .expect("topic");
    b.ensure_consumer(&ConsumerSpec {
        name: "p.s".into(),
        topic: "in".into(),
        filter: BTreeMap::new(),
        ack_wait: Duration::from_secs(60),
        max_ack_pending: None,
        max_deliver: None,
    })
    .await
    .expect("consumer");
    let messages = (0..5)
        .map(|i| Message::new(format!("m{i}"), "in", vec![b'x'; SIZE]))
        .collect();
    b.publish(messages).await.expect("publish");

    // Two fit in 2.5 messages' worth; the third would not.
    let two = b
        .fetch_within("p.s", 10, SIZE * 5 / 2, WAIT)
        .await
        .expect("fetch");
    // A limit below one message still gets one.
    let one = b.fetch_within("p.s", 10, 10, WAIT).await.expect("fetch");
    // No limit: the rest.
    let rest = b.fetch("p.s", 10, WAIT).await.expect("fetch");
    assert_eq!(
        (two.len(), one.len(), rest.len()),
        (2, 1, 2),
        "deliveries per fetch"
    );
    let ids: BTreeSet<String> = [two, one, rest]
        .iter()
        .flatten()
        .map(|d| d.message.id.clone())
        .collect();
    assert_eq!(ids.len(), 5, "every message delivered once: {ids:?}");
}

#[tokio::test]
async fn embedded() {
    let dir = tempfile::tempdir().expect("dir");
    let b = EmbeddedBroker::open(EmbeddedOptions::new(dir.path())).expect("open");
    fetches_stop_at_max_bytes_but_always_take_one(b.as_ref()).await;
}

#[tokio::test]
async fn nats() {
    let server = NatsServer::start().expect("nats-server");
    let b = NatsBroker::connect(
        NatsOptions::parse(&server.url()).expect("url"),
        Duration::from_secs(10),
    )
    .await
    .expect("connect");
    fetches_stop_at_max_bytes_but_always_take_one(b.as_ref()).await;
}
