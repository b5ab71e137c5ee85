//! The client behind `sluice publish`, `tail`, `dlq` and `status`: one way
//! to reach the broker, one way to say it is not there, and one mapping of
//! errors to messages and exit codes.
//!
//! Two transports, one set of operations ([`Client`]):
//!
//! - **the daemon** (the default, and the only way to the embedded broker,
//!   whose data directory its daemon holds locked): HTTP to the admin API at
//!   `--admin`/`SLUICE_ADMIN`;
//! - **NATS directly** (`--broker nats://...`/`SLUICE_BROKER`, no daemon
//!   needed): the admin API's own operations ([`AdminState`]) called
//!   in-process over a [`NatsBroker`], on a small single-threaded runtime.
//!   So ingest checks, DLQ scans and redrive semantics are the daemon's,
//!   not a copy of them. Without pipeline files any topic the broker has is
//!   accepted and stage `p/s` has the DLQ topic `p.s.dlq`; `--pipelines`
//!   loads files to know custom `dlq:` topics and high-water marks.

use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use reqwest::blocking::{RequestBuilder, Response};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::args::{ADMIN_READ_TOKEN_ENV, ADMIN_TOKEN_ENV, TokenSource};
use crate::admin::{
    AdminState, ApiError, BatchHeaders, BatchLine, BatchReceipt, DEFAULT_ADMIN, DlqEntryDetail,
    DlqFilter, DlqList, ErrorBody, HEADER_PREFIX, ID_HEADER, KEY_HEADER, PublishReceipt,
    PurgeReport, PurgeRequest, ReadResponse, RedriveReport, RedriveRequest, StageControl,
    StageStatus, TopicView,
};
use crate::broker::BrokerError;
use crate::broker::nats::{NatsBroker, NatsOptions};
use crate::delay::{DELAY_HEADER, DELIVER_AT_HEADER};
use crate::metrics::Metrics;

/// How long a request may take unless the command says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the CLI waits for a first connection to NATS.
const NATS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How to reach the running daemon: one set of flags for every command that
/// talks to it.
#[derive(Debug, clap::Args)]
pub(crate) struct AdminArgs {
    /// The running daemon's admin address: HOST:PORT, http://HOST:PORT or https://HOST:PORT
    /// (what `sluice run --admin` listens on).
    #[arg(long, env = "SLUICE_ADMIN", value_name = "ADDR", default_value = DEFAULT_ADMIN)]
    admin: String,
    /// With an https:// --admin: trust the daemon's certificate through this PEM file (its CA,
    /// or the self-signed certificate itself) instead of the system's roots.
    #[arg(long, env = "SLUICE_ADMIN_CA", value_name = "FILE")]
    admin_ca: Option<PathBuf>,
    #[command(flatten)]
    tokens: super::args::TokenArgs,
}

/// How `publish`, `tail` and `dlq` reach the broker: through the daemon, or
/// straight to NATS.
#[derive(Debug, clap::Args)]
pub(crate) struct ConnectArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// Go straight to NATS JetStream, with no daemon running:
    /// `nats://[user:pass@|token@]host:port[,host:port...][?creds=FILE&tls_ca=FILE]`
    /// (`tls://` requires TLS; secrets can come from SLUICE_NATS_CREDS, SLUICE_NATS_TOKEN,
    /// SLUICE_NATS_USER/SLUICE_NATS_PASSWORD and SLUICE_NATS_TLS_CA). `embedded` (or no
    /// --broker) goes through the running daemon's admin API (--admin): the embedded broker's
    /// data directory is locked by its daemon, so it cannot be opened directly.
    #[arg(long, env = "SLUICE_BROKER", value_name = "URL")]
    broker: Option<String>,
    /// With a NATS --broker: pipeline files (or directories) to take topics and stages from,
    /// as the daemon does; needed for a stage whose `dlq:` names its own topic or has an
    /// `archive:` (which `dlq purge` writes first). Without them any topic NATS has a stream
    /// for is accepted, and stage P/S's DLQ is topic `P.S.dlq`.
    #[arg(long = "pipelines", value_name = "FILE|DIR")]
    pipelines: Vec<PathBuf>,
}

