//! The Redis sink: appends each message to a stream, effectively once.
//!
//! A Lua script does, for each message, atomically:
//!
//! ```text
//! SET sluice:dedup:<stream>:<message id> 1 NX PX <dedup_ttl>
//! only if it was set: XADD <stream> [MAXLEN ~ n] * payload .. id .. [key ..] <header> ..
//! ```
//!
//! so a message redelivered (a crash after the write, before the ack)
//! within `dedup_ttl` is not appended twice. An `XADD` that fails removes
//! the dedup key again, so a retry can write it. One script call takes up
//! to [`PER_CALL`] messages and answers for each (a call per message cost
//! the server more in call overhead than in the writes); a batch is one
//! pipeline of such calls (one round trip). The script is sent by
//! `EVALSHA` and loaded (`SCRIPT LOAD`) when the server does not know it
//! (after a restart).
//!
//! Errors: the server cannot be reached -> [`SinkError::Unavailable`]; a
//! reply that will never succeed (`WRONGTYPE`: the key is not a stream)
//! -> [`SinkError::Rejected`]; any other error reply (`OOM`, `BUSY`,
//! `TRYAGAIN`) -> [`SinkError::Retry`]; `LOADING`/`MASTERDOWN` (not
//! serving yet) and `READONLY` (a replica, after a failover moved the
//! primary) -> [`SinkError::Unavailable`], on a fresh connection. A
//! message with a header named `payload`, `id` or `key` is rejected: the
//! entry would carry that field twice.

use std::time::Duration;

use async_trait::async_trait;
use redis::{RedisError, Script, Value};

use super::config::RedisSinkConfig;
use super::{Conn, is_outage};
use crate::connect::{Sink, SinkError};
use crate::plugin::Message;

/// How long a reply may take: a server that stops answering (stopped,
/// a half-open connection) is an outage, which holds the messages without
/// spending attempts. Well under the stage's default `timeout` (30 s),
/// which would otherwise fire first and count a hung server against each
/// message.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// The fields every entry has; a message header may not take their names
/// (a reader that maps fields to a map would see the header instead).
pub const RESERVED_FIELDS: [&str; 3] = ["payload", "id", "key"];

/// Most messages one script call takes: a call runs atomically, so this
/// bounds how long it holds the server.
const PER_CALL: usize = 128;

