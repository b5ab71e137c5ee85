//! Hot reload: the daemon's files read again and applied while it runs.
//!
//! One reload at a time, in the daemon's own loop ([`Live::serve`]):
//!
//! 1. **Validate first.** Every file is parsed and checked and every plugin
//!    loaded, off the async threads, as at start-up. What a reload cannot
//!    change (the broker, claim-check settings) is refused here. So is
//!    removing a topic that still holds messages, unless forced. Any error
//!    and nothing changes: the last good configuration keeps running.
//! 2. **Build before stopping.** The new stages' workers and sink
//!    connectors, the new sources, the new topics and the new stages'
//!    consumers are made while the old ones run, so a failure here also
//!    changes nothing.
//! 3. **Only what changed restarts.** A stage whose settings, plugin bytes
//!    or pipeline `shutdown_timeout` changed is drained (no call starts;
//!    calls in flight get its `shutdown_timeout`; deliveries not started
//!    go back to the broker) and started again from its new setup; a
//!    removed stage is drained; an added one starts. Sources likewise.
//!    Everything else runs on untouched.
//! 4. The admin API then serves the new pipelines, and the report says
//!    what changed.
//!
//! A removed stage's consumer stays with the broker: it keeps its place,
//! so a stage added back under the same name goes on from there, and its
//! topic keeps what it has not read (until the topic's `retention`). The
//! report warns about it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, watch};
use tracing::Instrument as _;

use super::sources::{self, SourcePlan, Sources};
use super::{DaemonError, StageKey, Started, instance_capacity, stage_setup, topic_specs};
use crate::admin::AdminState;
use crate::broker::{Broker, BrokerError, TopicSpec, stage_inputs};
use crate::config::{self, Pipeline};
use crate::connect;
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::plugin::{HostConfig, PluginCheck, PluginHost, plugin_file_sha256};
use crate::reload::{Changes, ReloadError, ReloadReport, ReloadRequest, Restart, Trigger};

/// What runs now, and what a reload needs to change it.
pub(super) struct Live {
    /// The pipeline files and directories, as given.
    pub(super) paths: Vec<PathBuf>,
    /// `--broker`, which wins over the files' `broker:`.
    pub(super) broker_flag: Option<String>,
    /// The broker this daemon runs on (may hold a password: never shown).
    pub(super) broker_url: String,
    /// Loads plugins; replaced by a larger one when a reload needs more
    /// instances than it has room for.
    pub(super) host: PluginHost,
    /// The host settings from the flags.
    pub(super) host_config: HostConfig,
    pub(super) broker: Arc<dyn Broker>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) health: Arc<connect::Health>,
    /// The daemon's data directory, where connectors keep local state.
    pub(super) data_dir: PathBuf,
    pub(super) engine: Engine,
    pub(super) sources: Sources,
    /// The sha256 of each running plugin stage's component.
    pub(super) plugin_shas: HashMap<StageKey, String>,
    /// The running configuration.
    pub(super) pipelines: Arc<[Pipeline]>,
    pub(super) state: AdminState,
    /// The files `--watch` looks at: pipeline files and plugins.
    pub(super) watched: watch::Sender<Vec<PathBuf>>,
    /// The running configuration's version (`versions.rs`).
    pub(super) version: watch::Sender<String>,
}

/// What a validated set of files would change.
struct Plan {
    pipelines: Vec<Pipeline>,
    /// Its host (a new one when the old had too little room).
    host: PluginHost,
    shas: HashMap<StageKey, String>,
    stages_added: Vec<StageKey>,
    stages_removed: Vec<StageKey>,
    stages_restarted: Vec<(StageKey, Vec<String>)>,
    sources_added: Vec<SourcePlan>,
    sources_removed: Vec<String>,
    sources_restarted: Vec<(SourcePlan, Vec<String>)>,
    topics_added: Vec<TopicSpec>,
    topics_changed: Vec<TopicSpec>,
    topics_removed: Vec<String>,
}

/// `pipeline/name`.
fn display(key: &StageKey) -> String {
    format!("{}/{}", key.0, key.1)
}

