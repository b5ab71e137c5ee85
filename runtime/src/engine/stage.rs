//! One stage at work: fetch → valve → ordering lane → resolve claim →
//! invoke → settle.
//!
//! The fetch loop holds one in-flight permit per unsettled delivery, and
//! its bytes from the stage's byte budget, so a stage never holds more than
//! its in-flight limit, nor (give or take one fetch) more than
//! [`IN_FLIGHT_BYTES`] of messages, however fast its topic fills
//! (backpressure stays in the broker, on disk). Handlers run under the
//! concurrency valve: `concurrency` worker slots, one call each. Every
//! unsettled lease is in `leases`, which the heartbeat extends and shutdown
//! naks.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::dedup::{DedupGate, Gate};
use super::handler::StageHandler;
use super::settle::{Next, Settler};
use crate::broker::{Broker, BrokerError, ConsumerSpec, Delivery, Receipt, consumer_name};
use crate::claim::{self, ClaimError, Claims};
use crate::config::{OrderingKey, Stage};
use crate::dedup::DedupStore;
use crate::dlq;
use crate::metrics::Metrics;
use crate::plugin::Message as PluginMessage;

/// Everything needed to run one stage.
pub struct StageSetup {
    /// The pipeline's name.
    pub pipeline: String,
    /// The stage as configured.
    pub stage: Stage,
    /// How long shutdown waits for in-flight work before naking it.
    pub shutdown_timeout: Duration,
    /// One handler per worker slot: `stage.concurrency` of them.
    pub handlers: Vec<Box<dyn StageHandler>>,
}

impl StageSetup {
    /// The broker consumer this stage reads through.
    pub fn consumer(&self) -> ConsumerSpec {
        ConsumerSpec {
            name: consumer_name(&self.pipeline, &self.stage.name),
            topic: self.stage.subscribe.topic.clone(),
            filter: self.stage.subscribe.filter.clone(),
            ack_wait: self.stage.ack_wait.get(),
            max_ack_pending: self.stage.max_ack_pending,
            max_deliver: Some(
                self.stage
                    .retry
                    .max_attempts
                    .get()
                    .saturating_add(LOST_DELIVERY_MARGIN),
            ),
        }
    }
}

/// Deliveries a broker may make beyond `retry.max_attempts` before it gives
/// up on a message. The engine dead-letters at `max_attempts`; deliveries
/// that end without a settle (a crash, an expired lease, a shutdown nak)
/// count too, and this margin keeps such a message coming back so the
/// engine can still settle it rather than the broker dropping it.
pub const LOST_DELIVERY_MARGIN: u32 = 10;

/// Deliveries a stage holds at once unless `max_ack_pending` says otherwise
/// (or its concurrency and batch size need more). A deep window is what
/// lets a fast stage work in bursts: on NATS, 64 held 0.6 of a raw
/// async-nats loop's rate and 512 held 0.8-1.0 (BENCHMARKS.md), because
/// each round trip then carries many messages. [`IN_FLIGHT_BYTES`] keeps the
/// memory that costs bounded when messages are large.
pub const DEFAULT_IN_FLIGHT: usize = 512;

/// Bytes of messages (payload, headers, id, key) a stage holds at once,
/// fetched and not yet settled. A delivery waits in the fetch loop for its
/// share; the next fetch asks for no more than the free share fits at the
/// recent message size. A claim-check reference counts as its few bytes:
/// its payload is loaded only under a worker slot.
pub const IN_FLIGHT_BYTES: usize = 64 << 20;

/// The most deliveries one fetch asks for (a batch stage: at least one
/// batch). Each fetch is a broker round trip and, on the embedded broker,
/// one lease write.
const FETCH_MAX: usize = 256;

/// A delivery whose dedup key is held elsewhere asks again after this
/// pause, doubling up to [`DEDUP_POLL_MAX`] (and never past the holder's
/// lease): a twin in flight here finishes within milliseconds, a crashed
/// holder's lease takes seconds.
const DEDUP_POLL_MIN: Duration = Duration::from_millis(5);
/// The longest pause between asks.
const DEDUP_POLL_MAX: Duration = Duration::from_secs(1);

/// The log target of a line at every handler call's start (debug level):
/// `SLUICE_LOG=sluice::calls=debug` shows when calls start, which is how
/// the tests see that none starts after SIGTERM.
const CALLS: &str = "sluice::calls";

/// How long a fetch in flight when shutdown begins may still take. A
/// healthy broker answers within its one-second fetch expiry; a dead one
/// is not waited for.
const FETCH_AFTER_STOP: Duration = Duration::from_secs(2);

