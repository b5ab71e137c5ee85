//! What happens to a delivery after its handler returns: the outcome
//! table, in one place.
//!
//! | outcome | action |
//! |---|---|
//! | `ok(emits)` | publish the emits with deterministic ids (and the input's trace context) and ack, in one `complete` (with dedup: and record the key COMPLETED) |
//! | dedup: the key was already handled | republish its recorded outputs (same ids) and ack: outcome `duplicate` |
//! | retryable failure, attempts left | nak with backoff (or retry in place, for ordered stages) |
//! | retryable failure, attempts used up | dead-letter with provenance |
//! | permanent failure (`rejected`, `output-too-large`, `undeclared-topic`) | dead-letter now |
//! | the broker refuses an output as too large | `output-too-large`: dead-letter now |
//! | the broker refuses the outputs otherwise | `publish-failed`: retry like any retryable failure |

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{backoff, ids};
use crate::broker::Ticket;
use crate::broker::{Broker, BrokerError, Completion, Delivery, Message, now_millis};
use crate::config::{Backoff, Stage};
use crate::dedup::{DedupStore, REPUBLISH_WITHIN};
use crate::dlq::{self, Provenance};
use crate::failure::{Failure, FailureKind};
use crate::metrics::{Metrics, OutcomeLabels, StageLabels, TopicLabels};
use crate::plugin::{Emit, Outcome};
use crate::state::StateWrites;
use crate::trace;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;

/// What the caller does next with a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Settled (acked, naked or dead-lettered); nothing more to do.
    Done,
    /// Retry in place after this delay (ordered stages only).
    RetryAfter(Duration),
    /// The target is unavailable: keep the lease and try again after this
    /// delay, in place, without counting an attempt.
    Hold(Duration),
    /// The call's state moved under it ([`FailureKind::StateConflict`]):
    /// keep the lease and run it again after this short delay, in place,
    /// without counting an attempt. Some call of those that conflicted
    /// committed, so the stage as a whole always moves on.
    Again(Duration),
}

/// The most a call waits before running again after a state conflict:
/// the wait is random below it, so calls that collided spread out.
const CONFLICT_JITTER_MS: u64 = 20;

/// How long a settle (outputs + ack, or DLQ copy + term) is retried while
/// the broker is unavailable before the attempt counts as failed.
const BROKER_RETRY_BUDGET: Duration = Duration::from_secs(60);

/// The most first-failure times remembered; beyond it the map is cleared
/// (a DLQ entry then reports its last failure as its first).
const MAX_REMEMBERED_FAILURES: usize = 100_000;

/// Settles deliveries of one stage.
pub(super) struct Settler {
    pipeline: String,
    stage: String,
    dlq_topic: String,
    max_attempts: u32,
    backoff: Backoff,
    /// `retry.schedule`: explicit waits, in place of `backoff` when given.
    schedule: Vec<Duration>,
    broker: Arc<dyn Broker>,
    metrics: Arc<Metrics>,
    /// When each failing message first failed, by message id.
    first_failures: Mutex<HashMap<String, u64>>,
    /// This stage's metric handles for the per-message path, looked up once
    /// here rather than by building label strings for every message.
    ok: Counter,
    handler_duration: Histogram,
    /// The same durations for the console's history.
    handler_window: Arc<crate::metrics::LatencyWindow>,
    /// `sluice_messages_published_total` of each declared output topic.
    published: Vec<(String, Counter)>,
    /// The stage's dedup store, when it deduplicates: it takes back the
    /// keys of failed attempts (a success records its key through
    /// [`Broker::complete`]).
    dedup: Option<Arc<dyn DedupStore>>,
}

impl Settler {
    pub(super) fn new(
        pipeline: &str,
        stage: &Stage,
        broker: Arc<dyn Broker>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let stage_labels = StageLabels {
            pipeline: pipeline.to_owned(),
            stage: stage.name.clone(),
        };
        let ok = metrics
            .processed
            .get_or_create(&OutcomeLabels {
                pipeline: pipeline.to_owned(),
                stage: stage.name.clone(),
                outcome: "ok".into(),
            })
            .clone();
        let handler_duration = metrics
            .handler_duration
            .get_or_create(&stage_labels)
            .clone();
        let published = stage
            .publish
            .iter()
            .map(|topic| {
                let counter = metrics
                    .published
                    .get_or_create(&TopicLabels {
                        topic: topic.clone(),
                    })
                    .clone();
                (topic.clone(), counter)
            })
            .collect();
        Settler {
            ok,
            handler_window: metrics.handler_window(pipeline, &stage.name),
            handler_duration,
            published,
            pipeline: pipeline.to_owned(),
            stage: stage.name.clone(),
            dlq_topic: stage.dlq_topic(pipeline),
            max_attempts: stage.delivery.retry.attempts().get(),
            backoff: stage.delivery.retry.backoff.clone(),
            schedule: stage
                .delivery
                .retry
                .schedule
                .iter()
                .flatten()
                .map(|wait| wait.get())
                .collect(),
            broker,
            metrics,
            first_failures: Mutex::new(HashMap::new()),
            dedup: None,
        }
    }

