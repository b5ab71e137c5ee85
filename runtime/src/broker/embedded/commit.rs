//! Group commit: one thread is the only writer of the store.
//!
//! Callers send an [`Op`] and await its reply. The committer takes every op
//! that is queued, turns them into ONE fjall write batch (atomic across
//! keyspaces), writes it to the OS, and, under [`SyncMode::Always`], fsyncs
//! once for the whole group before replying. While it fsyncs, the next group
//! queues up, so many concurrent publishes and completes share one fsync.
//! Being the only writer also makes seq assignment, the duplicate window and
//! the topic counters race-free without locks held across I/O.
//!
//! Between groups (and when idle) it runs the maintenance in
//! [`super::retention`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use fjall::{OwnedWriteBatch, PersistMode};
use tokio::sync::oneshot;

use super::consumer::{Consumer, Pending};
use super::retention;
use super::store::{
    DedupRecord, MessageRecordRef, PendingRecord, Position, Store, TopicRecord, cursor_key, decode,
    dedup_key, delete_message, encode, msg_key, pending_key, run_key, storage,
};
use super::topic::{Topic, TopicState};
use super::{Shared, SyncMode};
use crate::broker::{BrokerError, Message, PublishAck, now_millis};
use crate::dedup::Ticket;

/// Most ops folded into one group, so one group's latency stays bounded.
const MAX_GROUP_OPS: usize = 4096;

/// How often maintenance (retention, duplicate-window expiry) runs.
const MAINTENANCE_EVERY: Duration = Duration::from_millis(200);

/// How soon after a settle what every consumer settled is deleted
/// ([`retention::prune`]). A topic's depth is what its high-water mark
/// counts: at 200 ms a source or producer held at a mark of 1,000 could
/// move at most 5,000 messages a second, whatever the stage's speed.
const PRUNE_AFTER: Duration = Duration::from_millis(10);

/// Where an op's result goes.
pub(super) type Reply<T> = oneshot::Sender<Result<T, BrokerError>>;

/// A write for the committer.
pub(super) enum Op {
    /// Store messages (duplicate window applies).
    Publish {
        /// The messages, each to its own topic.
        messages: Vec<Message>,
        /// One ack per message.
        reply: Reply<Vec<PublishAck>>,
    },
    /// Publish outputs and remove a pending entry, atomically (ack, term,
    /// complete, dead_letter).
    Settle {
        /// Whose entry.
        consumer: Arc<Consumer>,
        /// Which entry.
        seq: u64,
        /// What to publish with it.
        outputs: Vec<Message>,
        /// The stage dedup record to mark COMPLETED with it (its key and
        /// the holder's ticket).
        record: Option<(Vec<u8>, Ticket)>,
        /// Done.
        reply: Reply<()>,
    },
    /// Several settles without dedup records (a batch stage's items), each
    /// as [`Op::Settle`] would write it, answered together: one result per
    /// item, in order.
    SettleAll {
        /// The settles.
        items: Vec<SettleItem>,
        /// One result per item.
        reply: Reply<Vec<Result<(), BrokerError>>>,
    },
    /// Record deliveries: pending entries with their attempts, the cursor.
    /// Once written, the committer also applies them to the consumer in
    /// memory, so a fetch that is cancelled midway leaves leases that expire
    /// and redeliver rather than a cursor out of step with the store.
    Deliver {
        /// Whose.
        consumer: Arc<Consumer>,
        /// The new cursor, if it moved.
        cursor: Option<u64>,
        /// Entries to write (redeliveries and first deliveries).
        records: Vec<(u64, PendingRecord)>,
        /// First deliveries, to add to the pending set.
        leases: Vec<(u64, Pending)>,
        /// (seq, attempt) of entries whose message is gone.
        vanished: Vec<(u64, u32)>,
        /// Done (written to the OS, not necessarily fsynced).
        reply: Reply<()>,
    },
    /// Rewrite one pending entry (a nak's visible-at).
    Nak {
        /// Whose.
        consumer: Arc<Consumer>,
        /// Which.
        seq: u64,
        /// Its new durable form.
        record: PendingRecord,
        /// Done.
        reply: Reply<()>,
    },
    /// Remove messages from a topic.
    Remove {
        /// The topic.
        topic: Arc<Topic>,
        /// The seqs.
        seqs: Vec<u64>,
        /// How many were there.
        reply: Reply<u64>,
    },
    /// Declare or update a topic or consumer (`ensure_topic`, `ensure_consumer`).
    Ensure {
        /// What to do, run on the committer thread with the batch.
        apply: EnsureFn,
        /// Done.
        reply: Reply<()>,
    },
    /// Fsync everything written so far.
    Flush {
        /// Done.
        reply: Reply<()>,
    },
}

