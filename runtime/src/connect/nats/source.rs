//! The NATS source: a durable JetStream pull consumer, or a core
//! subscription.
//!
//! **With `stream`**, each `read`:
//!
//! 1. finds the stream and the durable consumer (`durable`, filtered on
//!    `subject`, explicit acks, `ack_wait`), creating the consumer if it is
//!    missing (from `deliver`) and putting back an `ack_wait` or filter that
//!    drifted; an existing consumer keeps its place;
//! 2. sends a pull request on a standing inbox: what is ready at once
//!    (`no_wait`, up to the room the runner gives), else one message,
//!    waiting up to the runner's wait. Every pull request is bounded in
//!    time here too: a request lost with a connection is given up, never
//!    waited on forever.
//!
//! Ids are the stream sequence, so a message delivered again (a crash
//! before the ack, an `ack_wait` that ran out) collapses in the topic's
//! duplicate window. `ack` publishes `+ACK` to each message's reply
//! subject of the oldest open read, then flushes: called by the runner
//! only after the durable publish. A lost ack is not a loss: the server
//! delivers the message again after `ack_wait` and its id collapses.
//! `release` (shutdown before a publish was durable) naks what is open, so
//! it comes back at once.
//!
//! **Without `stream`**, a core subscription (with `queue`, a queue
//! group): at most once. Each message gets a new UUIDv7 id; nothing is
//! acknowledged; what is published while the daemon is down or
//! reconnecting is lost, and so is what the client's buffer drops while
//! the topic is at its high-water mark.
//!
//! Every error is an outage ([`SourceError::Unavailable`], scrubbed): the
//! runner backs off and reads again, which starts over at step 1.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, FromConsumer, PullConsumer, pull};
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::{HeaderMap, StatusCode, Subject};
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{FutureExt as _, StreamExt as _};

use super::config::{Deliver, NatsSourceConfig, default_durable};
use super::{Conn, is_control};
use crate::connect::{Capabilities, Context, Source, SourceError, SourceMessage};

/// Reads open at once: acks are per message, so reads need not wait for
/// each other's publish.
const READS_IN_FLIGHT: usize = 4;
/// How long past its own expiry a pull request may go unanswered before
/// it counts as lost with the connection.
const PULL_GRACE: Duration = Duration::from_secs(5);
/// The longest a flush of acks may take.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a pull request waits for a first message.
const MAX_WAIT: Duration = Duration::from_secs(5);
/// JetStream's own default `max_ack_pending`.
const DEFAULT_MAX_ACK_PENDING: usize = 1000;

/// A NATS source: JetStream or core.
pub struct NatsSource {
    conn: Conn,
    key_header: String,
    mode: Mode,
}

enum Mode {
    JetStream(Box<Consumer>),
    Core(Core),
}

/// A durable pull consumer of one stream.
struct Consumer {
    js: jetstream::Context,
    stream: String,
    durable: String,
    subject: String,
    deliver: Deliver,
    ack_wait: Duration,
    /// The most messages one read takes.
    batch: usize,
    /// Found or created since the last error.
    consumer: Option<PullConsumer>,
    /// The standing inbox pull requests are answered on.
    inbox: Option<(async_nats::Subscriber, Subject)>,
    /// The reply subjects of each open read, oldest first.
    unacked: VecDeque<Vec<Subject>>,
}

/// A core subscription.
struct Core {
    subject: String,
    queue: Option<String>,
    subscriber: Option<async_nats::Subscriber>,
}

impl NatsSource {
    /// The source of `config`, connecting in the background.
    pub(crate) async fn new(config: &NatsSourceConfig, ctx: &Context) -> Result<Self, String> {
        let conn = Conn::new(
            &config.connection,
            config.tls.files(),
            &format!("sluice {}", ctx.label()),
        )
        .await?;
        let mode = match &config.stream {
            Some(stream) => Mode::JetStream(Box::new(Consumer {
                js: jetstream::ContextBuilder::new()
                    .timeout(Duration::from_secs(10))
                    .build(conn.client.clone()),
                stream: stream.clone(),
                durable: config
                    .durable
                    .clone()
                    .unwrap_or_else(|| default_durable(&ctx.pipeline, &ctx.name)),
                subject: config.subject.clone(),
                deliver: config.deliver,
                ack_wait: config.ack_wait.get(),
                batch: usize::try_from(config.batch.get()).unwrap_or(usize::MAX),
                consumer: None,
                inbox: None,
                unacked: VecDeque::new(),
            })),
            None => Mode::Core(Core {
                subject: config.subject.clone(),
                queue: config.queue.clone(),
                subscriber: None,
            }),
        };
        Ok(NatsSource {
            conn,
            key_header: config.key_header.clone(),
            mode,
        })
    }

