//! A stage's pace: its `rate` limit, and its hold after a `Retry-After`.
//!
//! Every handler call waits its turn here first (a batch takes one token
//! per message). The limit is a GCRA token bucket
//! ([`crate::broker::rates`]): for the whole stage, shared by every daemon
//! when the broker offers shared buckets (NATS), or one per key with
//! `per:`, kept in this daemon's memory, at most `max_keys` of them (the
//! least recently used go first). A shared bucket is reserved from in
//! chunks of about 20 ms of tokens, so a fast limit does not cost a round
//! trip per message.
//!
//! A hold stops every call of the stage until a time: a sink's target
//! answered `Retry-After` (a 429 or 503), or a handler asked for
//! `retry(after)` on a stage with `hold_on_retry_after: true`. A hold ends
//! by itself; pausing is the operator's.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lru::LruCache;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::{AtomicU64, Ordering};

use super::lock;
use crate::broker::rates::{Gcra, SharedRates};
use crate::broker::{Message, now_millis};
use crate::config::{OrderingKey, Rate, Stage};
use crate::failure::FailureKind;
use crate::plugin::Outcome;

/// Tokens of a shared bucket reserved at once: about this long's worth.
const SHARED_CHUNK: Duration = Duration::from_millis(20);

/// How long a shared bucket that cannot be reached is not asked again;
/// meanwhile this daemon keeps to the limit on its own.
const SHARED_RETRY: Duration = Duration::from_secs(5);

/// The pace of one stage.
pub(super) struct Pace {
    limiter: Option<Limiter>,
    /// Whether a handler's `retry(after)` holds the stage (always for a sink).
    hold_on_retry_after: bool,
    /// No call starts before this: microseconds after `epoch`, 0 for
    /// none. An atomic, so that a sink (which may always be held) checks
    /// it on every call without a lock.
    hold_until: AtomicU64,
    /// `sluice_stage_hold_until_timestamp_seconds` of the stage.
    hold_gauge: Gauge<f64, AtomicU64>,
    /// Microseconds on the monotonic clock that local buckets use.
    epoch: Instant,
}

struct Limiter {
    rule: Gcra,
    per: Option<OrderingKey>,
    /// The stage's bucket (or, with `per`, the bucket of messages without
    /// a key), as a TAT on `epoch`'s clock.
    local: Mutex<u64>,
    /// With `per`: each key's TAT.
    keys: Mutex<LruCache<String, u64>>,
    /// The stage's bucket on the broker, for the limit to hold across
    /// daemons (without `per`).
    shared: Option<Shared>,
}

struct Shared {
    store: Arc<dyn SharedRates>,
    name: String,
    chunk: u32,
    /// Reserved turns not yet used: the next one and how many are left.
    reserved: tokio::sync::Mutex<Reserved>,
}

#[derive(Default)]
struct Reserved {
    next: Option<Instant>,
    left: u32,
    /// Not asked again before this after a failure.
    down_until: Option<Instant>,
}

impl Pace {
    /// The pace of `stage` (named `name` in shared buckets).
    pub(super) fn new(
        stage: &Stage,
        name: &str,
        shared: Option<Arc<dyn SharedRates>>,
        hold_gauge: Gauge<f64, AtomicU64>,
    ) -> Pace {
        Pace {
            limiter: stage
                .delivery
                .rate
                .as_ref()
                .map(|rate| Limiter::new(rate, name, shared)),
            hold_on_retry_after: stage.hold_on_retry_after || stage.is_sink(),
            hold_until: AtomicU64::new(0),
            hold_gauge,
            epoch: Instant::now(),
        }
    }

    /// Whether a call may have to wait now: under a limit, or in a hold.
    pub(super) fn may_wait(&self) -> bool {
        self.limiter.is_some() || self.held_until().is_some()
    }

    /// Whether the limit is per key.
    pub(super) fn is_per_key(&self) -> bool {
        self.limiter.as_ref().is_some_and(|l| l.per.is_some())
    }

    /// When the current hold ends, if one is on.
    fn held_until(&self) -> Option<Instant> {
        match self.hold_until.load(Ordering::Acquire) {
            0 => None,
            micros => Some(self.epoch + Duration::from_micros(micros))
                .filter(|until| *until > Instant::now()),
        }
    }

    /// Waits until `message`'s call (`cost` messages: a batch's size) may
    /// start: past any hold, then its turn under the limit.
    pub(super) async fn wait_turn(&self, message: &Message, cost: u32) {
        while let Some(until) = self.held_until() {
            tokio::time::sleep_until(until.into()).await;
        }
        let Some(limiter) = &self.limiter else {
            return;
        };
        let at = limiter.turn(message, cost, self.epoch).await;
        // Most turns under a limit far above the stage's pace are now: no
        // timer for those.
        if at > Instant::now() {
            tokio::time::sleep_until(at.into()).await;
        }
    }

