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
//! 3. **Then acknowledge upstream**, read by read in the order they were
//!    made. A publish that fails is retried (the broker is down or full)
//!    until it succeeds or shutdown comes; only a durable publish is ever
//!    acknowledged. A connector that acknowledges message by message
//!    ([`Capabilities::per_message_ack`]) is read again while earlier
//!    reads are being made durable, so the upstream round trip and the
//!    broker's group commit overlap instead of taking turns; an upstream
//!    ordered by key ([`Capabilities::ordered_by_key`]) has its reads
//!    published one after another, so the topic keeps its order.
//! 4. **Outages**: an upstream error reconnects forever with backoff,
//!    logged once per outage and shown by readiness and metrics.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::StreamExt as _;
use futures_util::stream::FuturesOrdered;
use tokio::sync::{oneshot, watch};

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
/// publishes, then `ack`, and acknowledges reads in the order it made
/// them. With [`Source::reads_in_flight`] above 1 it reads again before
/// the earlier reads are acknowledged.
#[async_trait]
pub trait Source: Send {
    /// What the upstream can do.
    fn capabilities(&self) -> Capabilities;

    /// How many reads may be open (read, not yet acknowledged) at once.
    /// By default [`READS_IN_FLIGHT`] for an upstream that acknowledges
    /// message by message ([`Capabilities::per_message_ack`]), else 1: a
    /// read that holds something only its ack ends (a transaction) must
    /// be acknowledged before the next.
    fn reads_in_flight(&self) -> usize {
        if self.capabilities().per_message_ack {
            READS_IN_FLIGHT
        } else {
            1
        }
    }

    /// Reads up to `max` messages (at least 1), waiting up to `wait` for
    /// the first (not at all when `wait` is zero). Connects first if it is
    /// not connected. Messages a dead reader left unacknowledged upstream
    /// are reclaimed here too.
    async fn read(&mut self, max: usize, wait: Duration)
    -> Result<Vec<SourceMessage>, SourceError>;

    /// Acknowledges upstream everything the oldest read not yet
    /// acknowledged returned (reads that returned nothing do not count).
    /// Called only once all of it is durably published.
    async fn ack(&mut self) -> Result<(), SourceError>;

    /// Gives back every read not yet acknowledged (a rollback), so it is
    /// read again. Called when shutdown comes before the publish was
    /// durable.
    async fn release(&mut self) {}

    /// How many messages wait upstream, if the upstream can tell
    /// ([`Capabilities::lag`]).
    async fn lag(&mut self) -> Option<u64> {
        None
    }

