//! How long a failed message waits before its next attempt.

use std::time::Duration;

use crate::config::Backoff;

/// The delay before the retry that follows failed attempt `attempt`
/// (1-based): `min(max, initial * multiplier^(attempt-1))`, shortened by a
/// random fraction of up to `jitter` so that a burst of failures does not
/// come back as a burst.
pub fn delay(policy: &Backoff, attempt: u32) -> Duration {
    delay_with(policy, attempt, fastrand::f64())
}

/// The wait an explicit `retry.schedule` gives the retry after failed
/// attempt `attempt` (1-based): its `attempt`-th entry, the last one
/// repeating; `None` without a schedule.
pub fn scheduled(schedule: &[Duration], attempt: u32) -> Option<Duration> {
    let index = usize::try_from(attempt.saturating_sub(1)).unwrap_or(usize::MAX);
    schedule.get(index).or_else(|| schedule.last()).copied()
}

/// [`delay`] with the random draw given (0 ≤ `draw` < 1), for tests.
pub fn delay_with(policy: &Backoff, attempt: u32, draw: f64) -> Duration {
    let initial = policy.initial.get().as_secs_f64();
    let max = policy.max.get().as_secs_f64();
    let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
    let full = (initial * policy.multiplier.powi(exponent)).min(max);
    let jitter = policy.jitter.clamp(0.0, 1.0);
    let secs = full * (1.0 - jitter * draw.clamp(0.0, 1.0));
    if secs.is_finite() && secs > 0.0 {
        Duration::from_secs_f64(secs)
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HumanDuration;

    fn policy(jitter: f64) -> Backoff {
        Backoff {
            initial: HumanDuration::millis(100),
            max: HumanDuration::secs(1),
            multiplier: 2.0,
            jitter,
        }
    }

    #[test]
    fn grows_exponentially_up_to_max() {
        let p = policy(0.0);
        let ms: Vec<u128> = (1..=6)
            .map(|a| delay_with(&p, a, 0.5).as_millis())
            .collect();
        assert_eq!(ms, [100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn jitter_only_shortens_within_its_fraction() {
        let p = policy(0.5);
        assert_eq!(delay_with(&p, 1, 0.0).as_millis(), 100);
        assert_eq!(delay_with(&p, 1, 0.999_999).as_millis(), 50);
        assert!(delay(&p, 2) <= Duration::from_millis(200));
        assert!(delay(&p, 2) >= Duration::from_millis(100));
    }

    #[test]
    fn a_schedule_gives_its_waits_in_order_and_repeats_the_last() {
        let s = [60, 300, 1800].map(Duration::from_secs);
        let got: Vec<_> = (1..=5).map(|a| scheduled(&s, a)).collect();
        assert_eq!(
            got,
            [60, 300, 1800, 1800, 1800].map(|n| Some(Duration::from_secs(n)))
        );
        assert_eq!(scheduled(&[], 1), None);
        assert_eq!(scheduled(&s, 0), Some(Duration::from_secs(60)));
    }

    #[test]
    fn huge_attempt_counts_do_not_overflow() {
        assert_eq!(
            delay_with(&policy(0.0), u32::MAX, 0.0),
            Duration::from_secs(1)
        );
    }
}