impl ConnectArgs {
    /// Straight to NATS without `--pipelines`: the stages' settings (a
    /// `dlq:` topic or archive) are not known here.
    pub(crate) fn nats_without_pipelines(&self) -> bool {
        let broker = self.broker.as_deref().map(str::trim).unwrap_or_default();
        !broker.is_empty() && broker != "embedded" && self.pipelines.is_empty()
    }
}

/// Why a call to the daemon failed.
#[derive(Debug)]
pub(crate) enum ClientError {
    /// Nothing answers at the address.
    Unreachable {
        /// The base URL tried.
        url: String,
    },
    /// The invocation is wrong before any request is made.
    Usage(String),
    /// The daemon answered with an error.
    Api {
        /// The HTTP status.
        status: reqwest::StatusCode,
        /// The daemon's message.
        message: String,
    },
    /// The request failed some other way (timeout, a reply that is not the
    /// API's, local I/O).
    Failed(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Unreachable { url } => write!(
                f,
                "cannot reach the sluice daemon at {url} (is `sluice run` running? set --admin or SLUICE_ADMIN)"
            ),
            ClientError::Usage(message)
            | ClientError::Api { message, .. }
            | ClientError::Failed(message) => f.write_str(message),
        }
    }
}

impl ClientError {
    /// 2 when the invocation or its inputs are wrong (including a 4xx from
    /// the daemon: unknown topic, empty payload, ...), 1 when the operation
    /// failed (unreachable, busy, broker error).
    pub(crate) fn exit_code(&self) -> ExitCode {
        match self {
            ClientError::Usage(_) => ExitCode::from(2),
            ClientError::Api { status, .. }
                if status.is_client_error()
                    && *status != reqwest::StatusCode::TOO_MANY_REQUESTS =>
            {
                ExitCode::from(2)
            }
            _ => ExitCode::FAILURE,
        }
    }

    /// Prints `error: <message>` on stderr and returns the exit code.
    pub(crate) fn report(&self) -> ExitCode {
        eprintln!("error: {self}");
        self.exit_code()
    }
}

/// The operations the CLI needs, over whichever transport was chosen.
pub(crate) struct Client {
    transport: Transport,
}

enum Transport {
    Daemon(Http),
    Direct(Direct),
}

impl Client {
    /// A client over the transport `args` choose: NATS directly for a
    /// `nats://` (or `tls://`) `--broker`, else the daemon.
    pub(crate) fn connect(args: &ConnectArgs) -> Result<Self, ClientError> {
        let broker = args.broker.as_deref().map(str::trim).unwrap_or_default();
        let transport = if broker.is_empty() || broker == "embedded" {
            if !args.pipelines.is_empty() {
                return Err(ClientError::Usage(
                    "--pipelines is only for --broker nats://...; the daemon knows its own pipelines"
                        .into(),
                ));
            }
            Transport::Daemon(Http::new(&args.admin)?)
        } else if NatsOptions::is_nats_url(broker) {
            Transport::Direct(Direct::connect(broker, &args.pipelines)?)
        } else {
            return Err(ClientError::Usage(format!(
                "unknown broker `{broker}`; use a NATS URL such as nats://127.0.0.1:4222, or `embedded` to go through the running daemon"
            )));
        };
        Ok(Client { transport })
    }

    /// A client of the daemon at `args`.
    pub(crate) fn daemon(args: &AdminArgs) -> Result<Self, ClientError> {
        Ok(Client {
            transport: Transport::Daemon(Http::new(args)?),
        })
    }

    /// Every stage's status (the daemon only: rates are sampled there).
    pub(crate) fn status(&self) -> Result<Vec<StageStatus>, ClientError> {
        match &self.transport {
            Transport::Daemon(http) => http.get("/v1/status", DEFAULT_TIMEOUT),
            Transport::Direct(_) => Err(ClientError::Usage(
                "status needs a running daemon; point --admin at one".into(),
            )),
        }
    }

