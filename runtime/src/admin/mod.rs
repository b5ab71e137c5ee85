//! The daemon's admin HTTP server: ingest, reads, status, metrics and the
//! dead-letter tools, on one address (`--admin`, [`DEFAULT_ADMIN`]).
//!
//! Everything here goes through the [`Broker`] trait, so the same API serves
//! the embedded broker and NATS, and the CLI (`sluice publish`, `tail`,
//! `dlq`, `status`) needs nothing but this API to reach a running daemon.
//!
//! - `ingest.rs`: `POST /v1/topics/{topic}/messages` and `/batch` (202, 429);
//! - `topics.rs`: `GET /v1/topics[/{topic}[/messages]]` (stats, long-poll reads);
//! - `dlq/`: `/v1/dlq/{pipeline}/{stage}` list, show, redrive, purge, and
//!   the filters they take (`dlq/filter.rs`);
//! - `stages.rs`: `GET /v1/stages/{pipeline}/{stage}` (config, history),
//!   `POST .../pause` and `/resume`;
//! - `reload.rs`: `POST /v1/reload` (hot reload) and `GET /v1/reload`;
//! - `status.rs`: `GET /v1/status` and the throughput sampler behind it;
//! - `scrape.rs`: `GET /metrics`, refreshing the broker-backed gauges first;
//! - `error.rs`: the JSON error body every failure uses;
//! - `access.rs`: the guard in front of it all: bearer tokens (full and
//!   read-only), `Host` and `Origin` checks, the audit log;
//! - `server.rs`: the accept loop: connection cap, header-read timeout,
//!   optional TLS, graceful shutdown;
//! - `health.rs`: `GET /health`, `/health/live`, `/health/ready`;
//! - `openapi.rs`: `GET /v1/openapi.json`, the document of all of the above;
//! - `console.rs`: the web console at `/ui` (embedded page, sign-in) and
//!   `session.rs`, its cookie sessions with CSRF tokens; `throttle.rs`, the
//!   addresses refused for guessing tokens;
//! - `history.rs`: each stage's last 15 minutes, for the console's graphs.
//!
//! Without a token the API is open to whoever reaches it: the daemon
//! refuses a non-loopback `--admin` without one unless `--admin-insecure`.
//!
//! Each endpoint is a thin HTTP wrapper around a method of [`AdminState`]
//! (`publish_lines`, `topic_view`, `read_topic`, `dlq_list`, `dlq_show`,
//! `dlq_redrive`, `dlq_purge`). The CLI calls those same methods in-process
//! when it talks to NATS directly (`--broker nats://...`, no daemon), over a
//! state made by [`AdminState::without_pipelines`], so ingest checks and
//! redrive semantics live here only.

mod access;
mod console;
mod dlq;
mod error;
mod health;
mod history;
mod ingest;
mod openapi;
mod reload;
mod role;
mod scrape;
mod server;
mod session;
mod stages;
mod state;
mod status;
mod throttle;
mod topics;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use utoipa::OpenApi as _;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt as _};
use utoipa_axum::routes;

use crate::broker::{Broker, BrokerError, StageInput, consumer_name, stage_inputs};
use crate::config::{Pipeline, default_dlq};
use crate::metrics::Metrics;

pub use access::{AccessConfig, Token};
pub use dlq::{
    DlqEntry, DlqEntryDetail, DlqFilter, DlqList, Matcher, PurgeReport, PurgeRequest,
    REDRIVE_TIME_LIMIT, RedriveReport, RedriveRequest, SAMPLE, SkippedEntry,
    archive_line as dlq_archive_line,
};
pub use error::{ApiError, ErrorBody};
pub use history::{HistoryPoint, StageHistory};
#[cfg(feature = "fuzz")]
pub(crate) use ingest::batch_messages;
pub use ingest::{
    BatchHeaders, BatchLine, BatchReceipt, HEADER_PREFIX, ID_HEADER, KEY_HEADER, MAX_ID_BYTES,
    PublishReceipt, check_id,
};
pub use openapi::document as openapi_document;
pub use server::{
    DEFAULT_BODY_BUDGET, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, ServerLimits, TlsError,
    tls_config,
};
pub use stages::{StageControl, StageDetail};
pub use state::{StateDeleted, StateKey, StateListing, StateValue};
pub use status::{LaneStatus, SourceStatus, StageStatus};
pub use topics::{MessageView, ReadResponse, TopicView, payload_fields};

