//! The Kafka source: one member of a consumer group.
//!
//! - **A poll thread** owns the polling of the librdkafka consumer
//!   (`enable.auto.commit=false`, `enable.auto.offset.store=false`): it is
//!   polled every 100 ms whatever the runner does, so rebalances are
//!   served and the group never takes this daemon for dead. What it
//!   fetches goes into a bounded channel (`buffer` messages). When that is
//!   full it waits for room, polling nothing (librdkafka's own queue is
//!   bounded by `queued.*`); full for over a second, the assigned
//!   partitions are paused (librdkafka then drops what it had fetched
//!   ahead and resumes at the next message not handed over) and polling
//!   goes on, so memory stays bounded, nothing is skipped, and a resume,
//!   which stalls fetching for up to a second, is rare.
//! - **`read`** takes at most `max` (the room under the topic's
//!   high-water mark) from the channel. Messages still in the channel were
//!   never read: nothing is committed for them.
//! - **`ack`** (per read, in read order, after the durable publish)
//!   commits, for each partition the read holds, its last offset + 1.
//!   Within one assignment a partition's messages arrive in offset order
//!   and reads are acked in read order, so that offset and every earlier
//!   one are durable: commits are contiguous per partition, whatever the
//!   number of reads in flight. Commits are sent at most every 100 ms
//!   (`COMMIT_EVERY`; what a read made durable meanwhile goes with the next
//!   one, which the poll thread sends if no read does). A commit the
//!   brokers do not take (a cooperative rebalance under way, the
//!   coordinator moving) is sent again each second until they do: with no
//!   later read to carry it, the group's position would otherwise stay
//!   behind.
//! - **A rebalance**: before a partition is revoked, the poll thread
//!   commits its durable offset synchronously, under the same lock `ack`
//!   takes, and forgets the partition. Each assignment has an epoch;
//!   messages and reads of an earlier epoch of a partition are never
//!   committed for (the new owner reads them again: their ids
//!   `<partition>:<offset>` collapse in the topic's duplicate window), and
//!   messages of a revoked partition still in the channel are dropped.
//!
//! Ids are `<partition>:<offset>` (with several `topics`,
//! `<topic>:<partition>:<offset>`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::config::{GroupProtocol, KafkaSourceConfig, Sasl, StartFrom};
use super::diagnosis::{Diagnosis, Role};
use super::{client_config, code, is_outage, scrub};
use crate::connect::{Capabilities, Context, Source, SourceError, SourceMessage};

/// Reads open at once: while one read is made durable, the next ones are
/// already read.
const READS_IN_FLIGHT: usize = 4;
/// How long librdkafka waits before fetching again a partition whose local
/// queue is at its bound (`buffer`).
const FETCH_BACKOFF_MS: &str = "10";
/// How long one poll of the consumer waits.
const POLL: Duration = Duration::from_millis(100);
/// How long one poll waits while fetched messages wait for room in the
/// read channel (fetching is paused then; the poll serves callbacks).
const FULL_POLL: Duration = Duration::from_millis(2);
/// How long fetched messages may wait for room in the read channel
/// before the assigned partitions are paused. Meanwhile nothing is polled,
/// so rebalance callbacks wait at most this long.
const FULL_WAIT: Duration = Duration::from_secs(1);
/// How often an outage is probed (a metadata request) to see it end.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How often durable offsets are sent in a commit, at most. A commit
/// per read kept one always in flight, and librdkafka asks for a newly
/// assigned partition's committed offset only between commits: after a
/// member left, the partitions it gave up went unread for 7-15 s
/// (BENCHMARKS.md, Kafka).
const COMMIT_EVERY: Duration = Duration::from_millis(100);
/// How often durable offsets the brokers have not taken yet are
/// committed again: an asynchronous commit can fail (a cooperative
/// rebalance under way, a coordinator moving) with no later read to carry
/// it, which would leave the group's position behind for good.
const RECOMMIT_EVERY: Duration = Duration::from_secs(1);
/// How long dropping the source waits for the consumer to close.
const CLOSE_WAIT: Duration = Duration::from_secs(10);
/// How long a lag or probe request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// A partition: its topic and number.
type Tp = (String, i32);

/// One message the poll thread fetched, with the assignment epoch of its
/// partition at that moment.
struct Fetched {
    tp: Tp,
    offset: i64,
    epoch: u64,
    message: SourceMessage,
}

