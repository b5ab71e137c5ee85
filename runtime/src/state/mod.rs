//! Handler state (`sluice:plugin/state`, contract 0.2.0): a stage's
//! key-value store whose writes commit with the call's outcome.
//!
//! A call never writes the store itself. It reads through a
//! [`StateReader`] (the broker's store, as committed) and buffers its
//! writes in a [`Txn`], which answers its own reads from those writes. When
//! the call ends `ok`, the engine hands the buffer ([`StateWrites`]) to the
//! broker with the outputs and the ack ([`crate::broker::Completion`]);
//! the embedded broker checks and writes it in the same transaction. On any
//! other outcome the buffer is dropped, so a failed call leaves nothing.
//!
//! Concurrency is optimistic. Every value a call's result depends on (a
//! `get`, the current value of a `compare-and-set` or an `increment`) is
//! noted with the revision it had ([`StateWrites::checks`]); if one of them
//! moved by commit time, the commit is refused and the call retried with
//! kind `state-conflict`. An update is never lost.
//!
//! This module is shared by the plugin host (which runs the [`Txn`]) and
//! the brokers (which implement [`StateReader`] and commit), so neither
//! depends on the other.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

mod memory;
#[cfg(test)]
mod tests;

pub use memory::MemoryState;

/// The longest key, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// The largest value, in bytes (NATS KV's default message size).
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// The most keys one call may write.
pub const MAX_WRITES_PER_CALL: usize = 1000;
/// The most bytes (keys and values) one call may buffer.
pub const MAX_CALL_BYTES: usize = 16 << 20;
/// The most keys one `list` returns.
pub const MAX_LIST: u32 = 1000;
/// The revision a value written in this call reads back with: it has none
/// until the call commits.
pub const PENDING: u64 = u64::MAX;

/// One stored value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The bytes.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// The store's revision when it was written: unique within the store,
    /// increasing, never reused (so a compare-and-set cannot be fooled by a
    /// key deleted and written again).
    pub revision: u64,
    /// When it expires, in milliseconds since the Unix epoch; 0 never.
    pub expires_at: u64,
    /// The id of the message whose call wrote it.
    pub writer: String,
    /// When it was written (committed), in milliseconds since the Unix epoch.
    pub written_at: u64,
}

impl Entry {
    /// Whether it has expired at `now` (an expired value reads as absent).
    pub fn expired(&self, now: u64) -> bool {
        self.expires_at != 0 && self.expires_at <= now
    }

    /// The bytes it counts against its store's `max_bytes`, with its key.
    pub fn size(&self, key: &str) -> u64 {
        (key.len() + self.value.len()) as u64
    }
}

/// A store's bookkeeping, kept beside its entries and written with them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreMeta {
    /// The last revision given out.
    pub revision: u64,
    /// Bytes held (keys and values).
    pub bytes: u64,
    /// Keys held.
    pub keys: u64,
}

/// A write a call buffered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Set the value (and its expiry, 0 for none).
    Put {
        /// The bytes.
        value: Vec<u8>,
        /// When it expires, or 0.
        expires_at: u64,
    },
    /// Remove the key.
    Delete,
}

/// What a call that ended `ok` commits with its outputs and its ack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateWrites {
    /// The store: `<pipeline>/<store>`.
    pub store: Arc<str>,
    /// Its size limit, checked again at commit.
    pub max_bytes: u64,
    /// The message whose call wrote them.
    pub writer: String,
    /// Keys whose revision must still be this at commit (0: absent).
    pub checks: Vec<(String, u64)>,
    /// The writes, in key order.
    pub writes: Vec<(String, Write)>,
}

/// Why a state operation failed: what the guest sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// The stage does not grant `state:`.
    #[error("{0}")]
    NotGranted(String),
    /// The store is at its `max_bytes`.
    #[error("{0}")]
    StoreFull(String),
    /// A key, value or argument the store does not take.
    #[error("{0}")]
    Invalid(String),
    /// The store could not be read.
    #[error("{0}")]
    Unavailable(String),
}