/// How long past its deadline a stage still tries to hand back (nak) the
/// deliveries it abandoned, so another daemon can take them at once. A nak
/// that does not answer in this time is dropped: the lease expires and the
/// broker redelivers the message all the same.
pub(super) const RELEASE_GRACE: Duration = Duration::from_millis(500);

/// A fetched delivery and the in-flight permits (one, and its bytes) it
/// holds until settled.
struct Job {
    delivery: Delivery,
    _permit: OwnedSemaphorePermit,
    /// `None` only if the budget's semaphore were closed, which it never is.
    _bytes: Option<OwnedSemaphorePermit>,
}

/// Shared state of a running stage.
pub(super) struct StageRunner {
    pub(super) settler: Settler,
    broker: Arc<dyn Broker>,
    consumer: Arc<str>,
    ack_wait: Duration,
    /// `<pipeline>/<stage>`, what a redriven message names in `sluice-redrive-to`.
    target: String,
    ordering: Option<OrderingKey>,
    batch: Option<(usize, Duration)>,
    shutdown_timeout: Duration,
    max_in_flight: usize,
    /// Unsettled deliveries.
    inflight: Arc<Semaphore>,
    /// The byte budget of unsettled deliveries ([`IN_FLIGHT_BYTES`]).
    inflight_bytes: Arc<Semaphore>,
    /// The size a fetch assumes per message: the recent largest, decaying.
    typical_size: AtomicUsize,
    /// The concurrency valve: free worker slots. Closed when shutdown
    /// begins, so that no handler call starts after it.
    valve: Arc<Semaphore>,
    /// Turns true when shutdown begins; wakes retry and dedup pauses.
    halted: watch::Sender<bool>,
    pool: Mutex<Vec<Box<dyn StageHandler>>>,
    leases: Mutex<HashMap<u64, Receipt>>,
    /// Per-key queues of deliveries waiting behind a running one.
    lanes: Mutex<HashMap<String, VecDeque<Job>>>,
    /// Resolves claim-check references (None: no claim check configured).
    claims: Option<Arc<Claims>>,
    /// The dedup step (None: the stage does not deduplicate).
    dedup: Option<DedupGate>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl StageRunner {
    pub(super) fn new(
        setup: StageSetup,
        broker: Arc<dyn Broker>,
        metrics: Arc<Metrics>,
        claims: Option<Arc<Claims>>,
        dedup: Option<Arc<dyn DedupStore>>,
    ) -> Self {
        let stage = &setup.stage;
        let concurrency = setup.handlers.len().max(1);
        let batch = stage.batch.as_ref().map(|b| {
            (
                usize::try_from(b.max.get()).unwrap_or(usize::MAX),
                b.wait.get(),
            )
        });
        let per_call = batch.map_or(1, |(max, _)| max);
        let max_in_flight = match stage.max_ack_pending {
            Some(limit) => usize::try_from(limit).unwrap_or(usize::MAX).max(per_call),
            None => (concurrency * per_call * 2).max(DEFAULT_IN_FLIGHT),
        };
        let mut settler = Settler::new(&setup.pipeline, stage, broker.clone(), metrics);
        let dedup = match (dedup, &stage.dedup) {
            (Some(store), Some(config)) => {
                settler = settler.with_dedup(store.clone());
                Some(DedupGate::new(&setup.pipeline, stage, config, store))
            }
            _ => None,
        };
        StageRunner {
            settler,
            dedup,
            consumer: consumer_name(&setup.pipeline, &stage.name).into(),
            ack_wait: stage.ack_wait.get(),
            target: format!("{}/{}", setup.pipeline, stage.name),
            ordering: stage.ordering.as_ref().map(|o| o.key.clone()),
            batch,
            shutdown_timeout: setup.shutdown_timeout,
            max_in_flight,
            inflight: Arc::new(Semaphore::new(max_in_flight)),
            inflight_bytes: Arc::new(Semaphore::new(IN_FLIGHT_BYTES)),
            // Unknown yet: the first fetches are small until sizes are seen.
            typical_size: AtomicUsize::new(IN_FLIGHT_BYTES / 16),
            valve: Arc::new(Semaphore::new(concurrency)),
            halted: watch::Sender::new(false),
            pool: Mutex::new(setup.handlers),
            leases: Mutex::new(HashMap::new()),
            lanes: Mutex::new(HashMap::new()),
            claims,
            broker,
        }
    }

    /// Runs until `stop` carries the instant shutdown began, then drains
    /// (see [`StageRunner::drain`]). Everything after the stop is bounded by
    /// the stage's deadline, `shutdown_timeout` after that instant: a fetch
    /// or a settle that hangs on a dead broker is abandoned there.
    pub(super) async fn run(self: Arc<Self>, stop: watch::Receiver<Option<Instant>>) {
        let heartbeat = tokio::spawn(self.clone().heartbeat());
        let mut tasks = JoinSet::new();
        {
            let mut stopped = stop.clone();
            let cut = async {
                let at = stopped
                    .wait_for(Option::is_some)
                    .await
                    .ok()
                    .and_then(|at| *at)
                    .unwrap_or_else(Instant::now);
                tokio::time::sleep_until((at + self.shutdown_timeout).into()).await;
            };
            tokio::select! {
                () = self.fetch_loop(&mut tasks, stop.clone()) => {}
                () = cut => tracing::warn!("shutdown deadline reached while the fetch loop was still busy; abandoning it"),
            }
        }
        let began = (*stop.borrow()).unwrap_or_else(Instant::now);
        self.drain(tasks, began + self.shutdown_timeout).await;
        heartbeat.abort();
    }

    /// Closes the concurrency valve: from now on no handler call starts.
    /// Calls already running go on; every delivery that has not started
    /// stays leased until `drain` hands it back.
    pub(super) fn stop_calls(&self) {
        self.valve.close();
        self.halted.send_replace(true);
    }

    /// Sleeps `delay`, or less if shutdown begins meanwhile (the caller
    /// then sees [`StageRunner::stopping`] and leaves the delivery).
    async fn pause(&self, delay: Duration) {
        let mut halted = self.halted.subscribe();
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = halted.wait_for(|halted| *halted) => {}
        }
    }

