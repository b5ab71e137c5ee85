//! The on-disk layout: which fjall keyspaces exist, how their keys are
//! built and what their values hold.
//!
//! | keyspace | key | value |
//! |---|---|---|
//! | `messages` | topic id (u32 BE) + seq (u64 BE) | [`MessageRecord`] |
//! | `topics` | topic name | [`TopicRecord`] (id, retention, counters) |
//! | `consumers` | consumer name | [`ConsumerRecord`] (id, topic, spec) |
//! | `cursors` | consumer id (u32 BE) | next seq to read, then the floor (u64 BE each; see [`Position`]) |
//! | `pending` | consumer id (u32 BE) + seq (u64 BE) | [`PendingRecord`] |
//! | `settled` | consumer id (u32 BE) + first seq (u64 BE) | end seq, exclusive (u64 BE): first deliveries settled above the floor |
//! | `dedup`, `dedup_b` | topic id (u32 BE) + message id | [`DedupRecord`]: the duplicate window's two generations ([`super::window`]) |
//! | `idempotency` | consumer name + 0 + SHA-256 of the dedup key | [`crate::dedup::Record`] (COMPLETED) |
//!
//! Big-endian integers make byte order equal numeric order, so a topic's
//! messages and a consumer's pending entries are contiguous ranges.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use bytes::Bytes;
use fjall::config::{BloomConstructionPolicy, FilterPolicy, FilterPolicyEntry, PinningPolicy};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, OwnedWriteBatch};
use serde::{Deserialize, Serialize};

use super::window::DedupWindow;
use crate::broker::BrokerError;

/// Block cache shared by all keyspaces. Reads of a backlog go through it,
/// so it caps what a large backlog costs in memory.
///
/// The memtable sizes below are what fjall accounts (key + value bytes);
/// with small records a memtable's real footprint is about three times
/// that (skiplist nodes, per-entry allocations), and a sealed memtable
/// lives on while it is flushed. Measured: 1M unconsumed 64 B messages
/// keep the process near 100 MB RSS, flat (BENCHMARKS.md).
const CACHE_BYTES: u64 = 8 * 1024 * 1024;
/// Write buffer of the `messages` keyspace: the biggest writer.
const MESSAGES_MEMTABLE_BYTES: u64 = 4 * 1024 * 1024;
/// Write buffer of each duplicate-window generation.
const DEDUP_MEMTABLE_BYTES: u64 = 4 * 1024 * 1024;
/// Write buffer of the small bookkeeping keyspaces.
const SMALL_MEMTABLE_BYTES: u64 = 2 * 1024 * 1024;
/// Journal size after which fjall flushes memtables so old journals can go
/// (fjall's minimum). Journals live on disk, so this bounds disk, not RAM.
const MAX_JOURNAL_BYTES: u64 = 64 * 1024 * 1024;

/// The database and its keyspaces.
#[derive(Clone)]
pub(super) struct Store {
    /// The fjall database (journal, memtables, tables).
    pub db: Database,
    /// Message bodies by (topic, seq).
    pub messages: Keyspace,
    /// Topic records by name.
    pub topics: Keyspace,
    /// Consumer records by name.
    pub consumers: Keyspace,
    /// Consumer cursors by consumer id.
    pub cursors: Keyspace,
    /// Delivered-but-unsettled entries by (consumer, seq).
    pub pending: Keyspace,
    /// Runs of first deliveries settled above their consumer's floor, by
    /// (consumer, first seq) (see [`Position`]).
    pub settled: Keyspace,
    /// The duplicate window: (topic, message id) -> seq, in generations.
    pub window: DedupWindow,
    /// Stage dedup records (COMPLETED) by (consumer, key).
    pub idempotency: Keyspace,
}

