//! The embedded broker against its contract: real fjall stores in temporary
//! directories, real restarts, and real crashes (a child process killed with
//! SIGKILL, and a journal with a torn tail).
//!
//! Timeouts are generous and nothing asserts on timing, so a loaded machine
//! makes the tests slower, never flaky.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sluice::broker::embedded::{EmbeddedBroker, EmbeddedOptions, SyncMode};
use sluice::broker::{Broker, BrokerError, Completion, ConsumerSpec, Delivery, Message, TopicSpec};

/// Long enough that a lease never expires by accident on a loaded machine.
const LONG: Duration = Duration::from_secs(60);
/// How long a fetch may wait for something that must arrive.
const ARRIVE: Duration = Duration::from_secs(20);
/// How long a fetch waits for something that must NOT arrive.
const QUIET: Duration = Duration::from_millis(300);

fn open(dir: &Path, sync: SyncMode) -> Arc<EmbeddedBroker> {
    EmbeddedBroker::open(EmbeddedOptions::new(dir).sync(sync)).expect("open broker")
}

fn topic(name: &str) -> TopicSpec {
    TopicSpec::new(name)
}

fn consumer(name: &str, topic: &str, ack_wait: Duration) -> ConsumerSpec {
    ConsumerSpec {
        name: name.into(),
        topic: topic.into(),
        filter: BTreeMap::new(),
        ack_wait,
        max_ack_pending: None,
        max_deliver: None,
    }
}

fn msg(id: &str, topic: &str) -> Message {
    Message::new(id, topic, format!("payload {id}").into_bytes())
}

/// A broker in `dir` with topic `in` and consumer `p.s` on it.
async fn setup(dir: &Path, sync: SyncMode, ack_wait: Duration) -> Arc<EmbeddedBroker> {
    let b = open(dir, sync);
    b.ensure_topic(&topic("in")).await.expect("topic");
    b.ensure_consumer(&consumer("p.s", "in", ack_wait))
        .await
        .expect("consumer");
    b
}

async fn publish_ids(b: &EmbeddedBroker, topic: &str, ids: &[&str]) {
    let acks = b
        .publish(ids.iter().map(|id| msg(id, topic)).collect())
        .await
        .expect("publish");
    assert!(acks.iter().all(|a| !a.duplicate));
}

/// Fetches until `n` deliveries arrived.
async fn fetch_n(b: &EmbeddedBroker, consumer: &str, n: usize) -> Vec<Delivery> {
    let mut out = Vec::new();
    while out.len() < n {
        let got = b
            .fetch(consumer, n - out.len(), ARRIVE)
            .await
            .expect("fetch");
        assert!(
            !got.is_empty(),
            "{consumer}: expected {n}, got {}",
            out.len()
        );
        out.extend(got);
    }
    out
}

fn ids(ds: &[Delivery]) -> Vec<String> {
    ds.iter().map(|d| d.message.id.clone()).collect()
}

#[tokio::test]
async fn publish_fetch_ack_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Always, LONG).await;
    publish_ids(&b, "in", &["a", "b", "c"]).await;
    let ds = fetch_n(&b, "p.s", 3).await;
    assert_eq!(ids(&ds), ["a", "b", "c"]);
    assert_eq!(
        ds.iter().map(|d| d.seq).collect::<Vec<_>>(),
        [1, 2, 3],
        "seqs are 1-based and in publish order"
    );
    assert!(ds.iter().all(|d| d.attempt == 1));
    assert_eq!(ds[0].message.payload.as_ref(), b"payload a");
    assert!(ds[0].message.published_at > 0, "stamped on publish");
    let stats = b.consumer_stats("p.s").await.expect("stats");
    assert_eq!((stats.pending, stats.in_flight), (0, 3));
    for d in &ds {
        b.ack(&d.receipt).await.expect("ack");
    }
    assert!(b.fetch("p.s", 10, QUIET).await.expect("fetch").is_empty());
    let stats = b.consumer_stats("p.s").await.expect("stats");
    assert_eq!((stats.pending, stats.in_flight), (0, 0));
    // A second ack of the same receipt is stale.
    assert!(matches!(
        b.ack(&ds[0].receipt).await,
        Err(BrokerError::LeaseLost(_))
    ));
}

#[tokio::test]
async fn fetch_waits_for_a_publish() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Os, LONG).await;
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.fetch("p.s", 10, ARRIVE).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    publish_ids(&b, "in", &["late"]).await;
    let got = waiter.await.expect("join").expect("fetch");
    assert_eq!(ids(&got), ["late"]);
}

#[tokio::test]
async fn unknown_topic_and_consumer_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Os, LONG).await;
    assert_eq!(
        b.publish(vec![msg("x", "nope")]).await,
        Err(BrokerError::UnknownTopic("nope".into()))
    );
    assert!(matches!(
        b.fetch("nope.s", 1, QUIET).await,
        Err(BrokerError::UnknownConsumer(_))
    ));
    assert!(matches!(
        b.ensure_consumer(&consumer("p.x", "nope", LONG)).await,
        Err(BrokerError::UnknownTopic(_))
    ));
}

#[tokio::test]
async fn fan_out_consumers_are_independent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Os, LONG).await;
    b.ensure_consumer(&consumer("p.slow", "in", LONG))
        .await
        .expect("consumer");
    publish_ids(&b, "in", &["1", "2", "3", "4"]).await;
    // The slow consumer takes one and never answers it.
    let slow = fetch_n(&b, "p.slow", 1).await;
    assert_eq!(ids(&slow), ["1"]);
    // The fast one gets everything and acks it.
    let fast = fetch_n(&b, "p.s", 4).await;
    assert_eq!(ids(&fast), ["1", "2", "3", "4"]);
    for d in &fast {
        b.ack(&d.receipt).await.expect("ack");
    }
    publish_ids(&b, "in", &["5"]).await;
    assert_eq!(ids(&fetch_n(&b, "p.s", 1).await), ["5"]);
    // The slow one still has its own position.
    assert_eq!(ids(&fetch_n(&b, "p.slow", 2).await), ["2", "3"]);
    let stats = b.consumer_stats("p.slow").await.expect("stats");
    assert_eq!((stats.pending, stats.in_flight), (2, 3));
    assert!(stats.oldest_age.is_some());
}

#[tokio::test]
async fn filter_skips_non_matching_messages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Os, LONG).await;
    let mut spec = consumer("p.red", "in", LONG);
    spec.filter.insert("color".into(), "red".into());
    b.ensure_consumer(&spec).await.expect("consumer");
    let mut messages = Vec::new();
    for (id, color) in [("a", "red"), ("b", "blue"), ("c", "red"), ("d", "green")] {
        let mut m = msg(id, "in");
        m.headers.push(("color".into(), color.into()));
        messages.push(m);
    }
    b.publish(messages).await.expect("publish");
    assert_eq!(ids(&fetch_n(&b, "p.red", 2).await), ["a", "c"]);
    assert!(b.fetch("p.red", 10, QUIET).await.expect("fetch").is_empty());
    // The unfiltered consumer sees all four.
    assert_eq!(fetch_n(&b, "p.s", 4).await.len(), 4);
}