    /// Releases the dedup keys of failed attempts through `store`.
    pub(super) fn with_dedup(mut self, store: Arc<dyn DedupStore>) -> Self {
        self.dedup = Some(store);
        self
    }

    /// Records one handler call's duration.
    pub(super) fn observe(&self, elapsed: Duration) {
        self.handler_duration.observe(elapsed.as_secs_f64());
        self.handler_window.record(elapsed.as_secs_f64());
    }

    /// Acks a delivery this stage does not handle (a redrive for another stage).
    pub(super) async fn skip(&self, delivery: &Delivery) {
        match self.broker.ack(&delivery.receipt).await {
            Ok(()) => self.count("skipped"),
            Err(err) => {
                tracing::warn!(seq = delivery.seq, error = %err, "could not ack a skipped redrive; it will be redelivered")
            }
        }
    }

    /// Applies the outcome table to one attempt (`attempt` is 1-based).
    /// `ticket` holds the message's dedup key, if the stage deduplicates:
    /// a success records it COMPLETED, a failure gives it back.
    pub(super) async fn settle(
        &self,
        delivery: &Delivery,
        attempt: u32,
        outcome: Outcome,
        retry_in_place: bool,
        ticket: Option<&Ticket>,
        state: Option<StateWrites>,
    ) -> Next {
        let failure = match outcome {
            Ok(emits) => match self.complete(delivery, emits, ticket, state).await {
                Ok(()) => {
                    crate::otel::outcome("ok", None);
                    return Next::Done;
                }
                Err(failure) => failure,
            },
            Err(failure) => failure,
        };
        if let (Some(ticket), Some(store)) = (ticket, &self.dedup)
            && let Err(err) = store.release(ticket).await
        {
            // Not lost: the key's lease runs out and the retry takes it.
            tracing::warn!(seq = delivery.seq, error = %err, "could not release a dedup key; its retry waits for the lease to end");
        }
        self.fail(delivery, attempt, failure, retry_in_place).await
    }

    /// Settles a delivery whose dedup key was already handled: republishes
    /// the recorded outputs (with their original ids, so the broker's
    /// duplicate window drops those that arrived) while the record is
    /// recent enough for that window to recognise them, and acks.
    pub(super) async fn duplicate(
        &self,
        delivery: &Delivery,
        attempt: u32,
        outputs: Option<Vec<Message>>,
        completed_at: u64,
        retry_in_place: bool,
    ) -> Next {
        let age = Duration::from_millis(now_millis().saturating_sub(completed_at));
        let outputs = outputs
            .filter(|_| age < REPUBLISH_WITHIN)
            .unwrap_or_default();
        let completion = Completion::new(&delivery.receipt, outputs);
        let result = self.patiently(|| self.broker.complete(&completion)).await;
        match result {
            Ok(()) | Err(BrokerError::LeaseLost(_)) => {
                crate::otel::outcome("duplicate", None);
                self.count("duplicate");
                self.forget_failure(&delivery.message.id);
                Next::Done
            }
            Err(err) => {
                let failure = Failure::new(
                    FailureKind::PublishFailed,
                    format!("settling a duplicate failed: {err}"),
                );
                self.fail(delivery, attempt, failure, retry_in_place).await
            }
        }
    }

    /// Publishes the emits and acks, as one broker step (with the dedup
    /// record, when there is a ticket, and the handler's state writes:
    /// they travel in the [`Completion`]).
    async fn complete(
        &self,
        delivery: &Delivery,
        emits: Vec<Emit>,
        ticket: Option<&Ticket>,
        state: Option<StateWrites>,
    ) -> Result<(), Failure> {
        let mut completion = self.completion(delivery, emits, ticket);
        completion.state = state;
        let result = self.patiently(|| self.broker.complete(&completion)).await;
        self.completed(delivery, &completion, result)
    }

