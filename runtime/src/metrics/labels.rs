//! The label sets of the daemon's metrics: one struct per set of label
//! names, so a series cannot be written with a label missing or misspelt.

use prometheus_client::encoding::EncodeLabelSet;

/// Labels of per-topic metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TopicLabels {
    /// The topic.
    pub topic: String,
}

/// Labels of the store's per-keyspace metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyspaceLabels {
    /// The keyspace.
    pub keyspace: String,
}

/// Labels of `sluice_store_memory_bytes`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreMemoryLabels {
    /// The keyspace (`*`: shared by all).
    pub keyspace: String,
    /// `memtables`, `filters`, `indexes` or `cache`.
    pub part: String,
}

/// Labels of per-stage metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
}

/// `{pipeline, stage, host, status}`: a stage's outbound HTTP requests.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
    /// The host as its `http.allow` entry lists it; empty for a host not
    /// listed (so a handler cannot grow the label set).
    pub host: String,
    /// `2xx` .. `5xx`, or `refused`, `held`, `timeout`, `failed`.
    pub status: String,
}

/// `{pipeline, stage, host}`: the latency of a stage's requests to a host.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpHostLabels {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
    /// The host as its `http.allow` entry lists it.
    pub host: String,
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

/// Labels of `sluice_ingest_responses_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    /// The HTTP status ingest answered: 202, 400, 413, 429, 503, ...
    pub status: String,
}

/// Labels of per-source metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    /// The pipeline.
    pub pipeline: String,
    /// The source.
    pub source: String,
}

/// Labels of per-partition source metrics (a Kafka source's lag).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    /// The pipeline.
    pub pipeline: String,
    /// The source.
    pub source: String,
    /// The upstream partition (`3`, or `<topic>:3`).
    pub partition: String,
}

/// Labels of per-connector metrics (sources and sinks).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectorLabels {
    /// `<pipeline>/<name>`.
    pub connector: String,
}

/// Labels of `sluice_config_reloads_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `success` or `failure`.
    pub result: String,
}

/// Labels of `sluice_build_info`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// This build's version.
    pub version: String,
}

/// The ingest statuses counted from the first scrape, at zero.
pub const INGEST_STATUSES: [u16; 5] = [202, 400, 413, 429, 503];

/// `{pipeline, stage, kind}`: a stage's dead letters by failure kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
    /// The kind of the last failure (`rejected`, `timeout`, ...).
    pub kind: String,
}

/// `{pipeline, stage, topic}`: one priority lane of a stage.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabels {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
    /// The lane's topic.
    pub topic: String,
}
