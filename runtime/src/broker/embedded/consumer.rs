//! A consumer in memory: its cursor, its pending set (delivered, not yet
//! completed) and the timers of leases and nak delays.
//!
//! The pending set is the only per-message state held in memory, and it is
//! bounded by what is in flight or waiting for a redelivery; the backlog
//! past the cursor stays on disk.
//!
//! A first delivery has no pending record in the store (see
//! [`super::store::Position`]): it is in `unrecorded` until a record is
//! written for it (a redelivery, a nak, or a floor held back too long), and
//! the lowest unrecorded seq is the consumer's floor.
//!
//! A receipt is valid while its entry is leased with the same `attempt`.
//! Taking an entry for redelivery bumps the attempt first, under the lock,
//! so a stale holder can never complete what someone else now holds.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::store::PendingRecord;
use super::topic::Topic;
use crate::broker::{BrokerError, ConsumerSpec, Receipt};

/// One delivered, uncompleted message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pending {
    /// The attempt of the current (or last) delivery.
    pub attempt: u32,
    /// When it becomes deliverable again (ms since epoch): the lease
    /// deadline while leased, the nak's visible-at otherwise.
    pub due: u64,
    /// Whether a receipt for `attempt` is outstanding.
    pub leased: bool,
    /// A completion of this lease is being committed: the receipt is used up
    /// and the entry is not redelivered, but it stays in the pending set
    /// (holding the retention watermark) until the completion is durable.
    pub completing: bool,
    /// The message's publish time.
    pub published_at: u64,
}

impl Pending {
    /// The durable form, for a redelivery, a nak or a floor held too far
    /// back: leases are not persisted (a restart expires them), nak delays
    /// are.
    pub fn record(&self) -> PendingRecord {
        PendingRecord {
            attempt: self.attempt,
            visible_at: if self.leased { 0 } else { self.due },
            published_at: self.published_at,
        }
    }
}

/// The mutable part of a consumer.
pub(super) struct ConsumerState {
    /// The spec as last ensured.
    pub spec: ConsumerSpec,
    /// The next seq to look at for a first delivery.
    pub cursor: u64,
    /// Delivered, uncompleted entries by seq.
    pub pending: BTreeMap<u64, Pending>,
    /// (due, seq) of every entry's current deadline, plus stale ones that
    /// are skipped when popped (an entry's `due` no longer matches).
    pub timers: BinaryHeap<Reverse<(u64, u64)>>,
    /// How many entries are leased.
    pub leased: u64,
    /// (seq, published_at) of the message at the cursor, for `oldest_age`.
    pub cursor_age_cache: Option<(u64, u64)>,
    /// Pending entries with no pending record in the store (first
    /// deliveries): the lowest is the floor.
    pub unrecorded: BTreeSet<u64>,
    /// The floor may have risen since it was last written.
    pub floor_dirty: bool,
    /// Completed runs of first deliveries above the floor, as stored
    /// (`settled` keyspace): start -> end (exclusive).
    pub completed_runs: BTreeMap<u64, u64>,
    /// Paused: fetches deliver nothing (leases already out stay valid).
    pub paused: bool,
}

impl ConsumerState {
    /// A consumer state at `cursor` with nothing pending.
    pub fn new(spec: ConsumerSpec, cursor: u64) -> ConsumerState {
        ConsumerState {
            spec,
            cursor,
            pending: BTreeMap::new(),
            timers: BinaryHeap::new(),
            leased: 0,
            cursor_age_cache: None,
            unrecorded: BTreeSet::new(),
            floor_dirty: false,
            completed_runs: BTreeMap::new(),
            paused: false,
        }
    }
}

/// How far the floor may trail the cursor before the oldest unrecorded
/// entries get pending records, so the floor can rise: this bounds what a
/// crash delivers again (completed messages in `floor..cursor`) when one
/// delivery is slow while thousands after it complete.
pub(super) const MAX_FLOOR_LAG: u64 = 10_000;

/// What the committer writes for a consumer's position.
pub(super) struct PositionUpdate {
    /// The cursor in memory.
    pub cursor: u64,
    /// The lowest unrecorded seq not being completed now, or the cursor.
    pub floor: u64,
    /// Unrecorded entries far below the cursor, to record now:
    /// (seq, their durable form).
    pub to_record: Vec<(u64, PendingRecord)>,
    /// Runs of first deliveries completed now above the floor, to store:
    /// (start, end exclusive).
    pub new_runs: Vec<(u64, u64)>,
    /// Stored runs now wholly below the floor, to delete (their starts).
    pub dropped_runs: Vec<u64>,
}