#[tokio::test]
async fn an_expired_lease_is_redelivered_with_the_next_attempt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Os, Duration::from_millis(200)).await;
    publish_ids(&b, "in", &["a"]).await;
    let first = fetch_n(&b, "p.s", 1).await;
    assert_eq!(first[0].attempt, 1);
    // Not acked: it comes back after ack_wait.
    let second = fetch_n(&b, "p.s", 1).await;
    assert_eq!(ids(&second), ["a"]);
    assert_eq!(second[0].attempt, 2);
    assert_eq!(second[0].seq, first[0].seq);
    // The first receipt is stale now; the second one works.
    assert!(matches!(
        b.ack(&first[0].receipt).await,
        Err(BrokerError::LeaseLost(_))
    ));
    b.ack(&second[0].receipt).await.expect("ack");
}

#[tokio::test]
async fn in_progress_keeps_the_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A lease of 2 s extended every 0.5 s: only a stall of 1.5 s between
    // two extensions (not a slow machine) could let it expire.
    let b = setup(dir.path(), SyncMode::Os, Duration::from_secs(2)).await;
    publish_ids(&b, "in", &["a"]).await;
    let d = fetch_n(&b, "p.s", 1).await.remove(0);
    // Keep extending for twice ack_wait; it is never redelivered.
    for _ in 0..8 {
        b.in_progress(&d.receipt).await.expect("in_progress");
        assert!(
            b.fetch("p.s", 1, Duration::from_millis(500))
                .await
                .expect("fetch")
                .is_empty()
        );
    }
    b.ack(&d.receipt).await.expect("ack after extending");
}

#[tokio::test]
async fn nak_redelivers_after_the_delay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Always, LONG).await;
    publish_ids(&b, "in", &["a", "b"]).await;
    let ds = fetch_n(&b, "p.s", 2).await;
    b.nak(&ds[0].receipt, Duration::from_secs(3600))
        .await
        .expect("nak");
    b.nak(&ds[1].receipt, Duration::from_millis(300))
        .await
        .expect("nak");
    // A nak answers the receipt.
    assert!(matches!(
        b.ack(&ds[1].receipt).await,
        Err(BrokerError::LeaseLost(_))
    ));
    let again = fetch_n(&b, "p.s", 1).await;
    assert_eq!(ids(&again), ["b"]);
    assert_eq!(again[0].attempt, 2);
    assert!(b.fetch("p.s", 10, QUIET).await.expect("fetch").is_empty());
    let stats = b.consumer_stats("p.s").await.expect("stats");
    assert_eq!((stats.pending, stats.in_flight), (1, 1));
}

#[tokio::test]
async fn a_stale_receipt_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Always, Duration::from_millis(200)).await;
    b.ensure_topic(&topic("out")).await.expect("topic");
    publish_ids(&b, "in", &["a"]).await;
    let stale = fetch_n(&b, "p.s", 1).await.remove(0);
    let fresh = fetch_n(&b, "p.s", 1).await.remove(0);
    assert_eq!(fresh.attempt, 2);
    let out = vec![msg("a-out", "out")];
    for result in [
        b.complete(&Completion::new(&stale.receipt, out.clone()))
            .await,
        b.dead_letter(&stale.receipt, msg("a-dlq", "out")).await,
        b.nak(&stale.receipt, Duration::ZERO).await,
        b.in_progress(&stale.receipt).await,
        b.term(&stale.receipt).await,
    ] {
        assert!(
            matches!(result, Err(BrokerError::LeaseLost(_))),
            "{result:?}"
        );
    }
    assert_eq!(b.topic_stats("out").await.expect("stats").depth, 0);
    b.complete(&Completion::new(&fresh.receipt, out))
        .await
        .expect("complete");
    assert_eq!(b.topic_stats("out").await.expect("stats").depth, 1);
}

#[tokio::test]
async fn complete_publishes_outputs_and_acks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Always, LONG).await;
    b.ensure_topic(&topic("out")).await.expect("topic");
    b.ensure_consumer(&consumer("p.next", "out", LONG))
        .await
        .expect("consumer");
    publish_ids(&b, "in", &["a"]).await;
    let d = fetch_n(&b, "p.s", 1).await.remove(0);
    // An output to an undeclared topic fails and leaves the lease intact.
    assert!(matches!(
        b.complete(&Completion::new(&d.receipt, vec![msg("x", "nowhere")]))
            .await,
        Err(BrokerError::UnknownTopic(_))
    ));
    b.complete(&Completion::new(
        &d.receipt,
        vec![msg("a1", "out"), msg("a2", "out")],
    ))
    .await
    .expect("complete");
    assert_eq!(ids(&fetch_n(&b, "p.next", 2).await), ["a1", "a2"]);
    assert!(b.fetch("p.s", 1, QUIET).await.expect("fetch").is_empty());
}

#[tokio::test]
async fn complete_all_completes_each_item_with_its_own_result() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Always, Duration::from_millis(300)).await;
    b.ensure_topic(&topic("out")).await.expect("topic");
    b.ensure_consumer(&consumer("p.next", "out", LONG))
        .await
        .expect("consumer");
    publish_ids(&b, "in", &["a", "b", "c", "d"]).await;
    let ds = fetch_n(&b, "p.s", 4).await;
    // `c` was already acked: its lease is gone. `b` names an undeclared
    // topic. Both fail alone; `a` and `d` are written and acked.
    b.ack(&ds[2].receipt).await.expect("ack");
    let results = b
        .complete_all(&[
            Completion::new(&ds[0].receipt, vec![msg("a-out", "out")]),
            Completion::new(&ds[1].receipt, vec![msg("b-out", "nowhere")]),
            Completion::new(&ds[2].receipt, vec![msg("c-out", "out")]),
            Completion::new(&ds[3].receipt, vec![msg("d1", "out"), msg("d2", "out")]),
        ])
        .await;
    assert_eq!(results.len(), 4);
    assert!(results[0].is_ok() && results[3].is_ok(), "{results:?}");
    assert!(matches!(results[1], Err(BrokerError::UnknownTopic(_))));
    assert!(matches!(results[2], Err(BrokerError::LeaseLost(_))));
    assert_eq!(ids(&fetch_n(&b, "p.next", 3).await), ["a-out", "d1", "d2"]);
    // `b` keeps its lease (an ack still works) and nothing else comes back,
    // even after ack_wait.
    b.ack(&ds[1].receipt).await.expect("b's lease is intact");
    assert!(
        b.fetch("p.s", 4, Duration::from_millis(600))
            .await
            .expect("fetch")
            .is_empty()
    );
    let stats = b.consumer_stats("p.s").await.expect("stats");
    assert_eq!((stats.pending, stats.in_flight), (0, 0));
    // A second completion of the same receipts changes nothing.
    let again = b
        .complete_all(&[Completion::new(&ds[0].receipt, vec![msg("a-out", "out")])])
        .await;
    assert!(matches!(again[0], Err(BrokerError::LeaseLost(_))));
    assert!(b.complete_all(&[]).await.is_empty());
}

#[tokio::test]
async fn dead_letter_publishes_the_entry_and_answers_the_receipt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Always, Duration::from_millis(200)).await;
    b.ensure_topic(&topic("p.s.dlq")).await.expect("topic");
    publish_ids(&b, "in", &["a"]).await;
    let d = fetch_n(&b, "p.s", 1).await.remove(0);
    b.dead_letter(&d.receipt, msg("a", "p.s.dlq"))
        .await
        .expect("dead_letter");
    // Never redelivered, even after ack_wait.
    assert!(
        b.fetch("p.s", 1, Duration::from_millis(500))
            .await
            .expect("fetch")
            .is_empty()
    );
    let dlq = b.read("p.s.dlq", 1, 10, QUIET).await.expect("read");
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].message.id, "a");
    assert_eq!(dlq[0].message.topic, "p.s.dlq");
}

