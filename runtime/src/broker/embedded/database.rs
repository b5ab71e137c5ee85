//! The open store: the fjall database, its keyspaces and the duplicate
//! window over two of them ([`Store`]), the slot that swaps it when a
//! failed write forces a reopen ([`StoreSlot`]), and how damage found while
//! opening is refused. What the keyspaces hold is in [`super::store`].

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use fjall::config::{BloomConstructionPolicy, FilterPolicy, FilterPolicyEntry, PinningPolicy};
use fjall::{AbstractTree, Database, Keyspace, KeyspaceCreateOptions, OwnedWriteBatch};

use super::store::{MessageRecord, decode_message, key_seq, msg_key, storage};
use super::window::DedupWindow;
use crate::broker::{BrokerError, KeyspaceMemory, StoreMemory};

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
pub(super) const MESSAGES_MEMTABLE_BYTES: u64 = 4 * 1024 * 1024;
/// A message record of this size or more counts as large: fjall keeps it
/// in a blob file once flushed, and the committer seals the memtable
/// after large writes (`memtables.rs`).
pub(super) const LARGE_RECORD_BYTES: usize = 64 * 1024;
/// Write buffer of each duplicate-window generation.
const DEDUP_MEMTABLE_BYTES: u64 = 4 * 1024 * 1024;
/// Write buffer of the small bookkeeping keyspaces.
const SMALL_MEMTABLE_BYTES: u64 = 2 * 1024 * 1024;
/// Journal size after which fjall flushes memtables so old journals can go
/// (fjall's minimum). Journals live on disk, so this bounds disk, not RAM.
const MAX_JOURNAL_BYTES: u64 = 64 * 1024 * 1024;

/// Levels of an LSM tree in fjall (its default and the most it builds).
const LEVELS: usize = 7;

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
    /// Delivered entries not yet completed, by (consumer, seq).
    pub pending: Keyspace,
    /// Runs of first deliveries completed above their consumer's floor, by
    /// (consumer, first seq) (see [`super::store::Position`]). On disk the
    /// keyspace keeps its first name, `settled`, so existing data
    /// directories open as they are.
    pub completed_runs: Keyspace,
    /// The duplicate window: (topic, message id) -> seq, in generations.
    pub window: DedupWindow,
    /// Stage dedup records (COMPLETED) by (consumer, key).
    pub idempotency: Keyspace,
    /// Delayed messages by (topic, due time, counter).
    pub delayed: Keyspace,
    /// Handler state: entries and each store's bookkeeping
    /// ([`super::state`]).
    pub state: Keyspace,
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
        let messages = db
            .keyspace("messages", || {
                KeyspaceCreateOptions::default()
                    .max_memtable_size(MESSAGES_MEMTABLE_BYTES)
                    .manual_journal_persist(true)
                    // Large records go to blob files when flushed, so a
                    // compaction moves a pointer instead of reading and
                    // rewriting the payload (before this, compacting four
                    // 60 MB messages took the daemon 180 MB past its
                    // peak). Uncompressed: payloads that are worth it are
                    // usually compressed already. Applies to stores created
                    // from now on; fjall keeps an existing keyspace's
                    // settings.
                    .with_kv_separation(Some(
                        fjall::KvSeparationOptions::default()
                            .separation_threshold(LARGE_RECORD_BYTES as u32)
                            .compression(fjall::CompressionType::None),
                    ))
            })
            .map_err(|e| storage("opening keyspace messages", e))?;
        Ok(Store {
            messages,
            topics: ks("topics", SMALL_MEMTABLE_BYTES)?,
            consumers: ks("consumers", SMALL_MEMTABLE_BYTES)?,
            cursors: ks("cursors", SMALL_MEMTABLE_BYTES)?,
            pending: ks("pending", SMALL_MEMTABLE_BYTES)?,
            completed_runs: ks("settled", SMALL_MEMTABLE_BYTES)?,
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
            // Read only from the front, in due order: no filters needed.
            delayed: ks("delayed", SMALL_MEMTABLE_BYTES)?,
            // Every completion with state writes probes for its message's
            // marker, which is almost never there, and reads the keys it
            // writes: filters pinned, like the dedup window's.
            state: probed("state", SMALL_MEMTABLE_BYTES)?,
            db,
        })
    }

    /// Every keyspace, with its name (for the data tools and the memory
    /// report).
    pub fn keyspaces(&self) -> [(&'static str, &Keyspace); 11] {
        let [dedup, dedup_b] = self.window.keyspaces();
        [
            ("messages", &self.messages),
            ("topics", &self.topics),
            ("consumers", &self.consumers),
            ("cursors", &self.cursors),
            ("pending", &self.pending),
            ("settled", &self.completed_runs),
            dedup,
            dedup_b,
            ("idempotency", &self.idempotency),
            ("delayed", &self.delayed),
            ("state", &self.state),
        ]
    }

    /// What the store holds in memory, by keyspace.
    ///
    /// The memtable figure comes from fjall's hidden version-history API
    /// (the only one that counts flushed memtables an older version still
    /// holds); it takes that lock for a moment, which a scrape can afford.
    pub fn memory(&self) -> StoreMemory {
        let keyspaces = self
            .keyspaces()
            .into_iter()
            .map(|(keyspace, ks)| KeyspaceMemory {
                keyspace,
                memtables: ks.tree.version_memtable_size_sum(),
                filters: ks.tree.pinned_filter_size() as u64,
                indexes: ks.tree.pinned_block_index_size() as u64,
                tables: ks.table_count() as u64,
                levels: (0..LEVELS)
                    .filter(|&level| ks.tree.level_table_count(level).unwrap_or(0) > 0)
                    .count() as u64,
            })
            .collect();
        StoreMemory {
            cache: self.db.cache_size(),
            keyspaces,
        }
    }

    /// The stored message `seq` of topic `topic_id`, if any.
    pub fn message(&self, topic_id: u32, seq: u64) -> Result<Option<MessageRecord>, BrokerError> {
        match self
            .messages
            .get(msg_key(topic_id, seq))
            .map_err(|e| storage("reading a message", e))?
        {
            Some(bytes) => decode_message(bytes).map(Some),
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
                Ok(Some((key_seq(&k)?, decode_message(v)?)))
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