    /// The lag per partition (`(partition, lag)`), for an upstream split
    /// into partitions (Kafka); asked right after [`lag`](Self::lag). The
    /// default has none.
    async fn partition_lag(&mut self) -> Vec<(String, u64)> {
        Vec::new()
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
    /// The upstream header mapped onto a delay, if any.
    pub delay_from: Option<crate::delay::DelayFrom>,
    /// The most messages one read takes.
    pub read_max: usize,
}

/// Reads open at once for an upstream that acknowledges message by
/// message: while one read's messages are made durable in the topic, the
/// next ones are already read (BENCHMARKS.md, the Redis round trip).
pub const READS_IN_FLIGHT: usize = 4;
/// How long the runner waits for upstream messages in one read before it
/// checks for shutdown and backpressure again.
const READ_WAIT: Duration = Duration::from_secs(1);
/// The first and the longest pause after an upstream or broker error.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How soon a source at its topic's high-water mark looks again: first
/// soon (a fast stage drains a mark's worth in milliseconds, and a fixed
/// 50 ms pause capped a mark of 1,000 at 20,000 messages a second), then
/// less often the longer the topic stays full.
const FULL_POLL_MIN: Duration = Duration::from_millis(2);
/// The longest pause between looks at a full topic.
const FULL_POLL_MAX: Duration = Duration::from_millis(50);
/// How often lag is asked for.
const LAG_EVERY: Duration = Duration::from_secs(5);

/// Runs one source until `stop` turns true. Reads whose publish is
/// durable when stop comes are acknowledged; the rest (a publish still
/// failing, or cut short) are given back upstream (released), never
/// acknowledged.
pub async fn run(setup: SourceSetup, broker: Arc<dyn Broker>, stop: watch::Receiver<bool>) {
    // The connector apart, so the rest can be shared across awaits while
    // the connector is borrowed mutably.
    let SourceSetup {
        ctx,
        source,
        topic,
        dlq_topic,
        high_water_mark,
        subscribers,
        delay_from,
        read_max,
    } = setup;
    let route = Route {
        ctx,
        topic,
        dlq_topic,
        high_water_mark,
        subscribers,
        delay_from,
        read_max,
    };
    let label = route.ctx.label();
    route.ctx.metrics.connector_started(&label);
    // Its count at zero from the first scrape, as every stage's.
    route
        .ctx
        .metrics
        .count_source(&route.ctx.pipeline, &route.ctx.name, 0);
    let mut runner = Runner {
        route: &route,
        broker: &broker,
        reads_in_flight: source.reads_in_flight().max(1),
        capabilities: source.capabilities(),
        last_publish: None,
        source,
        stop,
        publishing: FuturesOrdered::new(),
        held: 0,
        pause: RETRY_MIN,
        full_poll: FULL_POLL_MIN,
    };
    runner.run().await;
    tracing::debug!(source = %label, "source stopped");
}

/// A read's publish: whether it became durable, and how many messages it held.
type Publishing<'a> = Pin<Box<dyn Future<Output = (bool, u64)> + Send + 'a>>;

/// One running source's loop and what it has in flight.
struct Runner<'a> {
    route: &'a Route,
    broker: &'a Arc<dyn Broker>,
    source: Box<dyn Source>,
    stop: watch::Receiver<bool>,
    reads_in_flight: usize,
    /// What the upstream can do, asked once.
    capabilities: Capabilities,
    /// For an upstream ordered by key: the end of the newest publish,
    /// which the next one waits for.
    last_publish: Option<oneshot::Receiver<()>>,
    /// The reads being published, oldest first: acknowledged in this order.
    publishing: FuturesOrdered<Publishing<'a>>,
    /// Messages read and not yet acknowledged: they count against the
    /// high-water mark, wherever their publish stands.
    held: u64,
    /// The pause after the next upstream error.
    pause: Duration,
    /// The pause before looking again at a full topic.
    full_poll: Duration,
}

