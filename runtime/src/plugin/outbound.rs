//! Outbound HTTP for handlers: the sender behind `wasi:http/outgoing-handler`.
//!
//! `wasmtime-wasi-http` turns the guest's request into an `http::Request`
//! and hands it to [`CallHooks::send_request`]; this module decides whether
//! it may leave and sends it with its own client:
//!
//! - only a host the stage's `http.allow` lists (port included) is
//!   reachable; `wasi:http` follows no redirects, so a redirect reaches the
//!   handler as a response, and its next request passes the same check;
//! - a name is resolved once, its addresses checked, and the connection
//!   made to an address that passed ([`GuardedResolver`]): a name that
//!   resolves to a loopback, private or link-local address is refused
//!   unless the stage sets `allow_private`, and DNS rebinding cannot slip
//!   past between the check and the connect. An IP address listed in
//!   `allow` is reachable as listed;
//! - every request counts against the stage's `timeout`: epoch ticks do
//!   not interrupt an awaited host call, so the send, and each read of the
//!   answer's body, is cut at the call's deadline (or the grant's shorter
//!   `timeout`);
//! - a `429` or `503` with `Retry-After` holds the stage's calls to that
//!   host until then: a call meanwhile fails at once;
//! - the host adds `Idempotency-Key: <message id>:<call index>` unless the
//!   handler set one (a redelivered message repeats its keys), and the
//!   grant's headers for the host (secrets put in, so the guest never holds
//!   them).
//!
//! A refused request is an error the handler sees, and a log line naming
//! the stage and the host; nothing leaves the machine.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use crate::config::AllowedHost;
use crate::metrics::{HttpLabels, Metrics};
use crate::otel::ClientSpan;

/// The largest request body a handler may send.
const MAX_REQUEST_BODY: usize = 16 << 20;

/// The largest response body read whole before the handler gets the
/// answer; a larger one (or one of unknown length) streams to it.
const SMALL_RESPONSE_BODY: u64 = 64 << 10;

