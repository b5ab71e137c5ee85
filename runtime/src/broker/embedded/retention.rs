//! Maintenance, run by the committer thread between groups: what may be
//! deleted is deleted, in bounded chunks so a group never waits long.
//! The full run comes every 200 ms; messages completed by everyone are also
//! deleted 10 ms after a completion ([`prune`]), because a topic's depth is
//! what its high-water mark counts.
//!
//! - **Completed by everyone.** A topic with consumers drops messages below
//!   its low watermark: the minimum over its consumers of their cursor and
//!   oldest pending seq. Messages a filter skipped are behind the cursor, so
//!   they count as completed.
//! - **Too old.** A topic with `retention` drops messages (oldest first)
//!   published longer ago than that, completed or not, with the pending
//!   entries that pointed at them.
//! - **Duplicate window.** A generation a window old starts the next one,
//!   and the other is cleared whole ([`super::window`]).
//! - **Stage dedup records** past their TTL are removed.
//! - **Floors** that rose since the last group are written
//!   ([`super::store::Position`]).
//!
//! A topic with no consumers (a DLQ) keeps everything until `remove` or
//! its age retention.

use std::sync::Arc;

use super::Shared;
use super::commit::group::{Done, Group, unit};
use super::database::delete_message;
use super::store::{decode_message, key_seq, msg_key, storage};
use super::topic::Topic;
use crate::broker::BrokerError;

/// Most deletions per maintenance run.
const CHUNK: usize = 50_000;

/// One maintenance run: everything above.
pub(super) fn maintain(shared: &Shared) -> Result<(), BrokerError> {
    if let Some(store) = shared.store.current() {
        super::memtables::release_flushed(&store, &shared.large_records);
    }
    run(shared, true)
}

/// Deletes only what every consumer completed; the committer runs this soon
/// after completions, so a topic's depth (which its high-water mark counts)
/// follows its consumers closely.
pub(super) fn prune(shared: &Shared) -> Result<(), BrokerError> {
    run(shared, false)
}

/// A maintenance run; `full`: with age retention, the window, the dedup
/// records and the floors.
fn run(shared: &Shared, full: bool) -> Result<(), BrokerError> {
    let Some(store) = shared.store.current() else {
        return Ok(());
    };
    let mut group = Group::new(shared, store);
    let mut budget = CHUNK;
    for topic in shared.topic_list() {
        if budget == 0 {
            break;
        }
        let st = topic.snapshot();
        if st.depth == 0 {
            continue;
        }
        let consumers = shared.consumers_of(&topic);
        if !consumers.is_empty() {
            let watermark = consumers
                .iter()
                .map(|c| c.watermark())
                .min()
                .unwrap_or(0)
                .min(st.last_seq + 1);
            if watermark > st.first_seq {
                delete_below(&mut group, &topic, watermark, &mut budget)?;
            }
        }
        if let Some(retention) = st.retention_ms.filter(|_| full) {
            let cutoff = group.now.saturating_sub(retention);
            expire(&mut group, &topic, cutoff, &mut budget)?;
        }
    }
    if !full {
        return commit(group, Vec::new());
    }
    if shared.dedup_window_ms > 0 {
        // An idle broker drops an expired generation too.
        let window = group.store.window.clone();
        window.rotate(&mut group.batch, group.now, shared.dedup_window_ms)?;
    }
    super::idempotency::sweep(&mut group)?;
    super::state::sweep(&mut group)?;
    // Floors that rose since the last group (the pipeline went idle).
    let mut early = Vec::new();
    group.write_positions(true, &mut early);
    commit(group, early)
}

/// Writes what a run put in its batch (to the OS: nothing it deletes
/// needs an fsync to be safe).
fn commit(group: Group<'_>, early: Vec<Done>) -> Result<(), BrokerError> {
    if group.batch.is_empty() {
        return Ok(());
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    group.commit(false, false, early, vec![unit(tx)]);
    rx.blocking_recv()
        .map_err(|_| BrokerError::Unavailable("maintenance reply lost".into()))?
}

/// Deletes the stored messages of `topic` below `below`.
fn delete_below(
    group: &mut Group<'_>,
    topic: &Arc<Topic>,
    below: u64,
    budget: &mut usize,
) -> Result<(), BrokerError> {
    let store = group.store.clone();
    let from = group.topic_state(topic).first_seq;
    let mut deleted = 0u64;
    let mut next = from;
    for guard in store
        .messages
        .range(msg_key(topic.id, from)..msg_key(topic.id, below))
    {
        if *budget == 0 {
            break;
        }
        let key = guard.key().map_err(|e| storage("reading a message", e))?;
        next = key_seq(&key)? + 1;
        delete_message(&mut group.batch, &store.messages, &key);
        deleted += 1;
        *budget -= 1;
    }
    if *budget > 0 {
        next = below;
    }
    let st = group.topic_state(topic);
    st.depth = st.depth.saturating_sub(deleted);
    st.first_seq = st.first_seq.max(next);
    group.refirst.push(topic.id);
    Ok(())
}

/// Deletes the messages of `topic` published before `cutoff`, oldest
/// first, and the pending entries that pointed at them.
fn expire(
    group: &mut Group<'_>,
    topic: &Arc<Topic>,
    cutoff: u64,
    budget: &mut usize,
) -> Result<(), BrokerError> {
    let store = group.store.clone();
    let from = group.topic_state(topic).first_seq;
    let mut deleted = 0u64;
    let mut next = None;
    for guard in store
        .messages
        .range(msg_key(topic.id, from)..=msg_key(topic.id, u64::MAX))
    {
        if *budget == 0 {
            break;
        }
        let (key, value) = guard
            .into_inner()
            .map_err(|e| storage("reading a message", e))?;
        let record = decode_message(value)?;
        if record.published_at >= cutoff {
            break;
        }
        next = Some(key_seq(&key)? + 1);
        delete_message(&mut group.batch, &store.messages, &key);
        deleted += 1;
        *budget -= 1;
    }
    let Some(next) = next else {
        return Ok(());
    };
    let st = group.topic_state(topic);
    st.depth = st.depth.saturating_sub(deleted);
    st.first_seq = st.first_seq.max(next);
    group.refirst.push(topic.id);
    group.drop_pending(topic, &[], next);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::database::{Store, delete_message};
    use super::super::store::msg_key;

    /// Why consumed messages go with weak tombstones: messages deleted
    /// before their memtable is flushed cost the tables nothing.
    #[test]
    fn messages_deleted_before_their_flush_never_reach_a_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let mut batch = store.db.batch();
        for seq in 1..=10_000 {
            batch.insert(&store.messages, msg_key(1, seq), vec![b'x'; 64]);
        }
        batch.commit().expect("commit");
        let mut batch = store.db.batch();
        for seq in 1..=10_000 {
            delete_message(&mut batch, &store.messages, &msg_key(1, seq));
        }
        // One message stays, so the flush has something to write.
        batch.insert(&store.messages, msg_key(1, 10_001), vec![b'y'; 64]);
        batch.commit().expect("commit");
        store.messages.rotate_memtable_and_wait().expect("flush");
        let left: Vec<_> = store
            .messages
            .iter()
            .map(|g| g.key().expect("key").to_vec())
            .collect();
        assert_eq!(left, vec![msg_key(1, 10_001).to_vec()]);
        assert!(
            store.messages.disk_space() < 16 * 1024,
            "{} bytes of tables for one message",
            store.messages.disk_space()
        );
    }
}
