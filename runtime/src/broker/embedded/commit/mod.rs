//! Group commit: one thread is the only writer of the store.
//!
//! Callers send an [`Op`] and await its reply. The committer takes every op
//! that is queued, turns them into ONE fjall write batch (atomic across
//! keyspaces), writes it to the OS, and, under [`SyncMode::Always`], fsyncs
//! once for the whole group before replying. While it fsyncs, the next group
//! queues up, so many concurrent publishes and completes share one fsync.
//! Being the only writer also makes seq assignment, the duplicate window and
//! the topic counters race-free without locks held across I/O.
//!
//! - `op.rs`: the ops and how a group of them is built ([`op::process`]);
//! - `group.rs`: the group's batch, its commit, and the replies it owes;
//! - `state_writes.rs`: handlers' state writes, checked and batched with
//!   their completions;
//! - here: the loop that collects ops into groups, and between groups
//!   (and when idle) runs the maintenance in [`super::retention`] and
//!   reopens a store that failed a write.
//!
//! [`SyncMode::Always`]: super::SyncMode::Always

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use fjall::PersistMode;

use super::Shared;
use super::store::{TopicRecord, decode};
use super::{delayed, retention};
use crate::broker::{BrokerError, now_millis};

pub(super) mod group;
pub(super) mod op;
pub(super) mod state_writes;

pub(super) use group::{Group, Reply};
pub(super) use op::{CompleteItem, Op};

/// Most ops folded into one group, so one group's latency stays bounded.
const MAX_GROUP_OPS: usize = 4096;

/// How often maintenance (retention, duplicate-window expiry) runs.
const MAINTENANCE_EVERY: Duration = Duration::from_millis(200);

/// How soon after a completion what every consumer completed is deleted
/// ([`retention::prune`]). A topic's depth is what its high-water mark
/// counts: at 200 ms a source or producer held at a mark of 1,000 could
/// move at most 5,000 messages a second, whatever the stage's speed.
const PRUNE_AFTER: Duration = Duration::from_millis(10);

/// After a reopen: a write that failed may still have landed whole (fjall
/// had written the batch to the journal before the step that failed, and
/// the reopen replayed it), with the topic records it rewrote. Each
/// topic's counters are raised to what the store recorded, or the next
/// publish would reuse a seq that a deduplicated retry already points at.
/// No write runs meanwhile: the committer refuses until this is done.
fn reconcile(shared: &Shared) {
    let Some(store) = shared.store.current() else {
        return;
    };
    for topic in shared.topic_list() {
        let Ok(Some(bytes)) = store.topics.get(&*topic.name) else {
            continue;
        };
        let Ok(rec) = decode::<TopicRecord>(&bytes) else {
            continue;
        };
        let grew = {
            let mut st = topic.state();
            if rec.delay_seq > st.delay_seq {
                st.delayed = rec.delayed;
                st.delay_seq = rec.delay_seq;
                st.next_due = super::delayed::first_due(&store, topic.id)
                    .ok()
                    .flatten()
                    .unwrap_or(0);
            }
            if rec.last_seq > st.last_seq {
                if st.depth == 0 {
                    st.first_seq = rec.first_seq;
                    st.first_published_at = store
                        .first_message_from(topic.id, rec.first_seq)
                        .ok()
                        .flatten()
                        .map_or(0, |(_, m)| m.published_at);
                }
                st.last_seq = rec.last_seq;
                st.depth = rec.depth;
                true
            } else {
                false
            }
        };
        if grew {
            tracing::info!(topic = %topic.name, last_seq = rec.last_seq, "embedded broker: a failed write had landed; counters raised");
            topic.notify.notify_waiters();
        }
    }
}

/// Pause after a failed attempt to move due delayed messages (a record that
/// does not read), so a damaged one is retried, and counted, but never
/// spun on.
const RELEASE_RETRY: Duration = Duration::from_secs(1);

/// Pause between attempts to reopen a store that failed a write.
const REOPEN_EVERY: Duration = Duration::from_secs(1);

/// Reopens a store that failed a write, on a thread of its own so the
/// committer keeps answering (503) at once meanwhile.
#[derive(Default)]
struct Reopener {
    /// The attempt running now.
    running: Option<std::thread::JoinHandle<()>>,
    /// Not before this.
    next: Option<Instant>,
}

