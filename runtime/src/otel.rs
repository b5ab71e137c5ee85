//! Trace export over OTLP: a span for every stage attempt, sent to a
//! collector when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `sluice run --otlp`)
//! is set, and nothing at all when it is not.
//!
//! - **Spans.** Each handler attempt of a stage is one span (`process
//!   <pipeline>/<stage>`, kind consumer) with the pipeline, stage, attempt,
//!   outcome and the plugin's sha256. Its parent is the message's
//!   `traceparent` (see [`crate::trace`]); a message without one starts a
//!   trace. The handler sees, and the outputs and the dead-letter copy
//!   carry, the attempt's own context, so the next stage's span is its
//!   child and one message's way through the stages is one trace. A batch
//!   call is one span linked to each item's context.
//! - **Export.** The standard OTLP/HTTP exporter (protobuf), configured by
//!   the standard `OTEL_*` variables (endpoint, headers, timeout,
//!   compression, sampler, batch processor, resource), on the batch
//!   processor's own thread, so a slow or absent collector never slows a
//!   stage: when its queue is full spans are dropped, never messages.
//! - **Off costs nothing.** Without an endpoint no span is made: every
//!   helper here first reads one flag.
//!
//! Stage attempts, one or more per message, are made with the SDK's tracer
//! directly ([`Span`]): through a `tracing` span and the
//! `tracing-opentelemetry` bridge they cost about four times the CPU (see
//! BENCHMARKS.md). The daemon's rare operations (a reload) are `tracing`
//! spans on the [`TARGET`] target, which the bridge layer ([`Export::layer`])
//! exports and the log layer leaves out.

use std::borrow::Cow;
use std::collections::HashSet;
use std::str::FromStr as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, RwLock};

use futures_util::future::Either;
use opentelemetry::context::{FutureExt as _, WithContext};
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags,
    TraceId, TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter};

use crate::trace::{TRACEPARENT, TRACESTATE, TraceParent};

/// The `tracing` target of the spans that are exported (not this module's
/// path: the log leaves this target out, and keeps this module's events).
pub const TARGET: &str = "sluice::otel::spans";

/// Set once an exporter is installed: spans are made only then.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The tracer stage spans are made with, while an exporter is installed.
static TRACER: RwLock<Option<SdkTracer>> = RwLock::new(None);

/// Whether spans are exported (and so made at all).
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Why export could not be set up; the daemon refuses to start rather than
/// run without the traces it was asked for.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` asks for a protocol not built in.
    #[error(
        "{var}={value}: only http/protobuf is built in (an OTLP collector's HTTP port, usually 4318)"
    )]
    Protocol {
        /// The variable that asks.
        var: &'static str,
        /// What it asks for.
        value: String,
    },
    /// `--otlp` is not an http(s) URL.
    #[error("--otlp {0}: expected an http:// or https:// URL, such as http://127.0.0.1:4318")]
    Endpoint(String),
    /// The exporter refused its configuration.
    #[error("the OTLP exporter: {0}")]
    Build(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The installed exporter: keep it for the daemon's life and call
/// [`Export::shutdown`] on the way out, which sends the spans still queued.
pub struct Export {
    provider: SdkTracerProvider,
    /// Where spans go, for the log (without credentials).
    endpoint: String,
}

impl Export {
    /// The exporter `flag` (`--otlp`) or the environment asks for, or None
    /// when neither names an endpoint (or `OTEL_SDK_DISABLED=true`, or
    /// `OTEL_TRACES_EXPORTER=none`). `flag` is a base URL, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is: `/v1/traces` is added to it.
    pub fn from_env(flag: Option<&str>) -> Result<Option<Export>, ExportError> {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return Ok(None);
        }
        let from_env = var(opentelemetry_otlp::OTEL_EXPORTER_OTLP_ENDPOINT)
            .or_else(|| var(opentelemetry_otlp::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT));
        if flag.is_none() && from_env.is_none() {
            return Ok(None);
        }
        for name in [
            opentelemetry_otlp::OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
            opentelemetry_otlp::OTEL_EXPORTER_OTLP_PROTOCOL,
        ] {
            if let Some(value) = var(name) {
                if value != "http/protobuf" {
                    return Err(ExportError::Protocol { var: name, value });
                }
                break;
            }
        }
        let mut builder = opentelemetry_otlp::SpanExporter::builder().with_http();
        let endpoint = match flag {
            Some(base) => {
                let url = traces_url(base)?;
                builder = builder.with_endpoint(url.clone());
                url
            }
            None => from_env.unwrap_or_default(),
        };
        let exporter = ReportingExporter::new(builder.build()?, &endpoint);
        let mut resource = opentelemetry_sdk::Resource::builder();
        if var("OTEL_SERVICE_NAME").is_none()
            && !var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="))
        {
            resource = resource.with_service_name("sluice");
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        *TRACER
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(provider.tracer("sluice"));
        ENABLED.store(true, Ordering::Relaxed);
        Ok(Some(Export {
            provider,
            endpoint: shown(&endpoint),
        }))
    }

    /// Where spans go: scheme, host, port and path, never credentials.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The `tracing` layer that turns the [`TARGET`] spans into
    /// OpenTelemetry spans (and takes nothing else).
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        // The span's attributes are its own fields only: not the source
        // line, thread or busy time `tracing` could add to each.
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("sluice"))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            // Entering a span need not set the thread's OpenTelemetry
            // context: only a stage attempt's is read (see `current`).
            .with_context_activation(false)
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(TARGET, tracing::Level::INFO),
            )
    }

    /// Sends the spans still queued and stops the exporter. Blocks (up to
    /// the exporter's timeout): call it outside the async runtime.
    pub fn shutdown(self) {
        ENABLED.store(false, Ordering::Relaxed);
        *TRACER
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        if let Err(err) = self.provider.shutdown() {
            tracing::warn!(error = %err, "the trace exporter did not shut down cleanly; queued spans may be lost");
        }
    }
}

