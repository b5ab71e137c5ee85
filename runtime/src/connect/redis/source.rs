//! The Redis source: one consumer of a consumer group.
//!
//! Each `read` does, in this order:
//!
//! 1. creates the group if it is missing (`XGROUP CREATE ... MKSTREAM`,
//!    from `$` or `0` as `start:` says; an existing group keeps its place);
//! 2. after a (re)connect or an error, re-reads this consumer's own
//!    pending entries (`XREADGROUP ... 0`): read before, never acked;
//! 3. every `claim_idle / 2`, takes over entries another consumer read and
//!    left idle for `claim_idle` (`XAUTOCLAIM`): that consumer is dead;
//!    entries deleted meanwhile are acked, they are gone;
//! 4. otherwise reads new entries (`XREADGROUP ... >`, `COUNT`, `BLOCK`).
//!
//! `ack` is one `XACK` of every id of the last read, called by the runner
//! only after the durable publish. Every error is an outage
//! ([`SourceError::Unavailable`], scrubbed): the runner backs off and
//! calls `read` again, which starts over at step 1.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use redis::Value;

use super::config::{RedisSourceConfig, StartFrom};
use super::{Conn, is_outage};
use crate::connect::{Capabilities, Source, SourceError, SourceMessage};

/// The longest a `XREADGROUP` blocks, whatever the runner asks.
const MAX_BLOCK: Duration = Duration::from_secs(5);
/// How long a reply may take beyond the block.
const RESPONSE_GRACE: Duration = Duration::from_secs(10);

/// A consumer of a Redis stream's consumer group.
pub struct RedisSource {
    conn: Conn,
    stream: String,
    group: String,
    consumer: String,
    start: StartFrom,
    claim_idle: Duration,
    payload_field: String,
    key_field: String,
    /// The group is known to exist (created or found) since the last error.
    group_ready: bool,
    /// Where the re-read of this consumer's own pending entries stands;
    /// `None` once it is done.
    own_pending: Option<String>,
    /// When `XAUTOCLAIM` last ran, and where its scan stands.
    claimed_at: Option<Instant>,
    claim_cursor: String,
    /// The ids of each read not yet acknowledged, oldest first, for `ack`.
    unacked: VecDeque<Vec<String>>,
    /// The last new entry (`>`) this source read: where a group that
    /// vanished (a server restarted without persistence, the stream
    /// deleted) is created again, so entries written since are read
    /// whatever `start` says.
    last_new: Option<String>,
}

impl RedisSource {
    /// The source of `config`, not connected.
    pub(crate) fn new(config: &RedisSourceConfig) -> Result<Self, String> {
        let conn = Conn::new(
            &config.connection,
            config.tls.files(),
            MAX_BLOCK + RESPONSE_GRACE,
        )?;
        Ok(RedisSource {
            conn,
            stream: config.stream.clone(),
            group: config.group.clone(),
            consumer: config.consumer.clone().unwrap_or_else(default_consumer),
            start: config.start,
            claim_idle: config.claim_idle.get(),
            payload_field: config.payload_field.clone(),
            key_field: config.key_field.clone(),
            group_ready: false,
            own_pending: Some("0".into()),
            claimed_at: None,
            claim_cursor: "0-0".into(),
            unacked: VecDeque::new(),
            last_new: None,
        })
    }

    /// This consumer's name in the group.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Runs `cmd`, turning an error into an outage (and forgetting what
    /// this consumer knows of the server, so the next read starts over).
    async fn query(&mut self, cmd: &redis::Cmd) -> Result<Value, SourceError> {
        let mut manager = self.conn.get().map_err(SourceError::Unavailable)?;
        match cmd.query_async::<Value>(&mut manager).await {
            Ok(value) => Ok(value),
            Err(err) => {
                self.conn.failed(&err);
                // NOGROUP: the group (or the stream) is gone; UNBLOCKED:
                // the stream was deleted while this read waited on it.
                if !is_outage(&err) && matches!(err.code(), Some("NOGROUP" | "UNBLOCKED")) {
                    self.group_ready = false;
                }
                self.reset();
                Err(SourceError::Unavailable(format!(
                    "redis stream `{}` group `{}` at {}: {}",
                    self.stream,
                    self.group,
                    self.conn.url,
                    self.conn.scrub(&err)
                )))
            }
        }
    }

