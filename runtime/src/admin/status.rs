//! `GET /v1/status`: one object per stage (a sink is a stage), and
//! `GET /v1/sources`: one per source; what `sluice status` prints.
//!
//! Backlog numbers come from the broker at request time. Throughput comes
//! from a sampler that reads each stage's processed counter once a second
//! into a small ring, so the rate is over the last ~10 s rather than since
//! start (which would hide a stage that just stalled).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use super::{AdminState, ApiError, StageEntry};
use crate::broker::{BrokerError, ConsumerStats, TopicStats};

/// How often the sampler reads the counters.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Samples kept per stage: 11 one-second samples span 10 s.
const SAMPLES: usize = 11;

/// One stage's state, as `status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StageStatus {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
    /// The topic it consumes (the first, for a stage with priority lanes).
    pub topic: String,
    /// Messages waiting for it.
    pub depth: u64,
    /// Deliveries it holds and has not settled.
    pub in_flight: u64,
    /// Age of the oldest message it has not settled, in seconds.
    pub oldest_age_seconds: Option<f64>,
    /// Messages in its dead-letter topic.
    pub dlq_depth: u64,
    /// Deliveries settled per second over the last ~10 s.
    pub processed_per_sec: f64,
    /// Deliveries settled since the daemon started.
    pub processed_total: u64,
    /// `plugin`, or `sink:<connector>` (`sink:http`) for a sink.
    #[serde(default = "plugin_kind")]
    pub kind: String,
    /// A sink's target, for people (never with a password).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// For a sink: whether it reaches its target (false during an outage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up: Option<bool>,
    /// For an object-store sink: the files it is filling, and how long
    /// the oldest record in them has waited, in seconds (its messages are
    /// acked once their file is uploaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<OpenFiles>,
    /// Paused by the operator (`sluice stage pause`): it fetches nothing.
    #[serde(default)]
    pub paused: bool,
    /// Messages on its topic waiting for their due time (not in `depth`).
    #[serde(default)]
    pub delayed: u64,
    /// When the next of them is due (RFC 3339), where the broker can tell
    /// cheaply (the embedded broker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_due: Option<String>,
    /// For a stage with several topics: each priority lane, in priority
    /// order. The stage's own figures above are their sums.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<LaneStatus>,
    /// Its `rate` limit, as configured (`200/s`, `5/s per key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// An adaptive stage's limit now: the calls it may run at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_limit: Option<u64>,
    /// An adaptive stage's most calls at once (`concurrency.max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_max: Option<u32>,
    /// While the stage is held after a `Retry-After`: when the hold ends
    /// (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_until: Option<String>,
}

/// One priority lane of a stage, as `status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LaneStatus {
    /// The lane's topic.
    pub topic: String,
    /// Messages waiting in it.
    pub depth: u64,
    /// Its deliveries held and not settled.
    pub in_flight: u64,
    /// Age of its oldest unsettled message, in seconds.
    pub oldest_age_seconds: Option<f64>,
    /// Of its last 1,024 first deliveries in this daemon, the median wait
    /// from publish until a worker slot took it, in seconds.
    pub wait_p50_seconds: Option<f64>,
    /// The same waits' 99th percentile.
    pub wait_p99_seconds: Option<f64>,
}

fn plugin_kind() -> String {
    "plugin".into()
}

/// One source's state, as `status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SourceStatus {
    /// The pipeline.
    pub pipeline: String,
    /// The source.
    pub source: String,
    /// The connector: `redis`, `postgres`.
    pub kind: String,
    /// The upstream, for people (never with a password).
    pub upstream: String,
    /// The topic it publishes into.
    pub topic: String,
    /// Whether it reaches its upstream (false during an outage).
    pub up: bool,
    /// Upstream messages published into the topic since the daemon started.
    pub read_total: u64,
    /// Messages waiting upstream, where the upstream can tell.
    pub lag: Option<u64>,
    /// The lag per upstream partition this daemon reads (Kafka), as
    /// `(partition, lag)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partition_lag: Vec<(String, u64)>,
    /// Messages in its dead-letter topic (upstream messages that could not
    /// become messages).
    pub dlq_depth: u64,
}

/// A stage's backlog as the broker reports it.
pub(super) struct Backlog {
    /// Summed over its lanes.
    pub(super) consumer: ConsumerStats,
    /// Per lane (a stage with several topics), in priority order.
    pub(super) lanes: Vec<ConsumerStats>,
    pub(super) dlq_depth: u64,
    /// Delayed messages on the stage's topic.
    pub(super) delayed: u64,
    /// When the first of them is due (ms since the epoch), if known.
    pub(super) next_due: Option<u64>,
}