/// The header that makes a repeated call recognisable to its server.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// A stage's outbound HTTP: its policy, its client and its holds. One per
/// stage, shared by its workers.
pub struct Outbound {
    stage: Arc<str>,
    /// The pipeline and the registry its requests are counted in.
    metrics: Option<(String, Arc<Metrics>)>,
    client: reqwest::Client,
    allow: Vec<AllowedHost>,
    /// The grant's `timeout`: no request takes longer, even with more of
    /// the call's time left.
    timeout: Option<Duration>,
    /// Headers put on each request to a host, by its `allow` entry.
    headers: Vec<(AllowedHost, Vec<(HeaderName, HeaderValue)>)>,
    /// Per `host:port`: no request before this (a `Retry-After`).
    holds: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for Outbound {
    /// The stage and its hosts: never a header (they may carry secrets).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("stage", &self.stage)
            .field("allow", &self.allow)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What a stage's `http:` grant says, parsed.
pub struct OutboundPolicy {
    /// The hosts it may call.
    pub allow: Vec<AllowedHost>,
    /// Whether a name may resolve to a private or loopback address.
    pub allow_private: bool,
    /// The longest one request may take.
    pub timeout: Option<Duration>,
    /// Headers added per host, values with their secrets in.
    pub headers: Vec<(AllowedHost, Vec<(String, String)>)>,
    /// The stage's pipeline and the daemon's metrics, to count requests in.
    pub metrics: Option<(String, Arc<Metrics>)>,
}

impl Outbound {
    /// The sender for `stage` under `policy`.
    ///
    /// # Errors
    ///
    /// A header the grant gives that HTTP cannot carry (validation refuses
    /// those first), or a client that cannot be built (no TLS set-up). The
    /// message never quotes a header's value.
    pub fn new(stage: &str, policy: OutboundPolicy) -> Result<Arc<Outbound>, String> {
        let mut headers = Vec::new();
        for (host, list) in policy.headers {
            let mut parsed = Vec::new();
            for (name, value) in list {
                let name = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("`{name}` is not an HTTP header name"))?;
                let mut value = HeaderValue::from_str(&value)
                    .map_err(|_| format!("header `{name}` has a value HTTP cannot carry"))?;
                value.set_sensitive(true);
                parsed.push((name, value));
            }
            headers.push((host, parsed));
        }
        let mut tls = crate::tls::client_config(None, None)?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let client = reqwest::Client::builder()
            // The handler sees a redirect and decides; its next request
            // is checked like any other.
            .redirect(reqwest::redirect::Policy::none())
            // Never through a proxy named by the environment: the check
            // is on the host the handler named.
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver {
                allow_private: policy.allow_private,
            }))
            .tls_backend_preconfigured(tls)
            .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot set up the HTTP client: {e}"))?;
        Ok(Arc::new(Outbound {
            stage: stage.into(),
            metrics: policy.metrics,
            client,
            allow: policy.allow,
            timeout: policy.timeout,
            headers,
            holds: Mutex::new(HashMap::new()),
        }))
    }

    /// Checks `request` against the policy and readies it for the client.
    fn prepare(
        &self,
        request: http::Request<WasiBody>,
        message_id: &str,
        index: u32,
    ) -> Result<Prepared, Error> {
        let uri = request.uri().clone();
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(Error::HttpProtocolError),
        };
        let host = uri
            .host()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let default_port = if https { 443 } else { 80 };
        let port = uri.port_u16().unwrap_or(default_port);
        let target = format!("{host}:{port}");
        let Some(listed) = self
            .allow
            .iter()
            .find(|a| a.matches(&host, port, default_port))
        else {
            self.count("", "refused");
            tracing::warn!(
                stage = %self.stage,
                host = %target,
                "outbound request refused: the host is not in the stage's `http.allow`"
            );
            return Err(Error::HttpRequestDenied);
        };
        let label = listed.to_string();
        if let Some(until) = self.held_until(&target) {
            self.count(&label, "held");
            let left = until.saturating_duration_since(Instant::now());
            return Err(Error::InternalError(Some(format!(
                "calls to {target} are held for {} ms more: it answered with Retry-After",
                left.as_millis()
            ))));
        }
        let (mut parts, body) = request.into_parts();
        // The client writes the connection's own headers.
        parts.headers.remove(http::header::HOST);
        if !parts.headers.contains_key(IDEMPOTENCY_KEY) {
            let key = HeaderValue::from_str(&format!("{message_id}:{index}"))
                .map_err(|_| Error::InternalError(Some("message id is not header text".into())))?;
            parts.headers.insert(IDEMPOTENCY_KEY, key);
        }
        if let Some((_, headers)) = self
            .headers
            .iter()
            .find(|(a, _)| a.matches(&host, port, default_port))
        {
            for (name, value) in headers {
                parts.headers.insert(name.clone(), value.clone());
            }
        }
        let url =
            reqwest::Url::parse(&uri.to_string()).map_err(|_| Error::HttpRequestUriInvalid)?;
        let mut out = reqwest::Request::new(parts.method, url);
        *out.headers_mut() = parts.headers;
        Ok(Prepared {
            request: out,
            body,
            target,
            label,
        })
    }

    /// Counts one request to `host` (its `allow` entry) that ended as
    /// `status`.
    fn count(&self, host: &str, status: &str) {
        if let Some((pipeline, metrics)) = &self.metrics {
            metrics
                .http_requests
                .get_or_create(&HttpLabels {
                    pipeline: pipeline.clone(),
                    stage: self.stage.to_string(),
                    host: host.to_owned(),
                    status: status.to_owned(),
                })
                .inc();
        }
    }

    /// Records how long a request to `host` took to be answered.
    fn observe(&self, host: &str, took: Duration) {
        if let Some((pipeline, metrics)) = &self.metrics {
            metrics.observe_http(pipeline, &self.stage, host, took.as_secs_f64());
        }
    }

    /// The hosts it may call, as listed.
    pub fn allowed(&self) -> impl Iterator<Item = &AllowedHost> {
        self.allow.iter()
    }

    fn held_until(&self, target: &str) -> Option<Instant> {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        match holds.get(target) {
            Some(until) if *until > Instant::now() => Some(*until),
            Some(_) => {
                holds.remove(target);
                None
            }
            None => None,
        }
    }

    fn hold(&self, target: &str, wait: Duration) {
        let until = Instant::now() + wait;
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        let entry = holds.entry(target.to_owned()).or_insert(until);
        *entry = (*entry).max(until);
    }

    /// Sends `request` to `target`, all of it (the answer's body too) by
    /// `deadline`.
    async fn send(
        self: Arc<Self>,
        prepared: Prepared,
        span: Option<ClientSpan>,
        deadline: Instant,
    ) -> Result<http::Response<WasiBody>, Error> {
        let Prepared {
            mut request,
            body,
            target,
            label,
        } = prepared;
        let limited = http_body_util::Limited::new(body, MAX_REQUEST_BODY);
        match tokio::time::timeout_at(deadline.into(), limited.collect()).await {
            Ok(Ok(body)) => *request.body_mut() = Some(body.to_bytes().into()),
            Ok(Err(err)) => {
                self.count(&label, "failed");
                if err.is::<http_body_util::LengthLimitError>() {
                    return Err(Error::HttpRequestBodySize(Some(MAX_REQUEST_BODY as u64)));
                }
                return Err(Error::InternalError(Some(format!(
                    "reading the request's body: {err}"
                ))));
            }
            Err(_) => {
                // The handler did not finish its body by the deadline.
                self.count(&label, "timeout");
                return Err(Error::ConnectionWriteTimeout);
            }
        }
        let began = Instant::now();
        let method = request.method().clone();
        let sent = tokio::time::timeout_at(deadline.into(), self.client.execute(request)).await;
        let response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(err)) => {
                let error = self.failed(&target, &err);
                let status = if matches!(error, Error::DestinationIpProhibited) {
                    "refused"
                } else if err.is_timeout() {
                    "timeout"
                } else {
                    "failed"
                };
                self.count(&label, status);
                if let Some(span) = &span {
                    span.finish(None, Some(&error.to_string()));
                }
                return Err(error);
            }
            Err(_) => {
                self.count(&label, "timeout");
                if let Some(span) = &span {
                    span.finish(None, Some("cut at the call's deadline"));
                }
                tracing::warn!(
                    stage = %self.stage,
                    host = %target,
                    "outbound request cut at the call's deadline (the stage's `timeout`, or `http.timeout`)"
                );
                return Err(Error::HttpResponseTimeout);
            }
        };
        let status = response.status();
        self.observe(&label, began.elapsed());
        self.count(&label, &format!("{}xx", status.as_u16() / 100));
        if let Some(span) = &span {
            span.finish(Some(status.as_u16()), None);
        }
        drop(span);
        if matches!(status.as_u16(), 429 | 503)
            && let Some(wait) = crate::retry_after::wait(response.headers(), SystemTime::now())
            && !wait.is_zero()
        {
            tracing::warn!(
                stage = %self.stage,
                host = %target,
                status = status.as_u16(),
                hold_ms = wait.as_millis() as u64,
                "outbound calls to the host held: it answered with Retry-After"
            );
            self.hold(&target, wait);
        }
        tracing::debug!(
            stage = %self.stage,
            host = %target,
            %method,
            status = status.as_u16(),
            ms = began.elapsed().as_millis() as u64,
            "outbound request"
        );
        let (parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
        let body = if body
            .size_hint()
            .upper()
            .is_some_and(|n| n <= SMALL_RESPONSE_BODY)
        {
            // A small body is read here, in the task that waited for the
            // answer, and handed over whole: the handler's reads then find
            // it at once instead of each waiting for a frame (a hop between
            // tasks per wait), and the connection is back in the pool
            // before the handler reads.
            match tokio::time::timeout_at(deadline.into(), body.collect()).await {
                Ok(Ok(whole)) => whole.map_err(|never| match never {}).boxed_unsync(),
                Ok(Err(_)) => Broken(Some(Error::HttpResponseIncomplete)).boxed_unsync(),
                Err(_) => Broken(Some(Error::ConnectionReadTimeout)).boxed_unsync(),
            }
        } else {
            DeadlineBody {
                inner: body,
                deadline: Box::pin(tokio::time::sleep_until(deadline.into())),
            }
            .boxed_unsync()
        };
        Ok(http::Response::from_parts(parts, body))
    }

    /// The guest's error for a request the client could not complete,
    /// logged with the stage and the host.
    fn failed(&self, target: &str, err: &reqwest::Error) -> Error {
        let mut source = std::error::Error::source(err);
        while let Some(cause) = source {
            if let Some(refused) = cause.downcast_ref::<PrivateAddress>() {
                tracing::warn!(stage = %self.stage, host = %target, "outbound request refused: {refused}");
                return Error::DestinationIpProhibited;
            }
            source = cause.source();
        }
        tracing::warn!(stage = %self.stage, host = %target, error = %err, "outbound request failed");
        if err.is_timeout() {
            Error::ConnectionTimeout
        } else if err.is_connect() {
            Error::ConnectionRefused
        } else {
            Error::HttpProtocolError
        }
    }
}