    /// After an error: re-read own pending entries before new ones.
    fn reset(&mut self) {
        self.own_pending = Some("0".into());
    }

    async fn ensure_group(&mut self) -> Result<(), SourceError> {
        if self.group_ready {
            return Ok(());
        }
        let from = match (&self.last_new, self.start) {
            (Some(last), _) => last.as_str(),
            (None, StartFrom::New) => "$",
            (None, StartFrom::Oldest) => "0",
        };
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(from)
            .arg("MKSTREAM");
        let mut manager = self.conn.get().map_err(SourceError::Unavailable)?;
        match cmd.query_async::<Value>(&mut manager).await {
            Ok(_) => {
                if self.last_new.is_some() {
                    tracing::warn!(stream = %self.stream, group = %self.group, after = from, "the consumer group was gone (a restart without persistence, or the stream deleted); created it again after the last entry read");
                } else {
                    tracing::info!(stream = %self.stream, group = %self.group, start = from, "created the consumer group");
                }
            }
            Err(err) if err.code() == Some("BUSYGROUP") => {}
            Err(err) => {
                self.conn.failed(&err);
                return Err(SourceError::Unavailable(format!(
                    "redis stream `{}` at {}: cannot create group `{}`: {}",
                    self.stream,
                    self.conn.url,
                    self.group,
                    self.conn.scrub(&err)
                )));
            }
        }
        self.group_ready = true;
        Ok(())
    }

    /// `XREADGROUP` from `position` (`0`-style for own pending, `>` for
    /// new), blocking up to `block` when reading new entries.
    async fn read_group(
        &mut self,
        position: &str,
        max: usize,
        block: Option<Duration>,
    ) -> Result<Vec<Entry>, SourceError> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(max);
        if let Some(block) = block {
            let ms = u64::try_from(block.min(MAX_BLOCK).as_millis())
                .unwrap_or(1)
                .max(1);
            cmd.arg("BLOCK").arg(ms);
        }
        cmd.arg("STREAMS").arg(&self.stream).arg(position);
        let reply = self.query(&cmd).await?;
        parse_read_reply(reply).map_err(|e| self.bad_reply(&e))
    }

    /// `XAUTOCLAIM` of entries idle for `claim_idle`, one page; the ids of
    /// entries deleted meanwhile are acked here.
    async fn autoclaim(&mut self, max: usize) -> Result<Vec<Entry>, SourceError> {
        let idle = u64::try_from(self.claim_idle.as_millis()).unwrap_or(u64::MAX);
        let mut cmd = redis::cmd("XAUTOCLAIM");
        cmd.arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(idle)
            .arg(&self.claim_cursor)
            .arg("COUNT")
            .arg(max);
        let reply = self.query(&cmd).await?;
        let claim = parse_autoclaim(reply).map_err(|e| self.bad_reply(&e))?;
        self.claim_cursor = claim.cursor;
        if self.claim_cursor == "0-0" {
            self.claimed_at = Some(Instant::now());
        }
        if claim.unnamed_deleted > 0 {
            // Redis 6.2: acked when the own pending entries are re-read.
            self.reset();
        }
        if !claim.deleted.is_empty() {
            tracing::info!(stream = %self.stream, count = claim.deleted.len(), "entries a dead consumer left were deleted from the stream meanwhile; acknowledged");
            self.xack(&claim.deleted).await?;
        }
        if !claim.entries.is_empty() {
            tracing::info!(stream = %self.stream, count = claim.entries.len(), "reclaimed entries another consumer read and left unacknowledged");
        }
        Ok(claim.entries)
    }

    async fn xack(&mut self, ids: &[String]) -> Result<(), SourceError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("XACK");
        cmd.arg(&self.stream).arg(&self.group).arg(ids);
        self.query(&cmd).await.map(|_| ())
    }

    fn claim_due(&self) -> bool {
        self.claim_cursor != "0-0"
            || self
                .claimed_at
                .is_none_or(|at| at.elapsed() >= self.claim_idle / 2)
    }

    fn bad_reply(&mut self, what: &str) -> SourceError {
        self.reset();
        SourceError::Unavailable(format!(
            "redis stream `{}`: unexpected reply: {what}",
            self.stream
        ))
    }

    /// Turns entries into messages; the ids of deleted ones (a pending
    /// entry whose data is gone) are acked at once.
    async fn take_entries(
        &mut self,
        entries: Vec<Entry>,
    ) -> Result<Vec<SourceMessage>, SourceError> {
        let mut gone = Vec::new();
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            match entry.fields {
                Some(fields) => {
                    out.push(to_message(
                        entry.id,
                        fields,
                        &self.payload_field,
                        &self.key_field,
                    ));
                }
                None => gone.push(entry.id),
            }
        }
        self.xack(&gone).await?;
        if !out.is_empty() {
            self.unacked
                .push_back(out.iter().map(|m| m.upstream_id.clone()).collect());
        }
        Ok(out)
    }
}

