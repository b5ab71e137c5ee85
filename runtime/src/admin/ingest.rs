//! Ingest: producers publish into a pipeline over HTTP.
//!
//! `POST /v1/topics/{topic}/messages` takes the payload as the body, the key
//! in `Sluice-Key`, the message id in `Idempotency-Key` (so a retried POST
//! is stored once) and headers as `Sluice-Header-<Name>`; a W3C
//! `traceparent` (and `tracestate`) becomes the message's own, so the
//! trace goes on through the pipeline ([`crate::trace`]). `POST
//! /v1/topics/{topic}/batch` takes JSON lines, validates them all and then
//! publishes them as one broker batch, so a bad line publishes nothing.
//! Both answer 202 with what the broker stored, or 429 while the topic is
//! above its `high_water_mark`.
//!
//! Request bodies draw on one budget of bytes in flight across all
//! requests (`--admin-body-budget`); past it ingest answers 503 with
//! `Retry-After` rather than buffer without bound. While the daemon drains
//! (SIGTERM) ingest answers 503 too. Every answer is counted in
//! `sluice_ingest_responses_total{status}`.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{AdminState, ApiError, TopicEntry};
use crate::broker::{BrokerError, Message, PublishAck, check_portable, new_message_id, now_millis};
use crate::delay;
use crate::trace::{self, TRACEPARENT, TRACESTATE};

/// The longest message id accepted, in bytes. Ids key the broker's
/// duplicate window and travel in headers, so they stay short.
pub const MAX_ID_BYTES: usize = 256;
/// The most messages one batch request carries. Each line becomes a
/// message, a receipt and a broker record, several times its own size in
/// memory, and the topic's `high_water_mark` is checked once per batch: the
/// cap bounds both what one request holds and how far past the mark it
/// can go.
pub const MAX_BATCH_LINES: usize = 10_000;

/// Request header carrying the message key.
pub const KEY_HEADER: &str = "sluice-key";
/// Request header carrying the message id.
pub const ID_HEADER: &str = "idempotency-key";
/// Prefix of request headers that become message headers (lowercase, as
/// HTTP header names arrive). `Sluice-Delay` and `Sluice-Deliver-At`
/// delay the message ([`crate::delay`]).
pub const HEADER_PREFIX: &str = "sluice-header-";
/// Message headers with this prefix are the runtime's own (DLQ provenance,
/// redrive targeting); producers may set them only on dead-letter topics.
const RESERVED_PREFIX: &str = "sluice-";

/// What ingest stored for one message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PublishReceipt {
    /// The message id: the `Idempotency-Key`, or a fresh UUIDv7.
    pub id: String,
    /// The topic.
    pub topic: String,
    /// Its sequence in the topic (the original one for a duplicate).
    pub seq: u64,
    /// True when the id was already published, so nothing new was stored.
    pub duplicate: bool,
    /// When a delayed message is due (RFC 3339); its `seq` is 0 until then,
    /// when it enters the topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<String>,
}

/// What ingest stored for a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BatchReceipt {
    /// The topic.
    pub topic: String,
    /// Messages newly stored.
    pub published: u64,
    /// Messages whose id was already published.
    pub duplicates: u64,
    /// One receipt per line, in order.
    pub messages: Vec<PublishReceipt>,
}

/// One line of a batch: `{"payload": "text"}` or `{"payload_base64": ".."}`,
/// with optional `key`, `headers` and `id`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchLine {
    /// The payload as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The payload as standard base64, for bytes that are not text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    /// The message key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Message headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<BatchHeaders>,
    /// The message id (the idempotency key); a fresh one when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Deliver after this long (`90s`, `2h`), as `Sluice-Delay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// Deliver at this time (RFC 3339), as `Sluice-Deliver-At`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<String>,
}

/// Headers of a batch line: a map, or the `[[name, value], ...]` list that
/// `tail` prints (which keeps order and repeated names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum BatchHeaders {
    /// `{"name": "value"}`.
    Map(BTreeMap<String, String>),
    /// `[["name", "value"], ...]`.
    Pairs(Vec<(String, String)>),
}