    /// Asks the running daemon to reload its files (`POST /v1/reload`) and
    /// waits up to `timeout` for its report; a refused reload is a report
    /// too (`ok: false`, with its errors).
    pub(crate) fn reload(
        &self,
        force: bool,
        timeout: Duration,
    ) -> Result<crate::reload::ReloadReport, ClientError> {
        match &self.transport {
            Transport::Daemon(http) => http.reload(force, timeout),
            Transport::Direct(_) => Err(ClientError::Usage(
                "reload needs a running daemon; point --admin at one".into(),
            )),
        }
    }

    /// The running daemon's reload counts and last report (`GET
    /// /v1/reload`); `None` from a daemon that predates reloads.
    pub(crate) fn reload_summary(
        &self,
    ) -> Result<Option<crate::reload::ReloadSummary>, ClientError> {
        match &self.transport {
            Transport::Daemon(http) => match http.get("/v1/reload", DEFAULT_TIMEOUT) {
                Ok(summary) => Ok(Some(summary)),
                Err(ClientError::Api { status, .. })
                    if status == reqwest::StatusCode::NOT_FOUND =>
                {
                    Ok(None)
                }
                Err(err) => Err(err),
            },
            Transport::Direct(_) => Ok(None),
        }
    }

    /// The sources of the running daemon (`GET /v1/sources`).
    pub(crate) fn sources(&self) -> Result<Vec<crate::admin::SourceStatus>, ClientError> {
        match &self.transport {
            Transport::Daemon(http) => http.get("/v1/sources", DEFAULT_TIMEOUT),
            Transport::Direct(_) => Err(ClientError::Usage(
                "status needs a running daemon; point --admin at one".into(),
            )),
        }
    }

    /// Publishes one message to `topic`.
    ///
    /// To a daemon it goes as `POST /v1/topics/{topic}/messages`: the
    /// payload is the raw body (no base64 growth, so the body limit is the
    /// payload limit), the id is the `Idempotency-Key`, the key and headers
    /// are `Sluice-Key` and `Sluice-Header-*`. When HTTP headers cannot
    /// carry the message exactly (a header name with capitals, which HTTP
    /// lowercases; a repeated name; a value with control characters, edge
    /// spaces or non-ASCII text) it goes as one JSON line of
    /// `/v1/topics/{topic}/batch` instead, which carries anything.
    pub(crate) fn publish(
        &self,
        topic: &str,
        message: Outgoing,
    ) -> Result<PublishReceipt, ClientError> {
        let receipt: BatchReceipt = match &self.transport {
            Transport::Daemon(http) => {
                if let Some(headers) = message.request_headers() {
                    return http.send(
                        http.http
                            .post(http.url(&format!("/v1/topics/{}/messages", segment(topic))))
                            .headers(headers)
                            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                            .body(message.payload)
                            .timeout(DEFAULT_TIMEOUT),
                    );
                }
                let mut body = serde_json::to_vec(&message.into_line())
                    .map_err(|e| ClientError::Failed(format!("cannot encode the message: {e}")))?;
                body.push(b'\n');
                http.post_bytes(
                    &format!("/v1/topics/{}/batch", segment(topic)),
                    "application/x-ndjson",
                    body,
                )?
            }
            Transport::Direct(direct) => {
                direct.call(direct.state.publish_lines(topic, vec![message.into_line()]))?
            }
        };
        receipt
            .messages
            .into_iter()
            .next()
            .ok_or_else(|| ClientError::Failed("the broker acknowledged no message".into()))
    }

    /// A topic's stats.
    pub(crate) fn topic(&self, topic: &str) -> Result<TopicView, ClientError> {
        match &self.transport {
            Transport::Daemon(http) => {
                http.get(&format!("/v1/topics/{}", segment(topic)), DEFAULT_TIMEOUT)
            }
            Transport::Direct(direct) => direct.call(direct.state.topic_view(topic)),
        }
    }

    /// Up to `max` messages of `topic` from `from` (default: the oldest
    /// stored), waiting up to `wait` for the first.
    pub(crate) fn read(
        &self,
        topic: &str,
        from: Option<u64>,
        max: u64,
        wait: Duration,
    ) -> Result<ReadResponse, ClientError> {
        match &self.transport {
            Transport::Daemon(http) => {
                let mut path = format!(
                    "/v1/topics/{}/messages?max={max}&wait_ms={}",
                    segment(topic),
                    wait.as_millis()
                );
                if let Some(from) = from {
                    path.push_str(&format!("&from={from}"));
                }
                http.get(&path, wait + DEFAULT_TIMEOUT)
            }
            Transport::Direct(direct) => {
                let max = usize::try_from(max).unwrap_or(usize::MAX);
                direct.call(direct.state.read_topic(topic, from, Some(max), wait))
            }
        }
    }

