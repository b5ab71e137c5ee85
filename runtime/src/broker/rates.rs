//! Rate limits as token buckets, in the form of GCRA (the generic cell
//! rate algorithm): a bucket is one number, its *theoretical arrival time*
//! (TAT), so it can live in memory or in a shared store (a NATS KV entry)
//! and be updated with one compare-and-set.
//!
//! A bucket of `burst` tokens refilling one per `interval` lets a message
//! go at `max(now, TAT - (burst - 1) * interval)`; each message moves the
//! TAT on by one interval. Callers *reserve*: they learn when their turn
//! is and sleep until then, so the turns stay on the ideal grid however
//! late the timer wakes, and the rate over a long run is exact.

use std::time::Duration;

use async_trait::async_trait;

use super::BrokerError;

/// One bucket's rule: its interval and how far ahead of the grid a burst
/// may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    /// Microseconds between two tokens.
    pub interval_us: u64,
    /// Microseconds a burst may run ahead: `(burst - 1) * interval`.
    pub tolerance_us: u64,
}

impl Gcra {
    /// The rule of `burst` tokens refilling one per `interval`.
    pub fn new(interval: Duration, burst: u32) -> Gcra {
        let interval_us = u64::try_from(interval.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        Gcra {
            interval_us,
            tolerance_us: interval_us.saturating_mul(u64::from(burst.max(1) - 1)),
        }
    }

    /// Reserves `cost` tokens at `now` on a bucket whose TAT is `tat` (all
    /// in microseconds on one clock): returns when they may be used and
    /// the bucket's new TAT. A cost above the burst goes when its last
    /// token would have.
    pub fn reserve(&self, tat: u64, now: u64, cost: u32) -> (u64, u64) {
        let cost = u64::from(cost.max(1));
        let base = tat.max(now);
        let last = base.saturating_add(self.interval_us.saturating_mul(cost - 1));
        let at = last.saturating_sub(self.tolerance_us).max(now);
        (
            at,
            base.saturating_add(self.interval_us.saturating_mul(cost)),
        )
    }
}

/// Buckets shared by every daemon on one broker, so that a stage's limit
/// holds for the group rather than per daemon.
#[async_trait]
pub trait SharedRates: Send + Sync {
    /// Reserves `cost` tokens of bucket `name` under `rule`; returns how
    /// long the caller waits before using them.
    async fn reserve(&self, name: &str, rule: Gcra, cost: u32) -> Result<Duration, BrokerError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_one_spaces_every_token_by_the_interval() {
        let rule = Gcra::new(Duration::from_millis(5), 1);
        let (mut tat, mut times) = (0, Vec::new());
        // Ten callers at once, at t = 1000 µs.
        for _ in 0..10 {
            let (at, next) = rule.reserve(tat, 1_000, 1);
            times.push(at);
            tat = next;
        }
        let expected: Vec<u64> = (0..10).map(|i| 1_000 + i * 5_000).collect();
        assert_eq!(times, expected);
    }

    #[test]
    fn a_burst_goes_at_once_then_the_grid_resumes() {
        let rule = Gcra::new(Duration::from_millis(10), 3);
        let mut tat = 0;
        let mut times = Vec::new();
        for _ in 0..5 {
            let (at, next) = rule.reserve(tat, 100_000, 1);
            times.push(at);
            tat = next;
        }
        assert_eq!(times, [100_000, 100_000, 100_000, 110_000, 120_000]);
        // A quiet spell refills it.
        let (at, _) = rule.reserve(tat, 1_000_000, 1);
        assert_eq!(at, 1_000_000);
    }

    #[test]
    fn a_batch_costs_one_token_per_message() {
        let rule = Gcra::new(Duration::from_millis(10), 1);
        let (first, tat) = rule.reserve(0, 0, 4);
        assert_eq!(first, 30_000, "it goes when its last token would have");
        let (second, _) = rule.reserve(tat, 0, 1);
        assert_eq!(second, 40_000);
    }
}