    /// A NATS message as a source message with `id`.
    fn to_message(&self, id: String, headers: Option<&HeaderMap>, payload: Bytes) -> SourceMessage {
        let mut message = SourceMessage::new(id, payload);
        if let Some(map) = headers {
            for (name, values) in map.iter() {
                let name: &str = name.as_ref();
                for value in values {
                    let value = value.as_str();
                    if message.key.is_none() && name.eq_ignore_ascii_case(&self.key_header) {
                        message.key = Some(value.to_owned());
                    } else if !is_control(name) {
                        message.headers.push((name.to_owned(), value.to_owned()));
                    }
                }
            }
            // HeaderMap is a hash map: a stable order.
            message.headers.sort();
        }
        message
    }

    fn unavailable(&self, what: &str, err: &dyn std::fmt::Display) -> SourceError {
        SourceError::Unavailable(
            self.conn
                .scrub(&format!("NATS at {} ({what}): {err}", self.conn.url)),
        )
    }
}

#[async_trait]
impl Source for NatsSource {
    fn capabilities(&self) -> Capabilities {
        match &self.mode {
            Mode::JetStream(_) => Capabilities {
                per_message_ack: true,
                lag: true,
                ..Capabilities::default()
            },
            Mode::Core(_) => Capabilities::default(),
        }
    }

    fn reads_in_flight(&self) -> usize {
        READS_IN_FLIGHT
    }

    async fn read(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<SourceMessage>, SourceError> {
        let max = max.max(1);
        // Wait a little for a reconnect rather than spin.
        if !self.conn.ready(wait.min(Duration::from_millis(200))).await {
            let what = match &self.mode {
                Mode::JetStream(c) => format!("stream `{}`", c.stream),
                Mode::Core(c) => format!("subject `{}`", c.subject),
            };
            return Err(SourceError::Unavailable(self.conn.down(&what)));
        }
        match &mut self.mode {
            Mode::JetStream(_) => self.read_jetstream(max, wait).await,
            Mode::Core(_) => self.read_core(max, wait).await,
        }
    }

    async fn ack(&mut self) -> Result<(), SourceError> {
        let Mode::JetStream(consumer) = &mut self.mode else {
            return Ok(());
        };
        let replies = consumer.unacked.pop_front().unwrap_or_default();
        if replies.is_empty() {
            return Ok(());
        }
        let result = reply_all(&self.conn.client, replies, b"+ACK").await;
        result.map_err(|e| self.unavailable("acknowledging", &e))
    }

    async fn release(&mut self) {
        let Mode::JetStream(consumer) = &mut self.mode else {
            return;
        };
        let open: Vec<Subject> = consumer.unacked.drain(..).flatten().collect();
        // Best effort: a nak brings them back at once; without it they
        // come back after `ack_wait`. Not while disconnected: the flush
        // would hold the shutdown for its whole timeout.
        if open.is_empty() || !self.conn.connected() {
            return;
        }
        let _ = reply_all(&self.conn.client, open, b"-NAK").await;
    }

    async fn lag(&mut self) -> Option<u64> {
        let Mode::JetStream(consumer) = &mut self.mode else {
            return None;
        };
        let info = consumer.consumer.as_ref()?.get_info().await.ok()?;
        Some(info.num_pending)
    }
}

/// Publishes `kind` (`+ACK`, `-NAK`) to each reply subject, then flushes.
async fn reply_all(
    client: &async_nats::Client,
    replies: Vec<Subject>,
    kind: &'static [u8],
) -> Result<(), String> {
    for reply in replies {
        client
            .publish(reply, Bytes::from_static(kind))
            .await
            .map_err(|e| e.to_string())?;
    }
    match tokio::time::timeout(FLUSH_TIMEOUT, client.flush()).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "the server did not confirm the acks within {FLUSH_TIMEOUT:?}"
        )),
    }
}