impl Store {
    /// Opens (or creates) the database in `dir`; fjall replays its journal,
    /// discarding a torn last batch.
    ///
    /// The journals are verified first ([`super::journal`]): any damage
    /// but a torn tail refuses, before fjall (which would truncate the
    /// journal at the damage) touches a file. A panic inside fjall is
    /// caught and refused the same way.
    pub fn open(dir: &Path) -> Result<Store, BrokerError> {
        let journals = super::journal::verify(dir)
            .map_err(|e| storage(format!("reading the journals in {}", dir.display()), e))?;
        if let Some(why) = journals.iter().find_map(|j| j.refusal()) {
            return Err(BrokerError::Storage(damaged(dir, &why)));
        }
        guard_panic(dir, || Store::open_unchecked(dir))
    }

    /// [`Store::open`] without the journal check (which the data tools run
    /// themselves).
    pub fn open_unchecked(dir: &Path) -> Result<Store, BrokerError> {
        let db = Database::builder(dir)
            .cache_size(CACHE_BYTES)
            .max_journaling_size(MAX_JOURNAL_BYTES)
            // The committer decides when to write and when to fsync.
            .manual_journal_persist(true)
            .open()
            .map_err(|e| storage(format!("opening {}", dir.display()), e))?;
        let ks = |name: &str, memtable: u64| {
            db.keyspace(name, || {
                KeyspaceCreateOptions::default()
                    .max_memtable_size(memtable)
                    .manual_journal_persist(true)
            })
            .map_err(|e| storage(format!("opening keyspace {name}"), e))
        };
        // A keyspace read mostly by point lookups of absent keys: bloom
        // filters (and indexes) pinned in memory.
        let probed = |name: &str, memtable: u64| {
            db.keyspace(name, || {
                KeyspaceCreateOptions::default()
                    .max_memtable_size(memtable)
                    .manual_journal_persist(true)
                    .filter_policy(FilterPolicy::all(FilterPolicyEntry::Bloom(
                        BloomConstructionPolicy::BitsPerKey(10.0),
                    )))
                    .filter_block_pinning_policy(PinningPolicy::all(true))
                    .index_block_pinning_policy(PinningPolicy::all(true))
            })
            .map_err(|e| storage(format!("opening keyspace {name}"), e))
        };
        // Stores written before the window had generations kept an expiry
        // index beside it; the generations need none.
        if db.keyspace_exists("dedup_expiry") {
            let old = ks("dedup_expiry", SMALL_MEMTABLE_BYTES)?;
            db.delete_keyspace(old)
                .map_err(|e| storage("removing the old keyspace dedup_expiry", e))?;
        }
        Ok(Store {
            messages: ks("messages", MESSAGES_MEMTABLE_BYTES)?,
            topics: ks("topics", SMALL_MEMTABLE_BYTES)?,
            consumers: ks("consumers", SMALL_MEMTABLE_BYTES)?,
            cursors: ks("cursors", SMALL_MEMTABLE_BYTES)?,
            pending: ks("pending", SMALL_MEMTABLE_BYTES)?,
            settled: ks("settled", SMALL_MEMTABLE_BYTES)?,
            // Every publish probes the window for an id that is almost
            // never there: that is a bloom filter check per table, and the
            // filters must stay in memory (pinned, ~1.2 B per id) or each
            // probe reloads a filter block through the small cache (this
            // took 1M publishes from 4 s to 25 s before it was pinned).
            window: DedupWindow::open([
                probed("dedup", DEDUP_MEMTABLE_BYTES)?,
                probed("dedup_b", DEDUP_MEMTABLE_BYTES)?,
            ])?,
            // Likewise, a stage's dedup check probes for a key that is
            // usually not there.
            idempotency: probed("idempotency", SMALL_MEMTABLE_BYTES)?,
            db,
        })
    }

    /// The stored message `seq` of topic `topic_id`, if any.
    pub fn message(&self, topic_id: u32, seq: u64) -> Result<Option<MessageRecord>, BrokerError> {
        match self
            .messages
            .get(msg_key(topic_id, seq))
            .map_err(|e| storage("reading a message", e))?
        {
            Some(bytes) => decode(&bytes).map(Some),
            None => Ok(None),
        }
    }