#[tokio::test]
async fn the_duplicate_window_drops_a_republish() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = open(dir.path(), SyncMode::Os);
    b.ensure_topic(&topic("in")).await.expect("topic");
    b.ensure_topic(&topic("other")).await.expect("topic");
    let first = b
        .publish(vec![msg("a", "in"), msg("b", "in")])
        .await
        .expect("publish");
    let again = b
        .publish(vec![
            msg("b", "in"),
            msg("c", "in"),
            msg("c", "in"),
            msg("b", "other"),
        ])
        .await
        .expect("publish");
    assert!(!first[1].duplicate);
    assert_eq!((again[0].seq, again[0].duplicate), (first[1].seq, true));
    assert_eq!((again[1].seq, again[1].duplicate), (3, false));
    assert_eq!(
        (again[2].seq, again[2].duplicate),
        (3, true),
        "within one call"
    );
    assert!(!again[3].duplicate, "the window is per topic");
    assert_eq!(b.topic_stats("in").await.expect("stats").depth, 3);
    drop(b);

    // The window survives a restart, and a short window expires.
    let b = EmbeddedBroker::open(
        EmbeddedOptions::new(dir.path())
            .sync(SyncMode::Os)
            .dedup_window(Duration::from_millis(300)),
    )
    .expect("reopen");
    assert!(b.publish(vec![msg("a", "in")]).await.expect("publish")[0].duplicate);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let late = b.publish(vec![msg("a", "in")]).await.expect("publish");
    assert_eq!((late[0].seq, late[0].duplicate), (4, false));
}

#[tokio::test]
async fn a_consumer_starts_at_the_oldest_stored_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = open(dir.path(), SyncMode::Os);
    b.ensure_topic(&topic("in")).await.expect("topic");
    publish_ids(&b, "in", &["a", "b"]).await;
    b.ensure_consumer(&consumer("p.late", "in", LONG))
        .await
        .expect("consumer");
    assert_eq!(ids(&fetch_n(&b, "p.late", 2).await), ["a", "b"]);
    // Ensuring again (updated ack_wait) keeps its position.
    b.ensure_consumer(&consumer("p.late", "in", Duration::from_secs(5)))
        .await
        .expect("update");
    assert!(
        b.fetch("p.late", 10, QUIET)
            .await
            .expect("fetch")
            .is_empty()
    );
}

#[tokio::test]
async fn max_ack_pending_limits_deliveries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = open(dir.path(), SyncMode::Os);
    b.ensure_topic(&topic("in")).await.expect("topic");
    let mut spec = consumer("p.s", "in", LONG);
    spec.max_ack_pending = Some(2);
    b.ensure_consumer(&spec).await.expect("consumer");
    publish_ids(&b, "in", &["a", "b", "c"]).await;
    let ds = b.fetch("p.s", 10, ARRIVE).await.expect("fetch");
    assert_eq!(ids(&ds), ["a", "b"]);
    assert!(b.fetch("p.s", 10, QUIET).await.expect("fetch").is_empty());
    // A waiting fetch is woken when a lease is answered.
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.fetch("p.s", 10, ARRIVE).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    b.ack(&ds[0].receipt).await.expect("ack");
    assert_eq!(ids(&waiter.await.expect("join").expect("fetch")), ["c"]);
}

#[tokio::test]
async fn acked_messages_are_removed_once_every_consumer_completed_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Os, LONG).await;
    b.ensure_consumer(&consumer("p.t", "in", LONG))
        .await
        .expect("consumer");
    publish_ids(&b, "in", &["a", "b", "c"]).await;
    for d in fetch_n(&b, "p.s", 3).await {
        b.ack(&d.receipt).await.expect("ack");
    }
    // p.t has not read anything: all three stay.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(b.topic_stats("in").await.expect("stats").depth, 3);
    let ds = fetch_n(&b, "p.t", 3).await;
    b.ack(&ds[0].receipt).await.expect("ack");
    b.term(&ds[2].receipt).await.expect("term");
    // "b" is still pending for p.t: only "a" can go.
    wait_for_depth(&b, "in", 2).await;
    let stats = b.topic_stats("in").await.expect("stats");
    assert_eq!((stats.first_seq, stats.last_seq), (2, 3));
    b.ack(&ds[1].receipt).await.expect("ack");
    wait_for_depth(&b, "in", 0).await;
    let stats = b.topic_stats("in").await.expect("stats");
    assert_eq!(
        (stats.first_seq, stats.last_seq, stats.oldest_age),
        (0, 3, None)
    );
}

/// Polls until `topic` holds `depth` messages (maintenance runs in the
/// background).
async fn wait_for_depth(b: &EmbeddedBroker, topic: &str, depth: u64) {
    for _ in 0..400 {
        if b.topic_stats(topic).await.expect("stats").depth == depth {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{topic}: depth stayed {:?}, expected {depth}",
        b.topic_stats(topic).await
    );
}

#[tokio::test]
async fn age_retention_removes_old_messages_and_their_leases() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = open(dir.path(), SyncMode::Os);
    b.ensure_topic(&TopicSpec {
        retention: Some(Duration::from_millis(500)),
        ..TopicSpec::new("in")
    })
    .await
    .expect("topic");
    b.ensure_consumer(&consumer("p.s", "in", LONG))
        .await
        .expect("consumer");
    let mut old = msg("old", "in");
    old.published_at = sluice::broker::now_millis() - 10_000;
    b.publish(vec![old, msg("new", "in")])
        .await
        .expect("publish");
    let ds = fetch_n(&b, "p.s", 2).await;
    wait_for_depth(&b, "in", 1).await;
    // The lease on the removed message is gone with it.
    assert!(matches!(
        b.ack(&ds[0].receipt).await,
        Err(BrokerError::LeaseLost(_))
    ));
    wait_for_depth(&b, "in", 0).await;
    assert_eq!(b.consumer_stats("p.s").await.expect("stats").in_flight, 0);
}

#[tokio::test]
async fn a_topic_without_consumers_keeps_its_messages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = open(dir.path(), SyncMode::Os);
    b.ensure_topic(&topic("p.s.dlq")).await.expect("topic");
    publish_ids(&b, "p.s.dlq", &["a", "b", "c"]).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let stats = b.topic_stats("p.s.dlq").await.expect("stats");
    assert_eq!((stats.depth, stats.first_seq, stats.last_seq), (3, 1, 3));
    assert!(stats.oldest_age.is_some());
    // Browsing does not consume.
    let all = b.read("p.s.dlq", 0, 10, QUIET).await.expect("read");
    assert_eq!(all.len(), 3);
    assert_eq!(
        b.read("p.s.dlq", 3, 10, QUIET).await.expect("read").len(),
        1
    );
    // remove() is how it shrinks.
    assert_eq!(b.remove("p.s.dlq", &[1, 3, 9]).await.expect("remove"), 2);
    assert_eq!(b.remove("p.s.dlq", &[1]).await.expect("remove"), 0);
    let stats = b.topic_stats("p.s.dlq").await.expect("stats");
    assert_eq!((stats.depth, stats.first_seq, stats.last_seq), (1, 2, 3));
    let left = b.read("p.s.dlq", 0, 10, QUIET).await.expect("read");
    assert_eq!(left.iter().map(|s| s.seq).collect::<Vec<_>>(), [2]);
}

