//! Reading topics without consuming them: what `sluice tail` and
//! dashboards use.
//!
//! `GET /v1/topics` lists every topic the API accepts with its stats,
//! `GET /v1/topics/{topic}` one of them (`tail` starts at its `last_seq + 1`),
//! and `GET /v1/topics/{topic}/messages?from=SEQ&max=N&wait_ms=M` reads up to
//! N stored messages from SEQ, long-polling up to M ms for the first one.
//! Reading never affects any stage's cursor.

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::{AdminState, ApiError};
use crate::broker::{Stored, TopicStats};

/// Messages returned per read unless `max` says otherwise.
const DEFAULT_MAX: usize = 100;
/// The most messages one read returns.
const MAX_MAX: usize = 1000;
/// The first broker read of a page: a few messages, whose size decides
/// how many the next reads take.
const FIRST_CHUNK: usize = 4;
/// The payload bytes a page stops at (it holds at least one message, and
/// may pass this by the last one).
const MAX_PAGE_BYTES: usize = 16 << 20;
/// The longest long-poll: shorter than common proxy idle timeouts, so a
/// follower sees an empty answer rather than a dropped connection.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// A stored message as the API shows it: the payload as text when it is
/// UTF-8, as base64 otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MessageView {
    /// Its position in the topic.
    pub seq: u64,
    /// The message id.
    pub id: String,
    /// The topic.
    pub topic: String,
    /// The key, if any.
    pub key: Option<String>,
    /// Headers in order, as `[name, value]` pairs.
    pub headers: Vec<(String, String)>,
    /// The payload, when it is UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The payload in standard base64, when it is not text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    /// When it was published, in ms since the Unix epoch.
    pub published_at: u64,
}

impl MessageView {
    /// The view of a stored message.
    pub fn of(stored: &Stored) -> Self {
        let m = &stored.message;
        let (payload, payload_base64) = payload_fields(&m.payload);
        MessageView {
            seq: stored.seq,
            id: m.id.clone(),
            topic: m.topic.clone(),
            key: m.key.clone(),
            headers: m.headers.clone(),
            payload,
            payload_base64,
            published_at: m.published_at,
        }
    }
}

/// A payload as the API's JSON carries it: `(Some(text), None)` for UTF-8
/// bytes, `(None, Some(base64))` otherwise, so text stays readable and any
/// bytes survive.
pub fn payload_fields(bytes: &[u8]) -> (Option<String>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (Some(text.to_owned()), None),
        Err(_) => (
            None,
            Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
        ),
    }
}

/// The answer to a read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReadResponse {
    /// The messages, oldest first.
    pub messages: Vec<MessageView>,
    /// The `from` of the next read, to continue where this one ended.
    pub next: u64,
    /// The sequence of the newest message ever published to the topic.
    pub last_seq: u64,
}

/// A topic and its contents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TopicView {
    /// The topic.
    pub topic: String,
    /// Messages stored.
    pub depth: u64,
    /// The oldest stored message's sequence (0 when empty).
    pub first_seq: u64,
    /// The newest published message's sequence (0 when none).
    pub last_seq: u64,
    /// Age of the oldest stored message, in seconds.
    pub oldest_age_seconds: Option<f64>,
    /// Its backpressure limit, if any.
    pub high_water_mark: Option<u64>,
    /// Whether it is a stage's dead-letter topic.
    pub dead_letter: bool,
    /// Messages waiting for their due time (not in `depth`).
    #[serde(default)]
    pub delayed: u64,
    /// When the next of them is due (RFC 3339), where the broker can tell
    /// cheaply (the embedded broker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_due: Option<String>,
}

impl TopicView {
    fn of(topic: &str, stats: TopicStats, high_water_mark: Option<u64>, dead_letter: bool) -> Self {
        TopicView {
            topic: topic.to_owned(),
            depth: stats.depth,
            first_seq: stats.first_seq,
            last_seq: stats.last_seq,
            oldest_age_seconds: stats.oldest_age.map(|d| d.as_secs_f64()),
            high_water_mark,
            dead_letter,
            delayed: stats.delayed,
            next_due: stats.next_due.map(crate::timestamp::format_rfc3339_millis),
        }
    }
}