/// A declaration run on the committer thread, inside a group.
pub(super) type EnsureFn = Box<dyn FnOnce(&mut Group<'_>) -> Result<(), BrokerError> + Send>;

/// One settle of an [`Op::SettleAll`]: a delivery whose lease the caller
/// took, and the outputs to publish with its ack.
pub(super) struct SettleItem {
    /// Whose entry.
    pub consumer: Arc<Consumer>,
    /// Which entry.
    pub seq: u64,
    /// What to publish with it.
    pub outputs: Vec<Message>,
}

/// A reply waiting for the group's commit (and fsync).
pub(super) enum Done {
    /// A publish's acks.
    Acks(Reply<Vec<PublishAck>>, Vec<PublishAck>),
    /// A count.
    Count(Reply<u64>, u64),
    /// Nothing to return.
    Unit(Reply<()>),
    /// A settle: the pending entry leaves memory once the removal is
    /// durable (here, not in the caller, so a caller that gives up cannot
    /// leave it behind), or is released for redelivery if it failed.
    Settle(Reply<()>, Arc<Consumer>, u64),
    /// Settles answered together: each entry, and the error it met while
    /// the group was built (already released), if any.
    SettleAll(
        Reply<Vec<Result<(), BrokerError>>>,
        Vec<(Arc<Consumer>, u64, Option<BrokerError>)>,
    ),
    /// Deliveries, applied to the consumer once written: the cursor, the
    /// first deliveries, the vanished entries, the entries whose pending
    /// records were written (seq, attempt).
    Deliver(
        Reply<()>,
        Arc<Consumer>,
        Option<u64>,
        Vec<(u64, Pending)>,
        Vec<(u64, u32)>,
        Vec<(u64, u32)>,
    ),
    /// Pending records written (seq, attempt): those entries no longer
    /// hold the floor down.
    Recorded(Option<Reply<()>>, Arc<Consumer>, Vec<(u64, u32)>),
    /// A position written: the settled runs it stored and deleted.
    Runs(Arc<Consumer>, Vec<(u64, u64)>, Vec<u64>),
}

impl Done {
    /// Sends the result (or `err`).
    fn send(self, err: Option<&BrokerError>) {
        // A caller that gave up (dropped its future) is not an error.
        match (self, err) {
            (Done::Acks(r, v), None) => drop(r.send(Ok(v))),
            (Done::Acks(r, _), Some(e)) => drop(r.send(Err(e.clone()))),
            (Done::Count(r, v), None) => drop(r.send(Ok(v))),
            (Done::Count(r, _), Some(e)) => drop(r.send(Err(e.clone()))),
            (Done::Unit(r), None) => drop(r.send(Ok(()))),
            (Done::Unit(r), Some(e)) => drop(r.send(Err(e.clone()))),
            (Done::Settle(r, c, seq), None) => {
                c.settled(seq);
                c.settled.notify_waiters();
                drop(r.send(Ok(())));
            }
            (Done::Settle(r, c, seq), Some(e)) => {
                release_settle(&c, seq, e);
                c.settled.notify_waiters();
                drop(r.send(Err(e.clone())));
            }
            (Done::SettleAll(r, items), err) => {
                let mut woken: Vec<Arc<Consumer>> = Vec::new();
                let results = items
                    .into_iter()
                    .map(|(c, seq, failed)| {
                        let result = match (failed, err) {
                            (Some(failed), _) => Err(failed),
                            (None, None) => {
                                c.settled(seq);
                                Ok(())
                            }
                            (None, Some(e)) => {
                                release_settle(&c, seq, e);
                                Err(e.clone())
                            }
                        };
                        if !woken.iter().any(|w| Arc::ptr_eq(w, &c)) {
                            woken.push(c);
                        }
                        result
                    })
                    .collect();
                for c in woken {
                    c.settled.notify_waiters();
                }
                drop(r.send(Ok(results)));
            }
            (Done::Deliver(r, c, cursor, leases, vanished, recorded), None) => {
                c.drop_vanished(&vanished);
                c.add_leases(cursor.unwrap_or(0), &leases);
                c.mark_recorded(&recorded);
                drop(r.send(Ok(())));
            }
            (Done::Deliver(r, ..), Some(e)) => drop(r.send(Err(e.clone()))),
            (Done::Recorded(r, c, recorded), None) => {
                c.mark_recorded(&recorded);
                if let Some(r) = r {
                    drop(r.send(Ok(())));
                }
            }
            (Done::Recorded(r, ..), Some(e)) => {
                if let Some(r) = r {
                    drop(r.send(Err(e.clone())));
                }
            }
            (Done::Runs(c, new_runs, dropped), None) => c.apply_runs(&new_runs, &dropped),
            (Done::Runs(..), Some(_)) => {}
        }
    }
}

/// The state of one group being built.
pub(super) struct Group<'a> {
    /// The shared broker state.
    pub shared: &'a Shared,
    /// The store this group writes (the committer alone replaces it).
    pub store: Store,
    /// The batch.
    pub batch: OwnedWriteBatch,
    /// Working copies of the counters of the topics this group touches.
    pub topics: HashMap<u32, (Arc<Topic>, TopicState)>,
    /// Topics whose first message must be looked up after the commit.
    pub refirst: Vec<u32>,
    /// Ids stored by this group (dedup key -> seq), not yet in the store.
    dedup: HashMap<Vec<u8>, u64>,
    /// Cursors moved by this group's deliveries, by consumer id: each
    /// consumer's position is written once, by [`Group::write_positions`].
    cursors: HashMap<u32, (Arc<Consumer>, u64)>,
    /// First deliveries this group settles, by consumer id.
    settles: HashMap<u32, (Arc<Consumer>, Vec<u64>)>,
    /// The broker clock for this group.
    pub now: u64,
}