/// The OTLP exporter, with the collector's outages told in the log once
/// each: when export starts failing (with the endpoint and why) and when it
/// works again (with how many spans were lost meanwhile), where the SDK
/// would log an error at every batch, every few seconds, without saying
/// where to.
#[derive(Debug)]
struct ReportingExporter {
    inner: opentelemetry_otlp::SpanExporter,
    /// The endpoint as configured: taken out of error texts.
    raw: String,
    /// The endpoint for the log (without credentials).
    shown: String,
    /// The outage under way, if export is failing.
    outage: std::sync::Mutex<Option<Outage>>,
}

/// An outage of the collector, as the exporter saw it.
#[derive(Debug)]
struct Outage {
    since: std::time::Instant,
    /// Spans in the exports that failed.
    lost: u64,
}

impl ReportingExporter {
    fn new(inner: opentelemetry_otlp::SpanExporter, endpoint: &str) -> ReportingExporter {
        ReportingExporter {
            inner,
            raw: endpoint.to_owned(),
            shown: shown(endpoint),
            outage: std::sync::Mutex::new(None),
        }
    }

    fn outage(&self) -> std::sync::MutexGuard<'_, Option<Outage>> {
        self.outage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl SpanExporter for ReportingExporter {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        let result = self.inner.export(batch).await;
        let mut outage = self.outage();
        match (result, outage.as_mut()) {
            (Ok(()), None) => {}
            (Ok(()), Some(was)) => {
                tracing::info!(
                    endpoint = %self.shown,
                    lost = was.lost,
                    down_for = ?was.since.elapsed(),
                    "trace export works again; the spans of the failed exports are lost"
                );
                *outage = None;
            }
            (Err(err), None) => {
                let error = if self.raw.is_empty() {
                    err.to_string()
                } else {
                    err.to_string().replace(&self.raw, &self.shown)
                };
                tracing::warn!(
                    endpoint = %self.shown,
                    %error,
                    "trace export failed; spans are dropped until the collector answers \
                     (messages are not affected; logged once until it recovers)"
                );
                *outage = Some(Outage {
                    since: std::time::Instant::now(),
                    lost: spans,
                });
            }
            (Err(_), Some(was)) => was.lost = was.lost.saturating_add(spans),
        }
        // Told above: the batch processor would log it again, at every
        // batch. It does nothing else with the error (no retry).
        Ok(())
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        if let Some(outage) = self.outage().as_ref() {
            tracing::warn!(
                endpoint = %self.shown,
                lost = outage.lost,
                down_for = ?outage.since.elapsed(),
                "trace export was failing at shutdown; the spans of the failed exports are lost"
            );
        }
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

/// `base` (`--otlp`) with the traces path, as the exporter does for
/// `OTEL_EXPORTER_OTLP_ENDPOINT`.
fn traces_url(base: &str) -> Result<String, ExportError> {
    let url = url::Url::parse(base.trim()).map_err(|_| ExportError::Endpoint(shown(base)))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ExportError::Endpoint(shown(base)));
    }
    Ok(format!("{}/v1/traces", url.as_str().trim_end_matches('/')))
}