impl BatchHeaders {
    fn into_pairs(self) -> Vec<(String, String)> {
        match self {
            BatchHeaders::Map(map) => map.into_iter().collect(),
            BatchHeaders::Pairs(pairs) => pairs,
        }
    }
}

/// Checks a message id: not empty, at most [`MAX_ID_BYTES`], no control
/// characters (ids end up in headers and logs).
///
/// # Errors
///
/// What is wrong with it, for the client.
pub fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("the message id (Idempotency-Key) is empty".into());
    }
    if id.len() > MAX_ID_BYTES {
        return Err(format!(
            "the message id (Idempotency-Key) is {} bytes; the limit is {MAX_ID_BYTES}",
            id.len()
        ));
    }
    if id.chars().any(char::is_control) {
        return Err("the message id (Idempotency-Key) contains control characters".into());
    }
    Ok(())
}

/// Counts an ingest answer by its status.
fn counted<T: IntoResponse>(state: &AdminState, result: Result<T, ApiError>) -> Response {
    let response = result.into_response();
    state
        .metrics()
        .count_ingest_response(response.status().as_u16());
    response
}

/// `POST /v1/topics/{topic}/messages`.
#[utoipa::path(post, path = "/v1/topics/{topic}/messages", operation_id = "publish", tag = "ingest",
    params(
        ("topic" = String, Path, description = "A topic a loaded pipeline declares."),
        ("Idempotency-Key" = Option<String>, Header, max_length = 256,
            description = "The message id: a retried request with the same one is stored once \
                (default: a fresh UUIDv7)."),
        ("Sluice-Key" = Option<String>, Header, description = "The message key."),
        ("Sluice-Delay" = Option<String>, Header,
            description = "Deliver after this long: `90s`, `2h`, `3d` (at most 365 days)."),
        ("Sluice-Deliver-At" = Option<String>, Header,
            description = "Deliver at this time (RFC 3339)."),
        ("traceparent" = Option<String>, Header,
            description = "W3C Trace Context: kept as the message header `traceparent` when \
                well formed (else ignored, and the trace restarts), and carried on to the \
                outputs, dead letters and sinks."),
        ("tracestate" = Option<String>, Header,
            description = "W3C Trace Context: kept as the message header `tracestate` beside a \
                valid `traceparent`."),
    ),
    request_body(description = "The payload: any bytes, stored as sent (not empty). Request \
        headers `Sluice-Header-<Name>: value` become message headers.",
        content(
            (Vec<u8> = "application/octet-stream"),
            (String = "text/plain"),
            (serde_json::Value = "application/json"),
        )),
    responses(
        (status = 202, description = "Stored (or, for a repeated id, stored already).",
            body = PublishReceipt),
        (status = 400, description = "Empty body, a bad header, or a reserved header name.",
            body = super::ErrorBody),
        (status = 404, description = "No loaded pipeline declares this topic.",
            body = super::ErrorBody),
        (status = 408, description = "The body stopped arriving.", body = super::ErrorBody),
        (status = 413, description = "Larger than the topic's limit.", body = super::ErrorBody),
        (status = 429, description = "The topic is over its `high_water_mark`: retry later.",
            body = super::ErrorBody, headers(("Retry-After" = u32))),
        (status = 503, description = "The daemon is draining, the budget of request bodies in \
            flight is spent, or the broker cannot take it now.", body = super::ErrorBody,
            headers(("Retry-After" = u32))),
    ))]
pub(super) async fn publish_one(
    State(state): State<AdminState>,
    topic: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let result = publish_one_inner(&state, topic, headers, body).await;
    counted(&state, result)
}