    /// Completes the successes of a batch together: one broker step for
    /// all of them where the broker can (the embedded broker's committer
    /// takes them as one op), rather than a step each. Returns, per item,
    /// what [`Settler::complete`] would have; an item whose completion
    /// failed still needs [`Settler::failed`].
    pub(super) async fn complete_all(
        &self,
        items: Vec<(&Delivery, Vec<Emit>)>,
    ) -> Vec<Result<(), Failure>> {
        let (deliveries, completions): (Vec<&Delivery>, Vec<Completion>) = items
            .into_iter()
            .map(|(delivery, emits)| (delivery, self.completion(delivery, emits, None)))
            .unzip();
        let results = self.patiently_all(&completions).await;
        deliveries
            .into_iter()
            .zip(&completions)
            .zip(results)
            .map(|((delivery, completion), result)| self.completed(delivery, completion, result))
            .collect()
    }

    /// Settles a delivery whose completion failed (see
    /// [`Settler::complete_all`]): retry, or dead-letter.
    pub(super) async fn failed(&self, delivery: &Delivery, failure: Failure) -> Next {
        self.fail(delivery, delivery.attempt, failure, false).await
    }

    /// The completion of `delivery`: its emits as outputs with their
    /// deterministic ids, and its ack.
    fn completion(
        &self,
        delivery: &Delivery,
        emits: Vec<Emit>,
        ticket: Option<&Ticket>,
    ) -> Completion {
        // Output ids derive from the input's id; under dedup from its key,
        // so that if a crash strands a key between the outputs and the
        // record, and a copy of the message under another id runs the
        // handler again, its outputs still carry the same ids and the
        // broker's duplicate window drops them.
        let basis = ticket.map_or(delivery.message.id.as_str(), |t| t.key.as_str());
        // With trace export on, the outputs' parent is this attempt's span
        // (the next stage's span is its child); else the input's context.
        let outputs: Vec<Message> = crate::otel::with_current(|attempt| {
            let context = attempt.unwrap_or(&delivery.message.headers);
            emits
                .into_iter()
                .enumerate()
                .map(|(index, mut emit)| {
                    // A redrive target addresses this stage only; an output
                    // that copied its input's headers must not carry it on, or
                    // the next stage would skip the output as not its own.
                    emit.headers.retain(|(name, _)| name != dlq::REDRIVE_TO);
                    // The output goes on in its input's trace, whether or not
                    // the handler copied the headers; a batch item's outputs
                    // in their own input's.
                    trace::carry(context, &mut emit.headers);
                    (index, emit)
                })
                .map(|(index, emit)| Message {
                    id: ids::emit_id(&self.pipeline, &self.stage, basis, index),
                    topic: emit.topic,
                    key: emit.key,
                    headers: emit.headers,
                    payload: Bytes::from(emit.payload),
                    published_at: 0,
                })
                .collect()
        });
        Completion {
            receipt: delivery.receipt.clone(),
            outputs,
            ticket: ticket.cloned(),
            state: None,
        }
    }

    /// What the broker's answer to a completion means: counted as `ok`,
    /// or the failure to retry or dead-letter.
    fn completed(
        &self,
        delivery: &Delivery,
        completion: &Completion,
        result: Result<(), BrokerError>,
    ) -> Result<(), Failure> {
        match result {
            Ok(()) => {
                self.ok.inc();
                let mut per_topic: Vec<(&str, u64)> = Vec::new();
                for output in &completion.outputs {
                    match per_topic.iter_mut().find(|(t, _)| *t == output.topic) {
                        Some((_, n)) => *n += 1,
                        None => per_topic.push((&output.topic, 1)),
                    }
                }
                for (topic, n) in per_topic {
                    match self.published.iter().find(|(t, _)| t == topic) {
                        Some((_, counter)) => {
                            counter.inc_by(n);
                        }
                        None => self.metrics.count_published(topic, n),
                    }
                }
                self.forget_failure(&delivery.message.id);
                Ok(())
            }
            Err(BrokerError::LeaseLost(why)) => {
                // Another delivery of this message owns it now; its outcome
                // counts, this one changed nothing.
                tracing::warn!(seq = delivery.seq, %why, "lease lost before completing; outputs discarded");
                Ok(())
            }
            // The broker refuses the same output on every attempt: retrying
            // would only run the handler `max_attempts` times to end in the
            // DLQ anyway, reported as a publish failure, which it is not.
            Err(BrokerError::PayloadTooLarge(why)) => Err(Failure::new(
                FailureKind::OutputTooLarge,
                too_large(&completion.outputs, &why),
            )),
            // Likewise a delay the broker cannot read (the plugin worker
            // checks first; this is the last line).
            Err(BrokerError::BadMessage(why)) => Err(Failure::new(FailureKind::Rejected, why)),
            // Nothing was written: the call runs again on what the store
            // holds now.
            Err(BrokerError::StateConflict(why)) => {
                Err(Failure::new(FailureKind::StateConflict, why))
            }
            Err(err) => Err(Failure::new(
                FailureKind::PublishFailed,
                format!("publishing outputs failed: {err}"),
            )),
        }
    }

