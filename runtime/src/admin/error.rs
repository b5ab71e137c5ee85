//! Every way an admin request can fail, and how each one looks on the wire:
//! a status code plus `{"error": "<message for people>", "code": "<stable
//! name for programs>"}`. The CLI prints `error` and branches on the status;
//! scripts branch on `code`. Keeping them in one enum keeps the two in step.

use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::broker::BrokerError;

/// The JSON body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong, in a sentence a person can act on.
    pub error: String,
    /// A stable, machine-readable name for the kind of error.
    pub code: String,
}

/// Why an admin request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The topic is not declared by any loaded pipeline (nor is it one of
    /// their dead-letter topics).
    #[error("unknown topic `{0}`: it is not declared by any loaded pipeline")]
    UnknownTopic(String),
    /// `{pipeline}/{stage}` names no loaded stage.
    #[error("unknown stage `{0}`: no loaded pipeline has it")]
    UnknownStage(String),
    /// Without pipelines: the broker has no topic by this name.
    #[error(
        "unknown topic `{0}`: the broker has no such topic (a daemon creates the topics of its pipelines when it starts)"
    )]
    NoSuchTopic(String),
    /// Without pipelines: the broker has no DLQ topic for the stage under
    /// the default name.
    #[error(
        "unknown stage `{stage}`: the broker has no dead-letter topic `{topic}` for it (a daemon creates it when it starts the stage)"
    )]
    NoDlqTopic {
        /// `pipeline/stage`.
        stage: String,
        /// The default DLQ topic looked for.
        topic: String,
    },
    /// The addressed thing (a DLQ entry, an endpoint) does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed: empty body, bad header, bad JSON line.
    #[error("{0}")]
    BadRequest(String),
    /// The batch endpoint got a body it does not read.
    #[error(
        "unsupported content type {0}; send JSON lines as application/x-ndjson or application/jsonl"
    )]
    UnsupportedMediaType(String),
    /// The body exceeds the server's limit.
    #[error("the request body is larger than the limit of {0} bytes")]
    PayloadTooLarge(usize),
    /// The client stopped sending its body before its end.
    #[error("no part of the request body arrived for {0:?}; the request is dropped")]
    SlowBody(std::time::Duration),
    /// The topic is at or above its `high_water_mark`; try again later.
    #[error(
        "topic `{topic}` is full: {depth} messages wait and its high_water_mark is {limit}; retry later"
    )]
    Backpressure {
        /// The topic.
        topic: String,
        /// How many messages wait.
        depth: u64,
        /// Its `high_water_mark`.
        limit: u64,
    },
    /// The method is not one this endpoint takes.
    #[error("method not allowed on this endpoint")]
    MethodNotAllowed,
    /// A JSON endpoint got a body of another type (a browser's `text/plain`
    /// form post, say).
    #[error("unsupported content type {0}; this endpoint takes application/json")]
    NotJson(String),
    /// No token, or not a valid one, where the API requires one.
    #[error("{0}")]
    Unauthorized(String),
    /// The token is valid but its role may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// The request came from a web page of another site.
    #[error("{0}")]
    CrossOrigin(String),
    /// The `Host` header names another server (DNS rebinding).
    #[error("{0}")]
    MisdirectedHost(String),
    /// The client's address failed authentication too often lately
    /// (`throttle.rs`); refused for this long.
    #[error(
        "too many failed authentications from this address; it is refused for another {}s",
        .0.as_secs().max(1)
    )]
    Throttled(std::time::Duration),
    /// The daemon is shutting down and takes no more messages.
    #[error(
        "the daemon is shutting down and takes no new messages; retry against it after it restarts"
    )]
    Draining,
    /// Too many request bodies are in flight at once.
    #[error(
        "the daemon holds {limit} bytes of request bodies in flight, its budget; retry shortly"
    )]
    Busy {
        /// The budget, in bytes.
        limit: usize,
    },
    /// The daemon cannot do this now; retry shortly (a reload queue that
    /// is full, say).
    #[error("{0}")]
    Unavailable(String),
    /// The broker failed.
    #[error("{0}")]
    Broker(#[from] BrokerError),
}

