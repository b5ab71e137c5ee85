//! The sink seam: a built-in handler behind the stage runner.
//!
//! A connector implements [`Sink`] (write one message, or a batch) and
//! says how each write went with a [`SinkError`]. [`SinkHandler`] puts it
//! behind [`StageHandler`], so a sink is a stage like any other: its
//! valve, retries, backoff, DLQ, ordering and batches are the engine's.
//! The mapping onto the outcome table is here, once for every sink:
//!
//! | write | outcome |
//! |---|---|
//! | done (or already there) | `ok`: acked, no outputs |
//! | [`SinkError::Rejected`] (the target refuses it for good) | `rejected`: dead-lettered now, with the reason |
//! | [`SinkError::Retry`] (refused for now, e.g. 429, 503) | `retry`, after the target's `Retry-After` (capped by `retry.backoff.max`) or the backoff |
//! | [`SinkError::Unavailable`] (cannot reach the target) | `unavailable`: held in place, no attempt spent |
//! | no answer within the stage's `timeout` | `timeout`: retried |

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::Context;
use crate::engine::StageHandler;
use crate::failure::{Failure, FailureKind};
use crate::plugin::{Message, Outcome};

/// How one write went, when it did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// The target refuses this message for good (an HTTP 400, a value
    /// the column cannot take): dead-lettered as `rejected` with this
    /// reason (say what the target answered, e.g. the status and the
    /// first bytes of the body).
    #[error("{0}")]
    Rejected(String),
    /// The target refuses it for now (an HTTP 429 or 503, a serialisation
    /// failure): retried after `after` if the target said when, else the
    /// stage's backoff.
    #[error("{reason}")]
    Retry {
        /// What the target answered.
        reason: String,
        /// When to try again, as the target asked (`Retry-After`).
        after: Option<Duration>,
    },
    /// The target cannot be reached (connection refused, DNS, a dropped
    /// connection): the message waits, its attempts untouched. The text
    /// must carry no secret.
    #[error("{0}")]
    Unavailable(String),
}

/// A write the target has taken but not yet made durable (a record in an
/// object-store file that is still open): it resolves once it is, or with
/// what went wrong.
pub type Pending = futures_util::future::BoxFuture<'static, Result<(), SinkError>>;

/// How the target took one message of a batch (see [`Sink::accept_batch`]).
pub enum Accepted {
    /// Written: its outcome is final.
    Written,
    /// Taken, finished later: the message is settled when this resolves.
    Pending(Pending),
}

/// An outside system messages are written to. One value serves every
/// worker slot of the sink, so it holds the connection pool.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Writes one message. Writing the same message (the same `id`) twice
    /// must leave one copy where the target allows it (an idempotency
    /// key, `ON CONFLICT (id)`, a dedup key).
    async fn write(&self, message: &Message) -> Result<(), SinkError>;

    /// Writes a batch (a stage with `batch:`), one result per message, in
    /// order. The default writes them one at a time.
    async fn write_batch(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            results.push(self.write(message).await);
        }
        results
    }

    /// Takes a batch, for a sink that gathers messages into larger writes
    /// (an object-store file): per message, a refusal at once, or a
    /// [`Pending`] that resolves when the write holding it is complete.
    /// The engine keeps a pending message's lease meanwhile and frees the
    /// worker slot. The default writes the batch ([`Sink::write_batch`]).
    async fn accept_batch(&self, messages: &[Message]) -> Vec<Result<Accepted, SinkError>> {
        self.write_batch(messages)
            .await
            .into_iter()
            .map(|result| result.map(|()| Accepted::Written))
            .collect()
    }

    /// Shutdown began: complete what is pending now (close and upload the
    /// open files) instead of at a roll limit. Nothing by default.
    fn flush(&self) {}
}

/// One worker slot of a sink stage: the shared sink, the stage's timeout,
/// and the health its outages are reported to.
pub struct SinkHandler {
    sink: Arc<dyn Sink>,
    ctx: Context,
    /// `<pipeline>/<sink>`, made once rather than per write.
    label: String,
    timeout: Duration,
    backoff_max: Duration,
    /// The last batch call's pending items, for the engine to take.
    pending: Vec<Option<crate::engine::PendingOutcome>>,
}

impl SinkHandler {
    /// A slot writing to `sink`; each write (or batch) gets `timeout`, and
    /// a target's `Retry-After` is capped at `backoff_max`.
    pub fn new(
        sink: Arc<dyn Sink>,
        ctx: Context,
        timeout: Duration,
        backoff_max: Duration,
    ) -> Self {
        SinkHandler {
            sink,
            label: ctx.label(),
            ctx,
            timeout,
            backoff_max,
            pending: Vec::new(),
        }
    }

