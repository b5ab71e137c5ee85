//! `sluice run`: pipelines in, a running daemon out.
//!
//! Start-up is all-or-nothing: every file is checked (and every plugin
//! loaded) before anything binds a port or opens the data directory, so a
//! bad file never leaves a partial daemon behind. Then the admin address is
//! bound, the broker opened, topics and consumers declared, and the stages
//! started. SIGTERM or SIGINT drains the stages (see `engine`) and flushes
//! the broker before exit. In between, a reload (`reload.rs`: SIGHUP,
//! `POST /v1/reload`, or a file change seen by `watch.rs`) applies changed
//! files with the same all-or-nothing check first; `sources.rs` keeps the
//! running sources, each stoppable alone; `stages.rs` sets up each stage,
//! and `shutdown.rs` drains them all in order.

mod reload;
mod shutdown;
mod sources;
mod stages;
mod versions;
mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::admin::{self, AdminState};
use crate::broker::embedded::{EmbeddedBroker, EmbeddedOptions, SyncMode};
use crate::broker::nats::{NatsBroker, NatsOptions};
use crate::broker::{Broker, BrokerError, TopicSpec};
use crate::claim::{ClaimingBroker, Claims};
use crate::config::{self, Diagnostics, Pipeline};
use crate::connect;
use crate::dedup::DedupStore;
use crate::metrics::Metrics;
use crate::plugin::{HostConfig, HostError, LoadError, PluginCheck, PluginHost};
use shutdown::shut_down;
use sources::Sources;
use stages::{stage_setup, start_stages};

