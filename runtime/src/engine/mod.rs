//! The stage runner: for each stage, fetch → valve → ordering lane →
//! resolve claim → dedup → invoke → settle.
//!
//! - `stage`: a stage's shared state and run, with its parts:
//!   `stage::intake` (the fetch loop, in-flight permits and byte budget,
//!   dispatch), `stage::lanes` (per-key ordering), `stage::attempt` (one
//!   delivery through the concurrency valve, dedup, invoke and settle, and
//!   the batch call) and `stage::leases` (the lease heartbeat and graceful
//!   drain);
//! - `settle`: the outcome table (complete, nak with backoff,
//!   dead-letter with provenance);
//! - `dedup`: the dedup step (run, wait for the key's holder, or settle
//!   as a duplicate);
//! - `backoff`: exponential backoff with jitter;
//! - `ids`: deterministic output ids;
//! - `handler`: what a worker slot is (a plugin worker, or native code).
//!
//! The engine only talks to a [`Broker`], so the same code runs on the
//! embedded broker and on NATS.

mod backoff;
mod dedup;
mod handler;
mod ids;
mod settle;
mod stage;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

pub use backoff::delay as backoff_delay;
pub use handler::StageHandler;
pub use ids::emit_id;
pub use stage::{DEFAULT_IN_FLIGHT, IN_FLIGHT_BYTES, StageSetup};

use crate::broker::{Broker, BrokerError, consumer_name};
use crate::claim::Claims;
use crate::dedup::DedupStore;
use crate::metrics::Metrics;

/// Running stages. Dropping it without [`Engine::shutdown`] aborts nothing:
/// the stage tasks keep running until the runtime ends.
pub struct Engine {
    /// The instant shutdown began, once it has.
    stop: watch::Sender<Option<Instant>>,
    runners: Vec<Arc<stage::StageRunner>>,
    stages: Vec<JoinHandle<()>>,
}

impl Engine {
    /// Declares each stage's consumer and starts its loop. `claims`
    /// resolves claim-check references before a handler runs (a reference
    /// with no `claims` is `claim-missing`); publishing through a
    /// [`ClaimingBroker`](crate::claim::ClaimingBroker) offloads outputs.
    /// `dedup` keeps the records of stages with `dedup:` (the broker's own
    /// store, which [`Broker::complete`] records keys in); a stage with
    /// `dedup:` and no store is refused.
    pub async fn start(
        broker: Arc<dyn Broker>,
        metrics: Arc<Metrics>,
        claims: Option<Arc<Claims>>,
        dedup: Option<Arc<dyn DedupStore>>,
        setups: Vec<StageSetup>,
    ) -> Result<Engine, BrokerError> {
        let mut dedup_stores = Vec::with_capacity(setups.len());
        for setup in &setups {
            for consumer in setup.consumers() {
                broker.ensure_consumer(&consumer).await?;
            }
            dedup_stores.push(dedup_store(dedup.as_ref(), setup).await?);
        }
        let (stop, stopped) = watch::channel(None);
        let mut runners = Vec::with_capacity(setups.len());
        let stages = setups
            .into_iter()
            .zip(dedup_stores)
            .map(|(setup, dedup)| {
                let span = tracing::info_span!(
                    "stage",
                    pipeline = %setup.pipeline,
                    stage = %setup.stage.name
                );
                let runner = Arc::new(stage::StageRunner::new(
                    setup,
                    broker.clone(),
                    metrics.clone(),
                    claims.clone(),
                    dedup,
                ));
                runners.push(runner.clone());
                tokio::spawn(runner.run(stopped.clone()).instrument(span))
            })
            .collect();
        Ok(Engine {
            stop,
            runners,
            stages,
        })
    }

    /// Shuts the stages down and returns when they are done, within each
    /// pipeline's `shutdown_timeout` (plus a moment to hand deliveries
    /// back) whatever the handlers and the broker do:
    ///
    /// - no handler call starts from now on;
    /// - deliveries fetched but not started are naked (or left to their
    ///   lease if the broker does not answer);
    /// - calls and settles already running get until the deadline, then
    ///   are abandoned: their messages are never acked, so they are
    ///   redelivered (to another daemon, or to this one after a restart).
    pub async fn shutdown(self) {
        let began = Instant::now();
        for runner in &self.runners {
            runner.stop_calls();
        }
        let _ = self.stop.send(Some(began));
        let longest = self
            .runners
            .iter()
            .map(|r| r.shutdown_timeout())
            .max()
            .unwrap_or_default();
        // Each stage keeps its own deadline; this only guards against a
        // stage task that somehow does not.
        let limit = began + longest + stage::RELEASE_GRACE * 4;
        for mut stage in self.stages {
            match tokio::time::timeout_at(limit.into(), &mut stage).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::error!(error = %err, "a stage task ended abnormally"),
                Err(_) => {
                    tracing::error!("a stage did not finish its shutdown in time; abandoning it");
                    stage.abort();
                }
            }
        }
    }
}

/// The dedup store of a stage with `dedup:`, prepared for its records.
async fn dedup_store(
    store: Option<&Arc<dyn DedupStore>>,
    setup: &StageSetup,
) -> Result<Option<Arc<dyn DedupStore>>, BrokerError> {
    let Some(dedup) = &setup.stage.dedup else {
        return Ok(None);
    };
    let store = store.ok_or_else(|| {
        BrokerError::Provision(format!(
            "stage `{}` of pipeline `{}` has `dedup:`, but this broker keeps no dedup records",
            setup.stage.name, setup.pipeline
        ))
    })?;
    store
        .ensure_scope(
            &consumer_name(&setup.pipeline, &setup.stage.name),
            dedup.ttl.get(),
        )
        .await?;
    Ok(Some(store.clone()))
}