#[async_trait]
impl Source for RedisSource {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            per_message_ack: true,
            lag: true,
            ..Capabilities::default()
        }
    }

    async fn read(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<SourceMessage>, SourceError> {
        let was_ready = self.group_ready;
        match self.read_entries(max, wait).await {
            // The group vanished under this read: create it again at once
            // (producers may be writing already) and read from it.
            Err(_) if was_ready && !self.group_ready => self.read_entries(max, wait).await,
            read => read,
        }
    }

    async fn ack(&mut self) -> Result<(), SourceError> {
        let ids = self.unacked.pop_front().unwrap_or_default();
        // On an error the entries stay pending for this consumer, and the
        // error has set it to read its pending entries again first.
        self.xack(&ids).await
    }

    async fn release(&mut self) {
        // The entries stay pending for this consumer and are read again
        // first.
        self.unacked.clear();
        self.reset();
    }

    async fn lag(&mut self) -> Option<u64> {
        // Not through `query`: a failed estimate (an ACL without XINFO)
        // must not reset the reader or its connection.
        let mut cmd = redis::cmd("XINFO");
        cmd.arg("GROUPS").arg(&self.stream);
        let mut manager = self.conn.get().ok()?;
        let reply = cmd.query_async::<Value>(&mut manager).await.ok()?;
        group_lag(&reply, &self.group)
    }
}