    async fn fail(
        &self,
        delivery: &Delivery,
        attempt: u32,
        failure: Failure,
        retry_in_place: bool,
    ) -> Next {
        let now = now_millis();
        let first = *self
            .first_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(delivery.message.id.clone())
            .or_insert(now);
        if failure.kind == FailureKind::StateConflict {
            self.count(failure.kind.as_str());
            crate::otel::outcome("state-conflict", Some(&failure));
            tracing::debug!(id = %delivery.message.id, seq = delivery.seq, error = %failure.message, "state conflict; the call runs again");
            return Next::Again(Duration::from_millis(fastrand::u64(1..=CONFLICT_JITTER_MS)));
        }
        if failure.kind == FailureKind::Unavailable {
            // Not the message's fault, and nothing is lost by waiting: the
            // lease is kept (the heartbeat extends it) and no attempt is
            // spent, however long the outage lasts. The sink logs the
            // outage once; this only counts it.
            self.count(failure.kind.as_str());
            crate::otel::outcome("held", Some(&failure));
            return Next::Hold(failure.retry_after.unwrap_or(self.backoff.initial.get()));
        }
        let retryable = failure.kind.is_retryable();
        if retryable && attempt < self.max_attempts {
            let delay = failure
                .retry_after
                .unwrap_or_else(|| self.retry_delay(attempt));
            self.count(failure.kind.as_str());
            crate::otel::outcome("retry", Some(&failure));
            tracing::warn!(
                id = %delivery.message.id,
                seq = delivery.seq,
                attempt,
                max_attempts = self.max_attempts,
                kind = %failure.kind,
                error = %failure.message,
                retry_in = ?delay,
                "attempt failed; will retry"
            );
            if retry_in_place {
                return Next::RetryAfter(delay);
            }
            if let Err(err) = self.broker.nak(&delivery.receipt, delay).await {
                tracing::warn!(seq = delivery.seq, error = %err, "nak failed; the lease will expire and the message come back");
            }
            return Next::Done;
        }
        let provenance = Provenance {
            pipeline: self.pipeline.clone(),
            stage: self.stage.clone(),
            source_topic: delivery.message.topic.clone(),
            source_seq: delivery.seq,
            original_id: delivery.message.id.clone(),
            attempts: attempt,
            kind: failure.kind.as_str().to_owned(),
            error: failure.message.clone(),
            first_failure: first,
            last_failure: now,
        };
        let mut entry = delivery.message.clone();
        entry.topic.clone_from(&self.dlq_topic);
        provenance.stamp(&mut entry);
        crate::dlq::stamp_state_read(&mut entry, &failure.state_read);
        // The dead letter sits in the failed attempt's trace (one started
        // by it, if the message came without a context).
        crate::otel::reparent(&mut entry.headers);
        crate::otel::outcome("dead-lettered", Some(&failure));
        tracing::error!(
            id = %delivery.message.id,
            seq = delivery.seq,
            attempts = attempt,
            kind = %failure.kind,
            error = %failure.message,
            dlq = %self.dlq_topic,
            "dead-lettering"
        );
        let result = self
            .patiently(|| self.broker.dead_letter(&delivery.receipt, entry.clone()))
            .await;
        match result {
            Ok(()) => {
                self.count("dead-lettered");
                self.metrics
                    .count_dead_letter(&self.pipeline, &self.stage, failure.kind.as_str());
                self.metrics.count_published(&self.dlq_topic, 1);
                self.forget_failure(&delivery.message.id);
                Next::Done
            }
            Err(BrokerError::LeaseLost(why)) => {
                tracing::warn!(seq = delivery.seq, %why, "lease lost before dead-lettering");
                Next::Done
            }
            Err(err) => {
                // Nothing is dropped: the message stays with the broker and
                // comes back; the next attempt dead-letters it again.
                let delay = self.retry_delay(attempt);
                tracing::error!(seq = delivery.seq, error = %err, retry_in = ?delay, "dead-lettering failed; will retry");
                if retry_in_place {
                    return Next::RetryAfter(delay);
                }
                if let Err(err) = self.broker.nak(&delivery.receipt, delay).await {
                    tracing::warn!(seq = delivery.seq, error = %err, "nak failed; the lease will expire and the message come back");
                }
                Next::Done
            }
        }
    }