/// A request that passed the checks, ready for the client.
struct Prepared {
    /// Without its body, which is read into memory first.
    request: reqwest::Request,
    /// What the handler writes, read whole before sending: the request
    /// then has a `Content-Length` (many servers refuse a chunked upload),
    /// and the handler's writes stay bounded by [`MAX_REQUEST_BODY`].
    body: WasiBody,
    /// `host:port`, for holds and logs.
    target: String,
    /// Its `allow` entry, for metrics.
    label: String,
}

/// Where a worker's requests go: out, through the stage's [`Outbound`], or
/// to a script of answers (`plugin test` cases, which need no server).
#[derive(Debug, Clone)]
pub enum HttpSender {
    /// The network, through the stage's policy.
    Live(Arc<Outbound>),
    /// Scripted exchanges: each request is answered by the first unused
    /// exchange that matches it.
    Script(Arc<Script>),
}

/// A request a script answers.
#[derive(Debug, Clone)]
pub struct ScriptedExchange {
    /// The method it must have, if given (`POST`).
    pub method: Option<String>,
    /// The URL it must have, exactly (`https://api.example.com/v1/charge`).
    pub url: String,
    /// The answer's status.
    pub status: u16,
    /// The answer's headers.
    pub headers: Vec<(String, String)>,
    /// The answer's body.
    pub body: Vec<u8>,
}