/// The largest `from` taken: 2^53 - 1, the largest integer every JSON
/// client holds exactly, and more sequences than any topic will have.
const MAX_FROM: u64 = (1 << 53) - 1;

/// `?from=SEQ&max=N&wait_ms=M`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct ReadQuery {
    /// The first sequence to read (default: the oldest stored message).
    #[param(maximum = 9_007_199_254_740_991_u64)]
    from: Option<u64>,
    /// The most messages to return (default 100). A page also stops near
    /// 16 MiB of payload.
    #[param(minimum = 1, maximum = 1000)]
    max: Option<u64>,
    /// How long to wait for a first message when there is none yet, in
    /// ms (default 0). Only a read from the next sequence to be published
    /// (`last_seq + 1`) or earlier waits.
    #[param(maximum = 30000)]
    wait_ms: Option<u64>,
}

impl ReadQuery {
    /// `max` and `wait` checked against their ranges: a value out of range
    /// is refused, saying what is taken, rather than quietly cut.
    fn checked(&self) -> Result<(Option<usize>, Duration), ApiError> {
        if self.from.is_some_and(|from| from > MAX_FROM) {
            return Err(ApiError::BadRequest(format!(
                "from is beyond any sequence (at most {MAX_FROM})"
            )));
        }
        let max = match self.max {
            None => None,
            Some(max @ 1..=1000) => usize::try_from(max).ok(),
            Some(other) => {
                return Err(ApiError::BadRequest(format!(
                    "max is {other}; a read returns 1 to {MAX_MAX} messages"
                )));
            }
        };
        let wait = Duration::from_millis(self.wait_ms.unwrap_or(0));
        if wait > MAX_WAIT {
            return Err(ApiError::BadRequest(format!(
                "wait_ms is {}; a read waits at most {} ms",
                wait.as_millis(),
                MAX_WAIT.as_millis()
            )));
        }
        Ok((max, wait))
    }
}

/// The `{topic}` path parameter.
const TOPIC: &str = "A topic a loaded pipeline declares, or a dead-letter topic.";

/// `GET /v1/topics`.
#[utoipa::path(get, path = "/v1/topics", operation_id = "list_topics", tag = "topics", responses(
    (status = 200, description = "Every topic the API accepts, by name.", body = Vec<TopicView>),
    (status = 503, description = "The broker cannot answer now.", body = super::ErrorBody,
        headers(("Retry-After" = u32))),
))]
pub(super) async fn list(
    State(state): State<AdminState>,
) -> Result<Json<Vec<TopicView>>, ApiError> {
    let catalog = state.catalog();
    let mut names: Vec<&String> = catalog.topics.keys().collect();
    names.sort();
    let mut views = Vec::with_capacity(names.len());
    for name in names {
        views.push(state.topic_view(name).await?);
    }
    Ok(Json(views))
}

/// `GET /v1/topics/{topic}`.
#[utoipa::path(get, path = "/v1/topics/{topic}", operation_id = "get_topic", tag = "topics",
    params(("topic" = String, Path, description = TOPIC)),
    responses(
        (status = 200, description = "The topic's contents.", body = TopicView),
        (status = 400, description = "The path is not valid.", body = super::ErrorBody),
        (status = 404, description = "No loaded pipeline has this topic.", body = super::ErrorBody),
        (status = 503, description = "The broker cannot answer now, or has not made the topic yet.",
            body = super::ErrorBody, headers(("Retry-After" = u32))),
    ))]
pub(super) async fn stats(
    State(state): State<AdminState>,
    topic: Result<Path<String>, PathRejection>,
) -> Result<Json<TopicView>, ApiError> {
    let Path(topic) = topic?;
    Ok(Json(state.topic_view(&topic).await?))
}

/// `GET /v1/topics/{topic}/messages`.
#[utoipa::path(get, path = "/v1/topics/{topic}/messages", operation_id = "read_messages", tag = "topics",
    params(("topic" = String, Path, description = TOPIC), ReadQuery),
    responses(
        (status = 200, description = "Stored messages from `from`, oldest first; reading moves \
            no stage's cursor.", body = ReadResponse),
        (status = 400, description = "The path or query is not valid.", body = super::ErrorBody),
        (status = 404, description = "No loaded pipeline has this topic.", body = super::ErrorBody),
        (status = 503, description = "The broker cannot answer now, or the daemon is shutting \
            down.", body = super::ErrorBody, headers(("Retry-After" = u32))),
    ))]
