//! Handler state in the embedded store: the `state` keyspace, read by
//! handlers through [`Reader`] and written only by the committer, in the
//! same batch as the settle it belongs to ([`apply`]).
//!
//! Keys: `e` + store + `0x00` + key for an entry ([`crate::state::Entry`]),
//! `m` + store for the store's [`StoreMeta`] (last revision, bytes, keys),
//! `a` + store + `0x00` + message id for a message whose call committed
//! state (so a redelivery does not apply its effect twice), swept after
//! the duplicate window and at least ten minutes.
//! A store name (`<pipeline>/<store>`) holds no NUL byte, so an entry key
//! names its store without doubt whatever the handler's key holds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::Shared;
use super::commit::Group;
use super::store::{decode, encode, storage};
use crate::broker::BrokerError;
use crate::state::{Entry, StateReader, StateWrites, StoreMeta, Write};

const ENTRY: u8 = b'e';
const META: u8 = b'm';
const APPLIED: u8 = b'a';

/// How long the store remembers that a message's call committed state,
/// at least: a redelivery of that message within it (after a crash,
/// where the broker can hand out again a message whose settle it wrote)
/// commits its outputs and ack but not its state writes a second time.
const APPLIED_AT_LEAST_MS: u64 = 10 * 60 * 1000;

/// The marker that `writer`'s call committed state to `store`.
fn applied_key(store: &str, writer: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + store.len() + writer.len());
    k.push(APPLIED);
    k.extend_from_slice(store.as_bytes());
    k.push(0);
    k.extend_from_slice(writer.as_bytes());
    k
}

/// The keyspace key of `key` in `store`.
fn entry_key(store: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + store.len() + key.len());
    k.push(ENTRY);
    k.extend_from_slice(store.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

fn meta_key(store: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + store.len());
    k.push(META);
    k.extend_from_slice(store.as_bytes());
    k
}

/// The store and key an entry key holds.
fn split_entry_key(k: &[u8]) -> Option<(&str, &str)> {
    let rest = k.strip_prefix(&[ENTRY])?;
    let nul = rest.iter().position(|b| *b == 0)?;
    Some((
        std::str::from_utf8(&rest[..nul]).ok()?,
        std::str::from_utf8(&rest[nul + 1..]).ok()?,
    ))
}

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
        let ks = self.keyspace()?;
        match ks.get(entry_key(store, key)).map_err(|e| e.to_string())? {
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

/// What a group has written to the `state` keyspace but not yet
/// committed: later settles in the same group check against it.
#[derive(Default)]
pub(in crate::broker::embedded) struct Overlay {
    entries: HashMap<Vec<u8>, Option<Entry>>,
    metas: HashMap<String, StoreMeta>,
    applied: std::collections::HashSet<Vec<u8>>,
}

impl Group<'_> {
    fn state_entry(&self, key: &[u8]) -> Result<Option<Entry>, BrokerError> {
        if let Some(found) = self.state.entries.get(key) {
            return Ok(found.clone());
        }
        match self
            .store
            .state
            .get(key)
            .map_err(|e| storage("reading a state entry", e))?
        {
            Some(bytes) => decode(&bytes).map(Some),
            None => Ok(None),
        }
    }

    fn state_applied(&self, marker: &[u8]) -> Result<bool, BrokerError> {
        if self.state.applied.contains(marker) {
            return Ok(true);
        }
        Ok(self
            .store
            .state
            .get(marker)
            .map_err(|e| storage("reading a state marker", e))?
            .is_some())
    }

    fn state_meta(&self, store: &str) -> Result<StoreMeta, BrokerError> {
        if let Some(meta) = self.state.metas.get(store) {
            return Ok(*meta);
        }
        match self
            .store
            .state
            .get(meta_key(store))
            .map_err(|e| storage("reading a state store's bookkeeping", e))?
        {
            Some(bytes) => decode(&bytes),
            None => Ok(StoreMeta::default()),
        }
    }
}

