//! Handler state on NATS ([`crate::state`]): one KV bucket per store,
//! `SLUICE_STATE_<store>_<hash>`, whose KV revisions are the state's.
//!
//! A handler's key `k` is the KV key `k.<k escaped>` (KV keys take few
//! characters: every byte outside `[A-Za-z0-9_-]` is written `=XX`). Beside
//! the keys, `m.<message id escaped>` marks a message whose writes are
//! applied; it expires after [`MARKER_TTL`].
//!
//! **What is atomic.** A call's writes and its marker are one JetStream
//! atomic batch on the bucket's stream (nats-server 2.12 or later): all
//! are stored or none. Each write of a key the call read carries the
//! revision it read (`Nats-Expected-Last-Subject-Sequence`), and the marker
//! must not exist yet, so a moved revision or a second application refuses
//! the whole batch. Keys the call only read (it wrote others) are checked
//! just before the batch, not inside it: a write landing in between is not
//! seen. The outputs and the ack follow the batch, as on every NATS
//! completion (they cannot share a transaction across streams). A crash
//! after the batch and before the ack redelivers the message; its call
//! runs again, its batch meets the marker, and the outputs the marker kept
//! are published instead of the rerun's, then the message is acked: the
//! writes are applied once, even after the streams' duplicate window has
//! passed (for [`MARKER_TTL`]). A marker keeps outputs up to
//! [`MAX_MARKER_OUTPUTS`] bytes; past that, a replay publishes the rerun's
//! outputs (same ids).
//!
//! **Size.** `max_bytes` is checked against the bucket's stored bytes as
//! the server counts them (entries with their overhead, and the last
//! hour's markers), when a call writes; concurrent calls may pass it by
//! their own writes.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{naming, read, write};
use crate::broker::{BrokerError, Message, now_millis};
use crate::state::{Entry, StateReader, StateWrites, StoreMeta, Write};

/// How long a message's applied-marker is kept: far past the duplicate
/// window and a daemon's restart, which is when an unacked message comes
/// back. Markers count against the store's `max_bytes`, so not longer.
pub const MARKER_TTL: Duration = Duration::from_secs(3600);

/// The most bytes of outputs a marker keeps; past it the marker keeps
/// none (a replay then publishes the rerun's outputs, under the same ids).
pub const MAX_MARKER_OUTPUTS: usize = 64 * 1024;

/// The most writes one batch carries (the server's limit is 1,000
/// messages, the marker included).
const MAX_BATCH: usize = 999;

/// JetStream's "wrong last sequence" error code.
const WRONG_LAST_SEQUENCE: u64 = 10071;

/// A stored value, as the bucket holds it.
#[derive(Serialize, Deserialize)]
struct Stored {
    #[serde(with = "serde_bytes")]
    value: Vec<u8>,
    expires_at: u64,
    writer: String,
    written_at: u64,
}

/// What a marker keeps.
#[derive(Serialize, Deserialize)]
struct Marker {
    /// The outputs the applied call published, if they fitted.
    outputs: Option<Vec<Message>>,
}

/// What committing a call's writes found.
pub(super) enum Commit {
    /// The writes are stored now.
    Applied,
    /// They were stored by an earlier run of the same message; publish
    /// these outputs (if kept) rather than the rerun's.
    AlreadyApplied(Option<Vec<Message>>),
}

/// The NATS broker's handler state: what [`crate::broker::Broker::state`]
/// hands out.
pub(super) struct NatsState {
    client: async_nats::Client,
    js: jetstream::Context,
    replicas: usize,
    buckets: RwLock<HashMap<String, kv::Store>>,
}

/// The bucket of `store` (`<pipeline>/<store>`): sanitised, with a hash of
/// the real name so two stores never share one.
pub(super) fn bucket_name(store: &str) -> String {
    let hash = blake3::hash(store.as_bytes()).to_hex();
    format!(
        "SLUICE_STATE_{}_{}",
        naming::durable_name(store),
        &hash[..8]
    )
}

/// `k` as a KV key.
fn kv_key(key: &str) -> String {
    let mut out = String::with_capacity(2 + key.len());
    out.push_str("k.");
    escape_into(&mut out, key);
    out
}

/// The marker of message `id`.
fn marker_key(id: &str) -> String {
    let mut out = String::with_capacity(2 + id.len());
    out.push_str("m.");
    escape_into(&mut out, id);
    out
}

fn escape_into(out: &mut String, text: &str) {
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("={b:02X}"));
        }
    }
}

/// The handler key of a KV key, if it is one.
fn handler_key(kv_key: &str) -> Option<String> {
    let escaped = kv_key.strip_prefix("k.")?;
    let mut bytes = Vec::with_capacity(escaped.len());
    let raw = escaped.as_bytes();
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'=' {
            let hex = escaped.get(i + 1..i + 3)?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            bytes.push(raw[i]);
            i += 1;
        }
    }
    String::from_utf8(bytes).ok()
}

