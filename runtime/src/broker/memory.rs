//! An in-memory [`Broker`] for the engine's unit tests: the trait's
//! semantics (leases, redelivery, the duplicate window, atomic completes)
//! without a store, so a test of intake, attempt and settle runs in
//! milliseconds and can move time.
//!
//! Time is tokio's clock plus a skew the test adds ([`MemoryBroker::skew`]),
//! so a test under `start_paused` sees leases expire exactly when it says,
//! never because the machine was slow. Messages are kept until removed (no
//! retention): a test reads every output and dead letter back. What a test
//! asserts on besides topics is recorded: every nak with its delay, and
//! every answer (ack, complete, nak, term, dead letter) that lost its
//! lease.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{
    Broker, BrokerError, Completion, ConsumerSpec, ConsumerStats, Delivery, Message, PublishAck,
    Receipt, Stored, TopicSpec, TopicStats,
};

/// The broker. See the module docs.
pub struct MemoryBroker {
    state: Mutex<State>,
    /// Woken by every publish and release, for waiting fetches and reads.
    changed: Notify,
    start: Instant,
    /// Milliseconds added to tokio's clock ([`MemoryBroker::skew`]).
    skew_ms: AtomicU64,
    /// A payload larger than this is refused as too large (None: any).
    max_payload: Option<usize>,
}

#[derive(Default)]
struct State {
    topics: HashMap<String, Topic>,
    consumers: HashMap<String, Consumer>,
    /// (seq, delay) of every nak, in order.
    naks: Vec<(u64, Duration)>,
    /// Receipts whose answer or extension was refused as stale.
    lost: Vec<Receipt>,
}

#[derive(Default)]
struct Topic {
    messages: BTreeMap<u64, Message>,
    last_seq: u64,
    /// Every id ever stored, and its seq: a window that never closes.
    ids: HashMap<String, u64>,
}

struct Consumer {
    spec: ConsumerSpec,
    /// The next seq to deliver for the first time.
    cursor: u64,
    pending: BTreeMap<u64, Entry>,
    paused: bool,
}

struct Entry {
    attempt: u32,
    /// When the lease ends (leased) or the redelivery is due (not leased).
    due: u64,
    leased: bool,
}

impl Default for MemoryBroker {
    fn default() -> Self {
        MemoryBroker::new()
    }
}

impl MemoryBroker {
    /// An empty broker.
    pub fn new() -> MemoryBroker {
        MemoryBroker {
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            start: Instant::now(),
            skew_ms: AtomicU64::new(0),
            max_payload: None,
        }
    }

    /// Refuses payloads larger than `bytes` (`PayloadTooLarge`), as a
    /// topic with a claim check's `max_payload` would.
    #[must_use]
    pub fn with_max_payload(mut self, bytes: usize) -> MemoryBroker {
        self.max_payload = Some(bytes);
        self
    }

