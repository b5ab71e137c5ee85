//! One delivery's way through a worker slot: resolve its claim, pass the
//! dedup gate, invoke the handler and settle, then retry in place, or hold
//! it while its target is unavailable, until it is settled; and the batch
//! call, which does the same for a batch's items under one slot.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;

use super::{CALLS, DEDUP_POLL_MAX, DEDUP_POLL_MIN, Job, Slot, StageRunner, lock};
use crate::broker::Delivery;
use crate::broker::Ticket;
use crate::claim::{self, ClaimError};
use crate::engine::dedup::Gate;
use crate::engine::handler::StageHandler;
use crate::engine::settle::Next;
use crate::plugin::Message as PluginMessage;
use crate::state::StateWrites;

/// Per job of a batch call, the outcome still to come, if it is pending.
type Pending = Vec<Option<crate::engine::handler::PendingOutcome>>;

/// How one try of a delivery ended, before its settle.
#[allow(
    clippy::large_enum_variant,
    reason = "returned once per try and matched at once, never stored in bulk"
)]
pub(super) enum Tried {
    /// Shutdown began before the handler call: the delivery is left
    /// unsettled, its lease for `drain` to hand back.
    Left,
    /// Another delivery holds its dedup key: try again after this pause.
    Busy(Duration),
    /// Settled already (as a duplicate); what to do next.
    Settled(Next),
    /// The handler ran, or the claim or dedup step failed: settle this
    /// outcome, with the dedup ticket if the key was taken and the
    /// handler's state writes if it made any.
    Ran(
        crate::plugin::Outcome,
        Option<Ticket>,
        Option<Box<StateWrites>>,
    ),
}

impl StageRunner {
    /// Handles one delivery to the end: invoke, settle, and for an ordered
    /// stage retry in place until it is settled.
    /// `slot` is a worker slot already taken for the first attempt.
    ///
    /// Once shutdown has begun no handler call starts: a delivery that has
    /// not reached its call (or waits for a retry in place) is left
    /// unsettled, its lease in `leases` for `drain` to hand back.
    pub(super) async fn process(&self, job: Job, retry_in_place: bool, mut slot: Option<Slot>) {
        let delivery = &job.delivery;
        let mut attempt = delivery.attempt;
        let mut busy_pause = DEDUP_POLL_MIN;
        let mut hold = Hold::new(self.settler.hold_max());
        loop {
            if self.stopping() {
                return;
            }
            // The attempt's span (none unless traces are exported) covers
            // the handler call and the settle, which reads it back for the
            // outputs' parent.
            let span = self.attempt_span(delivery, attempt);
            let tried = span
                .clone()
                .scope(self.attempt(delivery, attempt, retry_in_place, slot.take()))
                .await;
            // The span ends with the settle (or here), never after a pause.
            let next = match tried {
                Tried::Left => {
                    span.outcome("left", None);
                    return;
                }
                Tried::Busy(pause) => {
                    span.outcome("dedup-wait", None);
                    drop(span);
                    self.pause(pause.min(busy_pause)).await;
                    busy_pause = (busy_pause * 2).min(DEDUP_POLL_MAX);
                    continue;
                }
                Tried::Settled(next) => {
                    drop(span);
                    next
                }
                Tried::Ran(outcome, ticket, state) => {
                    self.pace.observe(&outcome);
                    span.scope(self.settler.settle(
                        delivery,
                        attempt,
                        outcome,
                        retry_in_place,
                        ticket.as_ref(),
                        state.map(|s| *s),
                    ))
                    .await
                }
            };
            match next {
                Next::Done => break,
                Next::RetryAfter(delay) => {
                    self.pause(delay).await;
                    attempt = attempt.saturating_add(1);
                }
                // Same attempt, later: the target is down. The worker slot
                // is free meanwhile and the lease kept.
                Next::Hold(delay) => self.pause(hold.next(delay)).await,
                // Same attempt, at once or nearly: the state it read moved.
                Next::Again(delay) => self.pause(delay).await,
            }
        }
        self.forget(delivery);
    }