/// What the poll thread, the rebalance callbacks and the source share.
#[derive(Default)]
struct State {
    /// The partitions this member owns now, each with its assignment's
    /// epoch.
    owned: HashMap<Tp, u64>,
    /// Per owned partition, the next offset to commit: the last durable
    /// one + 1.
    durable: HashMap<Tp, i64>,
    /// Per owned partition, the offset last sent in a commit (taken by
    /// the brokers or not yet answered).
    sent: HashMap<Tp, i64>,
    /// When offsets were last sent.
    sent_at: Option<Instant>,
    /// The last epoch handed out.
    epoch: u64,
    /// Why the brokers cannot be reached, during an outage.
    down: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    /// Per partition, the offset the brokers last took in a commit. Its
    /// own lock: the commit callback takes only this one.
    committed: Mutex<HashMap<Tp, i64>>,
    /// The source was dropped: the poll thread commits and leaves.
    stop: AtomicBool,
    label: String,
    sasl: Option<Sasl>,
    /// Why the brokers refuse this client (TLS, password, ACLs), said
    /// plainly.
    diagnosis: Diagnosis,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn committed(&self) -> std::sync::MutexGuard<'_, HashMap<Tp, i64>> {
        self.committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes a client error: a connection trouble takes the source down
    /// with the reason said plainly. True when it was one.
    fn trouble(&self, err: &rdkafka::error::KafkaError, reason: &str) -> bool {
        match self.diagnosis.note(err, reason) {
            Some(said) => {
                self.lock().down = Some(format!("kafka: {said}"));
                true
            }
            None => false,
        }
    }

    /// The brokers served this client: whatever kept it out is over.
    fn served(&self) {
        self.lock().down = None;
        self.diagnosis.clear();
    }
}

/// The consumer's context: the rebalance callbacks (run by the poll
/// thread, inside `poll`).
struct GroupContext {
    shared: Arc<Shared>,
}