/// Scripted exchanges, and what the handler asked of them.
#[derive(Debug, Default)]
pub struct Script {
    exchanges: Vec<ScriptedExchange>,
    state: Mutex<ScriptState>,
}

#[derive(Debug, Default)]
struct ScriptState {
    used: Vec<bool>,
    /// Requests no exchange matched, as `METHOD URL`.
    unexpected: Vec<String>,
}

impl Script {
    /// A script of `exchanges`, none used yet.
    pub fn new(exchanges: Vec<ScriptedExchange>) -> Script {
        let used = vec![false; exchanges.len()];
        Script {
            exchanges,
            state: Mutex::new(ScriptState {
                used,
                unexpected: Vec::new(),
            }),
        }
    }

    /// Requests that no exchange matched, as `METHOD URL`.
    pub fn unexpected(&self) -> Vec<String> {
        self.lock().unexpected.clone()
    }

    /// Exchanges no request used, as `METHOD URL`.
    pub fn unused(&self) -> Vec<String> {
        let state = self.lock();
        self.exchanges
            .iter()
            .zip(&state.used)
            .filter(|(_, used)| !**used)
            .map(|(e, _)| format!("{} {}", e.method.as_deref().unwrap_or("ANY"), e.url))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ScriptState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer to `method url`, from the first unused exchange that
    /// matches it.
    fn answer(&self, method: &str, url: &str) -> Result<http::Response<WasiBody>, Error> {
        let mut state = self.lock();
        let found = self.exchanges.iter().enumerate().find(|(i, e)| {
            !state.used[*i]
                && e.url == url
                && e.method
                    .as_deref()
                    .is_none_or(|m| m.eq_ignore_ascii_case(method))
        });
        let Some((i, exchange)) = found else {
            state.unexpected.push(format!("{method} {url}"));
            return Err(Error::HttpRequestDenied);
        };
        state.used[i] = true;
        let mut response = http::Response::builder().status(exchange.status);
        for (name, value) in &exchange.headers {
            response = response.header(name, value);
        }
        response
            .body(
                http_body_util::Full::new(Bytes::from(exchange.body.clone()))
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .map_err(|e| Error::InternalError(Some(format!("a scripted answer: {e}"))))
    }
}

/// The hooks of one worker's store: where the stage's requests go (none if
/// the stage grants no `http:`), and the call under way.
#[derive(Default)]
pub struct CallHooks {
    outbound: Option<HttpSender>,
    /// The stage, as errors name it.
    stage: Arc<str>,
    /// The id of the message being handled (the first of a batch).
    message_id: String,
    /// Requests made so far in this call: the next one's index.
    calls: u32,
    /// When the call's time is up.
    deadline: Option<Instant>,
}

impl CallHooks {
    /// Hooks that send through `outbound`, or refuse every request of
    /// stage `stage` (naming it and the grant to add).
    pub fn new(outbound: Option<HttpSender>, stage: &str) -> Self {
        CallHooks {
            outbound,
            stage: stage.into(),
            ..CallHooks::default()
        }
    }

    /// A call begins for message `message_id` (a batch's first).
    pub fn begin(&mut self, message_id: &str) {
        message_id.clone_into(&mut self.message_id);
        self.calls = 0;
    }

    /// The guest's execution must end by `deadline`.
    pub fn arm(&mut self, deadline: Instant) {
        self.deadline = Some(deadline);
    }
}

type SendFuture = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), Error>> + Send>,
                ),
                Error,
            >,
        > + Send,
