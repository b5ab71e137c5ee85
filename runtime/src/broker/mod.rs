//! The broker seam: what the engine, the admin API and the CLI need from a
//! queue, and nothing more.
//!
//! Two implementations plug in here: [`embedded`] (durable, single node, the
//! default) and [`nats`] (JetStream, for several daemons). The trait is shaped by what both can
//! honour:
//!
//! - **Consumers** are durable and named `<pipeline>.<stage>`. Each has its
//!   own cursor and pending set on a topic, so fan-out is "several consumers
//!   on one topic" and a slow one never holds up another.
//! - **Deliveries** carry a [`Receipt`] leased for the consumer's `ack_wait`.
//!   The holder answers it exactly once: [`Broker::complete`] (publish the
//!   outputs, then ack), [`Broker::nak`] (redeliver after a delay),
//!   [`Broker::dead_letter`] (publish the DLQ copy, then term) or
//!   [`Broker::term`] ([`Broker::ack`] is a complete without outputs).
//!   [`Broker::in_progress`] extends the lease while a
//!   handler runs.
//! - **Completing is one step** so a broker that can (the embedded one) makes
//!   the outputs and the ack one transaction, and a broker that cannot (NATS)
//!   publishes with deterministic ids that its duplicate window drops on a
//!   replay.
//! - **Keys and headers** are ones NATS headers can carry ([`check_portable`]),
//!   checked where they enter a pipeline, so a pipeline that runs on one
//!   broker runs on the other.

pub mod embedded;
pub mod idempotency;
#[cfg(test)]
pub(crate) mod memory;
pub mod nats;
mod portable;
pub mod rates;
pub mod versions;

pub use portable::{Unportable, check_portable};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;

use crate::state::{StateReader, StateWrites};
use serde::{Deserialize, Serialize};

/// A message as a broker stores and delivers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Stable identity: the same across redeliveries, and the key of the
    /// broker's duplicate window on publish.
    pub id: String,
    /// The topic it was published to.
    pub topic: String,
    /// The partition/ordering key, if any.
    pub key: Option<String>,
    /// Metadata, in order; names may repeat.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub payload: Bytes,
    /// When it was first published, in milliseconds since the Unix epoch.
    /// A publish with 0 gets the broker's clock.
    pub published_at: u64,
}

impl Message {
    /// A message with no key or headers, stamped on publish.
    pub fn new(id: impl Into<String>, topic: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Message {
            id: id.into(),
            topic: topic.into(),
            key: None,
            headers: Vec::new(),
            payload: payload.into(),
            published_at: 0,
        }
    }

    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The bytes it holds in memory: payload, id, key and headers. What a
    /// stage's byte budget and a fetch's `max_bytes` count.
    pub fn size(&self) -> usize {
        self.payload.len()
            + self.id.len()
            + self.key.as_ref().map_or(0, String::len)
            + self
                .headers
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum::<usize>()
    }
}

/// One delivery of a message to a consumer.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message.
    pub message: Message,
    /// Its position in the topic (1-based, increasing in publish order).
    pub seq: u64,
    /// Which delivery this is: 1 the first time, 2 on the first redelivery.
    pub attempt: u32,
    /// What answers it: complete, nak, dead-letter or term.
    pub receipt: Receipt,
}

/// The right to answer one delivery. A receipt from an earlier delivery of
/// the same message is stale: answering it fails with
/// [`BrokerError::LeaseLost`] rather than acking someone else's work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The consumer it was delivered to.
    pub consumer: Arc<str>,
    /// The message's sequence in the consumer's topic.
    pub seq: u64,
    /// The delivery count it was issued for.
    pub attempt: u32,
    /// Broker-specific handle (a JetStream reply subject); empty for embedded.
    pub handle: String,
}

/// A delivery's successful end, handed to [`Broker::complete`] as one
/// step: its outputs, the ack, and on a dedup stage the key recorded
/// COMPLETED with those outputs. The ticket travels with the outputs so
/// that the record and the outputs are written together (on the embedded
/// broker in the same transaction as the ack); see [`idempotency`].
#[derive(Debug, Clone)]
pub struct Completion {
    /// The delivery to ack.
    pub receipt: Receipt,
    /// The outputs to publish, with their (deterministic) ids.
    pub outputs: Vec<Message>,
    /// The dedup key the delivery holds, to record COMPLETED (None: the
    /// stage does not deduplicate, or the message has no key).
    pub ticket: Option<Ticket>,
    /// The handler's state writes, committed with the ack or not at all
    /// ([`crate::state`]); a revision they depend on that moved refuses
    /// the whole completion with [`BrokerError::StateConflict`].
    pub state: Option<StateWrites>,
}