async fn publish_one_inner(
    state: &AdminState,
    topic: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<(StatusCode, Json<PublishReceipt>), ApiError> {
    let state = state.clone();
    if state.is_draining() {
        return Err(ApiError::Draining);
    }
    let Path(topic) = topic?;
    let entry = state.topic(&topic).await?;
    // Held until the message is published: its bytes count against the
    // budget of bodies in flight until then.
    let (body, _budget) = read_payload(&state, &topic, &entry, body).await?;
    if body.is_empty() {
        return Err(ApiError::BadRequest(
            "the request body is empty; it is the message payload".into(),
        ));
    }
    let message = message_from_headers(&topic, &entry, &headers, body)?;
    check_backpressure(&state, &topic, &entry).await?;
    // Keep no reference to the payload past the publish: a consumer may
    // already be handling (and holding) it before this request returns.
    let published = Message {
        payload: Bytes::new(),
        ..message.clone()
    };
    let acks = state.broker().publish(vec![message]).await?;
    let receipts = receipts(&state, &topic, &[published], &acks)?;
    let receipt = receipts
        .into_iter()
        .next()
        .ok_or_else(|| missing_ack(&topic))?;
    Ok((StatusCode::ACCEPTED, Json(receipt)))
}

/// Reads a single message's body up to the topic's limit: its claim
/// check's `max_payload`, else the admin body limit. A larger body is
/// refused with 413 before it is read (by its Content-Length) or as soon
/// as it passes the limit.
async fn read_payload(
    state: &AdminState,
    topic: &str,
    entry: &TopicEntry,
    body: axum::body::Body,
) -> Result<(Bytes, Budget), ApiError> {
    let limit = entry.max_payload.map_or(state.body_limit, |max| {
        usize::try_from(max).unwrap_or(usize::MAX)
    });
    let too_large = || match entry.max_payload {
        Some(max) => ApiError::Broker(BrokerError::PayloadTooLarge(format!(
            "the payload is larger than the `max_payload` of topic `{topic}` ({max} bytes)"
        ))),
        None => ApiError::PayloadTooLarge(limit),
    };
    read_body(state, body, limit, too_large).await
}

/// Bytes of request bodies this request holds from the shared budget;
/// given back when dropped.
#[derive(Debug, Default)]
pub(super) struct Budget(Option<tokio::sync::OwnedSemaphorePermit>);

impl Budget {
    /// Takes `bytes` more from the budget, or says the daemon is busy.
    fn take(&mut self, state: &AdminState, bytes: usize) -> Result<(), ApiError> {
        if bytes == 0 {
            return Ok(());
        }
        let budget = state.limits.body_budget;
        let busy = || ApiError::Busy { limit: budget };
        let held = self.0.as_ref().map_or(0, |p| p.num_permits());
        if held.saturating_add(bytes) > budget {
            // Could never fit, however long the client waits.
            return Err(ApiError::PayloadTooLarge(budget));
        }
        let n = u32::try_from(bytes).map_err(|_| busy())?;
        let permit = state
            .budget
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| busy())?;
        match &mut self.0 {
            Some(held) => held.merge(permit),
            None => self.0 = Some(permit),
        }
        Ok(())
    }
}