/// Reads a broker's committed state (async: on NATS a read is a round
/// trip to the server).
#[async_trait::async_trait]
pub trait StateReader: Send + Sync + 'static {
    /// The entry at `key` of `store`, expired or not. A broker whose
    /// deleted keys keep a revision (a NATS KV delete marker) answers an
    /// entry already expired, so the call's check names that revision.
    async fn get(&self, store: &str, key: &str) -> Result<Option<Entry>, String>;

    /// Up to `limit` entries of `store` whose keys start with `prefix`, in
    /// key order, after `after` if given; expired ones included.
    async fn list(
        &self,
        store: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Entry)>, String>;

    /// The store's bookkeeping (zero for a store never written).
    async fn meta(&self, store: &str) -> Result<StoreMeta, String>;
}

/// A stage's grant of state, as a worker holds it.
#[derive(Clone)]
pub struct StateAccess {
    /// Where committed state is read.
    pub reader: Arc<dyn StateReader>,
    /// The store: `<pipeline>/<store>`.
    pub store: Arc<str>,
    /// Its size limit.
    pub max_bytes: u64,
}

impl std::fmt::Debug for StateAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateAccess")
            .field("store", &self.store)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

/// A committed value as the guest sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The bytes.
    pub value: Vec<u8>,
    /// Its revision ([`PENDING`] if this call wrote it).
    pub revision: u64,
}

/// One call's view of its store: committed reads, its own writes on top.
pub struct Txn {
    access: StateAccess,
    writer: String,
    now: u64,
    /// What the store held for each key this call fetched.
    fetched: BTreeMap<String, Option<Entry>>,
    /// Revisions the result depends on (0: absent).
    checks: BTreeMap<String, u64>,
    writes: BTreeMap<String, Write>,
    /// Bytes buffered by the writes (keys and values).
    buffered: usize,
    /// The store's bytes when first needed.
    store_bytes: Option<u64>,
}

impl Txn {
    /// A fresh view for the call handling message `writer`, at `now`.
    pub fn new(access: StateAccess, writer: String, now: u64) -> Self {
        Txn {
            access,
            writer,
            now,
            fetched: BTreeMap::new(),
            checks: BTreeMap::new(),
            writes: BTreeMap::new(),
            buffered: 0,
            store_bytes: None,
        }
    }

    /// Why the store could not be read, as the guest sees it.
    fn unreadable(&self, e: &str) -> StateError {
        StateError::Unavailable(format!(
            "state store `{}` could not be read: {e}",
            self.access.store
        ))
    }

    /// The committed entry at `key` (cached for the call).
    async fn fetch(&mut self, key: &str) -> Result<Option<Entry>, StateError> {
        if let Some(found) = self.fetched.get(key) {
            return Ok(found.clone());
        }
        let found = self
            .access
            .reader
            .get(&self.access.store, key)
            .await
            .map_err(|e| self.unreadable(&e))?;
        self.fetched.insert(key.to_owned(), found.clone());
        Ok(found)
    }

    /// The value at `key` as this call sees it, noting the committed
    /// revision it depends on.
    pub async fn get(&mut self, key: &str) -> Result<Option<Seen>, StateError> {
        check_key(key)?;
        match self.writes.get(key) {
            Some(Write::Put { value, .. }) => {
                return Ok(Some(Seen {
                    value: value.clone(),
                    revision: PENDING,
                }));
            }
            Some(Write::Delete) => return Ok(None),
            None => {}
        }
        let found = self.fetch(key).await?;
        let revision = found.as_ref().map_or(0, |e| e.revision);
        self.checks.entry(key.to_owned()).or_insert(revision);
        Ok(found.filter(|e| !e.expired(self.now)).map(|e| Seen {
            value: e.value,
            revision: e.revision,
        }))
    }

    /// The expiry a value at `key` would keep (for `increment`).
    fn expiry_of(&self, key: &str) -> u64 {
        match self.writes.get(key) {
            Some(Write::Put { expires_at, .. }) => *expires_at,
            Some(Write::Delete) => 0,
            None => self
                .fetched
                .get(key)
                .and_then(Option::as_ref)
                .filter(|e| !e.expired(self.now))
                .map_or(0, |e| e.expires_at),
        }
    }