    /// The outcome of one write, with its outage (or recovery) reported.
    fn outcome(&self, result: Result<(), SinkError>) -> Outcome {
        let label = &self.label;
        match result {
            Ok(()) => {
                self.ctx.health.up(&self.ctx.metrics, label);
                Ok(Vec::new())
            }
            Err(SinkError::Rejected(reason)) => {
                self.ctx.health.up(&self.ctx.metrics, label);
                Err(Failure::new(FailureKind::Rejected, reason))
            }
            Err(error @ SinkError::Retry { .. }) => {
                self.ctx.health.up(&self.ctx.metrics, label);
                Err(failure_of(error, self.backoff_max))
            }
            Err(SinkError::Unavailable(why)) => {
                self.ctx.health.down(&self.ctx.metrics, label, &why);
                Err(Failure::new(FailureKind::Unavailable, why))
            }
        }
    }

    /// The outcome to come of a pending write. The sink reports its own
    /// outages (a stalled upload) to the health, so this only maps.
    fn later(&self, pending: Pending) -> crate::engine::PendingOutcome {
        let backoff_max = self.backoff_max;
        Box::pin(async move {
            pending
                .await
                .map(|()| Vec::new())
                .map_err(|error| failure_of(error, backoff_max))
        })
    }

    fn timed_out(&self) -> Failure {
        Failure::new(
            FailureKind::Timeout,
            format!(
                "the write did not finish within the sink's timeout ({})",
                humantime::format_duration(self.timeout)
            ),
        )
    }
}

#[async_trait]
impl StageHandler for SinkHandler {
    async fn handle(&mut self, message: &Message) -> Outcome {
        match tokio::time::timeout(self.timeout, self.sink.write(message)).await {
            Ok(result) => self.outcome(result),
            Err(_) => Err(self.timed_out()),
        }
    }

    async fn handle_batch(&mut self, messages: &[Message]) -> Vec<Outcome> {
        self.pending.clear();
        match tokio::time::timeout(self.timeout, self.sink.accept_batch(messages)).await {
            Ok(results) => {
                let mut outcomes: Vec<Outcome> = Vec::with_capacity(messages.len());
                for result in results {
                    match result {
                        Ok(Accepted::Pending(pending)) => {
                            let later = self.later(pending);
                            self.pending.resize_with(outcomes.len(), || None);
                            self.pending.push(Some(later));
                            outcomes.push(Ok(Vec::new()));
                        }
                        Ok(Accepted::Written) => outcomes.push(self.outcome(Ok(()))),
                        Err(error) => outcomes.push(self.outcome(Err(error))),
                    }
                }
                // A sink that returned too few results: the rest failed.
                while outcomes.len() < messages.len() {
                    outcomes.push(Err(Failure::new(
                        FailureKind::Retry,
                        "the sink returned no result for this message",
                    )));
                }
                outcomes.truncate(messages.len());
                outcomes
            }
            Err(_) => messages.iter().map(|_| Err(self.timed_out())).collect(),
        }
    }

    fn take_pending(&mut self) -> Vec<Option<crate::engine::PendingOutcome>> {
        std::mem::take(&mut self.pending)
    }

    fn flush(&self) {
        self.sink.flush();
    }
}

/// A refused write as the failure the outcome table takes: `rejected`,
/// `retry` (after the target's `Retry-After`, capped at `backoff_max`) or
/// `unavailable`.
fn failure_of(error: SinkError, backoff_max: Duration) -> Failure {
    match error {
        SinkError::Rejected(reason) => Failure::new(FailureKind::Rejected, reason),
        SinkError::Retry { reason, after } => Failure {
            kind: FailureKind::Retry,
            message: reason,
            retry_after: after.map(|a| a.min(backoff_max)),
            state_read: Vec::new(),
        },
        SinkError::Unavailable(why) => Failure::new(FailureKind::Unavailable, why),
    }
}

#[cfg(test)]
mod tests {
    //! A sink stage through the real engine and embedded broker, with a
    //! scripted target: the outcome mapping and the hold of an outage,
    //! whatever the connector.

    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use crate::broker::embedded::{EmbeddedBroker, EmbeddedOptions};
    use crate::broker::{Broker, TopicSpec};
    use crate::config::Stage;
    use crate::connect::Health;
    use crate::dlq::Provenance;
    use crate::engine::{Engine, StageSetup};
    use crate::metrics::Metrics;