impl<'a> Runner<'a> {
    async fn run(&mut self) {
        let label = self.route.ctx.label();
        let mut lag_at = tokio::time::Instant::now();
        while !*self.stop.borrow() {
            // Acknowledge, in read order, every read already durable.
            while let Some(Some((durable, count))) = self.publishing.next().now_or_never() {
                if !self.ack_upstream(durable, count).await {
                    return self.give_back().await;
                }
            }
            let room = match room(self.route, self.broker).await {
                Ok(room) => room.saturating_sub(usize::try_from(self.held).unwrap_or(usize::MAX)),
                Err(err) => {
                    tracing::warn!(source = %label, error = %err, "cannot read the topic's backlog; waiting");
                    if self.sleep(RETRY_MAX).await {
                        break;
                    }
                    continue;
                }
            };
            if room == 0 || self.publishing.len() >= self.reads_in_flight {
                if self.publishing.is_empty() {
                    let pause = self.full_poll;
                    self.full_poll = (pause * 2).min(FULL_POLL_MAX);
                    if self.sleep(pause).await {
                        break;
                    }
                } else if !self.ack_oldest_upstream().await {
                    return self.give_back().await;
                }
                continue;
            }
            self.full_poll = FULL_POLL_MIN;
            // With reads in flight, do not wait for new messages: their
            // acknowledgements would wait too.
            let wait = if self.publishing.is_empty() {
                READ_WAIT
            } else {
                Duration::ZERO
            };
            let read = tokio::select! {
                read = self.source.read(room.min(self.route.read_max).max(1), wait) => read,
                _ = self.stop.wait_for(|s| *s) => break,
            };
            let messages = match read {
                Ok(messages) => {
                    self.route.ctx.health.up(&self.route.ctx.metrics, &label);
                    self.pause = RETRY_MIN;
                    messages
                }
                Err(SourceError::Unavailable(why)) => {
                    self.route
                        .ctx
                        .health
                        .down(&self.route.ctx.metrics, &label, &why);
                    if self.sleep(self.pause).await {
                        break;
                    }
                    self.pause = (self.pause * 2).min(RETRY_MAX);
                    continue;
                }
            };
            if self.capabilities.lag && lag_at.elapsed() >= LAG_EVERY {
                lag_at = tokio::time::Instant::now();
                if let Some(lag) = self.source.lag().await {
                    self.route.ctx.metrics.set_source_lag(
                        &self.route.ctx.pipeline,
                        &self.route.ctx.name,
                        lag,
                    );
                    let partitions = self.source.partition_lag().await;
                    if !partitions.is_empty() {
                        self.route.ctx.metrics.set_source_partition_lag(
                            &self.route.ctx.pipeline,
                            &self.route.ctx.name,
                            &partitions,
                        );
                    }
                }
            }
            if messages.is_empty() {
                // Nothing new: finish the oldest read before asking again.
                if !self.publishing.is_empty() && !self.ack_oldest_upstream().await {
                    return self.give_back().await;
                }
                continue;
            }
            let count = messages.len() as u64;
            self.held += count;
            let batch = to_messages(self.route, messages);
            let (route, broker, mut stop) = (self.route, self.broker, self.stop.clone());
            // An ordered upstream's reads enter the topic in read order:
            // each publish starts once the one before it has ended.
            let (after, done) = if self.capabilities.ordered_by_key {
                let (done, next) = oneshot::channel::<()>();
                (self.last_publish.replace(next), Some(done))
            } else {
                (None, None)
            };
            self.publishing.push_back(Box::pin(async move {
                if let Some(before) = after {
                    // An error means the one before was dropped (stop).
                    let _ = before.await;
                }
                let durable = publish_until_durable(route, broker, batch, &mut stop).await;
                if let Some(done) = done {
                    let _ = done.send(());
                }
                (durable, count)
            }));
        }
        self.give_back().await;
    }

    /// Waits for the oldest read's publish and acknowledges it upstream; false if stop
    /// came first.
    async fn ack_oldest_upstream(&mut self) -> bool {
        let next = tokio::select! {
            next = self.publishing.next() => next,
            _ = self.stop.wait_for(|s| *s) => return false,
        };
        match next {
            Some((durable, count)) => self.ack_upstream(durable, count).await,
            None => true,
        }
    }

    /// After the oldest read's publish ended: acknowledges it upstream if
    /// it is durable. False if it is not (stop came first).
    async fn ack_upstream(&mut self, durable: bool, count: u64) -> bool {
        if !durable {
            return false;
        }
        self.held = self.held.saturating_sub(count);
        // Acked upstream only now. A failed ack is not a loss: the
        // messages come back (a reclaim, a rolled-back transaction) and
        // their ids collapse in the duplicate window.
        if let Err(SourceError::Unavailable(why)) = self.source.ack().await {
            let label = self.route.ctx.label();
            self.route
                .ctx
                .health
                .down(&self.route.ctx.metrics, &label, &why);
            if self.sleep(self.pause).await {
                return true;
            }
            self.pause = (self.pause * 2).min(RETRY_MAX);
            return true;
        }
        self.route
            .ctx
            .metrics
            .count_source(&self.route.ctx.pipeline, &self.route.ctx.name, count);
        true
    }

