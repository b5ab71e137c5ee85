//! Each stage's last 15 minutes, for the console's stage graphs (`GET
//! /v1/stages/{pipeline}/{stage}`): every 10 s a point of throughput,
//! handler latency p50/p99, and deliveries by outcome (failure kinds
//! among them).
//!
//! The daemon keeps the history itself, so the console needs no
//! Prometheus: 90 points a stage, a few hundred bytes each, dropped
//! oldest-first. A reload carries the points of the stages that stay.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::AdminState;

/// How far apart the points are.
pub(super) const INTERVAL: Duration = Duration::from_secs(10);
/// Points kept per stage: 90 of 10 s are 15 minutes.
pub(super) const POINTS: usize = 90;

/// One interval of a stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HistoryPoint {
    /// The interval's end, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Deliveries settled or failed per second over the interval.
    pub processed_per_sec: f64,
    /// Median handler call duration in the interval, in seconds (None
    /// without calls). Read off log buckets: at most 19 % high.
    pub p50_seconds: Option<f64>,
    /// 99th percentile of the same.
    pub p99_seconds: Option<f64>,
    /// Deliveries in the interval by outcome: `ok`, `duplicate`,
    /// `skipped`, `dead-lettered`, and a failure kind (`timeout`, ...) for
    /// each failed attempt that will be retried. Outcomes with none are
    /// left out.
    pub outcomes: BTreeMap<String, u64>,
    /// Failed attempts in the interval by failure kind: those retried (or
    /// held), and the last attempt of each message dead-lettered. Kinds
    /// with none are left out.
    #[serde(default)]
    pub failures: BTreeMap<String, u64>,
}

/// A stage's recent history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StageHistory {
    /// Seconds between points.
    pub interval_seconds: u64,
    /// Oldest first; at most 90 (15 minutes).
    pub points: Vec<HistoryPoint>,
}

/// The ring of one stage.
#[derive(Default)]
pub(super) struct Ring {
    points: VecDeque<HistoryPoint>,
    /// The counters at the last sample and when it was taken.
    last: Option<(Instant, Counters)>,
}

/// A stage's counters at one sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Counters {
    /// By outcome, in [`crate::metrics::outcomes`] order.
    pub(super) outcomes: Vec<(&'static str, u64)>,
    /// Dead letters by the kind of their last failure, in
    /// [`crate::FailureKind::ALL`] order.
    pub(super) dead_letters: Vec<(&'static str, u64)>,
}

/// What grew from `before` to `after` (the same names in the same order),
/// without the names that did not.
fn growth(after: &[(&'static str, u64)], before: &[(&'static str, u64)]) -> BTreeMap<String, u64> {
    after
        .iter()
        .zip(before)
        .filter_map(|((name, now), (_, then))| {
            let delta = now.saturating_sub(*then);
            (delta > 0).then(|| ((*name).to_owned(), delta))
        })
        .collect()
}

/// One ring per stage, indexed as the catalog's stages.
pub(super) struct History {
    pub(super) rings: Vec<Mutex<Ring>>,
}

impl History {
    pub(super) fn new(stages: usize) -> Self {
        History {
            rings: (0..stages).map(|_| Mutex::default()).collect(),
        }
    }

    /// Closes stage `index`'s interval at `now`: its counters now and the
    /// handler latency quantiles since the last sample. The first sample
    /// only starts the clock.
    fn record(
        &self,
        index: usize,
        now: Instant,
        at_ms: u64,
        counters: Counters,
        latency: Option<(f64, f64)>,
    ) {
        let Some(ring) = self.rings.get(index) else {
            return;
        };
        let mut ring = ring.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((then, before)) = ring.last.take() {
            let elapsed = now.saturating_duration_since(then).as_secs_f64();
            let outcomes = growth(&counters.outcomes, &before.outcomes);
            let settled: u64 = outcomes.values().sum();
            let mut failures = growth(&counters.dead_letters, &before.dead_letters);
            for (outcome, n) in &outcomes {
                if !crate::metrics::SETTLED_OUTCOMES.contains(&outcome.as_str()) {
                    *failures.entry(outcome.clone()).or_default() += n;
                }
            }
            if ring.points.len() == POINTS {
                ring.points.pop_front();
            }
            ring.points.push_back(HistoryPoint {
                at_ms,
                processed_per_sec: if elapsed > 0.0 {
                    settled as f64 / elapsed
                } else {
                    0.0
                },
                p50_seconds: latency.map(|l| l.0),
                p99_seconds: latency.map(|l| l.1),
                outcomes,
                failures,
            });
        }
        ring.last = Some((now, counters));
    }

    /// Stage `index`'s points, oldest first.
    pub(super) fn snapshot(&self, index: usize) -> StageHistory {
        let points = self.rings.get(index).map_or_else(Vec::new, |ring| {
            let ring = ring.lock().unwrap_or_else(|e| e.into_inner());
            ring.points.iter().cloned().collect()
        });
        StageHistory {
            interval_seconds: INTERVAL.as_secs(),
            points,
        }
    }
}

/// Takes a point of every stage each [`INTERVAL`], for as long as the
/// server runs (`serve` aborts it).
pub(super) async fn sample(state: AdminState) {
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let at_ms = crate::broker::now_millis();
        let catalog = state.catalog();
        let metrics = state.metrics();
        for (index, stage) in catalog.stages.iter().enumerate() {
            let counters = Counters {
                outcomes: metrics.processed_by_outcome(&stage.pipeline, &stage.stage),
                dead_letters: metrics.dead_letters_by_kind(&stage.pipeline, &stage.stage),
            };
            catalog.history.record(
                index,
                now,
                at_ms,
                counters,
                metrics.take_handler_window(&stage.pipeline, &stage.stage),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_are_deltas_per_interval_and_the_ring_is_bounded() {
        let counters = |ok, timeout, dead, rejected| Counters {
            outcomes: vec![("ok", ok), ("dead-lettered", dead), ("timeout", timeout)],
            dead_letters: vec![("timeout", 0), ("rejected", rejected)],
        };
        let history = History::new(1);
        let t0 = Instant::now();
        history.record(0, t0, 0, counters(100, 5, 0, 0), None);
        assert!(
            history.snapshot(0).points.is_empty(),
            "the first sample starts the clock"
        );
        history.record(
            0,
            t0 + INTERVAL,
            10_000,
            counters(150, 7, 3, 3),
            Some((0.01, 0.2)),
        );
        let points = history.snapshot(0).points;
        assert_eq!(points.len(), 1);
        assert_eq!(
            points[0].outcomes,
            BTreeMap::from([
                ("ok".to_owned(), 50),
                ("dead-lettered".to_owned(), 3),
                ("timeout".to_owned(), 2)
            ])
        );
        assert_eq!(
            points[0].failures,
            BTreeMap::from([("rejected".to_owned(), 3), ("timeout".to_owned(), 2)]),
            "retried attempts and the last attempts of dead letters, by kind"
        );
        assert!((points[0].processed_per_sec - 5.5).abs() < 1e-9);
        assert_eq!(points[0].p99_seconds, Some(0.2));
        for i in 2..200u32 {
            history.record(0, t0 + INTERVAL * i, 0, counters(150, 7, 3, 3), None);
        }
        assert_eq!(history.snapshot(0).points.len(), POINTS);
        assert_eq!(
            history.snapshot(3).points.len(),
            0,
            "an unknown stage has none"
        );
    }
}
