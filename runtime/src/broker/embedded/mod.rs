//! The embedded broker: durable topics in the daemon's data directory, so
//! one machine needs nothing else.
//!
//! Open it with [`EmbeddedBroker::open`]; it implements [`Broker`]. Inside,
//! one file per job (ARCHITECTURE.md has the keyspace layout and why fjall):
//!
//! - `store.rs`: the fjall keyspaces, keys and records.
//! - `topic.rs` / `consumer.rs`: what is kept in memory: topic counters,
//!   and per consumer a cursor, a pending set and lease/nak timers.
//! - `database.rs`: the open store and its reopen slot.
//! - `commit/`: the single writer thread and its group commit.
//! - `fetch.rs`: deliveries and browsing.
//! - `delayed.rs`: messages waiting for their due time, and moving them
//!   into their topics when it comes.
//! - `retention.rs`: deleting what is completed or too old, expiring the
//!   duplicate window.
//! - `memtables.rs`: keeping large records from piling up in memory.
//! - `recover.rs`: rebuilding the in-memory state on open.
//! - `journal.rs`: verifying the journals before fjall opens them (any
//!   damage but a torn tail refuses).
//! - `tools.rs`: `sluice data check | salvage | quarantine` on a stopped
//!   data directory.
//!
//! Every write (publish, complete, delivery bookkeeping, declarations) goes
//! through the committer, so a `complete` is one atomic fjall batch holding
//! the outputs and the removal of the pending entry: a kill -9 leaves both
//! or neither. The data directory is locked (`broker.lock`) so only one
//! process owns it; a second open fails with an error naming the directory.

mod commit;
mod consumer;
mod database;
mod delayed;
mod fetch;
mod health;
mod idempotency;
pub mod journal;
mod memtables;
mod recover;
mod retention;
mod state;
mod store;
pub mod tools;
mod topic;
mod window;

#[cfg(feature = "fuzz")]
pub(crate) use store::decode_every_record;

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;

use self::commit::{CompleteItem, Group, Op, Reply};
use self::consumer::{Consumer, ConsumerState, millis};
use self::database::{Store, StoreSlot};
use self::store::{ConsumerRecord, Position, cursor_key, encode};
use self::topic::{Topic, TopicState};
use super::{
    Broker, BrokerError, Completion, ConsumerSpec, ConsumerStats, Delivery, Message, PublishAck,
    Receipt, Stored, TopicSpec, TopicStats, now_millis,
};

/// When a write counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// fsync before returning, with group commit (concurrent writers share
    /// one fsync). Survives power loss. The default: see ARCHITECTURE.md
    /// for the measured cost.
    #[default]
    Always,
    /// Written to the OS before returning, fsynced by the OS later.
    /// Survives a crash of the process (kill -9), not of the machine.
    Os,
}

impl std::fmt::Display for SyncMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SyncMode::Always => "always",
            SyncMode::Os => "os",
        })
    }
}

/// How to open an [`EmbeddedBroker`].
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// The data directory (created if missing; locked while open).
    pub dir: PathBuf,
    /// When a write is durable.
    pub sync: SyncMode,
    /// How long a published id is remembered per topic, so a republish
    /// (after a crash, or a redrive) is dropped. Zero disables it.
    pub dedup_window: Duration,
}

impl EmbeddedOptions {
    /// Defaults for `dir`: [`SyncMode::Always`], a two-minute duplicate
    /// window (NATS JetStream's default).
    pub fn new(dir: impl Into<PathBuf>) -> EmbeddedOptions {
        EmbeddedOptions {
            dir: dir.into(),
            sync: SyncMode::default(),
            dedup_window: Duration::from_secs(120),
        }
    }

    /// With `sync`.
    #[must_use]
    pub fn sync(mut self, sync: SyncMode) -> EmbeddedOptions {
        self.sync = sync;
        self
    }

    /// With a duplicate window of `window`.
    #[must_use]
    pub fn dedup_window(mut self, window: Duration) -> EmbeddedOptions {
        self.dedup_window = window;
        self
    }
}