/// A durable consumer.
pub(super) struct Consumer {
    /// Short id used in keys.
    pub id: u32,
    /// `<pipeline>.<stage>`.
    pub name: Arc<str>,
    /// The topic it reads.
    pub topic: Arc<Topic>,
    /// Cursor, pending set, timers.
    state: Mutex<ConsumerState>,
    /// Serialises fetches (and spec updates), so two fetches never read the
    /// same new messages.
    pub fetch_lock: tokio::sync::Mutex<()>,
    /// Woken when a lease is completed or released, for a fetch held back by
    /// max_ack_pending.
    pub freed: tokio::sync::Notify,
}

/// A redelivery picked by [`Consumer::take_due`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Redelivery {
    /// The message's seq.
    pub seq: u64,
    /// The new attempt.
    pub pending: Pending,
    /// The entry as it was before it was taken, for [`Consumer::untake`].
    pub previous: Pending,
}

impl Consumer {
    /// A consumer with the given state.
    pub fn new(id: u32, topic: Arc<Topic>, state: ConsumerState) -> Consumer {
        Consumer {
            id,
            name: state.spec.name.as_str().into(),
            topic,
            state: Mutex::new(state),
            fetch_lock: tokio::sync::Mutex::new(()),
            freed: tokio::sync::Notify::new(),
        }
    }

    /// Locks the state (poison-tolerant: every update leaves it valid).
    pub fn state(&self) -> MutexGuard<'_, ConsumerState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The lease length.
    pub fn ack_wait_ms(state: &ConsumerState) -> u64 {
        u64::try_from(state.spec.ack_wait.as_millis()).unwrap_or(u64::MAX)
    }

    /// Takes up to `max` due redeliveries (expired leases and elapsed nak
    /// delays), leasing each with attempt+1. `allowance` is how many more
    /// leases max_ack_pending permits; re-leasing an expired lease does not
    /// use it up. Returns them and the remaining allowance.
    pub fn take_due(&self, now: u64, max: usize, mut allowance: u64) -> (Vec<Redelivery>, u64) {
        let mut st = self.state();
        let lease = now.saturating_add(Self::ack_wait_ms(&st));
        let mut out = Vec::new();
        let mut deferred = Vec::new();
        while out.len() < max {
            let Some(&Reverse((due, seq))) = st.timers.peek() else {
                break;
            };
            if due > now {
                break;
            }
            st.timers.pop();
            let Some(entry) = st.pending.get(&seq).copied() else {
                continue;
            };
            if entry.due != due || entry.completing {
                continue; // stale timer, or being completed
            }
            if !entry.leased {
                if allowance == 0 {
                    deferred.push(Reverse((due, seq)));
                    continue;
                }
                allowance -= 1;
            }
            let next = Pending {
                attempt: entry.attempt.saturating_add(1),
                due: lease,
                leased: true,
                completing: false,
                published_at: entry.published_at,
            };
            if !entry.leased {
                st.leased += 1;
            }
            st.pending.insert(seq, next);
            st.timers.push(Reverse((lease, seq)));
            out.push(Redelivery {
                seq,
                pending: next,
                previous: entry,
            });
        }
        st.timers.extend(deferred);
        (out, allowance)
    }

    /// Puts back redeliveries [`Consumer::take_due`] handed out that the
    /// fetch did not deliver (they did not fit its byte limit): due as
    /// they were, with their attempt count, and not counted as leased if
    /// they were not. One changed meanwhile is left as it is now.
    pub fn untake(&self, taken: &[Redelivery]) {
        let mut st = self.state();
        for r in taken {
            if st.pending.get(&r.seq) != Some(&r.pending) {
                continue;
            }
            if !r.previous.leased {
                st.leased = st.leased.saturating_sub(1);
            }
            st.pending.insert(r.seq, r.previous);
            st.timers.push(Reverse((r.previous.due, r.seq)));
        }
    }

    /// How many new leases max_ack_pending permits now.
    pub fn allowance(&self) -> u64 {
        let st = self.state();
        match st.spec.max_ack_pending {
            Some(m) => u64::from(m).saturating_sub(st.leased),
            None => u64::MAX,
        }
    }

    /// The earliest timer, if any (may be stale: waking early is harmless).
    pub fn next_due(&self) -> Option<u64> {
        self.state().timers.peek().map(|Reverse((due, _))| *due)
    }