impl Live {
    /// Runs one reload request and answers it; the report also goes to the
    /// log, the reload record (`status`, `GET /v1/reload`) and `/metrics`.
    pub(super) async fn serve(&mut self, request: ReloadRequest, started: &Started) {
        crate::service::reloading();
        let began = Instant::now();
        // With trace export on, a reload is a span of its own, so that a
        // change in a trace's timings can be laid beside the reload that
        // caused it. Reloads are rare: a `tracing` span through the bridge
        // layer serves (stage attempts make their spans directly; see
        // `crate::otel`).
        let span = tracing::info_span!(
            target: crate::otel::TARGET,
            "reload",
            otel.name = "sluice reload",
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
            "sluice.reload.trigger" = request.trigger.name(),
            "sluice.reload.forced" = request.force,
            "sluice.reload.ok" = tracing::field::Empty,
            "sluice.reload.changes" = tracing::field::Empty,
            "sluice.config.version" = tracing::field::Empty,
        );
        let (changes, warnings, errors) =
            match self.reload(request.force).instrument(span.clone()).await {
                Ok((changes, warnings)) => (changes, warnings, Vec::new()),
                Err(errors) => (Changes::default(), Vec::new(), errors),
            };
        let report = ReloadReport {
            ok: errors.is_empty(),
            trigger: request.trigger,
            forced: request.force,
            at: crate::timestamp::format_rfc3339_millis(crate::broker::now_millis()),
            took_ms: u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
            version: self.version.borrow().clone(),
            changes,
            errors,
            warnings,
        };
        self.state.reloads().record(&report);
        self.metrics.count_reload(report.ok);
        span.record("sluice.reload.ok", report.ok);
        span.record("sluice.config.version", report.version.as_str());
        span.record("sluice.reload.changes", report.changes.summary().as_str());
        if !report.ok {
            span.record("otel.status_code", "ERROR");
            span.record(
                "otel.status_description",
                format!("refused: {} problem(s)", report.errors.len()).as_str(),
            );
        }
        if report.ok {
            tracing::info!(
                trigger = %report.trigger,
                took_ms = report.took_ms,
                version = %report.version,
                "reloaded: {}",
                report.changes.summary()
            );
            for warning in &report.warnings {
                tracing::warn!(trigger = %report.trigger, "reload: {warning}");
            }
        } else {
            let errors: Vec<String> = report.errors.iter().map(ToString::to_string).collect();
            tracing::error!(
                trigger = %report.trigger,
                "reload refused; the previous configuration keeps running:\n{}",
                errors.join("\n")
            );
        }
        crate::service::ready(&format!(
            "running {}; admin on {}://{}; last reload {} at {}",
            self.pipelines
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            started.admin_scheme,
            started.admin,
            if report.ok { "applied" } else { "refused" },
            report.at
        ));
        // The caller may have gone (a client that timed out): the reload
        // happened all the same, and the record shows it.
        let _ = request.reply.send(report);
    }

    /// Validates, plans and applies; the changes and warnings, or every
    /// reason nothing changed.
    async fn reload(&mut self, force: bool) -> Result<(Changes, Vec<String>), Vec<ReloadError>> {
        let plan = self.plan().await?;
        self.refuse_removals(&plan, force).await?;
        self.apply(plan)
            .await
            .map_err(|err| vec![ReloadError::new(err.to_string())])
    }

    /// Step 1: the files read and checked, and what they would change.
    async fn plan(&self) -> Result<Plan, Vec<ReloadError>> {
        let (pipelines, host, shas) = self.check_files().await?;
        self.check_fixed(&pipelines)?;
        let mut plan = Plan {
            pipelines: Vec::new(),
            host,
            shas,
            stages_added: Vec::new(),
            stages_removed: Vec::new(),
            stages_restarted: Vec::new(),
            sources_added: Vec::new(),
            sources_removed: Vec::new(),
            sources_restarted: Vec::new(),
            topics_added: Vec::new(),
            topics_changed: Vec::new(),
            topics_removed: Vec::new(),
        };
        self.plan_stages(&pipelines, &mut plan);
        self.plan_sources(&pipelines, &mut plan);
        self.plan_topics(&pipelines, &mut plan);
        plan.pipelines = pipelines;
        Ok(plan)
    }