/// Checks a call's state writes against the store as this group leaves
/// it, then adds them to the batch. Nothing is added unless every check
/// passes, so a refused settle leaves the batch as it was.
pub(super) fn apply(group: &mut Group<'_>, writes: &StateWrites) -> Result<(), BrokerError> {
    let store = &*writes.store;
    let marker = (!writes.writer.is_empty()).then(|| applied_key(store, &writes.writer));
    if let Some(marker) = &marker
        && group.state_applied(marker)?
    {
        // This message's state is in: its effect is not applied twice.
        tracing::info!(store, message = %writes.writer, "state of this message was committed before; the writes of its redelivery are dropped");
        return Ok(());
    }
    // Each key read once: the checks and the writes mostly name the same.
    let mut current: HashMap<&str, Option<Entry>> = HashMap::new();
    for (key, revision) in &writes.checks {
        let found = group.state_entry(&entry_key(store, key))?;
        let now = found.as_ref().map_or(0, |e| e.revision);
        current.insert(key, found);
        if now != *revision {
            return Err(BrokerError::StateConflict(format!(
                "state key `{key}` of store `{store}` changed (revision {revision} -> {now}) \
                 while the call ran; the call is retried on the new value"
            )));
        }
    }
    let mut meta = group.state_meta(store)?;
    let mut staged = Vec::with_capacity(writes.writes.len());
    let mut bytes = i128::from(meta.bytes);
    let mut keys = i128::from(meta.keys);
    for (key, write) in &writes.writes {
        let k = entry_key(store, key);
        let old = match current.remove(key.as_str()) {
            Some(found) => found,
            None => group.state_entry(&k)?,
        };
        bytes -= old.as_ref().map_or(0, |e| i128::from(e.size(key)));
        keys -= i128::from(old.is_some());
        let new = match write {
            Write::Put { value, expires_at } => {
                meta.revision += 1;
                let entry = Entry {
                    value: value.clone(),
                    revision: meta.revision,
                    expires_at: *expires_at,
                    writer: writes.writer.clone(),
                    written_at: group.now,
                };
                bytes += i128::from(entry.size(key));
                keys += 1;
                Some(entry)
            }
            Write::Delete => None,
        };
        staged.push((k, new));
    }
    let bytes = u64::try_from(bytes.max(0)).unwrap_or(u64::MAX);
    if bytes > meta.bytes && bytes > writes.max_bytes {
        return Err(BrokerError::StateConflict(format!(
            "state store `{store}` would hold {bytes} bytes, over its max_bytes of {}: other \
             calls filled it while this one ran; the call is retried and sees the store full",
            writes.max_bytes
        )));
    }
    meta.bytes = bytes;
    meta.keys = u64::try_from(keys.max(0)).unwrap_or(0);
    for (k, entry) in staged {
        match &entry {
            Some(entry) => {
                let value = encode(entry)?;
                group.batch.insert(&group.store.state, k.clone(), value);
            }
            None => group.batch.remove(&group.store.state, k.clone()),
        }
        group.state.entries.insert(k, entry);
    }
    group
        .batch
        .insert(&group.store.state, meta_key(store), encode(&meta)?);
    group.state.metas.insert(store.to_owned(), meta);
    if let Some(marker) = marker {
        group
            .batch
            .insert(&group.store.state, marker.clone(), group.now.to_be_bytes());
        group.state.applied.insert(marker);
    }
    Ok(())
}

/// Deletes `key` from `store` for an operator, as a handler's delete
/// would be written. Returns whether it was there.
pub(super) fn delete(group: &mut Group<'_>, store: &str, key: &str) -> Result<bool, BrokerError> {
    let Some(entry) = group.state_entry(&entry_key(store, key))? else {
        return Ok(false);
    };
    let writes = StateWrites {
        store: store.into(),
        max_bytes: u64::MAX,
        writer: String::new(),
        checks: vec![(key.to_owned(), entry.revision)],
        writes: vec![(key.to_owned(), Write::Delete)],
    };
    apply(group, &writes)?;
    Ok(true)
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
        match apply(group, &writes) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_key_names_its_store_whatever_the_key_holds() {
        let k = entry_key("p/s", "a\0b/c");
        assert_eq!(split_entry_key(&k), Some(("p/s", "a\0b/c")));
        assert!(k.starts_with(&entry_key("p/s", "")));
        assert!(!entry_key("p/st", "x").starts_with(&entry_key("p/s", "")));
    }
}
