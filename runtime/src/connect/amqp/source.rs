//! The AMQP source: one consumer of an existing queue, manual acks.
//!
//! - **Connect** (first read, or after any error): a connection, a
//!   channel, `basic.qos` (per consumer) and `basic.consume`. Each
//!   connection is a new *generation*; lapin's automatic recovery is off,
//!   so a channel is never silently replaced under the delivery tags.
//! - **Read**: deliveries the broker pushed (at most the prefetch window),
//!   up to `max`, waiting up to `wait` for the first.
//! - **Ack**: per read, in read order, one `basic.ack` with `multiple` up
//!   to the read's last delivery tag, on the channel the read came from. A
//!   read of an older generation is never acked: its channel is gone and
//!   the broker has put its messages back in the queue; they are read
//!   again and, with a `message-id`, collapse in the topic's duplicate
//!   window.
//! - **Prefetch**: `prefetch`, lowered to the room the runner reports
//!   under the topic's high-water mark (`max` below the block's `batch`
//!   means the room is short). RabbitMQ applies a per-consumer `basic.qos`
//!   only to consumers started after it, so a change is a `basic.cancel`
//!   (the deliveries already pushed are kept and stay acknowledgeable on
//!   the same channel), `basic.qos`, then `basic.consume` again; at most
//!   once a second, and only for a change of at least half.
//!
//! Every error is an outage ([`SourceError::Unavailable`], scrubbed): the
//! connection is dropped (the broker requeues what it had delivered and
//! not been acked) and the next read connects anew.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{FutureExt as _, StreamExt as _};
use lapin::message::Delivery;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};

use super::config::AmqpSourceConfig;
use super::{Endpoint, describe_error, value_text};
use crate::connect::{Capabilities, Source, SourceError, SourceMessage};
/// The shortest time between two prefetch changes.
const QOS_EVERY: Duration = Duration::from_secs(1);
/// How long closing a connection may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// The header that carries the routing key a message was published with.
pub const ROUTING_KEY_HEADER: &str = "amqp-routing-key";
/// The header that carries the exchange a message was published to.
pub const EXCHANGE_HEADER: &str = "amqp-exchange";

/// A consumer of one queue.
pub struct AmqpSource {
    endpoint: Endpoint,
    queue: String,
    prefetch: u16,
    read_max: usize,
    tag: String,
    live: Option<Live>,
    /// Bumped on every new connection: the generation of `live`.
    generation: u64,
    /// Per open read, oldest first: its generation, its last delivery
    /// tag, and how many messages it holds.
    unacked: VecDeque<(u64, u64, usize)>,
    /// Messages read and not yet acknowledged (all open reads).
    held: usize,
}

/// One connection's channel and consumer.
struct Live {
    connection: Connection,
    channel: Channel,
    consumer: Consumer,
    /// The current consumer's tag (a prefetch change starts a new one).
    consumer_tag: String,
    /// Deliveries received and not yet read, kept across a prefetch
    /// change (the old consumer's last deliveries).
    ready: VecDeque<Delivery>,
    /// The prefetch the current consumer was started with.
    qos: u16,
    qos_at: Instant,
    restarts: u32,
}

impl AmqpSource {
    /// The source of `config`, not connected.
    pub(crate) fn new(config: &AmqpSourceConfig, label: &str) -> Result<Self, String> {
        Ok(AmqpSource {
            endpoint: Endpoint::new(&config.connection, config.tls.files(), label)?,
            queue: config.queue.clone(),
            prefetch: config.prefetch.get(),
            read_max: usize::try_from(config.batch.get()).unwrap_or(usize::MAX),
            tag: config.consumer_tag.clone().unwrap_or_else(default_tag),
            live: None,
            generation: 0,
            unacked: VecDeque::new(),
            held: 0,
        })
    }

    /// The prefetch for a read of `max`: the whole `prefetch` while the
    /// runner asks for full batches, else the room it reports (what is
    /// held plus `max`).
    fn target(&self, max: usize) -> u16 {
        if max >= self.read_max {
            return self.prefetch;
        }
        let room = self.held.saturating_add(max).max(1);
        u16::try_from(room).unwrap_or(u16::MAX).min(self.prefetch)
    }