/// Reads a stage's backlog. A consumer or topic the broker does not know
/// yet (the engine declares them as it starts) reads as empty.
pub(super) async fn backlog(
    state: &AdminState,
    stage: &StageEntry,
) -> Result<Backlog, BrokerError> {
    let broker = state.broker();
    let mut lanes = Vec::with_capacity(stage.inputs.len());
    let mut delayed = 0;
    let mut next_due: Option<u64> = None;
    for input in &stage.inputs {
        lanes.push(match broker.consumer_stats(&input.consumer).await {
            Ok(stats) => stats,
            Err(BrokerError::UnknownConsumer(_) | BrokerError::UnknownTopic(_)) => {
                ConsumerStats::default()
            }
            Err(err) => return Err(err),
        });
        let topic = match broker.topic_stats(&input.topic).await {
            Ok(stats) => stats,
            Err(BrokerError::UnknownTopic(_)) => TopicStats::default(),
            Err(err) => return Err(err),
        };
        delayed += topic.delayed;
        next_due = match (next_due, topic.next_due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let dlq_depth = match broker.topic_stats(&stage.dlq_topic).await {
        Ok(stats) => stats.depth,
        Err(BrokerError::UnknownTopic(_)) => 0,
        Err(err) => return Err(err),
    };
    let consumer = ConsumerStats {
        pending: lanes.iter().map(|l| l.pending).sum(),
        in_flight: lanes.iter().map(|l| l.in_flight).sum(),
        oldest_age: lanes.iter().filter_map(|l| l.oldest_age).max(),
        // Paused while any lane is: a pause holds every lane, and a
        // half-applied one must not read as running.
        paused: lanes.iter().any(|l| l.paused),
    };
    if lanes.len() == 1 {
        lanes.clear();
    }
    Ok(Backlog {
        consumer,
        lanes,
        dlq_depth,
        delayed,
        next_due,
    })
}

/// `GET /v1/status`.
#[utoipa::path(get, path = "/v1/status", operation_id = "status", tag = "status", responses(
    (status = 200, description = "One entry per stage (a sink is a stage), in pipeline order.",
        body = Vec<StageStatus>),
    (status = 503, description = "The broker cannot answer now, or a stage has not started yet.",
        body = super::ErrorBody, headers(("Retry-After" = u32))),
))]
pub(super) async fn status(
    State(state): State<AdminState>,
) -> Result<Json<Vec<StageStatus>>, ApiError> {
    let catalog = state.catalog();
    let mut out = Vec::with_capacity(catalog.stages.len());
    for (index, stage) in catalog.stages.iter().enumerate() {
        let backlog = backlog(&state, stage).await?;
        let total = state
            .metrics()
            .processed_total(&stage.pipeline, &stage.stage);
        out.push(StageStatus {
            pipeline: stage.pipeline.clone(),
            stage: stage.stage.clone(),
            topic: stage
                .inputs
                .first()
                .map(|input| input.topic.clone())
                .unwrap_or_default(),
            depth: backlog.consumer.pending,
            in_flight: backlog.consumer.in_flight,
            oldest_age_seconds: backlog.consumer.oldest_age.map(|d| d.as_secs_f64()),
            dlq_depth: backlog.dlq_depth,
            processed_per_sec: catalog.rates.rate(index, Instant::now(), total),
            processed_total: total,
            kind: stage.kind.clone(),
            target: stage.target.clone(),
            up: stage.target.as_ref().map(|_| {
                !state
                    .connectors()
                    .is_down(&format!("{}/{}", stage.pipeline, stage.stage))
            }),
            open_files: (stage.kind == "sink:object_store")
                .then(|| open_files(state.metrics(), &stage.pipeline, &stage.stage)),
            paused: backlog.consumer.paused,
            delayed: backlog.delayed,
            next_due: backlog
                .next_due
                .map(crate::timestamp::format_rfc3339_millis),
            lanes: backlog
                .lanes
                .iter()
                .zip(&stage.inputs)
                .map(|(stats, input)| {
                    let waits = state.metrics().lane_wait_quantiles(
                        &stage.pipeline,
                        &stage.stage,
                        &input.topic,
                    );
                    LaneStatus {
                        topic: input.topic.clone(),
                        depth: stats.pending,
                        in_flight: stats.in_flight,
                        oldest_age_seconds: stats.oldest_age.map(|d| d.as_secs_f64()),
                        wait_p50_seconds: waits.map(|w| w.0),
                        wait_p99_seconds: waits.map(|w| w.1),
                    }
                })
                .collect(),
            rate: stage.rate.clone(),
            concurrency_limit: stage.adaptive_max.map(|_| {
                let limit = state
                    .metrics()
                    .concurrency_limit
                    .get_or_create(&crate::metrics::StageLabels {
                        pipeline: stage.pipeline.clone(),
                        stage: stage.stage.clone(),
                    })
                    .get();
                u64::try_from(limit).unwrap_or(0)
            }),
            concurrency_max: stage.adaptive_max,
            held_until: held_until(&state, stage),
        });
    }
    Ok(Json(out))
}

/// When the stage's hold ends, if it is held now (the engine keeps the
/// time in `sluice_stage_hold_until_timestamp_seconds`).
fn held_until(state: &AdminState, stage: &StageEntry) -> Option<String> {
    let until = state
        .metrics()
        .hold_until
        .get_or_create(&crate::metrics::StageLabels {
            pipeline: stage.pipeline.clone(),
            stage: stage.stage.clone(),
        })
        .get();
    let until_ms = (until * 1000.0) as u64;
    (until_ms > crate::broker::now_millis())
        .then(|| crate::timestamp::format_rfc3339_millis(until_ms))
}