#[tokio::test]
async fn read_waits_for_a_publish() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = open(dir.path(), SyncMode::Os);
    b.ensure_topic(&topic("t")).await.expect("topic");
    let reader = {
        let b = b.clone();
        tokio::spawn(async move { b.read("t", 1, 10, ARRIVE).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    publish_ids(&b, "t", &["x"]).await;
    let got = reader.await.expect("join").expect("read");
    assert_eq!(got.len(), 1);
}

#[tokio::test]
async fn reopen_keeps_messages_cursors_and_delivery_counts() {
    for sync in [SyncMode::Always, SyncMode::Os] {
        let dir = tempfile::tempdir().expect("tempdir");
        let b = setup(dir.path(), sync, LONG).await;
        b.ensure_topic(&topic("p.s.dlq")).await.expect("topic");
        publish_ids(&b, "in", &["a", "b", "c", "d"]).await;
        publish_ids(&b, "p.s.dlq", &["x"]).await;
        let ds = fetch_n(&b, "p.s", 3).await;
        b.ack(&ds[0].receipt).await.expect("ack");
        b.nak(&ds[2].receipt, Duration::from_secs(3600))
            .await
            .expect("nak");
        // ds[1] ("b") stays leased when the process goes away.
        drop(b);

        let b = open(dir.path(), sync);
        // The old lease is gone: "b" comes back at once with attempt 2,
        // then "d" (never delivered); "c" keeps its nak delay.
        let again = fetch_n(&b, "p.s", 2).await;
        assert_eq!(ids(&again), ["b", "d"], "{sync:?}");
        assert_eq!(again[0].attempt, 2);
        assert_eq!(again[1].attempt, 1);
        assert!(matches!(
            b.ack(&ds[1].receipt).await,
            Err(BrokerError::LeaseLost(_))
        ));
        assert!(b.fetch("p.s", 10, QUIET).await.expect("fetch").is_empty());
        let stats = b.consumer_stats("p.s").await.expect("stats");
        assert_eq!((stats.pending, stats.in_flight), (1, 2));
        assert_eq!(b.topic_stats("p.s.dlq").await.expect("stats").depth, 1);
        let ts = b.topic_stats("in").await.expect("stats");
        assert_eq!(ts.last_seq, 4);
        // Seqs continue after a restart.
        let acks = b.publish(vec![msg("e", "in")]).await.expect("publish");
        assert_eq!(acks[0].seq, 5);
    }
}

/// A redelivered message (it has a pending record) completed while an
/// earlier first delivery still holds the consumer's floor below it stays
/// completed across a restart: its ack must not be undone by the removal of
/// its record. (It came back before, and only the duplicate window kept
/// its outputs from being published twice.)
#[tokio::test]
async fn a_redelivery_completed_above_the_floor_stays_completed_after_a_restart() {
    for sync in [SyncMode::Always, SyncMode::Os] {
        let dir = tempfile::tempdir().expect("tempdir");
        let b = setup(dir.path(), sync, LONG).await;
        publish_ids(&b, "in", &["a", "b"]).await;
        let first = fetch_n(&b, "p.s", 2).await;
        // "b" is redelivered (so it gets a pending record) and completed;
        // "a", a first delivery, stays out and holds the floor.
        b.nak(&first[1].receipt, Duration::ZERO).await.expect("nak");
        let again = fetch_n(&b, "p.s", 1).await;
        assert_eq!((ids(&again), again[0].attempt), (vec!["b".to_owned()], 2));
        b.ack(&again[0].receipt).await.expect("ack");
        drop(b);

        let b = open(dir.path(), sync);
        let after = fetch_n(&b, "p.s", 1).await;
        assert_eq!(ids(&after), ["a"], "{sync:?}");
        let more = b.fetch("p.s", 10, QUIET).await.expect("fetch");
        assert!(
            more.is_empty(),
            "{sync:?}: a completed message came back: {:?}",
            ids(&more)
        );
    }
}

/// A paused consumer delivers nothing, lets a lease already out be answered,
/// and stays paused across a reopen and a new `ensure_consumer` (what a
/// restart does); a resume wakes a fetch that is waiting.
#[tokio::test]
async fn a_pause_holds_deliveries_survives_a_reopen_and_a_resume_wakes_a_fetch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Always, LONG).await;
    publish_ids(&b, "in", &["a"]).await;
    let held = fetch_n(&b, "p.s", 1).await;
    b.set_paused("p.s", true).await.expect("pause");
    publish_ids(&b, "in", &["b", "c"]).await;
    assert!(b.fetch("p.s", 10, QUIET).await.expect("fetch").is_empty());
    b.ack(&held[0].receipt)
        .await
        .expect("a lease out is answered");
    let stats = b.consumer_stats("p.s").await.expect("stats");
    assert!(stats.paused);
    assert_eq!((stats.pending, stats.in_flight), (2, 0));
    assert!(matches!(
        b.set_paused("nope", true).await,
        Err(BrokerError::UnknownConsumer(_))
    ));
    drop(b);

    let b = open(dir.path(), SyncMode::Always);
    b.ensure_consumer(&consumer("p.s", "in", Duration::from_secs(30)))
        .await
        .expect("a restart with new settings");
    assert!(b.consumer_stats("p.s").await.expect("stats").paused);
    assert!(b.fetch("p.s", 10, QUIET).await.expect("fetch").is_empty());
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move { b.fetch("p.s", 10, ARRIVE).await })
    };
    tokio::time::sleep(QUIET).await;
    b.set_paused("p.s", false).await.expect("resume");
    let got = waiting.await.expect("task").expect("fetch");
    assert_eq!(ids(&got), ["b", "c"]);
    assert!(!b.consumer_stats("p.s").await.expect("stats").paused);
}

/// A message with `sluice-delay` or `sluice-deliver-at` waits in the
/// store, counted on its topic, is never delivered early, survives a
/// reopen, and enters the topic without its delay header; a delay that
/// does not parse refuses the whole publish.
#[tokio::test]
async fn delayed_messages_wait_for_their_time_survive_a_reopen_and_lose_their_delay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Always, LONG).await;
    let start = sluice::broker::now_millis();
    let with = |id: &str, name: &str, value: String| {
        let mut m = msg(id, "in");
        m.headers = vec![("keep".into(), "1".into()), (name.into(), value)];
        m
    };
    let at = sluice::timestamp::format_rfc3339_millis(start + 3_000);
    let acks = b
        .publish(vec![
            msg("now", "in"),
            with("soon", "Sluice-Delay", "1500ms".into()),
            with("later", "sluice-deliver-at", at),
            with("past", "sluice-deliver-at", "2020-01-01T00:00:00Z".into()),
        ])
        .await
        .expect("publish");
    assert_eq!(
        acks.iter().map(|a| a.seq).collect::<Vec<_>>(),
        [1, 0, 0, 2],
        "a delayed message has no seq until it is due"
    );
    let refused = b
        .publish(vec![
            msg("fine", "in"),
            with("bad", "sluice-delay", "soonish".into()),
        ])
        .await;
    assert!(
        matches!(&refused, Err(BrokerError::BadMessage(why)) if why.contains("soonish")),
        "{refused:?}"
    );
    let stats = b.topic_stats("in").await.expect("stats");
    assert_eq!((stats.depth, stats.delayed), (2, 2));
    let next = stats.next_due.expect("next due");
    assert!((start + 1_500..start + 2_500).contains(&next), "{next}");
    // The backlog a high-water mark counts includes what is delayed.
    assert_eq!(
        sluice::broker::backlog(b.as_ref(), "in", &["p.s".into()])
            .await
            .expect("backlog"),
        4
    );
    let first = fetch_n(&b, "p.s", 2).await;
    assert_eq!(ids(&first), ["now", "past"]);
    assert_eq!(first[1].message.headers, [("keep".into(), "1".into())]);
    for d in &first {
        b.ack(&d.receipt).await.expect("ack");
    }
    drop(first);
    drop(b);

    let b = open(dir.path(), SyncMode::Always);
    let stats = b.topic_stats("in").await.expect("stats");
    assert_eq!(stats.delayed, 2, "the delayed messages survive a reopen");
    assert_eq!(stats.next_due, Some(next));
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let got = b.fetch("p.s", 10, ARRIVE).await.expect("fetch");
        let now = sluice::broker::now_millis();
        assert!(!got.is_empty(), "the delayed messages arrive");
        for d in got {
            let due = if d.message.id == "soon" {
                start + 1_500
            } else {
                start + 3_000
            };
            assert!(
                now >= due,
                "{} delivered {} ms early",
                d.message.id,
                due - now
            );
            assert!(d.message.published_at >= due, "published when released");
            assert_eq!(
                d.message.headers,
                [("keep".into(), "1".into())],
                "the delay header is removed"
            );
            b.ack(&d.receipt).await.expect("ack");
            seen.push(d.message.id);
        }
    }
    assert_eq!(seen, ["soon", "later"]);
    let stats = b.topic_stats("in").await.expect("stats");
    assert_eq!((stats.delayed, stats.next_due), (0, None));
    // The id is in the duplicate window from its publish on.
    let again = b
        .publish(vec![with("soon", "sluice-delay", "1s".into())])
        .await
        .expect("republish");
    assert!(again[0].duplicate);
}