impl<'a> Group<'a> {
    /// An empty group writing `store`.
    pub fn new(shared: &'a Shared, store: Store) -> Group<'a> {
        Group {
            shared,
            batch: store.db.batch(),
            store,
            topics: HashMap::new(),
            refirst: Vec::new(),
            dedup: HashMap::new(),
            cursors: HashMap::new(),
            settles: HashMap::new(),
            now: now_millis(),
        }
    }

    /// The working counters of `topic`.
    pub fn topic_state(&mut self, topic: &Arc<Topic>) -> &mut TopicState {
        &mut self
            .topics
            .entry(topic.id)
            .or_insert_with(|| (topic.clone(), topic.snapshot()))
            .1
    }

    /// Checks that every message's topic is declared.
    fn resolve(&self, messages: &[Message]) -> Result<Vec<Arc<Topic>>, BrokerError> {
        messages
            .iter()
            .map(|m| self.shared.topic(&m.topic))
            .collect()
    }

    /// Adds messages to the batch: duplicate check, seq, record, window.
    fn publish(
        &mut self,
        messages: &[Message],
        topics: &[Arc<Topic>],
    ) -> Result<Vec<PublishAck>, BrokerError> {
        let window = self.shared.dedup_window_ms;
        if window > 0 {
            self.store
                .window
                .rotate(&mut self.batch, self.now, window)?;
        }
        let mut acks = Vec::with_capacity(messages.len());
        for (m, topic) in messages.iter().zip(topics) {
            let dk = if window > 0 {
                let dk = dedup_key(topic.id, &m.id);
                if let Some(&seq) = self.dedup.get(&dk) {
                    acks.push(PublishAck {
                        seq,
                        duplicate: true,
                    });
                    continue;
                }
                // An entry past the window (its generation not yet
                // cleared) is replaced by the new one.
                if let Some(old) = self.store.window.get(&dk)?
                    && self.now.saturating_sub(old.at) < window
                {
                    acks.push(PublishAck {
                        seq: old.seq,
                        duplicate: true,
                    });
                    continue;
                }
                Some(dk)
            } else {
                None
            };
            let now = self.now;
            let st = self.topic_state(topic);
            let seq = st.last_seq + 1;
            let published_at = if m.published_at == 0 {
                now
            } else {
                m.published_at
            };
            st.last_seq = seq;
            if st.depth == 0 {
                st.first_seq = seq;
                st.first_published_at = published_at;
            }
            st.depth += 1;
            let value = encode(&MessageRecordRef {
                published_at,
                id: &m.id,
                key: &m.key,
                headers: &m.headers,
                payload: &m.payload,
            })?;
            let store = &self.store;
            self.batch
                .insert(&store.messages, msg_key(topic.id, seq), value);
            if let Some(dk) = dk {
                store
                    .window
                    .insert(&mut self.batch, &dk, DedupRecord { seq, at: now })?;
                self.dedup.insert(dk, seq);
            }
            acks.push(PublishAck {
                seq,
                duplicate: false,
            });
        }
        Ok(acks)
    }

    /// Adds one settle to the batch: the dedup record COMPLETED (if any),
    /// the outputs, and the end of the pending entry.
    fn settle(
        &mut self,
        consumer: &Arc<Consumer>,
        seq: u64,
        outputs: &[Message],
        record: Option<(Vec<u8>, Ticket)>,
    ) -> Result<(), BrokerError> {
        if let Some((key, ticket)) = record {
            self.complete_record(key, &ticket)?;
        }
        let topics = self.resolve(outputs)?;
        self.publish(outputs, &topics)?;
        // A first delivery has no record to remove: the floor covers it
        // (`store::Position`).
        if consumer.is_recorded(seq) {
            self.batch
                .remove(&self.store.pending, pending_key(consumer.id, seq));
        } else {
            self.settles
                .entry(consumer.id)
                .or_insert_with(|| (consumer.clone(), Vec::new()))
                .1
                .push(seq);
        }
        Ok(())
    }

    /// Removes `seqs` from `topic` (those still stored), and the pending
    /// entries that pointed at them. Returns how many were removed.
    pub fn remove(&mut self, topic: &Arc<Topic>, seqs: &[u64]) -> Result<u64, BrokerError> {
        let store = self.store.clone();
        let mut removed = Vec::new();
        let st = *self.topic_state(topic);
        for &seq in seqs {
            if seq < st.first_seq || seq > st.last_seq || removed.contains(&seq) {
                continue;
            }
            if store
                .messages
                .contains_key(msg_key(topic.id, seq))
                .map_err(|e| storage("reading a message", e))?
            {
                delete_message(&mut self.batch, &store.messages, &msg_key(topic.id, seq));
                removed.push(seq);
            }
        }
        let count = removed.len() as u64;
        if count > 0 {
            let st = self.topic_state(topic);
            st.depth = st.depth.saturating_sub(count);
            if removed.contains(&st.first_seq) {
                self.refirst.push(topic.id);
            }
            self.drop_pending(topic, &removed, 0);
        }
        Ok(count)
    }

    /// Drops the pending entries of removed messages of `topic` (in `seqs`
    /// or below `below`), in memory and in the batch.
    pub fn drop_pending(&mut self, topic: &Topic, seqs: &[u64], below: u64) {
        for c in topic.consumer_list() {
            for seq in c.drop_removed(seqs, below) {
                self.batch
                    .remove(&self.store.pending, pending_key(c.id, seq));
            }
        }
    }

    /// Writes the position ([`super::store::Position`]) of every consumer
    /// whose cursor moved in this group, that settles first deliveries in
    /// it, or (`all`: the maintenance run) whose floor rose since it was
    /// last written; with the settled runs to store and delete, and
    /// pending records for first deliveries that hold the floor too far
    /// below the cursor. Their `Done`s go to `early` (applied once
    /// written: a later group can only be replayed after this one).
    pub fn write_positions(&mut self, all: bool, early: &mut Vec<Done>) {
        let mut moved = std::mem::take(&mut self.cursors);
        let mut settles = std::mem::take(&mut self.settles);
        let mut consumers: Vec<Arc<Consumer>> = Vec::new();
        if all {
            for topic in self.shared.topic_list() {
                consumers.extend(topic.consumer_list());
            }
        } else {
            consumers.extend(moved.values().map(|(c, _)| c.clone()));
            consumers.extend(
                settles
                    .values()
                    .filter(|(c, _)| !moved.contains_key(&c.id))
                    .map(|(c, _)| c.clone()),
            );
        }
        for c in consumers {
            let explicit = moved.remove(&c.id).map(|(_, cursor)| cursor);
            let mut settling = settles.remove(&c.id).map(|(_, s)| s).unwrap_or_default();
            settling.sort_unstable();
            let Some(update) = c.position_update(explicit.is_some(), &settling) else {
                continue;
            };
            let cursor = explicit.unwrap_or(update.cursor).max(update.cursor);
            let position = Position {
                cursor,
                floor: update.floor,
            };
            let store = &self.store;
            self.batch
                .insert(&store.cursors, cursor_key(c.id), position.encode());
            for (start, end) in &update.new_runs {
                self.batch
                    .insert(&store.settled, run_key(c.id, *start), end.to_be_bytes());
            }
            for start in &update.dropped_runs {
                self.batch.remove(&store.settled, run_key(c.id, *start));
            }
            if !update.new_runs.is_empty() || !update.dropped_runs.is_empty() {
                early.push(Done::Runs(c.clone(), update.new_runs, update.dropped_runs));
            }
            if update.to_record.is_empty() {
                continue;
            }
            let mut recorded = Vec::with_capacity(update.to_record.len());
            for (seq, record) in &update.to_record {
                match encode(record) {
                    Ok(v) => {
                        self.batch
                            .insert(&store.pending, pending_key(c.id, *seq), v);
                        recorded.push((*seq, record.attempt));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "embedded broker: encoding a pending record");
                    }
                }
            }
            early.push(Done::Recorded(None, c, recorded));
        }
    }

