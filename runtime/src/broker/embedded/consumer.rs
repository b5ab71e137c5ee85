//! A consumer in memory: its cursor, its pending set (delivered, not yet
//! settled) and the timers of leases and nak delays.
//!
//! The pending set is the only per-message state held in memory, and it is
//! bounded by what is in flight or waiting for a redelivery; the backlog
//! past the cursor stays on disk.
//!
//! A receipt is valid while its entry is leased with the same `attempt`.
//! Taking an entry for redelivery bumps the attempt first, under the lock,
//! so a stale holder can never settle what someone else now holds.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::store::PendingRecord;
use super::topic::Topic;
use crate::broker::{BrokerError, ConsumerSpec, Receipt};

/// One delivered, unsettled message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pending {
    /// The attempt of the current (or last) delivery.
    pub attempt: u32,
    /// When it becomes deliverable again (ms since epoch): the lease
    /// deadline while leased, the nak's visible-at otherwise.
    pub due: u64,
    /// Whether a receipt for `attempt` is outstanding.
    pub leased: bool,
    /// A settle of this lease is being committed: the receipt is used up
    /// and the entry is not redelivered, but it stays in the pending set
    /// (holding the retention watermark) until the settle is durable.
    pub settling: bool,
    /// The message's publish time.
    pub published_at: u64,
}

impl Pending {
    /// The durable form: leases are not persisted (a restart expires
    /// them), nak delays are.
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
    /// Delivered, unsettled entries by seq.
    pub pending: BTreeMap<u64, Pending>,
    /// (due, seq) of every entry's current deadline, plus stale ones that
    /// are skipped when popped (an entry's `due` no longer matches).
    pub timers: BinaryHeap<Reverse<(u64, u64)>>,
    /// How many entries are leased.
    pub leased: u64,
    /// (seq, published_at) of the message at the cursor, for `oldest_age`.
    pub cursor_age_cache: Option<(u64, u64)>,
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
    /// Woken when a lease is settled or released, for a fetch held back by
    /// max_ack_pending.
    pub settled: tokio::sync::Notify,
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
            settled: tokio::sync::Notify::new(),
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
            if entry.due != due || entry.settling {
                continue; // stale timer, or being settled
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
                settling: false,
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
        Some(p)
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

    /// Checks a receipt and marks its entry as settling, so the receipt is
    /// used up and the entry is not redelivered. The entry stays in the
    /// pending set (so retention keeps its message) until
    /// [`Consumer::settled`] or [`Consumer::restore`]. On
    /// [`BrokerError::LeaseLost`] nothing changed.
    pub fn take_lease(&self, receipt: &Receipt) -> Result<(), BrokerError> {
        let mut st = self.state();
        check(&st, receipt)?;
        let p = st
            .pending
            .get_mut(&receipt.seq)
            .ok_or_else(|| lost(receipt))?;
        p.settling = true;
        Ok(())
    }

    /// Removes an entry whose settle is durable.
    pub fn settled(&self, seq: u64) {
        let mut st = self.state();
        if st.pending.get(&seq).is_some_and(|p| p.settling) {
            Self::remove_entry(&mut st, seq);
        }
    }

    /// Unmarks an entry marked by [`Consumer::take_lease`] whose settle
    /// was not written (the store could not take it): still leased, so the
    /// same receipt can settle it later.
    pub fn unsettle(&self, seq: u64) {
        let mut st = self.state();
        if let Some(p) = st.pending.get_mut(&seq) {
            p.settling = false;
        }
    }

    /// Releases an entry marked by [`Consumer::take_lease`] when the settle
    /// could not be stored: it becomes due for redelivery now.
    pub fn restore(&self, seq: u64, now: u64) {
        let mut st = self.state();
        let Some(p) = st.pending.get_mut(&seq) else {
            return;
        };
        if !p.settling {
            return;
        }
        p.settling = false;
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
        Some(p) if p.leased && !p.settling && p.attempt == receipt.attempt => Ok(()),
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