    /// Every file parsed and checked and every plugin loaded, off the async
    /// threads, as at start-up; with the host that loaded them and each
    /// plugin stage's file hash.
    async fn check_files(
        &self,
    ) -> Result<(Vec<Pipeline>, PluginHost, HashMap<StageKey, String>), Vec<ReloadError>> {
        let paths = self.paths.clone();
        let (host, host_config) = (self.host.clone(), self.host_config.clone());
        tokio::task::spawn_blocking(move || {
            let diagnostics = |d: config::Diagnostics| -> Vec<ReloadError> {
                d.0.iter().map(ReloadError::from).collect()
            };
            let pipelines = config::load(&paths).map_err(diagnostics)?;
            // A host with room for the new workers beside the old ones.
            let needed = instance_capacity(&pipelines, &host_config);
            let host = if needed > host.max_instances() {
                PluginHost::new(HostConfig {
                    max_instances: needed,
                    ..host_config
                })
                .map_err(|e| vec![ReloadError::new(e.to_string())])?
            } else {
                host
            };
            let pipelines =
                config::load_checked(&paths, &mut PluginCheck::new(&host)).map_err(diagnostics)?;
            // Each plugin stage's file, hashed, to see which changed (a
            // file replaced since its check fails its load at step 2).
            let mut shas = HashMap::new();
            let mut errors = Vec::new();
            for pipeline in &pipelines {
                for stage in pipeline.stages.iter().filter(|s| !s.is_sink()) {
                    match plugin_file_sha256(&stage.plugin) {
                        Ok(sha) => {
                            shas.insert((pipeline.name.clone(), stage.name.clone()), sha);
                        }
                        Err(err) => errors.push(ReloadError {
                            file: Some(stage.plugin.display().to_string()),
                            line: None,
                            col: None,
                            message: format!(
                                "stage `{}` of pipeline `{}`: cannot read its plugin: {err}",
                                stage.name, pipeline.name
                            ),
                        }),
                    }
                }
            }
            if errors.is_empty() {
                Ok((pipelines, host, shas))
            } else {
                Err(errors)
            }
        })
        .await
        .map_err(|e| vec![ReloadError::new(format!("the reload's check failed: {e}"))])?
    }

    /// Which stages `pipelines` add, remove, or change (and why).
    fn plan_stages(&self, pipelines: &[Pipeline], plan: &mut Plan) {
        let old_stages = stages_of(&self.pipelines);
        let new_stages = stages_of(pipelines);
        for (key, (pipeline, stage)) in &new_stages {
            let Some((old_pipeline, old)) = old_stages.get(key) else {
                plan.stages_added.push(key.clone());
                continue;
            };
            let mut why = Vec::new();
            if old.delivery.concurrency != stage.delivery.concurrency {
                why.push(format!(
                    "concurrency {} -> {}",
                    old.delivery.concurrency.get(),
                    stage.delivery.concurrency.get()
                ));
            }
            if old.plugin != stage.plugin {
                why.push("plugin file".to_owned());
            } else if self.plugin_shas.get(key) != plan.shas.get(key) {
                why.push("plugin".to_owned());
            }
            // The old stage with the new concurrency and plugin: any other
            // difference is a change of settings.
            let mut old_settings = (*old).clone();
            old_settings.delivery.concurrency = stage.delivery.concurrency;
            old_settings.plugin = stage.plugin.clone();
            let settings_changed = old_settings != **stage;
            if settings_changed {
                why.push("settings".to_owned());
            }
            if old_pipeline.shutdown_timeout != pipeline.shutdown_timeout {
                why.push("shutdown_timeout".to_owned());
            }
            if !why.is_empty() {
                plan.stages_restarted.push((key.clone(), why));
            }
        }
        plan.stages_removed = old_stages
            .keys()
            .filter(|key| !new_stages.contains_key(*key))
            .cloned()
            .collect();
    }

