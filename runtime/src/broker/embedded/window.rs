//! The duplicate window, kept in two generations so that expiring it
//! costs nothing per message.
//!
//! Each published id is written once, into the *current* generation (a
//! keyspace), with its seq and time ([`DedupRecord`]). When the current
//! generation is a window old, the other one holds only ids older than the
//! window: it is cleared whole (one journaled operation that drops its
//! tables) and becomes the current one. So an id stays findable for at
//! least the window and at most twice it, and no id ever costs an index
//! entry or a delete of its own.
//!
//! A generation records when it became current under [`SINCE_KEY`], in the
//! same write batch as its first ids. A generation without it (a new
//! store, a crash between the clear and that batch, or the single `dedup`
//! keyspace of stores written before generations) counts as the oldest,
//! so it is the one cleared next, never one holding ids still in window.
//!
//! Nearly every probe is for an id that is not there, and a store lookup
//! (a memtable search among ids that share no useful prefix, then the
//! tables' filters) cost the committer as much as writing the message. So
//! each generation keeps a bloom filter in memory of the ids written into
//! it since it was last cleared ([`Seen`]): an id the filter has not seen
//! is not looked up. A generation that held ids when the store was opened
//! is always looked up, until it is cleared.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use fjall::{Keyspace, OwnedWriteBatch};

use super::store::{DedupRecord, decode, encode, storage};
use crate::broker::BrokerError;

/// Key of a generation's start time (ms since the epoch, u64 BE). Window
/// keys start with a topic id and no topic has id 0xffffffff.
const SINCE_KEY: &[u8] = b"\xff\xff\xff\xffsince";

/// Bits of each generation's filter: 2 MiB. With 4 probes per id, an id
/// not written is looked up anyway about 2 % of the time at 2M ids in a
/// generation, 16 % at 8M; past that the filter saves less, never wrongly.
const FILTER_BITS: usize = 1 << 24;
/// Bits set and tested per id.
const FILTER_PROBES: u64 = 4;

/// A bloom filter of the ids written into one generation: "not seen"
/// means the id is not in that generation, so its lookup can be skipped.
/// Written and read by the committer alone (atomics only to be shareable).
struct Seen {
    /// The filter's bits.
    bits: Box<[AtomicU64]>,
    /// Whether every id in the generation went through
    /// [`DedupWindow::insert`] since the generation was last empty: false
    /// for one that held ids when the store was opened.
    complete: AtomicBool,
}

impl Seen {
    fn new(complete: bool) -> Seen {
        Seen {
            bits: (0..FILTER_BITS / 64).map(|_| AtomicU64::new(0)).collect(),
            complete: AtomicBool::new(complete),
        }
    }

    /// The bit positions of `key`: double hashing of one 64-bit hash.
    fn positions(key: &[u8]) -> impl Iterator<Item = usize> {
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(key);
        let (h1, h2) = (hash & 0xffff_ffff, (hash >> 32) | 1);
        (0..FILTER_PROBES).map(move |i| {
            // FILTER_BITS is a power of two below 2^32: the mask keeps
            // the value in range, so the cast cannot truncate.
            (h1.wrapping_add(i.wrapping_mul(h2)) & (FILTER_BITS as u64 - 1)) as usize
        })
    }

    fn add(&self, key: &[u8]) {
        for bit in Seen::positions(key) {
            self.bits[bit / 64].fetch_or(1 << (bit % 64), Ordering::Relaxed);
        }
    }

    /// False only if `key` is certainly not in the generation.
    fn may_hold(&self, key: &[u8]) -> bool {
        !self.complete.load(Ordering::Relaxed)
            || Seen::positions(key)
                .all(|bit| self.bits[bit / 64].load(Ordering::Relaxed) & (1 << (bit % 64)) != 0)
    }

    /// The generation was cleared: nothing is in it.
    fn reset(&self) {
        for word in &*self.bits {
            word.store(0, Ordering::Relaxed);
        }
        self.complete.store(true, Ordering::Relaxed);
    }
}

/// The two generations and when each became current.
#[derive(Clone)]
pub(super) struct DedupWindow {
    /// Generation keyspaces `dedup` and `dedup_b`.
    gens: [Keyspace; 2],
    /// When each became current (0: unknown, the oldest). Read at open,
    /// changed by the committer alone.
    since: Arc<[AtomicU64; 2]>,
    /// What each generation holds, as far as this process wrote it.
    seen: Arc<[Seen; 2]>,
}