/// Reads a request body of at most `limit` bytes into one buffer, drawing
/// its size from the budget of bodies in flight: the announced length up
/// front (refused at once when it does not fit), else chunk by chunk.
async fn read_body(
    state: &AdminState,
    body: axum::body::Body,
    limit: usize,
    too_large: impl Fn() -> ApiError,
) -> Result<(Bytes, Budget), ApiError> {
    use http_body_util::BodyExt;
    let mut budget = Budget::default();
    let hint = http_body::Body::size_hint(&body);
    if usize::try_from(hint.lower()).map_or(true, |lower| lower > limit) {
        return Err(too_large());
    }
    // One buffer of the announced size, each chunk copied in and freed: a
    // large payload costs its size once, not chunks + a collected copy.
    let expected = hint.exact().and_then(|n| usize::try_from(n).ok());
    let reserved = expected.unwrap_or(0).min(limit);
    let mut body = body;
    if let Err(busy) = budget.take(state, reserved) {
        return Err(refuse_busy(busy, body, limit).await);
    }
    let mut buf = bytes::BytesMut::with_capacity(reserved);
    loop {
        // A client that goes quiet mid-body would hold its share of the
        // budget (and its connection) for as long as it likes.
        let idle = state.limits.body_idle;
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(_) => return Err(ApiError::SlowBody(idle)),
        };
        let frame = frame
            .map_err(|e| ApiError::BadRequest(format!("cannot read the request body: {e}")))?;
        if let Ok(chunk) = frame.into_data() {
            if buf.len() + chunk.len() > limit {
                return Err(too_large());
            }
            let beyond = (buf.len() + chunk.len()).saturating_sub(reserved.max(buf.len()));
            if let Err(busy) = budget.take(state, beyond) {
                // Give back what this request held before waiting on it.
                drop((buf, budget));
                return Err(refuse_busy(busy, body, limit).await);
            }
            buf.extend_from_slice(&chunk);
        }
    }
    Ok((buf.freeze(), budget))
}

/// How long a refused request's body is read and dropped, at most.
const DISCARD_FOR: std::time::Duration = std::time::Duration::from_secs(2);

/// Answers a request that found the budget full (`busy`, or 413 when it
/// could never fit), after reading and dropping the rest of its body: a
/// client still sending would otherwise see the connection reset under
/// it instead of the 503 and its `Retry-After`. The bytes are not kept,
/// so this costs no memory; `limit` and [`DISCARD_FOR`] bound the rest.
async fn refuse_busy(error: ApiError, mut body: axum::body::Body, limit: usize) -> ApiError {
    use http_body_util::BodyExt;
    if !matches!(error, ApiError::Busy { .. }) {
        return error;
    }
    let drain = async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, Bytes::len);
            if seen > limit {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DISCARD_FOR, drain).await;
    error
}

/// `POST /v1/topics/{topic}/batch`.
#[utoipa::path(post, path = "/v1/topics/{topic}/batch", operation_id = "publish_batch", tag = "ingest",
    params(("topic" = String, Path, description = "A topic a loaded pipeline declares.")),
    request_body(description = "JSON lines: each item of the array is one line, a `BatchLine` \
        (at most 10,000). Every line is checked first: one bad line publishes nothing.",
        content(
            (Vec<BatchLine> = "application/x-ndjson"),
            (Vec<BatchLine> = "application/jsonl"),
        )),
    responses(
        (status = 202, description = "Every line stored, as one broker batch.",
            body = BatchReceipt),
        (status = 400, description = "A line is not a valid `BatchLine` (the error names it), \
            or there are too many lines.", body = super::ErrorBody),
        (status = 404, description = "No loaded pipeline declares this topic.",
            body = super::ErrorBody),
        (status = 408, description = "The body stopped arriving.", body = super::ErrorBody),
        (status = 413, description = "Larger than the body limit.", body = super::ErrorBody),
        (status = 415, description = "Not `application/x-ndjson` or `application/jsonl`.",
            body = super::ErrorBody),
        (status = 429, description = "The topic is over its `high_water_mark`: retry later.",
            body = super::ErrorBody, headers(("Retry-After" = u32))),
        (status = 503, description = "The daemon is draining, the budget of request bodies in \
            flight is spent, or the broker cannot take it now.", body = super::ErrorBody,
            headers(("Retry-After" = u32))),
    ))]
pub(super) async fn publish_batch(
    State(state): State<AdminState>,
    topic: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let result = publish_batch_inner(&state, topic, headers, body).await;
    counted(&state, result)
}

