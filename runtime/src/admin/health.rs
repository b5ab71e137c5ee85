//! The probes: `GET /health` and `/health/live` (liveness: the process
//! serves) and `GET /health/ready` (readiness: the broker can take work
//! and the daemon is not draining).
//!
//! Readiness is [`Broker::readiness`](crate::broker::Broker::readiness),
//! which answers from state the broker already keeps, so a probe answers at
//! once even while the store or the NATS connection is down.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::AdminState;
use crate::broker::Readiness;

/// What liveness answers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Live {
    /// Always `ok`.
    #[schema(pattern = "^ok$")]
    status: &'static str,
}

/// What readiness answers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Ready {
    /// `ready`, `degraded` (serving; a connector or the broker is
    /// impaired) or `not-ready`.
    #[schema(pattern = "^(ready|degraded|not-ready)$")]
    status: &'static str,
    /// Why it is not simply ready.
    reasons: Vec<String>,
}

/// `GET /health`: 200 while the process serves.
#[utoipa::path(get, path = "/health", operation_id = "health", tag = "health",
    responses((status = 200, description = "The process serves.", body = Live)))]
pub(super) async fn live() -> Json<Live> {
    Json(Live { status: "ok" })
}

/// `GET /health/live`: the same as `/health`.
#[utoipa::path(get, path = "/health/live", operation_id = "health_live", tag = "health",
    responses((status = 200, description = "The process serves.", body = Live)))]
pub(super) async fn live_alias() -> Json<Live> {
    live().await
}

/// `GET /health/ready`: 200 `{"status": "ready"|"degraded", "reasons"}`,
/// or 503 `{"status": "not-ready", "reasons"}` with `Retry-After`.
#[utoipa::path(get, path = "/health/ready", operation_id = "health_ready", tag = "health", responses(
    (status = 200, description = "Ready, or degraded (serving, with reasons).", body = Ready),
    (status = 503, description = "Not ready: draining, or the broker cannot take work.", body = Ready,
        headers(("Retry-After" = u32, description = "Seconds to wait."))),
))]
pub(super) async fn ready(State(state): State<AdminState>) -> Response {
    let mut reasons = Vec::new();
    let mut ready = true;
    let mut degraded = false;
    if state.is_draining() {
        ready = false;
        reasons.push("draining: the daemon is shutting down".to_owned());
    }
    match state.broker().readiness() {
        Readiness::Ready => {}
        Readiness::Degraded(why) => {
            degraded = true;
            reasons.push(why);
        }
        Readiness::NotReady(why) => {
            ready = false;
            reasons.push(why);
        }
    }
    // A source or sink that cannot reach its system holds up only its own
    // messages (they wait upstream, or held in place): degraded, with why.
    for (connector, why) in state.connectors().outages() {
        degraded = true;
        reasons.push(format!("{connector}: {why}"));
    }
    let (status, word) = match (ready, degraded) {
        (false, _) => (StatusCode::SERVICE_UNAVAILABLE, "not-ready"),
        (true, true) => (StatusCode::OK, "degraded"),
        (true, false) => (StatusCode::OK, "ready"),
    };
    let mut response = (
        status,
        Json(Ready {
            status: word,
            reasons,
        }),
    )
        .into_response();
    if !ready {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}