    /// Up to `limit` of a stage's DLQ entries that `filter` takes.
    pub(crate) fn dlq_list(
        &self,
        pipeline: &str,
        stage: &str,
        limit: u32,
        filter: &DlqFilter,
    ) -> Result<DlqList, ClientError> {
        match &self.transport {
            Transport::Daemon(http) => {
                let mut query = url::form_urlencoded::Serializer::new(String::new());
                query.append_pair("limit", &limit.to_string());
                for kind in &filter.kind {
                    query.append_pair("kind", kind);
                }
                for header in &filter.header {
                    query.append_pair("header", header);
                }
                for seq in &filter.seq {
                    query.append_pair("seq", &seq.to_string());
                }
                for (name, value) in [
                    ("since", &filter.since),
                    ("until", &filter.until),
                    ("error", &filter.error),
                    ("key", &filter.key),
                ] {
                    if let Some(value) = value {
                        query.append_pair(name, value);
                    }
                }
                http.get(
                    &format!("{}?{}", dlq_path(pipeline, stage), query.finish()),
                    DEFAULT_TIMEOUT,
                )
            }
            Transport::Direct(direct) => {
                let limit = usize::try_from(limit).unwrap_or(usize::MAX);
                direct.call(direct.state.dlq_list(pipeline, stage, Some(limit), filter))
            }
        }
    }

    /// One DLQ entry in full.
    pub(crate) fn dlq_show(
        &self,
        pipeline: &str,
        stage: &str,
        seq: u64,
    ) -> Result<DlqEntryDetail, ClientError> {
        match &self.transport {
            Transport::Daemon(http) => http.get(
                &format!("{}/{seq}", dlq_path(pipeline, stage)),
                DEFAULT_TIMEOUT,
            ),
            Transport::Direct(direct) => direct.call(direct.state.dlq_show(pipeline, stage, seq)),
        }
    }

    /// Redrives a stage's DLQ entries.
    pub(crate) fn dlq_redrive(
        &self,
        pipeline: &str,
        stage: &str,
        request: &RedriveRequest,
    ) -> Result<RedriveReport, ClientError> {
        match &self.transport {
            // A paced redrive takes as long as it takes.
            Transport::Daemon(http) => http.post_json(
                &format!("{}/redrive", dlq_path(pipeline, stage)),
                request,
                None,
            ),
            Transport::Direct(direct) => {
                direct.call(direct.state.dlq_redrive(pipeline, stage, request))
            }
        }
    }

    /// Pauses or resumes a stage.
    pub(crate) fn stage_set_paused(
        &self,
        pipeline: &str,
        stage: &str,
        paused: bool,
    ) -> Result<StageControl, ClientError> {
        match &self.transport {
            Transport::Daemon(http) => http.post_json(
                &format!(
                    "{}/{}",
                    stage_path(pipeline, stage),
                    if paused { "pause" } else { "resume" }
                ),
                &serde_json::json!({}),
                Some(DEFAULT_TIMEOUT),
            ),
            Transport::Direct(direct) => {
                direct.call(direct.state.set_paused(pipeline, stage, paused))
            }
        }
    }

    /// A page of the keys of a stage's state store.
    pub(crate) fn state_list(
        &self,
        pipeline: &str,
        stage: &str,
        prefix: &str,
        after: Option<&str>,
    ) -> Result<crate::admin::StateListing, ClientError> {
        match &self.transport {
            Transport::Daemon(http) => {
                let mut path =
                    format!("{}?prefix={}", state_path(pipeline, stage), segment(prefix));
                if let Some(after) = after {
                    path.push_str(&format!("&after={}", segment(after)));
                }
                http.get(&path, DEFAULT_TIMEOUT)
            }
            Transport::Direct(direct) => direct.call(async {
                direct
                    .state
                    .state_list(pipeline, stage, prefix, after, 1000)
                    .await
            }),
        }
    }

