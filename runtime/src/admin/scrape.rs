//! `GET /metrics`: the metrics, as OpenMetrics text when the scraper's
//! `Accept` allows it, else as Prometheus text format 0.0.4, each under its
//! own content type.
//!
//! Counters are counted where things happen (ingest, the engine). The
//! gauges that describe the broker (queue depth, oldest age, in-flight, DLQ
//! depth) are refreshed from it here, at scrape time, so a scrape never
//! shows a stale backlog and nothing polls the broker between scrapes. A
//! broker that is not ready, or slower than [`REFRESH_LIMIT`], is not
//! waited for: the scrape answers with the last values.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::AdminState;
use crate::broker::now_millis;
use crate::metrics::StageLabels;

/// The Prometheus text format's content type.
const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// OpenMetrics' content type.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The longest a scrape waits for the broker-backed gauges.
const REFRESH_LIMIT: Duration = Duration::from_secs(1);

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "health",
    params(("Accept" = Option<String>, Header,
        description = "`application/openmetrics-text` for OpenMetrics; else Prometheus text.")),
    responses((status = 200, description = "Every metric, for a Prometheus scrape.",
        content(
            (String = "text/plain"),
            (String = "application/openmetrics-text"),
        ))))]
pub(super) async fn metrics(State(state): State<AdminState>, headers: HeaderMap) -> Response {
    if state.broker().readiness().is_ready()
        && tokio::time::timeout(REFRESH_LIMIT, refresh_gauges(&state))
            .await
            .is_err()
    {
        tracing::warn!(
            "the broker did not answer within {REFRESH_LIMIT:?}; /metrics shows the last broker gauges"
        );
    }
    let metrics = state.metrics();
    metrics.observe_storage_errors(state.broker().storage_errors());
    metrics.observe_store_memory(&state.broker().store_memory());
    metrics.refresh_process();
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let (body, content_type) = if wants_openmetrics(accept) {
        (metrics.encode(), OPENMETRICS)
    } else {
        (metrics.encode_prometheus(), PROMETHEUS)
    };
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Whether `Accept` prefers OpenMetrics text to Prometheus text: it lists
/// `application/openmetrics-text` with a quality at least that of
/// `text/plain` (Prometheus itself asks for OpenMetrics first).
fn wants_openmetrics(accept: &str) -> bool {
    let mut openmetrics: f32 = 0.0;
    let mut text: f32 = 0.0;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        match media.as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(q),
            "text/plain" | "text/*" | "*/*" => text = text.max(q),
            _ => {}
        }
    }
    openmetrics > 0.0 && openmetrics >= text
}

/// Sets the per-stage broker gauges. A stage the broker cannot answer for
/// keeps its previous values (and is logged) rather than failing the whole
/// scrape: the counters are still worth having.
async fn refresh_gauges(state: &AdminState) {
    let metrics = state.metrics();
    for stage in &state.catalog().stages {
        let backlog = match super::status::backlog(state, stage).await {
            Ok(backlog) => backlog,
            Err(err) => {
                tracing::warn!(
                    pipeline = %stage.pipeline,
                    stage = %stage.stage,
                    "cannot read the stage's backlog for /metrics: {err}"
                );
                continue;
            }
        };
        let labels = StageLabels {
            pipeline: stage.pipeline.clone(),
            stage: stage.stage.clone(),
        };
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        metrics
            .queue_depth
            .get_or_create(&labels)
            .set(gauge(backlog.consumer.pending));
        metrics
            .inflight
            .get_or_create(&labels)
            .set(gauge(backlog.consumer.in_flight));
        metrics
            .oldest_age
            .get_or_create(&labels)
            .set(backlog.consumer.oldest_age.map_or(0.0, |d| d.as_secs_f64()));
        metrics
            .dlq_depth
            .get_or_create(&labels)
            .set(gauge(backlog.dlq_depth));
        metrics
            .stage_paused
            .get_or_create(&labels)
            .set(i64::from(backlog.consumer.paused));
        metrics
            .delayed
            .get_or_create(&labels)
            .set(gauge(backlog.delayed));
        metrics.next_due.get_or_create(&labels).set(
            backlog
                .next_due
                .map_or(0.0, |due| due.saturating_sub(now_millis()) as f64 / 1000.0),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiates_openmetrics_only_when_asked() {
        assert!(!wants_openmetrics(""));
        assert!(!wants_openmetrics("*/*"));
        assert!(!wants_openmetrics("text/plain;version=0.0.4"));
        assert!(wants_openmetrics("application/openmetrics-text"));
        assert!(wants_openmetrics(
            "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
        ));
        assert!(!wants_openmetrics(
            "text/plain;q=1.0,application/openmetrics-text;q=0.5"
        ));
    }
}
