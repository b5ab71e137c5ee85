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
//! | `settled` | consumer id (u32 BE) + first seq (u64 BE) | end seq, exclusive (u64 BE): first deliveries completed above the floor |
//! | `dedup`, `dedup_b` | topic id (u32 BE) + message id | [`DedupRecord`]: the duplicate window's two generations ([`super::window`]) |
//! | `idempotency` | consumer name + 0 + SHA-256 of the dedup key | [`crate::broker::idempotency::Record`] (COMPLETED) |
//! | `delayed` | topic id (u32 BE) + due ms (u64 BE) + the topic's delay counter (u64 BE) | [`MessageRecord`] not yet due ([`super::delayed`]) |
//!
//! Big-endian integers make byte order equal numeric order, so a topic's
//! messages and a consumer's pending entries are contiguous ranges.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::broker::BrokerError;

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
#[derive(Serialize, Clone, Copy)]
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
    /// Messages waiting in `delayed` for their time. Absent in records
    /// written before delays existed.
    #[serde(default)]
    pub delayed: u64,
    /// The last delay counter used in a `delayed` key of this topic.
    #[serde(default)]
    pub delay_seq: u64,
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
    /// Most uncompleted deliveries at once.
    pub max_ack_pending: Option<u32>,
    /// Paused by the operator (`sluice stage pause`): delivers nothing
    /// until resumed. Absent in records written before pauses existed.
    #[serde(default)]
    pub paused: bool,
}

/// A delivered, uncompleted message of one consumer.
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

/// Key of the pending entry of `seq` for consumer `consumer_id`.
pub(super) fn pending_key(consumer_id: u32, seq: u64) -> [u8; 12] {
    id_seq_key(consumer_id, seq)
}

/// Key of a completed run of consumer `consumer_id` starting at `start`.
pub(super) fn run_key(consumer_id: u32, start: u64) -> [u8; 12] {
    id_seq_key(consumer_id, start)
}

/// Key of a delayed message of topic `topic_id` due at `due_ms`, the
/// topic's `counter`-th delayed message: a topic's delayed messages are
/// one range, in due order.
pub(super) fn delayed_key(topic_id: u32, due_ms: u64, counter: u64) -> [u8; 20] {
    let mut k = [0u8; 20];
    k[..4].copy_from_slice(&topic_id.to_be_bytes());
    k[4..12].copy_from_slice(&due_ms.to_be_bytes());
    k[12..].copy_from_slice(&counter.to_be_bytes());
    k
}

/// The due time of a `delayed` key.
pub(super) fn delayed_due(key: &[u8]) -> Result<u64, BrokerError> {
    key_seq(key)
}

/// Key of a consumer's cursor.
pub(super) fn cursor_key(consumer_id: u32) -> [u8; 4] {
    consumer_id.to_be_bytes()
}

/// A consumer's durable position: where its next read starts, and its
/// floor.
///
/// A first delivery writes no pending record (that was two LSM entries
/// per message per consumer: the record, then its tombstone at its completion).
/// Instead every seq in `floor..cursor` without a pending record and not
/// in a completed run (the `settled` keyspace) counts, after a restart, as
/// delivered once and not completed: it is delivered again (attempt 2) if
/// its message is still stored and the filter takes it. Every seq below
/// `floor` is completed.
///
/// A completion is as durable as before, in the same write batch as its
/// outputs: the batch raises the floor past it (completed in order), or
/// stores it in a completed run (completed while an earlier delivery is still
/// out); runs below the floor are deleted as it rises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Position {
    /// The next seq to read.
    pub cursor: u64,
    /// Every seq below is completed.
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