    /// Which sources `pipelines` add, remove, or change.
    fn plan_sources(&self, pipelines: &[Pipeline], plan: &mut Plan) {
        let old_sources: BTreeMap<String, &SourcePlan> =
            self.sources.plans().map(|p| (p.name(), p)).collect();
        let new_sources = sources::plans(pipelines);
        for plan_source in &new_sources {
            match old_sources.get(&plan_source.name()) {
                None => plan.sources_added.push(plan_source.clone()),
                Some(old) if *old != plan_source => plan
                    .sources_restarted
                    .push((plan_source.clone(), plan_source.changes_from(old))),
                Some(_) => {}
            }
        }
        plan.sources_removed = old_sources
            .keys()
            .filter(|name| !new_sources.iter().any(|p| p.name() == **name))
            .cloned()
            .collect();
    }

    /// Which topics (and dead-letter topics) `pipelines` add, remove, or
    /// change.
    fn plan_topics(&self, pipelines: &[Pipeline], plan: &mut Plan) {
        let old_topics: BTreeMap<String, TopicSpec> = topic_specs(&self.pipelines)
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect();
        let new_topics = topic_specs(pipelines);
        for spec in &new_topics {
            match old_topics.get(&spec.name) {
                None => plan.topics_added.push(spec.clone()),
                Some(old) if old != spec => plan.topics_changed.push(spec.clone()),
                Some(_) => {}
            }
        }
        plan.topics_removed = old_topics
            .keys()
            .filter(|name| !new_topics.iter().any(|t| t.name == **name))
            .cloned()
            .collect();
    }