    /// Writes the touched topics' records, commits and (if asked) fsyncs.
    /// Replies in `early` are sent after the write, before the fsync.
    /// `force` fsyncs whatever the sync mode (`flush`).
    pub fn commit(mut self, sync: bool, force: bool, early: Vec<Done>, done: Vec<Done>) {
        for (topic, st) in self.topics.values() {
            match encode(&st.record(topic.id)) {
                Ok(v) => self.batch.insert(&self.store.topics, &*topic.name, v),
                Err(e) => return fail(&e, early, done),
            }
        }
        let batch = std::mem::replace(&mut self.batch, self.store.db.batch());
        let result = batch
            .durability(Some(PersistMode::Buffer))
            .commit()
            .map_err(|e| storage("writing a batch", e));
        if let Err(e) = result {
            let e = self.write_failed(&e);
            return fail(&e, early, done);
        }
        for d in early {
            d.send(None);
        }
        let synced = if force || (sync && self.shared.sync == SyncMode::Always) {
            self.store
                .db
                .persist(PersistMode::SyncAll)
                .map_err(|e| storage("fsync", e))
        } else {
            Ok(())
        };
        // The batch is in the store either way: its seqs are taken. (After
        // a failed fsync fjall refuses every later write, so nothing can be
        // read as durable that was not.)
        self.publish_counters();
        if let Err(e) = synced {
            let e = self.write_failed(&e);
            return fail(&e, Vec::new(), done);
        }
        for d in done {
            d.send(None);
        }
    }

