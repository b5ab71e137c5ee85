//! [`ClaimingBroker`]: the claim check as a [`Broker`] decorator.
//!
//! Everything that publishes goes through a `Broker`: the ingest API and
//! `sluice publish` call `publish`, the engine calls `complete` with a
//! handler's emits (and its dedup ticket, so a COMPLETED record keeps the
//! references) and `dead_letter` with a DLQ entry, and a redrive calls
//! `publish`. Wrapping the broker once covers all of them, and neither the
//! engine nor the admin API needs to know about stores.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{ClaimError, Claims};
use crate::broker::{
    Broker, BrokerError, Completion, ConsumerSpec, ConsumerStats, Delivery, Message, PublishAck,
    Receipt, Stored, TopicSpec, TopicStats,
};
use crate::dedup::DedupStore;

/// A broker whose publishes offload large payloads first: each message
/// above its topic's threshold is written to the claim store (durably),
/// then passed on with an empty body and the reference headers. Reads and
/// deliveries pass through unchanged (references stay references; the
/// engine resolves them before a handler runs).
pub struct ClaimingBroker {
    inner: Arc<dyn Broker>,
    claims: Arc<Claims>,
}

impl ClaimingBroker {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Broker>, claims: Arc<Claims>) -> Self {
        ClaimingBroker { inner, claims }
    }

    /// The claim checks it applies.
    pub fn claims(&self) -> &Arc<Claims> {
        &self.claims
    }

    async fn offload_all(&self, messages: Vec<Message>) -> Result<Vec<Message>, BrokerError> {
        let mut out = Vec::with_capacity(messages.len());
        for message in messages {
            out.push(self.claims.offload(message).await.map_err(to_broker)?);
        }
        Ok(out)
    }
}

/// A claim error as the broker error its callers already handle: too large
/// is the producer's fault (413), a store failure is "try again later".
fn to_broker(err: ClaimError) -> BrokerError {
    match err {
        ClaimError::TooLarge { .. } => BrokerError::PayloadTooLarge(err.to_string()),
        ClaimError::Missing(_) | ClaimError::Store(_) => BrokerError::Unavailable(err.to_string()),
    }
}

#[async_trait]
impl Broker for ClaimingBroker {
    async fn ensure_topic(&self, spec: &TopicSpec) -> Result<(), BrokerError> {
        self.inner.ensure_topic(spec).await
    }

    async fn ensure_consumer(&self, spec: &ConsumerSpec) -> Result<(), BrokerError> {
        self.inner.ensure_consumer(spec).await
    }

    async fn publish(&self, messages: Vec<Message>) -> Result<Vec<PublishAck>, BrokerError> {
        let messages = self.offload_all(messages).await?;
        self.inner.publish(messages).await
    }

    async fn fetch_within(
        &self,
        consumer: &str,
        max: usize,
        max_bytes: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        self.inner
            .fetch_within(consumer, max, max_bytes, wait)
            .await
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        self.inner.ack(receipt).await
    }

    async fn complete(&self, completion: &Completion) -> Result<(), BrokerError> {
        // Offloaded here, with or without a dedup ticket: a COMPLETED
        // record then keeps the references, not the payloads.
        let offloaded = Completion {
            receipt: completion.receipt.clone(),
            outputs: self.offload_all(completion.outputs.clone()).await?,
            ticket: completion.ticket.clone(),
        };
        self.inner.complete(&offloaded).await
    }

    async fn nak(&self, receipt: &Receipt, delay: Duration) -> Result<(), BrokerError> {
        self.inner.nak(receipt, delay).await
    }

    async fn in_progress(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        self.inner.in_progress(receipt).await
    }

    async fn term(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        self.inner.term(receipt).await
    }

    async fn dead_letter(&self, receipt: &Receipt, entry: Message) -> Result<(), BrokerError> {
        let entry = self.claims.offload(entry).await.map_err(to_broker)?;
        self.inner.dead_letter(receipt, entry).await
    }

    async fn consumer_stats(&self, consumer: &str) -> Result<ConsumerStats, BrokerError> {
        self.inner.consumer_stats(consumer).await
    }

    async fn topic_stats(&self, topic: &str) -> Result<TopicStats, BrokerError> {
        self.inner.topic_stats(topic).await
    }

    async fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Stored>, BrokerError> {
        self.inner.read(topic, from, max, wait).await
    }

    async fn remove(&self, topic: &str, seqs: &[u64]) -> Result<u64, BrokerError> {
        self.inner.remove(topic, seqs).await
    }

    fn dedup_store(self: Arc<Self>) -> Option<Arc<dyn DedupStore>> {
        // Completions, the only writes that carry outputs, go through
        // `complete` above.
        self.inner.clone().dedup_store()
    }

    async fn flush(&self) -> Result<(), BrokerError> {
        self.inner.flush().await
    }

    fn readiness(&self) -> crate::broker::Readiness {
        self.inner.readiness()
    }

    fn storage_errors(&self) -> u64 {
        self.inner.storage_errors()
    }
}