    fn unavailable(&self, what: &str, err: &lapin::Error) -> SourceError {
        SourceError::Unavailable(format!(
            "amqp queue `{}` at {}: {what}: {}",
            self.queue,
            self.endpoint.url,
            self.endpoint.url.scrub(&describe_error(err))
        ))
    }

    /// Drops the connection (the broker requeues its unacked deliveries);
    /// the next read connects anew, as a new generation.
    async fn drop_live(&mut self) {
        if let Some(live) = self.live.take() {
            let _ = tokio::time::timeout(
                CLOSE_TIMEOUT,
                live.connection
                    .close(200, "sluice source reconnects".into()),
            )
            .await;
        }
    }

    async fn fail(&mut self, what: &str, err: &lapin::Error) -> SourceError {
        let error = self.unavailable(what, err);
        self.drop_live().await;
        error
    }

    /// Connects, sets the prefetch and starts consuming.
    async fn connect(&mut self, max: usize) -> Result<(), SourceError> {
        let connection =
            self.endpoint.connect().await.map_err(|e| {
                SourceError::Unavailable(format!("amqp queue `{}`: {e}", self.queue))
            })?;
        let channel = match connection.create_channel().await {
            Ok(channel) => channel,
            Err(e) => {
                let _ = connection.close(200, "".into()).await;
                return Err(self.unavailable("cannot open a channel", &e));
            }
        };
        self.generation += 1;
        let qos = self.target(max);
        match consume(&channel, &self.queue, &self.tag, qos).await {
            Ok(consumer) => {
                tracing::debug!(queue = %self.queue, prefetch = qos, generation = self.generation, "consuming");
                self.live = Some(Live {
                    connection,
                    channel,
                    consumer,
                    consumer_tag: self.tag.clone(),
                    ready: VecDeque::new(),
                    qos,
                    qos_at: Instant::now(),
                    restarts: 0,
                });
                Ok(())
            }
            Err(e) => {
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, connection.close(200, "".into())).await;
                let what = if matches!(e.kind(), lapin::ErrorKind::ProtocolError(p) if p.get_id() == 404)
                {
                    "the queue does not exist (the connector declares no queue: declare it, \
                     durable, with its arguments)"
                } else {
                    "cannot consume"
                };
                Err(self.unavailable(what, &e))
            }
        }
    }

    /// Restarts the consumer with the prefetch `max` calls for, when it
    /// differs enough from the current one.
    async fn adapt(&mut self, max: usize) -> Result<(), SourceError> {
        let target = self.target(max);
        let Some(live) = self.live.as_mut() else {
            return Ok(());
        };
        let current = live.qos;
        let change = target < current / 2
            || target >= current.saturating_mul(2)
            || (target == self.prefetch && current != self.prefetch);
        if !change || live.qos_at.elapsed() < QOS_EVERY {
            return Ok(());
        }
        live.qos_at = Instant::now();
        // Stop the consumer; what it was sent before the cancel-ok is in
        // its stream, followed by its end: keep it, still acknowledgeable
        // on this channel.
        let cancel = live
            .channel
            .basic_cancel(
                live.consumer_tag.as_str().into(),
                BasicCancelOptions::default(),
            )
            .await;
        if let Err(e) = cancel {
            return Err(self.fail("cannot change the prefetch", &e).await);
        }
        loop {
            match live.consumer.next().now_or_never() {
                Some(Some(Ok(delivery))) => live.ready.push_back(delivery),
                Some(Some(Err(e))) => return Err(self.fail("the consumer failed", &e).await),
                Some(None) | None => break,
            }
        }
        live.restarts += 1;
        let tag = format!("{}-{}", self.tag, live.restarts);
        match consume(&live.channel, &self.queue, &tag, target).await {
            Ok(consumer) => {
                tracing::debug!(queue = %self.queue, from = current, to = target, "prefetch changed");
                live.consumer = consumer;
                live.consumer_tag = tag;
                live.qos = target;
                Ok(())
            }
            Err(e) => Err(self.fail("cannot consume again", &e).await),
        }
    }

    /// Up to `max` deliveries, waiting up to `wait` for the first.
    async fn take(&mut self, max: usize, wait: Duration) -> Result<Vec<Delivery>, SourceError> {
        let Some(live) = self.live.as_mut() else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        while out.len() < max {
            let Some(delivery) = live.ready.pop_front() else {
                break;
            };
            out.push(delivery);
        }
        let mut waited = false;
        while out.len() < max {
            let next = match live.consumer.next().now_or_never() {
                Some(next) => next,
                None if out.is_empty() && !waited && !wait.is_zero() => {
                    waited = true;
                    match tokio::time::timeout(wait, live.consumer.next()).await {
                        Ok(next) => next,
                        Err(_) => break,
                    }
                }
                None => break,
            };
            match next {
                Some(Ok(delivery)) => out.push(delivery),
                Some(Err(e)) => return Err(self.fail("the connection failed", &e).await),
                None => {
                    // The broker cancelled the consumer (the queue was
                    // deleted) or the channel closed.
                    let error = SourceError::Unavailable(format!(
                        "amqp queue `{}` at {}: the broker ended the consumer (the queue was \
                         deleted, or the channel closed)",
                        self.queue, self.endpoint.url
                    ));
                    self.drop_live().await;
                    return Err(error);
                }
            }
        }
        Ok(out)
    }
}