/// The right to complete (or release) a stage dedup key: what
/// [`idempotency::Begin::Run`] hands out, and what a [`Completion`] carries
/// so the broker records the key COMPLETED with the outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The scope.
    pub scope: String,
    /// The dedup key.
    pub key: String,
    /// [`crate::dedup::key_digest`] of the key.
    pub digest: [u8; 32],
    /// The holder's token.
    pub token: String,
    /// The payload hash recorded with it.
    pub hash: Option<Vec<u8>>,
    /// The store's revision of the IN_PROGRESS record (NATS KV); 0 for
    /// the embedded store.
    pub revision: u64,
    /// How long the key is remembered.
    pub ttl: Duration,
}

impl Completion {
    /// Outputs and an ack, without a dedup record.
    pub fn new(receipt: &Receipt, outputs: Vec<Message>) -> Self {
        Completion {
            receipt: receipt.clone(),
            outputs,
            ticket: None,
            state: None,
        }
    }
}

/// A topic as the broker needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    /// Its name.
    pub name: String,
    /// Messages older than this are removed even if unacked.
    pub retention: Option<Duration>,
    /// Whether some stage subscribes to it. A subscribed topic drops a
    /// message once every consumer is done with it (completed or dead-lettered); an unsubscribed one (an
    /// output, a DLQ) keeps messages by age, for readers.
    pub subscribed: bool,
    /// How long a republished id must still be recognised as a duplicate:
    /// at least the retry horizon of the stages publishing to it. `None`
    /// leaves the broker's default.
    pub duplicate_window: Option<Duration>,
    /// Whether some stage dead-letters into it. A dead letter carries
    /// provenance headers on top of its source message, so a broker with
    /// a size limit lets it use the room it keeps free on other topics.
    pub dead_letters: bool,
}

impl TopicSpec {
    /// A topic with default settings.
    pub fn new(name: impl Into<String>) -> Self {
        TopicSpec {
            name: name.into(),
            retention: None,
            subscribed: false,
            duplicate_window: None,
            dead_letters: false,
        }
    }
}

/// A durable consumer: one per stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSpec {
    /// `<pipeline>.<stage>`.
    pub name: String,
    /// The topic it reads.
    pub topic: String,
    /// Header equality filter; messages that do not match are skipped (never
    /// delivered, and count as acked for retention).
    pub filter: BTreeMap<String, String>,
    /// The lease length of a delivery.
    pub ack_wait: Duration,
    /// The most deliveries out and not yet answered at once (None: no broker-side limit).
    pub max_ack_pending: Option<u32>,
    /// The most deliveries of one message, after which the broker stops
    /// redelivering it (None: no limit). The engine dead-letters a message
    /// at `retry.max_attempts`, before this; the margin above it covers
    /// deliveries lost to a crash or an expired lease, which count too.
    pub max_deliver: Option<u32>,
}

impl ConsumerSpec {
    /// Whether `message` passes the header filter.
    pub fn accepts(&self, message: &Message) -> bool {
        self.filter
            .iter()
            .all(|(name, value)| message.header(name) == Some(value.as_str()))
    }
}

/// What a publish did with one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishAck {
    /// Its sequence in its topic (the original one for a duplicate).
    pub seq: u64,
    /// True when the id was already published within the duplicate window,
    /// so nothing new was stored.
    pub duplicate: bool,
}

/// A consumer's backlog, for `status`, metrics and backpressure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConsumerStats {
    /// Messages waiting for this consumer: not yet delivered, or waiting
    /// for a redelivery.
    pub pending: u64,
    /// Deliveries leased and not yet answered.
    pub in_flight: u64,
    /// Age of the oldest message this consumer has not yet answered.
    pub oldest_age: Option<Duration>,
    /// Paused by the operator ([`Broker::set_paused`]).
    pub paused: bool,
}

