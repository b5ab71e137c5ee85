//! A store in memory, for `sluice plugin test`: a handler that uses state
//! is tested without a daemon, with what a case says the store holds
//! before the call, and what it must hold after.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use super::{Entry, StateReader, StateWrites, StoreMeta, Write};

/// One store's entries, committed as the embedded broker commits them
/// (revisions checked, then written), without the broker.
#[derive(Debug, Default)]
pub struct MemoryState {
    inner: Mutex<(BTreeMap<String, Entry>, u64)>,
}

impl MemoryState {
    /// A store holding `entries` (each at its own revision, no expiry).
    pub fn with(entries: impl IntoIterator<Item = (String, Vec<u8>)>) -> Self {
        let mut map = BTreeMap::new();
        let mut revision = 0;
        for (key, value) in entries {
            revision += 1;
            map.insert(
                key,
                Entry {
                    value,
                    revision,
                    expires_at: 0,
                    writer: String::new(),
                    written_at: 0,
                },
            );
        }
        MemoryState {
            inner: Mutex::new((map, revision)),
        }
    }

    /// Commits a call's writes, or says which revision moved.
    ///
    /// # Errors
    ///
    /// A key the call read was changed since.
    pub fn commit(&self, writes: &StateWrites, now: u64) -> Result<(), String> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (map, revision) = &mut *inner;
        for (key, read) in &writes.checks {
            let now_rev = map.get(key).map_or(0, |e| e.revision);
            if now_rev != *read {
                return Err(format!(
                    "state key `{key}` changed (revision {read} -> {now_rev})"
                ));
            }
        }
        for (key, write) in &writes.writes {
            match write {
                Write::Put { value, expires_at } => {
                    *revision += 1;
                    map.insert(
                        key.clone(),
                        Entry {
                            value: value.clone(),
                            revision: *revision,
                            expires_at: *expires_at,
                            writer: writes.writer.clone(),
                            written_at: now,
                        },
                    );
                }
                Write::Delete => {
                    map.remove(key);
                }
            }
        }
        Ok(())
    }

    /// The live values at `now`.
    pub fn values(&self, now: u64) -> BTreeMap<String, Vec<u8>> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner
            .0
            .iter()
            .filter(|(_, e)| !e.expired(now))
            .map(|(k, e)| (k.clone(), e.value.clone()))
            .collect()
    }
}

#[async_trait::async_trait]
impl StateReader for MemoryState {
    async fn get(&self, _store: &str, key: &str) -> Result<Option<Entry>, String> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(inner.0.get(key).cloned())
    }

    async fn list(
        &self,
        _store: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Entry)>, String> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(inner
            .0
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(k, _)| after.is_none_or(|a| k.as_str() > a))
            .take(limit)
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect())
    }

    async fn meta(&self, _store: &str) -> Result<StoreMeta, String> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(StoreMeta {
            revision: inner.1,
            bytes: inner.0.iter().map(|(k, e)| e.size(k)).sum(),
            keys: inner.0.len() as u64,
        })
    }
}