impl Reopener {
    /// After a failed write fjall refuses every later one (it poisons
    /// itself), so the store is closed and opened again, one attempt at a
    /// time with [`REOPEN_EVERY`] between them, until a probe write and
    /// fsync succeed: the disk has room again, descriptors are free.
    /// Meanwhile writes answer [`BrokerError::Unavailable`] and the broker
    /// is not ready.
    fn poke(&mut self, shared: &Arc<Shared>) {
        if self.running.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        if let Some(done) = self.running.take() {
            let _ = done.join();
            self.next = Some(Instant::now() + REOPEN_EVERY);
        }
        if self.next.is_some_and(|next| Instant::now() < next) {
            return;
        }
        let shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("sluice-broker-reopen".into())
            .spawn(move || {
                shared.store.close();
                match shared.store.reopen() {
                    Ok(()) => {
                        state_writes::forget(&shared);
                        reconcile(&shared);
                        shared.health.recovered();
                        tracing::info!("embedded broker: the store takes writes again");
                    }
                    Err(e) => {
                        shared.health.count_error();
                        tracing::warn!(error = %e, "embedded broker: the store still cannot take writes; retrying");
                    }
                }
            });
        match spawned {
            Ok(handle) => self.running = Some(handle),
            Err(e) => tracing::warn!(error = %e, "embedded broker: cannot start a reopen"),
        }
    }

    /// Waits for a running attempt (on shutdown).
    fn finish(&mut self) {
        if let Some(handle) = self.running.take() {
            let _ = handle.join();
        }
    }
}

/// The committer thread's loop: groups ops until the channel closes.
pub(super) fn run(shared: Arc<Shared>, rx: Receiver<Op>) {
    let mut last_maintenance = Instant::now();
    // When completed messages are next deleted, if any were completed since.
    let mut prune_at: Option<Instant> = None;
    let mut reopener = Reopener::default();
    let mut ops = Vec::with_capacity(MAX_GROUP_OPS);
    // After a release fails, not again before this.
    let mut release_after: Option<Instant> = None;
    loop {
        let mut wait = MAINTENANCE_EVERY.saturating_sub(last_maintenance.elapsed());
        if let Some(at) = prune_at {
            wait = wait.min(at.saturating_duration_since(Instant::now()));
        }
        let due = delayed::next_due(&shared);
        if let Some(due) = due {
            wait = wait.min(Duration::from_millis(due.saturating_sub(now_millis())));
        }
        match rx.recv_timeout(wait) {
            Ok(op) => {
                ops.push(op);
                while ops.len() < MAX_GROUP_OPS {
                    match rx.try_recv() {
                        Ok(op) => ops.push(op),
                        Err(_) => break,
                    }
                }
                match (shared.health.write_failure(), shared.store.current()) {
                    (None, Some(store)) => {
                        if op::process(&shared, store, &mut ops) && prune_at.is_none() {
                            prune_at = Some(Instant::now() + PRUNE_AFTER);
                        }
                    }
                    (why, _) => {
                        let e = BrokerError::Unavailable(format!(
                            "the store cannot take writes now ({})",
                            why.unwrap_or_else(|| "it is being reopened".into())
                        ));
                        for op in ops.drain(..) {
                            op::refuse(op, &e);
                        }
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if due.is_some_and(|due| due <= now_millis())
            && release_after.is_none_or(|at| at <= Instant::now())
            && shared.health.write_failure().is_none()
            && let Some(store) = shared.store.current()
        {
            release_after = None;
            if let Err(e) = delayed::release(&shared, store) {
                shared.health.count_error();
                tracing::error!(error = %e, "embedded broker: moving due delayed messages into their topics failed; retrying in 1 s");
                release_after = Some(Instant::now() + RELEASE_RETRY);
            }
        }
        if last_maintenance.elapsed() >= MAINTENANCE_EVERY {
            if shared.health.write_failure().is_some() {
                reopener.poke(&shared);
            } else if let Err(e) = retention::maintain(&shared) {
                tracing::warn!(error = %e, "embedded broker maintenance failed");
            }
            last_maintenance = Instant::now();
            prune_at = None;
        } else if prune_at.is_some_and(|at| at <= Instant::now()) {
            prune_at = None;
            if shared.health.write_failure().is_none()
                && let Err(e) = retention::prune(&shared)
            {
                tracing::warn!(error = %e, "embedded broker: deleting completed messages failed");
            }
        }
    }
    reopener.finish();
    if shared.health.write_failure().is_none()
        && let Some(store) = shared.store.current()
    {
        // The last floors, so a clean stop delivers nothing twice.
        let mut group = Group::new(&shared, store.clone());
        let mut early = Vec::new();
        group.write_positions(true, &mut early);
        group.commit(false, false, early, Vec::new());
    }
    if let Some(store) = shared.store.current()
        && let Err(e) = store.db.persist(PersistMode::SyncAll)
    {
        tracing::error!(error = %e, "embedded broker final fsync failed");
    }
}
