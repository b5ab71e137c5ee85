//! The source seam and the one loop every source runs in.
//!
//! A connector implements [`Source`]: read a batch, acknowledge it. This
//! file does the rest, the same way for every upstream:
//!
//! 1. **Backpressure**: while the topic (or its slowest subscriber) holds
//!    `high_water_mark` messages, read nothing; otherwise read at most the
//!    room left, so the depth never passes the mark. The data waits
//!    upstream.
//! 2. **Publish durably**, each message with the id `<source>:<upstream
//!    id>`: a message read again after a crash before the ack collapses in
//!    the broker's duplicate window (effectively-once into the topic).
//!    An upstream message that cannot become a message (a header no broker
//!    can carry) goes to the source's dead-letter topic with the reason.
//! 3. **Then acknowledge upstream.** A publish that fails is retried
//!    (the broker is down or full) until it succeeds or shutdown comes;
//!    only a durable publish is ever acknowledged.
//! 4. **Outages**: an upstream error reconnects forever with backoff,
//!    logged once per outage and shown by readiness and metrics.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::watch;

use super::{Capabilities, Context};
use crate::broker::{Broker, BrokerError, Message, backlog, check_portable};
use crate::dlq::Provenance;

/// One message read from upstream, not yet acknowledged there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceMessage {
    /// The upstream's identity of it (a stream entry id, an outbox row
    /// id). The topic message's id is `<source>:<upstream_id>`.
    pub upstream_id: String,
    /// Its key.
    pub key: Option<String>,
    /// Its headers.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub payload: Bytes,
    /// Why it cannot become a message as it is (a missing payload field):
    /// it is dead-lettered with this reason, then acknowledged upstream.
    pub problem: Option<String>,
}

impl SourceMessage {
    /// A message with no key, headers or problem.
    pub fn new(upstream_id: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        SourceMessage {
            upstream_id: upstream_id.into(),
            key: None,
            headers: Vec::new(),
            payload: payload.into(),
            problem: None,
        }
    }
}

/// Why a source could not read or acknowledge.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SourceError {
    /// The upstream cannot be reached, or failed the request. The runner
    /// waits with backoff and tries again (the source reconnects). The
    /// text must carry no password: scrub it with
    /// [`SecretUrl::scrub`](super::SecretUrl::scrub).
    #[error("{0}")]
    Unavailable(String),
}

/// An upstream that messages are read from. The runner calls `read`, then
/// publishes, then `ack`: one read in flight at a time.
#[async_trait]
pub trait Source: Send {
    /// What the upstream can do.
    fn capabilities(&self) -> Capabilities;

    /// Reads up to `max` messages (at least 1), waiting up to `wait` for
    /// the first. Connects first if it is not connected. Messages a dead
    /// reader left unacknowledged upstream are reclaimed here too.
    async fn read(&mut self, max: usize, wait: Duration)
    -> Result<Vec<SourceMessage>, SourceError>;

    /// Acknowledges upstream everything the last `read` returned. Called
    /// only once all of it is durably published.
    async fn ack(&mut self) -> Result<(), SourceError>;

    /// Gives back what the last `read` returned without acknowledging it
    /// (a rollback), so it is read again. Called when shutdown comes
    /// before the publish was durable.
    async fn release(&mut self) {}

    /// How many messages wait upstream, if the upstream can tell
    /// ([`Capabilities::lag`]).
    async fn lag(&mut self) -> Option<u64> {
        None
    }
}

/// Everything one running source needs.
pub struct SourceSetup {
    /// Its pipeline, name, metrics and health.
    pub ctx: Context,
    /// The connector.
    pub source: Box<dyn Source>,
    /// The topic it publishes into.
    pub topic: String,
    /// Where upstream messages that cannot become messages go.
    pub dlq_topic: String,
    /// The topic's `high_water_mark`.
    pub high_water_mark: Option<u64>,
    /// The consumers of the topic (the slowest one's backlog counts).
    pub subscribers: Vec<String>,
    /// The most messages one read takes.
    pub read_max: usize,
}

