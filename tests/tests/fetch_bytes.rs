//! `Broker::fetch_within` on both brokers: a fetch stops before the
//! message that would take its payloads past `max_bytes`, yet always takes
//! one message, however large, so that a stage's byte budget holds to
//! within one message and a message larger than the budget still runs;
//! redeliveries included.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::time::Duration;

use sluice::broker::embedded::{EmbeddedBroker, EmbeddedOptions};
use sluice::broker::nats::{NatsBroker, NatsOptions};
use sluice::broker::{Broker, ConsumerSpec, Delivery, Message, TopicSpec};
use sluice_harness::nats::NatsServer;

const WAIT: Duration = Duration::from_secs(5);
const SIZE: usize = 100_000;

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

    let first = fetch_two_one_rest(b, "new messages", true).await;
    assert!(first.iter().all(|d| d.attempt == 1), "first deliveries");
    // Redeliveries meet the same limit. (A NATS nak is asynchronous: not
    // all five may be back when the capped fetch asks, so fewer may come.)
    for delivery in &first {
        b.nak(&delivery.receipt, Duration::ZERO).await.expect("nak");
    }
    let again = fetch_two_one_rest(b, "redeliveries", false).await;
    assert!(
        again.iter().all(|d| d.attempt == 2),
        "every redelivery is a second attempt: {:?}",
        again.iter().map(|d| d.attempt).collect::<Vec<_>>()
    );
}

/// Fetches the five messages as two (within 2.5 messages' worth; with
/// `exact` false, one or two), one (a limit below one message still gets
/// one) and the rest (no limit), and checks each came once.
async fn fetch_two_one_rest(b: &dyn Broker, what: &str, exact: bool) -> Vec<Delivery> {
    let two = b
        .fetch_within("p.s", 10, SIZE * 5 / 2, WAIT)
        .await
        .expect("fetch");
    let one = b.fetch_within("p.s", 10, 10, WAIT).await.expect("fetch");
    let fits = if exact { 2..=2 } else { 1..=2 };
    assert!(
        fits.contains(&two.len()) && one.len() == 1,
        "{what}: {} and {} deliveries from the capped fetches",
        two.len(),
        one.len()
    );
    let mut all: Vec<Delivery> = two.into_iter().chain(one).collect();
    while all.len() < 5 {
        let more = b.fetch("p.s", 10, WAIT).await.expect("fetch");
        assert!(!more.is_empty(), "{what}: only {} came back", all.len());
        all.extend(more);
    }
    let ids: BTreeSet<&str> = all.iter().map(|d| d.message.id.as_str()).collect();
    assert_eq!(
        (all.len(), ids.len()),
        (5, 5),
        "{what}: every message once: {ids:?}"
    );
    all
}
