//! One group: the ops the committer took at once, turned into one fjall
//! write batch, and the replies that wait for its commit (and fsync).
//!
//! A [`Group`] adds publishes (seqs, the duplicate window), completions,
//! removals and consumer positions to the batch; [`Group::commit`] writes
//! it, fsyncs once for all of them, and sends each [`Done`].

use std::collections::HashMap;
use std::sync::Arc;

use fjall::{OwnedWriteBatch, PersistMode};
use tokio::sync::oneshot;

use super::state_writes::{self, Stamped, StateView};
use crate::broker::Ticket;
use crate::broker::embedded::consumer::{Consumer, Pending};
use crate::broker::embedded::database::{self, Store, delete_message};
use crate::broker::embedded::memtables;
use crate::broker::embedded::store::{
    DedupRecord, MessageRecordRef, Position, cursor_key, dedup_key, delayed_key, encode,
    encode_message, msg_key, pending_key, run_key, storage,
};
use crate::broker::embedded::topic::{Topic, TopicState};
use crate::broker::embedded::{Shared, SyncMode};
use crate::broker::{BrokerError, Message, PublishAck, now_millis};
use crate::delay;

/// Where an op's result goes.
pub(in crate::broker::embedded) type Reply<T> = oneshot::Sender<Result<T, BrokerError>>;