    /// Moves the broker's clock forward by `by`, on top of tokio's: leases
    /// and nak delays that end within it are over.
    pub fn skew(&self, by: Duration) {
        self.skew_ms.fetch_add(millis(by), Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Every message stored in `topic`, in order.
    pub fn messages(&self, topic: &str) -> Vec<Message> {
        self.lock()
            .topics
            .get(topic)
            .map(|t| t.messages.values().cloned().collect())
            .unwrap_or_default()
    }

    /// (seq, delay) of every nak so far, in order.
    pub fn naks(&self) -> Vec<(u64, Duration)> {
        self.lock().naks.clone()
    }

    /// The receipts whose answer (ack, complete, nak, term, dead letter) or
    /// lease extension was refused as stale.
    pub fn lost(&self) -> Vec<Receipt> {
        self.lock().lost.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now(&self) -> u64 {
        millis(self.start.elapsed()) + self.skew_ms.load(Ordering::SeqCst)
    }

    /// Takes what is due for `consumer`: redeliveries first, then new
    /// messages past its cursor.
    fn take(
        &self,
        consumer: &str,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Delivery>, BrokerError> {
        let now = self.now();
        let mut guard = self.lock();
        let State {
            topics, consumers, ..
        } = &mut *guard;
        let c = consumers
            .get_mut(consumer)
            .ok_or_else(|| BrokerError::UnknownConsumer(consumer.into()))?;
        if c.paused {
            return Ok(Vec::new());
        }
        let topic = topics
            .get(&c.spec.topic)
            .ok_or_else(|| BrokerError::UnknownTopic(c.spec.topic.clone()))?;
        let ack_wait = millis(c.spec.ack_wait);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut fits = |message: &Message, out: &Vec<Delivery>| {
            let size = message.size();
            let ok = out.len() < max && (out.is_empty() || bytes + size <= max_bytes);
            if ok {
                bytes += size;
            }
            ok
        };
        let due: Vec<u64> = c
            .pending
            .iter()
            .filter(|(_, e)| e.due <= now)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            let Some(message) = topic.messages.get(&seq) else {
                c.pending.remove(&seq);
                continue;
            };
            if !fits(message, &out) {
                return Ok(out);
            }
            let entry = c.pending.get_mut(&seq).expect("due entry");
            entry.attempt += 1;
            entry.due = now + ack_wait;
            entry.leased = true;
            out.push(delivery(consumer, seq, entry.attempt, message));
        }
        let in_flight = |c: &Consumer| c.pending.values().filter(|e| e.leased).count();
        while let Some((&seq, message)) = topic.messages.range(c.cursor..).next() {
            if c.spec
                .max_ack_pending
                .is_some_and(|limit| in_flight(c) >= limit as usize)
            {
                break;
            }
            if !c.spec.accepts(message) {
                c.cursor = seq + 1;
                continue;
            }
            if !fits(message, &out) {
                break;
            }
            c.cursor = seq + 1;
            c.pending.insert(
                seq,
                Entry {
                    attempt: 1,
                    due: now + ack_wait,
                    leased: true,
                },
            );
            out.push(delivery(consumer, seq, 1, message));
        }
        Ok(out)
    }

    /// Checks a receipt against its lease; on success runs `then` on the
    /// state with the entry removed (ack, complete, term, dead letter) or
    /// kept (`keep`: a nak or an extension).
    fn with_lease<T>(
        &self,
        receipt: &Receipt,
        keep: bool,
        then: impl FnOnce(&mut State, &mut Entry) -> Result<T, BrokerError>,
    ) -> Result<T, BrokerError> {
        let mut state = self.lock();
        let Some(c) = state.consumers.get_mut(&*receipt.consumer) else {
            return Err(BrokerError::UnknownConsumer(receipt.consumer.to_string()));
        };
        let valid = c
            .pending
            .get(&receipt.seq)
            .is_some_and(|e| e.leased && e.attempt == receipt.attempt);
        if !valid {
            state.lost.push(receipt.clone());
            return Err(BrokerError::LeaseLost(format!(
                "{} seq {} attempt {}",
                receipt.consumer, receipt.seq, receipt.attempt
            )));
        }
        let mut entry = c.pending.remove(&receipt.seq).expect("checked");
        let result = then(&mut state, &mut entry);
        if (keep || result.is_err())
            && let Some(c) = state.consumers.get_mut(&*receipt.consumer)
        {
            c.pending.insert(receipt.seq, entry);
        }
        drop(state);
        self.changed.notify_waiters();
        result
    }

    /// Stores `messages` in one step: all or (on an error) none.
    fn store(
        &self,
        state: &mut State,
        messages: &[Message],
    ) -> Result<Vec<PublishAck>, BrokerError> {
        for m in messages {
            if !state.topics.contains_key(&m.topic) {
                return Err(BrokerError::UnknownTopic(m.topic.clone()));
            }
            if let Some(limit) = self.max_payload
                && m.payload.len() > limit
            {
                return Err(BrokerError::PayloadTooLarge(format!(
                    "a payload of {} bytes is over the topic's limit of {limit}",
                    m.payload.len()
                )));
            }
        }
        let now = self.now();
        let mut acks = Vec::with_capacity(messages.len());
        for m in messages {
            let topic = state.topics.get_mut(&m.topic).expect("checked");
            if let Some(&seq) = topic.ids.get(&m.id) {
                acks.push(PublishAck {
                    seq,
                    duplicate: true,
                });
                continue;
            }
            topic.last_seq += 1;
            let seq = topic.last_seq;
            let mut stored = m.clone();
            if stored.published_at == 0 {
                stored.published_at = now;
            }
            topic.ids.insert(m.id.clone(), seq);
            topic.messages.insert(seq, stored);
            acks.push(PublishAck {
                seq,
                duplicate: false,
            });
        }
        Ok(acks)
    }
}

fn delivery(consumer: &str, seq: u64, attempt: u32, message: &Message) -> Delivery {
    Delivery {
        message: message.clone(),
        seq,
        attempt,
        receipt: Receipt {
            consumer: consumer.into(),
            seq,
            attempt,
            handle: String::new(),
        },
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[async_trait]
impl Broker for MemoryBroker {
    async fn ensure_topic(&self, spec: &TopicSpec) -> Result<(), BrokerError> {
        self.lock().topics.entry(spec.name.clone()).or_default();
        Ok(())
    }

    async fn ensure_consumer(&self, spec: &ConsumerSpec) -> Result<(), BrokerError> {
        let mut state = self.lock();
        if !state.topics.contains_key(&spec.topic) {
            return Err(BrokerError::UnknownTopic(spec.topic.clone()));
        }
        state
            .consumers
            .entry(spec.name.clone())
            .and_modify(|c| c.spec = spec.clone())
            .or_insert_with(|| Consumer {
                spec: spec.clone(),
                cursor: 0,
                pending: BTreeMap::new(),
                paused: false,
            });
        Ok(())
    }

    async fn publish(&self, messages: Vec<Message>) -> Result<Vec<PublishAck>, BrokerError> {
        let acks = {
            let mut state = self.lock();
            self.store(&mut state, &messages)?
        };
        self.changed.notify_waiters();
        Ok(acks)
    }

    async fn fetch_within(
        &self,
        consumer: &str,
        max: usize,
        max_bytes: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        let deadline = Instant::now() + wait;
        loop {
            let changed = self.changed.notified();
            let out = self.take(consumer, max, max_bytes)?;
            if !out.is_empty() || Instant::now() >= deadline {
                return Ok(out);
            }
            // A redelivery falls due without a wake-up: look again soon.
            let next = (Instant::now() + Duration::from_millis(10)).min(deadline);
            let _ = tokio::time::timeout_at(next, changed).await;
        }
    }

    async fn ack(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        self.with_lease(receipt, false, |_, _| Ok(()))
    }

    async fn complete(&self, completion: &Completion) -> Result<(), BrokerError> {
        assert!(
            completion.ticket.is_none(),
            "the memory broker keeps no dedup records"
        );
        assert!(
            completion.state.is_none(),
            "the memory broker keeps no handler state"
        );
        self.with_lease(&completion.receipt, false, |state, _| {
            self.store(state, &completion.outputs).map(drop)
        })
    }

    async fn nak(&self, receipt: &Receipt, delay: Duration) -> Result<(), BrokerError> {
        let due = self.now() + millis(delay);
        self.with_lease(receipt, true, |state, entry| {
            entry.leased = false;
            entry.due = due;
            state.naks.push((receipt.seq, delay));
            Ok(())
        })
    }

    async fn in_progress(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        let now = self.now();
        self.with_lease(receipt, true, |state, entry| {
            let ack_wait = state
                .consumers
                .get(&*receipt.consumer)
                .map_or(0, |c| millis(c.spec.ack_wait));
            entry.due = now + ack_wait;
            Ok(())
        })
    }

    async fn term(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        self.with_lease(receipt, false, |_, _| Ok(()))
    }

    async fn dead_letter(&self, receipt: &Receipt, entry: Message) -> Result<(), BrokerError> {
        self.with_lease(receipt, false, |state, _| {
            self.store(state, std::slice::from_ref(&entry)).map(drop)
        })
    }

    async fn set_paused(&self, consumer: &str, paused: bool) -> Result<(), BrokerError> {
        self.lock()
            .consumers
            .get_mut(consumer)
            .ok_or_else(|| BrokerError::UnknownConsumer(consumer.into()))?
            .paused = paused;
        self.changed.notify_waiters();
        Ok(())
    }

    async fn consumer_stats(&self, consumer: &str) -> Result<ConsumerStats, BrokerError> {
        let state = self.lock();
        let c = state
            .consumers
            .get(consumer)
            .ok_or_else(|| BrokerError::UnknownConsumer(consumer.into()))?;
        let waiting = state
            .topics
            .get(&c.spec.topic)
            .map_or(0, |t| t.messages.range(c.cursor..).count());
        let in_flight = c.pending.values().filter(|e| e.leased).count();
        let redeliveries = c.pending.len() - in_flight;
        Ok(ConsumerStats {
            pending: (waiting + redeliveries) as u64,
            in_flight: in_flight as u64,
            oldest_age: None,
            paused: c.paused,
        })
    }

    async fn topic_stats(&self, topic: &str) -> Result<TopicStats, BrokerError> {
        let state = self.lock();
        let t = state
            .topics
            .get(topic)
            .ok_or_else(|| BrokerError::UnknownTopic(topic.into()))?;
        Ok(TopicStats {
            depth: t.messages.len() as u64,
            first_seq: t.messages.keys().next().copied().unwrap_or(0),
            last_seq: t.last_seq,
            oldest_age: None,
            ..TopicStats::default()
        })
    }

    async fn read(
        &self,
        topic: &str,
        from: u64,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Stored>, BrokerError> {
        let deadline = Instant::now() + wait;
        loop {
            let changed = self.changed.notified();
            let out: Vec<Stored> = {
                let state = self.lock();
                let t = state
                    .topics
                    .get(topic)
                    .ok_or_else(|| BrokerError::UnknownTopic(topic.into()))?;
                t.messages
                    .range(from..)
                    .take(max)
                    .map(|(seq, message)| Stored {
                        seq: *seq,
                        message: message.clone(),
                    })
                    .collect()
            };
            if !out.is_empty() || Instant::now() >= deadline {
                return Ok(out);
            }
            let _ = tokio::time::timeout_at(deadline, changed).await;
        }
    }

    async fn remove(&self, topic: &str, seqs: &[u64]) -> Result<u64, BrokerError> {
        let mut state = self.lock();
        let t = state
            .topics
            .get_mut(topic)
            .ok_or_else(|| BrokerError::UnknownTopic(topic.into()))?;
        Ok(seqs
            .iter()
            .filter(|seq| t.messages.remove(seq).is_some())
            .count() as u64)
    }

    async fn flush(&self) -> Result<(), BrokerError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer(name: &str, topic: &str) -> ConsumerSpec {
        ConsumerSpec {
            name: name.into(),
            topic: topic.into(),
            filter: BTreeMap::new(),
            ack_wait: Duration::from_secs(30),
            max_ack_pending: None,
            max_deliver: None,
        }
    }

    async fn broker() -> MemoryBroker {
        let b = MemoryBroker::new();
        for t in ["in", "out"] {
            b.ensure_topic(&TopicSpec::new(t)).await.expect("topic");
        }
        b.ensure_consumer(&consumer("c", "in"))
            .await
            .expect("consumer");
        b
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_ends_after_ack_wait_and_the_old_receipt_is_stale() {
        let b = broker().await;
        b.publish(vec![Message::new("a", "in", "x")])
            .await
            .expect("publish");
        let first = b.fetch("c", 10, Duration::ZERO).await.expect("fetch");
        assert_eq!(first.len(), 1);
        assert!(
            b.fetch("c", 10, Duration::ZERO)
                .await
                .expect("fetch")
                .is_empty()
        );
        b.skew(Duration::from_secs(31));
        let again = b.fetch("c", 10, Duration::ZERO).await.expect("fetch");
        assert_eq!(again[0].attempt, 2);
        let done = Completion::new(&first[0].receipt, vec![Message::new("o", "out", "y")]);
        assert!(matches!(
            b.complete(&done).await,
            Err(BrokerError::LeaseLost(_))
        ));
        assert!(
            b.messages("out").is_empty(),
            "a stale complete publishes nothing"
        );
        let done = Completion::new(&again[0].receipt, vec![Message::new("o", "out", "y")]);
        b.complete(&done).await.expect("complete");
        assert_eq!(b.messages("out").len(), 1);
        assert_eq!(b.lost().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_nak_redelivers_after_its_delay_and_duplicates_are_dropped() {
        let b = broker().await;
        let acks = b
            .publish(vec![
                Message::new("a", "in", "x"),
                Message::new("a", "in", "x"),
            ])
            .await
            .expect("publish");
        assert!(acks[1].duplicate);
        let d = b.fetch("c", 10, Duration::ZERO).await.expect("fetch");
        b.nak(&d[0].receipt, Duration::from_secs(5))
            .await
            .expect("nak");
        assert!(
            b.fetch("c", 10, Duration::from_secs(4))
                .await
                .expect("fetch")
                .is_empty()
        );
        let again = b
            .fetch("c", 10, Duration::from_secs(2))
            .await
            .expect("fetch");
        assert_eq!((again.len(), again[0].attempt), (1, 2));
        assert_eq!(b.naks(), [(1, Duration::from_secs(5))]);
    }
}
