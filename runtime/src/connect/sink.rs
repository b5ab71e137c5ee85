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
            Err(SinkError::Retry { reason, after }) => {
                self.ctx.health.up(&self.ctx.metrics, label);
                Err(Failure {
                    kind: FailureKind::Retry,
                    message: reason,
                    retry_after: after.map(|a| a.min(self.backoff_max)),
                    state_read: Vec::new(),
                })
            }
            Err(SinkError::Unavailable(why)) => {
                self.ctx.health.down(&self.ctx.metrics, label, &why);
                Err(Failure::new(FailureKind::Unavailable, why))
            }
        }
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
        match tokio::time::timeout(self.timeout, self.sink.write_batch(messages)).await {
            Ok(results) => {
                let mut outcomes: Vec<Outcome> =
                    results.into_iter().map(|r| self.outcome(r)).collect();
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
        };
        let handlers = (0..stage.concurrency.get())
            .map(|_| {
                Box::new(SinkHandler::new(
                    target.clone(),
                    ctx.clone(),
                    stage.timeout.get(),
                    stage.retry.backoff.max.get(),
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
