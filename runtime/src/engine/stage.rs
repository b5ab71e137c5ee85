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
//!
//! Its parts, each owning its state: `budget` (the in-flight permits and
//! the byte budget), `leases` (the lease keeper, the heartbeat and the
//! shutdown drain) and `lanes` (per-key ordering); and the steps that use
//! them: `intake` (fetch and dispatch) and `attempt` (one delivery's tries,
//! and the batch call). This module holds the stage's shared state and its
//! run.

mod adaptive;
mod attempt;
mod budget;
mod intake;
mod lanes;
mod leases;
mod pace;
mod valve;
mod workers;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::dedup::DedupGate;
use super::handler::StageHandler;
use super::settle::Settler;
use adaptive::Aimd;
use budget::Budget;
use lanes::Lanes;
use leases::LeaseKeeper;
use pace::Pace;
use valve::{Policy, Slot, Valve};

use crate::broker::{Broker, ConsumerSpec, Delivery, stage_inputs};
use crate::claim::Claims;
use crate::config::{Priority, Stage};
use crate::dedup::DedupStore;
use crate::metrics::{LaneWaits, Metrics};

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
    /// The plugin's sha256 (None for a sink), for the attempts' spans.
    pub plugin_sha256: Option<String>,
}

impl StageSetup {
    /// The broker consumers this stage reads through: one per subscribed
    /// topic, in priority order.
    pub fn consumers(&self) -> Vec<ConsumerSpec> {
        stage_inputs(&self.pipeline, &self.stage)
            .into_iter()
            .map(|input| ConsumerSpec {
                name: input.consumer,
                topic: input.topic,
                filter: self.stage.subscribe.filter.clone(),
                ack_wait: self.stage.delivery.ack_wait.get(),
                max_ack_pending: self.stage.delivery.max_ack_pending,
                max_deliver: Some(
                    self.stage
                        .delivery
                        .retry
                        .attempts()
                        .get()
                        .saturating_add(LOST_DELIVERY_MARGIN),
                ),
            })
            .collect()
    }
}