/// The state the broker's methods and the committer thread share.
pub(super) struct Shared {
    /// The fjall store (reopened after a failed write).
    store: StoreSlot,
    /// What readiness and the storage-error count report.
    health: health::Health,
    /// Declared topics.
    topics: RwLock<HashMap<String, Arc<Topic>>>,
    /// Declared consumers.
    consumers: RwLock<HashMap<String, Arc<Consumer>>>,
    /// Ids for new topics and consumers; used by the committer only.
    next_ids: Mutex<(u32, u32)>,
    /// When writes are durable.
    sync: SyncMode,
    /// The duplicate window in ms (0: off).
    dedup_window_ms: u64,
    /// Stage dedup keys held by a running handler in this process.
    holds: idempotency::Holds,
    /// Where the next sweep of expired dedup records starts.
    dedup_sweep: idempotency::SweepCursor,
    /// Where the next sweep of expired state entries starts.
    state_sweep: state::SweepCursor,
    /// What the committer knows of the state keyspace without reading it.
    state_known: Mutex<commit::state_writes::Known>,
    /// State writes of completions in flight, readable before they are durable.
    state_in_flight: state::InFlightWrites,
    /// Large records sealed whose memtables fjall still holds.
    large_records: memtables::LargeRecords,
}

impl Shared {
    /// A declared topic.
    fn topic(&self, name: &str) -> Result<Arc<Topic>, BrokerError> {
        self.topics
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
            .ok_or_else(|| BrokerError::UnknownTopic(name.to_owned()))
    }