    /// Records a failed write: the broker is not ready until the store is
    /// reopened, and callers get [`BrokerError::Unavailable`] (503, try
    /// again) rather than a storage error for good.
    fn write_failed(&self, e: &BrokerError) -> BrokerError {
        self.shared.health.write_failed(e);
        BrokerError::Unavailable(format!("the store cannot take writes now ({e})"))
    }

    /// Makes the committed counters visible and wakes readers. Never
    /// fails: the counters of a committed batch must be published (or the
    /// next group would reuse its seqs); if the oldest message cannot be
    /// looked up, `first_seq` stays a lower bound until the next try.
    pub fn publish_counters(&mut self) {
        for tid in std::mem::take(&mut self.refirst) {
            if let Some((_, st)) = self.topics.get_mut(&tid) {
                match self.store.first_message_from(tid, st.first_seq) {
                    Ok(Some((seq, rec))) if seq <= st.last_seq => {
                        st.first_seq = seq;
                        st.first_published_at = rec.published_at;
                    }
                    Ok(_) => {
                        st.first_seq = st.last_seq + 1;
                        st.first_published_at = 0;
                        st.depth = 0;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "embedded broker: finding a topic's oldest message");
                    }
                }
            }
        }
        for (topic, st) in self.topics.values() {
            let grew = {
                let mut cur = topic.state();
                let grew = st.last_seq > cur.last_seq;
                *cur = *st;
                grew
            };
            if grew {
                topic.notify.notify_waiters();
            }
        }
    }
}