/// An endpoint for the log: scheme, host, port and path, never a user,
/// password or query (which could hold a key).
fn shown(endpoint: &str) -> String {
    match url::Url::parse(endpoint) {
        Ok(url) => format!(
            "{}://{}{}{}",
            url.scheme(),
            url.host_str().unwrap_or(""),
            url.port().map(|p| format!(":{p}")).unwrap_or_default(),
            url.path()
        ),
        Err(_) => "(not a URL)".into(),
    }
}

/// The trace context in `headers`, if they carry a valid `traceparent`
/// (read by the W3C rules, as the SDK's propagator reads it, without its
/// allocations): the parent of an attempt's span.
fn parent(headers: &[(String, String)]) -> Option<Context> {
    let traceparent = TraceParent::parse(crate::trace::header(headers, TRACEPARENT)?)?;
    // An invalid `tracestate` is left out, the parent kept (W3C).
    let state = crate::trace::header(headers, TRACESTATE)
        .and_then(|state| TraceState::from_str(state).ok())
        .unwrap_or_default();
    let context = SpanContext::new(
        TraceId::from(traceparent.trace_id_bits()),
        SpanId::from(traceparent.parent_id_bits()),
        // Only the sampled flag is defined; others are zeroed (W3C).
        TraceFlags::new(traceparent.flags()) & TraceFlags::SAMPLED,
        true,
        state,
    );
    Some(Context::new().with_remote_span_context(context))
}

/// The `traceparent` value (version `00`) of `context`, hex-encoded by
/// hand: `format!` costs several times as much, once per attempt.
fn traceparent(context: &SpanContext) -> String {
    fn push_hex(out: &mut String, bytes: &[u8]) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for byte in bytes {
            out.push(char::from(DIGITS[usize::from(byte >> 4)]));
            out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
        }
    }
    let mut out = String::with_capacity(55);
    out.push_str("00-");
    push_hex(&mut out, &context.trace_id().to_bytes());
    out.push('-');
    push_hex(&mut out, &context.span_id().to_bytes());
    out.push('-');
    push_hex(&mut out, &[context.trace_flags().to_u8()]);
    out
}

/// The most distinct strings [`intern`] keeps for the daemon's life
/// (past it, strings are shared by reference count instead).
const INTERNED_MAX: usize = 4096;

/// The strings [`intern`] keeps.
static INTERNED: LazyLock<Mutex<HashSet<&'static str>>> = LazyLock::new(Default::default);

/// `text`, kept once for the daemon's life, or None once [`INTERNED_MAX`]
/// strings are kept. A stage's constant span strings (pipeline, stage,
/// topic, plugin hash, span name) are interned when the stage starts, so
/// that putting them in each span, and freeing the span on the exporter's
/// thread, touches no reference count that the stage threads share.
fn intern(text: &str) -> Option<&'static str> {
    let mut kept = INTERNED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(text) = kept.get(text) {
        return Some(text);
    }
    if kept.len() >= INTERNED_MAX {
        return None;
    }
    let text: &'static str = Box::leak(text.into());
    kept.insert(text);
    Some(text)
}

/// `text` as a span attribute value that every span of a stage shares.
fn shared(text: &str) -> Value {
    match intern(text) {
        Some(text) => Value::from(text),
        None => Value::from(Arc::<str>::from(text)),
    }
}

/// What every span of one stage carries, made once per stage: the
/// tracer, its name and the attributes that do not change from message to
/// message. Empty, and inert, when export is off.
#[derive(Default)]
pub struct StageSpans {
    /// The tracer, while export is on.
    tracer: Option<SdkTracer>,
    /// `process <pipeline>/<stage>`.
    name: Cow<'static, str>,
    /// Pipeline, stage, plugin and the constant `messaging.*` attributes.
    attributes: Vec<KeyValue>,
    /// The stage's topics, each with its attribute value.
    topics: Vec<(String, Value)>,
}