    /// One value of a stage's state store.
    pub(crate) fn state_get(
        &self,
        pipeline: &str,
        stage: &str,
        key: &str,
    ) -> Result<crate::admin::StateValue, ClientError> {
        match &self.transport {
            Transport::Daemon(http) => http.get(
                &format!("{}/keys/{}", state_path(pipeline, stage), segment(key)),
                DEFAULT_TIMEOUT,
            ),
            Transport::Direct(direct) => {
                direct.call(async { direct.state.state_get(pipeline, stage, key).await })
            }
        }
    }

    /// Deletes one key of a stage's state store.
    pub(crate) fn state_delete(
        &self,
        pipeline: &str,
        stage: &str,
        key: &str,
    ) -> Result<crate::admin::StateDeleted, ClientError> {
        match &self.transport {
            Transport::Daemon(http) => http.send(
                http.http
                    .delete(http.url(&format!(
                        "{}/keys/{}",
                        state_path(pipeline, stage),
                        segment(key)
                    )))
                    .timeout(DEFAULT_TIMEOUT),
            ),
            Transport::Direct(_) => Err(ClientError::Usage(
                "state lives in the daemon's embedded broker: ask the daemon (--admin)".into(),
            )),
        }
    }

    /// Purges a stage's DLQ entries.
    pub(crate) fn dlq_purge(
        &self,
        pipeline: &str,
        stage: &str,
        request: &PurgeRequest,
    ) -> Result<PurgeReport, ClientError> {
        match &self.transport {
            // Purging a large DLQ takes as long as it takes.
            Transport::Daemon(http) => http.post_json(
                &format!("{}/purge", dlq_path(pipeline, stage)),
                request,
                None,
            ),
            Transport::Direct(direct) => {
                direct.call(direct.state.dlq_purge(pipeline, stage, request))
            }
        }
    }
}

/// `/v1/stages/{pipeline}/{stage}`, escaped.
fn stage_path(pipeline: &str, stage: &str) -> String {
    format!("/v1/stages/{}/{}", segment(pipeline), segment(stage))
}

/// `/v1/state/{pipeline}/{stage}`, escaped.
fn state_path(pipeline: &str, stage: &str) -> String {
    format!("/v1/state/{}/{}", segment(pipeline), segment(stage))
}

/// `/v1/dlq/{pipeline}/{stage}`, escaped.
fn dlq_path(pipeline: &str, stage: &str) -> String {
    format!("/v1/dlq/{}/{}", segment(pipeline), segment(stage))
}

/// NATS directly: the admin API's operations over a [`NatsBroker`], in
/// this process.
struct Direct {
    // Dropped before the runtime its connection runs on.
    state: AdminState,
    runtime: tokio::runtime::Runtime,
    /// The servers, for messages.
    servers: String,
}

impl Direct {
    /// Connects to the NATS broker at `url`, and loads `pipelines` if any.
    fn connect(url: &str, pipelines: &[PathBuf]) -> Result<Self, ClientError> {
        let options = NatsOptions::parse(url).map_err(|e| ClientError::Usage(e.to_string()))?;
        let pipelines = if pipelines.is_empty() {
            None
        } else {
            Some(crate::config::load(pipelines).map_err(|diagnostics| {
                ClientError::Usage(format!(
                    "the --pipelines files have problems:\n{diagnostics}"
                ))
            })?)
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Failed(format!("cannot start the async runtime: {e}")))?;
        let servers = options.describe();
        let broker = runtime
            .block_on(NatsBroker::connect(options, NATS_CONNECT_TIMEOUT))
            .map_err(|e| ClientError::Failed(e.to_string()))?;
        let metrics = Arc::new(Metrics::new());
        let state = match pipelines {
            Some(pipelines) => {
                // The pipelines' claim checks apply to publishes from here too.
                let broker = crate::claim::wrap_broker(broker, &pipelines)
                    .map_err(|e| ClientError::Failed(e.to_string()))?;
                AdminState::new(broker, metrics, pipelines)
            }
            None => AdminState::without_pipelines(broker, metrics),
        };
        Ok(Direct {
            state,
            runtime,
            servers,
        })
    }