/// A reply with nothing to return, for [`Group::commit`].
pub(super) fn unit(reply: Reply<()>) -> Done {
    Done::Unit(reply)
}

/// Hands back the entry of a settle that failed: for
/// [`BrokerError::Unavailable`] the stage retries the settle with the same
/// lease; after anything else the message is redelivered.
fn release_settle(consumer: &Consumer, seq: u64, e: &BrokerError) {
    if matches!(e, BrokerError::Unavailable(_)) {
        consumer.unsettle(seq);
    } else {
        consumer.restore(seq, now_millis());
    }
}

/// Replies `e` to everyone.
fn fail(e: &BrokerError, early: Vec<Done>, done: Vec<Done>) {
    tracing::error!(error = %e, "embedded broker commit failed");
    for d in early.into_iter().chain(done) {
        d.send(Some(e));
    }
}

/// Answers an op that cannot be written with `e`.
fn refuse(op: Op, e: &BrokerError) {
    match op {
        Op::Publish { reply, .. } => drop(reply.send(Err(e.clone()))),
        Op::Settle {
            consumer,
            seq,
            reply,
            ..
        } => Done::Settle(reply, consumer, seq).send(Some(e)),
        Op::SettleAll { items, reply } => Done::SettleAll(
            reply,
            items
                .into_iter()
                .map(|item| (item.consumer, item.seq, None))
                .collect(),
        )
        .send(Some(e)),
        Op::Deliver { reply, .. }
        | Op::Nak { reply, .. }
        | Op::Ensure { reply, .. }
        | Op::Flush { reply } => drop(reply.send(Err(e.clone()))),
        Op::Remove { reply, .. } => drop(reply.send(Err(e.clone()))),
    }
}

/// After a reopen: a write that failed may still have landed whole (fjall
/// had written the batch to the journal before the step that failed, and
/// the reopen replayed it), with the topic records it rewrote. Each
/// topic's counters are raised to what the store recorded, or the next
/// publish would reuse a seq that a deduplicated retry already points at.
/// No write runs meanwhile: the committer refuses until this is done.
fn reconcile(shared: &Shared) {
    let Some(store) = shared.store.current() else {
        return;
    };
    for topic in shared.topic_list() {
        let Ok(Some(bytes)) = store.topics.get(&*topic.name) else {
            continue;
        };
        let Ok(rec) = decode::<TopicRecord>(&bytes) else {
            continue;
        };
        let grew = {
            let mut st = topic.state();
            if rec.last_seq > st.last_seq {
                if st.depth == 0 {
                    st.first_seq = rec.first_seq;
                    st.first_published_at = store
                        .first_message_from(topic.id, rec.first_seq)
                        .ok()
                        .flatten()
                        .map_or(0, |(_, m)| m.published_at);
                }
                st.last_seq = rec.last_seq;
                st.depth = rec.depth;
                true
            } else {
                false
            }
        };
        if grew {
            tracing::info!(topic = %topic.name, last_seq = rec.last_seq, "embedded broker: a failed write had landed; counters raised");
            topic.notify.notify_waiters();
        }
    }
}

/// Pause between attempts to reopen a store that failed a write.
const REOPEN_EVERY: Duration = Duration::from_secs(1);

/// Reopens a store that failed a write, on a thread of its own so the
/// committer keeps answering (503) at once meanwhile.
#[derive(Default)]
struct Reopener {
    /// The attempt running now.
    running: Option<std::thread::JoinHandle<()>>,
    /// Not before this.
    next: Option<Instant>,
}

