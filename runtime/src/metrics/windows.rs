//! Two structures the engine records into on its hot path, beside the
//! exported histograms: a stage's [`LatencyWindow`] (the console's history
//! of handler durations) and a priority lane's [`LaneWaits`] (`status`'s
//! recent p50 and p99).

use prometheus_client::metrics::histogram::Histogram;
use std::sync::atomic::AtomicU64;

/// Buckets of a [`LatencyWindow`]: a quarter of a doubling apart from
/// [`WINDOW_FIRST`], so a quantile read off them is at most 19 % high, up
/// to about 40 minutes.
const WINDOW_BUCKETS: usize = 112;
/// The upper bound of a [`LatencyWindow`]'s first bucket, in seconds.
const WINDOW_FIRST: f64 = 1e-5;

/// Durations counted into fine log-spaced buckets until taken: the
/// quantiles of one interval of a stage's history, in fixed memory and
/// without a lock on the hot path.
pub struct LatencyWindow {
    counts: [std::sync::atomic::AtomicU64; WINDOW_BUCKETS],
}

impl Default for LatencyWindow {
    fn default() -> Self {
        LatencyWindow {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl LatencyWindow {
    /// Counts one duration.
    pub fn record(&self, seconds: f64) {
        let index = if seconds > WINDOW_FIRST {
            ((seconds / WINDOW_FIRST).log2() * 4.0).ceil() as usize
        } else {
            0
        };
        self.counts[index.min(WINDOW_BUCKETS - 1)]
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The p50 and p99 (each its bucket's upper bound) of what was
    /// counted since the last take, emptying the window; None when empty.
    pub fn take(&self) -> Option<(f64, f64)> {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.swap(0, std::sync::atomic::Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let at = |q: f64| {
            let rank = ((total as f64 * q).ceil() as u64).max(1);
            let mut seen = 0;
            for (index, count) in counts.iter().enumerate() {
                seen += count;
                if seen >= rank {
                    return WINDOW_FIRST * 2f64.powf(index as f64 / 4.0);
                }
            }
            WINDOW_FIRST * 2f64.powf((WINDOW_BUCKETS - 1) as f64 / 4.0)
        };
        Some((at(0.5), at(0.99)))
    }
}

/// How many recent waits a lane keeps for its quantiles.
const LANE_WINDOW: usize = 1024;

/// One priority lane's waits: the histogram `/metrics` exports, and the
/// last [`LANE_WINDOW`] waits, from which `status` reads a p50 and p99 of
/// now rather than since start.
pub struct LaneWaits {
    histogram: Histogram,
    recent: std::sync::Mutex<std::collections::VecDeque<u32>>,
}

impl LaneWaits {
    pub(super) fn new(histogram: Histogram) -> LaneWaits {
        LaneWaits {
            histogram,
            recent: std::sync::Mutex::new(std::collections::VecDeque::with_capacity(LANE_WINDOW)),
        }
    }

    /// Records the wait of a message published at `published_at` (ms since
    /// the epoch), ending now.
    pub fn record(&self, published_at: u64) {
        let micros = crate::broker::now_millis()
            .saturating_sub(published_at)
            .saturating_mul(1000);
        self.histogram.observe(micros as f64 / 1e6);
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if recent.len() == LANE_WINDOW {
            recent.pop_front();
        }
        recent.push_back(u32::try_from(micros / 1000).unwrap_or(u32::MAX));
    }

    /// The p50 and p99 of the recent waits, in seconds.
    pub fn quantiles(&self) -> Option<(f64, f64)> {
        let mut waits: Vec<u32> = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .copied()
            .collect();
        if waits.is_empty() {
            return None;
        }
        waits.sort_unstable();
        let at = |q: f64| {
            let index = ((waits.len() as f64 * q).ceil() as usize).clamp(1, waits.len()) - 1;
            f64::from(waits[index]) / 1000.0
        };
        Some((at(0.5), at(0.99)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latency_window_reads_quantiles_within_a_bucket_and_empties() {
        let window = LatencyWindow::default();
        assert_eq!(window.take(), None);
        for _ in 0..98 {
            window.record(0.002);
        }
        window.record(0.5);
        window.record(0.5);
        let (p50, p99) = window.take().expect("counted");
        assert!((0.002..0.002 * 1.19).contains(&p50), "{p50}");
        assert!((0.5..0.5 * 1.19).contains(&p99), "{p99}");
        assert_eq!(window.take(), None, "a take empties the window");
        window.record(0.0);
        window.record(1e9);
        assert!(
            window.take().is_some(),
            "out-of-range values land in the end buckets"
        );
    }
}