impl RedisSource {
    /// One read: own pending entries, then reclaimed ones, then new ones.
    async fn read_entries(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<SourceMessage>, SourceError> {
        let max = max.max(1);
        self.ensure_group().await?;
        // This consumer's own pending entries first: read before a crash
        // or an error, never acked.
        while let Some(from) = self.own_pending.clone() {
            let entries = self.read_group(&from, max, None).await?;
            match entries.last() {
                None => self.own_pending = None,
                Some(last) => {
                    self.own_pending = Some(last.id.clone());
                    let messages = self.take_entries(entries).await?;
                    if !messages.is_empty() {
                        return Ok(messages);
                    }
                }
            }
        }
        if self.claim_due() {
            let entries = self.autoclaim(max).await?;
            let messages = self.take_entries(entries).await?;
            if !messages.is_empty() {
                return Ok(messages);
            }
        }
        let block = (!wait.is_zero()).then_some(wait);
        let entries = self.read_group(">", max, block).await?;
        if let Some(last) = entries.last() {
            self.last_new = Some(last.id.clone());
        }
        self.take_entries(entries).await
    }
}

/// `<host>-<pid>`, made a plain name.
fn default_consumer() -> String {
    crate::connect::names::this_daemon()
}

/// One stream entry; `fields` is `None` for a pending entry whose data was
/// deleted from the stream.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

/// An entry as a message: the payload field is the payload, the key
/// field the key, every other field a header. An entry without the
/// payload field, or with a key or header that is not UTF-8, carries a
/// problem (the runner dead-letters it).
pub(crate) fn to_message(
    id: String,
    fields: Vec<(Vec<u8>, Vec<u8>)>,
    payload_field: &str,
    key_field: &str,
) -> SourceMessage {
    let mut message = SourceMessage::new(id, Bytes::new());
    let mut payload = None;
    let mut problems = Vec::new();
    for (name, value) in fields {
        let name = match String::from_utf8(name) {
            Ok(name) => name,
            Err(e) => {
                problems.push(format!(
                    "a field name is not UTF-8: {:?}",
                    String::from_utf8_lossy(e.as_bytes())
                ));
                continue;
            }
        };
        if payload.is_none() && name == payload_field {
            payload = Some(Bytes::from(value));
            continue;
        }
        let text = match String::from_utf8(value) {
            Ok(text) => text,
            Err(e) => {
                problems.push(format!(
                    "field `{name}` is not UTF-8: {:?}",
                    String::from_utf8_lossy(e.as_bytes())
                ));
                continue;
            }
        };
        if message.key.is_none() && name == key_field {
            message.key = Some(text);
        } else {
            message.headers.push((name, text));
        }
    }
    match payload {
        Some(payload) => message.payload = payload,
        None => problems.insert(
            0,
            format!("the stream entry has no `{payload_field}` field (the payload)"),
        ),
    }
    if !problems.is_empty() {
        message.problem = Some(problems.join("; "));
    }
    message
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

/// `[id, [f, v, ...] | nil]`.
fn parse_entry(value: Value) -> Result<Entry, String> {
    let Value::Array(mut pair) = value else {
        return Err(format!("an entry is not an array: {value:?}"));
    };
    if pair.len() != 2 {
        return Err(format!("an entry has {} parts, not 2", pair.len()));
    }
    let fields = pair.pop().unwrap_or(Value::Nil);
    let id = pair
        .pop()
        .as_ref()
        .and_then(text)
        .ok_or("an entry id is not text")?;
    let fields = match fields {
        Value::Nil => None,
        Value::Array(flat) => {
            let mut fields = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let (Some(name), Some(value)) = (it.next(), it.next()) {
                let name = bytes(name).ok_or("a field name is not a string")?;
                let value = bytes(value).ok_or("a field value is not a string")?;
                fields.push((name, value));
            }
            Some(fields)
        }
        Value::Map(pairs) => {
            let mut fields = Vec::with_capacity(pairs.len());
            for (name, value) in pairs {
                let name = bytes(name).ok_or("a field name is not a string")?;
                let value = bytes(value).ok_or("a field value is not a string")?;
                fields.push((name, value));
            }
            Some(fields)
        }
        other => return Err(format!("entry fields are not an array: {other:?}")),
    };
    Ok(Entry { id, fields })
}

fn parse_entries(value: Value) -> Result<Vec<Entry>, String> {
    match value {
        Value::Array(entries) => entries.into_iter().map(parse_entry).collect(),
        Value::Nil => Ok(Vec::new()),
        other => Err(format!("entries are not an array: {other:?}")),
    }
}

/// The reply of `XREADGROUP` for one stream: nil (nothing new within the
/// block), or `[[stream, [entry...]]]` (RESP2) / `{stream: [entry...]}`
/// (RESP3).
pub(crate) fn parse_read_reply(value: Value) -> Result<Vec<Entry>, String> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Array(streams) => {
            let mut out = Vec::new();
            for stream in streams {
                let Value::Array(mut pair) = stream else {
                    return Err("a stream in the reply is not an array".into());
                };
                if pair.len() != 2 {
                    return Err("a stream in the reply has not 2 parts".into());
                }
                out.extend(parse_entries(pair.pop().unwrap_or(Value::Nil))?);
            }
            Ok(out)
        }
        Value::Map(streams) => {
            let mut out = Vec::new();
            for (_, entries) in streams {
                out.extend(parse_entries(entries)?);
            }
            Ok(out)
        }
        other => Err(format!("XREADGROUP replied {other:?}")),
    }
}