impl NatsSource {
    async fn read_core(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<SourceMessage>, SourceError> {
        let Mode::Core(core) = &mut self.mode else {
            return Ok(Vec::new());
        };
        if core.subscriber.is_none() {
            let subscribed = match &core.queue {
                Some(queue) => {
                    self.conn
                        .client
                        .queue_subscribe(core.subject.clone(), queue.clone())
                        .await
                }
                None => self.conn.client.subscribe(core.subject.clone()).await,
            };
            let subject = core.subject.clone();
            match subscribed {
                Ok(subscriber) => core.subscriber = Some(subscriber),
                Err(e) => {
                    return Err(self.unavailable(&format!("subscribing to `{subject}`"), &e));
                }
            }
        }
        let Some(subscriber) = core.subscriber.as_mut() else {
            return Ok(Vec::new());
        };
        let mut got = Vec::new();
        let first = if wait.is_zero() {
            subscriber.next().now_or_never()
        } else {
            tokio::time::timeout(wait.min(MAX_WAIT), subscriber.next())
                .await
                .ok()
        };
        match first {
            None => return Ok(Vec::new()),
            Some(None) => {
                core.subscriber = None;
                return Err(SourceError::Unavailable(
                    self.conn.down("the subscription was closed"),
                ));
            }
            Some(Some(message)) => got.push(message),
        }
        while got.len() < max {
            match subscriber.next().now_or_never() {
                Some(Some(message)) => got.push(message),
                _ => break,
            }
        }
        Ok(got
            .into_iter()
            .map(|m| {
                let id = uuid::Uuid::now_v7().to_string();
                self.to_message(id, m.headers.as_ref(), m.payload)
            })
            .collect())
    }

    async fn read_jetstream(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<SourceMessage>, SourceError> {
        let result = self.pull(max, wait).await;
        let Mode::JetStream(consumer) = &mut self.mode else {
            return Ok(Vec::new());
        };
        let messages = match result {
            Ok(messages) => messages,
            Err(err) => {
                // Start over: look the stream and consumer up again.
                consumer.consumer = None;
                return Err(err);
            }
        };
        let mut out = Vec::with_capacity(messages.len());
        let mut replies = Vec::with_capacity(messages.len());
        for message in messages {
            let Some(reply) = message.reply.clone() else {
                continue;
            };
            let seq = match parse_stream_sequence(&reply) {
                Some(seq) => seq,
                None => {
                    tracing::warn!(reply = %reply, "a JetStream delivery with a reply subject that names no stream sequence; skipped");
                    continue;
                }
            };
            replies.push(reply);
            out.push((seq, message));
        }
        if !replies.is_empty() {
            consumer.unacked.push_back(replies);
        }
        Ok(out
            .into_iter()
            .map(|(seq, m)| self.to_message(seq.to_string(), m.headers.as_ref(), m.payload))
            .collect())
    }

    /// Finds (or creates) the consumer and pulls what a read takes.
    async fn pull(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<async_nats::Message>, SourceError> {
        let Mode::JetStream(consumer) = &mut self.mode else {
            return Ok(Vec::new());
        };
        if consumer.consumer.is_none() {
            let found = ensure_consumer(consumer).await.map_err(|e| {
                SourceError::Unavailable(
                    self.conn.scrub(&format!("NATS at {}: {e}", self.conn.url)),
                )
            })?;
            consumer.consumer = Some(found);
        }
        if consumer.inbox.is_none() {
            let inbox = Subject::from(self.conn.client.new_inbox());
            let subscriber = self
                .conn
                .client
                .subscribe(inbox.clone())
                .await
                .map_err(|e| {
                    SourceError::Unavailable(self.conn.scrub(&format!(
                        "NATS at {}: cannot subscribe the pull inbox: {e}",
                        self.conn.url
                    )))
                })?;
            consumer.inbox = Some((subscriber, inbox));
        }
        let next: Subject = format!(
            "$JS.API.CONSUMER.MSG.NEXT.{}.{}",
            consumer.stream, consumer.durable
        )
        .into();
        let client = self.conn.client.clone();
        let Some((subscriber, inbox)) = consumer.inbox.as_mut() else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let ready = pull_once(
            &client,
            &next,
            subscriber,
            inbox,
            Pull::Ready(max),
            &mut out,
        )
        .await;
        if !out.is_empty() {
            return Ok(out);
        }
        let ended = match ready {
            Ok(ended) => ended,
            Err(e) => return Err(self.pull_failed(&e)),
        };
        if ended == Ended::Busy {
            // Asking again at once would be refused again (a crashed
            // reader's messages count against max_ack_pending until their
            // ack_wait ends): pause as a read that found nothing would.
            tokio::time::sleep(wait.min(Duration::from_millis(100))).await;
            return Ok(out);
        }
        if wait.is_zero() || matches!(ended, Ended::Gone(_)) {
            return self.after_pull(ended, out);
        }
        let Mode::JetStream(consumer) = &mut self.mode else {
            return Ok(Vec::new());
        };
        let Some((subscriber, inbox)) = consumer.inbox.as_mut() else {
            return Ok(Vec::new());
        };
        let first = pull_once(
            &client,
            &next,
            subscriber,
            inbox,
            Pull::First(wait.min(MAX_WAIT)),
            &mut out,
        )
        .await;
        if !out.is_empty() {
            return Ok(out);
        }
        match first {
            Ok(Ended::Busy) => {
                tokio::time::sleep(wait.min(Duration::from_millis(100))).await;
                Ok(out)
            }
            Ok(ended) => self.after_pull(ended, out),
            Err(e) => Err(self.pull_failed(&e)),
        }
    }

    fn after_pull(
        &self,
        ended: Ended,
        out: Vec<async_nats::Message>,
    ) -> Result<Vec<async_nats::Message>, SourceError> {
        match ended {
            Ended::Gone(why) => Err(self.pull_failed(&why)),
            Ended::Busy | Ended::Done => Ok(out),
        }
    }

    fn pull_failed(&self, why: &str) -> SourceError {
        let what = match &self.mode {
            Mode::JetStream(c) => format!("stream `{}` consumer `{}`", c.stream, c.durable),
            Mode::Core(c) => format!("subject `{}`", c.subject),
        };
        self.unavailable(&what, &why)
    }
}

/// What one pull request asks for.
enum Pull {
    /// Up to this many, answered at once.
    Ready(usize),
    /// One message, waiting up to this long for it.
    First(Duration),
}

/// How a pull request ended without an error.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// It got what it asked for, or the server said there is nothing
    /// (404, 408).
    Done,
    /// The server refused it for now (409: too many messages unacked, too
    /// many pull requests waiting).
    Busy,
    /// The server said the consumer cannot serve it (409 consumer deleted,
    /// 503 no responders: the consumer or JetStream is not there).
    Gone(String),
}

/// Sends one pull request on `inbox` and reads its answer into `out`,
/// until the batch is complete, a status ends it, or its time is up. A
/// message left over from an earlier request given up on may arrive
/// here: it is a valid delivery either way.
async fn pull_once(
    client: &async_nats::Client,
    next: &Subject,
    subscriber: &mut async_nats::Subscriber,
    inbox: &Subject,
    pull: Pull,
    out: &mut Vec<async_nats::Message>,
) -> Result<Ended, String> {
    let (batch, body, limit) = match pull {
        Pull::Ready(batch) => (
            batch,
            format!(r#"{{"batch":{batch},"no_wait":true}}"#),
            PULL_GRACE,
        ),
        Pull::First(wait) => (
            1,
            format!(
                r#"{{"batch":1,"expires":{}}}"#,
                u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX)
            ),
            wait + PULL_GRACE,
        ),
    };
    client
        .publish_with_reply(next.clone(), inbox.clone(), body.into())
        .await
        .map_err(|e| e.to_string())?;
    let give_up = tokio::time::Instant::now() + limit;
    let mut received = 0;
    while received < batch {
        let message = match tokio::time::timeout_at(give_up, subscriber.next()).await {
            Ok(Some(message)) => message,
            Ok(None) => return Err("the pull inbox subscription closed".into()),
            Err(_) if received > 0 => return Ok(Ended::Done),
            Err(_) => {
                return Err(format!(
                    "a pull request got no answer within {limit:?}; the connection was probably lost"
                ));
            }
        };
        match message.status {
            None | Some(StatusCode::OK) => {}
            Some(StatusCode::IDLE_HEARTBEAT) => continue,
            Some(StatusCode::NOT_FOUND | StatusCode::TIMEOUT) => return Ok(Ended::Done),
            Some(StatusCode::NO_RESPONDERS) => {
                return Ok(Ended::Gone(
                    "no responders: the stream or its consumer is missing, or JetStream is not \
                     ready"
                        .into(),
                ));
            }
            Some(status) => {
                let description = message.description.unwrap_or_default();
                let lower = description.to_ascii_lowercase();
                if lower.contains("deleted") || lower.contains("leadership") {
                    return Ok(Ended::Gone(format!("{status} {description}")));
                }
                tracing::debug!(%status, %description, "pull request refused");
                return Ok(Ended::Busy);
            }
        }
        received += 1;
        out.push(message);
    }
    Ok(Ended::Done)
}

/// The stream sequence in a JetStream reply subject:
/// `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`
/// or, with a domain and account hash, `$JS.ACK.<domain>.<hash>.<stream>
/// .<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>.<token>`.
fn parse_stream_sequence(reply: &str) -> Option<u64> {
    let tokens: Vec<&str> = reply.split('.').collect();
    if tokens.first() != Some(&"$JS") || tokens.get(1) != Some(&"ACK") {
        return None;
    }
    let sseq = match tokens.len() {
        9 => tokens.get(5),
        n if n >= 12 => tokens.get(7),
        _ => None,
    }?;
    sseq.parse().ok()
}

/// The durable consumer, found or created; an `ack_wait` or filter that
/// drifted is put back.
async fn ensure_consumer(c: &Consumer) -> Result<PullConsumer, String> {
    let stream = c.js.get_stream(&c.stream).await.map_err(|e| {
        format!(
            "cannot find stream `{}`: {e} (is it created, and is JetStream enabled?)",
            c.stream
        )
    })?;
    let want = pull::Config {
        durable_name: Some(c.durable.clone()),
        description: Some("sluice source".into()),
        deliver_policy: match c.deliver {
            Deliver::All => DeliverPolicy::All,
            Deliver::New => DeliverPolicy::New,
        },
        ack_policy: AckPolicy::Explicit,
        ack_wait: c.ack_wait,
        filter_subject: c.subject.clone(),
        // Room for every read the runner may have open, so a full batch
        // is never held back by the server's default of 1,000.
        max_ack_pending: i64::try_from(
            READS_IN_FLIGHT
                .saturating_mul(c.batch)
                .max(DEFAULT_MAX_ACK_PENDING),
        )
        .unwrap_or(i64::MAX),
        ..Default::default()
    };
    let have = match stream.consumer_info(&c.durable).await {
        Ok(info) => info.config,
        Err(err) if matches!(err.kind(), ConsumerInfoErrorKind::NotFound) => {
            let created = stream
                .create_consumer(want)
                .await
                .map_err(|e| format!("cannot create consumer `{}`: {e}", c.durable))?;
            tracing::info!(stream = %c.stream, consumer = %c.durable, subject = %c.subject, "created the durable consumer");
            return Ok(created);
        }
        Err(err) => {
            return Err(format!(
                "cannot look up consumer `{}` of stream `{}`: {err}",
                c.durable, c.stream
            ));
        }
    };
    if have.ack_policy != AckPolicy::Explicit {
        return Err(format!(
            "consumer `{}` of stream `{}` does not use explicit acks; delete it, or name \
             another `durable`",
            c.durable, c.stream
        ));
    }
    let filter_ok = have.filter_subject == c.subject && have.filter_subjects.is_empty();
    if have.ack_wait != c.ack_wait || !filter_ok {
        let mut update = <pull::Config as FromConsumer>::try_from_consumer_config(have)
            .map_err(|e| format!("consumer `{}` is not a pull consumer: {e}", c.durable))?;
        update.ack_wait = c.ack_wait;
        update.filter_subject = c.subject.clone();
        update.filter_subjects = Vec::new();
        stream
            .update_consumer(update)
            .await
            .map_err(|e| format!("cannot update consumer `{}`: {e}", c.durable))?;
        tracing::info!(stream = %c.stream, consumer = %c.durable, "updated the consumer's ack_wait and filter to the source's");
    }
    stream
        .get_consumer::<pull::Config>(&c.durable)
        .await
        .map_err(|e| format!("cannot look up consumer `{}`: {e}", c.durable))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_sequence_is_read_from_the_reply_subject() {
        assert_eq!(
            parse_stream_sequence("$JS.ACK.IN.sluice-p-src.1.42.7.1700000000000000000.3"),
            Some(42)
        );
        assert_eq!(
            parse_stream_sequence("$JS.ACK.hub.ACCHASH.IN.dur.2.99.8.1700000000000000000.0.tok"),
            Some(99)
        );
        assert_eq!(parse_stream_sequence("_INBOX.x.y"), None);
        assert_eq!(parse_stream_sequence("$JS.ACK.IN.d.1.x.7.1.3"), None);
    }
}