/// `basic.qos` then `basic.consume` (manual acks) on `channel`.
async fn consume(
    channel: &Channel,
    queue: &str,
    tag: &str,
    prefetch: u16,
) -> lapin::Result<Consumer> {
    channel
        .basic_qos(prefetch, BasicQosOptions { global: false })
        .await?;
    channel
        .basic_consume(
            queue.into(),
            tag.into(),
            BasicConsumeOptions {
                no_ack: false,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
}

#[async_trait]
impl Source for AmqpSource {
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
        let max = max.max(1);
        if self.live.is_none() {
            self.connect(max).await?;
        }
        self.adapt(max).await?;
        let deliveries = self.take(max, wait).await?;
        let Some(last) = deliveries.last().map(|d| d.delivery_tag) else {
            return Ok(Vec::new());
        };
        self.unacked
            .push_back((self.generation, last, deliveries.len()));
        self.held += deliveries.len();
        Ok(deliveries.into_iter().map(to_message).collect())
    }

    async fn ack(&mut self) -> Result<(), SourceError> {
        let Some((generation, tag, count)) = self.unacked.pop_front() else {
            return Ok(());
        };
        self.held = self.held.saturating_sub(count);
        let Some(live) = self.live.as_ref().filter(|_| generation == self.generation) else {
            // That channel is gone: the broker has requeued these, and
            // they come back (and collapse in the duplicate window).
            tracing::debug!(queue = %self.queue, count, "not acknowledging a read of a closed channel");
            return Ok(());
        };
        let acked = live
            .channel
            .basic_ack(tag, lapin::options::BasicAckOptions { multiple: true })
            .await;
        match acked {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail("cannot acknowledge", &e).await),
        }
    }

    async fn release(&mut self) {
        // Closing the channel gives every unacknowledged delivery back.
        self.unacked.clear();
        self.held = 0;
        self.drop_live().await;
    }

    async fn lag(&mut self) -> Option<u64> {
        // On a channel of its own: a passive declare of a queue that is
        // gone closes the channel it runs on.
        let live = self.live.as_ref()?;
        let channel = live.connection.create_channel().await.ok()?;
        let queue = channel
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .ok();
        let _ = channel.close(200, "".into()).await;
        queue.map(|q| u64::from(q.message_count()))
    }
}

