//! The leases a stage holds: every fetched, unsettled delivery is in its
//! [`LeaseKeeper`], so the heartbeat extends it while it waits or runs, and
//! shutdown hands it back (nak) rather than leave it to expire.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::{RELEASE_GRACE, StageRunner, lock};
use crate::broker::{Delivery, Receipt};

/// The leases of a stage's fetched, unsettled deliveries, by lane and
/// seq (seqs are per topic, and a stage with lanes reads several).
#[derive(Default)]
pub(super) struct LeaseKeeper {
    leases: Mutex<HashMap<(usize, u64), Receipt>>,
}

impl LeaseKeeper {
    /// Records the leases of fresh deliveries.
    pub(super) fn remember(&self, lane: usize, deliveries: &[Delivery]) {
        let mut leases = lock(&self.leases);
        for delivery in deliveries {
            leases.insert((lane, delivery.seq), delivery.receipt.clone());
        }
    }

    /// Forgets a settled delivery's lease.
    pub(super) fn forget(&self, lane: usize, seq: u64) {
        lock(&self.leases).remove(&(lane, seq));
    }

    /// Every lease held now.
    fn held(&self) -> Vec<Receipt> {
        lock(&self.leases).values().cloned().collect()
    }

    /// Every lease held now, forgotten: the caller hands them back.
    fn take_all(&self) -> Vec<Receipt> {
        lock(&self.leases).drain().map(|(_, r)| r).collect()
    }
}

impl StageRunner {
    pub(super) fn remember(&self, lane: usize, deliveries: &[Delivery]) {
        self.leases.remember(lane, deliveries);
    }

    pub(super) fn forget(&self, delivery: &Delivery) {
        self.leases.forget(self.lane_of(delivery), delivery.seq);
    }

    /// Extends every unsettled lease at a third of `ack_wait`, so a slow
    /// handler (or a delivery queued in a lane) is never redelivered while
    /// this daemon still holds it.
    pub(super) async fn heartbeat(self: Arc<Self>) {
        let period = (self.ack_wait / 3).max(Duration::from_millis(50));
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let receipts = self.leases.held();
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
    pub(super) async fn drain(&self, mut lanes: Vec<JoinSet<()>>, deadline: Instant) {
        let queued: Vec<Receipt> = self
            .lanes
            .take_queued()
            .into_iter()
            .map(|job| {
                self.forget(&job.delivery);
                job.delivery.receipt.clone()
            })
            .collect();
        self.release_all(queued, deadline).await;
        let finished = tokio::time::timeout_at(deadline.into(), async {
            for tasks in &mut lanes {
                while tasks.join_next().await.is_some() {}
            }
        })
        .await;
        if finished.is_err() {
            tracing::warn!(
                running = lanes.iter().map(JoinSet::len).sum::<usize>(),
                timeout = ?self.shutdown_timeout,
                "shutdown timeout reached; abandoning running handler calls and settles, their messages will be redelivered"
            );
            for tasks in &mut lanes {
                tasks.abort_all();
            }
            // An aborted task ends at its next await point (a guest call
            // yields at every epoch tick), so this is quick.
            let _ = tokio::time::timeout(RELEASE_GRACE, async {
                for tasks in &mut lanes {
                    while tasks.join_next().await.is_some() {}
                }
            })
            .await;
            for tasks in &mut lanes {
                tasks.detach_all();
            }
        }
        let left = self.leases.take_all();
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
