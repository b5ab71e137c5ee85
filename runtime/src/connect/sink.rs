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
            ctx,
            timeout,
            backoff_max,
        }
    }

    /// The outcome of one write, with its outage (or recovery) reported.
    fn outcome(&self, result: Result<(), SinkError>) -> Outcome {
        let label = self.ctx.label();
        match result {
            Ok(()) => {
                self.ctx.health.up(&self.ctx.metrics, &label);
                Ok(Vec::new())
            }
            Err(SinkError::Rejected(reason)) => {
                self.ctx.health.up(&self.ctx.metrics, &label);
                Err(Failure::new(FailureKind::Rejected, reason))
            }
            Err(SinkError::Retry { reason, after }) => {
                self.ctx.health.up(&self.ctx.metrics, &label);
                Err(Failure {
                    kind: FailureKind::Retry,
                    message: reason,
                    retry_after: after.map(|a| a.min(self.backoff_max)),
                })
            }
            Err(SinkError::Unavailable(why)) => {
                self.ctx.health.down(&self.ctx.metrics, &label, &why);
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
