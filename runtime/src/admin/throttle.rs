//! Token guessing, throttled: an address that fails authentication
//! [`MAX_FAILURES`] times within [`WINDOW`] is refused for [`BLOCK`],
//! every request it sends to the API or the console's sign-in (a right
//! token too, so that guessing on learns nothing), with `429` and a
//! `Retry-After`.
//!
//! - **What counts as a failure:** a bearer token that is not valid, and a
//!   console sign-in with one. A request without credentials, or with a
//!   console session that has ended, is not a guess and is not counted.
//! - **Loopback is exempt**, as in fail2ban's defaults. A local caller
//!   shares the daemon's machine, and tests and local tools are not locked
//!   out by their own mistakes.
//! - **IPv6 by /64:** one host usually holds a whole /64, so its
//!   addresses share one count.
//! - **Bounded:** at most [`MAX_TRACKED`] addresses are tracked. When full,
//!   the address whose last failure is oldest is forgotten.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures within [`WINDOW`] that block an address.
pub const MAX_FAILURES: u32 = 10;
/// The span in which [`MAX_FAILURES`] failures block an address.
pub const WINDOW: Duration = Duration::from_secs(60);
/// How long a blocked address is refused.
pub const BLOCK: Duration = Duration::from_secs(300);
/// The most addresses tracked at once.
const MAX_TRACKED: usize = 10_000;

/// The failed authentications of the addresses that have failed lately.
#[derive(Debug, Default)]
pub struct Throttle {
    addresses: Mutex<HashMap<IpAddr, Failures>>,
}

/// One address's recent failures.
#[derive(Debug, Clone, Copy)]
struct Failures {
    /// When the current window began (its first failure).
    since: Instant,
    /// Failures in the current window.
    count: u32,
    /// The latest failure.
    last: Instant,
    /// Refused until then, once blocked.
    blocked_until: Option<Instant>,
}

impl Throttle {
    /// How long `ip` is still refused for, if it is blocked.
    pub fn blocked(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        if ip.to_canonical().is_loopback() {
            return None;
        }
        let addresses = self.lock();
        let until = addresses.get(&counted_as(ip))?.blocked_until?;
        (until > now).then(|| until - now)
    }

    /// Counts a failed authentication from `ip`; true when it makes the
    /// address blocked (logged once, here).
    pub fn failed(&self, ip: IpAddr, now: Instant) -> bool {
        if ip.to_canonical().is_loopback() {
            return false;
        }
        let key = counted_as(ip);
        let mut addresses = self.lock();
        if addresses.len() >= MAX_TRACKED && !addresses.contains_key(&key) {
            forget_oldest(&mut addresses, now);
        }
        let entry = addresses.entry(key).or_insert(Failures {
            since: now,
            count: 0,
            last: now,
            blocked_until: None,
        });
        if entry.blocked_until.is_some_and(|until| until <= now) {
            entry.blocked_until = None;
            entry.count = 0;
        }
        if now.duration_since(entry.since) > WINDOW {
            entry.since = now;
            entry.count = 0;
        }
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
        if entry.count >= MAX_FAILURES && entry.blocked_until.is_none() {
            entry.blocked_until = Some(now + BLOCK);
            tracing::warn!(
                client = %ip,
                failures = entry.count,
                "admin API: {MAX_FAILURES} failed authentications within {}s; this address is refused for {}s (every request, a valid token too)",
                WINDOW.as_secs(),
                BLOCK.as_secs()
            );
            return true;
        }
        false
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Failures>> {
        self.addresses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What `ip`'s failures are counted under: an IPv4 address (also when
/// mapped into IPv6) itself, an IPv6 address its /64.
fn counted_as(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX))),
        v4 => v4,
    }
}