/// Thousands falling due at once are moved in several steps (2,048 per
/// write), each exactly once, in due order, while later ones keep waiting.
#[tokio::test]
async fn many_falling_due_at_once_are_released_in_steps_each_once_in_due_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Os, LONG).await;
    let start = sluice::broker::now_millis();
    let n = 5_000;
    let at = |i: usize| start + 1_000 + (i % 50) as u64;
    let mut messages: Vec<Message> = (0..n)
        .map(|i| {
            let mut m = msg(&format!("m{i}"), "in");
            m.headers = vec![(
                "sluice-deliver-at".into(),
                sluice::timestamp::format_rfc3339_millis(at(i)),
            )];
            m
        })
        .collect();
    let mut late = msg("late", "in");
    late.headers = vec![("sluice-delay".into(), "1h".into())];
    messages.push(late);
    for chunk in messages.chunks(1000) {
        b.publish(chunk.to_vec()).await.expect("publish");
    }
    assert_eq!(
        b.topic_stats("in").await.expect("stats").delayed,
        n as u64 + 1
    );
    let got = fetch_n(&b, "p.s", n).await;
    let now = sluice::broker::now_millis();
    assert!(now >= start + 1_000, "released early");
    let mut seen = std::collections::HashSet::new();
    let mut last_due = 0;
    for d in &got {
        let i: usize = d.message.id[1..].parse().expect("an m<i> id");
        assert!(seen.insert(i), "m{i} delivered twice");
        assert!(at(i) >= last_due, "out of due order at m{i}");
        last_due = at(i);
    }
    assert_eq!(seen.len(), n);
    assert!(b.fetch("p.s", 10, QUIET).await.expect("fetch").is_empty());
    let stats = b.topic_stats("in").await.expect("stats");
    assert_eq!(stats.delayed, 1, "the hour-long one still waits");
    assert!(stats.next_due.is_some_and(|due| due >= start + 3_600_000));
}

#[tokio::test]
async fn a_second_open_of_the_same_directory_fails_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _b = open(dir.path(), SyncMode::Os);
    let err = EmbeddedBroker::open(EmbeddedOptions::new(dir.path()))
        .err()
        .expect("second open must fail");
    let text = err.to_string();
    assert!(
        text.contains(&dir.path().display().to_string()),
        "names the dir: {text}"
    );
}

// ---------------------------------------------------------------------------
// Crashes. The test binary re-executes itself as the child: with
// `CHILD_ENV` set, the named test runs `crash_child` instead of its body.

/// Set in the child: `<data dir>|<always|os>`.
const CHILD_ENV: &str = "SLUICE_EMBEDDED_CRASH_CHILD";

fn mode_name(sync: SyncMode) -> &'static str {
    match sync {
        SyncMode::Always => "always",
        SyncMode::Os => "os",
    }
}

/// The child: publishes batches to `in` and completes deliveries of `p.s`
/// with one output each to `out`, printing `P <id>` after each publish
/// returned, `D <id> <attempt>` for each delivery it got, and `C <id>` after
/// each complete returned, until killed.
fn crash_child(spec: &str) {
    use std::io::Write;
    let (dir, mode) = spec.split_once('|').expect("dir|mode");
    let sync = if mode == "always" {
        SyncMode::Always
    } else {
        SyncMode::Os
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let b = setup(Path::new(dir), sync, LONG).await;
        b.ensure_topic(&topic("out")).await.expect("topic");
        let publisher = {
            let b = b.clone();
            async move {
                for i in 0u64.. {
                    let batch: Vec<Message> =
                        (0..20).map(|j| msg(&format!("m{i}-{j}"), "in")).collect();
                    let acks = b.publish(batch.clone()).await.expect("publish");
                    assert!(acks.iter().all(|a| !a.duplicate));
                    let mut out = std::io::stdout().lock();
                    for m in &batch {
                        writeln!(out, "P {}", m.id).expect("stdout");
                    }
                    out.flush().expect("flush");
                }
            }
        };
        let worker = async move {
            loop {
                let ds = b
                    .fetch("p.s", 50, Duration::from_millis(100))
                    .await
                    .expect("fetch");
                {
                    let mut out = std::io::stdout().lock();
                    for d in &ds {
                        writeln!(out, "D {} {}", d.message.id, d.attempt).expect("stdout");
                    }
                    out.flush().expect("flush");
                }
                for d in ds {
                    let output = msg(&format!("o-{}", d.message.id), "out");
                    b.complete(&Completion::new(&d.receipt, vec![output]))
                        .await
                        .expect("complete");
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "C {}", d.message.id).expect("stdout");
                    out.flush().expect("flush");
                }
            }
        };
        tokio::join!(publisher, worker);
    });
}

/// What the child printed before it was killed.
#[derive(Default)]
struct ChildLog {
    published: Vec<String>,
    completed: Vec<String>,
    /// The highest attempt each id was delivered with.
    delivered: std::collections::HashMap<String, u32>,
}

/// Runs the test `name` as a crash child on `dir`, SIGKILLs it once it has
/// published and completed enough, and returns what it printed.
fn run_and_kill_child(name: &str, dir: &Path, sync: SyncMode) -> ChildLog {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{}|{}", dir.display(), mode_name(sync)))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = ChildLog::default();
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    let record = |line: String, log: &mut ChildLog| {
        if let Some(id) = line.strip_prefix("P ") {
            log.published.push(id.to_owned());
        } else if let Some(id) = line.strip_prefix("C ") {
            log.completed.push(id.to_owned());
        } else if let Some((id, attempt)) = line
            .strip_prefix("D ")
            .and_then(|rest| rest.split_once(' '))
        {
            let attempt: u32 = attempt.parse().expect("attempt");
            let max = log.delivered.entry(id.to_owned()).or_default();
            *max = (*max).max(attempt);
        }
    };
    while log.published.len() < 3000 || log.completed.len() < 300 {
        assert!(
            std::time::Instant::now() < give_up,
            "child made too little progress: {} published, {} completed",
            log.published.len(),
            log.completed.len()
        );
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => record(line, &mut log),
            Err(e) => panic!("child stopped printing: {e}"),
        }
    }
    child.kill().expect("SIGKILL the child");
    let status = child.wait().expect("wait");
    assert!(!status.success(), "the child was killed, not finished");
    // Everything it printed before dying is still in the pipe.
    for line in rx {
        record(line, &mut log);
    }
    reader.join().expect("reader");
    log
}

