//! `POST /v1/reload` and `GET /v1/reload`: hot reload over the API.
//!
//! The POST asks the daemon to reload its pipeline files and plugins and
//! waits for the answer: 200 with what changed, or 422 with every error at
//! `file:line:col` (the previous configuration keeps running). It needs the
//! full-access token; `{"force": true}` also removes topics that still hold
//! messages. The GET shows the reload counts and the last report.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;

use super::{AdminState, ApiError};
use crate::reload::{ReloadReport, ReloadSummary, ReloadUnavailable, Trigger};

/// The body `POST /v1/reload` takes; an empty body is `{}`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReloadBody {
    /// Apply what is refused by default (removing a topic that holds
    /// messages).
    #[serde(default)]
    force: bool,
}

/// `POST /v1/reload`.
#[utoipa::path(post, path = "/v1/reload", operation_id = "reload", tag = "reload",
    description = "Reloads the pipeline files and plugins and waits for the answer. Every file \
        and plugin is checked first: with an error nothing changes and the previous \
        configuration keeps running. Only what changed restarts.",
    request_body(content = Option<ReloadBody>, content_type = "application/json",
        description = "Optional: an empty body is `{}`."),
    responses(
        (status = 200, description = "Applied: what changed.", body = ReloadReport),
        (status = 400, description = "The body is not valid.", body = super::ErrorBody),
        (status = 404, description = "This server runs no pipelines to reload.",
            body = super::ErrorBody),
        (status = 413, description = "The body is over 64 KiB.", body = super::ErrorBody),
        (status = 415, description = "The body is not `application/json`.",
            body = super::ErrorBody),
        (status = 422, description = "Refused: nothing changed; `errors` says why, at \
            `file:line:col`.", body = ReloadReport),
        (status = 503, description = "The daemon is draining, or 4 reloads wait already.",
            body = super::ErrorBody, headers(("Retry-After" = u32))),
    ))]
pub(super) async fn reload(
    State(state): State<AdminState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<ReloadReport>), ApiError> {
    let body: ReloadBody = super::dlq::json_body(&headers, body, state.body_limit)?;
    if state.is_draining() {
        return Err(ApiError::Draining);
    }
    let report = state
        .reloads()
        .request(Trigger::Api, body.force)
        .await
        .map_err(|err| match err {
            ReloadUnavailable::NoDaemon => ApiError::NotFound(err.to_string()),
            ReloadUnavailable::Busy(_) => ApiError::Unavailable(err.to_string()),
            ReloadUnavailable::ShuttingDown => ApiError::Draining,
        })?;
    let status = if report.ok {
        StatusCode::OK
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    Ok((status, Json(report)))
}

/// `GET /v1/reload`.
#[utoipa::path(get, path = "/v1/reload", operation_id = "reload_summary", tag = "reload", responses(
    (status = 200, description = "Reloads so far and the last one's report.",
        body = ReloadSummary),
))]
pub(super) async fn summary(State(state): State<AdminState>) -> Json<ReloadSummary> {
    Json(state.reloads().summary())
}