/// `KEYS[1]` the stream, `KEYS[2..]` one dedup key per message; `ARGV[1]`
/// the dedup TTL in ms, `ARGV[2]` the `MAXLEN ~` bound (`0`: no trim),
/// then per message the number of field and value arguments and those.
/// Returns, per message, 1 when appended, 0 when its id was already
/// written, or the error reply of its `SET` or `XADD`.
const SCRIPT: &str = r"
local out = {}
local a = 3
for m = 2, #KEYS do
  local n = tonumber(ARGV[a])
  local set = redis.pcall('SET', KEYS[m], '1', 'NX', 'PX', ARGV[1])
  if type(set) == 'table' and set.err then
    out[#out + 1] = set
  elseif not set then
    out[#out + 1] = 0
  else
    local args = {'XADD', KEYS[1]}
    if ARGV[2] ~= '0' then
      args[#args + 1] = 'MAXLEN'
      args[#args + 1] = '~'
      args[#args + 1] = ARGV[2]
    end
    args[#args + 1] = '*'
    for i = a + 1, a + n do
      args[#args + 1] = ARGV[i]
    end
    local added = redis.pcall(unpack(args))
    if type(added) == 'table' and added.err then
      redis.call('DEL', KEYS[m])
      out[#out + 1] = added
    else
      out[#out + 1] = 1
    end
  end
  a = a + 1 + n
end
return out
";

/// Appends messages to one stream.
pub struct RedisSink {
    conn: Conn,
    stream: String,
    maxlen: u64,
    ttl_ms: u64,
    script: Script,
}

impl RedisSink {
    /// The sink of `config`, not connected.
    pub(crate) fn new(config: &RedisSinkConfig) -> Result<Self, String> {
        Ok(RedisSink {
            conn: Conn::new(&config.connection, config.tls.files(), RESPONSE_TIMEOUT)?,
            stream: config.stream.clone(),
            maxlen: config.maxlen.unwrap_or(0),
            ttl_ms: u64::try_from(config.dedup_ttl.get().as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            script: Script::new(SCRIPT),
        })
    }

    /// The pipeline of script calls for `messages`, [`PER_CALL`] each.
    fn pipeline(&self, messages: &[Message]) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for chunk in messages.chunks(PER_CALL) {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.script.get_hash())
                .arg(1 + chunk.len())
                .arg(&self.stream);
            for message in chunk {
                cmd.arg(dedup_key(&self.stream, &message.id));
            }
            cmd.arg(self.ttl_ms).arg(self.maxlen);
            for message in chunk {
                let fields = entry_fields(message);
                cmd.arg(fields.len() * 2);
                for (name, value) in fields {
                    cmd.arg(name).arg(value);
                }
            }
            pipe.add_command(cmd);
        }
        pipe
    }

    /// A message with a header named like an entry's own field, refused.
    fn clash(&self, message: &Message) -> Option<SinkError> {
        let (name, _) = message
            .headers
            .iter()
            .find(|(name, _)| RESERVED_FIELDS.contains(&name.as_str()))?;
        Some(SinkError::Rejected(format!(
            "redis stream `{}`: header `{name}` would repeat the entry's own `{name}` field \
             (every entry has `payload`, `id` and `key`); rename the header",
            self.stream
        )))
    }

    fn unavailable(&self, err: &RedisError) -> SinkError {
        self.conn.failed(err);
        SinkError::Unavailable(format!(
            "redis stream `{}` at {}: {}",
            self.stream,
            self.conn.url,
            self.conn.scrub(err)
        ))
    }

    /// What one reply (or error) means for its message.
    fn outcome(&self, result: Result<Value, RedisError>) -> Result<(), SinkError> {
        match result {
            Ok(Value::ServerError(err)) => self.outcome(Err(err.into())),
            Ok(_) => Ok(()),
            Err(err) if is_outage(&err) => Err(self.unavailable(&err)),
            Err(err) => Err(classify_reply(
                &self.stream,
                &self.conn.scrub(&err),
                err.code(),
            )),
        }
    }
}

/// The error reply of a write as a sink error: `WRONGTYPE` (the key
/// holds something that is not a stream) never succeeds; `LOADING` and
/// `MASTERDOWN` (a server starting up, a replica without its primary) are
/// the server not serving yet, an outage that spends no attempts; any
/// other reply may succeed later, and is retried (then dead-lettered once
/// retries run out).
fn classify_reply(stream: &str, text: &str, code: Option<&str>) -> SinkError {
    let reason = format!("redis stream `{stream}`: {text}");
    match code {
        Some("WRONGTYPE") => SinkError::Rejected(reason),
        Some("LOADING" | "MASTERDOWN" | "READONLY") => SinkError::Unavailable(reason),
        _ => SinkError::Retry {
            reason,
            after: None,
        },
    }
}

/// `sluice:dedup:<stream>:<message id>`: the key that remembers a written
/// message for `dedup_ttl`.
pub fn dedup_key(stream: &str, id: &str) -> String {
    format!("sluice:dedup:{stream}:{id}")
}

/// The stream entry of a message: `payload`, `id`, `key` (if any), then
/// each header as a field, in order.
pub(crate) fn entry_fields(message: &Message) -> Vec<(&str, &[u8])> {
    let mut fields: Vec<(&str, &[u8])> = Vec::with_capacity(3 + message.headers.len());
    fields.push(("payload", &message.payload));
    fields.push(("id", message.id.as_bytes()));
    if let Some(key) = &message.key {
        fields.push(("key", key.as_bytes()));
    }
    for (name, value) in &message.headers {
        fields.push((name, value.as_bytes()));
    }
    fields
}

/// The replies of the script calls (one per [`PER_CALL`] messages) as one
/// reply per message: a call's array is split; a call that failed as a
/// whole (`NOSCRIPT`, `BUSY`) answers for each of its messages.
fn per_message(calls: Vec<Value>, messages: usize) -> Vec<Result<Value, RedisError>> {
    let mut out = Vec::with_capacity(messages);
    for (i, call) in calls.into_iter().enumerate() {
        let in_call = PER_CALL.min(messages.saturating_sub(i * PER_CALL));
        match call {
            Value::Array(items) => out.extend(items.into_iter().map(Ok)),
            other => out.extend(std::iter::repeat_n(other, in_call).map(Ok)),
        }
    }
    out
}

fn is_noscript(result: &Result<Value, RedisError>) -> bool {
    match result {
        Ok(Value::ServerError(err)) => err.code() == "NOSCRIPT",
        Ok(_) => false,
        Err(err) => err.code() == Some("NOSCRIPT"),
    }
}

#[async_trait]
impl Sink for RedisSink {
    async fn write(&self, message: &Message) -> Result<(), SinkError> {
        self.write_batch(std::slice::from_ref(message))
            .await
            .pop()
            .unwrap_or(Err(SinkError::Retry {
                reason: "no reply".into(),
                after: None,
            }))
    }

    async fn write_batch(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        if messages.is_empty() {
            return Vec::new();
        }
        if messages.iter().any(|m| self.clash(m).is_some()) {
            // Rare: write the rest, and reject those in place.
            let good: Vec<Message> = messages
                .iter()
                .filter(|m| self.clash(m).is_none())
                .cloned()
                .collect();
            let mut written = self.write_batch(&good).await.into_iter();
            return messages
                .iter()
                .map(|m| match self.clash(m) {
                    Some(refused) => Err(refused),
                    None => written.next().unwrap_or(Err(SinkError::Retry {
                        reason: "no reply".into(),
                        after: None,
                    })),
                })
                .collect();
        }
        let mut manager = match self.conn.get() {
            Ok(manager) => manager,
            Err(why) => {
                return messages
                    .iter()
                    .map(|_| Err(SinkError::Unavailable(why.clone())))
                    .collect();
            }
        };
        let pipe = self.pipeline(messages);
        // Each call is idempotent (its dedup key), so the whole pipeline
        // is sent again once the script is loaded.
        for attempt in 0..2 {
            let replies: Vec<Result<Value, RedisError>> =
                match pipe.query_async::<Vec<Value>>(&mut manager).await {
                    Ok(calls) => per_message(calls, messages.len()),
                    Err(err) if is_outage(&err) => {
                        let e = self.unavailable(&err);
                        return messages.iter().map(|_| Err(e.clone())).collect();
                    }
                    Err(err) => messages.iter().map(|_| Err(err.clone())).collect(),
                };
            if attempt == 0 && replies.iter().any(is_noscript) {
                if let Err(err) = self.script.prepare_invoke().load_async(&mut manager).await {
                    return messages
                        .iter()
                        .map(|_| self.outcome(Err(err.clone())))
                        .collect();
                }
                continue;
            }
            let mut results: Vec<Result<(), SinkError>> =
                replies.into_iter().map(|r| self.outcome(r)).collect();
            results.resize_with(messages.len(), || {
                Err(SinkError::Retry {
                    reason: "the pipeline returned too few replies".into(),
                    after: None,
                })
            });
            return results;
        }
        messages
            .iter()
            .map(|_| {
                Err(SinkError::Retry {
                    reason: format!(
                        "redis stream `{}`: the write script could not be loaded",
                        self.stream
                    ),
                    after: None,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message() -> Message {
        Message {
            id: "p.s:42".into(),
            topic: "t".into(),
            key: Some("k".into()),
            headers: vec![("h1".into(), "v1".into()), ("h2".into(), "v2".into())],
            payload: b"body".to_vec(),
            attempt: 1,
            published_at: 0,
        }
    }

    #[test]
    fn an_entry_has_payload_id_key_and_headers() {
        let m = message();
        let fields: Vec<(&str, &[u8])> = entry_fields(&m);
        assert_eq!(
            fields,
            vec![
                ("payload", &b"body"[..]),
                ("id", b"p.s:42"),
                ("key", b"k"),
                ("h1", b"v1"),
                ("h2", b"v2"),
            ]
        );
        let mut no_key = message();
        no_key.key = None;
        no_key.headers.clear();
        assert_eq!(entry_fields(&no_key).len(), 2);
    }

    #[test]
    fn the_dedup_key_names_stream_and_id() {
        assert_eq!(dedup_key("out", "src:1-0"), "sluice:dedup:out:src:1-0");
    }

    #[test]
    fn call_replies_split_into_one_per_message() {
        let calls = vec![
            Value::Array(vec![Value::Int(1); PER_CALL]),
            Value::Array(vec![Value::Int(0), Value::Int(1)]),
        ];
        let replies = per_message(calls, PER_CALL + 2);
        assert_eq!(replies.len(), PER_CALL + 2);
        assert!(matches!(replies[PER_CALL], Ok(Value::Int(0))));
        // A call refused whole answers for each of its messages.
        let replies = per_message(vec![Value::Int(7), Value::Nil], PER_CALL + 2);
        assert_eq!(replies.len(), PER_CALL + 2);
        assert!(matches!(replies[PER_CALL - 1], Ok(Value::Int(7))));
        assert!(matches!(replies[PER_CALL + 1], Ok(Value::Nil)));
    }

    #[test]
    fn the_script_sets_the_dedup_key_before_it_appends() {
        let set = SCRIPT.find("'NX', 'PX'").expect("SET NX PX");
        let add = SCRIPT.find("'XADD'").expect("XADD");
        assert!(set < add);
        assert!(SCRIPT.contains("'MAXLEN'") && SCRIPT.contains("'~'"));
        // A failed XADD gives the dedup key back, so a retry writes.
        assert!(SCRIPT.contains("redis.call('DEL', KEYS[m])"));
    }

    #[test]
    fn error_replies_map_onto_outcomes() {
        assert!(matches!(
            classify_reply("s", "WRONGTYPE Operation against a key", Some("WRONGTYPE")),
            SinkError::Rejected(_)
        ));
        for code in ["LOADING", "MASTERDOWN"] {
            assert!(
                matches!(
                    classify_reply("s", code, Some(code)),
                    SinkError::Unavailable(_)
                ),
                "{code}"
            );
        }
        for code in ["OOM", "BUSY", "TRYAGAIN"] {
            assert!(
                matches!(
                    classify_reply("s", code, Some(code)),
                    SinkError::Retry { .. }
                ),
                "{code}"
            );
        }
    }
}