    /// Records first deliveries read past the cursor and moves the cursor.
    pub fn add_leases(&self, cursor: u64, leases: &[(u64, Pending)]) {
        let mut st = self.state();
        st.cursor = st.cursor.max(cursor);
        for &(seq, p) in leases {
            if st.pending.insert(seq, p).is_none_or(|old| !old.leased) {
                st.leased += 1;
            }
            st.unrecorded.insert(seq);
            st.timers.push(Reverse((p.due, seq)));
        }
        Self::compact_timers(&mut st);
    }

    /// Drops entries whose message no longer exists, if still at `attempt`.
    pub fn drop_vanished(&self, seqs: &[(u64, u32)]) {
        let mut st = self.state();
        for &(seq, attempt) in seqs {
            if st.pending.get(&seq).is_some_and(|p| p.attempt == attempt) {
                Self::remove_entry(&mut st, seq);
            }
        }
    }

    /// Removes an entry, keeping the counters right.
    fn remove_entry(st: &mut ConsumerState, seq: u64) -> Option<Pending> {
        let p = st.pending.remove(&seq)?;
        if p.leased {
            st.leased -= 1;
        }
        if st.unrecorded.remove(&seq) {
            st.floor_dirty = true;
        }
        Some(p)
    }

    /// Whether `seq` has a pending record in the store (or is not pending).
    pub fn is_recorded(&self, seq: u64) -> bool {
        !self.state().unrecorded.contains(&seq)
    }

    /// Notes that pending records were written for these (seq, attempt):
    /// each entry still at that attempt no longer holds the floor down.
    pub fn mark_recorded(&self, entries: &[(u64, u32)]) {
        let mut st = self.state();
        for &(seq, attempt) in entries {
            if st.pending.get(&seq).is_some_and(|p| p.attempt == attempt)
                && st.unrecorded.remove(&seq)
            {
                st.floor_dirty = true;
            }
        }
    }

    /// The position to write, given the unrecorded entries this group
    /// completions (`completing_now`, sorted), if the floor may have moved
    /// (`force`: write it anyway); clears the dirty mark.
    ///
    /// The floor is the lowest unrecorded entry not completed now. Entries
    /// completed now above it become runs: a run spans completed entries with
    /// no uncompleted first delivery between them, so a batch completed out of
    /// order is one record, not one per message. When the floor trails
    /// the cursor by more than [`MAX_FLOOR_LAG`], the oldest unrecorded
    /// entries are handed out to be recorded (they stay unrecorded until
    /// [`Consumer::mark_recorded`], after the write).
    pub fn position_update(&self, force: bool, completing_now: &[u64]) -> Option<PositionUpdate> {
        let mut st = self.state();
        if !st.floor_dirty && !force && completing_now.is_empty() {
            return None;
        }
        st.floor_dirty = false;
        let cursor = st.cursor;
        let completing = |seq: &u64| completing_now.binary_search(seq).is_ok();
        let floor = st
            .unrecorded
            .iter()
            .find(|seq| !completing(seq))
            .copied()
            .unwrap_or(cursor)
            .min(cursor);
        let mut new_runs: Vec<(u64, u64)> = Vec::new();
        for &seq in completing_now.iter().filter(|s| **s >= floor) {
            if let Some(last) = new_runs.last_mut()
                && st.unrecorded.range(last.1..seq).all(completing)
            {
                last.1 = seq + 1;
                continue;
            }
            new_runs.push((seq, seq + 1));
        }
        let dropped_runs = st
            .completed_runs
            .iter()
            .take_while(|(start, _)| **start < floor)
            .filter(|(_, end)| **end <= floor)
            .map(|(start, _)| *start)
            .collect();
        let mut to_record = Vec::new();
        if cursor - floor > MAX_FLOOR_LAG {
            let below = cursor - MAX_FLOOR_LAG / 2;
            for seq in st.unrecorded.range(..below) {
                if let Some(p) = st.pending.get(seq)
                    && !p.completing
                {
                    to_record.push((*seq, p.record()));
                }
            }
        }
        Some(PositionUpdate {
            cursor,
            floor,
            to_record,
            new_runs,
            dropped_runs,
        })
    }

    /// Applies the runs a written position stored and deleted.
    pub fn apply_runs(&self, new_runs: &[(u64, u64)], dropped_runs: &[u64]) {
        let mut st = self.state();
        for start in dropped_runs {
            st.completed_runs.remove(start);
        }
        st.completed_runs.extend(new_runs.iter().copied());
    }

    /// Whether a stored run covers `seq`.
    pub fn in_completed_run(st: &ConsumerState, seq: u64) -> bool {
        st.completed_runs
            .range(..=seq)
            .next_back()
            .is_some_and(|(_, end)| seq < *end)
    }

