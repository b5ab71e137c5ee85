//! Open-time load: the in-memory state (topics and their counters,
//! consumers, cursors, pending sets) rebuilt from the store.
//!
//! Leases do not survive a restart: the data directory is locked to one
//! process, so every lease of the previous one is dead, and its entries are
//! due for redelivery at once (with their delivery counts, so a poison
//! message still reaches max_attempts). Nak delays are kept. First
//! deliveries have no records: the consumer's position says which seqs
//! they were ([`first_deliveries`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Arc;

use super::consumer::{Consumer, ConsumerState, Pending};
use super::database::Store;
use super::store::{
    ConsumerRecord, PendingRecord, Position, TopicRecord, cursor_key, decode, key_seq, msg_key,
    storage,
};
use super::topic::{Topic, TopicState};
use crate::broker::{BrokerError, ConsumerSpec, now_millis};

/// What open found.
pub(super) struct Loaded {
    /// Topics by name.
    pub topics: HashMap<String, Arc<Topic>>,
    /// Consumers by name.
    pub consumers: HashMap<String, Arc<Consumer>>,
    /// The next free topic id.
    pub next_topic_id: u32,
    /// The next free consumer id.
    pub next_consumer_id: u32,
}

/// Adds the first deliveries the position covers: every seq in
/// `floor..cursor` with no pending record and in no completed run, whose
/// message is still stored and passes the filter, was delivered once and
/// not completed. Each
/// is due now, at attempt 1 (its next delivery is attempt 2), and stays
/// unrecorded, holding the floor, until then.
fn first_deliveries(
    store: &Store,
    topic: &Topic,
    position: Position,
    now: u64,
    state: &mut ConsumerState,
) -> Result<(), BrokerError> {
    if position.floor >= position.cursor {
        return Ok(());
    }
    for guard in store
        .messages
        .range(msg_key(topic.id, position.floor)..msg_key(topic.id, position.cursor))
    {
        let (k, v) = guard
            .into_inner()
            .map_err(|e| storage("reading messages", e))?;
        let seq = key_seq(&k)?;
        if state.pending.contains_key(&seq) || Consumer::in_completed_run(state, seq) {
            continue;
        }
        let message = super::fetch::message(topic, decode(&v)?);
        if !state.spec.accepts(&message) {
            continue;
        }
        state.pending.insert(
            seq,
            Pending {
                attempt: 1,
                due: now,
                leased: false,
                completing: false,
                published_at: message.published_at,
            },
        );
        state.timers.push(Reverse((now, seq)));
        state.unrecorded.insert(seq);
    }
    Ok(())
}

/// Reads the store's topics, consumers and pending entries.
pub(super) fn load(store: &Store) -> Result<Loaded, BrokerError> {
    let now = now_millis();
    let mut topics = HashMap::new();
    let mut next_topic_id = 1;
    for guard in store.topics.iter() {
        let (k, v) = guard
            .into_inner()
            .map_err(|e| storage("reading topics", e))?;
        let name = String::from_utf8_lossy(&k).into_owned();
        let rec: TopicRecord = decode(&v)?;
        next_topic_id = next_topic_id.max(rec.id + 1);
        let mut state = TopicState {
            retention_ms: rec.retention_ms,
            first_seq: rec.last_seq + 1,
            last_seq: rec.last_seq,
            delayed: rec.delayed,
            delay_seq: rec.delay_seq,
            next_due: super::delayed::first_due(store, rec.id)?.unwrap_or(0),
            ..TopicState::default()
        };
        if let Some((seq, first)) = store.first_message_from(rec.id, rec.first_seq)?
            && seq <= rec.last_seq
        {
            state.first_seq = seq;
            state.first_published_at = first.published_at;
            state.depth = rec.depth;
        }
        topics.insert(name.clone(), Arc::new(Topic::new(rec.id, &name, state)));
    }

    let mut consumers = HashMap::new();
    let mut next_consumer_id = 1;
    for guard in store.consumers.iter() {
        let (k, v) = guard
            .into_inner()
            .map_err(|e| storage("reading consumers", e))?;
        let name = String::from_utf8_lossy(&k).into_owned();
        let rec: ConsumerRecord = decode(&v)?;
        next_consumer_id = next_consumer_id.max(rec.id + 1);
        let Some(topic) = topics.get(&rec.topic).cloned() else {
            tracing::warn!(consumer = %name, topic = %rec.topic, "consumer of a missing topic ignored");
            continue;
        };
        let position = match store
            .cursors
            .get(cursor_key(rec.id))
            .map_err(|e| storage("reading a cursor", e))?
        {
            Some(b) => Position::decode(&b)
                .ok_or_else(|| BrokerError::Storage(format!("malformed cursor of {name}")))?,
            None => {
                let first = topic.snapshot().first_seq;
                Position {
                    cursor: first,
                    floor: first,
                }
            }
        };
        let cursor = position.cursor;
        let mut pending = BTreeMap::new();
        let mut timers = BinaryHeap::new();
        for guard in store.pending.prefix(rec.id.to_be_bytes()) {
            let (k, v) = guard
                .into_inner()
                .map_err(|e| storage("reading pending entries", e))?;
            let seq = key_seq(&k)?;
            let p: PendingRecord = decode(&v)?;
            let due = if p.visible_at == 0 { now } else { p.visible_at };
            pending.insert(
                seq,
                Pending {
                    attempt: p.attempt,
                    due,
                    leased: false,
                    completing: false,
                    published_at: p.published_at,
                },
            );
            timers.push(Reverse((due, seq)));
        }
        let spec = ConsumerSpec {
            name: name.clone(),
            topic: rec.topic.clone(),
            filter: rec.filter,
            ack_wait: std::time::Duration::from_millis(rec.ack_wait_ms),
            max_ack_pending: rec.max_ack_pending,
            max_deliver: None,
        };
        let mut state = ConsumerState::new(spec, cursor);
        state.paused = rec.paused;
        state.pending = pending;
        state.timers = timers;
        for guard in store.completed_runs.prefix(rec.id.to_be_bytes()) {
            let (k, v) = guard
                .into_inner()
                .map_err(|e| storage("reading completed runs", e))?;
            let end = <[u8; 8]>::try_from(&*v)
                .map(u64::from_be_bytes)
                .map_err(|_| BrokerError::Storage(format!("malformed completed run of {name}")))?;
            state.completed_runs.insert(key_seq(&k)?, end);
        }
        first_deliveries(store, &topic, position, now, &mut state)?;
        let consumer = Arc::new(Consumer::new(rec.id, topic.clone(), state));
        consumers.insert(name, consumer);
    }
    Ok(Loaded {
        topics,
        consumers,
        next_topic_id,
        next_consumer_id,
    })
}