    /// Buffers `value` at `key`, expiring `ttl_ms` from now if given.
    pub async fn set(
        &mut self,
        key: &str,
        value: Vec<u8>,
        ttl_ms: Option<u64>,
    ) -> Result<(), StateError> {
        check_key(key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(StateError::Invalid(format!(
                "a value of {} bytes is over the limit of {MAX_VALUE_BYTES} bytes",
                value.len()
            )));
        }
        let expires_at = match ttl_ms {
            None => 0,
            Some(0) => {
                return Err(StateError::Invalid(
                    "a TTL of 0 ms would expire the value at once; leave it out to keep the value"
                        .into(),
                ));
            }
            Some(ms) => self.now.saturating_add(ms),
        };
        self.put(key, Write::Put { value, expires_at }).await
    }

    /// Buffers the removal of `key`.
    pub async fn delete(&mut self, key: &str) -> Result<(), StateError> {
        check_key(key)?;
        self.put(key, Write::Delete).await
    }

    /// Sets `key` to `value` if its revision is `revision` (0: absent or
    /// expired). Returns whether it did.
    pub async fn compare_and_set(
        &mut self,
        key: &str,
        revision: u64,
        value: Vec<u8>,
        ttl_ms: Option<u64>,
    ) -> Result<bool, StateError> {
        let current = self.get(key).await?.map_or(0, |seen| seen.revision);
        if current != revision {
            return Ok(false);
        }
        self.set(key, value, ttl_ms).await?;
        Ok(true)
    }

    /// Adds `delta` to the integer at `key` (absent: 0), stored as decimal
    /// text, keeping its expiry. Returns the new value.
    pub async fn increment(&mut self, key: &str, delta: i64) -> Result<i64, StateError> {
        let current = match self.get(key).await? {
            None => 0,
            Some(seen) => std::str::from_utf8(&seen.value)
                .ok()
                .and_then(|text| text.trim().parse::<i64>().ok())
                .ok_or_else(|| {
                    StateError::Invalid(format!(
                        "the value at `{key}` is not an integer in decimal text, so it cannot be \
                         incremented"
                    ))
                })?,
        };
        let next = current.checked_add(delta).ok_or_else(|| {
            StateError::Invalid(format!(
                "incrementing `{key}` by {delta} overflows a 64-bit integer"
            ))
        })?;
        let expires_at = self.expiry_of(key);
        self.put(
            key,
            Write::Put {
                value: next.to_string().into_bytes(),
                expires_at,
            },
        )
        .await?;
        Ok(next)
    }

    /// Up to `limit` keys that start with `prefix`, in order, as this call
    /// sees them. Not part of the conflict check: a key another call adds
    /// meanwhile does not retry this one.
    pub async fn list(&mut self, prefix: &str, limit: u32) -> Result<Vec<String>, StateError> {
        if limit > MAX_LIST {
            return Err(StateError::Invalid(format!(
                "list asks for {limit} keys; at most {MAX_LIST} per call"
            )));
        }
        let limit = limit as usize;
        let mut keys = std::collections::BTreeSet::new();
        let mut after: Option<String> = None;
        // Pages until `limit` live keys are found or the prefix ends:
        // expired and deleted ones do not count.
        loop {
            let page = self
                .access
                .reader
                .list(&self.access.store, prefix, after.as_deref(), limit.max(1))
                .await
                .map_err(|e| self.unreadable(&e))?;
            let full = page.len() >= limit.max(1);
            for (key, entry) in &page {
                if !entry.expired(self.now) && !matches!(self.writes.get(key), Some(Write::Delete))
                {
                    keys.insert(key.clone());
                }
            }
            after = page.last().map(|(key, _)| key.clone());
            if !full || keys.len() >= limit || after.is_none() {
                break;
            }
        }
        for (key, write) in self.writes.range(prefix.to_owned()..) {
            if !key.starts_with(prefix) {
                break;
            }
            if matches!(write, Write::Put { .. }) {
                keys.insert(key.clone());
            }
        }
        Ok(keys.into_iter().take(limit).collect())
    }

