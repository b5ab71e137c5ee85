//! The AMQP sink: publishes each message to an exchange with publisher
//! confirms.
//!
//! Every publish is `mandatory` (an unroutable message comes back as a
//! `basic.return` instead of vanishing), persistent (`delivery_mode` 2),
//! with `message-id` set to the Sluice id and the headers as AMQP headers
//! plus `sluice-id`. A batch is published whole, then its confirms are
//! awaited together.
//!
//! | broker answer | outcome |
//! |---|---|
//! | `basic.ack` | done |
//! | `basic.return` then `basic.ack` (no queue bound for the routing key) | [`SinkError::Rejected`], with the reply code and text |
//! | `basic.nack` (the broker could not take it) | [`SinkError::Retry`] |
//! | no connection, a closed channel, no confirm within 10 s | [`SinkError::Unavailable`]; the connection is dropped and made anew on the next write |
//!
//! All worker slots share one connection and one confirm channel (lapin
//! multiplexes them); a failed one is replaced by the first write after.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};

use super::config::AmqpSinkConfig;
use super::{Endpoint, RoutingKey, describe_error, header_table};
use crate::connect::{Sink, SinkError};
use crate::plugin::Message;

/// How long the broker may take to confirm a publish: past it, the broker
/// is taken for unreachable (held, no attempt spent). Under the stage's
/// default `timeout` (30 s).
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// The header every published message carries its Sluice id in.
pub const SLUICE_ID_HEADER: &str = "sluice-id";

