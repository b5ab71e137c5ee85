//! Handler state in the embedded store: the `state` keyspace, read by
//! handlers through [`Reader`], swept of expired entries and old markers,
//! and deleted from by operators. Writes go only through the committer,
//! in the same batch as the completion they belong to
//! ([`super::commit::state_writes`], which also has the key layout).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::Shared;
use super::commit::group::Group;
use super::commit::state_writes::{
    APPLIED, ENTRY, Stamped, apply, entry_key, meta_key, split_entry_key,
};
use super::store::{decode, storage};
use crate::broker::BrokerError;
use crate::state::{Entry, StateReader, StateWrites, StoreMeta, Write};

/// How long the store remembers that a message's call committed state,
/// at least: a redelivery of that message within it (after a crash,
/// where the broker can hand out again a message whose completion it wrote)
/// commits its outputs and removal but not its state writes a second time.
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
        if let Some(in_flight) = self.shared.state_in_flight.newest(&k) {
            return Ok(in_flight);
        }
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
    apply(group.state_view(), &writes, 0)?;
    Ok(true)
}

/// The state writes of completions on their way to the committer (sent,
/// their reply not back), readable by handlers before they are durable.
///
/// A stage completes beside its next call, so a key that comes back within
/// a commit's time is usually being written when it is read. Reading the
/// value before that write would be refused at the call's own commit
/// (`state-conflict`: about half of all calls in the benchmark), and
/// waiting for the write's fsync serialises such calls on the commit
/// latency (BENCHMARKS.md, "Handler state committed with the ack"). So a
/// read of such a key takes the newest write in flight, with the revision
/// that write will commit with: revisions are given out here, when the
/// completion is sent, not by the committer. The call's check then names that
/// revision, and passes only if that completion committed first; if it was
/// refused or lost, no entry ever holds the revision (revisions are never
/// given out twice while the store is open), and the call is retried.
#[derive(Default)]
pub(super) struct InFlightWrites {
    inner: Mutex<Tables>,
}

#[derive(Default)]
struct Tables {
    /// Per keyspace key, the writes in flight, oldest first: the completion's
    /// token and what it writes (`None`: a delete).
    keys: HashMap<Vec<u8>, Vec<(u64, Option<Entry>)>>,
    /// Per store, the last revision given out.
    revisions: HashMap<Arc<str>, u64>,
    next_token: u64,
}

impl InFlightWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives `writes`' values their revisions, makes them readable until
    /// the guard is dropped (when the completion's reply is in, or it is given
    /// up), and runs `send` with them under the same lock, so completions
    /// reach the committer in the order their writes became readable.
    pub(super) fn register<R>(
        &self,
        shared: &Shared,
        writes: StateWrites,
        now: u64,
        send: impl FnOnce(Stamped) -> R,
    ) -> Result<(InFlightGuard<'_>, R), BrokerError> {
        let mut inner = self.lock();
        let last = match inner.revisions.get(&writes.store) {
            Some(last) => *last,
            None => committed_revision(shared, &writes.store)?,
        };
        let puts = writes
            .writes
            .iter()
            .filter(|(_, w)| matches!(w, Write::Put { .. }))
            .count() as u64;
        inner.revisions.insert(writes.store.clone(), last + puts);
        let first = last + 1;
        inner.next_token += 1;
        let token = inner.next_token;
        let mut next = first;
        let mut keys = Vec::with_capacity(writes.writes.len());
        for (key, write) in &writes.writes {
            let entry = match write {
                Write::Put { value, expires_at } => {
                    next += 1;
                    Some(Entry {
                        value: value.clone(),
                        revision: next - 1,
                        expires_at: *expires_at,
                        writer: writes.writer.clone(),
                        written_at: now,
                    })
                }
                Write::Delete => None,
            };
            let k = entry_key(&writes.store, key);
            inner
                .keys
                .entry(k.clone())
                .or_default()
                .push((token, entry));
            keys.push(k);
        }
        let sent = send(Stamped {
            writes,
            first_revision: first,
        });
        drop(inner);
        Ok((
            InFlightGuard {
                writing: self,
                token,
                keys,
            },
            sent,
        ))
    }

    /// The newest write in flight to `key`, if any (`Some(None)`: a delete).
    fn newest(&self, key: &[u8]) -> Option<Option<Entry>> {
        self.lock()
            .keys
            .get(key)
            .and_then(|writes| writes.last())
            .map(|(_, entry)| entry.clone())
    }
}

/// The last revision `store` gave out, as committed: where this process
/// starts giving out revisions. Only completions sent through [`InFlightWrites`]
/// give any out, so nothing newer can be in flight the first time.
fn committed_revision(shared: &Shared, store: &str) -> Result<u64, BrokerError> {
    let Some(current) = shared.store.current() else {
        return Err(BrokerError::Unavailable(
            "the embedded store is being reopened after a failed write".into(),
        ));
    };
    match current
        .state
        .get(meta_key(store))
        .map_err(|e| storage("reading a state store's bookkeeping", e))?
    {
        Some(bytes) => Ok(decode::<StoreMeta>(&bytes)?.revision),
        None => Ok(0),
    }
}

/// The writes of one completion in flight ([`InFlightWrites::register`]).
pub(super) struct InFlightGuard<'a> {
    writing: &'a InFlightWrites,
    token: u64,
    keys: Vec<Vec<u8>>,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        let mut inner = self.writing.lock();
        for k in self.keys.drain(..) {
            if let Some(writes) = inner.keys.get_mut(&k) {
                writes.retain(|(token, _)| *token != self.token);
                if writes.is_empty() {
                    inner.keys.remove(&k);
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
        match apply(group.state_view(), &writes, 0) {
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