fn unreadable(what: &str, err: &(impl std::fmt::Display + ?Sized)) -> String {
    format!("{what}: {err}")
}

fn decode_entry(entry: &kv::Entry) -> Result<Entry, String> {
    match entry.operation {
        // A deleted key reads as absent, with the delete's revision, so a
        // call that read it checks that revision at commit.
        kv::Operation::Delete | kv::Operation::Purge => Ok(Entry {
            value: Vec::new(),
            revision: entry.revision,
            expires_at: 1,
            writer: String::new(),
            written_at: 0,
        }),
        kv::Operation::Put => {
            let stored: Stored = rmp_serde::from_slice(&entry.value)
                .map_err(|e| format!("entry `{}` is damaged: {e}", entry.key))?;
            Ok(Entry {
                value: stored.value,
                revision: entry.revision,
                expires_at: stored.expires_at,
                writer: stored.writer,
                written_at: stored.written_at,
            })
        }
    }
}

impl NatsState {
    pub(super) fn new(client: async_nats::Client, js: jetstream::Context, replicas: usize) -> Self {
        NatsState {
            client,
            js,
            replicas,
            buckets: RwLock::new(HashMap::new()),
        }
    }

    /// The bucket of `store`, created (or its settings brought up to date)
    /// on first use.
    async fn bucket(&self, store: &str) -> Result<kv::Store, String> {
        if let Some(found) = read(&self.buckets).get(store) {
            return Ok(found.clone());
        }
        let name = bucket_name(store);
        // A KV bucket's stream, as async-nats makes one, plus atomic
        // batches (the commit) and per-message TTLs (expiring values and
        // markers).
        let config = jetstream::stream::Config {
            name: format!("KV_{name}"),
            description: Some(format!("Sluice handler state of {store}")),
            subjects: vec![format!("$KV.{name}.>")],
            max_messages_per_subject: 1,
            storage: jetstream::stream::StorageType::File,
            num_replicas: self.replicas.max(1),
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            discard: jetstream::stream::DiscardPolicy::New,
            allow_message_ttl: true,
            allow_atomic_publish: true,
            ..Default::default()
        };
        self.js.create_or_update_stream(config).await.map_err(|e| {
            unreadable(
                &format!(
                    "creating KV bucket {name} (atomic batches need nats-server 2.12 or later)"
                ),
                &e,
            )
        })?;
        let kv = self
            .js
            .get_key_value(name.clone())
            .await
            .map_err(|e| unreadable(&format!("opening KV bucket {name}"), &e))?;
        write(&self.buckets).insert(store.to_owned(), kv.clone());
        Ok(kv)
    }

    /// The revision `key` has now (0: never written or gone).
    async fn revision(&self, kv: &kv::Store, key: &str) -> Result<u64, String> {
        Ok(kv
            .entry(kv_key(key))
            .await
            .map_err(|e| unreadable("reading", &e))?
            .map_or(0, |e| e.revision))
    }