/// Decodes `bytes` as every kind of value and key the store holds, as
/// opening a damaged store would: each gives a value or an error. For the
/// fuzz targets.
#[cfg(feature = "fuzz")]
pub(crate) fn decode_every_record(bytes: &[u8]) {
    let _ = decode::<MessageRecord>(bytes);
    if let Ok(m) = decode_message(fjall::Slice::from(bytes)) {
        let again = encode_message(&MessageRecordRef {
            published_at: m.published_at,
            id: &m.id,
            key: &m.key,
            headers: &m.headers,
            payload: &m.payload,
        })
        .expect("a decoded message encodes");
        let back = decode_message(again).expect("an encoded message decodes");
        assert_eq!(back.payload, m.payload, "a payload changed in a round trip");
    }
    let _ = decode::<TopicRecord>(bytes);
    let _ = decode::<ConsumerRecord>(bytes);
    let _ = decode::<PendingRecord>(bytes);
    let _ = decode::<DedupRecord>(bytes);
    let _ = decode::<crate::broker::idempotency::Record>(bytes);
    if let Some(p) = Position::decode(bytes) {
        let again = Position::decode(&p.encode()).expect("an encoded position decodes");
        assert_eq!(again.cursor, p.cursor);
    }
    let _ = key_seq(bytes);
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

/// Payloads from this size on are decoded as a view into the stored value
/// rather than copied out of it ([`decode_message`]). Below it a copy is
/// cheap, and a view could keep a whole table block alive for a few bytes.
const SHARE_PAYLOAD_FROM: usize = 64 << 10;

/// Encodes a message record straight into the buffer fjall stores: the
/// bytes [`encode`] gives, without a `Vec` that the write batch would copy
/// again (a 60 MB payload was held twice more before it reached the
/// journal). The payload is the record's last field, so the record is the
/// encoding of the other fields, then the payload's bin header, then the
/// payload.
pub(super) fn encode_message(rec: &MessageRecordRef<'_>) -> Result<fjall::Slice, BrokerError> {
    use std::io::Read as _;
    let empty = Bytes::new();
    let head = encode(&MessageRecordRef {
        payload: &empty,
        ..*rec
    })?;
    // An empty payload encodes as bin 8 of length 0.
    let head = head
        .strip_suffix(&[0xc4, 0x00])
        .ok_or_else(|| BrokerError::Storage("encoding a record: unexpected layout".into()))?;
    let len = rec.payload.len();
    // The bin header on the stack: a Vec here would be one more allocation
    // per message on the publish path.
    let mut bin = [0u8; 5];
    let bin = match u32::try_from(len) {
        Ok(n) if n < 1 << 8 => {
            bin[..2].copy_from_slice(&[0xc4, n as u8]);
            &bin[..2]
        }
        Ok(n) if n < 1 << 16 => {
            bin[0] = 0xc5;
            bin[1..3].copy_from_slice(&(n as u16).to_be_bytes());
            &bin[..3]
        }
        Ok(n) => {
            bin[0] = 0xc6;
            bin[1..5].copy_from_slice(&n.to_be_bytes());
            &bin[..5]
        }
        Err(_) => {
            return Err(BrokerError::PayloadTooLarge(format!(
                "a payload of {len} bytes cannot be stored"
            )));
        }
    };
    let total = head.len() + bin.len() + len;
    let mut bytes = head.chain(bin).chain(&rec.payload[..]);
    fjall::Slice::from_reader(&mut bytes, total)
        .map_err(|e| BrokerError::Storage(format!("encoding a record: {e}")))
}

/// Decodes a stored message. A payload of [`SHARE_PAYLOAD_FROM`] bytes or
/// more is not copied: it is a view into `value`, fjall's own buffer (which
/// a read from the memtable shares rather than copies), so a large message
/// is held once however many deliveries and reads hold it.
pub(super) fn decode_message(value: fjall::Slice) -> Result<MessageRecord, BrokerError> {
    #[derive(Deserialize)]
    struct Borrowed<'a> {
        published_at: u64,
        id: String,
        key: Option<String>,
        headers: Vec<(String, String)>,
        #[serde(borrow)]
        payload: &'a [u8],
    }
    let (published_at, id, key, headers, range) = {
        let record: Borrowed<'_> = rmp_serde::from_slice(&value)
            .map_err(|e| BrokerError::Storage(format!("decoding a stored record: {e}")))?;
        // The payload is a sub-slice of `value`: where it starts in it.
        let start = record.payload.as_ptr() as usize - value.as_ptr() as usize;
        let range = start..start + record.payload.len();
        (
            record.published_at,
            record.id,
            record.key,
            record.headers,
            range,
        )
    };
    let payload = if range.len() < SHARE_PAYLOAD_FROM {
        Bytes::copy_from_slice(&value[range])
    } else {
        Bytes::from_owner(value).slice(range)
    };
    Ok(MessageRecord {
        published_at,
        id,
        key,
        headers,
        payload,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_encodes_as_serde_would_and_decodes_with_its_payload_shared_when_large() {
        for len in [0, 1, 255, 256, 65_535, 65_536, 70_000] {
            let payload = Bytes::from(vec![7u8; len]);
            let key = Some("k".to_owned());
            let headers = vec![("h".to_owned(), "v".to_owned())];
            let rec = MessageRecordRef {
                published_at: 1_795_690_000_000,
                id: "id-1",
                key: &key,
                headers: &headers,
                payload: &payload,
            };
            let slice = encode_message(&rec).expect("encodes");
            assert_eq!(&*slice, &encode(&rec).expect("encodes")[..], "len {len}");
            let back = decode_message(slice.clone()).expect("decodes");
            assert_eq!(back.payload, payload);
            assert_eq!(
                (back.id.as_str(), back.key, back.headers),
                ("id-1", key, headers)
            );
            let shared = slice.as_ptr_range().contains(&back.payload.as_ptr());
            assert_eq!(shared, len >= SHARE_PAYLOAD_FROM, "len {len}");
        }
    }

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