/// Checks a store after a crash: every acknowledged publish is there (as
/// the message, or as its output if it was completed), every returned
/// complete left its output, no output exists twice, no message is both
/// completed (output stored) and still deliverable, and a redelivery's
/// attempt is above every attempt the dead process was handed.
async fn check_after_crash(dir: &Path, sync: SyncMode, log: &ChildLog) {
    use std::collections::{HashMap, HashSet};
    let b = open(dir, sync);
    let stored_in: HashSet<String> = b
        .read("in", 0, 10_000_000, Duration::ZERO)
        .await
        .expect("read in")
        .into_iter()
        .map(|s| s.message.id)
        .collect();
    let mut outputs: HashMap<String, usize> = HashMap::new();
    for s in b
        .read("out", 0, 10_000_000, Duration::ZERO)
        .await
        .expect("read out")
    {
        *outputs.entry(s.message.id).or_default() += 1;
    }
    assert!(
        outputs.values().all(|n| *n == 1),
        "an output was stored twice"
    );
    for id in &log.published {
        assert!(
            stored_in.contains(id) || outputs.contains_key(&format!("o-{id}")),
            "{sync:?}: acknowledged publish {id} was lost"
        );
    }
    for id in &log.completed {
        assert!(
            outputs.contains_key(&format!("o-{id}")),
            "{sync:?}: output of completed {id} was lost"
        );
    }
    // Atomicity: whatever is still deliverable has no output yet.
    loop {
        let ds = b.fetch("p.s", 1000, Duration::ZERO).await.expect("fetch");
        if ds.is_empty() {
            break;
        }
        for d in &ds {
            // A delivery the dead process saw counts: the attempt moves on.
            if let Some(seen) = log.delivered.get(&d.message.id) {
                assert!(
                    d.attempt > *seen,
                    "{sync:?}: {} redelivered with attempt {} after attempt {seen}",
                    d.message.id,
                    d.attempt
                );
            }
            assert!(
                !outputs.contains_key(&format!("o-{}", d.message.id)),
                "{sync:?}: {} has its output stored but was not acked",
                d.message.id
            );
            b.ack(&d.receipt).await.expect("ack");
        }
    }
}

fn crash_test(name: &str, sync: SyncMode) {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        crash_child(&spec);
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let log = run_and_kill_child(name, dir.path(), sync);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(check_after_crash(dir.path(), sync, &log));
}

#[test]
fn kill_9_loses_no_acknowledged_write_sync_always() {
    crash_test(
        "kill_9_loses_no_acknowledged_write_sync_always",
        SyncMode::Always,
    );
}

#[test]
fn kill_9_loses_no_acknowledged_write_sync_os() {
    crash_test("kill_9_loses_no_acknowledged_write_sync_os", SyncMode::Os);
}

/// The newest journal file of a store.
fn newest_journal(dir: &Path) -> std::path::PathBuf {
    let store = dir.join("store");
    std::fs::read_dir(&store)
        .expect("read store dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jnl"))
        .max_by_key(|p| {
            p.file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .unwrap_or_else(|| panic!("no journal in {}", store.display()))
}

/// After a crash, the journal's tail is damaged in one of two ways; open
/// must recover every acknowledged write and stay usable.
fn torn_tail_test(name: &str, sync: SyncMode) {
    use std::io::Write;
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        crash_child(&spec);
        return;
    }
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for damage in ["garbage", "truncated"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = run_and_kill_child(name, dir.path(), sync);
        let journal = newest_journal(dir.path());
        match damage {
            "garbage" => {
                // Bytes that are not a batch at all.
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&journal)
                    .expect("open journal");
                let junk: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
                f.write_all(&junk).expect("append garbage");
            }
            _ => {
                // A batch cut in the middle: write one more (unacknowledged)
                // batch, then chop the journal inside it.
                let before = {
                    let b = open(dir.path(), sync);
                    let journal = newest_journal(dir.path());
                    let before = std::fs::metadata(&journal).expect("stat").len();
                    rt.block_on(async {
                        let torn: Vec<Message> =
                            (0..50).map(|j| msg(&format!("torn-{j}"), "in")).collect();
                        b.publish(torn).await.expect("publish");
                    });
                    (journal, before)
                };
                let (journal, before) = before;
                let after = std::fs::metadata(&journal).expect("stat").len();
                assert!(after > before, "the extra batch reached the journal");
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&journal)
                    .expect("open journal");
                f.set_len(before + (after - before) / 2).expect("truncate");
            }
        }
        rt.block_on(async {
            check_after_crash(dir.path(), sync, &log).await;
            // Still usable: publish, and the seq moves on.
            let b = open(dir.path(), sync);
            let last = b.topic_stats("in").await.expect("stats").last_seq;
            let acks = b
                .publish(vec![msg("after-recovery", "in")])
                .await
                .expect("publish after recovery");
            assert_eq!(acks[0].seq, last + 1, "{damage}");
        });
    }
}

#[test]
fn torn_journal_tail_is_recovered_sync_always() {
    torn_tail_test(
        "torn_journal_tail_is_recovered_sync_always",
        SyncMode::Always,
    );
}

#[test]
fn torn_journal_tail_is_recovered_sync_os() {
    torn_tail_test("torn_journal_tail_is_recovered_sync_os", SyncMode::Os);
}