impl DedupWindow {
    /// The window over `gens`, reading when each became current.
    pub fn open(gens: [Keyspace; 2]) -> Result<DedupWindow, BrokerError> {
        let read = |ks: &Keyspace| -> Result<u64, BrokerError> {
            let value = ks
                .get(SINCE_KEY)
                .map_err(|e| storage("reading the duplicate window", e))?;
            Ok(value
                .and_then(|v| <[u8; 8]>::try_from(&v[..]).ok())
                .map_or(0, u64::from_be_bytes))
        };
        // The start record sorts after every id: a generation whose first
        // key is that (or nothing) holds no ids.
        let empty = |ks: &Keyspace| -> Result<bool, BrokerError> {
            match ks.first_key_value() {
                None => Ok(true),
                Some(guard) => {
                    let key = guard
                        .key()
                        .map_err(|e| storage("reading the duplicate window", e))?;
                    Ok(&*key == SINCE_KEY)
                }
            }
        };
        let since = [read(&gens[0])?, read(&gens[1])?];
        let seen = [Seen::new(empty(&gens[0])?), Seen::new(empty(&gens[1])?)];
        Ok(DedupWindow {
            gens,
            since: Arc::new(since.map(AtomicU64::new)),
            seen: Arc::new(seen),
        })
    }

