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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageStatus {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
    /// The topic it consumes.
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
}

fn plugin_kind() -> String {
    "plugin".into()
}

/// One source's state, as `status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    pub(super) consumer: ConsumerStats,
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
    let consumer = match broker.consumer_stats(&stage.consumer).await {
        Ok(stats) => stats,
        Err(BrokerError::UnknownConsumer(_) | BrokerError::UnknownTopic(_)) => {
            ConsumerStats::default()
        }
        Err(err) => return Err(err),
    };
    let dlq_depth = match broker.topic_stats(&stage.dlq_topic).await {
        Ok(stats) => stats.depth,
        Err(BrokerError::UnknownTopic(_)) => 0,
        Err(err) => return Err(err),
    };
    let topic = match broker.topic_stats(&stage.topic).await {
        Ok(stats) => stats,
        Err(BrokerError::UnknownTopic(_)) => TopicStats::default(),
        Err(err) => return Err(err),
    };
    Ok(Backlog {
        consumer,
        dlq_depth,
        delayed: topic.delayed,
        next_due: topic.next_due,
    })
}

/// `GET /v1/status`.
pub(super) async fn status(
    State(state): State<AdminState>,
) -> Result<Json<Vec<StageStatus>>, ApiError> {
    let mut out = Vec::with_capacity(state.inner.stages.len());
    for (index, stage) in state.inner.stages.iter().enumerate() {
        let backlog = backlog(&state, stage).await?;
        let total = state
            .metrics()
            .processed_total(&stage.pipeline, &stage.stage);
        out.push(StageStatus {
            pipeline: stage.pipeline.clone(),
            stage: stage.stage.clone(),
            topic: stage.topic.clone(),
            depth: backlog.consumer.pending,
            in_flight: backlog.consumer.in_flight,
            oldest_age_seconds: backlog.consumer.oldest_age.map(|d| d.as_secs_f64()),
            dlq_depth: backlog.dlq_depth,
            processed_per_sec: state.inner.rates.rate(index, Instant::now(), total),
            processed_total: total,
            kind: stage.kind.clone(),
            target: stage.target.clone(),
            up: stage.target.as_ref().map(|_| {
                !state
                    .connectors()
                    .is_down(&format!("{}/{}", stage.pipeline, stage.stage))
            }),
            paused: backlog.consumer.paused,
            delayed: backlog.delayed,
            next_due: backlog
                .next_due
                .map(crate::timestamp::format_rfc3339_millis),
        });
    }
    Ok(Json(out))
}

/// `GET /v1/sources`.
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
        for (index, stage) in state.inner.stages.iter().enumerate() {
            let total = state
                .metrics()
                .processed_total(&stage.pipeline, &stage.stage);
            state.inner.rates.record(index, now, total);
        }
    }
}

/// One ring of `(when, processed_total)` samples per stage.
pub(super) struct Rates {
    rings: Vec<Mutex<VecDeque<(Instant, u64)>>>,
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
