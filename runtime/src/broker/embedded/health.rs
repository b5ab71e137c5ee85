//! What the broker reports to the readiness probe and the storage-error
//! metric: a failed write (the store is being reopened, writes wait) and
//! read errors (a damaged block a consumer cannot read past).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::broker::{BrokerError, Readiness};

/// The broker's storage health; every method answers at once.
#[derive(Default)]
pub(super) struct Health {
    /// Why writes fail, until the store takes writes again.
    write_failure: Mutex<Option<String>>,
    /// The last read error per topic, until a read of that topic succeeds.
    read_failures: Mutex<BTreeMap<String, String>>,
    /// Storage errors since open.
    errors: AtomicU64,
}

impl Health {
    /// A write failed: not ready until [`Health::recovered`].
    pub fn write_failed(&self, e: &BrokerError) {
        self.count_error();
        let mut failure = lock(&self.write_failure);
        if failure.is_none() {
            tracing::error!(error = %e, "embedded broker: a write failed; writes wait until the store is reopened");
        }
        *failure = Some(e.to_string());
    }

    /// Why writes fail now, if they do.
    pub fn write_failure(&self) -> Option<String> {
        lock(&self.write_failure).clone()
    }

    /// The store takes writes again.
    pub fn recovered(&self) {
        *lock(&self.write_failure) = None;
    }

    /// Counts a storage error.
    pub fn count_error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A read of `topic` failed (near `seq`, when known).
    pub fn read_failed(&self, topic: &str, seq: Option<u64>, e: &BrokerError) {
        self.count_error();
        let at = seq.map(|s| format!(" at seq {s}")).unwrap_or_default();
        let why = format!(
            "topic {topic} cannot be read{at} ({e}); stop the daemon and run `sluice data check`, then `sluice data quarantine`"
        );
        let mut failures = lock(&self.read_failures);
        if failures.get(topic) != Some(&why) {
            tracing::error!(topic, seq, error = %e, "embedded broker: a read failed");
        }
        failures.insert(topic.to_owned(), why);
    }

    /// A read of `topic` succeeded.
    pub fn read_ok(&self, topic: &str) {
        let mut failures = lock(&self.read_failures);
        if !failures.is_empty() {
            failures.remove(topic);
        }
    }

    /// Storage errors since open.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// The readiness answer.
    pub fn readiness(&self) -> Readiness {
        if let Some(why) = self.write_failure() {
            return Readiness::NotReady(format!("the embedded store cannot take writes: {why}"));
        }
        let failures = lock(&self.read_failures);
        if failures.is_empty() {
            Readiness::Ready
        } else {
            Readiness::Degraded(failures.values().cloned().collect::<Vec<_>>().join("; "))
        }
    }
}

/// Locks, ignoring poisoning (the data is plain state).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