    /// The span of one attempt of `delivery` ([`crate::otel`]).
    pub(super) fn attempt_span(&self, delivery: &Delivery, attempt: u32) -> crate::otel::Span {
        crate::otel::attempt_span(
            &self.spans,
            &delivery.message.id,
            &delivery.message.topic,
            attempt,
            &delivery.message.headers,
        )
    }

    /// One try of `delivery` up to its settle: takes a worker slot (unless
    /// `slot` is one), resolves its claim, asks the dedup gate, and invokes
    /// the handler. The slot is free again when this returns.
    pub(super) async fn attempt(
        &self,
        delivery: &Delivery,
        attempt: u32,
        retry_in_place: bool,
        mut slot: Option<Slot>,
    ) -> Tried {
        if !self.wait_turn(&delivery.message, 1).await {
            return Tried::Left;
        }
        // A claim reference is resolved under the valve, so at most
        // `concurrency` claim payloads are in memory at once. An inline
        // message of a dedup stage takes its slot only once the dedup
        // check says it runs (see `run_gated`).
        if slot.is_none() && (self.dedup.is_none() || claim::is_reference(&delivery.message)) {
            match self.slot_for(delivery).await {
                Some(taken) => slot = Some(taken),
                // Closed: shutdown began.
                None => return Tried::Left,
            }
        }
        let message = match self.resolve(delivery, attempt).await {
            Ok(message) => message,
            Err(failure) => return Tried::Ran(Err(failure), None, None),
        };
        let mut gate = self.gate(&message).await;
        if let Gate::Run(Some(ticket)) = &gate
            && slot.is_none()
        {
            // The key is this delivery's, for a lease of one call; the
            // slot may take a while (deliveries queue for it). Should the
            // wait eat into the lease, the key is given back and taken
            // anew with the slot in hand, so the lease covers the call and
            // no copy of the message can take the key and run meanwhile.
            let asked = Instant::now();
            match self.slot_for(delivery).await {
                Some(taken) => slot = Some(taken),
                // Shutdown began: the dedup key's lease runs out and a
                // redelivery takes it.
                None => return Tried::Left,
            }
            if asked.elapsed() > crate::dedup::LEASE_MARGIN / 2
                && let Some(dedup) = &self.dedup
            {
                dedup.release(ticket).await;
                gate = self.gate(&message).await;
            }
        }
        match gate {
            Gate::Run(ticket) => self.run_gated(delivery, &message, ticket, slot).await,
            Gate::Wait(pause) => {
                // Same attempt, later: the key's holder (here or in
                // another daemon) is still at work. The worker slot is
                // free meanwhile, the lease kept.
                drop(slot);
                Tried::Busy(pause)
            }
            Gate::Duplicate {
                outputs,
                completed_at,
            } => {
                drop(slot);
                let next = self
                    .settler
                    .duplicate(delivery, attempt, outputs, completed_at, retry_in_place)
                    .await;
                Tried::Settled(next)
            }
            Gate::Fail(failure) => Tried::Ran(Err(failure), None, None),
        }
    }

    /// Invokes the handler for a message the dedup gate let through,
    /// taking a worker slot first if `slot` is none.
    async fn run_gated(
        &self,
        delivery: &Delivery,
        message: &PluginMessage,
        ticket: Option<Ticket>,
        slot: Option<Slot>,
    ) -> Tried {
        let _slot = match slot {
            Some(slot) => slot,
            None => match self.slot_for(delivery).await {
                Some(taken) => taken,
                // Shutdown began: the dedup key's lease runs out and a
                // redelivery takes it.
                None => return Tried::Left,
            },
        };
        if self.stopping() {
            return Tried::Left;
        }
        let started = Instant::now();
        let (outcome, state) = self.invoke(message).await;
        self.adapt(started.elapsed(), &outcome);
        Tried::Ran(outcome, ticket, state.map(Box::new))
    }