/// A topic's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TopicStats {
    /// Messages stored.
    pub depth: u64,
    /// The sequence of the oldest stored message (0 when empty).
    pub first_seq: u64,
    /// The sequence of the newest message ever published (0 when none).
    pub last_seq: u64,
    /// Age of the oldest stored message.
    pub oldest_age: Option<Duration>,
    /// Messages waiting for their due time ([`crate::delay`]); not in
    /// `depth`, not yet readable or deliverable.
    pub delayed: u64,
    /// When the earliest delayed message is due, in ms since the epoch,
    /// where the broker knows it cheaply (the embedded broker; `None` on
    /// NATS, and when nothing is delayed).
    pub next_due: Option<u64>,
}

/// A stored message with its sequence, as [`Broker::read`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Its position in the topic.
    pub seq: u64,
    /// The message.
    pub message: Message,
}

/// Why a broker operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    /// The receipt is stale: the lease expired and the message was
    /// redelivered, or it was already answered. Nothing was changed.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// The topic was never declared.
    #[error("unknown topic `{0}`")]
    UnknownTopic(String),
    /// The consumer was never declared.
    #[error("unknown consumer `{0}`")]
    UnknownConsumer(String),
    /// The broker is shutting down or its connection is gone; try again later.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// The store failed (I/O, corruption); the operation did not happen.
    #[error("broker storage failed: {0}")]
    Storage(String),
    /// A topic or consumer cannot be set up as declared (a name clash, a
    /// setting the broker cannot change in place).
    #[error("{0}")]
    Provision(String),
    /// A payload is larger than its topic accepts (the claim check's
    /// `max_payload`); nothing was published.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// A message cannot be published as it is (a delay header that does
    /// not parse); nothing was published. Producers check first
    /// ([`crate::delay::due_in`]), so this is a last line.
    #[error("{0}")]
    BadMessage(String),
    /// A state revision the handler's call read has moved (or the store
    /// filled up) since: nothing was written, and the call is retried.
    #[error("{0}")]
    StateConflict(String),
}

