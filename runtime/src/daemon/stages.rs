//! Each stage's setup at start-up and on a reload: a plugin's workers
//! (with the sandbox's grants: secrets, state, outbound HTTP) or a sink's
//! connector behind its handler slots; and the engine started on them all.

use std::collections::HashMap;
use std::sync::Arc;

use super::{DaemonError, Parts, StageKey, stage_key};
use crate::broker::Broker;
use crate::claim::Claims;
use crate::config::Pipeline;
use crate::connect;
use crate::dedup::DedupStore;
use crate::engine::{Engine, StageHandler, StageSetup};
use crate::metrics::Metrics;
use crate::plugin::PluginHost;

/// Sets up every stage and starts the engine on them; returns it with the
/// sha256 of each plugin stage's component.
pub(super) async fn start_stages(
    pipelines: &[Pipeline],
    parts: &Parts<'_>,
    claims: Option<Arc<Claims>>,
    dedup: Arc<dyn DedupStore>,
) -> Result<(Engine, HashMap<StageKey, String>), DaemonError> {
    let mut setups = Vec::new();
    let mut plugin_shas = HashMap::new();
    for pipeline in pipelines {
        for stage in &pipeline.stages {
            let (setup, sha) = stage_setup(
                pipeline,
                stage,
                parts.host,
                parts.broker,
                parts.metrics,
                parts.health,
                parts.data_dir,
            )
            .await?;
            if let Some(sha) = sha {
                plugin_shas.insert(stage_key(pipeline, stage), sha);
            }
            setups.push(setup);
        }
    }
    let engine = Engine::start(
        parts.broker.clone(),
        parts.metrics.clone(),
        claims,
        Some(dedup),
        setups,
    )
    .await?;
    Ok((engine, plugin_shas))
}

/// A stage's setup: a sink's connector, or the plugin's workers (with the
/// plugin's sha256, which a reload compares).
pub(super) async fn stage_setup(
    pipeline: &Pipeline,
    stage: &crate::config::Stage,
    host: &PluginHost,
    broker: &Arc<dyn Broker>,
    metrics: &Arc<Metrics>,
    health: &Arc<connect::Health>,
    data_dir: &std::path::Path,
) -> Result<(StageSetup, Option<String>), DaemonError> {
    if let Some(sink) = &stage.sink {
        return Ok((
            sink_setup(pipeline, stage, sink, metrics, health, data_dir).await?,
            None,
        ));
    }
    let plugin = host.load(&stage.plugin)?;
    // Checked at validation too; again here, on the bytes loaded.
    stage
        .check_pin(plugin.sha256())
        .map_err(DaemonError::PluginPin)?;
    plugin.check_grants(&stage.name, &stage.grants())?;
    let mut settings = stage.worker_settings_with(&pipeline.secret_values);
    // Errors the guest meets name the stage with its pipeline.
    settings.secrets = settings
        .secrets
        .for_stage(&format!("{}/{}", pipeline.name, stage.name));
    if let Some((store, max_bytes)) = stage.state_store(&pipeline.name) {
        let Some(reader) = broker.state() else {
            return Err(DaemonError::Unsupported(format!(
                "stage `{}` of pipeline `{}` has `state:`, which this broker cannot commit with \
                 the ack; remove `state:` or run on the embedded broker or NATS",
                stage.name, pipeline.name
            )));
        };
        settings.state = Some(crate::state::StateAccess {
            reader,
            store: store.into(),
            max_bytes,
        });
    }
    settings.http = stage
        .outbound(Some((pipeline.name.clone(), metrics.clone())))
        .map(|sender| sender.map(crate::plugin::HttpSender::Live))
        .map_err(|why| {
            DaemonError::Unsupported(format!(
                "stage `{}` of pipeline `{}`: its `http:` cannot be set up: {why}",
                stage.name, pipeline.name
            ))
        })?;
    let handlers: Vec<Box<dyn StageHandler>> = (0..stage.delivery.concurrency.get())
        .map(|_| Box::new(plugin.worker(settings.clone())) as Box<dyn StageHandler>)
        .collect();
    Ok((
        StageSetup {
            pipeline: pipeline.name.clone(),
            stage: stage.clone(),
            shutdown_timeout: pipeline.shutdown_timeout.get(),
            handlers,
            plugin_sha256: Some(plugin.sha256().to_owned()),
        },
        Some(plugin.sha256().to_owned()),
    ))
}

/// The stage that runs a sink: its connector built (not yet connected)
/// behind `concurrency` handler slots.
async fn sink_setup(
    pipeline: &Pipeline,
    stage: &crate::config::Stage,
    sink: &connect::SinkDef,
    metrics: &Arc<Metrics>,
    health: &Arc<connect::Health>,
    data_dir: &std::path::Path,
) -> Result<StageSetup, DaemonError> {
    let ctx = connect::Context {
        pipeline: pipeline.name.clone(),
        name: sink.name.clone(),
        metrics: metrics.clone(),
        health: health.clone(),
        data_dir: Some(data_dir.to_owned()),
    };
    let connector = sink.connector().ok_or_else(|| {
        DaemonError::Unsupported(format!("sink `{}` has no connector block", sink.name))
    })?;
    for warning in connector.warnings() {
        tracing::warn!(sink = %ctx.label(), field = %warning.path.join("."), "{}", warning.message);
    }
    let built = connector
        .build_for(&ctx, *stage.delivery.concurrency)
        .await?;
    metrics.connector_started(&ctx.label());
    tracing::info!(sink = %ctx.label(), target = %connector.describe(), "sink ready");
    let handlers: Vec<Box<dyn StageHandler>> = (0..stage.delivery.concurrency.get())
        .map(|_| {
            Box::new(connect::SinkHandler::new(
                built.clone(),
                ctx.clone(),
                stage.delivery.timeout.get(),
                stage.delivery.retry.backoff.max.get(),
            )) as Box<dyn StageHandler>
        })
        .collect();
    Ok(StageSetup {
        pipeline: pipeline.name.clone(),
        stage: stage.clone(),
        shutdown_timeout: pipeline.shutdown_timeout.get(),
        handlers,
        plugin_sha256: None,
    })
}