    /// At shutdown: acknowledges the reads already durable, in order, and
    /// gives back the rest.
    async fn give_back(&mut self) {
        while let Some(next) = self.publishing.next().now_or_never() {
            match next {
                Some((true, count)) => {
                    self.ack_upstream(true, count).await;
                }
                Some((false, _)) => break,
                None => return,
            }
        }
        if !self.publishing.is_empty() {
            // Dropping the publishes in flight: each may still land in the
            // topic; read again, its ids collapse in the duplicate window.
            self.publishing = FuturesOrdered::new();
            self.last_publish = None;
            self.held = 0;
            self.source.release().await;
        }
    }

    /// Sleeps `pause`; true if stop came meanwhile.
    async fn sleep(&mut self, pause: Duration) -> bool {
        sleep_or_stop(pause, &mut self.stop).await
    }
}

/// A running source's settings, without its connector.
struct Route {
    ctx: Context,
    topic: String,
    dlq_topic: String,
    high_water_mark: Option<u64>,
    subscribers: Vec<String>,
    delay_from: Option<crate::delay::DelayFrom>,
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
        .map(|mut m| {
            let id = format!("{}:{}", setup.ctx.name, m.upstream_id);
            let now = crate::broker::now_millis();
            // An upstream `traceparent` goes on as ingest's does: valid,
            // or dropped (the trace restarts), never a reason to refuse.
            crate::trace::sanitize(&mut m.headers);
            let problem = m
                .problem
                .clone()
                .or_else(|| {
                    check_portable(m.key.as_deref(), &m.headers)
                        .err()
                        .map(|e| e.to_string())
                })
                .or_else(|| {
                    let mapped = match &setup.delay_from {
                        Some(from) => from.apply(&mut m.headers),
                        None => Ok(()),
                    };
                    mapped
                        .and_then(|()| crate::delay::due_in(&m.headers, now).map(|_| ()))
                        .err()
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
        // A dead letter is never delayed: its delay may be what was wrong.
        let ok = !crate::delay::is_delay_header(name)
            && check_portable(None, &[(name.clone(), value.clone())]).is_ok();
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
    let mut too_large = false;
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
                if too_large {
                    setup.ctx.health.up(&setup.ctx.metrics, &setup.ctx.label());
                }
                return true;
            }
            // Waiting will not shrink it, and dropping or cutting it would
            // lose data upstream already holds: the source stops here,
            // loudly (readiness and status name it), until the operator
            // gives the topic a claim check or the broker a larger limit.
            Err(BrokerError::PayloadTooLarge(why)) => {
                if !too_large {
                    too_large = true;
                    setup.ctx.health.down(
                        &setup.ctx.metrics,
                        &setup.ctx.label(),
                        &format!(
                            "a read holds a message the broker refuses as too large ({why}); it stays \
                             unacknowledged upstream and the source waits: give the topic a \
                             `claim_check`, or raise the broker's payload limit, and restart"
                        ),
                    );
                }
                if sleep_or_stop(pause, stop).await {
                    return false;
                }
                pause = (pause * 2).min(RETRY_MAX);
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

#[cfg(test)]
mod tests {
    //! The runner against the real embedded broker, with a scripted
    //! upstream: the runner's own promises (publish before ack, ids, the
    //! high-water mark, dead letters, outages), whatever the connector.

    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;
    use crate::broker::embedded::{EmbeddedBroker, EmbeddedOptions};
    use crate::broker::{ConsumerSpec, TopicSpec};
    use crate::connect::Health;
    use crate::metrics::Metrics;

    /// What the scripted upstream saw, shared with the test.
    #[derive(Default)]
    struct Log {
        /// Per `ack`, the upstream ids acked and how many messages the
        /// topic held at that moment.
        acks: Vec<(Vec<String>, u64)>,
        /// Ids still to be read.
        waiting: VecDeque<SourceMessage>,
        /// Reads that fail before the next one succeeds.
        failures: u32,
        /// The most reads open (read, not acked) at once.
        most_open: usize,
    }

    struct Scripted {
        log: Arc<Mutex<Log>>,
        broker: Arc<dyn Broker>,
        /// The ids of each open read, oldest first.
        open: VecDeque<Vec<String>>,
        reads_in_flight: usize,
    }

    #[async_trait]
    impl Source for Scripted {
        fn capabilities(&self) -> Capabilities {
            Capabilities::default()
        }

        fn reads_in_flight(&self) -> usize {
            self.reads_in_flight
        }

        async fn read(
            &mut self,
            max: usize,
            wait: Duration,
        ) -> Result<Vec<SourceMessage>, SourceError> {
            let batch: Vec<SourceMessage> = {
                let mut log = self.log.lock().expect("log");
                if log.failures > 0 {
                    log.failures -= 1;
                    return Err(SourceError::Unavailable("connection refused".into()));
                }
                let n = max.min(log.waiting.len());
                log.waiting.drain(..n).collect()
            };
            if batch.is_empty() {
                tokio::time::sleep(wait.min(Duration::from_millis(20))).await;
            }
            if !batch.is_empty() {
                self.open
                    .push_back(batch.iter().map(|m| m.upstream_id.clone()).collect());
                let mut log = self.log.lock().expect("log");
                log.most_open = log.most_open.max(self.open.len());
            }
            Ok(batch)
        }

        async fn ack(&mut self) -> Result<(), SourceError> {
            let depth = self
                .broker
                .topic_stats("in")
                .await
                .map(|s| s.depth)
                .unwrap_or_default();
            let acked = self.open.pop_front().expect("an ack follows a read");
            self.log.lock().expect("log").acks.push((acked, depth));
            Ok(())
        }
    }

    fn setup(
        broker: &Arc<dyn Broker>,
        log: &Arc<Mutex<Log>>,
        mark: Option<u64>,
        reads_in_flight: usize,
    ) -> (SourceSetup, Arc<Health>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let health = Arc::new(Health::new());
        let setup = SourceSetup {
            ctx: Context {
                pipeline: "p".into(),
                name: "src".into(),
                metrics: metrics.clone(),
                health: health.clone(),
                data_dir: None,
            },
            source: Box::new(Scripted {
                log: log.clone(),
                broker: broker.clone(),
                open: VecDeque::new(),
                reads_in_flight,
            }),
            topic: "in".into(),
            dlq_topic: "p.src.dlq".into(),
            high_water_mark: mark,
            subscribers: vec!["p.work".into()],
            delay_from: None,
            read_max: 10,
        };
        (setup, health, metrics)
    }

    async fn broker(dir: &std::path::Path) -> Arc<dyn Broker> {
        let broker: Arc<dyn Broker> =
            EmbeddedBroker::open(EmbeddedOptions::new(dir)).expect("open the broker");
        for name in ["in", "p.src.dlq"] {
            broker
                .ensure_topic(&TopicSpec {
                    subscribed: name == "in",
                    ..TopicSpec::new(name)
                })
                .await
                .expect("topic");
        }
        broker
            .ensure_consumer(&ConsumerSpec {
                name: "p.work".into(),
                topic: "in".into(),
                filter: Default::default(),
                ack_wait: Duration::from_secs(30),
                max_ack_pending: None,
                max_deliver: None,
            })
            .await
            .expect("consumer");
        broker
    }

    fn upstream(n: usize) -> VecDeque<SourceMessage> {
        (0..n)
            .map(|i| SourceMessage::new(format!("{i}"), format!("m{i}")))
            .collect()
    }

    #[tokio::test]
    async fn publishes_with_upstream_ids_before_acking_and_stops_at_the_mark() {
        let dir = tempfile::tempdir().expect("dir");
        let broker = broker(dir.path()).await;
        let log = Arc::new(Mutex::new(Log {
            waiting: upstream(95),
            ..Log::default()
        }));
        let (setup, _, metrics) = setup(&broker, &log, Some(40), 3);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(setup, broker.clone(), stopped));
        // Nothing consumes: the source fills the topic to its mark and waits.
        for _ in 0..200 {
            if metrics.source_total("p", "src") >= 40 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = stop.send(true);
        task.await.expect("runner");
        {
            let log = log.lock().expect("log");
            let acked: Vec<String> = log.acks.iter().flat_map(|(ids, _)| ids.clone()).collect();
            assert_eq!(acked.len(), 40, "acked exactly up to the mark");
            assert_eq!(log.waiting.len(), 55, "the rest waits upstream");
            let mut held = 0;
            for (ids, depth) in &log.acks {
                held += ids.len() as u64;
                // Every acked message was already in the topic at its ack.
                assert!(*depth >= held, "acked {held} with {depth} in the topic");
            }
        }
        let stored = broker
            .read("in", 1, 100, Duration::ZERO)
            .await
            .expect("read");
        assert_eq!(stored.len(), 40);
        assert!(stored.iter().all(|m| m.message.id.starts_with("src:")));
        assert_eq!(stored[0].message.id, "src:0");
    }

    #[tokio::test]
    async fn an_unportable_message_is_dead_lettered_and_an_outage_is_waited_out() {
        let dir = tempfile::tempdir().expect("dir");
        let broker = broker(dir.path()).await;
        let mut waiting = upstream(3);
        waiting[1]
            .headers
            .push(("bad".into(), "line\nbreak".into()));
        waiting[2].problem = Some("the entry has no `payload` field".into());
        let log = Arc::new(Mutex::new(Log {
            waiting,
            failures: 3,
            ..Log::default()
        }));
        let (setup, health, metrics) = setup(&broker, &log, None, 1);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(setup, broker.clone(), stopped));
        for _ in 0..300 {
            if metrics.source_total("p", "src") >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = stop.send(true);
        task.await.expect("runner");
        assert_eq!(metrics.source_total("p", "src"), 3);
        assert!(health.outages().is_empty(), "the outage ended");
        assert!(
            metrics
                .encode()
                .contains("sluice_connector_outages_total{connector=\"p/src\"} 1")
        );
        let good = broker
            .read("in", 1, 10, Duration::ZERO)
            .await
            .expect("read");
        assert_eq!(good.len(), 1);
        let dead = broker
            .read("p.src.dlq", 1, 10, Duration::ZERO)
            .await
            .expect("read dlq");
        assert_eq!(dead.len(), 2);
        let first = Provenance::read(&dead[0].message).expect("provenance");
        assert_eq!(first.kind, "rejected");
        assert!(
            first.error.contains("not carried: header \"bad\""),
            "{}",
            first.error
        );
        assert!(dead[0].message.header("bad").is_none());
        let second = Provenance::read(&dead[1].message).expect("provenance");
        assert!(
            second.error.contains("no `payload` field"),
            "{}",
            second.error
        );
        assert_eq!(dead[1].message.payload.as_ref(), b"m2");
    }

    #[tokio::test]
    async fn reads_in_flight_are_acked_in_read_order_each_after_its_publish() {
        let dir = tempfile::tempdir().expect("dir");
        let broker = broker(dir.path()).await;
        let log = Arc::new(Mutex::new(Log {
            waiting: upstream(95),
            ..Log::default()
        }));
        let (setup, _, metrics) = setup(&broker, &log, None, 3);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(setup, broker.clone(), stopped));
        for _ in 0..300 {
            if metrics.source_total("p", "src") >= 95 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = stop.send(true);
        task.await.expect("runner");
        let log = log.lock().expect("log");
        assert!(
            log.most_open >= 2,
            "the runner read again while a read was being published"
        );
        assert!(log.most_open <= 3, "never more reads open than allowed");
        let acked: Vec<String> = log.acks.iter().flat_map(|(ids, _)| ids.clone()).collect();
        let expected: Vec<String> = (0..95).map(|i| i.to_string()).collect();
        assert_eq!(acked, expected, "every read acked once, in read order");
        let mut held = 0;
        for (ids, depth) in &log.acks {
            held += ids.len() as u64;
            assert!(*depth >= held, "acked {held} with {depth} in the topic");
        }
    }
}