/// How the valve shares the slots among a stage's lanes: as configured,
/// or equally when a stage lists several topics without a `priority`.
fn policy(stage: &Stage) -> Policy {
    match &stage.subscribe.priority {
        Some(Priority::Strict) => Policy::Strict,
        Some(Priority::Weighted(weights)) => Policy::Weighted(
            stage
                .subscribe
                .topics
                .iter()
                .map(|topic| weights.get(topic).map_or(1, |w| w.get()))
                .collect(),
        ),
        None => Policy::Weighted(vec![1; stage.subscribe.topics.len()]),
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

/// The bytes of messages a stage holds at once: [`IN_FLIGHT_BYTES`]; for
/// an object-store sink, whose records stay in flight until the file
/// holding them is uploaded, four times its `roll.max_bytes` when that is
/// more (up to 4 GiB), so a file can fill to its size limit even from
/// messages that compress 4:1. The memory that takes is the sink's to
/// state (docs/connectors/object_store.md).
fn in_flight_bytes(stage: &Stage) -> usize {
    let files = stage
        .sink
        .as_ref()
        .and_then(|sink| sink.object_store.as_ref())
        .map_or(0, |block| block.roll.max_bytes.bytes().saturating_mul(4));
    usize::try_from(files.min(4 << 30))
        .unwrap_or(usize::MAX)
        .max(IN_FLIGHT_BYTES)
}

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

/// One topic a stage reads (a priority lane, when it reads several): its
/// consumer and what the lane may hold at once.
struct Input {
    topic: String,
    consumer: Arc<str>,
    /// What this lane may hold at once: in-flight permits and bytes. Each
    /// lane has its own, so a lower lane's backlog never takes the permits
    /// a higher lane needs to fetch.
    budget: Budget,
    /// Records each first delivery's wait for a slot (a stage with lanes).
    waits: Option<Arc<LaneWaits>>,
}

/// Shared state of a running stage.
pub(super) struct StageRunner {
    pub(super) settler: Settler,
    broker: Arc<dyn Broker>,
    /// The topics it reads, in priority order: one for most stages.
    inputs: Vec<Input>,
    ack_wait: Duration,
    /// `<pipeline>/<stage>`, what a redriven message names in `sluice-redrive-to`.
    target: String,
    batch: Option<(usize, Duration)>,
    shutdown_timeout: Duration,
    /// The leases of every fetched, unsettled delivery.
    leases: LeaseKeeper,
    /// Per-key queues of deliveries waiting behind a running one.
    lanes: Lanes,
    /// A plain stage's deliveries, in fetch order, for its worker loops
    /// (`workers`); None for a batched, ordered or deduplicating stage,
    /// which runs a task per delivery or batch.
    queue: Option<(async_channel::Sender<Job>, async_channel::Receiver<Job>)>,
    /// The concurrency valve: free worker slots, shared by the lanes by
    /// the stage's priority policy. Closed when shutdown begins, so that
    /// no handler call starts after it.
    valve: Valve,
    /// Turns true when shutdown begins; wakes retry and dedup pauses.
    halted: watch::Sender<bool>,
    pool: Mutex<Vec<Box<dyn StageHandler>>>,
    /// Resolves claim-check references (None: no claim check configured).
    claims: Option<Arc<Claims>>,
    /// The dedup step (None: the stage does not deduplicate).
    dedup: Option<DedupGate>,
    /// The rate limit and the hold after a `Retry-After`.
    pace: Pace,
    /// Worker slots: `concurrency`, or an adaptive stage's most.
    slots: usize,
    /// An adaptive stage's limit keeper.
    adaptive: Option<Aimd>,
    /// What each attempt's span names: the pipeline, the stage and its
    /// plugin's sha256 (see [`crate::otel`]).
    spans: crate::otel::StageSpans,
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
        let batch = stage.delivery.batch.as_ref().map(|b| {
            (
                usize::try_from(b.max.get()).unwrap_or(usize::MAX),
                b.wait.get(),
            )
        });
        let per_call = batch.map_or(1, |(max, _)| max);
        let max_in_flight = match stage.delivery.max_ack_pending {
            Some(limit) => usize::try_from(limit).unwrap_or(usize::MAX).max(per_call),
            None => (concurrency * per_call * 2).max(DEFAULT_IN_FLIGHT),
        };
        let mut settler = Settler::new(&setup.pipeline, stage, broker.clone(), metrics.clone());
        let dedup = match (dedup, &stage.delivery.dedup) {
            (Some(store), Some(config)) => {
                settler = settler.with_dedup(store.clone());
                Some(DedupGate::new(&setup.pipeline, stage, config, store))
            }
            _ => None,
        };
        let hold_gauge = metrics
            .hold_until
            .get_or_create(&crate::metrics::StageLabels {
                pipeline: setup.pipeline.clone(),
                stage: stage.name.clone(),
            })
            .clone();
        let pace = Pace::new(
            stage,
            &crate::broker::consumer_name(&setup.pipeline, &stage.name),
            broker.shared_rates(),
            hold_gauge,
        );
        let lanes = stage_inputs(&setup.pipeline, stage);
        let lane_count = lanes.len().max(1);
        let several = lane_count > 1;
        let inputs = lanes
            .into_iter()
            .map(|input| Input {
                waits: several
                    .then(|| metrics.lane_waits(&setup.pipeline, &stage.name, &input.topic)),
                topic: input.topic,
                consumer: input.consumer.into(),
                budget: Budget::new(max_in_flight, in_flight_bytes(stage) / lane_count),
            })
            .collect::<Vec<_>>();
        let valve = Valve::new(
            concurrency,
            inputs.len(),
            policy(stage),
            stage.delivery.concurrency.adaptive,
        );
        let limit_gauge = metrics
            .concurrency_limit
            .get_or_create(&crate::metrics::StageLabels {
                pipeline: setup.pipeline.clone(),
                stage: stage.name.clone(),
            })
            .clone();
        limit_gauge.set(i64::try_from(concurrency).unwrap_or(i64::MAX));
        let adaptive = stage
            .delivery
            .concurrency
            .adaptive
            .then(|| Aimd::new(concurrency, limit_gauge));
        // A stage with lanes runs a task per delivery: its worker slots are
        // handed out per lane by the valve, not taken in fetch order.
        // So does a stage limited per key: a message waiting for its key's
        // turn must not hold up a worker that others could use.
        let plain = batch.is_none()
            && stage.delivery.ordering.is_none()
            && dedup.is_none()
            && !several
            && !pace.is_per_key();
        StageRunner {
            settler,
            dedup,
            inputs,
            ack_wait: stage.delivery.ack_wait.get(),
            target: format!("{}/{}", setup.pipeline, stage.name),
            batch,
            shutdown_timeout: setup.shutdown_timeout,
            leases: LeaseKeeper::default(),
            lanes: Lanes::new(stage.delivery.ordering.as_ref().map(|o| o.key.clone())),
            queue: plain.then(async_channel::unbounded),
            valve,
            halted: watch::Sender::new(false),
            pool: Mutex::new(setup.handlers),
            claims,
            broker,
            pace,
            slots: concurrency,
            adaptive,
            spans: crate::otel::StageSpans::new(
                &setup.pipeline,
                &stage.name,
                &stage.subscribe.topics,
                setup.plugin_sha256.as_deref(),
            ),
        }
    }

    /// Runs until `stop` carries the instant shutdown began, then drains
    /// (see [`StageRunner::drain`]). Everything after the stop is bounded by
    /// the stage's deadline, `shutdown_timeout` after that instant: a fetch
    /// or a settle that hangs on a dead broker is abandoned there.
    pub(super) async fn run(self: Arc<Self>, stop: watch::Receiver<Option<Instant>>) {
        let heartbeat = tokio::spawn(self.clone().heartbeat());
        // One set of tasks per lane, each filled by the lane's fetch loop;
        // they outlive the loops, so `drain` can wait for what they run.
        let mut lanes: Vec<JoinSet<()>> = self.inputs.iter().map(|_| JoinSet::new()).collect();
        if let (Some((_, jobs)), Some(tasks)) = (&self.queue, lanes.first_mut()) {
            for _ in 0..self.slots {
                tasks.spawn(self.clone().work(jobs.clone()).in_current_span());
            }
        }
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
            let loops = futures_util::future::join_all(
                lanes
                    .iter_mut()
                    .enumerate()
                    .map(|(lane, tasks)| self.fetch_loop(lane, tasks, stop.clone())),
            );
            tokio::select! {
                _ = loops => {}
                () = cut => tracing::warn!("shutdown deadline reached while the fetch loop was still busy; abandoning it"),
            }
        }
        // The worker loops end once they have taken what is queued (with
        // the valve closed, they start nothing: `drain` hands it back).
        if let Some((queue, _)) = &self.queue {
            queue.close();
        }
        let began = (*stop.borrow()).unwrap_or_else(Instant::now);
        self.drain(lanes, began + self.shutdown_timeout).await;
        heartbeat.abort();
    }

    /// The lane a delivery came in on: the position of its topic.
    fn lane_of(&self, delivery: &Delivery) -> usize {
        if self.inputs.len() == 1 {
            return 0;
        }
        self.inputs
            .iter()
            .position(|input| input.topic == delivery.message.topic)
            .unwrap_or(0)
    }

    /// Takes a worker slot for `delivery`, in its lane's turn; `None` once
    /// shutdown began. A first delivery's wait, from its publish to here,
    /// is recorded for its lane.
    async fn slot_for(&self, delivery: &Delivery) -> Option<Slot> {
        let lane = self.lane_of(delivery);
        let slot = self.valve.acquire(lane).await?;
        if let Some(waits) = &self.inputs[lane].waits
            && delivery.attempt == 1
        {
            waits.record(delivery.message.published_at);
        }
        Some(slot)
    }

    /// Takes a worker slot for a batch (all of one lane: a batch is cut
    /// from one fetch), recording its first deliveries' waits.
    async fn batch_slot(&self, jobs: &[Job]) -> Option<Slot> {
        let lane = jobs.first().map_or(0, |job| self.lane_of(&job.delivery));
        let slot = self.valve.acquire(lane).await?;
        if let Some(waits) = &self.inputs[lane].waits {
            for job in jobs.iter().filter(|job| job.delivery.attempt == 1) {
                waits.record(job.delivery.message.published_at);
            }
        }
        Some(slot)
    }

    /// Closes the concurrency valve: from now on no handler call starts.
    /// Calls already running go on; every delivery that has not started
    /// stays leased until `drain` hands it back.
    pub(super) fn stop_calls(&self) {
        self.valve.close();
        self.halted.send_replace(true);
        // Handlers holding items pending (a sink's open files) finish them
        // now. Those of a sink share one target, so the idle ones reach it.
        for handler in lock(&self.pool).iter() {
            handler.flush();
        }
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

    /// Waits until a call of `cost` messages for `message` may start under
    /// the stage's pace. False if shutdown began meanwhile.
    async fn wait_turn(&self, message: &crate::broker::Message, cost: u32) -> bool {
        if !self.pace.may_wait() {
            return true;
        }
        let mut halted = self.halted.subscribe();
        tokio::select! {
            biased;
            () = self.pace.wait_turn(message, cost) => !self.stopping(),
            _ = halted.wait_for(|halted| *halted) => false,
        }
    }

    /// Takes in a call's time and outcome, for an adaptive stage.
    fn adapt(&self, took: Duration, outcome: &crate::plugin::Outcome) {
        if let Some(adaptive) = &self.adaptive {
            adaptive.observe(took, outcome, &self.valve);
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
}