    /// What a reload cannot change in a running daemon.
    fn check_fixed(&self, pipelines: &[Pipeline]) -> Result<(), Vec<ReloadError>> {
        let mut errors = Vec::new();
        match super::broker_url(self.broker_flag.as_deref(), pipelines) {
            Ok(url) if url != self.broker_url => errors.push(ReloadError::new(
                "the pipelines' `broker:` changed; a reload cannot move a running daemon to another broker: restart it",
            )),
            Ok(_) => {}
            Err(err) => errors.push(ReloadError::new(err.to_string())),
        }
        let old_checks = crate::claim::topic_checks(&self.pipelines);
        if old_checks != crate::claim::topic_checks(pipelines) {
            errors.push(ReloadError::new(
                "claim-check settings changed (a `claim_check:` block, or the topics and dead-letter topics one covers): restart the daemon to apply them",
            ));
        } else if !old_checks.is_empty()
            && dead_letter_topics(&self.pipelines) != dead_letter_topics(pipelines)
        {
            // The claim sweeper keeps every object a dead letter still
            // references; it reads the DLQ topics it was started with.
            errors.push(ReloadError::new(
                "this daemon runs a claim check, and the reload adds or removes a dead-letter topic its sweeper must read: restart the daemon to apply it",
            ));
        }
        if retention_archives(&self.pipelines) != retention_archives(pipelines) {
            // The retention archivers start with the daemon, and the broker
            // holds no age limit for their topics: applied halfway, a topic
            // would keep, or drop unarchived, what it should archive.
            errors.push(ReloadError::new(
                "a topic's `retention: {max_age, archive}` was added, changed or removed: the retention archivers start with the daemon, so restart it to apply this",
            ));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// A removed topic that still holds messages, unforced, refuses the
    /// reload: its messages would sit where nothing reads them.
    async fn refuse_removals(&self, plan: &Plan, force: bool) -> Result<(), Vec<ReloadError>> {
        let mut errors = Vec::new();
        for topic in &plan.topics_removed {
            let depth = match self.broker.topic_stats(topic).await {
                Ok(stats) => stats.depth,
                Err(BrokerError::UnknownTopic(_)) => 0,
                Err(err) => {
                    errors.push(ReloadError::new(format!(
                        "cannot tell whether topic `{topic}`, which the new files no longer declare, still holds messages: {err}"
                    )));
                    continue;
                }
            };
            if depth > 0 && !force {
                errors.push(ReloadError::new(format!(
                    "topic `{topic}` still holds {depth} message{} and the new files no longer declare it; drain it first, or force the reload (`sluice reload --force`) to stop serving it: its messages stay in the broker",
                    if depth == 1 { "" } else { "s" }
                )));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// Steps 2 to 4: build, then swap.
    async fn apply(&mut self, plan: Plan) -> Result<(Changes, Vec<String>), DaemonError> {
        let new_stages = stages_of(&plan.pipelines);
        for spec in plan.topics_added.iter().chain(&plan.topics_changed) {
            self.broker.ensure_topic(spec).await?;
        }
        // The new stages' setups and consumers, while the old ones run.
        let mut setups = Vec::new();
        let starting = plan
            .stages_added
            .iter()
            .chain(plan.stages_restarted.iter().map(|(key, _)| key));
        // The bytes actually loaded are what runs: their sha256 is kept.
        let mut loaded = HashMap::new();
        for key in starting {
            let (pipeline, stage) = new_stages[key];
            let (setup, sha) = stage_setup(
                pipeline,
                stage,
                &plan.host,
                &self.broker,
                &self.metrics,
                &self.health,
                &self.data_dir,
            )
            .await?;
            if let Some(sha) = sha {
                loaded.insert(key.clone(), sha);
            }
            setups.push(setup);
        }
        let prepared = self.engine.prepare(setups).await?;
        let mut source_setups = Vec::new();
        for source in plan
            .sources_added
            .iter()
            .chain(plan.sources_restarted.iter().map(|(p, _)| p))
        {
            source_setups.push((
                source.clone(),
                sources::setup(source, &self.metrics, &self.health).await?,
            ));
        }

        // The swap: sources stop first, so nothing new enters a stage that
        // is about to drain; stages start before sources.
        let longest = self
            .pipelines
            .iter()
            .chain(&plan.pipelines)
            .map(|p| p.shutdown_timeout.get())
            .max()
            .unwrap_or_default();
        let stopping_sources: Vec<String> = plan
            .sources_removed
            .iter()
            .cloned()
            .chain(plan.sources_restarted.iter().map(|(p, _)| p.name()))
            .collect();
        let mut warnings = Vec::new();
        if !self
            .sources
            .stop(
                Some(&stopping_sources),
                tokio::time::Instant::now() + longest,
            )
            .await
        {
            warnings.push(
                "a source did not stop in time; what it read and did not acknowledge is read again"
                    .to_owned(),
            );
        }
        let stopping: Vec<StageKey> = plan
            .stages_removed
            .iter()
            .cloned()
            .chain(plan.stages_restarted.iter().map(|(key, _)| key.clone()))
            .collect();
        self.engine.remove(&stopping).await;
        self.engine.launch(prepared);
        for (plan_source, setup) in source_setups {
            self.sources.start(plan_source, setup, self.broker.clone());
        }

        // Connectors that are gone no longer count for readiness.
        let old_stages = stages_of(&self.pipelines);
        for key in &plan.stages_removed {
            if old_stages.get(key).is_some_and(|(_, s)| s.is_sink()) {
                self.health.forget(&self.metrics, &display(key));
            }
            if let Some((pipeline, stage)) = old_stages.get(key) {
                for input in stage_inputs(&pipeline.name, stage) {
                    warnings.push(format!(
                        "stage {} removed: its consumer `{}` keeps its place in topic `{}`, which keeps the messages it has not read (until the topic's retention); add the stage back to go on from there",
                        display(key),
                        input.consumer,
                        input.topic
                    ));
                }
            }
        }
        for name in &plan.sources_removed {
            self.health.forget(&self.metrics, name);
        }

        let changes = Changes {
            stages_added: plan.stages_added.iter().map(display).collect(),
            stages_removed: plan.stages_removed.iter().map(display).collect(),
            stages_restarted: plan
                .stages_restarted
                .iter()
                .map(|(key, why)| Restart {
                    name: display(key),
                    why: why.clone(),
                })
                .collect(),
            sources_added: plan.sources_added.iter().map(SourcePlan::name).collect(),
            sources_removed: plan.sources_removed.clone(),
            sources_restarted: plan
                .sources_restarted
                .iter()
                .map(|(p, why)| Restart {
                    name: p.name(),
                    why: why.clone(),
                })
                .collect(),
            topics_added: plan.topics_added.iter().map(|t| t.name.clone()).collect(),
            topics_removed: plan.topics_removed.clone(),
            topics_changed: plan.topics_changed.iter().map(|t| t.name.clone()).collect(),
        };
        self.plugin_shas = plan.shas;
        self.plugin_shas.extend(loaded);
        self.host = plan.host;
        self.pipelines = plan.pipelines.into();
        self.state.replace_pipelines(self.pipelines.clone());
        self.publish_watched();
        self.version
            .send_replace(super::versions::version(&self.pipelines, &self.plugin_shas));
        Ok((changes, warnings))
    }

    /// Tells `--watch` which files make up the running configuration: the
    /// paths given (a directory's `*.yaml` files are found by the watcher)
    /// and every stage's plugin.
    pub(super) fn publish_watched(&self) {
        let mut files: Vec<PathBuf> = self.paths.clone();
        for pipeline in self.pipelines.iter() {
            files.push(pipeline.source.clone());
            for stage in pipeline.stages.iter().filter(|s| !s.is_sink()) {
                files.push(stage.plugin.clone());
            }
        }
        files.sort();
        files.dedup();
        self.watched.send_replace(files);
    }
}

/// Every stage of `pipelines` by its key, with its pipeline.
fn stages_of(pipelines: &[Pipeline]) -> BTreeMap<StageKey, (&Pipeline, &config::Stage)> {
    pipelines
        .iter()
        .flat_map(|p| {
            p.stages
                .iter()
                .map(move |s| ((p.name.clone(), s.name.clone()), (p, s)))
        })
        .collect()
}

/// Every stage's and source's dead-letter topic.
fn dead_letter_topics(pipelines: &[Pipeline]) -> HashSet<String> {
    pipelines
        .iter()
        .flat_map(|p| {
            p.stages
                .iter()
                .map(|s| s.dlq_topic(&p.name))
                .chain(p.sources.iter().map(|s| s.dlq_topic(&p.name)))
        })
        .collect()
}

/// Turns each SIGHUP into a reload request, until the daemon stops. The
/// report goes to the log ([`Live::serve`]).
pub(super) fn on_hangup(
    requests: mpsc::Sender<ReloadRequest>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    // Installed now, not when the task first runs: the daemon says
    // READY=1 right after, and a SIGHUP before the handler would kill it
    // (the signal's default action).
    let hangups = signal(SignalKind::hangup());
    async move {
        let Ok(hangups) = hangups else {
            tracing::warn!(
                "cannot install the SIGHUP handler; reload with `sluice reload` instead"
            );
            return;
        };
        reload_on_each(hangups, requests).await;
    }
}

/// Queues a reload for each SIGHUP.
async fn reload_on_each(
    mut hangups: tokio::signal::unix::Signal,
    requests: mpsc::Sender<ReloadRequest>,
) {
    while hangups.recv().await.is_some() {
        tracing::info!("SIGHUP received: reloading");
        let (reply, _report) = tokio::sync::oneshot::channel();
        let request = ReloadRequest {
            trigger: Trigger::Signal,
            force: false,
            reply,
        };
        if requests.try_send(request).is_err() {
            tracing::warn!("SIGHUP: reloads are queued up already; this one is skipped");
        }
    }
}

/// Every topic whose `retention` has an `archive`, with it, in name order.
fn retention_archives(pipelines: &[Pipeline]) -> Vec<(&str, &config::Retention)> {
    let mut out: Vec<(&str, &config::Retention)> = pipelines
        .iter()
        .flat_map(|p| &p.topics)
        .filter_map(|t| {
            t.retention
                .as_ref()
                .filter(|r| r.archive.is_some())
                .map(|r| (t.name.as_str(), r))
        })
        .collect();
    out.sort_by_key(|(name, _)| *name);
    out
}