    /// Removes every pending entry with seq in `seqs` or `< below`
    /// (messages that retention or `remove` deleted). Returns their seqs.
    pub fn drop_removed(&self, seqs: &[u64], below: u64) -> Vec<u64> {
        let mut st = self.state();
        let mut gone: Vec<u64> = st.pending.range(..below).map(|(s, _)| *s).collect();
        gone.extend(seqs.iter().filter(|s| st.pending.contains_key(s)));
        for seq in &gone {
            Self::remove_entry(&mut st, *seq);
        }
        gone
    }

    /// Checks a receipt and marks its entry as completing, so the receipt is
    /// used up and the entry is not redelivered. The entry stays in the
    /// pending set (so retention keeps its message) until
    /// [`Consumer::completed`] or [`Consumer::restore`]. On
    /// [`BrokerError::LeaseLost`] nothing changed.
    pub fn take_lease(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        let mut st = self.state();
        check(&st, receipt)?;
        let p = st
            .pending
            .get_mut(&receipt.seq)
            .ok_or_else(|| lost(receipt))?;
        p.completing = true;
        Ok(())
    }

    /// Removes an entry whose completion is durable.
    pub fn completed(&self, seq: u64) {
        let mut st = self.state();
        if st.pending.get(&seq).is_some_and(|p| p.completing) {
            Self::remove_entry(&mut st, seq);
        }
    }

    /// Unmarks an entry marked by [`Consumer::take_lease`] whose completion
    /// was not written (the store could not take it): still leased, so the
    /// same receipt can complete it later.
    pub fn abandon_completion(&self, seq: u64) {
        let mut st = self.state();
        if let Some(p) = st.pending.get_mut(&seq) {
            p.completing = false;
        }
    }

    /// Releases an entry marked by [`Consumer::take_lease`] when the completion
    /// could not be stored: it becomes due for redelivery now.
    pub fn restore(&self, seq: u64, now: u64) {
        let mut st = self.state();
        let Some(p) = st.pending.get_mut(&seq) else {
            return;
        };
        if !p.completing {
            return;
        }
        p.completing = false;
        p.leased = false;
        p.due = now;
        st.leased -= 1;
        st.timers.push(Reverse((now, seq)));
    }

    /// Checks a receipt and releases its entry until `visible_at`. Returns
    /// the durable form to store.
    pub fn release(
        &self,
        receipt: &Receipt,
        visible_at: u64,
    ) -> Result<PendingRecord, BrokerError> {
        let mut st = self.state();
        check(&st, receipt)?;
        let p = st
            .pending
            .get_mut(&receipt.seq)
            .ok_or_else(|| lost(receipt))?;
        p.leased = false;
        p.due = visible_at;
        let record = p.record();
        st.leased -= 1;
        st.timers.push(Reverse((visible_at, receipt.seq)));
        Ok(record)
    }

    /// Checks a receipt and extends its lease by ack_wait from `now`.
    pub fn extend(&self, receipt: &Receipt, now: u64) -> Result<(), BrokerError> {
        let mut st = self.state();
        check(&st, receipt)?;
        let due = now.saturating_add(Self::ack_wait_ms(&st));
        if let Some(p) = st.pending.get_mut(&receipt.seq) {
            p.due = due;
        }
        st.timers.push(Reverse((due, receipt.seq)));
        Self::compact_timers(&mut st);
        Ok(())
    }

    /// The low watermark for retention: nothing below it is needed by
    /// this consumer.
    pub fn watermark(&self) -> u64 {
        let st = self.state();
        st.pending
            .first_key_value()
            .map_or(st.cursor, |(s, _)| (*s).min(st.cursor))
    }

    /// Rebuilds the timer heap when stale entries dominate, so a busy
    /// consumer's heap stays proportional to its pending set.
    fn compact_timers(st: &mut ConsumerState) {
        if st.timers.len() > 1024 && st.timers.len() > 2 * st.pending.len() {
            st.timers = st
                .pending
                .iter()
                .map(|(seq, p)| Reverse((p.due, *seq)))
                .collect();
        }
    }

    /// Replaces the spec (ack_wait, filter, max_ack_pending).
    pub fn set_spec(&self, spec: ConsumerSpec) {
        self.state().spec = spec;
    }
}

/// Whether `receipt` names the current lease.
fn check(st: &ConsumerState, receipt: &Receipt) -> Result<(), BrokerError> {
    match st.pending.get(&receipt.seq) {
        Some(p) if p.leased && !p.completing && p.attempt == receipt.attempt => Ok(()),
        _ => Err(lost(receipt)),
    }
}