    /// The first stored message of a topic with `seq >= from`, if any.
    pub fn first_message_from(
        &self,
        topic_id: u32,
        from: u64,
    ) -> Result<Option<(u64, MessageRecord)>, BrokerError> {
        let mut iter = self
            .messages
            .range(msg_key(topic_id, from)..=msg_key(topic_id, u64::MAX));
        match iter.next() {
            Some(guard) => {
                let (k, v) = guard
                    .into_inner()
                    .map_err(|e| storage("reading a message", e))?;
                Ok(Some((key_seq(&k)?, decode(&v)?)))
            }
            None => Ok(None),
        }
    }
}

/// The open store, replaceable: after a failed write fjall refuses every
/// later one, so the committer closes it and opens it again
/// ([`StoreSlot::reopen`]). Readers take a clone per operation.
pub(super) struct StoreSlot {
    /// fjall's directory.
    dir: PathBuf,
    /// The store; None while it is being reopened.
    store: RwLock<Option<Store>>,
}

impl StoreSlot {
    /// A slot holding `store`, opened from `dir`.
    pub fn new(dir: PathBuf, store: Store) -> StoreSlot {
        StoreSlot {
            dir,
            store: RwLock::new(Some(store)),
        }
    }

    /// The store, or [`BrokerError::Unavailable`] while it is reopened.
    pub fn get(&self) -> Result<Store, BrokerError> {
        self.current().ok_or_else(|| {
            BrokerError::Unavailable("the store is being reopened after a failed write".into())
        })
    }

    /// The store, if open.
    pub fn current(&self) -> Option<Store> {
        self.store
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Drops this slot's handle (fjall closes once readers drop theirs).
    pub fn close(&self) {
        let old = self
            .store
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        drop(old);
    }

    /// Opens the store again (after [`StoreSlot::close`]) and proves it
    /// takes writes: a probe batch (a tombstone of a key never written),
    /// fsynced.
    pub fn reopen(&self) -> Result<(), BrokerError> {
        let store = Store::open(&self.dir)?;
        let mut probe = store.db.batch();
        probe.remove(&store.messages, PROBE_KEY);
        probe
            .commit()
            .map_err(|e| storage("writing a probe batch", e))?;
        store
            .db
            .persist(fjall::PersistMode::SyncAll)
            .map_err(|e| storage("fsync of a probe batch", e))?;
        *self
            .store
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(store);
        Ok(())
    }
}

/// A key no record has (message keys start with a topic id; no topic has
/// id 0xffffffff), written as a tombstone to prove writes work.
const PROBE_KEY: &[u8] = b"\xff\xff\xff\xffprobe";

/// A stored message. The topic is the key's; the seq is the key's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct MessageRecord {
    /// Publish time, ms since the epoch; first so age checks read it early.
    pub published_at: u64,
    /// The message id.
    pub id: String,
    /// The ordering key.
    pub key: Option<String>,
    /// The headers.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub payload: Bytes,
}

/// [`MessageRecord`] borrowed from a [`crate::broker::Message`], so
/// encoding copies nothing first. Same wire format.
#[derive(Serialize)]
pub(super) struct MessageRecordRef<'a> {
    /// See [`MessageRecord::published_at`].
    pub published_at: u64,
    /// See [`MessageRecord::id`].
    pub id: &'a str,
    /// See [`MessageRecord::key`].
    pub key: &'a Option<String>,
    /// See [`MessageRecord::headers`].
    pub headers: &'a [(String, String)],
    /// See [`MessageRecord::payload`].
    pub payload: &'a Bytes,
}

