//! The daemon's Prometheus metrics, named as DESIGN's metrics table names
//! them. The engine and the ingest path count into [`Metrics`]; gauges that
//! describe the broker (depth, age, in-flight, DLQ depth) are read from it
//! when `/metrics` is scraped, so they are never stale.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::failure::FailureKind;

/// Labels of per-topic metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    /// The topic.
    pub topic: String,
}

/// Labels of per-stage metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
}

/// Labels of per-stage outcome counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
    /// `ok`, `skipped` (filtered or redrive for another stage),
    /// `dead-lettered`, or the failure kind of a retried attempt.
    pub outcome: String,
}

/// Labels of claim-check byte counters.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    /// `put` (offloaded to a claim store) or `get` (resolved from one).
    pub direction: String,
}

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    /// `sluice_messages_published_total{topic}`.
    pub published: Family<TopicLabels, Counter>,
    /// `sluice_messages_processed_total{pipeline,stage,outcome}`.
    pub processed: Family<OutcomeLabels, Counter>,
    /// `sluice_queue_depth{pipeline,stage}`.
    pub queue_depth: Family<StageLabels, Gauge>,
    /// `sluice_oldest_message_age_seconds{pipeline,stage}`.
    pub oldest_age: Family<StageLabels, Gauge<f64, AtomicU64>>,
    /// `sluice_dlq_depth{pipeline,stage}`.
    pub dlq_depth: Family<StageLabels, Gauge>,
    /// `sluice_inflight{pipeline,stage}`.
    pub inflight: Family<StageLabels, Gauge>,
    /// `sluice_handler_duration_seconds{pipeline,stage}`.
    pub handler_duration: Family<StageLabels, Histogram>,
    /// `sluice_claim_bytes_total{direction}`.
    pub claim_bytes: Family<DirectionLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let published = Family::<TopicLabels, Counter>::default();
        let processed = Family::<OutcomeLabels, Counter>::default();
        let queue_depth = Family::<StageLabels, Gauge>::default();
        let oldest_age = Family::<StageLabels, Gauge<f64, AtomicU64>>::default();
        let dlq_depth = Family::<StageLabels, Gauge>::default();
        let inflight = Family::<StageLabels, Gauge>::default();
        let handler_duration = Family::<StageLabels, Histogram>::new_with_constructor(|| {
            // 50 µs .. ~100 s.
            Histogram::new(exponential_buckets(0.000_05, 2.0, 22))
        });
        let claim_bytes = Family::<DirectionLabels, Counter>::default();
        registry.register(
            "sluice_messages_published",
            "Messages published to a topic (ingest, CLI, handler emits, DLQ)",
            published.clone(),
        );
        registry.register(
            "sluice_messages_processed",
            "Deliveries a stage settled, by outcome",
            processed.clone(),
        );
        registry.register(
            "sluice_queue_depth",
            "Messages waiting for a stage",
            queue_depth.clone(),
        );
        registry.register(
            "sluice_oldest_message_age_seconds",
            "Age of the oldest message a stage has not settled",
            oldest_age.clone(),
        );
        registry.register(
            "sluice_dlq_depth",
            "Messages in a stage's dead-letter topic",
            dlq_depth.clone(),
        );
        registry.register(
            "sluice_inflight",
            "Deliveries a stage holds and has not settled",
            inflight.clone(),
        );
        registry.register(
            "sluice_handler_duration_seconds",
            "Time a stage's handler took per call",
            handler_duration.clone(),
        );
        registry.register(
            "sluice_claim_bytes",
            "Payload bytes moved through the claim check",
            claim_bytes.clone(),
        );
        Metrics {
            registry,
            published,
            processed,
            queue_depth,
            oldest_age,
            dlq_depth,
            inflight,
            handler_duration,
            claim_bytes,
        }
    }

    /// Counts `n` messages published to `topic`.
    pub fn count_published(&self, topic: &str, n: u64) {
        self.published
            .get_or_create(&TopicLabels {
                topic: topic.to_owned(),
            })
            .inc_by(n);
    }

    /// Counts one settled delivery of a stage.
    pub fn count_processed(&self, pipeline: &str, stage: &str, outcome: &str) {
        self.processed
            .get_or_create(&OutcomeLabels {
                pipeline: pipeline.to_owned(),
                stage: stage.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Records one handler call's duration.
    pub fn observe_handler(&self, pipeline: &str, stage: &str, seconds: f64) {
        self.handler_duration
            .get_or_create(&StageLabels {
                pipeline: pipeline.to_owned(),
                stage: stage.to_owned(),
            })
            .observe(seconds);
    }

    /// The total of `sluice_messages_processed_total` for a stage, over all
    /// outcomes (for rates in `status`).
    pub fn processed_total(&self, pipeline: &str, stage: &str) -> u64 {
        // Family has no iteration API; the engine's outcomes are a small
        // fixed set, so sum the known ones.
        let mut total = 0;
        for outcome in outcomes() {
            let labels = OutcomeLabels {
                pipeline: pipeline.to_owned(),
                stage: stage.to_owned(),
                outcome: outcome.to_owned(),
            };
            if let Some(counter) = self.processed.get(&labels) {
                total += counter.get();
            }
        }
        total
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The `outcome` label values of a settled delivery that did not fail
/// (`duplicate`: a dedup key already handled, so the handler did not run).
pub const SETTLED_OUTCOMES: [&str; 4] = ["ok", "duplicate", "skipped", "dead-lettered"];

/// Every `outcome` label value the engine uses: [`SETTLED_OUTCOMES`], then
/// each failure kind's name (an attempt that failed and will be retried).
pub fn outcomes() -> impl Iterator<Item = &'static str> {
    SETTLED_OUTCOMES
        .into_iter()
        .chain(FailureKind::ALL.iter().map(|kind| kind.as_str()))
}
