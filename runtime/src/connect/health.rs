//! Which connectors cannot reach their outside system right now.
//!
//! A source or sink reports each failed and each successful contact here.
//! The first failure of an outage is logged (once, not per retry) and
//! counted; readiness lists every connector that is down; the first
//! success after an outage is logged with how long it lasted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use crate::metrics::Metrics;

/// The daemon's connectors that are down, by `<pipeline>/<name>`.
#[derive(Debug, Default)]
pub struct Health {
    down: Mutex<BTreeMap<String, Outage>>,
    /// How many entries `down` has: every successful write reports `up`,
    /// and with nothing down that must cost no lock.
    outages: AtomicUsize,
}

#[derive(Debug)]
struct Outage {
    since: Instant,
    why: String,
}

impl Health {
    /// No connector down.
    pub fn new() -> Self {
        Self::default()
    }

    /// `connector` (`<pipeline>/<name>`) could not reach its system. Logs
    /// and counts only the first report of an outage; `why` must carry no
    /// secret (scrub it first). Returns whether this began an outage.
    pub fn down(&self, metrics: &Metrics, connector: &str, why: &str) -> bool {
        let mut down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(outage) = down.get_mut(connector) {
            outage.why = why.to_owned();
            return false;
        }
        tracing::warn!(connector, error = %why, "cannot reach the outside system; retrying with backoff until it is back (logged once per outage)");
        metrics.connector_outage(connector);
        self.outages.fetch_add(1, Ordering::SeqCst);
        down.insert(
            connector.to_owned(),
            Outage {
                since: Instant::now(),
                why: why.to_owned(),
            },
        );
        true
    }

    /// `connector` reached its system. Logs the end of an outage.
    pub fn up(&self, metrics: &Metrics, connector: &str) {
        if self.outages.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(outage) = down.remove(connector) {
            self.outages.fetch_sub(1, Ordering::SeqCst);
            tracing::info!(
                connector,
                after = ?outage.since.elapsed(),
                "reached the outside system again"
            );
            metrics.connector_recovered(connector);
        }
    }

    /// `connector` was removed by a reload: an outage it had no longer
    /// holds readiness down, and its gauge goes.
    pub fn forget(&self, metrics: &Metrics, connector: &str) {
        let mut down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        if down.remove(connector).is_some() {
            self.outages.fetch_sub(1, Ordering::SeqCst);
        }
        metrics.forget_connector(connector);
    }

    /// Every connector that is down, with why, for readiness.
    pub fn outages(&self) -> Vec<(String, String)> {
        self.down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(name, outage)| {
                (
                    name.clone(),
                    format!(
                        "{} (down for {}s)",
                        outage.why,
                        outage.since.elapsed().as_secs()
                    ),
                )
            })
            .collect()
    }

    /// Whether `connector` is down.
    pub fn is_down(&self, connector: &str) -> bool {
        self.down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(connector)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_reported_once_and_cleared() {
        let metrics = Metrics::new();
        let health = Health::new();
        assert!(health.down(&metrics, "p/src", "connection refused"));
        assert!(!health.down(&metrics, "p/src", "connection refused"));
        assert_eq!(health.outages().len(), 1);
        assert!(health.is_down("p/src"));
        health.up(&metrics, "p/src");
        assert!(health.outages().is_empty());
        assert!(
            metrics
                .encode()
                .contains("sluice_connector_outages_total{connector=\"p/src\"} 1")
        );
    }
}