impl StageSpans {
    /// The spans of `stage` of `pipeline`, which reads `topics` and whose
    /// plugin's sha256 is `plugin` (None for a sink).
    pub fn new(pipeline: &str, stage: &str, topics: &[String], plugin: Option<&str>) -> StageSpans {
        let Some(tracer) = enabled().then(tracer).flatten() else {
            return StageSpans::default();
        };
        let mut attributes = vec![
            KeyValue::new("sluice.pipeline", shared(pipeline)),
            KeyValue::new("sluice.stage", shared(stage)),
            KeyValue::new("messaging.system", "sluice"),
            KeyValue::new("messaging.operation.type", "process"),
        ];
        if let Some(plugin) = plugin {
            attributes.push(KeyValue::new("sluice.plugin.sha256", shared(plugin)));
        }
        let name = format!("process {pipeline}/{stage}");
        StageSpans {
            tracer: Some(tracer),
            name: intern(&name).map_or(Cow::Owned(name), Cow::Borrowed),
            attributes,
            topics: topics
                .iter()
                .map(|topic| (topic.clone(), shared(topic)))
                .collect(),
        }
    }

    /// The attributes of one span: the stage's, then room for `more`.
    fn attributes(&self, more: usize) -> Vec<KeyValue> {
        let mut attributes = Vec::with_capacity(self.attributes.len() + more);
        attributes.extend_from_slice(&self.attributes);
        attributes
    }

    /// `topic` as an attribute value: the stage's own, shared, or a copy.
    fn topic(&self, topic: &str) -> Value {
        self.topics
            .iter()
            .find(|(name, _)| name == topic)
            .map_or_else(|| Value::from(topic.to_owned()), |(_, value)| value.clone())
    }

    /// The tracer, while export is on.
    fn tracer(&self) -> Option<&SdkTracer> {
        self.tracer.as_ref().filter(|_| enabled())
    }
}

/// The trace context headers of an attempt, worked out once when its span
/// starts: the attempt's outputs, its dead letter and its handler's view
/// each take a copy.
struct ContextHeaders(Vec<(String, String)>);

/// A stage attempt's or a batch call's span: an OpenTelemetry span made
/// with the SDK's tracer directly (not through a `tracing` span and the
/// bridge layer, which cost several times as much per message), in the
/// context it runs in. Inert when export is off. The span ends when the
/// last clone is dropped.
#[derive(Clone, Default)]
pub struct Span(Option<Context>);

impl Span {
    /// The inert span: export is off.
    pub fn none() -> Span {
        Span(None)
    }

    /// Whether this is the inert span.
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }

    /// `future` with this span current while it is polled, so that
    /// [`current`], [`reparent`] and [`outcome`] inside it see the attempt;
    /// `future` itself when the span is inert. The future holds the span:
    /// when it is the last holder, the span ends as the future is dropped.
    pub fn scope<F: Future>(self, future: F) -> Either<WithContext<F>, F> {
        match self.0 {
            Some(cx) => Either::Left(future.with_context(cx)),
            None => Either::Right(future),
        }
    }

    /// Records how the attempt ended, as [`outcome`] does for the current
    /// one.
    pub fn outcome(&self, outcome: &'static str, error: Option<&crate::Failure>) {
        if let Some(cx) = &self.0 {
            record(cx, outcome, error);
        }
    }
}