    /// Hands a batch to one worker slot, then settles its items together.
    /// Items whose target is unavailable are held (lease kept, no attempt
    /// spent) and handed over again, as a smaller batch, after a pause.
    pub(super) async fn process_batch(&self, jobs: Vec<Job>) {
        let mut jobs = jobs;
        let mut hold = Hold::new(self.settler.hold_max());
        loop {
            let span = crate::otel::batch_span(
                &self.spans,
                jobs.iter()
                    .map(|job| job.delivery.message.headers.as_slice()),
            );
            let Some((mut outcomes, pending)) = self.call_batch(&jobs).await else {
                // Shutdown began: no call starts; `drain` hands them back.
                return;
            };
            // The span is the call's.
            drop(span);
            // Items the handler took but has not finished (records in an
            // open file) are waited for here, with the worker slot free
            // and their leases kept by the heartbeat.
            let waits = pending
                .into_iter()
                .enumerate()
                .filter_map(|(i, pending)| pending.map(|p| async move { (i, p.await) }));
            for (i, outcome) in futures_util::future::join_all(waits).await {
                if let Some(slot) = outcomes.get_mut(i) {
                    *slot = outcome;
                }
            }
            let mut held = Vec::new();
            let mut settled = Vec::with_capacity(jobs.len());
            let mut wait = Duration::ZERO;
            for (job, outcome) in jobs.into_iter().zip(outcomes) {
                self.pace.observe(&outcome);
                match outcome {
                    Err(failure) if failure.kind == crate::FailureKind::Unavailable => {
                        self.settler.count_failure(crate::FailureKind::Unavailable);
                        wait = wait.max(failure.retry_after.unwrap_or_default());
                        held.push(job);
                    }
                    outcome => settled.push((job, outcome)),
                }
            }
            self.settle_batch(settled).await;
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

    /// Settles a batch's items. Every item is settled on its own (its own
    /// outputs, ack, nak or dead letter), but at once: the successes in one
    /// broker step ([`Settler::complete_all`]: on the embedded broker one
    /// op and one group commit for the batch, not an op, a reply and a
    /// wake-up per item), and the failures, and successes whose completion
    /// failed, concurrently, so they share the group commit or NATS's
    /// pipelining. Batch items are naked for their retries: holding a whole
    /// batch back for one item would stall the rest.
    async fn settle_batch(&self, settled: Vec<(Job, crate::plugin::Outcome)>) {
        let mut succeeded = Vec::with_capacity(settled.len());
        let mut failed = Vec::new();
        for (job, outcome) in settled {
            match outcome {
                Ok(emits) => succeeded.push((job, emits)),
                Err(failure) => failed.push((job, failure)),
            }
        }
        let completed = self
            .settler
            .complete_all(
                succeeded
                    .iter_mut()
                    .map(|(job, emits)| (&job.delivery, std::mem::take(emits)))
                    .collect(),
            )
            .await;
        for ((job, _), result) in succeeded.into_iter().zip(completed) {
            match result {
                Ok(()) => self.forget(&job.delivery),
                Err(failure) => failed.push((job, failure)),
            }
        }
        let failures = failed.into_iter().map(|(job, failure)| async move {
            self.settler.failed(&job.delivery, failure).await;
            self.forget(&job.delivery);
        });
        futures_util::future::join_all(failures).await;
    }

    /// One handler call for `jobs` under a worker slot: an outcome per job,
    /// in order, and the jobs whose outcome is still pending (see
    /// [`StageHandler::take_pending`]). `None` if shutdown began before the
    /// call could start.
    async fn call_batch(&self, jobs: &[Job]) -> Option<(Vec<crate::plugin::Outcome>, Pending)> {
        let first = &jobs.first()?.delivery.message;
        if !self
            .wait_turn(first, u32::try_from(jobs.len()).unwrap_or(u32::MAX))
            .await
        {
            return None;
        }
        let _slot = self.batch_slot(jobs).await?;
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
            Some(handler) => {
                match AssertUnwindSafe(handler.handle_batch(&messages))
                    .catch_unwind()
                    .await
                {
                    Ok(outcomes) => outcomes,
                    Err(panic) => {
                        handler.after_panic();
                        vec![Err(panicked(panic.as_ref())); messages.len()]
                    }
                }
            }
            None => vec![
                Err(crate::Failure::new(
                    crate::FailureKind::Trap,
                    "no worker slot free (engine bug)"
                ));
                messages.len()
            ],
        };
        self.settler.observe(started.elapsed());
        let ok: crate::plugin::Outcome = Ok(Vec::new());
        self.adapt(
            started.elapsed(),
            handled
                .iter()
                .find(|outcome| outcome.is_err())
                .unwrap_or(&ok),
        );
        let mut pending = Vec::new();
        if let Some(mut handler) = handler {
            pending = handler.take_pending();
            lock(&self.pool).push(handler);
        }
        let mut handled = handled.into_iter();
        let mut pending = pending.into_iter();
        let mut waiting = Vec::with_capacity(jobs.len());
        let outcomes = failed
            .into_iter()
            .map(|failure| match failure {
                Some(failure) => {
                    waiting.push(None);
                    Err(failure)
                }
                None => {
                    waiting.push(pending.next().flatten());
                    handled.next().unwrap_or_else(|| {
                        Err(crate::Failure::new(
                            crate::FailureKind::Trap,
                            "no outcome returned",
                        ))
                    })
                }
            })
            .collect();
        Some((outcomes, waiting))
    }

    fn take_handler(&self) -> Option<Box<dyn StageHandler>> {
        lock(&self.pool).pop()
    }

    /// Calls a free handler with `message` (the caller holds a worker
    /// slot). Returns its outcome, and on `ok` the state writes it made.
    async fn invoke(
        &self,
        message: &PluginMessage,
    ) -> (crate::plugin::Outcome, Option<StateWrites>) {
        tracing::debug!(target: CALLS, id = %message.id, attempt = message.attempt, "handler call starts");
        let mut handler = self.take_handler();
        let started = Instant::now();
        let outcome = match handler.as_mut() {
            Some(handler) => match AssertUnwindSafe(handler.handle(message))
                .catch_unwind()
                .await
            {
                Ok(outcome) => outcome,
                Err(panic) => {
                    handler.after_panic();
                    Err(panicked(panic.as_ref()))
                }
            },
            None => Err(crate::Failure::new(
                crate::FailureKind::Trap,
                "no worker slot free (engine bug)",
            )),
        };
        self.settler.observe(started.elapsed());
        let mut state = None;
        let mut outcome = outcome;
        if let Some(mut handler) = handler {
            if let Err(failure) = &mut outcome {
                failure.state_read = handler.state_read();
            }
            // Taken on every outcome, so a failed call's writes are
            // dropped here and never reach the next call.
            state = handler.take_state().filter(|_| outcome.is_ok());
            lock(&self.pool).push(handler);
        }
        (outcome, state)
    }

    /// The dedup step: whether `message` runs, waits, or is a duplicate.
    async fn gate(&self, message: &PluginMessage) -> Gate {
        match &self.dedup {
            Some(gate) => gate.check(message).await,
            None => Gate::Run(None),
        }
    }

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
        // In a traced attempt the handler sees the attempt as its parent.
        crate::otel::reparent(&mut headers);
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
                // The store failing (S3 throttling, a 5xx, a timeout, an
                // I/O error) is an outage, not the message's fault: held
                // without spending attempts, as a sink's target is. An
                // object that is not there, or not the bytes referenced,
                // is the message's: retried, then dead-lettered.
                Err(err @ ClaimError::Store(_)) => {
                    return Err(crate::Failure::new(
                        crate::FailureKind::Unavailable,
                        err.to_string(),
                    ));
                }
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

/// A handler call that panicked (a bug in Sluice's host or a built-in
/// sink, never the guest's: a guest traps) as a failed attempt: retried,
/// then dead-lettered with the panic's message, while the worker slot
/// goes back to the pool instead of being lost with the task.
fn panicked(panic: &(dyn std::any::Any + Send)) -> crate::Failure {
    let said = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    tracing::error!(panic = %said, "a handler call panicked (a bug in Sluice; please report it)");
    crate::Failure::new(
        crate::FailureKind::Trap,
        format!("the handler panicked: {said} (a bug in Sluice; please report it)"),
    )
}