/// Where the admin API listens unless `--admin`/`SLUICE_ADMIN` says
/// otherwise: loopback only, so that without a token nothing off the
/// machine reaches it.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:7400";

/// The largest request body accepted by default (64 MiB): big enough for a
/// large payload or batch, small enough that one request cannot exhaust the
/// daemon's memory. Larger bodies get a JSON 413.
pub const DEFAULT_BODY_LIMIT: usize = 64 << 20;

/// What the admin handlers share: the broker, the metrics, and an index of
/// the loaded pipelines' topics and stages. Cheap to clone.
#[derive(Clone)]
pub struct AdminState {
    inner: Arc<Inner>,
    body_limit: usize,
    /// Who may call (tokens, extra Host names).
    access: Arc<AccessConfig>,
    /// TLS, when the API serves HTTPS.
    tls: Option<Arc<rustls::ServerConfig>>,
    /// Connection cap, header timeout, body budget.
    limits: ServerLimits,
    /// Request-body bytes in flight, across all requests: one permit a byte.
    budget: Arc<tokio::sync::Semaphore>,
    /// The longest one redrive runs ([`REDRIVE_TIME_LIMIT`]).
    redrive_time_limit: std::time::Duration,
    /// Sources and sinks that cannot reach their outside system.
    connectors: Arc<crate::connect::Health>,
    /// The web console's sign-in sessions.
    sessions: Arc<session::Sessions>,
    /// Failed authentications by address (token guessing).
    throttle: Arc<throttle::Throttle>,
}

struct Inner {
    broker: Arc<dyn Broker>,
    metrics: Arc<Metrics>,
    /// What the loaded pipelines declare; a reload swaps it whole, so a
    /// request sees one set of pipelines from start to end.
    catalog: arc_swap::ArcSwap<Catalog>,
    /// Reloads so far, for `status` and `/metrics`, and the way to ask for
    /// one (`POST /v1/reload`) when the daemon runs one.
    reloads: crate::reload::ReloadLog,
    /// Flipped to true when the server starts shutting down, so long-polls
    /// and paced redrives end instead of holding the shutdown up.
    shutdown: tokio::sync::watch::Sender<bool>,
    /// One lock per stage's DLQ: serialises that stage's redrives and
    /// purges, so two at once never handle the same entry twice, while a
    /// slow redrive of one stage never holds up another's.
    dlq_locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Set once SIGTERM arrives: ingest answers 503 and readiness says
    /// draining while the stages drain.
    draining: std::sync::atomic::AtomicBool,
    /// No pipelines are loaded ([`AdminState::without_pipelines`]): every
    /// topic the broker has is accepted, and a stage's DLQ topic is the
    /// default one.
    open: bool,
}

/// The loaded pipelines as the API sees them.
struct Catalog {
    pipelines: Arc<[Pipeline]>,
    /// Every topic ingest and reads accept: declared ones and DLQ topics.
    topics: HashMap<String, TopicEntry>,
    /// Every stage, in pipeline order.
    stages: Vec<StageEntry>,
    /// Throughput samples, one ring per entry of `stages`.
    rates: status::Rates,
    /// The last 15 minutes, one ring per entry of `stages`.
    history: history::History,
}