/// What one `XAUTOCLAIM` returned.
#[derive(Debug, PartialEq)]
pub(crate) struct Claim {
    pub(crate) cursor: String,
    pub(crate) entries: Vec<Entry>,
    pub(crate) deleted: Vec<String>,
    /// Claimed entries deleted meanwhile whose ids Redis 6.2 does not say
    /// (a bare nil): they are this consumer's now, and its re-read of its
    /// own pending entries finds and acks them.
    pub(crate) unnamed_deleted: usize,
}

/// `[cursor, [entry...], [deleted id...]]` (Redis 7; 6.2 has no third).
pub(crate) fn parse_autoclaim(value: Value) -> Result<Claim, String> {
    let Value::Array(parts) = value else {
        return Err(format!("XAUTOCLAIM replied {value:?}"));
    };
    let mut parts = parts.into_iter();
    let cursor = parts
        .next()
        .as_ref()
        .and_then(text)
        .ok_or("XAUTOCLAIM's cursor is not text")?;
    let (entries, unnamed_deleted) = match parts.next().unwrap_or(Value::Nil) {
        Value::Array(items) => {
            let nils = items.iter().filter(|v| matches!(v, Value::Nil)).count();
            let entries = items
                .into_iter()
                .filter(|v| !matches!(v, Value::Nil))
                .map(parse_entry)
                .collect::<Result<Vec<_>, _>>()?;
            (entries, nils)
        }
        other => (parse_entries(other)?, 0),
    };
    let deleted = match parts.next() {
        Some(Value::Array(ids)) => ids.iter().filter_map(text).collect(),
        _ => Vec::new(),
    };
    Ok(Claim {
        cursor,
        entries,
        deleted,
        unnamed_deleted,
    })
}