    /// Runs one operation to its end.
    fn call<T>(
        &self,
        operation: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ClientError> {
        self.runtime
            .block_on(operation)
            .map_err(|err| self.error(err))
    }

    /// An operation's error as the daemon would have answered it; a topic
    /// declared in `--pipelines` that NATS has no stream for is a wrong
    /// input (exit 2) here, not a daemon still starting.
    fn error(&self, err: ApiError) -> ClientError {
        match err {
            ApiError::Broker(BrokerError::UnknownTopic(topic)) => ClientError::Api {
                status: reqwest::StatusCode::NOT_FOUND,
                message: format!(
                    "unknown topic `{topic}`: NATS at {} has no stream for it (a daemon creates the topics of its pipelines when it starts)",
                    self.servers
                ),
            },
            err => ClientError::Api {
                status: err.status(),
                message: err.to_string(),
            },
        }
    }
}

/// One message for [`Client::publish`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Outgoing {
    /// The payload bytes.
    pub(crate) payload: Vec<u8>,
    /// The message key.
    pub(crate) key: Option<String>,
    /// Message headers, in order.
    pub(crate) headers: Vec<(String, String)>,
    /// The message id (idempotency key); the daemon picks one when absent.
    pub(crate) id: Option<String>,
    /// Deliver after this long (`Sluice-Delay`).
    pub(crate) delay: Option<String>,
    /// Deliver at this time, RFC 3339 (`Sluice-Deliver-At`).
    pub(crate) deliver_at: Option<String>,
}

impl Outgoing {
    /// As one line of the batch endpoint.
    fn into_line(self) -> BatchLine {
        let (payload, payload_base64) = crate::admin::payload_fields(&self.payload);
        BatchLine {
            payload,
            payload_base64,
            key: self.key,
            headers: (!self.headers.is_empty()).then_some(BatchHeaders::Pairs(self.headers)),
            id: self.id,
            delay: self.delay,
            deliver_at: self.deliver_at,
        }
    }

    /// The request headers of a single-message POST that carry this
    /// message's id, key and headers exactly, or None when HTTP headers
    /// cannot.
    fn request_headers(&self) -> Option<HeaderMap> {
        // HTTP trims edge whitespace and may mangle bytes outside visible
        // ASCII; the server would see something else.
        fn value(text: &str) -> Option<HeaderValue> {
            let exact = !text.is_empty()
                && text.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
                && !text.starts_with(' ')
                && !text.ends_with(' ');
            exact.then(|| HeaderValue::from_str(text).ok()).flatten()
        }
        // HTTP lowercases names: only names that are lowercase already come
        // through as they were given.
        fn name(text: &str) -> Option<HeaderName> {
            let exact = !text.is_empty()
                && text
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
            exact
                .then(|| HeaderName::from_bytes(format!("{HEADER_PREFIX}{text}").as_bytes()).ok())
                .flatten()
        }
        let mut map = HeaderMap::new();
        if let Some(id) = &self.id {
            map.insert(HeaderName::from_static(ID_HEADER), value(id)?);
        }
        if let Some(key) = &self.key {
            map.insert(HeaderName::from_static(KEY_HEADER), value(key)?);
        }
        if let Some(delay) = &self.delay {
            map.insert(HeaderName::from_static(DELAY_HEADER), value(delay)?);
        }
        if let Some(at) = &self.deliver_at {
            map.insert(HeaderName::from_static(DELIVER_AT_HEADER), value(at)?);
        }
        for (n, v) in &self.headers {
            let n = name(n)?;
            // A repeated name would come back grouped, not in order.
            if map.contains_key(&n) {
                return None;
            }
            map.insert(n, value(v)?);
        }
        Some(map)
    }
}

/// A client of one daemon's admin API.
struct Http {
    http: reqwest::blocking::Client,
    base: String,
    /// The token sent, and whether it is the read-only one (for messages).
    token: Option<(TokenSource, bool)>,
}

