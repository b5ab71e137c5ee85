//! Large message records and the memory fjall holds for them.
//!
//! A record sits in its keyspace's memtable until a worker thread flushes
//! it, and a flushed memtable stays referenced by fjall's version history
//! until the next memtable rotation lets fjall drop the older versions.
//! Small records never notice: a memtable rotates at 4 MiB. A 60 MB
//! payload is different (measured, `tests/fixtures/large_messages.py`):
//!
//! - each group that wrote one rotated only when a busy worker got to it,
//!   so several large records shared one memtable and waited for its
//!   flush, and
//! - after a burst the daemon kept the last memtables (hundreds of MB)
//!   until some later write rotated again, which an idle daemon never does.
//!
//! So the committer seals the `messages` memtable itself once the large
//! records written since the last seal fill one ([`seal_after_large_writes`]),
//! waits before a new group while unflushed memtables exceed
//! [`WRITE_BUFFER_LIMIT`] and a flush is under way ([`wait_for_flushes`]),
//! and, in maintenance once those flushes are done, rotates once more so
//! fjall lets go of the flushed ones ([`release_flushed`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::database::{MESSAGES_MEMTABLE_BYTES, Store};

/// Unflushed memtable bytes (all keyspaces) above which the committer
/// waits for the flushes before it writes the next group. The small
/// keyspaces' memtables stay far below this together.
pub(super) const WRITE_BUFFER_LIMIT: u64 = 64 * 1024 * 1024;

/// The longest the committer waits for flushes before it writes anyway: a
/// flush that cannot finish (a full disk) must not stop every write
/// forever; those fail on their own and say why.
const FLUSH_WAIT_LIMIT: Duration = Duration::from_secs(30);

/// A key no message ever has (message keys are 12 bytes); the rotation
/// that releases flushed memtables removes it, so the memtable it seals is
/// never empty. A removal of an absent key is invisible to every read.
const RELEASE_KEY: &[u8] = b"\xffsluice-release";

/// The committer's account of large records in the `messages` memtable.
#[derive(Debug, Default)]
pub(super) struct LargeRecords {
    /// Bytes of large records written since the last seal.
    unsealed: AtomicU64,
    /// Whether a memtable was sealed and not yet released.
    sealed: AtomicBool,
}

/// After a group that wrote `large_bytes` of large records: once those
/// since the last seal fill a memtable, seals it, so it is flushed now
/// rather than when a busy worker gets to it, and no later record joins
/// it. (Many records of 100 KiB seal a memtable every 4 MiB, as often as
/// fjall would rotate it; one of 60 MB seals at once.)
pub(super) fn seal_after_large_writes(store: &Store, large: &LargeRecords, large_bytes: u64) {
    if large_bytes == 0 {
        return;
    }
    let unsealed = large.unsealed.fetch_add(large_bytes, Ordering::Relaxed) + large_bytes;
    if unsealed < MESSAGES_MEMTABLE_BYTES {
        return;
    }
    large.unsealed.store(0, Ordering::Relaxed);
    // Failing to rotate leaves the memtable to rotate on its own.
    if let Err(e) = store.messages.rotate_memtable() {
        tracing::debug!(error = %e, "sealing the messages memtable failed");
    }
    large.sealed.store(true, Ordering::Relaxed);
}