impl ClientContext for GroupContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        let text = scrub(self.shared.sasl.as_ref(), log_message);
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::debug!(source = %self.shared.label, facility = fac, "librdkafka: {text}");
            }
            _ => tracing::trace!(source = %self.shared.label, facility = fac, "librdkafka: {text}"),
        }
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        // A refused handshake or password is said here first (and only
        // here, for some); other errors come back through `poll`.
        let text = scrub(self.shared.sasl.as_ref(), &format!("{error}: {reason}"));
        tracing::debug!(source = %self.shared.label, "librdkafka error: {text}");
        self.shared.trouble(&error, reason);
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        // Under the lock `ack` commits under: no commit for these
        // partitions can start once this has taken them away.
        let mut state = self.shared.lock();
        let mut commit = TopicPartitionList::new();
        let mut names = Vec::new();
        for el in revoked.elements() {
            let tp = (el.topic().to_owned(), el.partition());
            names.push(format!("{}:{}", tp.0, tp.1));
            state.sent.remove(&tp);
            if let Some(next) = state.durable.remove(&tp) {
                let _ = commit.add_partition_offset(&tp.0, tp.1, Offset::Offset(next));
            }
            state.owned.remove(&tp);
            self.shared.committed().remove(&tp);
        }
        if commit.count() > 0 {
            let lost = consumer.assignment_lost();
            match consumer.commit(&commit, CommitMode::Sync) {
                Ok(()) => {
                    tracing::info!(source = %self.shared.label, partitions = %names.join(","), "partitions revoked; their durable offsets are committed");
                }
                Err(err) => {
                    // Not a loss: the next owner reads from the last
                    // committed offset, and the ids collapse.
                    let text = scrub(self.shared.sasl.as_ref(), &err.to_string());
                    tracing::warn!(source = %self.shared.label, partitions = %names.join(","), lost, error = %text, "partitions revoked; committing their durable offsets failed (the next owner reads them again)");
                }
            }
        } else {
            tracing::info!(source = %self.shared.label, partitions = %names.join(","), "partitions revoked");
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(assigned) => {
                let mut state = self.shared.lock();
                state.epoch += 1;
                let epoch = state.epoch;
                let mut names = Vec::new();
                for el in assigned.elements() {
                    let tp = (el.topic().to_owned(), el.partition());
                    names.push(format!("{}:{}", tp.0, tp.1));
                    state.owned.insert(tp, epoch);
                }
                drop(state);
                self.shared.served();
                tracing::info!(source = %self.shared.label, partitions = %names.join(","), epoch, "partitions assigned");
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(err) => {
                let text = scrub(self.shared.sasl.as_ref(), &err.to_string());
                tracing::warn!(source = %self.shared.label, error = %text, "consumer group rebalance failed");
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(err) = &result {
            let text = scrub(self.shared.sasl.as_ref(), &err.to_string());
            tracing::debug!(source = %self.shared.label, error = %text, "an offset commit failed (it is sent again)");
        }
        let mut committed = self.shared.committed();
        for el in offsets.elements() {
            match (el.error(), el.offset()) {
                (Ok(()), Offset::Offset(next)) if result.is_ok() => {
                    let slot = committed
                        .entry((el.topic().to_owned(), el.partition()))
                        .or_insert(next);
                    *slot = (*slot).max(next);
                }
                (Err(err), _) => {
                    tracing::debug!(source = %self.shared.label, partition = %format!("{}:{}", el.topic(), el.partition()), error = %err, "a partition's offset commit failed (it is sent again)");
                }
                _ => {}
            }
        }
    }
}

type GroupConsumer = BaseConsumer<GroupContext>;

/// A member of a Kafka consumer group.
pub struct KafkaSource {
    /// `None` once dropped (the poll thread then closes it).
    consumer: Option<Arc<GroupConsumer>>,
    /// Says when the poll thread has committed and closed the consumer.
    closed: Option<std::sync::mpsc::Receiver<()>>,
    shared: Arc<Shared>,
    fetched: mpsc::Receiver<Fetched>,
    /// Per read not yet acknowledged, oldest first: for each partition it
    /// holds, the assignment epoch and the last offset.
    unacked: VecDeque<Vec<(Tp, u64, i64)>>,
    /// Per partition, the epoch and the next offset expected (a message
    /// delivered twice within one assignment is dropped).
    next: HashMap<Tp, (u64, i64)>,
    /// The last per-partition lag measured.
    partition_lag: Vec<(String, u64)>,
    multi_topic: bool,
}

impl KafkaSource {
    /// The source of `config`: the consumer is made and subscribed (which
    /// contacts nothing), and its poll thread started.
    pub(crate) fn new(config: &KafkaSourceConfig, ctx: &Context) -> Result<Self, String> {
        let topics = config.topic_list();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            committed: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            label: ctx.label(),
            sasl: config.connection.sasl.clone(),
            diagnosis: Diagnosis::new(Role::Consumer, ctx.label(), config.connection.sasl.clone()),
        });
        let mut client = client_config(&config.connection, config.tls.files())?;
        let session_ms = config.session_timeout.get().as_millis().max(1000);
        let buffer = usize::try_from(config.buffer.get()).unwrap_or(2000);
        client
            .set("group.id", &config.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set(
                "auto.offset.reset",
                match config.start {
                    StartFrom::Latest => "latest",
                    StartFrom::Earliest => "earliest",
                },
            )
            .set("group.protocol", config.group_protocol.name())
            // What librdkafka fetches ahead, per partition, is bounded
            // too: at most this many messages or KiB.
            .set("queued.min.messages", buffer.min(10_000).to_string())
            .set("queued.max.messages.kbytes", "16384")
            // Above those bounds librdkafka waits this long before it
            // fetches that partition again: 1 s by default, which with
            // bounds this low stalled the source most of the time (2.5k
            // msg/s where the client does 700k; BENCHMARKS.md, Kafka).
            .set("fetch.queue.backoff.ms", FETCH_BACKOFF_MS)
            .set("enable.partition.eof", "false");
        if config.group_protocol == GroupProtocol::Classic {
            // Under KIP-848 the brokers own these, and librdkafka refuses
            // them.
            client
                .set("partition.assignment.strategy", "cooperative-sticky")
                .set("session.timeout.ms", session_ms.to_string())
                // Heartbeats are how a member hears that the group is
                // rebalancing: at most 1 s apart, so a member leaving
                // costs the others a second of waiting, not a third of
                // the session.
                .set(
                    "heartbeat.interval.ms",
                    (session_ms / 3).min(1000).to_string(),
                );
        }
        if let Some(id) = &config.instance_id {
            client.set("group.instance.id", id);
        }
        let consumer: GroupConsumer = client
            .create_with_context(GroupContext {
                shared: shared.clone(),
            })
            .map_err(|e| {
                scrub(
                    config.connection.sasl.as_ref(),
                    &format!("cannot make the consumer: {e}"),
                )
            })?;
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer.subscribe(&names).map_err(|e| {
            scrub(
                config.connection.sasl.as_ref(),
                &format!("cannot subscribe: {e}"),
            )
        })?;
        let consumer = Arc::new(consumer);
        let (tx, rx) = mpsc::channel(buffer);
        let (closed_tx, closed_rx) = std::sync::mpsc::channel();
        let poller = Poller {
            consumer: consumer.clone(),
            shared: shared.clone(),
            out: tx,
            closed: closed_tx,
            multi_topic: topics.len() > 1,
            probe_topic: topics.first().cloned().unwrap_or_default(),
        };
        std::thread::Builder::new()
            .name(format!("kafka-{}", ctx.name))
            .spawn(move || poller.run())
            .map_err(|e| format!("cannot start the consumer's poll thread: {e}"))?;
        Ok(KafkaSource {
            consumer: Some(consumer),
            closed: Some(closed_rx),
            shared,
            fetched: rx,
            unacked: VecDeque::new(),
            next: HashMap::new(),
            partition_lag: Vec::new(),
            multi_topic: topics.len() > 1,
        })
    }

    /// Whether `f` belongs to the current assignment of its partition and
    /// comes after what was read of it; notes it as read.
    fn take(&mut self, owned: &HashMap<Tp, u64>, f: &Fetched) -> bool {
        if owned.get(&f.tp) != Some(&f.epoch) {
            return false;
        }
        match self.next.get(&f.tp) {
            Some((epoch, next)) if *epoch == f.epoch && f.offset < *next => false,
            _ => {
                self.next.insert(f.tp.clone(), (f.epoch, f.offset + 1));
                true
            }
        }
    }
}

