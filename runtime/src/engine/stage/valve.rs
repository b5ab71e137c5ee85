//! The concurrency valve: a stage's `concurrency` worker slots, one
//! handler call each.
//!
//! A stage with one topic uses a plain semaphore. A stage with several
//! topics (priority lanes) asks for a slot on behalf of a lane, and a
//! freed slot goes to a lane with someone waiting, chosen by the stage's
//! policy: under `strict` the first listed lane; under `weighted` by smooth
//! weighted round robin (the scheme of nginx's upstreams), which hands out
//! slots in proportion to the weights, interleaved, and never passes over a
//! waiting lane for longer than the sum of the weights. Only lanes with
//! someone waiting take part, so an idle lane neither holds slots back nor
//! saves up a claim on them.
//!
//! An adaptive stage (`concurrency: {max, adaptive: true}`) uses the same
//! scheduler, with one lane, because its number of slots changes as it
//! runs ([`Valve::set_limit`]): a cut takes effect as calls finish.

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::lock;

/// How a stage's lanes share its slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Policy {
    /// The first lane (in listed order) with a waiter gets the slot.
    Strict,
    /// Slots in proportion to each lane's weight, among lanes that wait.
    Weighted(Vec<u32>),
}

/// The worker slots of one stage.
pub(super) enum Valve {
    /// One lane: first come, first served.
    Plain(Arc<Semaphore>),
    /// Several lanes served by policy, or a limit that changes as the
    /// stage runs (adaptive).
    Scheduled(Arc<Scheduler>),
}

/// A taken worker slot; dropping it frees the slot.
#[must_use = "the slot is free again as soon as it is dropped"]
#[allow(dead_code, reason = "held only for what dropping it does")]
pub(super) enum Slot {
    Plain(OwnedSemaphorePermit),
    Scheduled(ScheduledSlot),
}

impl Valve {
    /// `slots` worker slots, shared by `lanes` lanes under `policy`; an
    /// adaptive valve starts with one, and may grow to `slots`.
    pub(super) fn new(slots: usize, lanes: usize, policy: Policy, adaptive: bool) -> Valve {
        if lanes <= 1 && !adaptive {
            return Valve::Plain(Arc::new(Semaphore::new(slots)));
        }
        let valve = Scheduler::new(slots, lanes.max(1), policy);
        if adaptive {
            valve.set_limit(1);
        }
        Valve::Scheduled(Arc::new(valve))
    }

    /// Sets how many slots there are (an adaptive stage). Fewer take
    /// effect as calls finish: none is interrupted.
    pub(super) fn set_limit(&self, slots: usize) {
        if let Valve::Scheduled(valve) = self {
            valve.set_limit(slots);
        }
    }

    /// The most slots in use at once since the last ask, and the limit
    /// now (for an adaptive stage: did calls fill every slot?).
    pub(super) fn take_peak(&self) -> (usize, usize) {
        match self {
            Valve::Plain(_) => (0, 0),
            Valve::Scheduled(valve) => {
                let mut state = lock(&valve.state);
                let in_use = state.in_use();
                (std::mem::replace(&mut state.peak, in_use), state.limit)
            }
        }
    }

    /// Waits for a slot for a delivery of `lane`. `None` once the valve is
    /// closed (shutdown began): no call may start.
    pub(super) async fn acquire(&self, lane: usize) -> Option<Slot> {
        match self {
            Valve::Plain(semaphore) => semaphore
                .clone()
                .acquire_owned()
                .await
                .ok()
                .map(Slot::Plain),
            Valve::Scheduled(valve) => valve.clone().acquire(lane).await.map(Slot::Scheduled),
        }
    }

    /// Closes the valve: waiters and later callers get `None`.
    pub(super) fn close(&self) {
        match self {
            Valve::Plain(semaphore) => semaphore.close(),
            Valve::Scheduled(valve) => valve.close(),
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        match self {
            Valve::Plain(semaphore) => semaphore.is_closed(),
            Valve::Scheduled(valve) => lock(&valve.state).closed,
        }
    }
}

/// The slots of a stage with priority lanes or an adaptive limit: who
/// gets a freed slot, and how many there are.
pub(super) struct Scheduler {
    state: Mutex<State>,
    /// Per lane: woken when the lane is granted a slot, or on close.
    granted: Vec<Notify>,
}

struct State {
    /// Slots free now: negative after a cut, until enough calls finish.
    free: isize,
    /// How many slots there are.
    limit: usize,
    /// The most in use at once since [`Valve::take_peak`].
    peak: usize,
    closed: bool,
    policy: Policy,
    /// Per lane: callers waiting for a slot (granted or not yet).
    waiting: Vec<usize>,
    /// Per lane: slots granted and not yet picked up by a waiter.
    grants: Vec<usize>,
    /// Per lane: the smooth weighted round robin's running credit.
    credit: Vec<i64>,
}

impl State {
    /// Hands free slots to waiting lanes; returns the lanes granted one.
    fn grant(&mut self) -> Vec<usize> {
        let mut woken = Vec::new();
        while self.free > 0 {
            let Some(lane) = self.pick() else { break };
            self.grants[lane] += 1;
            self.free -= 1;
            woken.push(lane);
        }
        self.peak = self.peak.max(self.in_use());
        woken
    }