/// Waits while the memtables hold more than [`WRITE_BUFFER_LIMIT`] bytes
/// that are not flushed yet and flushes are under way, up to
/// [`FLUSH_WAIT_LIMIT`]. With no flush queued (none was needed, or one
/// failed) there is nothing to wait for.
pub(super) fn wait_for_flushes(store: &Store) {
    let behind =
        || store.db.write_buffer_size() > WRITE_BUFFER_LIMIT && store.db.outstanding_flushes() > 0;
    if !behind() {
        return;
    }
    let started = Instant::now();
    while behind() {
        if started.elapsed() > FLUSH_WAIT_LIMIT {
            tracing::warn!(
                unflushed_bytes = store.db.write_buffer_size(),
                waited = ?FLUSH_WAIT_LIMIT,
                "the store's flushes are not keeping up; writing anyway"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Once the sealed large records are flushed, rotates the `messages`
/// memtable once more so fjall drops the versions that still reference
/// the flushed memtables. Called from the committer's maintenance.
pub(super) fn release_flushed(store: &Store, large: &LargeRecords) {
    if !large.sealed.load(Ordering::Relaxed) || store.db.outstanding_flushes() > 0 {
        return;
    }
    large.sealed.store(false, Ordering::Relaxed);
    let rotated = store
        .messages
        .remove(RELEASE_KEY)
        .and_then(|()| store.messages.rotate_memtable());
    if let Err(e) = rotated {
        tracing::debug!(error = %e, "releasing flushed memtables failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::embedded::store::msg_key;

    /// Waits (up to a generous minute) until `done` holds.
    fn wait(what: &str, mut done: impl FnMut() -> bool) {
        let started = Instant::now();
        while !done() {
            assert!(started.elapsed() < Duration::from_secs(60), "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A record of a memtable's size: sealed at once.
    const SIZE: usize = MESSAGES_MEMTABLE_BYTES as usize;

    fn write_large(store: &Store, large: &LargeRecords, seq: u64) {
        let mut batch = store.db.batch();
        let value = vec![b'x'; SIZE];
        batch.insert(&store.messages, msg_key(1, seq), value.clone());
        batch.commit().expect("commit");
        seal_after_large_writes(store, large, value.len() as u64);
    }

    /// Without the seal, the record would wait in its memtable until a
    /// worker rotates it; with it, it is flushed (to a blob file) at once.
    #[test]
    fn a_large_record_is_sealed_and_flushed_at_once_then_released() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let large = LargeRecords::default();
        write_large(&store, &large, 1);
        wait("the sealed memtable was not flushed", || {
            store.messages.blob_file_count() == 1 && store.db.outstanding_flushes() == 0
        });
        assert!(large.sealed.load(Ordering::Relaxed));
        release_flushed(&store, &large);
        assert!(!large.sealed.load(Ordering::Relaxed), "released once");
        // The release's removal is invisible: the message is all there is.
        let keys: Vec<_> = store
            .messages
            .iter()
            .map(|g| g.key().expect("key").to_vec())
            .collect();
        assert_eq!(keys, vec![msg_key(1, 1).to_vec()]);
        let stored = store
            .messages
            .get(msg_key(1, 1))
            .expect("get")
            .expect("kept");
        assert_eq!(stored.len(), SIZE);
    }

    /// A store whose `messages` keyspace was created before key-value
    /// separation keeps its settings: it opens, and large records stay in
    /// its tables.
    /// Records of 100 KiB seal a memtable once they fill one, not every
    /// group: a stream of them must not make a table per group.
    #[test]
    fn small_large_records_seal_once_a_memtable_is_full() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let large = LargeRecords::default();
        let each = 100 * 1024;
        let fill = MESSAGES_MEMTABLE_BYTES.div_ceil(each);
        for _ in 1..fill {
            seal_after_large_writes(&store, &large, each);
        }
        assert!(!large.sealed.load(Ordering::Relaxed), "sealed too early");
        seal_after_large_writes(&store, &large, each);
        assert!(large.sealed.load(Ordering::Relaxed), "never sealed");
        assert_eq!(large.unsealed.load(Ordering::Relaxed), 0);
        seal_after_large_writes(&store, &large, each);
        assert_eq!(large.unsealed.load(Ordering::Relaxed), each);
    }

    #[test]
    fn a_store_created_without_blob_files_keeps_working_without_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let db = fjall::Database::builder(dir.path()).open().expect("db");
            db.keyspace("messages", fjall::KeyspaceCreateOptions::default)
                .expect("keyspace");
            db.persist(fjall::PersistMode::SyncAll).expect("persist");
        }
        let store = Store::open(dir.path()).expect("open");
        let large = LargeRecords::default();
        write_large(&store, &large, 7);
        wait("the sealed memtable was not flushed", || {
            store.db.outstanding_flushes() == 0 && store.messages.table_count() == 1
        });
        assert_eq!(store.messages.blob_file_count(), 0);
        let stored = store
            .messages
            .get(msg_key(1, 7))
            .expect("get")
            .expect("kept");
        assert_eq!(stored.len(), SIZE);
    }
}