#[async_trait]
impl Source for KafkaSource {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // Offsets, not messages, are committed: a commit covers every
            // earlier offset of its partition.
            per_message_ack: false,
            // A partition is read in offset order.
            ordered_by_key: true,
            lag: true,
        }
    }

    fn reads_in_flight(&self) -> usize {
        READS_IN_FLIGHT
    }

    async fn read(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<SourceMessage>, SourceError> {
        let mut batch: Vec<Fetched> = Vec::new();
        let first = if wait.is_zero() {
            self.fetched.try_recv().ok()
        } else {
            tokio::time::timeout(wait, self.fetched.recv())
                .await
                .ok()
                .flatten()
        };
        if let Some(first) = first {
            batch.push(first);
            while batch.len() < max {
                match self.fetched.try_recv() {
                    Ok(f) => batch.push(f),
                    Err(_) => break,
                }
            }
        }
        let (owned, down) = {
            let state = self.shared.lock();
            (state.owned.clone(), state.down.clone())
        };
        let mut spans: BTreeMap<Tp, (u64, i64)> = BTreeMap::new();
        let mut out = Vec::with_capacity(batch.len());
        for f in batch {
            if !self.take(&owned, &f) {
                continue;
            }
            let span = spans.entry(f.tp.clone()).or_insert((f.epoch, f.offset));
            span.1 = span.1.max(f.offset);
            out.push(f.message);
        }
        if out.is_empty() {
            return match down {
                Some(why) => Err(SourceError::Unavailable(why)),
                None => Ok(out),
            };
        }
        self.unacked.push_back(
            spans
                .into_iter()
                .map(|(tp, (epoch, last))| (tp, epoch, last))
                .collect(),
        );
        Ok(out)
    }

    async fn ack(&mut self) -> Result<(), SourceError> {
        let Some(read) = self.unacked.pop_front() else {
            return Ok(());
        };
        let mut state = self.shared.lock();
        for (tp, epoch, last) in read {
            // A partition revoked since (or revoked and assigned again):
            // its new owner reads from the committed offset; nothing is
            // committed for it here.
            if state.owned.get(&tp) != Some(&epoch) {
                continue;
            }
            let next = last + 1;
            if state.durable.get(&tp).is_none_or(|d| *d < next) {
                state.durable.insert(tp, next);
            }
        }
        if state.sent_at.is_some_and(|at| at.elapsed() < COMMIT_EVERY) {
            // The poll thread sends it within COMMIT_EVERY.
            return Ok(());
        }
        let Some(consumer) = &self.consumer else {
            return Ok(());
        };
        send_durable(&mut state, consumer).map_err(|e| {
            SourceError::Unavailable(scrub(
                self.shared.sasl.as_ref(),
                &format!("{}: committing offsets failed: {e}", self.shared.label),
            ))
        })
    }

    async fn release(&mut self) {
        // At shutdown: nothing of these reads is committed; whoever owns
        // their partitions next reads them again from the committed
        // offsets.
        self.unacked.clear();
    }

    async fn lag(&mut self) -> Option<u64> {
        let owned: Vec<(Tp, Option<i64>)> = {
            let state = self.shared.lock();
            state
                .owned
                .keys()
                .map(|tp| (tp.clone(), state.durable.get(tp).copied()))
                .collect()
        };
        let consumer = self.consumer.clone()?;
        let multi = self.multi_topic;
        let measured = tokio::task::spawn_blocking(move || measure_lag(&consumer, owned, multi))
            .await
            .ok()?;
        let total = measured.iter().map(|(_, lag)| lag).sum();
        self.partition_lag = measured;
        Some(total)
    }

    async fn partition_lag(&mut self) -> Vec<(String, u64)> {
        self.partition_lag.clone()
    }
}