    /// How long this stage's shutdown may take.
    pub(super) fn shutdown_timeout(&self) -> Duration {
        self.shutdown_timeout
    }

    /// Whether shutdown has begun (no handler call may start).
    fn stopping(&self) -> bool {
        self.valve.is_closed()
    }

    /// Fetches and dispatches until `stop` carries a value.
    async fn fetch_loop(
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
        let mut leases = lock(&self.leases);
        for delivery in &out {
            leases.insert(delivery.seq, delivery.receipt.clone());
        }
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
                // must not hold the handlers up.
                let slot = match self.dedup {
                    None => self.valve.clone().acquire_owned().await.ok(),
                    Some(_) => None,
                };
                let runner = self.clone();
                tasks
                    .spawn(async move { runner.process(job, false, slot).await }.in_current_span());
                continue;
            };
            {
                let mut lanes = lock(&self.lanes);
                if let Some(queue) = lanes.get_mut(&key) {
                    queue.push_back(job);
                    continue;
                }
                lanes.insert(key.clone(), VecDeque::new());
            }
            let runner = self.clone();
            tasks.spawn(async move { runner.run_lane(key, job).await }.in_current_span());
        }
    }

    /// The ordering key of a message, if the stage orders and it has one.
    fn lane_key(&self, message: &crate::broker::Message) -> Option<String> {
        match self.ordering.as_ref()? {
            OrderingKey::Key => message.key.clone(),
            OrderingKey::Header(name) => message.header(name).map(str::to_owned),
        }
    }

    /// Handles `first` and then every delivery queued behind it on `key`,
    /// one at a time, in order. Retries happen in place, so a failing
    /// message holds back only its own key.
    async fn run_lane(self: Arc<Self>, key: String, first: Job) {
        let mut next = Some(first);
        while let Some(job) = next {
            self.process(job, true, None).await;
            let mut lanes = lock(&self.lanes);
            next = lanes.get_mut(&key).and_then(VecDeque::pop_front);
            if next.is_none() {
                lanes.remove(&key);
            }
        }
    }

    /// Handles one delivery to the end: invoke, settle, and for an ordered
    /// stage retry in place until it is settled.
    /// `slot` is a worker slot already taken for the first attempt.
    ///
    /// Once shutdown has begun no handler call starts: a delivery that has
    /// not reached its call (or waits for a retry in place) is left
    /// unsettled, its lease in `leases` for `drain` to hand back.
    async fn process(
        &self,
        job: Job,
        retry_in_place: bool,
        mut slot: Option<OwnedSemaphorePermit>,
    ) {
        let delivery = &job.delivery;
        let mut attempt = delivery.attempt;
        let mut busy_pause = DEDUP_POLL_MIN;
        let mut hold = Hold::new(self.settler.hold_max());
        loop {
            if self.stopping() {
                return;
            }
            let (outcome, ticket) = {
                // A claim reference is resolved under the valve, so at most
                // `concurrency` claim payloads are in memory at once. An
                // inline message of a dedup stage takes its slot only once
                // the dedup check says it runs.
                let mut _slot = slot.take();
                if _slot.is_none()
                    && (self.dedup.is_none() || claim::is_reference(&delivery.message))
                {
                    match self.valve.clone().acquire_owned().await {
                        Ok(taken) => _slot = Some(taken),
                        // Closed: shutdown began.
                        Err(_) => return,
                    }
                }
                match self.resolve(delivery, attempt).await {
                    Err(failure) => (Err(failure), None),
                    Ok(message) => match self.gate(&message).await {
                        Gate::Run(ticket) => {
                            if _slot.is_none() {
                                match self.valve.clone().acquire_owned().await {
                                    Ok(taken) => _slot = Some(taken),
                                    // Shutdown began: the dedup key's lease
                                    // runs out and a redelivery takes it.
                                    Err(_) => return,
                                }
                            }
                            if self.stopping() {
                                return;
                            }
                            (self.invoke(&message).await, ticket)
                        }
                        Gate::Wait(pause) => {
                            // Same attempt, later: the key's holder (here
                            // or in another daemon) is still at work. The
                            // worker slot is free meanwhile, the lease kept.
                            drop(_slot);
                            self.pause(pause.min(busy_pause)).await;
                            busy_pause = (busy_pause * 2).min(DEDUP_POLL_MAX);
                            continue;
                        }
                        Gate::Duplicate {
                            outputs,
                            completed_at,
                        } => {
                            drop(_slot);
                            match self
                                .settler
                                .duplicate(delivery, attempt, outputs, completed_at, retry_in_place)
                                .await
                            {
                                Next::Done => break,
                                Next::RetryAfter(delay) => {
                                    self.pause(delay).await;
                                    attempt = attempt.saturating_add(1);
                                    continue;
                                }
                                Next::Hold(delay) => {
                                    self.pause(hold.next(delay)).await;
                                    continue;
                                }
                            }
                        }
                        Gate::Fail(failure) => (Err(failure), None),
                    },
                }
            };
            match self
                .settler
                .settle(delivery, attempt, outcome, retry_in_place, ticket.as_ref())
                .await
            {
                Next::Done => break,
                Next::RetryAfter(delay) => {
                    self.pause(delay).await;
                    attempt = attempt.saturating_add(1);
                }
                // Same attempt, later: the target is down. The worker slot
                // is free meanwhile and the lease kept.
                Next::Hold(delay) => self.pause(hold.next(delay)).await,
            }
        }
        self.forget(delivery.seq);
    }

    /// Hands a batch to one worker slot, then settles its items together.
    /// Items whose target is unavailable are held (lease kept, no attempt
    /// spent) and handed over again, as a smaller batch, after a pause.
    async fn process_batch(&self, jobs: Vec<Job>) {
        let mut jobs = jobs;
        let mut hold = Hold::new(self.settler.hold_max());
        loop {
            let Some(outcomes) = self.call_batch(&jobs).await else {
                // Shutdown began: no call starts; `drain` hands them back.
                return;
            };
            let mut held = Vec::new();
            let mut settled = Vec::with_capacity(jobs.len());
            let mut wait = Duration::ZERO;
            for (job, outcome) in jobs.into_iter().zip(outcomes) {
                match outcome {
                    Err(failure) if failure.kind == crate::FailureKind::Unavailable => {
                        self.settler.count_failure(crate::FailureKind::Unavailable);
                        wait = wait.max(failure.retry_after.unwrap_or_default());
                        held.push(job);
                    }
                    outcome => settled.push((job, outcome)),
                }
            }
            // Every item is settled on its own (its own outputs, ack, nak
            // or dead letter), but all at once: each settle waits for the
            // broker to make it durable, and in flight together they share
            // the embedded broker's group commit (one fsync for the batch)
            // or NATS's pipelining, instead of paying one round each in
            // turn. Batch items are naked for their retries: holding a
            // whole batch back for one item would stall the rest.
            let settles = settled.into_iter().map(|(job, outcome)| async move {
                let delivery = &job.delivery;
                self.settler
                    .settle(delivery, delivery.attempt, outcome, false, None)
                    .await;
                self.forget(delivery.seq);
            });
            futures_util::future::join_all(settles).await;
            if held.is_empty() {
                return;
            }
            self.pause(hold.next(wait)).await;
            if self.stopping() {
                return;
            }
            jobs = held;
        }
    }

    /// One handler call for `jobs` under a worker slot: an outcome per job,
    /// in order. `None` if shutdown began before the call could start.
    async fn call_batch(&self, jobs: &[Job]) -> Option<Vec<crate::plugin::Outcome>> {
        let _slot = self.valve.acquire().await.ok()?;
        // Items whose claim cannot be resolved fail alone; the rest go to
        // the handler as one batch.
        let mut failed: Vec<Option<crate::Failure>> = Vec::with_capacity(jobs.len());
        let mut messages: Vec<PluginMessage> = Vec::with_capacity(jobs.len());
        for job in jobs {
            match self.resolve(&job.delivery, job.delivery.attempt).await {
                Ok(message) => {
                    messages.push(message);
                    failed.push(None);
                }
                Err(failure) => failed.push(Some(failure)),
            }
        }
        if self.stopping() {
            return None;
        }
        tracing::debug!(target: CALLS, items = messages.len(), "handler call starts");
        let mut handler = self.take_handler();
        let started = Instant::now();
        let handled = match handler.as_mut() {
            Some(_) if messages.is_empty() => Vec::new(),
            Some(handler) => handler.handle_batch(&messages).await,
            None => vec![
                Err(crate::Failure::new(
                    crate::FailureKind::Trap,
                    "no worker slot free (engine bug)"
                ));
                messages.len()
            ],
        };
        self.settler.observe(started.elapsed());
        if let Some(handler) = handler {
            lock(&self.pool).push(handler);
        }
        let mut handled = handled.into_iter();
        Some(
            failed
                .into_iter()
                .map(|failure| match failure {
                    Some(failure) => Err(failure),
                    None => handled.next().unwrap_or_else(|| {
                        Err(crate::Failure::new(
                            crate::FailureKind::Trap,
                            "no outcome returned",
                        ))
                    }),
                })
                .collect(),
        )
    }

    fn take_handler(&self) -> Option<Box<dyn StageHandler>> {
        lock(&self.pool).pop()
    }

    /// Calls a free handler with `message` (the caller holds a worker slot).
    async fn invoke(&self, message: &PluginMessage) -> crate::plugin::Outcome {
        tracing::debug!(target: CALLS, id = %message.id, attempt = message.attempt, "handler call starts");
        let mut handler = self.take_handler();
        let started = Instant::now();
        let outcome = match handler.as_mut() {
            Some(handler) => handler.handle(message).await,
            None => Err(crate::Failure::new(
                crate::FailureKind::Trap,
                "no worker slot free (engine bug)",
            )),
        };
        self.settler.observe(started.elapsed());
        if let Some(handler) = handler {
            lock(&self.pool).push(handler);
        }
        outcome
    }

    /// The dedup step: whether `message` runs, waits, or is a duplicate.
    async fn gate(&self, message: &PluginMessage) -> Gate {
        match &self.dedup {
            Some(gate) => gate.check(message).await,
            None => Gate::Run(None),
        }
    }

    fn forget(&self, seq: u64) {
        lock(&self.leases).remove(&seq);
    }

    /// Extends every unsettled lease at a third of `ack_wait`, so a slow
    /// handler (or a delivery queued in a lane) is never redelivered while
    /// this daemon still holds it.
    async fn heartbeat(self: Arc<Self>) {
        let period = (self.ack_wait / 3).max(Duration::from_millis(50));
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let receipts: Vec<Receipt> = lock(&self.leases).values().cloned().collect();
            for receipt in receipts {
                if let Err(err) = self.broker.in_progress(&receipt).await {
                    tracing::debug!(seq = receipt.seq, error = %err, "lease extension failed");
                }
            }
        }
    }

    /// Shutdown (the valve is already closed, so nothing new starts): hands
    /// back what is queued in lanes at once, gives the calls and settles
    /// already running until `deadline`, then abandons them and hands back
    /// every delivery still unsettled. An abandoned call's message is never
    /// acked: it is naked, or if the broker does not answer within
    /// [`RELEASE_GRACE`] its lease expires; either way it is redelivered.
    async fn drain(&self, mut tasks: JoinSet<()>, deadline: Instant) {
        let queued: Vec<Receipt> = lock(&self.lanes)
            .values_mut()
            .flat_map(|queue| queue.drain(..))
            .map(|job| {
                self.forget(job.delivery.seq);
                job.delivery.receipt.clone()
            })
            .collect();
        self.release_all(queued, deadline).await;
        let finished = tokio::time::timeout_at(deadline.into(), async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if finished.is_err() {
            tracing::warn!(
                running = tasks.len(),
                timeout = ?self.shutdown_timeout,
                "shutdown timeout reached; abandoning running handler calls and settles, their messages will be redelivered"
            );
            tasks.abort_all();
            // An aborted task ends at its next await point (a guest call
            // yields at every epoch tick), so this is quick.
            let _ = tokio::time::timeout(RELEASE_GRACE, async {
                while tasks.join_next().await.is_some() {}
            })
            .await;
            tasks.detach_all();
        }
        let left: Vec<Receipt> = lock(&self.leases).drain().map(|(_, r)| r).collect();
        self.release_all(left, deadline.max(Instant::now() + RELEASE_GRACE))
            .await;
    }

    /// Naks `receipts` (delay zero) concurrently, giving up at `until`: an
    /// unanswered nak only means the lease expires instead.
    async fn release_all(&self, receipts: Vec<Receipt>, until: Instant) {
        if receipts.is_empty() {
            return;
        }
        let count = receipts.len();
        let naks = receipts.iter().map(|receipt| self.release(receipt));
        if tokio::time::timeout_at(until.into(), futures_util::future::join_all(naks))
            .await
            .is_err()
        {
            tracing::warn!(
                deliveries = count,
                "the broker did not take the shutdown naks in time; those messages are redelivered when their leases expire"
            );
        }
    }

    async fn release(&self, receipt: &Receipt) {
        if let Err(err) = self.broker.nak(receipt, Duration::ZERO).await {
            tracing::debug!(seq = receipt.seq, error = %err, "nak on shutdown failed; the lease will expire instead");
        }
    }
}