impl Http {
    /// A client for the daemon `args` names, sending the full-access token
    /// if one is set, else the read-only one.
    fn new(args: &AdminArgs) -> Result<Self, ClientError> {
        let base = base_url(&args.admin)?;
        let token = match args.tokens.full().map_err(ClientError::Usage)? {
            Some(full) => Some((full, false)),
            None => args
                .tokens
                .read()
                .map_err(ClientError::Usage)?
                .map(|read| (read, true)),
        };
        let mut headers = HeaderMap::new();
        if let Some((token, _)) = &token {
            let mut value =
                HeaderValue::from_str(&format!("Bearer {}", token.text)).map_err(|_| {
                    ClientError::Usage(format!(
                        "the admin token from {} has characters a header cannot carry",
                        token.source
                    ))
                })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut builder = reqwest::blocking::Client::builder()
            // The admin API is local or on a private network; a proxy from
            // the environment would only get in the way.
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .timeout(None)
            .default_headers(headers)
            .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = &args.admin_ca {
            let pem = std::fs::read(ca).map_err(|e| {
                ClientError::Usage(format!("cannot read --admin-ca {}: {e}", ca.display()))
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                ClientError::Usage(format!(
                    "--admin-ca {} holds no usable PEM certificate: {e}",
                    ca.display()
                ))
            })?;
            if certs.is_empty() {
                return Err(ClientError::Usage(format!(
                    "--admin-ca {} holds no PEM certificate",
                    ca.display()
                )));
            }
            builder = builder.tls_certs_only(certs);
        }
        let http = builder
            .build()
            .map_err(|e| ClientError::Failed(format!("cannot start the HTTP client: {e}")))?;
        Ok(Http { http, base, token })
    }

    /// `GET path` (query included), decoded.
    fn get<T: DeserializeOwned>(&self, path: &str, timeout: Duration) -> Result<T, ClientError> {
        self.send(self.http.get(self.url(path)).timeout(timeout))
    }

    /// `POST path` with a JSON body, decoded. `timeout` None waits as long
    /// as the daemon works (a paced redrive).
    fn post_json<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Option<Duration>,
    ) -> Result<T, ClientError> {
        let mut request = self.http.post(self.url(path)).json(body);
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        self.send(request)
    }