/// The operations the engine, admin API and CLI use. See the module docs.
#[async_trait]
pub trait Broker: Send + Sync + 'static {
    /// Declares a topic; idempotent.
    async fn ensure_topic(&self, spec: &TopicSpec) -> Result<(), BrokerError>;

    /// Declares a durable consumer; idempotent. A consumer created on a
    /// topic that already holds messages starts at the oldest one.
    async fn ensure_consumer(&self, spec: &ConsumerSpec) -> Result<(), BrokerError>;

    /// Publishes messages, in order, each to its own `topic`. Returns when
    /// they are durable under the broker's sync setting. An id already
    /// published to the same topic within the duplicate window is not stored
    /// again.
    async fn publish(&self, messages: Vec<Message>) -> Result<Vec<PublishAck>, BrokerError>;

    /// Up to `max` deliveries for `consumer`, redeliveries first, waiting up
    /// to `wait` for the first one. Each is leased for the consumer's
    /// `ack_wait`.
    async fn fetch(
        &self,
        consumer: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        self.fetch_within(consumer, max, usize::MAX, wait).await
    }

    /// [`Broker::fetch`], stopping short of a delivery that would take
    /// the messages fetched past `max_bytes` ([`Message::size`]; on NATS
    /// the server's own count, headers and body), but always taking one if
    /// one is ready: a stage's byte budget then holds to within one
    /// message however much message sizes jump between fetches.
    async fn fetch_within(
        &self,
        consumer: &str,
        max: usize,
        max_bytes: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError>;

    /// Ends a delivery with no outputs: a complete without outputs (on
    /// NATS, just the JetStream ack).
    async fn ack(&self, receipt: &Receipt) -> Result<(), BrokerError>;

    /// Ends a delivery successfully (see [`Completion`]): publishes its
    /// outputs, records its dedup key COMPLETED when it carries a ticket,
    /// and acks it. One transaction where the broker supports it (the
    /// embedded broker); on NATS publish-with-ids, then the record, then
    /// the ack. Borrowed, so a caller can retry the same completion.
    async fn complete(&self, completion: &Completion) -> Result<(), BrokerError>;

    /// Completes several deliveries: one result per completion, in order,
    /// each what [`Broker::complete`] would have answered for it alone. A
    /// batch stage completes its items through this. The default completes
    /// them concurrently, one call each; a broker that can write them in
    /// one step overrides it (the embedded broker: one op for its
    /// committer, rather than an op, a reply and a wake-up per message).
    async fn complete_all(&self, completions: &[Completion]) -> Vec<Result<(), BrokerError>> {
        futures_util::future::join_all(completions.iter().map(|c| self.complete(c))).await
    }

    /// Releases the delivery for redelivery after `delay`.
    async fn nak(&self, receipt: &Receipt, delay: Duration) -> Result<(), BrokerError>;

    /// Extends the lease by the consumer's `ack_wait` from now.
    async fn in_progress(&self, receipt: &Receipt) -> Result<(), BrokerError>;

    /// Answers the delivery for good, without outputs: never redelivered.
    async fn term(&self, receipt: &Receipt) -> Result<(), BrokerError>;

    /// Publishes `entry` (to its own topic, the DLQ) and then terms the
    /// delivery; one transaction where the broker supports it.
    async fn dead_letter(&self, receipt: &Receipt, entry: Message) -> Result<(), BrokerError>;

    /// Pauses (`true`) or resumes a consumer. A paused consumer delivers
    /// nothing: a fetch waits out its `wait` and returns empty. Leases
    /// already out stay valid, so calls in flight finish and settle. The
    /// pause is durable: it survives a restart and a new
    /// [`Broker::ensure_consumer`], and on NATS it holds for every daemon
    /// (a JetStream consumer pause, nats-server 2.11 or later).
    async fn set_paused(&self, consumer: &str, paused: bool) -> Result<(), BrokerError>;

    /// The consumer's backlog.
    async fn consumer_stats(&self, consumer: &str) -> Result<ConsumerStats, BrokerError>;

    /// The topic's contents.
    async fn topic_stats(&self, topic: &str) -> Result<TopicStats, BrokerError>;

    /// Reads up to `max` stored messages with `seq >= from`, without
    /// consuming them, waiting up to `wait` if there are none yet.
    async fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Stored>, BrokerError>;

    /// Removes the given messages from a topic (DLQ redrive and purge).
    /// Returns how many were there.
    async fn remove(&self, topic: &str, seqs: &[u64]) -> Result<u64, BrokerError>;

    /// Makes everything done so far durable (for shutdown).
    async fn flush(&self) -> Result<(), BrokerError>;

    /// Whether the broker can take work now, for the readiness probe and
    /// `status`. It must answer at once from state the broker already
    /// keeps (never a round trip), so a probe never hangs on an outage.
    fn readiness(&self) -> Readiness {
        Readiness::Ready
    }

    /// Storage errors seen since the broker was opened (I/O failures,
    /// checksum mismatches), for `sluice_storage_errors_total`. Answers at
    /// once, like [`Broker::readiness`].
    fn storage_errors(&self) -> u64 {
        0
    }

    /// Rate-limit buckets every daemon on this broker shares, so that a
    /// stage's `rate` holds for all of them together. `None` (the default,
    /// and the embedded broker, which one daemon owns): each daemon keeps
    /// its buckets in memory.
    fn shared_rates(&self) -> Option<Arc<dyn rates::SharedRates>> {
        None
    }

    /// Where daemons sharing this broker announce which configuration they
    /// run, so a reload rolled out one daemon at a time can log how long
    /// they disagreed. `None` (the default, and the embedded broker, which
    /// one daemon owns): there is no one to disagree with.
    fn shared_versions(&self) -> Option<Arc<dyn versions::SharedVersions>> {
        None
    }

    /// What the broker's own store holds in memory, for
    /// `sluice_store_memory_bytes` (an operator asking where the daemon's
    /// memory goes). Empty for a broker whose store is another process
    /// (NATS). Answers at once, like [`Broker::readiness`].
    fn store_memory(&self) -> StoreMemory {
        StoreMemory::default()
    }

    /// Where handler state is read, for a broker that commits it with the
    /// ack ([`Completion::state`]). `None` (the default, e.g. the test
    /// broker): a stage with `state:` is refused at start.
    fn state(&self) -> Option<Arc<dyn StateReader>> {
        None
    }

    /// Deletes `key` from the handler state `store` (an operator's
    /// `sluice state delete`): committed like a handler's delete, so a call
    /// that read the key meanwhile runs again. Returns whether it was
    /// there.
    async fn delete_state(&self, store: &str, key: &str) -> Result<bool, BrokerError> {
        let _ = (store, key);
        Err(BrokerError::Provision(
            "this broker keeps no handler state".into(),
        ))
    }
}