/// The `lag` of `group` in an `XINFO GROUPS` reply (Redis 7; nil when the
/// server cannot tell).
pub(crate) fn group_lag(reply: &Value, group: &str) -> Option<u64> {
    let Value::Array(groups) = reply else {
        return None;
    };
    for info in groups {
        let pairs: Vec<(&Value, &Value)> = match info {
            Value::Array(flat) => flat
                .chunks(2)
                .filter_map(|c| Some((c.first()?, c.get(1)?)))
                .collect(),
            Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
            _ => continue,
        };
        let field = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| text(k).as_deref() == Some(name))
                .map(|(_, v)| *v)
        };
        if field("name").and_then(text).as_deref() != Some(group) {
            continue;
        }
        return match field("lag") {
            Some(Value::Int(n)) => u64::try_from(*n).ok(),
            _ => None,
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn fields(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn fields_become_payload_key_and_headers() {
        let m = to_message(
            "1-0".into(),
            fields(&[
                ("trace", "t1"),
                ("payload", "hello"),
                ("key", "k1"),
                ("n", "2"),
            ]),
            "payload",
            "key",
        );
        assert_eq!(m.upstream_id, "1-0");
        assert_eq!(&m.payload[..], b"hello");
        assert_eq!(m.key.as_deref(), Some("k1"));
        assert_eq!(
            m.headers,
            vec![("trace".into(), "t1".into()), ("n".into(), "2".into())]
        );
        assert_eq!(m.problem, None);
    }

    #[test]
    fn other_field_names_are_honoured() {
        let m = to_message(
            "1-0".into(),
            fields(&[("body", "x"), ("payload", "p"), ("user", "u")]),
            "body",
            "user",
        );
        assert_eq!(&m.payload[..], b"x");
        assert_eq!(m.key.as_deref(), Some("u"));
        assert_eq!(m.headers, vec![("payload".into(), "p".into())]);
    }

    #[test]
    fn a_binary_payload_is_kept_as_it_is() {
        let m = to_message(
            "1-0".into(),
            vec![(b"payload".to_vec(), vec![0, 255, 1])],
            "payload",
            "key",
        );
        assert_eq!(&m.payload[..], &[0, 255, 1]);
        assert_eq!(m.problem, None);
    }

    #[test]
    fn an_entry_without_payload_has_a_problem() {
        let m = to_message("5-1".into(), fields(&[("other", "x")]), "payload", "key");
        let problem = m.problem.expect("a problem");
        assert!(problem.contains("no `payload` field"), "{problem}");
        assert_eq!(m.headers, vec![("other".into(), "x".into())]);
    }

    #[test]
    fn a_binary_header_is_a_problem() {
        let m = to_message(
            "5-1".into(),
            vec![
                (b"payload".to_vec(), b"p".to_vec()),
                (b"h".to_vec(), vec![0xff]),
            ],
            "payload",
            "key",
        );
        assert!(m.problem.expect("problem").contains("`h` is not UTF-8"));
    }

    #[test]
    fn read_replies_parse_in_resp2_and_resp3() {
        let entry = Value::Array(vec![
            bulk("1-1"),
            Value::Array(vec![bulk("payload"), bulk("a")]),
        ]);
        let deleted = Value::Array(vec![bulk("1-2"), Value::Nil]);
        let resp2 = Value::Array(vec![Value::Array(vec![
            bulk("s"),
            Value::Array(vec![entry.clone(), deleted.clone()]),
        ])]);
        let want = vec![
            Entry {
                id: "1-1".into(),
                fields: Some(fields(&[("payload", "a")])),
            },
            Entry {
                id: "1-2".into(),
                fields: None,
            },
        ];
        assert_eq!(parse_read_reply(resp2).expect("resp2"), want);
        let resp3 = Value::Map(vec![(bulk("s"), Value::Array(vec![entry, deleted]))]);
        assert_eq!(parse_read_reply(resp3).expect("resp3"), want);
        assert_eq!(parse_read_reply(Value::Nil).expect("nil"), vec![]);
        assert!(parse_read_reply(Value::Int(3)).is_err());
    }

    #[test]
    fn autoclaim_replies_parse_with_deleted_ids() {
        let reply = Value::Array(vec![
            bulk("7-0"),
            Value::Array(vec![Value::Array(vec![
                bulk("3-0"),
                Value::Array(vec![bulk("payload"), bulk("z")]),
            ])]),
            Value::Array(vec![bulk("2-0")]),
        ]);
        let claim = parse_autoclaim(reply).expect("parses");
        assert_eq!(claim.cursor, "7-0");
        assert_eq!(claim.entries.len(), 1);
        assert_eq!(claim.deleted, vec!["2-0".to_string()]);
        assert_eq!(claim.unnamed_deleted, 0);
        // Redis 6.2: a deleted entry is a bare nil, and there is no third part.
        let reply = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![
                Value::Nil,
                Value::Array(vec![
                    bulk("4-0"),
                    Value::Array(vec![bulk("payload"), bulk("y")]),
                ]),
            ]),
        ]);
        let claim = parse_autoclaim(reply).expect("parses");
        assert_eq!(claim.entries.len(), 1);
        assert_eq!(claim.unnamed_deleted, 1);
        assert!(claim.deleted.is_empty());
    }

    #[test]
    fn lag_is_read_from_xinfo_groups() {
        let group = |name: &str, lag: Value| {
            Value::Array(vec![
                bulk("name"),
                bulk(name),
                bulk("pending"),
                Value::Int(3),
                bulk("lag"),
                lag,
            ])
        };
        let reply = Value::Array(vec![
            group("other", Value::Int(9)),
            group("g", Value::Int(42)),
        ]);
        assert_eq!(group_lag(&reply, "g"), Some(42));
        assert_eq!(group_lag(&reply, "missing"), None);
        let unknown = Value::Array(vec![group("g", Value::Nil)]);
        assert_eq!(group_lag(&unknown, "g"), None);
    }

    #[test]
    fn the_default_consumer_is_a_plain_name() {
        let name = default_consumer();
        assert!(
            crate::connect::names::check_plain_name(&name).is_ok(),
            "{name}"
        );
        assert!(name.ends_with(&format!("-{}", std::process::id())));
    }
}
