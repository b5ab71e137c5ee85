//! Adaptive concurrency (`concurrency: {max, adaptive: true}`): the
//! stage's number of worker slots follows its calls, in the manner of AIMD
//! (TCP's congestion window; Vector's adaptive request concurrency).
//!
//! Calls are judged in windows of about three average call times (at least
//! 50 ms). At the end of each:
//!
//! - any call that ended in a retry, a timeout or `unavailable`, or a mean
//!   latency over twice the moving average, cuts the limit by a tenth (at
//!   least one, never below 1): the downstream is saying "less";
//! - otherwise, if the calls filled every slot and the mean latency stayed
//!   at its moving average (within 5 %), the limit grows by one (never past
//!   `max`): more may fit;
//! - otherwise it stays.
//!
//! The limit starts at 1 and doubles (slow start) until the first cut. A
//! cut right after a growth means the limit found the ceiling: the next
//! probe above it waits twice as many windows as the last (up to
//! [`MAX_COOLDOWN`], several seconds), so a steady target sees a refusal
//! rarely; each growth that holds halves the wait again, so a target that
//! got faster is found quickly.
//!
//! The moving average is an exponentially weighted one over the windows'
//! means, and does not take in a window that was cut, so that overload
//! does not become the new normal.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;

use super::lock;
use super::valve::Valve;
use crate::failure::FailureKind;
use crate::plugin::Outcome;

/// The shortest window.
const MIN_WINDOW: Duration = Duration::from_millis(50);
/// A window lasts this many average call times.
const WINDOW_CALLS: u32 = 3;
/// What a cut keeps of the limit.
const CUT: f64 = 0.9;
/// The most windows a probe above a found ceiling waits.
const MAX_COOLDOWN: u32 = 128;
/// A window's mean this far over the average is "well above" it.
const OVERLOAD: f64 = 2.0;
/// A window's mean this close to the average "stayed at" it.
const STEADY: f64 = 1.05;
/// The weight of a new window's mean in the moving average.
const ALPHA: f64 = 0.2;

/// The adaptive limit of one stage.
pub(super) struct Aimd {
    max: usize,
    state: Mutex<State>,
    /// `sluice_concurrency_limit{pipeline,stage}`.
    gauge: Gauge,
}

struct State {
    limit: usize,
    /// The moving average of call time, in seconds.
    average: Option<f64>,
    window_start: Instant,
    sum: f64,
    calls: u32,
    /// When the limit was last cut.
    last_cut: Option<Instant>,
    /// Doubling until the first cut.
    slow_start: bool,
    /// Windows a growth waits after a cut.
    cooldown: u32,
    /// Windows left before the next growth.
    wait: u32,
    /// The last window grew the limit.
    grew: bool,
}

impl Aimd {
    pub(super) fn new(max: usize, gauge: Gauge) -> Aimd {
        gauge.set(1);
        Aimd {
            max: max.max(1),
            state: Mutex::new(State {
                limit: 1,
                average: None,
                window_start: Instant::now(),
                sum: 0.0,
                calls: 0,
                last_cut: None,
                slow_start: true,
                cooldown: 1,
                wait: 0,
                grew: false,
            }),
            gauge,
        }
    }

    /// Takes in one call that took `took` and ended in `outcome` (for a
    /// batch: the first failure among its items, if any), and at the end
    /// of a window sets `valve`'s limit.
    pub(super) fn observe(&self, took: Duration, outcome: &Outcome, valve: &Valve) {
        let backoff = matches!(
            outcome,
            Err(f) if matches!(f.kind, FailureKind::Retry | FailureKind::Timeout | FailureKind::Unavailable)
        );
        let mut state = lock(&self.state);
        let window = state
            .average
            .map_or(MIN_WINDOW, |a| Duration::from_secs_f64(a) * WINDOW_CALLS)
            .max(MIN_WINDOW);
        if backoff {
            // Cut at once: a slot left over the target's limit would
            // otherwise spin, each refusal quick, until the window ends.
            // A refusal of a call that started before the last cut is of
            // the same episode and cuts nothing more (TCP's rule: one cut
            // per window of data sent before the loss).
            let started = Instant::now().checked_sub(took);
            if state
                .last_cut
                .is_none_or(|at| started.is_none_or(|started| started >= at))
            {
                let mean = took.as_secs_f64();
                self.cut(&mut state, valve, mean);
            }
            return;
        }
        state.sum += took.as_secs_f64();
        state.calls += 1;
        if state.window_start.elapsed() < window {
            return;
        }
        let mean = state.sum / f64::from(state.calls);
        let (peak, _) = valve.take_peak();
        let limit = state.limit;
        let overloaded = state.average.is_some_and(|a| mean > a * OVERLOAD);
        let steady = state.average.is_none_or(|a| mean <= a * STEADY);
        if overloaded {
            self.cut(&mut state, valve, mean);
            return;
        }
        let next = if state.wait > 0 {
            state.wait -= 1;
            limit
        } else if peak >= limit && steady {
            if state.grew {
                state.cooldown = (state.cooldown / 2).max(1);
            }
            state.wait = if state.slow_start {
                0
            } else {
                state.cooldown - 1
            };
            if state.slow_start {
                (limit * 2).min(self.max)
            } else {
                (limit + 1).min(self.max)
            }
        } else {
            limit
        };
        state.grew = next > limit;
        state.average = Some(state.average.map_or(mean, |a| a + ALPHA * (mean - a)));
        self.set(&mut state, valve, next, mean);
    }

    /// Cuts the limit by [`CUT`] (at least one, never below 1), and makes
    /// the next growth wait: twice as long as the last time if this cut
    /// came right after a growth (the ceiling was found again).
    fn cut(&self, state: &mut State, valve: &Valve, mean: f64) {
        state.slow_start = false;
        if state.grew {
            state.cooldown = (state.cooldown * 2).min(MAX_COOLDOWN);
        }
        state.wait = state.cooldown;
        state.grew = false;
        state.last_cut = Some(Instant::now());
        let limit = state.limit;
        let next = ((limit as f64 * CUT).floor() as usize)
            .min(limit.saturating_sub(1))
            .max(1);
        self.set(state, valve, next, mean);
    }

    /// Starts a new window with the limit at `next`.
    fn set(&self, state: &mut State, valve: &Valve, next: usize, mean: f64) {
        state.window_start = Instant::now();
        state.sum = 0.0;
        state.calls = 0;
        let _ = valve.take_peak();
        if next != state.limit {
            state.limit = next;
            valve.set_limit(next);
            self.gauge.set(i64::try_from(next).unwrap_or(i64::MAX));
            tracing::debug!(
                limit = next,
                mean_ms = mean * 1000.0,
                "adaptive concurrency"
            );
        }
    }
}