/// The error for a stale receipt.
fn lost(receipt: &Receipt) -> BrokerError {
    BrokerError::LeaseLost(format!(
        "{} seq {} attempt {}",
        receipt.consumer, receipt.seq, receipt.attempt
    ))
}

/// A duration in ms, saturating.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::embedded::topic::TopicState;

    /// A consumer at `cursor` whose first deliveries `seqs` are out.
    fn consumer(cursor: u64, seqs: &[u64]) -> Consumer {
        let topic = Arc::new(Topic::new(
            1,
            "t",
            TopicState {
                first_seq: 1,
                last_seq: cursor,
                depth: cursor,
                ..TopicState::default()
            },
        ));
        let spec = ConsumerSpec {
            name: "p.s".into(),
            topic: "t".into(),
            filter: Default::default(),
            ack_wait: Duration::from_secs(30),
            max_ack_pending: None,
            max_deliver: None,
        };
        let c = Consumer::new(1, topic, ConsumerState::new(spec, 1));
        let lease = Pending {
            attempt: 1,
            due: u64::MAX,
            leased: true,
            completing: false,
            published_at: 0,
        };
        let leases: Vec<(u64, Pending)> = seqs.iter().map(|s| (*s, lease)).collect();
        c.add_leases(cursor, &leases);
        c
    }

    #[test]
    fn the_floor_is_the_lowest_first_delivery_not_completing_now() {
        let c = consumer(11, &(1..=10).collect::<Vec<_>>());
        let u = c.position_update(false, &[1, 2, 3]).expect("an update");
        assert_eq!((u.cursor, u.floor), (11, 4));
        assert!(u.new_runs.is_empty(), "completed in order: no runs");
        // Nothing out: the floor is the cursor.
        let idle = consumer(11, &[]);
        let u = idle.position_update(true, &[]).expect("forced");
        assert_eq!(u.floor, 11);
        assert!(
            idle.position_update(false, &[]).is_none(),
            "nothing to write"
        );
    }

    #[test]
    fn completions_above_the_floor_become_runs_split_by_what_is_still_out() {
        let c = consumer(11, &(1..=10).collect::<Vec<_>>());
        // 1 and 6 stay out; 2..=5 and 7..=10 complete now.
        let u = c
            .position_update(false, &[2, 3, 4, 5, 7, 8, 9, 10])
            .expect("an update");
        assert_eq!(u.floor, 1);
        assert_eq!(u.new_runs, vec![(2, 6), (7, 11)]);
        c.apply_runs(&u.new_runs, &u.dropped_runs);
        let st = c.state();
        assert!(Consumer::in_completed_run(&st, 5) && Consumer::in_completed_run(&st, 10));
        assert!(!Consumer::in_completed_run(&st, 6) && !Consumer::in_completed_run(&st, 1));
    }

    #[test]
    fn runs_below_a_risen_floor_are_dropped() {
        let c = consumer(11, &(1..=10).collect::<Vec<_>>());
        let u = c.position_update(false, &[3, 4]).expect("an update");
        c.apply_runs(&u.new_runs, &u.dropped_runs);
        for seq in [3, 4] {
            c.take_lease(&Receipt {
                consumer: "p.s".into(),
                seq,
                attempt: 1,
                handle: String::new(),
            })
            .expect("lease");
            c.completed(seq);
        }
        // 1 and 2 complete now: the floor passes the run [3, 5).
        let u = c.position_update(false, &[1, 2]).expect("an update");
        assert_eq!(u.floor, 5);
        assert_eq!(u.dropped_runs, vec![3]);
    }

    #[test]
    fn a_floor_held_far_below_the_cursor_gets_its_holders_recorded() {
        let cursor = MAX_FLOOR_LAG + 100;
        let c = consumer(cursor, &[1, 2, cursor - 1]);
        let u = c.position_update(true, &[]).expect("an update");
        assert_eq!(u.floor, 1);
        let recorded: Vec<u64> = u.to_record.iter().map(|(s, _)| *s).collect();
        assert_eq!(recorded, vec![1, 2], "the old ones, not the recent one");
        c.mark_recorded(&[(1, 1), (2, 1)]);
        let u = c.position_update(true, &[]).expect("an update");
        assert_eq!(u.floor, cursor - 1);
        assert!(u.to_record.is_empty());
        assert!(c.is_recorded(1) && !c.is_recorded(cursor - 1));
    }
}
