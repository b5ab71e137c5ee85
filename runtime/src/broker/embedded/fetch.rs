//! Deliveries (fetch), browsing (read) and consumer stats.
//!
//! A fetch first takes the redeliveries that are due (expired leases,
//! elapsed nak delays), then reads new messages past the cursor, skipping
//! those the filter rejects. The new attempts and the cursor are written
//! through the committer before anything is returned, so a delivery count
//! is never lower after a crash than what a handler saw: a redelivery
//! writes its pending record, and a first delivery is covered by the
//! cursor having moved past it (`store::Position`). Reads run on the
//! calling task: they are served from fjall's memtables and block cache.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::EmbeddedBroker;
use super::commit::op::Op;
use super::consumer::{Consumer, Pending};
use super::store::{MessageRecord, PendingRecord, decode_message, key_seq, msg_key, storage};
use super::topic::Topic;
use crate::broker::{BrokerError, ConsumerStats, Delivery, Message, Receipt, Stored, now_millis};

/// Most messages a fetch looks at (filter rejects included) before it
/// records its progress and returns.
const SCAN_LIMIT: usize = 10_000;

/// The deadline `wait` from now (far away for a huge `wait`).
fn deadline(wait: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365))
}

/// A stored record as a message of `topic`.
pub(super) fn message(topic: &Topic, rec: MessageRecord) -> Message {
    Message {
        id: rec.id,
        topic: topic.name.to_string(),
        key: rec.key,
        headers: rec.headers,
        payload: rec.payload,
        published_at: rec.published_at,
    }
}