pub(super) async fn read(
    State(state): State<AdminState>,
    topic: Result<Path<String>, PathRejection>,
    query: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<Json<ReadResponse>, ApiError> {
    let Path(topic) = topic?;
    let Query(query) = query?;
    let (max, wait) = query.checked()?;
    Ok(Json(state.read_topic(&topic, query.from, max, wait).await?))
}

impl AdminState {
    /// A topic and its contents: what `GET /v1/topics/{topic}` answers.
    ///
    /// # Errors
    ///
    /// The topic is not accepted here, or the broker failed.
    pub async fn topic_view(&self, topic: &str) -> Result<TopicView, ApiError> {
        let entry = self.topic(topic).await?;
        let stats = self.broker().topic_stats(topic).await?;
        Ok(TopicView::of(
            topic,
            stats,
            entry.high_water_mark,
            entry.is_dlq,
        ))
    }

    /// Up to `max` (default 100, at most 1000) stored messages of `topic`
    /// from seq `from` (default: the oldest stored), waiting up to `wait`
    /// (at most 30 s) for the first: what `GET /v1/topics/{topic}/messages`
    /// answers. Ends early, empty, when the server starts shutting down.
    ///
    /// # Errors
    ///
    /// The topic is not accepted here, or the broker failed.
    pub async fn read_topic(
        &self,
        topic: &str,
        from: Option<u64>,
        max: Option<usize>,
        wait: Duration,
    ) -> Result<ReadResponse, ApiError> {
        self.topic(topic).await?;
        let broker = self.broker();
        let from = match from {
            Some(from) => from,
            None => {
                let stats = broker.topic_stats(topic).await?;
                if stats.first_seq > 0 {
                    stats.first_seq
                } else {
                    stats.last_seq + 1
                }
            }
        };
        let max = max.unwrap_or(DEFAULT_MAX).clamp(1, MAX_MAX);
        let mut wait = wait.min(MAX_WAIT);
        // A long-poll waits for the next message; a `from` past it names
        // a message that cannot be the next one published: answer at once
        // rather than hold the connection for nothing.
        if !wait.is_zero() && from > broker.topic_stats(topic).await?.last_seq.saturating_add(1) {
            wait = Duration::ZERO;
        }
        // The first chunk waits (a long-poll); the page then grows by
        // chunks until `max` messages or MAX_PAGE_BYTES of payload, so a
        // page of large messages never holds more than about that (or
        // one message) in memory.
        let mut stored = tokio::select! {
            read = broker.read(topic, from, max.min(FIRST_CHUNK), wait) => read?,
            // End a long-poll when the daemon stops, so it does not hold up the
            // shutdown; the client sees an empty page and reconnects later.
            () = self.shutting_down() => Vec::new(),
        };
        let mut bytes: usize = stored.iter().map(|s| s.message.payload.len()).sum();
        let mut asked = max.min(FIRST_CHUNK);
        let mut last_chunk = stored.len();
        while last_chunk == asked && stored.len() < max && bytes < MAX_PAGE_BYTES {
            // As many more as fit the rest of the budget at the size seen
            // so far (between 1 and 256 at a time).
            let typical = (bytes / stored.len().max(1)).max(1);
            asked = ((MAX_PAGE_BYTES - bytes) / typical)
                .clamp(1, 256)
                .min(max - stored.len());
            let next_from = stored.last().map_or(from, |s| s.seq + 1);
            let more = broker.read(topic, next_from, asked, Duration::ZERO).await?;
            last_chunk = more.len();
            for s in more {
                if bytes >= MAX_PAGE_BYTES {
                    break;
                }
                bytes += s.message.payload.len();
                stored.push(s);
            }
        }
        let last_seq = broker.topic_stats(topic).await?.last_seq;
        let next = stored.last().map_or(from, |s| s.seq + 1);
        Ok(ReadResponse {
            messages: stored.iter().map(MessageView::of).collect(),
            next,
            last_seq,
        })
    }
}