/// The tracer, once export is set up.
fn tracer() -> Option<SdkTracer> {
    TRACER
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// The span of one stage attempt (the `attempt`th, 1-based) of the
/// message `message_id` read from `topic`, a child of the message's trace
/// context (`headers`) when it has one; inert when export is off. Run the
/// attempt and its settle in its [`Span::scope`]: the settle reads it back
/// ([`current`]) to give the outputs their parent.
pub fn attempt_span(
    stage: &StageSpans,
    message_id: &str,
    topic: &str,
    attempt: u32,
    headers: &[(String, String)],
) -> Span {
    let Some(tracer) = stage.tracer() else {
        return Span::none();
    };
    let parent = parent(headers);
    let has_parent = parent.is_some();
    let parent = parent.unwrap_or_default();
    // Three here, and the outcome when it is known.
    let mut attributes = stage.attributes(4);
    attributes.extend([
        KeyValue::new("sluice.attempt", i64::from(attempt)),
        KeyValue::new("messaging.destination.name", stage.topic(topic)),
        KeyValue::new("messaging.message.id", message_id.to_owned()),
    ]);
    let span = tracer
        .span_builder(stage.name.clone())
        .with_kind(SpanKind::Consumer)
        .with_attributes(attributes)
        .start_with_context(tracer, &parent);
    if !span.is_recording() && has_parent {
        // Not sampled (by default because the producer did not sample):
        // nothing is recorded, and the message's own context goes on
        // unchanged, to the handler and the outputs, without the cost of
        // a context per attempt. A new trace that is not sampled still
        // gets one, so that the stages after this one follow the decision.
        return Span::none();
    }
    let sc = span.span_context();
    let mut context = Vec::with_capacity(2);
    context.push((TRACEPARENT.to_owned(), traceparent(sc)));
    let state = sc.trace_state().header();
    if !state.is_empty() {
        context.push((TRACESTATE.to_owned(), state));
    }
    Span(Some(
        parent.with_span(span).with_value(ContextHeaders(context)),
    ))
}

/// The span of one batch call: a new trace linked to each item's context
/// (`items`, their headers); inert when export is off. Hold it for the
/// call; it is not made current (the items' outputs go on in their own
/// traces).
pub fn batch_span<'h>(
    stage: &StageSpans,
    items: impl Iterator<Item = &'h [(String, String)]>,
) -> Span {
    let Some(tracer) = stage.tracer() else {
        return Span::none();
    };
    let mut count = 0_i64;
    let mut links = Vec::new();
    for headers in items {
        count += 1;
        if let Some(cx) = parent(headers) {
            links.push(Link::with_context(cx.span().span_context().clone()));
        }
    }
    let mut attributes = stage.attributes(1);
    attributes.push(KeyValue::new("messaging.batch.message_count", count));
    let span = tracer
        .span_builder(stage.name.clone())
        .with_kind(SpanKind::Consumer)
        .with_attributes(attributes)
        .with_links(links)
        .start_with_context(tracer, &Context::new());
    Span(Some(Context::new().with_span(span)))
}

/// Calls `f` with the current attempt's context as message headers
/// (`traceparent`, and `tracestate` when there is one), for its outputs
/// and dead-letter copy; with None when export is off or no attempt is
/// current. Borrowed: each output copies what it keeps.
pub fn with_current<R>(f: impl FnOnce(Option<&[(String, String)]>) -> R) -> R {
    if !enabled() {
        return f(None);
    }
    Context::map_current(|cx| {
        f(cx.get::<ContextHeaders>()
            .map(|headers| headers.0.as_slice()))
    })
}

/// Replaces the trace context in `headers` with the current attempt's (no
/// change when there is none): the handler then sees, and passes on, its
/// own attempt as the parent.
pub fn reparent(headers: &mut Vec<(String, String)>) {
    with_current(|context| {
        if let Some(context) = context {
            headers.retain(|(n, _)| {
                !n.eq_ignore_ascii_case(TRACEPARENT) && !n.eq_ignore_ascii_case(TRACESTATE)
            });
            headers.extend_from_slice(context);
        }
    });
}

/// A span for one outbound HTTP request of the current attempt, its
/// child, with the `traceparent` the request carries; None when export is
/// off or no attempt is current (then the request carries the attempt's
/// context as the handler passed it, if any).
pub fn http_client_span(method: &str, host: &str) -> Option<(ClientSpan, String)> {
    if !enabled() {
        return None;
    }
    let tracer = tracer()?;
    let parent = Context::current();
    if !parent.has_active_span() {
        return None;
    }
    let span = tracer
        .span_builder(method.to_owned())
        .with_kind(SpanKind::Client)
        .with_attributes([
            KeyValue::new("http.request.method", method.to_owned()),
            KeyValue::new("server.address", host.to_owned()),
        ])
        .start_with_context(&tracer, &parent);
    let header = traceparent(span.span_context());
    Some((ClientSpan(parent.with_span(span)), header))
}

/// An outbound request's span ([`http_client_span`]); it ends when dropped.
pub struct ClientSpan(Context);