impl EmbeddedBroker {
    /// [`crate::broker::Broker::fetch`] for a resolved consumer.
    pub(super) async fn fetch_for(
        &self,
        consumer: &Arc<Consumer>,
        max: usize,
        max_bytes: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let deadline = deadline(wait);
        loop {
            let published = consumer.topic.notify.notified();
            let freed = consumer.freed.notified();
            tokio::pin!(published, freed);
            published.as_mut().enable();
            freed.as_mut().enable();
            if consumer.state().paused {
                // Paused: nothing is delivered; a resume wakes `freed`.
                if Instant::now() >= deadline {
                    return Ok(Vec::new());
                }
                tokio::select! {
                    () = &mut freed => {}
                    () = tokio::time::sleep_until(deadline) => {}
                }
                continue;
            }
            let out = {
                let _one_fetch_at_a_time = consumer.fetch_lock.lock().await;
                self.fetch_once(consumer, max, max_bytes).await
            };
            // A read error (a damaged block) is counted and reported by
            // readiness until a fetch of the topic succeeds again.
            let health = &self.shared.health;
            let out = match out {
                Ok(out) => {
                    health.read_ok(&consumer.topic.name);
                    out
                }
                Err(e @ BrokerError::Storage(_)) => {
                    let at = consumer.state().cursor;
                    health.read_failed(&consumer.topic.name, Some(at), &e);
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if !out.is_empty() || now >= deadline {
                return Ok(out);
            }
            let mut until = deadline;
            if let Some(due) = consumer.next_due() {
                // Held back by max_ack_pending, the earliest timer may be a
                // nak'd entry that cannot be taken yet: poll slowly (a
                // completion wakes us anyway) rather than spin on it.
                let floor = if consumer.allowance() == 0 { 100 } else { 1 };
                let ms = due.saturating_sub(now_millis()).max(floor);
                until = until.min(now + Duration::from_millis(ms));
            }
            tokio::select! {
                () = &mut published => {}
                () = &mut freed => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// One pass: due redeliveries, then new messages, while they fit in
    /// `max_bytes` (the first one always).
    async fn fetch_once(
        &self,
        consumer: &Arc<Consumer>,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Delivery>, BrokerError> {
        let store = self.shared.store.get()?;
        let topic = &consumer.topic;
        let now = now_millis();
        let (redeliveries, allowance) = consumer.take_due(now, max, consumer.allowance());

        let mut deliveries = Vec::with_capacity(max.min(1024));
        let mut records: Vec<(u64, PendingRecord)> = Vec::new();
        let mut vanished = Vec::new();
        let mut bytes = 0usize;
        let mut over_budget = false;
        for (i, r) in redeliveries.iter().enumerate() {
            match store.message(topic.id, r.seq)? {
                Some(rec) => {
                    let d = delivery(consumer, topic, rec, r.seq, r.pending.attempt);
                    let size = d.message.size();
                    if !deliveries.is_empty() && bytes.saturating_add(size) > max_bytes {
                        // This one and the rest wait for the next fetch.
                        consumer.untake(&redeliveries[i..]);
                        over_budget = true;
                        break;
                    }
                    records.push((r.seq, r.pending.record()));
                    bytes = bytes.saturating_add(size);
                    deliveries.push(d);
                }
                None => vanished.push((r.seq, r.pending.attempt)),
            }
        }

        let want = if over_budget {
            0
        } else {
            (max - redeliveries.len()).min(usize::try_from(allowance).unwrap_or(usize::MAX))
        };
        let mut new_cursor = None;
        let mut leases = Vec::new();
        if want > 0 {
            let ts = topic.snapshot();
            let (cursor, spec) = {
                let st = consumer.state();
                (st.cursor.max(ts.first_seq), st.spec.clone())
            };
            if cursor <= ts.last_seq {
                let lease_until = now.saturating_add(super::consumer::millis(spec.ack_wait));
                let mut next = ts.last_seq + 1;
                let mut scanned = 0;
                for guard in store
                    .messages
                    .range(msg_key(topic.id, cursor)..=msg_key(topic.id, ts.last_seq))
                {
                    let (k, v) = guard
                        .into_inner()
                        .map_err(|e| storage("reading messages", e))?;
                    let seq = key_seq(&k)?;
                    let rec = decode_message(v)?;
                    let m = message(topic, rec);
                    let accepted = spec.accepts(&m);
                    if accepted
                        && !deliveries.is_empty()
                        && bytes.saturating_add(m.size()) > max_bytes
                    {
                        // Left for the next fetch, cursor and all.
                        next = seq;
                        break;
                    }
                    scanned += 1;
                    if accepted {
                        bytes = bytes.saturating_add(m.size());
                        let p = Pending {
                            attempt: 1,
                            due: lease_until,
                            leased: true,
                            completing: false,
                            published_at: m.published_at,
                        };
                        // No pending record: the cursor and floor cover
                        // a first delivery (`store::Position`).
                        leases.push((seq, p));
                        deliveries.push(Delivery {
                            receipt: receipt(consumer, seq, 1),
                            message: m,
                            seq,
                            attempt: 1,
                        });
                    }
                    if leases.len() >= want || scanned >= SCAN_LIMIT {
                        next = seq + 1;
                        break;
                    }
                }
                new_cursor = Some(next);
            }
        }

        if records.is_empty() && vanished.is_empty() && new_cursor.is_none() {
            return Ok(deliveries);
        }
        self.call(|reply| Op::Deliver {
            consumer: consumer.clone(),
            cursor: new_cursor,
            records,
            leases,
            vanished,
            reply,
        })
        .await?;
        Ok(deliveries)
    }

    /// [`crate::broker::Broker::read`] for a resolved topic.
    pub(super) async fn read_from(
        &self,
        topic: &Arc<Topic>,
        from: u64,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Stored>, BrokerError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let deadline = deadline(wait);
        loop {
            let published = topic.notify.notified();
            tokio::pin!(published);
            published.as_mut().enable();
            let ts = topic.snapshot();
            let start = from.max(ts.first_seq).max(1);
            let mut out = Vec::new();
            if start <= ts.last_seq {
                for guard in self
                    .shared
                    .store
                    .get()?
                    .messages
                    .range(msg_key(topic.id, start)..=msg_key(topic.id, ts.last_seq))
                    .take(max)
                {
                    let (k, v) = guard
                        .into_inner()
                        .map_err(|e| storage("reading messages", e))?;
                    out.push(Stored {
                        seq: key_seq(&k)?,
                        message: message(topic, decode_message(v)?),
                    });
                }
            }
            if !out.is_empty() || Instant::now() >= deadline {
                return Ok(out);
            }
            tokio::select! {
                () = &mut published => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// [`crate::broker::Broker::consumer_stats`]: counters from memory, and
    /// at most one (cached) read for the age of the message at the cursor.
    pub(super) fn stats_for(&self, consumer: &Consumer) -> Result<ConsumerStats, BrokerError> {
        let ts = consumer.topic.snapshot();
        let (cursor, waiting, in_flight, oldest_pending, cached, paused) = {
            let st = consumer.state();
            (
                st.cursor.max(ts.first_seq),
                st.pending.len() as u64 - st.leased,
                st.leased,
                st.pending.first_key_value().map(|(_, p)| p.published_at),
                st.cursor_age_cache,
                st.paused,
            )
        };
        let undelivered = if cursor <= ts.last_seq {
            (ts.last_seq - cursor + 1).min(ts.depth)
        } else {
            0
        };
        let oldest = match oldest_pending {
            Some(at) => Some(at),
            None if undelivered > 0 => match cached {
                Some((seq, at)) if seq == cursor => Some(at),
                _ => {
                    let found = self
                        .shared
                        .store
                        .get()?
                        .first_message_from(consumer.topic.id, cursor)?;
                    found.map(|(_, rec)| {
                        consumer.state().cursor_age_cache = Some((cursor, rec.published_at));
                        rec.published_at
                    })
                }
            },
            None => None,
        };
        Ok(ConsumerStats {
            pending: undelivered + waiting,
            in_flight,
            oldest_age: oldest.map(|at| Duration::from_millis(now_millis().saturating_sub(at))),
            paused,
        })
    }
}

/// A receipt for `seq` at `attempt`.
fn receipt(consumer: &Consumer, seq: u64, attempt: u32) -> Receipt {
    Receipt {
        consumer: consumer.name.clone(),
        seq,
        attempt,
        handle: String::new(),
    }
}

/// A delivery of a stored record.
fn delivery(
    consumer: &Consumer,
    topic: &Topic,
    rec: MessageRecord,
    seq: u64,
    attempt: u32,
) -> Delivery {
    Delivery {
        message: message(topic, rec),
        seq,
        attempt,
        receipt: receipt(consumer, seq, attempt),
    }
}