    /// Every declared topic.
    fn topic_list(&self) -> Vec<Arc<Topic>> {
        self.topics
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// A declared consumer.
    fn consumer(&self, name: &str) -> Result<Arc<Consumer>, BrokerError> {
        self.consumers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
            .ok_or_else(|| BrokerError::UnknownConsumer(name.to_owned()))
    }

    /// The consumers reading `topic`: its fan-out.
    fn consumers_of(&self, topic: &Topic) -> Vec<Arc<Consumer>> {
        let mut consumers = self.consumer_list();
        consumers.retain(|c| c.topic.id == topic.id);
        consumers
    }

    /// Every declared consumer.
    fn consumer_list(&self) -> Vec<Arc<Consumer>> {
        self.consumers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Allocates a topic id (`topic`) or consumer id.
    fn next_id(&self, topic: bool) -> u32 {
        let mut ids = self
            .next_ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let slot = if topic { &mut ids.0 } else { &mut ids.1 };
        let id = *slot;
        *slot += 1;
        id
    }
}

/// The durable single-node broker. See the module docs.
pub struct EmbeddedBroker {
    /// State shared with the committer.
    shared: Arc<Shared>,
    /// The committer's queue; None once dropping.
    tx: Option<Sender<Op>>,
    /// The committer thread, joined on drop.
    committer: Option<JoinHandle<()>>,
    /// The data directory lock, held while open.
    _lock: File,
}

/// The lock file in the data directory.
const LOCK_FILE: &str = "broker.lock";

impl EmbeddedBroker {
    /// Opens (or creates) the broker in `options.dir`, recovering what a
    /// previous process left: a torn journal tail is discarded (only a
    /// batch whose write never returned can be torn), leases are expired.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Unavailable`] when another process holds the
    /// directory; [`BrokerError::Storage`] when it cannot be read.
    pub fn open(options: EmbeddedOptions) -> Result<Arc<EmbeddedBroker>, BrokerError> {
        let dir = &options.dir;
        std::fs::create_dir_all(dir)
            .map_err(|e| store::storage(format!("creating {}", dir.display()), e))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| store::storage(format!("opening {}", lock_path.display()), e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(BrokerError::Unavailable(format!(
                    "data directory {} is in use by another sluice process ({} is locked)",
                    dir.display(),
                    lock_path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(store::storage(
                    format!("locking {}", lock_path.display()),
                    e,
                ));
            }
        }
        let store_dir = dir.join("store");
        let store = Store::open(&store_dir)?;
        let loaded = database::guard_panic(&store_dir, || recover::load(&store))?;
        let shared = Arc::new(Shared {
            store: StoreSlot::new(store_dir, store),
            health: health::Health::default(),
            topics: RwLock::new(loaded.topics),
            consumers: RwLock::new(loaded.consumers),
            next_ids: Mutex::new((loaded.next_topic_id, loaded.next_consumer_id)),
            sync: options.sync,
            dedup_window_ms: millis(options.dedup_window),
            holds: idempotency::Holds::default(),
            dedup_sweep: idempotency::SweepCursor::default(),
            state_sweep: state::SweepCursor::default(),
            state_known: Mutex::default(),
            state_in_flight: state::InFlightWrites::default(),
            large_records: memtables::LargeRecords::default(),
        });
        let (tx, rx) = mpsc::channel();
        let committer = std::thread::Builder::new()
            .name("sluice-broker-commit".into())
            .spawn({
                let shared = shared.clone();
                move || commit::run(shared, rx)
            })
            .map_err(|e| store::storage("starting the committer thread", e))?;
        Ok(Arc::new(EmbeddedBroker {
            shared,
            tx: Some(tx),
            committer: Some(committer),
            _lock: lock,
        }))
    }

    /// The sync mode it was opened with.
    pub fn sync_mode(&self) -> SyncMode {
        self.shared.sync
    }

    /// Sends an op to the committer and waits for its reply.
    async fn call<T>(&self, op: impl FnOnce(Reply<T>) -> Op) -> Result<T, BrokerError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .as_ref()
            .ok_or_else(shut_down)?
            .send(op(reply))
            .map_err(|_| shut_down())?;
        rx.await.map_err(|_| shut_down())?
    }

    /// Publishes `outputs` and completes `receipt`, atomically.
    async fn complete_outputs(
        &self,
        receipt: &Receipt,
        outputs: Vec<Message>,
    ) -> Result<(), BrokerError> {
        self.complete_with(receipt, outputs, None, None).await
    }

    /// A completion that also marks a stage dedup record COMPLETED, and writes
    /// the handler's state, in the same batch.
    async fn complete_with(
        &self,
        receipt: &Receipt,
        outputs: Vec<Message>,
        record: Option<(Vec<u8>, crate::broker::Ticket)>,
        state: Option<crate::state::StateWrites>,
    ) -> Result<(), BrokerError> {
        let consumer = self.take_for_completion(receipt, &outputs)?;
        let (reply, rx) = oneshot::channel();
        let op = |state: Option<commit::state_writes::Stamped>| Op::Complete {
            consumer: consumer.clone(),
            seq: receipt.seq,
            outputs,
            record,
            state: state.map(Box::new),
            reply,
        };
        let tx = self.tx.as_ref();
        let send = |op: Op| tx.ok_or_else(shut_down)?.send(op).map_err(|_| shut_down());
        // Its writes are readable until the reply is in (`state::InFlightWrites`).
        let (_writing, sent) = match state {
            Some(writes) => {
                let now = crate::broker::now_millis();
                match self
                    .shared
                    .state_in_flight
                    .register(&self.shared, writes, now, |stamped| send(op(Some(stamped))))
                {
                    Ok((guard, sent)) => (Some(guard), sent),
                    Err(e) => {
                        consumer.abandon_completion(receipt.seq);
                        return Err(e);
                    }
                }
            }
            None => (None, send(op(None))),
        };
        let result = match sent {
            Ok(()) => rx.await.map_err(|_| shut_down()).and_then(|r| r),
            Err(e) => Err(e),
        };
        if matches!(result, Err(BrokerError::Unavailable(_))) {
            // Not written (the op never reached the committer, or the
            // store could not write): the lease stays, so the stage can
            // retry the completion without spending an attempt.
            consumer.abandon_completion(receipt.seq);
        }
        result
    }

    /// Checks a completion's consumer and output topics, and marks its lease as
    /// completing. The committer removes the entry once the completion is
    /// durable (only then may retention pass the message), or releases it
    /// on failure.
    fn take_for_completion(
        &self,
        receipt: &Receipt,
        outputs: &[Message],
    ) -> Result<Arc<Consumer>, BrokerError> {
        let consumer = self.shared.consumer(&receipt.consumer)?;
        for m in outputs {
            self.shared.topic(&m.topic)?;
        }
        consumer.take_lease(receipt)?;
        Ok(consumer)
    }
}

/// The error after shutdown.
fn shut_down() -> BrokerError {
    BrokerError::Unavailable("the embedded broker is shut down".into())
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        // Closing the queue ends the committer after the queued ops; it
        // fsyncs on the way out. Joining releases the store before the lock.
        self.tx = None;
        if let Some(handle) = self.committer.take()
            && handle.join().is_err()
        {
            tracing::error!("embedded broker committer panicked");
        }
    }
}

#[async_trait]
impl Broker for EmbeddedBroker {
    async fn ensure_topic(&self, spec: &TopicSpec) -> Result<(), BrokerError> {
        let retention_ms = spec.retention.map(millis);
        if let Ok(topic) = self.shared.topic(&spec.name)
            && topic.snapshot().retention_ms == retention_ms
        {
            return Ok(());
        }
        let name = spec.name.clone();
        self.call(|reply| Op::Ensure {
            apply: Box::new(move |g: &mut Group<'_>| {
                let topic = match g.shared.topic(&name) {
                    Ok(topic) => topic,
                    Err(_) => {
                        let id = g.shared.next_id(true);
                        let state = TopicState {
                            retention_ms,
                            first_seq: 1,
                            ..TopicState::default()
                        };
                        let topic = Arc::new(Topic::new(id, &name, state));
                        g.shared
                            .topics
                            .write()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .insert(name, topic.clone());
                        topic
                    }
                };
                g.topic_state(&topic).retention_ms = retention_ms;
                Ok(())
            }),
            reply,
        })
        .await
    }

    async fn ensure_consumer(&self, spec: &ConsumerSpec) -> Result<(), BrokerError> {
        self.shared.topic(&spec.topic)?;
        if let Ok(c) = self.shared.consumer(&spec.name)
            && c.state().spec == *spec
        {
            return Ok(());
        }
        let spec = spec.clone();
        self.call(|reply| Op::Ensure {
            apply: Box::new(move |g: &mut Group<'_>| {
                let topic = g.shared.topic(&spec.topic)?;
                let record = consumer_record(0, &spec, false);
                let store = g.store.clone();
                let record = match g.shared.consumer(&spec.name) {
                    Ok(c) => {
                        if *c.topic.name != *spec.topic {
                            return Err(BrokerError::Storage(format!(
                                "consumer {} reads {}, not {}",
                                spec.name, c.topic.name, spec.topic
                            )));
                        }
                        c.set_spec(spec.clone());
                        // A restart with new settings keeps the pause.
                        let paused = c.state().paused;
                        ConsumerRecord {
                            id: c.id,
                            paused,
                            ..record
                        }
                    }
                    Err(_) => {
                        let id = g.shared.next_id(false);
                        let cursor = g.topic_state(&topic).first_seq;
                        let state = ConsumerState::new(spec.clone(), cursor);
                        let consumer = Arc::new(Consumer::new(id, topic.clone(), state));
                        g.shared
                            .consumers
                            .write()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .insert(spec.name.clone(), consumer);
                        g.batch.insert(
                            &store.cursors,
                            cursor_key(id),
                            Position {
                                cursor,
                                floor: cursor,
                            }
                            .encode(),
                        );
                        ConsumerRecord { id, ..record }
                    }
                };
                g.batch
                    .insert(&store.consumers, spec.name.as_str(), encode(&record)?);
                Ok(())
            }),
            reply,
        })
        .await
    }