impl Catalog {
    /// The index of `pipelines`: their topics (with fan-out, marks and
    /// claim checks) and stages.
    fn new(pipelines: Arc<[Pipeline]>) -> Catalog {
        let mut topics: HashMap<String, TopicEntry> = HashMap::new();
        let mut stages = Vec::new();
        for pipeline in pipelines.iter() {
            for topic in &pipeline.topics {
                let entry = topics.entry(topic.name.clone()).or_default();
                entry.high_water_mark = match (entry.high_water_mark, topic.high_water_mark) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            for stage in &pipeline.stages {
                let inputs = stage_inputs(&pipeline.name, stage);
                let dlq_topic = stage.dlq_topic(&pipeline.name);
                for input in &inputs {
                    topics
                        .entry(input.topic.clone())
                        .or_default()
                        .subscribers
                        .push(input.consumer.clone());
                }
                topics.entry(dlq_topic.clone()).or_default().is_dlq = true;
                let connector = stage.sink.as_ref().and_then(|s| s.connector());
                stages.push(StageEntry {
                    pipeline: pipeline.name.clone(),
                    stage: stage.name.clone(),
                    inputs,
                    rate: stage.delivery.rate.as_ref().map(|rate| match &rate.per {
                        Some(per) => format!("{} per {per}", rate.limit),
                        None => rate.limit.to_string(),
                    }),
                    adaptive_max: stage
                        .delivery
                        .concurrency
                        .adaptive
                        .then_some(stage.delivery.concurrency.max.get()),
                    dlq_topic,
                    kind: connector
                        .map_or_else(|| "plugin".to_owned(), |c| format!("sink:{}", c.kind())),
                    target: connector.map(|c| c.describe()),
                    archive: stage.delivery.dlq_archive().cloned().map(Arc::new),
                });
            }
        }
        for pipeline in pipelines.iter() {
            for source in &pipeline.sources {
                topics
                    .entry(source.dlq_topic(&pipeline.name))
                    .or_default()
                    .is_dlq = true;
            }
        }
        for (topic, check) in crate::claim::topic_checks(&pipelines) {
            if let Some(entry) = topics.get_mut(&topic) {
                entry.max_payload = Some(check.max_payload.bytes());
            }
        }
        let rates = status::Rates::new(stages.len());
        let history = history::History::new(stages.len());
        Catalog {
            pipelines,
            topics,
            stages,
            rates,
            history,
        }
    }

    /// The index of no pipelines.
    fn empty() -> Catalog {
        Catalog::new(Vec::new().into())
    }
}

/// A topic ingest accepts.
#[derive(Debug, Clone, Default)]
struct TopicEntry {
    /// The lowest `high_water_mark` any pipeline declares for it.
    high_water_mark: Option<u64>,
    /// Consumers (`<pipeline>.<stage>`) that subscribe to it: its fan-out.
    subscribers: Vec<String>,
    /// Whether it is some stage's dead-letter topic.
    is_dlq: bool,
    /// Its claim check's `max_payload`, when it has one: the largest body
    /// ingest takes for it (else the admin body limit).
    max_payload: Option<u64>,
}

/// A stage, with the names the broker knows it by.
#[derive(Debug, Clone)]
struct StageEntry {
    pipeline: String,
    stage: String,
    /// The topics it reads, each with its consumer: one, or one per
    /// priority lane.
    inputs: Vec<StageInput>,
    /// Its `rate` limit as written (`50/s`, `5/s per key`).
    rate: Option<String>,
    /// Its most calls at once, when its concurrency is adaptive.
    adaptive_max: Option<u32>,
    dlq_topic: String,
    /// `plugin`, or `sink:<connector>` for a sink.
    kind: String,
    /// A sink's target, for people (no password).
    target: Option<String>,
    /// Where `dlq purge` writes what it deletes first (`dlq: {archive}`).
    archive: Option<Arc<crate::config::Archive>>,
}

impl AdminState {
    /// State for serving `pipelines` on `broker`, counting into `metrics`
    /// (the same [`Metrics`] the engine counts into, so `/metrics` shows
    /// both).
    pub fn new(
        broker: Arc<dyn Broker>,
        metrics: Arc<Metrics>,
        pipelines: impl Into<Arc<[Pipeline]>>,
    ) -> Self {
        let catalog = Catalog::new(pipelines.into());
        zero_series(&metrics, &catalog.topics, &catalog.stages);
        Self::build(broker, metrics, catalog, false)
    }