/// How to run.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// Pipeline files or directories.
    pub paths: Vec<PathBuf>,
    /// The broker for every pipeline (`--broker`/`SLUICE_BROKER`): `embedded`
    /// or a `nats://` URL. `None` takes the pipelines' own `broker:`.
    pub broker: Option<String>,
    /// Where the embedded broker keeps its data.
    pub data_dir: PathBuf,
    /// The admin HTTP address.
    pub admin: SocketAddr,
    /// The embedded broker's durability setting.
    pub sync: SyncMode,
    /// The plugin host's settings (cache directory, limits).
    pub host: HostConfig,
    /// Who may call the admin API (tokens, extra Host names).
    pub admin_access: admin::AccessConfig,
    /// Serve the admin API without a token on a non-loopback address
    /// (`--admin-insecure`).
    pub admin_insecure: bool,
    /// The admin API's TLS certificate chain and key (PEM files).
    pub admin_tls: Option<(PathBuf, PathBuf)>,
    /// The admin server's connection cap, header timeout and body budget.
    pub admin_limits: admin::ServerLimits,
    /// Reload when a pipeline file or a plugin changes (`--watch`).
    pub watch: bool,
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
    /// A plugin file is not the one its stage's `sha256:` pins.
    #[error("{0}")]
    PluginPin(String),
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
    /// A claim store could not be opened.
    #[error(transparent)]
    Claim(#[from] crate::claim::ClaimError),
    /// The admin API would be open to the network: a non-loopback address
    /// with no token, and no `--admin-insecure`.
    #[error(
        "refusing to serve the admin API on {0} without a token: anyone who can reach that address could publish, purge and redrive. Set SLUICE_ADMIN_TOKEN (or --admin-token-file FILE), bind a loopback address, or pass --admin-insecure to accept the risk"
    )]
    InsecureAdmin(SocketAddr),
    /// The admin TLS certificate or key cannot be used.
    #[error(transparent)]
    AdminTls(#[from] admin::TlsError),
    /// A source or sink could not be built from its configuration.
    #[error(transparent)]
    Connector(#[from] connect::BuildError),
}

/// What a successful start looks like, for the ready line and tests.
#[derive(Debug, Clone)]
pub struct Started {
    /// The admin address actually bound.
    pub admin: SocketAddr,
    /// `https` when the admin API serves TLS, else `http`.
    pub admin_scheme: &'static str,
    /// The broker, for people: `embedded (DIR, sync: MODE)` or the NATS servers.
    pub broker: String,
    /// Pipelines and stage counts.
    pub pipelines: Vec<(String, usize)>,
}

/// Loads and checks every pipeline and its plugins; nothing else.
pub fn load(opts: &DaemonOptions) -> Result<(Vec<Pipeline>, PluginHost), DaemonError> {
    let pipelines = config::load(&opts.paths).map_err(DaemonError::Config)?;
    parse_broker(&broker_url(opts.broker.as_deref(), &pipelines)?)?;
    let host = PluginHost::new(HostConfig {
        max_instances: instance_capacity(&pipelines, &opts.host),
        ..opts.host.clone()
    })?;
    let pipelines = config::load_checked(&opts.paths, &mut PluginCheck::new(&host))
        .map_err(DaemonError::Config)?;
    Ok((pipelines, host))
}

/// How many plugin instances the host keeps room for: every worker slot
/// twice over (a reload starts a stage's new workers while its old ones
/// finish their calls), plus a few for `plugin test`-like one-offs, and at
/// least the configured number.
fn instance_capacity(pipelines: &[Pipeline], host: &HostConfig) -> u32 {
    let workers: u32 = pipelines
        .iter()
        .flat_map(|p| &p.stages)
        .filter(|s| !s.is_sink())
        .map(|s| s.delivery.concurrency.get())
        .sum();
    workers
        .saturating_mul(2)
        .saturating_add(8)
        .max(host.max_instances)
}

/// Runs the daemon until `shutdown` resolves, then drains and returns.
/// `ready` is called once everything is up. Meanwhile it reloads its files
/// when asked (SIGHUP, `POST /v1/reload`, and file changes with
/// [`DaemonOptions::watch`]): see [`reload`].
pub async fn run(
    opts: DaemonOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(&Started),
) -> Result<(), DaemonError> {
    raise_open_files_limit();
    let (pipelines, host) = load(&opts)?;
    let broker_url = broker_url(opts.broker.as_deref(), &pipelines)?;
    let choice = parse_broker(&broker_url)?;
    let tls = admin_tls(&opts)?;
    let (listener, admin_addr) = bind_admin(opts.admin).await?;
    let opened = open_broker(choice, &opts).await?;
    for spec in topic_specs(&pipelines) {
        opened.broker.ensure_topic(&spec).await?;
    }
    let metrics = Arc::new(Metrics::new());
    // With a claim check anywhere, every publish (ingest, emits, dead
    // letters, redrives) goes through the decorator that offloads.
    let claims = Claims::from_pipelines(&pipelines)?.map(|c| Arc::new(c.with_metrics(&metrics)));
    let broker: Arc<dyn Broker> = match &claims {
        Some(claims) => Arc::new(ClaimingBroker::new(opened.broker, claims.clone())),
        None => opened.broker,
    };
    let health = Arc::new(connect::Health::new());
    let parts = Parts {
        host: &host,
        broker: &broker,
        metrics: &metrics,
        health: &health,
        data_dir: &opts.data_dir,
    };
    let (engine, plugin_shas) =
        start_stages(&pipelines, &parts, claims.clone(), opened.dedup).await?;
    // Sources start once the stages read: their topics' consumers exist,
    // so backpressure counts them from the first read.
    let sources = start_sources(&pipelines, &parts).await?;
    let sweeper = start_sweeper(claims, &pipelines, &broker, &parts);

    let pipelines: Arc<[Pipeline]> = pipelines.into();
    let (reload_requests, reloads) = tokio::sync::mpsc::channel(crate::reload::QUEUE);
    let state = AdminState::new(broker.clone(), metrics.clone(), pipelines.clone())
        .with_connectors(health.clone())
        .with_access(opts.admin_access.clone())
        .with_limits(opts.admin_limits);
    let admin = start_admin(listener, state, tls, &reload_requests);
    let mut live = reload::Live {
        paths: opts.paths.clone(),
        broker_flag: opts.broker.clone(),
        broker_url,
        host,
        host_config: opts.host.clone(),
        broker: broker.clone(),
        metrics,
        health,
        data_dir: opts.data_dir.clone(),
        engine,
        sources,
        plugin_shas,
        pipelines,
        state: admin.state.clone(),
        watched: tokio::sync::watch::channel(Vec::new()).0,
        version: tokio::sync::watch::channel(String::new()).0,
    };
    let helpers = start_helpers(&mut live, opts.watch, reload_requests);

    let started = Started {
        admin: admin_addr,
        admin_scheme: admin.scheme,
        broker: opened.label,
        pipelines: live
            .pipelines
            .iter()
            .map(|p| (p.name.clone(), p.stages.len()))
            .collect(),
    };
    ready(&started);
    serve_until(shutdown, reloads, &mut live, &started).await;
    for task in helpers {
        task.abort();
    }
    shut_down(live, sweeper, admin, &broker).await
}

/// What a stage's or a source's setup draws on.
struct Parts<'a> {
    host: &'a PluginHost,
    broker: &'a Arc<dyn Broker>,
    metrics: &'a Arc<Metrics>,
    health: &'a Arc<connect::Health>,
    /// Where connectors keep local state (`Context::data_dir`).
    data_dir: &'a std::path::Path,
}