/// A topic's durable metadata and counters, rewritten in every batch that
/// changes them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct TopicRecord {
    /// Short id used in keys.
    pub id: u32,
    /// Age retention in ms.
    pub retention_ms: Option<u64>,
    /// A lower bound of the oldest stored seq (exact after open).
    pub first_seq: u64,
    /// The newest seq ever assigned.
    pub last_seq: u64,
    /// Messages stored.
    pub depth: u64,
}

/// A consumer's durable spec.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ConsumerRecord {
    /// Short id used in keys.
    pub id: u32,
    /// The topic it reads.
    pub topic: String,
    /// Header equality filter.
    pub filter: BTreeMap<String, String>,
    /// Lease length in ms.
    pub ack_wait_ms: u64,
    /// Most unsettled deliveries at once.
    pub max_ack_pending: Option<u32>,
}

/// A delivered, unsettled message of one consumer.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(super) struct PendingRecord {
    /// Deliveries so far (the last delivery's attempt number).
    pub attempt: u32,
    /// Not redelivered before this time (ms since epoch): a nak delay.
    /// 0 while leased; leases do not survive a restart.
    pub visible_at: u64,
    /// The message's publish time, for `oldest_age`.
    pub published_at: u64,
}

/// One entry of the duplicate window.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(super) struct DedupRecord {
    /// The seq the id was stored at.
    pub seq: u64,
    /// When (ms since epoch): the entry is in the window until `at` plus
    /// the window.
    pub at: u64,
}

/// Key of message `seq` in topic `topic_id`.
pub(super) fn msg_key(topic_id: u32, seq: u64) -> [u8; 12] {
    id_seq_key(topic_id, seq)
}

/// Deletes message `key` in `batch` with a *weak* tombstone (fjall's
/// single delete), which vanishes together with the value it meets in a
/// flush or compaction. A plain tombstone must outlive the value until the
/// last level, so every consumed message would be written to the tables
/// twice (message, then tombstone) and compacted on; this way a message
/// deleted before its memtable is flushed is never written to a table.
///
/// Safe because a message key is written once: seqs only grow, a batch
/// that stored a seq also stored the topic's counter past it, and no topic
/// id is reused. (A weak delete over two versions would bring back the
/// older one.)
pub(super) fn delete_message(batch: &mut OwnedWriteBatch, messages: &Keyspace, key: &[u8]) {
    batch.remove_weak(messages, key);
}

/// Key of the pending entry of `seq` for consumer `consumer_id`.
pub(super) fn pending_key(consumer_id: u32, seq: u64) -> [u8; 12] {
    id_seq_key(consumer_id, seq)
}

/// Key of a settled run of consumer `consumer_id` starting at `start`.
pub(super) fn run_key(consumer_id: u32, start: u64) -> [u8; 12] {
    id_seq_key(consumer_id, start)
}

/// Key of a consumer's cursor.
pub(super) fn cursor_key(consumer_id: u32) -> [u8; 4] {
    consumer_id.to_be_bytes()
}

/// A consumer's durable position: where its next read starts, and its
/// floor.
///
/// A first delivery writes no pending record (that was two LSM entries
/// per message per consumer: the record, then its tombstone at the ack).
/// Instead every seq in `floor..cursor` without a pending record and not
/// in a settled run (the `settled` keyspace) counts, after a restart, as
/// delivered once and not settled: it is delivered again (attempt 2) if
/// its message is still stored and the filter takes it. Every seq below
/// `floor` is settled.
///
/// A settle is as durable as before, in the same write batch as its
/// outputs: the batch raises the floor past it (settled in order), or
/// stores it in a settled run (settled while an earlier delivery is still
/// out); runs below the floor are deleted as it rises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Position {
    /// The next seq to read.
    pub cursor: u64,
    /// Every seq below is settled.
    pub floor: u64,
}