    /// Commits a call's writes with its marker, or finds them applied.
    pub(super) async fn commit(
        &self,
        writes: &StateWrites,
        outputs: &[Message],
    ) -> Result<Commit, BrokerError> {
        let unavailable =
            |e: String| BrokerError::Unavailable(format!("state store {}: {e}", writes.store));
        if writes.writes.len() > MAX_BATCH {
            return Err(BrokerError::Storage(format!(
                "state store {}: a call wrote {} keys; at most {MAX_BATCH} commit together on NATS",
                writes.store,
                writes.writes.len()
            )));
        }
        let kv = self.bucket(&writes.store).await.map_err(unavailable)?;
        let name = bucket_name(&writes.store);
        let checks: HashMap<&str, u64> = writes
            .checks
            .iter()
            .map(|(k, rev)| (k.as_str(), *rev))
            .collect();
        let written: std::collections::HashSet<&str> =
            writes.writes.iter().map(|(k, _)| k.as_str()).collect();
        // Keys only read: checked now, outside the batch (see the module
        // docs).
        for (key, rev) in &writes.checks {
            if written.contains(key.as_str()) {
                continue;
            }
            if self.revision(&kv, key).await.map_err(unavailable)? != *rev {
                if let Some(found) = self.applied(&kv, &writes.writer).await? {
                    return Ok(found);
                }
                return Err(conflict(&writes.store, key));
            }
        }
        let now = now_millis();
        let mut batch: Vec<(String, HeaderMap, Bytes)> =
            Vec::with_capacity(writes.writes.len() + 1);
        for (key, op) in &writes.writes {
            let mut headers = HeaderMap::new();
            if let Some(rev) = checks.get(key.as_str()) {
                headers.insert(
                    "Nats-Expected-Last-Subject-Sequence",
                    rev.to_string().as_str(),
                );
            }
            let payload = match op {
                Write::Put { value, expires_at } => {
                    if *expires_at != 0 {
                        // The server drops it a second after it expires;
                        // reads never see it past `expires_at` anyway.
                        let secs = expires_at.saturating_sub(now).div_ceil(1000) + 1;
                        headers.insert("Nats-TTL", format!("{secs}s").as_str());
                    }
                    let stored = Stored {
                        value: value.clone(),
                        expires_at: *expires_at,
                        writer: writes.writer.clone(),
                        written_at: now,
                    };
                    Bytes::from(rmp_serde::to_vec(&stored).map_err(|e| {
                        BrokerError::Storage(format!("encoding a state entry: {e}"))
                    })?)
                }
                Write::Delete => {
                    headers.insert("KV-Operation", "DEL");
                    Bytes::new()
                }
            };
            batch.push((format!("$KV.{name}.{}", kv_key(key)), headers, payload));
        }
        let kept = encode_outputs(outputs)?;
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Expected-Last-Subject-Sequence", "0");
        headers.insert("Nats-TTL", format!("{}s", MARKER_TTL.as_secs()).as_str());
        batch.push((
            format!("$KV.{name}.{}", marker_key(&writes.writer)),
            headers,
            kept,
        ));
        match self.publish_atomic(batch).await {
            Ok(()) => Ok(Commit::Applied),
            Err(refusal) => {
                if let Some(found) = self.applied(&kv, &writes.writer).await? {
                    return Ok(found);
                }
                match refusal {
                    Refusal::WrongSequence(why) => Err(BrokerError::StateConflict(format!(
                        "state store {}: a key the call read changed before its commit ({why})",
                        writes.store
                    ))),
                    Refusal::Other(why) => Err(unavailable(why)),
                }
            }
        }
    }

    /// Whether message `id`'s writes are applied, with the outputs kept.
    async fn applied(&self, kv: &kv::Store, id: &str) -> Result<Option<Commit>, BrokerError> {
        let found = kv
            .entry(marker_key(id))
            .await
            .map_err(|e| BrokerError::Unavailable(format!("state store: reading a marker: {e}")))?;
        match found {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let marker: Marker = rmp_serde::from_slice(&entry.value).map_err(|e| {
                    BrokerError::Storage(format!("state store: a marker is damaged: {e}"))
                })?;
                tracing::info!(message = %id, kept_outputs = marker.outputs.is_some(), "state of this message was committed before; the writes of its redelivery are dropped and the first run's outputs published");
                Ok(Some(Commit::AlreadyApplied(marker.outputs)))
            }
            _ => Ok(None),
        }
    }

    /// Publishes `batch` as one JetStream atomic batch: every message or
    /// none.
    async fn publish_atomic(&self, batch: Vec<(String, HeaderMap, Bytes)>) -> Result<(), Refusal> {
        let id = uuid::Uuid::now_v7().simple().to_string();
        let count = batch.len();
        for (n, (subject, mut headers, payload)) in batch.into_iter().enumerate() {
            headers.insert("Nats-Batch-Id", id.as_str());
            headers.insert("Nats-Batch-Sequence", (n + 1).to_string().as_str());
            if n + 1 < count {
                self.client
                    .publish_with_headers(subject, headers, payload)
                    .await
                    .map_err(|e| Refusal::Other(format!("publishing a batch: {e}")))?;
                continue;
            }
            headers.insert("Nats-Batch-Commit", "1");
            let reply = self
                .client
                .request_with_headers(subject, headers, payload)
                .await
                .map_err(|e| Refusal::Other(format!("committing a batch: {e}")))?;
            return match serde_json::from_slice::<BatchReply>(&reply.payload) {
                Ok(BatchReply {
                    error: Some(error), ..
                }) => {
                    if error.err_code == WRONG_LAST_SEQUENCE {
                        Err(Refusal::WrongSequence(error.description))
                    } else {
                        Err(Refusal::Other(format!(
                            "the server refused a batch: {} (error {})",
                            error.description, error.err_code
                        )))
                    }
                }
                Ok(BatchReply {
                    count: Some(stored),
                    ..
                }) if stored == count as u64 => Ok(()),
                Ok(_) => Err(Refusal::Other(format!(
                    "the server's answer to a batch of {count} does not confirm it: {}",
                    String::from_utf8_lossy(&reply.payload)
                ))),
                Err(e) => Err(Refusal::Other(format!(
                    "an unreadable answer to a batch: {e}"
                ))),
            };
        }
        Ok(())
    }

    /// Deletes `key` of `store` (an operator's delete). Returns whether it
    /// was there.
    pub(super) async fn delete(&self, store: &str, key: &str) -> Result<bool, BrokerError> {
        let unavailable = |e: String| BrokerError::Unavailable(format!("state store {store}: {e}"));
        let found = self.get(store, key).await.map_err(unavailable)?;
        let Some(entry) = found.filter(|e| !e.expired(now_millis())) else {
            return Ok(false);
        };
        // At the revision read: a handler's write in between is kept, and
        // the operator is told to look again.
        let mut headers = HeaderMap::new();
        headers.insert("KV-Operation", "DEL");
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence",
            entry.revision.to_string().as_str(),
        );
        let subject = format!("$KV.{}.{}", bucket_name(store), kv_key(key));
        self.js
            .publish_with_headers(subject, headers, Bytes::new())
            .await
            .map_err(|e| unavailable(e.to_string()))?
            .await
            .map_err(|e| match e.kind() {
                jetstream::context::PublishErrorKind::WrongLastSequence => {
                    BrokerError::StateConflict(format!(
                        "state store {store}: `{key}` changed while it was being deleted; read \
                         it again"
                    ))
                }
                _ => unavailable(e.to_string()),
            })?;
        Ok(true)
    }
}

