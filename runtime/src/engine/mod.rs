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
pub use handler::{PendingOutcome, StageHandler};
pub use ids::emit_id;
pub use stage::{DEFAULT_IN_FLIGHT, IN_FLIGHT_BYTES, StageSetup};

use crate::broker::{Broker, BrokerError, consumer_name};
use crate::claim::Claims;
use crate::dedup::DedupStore;
use crate::metrics::Metrics;

/// Running stages. Dropping it without [`Engine::shutdown`] aborts nothing:
/// the stage tasks keep running until the runtime ends.
pub struct Engine {
    broker: Arc<dyn Broker>,
    metrics: Arc<Metrics>,
    claims: Option<Arc<Claims>>,
    dedup: Option<Arc<dyn DedupStore>>,
    stages: Vec<RunningStage>,
}

/// Stages whose consumers are declared, ready for [`Engine::launch`].
pub struct PreparedStages {
    stages: Vec<(StageSetup, Option<Arc<dyn DedupStore>>)>,
}

/// One stage's runner and task, and the switch that stops it alone (a
/// reload that removes or replaces it) or with the others (shutdown).
struct RunningStage {
    pipeline: String,
    stage: String,
    /// The instant its shutdown began, once it has.
    stop: watch::Sender<Option<Instant>>,
    runner: Arc<stage::StageRunner>,
    task: JoinHandle<()>,
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
        let mut engine = Engine {
            broker,
            metrics,
            claims,
            dedup,
            stages: Vec::new(),
        };
        engine.add(setups).await?;
        Ok(engine)
    }

    /// Starts more stages beside those running: their consumers are
    /// declared first, so a broker that refuses one starts none of them.
    pub async fn add(&mut self, setups: Vec<StageSetup>) -> Result<(), BrokerError> {
        let prepared = self.prepare(setups).await?;
        self.launch(prepared);
        Ok(())
    }

    /// Declares the consumers (and dedup scopes) of stages about to start,
    /// without starting them: a reload does this while the stages they
    /// replace still run, so a broker that refuses changes nothing.
    pub async fn prepare(&self, setups: Vec<StageSetup>) -> Result<PreparedStages, BrokerError> {
        let mut dedup_stores = Vec::with_capacity(setups.len());
        for setup in &setups {
            for consumer in setup.consumers() {
                self.broker.ensure_consumer(&consumer).await?;
            }
            dedup_stores.push(dedup_store(self.dedup.as_ref(), setup).await?);
        }
        Ok(PreparedStages {
            stages: setups.into_iter().zip(dedup_stores).collect(),
        })
    }

    /// Starts stages [`Engine::prepare`] made ready.
    pub fn launch(&mut self, prepared: PreparedStages) {
        for (setup, dedup) in prepared.stages {
            let span = tracing::info_span!(
                "stage",
                pipeline = %setup.pipeline,
                stage = %setup.stage.name
            );
            let (pipeline, name) = (setup.pipeline.clone(), setup.stage.name.clone());
            let runner = Arc::new(stage::StageRunner::new(
                setup,
                self.broker.clone(),
                self.metrics.clone(),
                self.claims.clone(),
                dedup,
            ));
            let (stop, stopped) = watch::channel(None);
            let task = tokio::spawn(runner.clone().run(stopped).instrument(span));
            self.stages.push(RunningStage {
                pipeline,
                stage: name,
                stop,
                runner,
                task,
            });
        }
    }

    /// Whether stage `stage` of `pipeline` runs here.
    pub fn runs(&self, pipeline: &str, stage: &str) -> bool {
        self.stages
            .iter()
            .any(|s| s.pipeline == pipeline && s.stage == stage)
    }

    /// Stops the stages `which` names (`(pipeline, stage)`) as
    /// [`Engine::shutdown`] stops all of them, and returns once they are
    /// done; the others run on. Their consumers stay with the broker, so a
    /// stage started again under the same name goes on where this one
    /// stopped.
    pub async fn remove(&mut self, which: &[(String, String)]) {
        let (going, staying): (Vec<_>, Vec<_>) = std::mem::take(&mut self.stages)
            .into_iter()
            .partition(|s| which.iter().any(|(p, n)| *p == s.pipeline && *n == s.stage));
        self.stages = staying;
        stop(going).await;
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
        stop(self.stages).await;
    }
}

/// Stops `stages` together (see [`Engine::shutdown`]).
async fn stop(stages: Vec<RunningStage>) {
    let began = Instant::now();
    for stage in &stages {
        stage.runner.stop_calls();
        stage.stop.send_replace(Some(began));
    }
    let longest = stages
        .iter()
        .map(|s| s.runner.shutdown_timeout())
        .max()
        .unwrap_or_default();
    // Each stage keeps its own deadline; this only guards against a
    // stage task that somehow does not.
    let limit = began + longest + stage::RELEASE_GRACE * 4;
    for mut stage in stages {
        match tokio::time::timeout_at(limit.into(), &mut stage.task).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::error!(
                error = %err,
                pipeline = %stage.pipeline,
                stage = %stage.stage,
                "a stage task ended abnormally"
            ),
            Err(_) => {
                tracing::error!(
                    pipeline = %stage.pipeline,
                    stage = %stage.stage,
                    "a stage did not finish its shutdown in time; abandoning it"
                );
                stage.task.abort();
            }
        }
    }
}

/// The dedup store of a stage with `dedup:`, prepared for its records.
async fn dedup_store(
    store: Option<&Arc<dyn DedupStore>>,
    setup: &StageSetup,
) -> Result<Option<Arc<dyn DedupStore>>, BrokerError> {
    let Some(dedup) = &setup.stage.delivery.dedup else {
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