/// Sends, asynchronously, each owned partition's durable offset that was
/// not sent yet: queued in order behind earlier commits (a revoke commits
/// synchronously behind them before the partition goes). Called under the
/// state's lock, so commits stay in order.
fn send_durable(state: &mut State, consumer: &GroupConsumer) -> KafkaResult<()> {
    let mut commit = TopicPartitionList::new();
    for (tp, next) in &state.durable {
        if state.owned.contains_key(tp) && state.sent.get(tp).is_none_or(|s| s < next) {
            let _ = commit.add_partition_offset(&tp.0, tp.1, Offset::Offset(*next));
        }
    }
    state.sent_at = Some(Instant::now());
    if commit.count() == 0 {
        return Ok(());
    }
    for el in commit.elements() {
        if let Offset::Offset(next) = el.offset() {
            state
                .sent
                .insert((el.topic().to_owned(), el.partition()), next);
        }
    }
    consumer.commit(&commit, CommitMode::Async)
}

/// Per owned partition: its high watermark less the next offset to
/// commit (the durable one, else the group's committed one, else the low
/// watermark).
fn measure_lag(
    consumer: &GroupConsumer,
    owned: Vec<(Tp, Option<i64>)>,
    multi_topic: bool,
) -> Vec<(String, u64)> {
    let mut ask = TopicPartitionList::new();
    for ((topic, partition), durable) in &owned {
        if durable.is_none() {
            ask.add_partition(topic, *partition);
        }
    }
    let committed: HashMap<(String, i32), Offset> = if ask.count() > 0 {
        consumer
            .committed_offsets(ask, REQUEST_TIMEOUT)
            .map(|tpl| tpl.to_topic_map())
            .unwrap_or_default()
    } else {
        HashMap::new()
    };
    let mut out = Vec::new();
    for ((topic, partition), durable) in owned {
        let Ok((low, high)) = consumer.fetch_watermarks(&topic, partition, REQUEST_TIMEOUT) else {
            continue;
        };
        let from = durable
            .or_else(|| match committed.get(&(topic.clone(), partition)) {
                Some(Offset::Offset(o)) => Some(*o),
                _ => None,
            })
            .unwrap_or(low)
            .max(low);
        let name = if multi_topic {
            format!("{topic}:{partition}")
        } else {
            partition.to_string()
        };
        out.push((name, u64::try_from(high - from).unwrap_or(0)));
    }
    out.sort_by_key(|a| natural(&a.0));
    out
}