/// Why a batch was not stored.
enum Refusal {
    /// A write's expected revision (or the marker's absence) did not hold.
    WrongSequence(String),
    /// Anything else.
    Other(String),
}

#[derive(Deserialize)]
struct BatchReply {
    error: Option<ApiError>,
    count: Option<u64>,
}

#[derive(Deserialize)]
struct ApiError {
    #[serde(default)]
    err_code: u64,
    #[serde(default)]
    description: String,
}

fn conflict(store: &str, key: &str) -> BrokerError {
    BrokerError::StateConflict(format!(
        "state store {store}: `{key}` changed since the call read it"
    ))
}

fn encode_outputs(outputs: &[Message]) -> Result<Bytes, BrokerError> {
    let size: usize = outputs.iter().map(|m| m.payload.len() + 256).sum();
    let marker = Marker {
        outputs: (size <= MAX_MARKER_OUTPUTS).then(|| outputs.to_vec()),
    };
    rmp_serde::to_vec(&marker)
        .map(Bytes::from)
        .map_err(|e| BrokerError::Storage(format!("encoding a state marker: {e}")))
}

#[async_trait::async_trait]
impl StateReader for NatsState {
    async fn get(&self, store: &str, key: &str) -> Result<Option<Entry>, String> {
        let kv = self.bucket(store).await?;
        match kv
            .entry(kv_key(key))
            .await
            .map_err(|e| unreadable("reading", &e))?
        {
            Some(entry) => decode_entry(&entry).map(Some),
            None => Ok(None),
        }
    }

    /// Scans the bucket's keys: on NATS a listing costs a pass over them
    /// all (KV keys are not ordered by prefix).
    async fn list(
        &self,
        store: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Entry)>, String> {
        use futures_util::StreamExt as _;
        let kv = self.bucket(store).await?;
        let mut all = kv
            .keys()
            .await
            .map_err(|e| unreadable("listing keys", &e))?;
        let mut keys: Vec<String> = Vec::new();
        while let Some(found) = all.next().await {
            let found = found.map_err(|e| unreadable("listing keys", &e))?;
            if let Some(key) = handler_key(&found)
                && key.starts_with(prefix)
                && after.is_none_or(|a| key.as_str() > a)
            {
                keys.push(key);
            }
        }
        keys.sort();
        keys.truncate(limit);
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(entry) = self.get(store, &key).await? {
                out.push((key, entry));
            }
        }
        Ok(out)
    }

    async fn meta(&self, store: &str) -> Result<StoreMeta, String> {
        self.bucket(store).await?;
        // One request: getting the stream answers with its info.
        let stream = self
            .js
            .get_stream(format!("KV_{}", bucket_name(store)))
            .await
            .map_err(|e| unreadable("reading the bucket", &e))?;
        let info = stream.cached_info();
        Ok(StoreMeta {
            revision: info.state.last_sequence,
            bytes: info.state.bytes,
            keys: info.state.messages,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_escape_to_valid_kv_keys_and_back() {
        for key in ["plain", "with.dots", "a b/c=d", "ünï", "-_"] {
            let escaped = kv_key(key);
            assert!(
                escaped
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_=.".contains(&b)),
                "{escaped}"
            );
            assert_eq!(escaped.matches('.').count(), 1, "{escaped}");
            assert_eq!(handler_key(&escaped).as_deref(), Some(key));
        }
        assert_eq!(handler_key(&marker_key("m1")), None);
        assert_ne!(bucket_name("a_b/c"), bucket_name("a/b_c"));
        assert!(bucket_name("p/s").starts_with("SLUICE_STATE_p_s_"));
    }
}