    /// Buffers one write, within the call's and the store's limits.
    async fn put(&mut self, key: &str, write: Write) -> Result<(), StateError> {
        if !self.writes.contains_key(key) && self.writes.len() >= MAX_WRITES_PER_CALL {
            return Err(StateError::Invalid(format!(
                "a call may write at most {MAX_WRITES_PER_CALL} keys"
            )));
        }
        let new_len = match &write {
            Write::Put { value, .. } => key.len() + value.len(),
            Write::Delete => 0,
        };
        let old_buffered = match self.writes.get(key) {
            Some(Write::Put { value, .. }) => key.len() + value.len(),
            _ => 0,
        };
        let buffered = self.buffered - old_buffered + new_len;
        if buffered > MAX_CALL_BYTES {
            return Err(StateError::Invalid(format!(
                "a call may buffer at most {MAX_CALL_BYTES} bytes of state writes"
            )));
        }
        // The store's size after this write, against `max_bytes`: what
        // the call's writes add over what they replace.
        let committed = self.fetch(key).await?;
        let grows = new_len as u64 > committed.as_ref().map_or(0, |e| e.size(key));
        if grows {
            let store_bytes = self.store_bytes().await?;
            let after = self.size_after(store_bytes, key, new_len).await?;
            if after > self.access.max_bytes {
                return Err(StateError::StoreFull(format!(
                    "state store `{}` is full: this write would take it to {after} bytes, over \
                     its max_bytes of {}; delete keys, set TTLs, or raise `state.max_bytes`",
                    self.access.store, self.access.max_bytes
                )));
            }
        }
        self.buffered = buffered;
        self.writes.insert(key.to_owned(), write);
        Ok(())
    }

    async fn store_bytes(&mut self) -> Result<u64, StateError> {
        if let Some(bytes) = self.store_bytes {
            return Ok(bytes);
        }
        let meta = self
            .access
            .reader
            .meta(&self.access.store)
            .await
            .map_err(|e| self.unreadable(&e))?;
        self.store_bytes = Some(meta.bytes);
        Ok(meta.bytes)
    }

    /// The store's bytes if the call's writes, with `key` at `new_len`, commit.
    async fn size_after(
        &mut self,
        store_bytes: u64,
        key: &str,
        new_len: usize,
    ) -> Result<u64, StateError> {
        let mut total = store_bytes as i128;
        let mut keys: Vec<String> = self.writes.keys().cloned().collect();
        if !self.writes.contains_key(key) {
            keys.push(key.to_owned());
        }
        for k in keys {
            let old = self.fetch(&k).await?.map_or(0, |e| e.size(&k)) as i128;
            let new = if k == key {
                new_len as i128
            } else {
                match &self.writes[&k] {
                    Write::Put { value, .. } => (k.len() + value.len()) as i128,
                    Write::Delete => 0,
                }
            };
            total += new - old;
        }
        Ok(total.max(0) as u64)
    }

    /// The keys the call read from the store, in order (a dead letter
    /// names them, so its case can be tested with their values).
    pub fn read_keys(&self) -> Vec<String> {
        self.checks.keys().cloned().collect()
    }

    /// What the call commits if it ends `ok`; none if it wrote nothing.
    pub fn finish(self) -> Option<StateWrites> {
        if self.writes.is_empty() {
            return None;
        }
        Some(StateWrites {
            store: self.access.store,
            max_bytes: self.access.max_bytes,
            writer: self.writer,
            checks: self.checks.into_iter().collect(),
            writes: self.writes.into_iter().collect(),
        })
    }
}

/// Keys are non-empty text of at most [`MAX_KEY_BYTES`].
fn check_key(key: &str) -> Result<(), StateError> {
    if key.is_empty() {
        return Err(StateError::Invalid("a state key cannot be empty".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(StateError::Invalid(format!(
            "a state key of {} bytes is over the limit of {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    Ok(())
}

/// The store a stage's `state:` names: `<pipeline>/<store>`.
pub fn store_name(pipeline: &str, store: &str) -> String {
    format!("{pipeline}/{store}")
}