/// `GET /v1/sources`.
#[utoipa::path(get, path = "/v1/sources", operation_id = "sources", tag = "status", responses(
    (status = 200, description = "One entry per source connector.", body = Vec<SourceStatus>),
    (status = 503, description = "The broker cannot answer now.", body = super::ErrorBody,
        headers(("Retry-After" = u32))),
))]
pub(super) async fn sources(
    State(state): State<AdminState>,
) -> Result<Json<Vec<SourceStatus>>, ApiError> {
    let mut out = Vec::new();
    for pipeline in state.pipelines().iter() {
        for source in &pipeline.sources {
            let Some(connector) = source.connector() else {
                continue;
            };
            let dlq_depth = match state
                .broker()
                .topic_stats(&source.dlq_topic(&pipeline.name))
                .await
            {
                Ok(stats) => stats.depth,
                Err(BrokerError::UnknownTopic(_)) => 0,
                Err(err) => return Err(err.into()),
            };
            let metrics = state.metrics();
            out.push(SourceStatus {
                pipeline: pipeline.name.clone(),
                source: source.name.clone(),
                kind: connector.kind().to_owned(),
                upstream: connector.describe(),
                topic: source.to.clone(),
                up: !state
                    .connectors()
                    .is_down(&format!("{}/{}", pipeline.name, source.name)),
                read_total: metrics.source_total(&pipeline.name, &source.name),
                lag: metrics.source_lag_value(&pipeline.name, &source.name),
                partition_lag: metrics.source_partition_lag_values(&pipeline.name, &source.name),
                dlq_depth,
            });
        }
    }
    Ok(Json(out))
}

/// Samples every stage's processed counter each second, for as long as the
/// server runs (`serve` aborts it).
pub(super) async fn sample(state: AdminState) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let catalog = state.catalog();
        for (index, stage) in catalog.stages.iter().enumerate() {
            let total = state
                .metrics()
                .processed_total(&stage.pipeline, &stage.stage);
            catalog.rates.record(index, now, total);
        }
    }
}

/// One ring of `(when, processed_total)` samples per stage.
pub(super) struct Rates {
    pub(super) rings: Vec<Mutex<VecDeque<(Instant, u64)>>>,
}

impl Rates {
    pub(super) fn new(stages: usize) -> Self {
        Rates {
            rings: (0..stages)
                .map(|_| Mutex::new(VecDeque::with_capacity(SAMPLES)))
                .collect(),
        }
    }

    fn record(&self, index: usize, at: Instant, total: u64) {
        if let Some(ring) = self.rings.get(index) {
            let mut ring = ring.lock().unwrap_or_else(|e| e.into_inner());
            if ring.len() == SAMPLES {
                ring.pop_front();
            }
            ring.push_back((at, total));
        }
    }

    /// Per second from the oldest sample to `(now, total)`; 0 until a
    /// sample at least 100 ms old exists.
    fn rate(&self, index: usize, now: Instant, total: u64) -> f64 {
        let Some(ring) = self.rings.get(index) else {
            return 0.0;
        };
        let ring = ring.lock().unwrap_or_else(|e| e.into_inner());
        match ring.front() {
            Some(&(at, then)) => {
                let elapsed = now.saturating_duration_since(at).as_secs_f64();
                if elapsed < 0.1 {
                    0.0
                } else {
                    total.saturating_sub(then) as f64 / elapsed
                }
            }
            None => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_spans_the_ring_and_forgets_old_samples() {
        let rates = Rates::new(1);
        let t0 = Instant::now();
        assert_eq!(rates.rate(0, t0, 5), 0.0);
        for i in 0..20u64 {
            rates.record(0, t0 + Duration::from_secs(i), i * 10);
        }
        // Oldest kept sample: t0+9s at 90; now t0+20s at 200.
        let rate = rates.rate(0, t0 + Duration::from_secs(20), 200);
        assert!((rate - 10.0).abs() < 1e-9, "{rate}");
        assert_eq!(rates.rate(7, t0, 1), 0.0);
    }
}

/// An object-store sink's open files, in `GET /v1/status`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OpenFiles {
    /// Files being filled.
    pub count: u64,
    /// How long the oldest record in them has waited, in seconds.
    pub oldest_seconds: f64,
}

/// The open-files gauges of sink `pipeline/sink`.
fn open_files(metrics: &crate::metrics::Metrics, pipeline: &str, sink: &str) -> OpenFiles {
    let labels = crate::metrics::ConnectorLabels {
        connector: format!("{pipeline}/{sink}"),
    };
    OpenFiles {
        count: metrics
            .sink_open_files
            .get(&labels)
            .map_or(0, |g| u64::try_from(g.get()).unwrap_or(0)),
        oldest_seconds: metrics
            .sink_oldest_unflushed
            .get(&labels)
            .map_or(0.0, |g| g.get()),
    }
}
