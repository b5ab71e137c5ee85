//! Handler state in the embedded store: the `state` keyspace, read by
//! handlers through [`Reader`], swept of expired entries and old markers,
//! and deleted from by operators. Writes go only through the committer,
//! in the same batch as the settle they belong to
//! ([`super::commit::state_writes`], which also has the key layout).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use super::Shared;
use super::commit::group::Group;
use super::commit::state_writes::{APPLIED, ENTRY, apply, entry_key, meta_key, split_entry_key};
use super::store::{decode, storage};
use crate::broker::BrokerError;
use crate::state::{Entry, StateReader, StateWrites, StoreMeta, Write};

/// How long the store remembers that a message's call committed state,
/// at least: a redelivery of that message within it (after a crash,
/// where the broker can hand out again a message whose settle it wrote)
/// commits its outputs and ack but not its state writes a second time.
const APPLIED_AT_LEAST_MS: u64 = 10 * 60 * 1000;

/// Reads committed state for handlers (and the operator's tools).
pub(super) struct Reader {
    pub(super) shared: Arc<Shared>,
}

impl Reader {
    fn keyspace(&self) -> Result<fjall::Keyspace, String> {
        self.shared
            .store
            .current()
            .map(|store| store.state)
            .ok_or_else(|| "the embedded store is being reopened after a failed write".to_owned())
    }
}