impl ApiError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::UnknownTopic(_)
            | ApiError::UnknownStage(_)
            | ApiError::NoSuchTopic(_)
            | ApiError::NoDlqTopic { .. }
            | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::SlowBody(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Backpressure { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::NotJson(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) | ApiError::CrossOrigin(_) => StatusCode::FORBIDDEN,
            ApiError::MisdirectedHost(_) => StatusCode::MISDIRECTED_REQUEST,
            ApiError::Throttled(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Draining | ApiError::Busy { .. } | ApiError::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Broker(err) => match err {
                // Declared in the pipelines but not (yet) by the broker: the
                // engine declares topics as it starts, so this passes.
                BrokerError::UnknownTopic(_)
                | BrokerError::UnknownConsumer(_)
                | BrokerError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                BrokerError::LeaseLost(_) | BrokerError::Storage(_) | BrokerError::Provision(_) => {
                    StatusCode::INTERNAL_SERVER_ERROR
                }
                BrokerError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                BrokerError::BadMessage(_) => StatusCode::BAD_REQUEST,
                BrokerError::StateConflict(_) => StatusCode::CONFLICT,
            },
        }
    }

    /// The stable machine-readable name.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::UnknownTopic(_) | ApiError::NoSuchTopic(_) => "unknown_topic",
            ApiError::UnknownStage(_) | ApiError::NoDlqTopic { .. } => "unknown_stage",
            ApiError::NotFound(_) => "not_found",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::SlowBody(_) => "request_timeout",
            ApiError::Backpressure { .. } => "backpressure",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::NotJson(_) => "unsupported_media_type",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::CrossOrigin(_) => "cross_origin",
            ApiError::MisdirectedHost(_) => "host_not_allowed",
            ApiError::Throttled(_) => "too_many_auth_failures",
            ApiError::Draining => "draining",
            ApiError::Busy { .. } | ApiError::Unavailable(_) => "busy",
            ApiError::Broker(err) => match err {
                BrokerError::UnknownTopic(_) | BrokerError::UnknownConsumer(_) => "not_ready",
                BrokerError::Unavailable(_) => "unavailable",
                BrokerError::LeaseLost(_) | BrokerError::Storage(_) | BrokerError::Provision(_) => {
                    "broker_error"
                }
                BrokerError::PayloadTooLarge(_) => "payload_too_large",
                BrokerError::BadMessage(_) => "bad_request",
                BrokerError::StateConflict(_) => "state_conflict",
            },
        }
    }

    /// Maps a body-buffering failure, so an oversized body gets a JSON 413
    /// rather than axum's plain-text one.
    pub(crate) fn from_body(rejection: BytesRejection, limit: usize) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(limit)
        } else {
            ApiError::BadRequest(format!("cannot read the request body: {rejection}"))
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::BadRequest(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::BadRequest(rejection.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // Draining and busy are expected, per request: not worth a warning each.
        if status.is_server_error() && !matches!(self, ApiError::Draining | ApiError::Busy { .. }) {
            tracing::warn!(code = self.code(), "admin request failed: {self}");
        }
        let body = ErrorBody {
            error: self.to_string(),
            code: self.code().to_owned(),
        };
        let mut response = (status, axum::Json(body)).into_response();
        // Both are "come back shortly"; say when, as HTTP intends. A
        // draining daemon will not come back as itself: give a restart time.
        if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            let after = match &self {
                ApiError::Draining => HeaderValue::from_static("5"),
                ApiError::Throttled(left) => HeaderValue::from(left.as_secs().max(1)),
                _ => HeaderValue::from_static("1"),
            };
            response.headers_mut().insert(header::RETRY_AFTER, after);
        }
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sluice\""),
            );
        }
        response
    }
}
