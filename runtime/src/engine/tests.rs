//! The engine against the in-memory broker: every row of the outcome
//! table, a batch's partial failure, a lease that ends during a call, and
//! per-key ordering. Time is tokio's paused clock, so backoffs of seconds
//! and leases of half a minute take no real time and no test depends on
//! the machine's speed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::{Engine, StageHandler, StageSetup, backoff};
use crate::broker::memory::MemoryBroker;
use crate::broker::{Broker, Message, TopicSpec};
use crate::config::Stage;
use crate::dlq;
use crate::failure::{Failure, FailureKind};
use crate::metrics::Metrics;
use crate::plugin::{Emit, Message as PluginMessage, Outcome};

/// What a scripted handler does with one call: the message, and how many
/// calls came before this one (across all worker slots).
type Script = dyn Fn(&PluginMessage, usize) -> Outcome + Send + Sync;

/// What a scripted handler does inside a call before its outcome: a pause
/// to sleep through, if any (and whatever else, such as moving the
/// broker's clock).
type During = dyn Fn(&PluginMessage) -> Option<Duration> + Send + Sync;

/// (id, attempt) of each call, in the order the calls started.
type Calls = Arc<Mutex<Vec<(String, u32)>>>;

/// A handler whose outcome per message is a function of the test's, and
/// which records every call it gets.
#[derive(Clone)]
struct Scripted {
    script: Arc<Script>,
    calls: Calls,
    /// Run inside the call, before the outcome (a hook to move time).
    during: Option<Arc<During>>,
}

impl Scripted {
    fn new(script: impl Fn(&PluginMessage, usize) -> Outcome + Send + Sync + 'static) -> Self {
        Scripted {
            script: Arc::new(script),
            calls: Arc::default(),
            during: None,
        }
    }

    /// (id, attempt) of every call so far, in the order they started.
    fn calls(&self) -> Vec<(String, u32)> {
        self.calls.lock().expect("calls").clone()
    }
}

#[async_trait]
impl StageHandler for Scripted {
    async fn handle(&mut self, message: &PluginMessage) -> Outcome {
        let before = {
            let mut calls = self.calls.lock().expect("calls");
            calls.push((message.id.clone(), message.attempt));
            calls.len() - 1
        };
        if let Some(during) = &self.during
            && let Some(pause) = during(message)
        {
            tokio::time::sleep(pause).await;
        }
        (self.script)(message, before)
    }
}

fn upper(message: &PluginMessage) -> Outcome {
    Ok(vec![Emit {
        topic: "out".into(),
        key: message.key.clone(),
        headers: message.headers.clone(),
        payload: message.payload.to_ascii_uppercase(),
    }])
}

/// An emit to `out`.
fn emit(payload: impl Into<Vec<u8>>) -> Emit {
    Emit {
        topic: "out".into(),
        key: None,
        headers: Vec::new(),
        payload: payload.into(),
    }
}

fn fail(kind: FailureKind) -> Outcome {
    Err(Failure::new(kind, format!("scripted {kind}")))
}

/// A stage `p/s` reading `in`, publishing `out`, with `extra` YAML.
fn stage(extra: &str) -> Stage {
    let yaml = format!(
        "name: s\nsubscribe: in\nplugin: scripted.wasm\npublish: [out]\n\
         retry: {{max_attempts: 3, backoff: {{initial: 1s, max: 1s, jitter: 0}}}}\n{extra}"
    );
    serde_saphyr::from_str(&yaml).expect("stage YAML")
}

/// A running stage on a memory broker with `in`, `out` and the DLQ.
struct Rig {
    broker: Arc<MemoryBroker>,
    engine: Engine,
}

const DLQ: &str = "p.s.dlq";

async fn rig(broker: Arc<MemoryBroker>, stage: Stage, handler: &Scripted) -> Rig {
    let handlers = (0..stage.delivery.concurrency.get())
        .map(|_| Box::new(handler.clone()) as Box<dyn StageHandler>)
        .collect();
    start(broker, stage, handlers).await
}

