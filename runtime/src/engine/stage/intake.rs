//! Getting deliveries into a stage: the fetch loop, the in-flight permits
//! and the byte budget that bound what a stage holds, the fetch that fills
//! a batch, and the dispatch of what was fetched to ordering lanes, tasks
//! or batches.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::{FETCH_AFTER_STOP, FETCH_MAX, Job, StageRunner};
use crate::broker::{BrokerError, Delivery};
use crate::dlq;

impl StageRunner {
    /// Fetches and dispatches until `stop` carries a value.
    pub(super) async fn fetch_loop(
        self: &Arc<Self>,
        lane: usize,
        tasks: &mut JoinSet<()>,
        mut stop: watch::Receiver<Option<Instant>>,
    ) {
        let mut fetch_errors = 0u32;
        while stop.borrow().is_none() {
            while tasks.try_join_next().is_some() {}
            let permits = tokio::select! {
                permits = self.reserve(lane) => permits,
                _ = stop.changed() => break,
            };
            let fetch = self.fetch(lane, permits.len());
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
                    if !self
                        .admit(lane, deliveries, permits, tasks, &mut stop)
                        .await
                    {
                        break;
                    }
                }
                Err(err) => {
                    fetch_errors = fetch_errors.saturating_add(1);
                    let pause = Duration::from_millis(100)
                        .saturating_mul(fetch_errors.min(50))
                        .min(Duration::from_secs(5));
                    tracing::warn!(topic = %self.inputs[lane].topic, error = %err, retry_in = ?pause, "fetch failed");
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        _ = stop.changed() => break,
                    }
                }
            }
        }
    }

    /// The in-flight permits for the next fetch (see [`super::budget::Budget::reserve`]).
    /// A batch stage fetches several batches at once (split in
    /// `dispatch`): one round trip per batch left a batch stage at 0.3-0.8
    /// of an unbatched one's rate (BENCHMARKS.md).
    async fn reserve(&self, lane: usize) -> Vec<OwnedSemaphorePermit> {
        let per_fetch = self.batch.map_or(FETCH_MAX, |(max, _)| max.max(FETCH_MAX));
        self.inputs[lane].budget.reserve(per_fetch).await
    }

    /// Takes each fetched delivery's bytes from the budget and dispatches
    /// it. Returns false if `stop` turned true while it waited for bytes:
    /// what it had not dispatched stays leased, and `drain` naks it.
    async fn admit(
        self: &Arc<Self>,
        lane: usize,
        deliveries: Vec<Delivery>,
        permits: Vec<OwnedSemaphorePermit>,
        tasks: &mut JoinSet<()>,
        stop: &mut watch::Receiver<Option<Instant>>,
    ) -> bool {
        let budget = &self.inputs[lane].budget;
        budget.learn_sizes(&deliveries);
        let mut jobs = Vec::with_capacity(deliveries.len());
        for (delivery, permit) in deliveries.into_iter().zip(permits) {
            let bytes = match budget.try_take_bytes(&delivery) {
                Some(bytes) => Some(bytes),
                None => {
                    // Over the budget: start what is held (it frees bytes
                    // as it settles), then wait.
                    self.dispatch(std::mem::take(&mut jobs), tasks).await;
                    tokio::select! {
                        bytes = budget.take_bytes(&delivery) => bytes,
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

    /// Fetches up to `max` deliveries, within the free byte budget (or one
    /// larger message), and records their leases. A batch stage whose first
    /// fetch did not fill one batch keeps fetching until it does, the
    /// budget is full, or the batch's wait is over.
    async fn fetch(&self, lane: usize, max: usize) -> Result<Vec<Delivery>, BrokerError> {
        let input = &self.inputs[lane];
        let budget = input.budget.free_bytes();
        let mut out = match self.batch {
            None => {
                self.broker
                    .fetch_within(&input.consumer, max, budget, Duration::from_secs(1))
                    .await?
            }
            Some((batch_max, wait)) => {
                let mut out = self
                    .broker
                    .fetch_within(&input.consumer, max, budget, Duration::from_secs(1))
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
                        .fetch_within(&input.consumer, max - out.len(), budget - held, left)
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
        self.remember(lane, &out);
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
                    self.forget(&job.delivery);
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
        if let Some((queue, _)) = &self.queue {
            for job in ready {
                // Unbounded, but never longer than the in-flight limit:
                // every job holds a permit. Sent only while open: once
                // closed, the job's lease is left for `drain`.
                let _ = queue.try_send(job);
            }
            return;
        }
        for job in ready {
            let Some(key) = self.lanes.key_of(&job.delivery.message) else {
                // Take the worker slot here, in fetch order, so a stage with
                // concurrency 1 handles unkeyed messages in publish order.
                // A dedup stage takes it after the dedup check instead (see
                // `process`): a duplicate never needs one, and the check
                // (a round trip to the store on NATS) must not hold the
                // handlers up. Its key's lease is renewed if the slot comes
                // late (`attempt`).
                // A stage limited per key takes it after its key's turn
                // (in `attempt`), so a hot key holds no slot while it waits.
                let slot = match self.dedup {
                    None if !self.pace.is_per_key() => self.slot_for(&job.delivery).await,
                    _ => None,
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
