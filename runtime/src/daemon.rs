//! `sluice run`: pipelines in, a running daemon out.
//!
//! Start-up is all-or-nothing: every file is checked (and every plugin
//! loaded) before anything binds a port or opens the data directory, so a
//! bad file never leaves a partial daemon behind. Then the admin address is
//! bound, the broker opened, topics and consumers declared, and the stages
//! started. SIGTERM or SIGINT drains the stages (see `engine`) and flushes
//! the broker before exit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::admin::{self, AdminState};
use crate::broker::embedded::{EmbeddedBroker, EmbeddedOptions, SyncMode};
use crate::broker::{Broker, BrokerError, TopicSpec};
use crate::config::{self, Diagnostics, Pipeline};
use crate::engine::{Engine, StageHandler, StageSetup};
use crate::metrics::Metrics;
use crate::plugin::{HostConfig, HostError, LoadError, PluginHost};

/// How to run.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// Pipeline files or directories.
    pub paths: Vec<PathBuf>,
    /// Where the embedded broker keeps its data.
    pub data_dir: PathBuf,
    /// The admin HTTP address.
    pub admin: SocketAddr,
    /// The embedded broker's durability setting.
    pub sync: SyncMode,
    /// The plugin host's settings (cache directory, limits).
    pub host: HostConfig,
}

/// Why the daemon could not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A pipeline file is wrong; nothing was started.
    #[error("{0}")]
    Config(Diagnostics),
    /// A pipeline asks for something this build cannot do yet.
    #[error("{0}")]
    Unsupported(String),
    /// The plugin host could not be created.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A plugin failed to load after validation passed (it changed on disk).
    #[error(transparent)]
    Plugin(#[from] LoadError),
    /// The admin address could not be bound.
    #[error(
        "cannot listen on {addr}: {source} (is another daemon running? choose another --admin)"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The broker failed.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The admin server failed.
    #[error("admin server failed: {0}")]
    Admin(std::io::Error),
}

/// What a successful start looks like, for the ready line and tests.
#[derive(Debug, Clone)]
pub struct Started {
    /// The admin address actually bound.
    pub admin: SocketAddr,
    /// Pipelines and stage counts.
    pub pipelines: Vec<(String, usize)>,
}

/// Loads and checks every pipeline and its plugins; nothing else.
pub fn load(opts: &DaemonOptions) -> Result<(Vec<Pipeline>, PluginHost), DaemonError> {
    let pipelines = config::load(&opts.paths).map_err(DaemonError::Config)?;
    for pipeline in &pipelines {
        if pipeline.broker != "embedded" {
            return Err(DaemonError::Unsupported(format!(
                "{}: pipeline `{}` uses broker `{}`, but this build runs pipelines on the embedded broker only (NATS JetStream support is the next milestone); use `broker: embedded`",
                pipeline.source.display(),
                pipeline.name,
                pipeline.broker
            )));
        }
    }
    let workers: u32 = pipelines
        .iter()
        .flat_map(|p| &p.stages)
        .map(|s| s.concurrency.get())
        .sum();
    let host = PluginHost::new(HostConfig {
        max_instances: workers.saturating_add(8).max(opts.host.max_instances),
        ..opts.host.clone()
    })?;
    let pipelines =
        config::load_and_check_plugins(&opts.paths, &host).map_err(DaemonError::Config)?;
    Ok((pipelines, host))
}

/// Runs the daemon until `shutdown` resolves, then drains and returns.
/// `ready` is called once everything is up.
pub async fn run(
    opts: DaemonOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(&Started),
) -> Result<(), DaemonError> {
    let (pipelines, host) = load(&opts)?;

    let listener = tokio::net::TcpListener::bind(opts.admin)
        .await
        .map_err(|source| DaemonError::Bind {
            addr: opts.admin,
            source,
        })?;
    let admin_addr = listener.local_addr().map_err(|source| DaemonError::Bind {
        addr: opts.admin,
        source,
    })?;

    let embedded = EmbeddedBroker::open(EmbeddedOptions {
        sync: opts.sync,
        ..EmbeddedOptions::new(opts.data_dir.clone())
    })?;
    let broker: Arc<dyn Broker> = embedded;
    for spec in topic_specs(&pipelines) {
        broker.ensure_topic(&spec).await?;
    }

    let mut setups = Vec::new();
    for pipeline in &pipelines {
        for stage in &pipeline.stages {
            let plugin = host.load(&stage.plugin)?;
            let handlers: Vec<Box<dyn StageHandler>> = (0..stage.concurrency.get())
                .map(|_| Box::new(plugin.worker(stage.worker_settings())) as Box<dyn StageHandler>)
                .collect();
            setups.push(StageSetup {
                pipeline: pipeline.name.clone(),
                stage: stage.clone(),
                shutdown_timeout: pipeline.shutdown_timeout.get(),
                handlers,
            });
        }
    }
    let metrics = Arc::new(Metrics::new());
    let engine = Engine::start(broker.clone(), metrics.clone(), setups).await?;

    let pipelines: Arc<[Pipeline]> = pipelines.into();
    let (stop_admin, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    let state = AdminState::new(broker.clone(), metrics.clone(), pipelines.clone());
    let admin_task = tokio::spawn(admin::serve(listener, state, async move {
        let _ = admin_stopped.await;
    }));

    ready(&Started {
        admin: admin_addr,
        pipelines: pipelines
            .iter()
            .map(|p| (p.name.clone(), p.stages.len()))
            .collect(),
    });

    shutdown.await;
    tracing::info!("shutting down: draining stages");
    engine.shutdown().await;
    let _ = stop_admin.send(());
    let admin_result = admin_task.await;
    broker.flush().await?;
    tracing::info!("stopped");
    match admin_result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(DaemonError::Admin(err)),
        Err(err) => Err(DaemonError::Admin(std::io::Error::other(err))),
    }
}

/// Every topic the pipelines declare, plus each stage's DLQ topic.
fn topic_specs(pipelines: &[Pipeline]) -> Vec<TopicSpec> {
    let mut specs: Vec<TopicSpec> = Vec::new();
    let mut add = |spec: TopicSpec| {
        if !specs.iter().any(|s| s.name == spec.name) {
            specs.push(spec);
        }
    };
    for pipeline in pipelines {
        for topic in &pipeline.topics {
            add(TopicSpec {
                name: topic.name.clone(),
                retention: topic.retention.map(|r| r.get()),
            });
        }
        for stage in &pipeline.stages {
            add(TopicSpec {
                name: stage.dlq_topic(&pipeline.name),
                retention: None,
            });
        }
    }
    specs
}