>;

impl WasiHttpHooks for CallHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> SendFuture {
        let outbound = match self.outbound.clone() {
            Some(HttpSender::Live(outbound)) => outbound,
            Some(HttpSender::Script(script)) => {
                let method = request.method().to_string();
                let url = request.uri().to_string();
                return Box::new(async move {
                    // Read what the handler sends, as a server would.
                    let _ = request.into_body().collect().await;
                    let response = script.answer(&method, &url)?;
                    let io: Box<dyn Future<Output = Result<(), Error>> + Send> =
                        Box::new(async { Ok(()) });
                    Ok((response, io))
                });
            }
            None => {
                // Only an engine that imports every capability gets here
                // (a component importing wasi:http on such a stage is
                // refused at load).
                tracing::warn!(stage = %self.stage, "outbound request refused: the stage does not grant http");
                let why = format!(
                    "stage `{}` does not grant http; add `http: {{allow: [HOST, ...]}}` to it, \
                     listing the hosts it calls",
                    self.stage
                );
                return Box::new(async { Err(Error::InternalError(Some(why))) });
            }
        };
        let index = self.calls;
        self.calls = self.calls.saturating_add(1);
        // The call's deadline, the grant's timeout and the guest's own
        // (connect, first byte): whichever comes first.
        let now = Instant::now();
        let mut deadline = self.deadline.unwrap_or(now + Duration::from_secs(30));
        let guest = options.and_then(|o| match (o.connect_timeout, o.first_byte_timeout) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        });
        for limit in [outbound.timeout, guest].into_iter().flatten() {
            deadline = deadline.min(now + limit);
        }
        let prepared = outbound.prepare(request, &self.message_id, index);
        // A child of the attempt's span, made here, where the attempt is
        // current; the request carries it as its `traceparent`.
        let span = match prepared {
            Ok(mut prepared) => {
                let span = crate::otel::http_client_span(
                    prepared.request.method().as_str(),
                    &prepared.target,
                );
                let span = span.and_then(|(span, header)| {
                    let value = HeaderValue::from_str(&header).ok()?;
                    prepared
                        .request
                        .headers_mut()
                        .insert(crate::trace::TRACEPARENT, value);
                    Some(span)
                });
                Ok((prepared, span))
            }
            Err(err) => Err(err),
        };
        Box::new(async move {
            let (prepared, span) = span?;
            let response = outbound.send(prepared, span, deadline).await?;
            let io: Box<dyn Future<Output = Result<(), Error>> + Send> = Box::new(async { Ok(()) });
            Ok((response, io))
        })
    }
}

/// A response body whose reading, done before the handler got the answer,
/// failed: the handler's first read gets the error, as it would have
/// reading the body itself.
struct Broken(Option<Error>);

impl Body for Broken {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        Poll::Ready(self.0.take().map(Err))
    }
}

/// A response body that ends in an error at the call's deadline: epoch
/// ticks do not interrupt a guest waiting on a read.
struct DeadlineBody {
    inner: reqwest::Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl Body for DeadlineBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Error::ConnectionReadTimeout)));
        }
        Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_err(|_| Error::HttpResponseIncomplete)
    }
}

/// Resolves a name and keeps only the addresses the stage may reach: the
/// client connects to those, never to a second lookup's answer.
struct GuardedResolver {
    allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let reachable: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| allow_private || !is_private(a.ip()))
                .collect();
            if reachable.is_empty() && !found.is_empty() {
                return Err(
                    Box::new(PrivateAddress { host }) as Box<dyn std::error::Error + Send + Sync>
                );
            }
            Ok(Box::new(reachable.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// A name that resolves only to addresses the stage may not reach.
#[derive(Debug)]
struct PrivateAddress {
    host: String,
}

impl std::fmt::Display for PrivateAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` resolves only to loopback, private or link-local addresses; list the address \
             itself under `http.allow`, or set `http.allow_private: true`",
            self.host
        )
    }
}

impl std::error::Error for PrivateAddress {}

/// Loopback, private, link-local, shared (CGNAT), unspecified, broadcast,
/// multicast and documentation addresses: none is a public service.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || (a == 100 && (64..128).contains(&b))
                || a == 0
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_private(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_private_and_public_ones_are_not() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_private(private.parse().expect("ip")), "{private}");
        }
        for public in ["1.1.1.1", "8.8.8.8", "2606:4700::1111", "::ffff:1.1.1.1"] {
            assert!(!is_private(public.parse().expect("ip")), "{public}");
        }
    }
}