/// The pauses of a delivery held while its target is unavailable: the
/// delay asked for (a `Retry-After`), else doubling from the first one
/// given, never longer than the stage's `retry.backoff.max`.
struct Hold {
    last: Duration,
    max: Duration,
}

impl Hold {
    fn new(max: Duration) -> Self {
        Hold {
            last: Duration::ZERO,
            max,
        }
    }

    fn next(&mut self, asked: Duration) -> Duration {
        let doubled = (self.last * 2).max(Duration::from_millis(100));
        self.last = asked.max(doubled).min(self.max);
        self.last
    }
}

/// What a delivery counts against the byte budget: what it holds in
/// memory, capped at the budget so that one larger message still runs
/// (alone).
fn footprint(delivery: &Delivery) -> u32 {
    let bytes = delivery.message.size();
    u32::try_from(bytes.min(IN_FLIGHT_BYTES)).unwrap_or(u32::MAX)
}

impl StageRunner {
    /// The plugin's view of a delivery, with a claim-check reference
    /// resolved: the payload read from its store (checked against the
    /// reference's size and hash) and the `sluice-claim*` headers removed,
    /// so the handler sees the message as it was published. The delivery
    /// itself keeps the reference: a dead letter carries the reference, not
    /// the payload.
    ///
    /// The plugin's `Message` owns a `Vec<u8>`; a payload read from a store
    /// becomes it without a copy when its buffer is not shared (the usual
    /// case), an inline one is copied once.
    async fn resolve(
        &self,
        delivery: &Delivery,
        attempt: u32,
    ) -> Result<PluginMessage, crate::Failure> {
        let message = &delivery.message;
        let mut headers = message.headers.clone();
        let payload = if claim::is_reference(message) {
            let resolved = match &self.claims {
                Some(claims) => claims.resolve(message).await,
                None => Err(ClaimError::Missing(
                    "the message is a claim-check reference, but this daemon has no \
                     `claim_check` configured"
                        .into(),
                )),
            };
            match resolved {
                Ok(Some(payload)) => {
                    claim::strip_claim_headers(&mut headers);
                    Vec::from(payload)
                }
                Ok(None) => message.payload.to_vec(),
                Err(err) => {
                    return Err(crate::Failure::new(
                        crate::FailureKind::ClaimMissing,
                        err.to_string(),
                    ));
                }
            }
        } else {
            message.payload.to_vec()
        };
        Ok(PluginMessage {
            id: message.id.clone(),
            topic: message.topic.clone(),
            key: message.key.clone(),
            headers,
            payload,
            attempt,
            published_at: message.published_at,
        })
    }
}
