//! The NATS JetStream broker: the same [`Broker`] trait over async-nats, so
//! the same pipelines run on several daemons.
//!
//! - **One stream per topic** ([`naming`]), because topics are what pipelines
//!   share: a topic may be published by one pipeline and read by another,
//!   and its retention, duplicate window and high-water mark are its own.
//! - **Retention.** A topic some stage subscribes to is an *interest* stream:
//!   a message goes once every stage's consumer has acked (or termed) it,
//!   as on the embedded broker. A topic nobody subscribes to (an output, a
//!   DLQ) keeps *limits* retention, by age only, so `tail` and `dlq list`
//!   can read it.
//! - **One durable pull consumer per stage**, with the stage's `ack_wait`,
//!   `max_ack_pending` (the cluster-wide valve) and `max_deliver` (see
//!   [`ConsumerSpec::max_deliver`]). A header filter, which JetStream cannot
//!   express, is applied here: a delivery that does not match is acked and
//!   never reaches the engine.
//! - **Acking** publishes JetStream's ack protocol (`+ACK`, `-NAK {delay}`,
//!   `+WPI`, `+TRM`) to the delivery's reply subject, which the [`Receipt`]
//!   carries. Outputs and DLQ copies are published and their `PubAck`s
//!   awaited **before** the ack or term, each with `Nats-Msg-Id` set to its
//!   deterministic id, so a republish after a crash falls in the stream's
//!   duplicate window and is dropped.
//! - **Provisioning** ([`provision`]) creates streams and consumers
//!   idempotently and brings drifted settings back in line, saying what it
//!   changed.

mod batcher;
mod bucket;
mod codec;
mod dedup;
mod naming;
mod options;
mod provision;
mod rates;
mod schedules;
mod state;
mod versions;

pub use crate::config::{BadNatsUrl, DEFAULT_DUPLICATE_WINDOW, NatsOptions};
pub use codec::{KEY as KEY_HEADER, MSG_ID as MSG_ID_HEADER};
pub use naming::{durable_name, stream_name};

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind, consumer::PullConsumer, stream::Stream};
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;

use super::{
    Broker, BrokerError, Completion, ConsumerSpec, ConsumerStats, Delivery, Message, PublishAck,
    Receipt, Stored, TopicSpec, TopicStats, now_millis,
};

/// A stage's consumer as this process knows it.
struct ConsumerHandle {
    name: Arc<str>,
    spec: ConsumerSpec,
    stream: Stream,
    pull: PullConsumer,
    /// The inbox its pull requests are answered on; made on first fetch.
    puller: tokio::sync::Mutex<Option<Puller>>,
}

/// A consumer's standing pull inbox. One subscription for the consumer's
/// life, rather than one per pull request as async-nats's batch API makes:
/// every SUB/UNSUB makes the server rebuild its subject match cache, which
/// cost about a third more server CPU per message in the benchmark.
///
/// Each request is answered on its own subject under the inbox
/// (`<inbox>.<n>`, one `<inbox>.*` subscription), so a status left over
/// from a request given up on is told from the current one's.
struct Puller {
    subscriber: async_nats::Subscriber,
    inbox: String,
    /// `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`.
    next: async_nats::Subject,
    /// Requests sent so far: the last one's reply subject ends in it.
    requests: u64,
}

/// What a pull request asks for.
enum Pull {
    /// Up to this many, answered at once (404 when there are none), and
    /// (when given) no more payload bytes than this: the server stops
    /// before a message that does not fit, even the first (409).
    Ready(usize, Option<usize>),
    /// One message, waiting up to this long for it.
    First(Duration),
}

/// A [`Broker`] on NATS JetStream. Cheap to share; one connection.
pub struct NatsBroker {
    client: async_nats::Client,
    js: jetstream::Context,
    options: NatsOptions,
    /// Streams by topic, looked up once.
    streams: RwLock<HashMap<String, Stream>>,
    /// Consumers by `<pipeline>.<stage>`, declared by [`Broker::ensure_consumer`].
    consumers: RwLock<HashMap<String, Arc<ConsumerHandle>>>,
    /// Completions and dead letters, put on the wire in groups.
    batcher: batcher::Batcher,
    /// Stage dedup buckets by consumer name, looked up once.
    dedup_buckets: RwLock<HashMap<String, jetstream::kv::Store>>,
    /// Handler state: a KV bucket per store.
    state: Arc<state::NatsState>,
    /// When each topic's next delayed message is due, as last read.
    next_due: schedules::NextDue,
}