    fn in_use(&self) -> usize {
        usize::try_from(isize::try_from(self.limit).unwrap_or(isize::MAX) - self.free).unwrap_or(0)
    }

    /// The lane the next slot goes to, among those with a waiter not yet
    /// granted one.
    fn pick(&mut self) -> Option<usize> {
        let wants = |lane: usize| self.waiting[lane] > self.grants[lane];
        match &self.policy {
            Policy::Strict => (0..self.waiting.len()).find(|&lane| wants(lane)),
            Policy::Weighted(weights) => {
                let eligible: Vec<usize> = (0..self.waiting.len()).filter(|&l| wants(l)).collect();
                let mut total = 0i64;
                let mut best: Option<usize> = None;
                for &lane in &eligible {
                    let weight = i64::from(weights.get(lane).copied().unwrap_or(1).max(1));
                    self.credit[lane] += weight;
                    total += weight;
                    if best.is_none_or(|b| self.credit[lane] > self.credit[b]) {
                        best = Some(lane);
                    }
                }
                let best = best?;
                self.credit[best] -= total;
                Some(best)
            }
        }
    }
}

impl Scheduler {
    fn new(slots: usize, lanes: usize, policy: Policy) -> Scheduler {
        Scheduler {
            state: Mutex::new(State {
                free: isize::try_from(slots).unwrap_or(isize::MAX),
                limit: slots,
                peak: 0,
                closed: false,
                policy,
                waiting: vec![0; lanes],
                grants: vec![0; lanes],
                credit: vec![0; lanes],
            }),
            granted: (0..lanes).map(|_| Notify::new()).collect(),
        }
    }

    fn wake(&self, lanes: Vec<usize>) {
        for lane in lanes {
            self.granted[lane].notify_waiters();
        }
    }

    async fn acquire(self: Arc<Self>, lane: usize) -> Option<ScheduledSlot> {
        let lane = lane.min(self.granted.len() - 1);
        let woken = {
            let mut state = lock(&self.state);
            if state.closed {
                return None;
            }
            state.waiting[lane] += 1;
            state.grant()
        };
        self.wake(woken);
        // Counted as waiting from here: a cancelled wait gives back what
        // it was granted.
        let mut waiter = Waiter {
            valve: &self,
            lane,
            done: false,
        };
        loop {
            let notified = self.granted[lane].notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = lock(&self.state);
                if state.closed {
                    return None;
                }
                if state.grants[lane] > 0 {
                    state.grants[lane] -= 1;
                    state.waiting[lane] -= 1;
                    waiter.done = true;
                    break;
                }
            }
            notified.await;
        }
        drop(waiter);
        Some(ScheduledSlot { valve: self })
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        for notify in &self.granted {
            notify.notify_waiters();
        }
    }

    fn set_limit(&self, slots: usize) {
        let woken = {
            let mut state = lock(&self.state);
            let change = isize::try_from(slots).unwrap_or(isize::MAX)
                - isize::try_from(state.limit).unwrap_or(isize::MAX);
            state.limit = slots;
            state.free += change;
            state.grant()
        };
        self.wake(woken);
    }

    fn release(&self) {
        let woken = {
            let mut state = lock(&self.state);
            state.free += 1;
            state.grant()
        };
        self.wake(woken);
    }
}

/// A waiter of a lane, until it has its slot: dropped before, it takes
/// itself off the lane, and a slot granted to the lane beyond those still
/// waiting goes back to the pool.
struct Waiter<'a> {
    valve: &'a Scheduler,
    lane: usize,
    done: bool,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let woken = {
            let mut state = lock(&self.valve.state);
            let lane = self.lane;
            state.waiting[lane] -= 1;
            if state.grants[lane] > state.waiting[lane] {
                state.grants[lane] -= 1;
                state.free += 1;
                state.grant()
            } else {
                Vec::new()
            }
        };
        self.valve.wake(woken);
    }
}