impl ClientSpan {
    /// Records the answer's status, or why there was none.
    pub fn finish(&self, status: Option<u16>, error: Option<&str>) {
        let span = self.0.span();
        if let Some(status) = status {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if let Some(error) = error {
            span.set_status(Status::error(error.to_owned()));
        } else if status.is_some_and(|s| s >= 500) {
            span.set_status(Status::error(""));
        }
    }
}

impl Drop for ClientSpan {
    fn drop(&mut self) {
        self.0.span().end();
    }
}

/// Records how the current attempt ended (`ok`, `retry`, `dead-lettered`,
/// `held`, `duplicate`), and an error status for a failure.
pub fn outcome(outcome: &'static str, error: Option<&crate::Failure>) {
    if !enabled() {
        return;
    }
    Context::map_current(|cx| {
        if cx.has_active_span() {
            record(cx, outcome, error);
        }
    });
}

/// Sets the outcome attribute (and, for a failure, the error status) of
/// the span in `cx`.
fn record(cx: &Context, outcome: &'static str, error: Option<&crate::Failure>) {
    let span = cx.span();
    span.set_attribute(KeyValue::new("sluice.outcome", outcome));
    if let Some(failure) = error {
        let text: String = failure.message.chars().take(256).collect();
        span.set_status(Status::error(format!("{}: {text}", failure.kind)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_is_a_base_url_like_the_variable() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").expect("valid"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://otel.example/base/").expect("valid"),
            "https://otel.example/base/v1/traces"
        );
        for bad in ["127.0.0.1:4318", "grpc://x:4317", "", "http://"] {
            assert!(traces_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_endpoint_is_logged_without_its_secrets() {
        let shown = shown("https://user:hunter2@otel.example:4318/v1/traces?api_key=k");
        assert_eq!(shown, "https://otel.example:4318/v1/traces");
    }

    #[test]
    fn without_export_no_span_is_made() {
        let stage = StageSpans::new("p", "s", &["t".to_owned()], None);
        assert!(stage.tracer.is_none() && stage.attributes.is_empty());
        assert!(attempt_span(&stage, "m", "t", 1, &[]).is_none());
        assert!(batch_span(&stage, std::iter::empty()).is_none());
        assert!(with_current(|context| context.is_none()));
    }

    #[test]
    fn a_traceparent_is_written_as_the_w3c_form() {
        let context = SpanContext::new(
            TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736),
            SpanId::from(0x00f0_67aa_0ba9_02b7),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        assert_eq!(
            traceparent(&context),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        let unsampled = SpanContext::new(
            TraceId::from(1),
            SpanId::from(u64::MAX),
            TraceFlags::default(),
            false,
            TraceState::default(),
        );
        assert_eq!(
            traceparent(&unsampled),
            "00-00000000000000000000000000000001-ffffffffffffffff-00"
        );
    }

    #[test]
    fn interned_strings_are_kept_once() {
        let first = intern("pipeline-under-test").expect("room");
        let again = intern(&String::from("pipeline-under-test")).expect("room");
        assert!(std::ptr::eq(first, again));
    }

    #[test]
    fn the_parent_is_read_from_the_message_headers() {
        let headers = vec![(
            "traceparent".to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        )];
        let cx = parent(&headers).expect("valid");
        let sc = cx.span().span_context().clone();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
        assert!(parent(&[]).is_none());

        // The state comes along; flags other than sampled are zeroed; an
        // invalid state is left out, the parent kept.
        let mut with_state = vec![
            (
                "TraceParent".to_owned(),
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03".to_owned(),
            ),
            ("tracestate".to_owned(), "vendor=a,other=b".to_owned()),
        ];
        let sc = parent(&with_state)
            .expect("valid")
            .span()
            .span_context()
            .clone();
        assert_eq!(sc.trace_state().header(), "vendor=a,other=b");
        assert_eq!(sc.trace_flags(), TraceFlags::SAMPLED);
        with_state[1].1 = "not a state".to_owned();
        let sc = parent(&with_state)
            .expect("valid")
            .span()
            .span_context()
            .clone();
        assert_eq!(sc.trace_state().header(), "");

        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "garbage",
        ] {
            let headers = vec![("traceparent".to_owned(), bad.to_owned())];
            assert!(parent(&headers).is_none(), "{bad}");
        }
    }
}