    /// Fails each message's first `outage` writes as unavailable; rejects
    /// payloads starting with `bad`; asks once for a retry on `slow`.
    struct Target {
        outage: u32,
        seen: Mutex<HashMap<String, u32>>,
        written: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl Sink for Target {
        async fn write(&self, message: &Message) -> Result<(), SinkError> {
            let tries = {
                let mut seen = self.seen.lock().expect("seen");
                let n = seen.entry(message.id.clone()).or_default();
                *n += 1;
                *n
            };
            if tries <= self.outage {
                return Err(SinkError::Unavailable("connection refused".into()));
            }
            if message.payload.starts_with(b"bad") {
                return Err(SinkError::Rejected("HTTP 400: no".into()));
            }
            if message.payload.starts_with(b"slow") && tries == self.outage + 1 {
                return Err(SinkError::Retry {
                    reason: "HTTP 429".into(),
                    after: Some(Duration::from_millis(20)),
                });
            }
            self.written
                .lock()
                .expect("written")
                .push(message.id.clone());
            Ok(())
        }
    }

    async fn run(
        yaml: &str,
        payloads: &[&str],
        outage: u32,
    ) -> (Arc<Target>, Vec<Provenance>, String) {
        let dir = tempfile::tempdir().expect("dir");
        let broker: Arc<dyn Broker> =
            EmbeddedBroker::open(EmbeddedOptions::new(dir.path())).expect("broker");
        for name in ["in", "p.s.dlq"] {
            broker
                .ensure_topic(&TopicSpec::new(name))
                .await
                .expect("topic");
        }
        let messages = payloads
            .iter()
            .enumerate()
            .map(|(i, p)| crate::broker::Message::new(format!("m{i}"), "in", p.as_bytes().to_vec()))
            .collect();
        broker.publish(messages).await.expect("publish");
        let stage: Stage = serde_saphyr::from_str(yaml).expect("a stage");
        let target = Arc::new(Target {
            outage,
            seen: Mutex::default(),
            written: Mutex::default(),
        });
        let metrics = Arc::new(Metrics::new());
        let ctx = Context {
            pipeline: "p".into(),
            name: "s".into(),
            metrics: metrics.clone(),
            health: Arc::new(Health::new()),
            data_dir: None,
        };
        let handlers = (0..stage.delivery.concurrency.get())
            .map(|_| {
                Box::new(SinkHandler::new(
                    target.clone(),
                    ctx.clone(),
                    stage.delivery.timeout.get(),
                    stage.delivery.retry.backoff.max.get(),
                )) as Box<dyn StageHandler>
            })
            .collect();
        let engine = Engine::start(
            broker.clone(),
            metrics.clone(),
            None,
            None,
            vec![StageSetup {
                pipeline: "p".into(),
                stage,
                shutdown_timeout: Duration::from_secs(5),
                handlers,
                plugin_sha256: None,
            }],
        )
        .await
        .expect("engine");
        let bad = payloads.iter().filter(|p| p.starts_with("bad")).count();
        for _ in 0..1000 {
            let written = target.written.lock().expect("written").len();
            let dead = broker.topic_stats("p.s.dlq").await.expect("stats").depth as usize;
            if written + dead >= payloads.len() && dead >= bad {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        engine.shutdown().await;
        let dead = broker
            .read("p.s.dlq", 1, 100, Duration::ZERO)
            .await
            .expect("read dlq")
            .iter()
            .filter_map(|s| Provenance::read(&s.message))
            .collect();
        (target, dead, metrics.encode())
    }

    const STAGE: &str = "name: s\nsubscribe: in\nplugin: ''\nretry: {max_attempts: 2, backoff: {initial: 10ms, max: 40ms}}\n";

    #[tokio::test]
    async fn an_outage_spends_no_attempts_and_refusals_follow_the_outcome_table() {
        let payloads = ["a", "bad one", "slow", "b"];
        // Five unavailable writes per message against two attempts: had an
        // outage spent attempts, every message would be dead-lettered.
        let (target, dead, metrics) = run(STAGE, &payloads, 5).await;
        let mut written = target.written.lock().expect("written").clone();
        written.sort();
        assert_eq!(written, ["m0", "m2", "m3"]);
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert_eq!(dead[0].kind, "rejected");
        assert_eq!(dead[0].error, "HTTP 400: no");
        assert_eq!(dead[0].attempts, 1);
        assert!(
            metrics.contains("outcome=\"unavailable\"} 20"),
            "every held write counted: {metrics}"
        );
        assert!(metrics.contains("outcome=\"retry\"} 1"), "{metrics}");
    }

    /// Takes every message as pending and answers them all after
    /// `after`, counting how often each was handed over.
    struct Later {
        after: Duration,
        taken: Mutex<HashMap<String, u32>>,
        /// Writes pending now, and the most at once.
        pending: Arc<std::sync::atomic::AtomicUsize>,
        most: std::sync::atomic::AtomicUsize,
    }

    #[async_trait]
    impl Sink for Later {
        async fn write(&self, _: &Message) -> Result<(), SinkError> {
            unreachable!("a batch stage")
        }

        async fn accept_batch(&self, messages: &[Message]) -> Vec<Result<Accepted, SinkError>> {
            use std::sync::atomic::Ordering::SeqCst;
            let mut taken = self.taken.lock().expect("taken");
            let after = self.after;
            let now = self.pending.fetch_add(messages.len(), SeqCst) + messages.len();
            self.most.fetch_max(now, SeqCst);
            messages
                .iter()
                .map(|m| {
                    *taken.entry(m.id.clone()).or_default() += 1;
                    let pending = self.pending.clone();
                    let later: Pending = Box::pin(async move {
                        tokio::time::sleep(after).await;
                        pending.fetch_sub(1, SeqCst);
                        Ok(())
                    });
                    Ok(Accepted::Pending(later))
                })
                .collect()
        }
    }

    #[tokio::test]
    async fn a_pending_write_keeps_its_lease_past_ack_wait_and_frees_the_slot() {
        let dir = tempfile::tempdir().expect("dir");
        let broker: Arc<dyn Broker> =
            EmbeddedBroker::open(EmbeddedOptions::new(dir.path())).expect("broker");
        for name in ["in", "p.s.dlq"] {
            broker
                .ensure_topic(&TopicSpec::new(name))
                .await
                .expect("topic");
        }
        let messages = (0..40)
            .map(|i| crate::broker::Message::new(format!("m{i}"), "in", b"x".to_vec()))
            .collect();
        broker.publish(messages).await.expect("publish");
        // One slot, batches of 10, a 1 s lease: the writes finish 2.5 s
        // after they are taken. Were the slot held until then, no more
        // than one batch would be pending at once; were the leases left to
        // run out, the messages would be delivered again.
        let stage: Stage = serde_saphyr::from_str(
            "name: s\nsubscribe: in\nplugin: ''\nack_wait: 1s\nbatch: {max: 10, wait: 10ms}\n",
        )
        .expect("a stage");
        let sink = Arc::new(Later {
            after: Duration::from_millis(2500),
            taken: Mutex::default(),
            pending: Arc::default(),
            most: std::sync::atomic::AtomicUsize::new(0),
        });
        let metrics = Arc::new(Metrics::new());
        let ctx = Context {
            pipeline: "p".into(),
            name: "s".into(),
            metrics: metrics.clone(),
            health: Arc::new(Health::new()),
            data_dir: None,
        };
        let handler = SinkHandler::new(
            sink.clone(),
            ctx,
            stage.delivery.timeout.get(),
            stage.delivery.retry.backoff.max.get(),
        );
        let engine = Engine::start(
            broker.clone(),
            metrics.clone(),
            None,
            None,
            vec![StageSetup {
                pipeline: "p".into(),
                stage,
                shutdown_timeout: Duration::from_secs(5),
                handlers: vec![Box::new(handler)],
                plugin_sha256: None,
            }],
        )
        .await
        .expect("engine");
        for _ in 0..1000 {
            if broker.topic_stats("in").await.expect("stats").depth == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        engine.shutdown().await;
        let taken = sink.taken.lock().expect("taken").clone();
        assert_eq!(taken.len(), 40);
        assert!(
            taken.values().all(|n| *n == 1),
            "a pending message was delivered again: {taken:?}"
        );
        let most = sink.most.load(std::sync::atomic::Ordering::SeqCst);
        assert!(
            most > 10,
            "one slot held at most one batch pending ({most}): the slot was not freed"
        );
    }

    #[tokio::test]
    async fn a_batch_sink_holds_only_the_items_whose_target_is_down() {
        let stage = format!("{STAGE}batch: {{max: 4, wait: 10ms}}\nconcurrency: 2\n");
        let payloads = ["a", "b", "bad", "c", "d", "e"];
        let (target, dead, _) = run(&stage, &payloads, 3).await;
        assert_eq!(target.written.lock().expect("written").len(), 5);
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].kind, "rejected");
    }
}