#[async_trait::async_trait]
impl StateReader for Reader {
    async fn get(&self, store: &str, key: &str) -> Result<Option<Entry>, String> {
        let k = entry_key(store, key);
        self.shared.state_writing.wait(&k).await;
        let ks = self.keyspace()?;
        match ks.get(k).map_err(|e| e.to_string())? {
            Some(bytes) => decode(&bytes).map(Some).map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }

    async fn list(
        &self,
        store: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Entry)>, String> {
        let ks = self.keyspace()?;
        let start = entry_key(store, after.unwrap_or(prefix));
        let bound = entry_key(store, prefix);
        let mut out = Vec::new();
        for guard in ks.range(start..) {
            let (k, v) = guard.into_inner().map_err(|e| e.to_string())?;
            if !k.starts_with(&bound) {
                break;
            }
            let Some((_, key)) = split_entry_key(&k) else {
                break;
            };
            if after.is_some_and(|a| key <= a) {
                continue;
            }
            out.push((key.to_owned(), decode(&v).map_err(|e| e.to_string())?));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    async fn meta(&self, store: &str) -> Result<StoreMeta, String> {
        let ks = self.keyspace()?;
        match ks.get(meta_key(store)).map_err(|e| e.to_string())? {
            Some(bytes) => decode(&bytes).map_err(|e| e.to_string()),
            None => Ok(StoreMeta::default()),
        }
    }
}

/// Deletes `key` from `store` for an operator, as a handler's delete
/// would be written. Returns whether it was there.
pub(super) fn delete(group: &mut Group<'_>, store: &str, key: &str) -> Result<bool, BrokerError> {
    let Some(entry) = group.state_view().entry(&entry_key(store, key), key)? else {
        return Ok(false);
    };
    let writes = StateWrites {
        store: store.into(),
        max_bytes: u64::MAX,
        writer: String::new(),
        checks: vec![(key.to_owned(), entry.revision)],
        writes: vec![(key.to_owned(), Write::Delete)],
    };
    apply(group.state_view(), &writes)?;
    Ok(true)
}

/// Keys that settles on their way to the committer write (sent, their
/// reply not back). A handler's read of such a key waits for that settle
/// and reads what it wrote, rather than the value before it: a read of the
/// old value is refused at the call's own commit (`state-conflict`) and
/// the call runs again. A stage settles beside its next call, so on keys
/// that come back within a commit's time that was about half of all calls
/// (BENCHMARKS.md, "Handler state committed with the ack").
#[derive(Default)]
pub(super) struct Writing {
    keys: Mutex<InFlight>,
}

/// Per keyspace key: how many settles in flight write it, and what wakes
/// its readers when the last one is back.
type InFlight = HashMap<Vec<u8>, (usize, Arc<Notify>)>;

/// The longest a read waits for settles in flight; past it, it reads what
/// is committed, and the commit's check catches a stale read as ever.
const WRITING_WAIT_MAX: Duration = Duration::from_secs(2);

impl Writing {
    fn keys(&self) -> std::sync::MutexGuard<'_, InFlight> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes the keys `writes` writes until the guard is dropped (when
    /// the settle's reply is in, or the settle is given up).
    pub(super) fn register(&self, writes: &StateWrites) -> WritingGuard<'_> {
        let keys: Vec<Vec<u8>> = writes
            .writes
            .iter()
            .map(|(key, _)| entry_key(&writes.store, key))
            .collect();
        let mut map = self.keys();
        for k in &keys {
            map.entry(k.clone())
                .or_insert_with(|| (0, Arc::new(Notify::new())))
                .0 += 1;
        }
        WritingGuard {
            writing: self,
            keys,
        }
    }

    /// Returns once no settle in flight writes `key` (or after
    /// [`WRITING_WAIT_MAX`]).
    async fn wait(&self, key: &[u8]) {
        let deadline = tokio::time::Instant::now() + WRITING_WAIT_MAX;
        loop {
            let Some(notify) = self.keys().get(key).map(|(_, n)| n.clone()) else {
                return;
            };
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Released between the look and the enable: nothing to wait for.
            if !self
                .keys()
                .get(key)
                .is_some_and(|(_, n)| Arc::ptr_eq(n, &notify))
            {
                continue;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }
}

/// The keys of one settle in flight ([`Writing::register`]).
pub(super) struct WritingGuard<'a> {
    writing: &'a Writing,
    keys: Vec<Vec<u8>>,
}

impl Drop for WritingGuard<'_> {
    fn drop(&mut self) {
        let mut map = self.writing.keys();
        for k in self.keys.drain(..) {
            if let Some((count, notify)) = map.get_mut(&k) {
                *count -= 1;
                if *count == 0 {
                    notify.notify_waiters();
                    map.remove(&k);
                }
            }
        }
    }
}

/// Where the next sweep of expired entries starts: like the dedup
/// records' sweep, a walk of the keyspace a chunk at a time rather than a
/// time index that every write would pay for.
#[derive(Default)]
pub(super) struct SweepCursor(Mutex<Vec<u8>>, Mutex<Vec<u8>>);

/// Entries looked at per sweep (maintenance runs every 200 ms).
const SWEEP_CHUNK: usize = 2_000;

/// Removes expired entries among the next [`SWEEP_CHUNK`] after the
/// cursor, with their stores' bookkeeping, and moves the cursor on.
pub(super) fn sweep(group: &mut Group<'_>) -> Result<(), BrokerError> {
    let ks = group.store.state.clone();
    let mut cursor = group
        .shared
        .state_sweep
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let start = if cursor.is_empty() {
        vec![ENTRY]
    } else {
        cursor.clone()
    };
    let mut seen = 0;
    let mut last = None;
    let mut expired = Vec::new();
    for guard in ks.range(start..) {
        let (k, v) = guard
            .into_inner()
            .map_err(|e| storage("sweeping the state keyspace", e))?;
        if k.first() != Some(&ENTRY) {
            break;
        }
        seen += 1;
        if let Ok(entry) = decode::<Entry>(&v)
            && entry.expired(group.now)
            && let Some((store, key)) = split_entry_key(&k)
        {
            expired.push((store.to_owned(), key.to_owned(), entry.revision));
        }
        last = Some(k.to_vec());
        if seen >= SWEEP_CHUNK {
            break;
        }
    }
    // Past the end: start again from the front next time.
    *cursor = match (seen >= SWEEP_CHUNK, last) {
        (true, Some(mut last)) => {
            last.push(0);
            last
        }
        _ => Vec::new(),
    };
    drop(cursor);
    sweep_markers(group)?;
    for (store, key, revision) in expired {
        // A delete that checks the revision it saw, so an entry rewritten
        // meanwhile in this group stays.
        let writes = StateWrites {
            store: store.as_str().into(),
            max_bytes: u64::MAX,
            writer: String::new(),
            checks: vec![(key.clone(), revision)],
            writes: vec![(key, Write::Delete)],
        };
        match apply(group.state_view(), &writes) {
            Ok(()) | Err(BrokerError::StateConflict(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Removes markers older than the duplicate window (and
/// [`APPLIED_AT_LEAST_MS`]), oldest first as far as a chunk goes: a
/// marker's key does not sort by age, so a chunk is walked from a cursor
/// like the entries.
fn sweep_markers(group: &mut Group<'_>) -> Result<(), BrokerError> {
    let keep_ms = group.shared.dedup_window_ms.max(APPLIED_AT_LEAST_MS);
    let cutoff = group.now.saturating_sub(keep_ms);
    let ks = group.store.state.clone();
    let mut cursor = group
        .shared
        .state_sweep
        .1
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let start = if cursor.is_empty() {
        vec![APPLIED]
    } else {
        cursor.clone()
    };
    let mut seen = 0;
    let mut last = None;
    for guard in ks.range(start..) {
        let (k, v) = guard
            .into_inner()
            .map_err(|e| storage("sweeping the state keyspace", e))?;
        if k.first() != Some(&APPLIED) {
            break;
        }
        seen += 1;
        let at = <[u8; 8]>::try_from(&*v).map_or(0, u64::from_be_bytes);
        if at <= cutoff {
            group.batch.remove(&group.store.state, k.to_vec());
        }
        last = Some(k.to_vec());
        if seen >= SWEEP_CHUNK {
            break;
        }
    }
    *cursor = match (seen >= SWEEP_CHUNK, last) {
        (true, Some(mut last)) => {
            last.push(0);
            last
        }
        _ => Vec::new(),
    };
    Ok(())
}

/// The reader a broker hands out ([`crate::broker::Broker::state`]).
pub(super) fn reader(shared: &Arc<Shared>) -> Arc<dyn StateReader> {
    Arc::new(Reader {
        shared: shared.clone(),
    })
}