/// The embedded store's memory, by part ([`Broker::store_memory`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreMemory {
    /// Bytes held in the block cache (shared by all keyspaces; capped).
    pub cache: u64,
    /// Each keyspace's share.
    pub keyspaces: Vec<KeyspaceMemory>,
}

/// One keyspace's memory ([`StoreMemory`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyspaceMemory {
    /// The keyspace (`messages`, `pending`, `dedup`, ...).
    pub keyspace: &'static str,
    /// Memtable bytes still referenced, as the store accounts them (keys
    /// and values; the allocations around them come on top): the active
    /// memtable, sealed ones waiting for their flush, and flushed ones an
    /// older version still holds.
    pub memtables: u64,
    /// Bloom filter blocks pinned in memory.
    pub filters: u64,
    /// Index blocks pinned in memory.
    pub indexes: u64,
    /// Tables on disk.
    pub tables: u64,
    /// Levels of its tree holding tables. fjall fills the last level first
    /// and the ones above it as the data grows; a compaction into a level
    /// that was empty is larger than those before it.
    pub levels: u64,
}

/// A broker's answer to "can you take work now?" ([`Broker::readiness`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Reads and writes work.
    Ready,
    /// Writes work, but something needs the operator (for example a damaged
    /// range a stage cannot read past). Still ready: restarting the daemon
    /// would not help.
    Degraded(String),
    /// Writes fail now (disk full, connection lost, store closed); work
    /// waits until the cause is gone.
    NotReady(String),
}

impl Readiness {
    /// Whether a readiness probe should pass.
    pub fn is_ready(&self) -> bool {
        !matches!(self, Readiness::NotReady(_))
    }

    /// The reason, when not plainly ready.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Readiness::Ready => None,
            Readiness::Degraded(why) | Readiness::NotReady(why) => Some(why),
        }
    }
}

/// What backpressure counts on `topic`: its stored depth, or the
/// pending count of its slowest subscriber if that is larger (a fan-out
/// topic's depth alone can hide one stage far behind), plus the messages
/// delayed on it, which will all be delivered: a flood of delayed
/// messages meets the high-water mark like any other. A subscriber not
/// declared yet counts nothing.
pub async fn backlog(
    broker: &dyn Broker,
    topic: &str,
    subscribers: &[String],
) -> Result<u64, BrokerError> {
    let stats = broker.topic_stats(topic).await?;
    let mut depth = stats.depth;
    for consumer in subscribers {
        match broker.consumer_stats(consumer).await {
            Ok(stats) => depth = depth.max(stats.pending),
            Err(BrokerError::UnknownConsumer(_)) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(depth.saturating_add(stats.delayed))
}

/// Milliseconds since the Unix epoch, now.
pub fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A fresh message id: a UUIDv7, so ids sort by creation time.
pub fn new_message_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// The durable consumer name of a stage: `<pipeline>.<stage>`.
pub fn consumer_name(pipeline: &str, stage: &str) -> String {
    format!("{pipeline}.{stage}")
}

/// One topic a stage reads, and the durable consumer that reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageInput {
    /// The topic.
    pub topic: String,
    /// The consumer: [`consumer_name`] for a single-topic stage;
    /// `<pipeline>.<stage>~<topic>` for each priority lane of a stage with
    /// several (`~` is not allowed in stage names, so no other stage's
    /// consumer can have that name).
    pub consumer: String,
}

/// The topics `stage` of `pipeline` reads, in its priority order, each
/// with its consumer.
pub fn stage_inputs(pipeline: &str, stage: &crate::config::Stage) -> Vec<StageInput> {
    let plain = consumer_name(pipeline, &stage.name);
    if !stage.subscribe.has_lanes() {
        return vec![StageInput {
            topic: stage.subscribe.topic().to_owned(),
            consumer: plain,
        }];
    }
    stage
        .subscribe
        .topics
        .iter()
        .map(|topic| StageInput {
            topic: topic.clone(),
            consumer: format!("{plain}~{topic}"),
        })
        .collect()
}