    async fn publish(&self, messages: Vec<Message>) -> Result<Vec<PublishAck>, BrokerError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        self.call(|reply| Op::Publish { messages, reply }).await
    }

    async fn fetch_within(
        &self,
        consumer: &str,
        max: usize,
        max_bytes: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        let consumer = self.shared.consumer(consumer)?;
        self.fetch_for(&consumer, max, max_bytes, wait).await
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        self.complete_outputs(receipt, Vec::new()).await
    }

    async fn complete(&self, completion: &Completion) -> Result<(), BrokerError> {
        let Completion {
            receipt,
            outputs,
            ticket,
            state,
        } = completion;
        match ticket {
            Some(ticket) => {
                self.complete_recorded(ticket, receipt, outputs.clone(), state.clone())
                    .await
            }
            None => {
                self.complete_with(receipt, outputs.clone(), None, state.clone())
                    .await
            }
        }
    }

    async fn complete_all(&self, completions: &[Completion]) -> Vec<Result<(), BrokerError>> {
        // A completion that records a dedup key is checked against its
        // holder's ticket first (`complete_recorded`), and one with state
        // writes is checked in the committer: those go one by one.
        if completions
            .iter()
            .any(|c| c.ticket.is_some() || c.state.is_some())
        {
            return futures_util::future::join_all(completions.iter().map(|c| self.complete(c)))
                .await;
        }
        let mut results: Vec<Result<(), BrokerError>> = Vec::with_capacity(completions.len());
        let mut items = Vec::with_capacity(completions.len());
        for completion in completions {
            let receipt = &completion.receipt;
            match self.take_for_completion(receipt, &completion.outputs) {
                Ok(consumer) => {
                    items.push(CompleteItem {
                        consumer,
                        seq: receipt.seq,
                        outputs: completion.outputs.clone(),
                    });
                    results.push(Ok(()));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if items.is_empty() {
            return results;
        }
        let taken: Vec<(Arc<Consumer>, u64)> = items
            .iter()
            .map(|item| (item.consumer.clone(), item.seq))
            .collect();
        let answered = match self.call(|reply| Op::CompleteAll { items, reply }).await {
            Ok(answered) => answered,
            Err(e) => vec![Err(e); taken.len()],
        };
        let mut answered = answered.into_iter();
        for ((consumer, seq), result) in taken.iter().zip(results.iter_mut().filter(|r| r.is_ok()))
        {
            *result = answered.next().unwrap_or_else(|| {
                Err(BrokerError::Unavailable(
                    "the committer gave no answer for a completion".into(),
                ))
            });
            if matches!(result, Err(BrokerError::Unavailable(_))) {
                // Not written (as in `complete_with`): the lease stays, so
                // the stage can retry without spending an attempt.
                consumer.abandon_completion(*seq);
            }
        }
        results
    }

    async fn nak(&self, receipt: &Receipt, delay: Duration) -> Result<(), BrokerError> {
        let consumer = self.shared.consumer(&receipt.consumer)?;
        let visible_at = now_millis().saturating_add(millis(delay));
        let record = consumer.release(receipt, visible_at)?;
        let result = self
            .call(|reply| Op::Nak {
                consumer: consumer.clone(),
                seq: receipt.seq,
                record,
                reply,
            })
            .await;
        // Waiting fetches recompute when the next redelivery is due.
        consumer.topic.notify.notify_waiters();
        consumer.freed.notify_waiters();
        result
    }

    async fn in_progress(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        let consumer = self.shared.consumer(&receipt.consumer)?;
        consumer.extend(receipt, now_millis())
    }

    async fn term(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        self.complete_outputs(receipt, Vec::new()).await
    }

    async fn dead_letter(&self, receipt: &Receipt, entry: Message) -> Result<(), BrokerError> {
        self.complete_outputs(receipt, vec![entry]).await
    }

    async fn set_paused(&self, consumer: &str, paused: bool) -> Result<(), BrokerError> {
        let consumer = self.shared.consumer(consumer)?;
        let c = consumer.clone();
        self.call(|reply| Op::Ensure {
            apply: Box::new(move |g: &mut Group<'_>| {
                let spec = c.state().spec.clone();
                let record = consumer_record(c.id, &spec, paused);
                let store = g.store.clone();
                g.batch
                    .insert(&store.consumers, spec.name.as_str(), encode(&record)?);
                Ok(())
            }),
            reply,
        })
        .await?;
        // Only once it is durable, so memory never claims a pause that a
        // restart would forget; a resumed fetch wakes at once.
        consumer.state().paused = paused;
        consumer.freed.notify_waiters();
        Ok(())
    }

    async fn consumer_stats(&self, consumer: &str) -> Result<ConsumerStats, BrokerError> {
        let consumer = self.shared.consumer(consumer)?;
        self.stats_for(&consumer)
    }

    async fn topic_stats(&self, topic: &str) -> Result<TopicStats, BrokerError> {
        Ok(self.shared.topic(topic)?.stats())
    }

    async fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Stored>, BrokerError> {
        let topic = self.shared.topic(topic)?;
        self.read_from(&topic, from, max, wait).await
    }

    async fn remove(&self, topic: &str, seqs: &[u64]) -> Result<u64, BrokerError> {
        let topic = self.shared.topic(topic)?;
        let seqs = seqs.to_vec();
        self.call(|reply| Op::Remove { topic, seqs, reply }).await
    }

    async fn flush(&self) -> Result<(), BrokerError> {
        self.call(|reply| Op::Flush { reply }).await
    }

    fn readiness(&self) -> super::Readiness {
        self.shared.health.readiness()
    }

    fn storage_errors(&self) -> u64 {
        self.shared.health.errors()
    }

    fn state(&self) -> Option<Arc<dyn crate::state::StateReader>> {
        Some(state::reader(&self.shared))
    }

    async fn delete_state(&self, store: &str, key: &str) -> Result<bool, BrokerError> {
        let found = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (store, key, seen) = (store.to_owned(), key.to_owned(), found.clone());
        self.call(|reply| Op::Ensure {
            apply: Box::new(move |g: &mut Group<'_>| {
                seen.store(
                    state::delete(g, &store, &key)?,
                    std::sync::atomic::Ordering::Relaxed,
                );
                Ok(())
            }),
            reply,
        })
        .await?;
        Ok(found.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn store_memory(&self) -> crate::broker::StoreMemory {
        self.shared
            .store
            .current()
            .map(|store| store.memory())
            .unwrap_or_default()
    }
}

/// The durable form of a consumer's spec.
fn consumer_record(id: u32, spec: &ConsumerSpec, paused: bool) -> ConsumerRecord {
    ConsumerRecord {
        id,
        topic: spec.topic.clone(),
        filter: spec.filter.clone(),
        ack_wait_ms: millis(spec.ack_wait),
        max_ack_pending: spec.max_ack_pending,
        paused,
    }
}
