//! The Kafka sink: the idempotent producer (`enable.idempotence=true`,
//! `acks=all`), one delivery report awaited per write.
//!
//! Each message is produced to `topic` with its key as the partition key,
//! its headers, and `sluice-id` (the Sluice message id) as one more
//! header. A write returns only once its delivery report says the
//! brokers' in-sync replicas have it; a batch sends every message first,
//! then awaits every report.
//!
//! The idempotent producer drops the repeats of its own internal retries
//! (one producer session); a write the stage retries (a crash between
//! the delivery and the stage's ack, a timeout) is produced again: the
//! copies carry the same `sluice-id`.
//!
//! Errors: a message the brokers refuse for good (too large, invalid,
//! corrupt) -> [`SinkError::Rejected`]; the brokers cannot be reached, the
//! delivery timed out, the topic is unknown or not authorised ->
//! [`SinkError::Unavailable`]; anything else (not enough replicas, a
//! leader moving, the local queue full) -> [`SinkError::Retry`]. A fatal
//! producer error (the idempotence guarantee broken) makes a new producer.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use rdkafka::ClientConfig;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

use super::config::{KafkaSinkConfig, Sasl};
use super::diagnosis::{Diagnosis, Role};
use super::{client_config, is_outage, scrub};
use crate::connect::{Sink, SinkError};
use crate::plugin::Message;

/// The header that carries the Sluice message id.
pub const ID_HEADER: &str = "sluice-id";

/// The producer's context: librdkafka's log lines go to `tracing`, and
/// its connection troubles to the sink's [`Diagnosis`].
struct ProducerContext {
    sasl: Option<Sasl>,
    diagnosis: Arc<Diagnosis>,
}

impl ClientContext for ProducerContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        let text = scrub(self.sasl.as_ref(), log_message);
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => tracing::debug!(facility = fac, "librdkafka: {text}"),
            _ => tracing::trace!(facility = fac, "librdkafka: {text}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let text = scrub(self.sasl.as_ref(), &format!("{error}: {reason}"));
        tracing::debug!("librdkafka producer error: {text}");
        self.diagnosis.note(&error, reason);
    }
}

type Producer_ = FutureProducer<ProducerContext>;

/// Writes messages to a Kafka topic.
pub struct KafkaSink {
    config: ClientConfig,
    producer: RwLock<Arc<Producer_>>,
    topic: String,
    sasl: Option<Sasl>,
    describe: String,
    /// Why the brokers refuse the producer (TLS, password, ACLs): a
    /// delivery that times out says this rather than "timed out".
    diagnosis: Arc<Diagnosis>,
}

impl KafkaSink {
    /// The sink of `config`: the producer is made (it connects by itself,
    /// when the first message goes).
    pub(crate) fn new(config: &KafkaSinkConfig) -> Result<Self, String> {
        let mut client = client_config(&config.connection, config.tls.files())?;
        client
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set(
                "message.timeout.ms",
                config.delivery_timeout.get().as_millis().to_string(),
            )
            .set("linger.ms", config.linger.get().as_millis().to_string())
            .set("message.max.bytes", config.max_message_bytes.to_string())
            .set("queue.buffering.max.messages", "100000");
        let describe = format!("kafka topic `{}`", config.topic);
        let diagnosis = Arc::new(Diagnosis::new(
            Role::Producer,
            describe.clone(),
            config.connection.sasl.clone(),
        ));
        let producer = make(&client, config.connection.sasl.as_ref(), &diagnosis)?;
        Ok(KafkaSink {
            config: client,
            producer: RwLock::new(Arc::new(producer)),
            topic: config.topic.clone(),
            sasl: config.connection.sasl.clone(),
            describe,
            diagnosis,
        })
    }

    fn producer(&self) -> Arc<Producer_> {
        self.producer
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Queues `message` for sending; the future resolves with its delivery
    /// report.
    fn send(&self, producer: &Producer_, message: &Message) -> Result<DeliveryFuture, SinkError> {
        let mut headers = OwnedHeaders::new_with_capacity(message.headers.len() + 1);
        // A `sluice-id` that came with the message (from an upstream
        // Sluice) is replaced by this message's own.
        for (name, value) in message.headers.iter().filter(|(n, _)| n != ID_HEADER) {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        headers = headers.insert(Header {
            key: ID_HEADER,
            value: Some(message.id.as_bytes()),
        });
        let mut record: FutureRecord<'_, str, [u8]> = FutureRecord::to(&self.topic)
            .payload(&message.payload[..])
            .headers(headers);
        if let Some(key) = &message.key {
            record = record.key(key.as_str());
        }
        producer
            .send_result(record)
            .map_err(|(err, _)| self.classify(&err))
    }

    /// Awaits a delivery report.
    async fn delivered(&self, future: DeliveryFuture) -> Result<(), SinkError> {
        match future.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((err, _))) => Err(self.classify(&err)),
            Err(_) => Err(SinkError::Unavailable(format!(
                "{}: the producer went away before the delivery report",
                self.describe
            ))),
        }
    }

