//! The running sources, each with its own stop, so a reload can stop,
//! start or restart one while the others read on.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::DaemonError;
use crate::broker::Broker;
use crate::config::Pipeline;
use crate::connect::{self, SourceDef};
use crate::metrics::Metrics;

/// What a source's runner is made of; two equal plans run the same way, so
/// a reload restarts a source only when its plan changed.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SourcePlan {
    pub(super) pipeline: String,
    pub(super) source: SourceDef,
    /// Its topic's lowest `high_water_mark` across the pipelines.
    high_water_mark: Option<u64>,
    /// The consumers of its topic, whose backlog backpressure counts.
    subscribers: Vec<String>,
}

impl SourcePlan {
    /// `pipeline/source`.
    pub(super) fn name(&self) -> String {
        format!("{}/{}", self.pipeline, self.source.name)
    }

    /// What changed from `old`, for the reload report.
    pub(super) fn changes_from(&self, old: &SourcePlan) -> Vec<String> {
        let mut why = Vec::new();
        if self.source != old.source {
            why.push("settings".to_owned());
        }
        if self.high_water_mark != old.high_water_mark {
            why.push("its topic's high_water_mark".to_owned());
        }
        if self.subscribers != old.subscribers {
            why.push("its topic's subscribers".to_owned());
        }
        why
    }
}

/// Every source of `pipelines`, planned.
pub(super) fn plans(pipelines: &[Pipeline]) -> Vec<SourcePlan> {
    let mut plans = Vec::new();
    for pipeline in pipelines {
        for source in &pipeline.sources {
            let high_water_mark = pipelines
                .iter()
                .flat_map(|p| &p.topics)
                .filter(|t| t.name == source.to)
                .filter_map(|t| t.high_water_mark)
                .min();
            let mut subscribers: Vec<String> = pipelines
                .iter()
                .flat_map(|p| {
                    p.stages
                        .iter()
                        .flat_map(|s| crate::broker::stage_inputs(&p.name, s))
                        .filter(|input| input.topic == source.to)
                        .map(|input| input.consumer)
                })
                .collect();
            subscribers.sort();
            plans.push(SourcePlan {
                pipeline: pipeline.name.clone(),
                source: source.clone(),
                high_water_mark,
                subscribers,
            });
        }
    }
    plans
}

/// A source's connector built (not yet connected) from its plan.
pub(super) async fn setup(
    plan: &SourcePlan,
    metrics: &Arc<Metrics>,
    health: &Arc<connect::Health>,
) -> Result<connect::source::SourceSetup, DaemonError> {
    let source = &plan.source;
    let ctx = connect::Context {
        pipeline: plan.pipeline.clone(),
        name: source.name.clone(),
        metrics: metrics.clone(),
        health: health.clone(),
        data_dir: None,
    };
    let connector = source.connector().ok_or_else(|| {
        DaemonError::Unsupported(format!("source `{}` has no connector block", source.name))
    })?;
    for warning in connector.warnings() {
        tracing::warn!(source = %ctx.label(), field = %warning.path.join("."), "{}", warning.message);
    }
    let built = connector.build(&ctx).await?;
    tracing::info!(source = %ctx.label(), upstream = %connector.describe(), to = %source.to, "source ready");
    Ok(connect::source::SourceSetup {
        ctx,
        source: built,
        topic: source.to.clone(),
        dlq_topic: source.dlq_topic(&plan.pipeline),
        high_water_mark: plan.high_water_mark,
        subscribers: plan.subscribers.clone(),
        delay_from: source.delay_from.clone(),
        read_max: connector.read_max(),
    })
}

/// One running source.
struct RunningSource {
    plan: SourcePlan,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// The running sources.
#[derive(Default)]
pub(super) struct Sources {
    running: Vec<RunningSource>,
}

impl Sources {
    /// Starts `setup` (made from `plan`) publishing through `broker`.
    pub(super) fn start(
        &mut self,
        plan: SourcePlan,
        setup: connect::source::SourceSetup,
        broker: Arc<dyn Broker>,
    ) {
        let span =
            tracing::info_span!("source", pipeline = %setup.ctx.pipeline, source = %setup.ctx.name);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(connect::source::run(setup, broker, stopped).instrument(span));
        self.running.push(RunningSource { plan, stop, task });
    }

    /// The plan each running source was started from.
    pub(super) fn plans(&self) -> impl Iterator<Item = &SourcePlan> {
        self.running.iter().map(|r| &r.plan)
    }

    /// Stops the sources `names` names (`pipeline/source`; every one when
    /// `None`) and waits for them until `deadline`: a read being published
    /// finishes (and is acked upstream) or is given back. One that has not
    /// stopped by then is abandoned; what it read and did not acknowledge
    /// is read again later. Returns whether all stopped in time.
    pub(super) async fn stop(
        &mut self,
        names: Option<&[String]>,
        deadline: tokio::time::Instant,
    ) -> bool {
        let (going, staying): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|r| names.is_none_or(|names| names.contains(&r.plan.name())));
        self.running = staying;
        for source in &going {
            let _ = source.stop.send(true);
        }
        let mut in_time = true;
        for mut source in going {
            if tokio::time::timeout_at(deadline, &mut source.task)
                .await
                .is_err()
            {
                in_time = false;
                source.task.abort();
            }
        }
        in_time
    }
}
