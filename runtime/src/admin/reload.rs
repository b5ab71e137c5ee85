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
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReloadBody {
    /// Apply what is refused by default (removing a topic that holds
    /// messages).
    #[serde(default)]
    force: bool,
}

/// `POST /v1/reload`.
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
pub(super) async fn summary(State(state): State<AdminState>) -> Json<ReloadSummary> {
    Json(state.reloads().summary())
}
