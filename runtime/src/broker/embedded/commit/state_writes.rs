//! What a group's completions write to the `state` keyspace: each call's
//! writes checked against the store as the group leaves it (the overlay
//! of the group's earlier completions, then what the committer knows, then
//! the keyspace), and added to the group's batch ([`apply`]). The
//! keyspace's layout is here too; reading it for handlers, sweeping it
//! and operators' deletes are `../state.rs`.
//!
//! Keys: `e` + store + `0x00` + key for an entry ([`crate::state::Entry`]),
//! `m` + store for the store's [`StoreMeta`] (last revision, bytes, keys),
//! `a` + store + `0x00` + message id for a message whose call committed
//! state (so a redelivery does not apply its effect twice).
//! A store name (`<pipeline>/<store>`) holds no NUL byte, so an entry key
//! names its store without doubt whatever the handler's key holds.

use std::collections::HashMap;
use std::sync::PoisonError;

use fjall::{Keyspace, OwnedWriteBatch};

use crate::broker::BrokerError;
use crate::broker::embedded::Shared;
use crate::broker::embedded::store::{decode, encode, storage};
use crate::state::{Entry, StateWrites, StoreMeta, Write};

pub(in crate::broker::embedded) const ENTRY: u8 = b'e';
const META: u8 = b'm';
pub(in crate::broker::embedded) const APPLIED: u8 = b'a';

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
pub(in crate::broker::embedded) fn entry_key(store: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + store.len() + key.len());
    k.push(ENTRY);
    k.extend_from_slice(store.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

pub(in crate::broker::embedded) fn meta_key(store: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + store.len());
    k.push(META);
    k.extend_from_slice(store.as_bytes());
    k
}

/// The store and key an entry key holds.
pub(in crate::broker::embedded) fn split_entry_key(k: &[u8]) -> Option<(&str, &str)> {
    let rest = k.strip_prefix(&[ENTRY])?;
    let nul = rest.iter().position(|b| *b == 0)?;
    Some((
        std::str::from_utf8(&rest[..nul]).ok()?,
        std::str::from_utf8(&rest[nul + 1..]).ok()?,
    ))
}

/// What a completion's checks need of an entry: its revision, and the bytes
/// it counts towards its store's `max_bytes`.
#[derive(Clone, Copy)]
pub(in crate::broker::embedded) struct Brief {
    pub(in crate::broker::embedded) revision: u64,
    size: u64,
}

impl Brief {
    fn of(key: &str, entry: &Entry) -> Brief {
        Brief {
            revision: entry.revision,
            size: entry.size(key),
        }
    }
}

/// What a group has written to the `state` keyspace but not yet
/// committed: later completions in the same group check against it.
#[derive(Default)]
pub(in crate::broker::embedded) struct Overlay {
    entries: HashMap<Vec<u8>, Option<Brief>>,
    metas: HashMap<String, StoreMeta>,
    applied: std::collections::HashSet<Vec<u8>>,
}

/// Entries the committer remembers, at most, per generation.
const KNOWN_PER_GENERATION: usize = 64 * 1024;

/// What committed groups wrote, as the committer last left it: the
/// committer is the only writer of the keyspace, so this is exact, and
/// a completion whose keys were written lately checks them, and a store's
/// bookkeeping, without a read. Two generations bound it (the older is
/// dropped when the newer fills); it is forgotten whole after a failed
/// write, when what the store holds is only known again by reading it.
#[derive(Default)]
pub(in crate::broker::embedded) struct Known {
    entries: [HashMap<Vec<u8>, Option<Brief>>; 2],
    metas: HashMap<String, StoreMeta>,
}

impl Known {
    fn entry(&self, key: &[u8]) -> Option<Option<Brief>> {
        self.entries[0]
            .get(key)
            .or_else(|| self.entries[1].get(key))
            .copied()
    }

    /// Takes in what a group committed.
    fn remember(&mut self, overlay: &mut Overlay) {
        for (k, brief) in overlay.entries.drain() {
            if self.entries[0].len() >= KNOWN_PER_GENERATION {
                self.entries[1] = std::mem::take(&mut self.entries[0]);
            }
            self.entries[0].insert(k, brief);
        }
        self.metas.extend(overlay.metas.drain());
    }

    fn forget(&mut self) {
        *self = Known::default();
    }
}

fn known(shared: &Shared) -> std::sync::MutexGuard<'_, Known> {
    shared
        .state_known
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// After a group's batch is in the store: what it wrote to the `state`
/// keyspace is what the committer knows from now on.
pub(in crate::broker::embedded) fn committed(shared: &Shared, overlay: &mut Overlay) {
    if !overlay.entries.is_empty() || !overlay.metas.is_empty() {
        known(shared).remember(overlay);
    }
}

/// After a failed write: the store may or may not hold the group, so
/// nothing is known until read again.
pub(in crate::broker::embedded) fn forget(shared: &Shared) {
    known(shared).forget();
}

/// Before a group's batch is written: each store's bookkeeping once, as
/// the group's last completion left it (not once per completion).
pub(in crate::broker::embedded) fn write_metas(
    overlay: &Overlay,
    batch: &mut OwnedWriteBatch,
    keyspace: &Keyspace,
) -> Result<(), BrokerError> {
    for (store, meta) in &overlay.metas {
        batch.insert(keyspace, meta_key(store), encode(meta)?);
    }
    Ok(())
}