async fn publish_batch_inner(
    state: &AdminState,
    topic: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<(StatusCode, Json<BatchReceipt>), ApiError> {
    let state = state.clone();
    if state.is_draining() {
        return Err(ApiError::Draining);
    }
    let Path(topic) = topic?;
    let entry = state.topic(&topic).await?;
    check_batch_content_type(&headers)?;
    let limit = state.request_limit();
    let (body, _budget) =
        read_body(&state, body, limit, || ApiError::PayloadTooLarge(limit)).await?;
    let lines = parse_batch_body(&body)?;
    let receipt = publish_numbered(&state, &topic, &entry, lines).await?;
    Ok((StatusCode::ACCEPTED, Json(receipt)))
}

/// The JSON lines of a batch body, each with its line number; blank lines
/// are skipped.
fn parse_batch_body(body: &[u8]) -> Result<Vec<(usize, BatchLine)>, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::BadRequest("the batch body is not UTF-8 text".into()))?;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if lines.len() == MAX_BATCH_LINES {
            return Err(ApiError::BadRequest(format!(
                "a batch carries at most {MAX_BATCH_LINES} messages; split it into several requests"
            )));
        }
        let parsed: BatchLine = serde_json::from_str(line)
            .map_err(|e| ApiError::BadRequest(format!("line {}: {e}", index + 1)))?;
        lines.push((index + 1, parsed));
    }
    Ok(lines)
}

/// A batch body turned into messages for `topic` as ingest does before it
/// publishes (a dead-letter topic when `is_dlq`): for the fuzz targets.
#[cfg(feature = "fuzz")]
pub(crate) fn batch_messages(body: &[u8], is_dlq: bool) -> Result<Vec<Message>, String> {
    let entry = TopicEntry {
        high_water_mark: None,
        subscribers: Vec::new(),
        is_dlq,
        max_payload: None,
    };
    let lines = parse_batch_body(body).map_err(|e| e.to_string())?;
    lines
        .into_iter()
        .map(|(number, line)| {
            message_from_line("t", &entry, line).map_err(|e| format!("line {number}: {e}"))
        })
        .collect()
}

impl AdminState {
    /// Publishes `lines` to `topic` as one broker batch, after checking them
    /// all (a bad line publishes nothing) and the topic's
    /// `high_water_mark`: what `POST /v1/topics/{topic}/batch` does with its
    /// JSON lines. A problem with the N-th line says `line N`.
    ///
    /// # Errors
    ///
    /// The topic is not accepted here, a line is invalid, the topic is full
    /// ([`ApiError::Backpressure`]), or the broker failed.
    pub async fn publish_lines(
        &self,
        topic: &str,
        lines: Vec<BatchLine>,
    ) -> Result<BatchReceipt, ApiError> {
        let entry = self.topic(topic).await?;
        let numbered = lines.into_iter().enumerate().map(|(i, l)| (i + 1, l));
        publish_numbered(self, topic, &entry, numbered.collect()).await
    }
}

/// Checks and publishes a batch of `(line number, line)`.
async fn publish_numbered(
    state: &AdminState,
    topic: &str,
    entry: &TopicEntry,
    lines: Vec<(usize, BatchLine)>,
) -> Result<BatchReceipt, ApiError> {
    if lines.len() > MAX_BATCH_LINES {
        return Err(ApiError::BadRequest(format!(
            "a batch carries at most {MAX_BATCH_LINES} messages; split it into several requests"
        )));
    }
    let mut messages = Vec::with_capacity(lines.len());
    for (number, line) in lines {
        let message = message_from_line(topic, entry, line)
            .map_err(|e| ApiError::BadRequest(format!("line {number}: {e}")))?;
        messages.push(message);
    }
    if messages.is_empty() {
        return Err(ApiError::BadRequest(
            "the batch has no messages; send one JSON object per line".into(),
        ));
    }
    check_backpressure(state, topic, entry).await?;
    let acks = state.broker().publish(messages.clone()).await?;
    let messages = receipts(state, topic, &messages, &acks)?;
    let duplicates = messages.iter().filter(|r| r.duplicate).count() as u64;
    Ok(BatchReceipt {
        topic: topic.to_owned(),
        published: messages.len() as u64 - duplicates,
        duplicates,
        messages,
    })
}