/// Publishes to one exchange.
pub struct AmqpSink {
    endpoint: Endpoint,
    exchange: String,
    routing_key: RoutingKey,
    live: Mutex<Option<Live>>,
    /// Held while connecting, so slots do not open a connection each.
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Live {
    connection: Arc<Connection>,
    channel: Channel,
}

/// A message ready to publish: its routing key and properties, or why it
/// cannot be published at all.
type Prepared = Result<(ShortString, BasicProperties), SinkError>;

impl AmqpSink {
    /// The sink of `config`, not connected.
    pub(crate) fn new(config: &AmqpSinkConfig, label: &str) -> Result<Self, String> {
        Ok(AmqpSink {
            endpoint: Endpoint::new(&config.connection, config.tls.files(), label)?,
            exchange: config.exchange.clone(),
            routing_key: RoutingKey::parse(&config.routing_key)?,
            live: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    fn current(&self) -> Option<Live> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The shared confirm channel, connecting first if there is none.
    async fn channel(&self) -> Result<Live, SinkError> {
        if let Some(live) = self.current().filter(|l| l.channel.status().connected()) {
            return Ok(live);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(live) = self.current().filter(|l| l.channel.status().connected()) {
            return Ok(live);
        }
        self.forget();
        let connection = self.endpoint.connect().await.map_err(|e| {
            SinkError::Unavailable(format!("amqp exchange `{}`: {e}", self.exchange))
        })?;
        let channel = match connection.create_channel().await {
            Ok(channel) => channel,
            Err(e) => return Err(self.unavailable("cannot open a channel", &e)),
        };
        if let Err(e) = channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
        {
            return Err(self.unavailable("cannot turn on publisher confirms", &e));
        }
        let live = Live {
            connection: Arc::new(connection),
            channel,
        };
        *self.live.lock().unwrap_or_else(PoisonError::into_inner) = Some(live.clone());
        Ok(live)
    }

    /// Drops the connection: the next write makes a new one.
    fn forget(&self) {
        let old = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(old) = old {
            tokio::spawn(async move {
                let _ = tokio::time::timeout(
                    Duration::from_secs(2),
                    old.connection.close(200, "sluice sink reconnects".into()),
                )
                .await;
            });
        }
    }

    fn unavailable(&self, what: &str, err: &lapin::Error) -> SinkError {
        self.forget();
        SinkError::Unavailable(format!(
            "amqp exchange `{}` at {}: {what}: {}",
            self.exchange,
            self.endpoint.url,
            self.endpoint.url.scrub(&describe_error(err))
        ))
    }

    /// The routing key and properties of `message`.
    fn prepare(&self, message: &Message) -> Prepared {
        let routing_key = self
            .routing_key
            .render(message.key.as_deref())
            .map_err(SinkError::Rejected)?;
        let id = ShortString::try_new(message.id.as_str()).map_err(|e| {
            SinkError::Rejected(format!("the message id is too long for `message-id`: {e}"))
        })?;
        let mut headers = header_table(
            message
                .headers
                .iter()
                .filter(|(name, _)| name != SLUICE_ID_HEADER)
                .map(|(n, v)| (n.as_str(), v.as_str())),
        )
        .map_err(SinkError::Rejected)?;
        headers.insert(
            SLUICE_ID_HEADER.into(),
            AMQPValue::LongString(LongString::from(message.id.as_str())),
        );
        let properties = BasicProperties::default()
            .with_message_id(id)
            .with_delivery_mode(2)
            .with_headers(headers);
        Ok((routing_key, properties))
    }

    /// Publishes every prepared message, then awaits their confirms.
    async fn publish(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        let prepared: Vec<Prepared> = messages.iter().map(|m| self.prepare(m)).collect();
        if prepared.iter().all(Result::is_err) {
            return prepared.into_iter().map(|p| p.map(drop)).collect();
        }
        let live = match self.channel().await {
            Ok(live) => live,
            Err(e) => return messages.iter().map(|_| Err(e.clone())).collect(),
        };
        // Publish all: each publish only sends its frames; the confirms
        // come back in any order and are awaited below.
        let mut pending: Vec<Result<PublisherConfirm, SinkError>> =
            Vec::with_capacity(messages.len());
        let mut broken = None;
        for (message, prepared) in messages.iter().zip(prepared) {
            let (routing_key, properties) = match prepared {
                Ok(p) => p,
                Err(e) => {
                    pending.push(Err(e));
                    continue;
                }
            };
            if let Some(e) = &broken {
                pending.push(Err(SinkError::clone(e)));
                continue;
            }
            let published = live
                .channel
                .basic_publish(
                    self.exchange.as_str().into(),
                    routing_key,
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &message.payload,
                    properties,
                )
                .await;
            match published {
                Ok(confirm) => pending.push(Ok(confirm)),
                Err(e) => {
                    let error = self.unavailable("cannot publish", &e);
                    broken = Some(error.clone());
                    pending.push(Err(error));
                }
            }
        }
        let waits = pending.into_iter().map(|p| async move {
            let confirm = p?;
            match tokio::time::timeout(CONFIRM_TIMEOUT, confirm).await {
                Ok(Ok(confirmation)) => self.outcome(confirmation),
                Ok(Err(e)) => Err(self.unavailable("no publisher confirm", &e)),
                Err(_) => {
                    self.forget();
                    Err(SinkError::Unavailable(format!(
                        "amqp exchange `{}` at {}: no publisher confirm within {}s",
                        self.exchange,
                        self.endpoint.url,
                        CONFIRM_TIMEOUT.as_secs()
                    )))
                }
            }
        });
        futures_util::future::join_all(waits).await
    }

    /// What the broker's confirm means for its message.
    fn outcome(&self, confirmation: Confirmation) -> Result<(), SinkError> {
        match confirmation {
            Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(SinkError::Rejected(format!(
                "amqp exchange `{}`: unroutable, returned by the broker: {} {} (routing key \
                 `{}`: no queue is bound for it)",
                self.exchange,
                returned.reply_code,
                returned.reply_text,
                returned.delivery.routing_key
            ))),
            Confirmation::Nack(returned) => Err(SinkError::Retry {
                reason: format!(
                    "amqp exchange `{}`: the broker refused the message (basic.nack){}",
                    self.exchange,
                    returned
                        .map(|r| format!(": {} {}", r.reply_code, r.reply_text))
                        .unwrap_or_default()
                ),
                after: None,
            }),
        }
    }
}

#[async_trait]
impl Sink for AmqpSink {
    async fn write(&self, message: &Message) -> Result<(), SinkError> {
        self.publish(std::slice::from_ref(message))
            .await
            .pop()
            .unwrap_or(Err(SinkError::Retry {
                reason: "no result".into(),
                after: None,
            }))
    }

    async fn write_batch(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        self.publish(messages).await
    }
}
