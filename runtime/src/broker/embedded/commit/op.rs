//! The committer's protocol: the [`Op`]s callers send, and how one group
//! of them is built, committed and answered ([`process`]).

use std::sync::Arc;

use super::group::{Done, Group, Reply, release_completion};
use super::state_writes::Stamped;
use crate::broker::Ticket;
use crate::broker::embedded::Shared;
use crate::broker::embedded::consumer::{Consumer, Pending};
use crate::broker::embedded::database::Store;
use crate::broker::embedded::memtables;
use crate::broker::embedded::store::{PendingRecord, encode, pending_key};
use crate::broker::embedded::topic::Topic;
use crate::broker::{BrokerError, Message, PublishAck};

/// A write for the committer.
pub(in crate::broker::embedded) enum Op {
    /// Store messages (duplicate window applies).
    Publish {
        /// The messages, each to its own topic.
        messages: Vec<Message>,
        /// One ack per message.
        reply: Reply<Vec<PublishAck>>,
    },
    /// Publish outputs and remove a pending entry, atomically (ack, term,
    /// complete, dead_letter).
    Complete {
        /// Whose entry.
        consumer: Arc<Consumer>,
        /// Which entry.
        seq: u64,
        /// What to publish with it.
        outputs: Vec<Message>,
        /// The stage dedup record to mark COMPLETED with it (its key and
        /// the holder's ticket).
        record: Option<(Vec<u8>, Ticket)>,
        /// The handler's state writes, checked and written with it (boxed:
        /// most completions have none).
        state: Option<Box<Stamped>>,
        /// Done.
        reply: Reply<()>,
    },
    /// Several completions without dedup records (a batch stage's items), each
    /// as [`Op::Complete`] would write it, answered together: one result per
    /// item, in order.
    CompleteAll {
        /// The completions.
        items: Vec<CompleteItem>,
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
pub(in crate::broker::embedded) type EnsureFn =
    Box<dyn FnOnce(&mut Group<'_>) -> Result<(), BrokerError> + Send>;

/// One completion of an [`Op::CompleteAll`]: a delivery whose lease the caller
/// took, and the outputs to publish as it is removed.
pub(in crate::broker::embedded) struct CompleteItem {
    /// Whose entry.
    pub consumer: Arc<Consumer>,
    /// Which entry.
    pub seq: u64,
    /// What to publish with it.
    pub outputs: Vec<Message>,
}

/// Answers an op that cannot be written with `e`.
pub(super) fn refuse(op: Op, e: &BrokerError) {
    match op {
        Op::Publish { reply, .. } => drop(reply.send(Err(e.clone()))),
        Op::Complete {
            consumer,
            seq,
            reply,
            ..
        } => Done::Complete(reply, consumer, seq).send(Some(e)),
        Op::CompleteAll { items, reply } => Done::CompleteAll(
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

/// Builds, commits and answers one group. Returns whether it completed
/// deliveries (so completed messages may be deletable).
pub(super) fn process(shared: &Shared, store: Store, ops: &mut Vec<Op>) -> bool {
    memtables::wait_for_flushes(&store);
    let mut group = Group::new(shared, store);
    let mut early = Vec::new();
    let mut done = Vec::new();
    let mut sync = false;
    let mut force = false;
    let mut completed = false;
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
            Op::Complete {
                consumer,
                seq,
                outputs,
                record,
                state,
                reply,
            } => match group.complete(&consumer, seq, &outputs, record, state.as_deref()) {
                Ok(()) => {
                    sync = true;
                    completed = true;
                    done.push(Done::Complete(reply, consumer, seq));
                }
                Err(e) => Done::Complete(reply, consumer, seq).send(Some(&e)),
            },
            Op::CompleteAll { items, reply } => {
                let mut answers = Vec::with_capacity(items.len());
                for CompleteItem {
                    consumer,
                    seq,
                    outputs,
                } in items
                {
                    match group.complete(&consumer, seq, &outputs, None, None) {
                        Ok(()) => {
                            sync = true;
                            completed = true;
                            answers.push((consumer, seq, None));
                        }
                        Err(e) => {
                            release_completion(&consumer, seq, &e);
                            answers.push((consumer, seq, Some(e)));
                        }
                    }
                }
                done.push(Done::CompleteAll(reply, answers));
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
    completed
}