/// A slot taken through a lane.
pub(super) struct ScheduledSlot {
    valve: Arc<Scheduler>,
}

impl Drop for ScheduledSlot {
    fn drop(&mut self) {
        self.valve.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Which lane each of `grants` slots goes to when every lane always
    /// has a waiter, one slot at a time.
    fn order(policy: Policy, lanes: usize, grants: usize) -> Vec<usize> {
        let mut state = State {
            free: 0,
            limit: 1,
            peak: 0,
            closed: false,
            policy,
            waiting: vec![1; lanes],
            grants: vec![0; lanes],
            credit: vec![0; lanes],
        };
        (0..grants)
            .map(|_| {
                state.free = 1;
                let lane = state.grant()[0];
                state.grants[lane] = 0;
                lane
            })
            .collect()
    }

    #[test]
    fn strict_always_serves_the_first_waiting_lane() {
        assert_eq!(order(Policy::Strict, 3, 4), [0, 0, 0, 0]);
        let mut state = State {
            free: 2,
            limit: 2,
            peak: 0,
            closed: false,
            policy: Policy::Strict,
            waiting: vec![0, 1, 3],
            grants: vec![0; 3],
            credit: vec![0; 3],
        };
        assert_eq!(state.grant(), [1, 2]);
    }

    #[test]
    fn weighted_shares_in_proportion_and_interleaves() {
        let got = order(Policy::Weighted(vec![8, 1]), 2, 90);
        assert_eq!(got.iter().filter(|&&l| l == 1).count(), 10);
        // Never more than the sum of the weights between two turns of the
        // light lane.
        let turns: Vec<usize> = (0..got.len()).filter(|&i| got[i] == 1).collect();
        assert!(turns.windows(2).all(|w| w[1] - w[0] <= 9), "{got:?}");
        let got = order(Policy::Weighted(vec![4, 2, 1]), 3, 70);
        let counts: Vec<usize> = (0..3)
            .map(|lane| got.iter().filter(|&&l| l == lane).count())
            .collect();
        assert_eq!(counts, [40, 20, 10]);
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_higher_lane_under_strict() {
        let valve = Valve::new(1, 2, Policy::Strict, false);
        let held = valve.acquire(1).await.expect("free slot");
        let valve = Arc::new(valve);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for lane in [1, 1, 0] {
            let (valve, tx) = (valve.clone(), tx.clone());
            tokio::spawn(async move {
                let slot = valve.acquire(lane).await.expect("slot");
                tx.send(lane).expect("send");
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(slot);
            });
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(held);
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(rx.recv().await.expect("lane"));
        }
        assert_eq!(got, [0, 1, 1]);
    }

    #[tokio::test]
    async fn a_cancelled_wait_gives_its_grant_back() {
        let valve = Arc::new(Valve::new(1, 2, Policy::Strict, false));
        let held = valve.acquire(0).await.expect("free slot");
        let waiting = {
            let valve = valve.clone();
            tokio::spawn(async move { valve.acquire(0).await.is_some() })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(held);
        waiting.abort();
        let _ = waiting.await;
        let again = tokio::time::timeout(Duration::from_secs(1), valve.acquire(1)).await;
        assert!(matches!(again, Ok(Some(_))), "the slot was lost");
    }

    #[tokio::test]
    async fn an_adaptive_valve_grows_and_a_cut_waits_for_calls_to_finish() {
        let valve = Valve::new(8, 1, Policy::Strict, true);
        let first = valve.acquire(0).await.expect("one slot to start");
        assert!(
            tokio::time::timeout(Duration::from_millis(20), valve.acquire(0))
                .await
                .is_err(),
            "an adaptive valve starts with one slot"
        );
        valve.set_limit(3);
        let second = valve.acquire(0).await.expect("grown");
        let third = valve.acquire(0).await.expect("grown");
        assert_eq!(valve.take_peak(), (3, 3));
        valve.set_limit(1);
        drop(first);
        drop(second);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), valve.acquire(0))
                .await
                .is_err(),
            "the third call still holds the one slot left"
        );
        drop(third);
        assert!(valve.acquire(0).await.is_some());
    }

    #[tokio::test]
    async fn closing_wakes_every_waiter_with_none() {
        let valve = Arc::new(Valve::new(1, 2, Policy::Weighted(vec![1, 1]), false));
        let _held = valve.acquire(0).await.expect("free slot");
        let waiter = {
            let valve = valve.clone();
            tokio::spawn(async move { valve.acquire(1).await.is_none() })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        valve.close();
        assert!(waiter.await.expect("joins"));
        assert!(valve.is_closed() && valve.acquire(0).await.is_none());
    }
}