/// How long the runner waits for upstream messages in one read before it
/// checks for shutdown and backpressure again.
const READ_WAIT: Duration = Duration::from_secs(1);
/// The first and the longest pause after an upstream or broker error.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How often a source at its topic's high-water mark looks again.
const FULL_POLL: Duration = Duration::from_millis(50);
/// How often lag is asked for.
const LAG_EVERY: Duration = Duration::from_secs(5);

/// Runs one source until `stop` turns true. A read that is published and
/// acknowledged when stop comes is finished; a publish still failing then
/// is given back upstream (released), never acknowledged.
pub async fn run(setup: SourceSetup, broker: Arc<dyn Broker>, mut stop: watch::Receiver<bool>) {
    // The connector apart, so the rest can be shared across awaits while
    // the connector is borrowed mutably.
    let SourceSetup {
        ctx,
        mut source,
        topic,
        dlq_topic,
        high_water_mark,
        subscribers,
        read_max,
    } = setup;
    let setup = Route {
        ctx,
        topic,
        dlq_topic,
        high_water_mark,
        subscribers,
        read_max,
    };
    let label = setup.ctx.label();
    setup.ctx.metrics.connector_started(&label);
    let mut pause = RETRY_MIN;
    let mut lag_at = tokio::time::Instant::now();
    while !*stop.borrow() {
        let room = match room(&setup, &broker).await {
            Ok(0) => {
                if sleep_or_stop(FULL_POLL, &mut stop).await {
                    break;
                }
                continue;
            }
            Ok(room) => room,
            Err(err) => {
                tracing::warn!(source = %label, error = %err, "cannot read the topic's backlog; waiting");
                if sleep_or_stop(RETRY_MAX, &mut stop).await {
                    break;
                }
                continue;
            }
        };
        let read = tokio::select! {
            read = source.read(room.min(setup.read_max).max(1), READ_WAIT) => read,
            _ = stop.wait_for(|s| *s) => break,
        };
        let messages = match read {
            Ok(messages) => {
                setup.ctx.health.up(&setup.ctx.metrics, &label);
                pause = RETRY_MIN;
                messages
            }
            Err(SourceError::Unavailable(why)) => {
                setup.ctx.health.down(&setup.ctx.metrics, &label, &why);
                if sleep_or_stop(pause, &mut stop).await {
                    break;
                }
                pause = (pause * 2).min(RETRY_MAX);
                continue;
            }
        };
        if lag_at.elapsed() >= LAG_EVERY {
            lag_at = tokio::time::Instant::now();
            if let Some(lag) = source.lag().await {
                setup
                    .ctx
                    .metrics
                    .set_source_lag(&setup.ctx.pipeline, &setup.ctx.name, lag);
            }
        }
        if messages.is_empty() {
            continue;
        }
        let count = messages.len() as u64;
        let batch = to_messages(&setup, messages);
        if !publish_until_durable(&setup, &broker, batch, &mut stop).await {
            source.release().await;
            break;
        }
        // Acked upstream only now. A failed ack is not a loss: the
        // messages come back (a reclaim, a rolled-back transaction) and
        // their ids collapse in the duplicate window.
        if let Err(SourceError::Unavailable(why)) = source.ack().await {
            setup.ctx.health.down(&setup.ctx.metrics, &label, &why);
            if sleep_or_stop(pause, &mut stop).await {
                break;
            }
            pause = (pause * 2).min(RETRY_MAX);
            continue;
        }
        setup
            .ctx
            .metrics
            .count_source(&setup.ctx.pipeline, &setup.ctx.name, count);
    }
    tracing::debug!(source = %label, "source stopped");
}

/// A running source's settings, without its connector.
struct Route {
    ctx: Context,
    topic: String,
    dlq_topic: String,
    high_water_mark: Option<u64>,
    subscribers: Vec<String>,
    read_max: usize,
}