    /// State with no pipeline files, for the CLI talking to a broker
    /// directly (no daemon): ingest and reads accept any topic the broker
    /// has (one it does not have is [`ApiError::NoSuchTopic`]), with no
    /// `high_water_mark` and `sluice-` headers allowed only on topics named
    /// `*.dlq`; stage `p/s` has the default DLQ topic `p.s.dlq`
    /// ([`ApiError::NoDlqTopic`] when the broker does not have it). Status
    /// and `/metrics` have no stages to show.
    pub fn without_pipelines(broker: Arc<dyn Broker>, metrics: Arc<Metrics>) -> Self {
        Self::build(broker, metrics, Catalog::empty(), true)
    }

    fn build(broker: Arc<dyn Broker>, metrics: Arc<Metrics>, catalog: Catalog, open: bool) -> Self {
        AdminState {
            inner: Arc::new(Inner {
                broker,
                metrics,
                catalog: arc_swap::ArcSwap::from_pointee(catalog),
                reloads: crate::reload::ReloadLog::default(),
                shutdown: tokio::sync::watch::channel(false).0,
                dlq_locks: std::sync::Mutex::default(),
                draining: std::sync::atomic::AtomicBool::new(false),
                open,
            }),
            body_limit: DEFAULT_BODY_LIMIT,
            access: Arc::default(),
            tls: None,
            limits: ServerLimits::default(),
            budget: Arc::new(tokio::sync::Semaphore::new(budget_permits(
                DEFAULT_BODY_BUDGET,
            ))),
            redrive_time_limit: REDRIVE_TIME_LIMIT,
            connectors: Arc::default(),
            sessions: Arc::default(),
            throttle: Arc::default(),
        }
        .with_limits(ServerLimits::default())
    }

    /// Sets the longest one redrive runs (default [`REDRIVE_TIME_LIMIT`]).
    pub fn with_redrive_time_limit(mut self, limit: std::time::Duration) -> Self {
        self.redrive_time_limit = limit;
        self
    }

    /// Reports the health of these sources and sinks in readiness.
    pub fn with_connectors(mut self, health: Arc<crate::connect::Health>) -> Self {
        self.connectors = health;
        self
    }

    /// The sources and sinks that cannot reach their outside system.
    pub fn connectors(&self) -> &crate::connect::Health {
        &self.connectors
    }

    /// Sets who may call the API (default: everyone who reaches it).
    pub fn with_access(mut self, access: AccessConfig) -> Self {
        self.access = Arc::new(access);
        self
    }