/// Many workers on two consumers of one topic, answering at random: ack,
/// complete, nak, term, or let the lease expire. Every message is finished
/// by each consumer, nothing is finished twice, attempts only grow, and at
/// the end both consumers are empty and retention has emptied the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_workers_answer_everything_once() {
    use std::collections::HashMap;
    use std::sync::Mutex;
    const N: usize = 3000;
    let dir = tempfile::tempdir().expect("tempdir");
    let b = setup(dir.path(), SyncMode::Always, Duration::from_millis(300)).await;
    b.ensure_topic(&topic("out")).await.expect("topic");
    let mut spec = consumer("p.t", "in", Duration::from_millis(300));
    spec.max_ack_pending = Some(64);
    b.ensure_consumer(&spec).await.expect("consumer");

    let publisher = {
        let b = b.clone();
        tokio::spawn(async move {
            for chunk in 0..(N / 100) {
                let batch = (0..100)
                    .map(|i| msg(&format!("m{}", chunk * 100 + i), "in"))
                    .collect();
                b.publish(batch).await.expect("publish");
            }
        })
    };
    // (consumer, id) -> finished; (consumer, id) -> attempts delivered.
    let finished: Arc<Mutex<HashMap<(String, String), u32>>> = Default::default();
    // The output ids of the completes the broker accepted.
    let completed: Arc<Mutex<Vec<String>>> = Default::default();
    type Seen = HashMap<(String, String), std::collections::HashSet<u32>>;
    let attempts: Arc<Mutex<Seen>> = Default::default();
    let mut workers = tokio::task::JoinSet::new();
    for name in ["p.s", "p.t"] {
        for w in 0..4u64 {
            let b = b.clone();
            let finished = finished.clone();
            let attempts = attempts.clone();
            let completed = completed.clone();
            workers.spawn(async move {
                let mut rng = w * 7919 + name.len() as u64;
                let mut mine: HashMap<(String, String), u32> = HashMap::new();
                loop {
                    let done = finished
                        .lock()
                        .expect("lock")
                        .keys()
                        .filter(|(c, _)| c == name)
                        .count();
                    if done == N {
                        return;
                    }
                    let ds = b
                        .fetch(name, 16, Duration::from_millis(200))
                        .await
                        .expect("fetch");
                    for d in ds {
                        let key = (name.to_owned(), d.message.id.clone());
                        {
                            // Every delivery gets a delivery count of its
                            // own. (Comparing against the last one any
                            // worker saw would race: another worker may
                            // record a later delivery first when this one
                            // is descheduled past the 300 ms lease.)
                            let mut a = attempts.lock().expect("lock");
                            let seen = a.entry(key.clone()).or_default();
                            assert!(
                                seen.insert(d.attempt),
                                "{key:?}: attempt {} delivered twice",
                                d.attempt
                            );
                        }
                        // Within one worker, deliveries come in order, so
                        // the count can only grow.
                        let last = mine.entry(key.clone()).or_default();
                        assert!(
                            d.attempt > *last,
                            "{key:?}: attempt {} after {last} in one worker",
                            d.attempt
                        );
                        *last = d.attempt;
                        rng = rng
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let roll = (rng >> 33) % 10;
                        let result = match roll {
                            0 => b.nak(&d.receipt, Duration::from_millis(20)).await,
                            1 => continue, // let the lease expire
                            2 => b.term(&d.receipt).await,
                            3 => {
                                b.complete(&Completion::new(
                                    &d.receipt,
                                    vec![msg(&format!("o-{}-{}", name, d.message.id), "out")],
                                ))
                                .await
                            }
                            _ => b.ack(&d.receipt).await,
                        };
                        match (roll, result) {
                            (0, Ok(())) => {}
                            (_, Ok(())) => {
                                let prev = finished
                                    .lock()
                                    .expect("lock")
                                    .insert(key.clone(), d.attempt);
                                assert!(prev.is_none(), "{key:?} finished twice");
                                if roll == 3 {
                                    completed
                                        .lock()
                                        .expect("lock")
                                        .push(format!("o-{}-{}", name, d.message.id));
                                }
                            }
                            // An expired lease raced a redelivery: allowed.
                            (_, Err(BrokerError::LeaseLost(_))) => {}
                            (_, Err(e)) => panic!("{key:?}: {e}"),
                        }
                    }
                }
            });
        }
    }
    publisher.await.expect("publisher");
    let all = async {
        while let Some(r) = workers.join_next().await {
            r.expect("worker");
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("workers finish");
    for name in ["p.s", "p.t"] {
        let stats = b.consumer_stats(name).await.expect("stats");
        assert_eq!((stats.pending, stats.in_flight), (0, 0), "{name}");
    }
    wait_for_depth(&b, "in", 0).await;
    let outputs = b
        .read("out", 0, 100_000, Duration::ZERO)
        .await
        .expect("read");
    assert_eq!(finished.lock().expect("lock").len(), 2 * N);
    // Every accepted complete published its output, once; a complete
    // refused (its lease lost) published nothing.
    let mut expected = completed.lock().expect("lock").clone();
    expected.sort();
    let mut got: Vec<String> = outputs.iter().map(|m| m.message.id.clone()).collect();
    got.sort();
    assert!(!expected.is_empty(), "no worker completed with an output");
    assert_eq!(got, expected, "outputs against accepted completes");
}

/// The embedded dedup store: a key is taken once, busy while held, done
/// (the record committed with the outputs and the ack) once completed, and
/// new again after its TTL; a released key can be taken again; records
/// survive a restart.
#[tokio::test]
async fn dedup_records_take_complete_release_expire_and_survive_a_restart() {
    use sluice::dedup::{Begin, BeginRequest, DedupStore};

    let dir = tempfile::tempdir().expect("dir");
    let request = |key: &str, ttl: Duration| BeginRequest {
        scope: "p.s".into(),
        key: key.into(),
        digest: sluice::dedup::key_digest(key),
        hash: None,
        lease: LONG,
        ttl,
    };
    {
        let b = setup(dir.path(), SyncMode::Always, LONG).await;
        b.ensure_topic(&topic("out")).await.expect("out");
        publish_ids(&b, "in", &["m1"]).await;
        let delivery = b.fetch("p.s", 1, ARRIVE).await.expect("fetch").remove(0);

        let Begin::Run(ticket) = b.begin(request("k1", LONG)).await.expect("begin") else {
            panic!("a new key is taken")
        };
        assert!(matches!(
            b.begin(request("k1", LONG)).await.expect("begin"),
            Begin::Busy(_)
        ));
        b.complete(&Completion {
            receipt: delivery.receipt.clone(),
            outputs: vec![msg("o1", "out")],
            ticket: Some(ticket),
            state: None,
        })
        .await
        .expect("complete");
        // Outputs and ack went with the record.
        assert_eq!(b.topic_stats("out").await.expect("stats").depth, 1);
        assert!(b.fetch("p.s", 1, QUIET).await.expect("fetch").is_empty());

        // A released key is free again; one that expires is new again.
        let Begin::Run(held) = b.begin(request("k2", LONG)).await.expect("begin") else {
            panic!("k2 is new")
        };
        b.release(&held).await.expect("release");
        assert!(matches!(
            b.begin(request("k2", LONG)).await.expect("begin"),
            Begin::Run(_)
        ));
        assert!(matches!(
            b.begin(request("k3", Duration::from_millis(1)))
                .await
                .expect("begin"),
            Begin::Run(_)
        ));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(matches!(
            b.begin(request("k3", LONG)).await.expect("begin"),
            Begin::Run(_)
        ));
    }
    let b = open(dir.path(), SyncMode::Always);
    match b.begin(request("k1", LONG)).await.expect("begin") {
        // The outputs committed with the record, so it does not repeat them.
        Begin::Done { outputs, .. } => assert_eq!(outputs, None),
        other => panic!("k1 is done after a restart: {other:?}"),
    }
}

// ---------------------------------------------------------------------
// First deliveries have no pending records: the consumer's floor and its
// completed runs (the `settled` keyspace) say what was completed.
// Completes out of order must be as durable as in order, across a SIGKILL.
// ---------------------------------------------------------------------

/// Set in the child of the out-of-order test: `<data dir>`.
const FLOOR_CHILD_ENV: &str = "SLUICE_EMBEDDED_FLOOR_CHILD";

/// Publishes f0..f29 (seqs 1..30), fetches them all, completes f29 down
/// to f10 (each with an output) and then f5, prints `COMPLETED` and waits
/// to be killed. The completes run out of order while f0..f9 are still out.
fn floor_child(dir: &str) {
    use std::io::Write;
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let b = setup(Path::new(dir), SyncMode::Always, LONG).await;
        b.ensure_topic(&topic("out")).await.expect("topic");
        let ids: Vec<String> = (0..30).map(|i| format!("f{i}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        publish_ids(&b, "in", &refs).await;
        let mut ds = Vec::new();
        while ds.len() < 30 {
            ds.extend(b.fetch("p.s", 30, ARRIVE).await.expect("fetch"));
        }
        let order: Vec<usize> = (10..30).rev().chain([5]).collect();
        for i in order {
            let d = ds
                .iter()
                .find(|d| d.message.id == format!("f{i}"))
                .expect("delivered");
            let output = msg(&format!("o-{}", d.message.id), "out");
            b.complete(&Completion::new(&d.receipt, vec![output]))
                .await
                .expect("complete");
        }
        println!("COMPLETED");
        std::io::stdout().flush().expect("flush");
        tokio::time::sleep(Duration::from_secs(600)).await;
    });
}

#[test]
fn completes_out_of_order_survive_a_kill_9_and_only_the_unanswered_come_back() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    if let Ok(dir) = std::env::var(FLOOR_CHILD_ENV) {
        floor_child(&dir);
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(std::env::current_exe().expect("current_exe"))
        .args([
            "--exact",
            "completes_out_of_order_survive_a_kill_9_and_only_the_unanswered_come_back",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(FLOOR_CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let completed = stdout
        .lines()
        .map_while(Result::ok)
        .any(|line| line.ends_with("COMPLETED"));
    child.kill().expect("SIGKILL the child");
    child.wait().expect("wait");
    assert!(completed, "the child completed before it was killed");

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let b = open(dir.path(), SyncMode::Always);
        let outputs: Vec<String> = b
            .read("out", 0, 1000, Duration::ZERO)
            .await
            .expect("read out")
            .into_iter()
            .map(|s| s.message.id)
            .collect();
        assert_eq!(outputs.len(), 21, "{outputs:?}");
        let mut again = BTreeMap::new();
        loop {
            let ds = b.fetch("p.s", 100, QUIET).await.expect("fetch");
            if ds.is_empty() {
                break;
            }
            for d in ds {
                again.insert(d.message.id.clone(), d.attempt);
                b.ack(&d.receipt).await.expect("ack");
            }
        }
        let expected: BTreeMap<String, u32> = [0, 1, 2, 3, 4, 6, 7, 8, 9]
            .iter()
            .map(|i| (format!("f{i}"), 2))
            .collect();
        assert_eq!(
            again, expected,
            "exactly the unanswered first deliveries come back, at attempt 2"
        );
    });
}

#[tokio::test]
async fn a_clean_reopen_after_out_of_order_acks_delivers_only_what_is_unanswered() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let b = setup(dir.path(), SyncMode::Os, LONG).await;
        publish_ids(&b, "in", &["a", "b", "c", "d", "e"]).await;
        let ds = b.fetch("p.s", 5, ARRIVE).await.expect("fetch");
        assert_eq!(ds.len(), 5);
        // b and d completed; a, c and e still out; e then nak'd.
        b.ack(&ds[1].receipt).await.expect("ack b");
        b.ack(&ds[3].receipt).await.expect("ack d");
        b.nak(&ds[4].receipt, Duration::ZERO).await.expect("nak e");
    }
    let b = open(dir.path(), SyncMode::Os);
    let mut again = BTreeMap::new();
    loop {
        let ds = b.fetch("p.s", 10, QUIET).await.expect("fetch");
        if ds.is_empty() {
            break;
        }
        for d in ds {
            again.insert(d.message.id.clone(), d.attempt);
            b.ack(&d.receipt).await.expect("ack");
        }
    }
    let expected: BTreeMap<String, u32> = [("a", 2), ("c", 2), ("e", 2)]
        .iter()
        .map(|(id, a)| (id.to_string(), *a))
        .collect();
    assert_eq!(again, expected);
}

