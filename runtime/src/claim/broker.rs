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
        self.check_delays(&messages)?;
        let mut out = Vec::with_capacity(messages.len());
        for message in messages {
            out.push(self.claims.offload(message).await.map_err(to_broker)?);
        }
        Ok(out)
    }
}

impl ClaimingBroker {
    /// Refuses a delayed message whose payload would be offloaded to a
    /// `file://` store for longer than the store keeps objects: the
    /// sweeper finds references in stored messages only, not in delayed
    /// ones, so the object could be deleted before the message is due.
    fn check_delays(&self, messages: &[Message]) -> Result<(), BrokerError> {
        let now = crate::broker::now_millis();
        for m in messages {
            let Some(policy) = self.claims.policy(&m.topic) else {
                continue;
            };
            if m.payload.len() as u64 <= policy.threshold {
                continue;
            }
            let due = crate::delay::due_in(&m.headers, now).map_err(BrokerError::BadMessage)?;
            if let Some(due) = due
                && Duration::from_millis(due - now) >= policy.retention
            {
                return Err(BrokerError::BadMessage(format!(
                    "message `{}` to `{}` is delayed past its claim store's retention of {}: its payload could be swept before it is due; raise the claim_check's retention",
                    m.id,
                    m.topic,
                    humantime::format_duration(policy.retention)
                )));
            }
        }
        Ok(())
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
            state: completion.state.clone(),
        };
        self.inner.complete(&offloaded).await
    }

    async fn complete_all(&self, completions: &[Completion]) -> Vec<Result<(), BrokerError>> {
        // Each offloaded on its own (one that cannot be fails alone), then
        // the rest completed together.
        let mut results: Vec<Result<(), BrokerError>> = Vec::with_capacity(completions.len());
        let mut offloaded = Vec::with_capacity(completions.len());
        for completion in completions {
            match self.offload_all(completion.outputs.clone()).await {
                Ok(outputs) => {
                    results.push(Ok(()));
                    offloaded.push(Completion {
                        receipt: completion.receipt.clone(),
                        outputs,
                        ticket: completion.ticket.clone(),
                        state: completion.state.clone(),
                    });
                }
                Err(e) => results.push(Err(e)),
            }
        }
        let mut done = self.inner.complete_all(&offloaded).await.into_iter();
        for result in &mut results {
            if result.is_ok() {
                *result = done.next().unwrap_or_else(|| {
                    Err(BrokerError::Unavailable(
                        "no result for a completion".into(),
                    ))
                });
            }
        }
        results
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

    async fn set_paused(&self, consumer: &str, paused: bool) -> Result<(), BrokerError> {
        self.inner.set_paused(consumer, paused).await
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

    async fn flush(&self) -> Result<(), BrokerError> {
        self.inner.flush().await
    }

    fn readiness(&self) -> crate::broker::Readiness {
        self.inner.readiness()
    }

    fn storage_errors(&self) -> u64 {
        self.inner.storage_errors()
    }

    fn shared_rates(&self) -> Option<Arc<dyn crate::broker::rates::SharedRates>> {
        self.inner.shared_rates()
    }

    fn shared_versions(&self) -> Option<Arc<dyn crate::broker::versions::SharedVersions>> {
        self.inner.shared_versions()
    }

    fn store_memory(&self) -> crate::broker::StoreMemory {
        self.inner.store_memory()
    }

    fn state(&self) -> Option<Arc<dyn crate::state::StateReader>> {
        self.inner.state()
    }

    async fn delete_state(&self, store: &str, key: &str) -> Result<bool, BrokerError> {
        self.inner.delete_state(store, key).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use bytes::Bytes;

    use super::*;
    use crate::broker::embedded::{EmbeddedBroker, EmbeddedOptions, SyncMode};
    use crate::claim::is_reference;
    use crate::config::{ClaimCheck, HumanDuration, HumanSize};
    use crate::dedup::{Begin, BeginRequest, key_digest};

    const LONG: Duration = Duration::from_secs(60);

    /// A deduplicated completion through the claim check offloads its
    /// outputs like any other: the topic holds the reference, which
    /// resolves to the payload, and the key is recorded COMPLETED.
    #[tokio::test]
    async fn a_deduplicated_completion_offloads_its_outputs() {
        let dir = tempfile::tempdir().expect("dir");
        let inner = EmbeddedBroker::open(EmbeddedOptions::new(dir.path()).sync(SyncMode::Always))
            .expect("open broker");
        // The daemon hands the stage this store, the inner broker's.
        let inner_store: Arc<dyn crate::dedup::DedupStore> = inner.clone();
        let check = ClaimCheck {
            store: "memory://t".into(),
            threshold: HumanSize(16),
            retention: HumanDuration::secs(60),
            max_payload: HumanSize(1024),
            region: None,
            endpoint: None,
            allow_http: false,
        };
        let claims = Arc::new(Claims::new(vec![("big".into(), check)]).expect("claims"));
        let broker = Arc::new(ClaimingBroker::new(inner, claims.clone()));
        for name in ["in", "big"] {
            broker
                .ensure_topic(&TopicSpec::new(name))
                .await
                .expect("topic");
        }
        let consumer = ConsumerSpec {
            name: "p.s".into(),
            topic: "in".into(),
            filter: BTreeMap::new(),
            ack_wait: LONG,
            max_ack_pending: None,
            max_deliver: None,
        };
        broker.ensure_consumer(&consumer).await.expect("consumer");
        broker
            .publish(vec![Message::new("m1", "in", &b"x"[..])])
            .await
            .expect("publish");
        let delivery = broker.fetch("p.s", 1, LONG).await.expect("fetch").remove(0);
        let store = inner_store;
        let request = BeginRequest {
            scope: "p.s".into(),
            key: "k".into(),
            digest: key_digest("k"),
            hash: None,
            lease: LONG,
            ttl: LONG * 10,
        };
        let Begin::Run(ticket) = store.begin(request.clone()).await.expect("begin") else {
            panic!("a new key is taken")
        };
        let payload = Bytes::from(vec![7u8; 100]);
        broker
            .complete(&Completion {
                receipt: delivery.receipt.clone(),
                outputs: vec![Message::new("o1", "big", payload.clone())],
                ticket: Some(ticket),
                state: None,
            })
            .await
            .expect("complete");

        let stored = broker
            .read("big", 0, 10, Duration::ZERO)
            .await
            .expect("read");
        assert_eq!(stored.len(), 1);
        let output = &stored[0].message;
        assert!(is_reference(output), "{output:?}");
        assert!(output.payload.is_empty(), "no payload in the broker");
        assert_eq!(
            claims.resolve(output).await.expect("resolves"),
            Some(payload)
        );
        // The key went COMPLETED with it.
        assert!(matches!(
            store.begin(request).await.expect("begin"),
            Begin::Done { .. }
        ));
    }
}
