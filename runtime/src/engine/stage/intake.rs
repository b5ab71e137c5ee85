//! Getting deliveries into a stage: the fetch loop, the in-flight permits
//! and the byte budget that bound what a stage holds, the fetch that fills
//! a batch, and the dispatch of what was fetched to ordering lanes, tasks
//! or batches.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::{FETCH_AFTER_STOP, FETCH_MAX, IN_FLIGHT_BYTES, Job, StageRunner};
use crate::broker::{BrokerError, Delivery};
use crate::dlq;

impl StageRunner {
    /// Fetches and dispatches until `stop` carries a value.
    pub(super) async fn fetch_loop(
        self: &Arc<Self>,
        tasks: &mut JoinSet<()>,
        mut stop: watch::Receiver<Option<Instant>>,
    ) {
        let mut fetch_errors = 0u32;
        while stop.borrow().is_none() {
            while tasks.try_join_next().is_some() {}
            let permits = tokio::select! {
                permits = self.reserve() => permits,
                _ = stop.changed() => break,
            };
            let fetch = self.fetch(permits.len());
            tokio::pin!(fetch);
            let fetched = tokio::select! {
                fetched = &mut fetch => fetched,
                _ = stop.changed() => {
                    // Dropping a fetch in flight could strand deliveries the
                    // broker already leased (until `ack_wait`, holding them
                    // from other daemons). It waits a second at most on a
                    // healthy broker: let it finish, within a bound for a
                    // dead one; `drain` hands back what it recorded.
                    let _ = tokio::time::timeout(FETCH_AFTER_STOP, fetch).await;
                    break;
                }
            };
            match fetched {
                Ok(deliveries) => {
                    fetch_errors = 0;
                    if !self.admit(deliveries, permits, tasks, &mut stop).await {
                        break;
                    }
                }
                Err(err) => {
                    fetch_errors = fetch_errors.saturating_add(1);
                    let pause = Duration::from_millis(100)
                        .saturating_mul(fetch_errors.min(50))
                        .min(Duration::from_secs(5));
                    tracing::warn!(error = %err, retry_in = ?pause, "fetch failed");
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        _ = stop.changed() => break,
                    }
                }
            }
        }
    }

    /// Waits for in-flight permits, then takes as many more as are free, up
    /// to one fetch's worth. When every permit is taken (the stage is
    /// saturated) it waits for a chunk of them rather than one: each fetch
    /// is a broker round trip, and fetching one message per settled one
    /// would spend the stage's time on round trips. The chunk is at most a
    /// quarter of the in-flight limit, so the rest stays busy meanwhile.
    async fn reserve(&self) -> Vec<OwnedSemaphorePermit> {
        // A batch stage fetches several batches at once (split in
        // `dispatch`): one round trip per batch left a batch stage at
        // 0.3-0.8 of an unbatched one's rate (BENCHMARKS.md).
        let want = self
            .batch
            .map_or(FETCH_MAX, |(max, _)| max.max(FETCH_MAX))
            .min(self.max_in_flight);
        let mut permits = Vec::with_capacity(want);
        let chunk = if self.inflight.available_permits() == 0 {
            (self.max_in_flight / 4).clamp(1, 32).min(want)
        } else {
            1
        };
        let chunk = u32::try_from(chunk).unwrap_or(1);
        if let Ok(mut taken) = self.inflight.clone().acquire_many_owned(chunk).await {
            while let Some(one) = taken.split(1) {
                permits.push(one);
            }
        }
        while permits.len() < want {
            match self.inflight.clone().try_acquire_owned() {
                Ok(permit) => permits.push(permit),
                Err(_) => break,
            }
        }
        // As many as the free byte budget fits at the recent message size
        // (at least one: a message larger than the budget still runs).
        let typical = self.typical_size.load(Ordering::Relaxed).max(1);
        let fits = (self.inflight_bytes.available_permits() / typical).max(1);
        permits.truncate(fits);
        permits
    }

    /// Takes each fetched delivery's bytes from the budget and dispatches
    /// it. Returns false if `stop` turned true while it waited for bytes:
    /// what it had not dispatched stays leased, and `drain` naks it.
    async fn admit(
        self: &Arc<Self>,
        deliveries: Vec<Delivery>,
        permits: Vec<OwnedSemaphorePermit>,
        tasks: &mut JoinSet<()>,
        stop: &mut watch::Receiver<Option<Instant>>,
    ) -> bool {
        self.learn_sizes(&deliveries);
        let mut jobs = Vec::with_capacity(deliveries.len());
        for (delivery, permit) in deliveries.into_iter().zip(permits) {
            let need = footprint(&delivery);
            let bytes = match self.inflight_bytes.clone().try_acquire_many_owned(need) {
                Ok(bytes) => Some(bytes),
                Err(_) => {
                    // Over the budget: start what is held (it frees bytes
                    // as it settles), then wait.
                    self.dispatch(std::mem::take(&mut jobs), tasks).await;
                    tokio::select! {
                        bytes = self.inflight_bytes.clone().acquire_many_owned(need) => bytes.ok(),
                        _ = stop.changed() => return false,
                    }
                }
            };
            jobs.push(Job {
                delivery,
                _permit: permit,
                _bytes: bytes,
            });
        }
        self.dispatch(jobs, tasks).await;
        true
    }

    /// Updates the size a fetch assumes per message: the largest just
    /// fetched, or half the previous figure, whichever is larger, so a
    /// run of large messages shrinks fetches at once and small ones
    /// grow them back within a few fetches.
    fn learn_sizes(&self, deliveries: &[Delivery]) {
        if let Some(largest) = deliveries.iter().map(|d| footprint(d) as usize).max() {
            let before = self.typical_size.load(Ordering::Relaxed);
            self.typical_size
                .store(largest.max(before / 2), Ordering::Relaxed);
        }
    }

    /// Fetches up to `max` deliveries, within the free byte budget (or one
    /// larger message), and records their leases. A batch stage whose first
    /// fetch did not fill one batch keeps fetching until it does, the
    /// budget is full, or the batch's wait is over.
    async fn fetch(&self, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        let budget = self.inflight_bytes.available_permits();
        let mut out = match self.batch {
            None => {
                self.broker
                    .fetch_within(&self.consumer, max, budget, Duration::from_secs(1))
                    .await?
            }
            Some((batch_max, wait)) => {
                let mut out = self
                    .broker
                    .fetch_within(&self.consumer, max, budget, Duration::from_secs(1))
                    .await?;
                let deadline = Instant::now() + wait;
                while !out.is_empty() && out.len() < batch_max.min(max) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let held: usize = out.iter().map(|d| d.message.size()).sum();
                    if left.is_zero() || held >= budget {
                        break;
                    }
                    let more = self
                        .broker
                        .fetch_within(&self.consumer, max - out.len(), budget - held, left)
                        .await?;
                    if more.is_empty() {
                        break;
                    }
                    out.extend(more);
                }
                out
            }
        };
        out.truncate(max);
        self.remember(&out);
        Ok(out)
    }

    /// Skips redrives meant for another stage, then routes each delivery to
    /// its ordering lane or straight to a task.
    async fn dispatch(self: &Arc<Self>, jobs: Vec<Job>, tasks: &mut JoinSet<()>) {
        let mut ready = Vec::with_capacity(jobs.len());
        for job in jobs {
            match job.delivery.message.header(dlq::REDRIVE_TO) {
                Some(target) if target != self.target => {
                    self.settler.skip(&job.delivery).await;
                    self.forget(job.delivery.seq);
                }
                _ => ready.push(job),
            }
        }
        if ready.is_empty() {
            return;
        }
        if let Some((batch_max, _)) = self.batch {
            // One task per batch; they take the valve in fetch order.
            let mut rest = ready.into_iter().peekable();
            while rest.peek().is_some() {
                let batch: Vec<Job> = rest.by_ref().take(batch_max.max(1)).collect();
                let runner = self.clone();
                tasks.spawn(async move { runner.process_batch(batch).await }.in_current_span());
            }
            return;
        }
        for job in ready {
            let Some(key) = self.lane_key(&job.delivery.message) else {
                // Take the worker slot here, in fetch order, so a stage with
                // concurrency 1 handles unkeyed messages in publish order.
                // A dedup stage takes it after the dedup check instead (see
                // `process`): a duplicate never needs one, and the check
                // (a round trip to the store on NATS) must not hold the
                // handlers up. Its key's lease is renewed if the slot comes
                // late (`attempt`).
                let slot = match self.dedup {
                    None => self.valve.clone().acquire_owned().await.ok(),
                    Some(_) => None,
                };
                let runner = self.clone();
                tasks
                    .spawn(async move { runner.process(job, false, slot).await }.in_current_span());
                continue;
            };
            self.enqueue(key, job, tasks);
        }
    }
}

/// What a delivery counts against the byte budget: what it holds in
/// memory, capped at the budget so that one larger message still runs
/// (alone).
fn footprint(delivery: &Delivery) -> u32 {
    let bytes = delivery.message.size();
    u32::try_from(bytes.min(IN_FLIGHT_BYTES)).unwrap_or(u32::MAX)
}