/// The admin API's TLS configuration, if it has one; refused when the API
/// would be open to the network without a token, and warned about when
/// its tokens would cross the network in plain HTTP.
fn admin_tls(opts: &DaemonOptions) -> Result<Option<Arc<rustls::ServerConfig>>, DaemonError> {
    if !opts.admin.ip().is_loopback() && !opts.admin_access.has_token() {
        if !opts.admin_insecure {
            return Err(DaemonError::InsecureAdmin(opts.admin));
        }
        tracing::warn!(
            "the admin API on {} has no token (--admin-insecure): anyone who reaches it can publish, purge and redrive",
            opts.admin
        );
    }
    let tls = match &opts.admin_tls {
        Some((cert, key)) => Some(admin::tls_config(cert, key)?),
        None => None,
    };
    if !opts.admin.ip().is_loopback() && opts.admin_access.has_token() && tls.is_none() {
        tracing::warn!(
            "the admin API on {} takes its tokens over plain HTTP: anyone on the path can read and reuse them; give it a certificate (--admin-tls-cert, --admin-tls-key) or put it behind a TLS proxy",
            opts.admin
        );
    }
    Ok(tls)
}

/// Binds the admin address (before the broker opens, so a daemon already
/// running there is found first); returns the listener and the address
/// actually bound.
async fn bind_admin(
    addr: SocketAddr,
) -> Result<(tokio::net::TcpListener, SocketAddr), DaemonError> {
    let bind_error = |source| DaemonError::Bind { addr, source };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    Ok((listener, bound))
}

/// The broker opened, with its dedup store and its description for people.
struct OpenedBroker {
    broker: Arc<dyn Broker>,
    dedup: Arc<dyn DedupStore>,
    label: String,
}

/// Opens the embedded broker's data directory, or connects to NATS. The
/// broker keeps the stages' dedup records too: a key is recorded
/// COMPLETED in the same step as the outputs and the ack.
async fn open_broker(
    choice: BrokerChoice,
    opts: &DaemonOptions,
) -> Result<OpenedBroker, DaemonError> {
    Ok(match choice {
        BrokerChoice::Embedded => {
            let embedded = EmbeddedBroker::open(EmbeddedOptions {
                sync: opts.sync,
                ..EmbeddedOptions::new(opts.data_dir.clone())
            })?;
            let label = format!(
                "embedded (data in {}, sync: {})",
                opts.data_dir.display(),
                opts.sync
            );
            OpenedBroker {
                broker: embedded.clone(),
                dedup: embedded,
                label,
            }
        }
        BrokerChoice::Nats(options) => {
            let nats = NatsBroker::connect(options, NATS_CONNECT_TIMEOUT).await?;
            let label = format!("NATS JetStream at {}", nats.describe());
            OpenedBroker {
                broker: nats.clone(),
                dedup: nats,
                label,
            }
        }
    })
}

/// Sets up and starts every source of the pipelines.
async fn start_sources(pipelines: &[Pipeline], parts: &Parts<'_>) -> Result<Sources, DaemonError> {
    let mut sources = Sources::default();
    for plan in sources::plans(pipelines) {
        let setup = sources::setup(&plan, parts.metrics, parts.health).await?;
        sources.start(plan, setup, parts.broker.clone());
    }
    Ok(sources)
}