impl Reopener {
    /// After a failed write fjall refuses every later one (it poisons
    /// itself), so the store is closed and opened again, one attempt at a
    /// time with [`REOPEN_EVERY`] between them, until a probe write and
    /// fsync succeed: the disk has room again, descriptors are free.
    /// Meanwhile writes answer [`BrokerError::Unavailable`] and the broker
    /// is not ready.
    fn poke(&mut self, shared: &Arc<Shared>) {
        if self.running.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        if let Some(done) = self.running.take() {
            let _ = done.join();
            self.next = Some(Instant::now() + REOPEN_EVERY);
        }
        if self.next.is_some_and(|next| Instant::now() < next) {
            return;
        }
        let shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("sluice-broker-reopen".into())
            .spawn(move || {
                shared.store.close();
                match shared.store.reopen() {
                    Ok(()) => {
                        reconcile(&shared);
                        shared.health.recovered();
                        tracing::info!("embedded broker: the store takes writes again");
                    }
                    Err(e) => {
                        shared.health.count_error();
                        tracing::warn!(error = %e, "embedded broker: the store still cannot take writes; retrying");
                    }
                }
            });
        match spawned {
            Ok(handle) => self.running = Some(handle),
            Err(e) => tracing::warn!(error = %e, "embedded broker: cannot start a reopen"),
        }
    }

    /// Waits for a running attempt (on shutdown).
    fn finish(&mut self) {
        if let Some(handle) = self.running.take() {
            let _ = handle.join();
        }
    }
}