    /// The generation keyspaces, with their names (for the data tools).
    pub fn keyspaces(&self) -> [(&'static str, &Keyspace); 2] {
        [("dedup", &self.gens[0]), ("dedup_b", &self.gens[1])]
    }

    /// Index of the current generation: the one that became current last
    /// (the first one on a tie, so a store from before generations keeps
    /// its ids in the first and clears the empty second).
    fn current(&self) -> usize {
        let [a, b] = [0, 1].map(|i| self.since[i].load(Ordering::Relaxed));
        usize::from(b > a)
    }

    /// Starts a new generation when the current one is `window_ms` old:
    /// clears the other one (every id in it is older than the window) and
    /// adds its start time to `batch`.
    pub fn rotate(
        &self,
        batch: &mut OwnedWriteBatch,
        now: u64,
        window_ms: u64,
    ) -> Result<(), BrokerError> {
        let current = self.current();
        let since = self.since[current].load(Ordering::Relaxed);
        if since.saturating_add(window_ms) > now {
            return Ok(());
        }
        let next = 1 - current;
        self.gens[next]
            .clear()
            .map_err(|e| storage("clearing an expired duplicate-window generation", e))?;
        self.seen[next].reset();
        batch.insert(&self.gens[next], SINCE_KEY, now.to_be_bytes());
        self.since[next].store(now, Ordering::Relaxed);
        Ok(())
    }

    /// The entry of `key`, newest generation first; expired or not (the
    /// caller compares its time with the window).
    pub fn get(&self, key: &[u8]) -> Result<Option<DedupRecord>, BrokerError> {
        let current = self.current();
        for g in [current, 1 - current] {
            if !self.seen[g].may_hold(key) {
                continue;
            }
            if let Some(bytes) = self.gens[g]
                .get(key)
                .map_err(|e| storage("reading the duplicate window", e))?
            {
                return decode(&bytes).map(Some);
            }
        }
        Ok(None)
    }

    /// Adds `key`'s entry to `batch`, in the current generation. Every id
    /// enters a generation through here (or [`DedupWindow::get`] could
    /// miss it). Should the batch fail, the filter keeps the id: a lookup
    /// too many, never one too few.
    pub fn insert(
        &self,
        batch: &mut OwnedWriteBatch,
        key: &[u8],
        record: DedupRecord,
    ) -> Result<(), BrokerError> {
        let current = self.current();
        self.seen[current].add(key);
        batch.insert(&self.gens[current], key, encode(&record)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::database::Store;
    use super::super::store::dedup_key;
    use super::*;

    const W: u64 = 1_000;

    /// Publishes `id` at `now` the way the committer does: rotate, probe,
    /// insert. Returns whether it was a duplicate.
    fn publish(store: &Store, id: &str, now: u64) -> bool {
        let window = &store.window;
        let mut batch = store.db.batch();
        window.rotate(&mut batch, now, W).expect("rotate");
        let key = dedup_key(1, id);
        let found = window.get(&key).expect("get");
        let duplicate = found.is_some_and(|r| now.saturating_sub(r.at) < W);
        if !duplicate {
            let record = DedupRecord { seq: now, at: now };
            window.insert(&mut batch, &key, record).expect("insert");
        }
        batch.commit().expect("commit");
        duplicate
    }

    fn entries(ks: &Keyspace) -> usize {
        ks.iter().count()
    }

    #[test]
    fn an_id_is_found_for_the_window_and_its_generation_goes_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let t0 = 1_000_000;
        assert!(!publish(&store, "a", t0));
        assert!(publish(&store, "a", t0 + W - 1), "inside the window");
        // Past the window the id is new again, though its generation is
        // still there (it became current at t0).
        assert!(!publish(&store, "b", t0 + W / 2));
        assert!(!publish(&store, "a", t0 + W + 1));
        assert!(publish(&store, "b", t0 + W + 2), "b is still in window");
        // Two windows on, the first generation was cleared whole: only
        // the ids of the current one and its start remain.
        assert!(!publish(&store, "c", t0 + 2 * W + 5));
        let [(_, a), (_, b)] = store.window.keyspaces();
        let total = entries(a) + entries(b);
        assert_eq!(total, 2 + 2, "a (again) and c, plus two start records");
        // Reopened, the generations and their starts are read back.
        drop(store);
        let store = Store::open(dir.path()).expect("reopen");
        assert!(publish(&store, "c", t0 + 2 * W + 6));
        assert!(publish(&store, "a", t0 + 2 * W));
        assert!(!publish(&store, "b", t0 + 2 * W + 7));
    }

    #[test]
    fn the_filter_never_hides_an_id_and_spares_most_lookups_of_absent_ones() {
        let seen = Seen::new(true);
        let key = |prefix: &str, i: usize| dedup_key(1, &format!("{prefix}-{i}"));
        for i in 0..100_000 {
            seen.add(&key("in", i));
        }
        assert!((0..100_000).all(|i| seen.may_hold(&key("in", i))));
        let looked_up = (0..100_000)
            .filter(|&i| seen.may_hold(&key("out", i)))
            .count();
        // About 3 in 10^7 expected at this fill.
        assert!(
            looked_up < 10,
            "{looked_up} of 100,000 absent ids looked up"
        );
        seen.reset();
        assert!(!seen.may_hold(&key("in", 1)), "cleared");
        assert!(Seen::new(false).may_hold(b"anything"), "ids from disk");
    }

    #[test]
    fn ids_from_before_the_open_are_looked_up_until_their_generation_goes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t0 = 1_000_000;
        {
            let store = Store::open(dir.path()).expect("open");
            assert!(!publish(&store, "a", t0));
        }
        let store = Store::open(dir.path()).expect("reopen");
        let holding = store.window.current();
        assert!(!store.window.seen[holding].complete.load(Ordering::Relaxed));
        assert!(
            store.window.seen[1 - holding]
                .complete
                .load(Ordering::Relaxed)
        );
        assert!(publish(&store, "a", t0 + 1), "found though never added");
        // A window on, the other generation is cleared and current, and
        // filtered; the one read from disk still is not.
        assert!(!publish(&store, "b", t0 + W));
        let current = store.window.current();
        assert!(store.window.seen[current].complete.load(Ordering::Relaxed));
        assert!(
            !store.window.seen[1 - current]
                .complete
                .load(Ordering::Relaxed)
        );
    }

    #[test]
    fn a_generation_without_a_start_is_the_oldest_so_ids_in_window_survive() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A store from before generations: ids in `dedup`, an expiry index
        // beside it, no start record.
        {
            let db = fjall::Database::builder(dir.path()).open().expect("db");
            let old = db
                .keyspace("dedup", fjall::KeyspaceCreateOptions::default)
                .expect("dedup");
            let expiry = db
                .keyspace("dedup_expiry", fjall::KeyspaceCreateOptions::default)
                .expect("expiry");
            let at = 1_000_000u64;
            let record = encode(&DedupRecord { seq: 7, at }).expect("encode");
            old.insert(dedup_key(1, "old"), record).expect("insert");
            expiry.insert(at.to_be_bytes(), []).expect("insert");
            db.persist(fjall::PersistMode::SyncAll).expect("persist");
        }
        let store = Store::open(dir.path()).expect("open");
        assert!(!store.db.keyspace_exists("dedup_expiry"), "index removed");
        // The old ids stay for a window after the first publish...
        assert!(publish(&store, "old", 1_000_000 + W - 1));
        // ...which put new ids in the other generation.
        assert!(!publish(&store, "new", 1_000_000 + W - 1));
        let [(_, a), (_, b)] = store.window.keyspaces();
        assert_eq!((entries(a), entries(b)), (1, 2));
        // Cleared, and the start record lost with a crash: that one is
        // the oldest again, never the one holding `new`.
        a.clear().expect("clear");
        drop(store);
        let store = Store::open(dir.path()).expect("reopen");
        assert!(publish(&store, "new", 1_000_000 + W));
        let [(_, a), (_, b)] = store.window.keyspaces();
        assert_eq!((entries(a), entries(b)), (0, 2));
    }
}