async fn start(
    broker: Arc<MemoryBroker>,
    stage: Stage,
    handlers: Vec<Box<dyn StageHandler>>,
) -> Rig {
    for name in ["in", "out", DLQ] {
        broker
            .ensure_topic(&TopicSpec::new(name))
            .await
            .expect("topic");
    }
    let setup = StageSetup {
        pipeline: "p".into(),
        handlers,
        stage,
        shutdown_timeout: Duration::from_secs(5),
        plugin_sha256: None,
    };
    let engine = Engine::start(
        broker.clone() as Arc<dyn Broker>,
        Arc::new(Metrics::new()),
        None,
        None,
        vec![setup],
    )
    .await
    .expect("engine");
    Rig { broker, engine }
}

fn memory() -> Arc<MemoryBroker> {
    Arc::new(MemoryBroker::new())
}

impl Rig {
    async fn publish(&self, messages: &[(&str, Option<&str>, &str)]) {
        let messages = messages
            .iter()
            .map(|(id, key, payload)| {
                let mut m = Message::new(*id, "in", payload.as_bytes().to_vec());
                m.key = key.map(str::to_owned);
                m
            })
            .collect();
        self.broker.publish(messages).await.expect("publish");
    }

    /// Waits (in tokio's paused time: no real time passes) until `done`.
    async fn until(&self, what: &str, done: impl Fn(&MemoryBroker) -> bool) {
        for _ in 0..100_000 {
            if done(&self.broker) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!(
            "{what}: not within 500 s of (paused) time; out: {:?}, dlq: {:?}, naks: {:?}",
            self.payloads("out"),
            self.payloads(DLQ),
            self.broker.naks()
        );
    }

    /// Waits until the stage's consumer holds nothing, and shuts it down.
    async fn settle_and_stop(self) -> Arc<MemoryBroker> {
        let consumer = crate::broker::consumer_name("p", "s");
        for _ in 0..100_000 {
            let stats = self.broker.consumer_stats(&consumer).await.expect("stats");
            if stats.pending == 0 && stats.in_flight == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.engine.shutdown().await;
        self.broker
    }

    fn payloads(&self, topic: &str) -> Vec<String> {
        self.broker
            .messages(topic)
            .iter()
            .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
            .collect()
    }
}

fn header<'a>(m: &'a Message, name: &str) -> Option<&'a str> {
    m.header(name)
}

