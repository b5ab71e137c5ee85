//! The NATS sink: publishes each message to one subject.
//!
//! **JetStream** (the default): each message is published with
//! `Nats-Msg-Id` and `sluice-id` set to the Sluice id, the key in
//! `key_header` and every header but NATS's own `Nats-*` controls, and the
//! write succeeds only once the stream's `PubAck` is back (a `PubAck` that
//! says `duplicate` is a success: the stream had it already). A batch is
//! published whole first, then its `PubAck`s are awaited together.
//! Within the stream's duplicate window a redelivered message is stored
//! once.
//!
//! **Core** (`jetstream: false`): a publish and a flush. Nobody confirms
//! it: a subject no one listens to drops it.
//!
//! Errors:
//!
//! | what | outcome |
//! |---|---|
//! | not connected, the connection lost, no `PubAck` in time | [`SinkError::Unavailable`]: held, no attempt spent |
//! | no stream captures the subject (no responders), and JetStream answers | [`SinkError::Retry`]: attempts spent, then dead-lettered with the reason |
//! | no responders, and JetStream does not answer either (starting up) | [`SinkError::Unavailable`] |
//! | the message is larger than the server's `max_payload`, a header NATS cannot carry | [`SinkError::Rejected`] |
//! | another JetStream error (a full stream with `discard: new`, ...) | [`SinkError::Retry`] |

use std::str::FromStr;
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use async_trait::async_trait;
use bytes::Bytes;

use super::config::NatsSinkConfig;
use super::{Conn, is_control};
use crate::broker::nats::MSG_ID_HEADER;
use crate::connect::{Context, Sink, SinkError};
use crate::plugin::Message;

/// How long a `PubAck` may take: a server that stops answering is an
/// outage, well under the stage's default `timeout` (30 s).
const PUBACK_TIMEOUT: Duration = Duration::from_secs(10);
/// Publishes in flight per chunk of a batch: async-nats holds a permit
/// per unacknowledged publish, so a batch is sent and awaited in chunks.
const CHUNK: usize = 256;
/// The header every write carries the Sluice id in.
pub const SLUICE_ID_HEADER: &str = "sluice-id";

/// Publishes messages to one NATS subject.
pub struct NatsSink {
    conn: Conn,
    js: Option<jetstream::Context>,
    subject: async_nats::Subject,
    key_header: String,
}

impl NatsSink {
    /// The sink of `config`, connecting in the background.
    pub(crate) async fn new(config: &NatsSinkConfig, ctx: &Context) -> Result<Self, String> {
        let conn = Conn::new(
            &config.connection,
            config.tls.files(),
            &format!("sluice {}", ctx.label()),
        )
        .await?;
        let js = config.jetstream.then(|| {
            jetstream::ContextBuilder::new()
                .timeout(PUBACK_TIMEOUT)
                .max_ack_inflight(CHUNK * 64)
                .build(conn.client.clone())
        });
        Ok(NatsSink {
            conn,
            js,
            subject: config.subject.clone().into(),
            key_header: config.key_header.clone(),
        })
    }

    /// The headers `message` is published with, or why it cannot be.
    fn headers(&self, message: &Message) -> Result<HeaderMap, SinkError> {
        let mut map = HeaderMap::new();
        let value = |text: &str, what: &str| {
            HeaderValue::from_str(text).map_err(|_| {
                SinkError::Rejected(format!(
                    "nats subject `{}`: {what} {text:?} cannot be a NATS header value (a line break)",
                    self.subject
                ))
            })
        };
        let id = value(&message.id, "the message id")?;
        if self.js.is_some() {
            map.insert(MSG_ID_HEADER, id.clone());
        }
        map.insert(SLUICE_ID_HEADER, id);
        if let Some(key) = &message.key {
            map.insert(self.key_header.as_str(), value(key, "the key")?);
        }
        for (name, text) in &message.headers {
            if is_control(name)
                || name.eq_ignore_ascii_case(SLUICE_ID_HEADER)
                || name.eq_ignore_ascii_case(&self.key_header)
            {
                continue;
            }
            let header = HeaderName::from_str(name).map_err(|_| {
                SinkError::Rejected(format!(
                    "nats subject `{}`: header {name:?} cannot be a NATS header name \
                     (printable ASCII, no `:` or space)",
                    self.subject
                ))
            })?;
            map.append(header, value(text, &format!("header `{name}`"))?);
        }
        Ok(map)
    }

    fn unavailable(&self, why: &dyn std::fmt::Display) -> SinkError {
        SinkError::Unavailable(self.conn.scrub(&format!(
            "NATS at {} (subject `{}`): {why}",
            self.conn.url, self.subject
        )))
    }

    /// A failed JetStream publish (or its `PubAck`) as a sink error.
    async fn publish_failed(&self, err: &jetstream::context::PublishError) -> SinkError {
        match err.kind() {
            PublishErrorKind::StreamNotFound => self.no_stream().await,
            PublishErrorKind::MaxPayloadExceeded => SinkError::Rejected(self.conn.scrub(&format!(
                "nats subject `{}`: the message is larger than the server's max_payload ({err})",
                self.subject
            ))),
            PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => self.unavailable(err),
            _ if !self.conn.connected() => self.unavailable(err),
            _ => SinkError::Retry {
                reason: self.conn.scrub(&format!(
                    "nats subject `{}`: JetStream refused the publish: {err}",
                    self.subject
                )),
                after: None,
            },
        }
    }