/// Sorts `3` before `10`.
fn natural(name: &str) -> (String, u64) {
    match name.rsplit_once(':') {
        Some((topic, p)) => (topic.to_owned(), p.parse().unwrap_or(0)),
        None => (String::new(), name.parse().unwrap_or(0)),
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        // The poll thread commits the durable offsets and closes the
        // consumer (leaving the group, so its partitions move at once)
        // once it holds the last reference. Waited for, briefly: at
        // shutdown the process must not end before the commit lands.
        self.shared.stop.store(true, Ordering::SeqCst);
        self.consumer = None;
        if let Some(closed) = self.closed.take() {
            let _ = closed.recv_timeout(CLOSE_WAIT);
        }
    }
}

/// The poll thread.
struct Poller {
    consumer: Arc<GroupConsumer>,
    shared: Arc<Shared>,
    out: mpsc::Sender<Fetched>,
    closed: std::sync::mpsc::Sender<()>,
    multi_topic: bool,
    probe_topic: String,
}

impl Poller {
    fn run(self) {
        let mut overflow: VecDeque<Fetched> = VecDeque::new();
        // The epoch whose assignment is paused, while the channel is full.
        let mut paused: Option<u64> = None;
        // Since when fetched messages wait for room in the read channel.
        let mut full_since: Option<Instant> = None;
        let mut probed = Instant::now();
        let mut recommitted = Instant::now();
        // When the poll thread last looked for durable offsets to send:
        // the state's lock is taken for it every COMMIT_EVERY, not per
        // message.
        let mut flushed = Instant::now();
        while !self.shared.stop.load(Ordering::SeqCst) {
            while let Some(f) = overflow.pop_front() {
                match self.out.try_send(f) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(f)) => {
                        overflow.push_front(f);
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        self.shared.stop.store(true, Ordering::SeqCst);
                        break;
                    }
                }
            }
            let epoch = self.shared.lock().epoch;
            if overflow.is_empty() {
                full_since = None;
                if paused.take().is_some()
                    && let Ok(assignment) = self.consumer.assignment()
                {
                    let _ = self.consumer.resume(&assignment);
                    tracing::debug!(source = %self.shared.label, partitions = assignment.count(), "fetching resumed");
                }
            } else if full_since.get_or_insert_with(Instant::now).elapsed() < FULL_WAIT {
                // Full for a moment: the reads are catching up. Wait for
                // room rather than pause, since a paused partition drops
                // what librdkafka fetched ahead and, resumed, stalls for up
                // to a second before it fetches again (BENCHMARKS.md,
                // Kafka). What librdkafka holds meanwhile is bounded by
                // `queued.*`; nothing more is polled.
                std::thread::sleep(FULL_POLL);
                continue;
            } else if paused != Some(epoch)
                && let Ok(assignment) = self.consumer.assignment()
            {
                // Full for long (the topic at its high-water mark): fetch
                // no more, and poll on, so rebalances are served and the
                // group keeps this member (an assignment made since is
                // paused anew).
                let _ = self.consumer.pause(&assignment);
                paused = Some(epoch);
                tracing::debug!(source = %self.shared.label, partitions = assignment.count(), epoch, "the read channel is full: fetching paused");
            }
            // While paused with messages waiting for room, poll briefly:
            // the wait is for the reads, not for the brokers.
            let poll = if overflow.is_empty() { POLL } else { FULL_POLL };
            match self.consumer.poll(poll) {
                None => {}
                Some(Ok(m)) => {
                    let tp = (m.topic().to_owned(), m.partition());
                    let (epoch, was_down) = {
                        let mut state = self.shared.lock();
                        (state.owned.get(&tp).copied(), state.down.take().is_some())
                    };
                    if was_down {
                        self.shared.diagnosis.clear();
                    }
                    // A message of a partition not owned (revoked
                    // meanwhile) is dropped: its new owner reads it.
                    if let Some(epoch) = epoch {
                        overflow.push_back(self.fetched(&m, tp, epoch));
                    }
                }
                Some(Err(err)) => {
                    let text = scrub(self.shared.sasl.as_ref(), &err.to_string());
                    if self.shared.trouble(&err, "") {
                        tracing::debug!(source = %self.shared.label, error = %text, "kafka unreachable");
                    } else if code(&err).is_some_and(is_outage) {
                        self.shared.lock().down = Some(format!("kafka: {text}"));
                    } else {
                        tracing::warn!(source = %self.shared.label, error = %text, "kafka consumer error");
                    }
                }
            }
            if recommitted.elapsed() >= RECOMMIT_EVERY {
                recommitted = Instant::now();
                self.recommit();
            } else if flushed.elapsed() >= COMMIT_EVERY {
                flushed = Instant::now();
                let mut state = self.shared.lock();
                if state.sent_at.is_none_or(|at| at.elapsed() >= COMMIT_EVERY) {
                    let _ = send_durable(&mut state, &self.consumer);
                }
            }
            // A refusal (TLS, password, ACL) ends with an assignment or
            // a message, not with a metadata answer.
            if probed.elapsed() >= PROBE_EVERY
                && self.shared.lock().down.is_some()
                && self.shared.diagnosis.specific().is_none()
            {
                probed = Instant::now();
                if self
                    .consumer
                    .fetch_metadata(Some(&self.probe_topic), REQUEST_TIMEOUT)
                    .is_ok_and(|m| {
                        m.topics()
                            .iter()
                            .any(|t| t.error().is_none() && !t.partitions().is_empty())
                    })
                {
                    self.shared.lock().down = None;
                }
            }
        }
        self.close();
    }

    /// Commits again, for each owned partition, the durable offset the
    /// brokers have not taken (under the lock `ack` commits under, so
    /// commits stay in order).
    fn recommit(&self) {
        let mut state = self.shared.lock();
        let mut commit = TopicPartitionList::new();
        {
            let committed = self.shared.committed();
            for (tp, next) in &state.durable {
                if state.owned.contains_key(tp) && committed.get(tp).is_none_or(|c| c < next) {
                    let _ = commit.add_partition_offset(&tp.0, tp.1, Offset::Offset(*next));
                }
            }
        }
        if commit.count() > 0 {
            state.sent_at = Some(Instant::now());
            let _ = self.consumer.commit(&commit, CommitMode::Async);
        }
    }

    /// Turns a fetched message into a source message.
    fn fetched(&self, m: &rdkafka::message::BorrowedMessage<'_>, tp: Tp, epoch: u64) -> Fetched {
        let offset = m.offset();
        let upstream_id = if self.multi_topic {
            format!("{}:{}:{offset}", tp.0, tp.1)
        } else {
            format!("{}:{offset}", tp.1)
        };
        let mut problems = Vec::new();
        let key = m.key().and_then(|k| match std::str::from_utf8(k) {
            Ok(k) => Some(k.to_owned()),
            Err(_) => {
                problems.push("its key is not UTF-8 text".to_owned());
                None
            }
        });
        let mut headers = Vec::new();
        if let Some(hs) = m.headers() {
            for h in hs.iter() {
                let value = h.value.unwrap_or_default();
                match std::str::from_utf8(value) {
                    Ok(v) => headers.push((h.key.to_owned(), v.to_owned())),
                    Err(_) => problems.push(format!("header `{}` is not UTF-8 text", h.key)),
                }
            }
        }
        let message = SourceMessage {
            upstream_id,
            key,
            headers,
            payload: Bytes::copy_from_slice(m.payload().unwrap_or_default()),
            problem: (!problems.is_empty()).then(|| problems.join("; ")),
        };
        Fetched {
            tp,
            offset,
            epoch,
            message,
        }
    }

    /// After the source is gone: commits the durable offsets, then closes
    /// the consumer (its revoke commits them again and leaves the group).
    fn close(self) {
        let Poller {
            consumer,
            shared,
            closed,
            ..
        } = self;
        {
            let state = shared.lock();
            let mut commit = TopicPartitionList::new();
            for (tp, next) in &state.durable {
                if state.owned.contains_key(tp) {
                    let _ = commit.add_partition_offset(&tp.0, tp.1, Offset::Offset(*next));
                }
            }
            if commit.count() > 0 {
                let _ = consumer.commit(&commit, CommitMode::Sync);
            }
        }
        // The source's reference goes with it; wait for that (briefly).
        let started = Instant::now();
        let mut consumer = consumer;
        loop {
            match Arc::try_unwrap(consumer) {
                Ok(c) => {
                    drop(c);
                    break;
                }
                Err(c) if started.elapsed() < Duration::from_secs(10) => {
                    consumer = c;
                    let _ = consumer.poll(POLL);
                }
                Err(_) => break,
            }
        }
        tracing::debug!(source = %shared.label, "kafka consumer closed");
        let _ = closed.send(());
    }
}