impl Position {
    /// The stored form: cursor and floor, big-endian.
    pub fn encode(self) -> [u8; 16] {
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&self.cursor.to_be_bytes());
        v[8..].copy_from_slice(&self.floor.min(self.cursor).to_be_bytes());
        v
    }

    /// Reads a stored position. Eight bytes (the cursor alone) is the
    /// format before floors, when every delivery had a pending record: its
    /// floor is the cursor.
    pub fn decode(bytes: &[u8]) -> Option<Position> {
        let be = |b: &[u8]| <[u8; 8]>::try_from(b).ok().map(u64::from_be_bytes);
        match bytes.len() {
            8 => {
                let cursor = be(bytes)?;
                Some(Position {
                    cursor,
                    floor: cursor,
                })
            }
            16 => Some(Position {
                cursor: be(&bytes[..8])?,
                floor: be(&bytes[8..])?,
            }),
            _ => None,
        }
    }
}

/// `id` BE followed by `seq` BE.
fn id_seq_key(id: u32, seq: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&id.to_be_bytes());
    k[4..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The seq of a messages/pending key.
pub(super) fn key_seq(key: &[u8]) -> Result<u64, BrokerError> {
    key.get(4..12)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| BrokerError::Storage(format!("malformed key of {} bytes", key.len())))
}

/// Key of the duplicate-window entry of `id` in topic `topic_id`.
pub(super) fn dedup_key(topic_id: u32, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + id.len());
    k.extend_from_slice(&topic_id.to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

/// Key of a stage dedup record: the scope (consumer name), a 0 byte, and
/// the digest of the dedup key (keys can be long; the digest is not).
pub(super) fn idempotency_key(scope: &str, digest: &[u8; 32]) -> Vec<u8> {
    let mut k = Vec::with_capacity(scope.len() + 33);
    k.extend_from_slice(scope.as_bytes());
    k.push(0);
    k.extend_from_slice(digest);
    k
}

/// Encodes a record with rmp-serde (positional, compact).
pub(super) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, BrokerError> {
    rmp_serde::to_vec(value).map_err(|e| BrokerError::Storage(format!("encoding a record: {e}")))
}

/// Decodes a record written by [`encode`].
pub(super) fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, BrokerError> {
    rmp_serde::from_slice(bytes)
        .map_err(|e| BrokerError::Storage(format!("decoding a stored record: {e}")))
}

/// A storage error with what was being done.
pub(super) fn storage(what: impl std::fmt::Display, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Storage(format!("{what}: {e}"))
}

/// The refusal message for damage found in `dir`.
pub(super) fn damaged(dir: &Path, why: &str) -> String {
    let data_dir = dir.parent().unwrap_or(dir);
    format!(
        "refusing to open the store: {why}. No file was changed. Inspect it with \
         `sluice data check --data-dir {d}`; `sluice data salvage --data-dir {d} --to NEW` \
         copies what is readable and reports what was lost",
        d = data_dir.display()
    )
}

/// Runs `f`, turning a panic inside the storage library into a storage
/// error naming `dir` (fjall panics on some damaged files).
pub(super) fn guard_panic<T>(
    dir: &Path,
    f: impl FnOnce() -> Result<T, BrokerError>,
) -> Result<T, BrokerError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let msg = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Err(BrokerError::Storage(format!(
            "the storage library panicked while reading {} ({msg}): the store is damaged; \
             inspect it with `sluice data check --data-dir {}`",
            dir.display(),
            dir.parent().unwrap_or(dir).display()
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_round_trips_and_the_old_cursor_form_has_its_floor_at_the_cursor() {
        let p = Position {
            cursor: 42,
            floor: 7,
        };
        assert_eq!(Position::decode(&p.encode()), Some(p));
        assert_eq!(
            Position::decode(&42u64.to_be_bytes()),
            Some(Position {
                cursor: 42,
                floor: 42
            })
        );
        assert_eq!(Position::decode(&[1, 2, 3]), None);
        // A floor is never above the cursor.
        let odd = Position {
            cursor: 5,
            floor: 9,
        };
        assert_eq!(Position::decode(&odd.encode()).map(|p| p.floor), Some(5));
    }
}