impl NatsBroker {
    /// Connects. Returns once the first connection is up, or fails after
    /// `timeout`; later losses are reconnected forever in the background.
    pub async fn connect(
        options: NatsOptions,
        timeout: Duration,
    ) -> Result<Arc<Self>, BrokerError> {
        let unavailable = |why: String| {
            BrokerError::Unavailable(format!("NATS at {}: {why}", options.describe()))
        };
        let addrs = options
            .server_addrs()
            .map_err(|e| unavailable(e.to_string()))?;
        // Why connecting keeps failing (refused, authorization violation,
        // TLS), so a start-up that gives up can say so.
        let last_error: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
        let seen = last_error.clone();
        let connect = options
            .connect_options()
            .await
            .map_err(|e| unavailable(e.to_string()))?
            .event_callback(move |event| {
                let seen = seen.clone();
                async move {
                    match event {
                        async_nats::Event::Connected => tracing::info!("NATS connected"),
                        async_nats::Event::Disconnected => {
                            tracing::warn!("NATS connection lost; reconnecting");
                        }
                        async_nats::Event::ClientError(err) => {
                            tracing::debug!(error = %err, "NATS connect attempt failed");
                            *seen
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                                Some(err.to_string());
                        }
                        async_nats::Event::ServerError(err) => {
                            tracing::warn!(error = %err, "NATS server error");
                            *seen
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner) =
                                Some(err.to_string());
                        }
                        other => tracing::debug!(event = %other, "NATS event"),
                    }
                }
            });
        let client = connect
            .connect(addrs)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        // `retry_on_initial_connect` returns at once; wait here for the
        // first connection so a wrong address or login fails start-up
        // clearly.
        let deadline = Instant::now() + timeout;
        while client.connection_state() != async_nats::connection::State::Connected {
            if Instant::now() >= deadline {
                let why = last_error
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone()
                    .map_or_else(String::new, |e| format!(" (last error: {e})"));
                return Err(unavailable(format!(
                    "no connection within {timeout:?}{why}; is nats-server running there, with JetStream enabled, and do the credentials match?"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let js = jetstream::new(client.clone());
        let batcher = batcher::Batcher::start(js.clone(), client.clone());
        let state = Arc::new(state::NatsState::new(
            client.clone(),
            js.clone(),
            options.replicas,
        ));
        Ok(Arc::new(NatsBroker {
            batcher,
            client,
            js,
            options,
            streams: RwLock::new(HashMap::new()),
            consumers: RwLock::new(HashMap::new()),
            dedup_buckets: RwLock::new(HashMap::new()),
            state,
            next_due: schedules::NextDue::default(),
        }))
    }

    /// The servers it talks to, for messages.
    pub fn describe(&self) -> String {
        self.options.describe()
    }

    /// The underlying client (for tests and benchmarks).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The stream of `topic`, from the cache or the server.
    async fn stream(&self, topic: &str) -> Result<Stream, BrokerError> {
        if let Some(stream) = read(&self.streams).get(topic) {
            return Ok(stream.clone());
        }
        let stream = self
            .js
            .get_stream(naming::stream_name(topic))
            .await
            .map_err(|err| match err.kind() {
                jetstream::context::GetStreamErrorKind::JetStream(e)
                    if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND =>
                {
                    BrokerError::UnknownTopic(topic.to_owned())
                }
                _ => unavailable(&err),
            })?;
        write(&self.streams).insert(topic.to_owned(), stream.clone());
        Ok(stream)
    }

    /// The consumer `name`, as declared by this process or found on the server.
    async fn consumer(&self, name: &str) -> Result<Arc<ConsumerHandle>, BrokerError> {
        if let Some(handle) = read(&self.consumers).get(name).cloned() {
            return Ok(handle);
        }
        self.find_consumer(name).await
    }

    /// The consumer `name` as a daemon made it, looked for in every Sluice
    /// stream: for `sluice stage pause --broker nats://...`, which declares
    /// no consumers of its own and may not know the stage's topics. Only
    /// the name, topic and lease of its spec are filled in (what pausing
    /// and stats need); it is not kept, so nothing here fetches with it.
    async fn find_consumer(&self, name: &str) -> Result<Arc<ConsumerHandle>, BrokerError> {
        let durable = naming::durable_name(name);
        let mut streams = self.js.streams();
        while let Some(info) = streams.next().await {
            let info = info.map_err(|e| unavailable(&e))?;
            if !info.config.name.starts_with(naming::STREAM_PREFIX) {
                continue;
            }
            let Some(topic) = info.config.subjects.first().cloned() else {
                continue;
            };
            let stream = self.stream(&topic).await?;
            let Ok(pull) = stream
                .get_consumer::<jetstream::consumer::pull::Config>(&durable)
                .await
            else {
                continue;
            };
            let config = &pull.cached_info().config;
            let spec = ConsumerSpec {
                name: name.to_owned(),
                topic,
                filter: Default::default(),
                ack_wait: config.ack_wait,
                max_ack_pending: u32::try_from(config.max_ack_pending).ok(),
                max_deliver: u32::try_from(config.max_deliver).ok(),
            };
            return Ok(Arc::new(ConsumerHandle {
                name: name.into(),
                spec,
                stream,
                pull,
                puller: tokio::sync::Mutex::new(None),
            }));
        }
        Err(BrokerError::UnknownConsumer(name.to_owned()))
    }

    /// Sends one ack-protocol message for a delivery.
    async fn ack_one(&self, receipt: &Receipt, kind: AckKind) -> Result<(), BrokerError> {
        self.client
            .publish(live_handle(receipt)?, Bytes::from(kind))
            .await
            .map_err(|e| unavailable(&e))
    }

    /// Refuses any of `messages` that is too large to publish, before
    /// anything is sent, so a batch with one such message publishes none
    /// (the client would refuse it only as it sends it). A message must
    /// leave [`DEAD_LETTER_HEADROOM`] free under the server's max_payload;
    /// a dead letter (`headroom: false`) may use it.
    fn check_sizes(&self, messages: &[Message], headroom: bool) -> Result<(), BrokerError> {
        let max = self.client.max_payload();
        if max == 0 {
            return Ok(());
        }
        let limit = if headroom {
            max.saturating_sub(DEAD_LETTER_HEADROOM)
        } else {
            max
        };
        for message in messages {
            let size = codec::wire_size(message);
            if size > limit {
                let room = if headroom {
                    format!(
                        " less the {DEAD_LETTER_HEADROOM} bytes kept free for its dead letter's provenance headers"
                    )
                } else {
                    String::new()
                };
                return Err(BrokerError::PayloadTooLarge(format!(
                    "publishing to `{}`: message `{}` is {size} bytes with its headers, over the NATS server's max_payload of {max}{room}; configure a claim_check for large payloads",
                    message.topic, message.id
                )));
            }
        }
        Ok(())
    }

    /// Whether the server has message schedules (nats-server 2.12 and
    /// later), which delayed messages are published as.
    fn schedules(&self) -> bool {
        provision::schedules_supported(&self.client.server_info().version)
    }

    /// Resolves the delay headers of `messages` ([`crate::delay`]): each
    /// message without them, and its due time if it is delayed. Checked for
    /// all before any is sent, so a bad one publishes none.
    async fn resolve_delays(
        &self,
        messages: Vec<Message>,
    ) -> Result<Vec<(Message, Option<u64>)>, BrokerError> {
        let now = now_millis();
        let mut out = Vec::with_capacity(messages.len());
        for mut message in messages {
            if !message
                .headers
                .iter()
                .any(|(n, _)| crate::delay::is_delay_header(n))
            {
                out.push((message, None));
                continue;
            }
            let due = crate::delay::take_due(&mut message.headers, now)
                .map_err(BrokerError::BadMessage)?;
            if let Some(due) = due {
                self.check_delay(&message.topic, due.saturating_sub(now))
                    .await?;
            }
            out.push((message, due));
        }
        Ok(out)
    }

    /// Refuses a delay the server cannot keep: on a server without
    /// schedules, or longer than the topic's retention (the schedule would
    /// be removed by age before it is due).
    async fn check_delay(&self, topic: &str, delay_ms: u64) -> Result<(), BrokerError> {
        if !self.schedules() {
            return Err(BrokerError::BadMessage(format!(
                "a delayed message for `{topic}` needs nats-server 2.12 or later (message schedules); this server is {}",
                self.client.server_info().version
            )));
        }
        let stream = self.stream(topic).await?;
        let max_age = stream.cached_info().config.max_age;
        if !max_age.is_zero() && Duration::from_millis(delay_ms) >= max_age {
            return Err(BrokerError::BadMessage(format!(
                "a delay of {} on `{topic}` is longer than the topic's retention of {}: it would be removed before it is due",
                humantime::format_duration(Duration::from_secs(delay_ms / 1000)),
                humantime::format_duration(max_age)
            )));
        }
        Ok(())
    }

    /// Publishes messages and waits for every `PubAck`. The publishes are
    /// pipelined: all are sent before the first ack is awaited. A delayed
    /// message is published as a schedule ([`codec::schedule`]) on its own
    /// subject in the topic's stream, and acked with seq 0: it takes its
    /// place in the topic when the server publishes it.
    async fn publish_all(&self, messages: Vec<Message>) -> Result<Vec<PublishAck>, BrokerError> {
        self.check_sizes(&messages, true)?;
        let prepared = self.resolve_delays(messages).await?;
        let mut pending = Vec::with_capacity(prepared.len());
        for (message, due) in prepared {
            let (subject, headers) = match due {
                Some(due) => (
                    naming::delay_subject(&message.topic, &message.id),
                    codec::schedule(&message, due),
                ),
                None => (message.topic.clone(), codec::headers(&message)),
            };
            let topic = message.topic;
            let future = self
                .js
                .publish_with_headers(subject, headers, message.payload)
                .await
                .map_err(|e| publish_error(&topic, &e))?;
            pending.push((topic, future, due.is_some()));
        }
        // Awaited together: each await starts its own timeout, so one by
        // one a batch whose PubAcks died with the connection would take a
        // timeout per message to fail.
        futures_util::future::join_all(pending.into_iter().map(
            |(topic, future, delayed)| async move {
                let ack = future.await.map_err(|e| publish_error(&topic, &e))?;
                Ok(PublishAck {
                    seq: if delayed { 0 } else { ack.sequence },
                    duplicate: ack.duplicate,
                })
            },
        ))
        .await
        .into_iter()
        .collect()
    }

    /// Turns one pulled message into a delivery, or acks it here when the
    /// stage's header filter does not want it.
    async fn delivery(
        &self,
        handle: &ConsumerHandle,
        message: jetstream::Message,
    ) -> Result<Option<Delivery>, BrokerError> {
        let info = message
            .info()
            .map_err(|e| BrokerError::Storage(format!("a delivery without metadata: {e}")))?;
        let seq = info.stream_sequence;
        let attempt = u32::try_from(info.delivered.max(1)).unwrap_or(u32::MAX);
        let stamped = codec::millis(info.published);
        let stream = info.stream.to_owned();
        let handle_subject = message
            .reply
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default();
        let message = codec::message(
            &handle.spec.topic,
            &stream,
            seq,
            message.headers.as_ref(),
            message.payload.clone(),
            stamped,
        );
        let receipt = Receipt {
            consumer: handle.name.clone(),
            seq,
            attempt,
            handle: handle_subject,
        };
        if !handle.spec.accepts(&message) {
            self.ack_one(&receipt, AckKind::Ack).await?;
            return Ok(None);
        }
        Ok(Some(Delivery {
            message,
            seq,
            attempt,
            receipt,
        }))
    }

    /// Subscribes the standing inbox of `handle`.
    async fn puller(&self, handle: &ConsumerHandle) -> Result<Puller, BrokerError> {
        let inbox = self.client.new_inbox();
        let subscriber = self
            .client
            .subscribe(format!("{inbox}.*"))
            .await
            .map_err(|e| unavailable(&e))?;
        let info = handle.pull.cached_info();
        Ok(Puller {
            subscriber,
            inbox,
            requests: 0,
            next: format!(
                "$JS.API.CONSUMER.MSG.NEXT.{}.{}",
                info.stream_name, info.name
            )
            .into(),
        })
    }

    /// Sends one pull request and reads its answer into `out`, until the
    /// batch is complete, the server ends it with a status (404 no
    /// messages, 408 expired, 409 and the like), or `limit` passes.
    ///
    /// A message left over from an earlier request that was given up on
    /// may arrive here: it is a valid delivery, leased to this daemon, and
    /// counts towards this batch. A status left over is ignored: taken as
    /// this request's end, it left this request's own deliveries in the
    /// inbox for the next pull, which then met this one's status, and so on,
    /// until thousands of leased deliveries waited in the inbox past
    /// `ack_wait` and were delivered a second time.
    async fn pull(
        &self,
        handle: &ConsumerHandle,
        puller: &mut Puller,
        pull: Pull,
        out: &mut Vec<Delivery>,
    ) -> Result<(), BrokerError> {
        let (batch, body, limit) = match pull {
            Pull::Ready(batch, max_bytes) => (
                batch,
                match max_bytes {
                    Some(bytes) => {
                        format!(r#"{{"batch":{batch},"max_bytes":{bytes},"no_wait":true}}"#)
                    }
                    None => format!(r#"{{"batch":{batch},"no_wait":true}}"#),
                },
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
        puller.requests += 1;
        let reply = format!("{}.{}", puller.inbox, puller.requests);
        self.client
            .publish_with_reply(puller.next.clone(), reply.clone(), body.into())
            .await
            .map_err(|e| unavailable(&e))?;
        let give_up = tokio::time::Instant::now() + limit;
        let mut received = 0;
        while received < batch {
            let message = match tokio::time::timeout_at(give_up, puller.subscriber.next()).await {
                Ok(Some(message)) => message,
                Ok(None) => {
                    return Err(BrokerError::Unavailable(
                        "the pull inbox subscription closed".into(),
                    ));
                }
                // async-nats would wait forever for a request lost with a
                // connection: the classic pull consumer stuck after a
                // reconnect. The caller retries with a new request.
                Err(_) if received > 0 => return Ok(()),
                Err(_) => {
                    return Err(BrokerError::Unavailable(format!(
                        "a pull request got no answer within {limit:?}; the connection was probably lost"
                    )));
                }
            };
            match message.status {
                None | Some(async_nats::StatusCode::OK) => {}
                Some(async_nats::StatusCode::IDLE_HEARTBEAT) => continue,
                // An earlier request's end.
                Some(_) if message.subject.as_str() != reply => continue,
                Some(status) => {
                    if status != async_nats::StatusCode::NOT_FOUND
                        && status != async_nats::StatusCode::TIMEOUT
                    {
                        tracing::debug!(consumer = %handle.name, %status, description = ?message.description, "pull request ended");
                    }
                    return Ok(());
                }
            }
            received += 1;
            let message = jetstream::Message {
                message,
                context: self.js.clone(),
            };
            if let Some(delivery) = self.delivery(handle, message).await? {
                out.push(delivery);
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Broker for NatsBroker {
    async fn ensure_topic(&self, spec: &TopicSpec) -> Result<(), BrokerError> {
        let schedules = self.schedules();
        let stream = provision::stream(
            &self.js,
            &self.options,
            spec,
            self.client.max_payload(),
            schedules,
        )
        .await?;
        if schedules && spec.subscribed {
            provision::delay_keeper(&stream, spec).await?;
        }
        write(&self.streams).insert(spec.name.clone(), stream);
        Ok(())
    }

    async fn ensure_consumer(&self, spec: &ConsumerSpec) -> Result<(), BrokerError> {
        let stream = self.stream(&spec.topic).await?;
        let pull = provision::consumer(&stream, spec).await?;
        write(&self.consumers).insert(
            spec.name.clone(),
            Arc::new(ConsumerHandle {
                name: spec.name.as_str().into(),
                spec: spec.clone(),
                stream,
                pull,
                puller: tokio::sync::Mutex::new(None),
            }),
        );
        Ok(())
    }

    async fn publish(&self, messages: Vec<Message>) -> Result<Vec<PublishAck>, BrokerError> {
        self.publish_all(messages).await
    }

    /// Takes what is ready at once (a `no_wait` pull of `max`, with
    /// `max_bytes`); when nothing is (or the first ready message is larger
    /// than `max_bytes`), long-polls for one message, whatever its size,
    /// for up to `wait`, so a quiet stage answers a new message within a
    /// round trip instead of a whole `wait`. Every pull request is bounded
    /// in time (see [`NatsBroker::pull`]).
    async fn fetch_within(
        &self,
        consumer: &str,
        max: usize,
        max_bytes: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        let handle = self.consumer(consumer).await?;
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        let mut slot = handle.puller.lock().await;
        let puller = match &mut *slot {
            Some(puller) => puller,
            empty => empty.insert(self.puller(&handle).await?),
        };
        let deadline = Instant::now() + wait;
        loop {
            let result = self
                .pull(
                    &handle,
                    puller,
                    Pull::Ready(
                        max - out.len(),
                        (max_bytes < usize::MAX).then_some(max_bytes),
                    ),
                    &mut out,
                )
                .await;
            // Deliveries already taken are leased to us: hand them on even
            // if the rest of the pull failed.
            if !out.is_empty() {
                return Ok(out);
            }
            result?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left < Duration::from_millis(10) {
                return Ok(out);
            }
            let result = self
                .pull(&handle, puller, Pull::First(left), &mut out)
                .await;
            if !out.is_empty() {
                return Ok(out);
            }
            result?;
            if Instant::now() >= deadline {
                return Ok(out);
            }
        }
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        self.ack_one(receipt, AckKind::Ack).await
    }

    async fn complete(&self, completion: &Completion) -> Result<(), BrokerError> {
        let Completion {
            receipt,
            outputs,
            ticket,
            state,
        } = completion;
        // The state first, as one atomic batch with the message's marker
        // (see `state`); a rerun after a crash publishes what the first
        // run did.
        let kept;
        let outputs = match state {
            None => outputs,
            Some(writes) => match self.state.commit(writes, outputs).await? {
                state::Commit::Applied | state::Commit::AlreadyApplied(None) => outputs,
                state::Commit::AlreadyApplied(Some(first)) => {
                    kept = first;
                    &kept
                }
            },
        };
        if let Some(ticket) = ticket {
            return self
                .complete_recorded(ticket, receipt, outputs.clone())
                .await;
        }
        if outputs.is_empty() {
            return self.ack_one(receipt, AckKind::Ack).await;
        }
        self.check_sizes(outputs, true)?;
        // A delayed output is a schedule, published on its own subject:
        // not the batcher's plain publish. Still published, then acked.
        if outputs.iter().any(|m| {
            m.headers
                .iter()
                .any(|(n, _)| crate::delay::is_delay_header(n))
        }) {
            self.publish_all(outputs.clone()).await?;
            return self.ack_one(receipt, AckKind::Ack).await;
        }
        self.batcher
            .publish_then_ack(outputs.clone(), live_handle(receipt)?, AckKind::Ack)
            .await
    }

    fn state(&self) -> Option<Arc<dyn crate::state::StateReader>> {
        Some(self.state.clone())
    }

    async fn delete_state(&self, store: &str, key: &str) -> Result<bool, BrokerError> {
        self.state.delete(store, key).await
    }

    async fn nak(&self, receipt: &Receipt, delay: Duration) -> Result<(), BrokerError> {
        let delay = (!delay.is_zero()).then_some(delay);
        self.ack_one(receipt, AckKind::Nak(delay)).await
    }

    async fn in_progress(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        self.ack_one(receipt, AckKind::Progress).await
    }

    async fn term(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        self.ack_one(receipt, AckKind::Term).await
    }

    async fn dead_letter(&self, receipt: &Receipt, entry: Message) -> Result<(), BrokerError> {
        // The DLQ copy is durable before the source is termed: a crash in
        // between redelivers the source, and the copy's id dedups the rerun.
        let entry = vec![entry];
        self.check_sizes(&entry, false)?;
        self.batcher
            .publish_then_ack(entry, live_handle(receipt)?, AckKind::Term)
            .await
    }

    /// A JetStream consumer pause, so it holds for every daemon and across
    /// restarts. JetStream pauses until a time: "indefinitely" is a
    /// century from now.
    async fn set_paused(&self, consumer: &str, paused: bool) -> Result<(), BrokerError> {
        let handle = self.consumer(consumer).await?;
        let durable = naming::durable_name(&handle.spec.name);
        let result = if paused {
            let until = time::OffsetDateTime::now_utc() + time::Duration::days(36_500);
            handle.stream.pause_consumer(&durable, until).await
        } else {
            handle.stream.resume_consumer(&durable).await
        };
        result.map(drop).map_err(|e| {
            BrokerError::Unavailable(format!(
                "cannot {} consumer `{durable}` (a pause needs nats-server 2.11 or later): {e}",
                if paused { "pause" } else { "resume" }
            ))
        })
    }

    async fn consumer_stats(&self, consumer: &str) -> Result<ConsumerStats, BrokerError> {
        let handle = self.consumer(consumer).await?;
        let info = handle.pull.get_info().await.map_err(|e| unavailable(&e))?;
        let in_flight = u64::try_from(info.num_ack_pending).unwrap_or(u64::MAX);
        let oldest_age = if info.num_pending + in_flight == 0 {
            None
        } else {
            oldest_after(
                &handle.stream,
                &handle.spec.topic,
                info.ack_floor.stream_sequence,
            )
            .await
        };
        Ok(ConsumerStats {
            pending: info.num_pending,
            in_flight,
            oldest_age,
            paused: info.paused,
        })
    }

    async fn topic_stats(&self, topic: &str) -> Result<TopicStats, BrokerError> {
        let stream = self.stream(topic).await?;
        // One request: the stream's state, and the count on the topic's own
        // subject; the rest of the stream is its delayed messages.
        let mut subjects = stream
            .info_with_subjects(topic)
            .await
            .map_err(|e| unavailable(&e))?;
        let state = subjects.info.state.clone();
        let mut depth = 0;
        while let Some(entry) = subjects.next().await {
            let (subject, count) = entry.map_err(|e| unavailable(&e))?;
            if subject == topic {
                depth = count as u64;
            }
        }
        let delayed = state.messages.saturating_sub(depth);
        let oldest_age = if depth == 0 {
            None
        } else if delayed == 0 {
            Some(Duration::from_millis(
                now_millis().saturating_sub(codec::millis(state.first_timestamp)),
            ))
        } else {
            // The stream's first message may be a schedule.
            oldest_after(&stream, topic, 0).await
        };
        Ok(TopicStats {
            depth,
            first_seq: if state.messages > 0 {
                state.first_sequence
            } else {
                0
            },
            last_seq: state.last_sequence,
            oldest_age,
            delayed,
            next_due: self.next_due.get(&stream, topic, delayed).await,
        })
    }

    async fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Stored>, BrokerError> {
        let stream = self.stream(topic).await?;
        let name = naming::stream_name(topic);
        let deadline = Instant::now() + wait;
        let mut out = Vec::new();
        let mut next = from.max(1);
        loop {
            while out.len() < max {
                let got = stream
                    .raw_message_builder()
                    .sequence(next)
                    .next_by_subject(topic.to_owned())
                    .send()
                    .await;
                match got {
                    Ok(raw) => {
                        next = raw.sequence + 1;
                        let message = codec::message(
                            topic,
                            &name,
                            raw.sequence,
                            Some(&raw.headers),
                            raw.payload,
                            codec::millis(raw.time),
                        );
                        out.push(Stored {
                            seq: raw.sequence,
                            message,
                        });
                    }
                    Err(err) if is_no_message(&err) => break,
                    Err(err) => return Err(unavailable(&err)),
                }
            }
            if !out.is_empty() || Instant::now() >= deadline {
                return Ok(out);
            }
            tokio::time::sleep(Duration::from_millis(100).min(wait)).await;
        }
    }

    async fn remove(&self, topic: &str, seqs: &[u64]) -> Result<u64, BrokerError> {
        let stream = self.stream(topic).await?;
        let mut removed = 0;
        for &seq in seqs {
            match stream.delete_message(seq).await {
                Ok(true) => removed += 1,
                Ok(false) => {}
                Err(err) => {
                    if err.to_string().contains("no message found") {
                        continue;
                    }
                    return Err(unavailable(&err));
                }
            }
        }
        Ok(removed)
    }

    async fn flush(&self) -> Result<(), BrokerError> {
        self.client.flush().await.map_err(|e| unavailable(&e))
    }

    /// Stages' rate buckets in the KV bucket `SLUICE_RATES`, so a limit
    /// holds for all daemons together.
    fn shared_rates(&self) -> Option<Arc<dyn crate::broker::rates::SharedRates>> {
        Some(Arc::new(rates::NatsRates::new(
            self.js.clone(),
            self.options.replicas,
        )))
    }

    fn shared_versions(&self) -> Option<Arc<dyn crate::broker::versions::SharedVersions>> {
        Some(Arc::new(versions::NatsVersions::new(
            self.js.clone(),
            self.options.replicas,
        )))
    }

    /// From the client's connection state (kept by its connection task, so
    /// this never waits on the network). Storage is the server's, so
    /// `storage_errors` stays 0 here.
    fn readiness(&self) -> crate::broker::Readiness {
        match self.client.connection_state() {
            async_nats::connection::State::Connected => crate::broker::Readiness::Ready,
            async_nats::connection::State::Pending => crate::broker::Readiness::NotReady(format!(
                "NATS connection to {} pending",
                self.options.describe()
            )),
            async_nats::connection::State::Disconnected => crate::broker::Readiness::NotReady(
                format!("NATS connection lost ({})", self.options.describe()),
            ),
        }
    }
}

/// Bytes a message published to NATS leaves free under the server's
/// max_payload, so that its dead letter (the message plus the provenance
/// headers, whose error text is capped at [`crate::dlq::ERROR_MAX`]) still
/// fits: otherwise a message near the limit could never be dead-lettered
/// and would be redelivered until JetStream's `max_deliver` gave up on it.
pub const DEAD_LETTER_HEADROOM: usize = 4 << 10;

/// How long past its own expiry a pull request may go unanswered before it
/// counts as lost with the connection.
const PULL_GRACE: Duration = Duration::from_secs(5);

/// The age of the first message after `floor`, the consumer's ack floor.
async fn oldest_after(stream: &Stream, topic: &str, floor: u64) -> Option<Duration> {
    let raw = stream
        .raw_message_builder()
        .sequence(floor + 1)
        .next_by_subject(topic.to_owned())
        .send()
        .await
        .ok()?;
    Some(Duration::from_millis(
        now_millis().saturating_sub(codec::millis(raw.time)),
    ))
}

/// Whether a get failed only because there is no such message.
fn is_no_message(err: &impl std::fmt::Display) -> bool {
    let text = err.to_string().to_ascii_lowercase();
    text.contains("no message found") || text.contains("not found")
}

/// The reply subject a delivery is acked on.
fn live_handle(receipt: &Receipt) -> Result<String, BrokerError> {
    if receipt.handle.is_empty() {
        return Err(BrokerError::LeaseLost(format!(
            "delivery {} has no reply subject",
            receipt.seq
        )));
    }
    Ok(receipt.handle.clone())
}

fn unavailable(err: &(impl std::fmt::Display + ?Sized)) -> BrokerError {
    BrokerError::Unavailable(err.to_string())
}

/// A publish failure, in the caller's terms.
fn publish_error(topic: &str, err: &jetstream::context::PublishError) -> BrokerError {
    use jetstream::context::PublishErrorKind;
    match err.kind() {
        // async-nats reports JetStream's "no responders" this way, which is
        // also what a stream electing a new leader answers: transient.
        PublishErrorKind::StreamNotFound => BrokerError::Unavailable(format!(
            "no stream answered for `{topic}`: it is missing, or its leader is being elected"
        )),
        // Refused by the client before anything is sent: the caller's input
        // is too large (413 on the ingest API), not a broker failure.
        PublishErrorKind::MaxPayloadExceeded => BrokerError::PayloadTooLarge(format!(
            "publishing to `{topic}`: the message is larger than the NATS server's max_payload ({err}); configure a claim_check for large payloads"
        )),
        _ => BrokerError::Unavailable(format!("publishing to `{topic}`: {err}")),
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