/// Pairs messages with their acks and counts the new ones.
fn receipts(
    state: &AdminState,
    topic: &str,
    messages: &[Message],
    acks: &[PublishAck],
) -> Result<Vec<PublishReceipt>, ApiError> {
    if acks.len() != messages.len() {
        return Err(missing_ack(topic));
    }
    let published = acks.iter().filter(|a| !a.duplicate).count() as u64;
    if published > 0 {
        state.metrics().count_published(topic, published);
    }
    Ok(messages
        .iter()
        .zip(acks)
        .map(|(m, ack)| PublishReceipt {
            id: m.id.clone(),
            topic: topic.to_owned(),
            seq: ack.seq,
            duplicate: ack.duplicate,
            // Pinned to an absolute time before the publish ([`delay::pin`]).
            deliver_at: m.header(delay::DELIVER_AT_HEADER).map(str::to_owned),
        })
        .collect())
}

fn missing_ack(topic: &str) -> ApiError {
    ApiError::Broker(BrokerError::Storage(format!(
        "the broker did not acknowledge every message published to `{topic}`"
    )))
}

/// Answers 429 while the topic, or its slowest subscriber, holds at least
/// `high_water_mark` messages. A fan-out topic counts its slowest stage:
/// the stored depth alone can hide one stage falling far behind.
async fn check_backpressure(
    state: &AdminState,
    topic: &str,
    entry: &TopicEntry,
) -> Result<(), ApiError> {
    let Some(limit) = entry.high_water_mark else {
        return Ok(());
    };
    let depth = crate::broker::backlog(state.broker().as_ref(), topic, &entry.subscribers).await?;
    if depth >= limit {
        return Err(ApiError::Backpressure {
            topic: topic.to_owned(),
            depth,
            limit,
        });
    }
    Ok(())
}

fn check_batch_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let value = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let essence = value
        .as_deref()
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    match essence.as_deref() {
        Some("application/x-ndjson" | "application/jsonl") => Ok(()),
        _ => Err(ApiError::UnsupportedMediaType(
            value.map_or_else(|| "(none)".to_owned(), |v| format!("`{v}`")),
        )),
    }
}

/// Builds the message of a single-message POST from its request headers.
fn message_from_headers(
    topic: &str,
    entry: &TopicEntry,
    headers: &HeaderMap,
    payload: Bytes,
) -> Result<Message, ApiError> {
    let text = |name: &str, value: &header::HeaderValue| {
        std::str::from_utf8(value.as_bytes())
            .map(str::to_owned)
            .map_err(|_| ApiError::BadRequest(format!("header {name} is not UTF-8 text")))
    };
    let id = match headers.get(ID_HEADER) {
        Some(value) => {
            let id = text("Idempotency-Key", value)?;
            check_id(&id).map_err(ApiError::BadRequest)?;
            id
        }
        None => new_message_id(),
    };
    let key = headers
        .get(KEY_HEADER)
        .map(|v| text("Sluice-Key", v))
        .transpose()?;
    let mut message_headers = Vec::new();
    for (name, value) in headers {
        // `http` lowercases header names.
        if let Some(short) = name.as_str().strip_prefix(HEADER_PREFIX) {
            if short.is_empty() {
                return Err(ApiError::BadRequest(
                    "a Sluice-Header- request header needs a name after the prefix".into(),
                ));
            }
            message_headers.push((short.to_owned(), text(name.as_str(), value)?));
        }
    }
    check_reserved(entry, &message_headers).map_err(ApiError::BadRequest)?;
    for name in [delay::DELAY_HEADER, delay::DELIVER_AT_HEADER] {
        if let Some(value) = headers.get(name) {
            message_headers.push((name.to_owned(), text(name, value)?));
        }
    }
    trace_from_request(headers, &mut message_headers);
    check_portable(key.as_deref(), &message_headers)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let mut message = Message {
        id,
        topic: topic.to_owned(),
        key,
        headers: message_headers,
        payload,
        published_at: 0,
    };
    delay::pin(&mut message.headers, now_millis()).map_err(ApiError::BadRequest)?;
    Ok(message)
}