/// The committer thread's loop: groups ops until the channel closes.
pub(super) fn run(shared: Arc<Shared>, rx: Receiver<Op>) {
    let mut last_maintenance = Instant::now();
    // When settled messages are next deleted, if any were settled since.
    let mut prune_at: Option<Instant> = None;
    let mut reopener = Reopener::default();
    let mut ops = Vec::with_capacity(MAX_GROUP_OPS);
    loop {
        let mut wait = MAINTENANCE_EVERY.saturating_sub(last_maintenance.elapsed());
        if let Some(at) = prune_at {
            wait = wait.min(at.saturating_duration_since(Instant::now()));
        }
        match rx.recv_timeout(wait) {
            Ok(op) => {
                ops.push(op);
                while ops.len() < MAX_GROUP_OPS {
                    match rx.try_recv() {
                        Ok(op) => ops.push(op),
                        Err(_) => break,
                    }
                }
                match (shared.health.write_failure(), shared.store.current()) {
                    (None, Some(store)) => {
                        if process(&shared, store, &mut ops) && prune_at.is_none() {
                            prune_at = Some(Instant::now() + PRUNE_AFTER);
                        }
                    }
                    (why, _) => {
                        let e = BrokerError::Unavailable(format!(
                            "the store cannot take writes now ({})",
                            why.unwrap_or_else(|| "it is being reopened".into())
                        ));
                        for op in ops.drain(..) {
                            refuse(op, &e);
                        }
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if last_maintenance.elapsed() >= MAINTENANCE_EVERY {
            if shared.health.write_failure().is_some() {
                reopener.poke(&shared);
            } else if let Err(e) = retention::maintain(&shared) {
                tracing::warn!(error = %e, "embedded broker maintenance failed");
            }
            last_maintenance = Instant::now();
            prune_at = None;
        } else if prune_at.is_some_and(|at| at <= Instant::now()) {
            prune_at = None;
            if shared.health.write_failure().is_none()
                && let Err(e) = retention::prune(&shared)
            {
                tracing::warn!(error = %e, "embedded broker: deleting settled messages failed");
            }
        }
    }
    reopener.finish();
    if shared.health.write_failure().is_none()
        && let Some(store) = shared.store.current()
    {
        // The last floors, so a clean stop delivers nothing twice.
        let mut group = Group::new(&shared, store.clone());
        let mut early = Vec::new();
        group.write_positions(true, &mut early);
        group.commit(false, false, early, Vec::new());
    }
    if let Some(store) = shared.store.current()
        && let Err(e) = store.db.persist(PersistMode::SyncAll)
    {
        tracing::error!(error = %e, "embedded broker final fsync failed");
    }
}

/// Builds, commits and answers one group. Returns whether it settled
/// deliveries (so settled messages may be deletable).
fn process(shared: &Shared, store: Store, ops: &mut Vec<Op>) -> bool {
    let mut group = Group::new(shared, store);
    let mut early = Vec::new();
    let mut done = Vec::new();
    let mut sync = false;
    let mut force = false;
    let mut settled = false;
    for op in ops.drain(..) {
        match op {
            Op::Publish { messages, reply } => {
                let result = group
                    .resolve(&messages)
                    .and_then(|topics| group.publish(&messages, &topics));
                match result {
                    Ok(acks) => {
                        sync = true;
                        done.push(Done::Acks(reply, acks));
                    }
                    Err(e) => drop(reply.send(Err(e))),
                }
            }
            Op::Settle {
                consumer,
                seq,
                outputs,
                record,
                reply,
            } => match group.settle(&consumer, seq, &outputs, record) {
                Ok(()) => {
                    sync = true;
                    settled = true;
                    done.push(Done::Settle(reply, consumer, seq));
                }
                Err(e) => Done::Settle(reply, consumer, seq).send(Some(&e)),
            },
            Op::SettleAll { items, reply } => {
                let mut answers = Vec::with_capacity(items.len());
                for SettleItem {
                    consumer,
                    seq,
                    outputs,
                } in items
                {
                    match group.settle(&consumer, seq, &outputs, None) {
                        Ok(()) => {
                            sync = true;
                            settled = true;
                            answers.push((consumer, seq, None));
                        }
                        Err(e) => {
                            release_settle(&consumer, seq, &e);
                            answers.push((consumer, seq, Some(e)));
                        }
                    }
                }
                done.push(Done::SettleAll(reply, answers));
            }
            Op::Deliver {
                consumer,
                cursor,
                records,
                leases,
                vanished,
                reply,
            } => {
                let encoded: Result<Vec<_>, _> = records
                    .iter()
                    .map(|(seq, r)| Ok((*seq, encode(r)?)))
                    .collect();
                match encoded {
                    Ok(encoded) => {
                        for (seq, v) in encoded {
                            group.batch.insert(
                                &group.store.pending,
                                pending_key(consumer.id, seq),
                                v,
                            );
                        }
                        for (seq, _) in &vanished {
                            group
                                .batch
                                .remove(&group.store.pending, pending_key(consumer.id, *seq));
                        }
                        if let Some(c) = cursor {
                            let entry = group
                                .cursors
                                .entry(consumer.id)
                                .or_insert_with(|| (consumer.clone(), c));
                            entry.1 = entry.1.max(c);
                        }
                        let recorded = records.iter().map(|(s, r)| (*s, r.attempt)).collect();
                        early.push(Done::Deliver(
                            reply, consumer, cursor, leases, vanished, recorded,
                        ));
                    }
                    Err(e) => drop(reply.send(Err::<(), BrokerError>(e))),
                }
            }
            Op::Nak {
                consumer,
                seq,
                record,
                reply,
            } => match encode(&record) {
                Ok(v) => {
                    group
                        .batch
                        .insert(&group.store.pending, pending_key(consumer.id, seq), v);
                    sync = true;
                    done.push(Done::Recorded(
                        Some(reply),
                        consumer,
                        vec![(seq, record.attempt)],
                    ));
                }
                Err(e) => drop(reply.send(Err(e))),
            },
            Op::Remove { topic, seqs, reply } => match group.remove(&topic, &seqs) {
                Ok(n) => {
                    sync = true;
                    done.push(Done::Count(reply, n));
                }
                Err(e) => drop(reply.send(Err(e))),
            },
            Op::Ensure { apply, reply } => match apply(&mut group) {
                Ok(()) => {
                    sync = true;
                    done.push(Done::Unit(reply));
                }
                Err(e) => drop(reply.send(Err(e))),
            },
            Op::Flush { reply } => {
                sync = true;
                force = true;
                done.push(Done::Unit(reply));
            }
        }
    }
    group.write_positions(false, &mut early);
    group.commit(sync, force, early, done);
    settled
}