#[tokio::test(start_paused = true)]
async fn ok_publishes_the_outputs_with_deterministic_ids_and_acks() {
    let handler = Scripted::new(|m, _| upper(m));
    let rig = rig(memory(), stage(""), &handler).await;
    rig.publish(&[("a", None, "x"), ("b", Some("k"), "y")])
        .await;
    rig.until("two outputs", |b| b.messages("out").len() == 2)
        .await;
    let broker = rig.settle_and_stop().await;
    let out = broker.messages("out");
    let mut ids: Vec<&str> = out.iter().map(|m| m.id.as_str()).collect();
    ids.sort_unstable();
    let mut expected = [
        super::emit_id("p", "s", "a", 0),
        super::emit_id("p", "s", "b", 0),
    ];
    expected.sort();
    assert_eq!(ids, expected);
    assert_eq!(
        out.iter()
            .find(|m| m.payload == "Y")
            .expect("Y")
            .key
            .as_deref(),
        Some("k")
    );
    assert!(broker.naks().is_empty() && broker.messages(DLQ).is_empty());
    assert_eq!(handler.calls().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_retry_is_naked_with_the_backoff_and_succeeds_on_a_later_attempt() {
    let handler = Scripted::new(|m, _| {
        if m.attempt < 3 {
            fail(FailureKind::Retry)
        } else {
            upper(m)
        }
    });
    let rig = rig(memory(), stage(""), &handler).await;
    rig.publish(&[("a", None, "x")]).await;
    rig.until("the output", |b| !b.messages("out").is_empty())
        .await;
    let broker = rig.settle_and_stop().await;
    // Backoff 1 s (no jitter, max 1 s), twice.
    assert_eq!(broker.naks(), [(1, Duration::from_secs(1)); 2]);
    assert_eq!(
        handler.calls(),
        [("a".into(), 1), ("a".into(), 2), ("a".into(), 3)]
    );
    assert!(broker.messages(DLQ).is_empty());
}

/// `retry.schedule` sets each wait in turn, the last repeating, and
/// without `max_attempts` gives one attempt per wait plus the first.
#[tokio::test(start_paused = true)]
async fn a_retry_schedule_sets_each_wait_and_its_length_the_attempts() {
    let handler = Scripted::new(|_, _| fail(FailureKind::Retry));
    let yaml = "name: s\nsubscribe: in\nplugin: scripted.wasm\npublish: [out]\n\
                retry: {schedule: [1s, 3s]}\n";
    let stage: Stage = serde_saphyr::from_str(yaml).expect("stage YAML");
    assert_eq!(stage.delivery.retry.attempts().get(), 3);
    let rig = rig(memory(), stage, &handler).await;
    rig.publish(&[("a", None, "x")]).await;
    rig.until("the dead letter", |b| !b.messages(DLQ).is_empty())
        .await;
    let broker = rig.settle_and_stop().await;
    assert_eq!(
        broker.naks(),
        [(1, Duration::from_secs(1)), (1, Duration::from_secs(3))]
    );
    assert_eq!(handler.calls().len(), 3);

    let longer: Stage = serde_saphyr::from_str(
        "name: s\nsubscribe: in\nplugin: p.wasm\nretry: {schedule: [1m, 5m, 30m, 2h, 8h, 3d], max_attempts: 9}\n",
    )
    .expect("stage YAML");
    assert_eq!(longer.delivery.retry.attempts().get(), 9);
    let waits: Vec<_> = (1..=8)
        .map(|a| {
            backoff::scheduled(
                &longer
                    .delivery
                    .retry
                    .schedule
                    .iter()
                    .flatten()
                    .map(|w| w.get())
                    .collect::<Vec<_>>(),
                a,
            )
        })
        .collect();
    assert_eq!(waits[5], Some(Duration::from_secs(3 * 86_400)));
    assert_eq!(waits[7], waits[5], "the last wait repeats");
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_is_naked_with_the_handlers_delay() {
    let handler = Scripted::new(|m, _| {
        if m.attempt == 1 {
            let mut failure = Failure::new(FailureKind::Retry, "later");
            failure.retry_after = Some(Duration::from_secs(42));
            Err(failure)
        } else {
            upper(m)
        }
    });
    let rig = rig(memory(), stage(""), &handler).await;
    rig.publish(&[("a", None, "x")]).await;
    rig.until("the output", |b| !b.messages("out").is_empty())
        .await;
    let broker = rig.settle_and_stop().await;
    assert_eq!(broker.naks(), [(1, Duration::from_secs(42))]);
}

/// Retryable kinds run `max_attempts` times, then dead-letter with
/// provenance; permanent kinds dead-letter on the first attempt.
#[tokio::test(start_paused = true)]
async fn every_failure_kind_ends_where_the_outcome_table_says() {
    let cases = [
        (FailureKind::Retry, 3),
        (FailureKind::Timeout, 3),
        (FailureKind::Trap, 3),
        (FailureKind::OutOfMemory, 3),
        (FailureKind::Rejected, 1),
        (FailureKind::OutputTooLarge, 1),
        (FailureKind::UndeclaredTopic, 1),
    ];
    for (kind, attempts) in cases {
        let handler = Scripted::new(move |_, _| fail(kind));
        let rig = rig(memory(), stage(""), &handler).await;
        rig.publish(&[("a", None, "x")]).await;
        rig.until("the dead letter", |b| !b.messages(DLQ).is_empty())
            .await;
        let broker = rig.settle_and_stop().await;
        let dead = broker.messages(DLQ);
        assert_eq!(dead.len(), 1, "{kind}");
        let entry = &dead[0];
        assert_eq!(header(entry, dlq::KIND), Some(kind.as_str()), "{kind}");
        assert_eq!(
            header(entry, dlq::ATTEMPTS),
            Some(attempts.to_string().as_str()),
            "{kind}"
        );
        assert_eq!(header(entry, dlq::ORIGINAL_ID), Some("a"));
        assert_eq!(header(entry, dlq::SOURCE_TOPIC), Some("in"));
        assert_eq!(entry.payload, "x", "the dead letter carries the input");
        assert_eq!(handler.calls().len(), attempts, "{kind}");
        assert_eq!(broker.naks().len(), attempts - 1, "{kind}");
        assert!(broker.messages("out").is_empty(), "{kind}");
    }
}

/// `unavailable` holds the delivery in place: no attempt spent, no nak,
/// however many times it is tried, and it succeeds once the target is back.
#[tokio::test(start_paused = true)]
async fn unavailable_holds_without_spending_attempts() {
    let handler = Scripted::new(|m, before| {
        if before < 5 {
            fail(FailureKind::Unavailable)
        } else {
            upper(m)
        }
    });
    let rig = rig(memory(), stage(""), &handler).await;
    rig.publish(&[("a", None, "x")]).await;
    rig.until("the output", |b| !b.messages("out").is_empty())
        .await;
    let broker = rig.settle_and_stop().await;
    let calls = handler.calls();
    assert_eq!(calls.len(), 6);
    assert!(calls.iter().all(|(_, attempt)| *attempt == 1), "{calls:?}");
    assert!(broker.naks().is_empty());
    assert!(broker.messages(DLQ).is_empty());
}

/// The broker refusing an output as too large dead-letters at once, as
/// `output-too-large`, with the size in the reason.
#[tokio::test(start_paused = true)]
async fn an_output_the_broker_refuses_as_too_large_is_dead_lettered_at_once() {
    let handler = Scripted::new(|_, _| Ok(vec![emit(vec![b'z'; 100])]));
    let rig = rig(
        Arc::new(MemoryBroker::new().with_max_payload(50)),
        stage(""),
        &handler,
    )
    .await;
    rig.publish(&[("a", None, "x")]).await;
    rig.until("the dead letter", |b| !b.messages(DLQ).is_empty())
        .await;
    let broker = rig.settle_and_stop().await;
    let dead = &broker.messages(DLQ)[0];
    assert_eq!(header(dead, dlq::KIND), Some("output-too-large"));
    assert!(
        header(dead, dlq::ERROR).is_some_and(|e| e.contains("100 bytes")),
        "{dead:?}"
    );
    assert_eq!(handler.calls().len(), 1);
}

/// A batch whose items fail differently: each item is settled on its own.
#[tokio::test(start_paused = true)]
async fn a_batch_settles_each_item_by_its_own_outcome() {
    /// Records each batch's (id, attempt)s.
    struct Batch(Arc<Mutex<Vec<Batched>>>);
    type Batched = Vec<(String, u32)>;
    #[async_trait]
    impl StageHandler for Batch {
        async fn handle(&mut self, _: &PluginMessage) -> Outcome {
            unreachable!("a batch stage calls handle_batch")
        }
        async fn handle_batch(&mut self, messages: &[PluginMessage]) -> Vec<Outcome> {
            self.0
                .lock()
                .expect("calls")
                .push(messages.iter().map(|m| (m.id.clone(), m.attempt)).collect());
            messages
                .iter()
                .map(|m| match (m.id.as_str(), m.attempt) {
                    ("retry", 1) => fail(FailureKind::Retry),
                    ("reject", _) => fail(FailureKind::Rejected),
                    _ => upper(m),
                })
                .collect()
        }
    }
    let calls = Arc::new(Mutex::new(Vec::new()));
    let stage = stage("batch: {max: 8, wait: 50ms}\n");
    let rig = start(memory(), stage, vec![Box::new(Batch(calls.clone()))]).await;
    rig.publish(&[
        ("ok1", None, "a"),
        ("retry", None, "b"),
        ("reject", None, "c"),
        ("ok2", None, "d"),
    ])
    .await;
    rig.until("three outputs and a dead letter", |b| {
        b.messages("out").len() == 3 && b.messages(DLQ).len() == 1
    })
    .await;
    let broker = rig.settle_and_stop().await;
    let mut out: Vec<String> = broker
        .messages("out")
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    out.sort();
    assert_eq!(out, ["A", "B", "D"]);
    assert_eq!(
        header(&broker.messages(DLQ)[0], dlq::ORIGINAL_ID),
        Some("reject")
    );
    assert_eq!(
        broker.naks(),
        [(2, Duration::from_secs(1))],
        "only `retry` is naked"
    );
    let calls = calls.lock().expect("calls").clone();
    assert_eq!(
        calls.len(),
        2,
        "the batch, then the retried item: {calls:?}"
    );
    assert_eq!(calls[0].len(), 4);
    assert_eq!(calls[1], [("retry".to_owned(), 2)]);
}

/// A call that outlives its lease: the broker redelivers the message to
/// the other worker slot, that attempt's outputs are the ones published,
/// and the first call's late complete is refused and publishes nothing.
#[tokio::test(start_paused = true)]
async fn a_lease_that_ends_during_a_call_is_settled_once_by_the_redelivery() {
    let broker = memory();
    let skewer = broker.clone();
    let mut handler = Scripted::new(|m, _| Ok(vec![emit(format!("attempt {}", m.attempt))]));
    handler.during = Some(Arc::new(move |m: &PluginMessage| {
        (m.attempt == 1).then(|| {
            // The lease (ack_wait 30 s) is over at the broker now; this
            // call goes on for another minute, long past the redelivery.
            skewer.skew(Duration::from_secs(31));
            Duration::from_secs(60)
        })
    }));
    let rig = rig(broker, stage("concurrency: 2\nack_wait: 30s\n"), &handler).await;
    rig.publish(&[("a", None, "x")]).await;
    // Past the first call's minute (paused time: no real time passes).
    tokio::time::sleep(Duration::from_secs(70)).await;
    let broker = rig.settle_and_stop().await;
    assert_eq!(handler.calls(), [("a".into(), 1), ("a".into(), 2)]);
    let out: Vec<_> = broker.messages("out");
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].payload, "attempt 2");
    assert_eq!(out[0].id, super::emit_id("p", "s", "a", 0));
    assert!(
        broker.lost().iter().any(|r| r.attempt == 1),
        "the first call's complete was refused: {:?}",
        broker.lost()
    );
    assert!(broker.messages(DLQ).is_empty());
}

/// Per-key ordering: the calls of one key never overlap and come in
/// publish order, even across a retry in place, while keys run in
/// parallel.
#[tokio::test(start_paused = true)]
async fn per_key_ordering_keeps_each_keys_order_across_retries() {
    let handler = Scripted::new(|m, _| {
        if m.id == "k0-2" && m.attempt < 3 {
            fail(FailureKind::Retry)
        } else {
            upper(m)
        }
    });
    let stage = stage("concurrency: 4\nordering: {key: key}\n");
    let rig = rig(memory(), stage, &handler).await;
    let mut messages = Vec::new();
    let ids: Vec<(String, String)> = (0..5)
        .flat_map(|i| (0..3).map(move |k| (format!("k{k}-{i}"), format!("k{k}"))))
        .collect();
    for (id, key) in &ids {
        messages.push((id.as_str(), Some(key.as_str()), "x"));
    }
    rig.publish(&messages).await;
    rig.until("15 outputs", |b| b.messages("out").len() == 15)
        .await;
    let broker = rig.settle_and_stop().await;
    let mut per_key: HashMap<String, Vec<(String, u32)>> = HashMap::new();
    for (id, attempt) in handler.calls() {
        let key = id.split('-').next().expect("key").to_owned();
        per_key.entry(key).or_default().push((id, attempt));
    }
    for k in 0..3 {
        let key = format!("k{k}");
        let got: Vec<String> = per_key[&key].iter().map(|(id, _)| id.clone()).collect();
        let mut expected: Vec<String> = (0..5).map(|i| format!("{key}-{i}")).collect();
        if k == 0 {
            // Retried in place: k0-2 three times, before k0-3.
            expected.splice(2..3, ["k0-2".to_owned(), "k0-2".into(), "k0-2".into()]);
        }
        assert_eq!(got, expected, "{key}");
    }
    assert!(
        broker.naks().is_empty(),
        "an ordered stage retries in place"
    );
}

/// A delivery held while its target is unavailable, retried by a worker
/// loop's settle, takes the only worker slot for its retry while the loop
/// already has the next delivery: the loop must keep driving that retry
/// (every call here awaits, as a sink's request does), or neither ever
/// finishes.
#[tokio::test(start_paused = true)]
async fn a_held_delivery_and_the_next_ones_share_one_slot_without_stalling() {
    let held = Arc::new(Mutex::new(0usize));
    let count = held.clone();
    let mut handler = Scripted::new(move |m, _| {
        if m.id == "a" {
            let mut tries = count.lock().expect("tries");
            *tries += 1;
            if *tries <= 3 {
                return fail(FailureKind::Unavailable);
            }
        }
        upper(m)
    });
    handler.during = Some(Arc::new(|_| Some(Duration::from_millis(10))));
    let rig = rig(memory(), stage("concurrency: 1\n"), &handler).await;
    rig.publish(&[
        ("a", None, "x"),
        ("b", None, "y"),
        ("c", None, "z"),
        ("d", None, "w"),
    ])
    .await;
    rig.until("four outputs", |b| b.messages("out").len() == 4)
        .await;
    let broker = rig.settle_and_stop().await;
    assert_eq!(
        *held.lock().expect("tries"),
        4,
        "held three times, then done"
    );
    assert!(broker.naks().is_empty(), "a hold spends no attempt");
}

#[tokio::test(start_paused = true)]
async fn a_stage_swapped_while_calls_run_handles_each_message_once_and_the_rest_with_the_new_handler()
 {
    // The old handler takes 2 s a call: a swap comes while calls run.
    let mut old = Scripted::new(|m, _| Ok(vec![emit(m.payload.clone())]));
    old.during = Some(Arc::new(|_| Some(Duration::from_secs(2))));
    let mut rig = rig(memory(), stage("concurrency: 2"), &old).await;
    let ids: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    let messages: Vec<(&str, Option<&str>, &str)> =
        ids.iter().map(|id| (id.as_str(), None, "x")).collect();
    rig.publish(&messages).await;
    rig.until("the first calls to start", |_| old.calls().len() >= 2)
        .await;

    // Prepared (consumer declared) while the old stage runs, then the
    // swap: the old one drains, the new one starts on what is left.
    let new = Scripted::new(|m, _| upper(m));
    let setup = StageSetup {
        pipeline: "p".into(),
        handlers: (0..4)
            .map(|_| Box::new(new.clone()) as Box<dyn StageHandler>)
            .collect(),
        stage: stage("concurrency: 4"),
        shutdown_timeout: Duration::from_secs(5),
        plugin_sha256: None,
    };
    let prepared = rig.engine.prepare(vec![setup]).await.expect("prepare");
    assert!(rig.engine.runs("p", "s"));
    rig.engine.remove(&[("p".into(), "s".into())]).await;
    assert!(!rig.engine.runs("p", "s"));
    let handled_by_old = old.calls().len();
    assert!(
        (2..20).contains(&handled_by_old),
        "the drain let the calls in flight finish and started none: {handled_by_old}"
    );
    rig.engine.launch(prepared);
    rig.until("every message out", |b| b.messages("out").len() == 20)
        .await;
    let broker = rig.settle_and_stop().await;

    // Each input once: the old handler's outputs as they were, the new
    // one's upper-cased; none handled by both, none by the old one after
    // the swap.
    let out = broker.messages("out");
    let mut out_ids: Vec<&str> = out.iter().map(|m| m.id.as_str()).collect();
    out_ids.sort_unstable();
    out_ids.dedup();
    assert_eq!(out_ids.len(), 20, "an output twice, or one missing");
    assert_eq!(
        old.calls().len(),
        handled_by_old,
        "the old handler ran after the swap"
    );
    let upper_count = out.iter().filter(|m| m.payload.as_ref() == b"X").count();
    assert_eq!(upper_count, 20 - handled_by_old);
    assert_eq!(new.calls().len(), 20 - handled_by_old);
}

/// `traceparent`s of the W3C recommendation's shape, one per input.
const TRACE_A: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE_B: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const TRACE_OWN: &str = "00-11111111111111111111111111111111-2222222222222222-00";

impl Rig {
    /// Publishes `(id, traceparent)` inputs with payload `x`.
    async fn publish_traced(&self, messages: &[(&str, Option<&str>)]) {
        let messages = messages
            .iter()
            .map(|(id, parent)| {
                let mut m = Message::new(*id, "in", b"x".to_vec());
                if let Some(parent) = parent {
                    m.headers = vec![
                        (crate::trace::TRACEPARENT.into(), (*parent).into()),
                        (crate::trace::TRACESTATE.into(), format!("v={id}")),
                    ];
                }
                m
            })
            .collect();
        self.broker.publish(messages).await.expect("publish");
    }
}

/// Each output's (payload, traceparent, tracestate), sorted.
fn traces(broker: &MemoryBroker, topic: &str) -> Vec<(String, Option<String>, Option<String>)> {
    let mut found: Vec<_> = broker
        .messages(topic)
        .iter()
        .map(|m| {
            (
                String::from_utf8_lossy(&m.payload).into_owned(),
                header(m, crate::trace::TRACEPARENT).map(str::to_owned),
                header(m, crate::trace::TRACESTATE).map(str::to_owned),
            )
        })
        .collect();
    found.sort();
    found
}

#[tokio::test(start_paused = true)]
async fn outputs_carry_their_inputs_trace_context_unless_the_handler_set_one() {
    // Emits without the input's headers; `own` sets a context of its own;
    // `bad` is dead-lettered.
    let handler = Scripted::new(|m, _| match m.id.as_str() {
        "bad" => fail(FailureKind::Rejected),
        "own" => {
            let mut e = emit(m.id.clone());
            e.headers = vec![(crate::trace::TRACEPARENT.into(), TRACE_OWN.into())];
            Ok(vec![e])
        }
        id => Ok(vec![emit(id), emit(format!("{id}2"))]),
    });
    let rig = rig(memory(), stage(""), &handler).await;
    rig.publish_traced(&[
        ("a", Some(TRACE_A)),
        ("b", Some(TRACE_B)),
        ("none", None),
        ("own", Some(TRACE_A)),
        ("bad", Some(TRACE_B)),
    ])
    .await;
    rig.until("seven outputs and a dead letter", |b| {
        b.messages("out").len() == 7 && b.messages(DLQ).len() == 1
    })
    .await;
    let broker = rig.settle_and_stop().await;
    let t = |p: &str, parent: Option<&str>, state: Option<&str>| {
        (
            p.to_owned(),
            parent.map(str::to_owned),
            state.map(str::to_owned),
        )
    };
    assert_eq!(
        traces(&broker, "out"),
        [
            t("a", Some(TRACE_A), Some("v=a")),
            t("a2", Some(TRACE_A), Some("v=a")),
            t("b", Some(TRACE_B), Some("v=b")),
            t("b2", Some(TRACE_B), Some("v=b")),
            t("none", None, None),
            t("none2", None, None),
            t("own", Some(TRACE_OWN), None),
        ]
    );
    // The dead letter is the input, context included.
    let entry = &broker.messages(DLQ)[0];
    assert_eq!(header(entry, crate::trace::TRACEPARENT), Some(TRACE_B));
    assert_eq!(
        crate::trace::trace_id(&entry.headers).as_deref(),
        Some("0af7651916cd43dd8448eb211c80319c")
    );
}

#[tokio::test(start_paused = true)]
async fn a_batch_items_outputs_carry_that_items_trace_context() {
    /// Emits one bare output per item, under the item's id.
    struct Bare;
    #[async_trait]
    impl StageHandler for Bare {
        async fn handle(&mut self, _: &PluginMessage) -> Outcome {
            unreachable!("a batch stage calls handle_batch")
        }
        async fn handle_batch(&mut self, messages: &[PluginMessage]) -> Vec<Outcome> {
            messages
                .iter()
                .map(|m| Ok(vec![emit(m.id.clone())]))
                .collect()
        }
    }
    let stage = stage("batch: {max: 8, wait: 50ms}\n");
    let rig = start(memory(), stage, vec![Box::new(Bare)]).await;
    rig.publish_traced(&[("a", Some(TRACE_A)), ("none", None), ("b", Some(TRACE_B))])
        .await;
    rig.until("three outputs", |b| b.messages("out").len() == 3)
        .await;
    let broker = rig.settle_and_stop().await;
    let parents: Vec<(String, Option<String>)> = traces(&broker, "out")
        .into_iter()
        .map(|(p, parent, _)| (p, parent))
        .collect();
    assert_eq!(
        parents,
        [
            ("a".to_owned(), Some(TRACE_A.to_owned())),
            ("b".to_owned(), Some(TRACE_B.to_owned())),
            ("none".to_owned(), None),
        ]
    );
}