/// Takes the request's W3C `traceparent` and `tracestate` into the message
/// headers. When the request has a `traceparent`, it replaces any the
/// producer also sent as `Sluice-Header-Traceparent` (the standard header
/// is what tracing libraries set); then [`trace::sanitize`] keeps the
/// context only if it is valid. A value that is not text is invalid too:
/// a trace never makes a request fail.
fn trace_from_request(headers: &HeaderMap, message_headers: &mut Vec<(String, String)>) {
    let parents = headers.get_all(TRACEPARENT);
    if parents.iter().next().is_some() {
        message_headers.retain(|(name, _)| {
            !name.eq_ignore_ascii_case(TRACEPARENT) && !name.eq_ignore_ascii_case(TRACESTATE)
        });
        for value in parents {
            let value = value.to_str().unwrap_or_default();
            message_headers.push((TRACEPARENT.to_owned(), value.to_owned()));
        }
        for value in headers.get_all(TRACESTATE) {
            if let Ok(value) = value.to_str() {
                message_headers.push((TRACESTATE.to_owned(), value.to_owned()));
            }
        }
    }
    trace::sanitize(message_headers);
}

/// Builds a message from one batch line.
fn message_from_line(topic: &str, entry: &TopicEntry, line: BatchLine) -> Result<Message, String> {
    let payload: Bytes = match (line.payload, line.payload_base64) {
        (Some(text), None) => text.into_bytes().into(),
        (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
            .decode(encoded.as_bytes())
            .map_err(|e| format!("payload_base64 is not base64: {e}"))?
            .into(),
        (Some(_), Some(_)) => return Err("give payload or payload_base64, not both".into()),
        (None, None) => return Err("missing payload (or payload_base64)".into()),
    };
    if payload.is_empty() {
        return Err("the payload is empty".into());
    }
    let id = match line.id {
        Some(id) => {
            check_id(&id)?;
            id
        }
        None => new_message_id(),
    };
    let mut headers = line
        .headers
        .map(BatchHeaders::into_pairs)
        .unwrap_or_default();
    check_reserved(entry, &headers)?;
    // Like the single endpoint's: an invalid context is dropped, not refused.
    trace::sanitize(&mut headers);
    if let Some(value) = line.delay {
        headers.push((delay::DELAY_HEADER.to_owned(), value));
    }
    if let Some(value) = line.deliver_at {
        headers.push((delay::DELIVER_AT_HEADER.to_owned(), value));
    }
    check_portable(line.key.as_deref(), &headers).map_err(|e| e.to_string())?;
    let mut message = Message {
        id,
        topic: topic.to_owned(),
        key: line.key,
        headers,
        payload,
        published_at: 0,
    };
    delay::pin(&mut message.headers, now_millis())?;
    Ok(message)
}

/// Producers may not set the runtime's own headers, except on a dead-letter
/// topic (importing DLQ entries): a forged `sluice-dlq-source-topic` or
/// `sluice-redrive-to` on a normal topic would steer redrives and fan-out.
fn check_reserved(entry: &TopicEntry, headers: &[(String, String)]) -> Result<(), String> {
    if entry.is_dlq {
        return Ok(());
    }
    match headers
        .iter()
        .find(|(n, _)| n.to_ascii_lowercase().starts_with(RESERVED_PREFIX))
    {
        Some((name, _)) => Err(format!(
            "header `{name}` is reserved: names starting with `{RESERVED_PREFIX}` belong to the runtime"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_bounded_and_printable() {
        assert!(check_id("order-42").is_ok());
        assert!(check_id("").is_err());
        assert!(check_id(&"x".repeat(MAX_ID_BYTES)).is_ok());
        assert!(check_id(&"x".repeat(MAX_ID_BYTES + 1)).is_err());
        assert!(check_id("a\nb").is_err());
        assert!(check_id("a\u{7f}b").is_err());
    }

    #[test]
    fn batch_lines_take_text_or_base64_and_both_header_forms() {
        let entry = TopicEntry::default();
        let line: BatchLine =
            serde_json::from_str(r#"{"payload_base64":"AAE=","headers":[["a","1"],["a","2"]]}"#)
                .expect("parses");
        let m = message_from_line("t", &entry, line).expect("valid");
        assert_eq!(&m.payload[..], &[0, 1]);
        assert_eq!(m.headers.len(), 2);
        let line: BatchLine =
            serde_json::from_str(r#"{"payload":"hi","headers":{"b":"2"},"id":"x"}"#)
                .expect("parses");
        let m = message_from_line("t", &entry, line).expect("valid");
        assert_eq!((m.id.as_str(), &m.payload[..]), ("x", &b"hi"[..]));
        assert!(serde_json::from_str::<BatchLine>(r#"{"paylod":"x"}"#).is_err());
        let both = BatchLine {
            payload: Some("a".into()),
            payload_base64: Some("YQ==".into()),
            ..BatchLine::default()
        };
        assert!(message_from_line("t", &entry, both).is_err());
    }

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn request(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                *name,
                header::HeaderValue::from_str(value).expect("a header value"),
            );
        }
        map
    }

    #[test]
    fn a_valid_traceparent_becomes_a_message_header_and_an_invalid_one_is_ignored() {
        let entry = TopicEntry::default();
        let build = |pairs: &[(&'static str, &str)]| {
            message_from_headers("t", &entry, &request(pairs), Bytes::from_static(b"x"))
                .expect("accepted")
                .headers
        };
        let pair = |n: &str, v: &str| (n.to_owned(), v.to_owned());
        let kept = build(&[("traceparent", TP), ("tracestate", "congo=t61rcWkgMzE")]);
        assert_eq!(
            kept,
            [pair(TRACEPARENT, TP), pair(TRACESTATE, "congo=t61rcWkgMzE")]
        );
        let ignored = build(&[("traceparent", "00-bad-01"), ("tracestate", "a=b")]);
        assert!(ignored.is_empty(), "{ignored:?}");
        // The standard header wins over a `Sluice-Header-` one.
        let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let both = build(&[("sluice-header-traceparent", other), ("traceparent", TP)]);
        assert_eq!(both, [pair(TRACEPARENT, TP)]);
        let only_prefixed = build(&[("sluice-header-traceparent", other)]);
        assert_eq!(only_prefixed, [pair(TRACEPARENT, other)]);
    }

    #[test]
    fn batch_lines_keep_a_valid_traceparent_and_drop_an_invalid_one() {
        let entry = TopicEntry::default();
        let line = |headers: &str| {
            let line: BatchLine =
                serde_json::from_str(&format!(r#"{{"payload":"x","headers":{headers}}}"#))
                    .expect("parses");
            message_from_line("t", &entry, line).expect("valid").headers
        };
        let kept = line(&format!(r#"{{"traceparent":"{TP}","a":"1"}}"#));
        assert_eq!(kept.len(), 2);
        assert_eq!(
            trace::trace_id(&kept).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        // Even one no broker could carry: dropped before the check.
        let dropped = line(r#"[["traceparent","00-x\ny"],["a","1"]]"#);
        assert_eq!(dropped, [("a".to_owned(), "1".to_owned())]);
    }

    #[test]
    fn runtime_headers_are_reserved_outside_dead_letter_topics() {
        let headers = vec![("Sluice-Redrive-To".to_owned(), "p/s".to_owned())];
        assert!(check_reserved(&TopicEntry::default(), &headers).is_err());
        let dlq = TopicEntry {
            is_dlq: true,
            ..TopicEntry::default()
        };
        assert!(check_reserved(&dlq, &headers).is_ok());
    }
}