/// A reply waiting for the group's commit (and fsync).
pub(in crate::broker::embedded) enum Done {
    /// A publish's acks.
    Acks(Reply<Vec<PublishAck>>, Vec<PublishAck>),
    /// A count.
    Count(Reply<u64>, u64),
    /// Nothing to return.
    Unit(Reply<()>),
    /// A completion: the pending entry leaves memory once the removal is
    /// durable (here, not in the caller, so a caller that gives up cannot
    /// leave it behind), or is released for redelivery if it failed.
    Complete(Reply<()>, Arc<Consumer>, u64),
    /// Completions answered together: each entry, and the error it met while
    /// the group was built (already released), if any.
    CompleteAll(
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
    /// A position written: the completed runs it stored and deleted.
    Runs(Arc<Consumer>, Vec<(u64, u64)>, Vec<u64>),
}

impl Done {
    /// Sends the result (or `err`).
    pub(super) fn send(self, err: Option<&BrokerError>) {
        // A caller that gave up (dropped its future) is not an error.
        match (self, err) {
            (Done::Acks(r, v), None) => drop(r.send(Ok(v))),
            (Done::Acks(r, _), Some(e)) => drop(r.send(Err(e.clone()))),
            (Done::Count(r, v), None) => drop(r.send(Ok(v))),
            (Done::Count(r, _), Some(e)) => drop(r.send(Err(e.clone()))),
            (Done::Unit(r), None) => drop(r.send(Ok(()))),
            (Done::Unit(r), Some(e)) => drop(r.send(Err(e.clone()))),
            (Done::Complete(r, c, seq), None) => {
                c.completed(seq);
                c.freed.notify_waiters();
                drop(r.send(Ok(())));
            }
            (Done::Complete(r, c, seq), Some(e)) => {
                release_completion(&c, seq, e);
                c.freed.notify_waiters();
                drop(r.send(Err(e.clone())));
            }
            (Done::CompleteAll(r, items), err) => {
                let mut woken: Vec<Arc<Consumer>> = Vec::new();
                let results = items
                    .into_iter()
                    .map(|(c, seq, failed)| {
                        let result = match (failed, err) {
                            (Some(failed), _) => Err(failed),
                            (None, None) => {
                                c.completed(seq);
                                Ok(())
                            }
                            (None, Some(e)) => {
                                release_completion(&c, seq, e);
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
                    c.freed.notify_waiters();
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
pub(in crate::broker::embedded) struct Group<'a> {
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
    pub(super) cursors: HashMap<u32, (Arc<Consumer>, u64)>,
    /// Deliveries this group completes, by consumer id, for their positions.
    completions: HashMap<u32, (Arc<Consumer>, Vec<u64>)>,
    /// The broker clock for this group.
    pub now: u64,
    /// Bytes of large message records this group writes
    /// ([`database::LARGE_RECORD_BYTES`] each or more).
    large_bytes: u64,
    /// Handler state this group writes, for later completions to check against.
    pub(in crate::broker::embedded) state: state_writes::Overlay,
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
            completions: HashMap::new(),
            now: now_millis(),
            large_bytes: 0,
            state: Default::default(),
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

    /// Checks that every message's topic is declared and its delay
    /// headers parse, before any of them is added to the batch.
    pub(super) fn resolve(&self, messages: &[Message]) -> Result<Vec<Arc<Topic>>, BrokerError> {
        for m in messages {
            delay::due_in(&m.headers, self.now)
                .map_err(|e| BrokerError::BadMessage(format!("message `{}`: {e}", m.id)))?;
        }
        messages
            .iter()
            .map(|m| self.shared.topic(&m.topic))
            .collect()
    }

    /// Adds messages to the batch: duplicate check, seq, record, window.
    pub(super) fn publish(
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
            let published_at = if m.published_at == 0 {
                now
            } else {
                m.published_at
            };
            // The delay headers are resolved once, here, and not stored.
            let (due, stripped) = if m.headers.iter().any(|(n, _)| delay::is_delay_header(n)) {
                let due = delay::due_in(&m.headers, now).map_err(BrokerError::BadMessage)?;
                let kept: Vec<(String, String)> = m
                    .headers
                    .iter()
                    .filter(|(n, _)| !delay::is_delay_header(n))
                    .cloned()
                    .collect();
                (due, Some(kept))
            } else {
                (None, None)
            };
            let value = encode_message(&MessageRecordRef {
                published_at,
                id: &m.id,
                key: &m.key,
                headers: stripped.as_deref().unwrap_or(&m.headers),
                payload: &m.payload,
            })?;
            let seq = match due {
                // Not in the topic yet: its seq comes when it is due.
                Some(due) => {
                    self.delay(topic, due, value);
                    0
                }
                None => {
                    if value.len() >= database::LARGE_RECORD_BYTES {
                        self.large_bytes += value.len() as u64;
                    }
                    self.append(topic, published_at, value)
                }
            };
            if let Some(dk) = dk {
                self.store
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

    /// Adds a delayed message (its record already encoded, delay headers
    /// removed): stored under its due time, counted on its topic, until
    /// `delayed::release` moves it into the topic.
    fn delay(&mut self, topic: &Arc<Topic>, due: u64, value: fjall::Slice) {
        let st = self.topic_state(topic);
        st.delay_seq += 1;
        st.delayed += 1;
        if st.next_due == 0 || due < st.next_due {
            st.next_due = due;
        }
        let key = delayed_key(topic.id, due, st.delay_seq);
        self.batch.insert(&self.store.delayed, key, value);
    }

    /// What a completion's state writes are checked against and added to.
    pub(in crate::broker::embedded) fn state_view(&mut self) -> StateView<'_> {
        StateView {
            shared: self.shared,
            keyspace: &self.store.state,
            overlay: &mut self.state,
            batch: &mut self.batch,
            now: self.now,
        }
    }

    /// Adds an encoded message record to `topic` at its next seq.
    pub(in crate::broker::embedded) fn append(
        &mut self,
        topic: &Arc<Topic>,
        published_at: u64,
        value: fjall::Slice,
    ) -> u64 {
        let st = self.topic_state(topic);
        let seq = st.last_seq + 1;
        st.last_seq = seq;
        if st.depth == 0 {
            st.first_seq = seq;
            st.first_published_at = published_at;
        }
        st.depth += 1;
        self.batch
            .insert(&self.store.messages, msg_key(topic.id, seq), value);
        seq
    }

    /// Adds one completion to the batch: the handler's state writes (if any,
    /// once their checks pass), the dedup record COMPLETED (if any), the
    /// outputs, and the end of the pending entry. What can refuse the
    /// completion is checked before anything is added.
    pub(super) fn complete(
        &mut self,
        consumer: &Arc<Consumer>,
        seq: u64,
        outputs: &[Message],
        record: Option<(Vec<u8>, Ticket)>,
        state: Option<&Stamped>,
    ) -> Result<(), BrokerError> {
        let topics = self.resolve(outputs)?;
        if let Some(stamped) = state {
            state_writes::apply(self.state_view(), &stamped.writes, stamped.first_revision)?;
        }
        if let Some((key, ticket)) = record {
            self.complete_record(key, &ticket)?;
        }
        self.publish(outputs, &topics)?;
        // A recorded entry's record goes. Either way the completion is noted
        // in the consumer's position (`store::Position`): the floor passes
        // it, or a completed run above the floor covers it. A recorded entry
        // needs the run too: below it, an earlier first delivery may hold
        // the floor, and after a restart every seq from the floor up with
        // no record and in no run is delivered again.
        if consumer.is_recorded(seq) {
            self.batch
                .remove(&self.store.pending, pending_key(consumer.id, seq));
        }
        self.completions
            .entry(consumer.id)
            .or_insert_with(|| (consumer.clone(), Vec::new()))
            .1
            .push(seq);
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
        for c in self.shared.consumers_of(topic) {
            for seq in c.drop_removed(seqs, below) {
                self.batch
                    .remove(&self.store.pending, pending_key(c.id, seq));
            }
        }
    }

    /// Writes the position ([`super::store::Position`]) of every consumer
    /// whose cursor moved in this group, that completes first deliveries in
    /// it, or (`all`: the maintenance run) whose floor rose since it was
    /// last written; with the completed runs to store and delete, and
    /// pending records for first deliveries that hold the floor too far
    /// below the cursor. Their `Done`s go to `early` (applied once
    /// written: a later group can only be replayed after this one).
    pub fn write_positions(&mut self, all: bool, early: &mut Vec<Done>) {
        let mut moved = std::mem::take(&mut self.cursors);
        let mut completions = std::mem::take(&mut self.completions);
        let mut consumers: Vec<Arc<Consumer>> = Vec::new();
        if all {
            consumers = self.shared.consumer_list();
        } else {
            consumers.extend(moved.values().map(|(c, _)| c.clone()));
            consumers.extend(
                completions
                    .values()
                    .filter(|(c, _)| !moved.contains_key(&c.id))
                    .map(|(c, _)| c.clone()),
            );
        }
        for c in consumers {
            let explicit = moved.remove(&c.id).map(|(_, cursor)| cursor);
            let mut completing = completions
                .remove(&c.id)
                .map(|(_, s)| s)
                .unwrap_or_default();
            completing.sort_unstable();
            let Some(update) = c.position_update(explicit.is_some(), &completing) else {
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
                self.batch.insert(
                    &store.completed_runs,
                    run_key(c.id, *start),
                    end.to_be_bytes(),
                );
            }
            for start in &update.dropped_runs {
                self.batch
                    .remove(&store.completed_runs, run_key(c.id, *start));
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
        if let Err(e) = state_writes::write_metas(&self.state, &mut self.batch, &self.store.state) {
            return fail(&e, early, done);
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
        state_writes::committed(self.shared, &mut self.state);
        memtables::seal_after_large_writes(
            &self.store,
            &self.shared.large_records,
            self.large_bytes,
        );
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
        state_writes::forget(self.shared);
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
pub(in crate::broker::embedded) fn unit(reply: Reply<()>) -> Done {
    Done::Unit(reply)
}

/// Hands back the entry of a completion that failed: for
/// [`BrokerError::Unavailable`] the stage retries the completion with the same
/// lease; after anything else the message is redelivered.
pub(super) fn release_completion(consumer: &Consumer, seq: u64, e: &BrokerError) {
    if matches!(e, BrokerError::Unavailable(_)) {
        consumer.abandon_completion(seq);
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