    /// Holds the stage if `outcome` asks the caller to come back later and
    /// the stage holds on that.
    pub(super) fn observe(&self, outcome: &Outcome) {
        if !self.hold_on_retry_after {
            return;
        }
        let Err(failure) = outcome else { return };
        let Some(after) = failure.retry_after else {
            return;
        };
        if !matches!(failure.kind, FailureKind::Retry | FailureKind::Unavailable) || after.is_zero()
        {
            return;
        }
        let until = Instant::now() + after;
        let micros = u64::try_from(until.duration_since(self.epoch).as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        if self.hold_until.fetch_max(micros, Ordering::AcqRel) < micros {
            self.hold_gauge.set(wall_millis(until) as f64 / 1000.0);
            tracing::warn!(hold = ?after, "holding the stage: its target asked to come back later (Retry-After)");
        }
    }
}

impl Limiter {
    fn new(rate: &Rate, name: &str, shared: Option<Arc<dyn SharedRates>>) -> Limiter {
        let rule = Gcra::new(rate.interval(), rate.burst.get());
        let keys = usize::try_from(rate.max_keys.get()).unwrap_or(usize::MAX);
        let chunk = (rate.limit.per_second() * SHARED_CHUNK.as_secs_f64()).floor();
        Limiter {
            rule,
            per: rate.per.clone(),
            local: Mutex::new(0),
            keys: Mutex::new(LruCache::new(
                NonZeroUsize::new(keys).unwrap_or(NonZeroUsize::MIN),
            )),
            // A per-key limit is this daemon's; see the module's doc.
            shared: shared.filter(|_| rate.per.is_none()).map(|store| Shared {
                store,
                name: name.to_owned(),
                chunk: (chunk as u32).max(1),
                reserved: tokio::sync::Mutex::new(Reserved::default()),
            }),
        }
    }

    /// When a call of `cost` messages for `message` may start.
    async fn turn(&self, message: &Message, cost: u32, epoch: Instant) -> Instant {
        let now_us = u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX);
        let key = self.per.as_ref().and_then(|per| match per {
            OrderingKey::Key => message.key.clone(),
            OrderingKey::Header(name) => message.header(name).map(str::to_owned),
        });
        let at_us = match key {
            Some(key) => {
                let mut keys = lock(&self.keys);
                let tat = keys.get_or_insert_mut(key, || 0);
                let (at, next) = self.rule.reserve(*tat, now_us, cost);
                *tat = next;
                at
            }
            None => {
                if let Some(shared) = &self.shared
                    && let Some(at) = shared.turn(self.rule, cost).await
                {
                    return at;
                }
                let mut tat = lock(&self.local);
                let (at, next) = self.rule.reserve(*tat, now_us, cost);
                *tat = next;
                at
            }
        };
        epoch + Duration::from_micros(at_us)
    }
}

impl Shared {
    /// The next reserved turn, reserving another chunk when none is left;
    /// `None` if the shared bucket cannot be reached (the caller then
    /// keeps to the limit locally).
    async fn turn(&self, rule: Gcra, cost: u32) -> Option<Instant> {
        let mut reserved = self.reserved.lock().await;
        let now = Instant::now();
        if reserved.down_until.is_some_and(|until| until > now) {
            return None;
        }
        let interval = Duration::from_micros(rule.interval_us);
        if reserved.left >= cost
            && let Some(next) = reserved.next
        {
            reserved.left -= cost;
            reserved.next = Some(next + interval * cost);
            return Some(next + interval * (cost - 1));
        }
        let want = self.chunk.max(cost);
        match self.store.reserve(&self.name, rule, want).await {
            Ok(wait) => {
                // The chunk's first turn is `want - 1` intervals before
                // the time the store gave (when its last token is due).
                let last = Instant::now() + wait;
                let first = last
                    .checked_sub(interval * (want - 1))
                    .unwrap_or(last)
                    .max(now);
                reserved.next = Some(first + interval * cost);
                reserved.left = want - cost;
                Some(first + interval * (cost - 1))
            }
            Err(err) => {
                tracing::warn!(
                    bucket = %self.name,
                    error = %err,
                    "cannot reach the shared rate bucket; keeping to the limit in this daemon alone for now"
                );
                reserved.down_until = Some(now + SHARED_RETRY);
                reserved.left = 0;
                None
            }
        }
    }
}

/// Milliseconds since the Unix epoch at `until`.
fn wall_millis(until: Instant) -> u64 {
    now_millis().saturating_add(
        u64::try_from(until.saturating_duration_since(Instant::now()).as_millis())
            .unwrap_or(u64::MAX),
    )
}