    /// No responders: no stream captures the subject, or JetStream is not
    /// serving yet. Asked of JetStream itself, which tells the two apart.
    async fn no_stream(&self) -> SinkError {
        let Some(js) = &self.js else {
            return self.unavailable(&"no responders");
        };
        match js.stream_by_subject(self.subject.to_string()).await {
            Err(e)
                if matches!(
                    e.kind(),
                    jetstream::context::GetStreamByNameErrorKind::NotFound
                ) =>
            {
                SinkError::Retry {
                    reason: format!(
                        "nats subject `{}`: no JetStream stream captures the subject; create \
                         one whose subjects include it (or set `jetstream: false`)",
                        self.subject
                    ),
                    after: None,
                }
            }
            Ok(stream) => SinkError::Retry {
                reason: format!(
                    "nats subject `{}`: stream `{stream}` did not answer the publish (its \
                     leader may be moving)",
                    self.subject
                ),
                after: None,
            },
            Err(e) => {
                self.unavailable(&format!("no responders, and JetStream did not answer: {e}"))
            }
        }
    }

    async fn write_jetstream(
        &self,
        js: &jetstream::Context,
        messages: &[Message],
    ) -> Vec<Result<(), SinkError>> {
        let mut results: Vec<Result<(), SinkError>> = Vec::with_capacity(messages.len());
        for chunk in messages.chunks(CHUNK) {
            let mut pending = Vec::with_capacity(chunk.len());
            for message in chunk {
                pending.push(match self.headers(message) {
                    Ok(headers) => match js
                        .publish_with_headers(
                            self.subject.clone(),
                            headers,
                            Bytes::from(message.payload.clone()),
                        )
                        .await
                    {
                        Ok(future) => Pending::Sent(future),
                        Err(err) => Pending::Failed(err),
                    },
                    Err(refused) => Pending::Refused(refused),
                });
            }
            // Awaited together: one by one, a chunk whose PubAcks died with
            // the connection would take a timeout per message to fail.
            let acks = futures_util::future::join_all(pending.into_iter().map(|p| async move {
                match p {
                    Pending::Sent(future) => match future.await {
                        Ok(_) => Pending::Done,
                        Err(err) => Pending::Failed(err),
                    },
                    other => other,
                }
            }))
            .await;
            for ack in acks {
                results.push(match ack {
                    Pending::Done | Pending::Sent(_) => Ok(()),
                    Pending::Refused(refused) => Err(refused),
                    Pending::Failed(err) => Err(self.publish_failed(&err).await),
                });
            }
        }
        results
    }

    async fn write_core(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        let mut results: Vec<Result<(), SinkError>> = Vec::with_capacity(messages.len());
        for message in messages {
            let result = match self.headers(message) {
                Ok(headers) => self
                    .conn
                    .client
                    .publish_with_headers(
                        self.subject.clone(),
                        headers,
                        Bytes::from(message.payload.clone()),
                    )
                    .await
                    .map_err(|e| match e.kind() {
                        async_nats::client::PublishErrorKind::MaxPayloadExceeded => {
                            SinkError::Rejected(format!(
                                "nats subject `{}`: the message is larger than the server's \
                                 max_payload ({e})",
                                self.subject
                            ))
                        }
                        _ => self.unavailable(&e),
                    }),
                Err(refused) => Err(refused),
            };
            results.push(result);
        }
        if results.iter().any(Result::is_ok) {
            let flushed = match tokio::time::timeout(PUBACK_TIMEOUT, self.conn.client.flush()).await
            {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(self.unavailable(&e)),
                Err(_) => Err(self.unavailable(&"the server did not confirm the flush in time")),
            };
            if let Err(e) = flushed {
                for result in &mut results {
                    if result.is_ok() {
                        *result = Err(e.clone());
                    }
                }
            }
        }
        results
    }
}

/// Where one message of a JetStream batch stands.
enum Pending {
    /// Published; its `PubAck` is awaited.
    Sent(jetstream::context::PublishAckFuture),
    /// Stored (or already there).
    Done,
    /// Refused before sending.
    Refused(SinkError),
    /// The publish or its `PubAck` failed.
    Failed(jetstream::context::PublishError),
}

#[async_trait]
impl Sink for NatsSink {
    async fn write(&self, message: &Message) -> Result<(), SinkError> {
        self.write_batch(std::slice::from_ref(message))
            .await
            .pop()
            .unwrap_or(Err(SinkError::Retry {
                reason: "no result".into(),
                after: None,
            }))
    }

    async fn write_batch(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        if messages.is_empty() {
            return Vec::new();
        }
        if !self.conn.ready(Duration::ZERO).await {
            let why =
                SinkError::Unavailable(self.conn.down(&format!("subject `{}`", self.subject)));
            return messages.iter().map(|_| Err(why.clone())).collect();
        }
        match &self.js {
            Some(js) => self.write_jetstream(js, messages).await,
            None => self.write_core(messages).await,
        }
    }
}
