//! `GET /metrics`: the Prometheus text exposition.
//!
//! Counters are counted where things happen (ingest, the engine). The
//! gauges that describe the broker (queue depth, oldest age, in-flight, DLQ
//! depth) are refreshed from it here, at scrape time, so a scrape never
//! shows a stale backlog and nothing polls the broker between scrapes.

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::AdminState;
use crate::metrics::StageLabels;

/// The Prometheus text format's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics`.
pub(super) async fn metrics(State(state): State<AdminState>) -> Response {
    refresh_gauges(&state).await;
    let mut response = state.metrics().encode().into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    response
}

/// Sets the per-stage broker gauges. A stage the broker cannot answer for
/// keeps its previous values (and is logged) rather than failing the whole
/// scrape: the counters are still worth having.
async fn refresh_gauges(state: &AdminState) {
    let metrics = state.metrics();
    for stage in &state.inner.stages {
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
    }
}