/// Makes room for one more address: drops those that are neither blocked
/// nor in a current window, and if none is, the one whose last failure is
/// oldest (an address that is not blocked first).
fn forget_oldest(addresses: &mut HashMap<IpAddr, Failures>, now: Instant) {
    addresses.retain(|_, f| {
        f.blocked_until.is_some_and(|until| until > now) || now.duration_since(f.since) <= WINDOW
    });
    if addresses.len() < MAX_TRACKED {
        return;
    }
    let blocked = |f: &Failures| f.blocked_until.is_some_and(|until| until > now);
    let oldest = addresses
        .iter()
        .filter(|(_, f)| !blocked(f))
        .min_by_key(|(_, f)| f.last)
        .or_else(|| addresses.iter().min_by_key(|(_, f)| f.last))
        .map(|(ip, _)| *ip);
    if let Some(oldest) = oldest {
        addresses.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    const GUESSER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));
    const OTHER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 8));

    #[test]
    fn ten_failures_in_a_minute_block_the_address_for_five() {
        let throttle = Throttle::default();
        let start = Instant::now();
        for i in 0..MAX_FAILURES - 1 {
            assert!(!throttle.failed(GUESSER, start + Duration::from_secs(u64::from(i))));
        }
        assert_eq!(
            throttle.blocked(GUESSER, start + Duration::from_secs(9)),
            None
        );
        assert!(throttle.failed(GUESSER, start + Duration::from_secs(10)));
        let left = throttle
            .blocked(GUESSER, start + Duration::from_secs(11))
            .expect("blocked");
        assert_eq!(left, BLOCK - Duration::from_secs(1));
        // Another address is not affected; loopback never is.
        assert_eq!(
            throttle.blocked(OTHER, start + Duration::from_secs(11)),
            None
        );
        // Over when the block ends, and the count starts again.
        let after = start + Duration::from_secs(10) + BLOCK;
        assert_eq!(throttle.blocked(GUESSER, after), None);
        assert!(!throttle.failed(GUESSER, after));
        assert_eq!(throttle.blocked(GUESSER, after), None);
    }

    #[test]
    fn failures_spread_wider_than_the_window_do_not_block() {
        let throttle = Throttle::default();
        let start = Instant::now();
        for i in 0..3 * MAX_FAILURES {
            let at = start + Duration::from_secs(u64::from(i) * 7);
            assert!(!throttle.failed(GUESSER, at), "failure {i}");
            assert_eq!(throttle.blocked(GUESSER, at), None);
        }
    }

    #[test]
    fn the_addresses_of_one_ipv6_64_share_a_count() {
        let throttle = Throttle::default();
        let start = Instant::now();
        let host = |last: u16| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, last));
        for i in 0..MAX_FAILURES {
            throttle.failed(host(u16::try_from(i).expect("small")), start);
        }
        assert!(throttle.blocked(host(999), start).is_some());
        let next_64 = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 2, 0, 0, 0, 1));
        assert_eq!(throttle.blocked(next_64, start), None);
        // IPv4 mapped into IPv6 is the IPv4 address.
        for _ in 0..MAX_FAILURES {
            throttle.failed(GUESSER, start);
        }
        let mapped = IpAddr::V6(Ipv4Addr::new(192, 0, 2, 7).to_ipv6_mapped());
        assert!(throttle.blocked(mapped, start).is_some());
    }

    #[test]
    fn loopback_is_never_blocked() {
        let throttle = Throttle::default();
        let start = Instant::now();
        for ip in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V6(Ipv4Addr::new(127, 0, 0, 9).to_ipv6_mapped()),
        ] {
            for _ in 0..3 * MAX_FAILURES {
                assert!(!throttle.failed(ip, start));
            }
            assert_eq!(throttle.blocked(ip, start), None);
        }
    }

    #[test]
    fn the_tracked_addresses_are_bounded() {
        let throttle = Throttle::default();
        let start = Instant::now();
        for i in 0..u32::try_from(MAX_TRACKED).expect("fits") + 50 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            throttle.failed(ip, start + Duration::from_millis(u64::from(i)));
        }
        assert!(throttle.lock().len() <= MAX_TRACKED);
        // A blocked address survives the pruning of idle ones.
        let later = start + 2 * WINDOW;
        for _ in 0..MAX_FAILURES {
            throttle.failed(GUESSER, later);
        }
        for i in 0..u32::try_from(MAX_TRACKED).expect("fits") {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 + i));
            throttle.failed(ip, later + Duration::from_millis(1));
        }
        assert!(
            throttle
                .blocked(GUESSER, later + Duration::from_secs(1))
                .is_some()
        );
    }
}