    /// Runs a settling broker call, retrying it while the broker is
    /// unavailable (a lost connection, a stream electing a new leader) for
    /// up to [`BROKER_RETRY_BUDGET`]. Retrying here re-runs neither the
    /// handler nor uses up a delivery, so a broker hiccup does not push
    /// healthy messages towards the DLQ. The lease is kept alive meanwhile
    /// by the stage's heartbeat.
    async fn patiently<F, Fut>(&self, call: F) -> Result<(), BrokerError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), BrokerError>>,
    {
        let started = Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            match call().await {
                Err(BrokerError::Unavailable(why))
                    if started.elapsed() + pause < BROKER_RETRY_BUDGET =>
                {
                    tracing::warn!(%why, retry_in = ?pause, "the broker could not take a settle; retrying it");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                other => return other,
            }
        }
    }

    /// [`Settler::patiently`] for several completions at once: those the
    /// broker answers `Unavailable` are tried again together, within the
    /// same budget; every other answer is final.
    async fn patiently_all(&self, completions: &[Completion]) -> Vec<Result<(), BrokerError>> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(100);
        let mut results: Vec<Result<(), BrokerError>> = self.broker.complete_all(completions).await;
        loop {
            let waiting: Vec<usize> = results
                .iter()
                .enumerate()
                .filter(|(_, r)| matches!(r, Err(BrokerError::Unavailable(_))))
                .map(|(i, _)| i)
                .collect();
            if waiting.is_empty() || started.elapsed() + pause >= BROKER_RETRY_BUDGET {
                return results;
            }
            if let Some(Err(BrokerError::Unavailable(why))) = results.get(waiting[0]) {
                tracing::warn!(%why, settles = waiting.len(), retry_in = ?pause, "the broker could not take a batch's settles; retrying them");
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
            let again: Vec<Completion> = waiting.iter().map(|&i| completions[i].clone()).collect();
            for (i, result) in waiting
                .into_iter()
                .zip(self.broker.complete_all(&again).await)
            {
                results[i] = result;
            }
        }
    }

    /// Counts a failed attempt that is not settled here (a batch item held
    /// while its target is unavailable).
    pub(super) fn count_failure(&self, kind: FailureKind) {
        self.count(kind.as_str());
    }

    /// The wait before the retry after failed attempt `attempt`: the
    /// `schedule`'s entry when there is one, else the backoff.
    fn retry_delay(&self, attempt: u32) -> Duration {
        backoff::scheduled(&self.schedule, attempt)
            .unwrap_or_else(|| backoff::delay(&self.backoff, attempt))
    }

    /// The longest pause between tries while a target is unavailable.
    pub(super) fn hold_max(&self) -> Duration {
        self.backoff.max.get()
    }

    fn count(&self, outcome: &str) {
        self.metrics
            .count_processed(&self.pipeline, &self.stage, outcome);
    }

    fn forget_failure(&self, id: &str) {
        let mut map = self
            .first_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if map.remove(id).is_none() && map.len() > MAX_REMEMBERED_FAILURES {
            map.clear();
        }
    }
}

/// Why outputs the broker refused as too large are dead-lettered: the
/// broker's own words (which name its limit), the size of the largest
/// output if they do not give it, and the remedy if they do not name it.
fn too_large(outputs: &[Message], why: &str) -> String {
    let largest = outputs
        .iter()
        .max_by_key(|m| m.payload.len())
        .filter(|m| !why.contains(&m.payload.len().to_string()))
        .map(|m| {
            format!(
                "its largest emit, to `{}`, has a payload of {} bytes; ",
                m.topic,
                m.payload.len()
            )
        })
        .unwrap_or_default();
    let remedy = if why.contains("claim_check") {
        ""
    } else {
        "; payloads this large need a claim_check whose max_payload fits them"
    };
    format!(
        "the handler's output is too large for the broker, so no retry can succeed: {largest}{why}{remedy}"
    )
}