/// A state write that `message` commits with its ack: `key` set to
/// `value`, if `key` still has `read` (its revision as the call read it,
/// 0 for absent).
fn state_write(delivery: &Delivery, key: &str, value: &str, read: u64) -> Completion {
    use sluice::state::{StateWrites, Write};
    let mut completion = Completion::new(&delivery.receipt, Vec::new());
    completion.state = Some(StateWrites {
        store: "p/s".into(),
        max_bytes: u64::MAX,
        writer: delivery.message.id.clone(),
        checks: vec![(key.to_owned(), read)],
        writes: vec![(
            key.to_owned(),
            Write::Put {
                value: value.as_bytes().to_vec(),
                expires_at: 0,
            },
        )],
    });
    completion
}

/// A read of a key that a complete in flight writes sees that write (it
/// need not wait for its fsync), and a call that read it commits only if
/// that complete committed first: a write that is refused is never the base
/// of another. Each round sends a complete A (every other one with a stale
/// check, so it is refused), reads the key while A is (most likely) in
/// flight, and commits B on what it read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_a_key_in_flight_sees_that_write_and_builds_only_on_a_committed_one() {
    const ROUNDS: usize = 100;
    let dir = tempfile::tempdir().expect("dir");
    let b = setup(dir.path(), SyncMode::Always, LONG).await;
    let ids: Vec<String> = (0..ROUNDS * 2).map(|i| format!("m{i}")).collect();
    publish_ids(
        &b,
        "in",
        &ids.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
    let mut deliveries = Vec::new();
    while deliveries.len() < ROUNDS * 2 {
        deliveries.extend(b.fetch("p.s", 512, ARRIVE).await.expect("fetch"));
    }
    let reader = b.state().expect("the embedded broker keeps state");
    let (mut in_flight_refused, mut built_on_a) = (0, 0);
    for round in 0..ROUNDS {
        let before = reader.get("p/s", "k").await.expect("get");
        let before_rev = before.as_ref().map_or(0, |e| e.revision);
        let a_value = format!("a{round}");
        let a_stale = round % 2 == 1;
        let a = state_write(
            &deliveries[2 * round],
            "k",
            &a_value,
            if a_stale {
                before_rev + 1_000_000
            } else {
                before_rev
            },
        );
        let mut a_complete = Box::pin(b.complete(&a));
        // One poll sends A to the committer; its reply needs an fsync.
        let early = futures_util::poll!(&mut a_complete);
        let seen = reader.get("p/s", "k").await.expect("get");
        let seen_rev = seen.as_ref().map_or(0, |e| e.revision);
        let saw_a = seen.as_ref().is_some_and(|e| e.value == a_value.as_bytes());
        let b_call = state_write(
            &deliveries[2 * round + 1],
            "k",
            &format!("b{round}"),
            seen_rev,
        );
        let b_result = b.complete(&b_call).await;
        let a_result = match early {
            std::task::Poll::Ready(result) => result,
            std::task::Poll::Pending => a_complete.await,
        };
        assert_eq!(a_result.is_ok(), !a_stale, "round {round}: A: {a_result:?}");
        if saw_a {
            assert!(seen_rev > before_rev, "round {round}: A's revision is new");
            if a_stale {
                in_flight_refused += 1;
                assert!(
                    matches!(b_result, Err(BrokerError::StateConflict(_))),
                    "round {round}: B read A's write, which was refused, and must be refused too: {b_result:?}"
                );
            } else {
                built_on_a += 1;
                assert!(
                    b_result.is_ok(),
                    "round {round}: B read A's committed write: {b_result:?}"
                );
            }
        } else if a_stale {
            assert!(
                b_result.is_ok(),
                "round {round}: B read the value before A: {b_result:?}"
            );
        } else {
            assert!(
                matches!(b_result, Err(BrokerError::StateConflict(_))),
                "round {round}: B read the value before A, which A replaced: {b_result:?}"
            );
        }
        // What the store holds is what the last committed call wrote.
        let now = reader.get("p/s", "k").await.expect("get").map(|e| e.value);
        let expected = if b_result.is_ok() {
            Some(format!("b{round}").into_bytes())
        } else if a_result.is_ok() {
            Some(a_value.into_bytes())
        } else {
            before.map(|e| e.value)
        };
        assert_eq!(now, expected, "round {round}");
    }
    println!(
        "reads of a write in flight: {built_on_a} built on a committed one, {in_flight_refused} on a refused one"
    );
}