/// What a completion's state writes are checked against and added to: the
/// group's overlay and batch, the committer's [`Known`], the keyspace.
pub(in crate::broker::embedded) struct StateView<'g> {
    pub(in crate::broker::embedded) shared: &'g Shared,
    pub(in crate::broker::embedded) keyspace: &'g Keyspace,
    pub(in crate::broker::embedded) overlay: &'g mut Overlay,
    pub(in crate::broker::embedded) batch: &'g mut OwnedWriteBatch,
    pub(in crate::broker::embedded) now: u64,
}

impl StateView<'_> {
    /// The revision and size of the entry at keyspace key `key` (whose
    /// handler key is `key_text`), as this group leaves it.
    pub(in crate::broker::embedded) fn entry(
        &self,
        key: &[u8],
        key_text: &str,
    ) -> Result<Option<Brief>, BrokerError> {
        if let Some(found) = self.overlay.entries.get(key) {
            return Ok(*found);
        }
        if let Some(found) = known(self.shared).entry(key) {
            return Ok(found);
        }
        match self
            .keyspace
            .get(key)
            .map_err(|e| storage("reading a state entry", e))?
        {
            Some(bytes) => decode::<Entry>(&bytes).map(|e| Some(Brief::of(key_text, &e))),
            None => Ok(None),
        }
    }

    fn applied(&self, marker: &[u8]) -> Result<bool, BrokerError> {
        if self.overlay.applied.contains(marker) {
            return Ok(true);
        }
        Ok(self
            .keyspace
            .get(marker)
            .map_err(|e| storage("reading a state marker", e))?
            .is_some())
    }

    fn meta(&self, store: &str) -> Result<StoreMeta, BrokerError> {
        if let Some(meta) = self.overlay.metas.get(store) {
            return Ok(*meta);
        }
        if let Some(meta) = known(self.shared).metas.get(store) {
            return Ok(*meta);
        }
        match self
            .keyspace
            .get(meta_key(store))
            .map_err(|e| storage("reading a state store's bookkeeping", e))?
        {
            Some(bytes) => decode(&bytes),
            None => Ok(StoreMeta::default()),
        }
    }
}

/// A call's state writes as a completion carries them to the committer: the
/// revisions of its values were given out when it was sent
/// (`../state.rs`, `InFlightWrites`), from `first_revision` on, in order.
pub(in crate::broker::embedded) struct Stamped {
    pub(in crate::broker::embedded) writes: StateWrites,
    pub(in crate::broker::embedded) first_revision: u64,
}

/// Checks a call's state writes against the store as this group leaves
/// it, then adds them to the batch. Nothing is added unless every check
/// passes, so a refused completion leaves the batch as it was. The values
/// take revisions from `first_revision` on (0 for writes that only delete,
/// as an operator's and the sweep's do).
pub(in crate::broker::embedded) fn apply(
    group: StateView<'_>,
    writes: &StateWrites,
    first_revision: u64,
) -> Result<(), BrokerError> {
    let store = &*writes.store;
    let marker = (!writes.writer.is_empty()).then(|| applied_key(store, &writes.writer));
    if let Some(marker) = &marker
        && group.applied(marker)?
    {
        // This message's state is in: its effect is not applied twice.
        tracing::info!(store, message = %writes.writer, "state of this message was committed before; the writes of its redelivery are dropped");
        return Ok(());
    }
    // Each key read once: the checks and the writes mostly name the same.
    let mut current: HashMap<&str, Option<Brief>> = HashMap::new();
    for (key, revision) in &writes.checks {
        let found = group.entry(&entry_key(store, key), key)?;
        let now = found.as_ref().map_or(0, |e| e.revision);
        current.insert(key, found);
        if now != *revision {
            return Err(BrokerError::StateConflict(format!(
                "state key `{key}` of store `{store}` changed (revision {revision} -> {now}) \
                 while the call ran; the call is retried on the new value"
            )));
        }
    }
    let mut meta = group.meta(store)?;
    let mut staged = Vec::with_capacity(writes.writes.len());
    let mut bytes = i128::from(meta.bytes);
    let mut keys = i128::from(meta.keys);
    let mut next_revision = first_revision;
    for (key, write) in &writes.writes {
        let k = entry_key(store, key);
        let old = match current.remove(key.as_str()) {
            Some(found) => found,
            None => group.entry(&k, key)?,
        };
        bytes -= old.map_or(0, |e| i128::from(e.size));
        keys -= i128::from(old.is_some());
        let new = match write {
            Write::Put { value, expires_at } => {
                debug_assert!(first_revision > 0, "a value written without its revision");
                meta.revision = meta.revision.max(next_revision);
                let entry = Entry {
                    value: value.clone(),
                    revision: next_revision,
                    expires_at: *expires_at,
                    writer: writes.writer.clone(),
                    written_at: group.now,
                };
                next_revision += 1;
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
    for ((k, entry), (key, _)) in staged.into_iter().zip(&writes.writes) {
        let brief = match &entry {
            Some(entry) => {
                let value = encode(entry)?;
                group.batch.insert(group.keyspace, k.clone(), value);
                Some(Brief::of(key, entry))
            }
            None => {
                group.batch.remove(group.keyspace, k.clone());
                None
            }
        };
        group.overlay.entries.insert(k, brief);
    }
    // The bookkeeping is written once per group ([`write_metas`]).
    group.overlay.metas.insert(store.to_owned(), meta);
    if let Some(marker) = marker {
        group
            .batch
            .insert(group.keyspace, marker.clone(), group.now.to_be_bytes());
        group.overlay.applied.insert(marker);
    }
    Ok(())
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
