//! The worker loops of a plain stage (unbatched, unordered, without
//! dedup): `concurrency` long-lived tasks that take fetched deliveries in
//! fetch order, each under a worker slot, call the handler, and settle in
//! the background, instead of a task per delivery. A task per delivery was
//! 1.5 µs of the stage's 11 µs of CPU per message over the raw broker loop
//! (BENCHMARKS.md, the stage hop).
//!
//! Settling (the broker's round trip) does not hold a worker: each loop
//! keeps its deliveries' settles in flight beside its next call. A delivery
//! whose settle says "later" (its target is unavailable) goes on, among
//! them, through the per-delivery path ([`StageRunner::process`]), which
//! holds and retries it as ever.

use std::sync::Arc;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;

use super::attempt::Tried;
use super::{Job, StageRunner};
use crate::engine::settle::Next;

impl StageRunner {
    /// One worker loop: runs until the queue is closed and empty, or until
    /// shutdown closes the valve, then finishes the settles it started.
    ///
    /// The settles in flight are polled all the while, also while the loop
    /// waits for a job or a worker slot and while the handler runs: a held
    /// delivery among them may hold a slot of its own (its retry calls the
    /// handler), and must be able to finish and give it back.
    pub(super) async fn work(self: Arc<Self>, jobs: async_channel::Receiver<Job>) {
        let mut settling = FuturesUnordered::new();
        loop {
            let next = async {
                let job = jobs.recv().await.ok()?;
                // `None` once shutdown closed the valve: no call starts,
                // the lease stays in the keeper and `drain` hands it back.
                let slot = self.slot_for(&job.delivery).await?;
                Some((job, slot))
            };
            let Some((job, slot)) = beside(&mut settling, next).await else {
                break;
            };
            let attempt = job.delivery.attempt;
            // None unless traces are exported (see `process`).
            let span = self.attempt_span(&job.delivery, attempt);
            let tried = beside(
                &mut settling,
                span.clone()
                    .scope(self.attempt(&job.delivery, attempt, false, Some(slot))),
            )
            .await;
            if matches!(tried, Tried::Left) {
                span.outcome("left", None);
                break;
            }
            settling.push(self.clone().finish(job, attempt, tried, span));
        }
        while settling.next().await.is_some() {}
    }

    /// Settles a worker's try of `job`; a delivery that is not done (held
    /// while its target is unavailable) goes on through
    /// [`StageRunner::process`] after its pause.
    async fn finish(
        self: Arc<Self>,
        job: Job,
        attempt: u32,
        tried: Tried,
        span: crate::otel::Span,
    ) {
        // The span ends with the settle (or here), never after a pause.
        let next = match tried {
            Tried::Left => return,
            Tried::Settled(next) => {
                drop(span);
                next
            }
            Tried::Ran(outcome, ticket, state) => {
                self.pace.observe(&outcome);
                span.scope(self.settler.settle(
                    &job.delivery,
                    attempt,
                    outcome,
                    false,
                    ticket.as_ref(),
                    state.map(|s| *s),
                ))
                .await
            }
            // A plain stage has no dedup gate, so no key is ever busy;
            // were one, the per-delivery path asks again.
            Tried::Busy(pause) => {
                drop(span);
                Next::Hold(pause)
            }
        };
        match next {
            Next::Done => self.forget(&job.delivery),
            Next::Hold(delay) | Next::RetryAfter(delay) | Next::Again(delay) => {
                self.pause(delay).await;
                self.process(job, false, None).await;
            }
        }
    }
}

/// Runs `work` to its end while also driving the futures in `settling`
/// (those that finish meanwhile are dropped, done).
async fn beside<T, F, S>(settling: &mut FuturesUnordered<S>, work: F) -> T
where
    F: std::future::Future<Output = T>,
    S: std::future::Future<Output = ()>,
{
    tokio::pin!(work);
    loop {
        tokio::select! {
            biased;
            Some(()) = settling.next(), if !settling.is_empty() => {}
            done = &mut work => return done,
        }
    }
}
