//! The Redis sink: appends each message to a stream, effectively once.
//!
//! One Lua script per message does, atomically:
//!
//! ```text
//! SET sluice:dedup:<stream>:<message id> 1 NX PX <dedup_ttl>
//! only if it was set: XADD <stream> [MAXLEN ~ n] * payload .. id .. [key ..] <header> ..
//! ```
//!
//! so a message redelivered (a crash after the write, before the ack)
//! within `dedup_ttl` is not appended twice. An `XADD` that fails removes
//! the dedup key again, so a retry can write it. A batch is one pipeline
//! of script calls (one round trip); the script is sent by `EVALSHA` and
//! loaded (`SCRIPT LOAD`) when the server does not know it (after a
//! restart).
//!
//! Errors: the server cannot be reached -> [`SinkError::Unavailable`]; a
//! reply that will never succeed (`WRONGTYPE`: the key is not a stream)
//! -> [`SinkError::Rejected`]; any other error reply (`OOM`, `BUSY`,
//! `TRYAGAIN`) -> [`SinkError::Retry`]; `LOADING`/`MASTERDOWN` (not
//! serving yet) -> [`SinkError::Unavailable`].

use std::time::Duration;

use async_trait::async_trait;
use redis::{RedisError, Script, Value};

use super::config::RedisSinkConfig;
use super::{Conn, is_outage};
use crate::connect::{Sink, SinkError};
use crate::plugin::Message;

/// How long a reply may take (the stage's `timeout` bounds a write too).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// `KEYS[1]` the dedup key, `KEYS[2]` the stream; `ARGV[1]` the dedup TTL
/// in ms, `ARGV[2]` the `MAXLEN ~` bound (`0`: no trim), `ARGV[3..]` the
/// entry's fields and values. Returns 1 when appended, 0 when the id was
/// already written.
const SCRIPT: &str = r"
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  return 0
end
local args = {'XADD', KEYS[2]}
if ARGV[2] ~= '0' then
  args[#args + 1] = 'MAXLEN'
  args[#args + 1] = '~'
  args[#args + 1] = ARGV[2]
end
args[#args + 1] = '*'
for i = 3, #ARGV do
  args[#args + 1] = ARGV[i]
end
local added = redis.pcall(unpack(args))
if type(added) == 'table' and added.err then
  redis.call('DEL', KEYS[1])
  return added
end
return 1
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
            conn: Conn::new(&config.url, config.tls_ca.as_deref(), RESPONSE_TIMEOUT)?,
            stream: config.stream.clone(),
            maxlen: config.maxlen.unwrap_or(0),
            ttl_ms: u64::try_from(config.dedup_ttl.get().as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            script: Script::new(SCRIPT),
        })
    }

    /// The pipeline of script calls for `messages`.
    fn pipeline(&self, messages: &[Message]) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for message in messages {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(self.script.get_hash())
                .arg(2)
                .arg(dedup_key(&self.stream, &message.id))
                .arg(&self.stream)
                .arg(self.ttl_ms)
                .arg(self.maxlen);
            for (name, value) in entry_fields(message) {
                cmd.arg(name).arg(value);
            }
            pipe.add_command(cmd);
        }
        pipe
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
        Some("LOADING" | "MASTERDOWN") => SinkError::Unavailable(reason),
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
                    Ok(values) => values.into_iter().map(Ok).collect(),
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
    fn the_script_sets_the_dedup_key_before_it_appends() {
        let set = SCRIPT.find("'NX', 'PX'").expect("SET NX PX");
        let add = SCRIPT.find("'XADD'").expect("XADD");
        assert!(set < add);
        assert!(SCRIPT.contains("'MAXLEN'") && SCRIPT.contains("'~'"));
        // A failed XADD gives the dedup key back, so a retry writes.
        assert!(SCRIPT.contains("redis.call('DEL', KEYS[1])"));
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