    /// The outcome of `err`; a fatal producer error also replaces the
    /// producer.
    fn classify(&self, err: &KafkaError) -> SinkError {
        let text = scrub(self.sasl.as_ref(), &format!("{}: {err}", self.describe));
        let producer = self.producer();
        if let Some((_, reason)) = producer.client().fatal_error() {
            let reason = scrub(self.sasl.as_ref(), &reason);
            tracing::warn!(sink = %self.describe, reason = %reason, "the producer hit a fatal error; making a new one");
            if let Ok(fresh) = make(&self.config, self.sasl.as_ref(), &self.diagnosis) {
                let mut slot = self
                    .producer
                    .write()
                    .unwrap_or_else(PoisonError::into_inner);
                if Arc::ptr_eq(&slot, &producer) {
                    *slot = Arc::new(fresh);
                }
            }
            return SinkError::Unavailable(format!("{text} (fatal: {reason}; producer renewed)"));
        }
        let Some(code) = err.rdkafka_error_code() else {
            return SinkError::Retry {
                reason: text,
                after: None,
            };
        };
        // A refusal (TLS, password, ACL) is said as what to fix, also
        // when it shows only as a delivery that timed out.
        let said = match self.diagnosis.note_code(code, &err.to_string()) {
            Some(_) => self.diagnosis.specific(),
            None => None,
        };
        match said {
            Some(said) => SinkError::Unavailable(format!("{}: {said}", self.describe)),
            None => outcome(code, text),
        }
    }
}

/// The outcome of a produce error with `code`.
fn outcome(code: RDKafkaErrorCode, text: String) -> SinkError {
    use RDKafkaErrorCode as C;
    match code {
        C::MessageSizeTooLarge
        | C::InvalidMessage
        | C::InvalidMessageSize
        | C::MessageBatchTooLarge
        | C::BadMessage
        | C::InvalidRecord
        | C::InvalidTimestamp => SinkError::Rejected(text),
        C::QueueFull => SinkError::Retry {
            reason: text,
            after: Some(Duration::from_millis(100)),
        },
        code if is_outage(code) => SinkError::Unavailable(text),
        _ => SinkError::Retry {
            reason: text,
            after: None,
        },
    }
}

fn make(
    config: &ClientConfig,
    sasl: Option<&Sasl>,
    diagnosis: &Arc<Diagnosis>,
) -> Result<Producer_, String> {
    config
        .create_with_context(ProducerContext {
            sasl: sasl.cloned(),
            diagnosis: diagnosis.clone(),
        })
        .map_err(|e| scrub(sasl, &format!("cannot make the producer: {e}")))
}

#[async_trait]
impl Sink for KafkaSink {
    async fn write(&self, message: &Message) -> Result<(), SinkError> {
        let producer = self.producer();
        let future = self.send(&producer, message)?;
        self.delivered(future).await?;
        self.diagnosis.clear();
        Ok(())
    }

    async fn write_batch(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        let producer = self.producer();
        // Send all, then await all: one linger fills the brokers' batches.
        let sent: Vec<Result<DeliveryFuture, SinkError>> =
            messages.iter().map(|m| self.send(&producer, m)).collect();
        let results = join_all(sent.into_iter().map(|s| async move {
            match s {
                Ok(future) => self.delivered(future).await,
                Err(e) => Err(e),
            }
        }))
        .await;
        if results.iter().any(Result::is_ok) {
            self.diagnosis.clear();
        }
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn produce_errors_map_onto_outcomes() {
        let t = || "x".to_owned();
        assert!(matches!(
            outcome(RDKafkaErrorCode::MessageSizeTooLarge, t()),
            SinkError::Rejected(_)
        ));
        assert!(matches!(
            outcome(RDKafkaErrorCode::MessageTimedOut, t()),
            SinkError::Unavailable(_)
        ));
        assert!(matches!(
            outcome(RDKafkaErrorCode::AllBrokersDown, t()),
            SinkError::Unavailable(_)
        ));
        assert!(matches!(
            outcome(RDKafkaErrorCode::NotEnoughReplicas, t()),
            SinkError::Retry { .. }
        ));
        assert!(matches!(
            outcome(RDKafkaErrorCode::QueueFull, t()),
            SinkError::Retry { after: Some(_), .. }
        ));
    }
}