/// How many messages the topic takes before its high-water mark
/// (`usize::MAX` without one).
async fn room(setup: &Route, broker: &Arc<dyn Broker>) -> Result<usize, BrokerError> {
    let Some(mark) = setup.high_water_mark else {
        return Ok(usize::MAX);
    };
    let depth = backlog(broker.as_ref(), &setup.topic, &setup.subscribers).await?;
    Ok(usize::try_from(mark.saturating_sub(depth)).unwrap_or(usize::MAX))
}

/// The topic messages for a read: each with its deterministic id; one
/// that cannot be carried becomes a dead letter in the source's DLQ.
fn to_messages(setup: &Route, read: Vec<SourceMessage>) -> Vec<Message> {
    read.into_iter()
        .map(|m| {
            let id = format!("{}:{}", setup.ctx.name, m.upstream_id);
            let problem = m.problem.clone().or_else(|| {
                check_portable(m.key.as_deref(), &m.headers)
                    .err()
                    .map(|e| e.to_string())
            });
            let mut message = Message {
                id: id.clone(),
                topic: setup.topic.clone(),
                key: m.key,
                headers: m.headers,
                payload: m.payload,
                published_at: 0,
            };
            if let Some(problem) = problem {
                dead_letter(setup, &mut message, &problem);
            }
            message
        })
        .collect()
}

/// Turns `message` into its dead letter: into the source's DLQ topic, with
/// provenance naming the source and why. Headers that no broker can carry
/// are dropped from the copy, their text kept in the error.
fn dead_letter(setup: &Route, message: &mut Message, problem: &str) {
    tracing::warn!(source = %setup.ctx.label(), id = %message.id, reason = problem, "an upstream message cannot become a message; dead-lettered");
    let mut dropped = Vec::new();
    if message
        .key
        .as_deref()
        .is_some_and(|k| check_portable(Some(k), &[]).is_err())
    {
        dropped.push(format!("key {:?}", message.key.take().unwrap_or_default()));
    }
    message.headers.retain(|(name, value)| {
        let ok = check_portable(None, &[(name.clone(), value.clone())]).is_ok();
        if !ok {
            dropped.push(format!("header {name:?}={value:?}"));
        }
        ok
    });
    let error = if dropped.is_empty() {
        problem.to_owned()
    } else {
        format!("{problem}; not carried: {}", dropped.join(", "))
    };
    let now = crate::broker::now_millis();
    Provenance {
        pipeline: setup.ctx.pipeline.clone(),
        stage: setup.ctx.name.clone(),
        source_topic: setup.topic.clone(),
        source_seq: 0,
        original_id: message.id.clone(),
        attempts: 1,
        kind: crate::FailureKind::Rejected.as_str().to_owned(),
        error,
        first_failure: now,
        last_failure: now,
    }
    .stamp(message);
    message.topic = setup.dlq_topic.clone();
}

/// Publishes `batch` until the broker takes it, waiting out broker errors
/// (logged once). False if `stop` came first.
async fn publish_until_durable(
    setup: &Route,
    broker: &Arc<dyn Broker>,
    batch: Vec<Message>,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let mut pause = RETRY_MIN;
    let mut logged = false;
    loop {
        let publish = broker.publish(batch.clone());
        let result = tokio::select! {
            result = publish => result,
            _ = stop.wait_for(|s| *s) => return false,
        };
        match result {
            Ok(_) => {
                if logged {
                    tracing::info!(source = %setup.ctx.label(), "the broker takes the source's messages again");
                }
                return true;
            }
            Err(err) => {
                if !logged {
                    tracing::warn!(source = %setup.ctx.label(), error = %err, "publishing a read into the topic failed; it stays unacknowledged upstream and is retried");
                    logged = true;
                }
                if sleep_or_stop(pause, stop).await {
                    return false;
                }
                pause = (pause * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Sleeps `pause`; true if `stop` turned true meanwhile.
async fn sleep_or_stop(pause: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    let stopped = tokio::select! {
        () = tokio::time::sleep(pause) => false,
        _ = stop.wait_for(|s| *s) => true,
    };
    stopped || *stop.borrow()
}