/// A delivery as a message: the `message-id` is the upstream id (a
/// generated one without it), the AMQP headers become headers, with the
/// routing key, the exchange and a few properties beside them. A header
/// whose value is bytes that are not UTF-8 is a problem.
pub(crate) fn to_message(delivery: Delivery) -> SourceMessage {
    let properties = &delivery.properties;
    let mut problems = Vec::new();
    let id = match properties.message_id() {
        Some(id) if !id.as_str().is_empty() && !id.as_str().chars().any(char::is_control) => {
            id.as_str().to_owned()
        }
        Some(id) if !id.as_str().is_empty() => {
            problems.push(format!(
                "the message-id {:?} holds a control character",
                id.as_str()
            ));
            uuid::Uuid::now_v7().to_string()
        }
        _ => uuid::Uuid::now_v7().to_string(),
    };
    let mut message = SourceMessage::new(id, Bytes::from(delivery.data));
    if let Some(headers) = properties.headers() {
        for (name, value) in headers {
            match value_text(value) {
                Ok(text) => message.headers.push((name.as_str().to_owned(), text)),
                Err(e) => problems.push(format!("header `{name}`: {e}")),
            }
        }
    }
    message.headers.push((
        ROUTING_KEY_HEADER.to_owned(),
        delivery.routing_key.as_str().to_owned(),
    ));
    if !delivery.exchange.as_str().is_empty() {
        message.headers.push((
            EXCHANGE_HEADER.to_owned(),
            delivery.exchange.as_str().to_owned(),
        ));
    }
    for (name, value) in [
        ("content-type", properties.content_type()),
        ("amqp-correlation-id", properties.correlation_id()),
        ("amqp-type", properties.kind()),
    ] {
        if let Some(value) = value {
            message
                .headers
                .push((name.to_owned(), value.as_str().to_owned()));
        }
    }
    if !problems.is_empty() {
        message.problem = Some(problems.join("; "));
    }
    message
}

/// `sluice-<host>-<pid>`.
fn default_tag() -> String {
    format!("sluice-{}", crate::connect::names::this_daemon())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::BasicProperties;
    use lapin::types::{AMQPValue, LongString};

    fn delivery(properties: BasicProperties) -> Delivery {
        let mut d = Delivery::mock(7, "ex".into(), "orders.eu".into(), false, b"hi".to_vec());
        d.properties = properties;
        d
    }

    #[test]
    fn the_message_id_is_the_upstream_id_and_headers_travel() {
        let mut headers = FieldTable::default();
        headers.insert("trace".into(), AMQPValue::LongString("t1".into()));
        headers.insert("n".into(), AMQPValue::LongInt(3));
        let m = to_message(delivery(
            BasicProperties::default()
                .with_message_id("m-1".into())
                .with_headers(headers)
                .with_content_type("text/plain".into()),
        ));
        assert_eq!(m.upstream_id, "m-1");
        assert_eq!(&m.payload[..], b"hi");
        assert_eq!(m.problem, None);
        let h = |name: &str| {
            m.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(h("trace"), Some("t1"));
        assert_eq!(h("n"), Some("3"));
        assert_eq!(h(ROUTING_KEY_HEADER), Some("orders.eu"));
        assert_eq!(h(EXCHANGE_HEADER), Some("ex"));
        assert_eq!(h("content-type"), Some("text/plain"));
    }

    #[test]
    fn without_a_message_id_a_unique_one_is_made() {
        let a = to_message(delivery(BasicProperties::default()));
        let b = to_message(delivery(BasicProperties::default()));
        assert_ne!(a.upstream_id, b.upstream_id);
        assert_eq!(a.upstream_id.len(), 36);
    }

    #[test]
    fn a_binary_header_is_a_problem() {
        let mut headers = FieldTable::default();
        headers.insert(
            "bin".into(),
            AMQPValue::LongString(LongString::from(vec![0xff])),
        );
        let m = to_message(delivery(
            BasicProperties::default()
                .with_message_id("m-2".into())
                .with_headers(headers),
        ));
        assert!(m.problem.expect("a problem").contains("`bin`"));
    }
}