    /// Serves HTTPS with `tls` (see [`tls_config`]).
    pub fn with_tls(mut self, tls: Arc<rustls::ServerConfig>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets the server's limits (default [`ServerLimits::default`]). The
    /// body budget is raised to the largest request a claim-checked topic
    /// takes (its `max_payload` says the operator wants such payloads); any
    /// other body larger than the whole budget is refused with 413.
    pub fn with_limits(mut self, limits: ServerLimits) -> Self {
        self.limits = ServerLimits {
            body_budget: limits.body_budget.max(self.largest_claim_request()),
            ..limits
        };
        self.budget = Arc::new(tokio::sync::Semaphore::new(budget_permits(
            self.limits.body_budget,
        )));
        self
    }

    /// Marks the daemon as shutting down: from now on ingest answers 503
    /// with `Retry-After` and readiness says `draining`, while the server
    /// keeps answering.
    pub fn start_draining(&self) {
        self.inner
            .draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether [`start_draining`](Self::start_draining) was called.
    pub fn is_draining(&self) -> bool {
        self.inner
            .draining
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The lock of one stage's DLQ (made on first use).
    fn dlq_lock(&self, stage: &StageEntry) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .inner
            .dlq_locks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        locks
            .entry(format!("{}/{}", stage.pipeline, stage.stage))
            .or_default()
            .clone()
    }

    /// Sets the largest request body accepted (default
    /// [`DEFAULT_BODY_LIMIT`]).
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// The largest request body read at all: the body limit, or more when
    /// a claim-checked topic takes payloads up to a larger `max_payload`
    /// (a batch line carries one in base64, 4/3 of it, plus JSON).
    fn request_limit(&self) -> usize {
        self.body_limit.max(self.largest_claim_request())
    }

    /// The largest request a claim-checked topic takes (0 without one).
    fn largest_claim_request(&self) -> usize {
        self.catalog()
            .topics
            .values()
            .filter_map(|t| t.max_payload)
            .max()
            .map_or(0, |max| {
                usize::try_from(max / 3 * 4 + (64 << 10)).unwrap_or(usize::MAX)
            })
    }

    /// The broker the API reads and publishes through.
    pub fn broker(&self) -> &Arc<dyn Broker> {
        &self.inner.broker
    }

    /// The metrics `/metrics` exports.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The loaded pipelines.
    pub fn pipelines(&self) -> Arc<[Pipeline]> {
        self.catalog().pipelines.clone()
    }

    /// The index of the loaded pipelines, as of now.
    fn catalog(&self) -> Arc<Catalog> {
        self.inner.catalog.load_full()
    }

    /// Serves `pipelines` from now on (a reload applied them). Requests
    /// already running finish on the pipelines they started with; the
    /// throughput of stages that stay carries over.
    pub fn replace_pipelines(&self, pipelines: Arc<[Pipeline]>) {
        let old = self.catalog();
        let new = Catalog::new(pipelines);
        zero_series(&self.inner.metrics, &new.topics, &new.stages);
        carry_over(&old.rates.rings, &new.rates.rings, &old.stages, &new.stages);
        carry_over(
            &old.history.rings,
            &new.history.rings,
            &old.stages,
            &new.stages,
        );
        forget_removed(&self.inner.metrics, &old.stages, &new.stages);
        self.inner.catalog.store(Arc::new(new));
    }

    /// Reloads so far, and the way to ask for one.
    pub fn reloads(&self) -> &crate::reload::ReloadLog {
        &self.inner.reloads
    }

    /// The topic `name`, if ingest and reads accept it: a loaded pipeline
    /// declares it, or (without pipelines) the broker has it.
    async fn topic(&self, name: &str) -> Result<TopicEntry, ApiError> {
        if !self.inner.open {
            return self
                .catalog()
                .topics
                .get(name)
                .cloned()
                .ok_or_else(|| ApiError::UnknownTopic(name.to_owned()));
        }
        match self.broker().topic_stats(name).await {
            Ok(_) => Ok(TopicEntry {
                is_dlq: name.ends_with(".dlq"),
                ..TopicEntry::default()
            }),
            Err(BrokerError::UnknownTopic(_)) => Err(ApiError::NoSuchTopic(name.to_owned())),
            Err(err) => Err(err.into()),
        }
    }

    /// The source `pipeline/source` as the DLQ endpoints see it: its
    /// dead-letter topic is listed, shown, redriven and purged like a
    /// stage's.
    fn source_entry(&self, pipeline: &str, source: &str) -> Option<StageEntry> {
        let catalog = self.catalog();
        let p = catalog.pipelines.iter().find(|p| p.name == pipeline)?;
        let s = p.sources.iter().find(|s| s.name == source)?;
        Some(StageEntry {
            pipeline: pipeline.to_owned(),
            stage: source.to_owned(),
            inputs: vec![StageInput {
                topic: s.to.clone(),
                consumer: consumer_name(pipeline, source),
            }],
            rate: None,
            adaptive_max: None,
            dlq_topic: s.dlq_topic(pipeline),
            kind: "source".into(),
            target: None,
            archive: None,
        })
    }

    /// The stage `pipeline/stage`: a loaded one, or (without pipelines) one
    /// whose default DLQ topic the broker has.
    async fn stage(&self, pipeline: &str, stage: &str) -> Result<StageEntry, ApiError> {
        if !self.inner.open {
            return self
                .catalog()
                .stages
                .iter()
                .find(|s| s.pipeline == pipeline && s.stage == stage)
                .cloned()
                .or_else(|| self.source_entry(pipeline, stage))
                .ok_or_else(|| ApiError::UnknownStage(format!("{pipeline}/{stage}")));
        }
        let dlq_topic = default_dlq(pipeline, stage);
        match self.broker().topic_stats(&dlq_topic).await {
            Ok(_) => Ok(StageEntry {
                pipeline: pipeline.to_owned(),
                stage: stage.to_owned(),
                inputs: vec![StageInput {
                    // Unknown without its pipeline; nothing here needs it.
                    topic: String::new(),
                    consumer: consumer_name(pipeline, stage),
                }],
                rate: None,
                adaptive_max: None,
                dlq_topic,
                kind: "plugin".into(),
                target: None,
                // Without its pipeline, no archive is known: `dlq purge
                // --broker nats://` takes `--pipelines` to archive.
                archive: None,
            }),
            Err(BrokerError::UnknownTopic(_)) => Err(ApiError::NoDlqTopic {
                stage: format!("{pipeline}/{stage}"),
                topic: dlq_topic,
            }),
            Err(err) => Err(err.into()),
        }
    }

    /// Resolves once the server has started shutting down.
    async fn shutting_down(&self) {
        let mut rx = self.inner.shutdown.subscribe();
        if rx.wait_for(|down| *down).await.is_err() {
            // The sender lives as long as `self`; never reached.
            std::future::pending::<()>().await;
        }
    }
}

/// Creates every loaded topic's and stage's series at zero, so `/metrics`
/// shows each metric of `crate::metrics` from the first scrape and `rate()`/`increase()`
/// see the first increment rather than a series appearing out of nowhere.
fn zero_series(metrics: &Metrics, topics: &HashMap<String, TopicEntry>, stages: &[StageEntry]) {
    for topic in topics.keys() {
        metrics.count_published(topic, 0);
    }
    for stage in stages {
        for outcome in ["ok", "dead-lettered"] {
            let _ = metrics
                .processed
                .get_or_create(&crate::metrics::OutcomeLabels {
                    pipeline: stage.pipeline.clone(),
                    stage: stage.stage.clone(),
                    outcome: outcome.to_owned(),
                });
        }
        let _ = metrics
            .handler_duration
            .get_or_create(&crate::metrics::StageLabels {
                pipeline: stage.pipeline.clone(),
                stage: stage.stage.clone(),
            });
    }
    for direction in ["put", "get"] {
        let _ = metrics
            .claim_bytes
            .get_or_create(&crate::metrics::DirectionLabels {
                direction: direction.to_owned(),
            });
    }
}

/// Removes the per-stage series of stages a reload removed, so `/metrics`
/// shows no stage that no longer runs (their counters start again at zero
/// if the stage comes back).
fn forget_removed(metrics: &Metrics, old: &[StageEntry], new: &[StageEntry]) {
    for gone in old.iter().filter(|o| {
        !new.iter()
            .any(|n| n.pipeline == o.pipeline && n.stage == o.stage)
    }) {
        metrics.forget_stage(&gone.pipeline, &gone.stage);
    }
}

/// Moves the per-stage state of the stages that stay from `old` (indexed
/// as `old_stages`) into `new` (indexed as `new_stages`), after a reload.
fn carry_over<T: Default>(
    old: &[std::sync::Mutex<T>],
    new: &[std::sync::Mutex<T>],
    old_stages: &[StageEntry],
    new_stages: &[StageEntry],
) {
    for (to, stage) in new_stages.iter().enumerate() {
        let Some(from) = old_stages
            .iter()
            .position(|o| o.pipeline == stage.pipeline && o.stage == stage.stage)
        else {
            continue;
        };
        if let (Some(from), Some(to)) = (old.get(from), new.get(to)) {
            let taken = std::mem::take(&mut *from.lock().unwrap_or_else(|e| e.into_inner()));
            *to.lock().unwrap_or_else(|e| e.into_inner()) = taken;
        }
    }
}

/// The largest body a DLQ redrive or purge request takes.
const DLQ_BODY_LIMIT: usize = 64 * 1024;

/// The admin API's routes over `state`, without the access guard (tokens,
/// Host and Origin checks), which [`serve`] puts in front of them: not
/// public, so no embedder can serve them unguarded by mistake.
pub(crate) fn router(state: AdminState) -> Router {
    let limit = state.request_limit();
    let (routes, _) = routes().split_for_parts();
    routes
        .merge(console::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Every route with its OpenAPI description (`openapi.rs`): one list, so
/// the document and the server cannot disagree about what exists.
fn routes() -> OpenApiRouter<AdminState> {
    // Their bodies are a few fields of JSON: a small limit of their own,
    // since they are buffered outside the ingest byte budget.
    let small_body = || DefaultBodyLimit::max(DLQ_BODY_LIMIT);
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(health::live))
        .routes(routes!(health::live_alias))
        .routes(routes!(health::ready))
        .routes(routes!(scrape::metrics))
        .routes(routes!(openapi::openapi_json))
        .routes(routes!(status::status))
        .routes(routes!(status::sources))
        .routes(routes!(topics::list))
        .routes(routes!(topics::stats))
        .routes(routes!(ingest::publish_one, topics::read))
        .routes(routes!(ingest::publish_batch))
        .routes(routes!(dlq::list))
        .routes(routes!(dlq::redrive).layer(small_body()))
        .routes(routes!(dlq::purge).layer(small_body()))
        .routes(routes!(dlq::show))
        .routes(routes!(stages::detail))
        .routes(routes!(stages::pause))
        .routes(routes!(stages::resume))
        .routes(routes!(state::list))
        .routes(routes!(state::get, state::delete))
        .routes(routes!(reload::reload, reload::summary).layer(small_body()))
        .routes(
            routes!(console::current, console::sign_in, console::sign_out)
                .layer(DefaultBodyLimit::max(console::SIGN_IN_LIMIT)),
        )
}

/// Serves the admin API on `listener` until `shutdown` resolves, then stops
/// accepting, ends long-polls and waits for in-flight requests to finish.
/// Also runs the sampler behind `status`'s throughput for as long as it
/// serves.
///
/// # Errors
///
/// An I/O error of the listener.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let bound = listener.local_addr()?;
    tracing::info!(
        "admin API listening on {}://{bound}{}",
        server::scheme(state.tls.is_some()),
        if state.access.has_token() {
            " (token required)"
        } else {
            ""
        }
    );
    let sampler = tokio::spawn(status::sample(state.clone()));
    let history = tokio::spawn(history::sample(state.clone()));
    let signal = state.clone();
    let tls = state.tls.clone();
    let limits = state.limits;
    let guard = access::Guard::new(
        state.access.clone(),
        bound,
        state.sessions.clone(),
        state.throttle.clone(),
    );
    let app = router(state).layer(axum::middleware::from_fn_with_state(guard, access::guard));
    server::run(listener, app, tls, limits, async move {
        shutdown.await;
        signal.inner.shutdown.send_replace(true);
    })
    .await;
    sampler.abort();
    history.abort();
    Ok(())
}

/// A byte budget as semaphore permits (which top out below `usize::MAX`).
fn budget_permits(bytes: usize) -> usize {
    bytes.clamp(1, tokio::sync::Semaphore::MAX_PERMITS)
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound(format!("no endpoint at {}", uri.path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