/// The claim sweeper's task (with a claim check anywhere) and the switch
/// that stops it.
struct Sweeper {
    stop: tokio::sync::watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// One task per topic with `retention: {max_age, archive}`
    /// (`connect::archive::retention`), stopped by the same switch.
    archivers: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts the claim sweeper over the claim-checked topics and the DLQs.
fn start_sweeper(
    claims: Option<Arc<Claims>>,
    pipelines: &[Pipeline],
    broker: &Arc<dyn Broker>,
    parts: &Parts<'_>,
) -> Sweeper {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let archivers = start_archivers(pipelines, broker, parts, &stopped);
    let task = claims.map(|claims| {
        let (topics, dlqs) = claim_topics(&claims, pipelines);
        tokio::spawn(crate::claim::sweeper(
            claims,
            broker.clone(),
            topics,
            dlqs,
            stopped,
        ))
    });
    Sweeper {
        stop,
        task,
        archivers,
    }
}

/// The retention archivers: one task per topic whose `retention` has an
/// `archive` (the broker was given no age retention for it, so only this
/// task removes what is old, once the archive holds it).
fn start_archivers(
    pipelines: &[Pipeline],
    broker: &Arc<dyn Broker>,
    parts: &Parts<'_>,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let dead_letters: std::collections::HashSet<String> = pipelines
        .iter()
        .flat_map(|p| {
            p.stages
                .iter()
                .map(|s| s.dlq_topic(&p.name))
                .chain(p.sources.iter().map(|s| s.dlq_topic(&p.name)))
        })
        .collect();
    for topic in pipelines.iter().flat_map(|p| &p.topics) {
        let Some(retention) = &topic.retention else {
            continue;
        };
        let Some(archive) = &retention.archive else {
            continue;
        };
        let line: connect::archive::LineFn = if dead_letters.contains(&topic.name) {
            let name = topic.name.clone();
            Arc::new(move |stored| admin::dlq_archive_line(&name, stored))
        } else {
            Arc::new(connect::archive::message_line)
        };
        let job = connect::archive::RetentionArchive {
            topic: topic.name.clone(),
            max_age: retention.max_age.get(),
            archive: archive.clone(),
            line,
        };
        tasks.push(tokio::spawn(connect::archive::retention(
            job,
            broker.clone(),
            parts.health.clone(),
            parts.metrics.clone(),
            stopped.clone(),
        )));
    }
    tasks
}

/// The admin server's task, its state, and the switch that closes it.
struct AdminServer {
    state: AdminState,
    /// `https` or `http`.
    scheme: &'static str,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Serves the admin API on `listener` (with TLS if given); its reload
/// endpoint asks through `reload_requests`.
fn start_admin(
    listener: tokio::net::TcpListener,
    mut state: AdminState,
    tls: Option<Arc<rustls::ServerConfig>>,
    reload_requests: &tokio::sync::mpsc::Sender<crate::reload::ReloadRequest>,
) -> AdminServer {
    let scheme = if let Some(tls) = tls {
        state = state.with_tls(tls);
        "https"
    } else {
        "http"
    };
    state.reloads().connect(reload_requests.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(admin::serve(listener, state.clone(), async move {
        let _ = stopped.await;
    }));
    AdminServer {
        state,
        scheme,
        stop,
        task,
    }
}

/// Announces the running configuration's version and starts what runs
/// beside the daemon's loop: the version tracker on a shared broker, the
/// SIGHUP handler and, with `watch`, the file watcher. Returns their tasks.
fn start_helpers(
    live: &mut reload::Live,
    watch: bool,
    reload_requests: tokio::sync::mpsc::Sender<crate::reload::ReloadRequest>,
) -> Vec<tokio::task::JoinHandle<()>> {
    live.publish_watched();
    let version = versions::version(&live.pipelines, &live.plugin_shas);
    tracing::info!(%version, "configuration version");
    live.version.send_replace(version);
    // Daemons sharing a NATS say which configuration each runs.
    let versions = live
        .broker
        .shared_versions()
        .map(|shared| tokio::spawn(versions::track(shared, live.version.subscribe())));
    let hangups = tokio::spawn(reload::on_hangup(reload_requests.clone()));
    let watcher =
        watch.then(|| tokio::spawn(watch::watch(live.watched.subscribe(), reload_requests)));
    [Some(hangups), watcher, versions]
        .into_iter()
        .flatten()
        .collect()
}

/// The daemon's loop: serves reload requests until `shutdown` resolves.
/// Requests still queued then get no answer: their callers see the
/// shutdown.
async fn serve_until(
    shutdown: impl std::future::Future<Output = ()>,
    mut reloads: tokio::sync::mpsc::Receiver<crate::reload::ReloadRequest>,
    live: &mut reload::Live,
    started: &Started,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(request) = reloads.recv() => live.serve(request, started).await,
        }
    }
}

/// `(pipeline, stage)`: how the engine and a reload name a stage.
pub(crate) type StageKey = (String, String);

fn stage_key(pipeline: &Pipeline, stage: &crate::config::Stage) -> StageKey {
    (pipeline.name.clone(), stage.name.clone())
}

/// The topics the claim sweeper reads for references: the claim-checked
/// ones that are not dead-letter topics, and every stage's DLQ topic.
fn claim_topics(claims: &Claims, pipelines: &[Pipeline]) -> (Vec<String>, Vec<String>) {
    let mut dlqs: Vec<String> = pipelines
        .iter()
        .flat_map(|p| p.stages.iter().map(|s| s.dlq_topic(&p.name)))
        .collect();
    dlqs.sort();
    dlqs.dedup();
    let mut topics: Vec<String> = claims
        .policies()
        .map(|(t, _)| t.to_owned())
        .filter(|t| !dlqs.contains(t))
        .collect();
    topics.sort();
    (topics, dlqs)
}

/// How long start-up waits for a first connection to NATS.
const NATS_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// The broker a daemon runs on.
#[derive(Debug)]
enum BrokerChoice {
    Embedded,
    Nats(NatsOptions),
}

/// The broker URL for these pipelines: `--broker`/`SLUICE_BROKER` if given
/// (so the same files run on either broker unchanged), else the one their
/// `broker:` fields agree on.
fn broker_url(flag: Option<&str>, pipelines: &[Pipeline]) -> Result<String, DaemonError> {
    if let Some(url) = flag {
        return Ok(url.to_owned());
    }
    let mut named: Vec<&Pipeline> = Vec::new();
    for pipeline in pipelines {
        if !named.iter().any(|p| p.broker == pipeline.broker) {
            named.push(pipeline);
        }
    }
    if let [first, second, ..] = named.as_slice() {
        return Err(DaemonError::Unsupported(format!(
            "one daemon runs on one broker, but `{}` ({}) uses `{}` and `{}` ({}) uses `{}`; run them in separate daemons, or pass --broker to choose one for all",
            first.name,
            first.source.display(),
            first.broker,
            second.name,
            second.source.display(),
            second.broker
        )));
    }
    Ok(named
        .first()
        .map_or_else(crate::config::default_broker, |p| p.broker.clone()))
}

/// The broker a URL names.
fn parse_broker(url: &str) -> Result<BrokerChoice, DaemonError> {
    if url == "embedded" {
        return Ok(BrokerChoice::Embedded);
    }
    if NatsOptions::is_nats_url(url) {
        return NatsOptions::parse(url)
            .map(BrokerChoice::Nats)
            .map_err(|e| DaemonError::Unsupported(e.to_string()));
    }
    Err(DaemonError::Unsupported(format!(
        "unknown broker `{url}`; use `embedded` or a NATS URL such as `nats://127.0.0.1:4222`"
    )))
}

/// Every topic the pipelines declare, plus each stage's DLQ topic. A topic
/// is `subscribed` when some stage reads it, takes `dead_letters` when it
/// is some stage's DLQ, and its duplicate window covers
/// the retry horizon of every stage publishing to it: a stage republishes
/// its outputs (same ids) at most `ack_wait` after a crash, or one backoff
/// after a failed completion, so twice the longer of the two is kept.
pub(crate) fn topic_specs(pipelines: &[Pipeline]) -> Vec<TopicSpec> {
    let mut specs: Vec<TopicSpec> = Vec::new();
    let mut add = |name: String, retention: Option<std::time::Duration>| {
        if !specs.iter().any(|s| s.name == name) {
            specs.push(TopicSpec {
                retention,
                ..TopicSpec::new(name)
            });
        }
    };
    for pipeline in pipelines {
        for topic in &pipeline.topics {
            // A retention with an archive is the archiver's to apply
            // (`connect::archive`): the broker must not drop what it has
            // not written yet.
            let broker_retention = topic
                .retention
                .as_ref()
                .filter(|r| r.archive.is_none())
                .map(|r| r.max_age.get());
            add(topic.name.clone(), broker_retention);
        }
        for stage in &pipeline.stages {
            add(stage.dlq_topic(&pipeline.name), None);
        }
        for source in &pipeline.sources {
            add(source.dlq_topic(&pipeline.name), None);
        }
    }
    // A source's message read again (a crash before the upstream ack, a
    // reclaim) must still collapse in its topic's duplicate window.
    for pipeline in pipelines {
        for source in &pipeline.sources {
            let Some(connector) = source.connector() else {
                continue;
            };
            let horizon = connector
                .redelivery_horizon()
                .max(std::time::Duration::from_secs(60))
                * 2;
            for spec in &mut specs {
                if spec.name == source.to {
                    spec.duplicate_window = spec.duplicate_window.max(Some(horizon));
                }
                if spec.name == source.dlq_topic(&pipeline.name) {
                    spec.dead_letters = true;
                    spec.duplicate_window = spec.duplicate_window.max(Some(horizon));
                }
            }
        }
    }
    for pipeline in pipelines {
        for stage in &pipeline.stages {
            let horizon = stage
                .delivery
                .ack_wait
                .get()
                .max(stage.delivery.retry.backoff.max.get())
                * 2;
            for spec in &mut specs {
                if stage.subscribe.topics.contains(&spec.name) {
                    spec.subscribed = true;
                }
                let dlq = spec.name == stage.dlq_topic(&pipeline.name);
                spec.dead_letters |= dlq;
                if stage.publish.contains(&spec.name) || dlq {
                    spec.duplicate_window = spec.duplicate_window.max(Some(horizon));
                }
            }
        }
    }
    specs
}

/// Raises the soft limit of open files to the hard limit: the store keeps
/// table files open and every admin connection is one more descriptor, and
/// the common soft default (1024, or 256 under some shells) runs out long
/// before the hard limit would (EMFILE mid-write).
#[cfg(target_os = "linux")]
fn raise_open_files_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    // `None` is unlimited; the soft limit never exceeds the hard one.
    if limit.current.is_none() || limit.current == limit.maximum {
        return;
    }
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            tracing::debug!(limit = ?limit.maximum, "open-files limit raised to the hard limit")
        }
        Err(e) => tracing::warn!(error = %e, "could not raise the open-files limit"),
    }
}

#[cfg(not(target_os = "linux"))]
fn raise_open_files_limit() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_specs_mark_what_is_read_and_what_takes_dead_letters() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("shop.yaml");
        std::fs::write(
            &file,
            "name: shop\ntopics: [in, out]\nstages:\n\
             \x20 - {name: a, subscribe: in, publish: [out], plugin: x.wasm}\n\
             \x20 - {name: redo, subscribe: shop.a.dlq, plugin: x.wasm}\n",
        )
        .expect("write");
        let pipelines = crate::config::load(&[file]).expect("a valid pipeline");
        let specs = topic_specs(&pipelines);
        let spec = |name: &str| {
            specs
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("no spec for {name}: {specs:?}"))
        };
        let flags = |name: &str| (spec(name).subscribed, spec(name).dead_letters);
        assert_eq!(flags("in"), (true, false));
        assert_eq!(flags("out"), (false, false));
        assert_eq!(flags("shop.a.dlq"), (true, true));
        assert_eq!(flags("shop.redo.dlq"), (false, true));
    }
}