    /// `POST path` with a raw body of `content_type`, decoded.
    fn post_bytes<T: DeserializeOwned>(
        &self,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<T, ClientError> {
        self.send(
            self.http
                .post(self.url(path))
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body)
                .timeout(DEFAULT_TIMEOUT),
        )
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST /v1/reload`: its report whether it applied (200) or was
    /// refused (422); any other answer is an error.
    fn reload(
        &self,
        force: bool,
        timeout: Duration,
    ) -> Result<crate::reload::ReloadReport, ClientError> {
        let response = self
            .http
            .post(self.url("/v1/reload"))
            .json(&serde_json::json!({ "force": force }))
            .timeout(timeout)
            .send()
            .map_err(|e| self.transport(e))?;
        let status = response.status();
        if status.is_success() || status == reqwest::StatusCode::UNPROCESSABLE_ENTITY {
            return response.json().map_err(|e| {
                ClientError::Failed(format!(
                    "the daemon at {} sent a reload report this sluice cannot read: {e}",
                    self.base
                ))
            });
        }
        Err(self.api_error(status, response))
    }

    fn send<T: DeserializeOwned>(&self, request: RequestBuilder) -> Result<T, ClientError> {
        let response = request.send().map_err(|e| self.transport(e))?;
        let status = response.status();
        if status.is_success() {
            return response.json().map_err(|e| {
                ClientError::Failed(format!(
                    "the daemon at {} sent a reply this sluice cannot read: {e}",
                    self.base
                ))
            });
        }
        Err(self.api_error(status, response))
    }

    fn transport(&self, err: reqwest::Error) -> ClientError {
        if err.is_connect() && self.base.starts_with("https://") {
            ClientError::Failed(format!(
                "cannot connect to the sluice daemon at {}: {} (is `sluice run` running with TLS? to trust its certificate, set --admin-ca FILE or SLUICE_ADMIN_CA)",
                self.base,
                error_chain(&err)
            ))
        } else if err.is_connect() {
            ClientError::Unreachable {
                url: self.base.clone(),
            }
        } else if err.is_timeout() {
            ClientError::Failed(format!(
                "the daemon at {} did not answer in time",
                self.base
            ))
        } else {
            ClientError::Failed(format!("request to {} failed: {err}", self.base))
        }
    }

    fn api_error(&self, status: reqwest::StatusCode, response: Response) -> ClientError {
        let text = response.text().unwrap_or_default();
        let message = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) if status == reqwest::StatusCode::UNAUTHORIZED => match &self.token {
                None => format!(
                    "the daemon at {} requires a token: set {ADMIN_TOKEN_ENV} (or --admin-token-file FILE), or {ADMIN_READ_TOKEN_ENV} (or --admin-read-token-file FILE) for reads",
                    self.base
                ),
                Some((token, _)) => format!(
                    "the daemon at {} refused the token from {}: {}",
                    self.base, token.source, body.error
                ),
            },
            Ok(body) if status == reqwest::StatusCode::FORBIDDEN && body.code == "forbidden" => {
                match &self.token {
                    Some((token, true)) => format!(
                        "the token from {} is read-only ({}); this needs the full-access token: set {ADMIN_TOKEN_ENV} or --admin-token-file FILE",
                        token.source, body.error
                    ),
                    _ => body.error,
                }
            }
            Ok(body) => body.error,
            // Not the admin API (another server on that port?).
            Err(_) => format!(
                "{} answered {status}; is that a sluice daemon's admin address?",
                self.base
            ),
        };
        ClientError::Api { status, message }
    }
}

/// An error with its causes, for a TLS failure's real reason.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `127.0.0.1:7400` or `http://127.0.0.1:7400/` -> `http://127.0.0.1:7400`;
/// `https://...` stays https.
fn base_url(admin: &str) -> Result<String, ClientError> {
    let admin = admin.trim().trim_end_matches('/');
    if admin.is_empty() {
        return Err(ClientError::Usage(
            "the admin address is empty; give HOST:PORT".into(),
        ));
    }
    if admin.starts_with("http://") || admin.starts_with("https://") {
        Ok(admin.to_owned())
    } else if admin.contains("://") {
        Err(ClientError::Usage(format!(
            "`{admin}` is not an admin address; give HOST:PORT, http://HOST:PORT or https://HOST:PORT"
        )))
    } else {
        Ok(format!("http://{admin}"))
    }
}

/// Percent-encodes one URL path segment (topic, pipeline and stage names).
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_addresses_users_write() {
        assert_eq!(
            base_url("127.0.0.1:7400").ok(),
            Some("http://127.0.0.1:7400".into())
        );
        assert_eq!(base_url("http://h:1/").ok(), Some("http://h:1".into()));
        assert_eq!(base_url("https://h:1").ok(), Some("https://h:1".into()));
        assert!(base_url("nats://h:1").is_err());
        assert!(base_url(" ").is_err());
    }

    #[test]
    fn a_message_goes_as_http_headers_only_when_they_carry_it_exactly() {
        let plain = Outgoing {
            payload: b"x".to_vec(),
            key: Some("cust-7".into()),
            headers: vec![("trace".into(), "a b".into()), ("x-1".into(), "2".into())],
            id: Some("order-1".into()),
            delay: None,
            deliver_at: None,
        };
        let map = plain.request_headers().expect("plain headers fit");
        assert_eq!(map.get("idempotency-key").expect("id"), "order-1");
        assert_eq!(map.get("sluice-key").expect("key"), "cust-7");
        assert_eq!(map.get("sluice-header-trace").expect("header"), "a b");
        assert_eq!(map.len(), 4);
        let with = |f: fn(&mut Outgoing)| {
            let mut m = plain.clone();
            f(&mut m);
            m.request_headers()
        };
        assert!(with(|m| m.headers[0].0 = "Trace".into()).is_none());
        assert!(with(|m| m.headers[1].0 = "trace".into()).is_none());
        assert!(with(|m| m.headers[0].1 = "two\nlines".into()).is_none());
        assert!(with(|m| m.key = Some(" edge".into())).is_none());
        assert!(with(|m| m.id = Some("caf\u{e9}".into())).is_none());
        assert!(with(|m| m.key = None).is_some());
    }

    #[test]
    fn path_segments_are_escaped() {
        assert_eq!(segment("orders.eu_1-x"), "orders.eu_1-x");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }
}
