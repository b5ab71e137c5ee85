//! Delayed messages ([`crate::delay`]): stored in the `delayed` keyspace
//! by (topic, due time, counter) until they are due, then moved into their
//! topic by the committer, which gives them their seq then.
//!
//! Memory stays flat however many are delayed: the store holds them, and
//! each topic keeps only a count and the due time of its first one
//! ([`super::topic::TopicState`]). The committer sleeps until the earliest
//! due time of all topics ([`next_due`]) and then moves what is due
//! ([`release`]), oldest first, at most [`RELEASE_BATCH`] per group, in one
//! atomic batch with the topic counters: a kill -9 leaves a message either
//! delayed or in its topic, never both or neither.
//!
//! A released message enters its topic as if published then: its publish
//! time is its release time, so a topic's age retention and oldest-age
//! count from when it could first be delivered.

use super::Shared;
use super::commit::group::Group;
use super::database::Store;
use super::store::{
    MessageRecordRef, decode_message, delayed_due, delayed_key, encode_message, storage,
};
use crate::broker::BrokerError;

/// Most delayed messages moved in one group: a million falling due at once
/// are moved in steps, with the committer's other work in between.
const RELEASE_BATCH: usize = 2048;

/// The range of topic `topic_id`'s delayed keys.
fn range_of(topic_id: u32) -> std::ops::RangeInclusive<[u8; 20]> {
    delayed_key(topic_id, 0, 0)..=delayed_key(topic_id, u64::MAX, u64::MAX)
}

/// When the first delayed message of topic `topic_id` is due, from the
/// store (on open: the in-memory value is kept up to date afterwards).
pub(super) fn first_due(store: &Store, topic_id: u32) -> Result<Option<u64>, BrokerError> {
    match store.delayed.range(range_of(topic_id)).next() {
        Some(guard) => {
            let key = guard
                .key()
                .map_err(|e| storage("reading delayed messages", e))?;
            delayed_due(&key).map(Some)
        }
        None => Ok(None),
    }
}

/// How many delayed messages of topic `topic_id` can be read (for the
/// data tools, which rebuild a topic's counters from what they copy).
pub(super) fn count(store: &Store, topic_id: u32) -> u64 {
    let mut n = 0;
    for guard in store.delayed.range(range_of(topic_id)) {
        if guard.key().is_err() {
            break;
        }
        n += 1;
    }
    n
}

/// The earliest due time over all topics (ms since the epoch), if any
/// message is delayed.
pub(super) fn next_due(shared: &Shared) -> Option<u64> {
    shared
        .topic_list()
        .iter()
        .map(|t| t.snapshot().next_due)
        .filter(|&due| due > 0)
        .min()
}

/// Moves what is due (up to [`RELEASE_BATCH`] messages) into its topics,
/// in one group, committed like any other. Returns how many moved.
pub(super) fn release(shared: &Shared, store: Store) -> Result<usize, BrokerError> {
    let mut group = Group::new(shared, store.clone());
    let now = group.now;
    let mut budget = RELEASE_BATCH;
    for topic in shared.topic_list() {
        let due_at = topic.snapshot().next_due;
        if budget == 0 || due_at == 0 || due_at > now {
            continue;
        }
        let mut moved = 0;
        let mut next_due = 0;
        // From the first live due time: what lies before it is deletes
        // of earlier releases, which a scan from the start of the range
        // would wade through again each time until a compaction.
        let from = delayed_key(topic.id, due_at, 0)..=delayed_key(topic.id, u64::MAX, u64::MAX);
        for guard in store.delayed.range(from) {
            let (key, value) = guard
                .into_inner()
                .map_err(|e| storage("reading delayed messages", e))?;
            let due = delayed_due(&key)?;
            if due > now || budget == 0 {
                next_due = due;
                break;
            }
            let rec = decode_message(value)?;
            let value = encode_message(&MessageRecordRef {
                published_at: now,
                id: &rec.id,
                key: &rec.key,
                headers: &rec.headers,
                payload: &rec.payload,
            })?;
            group.append(&topic, now, value);
            // Written once (the counter never repeats): a weak delete
            // vanishes with the record, as a message's does.
            group.batch.remove_weak(&store.delayed, key);
            moved += 1;
            budget -= 1;
        }
        let st = group.topic_state(&topic);
        st.delayed = st.delayed.saturating_sub(moved);
        st.next_due = next_due;
    }
    let moved = RELEASE_BATCH - budget;
    group.commit(true, false, Vec::new(), Vec::new());
    Ok(moved)
}
