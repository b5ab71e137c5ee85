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
use serde_json::json;

use super::AdminState;
use crate::broker::Readiness;

/// `GET /health`, `GET /health/live`: 200 while the process serves.
pub(super) async fn live() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /health/ready`: 200 `{"status": "ready"|"degraded", "reasons"}`,
/// or 503 `{"status": "not-ready", "reasons"}` with `Retry-After`.
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
    let mut response = (status, Json(json!({"status": word, "reasons": reasons}))).into_response();
    if !ready {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}
