//! The daemon's Prometheus metrics, under the stable names registered in
//! [`Metrics::new`]; operators' dashboards and alerts rely on them. The
//! engine and the ingest path count into [`Metrics`]; gauges that
//! describe the broker (depth, age, in-flight, DLQ depth) are read from it
//! when `/metrics` is scraped, so they are never stale.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::broker::StoreMemory;
use crate::failure::FailureKind;

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

/// Per `(pipeline, source)`, the lag of each partition last reported.
type PartitionLags = BTreeMap<(String, String), Vec<(String, u64)>>;

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

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    /// `sluice_messages_published_total{topic}`.
    pub published: Family<TopicLabels, Counter>,
    /// `sluice_messages_processed_total{pipeline,stage,outcome}`.
    pub processed: Family<OutcomeLabels, Counter>,
    /// `sluice_dead_letters_total{pipeline,stage,kind}`: what the
    /// `dead-lettered` outcome does not say, the kind of failure that
    /// ended each.
    pub dead_letters: Family<KindLabels, Counter>,
    /// `sluice_queue_depth{pipeline,stage}`.
    pub queue_depth: Family<StageLabels, Gauge>,
    /// `sluice_oldest_message_age_seconds{pipeline,stage}`.
    pub oldest_age: Family<StageLabels, Gauge<f64, AtomicU64>>,
    /// `sluice_dlq_depth{pipeline,stage}`.
    pub dlq_depth: Family<StageLabels, Gauge>,
    /// `sluice_inflight{pipeline,stage}`.
    pub inflight: Family<StageLabels, Gauge>,
    /// `sluice_stage_paused{pipeline,stage}`: 1 while the operator holds it.
    pub stage_paused: Family<StageLabels, Gauge>,
    /// `sluice_delayed_messages{pipeline,stage}`: messages on the stage's
    /// topic waiting for their due time.
    pub delayed: Family<StageLabels, Gauge>,
    /// `sluice_concurrency_limit{pipeline,stage}`: the calls a stage may
    /// run at once now (its adaptive limit, or its fixed concurrency).
    pub concurrency_limit: Family<StageLabels, Gauge>,
    /// `sluice_stage_hold_until_timestamp_seconds{pipeline,stage}`: when the
    /// stage's current or last hold (after a `Retry-After`) ends; 0 if it
    /// never held.
    pub hold_until: Family<StageLabels, Gauge<f64, AtomicU64>>,
    /// `sluice_next_due_seconds{pipeline,stage}`: how soon the next of
    /// them is due (0 when none, or when the broker cannot tell cheaply).
    pub next_due: Family<StageLabels, Gauge<f64, AtomicU64>>,
    /// `sluice_handler_duration_seconds{pipeline,stage}`.
    pub handler_duration: Family<StageLabels, Histogram>,
    /// `sluice_http_requests_total{pipeline,stage,host,status}`: handlers'
    /// outbound requests, by outcome.
    pub http_requests: Family<HttpLabels, Counter>,
    /// `sluice_http_request_duration_seconds{pipeline,stage,host}`: from
    /// sending a request to its answer's headers.
    http_duration: Family<HttpHostLabels, Histogram>,
    /// The hosts each stage's `http_duration` has a series for, so a
    /// removed stage's can be dropped.
    http_hosts: std::sync::Mutex<HashMap<StageLabels, std::collections::BTreeSet<String>>>,
    /// `sluice_lane_wait_seconds{pipeline,stage,topic}`: for a stage with
    /// priority lanes, how long each first delivery waited from its publish
    /// until a worker slot took it up.
    pub lane_wait: Family<LaneLabels, Histogram>,
    /// The recent waits of each lane, for `status`'s p50 and p99.
    lane_windows: std::sync::Mutex<HashMap<LaneLabels, Arc<LaneWaits>>>,
    /// Each stage's handler durations since the console's history last
    /// took them (not exported: the histogram above is).
    handler_windows: Family<StageLabels, Arc<LatencyWindow>>,
    /// `sluice_claim_bytes_total{direction}`.
    pub claim_bytes: Family<DirectionLabels, Counter>,
    /// `sluice_ingest_responses_total{status}`.
    pub ingest_responses: Family<StatusLabels, Counter>,
    /// `sluice_storage_errors_total`, following the broker's own count.
    pub storage_errors: Counter,
    /// `sluice_source_messages_total{pipeline,source}`: upstream messages a
    /// source published into its topic (and acked upstream).
    pub source_messages: Family<SourceLabels, Counter>,
    /// `sluice_source_lag{pipeline,source}`: messages waiting upstream,
    /// where the upstream can tell.
    pub source_lag: Family<SourceLabels, Gauge>,
    /// `sluice_source_partition_lag{pipeline,source,partition}`: messages
    /// waiting in each upstream partition this daemon reads (Kafka).
    pub source_partition_lag: Family<PartitionLabels, Gauge>,
    /// The partitions each source last reported, for `status` and to drop
    /// the gauges of partitions it no longer reads.
    partition_lags: std::sync::Mutex<PartitionLags>,
    /// `sluice_connector_up{connector}`: 1 while the connector reaches its
    /// outside system, 0 during an outage.
    pub connector_up: Family<ConnectorLabels, Gauge>,
    /// `sluice_connector_outages_total{connector}`.
    pub connector_outages: Family<ConnectorLabels, Counter>,
    /// `sluice_store_memory_bytes{keyspace,part}`: what the embedded
    /// store holds in memory, read at scrape time.
    pub store_memory: Family<StoreMemoryLabels, Gauge>,
    /// `sluice_store_tables{keyspace}`: the store's tables on disk.
    pub store_tables: Family<KeyspaceLabels, Gauge>,
    /// `sluice_store_levels{keyspace}`: levels of each keyspace's tree
    /// that hold tables.
    pub store_levels: Family<KeyspaceLabels, Gauge>,
    /// `process_resident_memory_bytes`, read at scrape time.
    pub resident_memory: Gauge,
    /// `process_open_fds`, read at scrape time.
    pub open_fds: Gauge,
    /// `process_start_time_seconds`.
    pub start_time: Gauge<f64, AtomicU64>,
    /// `sluice_config_reloads_total{result}`: reloads tried, by result.
    pub reloads: Family<ReloadLabels, Counter>,
    /// `sluice_config_last_reload_successful`: 1 when the last reload (or
    /// the start) succeeded, 0 when it failed and the daemon runs its
    /// previous configuration.
    pub last_reload_successful: Gauge,
    /// `sluice_config_last_reload_success_timestamp_seconds`: when the
    /// running configuration was loaded (Unix seconds).
    pub last_reload_success: Gauge<f64, AtomicU64>,
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
        let dead_letters = Family::<KindLabels, Counter>::default();
        let queue_depth = Family::<StageLabels, Gauge>::default();
        let oldest_age = Family::<StageLabels, Gauge<f64, AtomicU64>>::default();
        let dlq_depth = Family::<StageLabels, Gauge>::default();
        let inflight = Family::<StageLabels, Gauge>::default();
        let stage_paused = Family::<StageLabels, Gauge>::default();
        let delayed = Family::<StageLabels, Gauge>::default();
        let next_due = Family::<StageLabels, Gauge<f64, AtomicU64>>::default();
        let hold_until = Family::<StageLabels, Gauge<f64, AtomicU64>>::default();
        let concurrency_limit = Family::<StageLabels, Gauge>::default();
        let handler_duration = Family::<StageLabels, Histogram>::new_with_constructor(|| {
            // 50 µs .. ~100 s.
            Histogram::new(exponential_buckets(0.000_05, 2.0, 22))
        });
        let http_requests = Family::<HttpLabels, Counter>::default();
        let http_duration = Family::<HttpHostLabels, Histogram>::new_with_constructor(|| {
            // 100 µs .. ~100 s.
            Histogram::new(exponential_buckets(0.000_1, 2.0, 21))
        });
        let lane_wait = Family::<LaneLabels, Histogram>::new_with_constructor(|| {
            // 100 µs .. ~30 min.
            Histogram::new(exponential_buckets(0.000_1, 2.0, 25))
        });
        let claim_bytes = Family::<DirectionLabels, Counter>::default();
        let ingest_responses = Family::<StatusLabels, Counter>::default();
        let storage_errors = Counter::default();
        let source_messages = Family::<SourceLabels, Counter>::default();
        let source_lag = Family::<SourceLabels, Gauge>::default();
        let source_partition_lag = Family::<PartitionLabels, Gauge>::default();
        let connector_up = Family::<ConnectorLabels, Gauge>::default();
        let connector_outages = Family::<ConnectorLabels, Counter>::default();
        let store_memory = Family::<StoreMemoryLabels, Gauge>::default();
        let store_tables = Family::<KeyspaceLabels, Gauge>::default();
        let store_levels = Family::<KeyspaceLabels, Gauge>::default();
        let resident_memory = Gauge::default();
        let open_fds = Gauge::default();
        let start_time = Gauge::<f64, AtomicU64>::default();
        let build_info = Family::<BuildLabels, Gauge>::default();
        let reloads = Family::<ReloadLabels, Counter>::default();
        let last_reload_successful = Gauge::default();
        let last_reload_success = Gauge::<f64, AtomicU64>::default();
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
            "sluice_dead_letters",
            "Messages a stage dead-lettered, by the kind of their last failure",
            dead_letters.clone(),
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
            "sluice_stage_paused",
            "1 while an operator has paused the stage (sluice stage pause), else 0",
            stage_paused.clone(),
        );
        registry.register(
            "sluice_delayed_messages",
            "Messages on a stage's topic waiting for their due time (Sluice-Delay, retries)",
            delayed.clone(),
        );
        registry.register(
            "sluice_next_due_seconds",
            "Seconds until the next delayed message on a stage's topic is due (0: none, or unknown: over 10,000 delayed on NATS)",
            next_due.clone(),
        );
        registry.register(
            "sluice_concurrency_limit",
            "Calls a stage may run at once now: its adaptive limit, or its fixed concurrency",
            concurrency_limit.clone(),
        );
        registry.register(
            "sluice_stage_hold_until_timestamp_seconds",
            "When a stage's hold after a Retry-After ends (Unix seconds; 0: it never held)",
            hold_until.clone(),
        );
        registry.register(
            "sluice_handler_duration_seconds",
            "Time a stage's handler took per call",
            handler_duration.clone(),
        );
        registry.register(
            "sluice_http_requests",
            "Handlers' outbound HTTP requests per stage and host, by status class or why none was answered (refused, held, timeout, failed)",
            http_requests.clone(),
        );
        registry.register(
            "sluice_http_request_duration_seconds",
            "Time from sending a handler's outbound request to its answer, per stage and host",
            http_duration.clone(),
        );
        registry.register(
            "sluice_lane_wait_seconds",
            "For a stage with priority lanes: how long a message waited from its publish until a worker slot took it, per lane",
            lane_wait.clone(),
        );
        registry.register(
            "sluice_claim_bytes",
            "Payload bytes moved through the claim check",
            claim_bytes.clone(),
        );
        registry.register(
            "sluice_ingest_responses",
            "Ingest requests answered, by HTTP status",
            ingest_responses.clone(),
        );
        registry.register(
            "sluice_storage_errors",
            "Storage errors the broker has seen (I/O failures, checksum mismatches)",
            storage_errors.clone(),
        );
        registry.register(
            "sluice_source_messages",
            "Upstream messages a source published into its topic",
            source_messages.clone(),
        );
        registry.register(
            "sluice_source_lag",
            "Messages waiting upstream of a source, where the upstream can tell",
            source_lag.clone(),
        );
        registry.register(
            "sluice_source_partition_lag",
            "Messages waiting in each upstream partition a source reads (Kafka)",
            source_partition_lag.clone(),
        );
        registry.register(
            "sluice_connector_up",
            "1 while a source or sink reaches its outside system, 0 during an outage",
            connector_up.clone(),
        );
        registry.register(
            "sluice_connector_outages",
            "Outages of a source's or sink's outside system",
            connector_outages.clone(),
        );
        registry.register(
            "sluice_store_memory_bytes",
            "Memory the embedded store holds, by keyspace and part (memtables, filters, indexes; keyspace \"*\" for the shared block cache)",
            store_memory.clone(),
        );
        registry.register(
            "sluice_store_tables",
            "Tables the embedded store keeps on disk, by keyspace",
            store_tables.clone(),
        );
        registry.register(
            "sluice_store_levels",
            "Levels of each keyspace's tree in the embedded store that hold tables",
            store_levels.clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            resident_memory.clone(),
        );
        registry.register(
            "process_open_fds",
            "Number of open file descriptors",
            open_fds.clone(),
        );
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            start_time.clone(),
        );
        registry.register(
            "sluice_build_info",
            "Always 1; the labels say which build runs",
            build_info.clone(),
        );
        registry.register(
            "sluice_config_reloads",
            "Configuration reloads tried (SIGHUP, --watch, POST /v1/reload), by result",
            reloads.clone(),
        );
        registry.register(
            "sluice_config_last_reload_successful",
            "1 if the last reload succeeded (or none was tried), 0 if it failed and the previous configuration runs",
            last_reload_successful.clone(),
        );
        registry.register(
            "sluice_config_last_reload_success_timestamp_seconds",
            "When the running configuration was loaded: the start or the last successful reload (Unix seconds)",
            last_reload_success.clone(),
        );
        for result in ["success", "failure"] {
            let _ = reloads.get_or_create(&ReloadLabels {
                result: result.to_owned(),
            });
        }
        last_reload_successful.set(1);
        last_reload_success.set(process_start_time());
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        start_time.set(process_start_time());
        for status in INGEST_STATUSES {
            let _ = ingest_responses.get_or_create(&StatusLabels {
                status: status.to_string(),
            });
        }
        Metrics {
            registry,
            published,
            processed,
            dead_letters,
            queue_depth,
            oldest_age,
            dlq_depth,
            inflight,
            stage_paused,
            delayed,
            next_due,
            hold_until,
            concurrency_limit,
            handler_duration,
            http_requests,
            http_duration,
            http_hosts: std::sync::Mutex::default(),
            lane_wait,
            lane_windows: std::sync::Mutex::default(),
            handler_windows: Family::default(),
            claim_bytes,
            ingest_responses,
            storage_errors,
            source_messages,
            source_lag,
            source_partition_lag,
            partition_lags: std::sync::Mutex::default(),
            connector_up,
            connector_outages,
            store_memory,
            store_tables,
            store_levels,
            resident_memory,
            open_fds,
            start_time,
            reloads,
            last_reload_successful,
            last_reload_success,
        }
    }

    /// Counts a reload: its result, and when it succeeded, that the
    /// running configuration is from now.
    pub fn count_reload(&self, succeeded: bool) {
        let result = if succeeded { "success" } else { "failure" };
        self.reloads
            .get_or_create(&ReloadLabels {
                result: result.to_owned(),
            })
            .inc();
        self.last_reload_successful.set(i64::from(succeeded));
        if succeeded {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            self.last_reload_success.set(now.as_secs_f64());
        }
    }

    /// Drops the gauges and the latency histogram of a stage a reload
    /// removed, so `/metrics` shows no frozen values for it. Its counters
    /// stay: a counter that vanished and came back would look like a reset.
    pub fn forget_stage(&self, pipeline: &str, stage: &str) {
        let labels = StageLabels {
            pipeline: pipeline.to_owned(),
            stage: stage.to_owned(),
        };
        self.queue_depth.remove(&labels);
        self.oldest_age.remove(&labels);
        self.dlq_depth.remove(&labels);
        self.inflight.remove(&labels);
        self.stage_paused.remove(&labels);
        self.delayed.remove(&labels);
        self.next_due.remove(&labels);
        self.hold_until.remove(&labels);
        self.concurrency_limit.remove(&labels);
        self.handler_duration.remove(&labels);
        self.handler_windows.remove(&labels);
        let hosts = self
            .http_hosts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&labels)
            .unwrap_or_default();
        for host in hosts {
            self.http_duration.remove(&HttpHostLabels {
                pipeline: pipeline.to_owned(),
                stage: stage.to_owned(),
                host,
            });
        }
    }

    /// Records how long a handler's request to `host` (its `allow` entry,
    /// empty if not listed) took to be answered.
    pub fn observe_http(&self, pipeline: &str, stage: &str, host: &str, seconds: f64) {
        let labels = HttpHostLabels {
            pipeline: pipeline.to_owned(),
            stage: stage.to_owned(),
            host: host.to_owned(),
        };
        self.http_duration.get_or_create(&labels).observe(seconds);
        self.http_hosts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(StageLabels {
                pipeline: pipeline.to_owned(),
                stage: stage.to_owned(),
            })
            .or_default()
            .insert(host.to_owned());
    }

    /// The wait recorder of one priority lane (created on first use).
    pub fn lane_waits(&self, pipeline: &str, stage: &str, topic: &str) -> Arc<LaneWaits> {
        let labels = LaneLabels {
            pipeline: pipeline.to_owned(),
            stage: stage.to_owned(),
            topic: topic.to_owned(),
        };
        let histogram = self.lane_wait.get_or_create(&labels).clone();
        self.lane_windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(labels)
            .or_insert_with(|| Arc::new(LaneWaits::new(histogram)))
            .clone()
    }

    /// A lane's recent wait p50 and p99, in seconds; `None` before any.
    pub fn lane_wait_quantiles(
        &self,
        pipeline: &str,
        stage: &str,
        topic: &str,
    ) -> Option<(f64, f64)> {
        let labels = LaneLabels {
            pipeline: pipeline.to_owned(),
            stage: stage.to_owned(),
            topic: topic.to_owned(),
        };
        let waits = self
            .lane_windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&labels)
            .cloned()?;
        waits.quantiles()
    }

    /// Registers a connector as up, so its gauge (and its outage count, at
    /// zero) shows from the first scrape.
    pub fn connector_started(&self, connector: &str) {
        let labels = ConnectorLabels {
            connector: connector.to_owned(),
        };
        self.connector_up.get_or_create(&labels).set(1);
        // At zero from the first scrape, so `increase()` sees the first outage.
        let _ = self.connector_outages.get_or_create(&labels);
    }

    /// Drops the up/down gauge of a connector a reload removed (its
    /// outage counter stays, as counters do).
    pub fn forget_connector(&self, connector: &str) {
        self.connector_up.remove(&ConnectorLabels {
            connector: connector.to_owned(),
        });
    }

    /// A connector's outage began.
    pub fn connector_outage(&self, connector: &str) {
        let labels = ConnectorLabels {
            connector: connector.to_owned(),
        };
        self.connector_up.get_or_create(&labels).set(0);
        self.connector_outages.get_or_create(&labels).inc();
    }

    /// A connector's outage ended.
    pub fn connector_recovered(&self, connector: &str) {
        self.connector_up
            .get_or_create(&ConnectorLabels {
                connector: connector.to_owned(),
            })
            .set(1);
    }

    /// Counts `n` upstream messages a source published.
    pub fn count_source(&self, pipeline: &str, source: &str, n: u64) {
        self.source_messages
            .get_or_create(&SourceLabels {
                pipeline: pipeline.to_owned(),
                source: source.to_owned(),
            })
            .inc_by(n);
    }

    /// Sets a source's upstream lag.
    pub fn set_source_lag(&self, pipeline: &str, source: &str, lag: u64) {
        self.source_lag
            .get_or_create(&SourceLabels {
                pipeline: pipeline.to_owned(),
                source: source.to_owned(),
            })
            .set(i64::try_from(lag).unwrap_or(i64::MAX));
    }

    /// Sets a source's lag per upstream partition (the partitions it reads
    /// now; gauges of partitions it no longer reads are removed).
    pub fn set_source_partition_lag(&self, pipeline: &str, source: &str, lags: &[(String, u64)]) {
        let labels = |partition: &str| PartitionLabels {
            pipeline: pipeline.to_owned(),
            source: source.to_owned(),
            partition: partition.to_owned(),
        };
        let mut known = self
            .partition_lags
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (pipeline.to_owned(), source.to_owned());
        if let Some(before) = known.get(&key) {
            for (partition, _) in before {
                if !lags.iter().any(|(p, _)| p == partition) {
                    self.source_partition_lag.remove(&labels(partition));
                }
            }
        }
        for (partition, lag) in lags {
            self.source_partition_lag
                .get_or_create(&labels(partition))
                .set(i64::try_from(*lag).unwrap_or(i64::MAX));
        }
        known.insert(key, lags.to_vec());
    }

    /// A source's last lag per upstream partition (empty if it has none).
    pub fn source_partition_lag_values(&self, pipeline: &str, source: &str) -> Vec<(String, u64)> {
        self.partition_lags
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&(pipeline.to_owned(), source.to_owned()))
            .cloned()
            .unwrap_or_default()
    }

    /// A source's upstream lag, if it has reported one.
    pub fn source_lag_value(&self, pipeline: &str, source: &str) -> Option<u64> {
        let labels = SourceLabels {
            pipeline: pipeline.to_owned(),
            source: source.to_owned(),
        };
        // `get` without creating: a source that never reported shows none.
        self.source_lag
            .get(&labels)
            .map(|gauge| u64::try_from(gauge.get()).unwrap_or_default())
    }

    /// Upstream messages a source has published so far.
    pub fn source_total(&self, pipeline: &str, source: &str) -> u64 {
        self.source_messages
            .get_or_create(&SourceLabels {
                pipeline: pipeline.to_owned(),
                source: source.to_owned(),
            })
            .get()
    }

    /// Counts one ingest answer of HTTP status `status`.
    pub fn count_ingest_response(&self, status: u16) {
        self.ingest_responses
            .get_or_create(&StatusLabels {
                status: status.to_string(),
            })
            .inc();
    }

    /// Brings `sluice_storage_errors_total` up to the broker's own count
    /// (a counter only rises; a broker reopened with a lower count adds
    /// nothing until it passes the old one).
    pub fn observe_storage_errors(&self, total: u64) {
        let seen = self.storage_errors.get();
        if total > seen {
            self.storage_errors.inc_by(total - seen);
        }
    }

    /// Reads the process gauges (resident memory, open descriptors) from
    /// `/proc`; on other systems they stay at zero.
    pub fn refresh_process(&self) {
        if let Some(rss) = resident_memory_bytes() {
            self.resident_memory
                .set(i64::try_from(rss).unwrap_or(i64::MAX));
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            // One entry is the directory handle read_dir itself holds.
            let n = entries.count().saturating_sub(1);
            self.open_fds.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Sets the store gauges from `memory` ([`Broker::store_memory`]).
    ///
    /// [`Broker::store_memory`]: crate::broker::Broker::store_memory
    pub fn observe_store_memory(&self, memory: &StoreMemory) {
        let set = |keyspace: &str, part: &str, bytes: u64| {
            self.store_memory
                .get_or_create(&StoreMemoryLabels {
                    keyspace: keyspace.to_owned(),
                    part: part.to_owned(),
                })
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        };
        if memory.keyspaces.is_empty() {
            return;
        }
        set("*", "cache", memory.cache);
        for ks in &memory.keyspaces {
            set(ks.keyspace, "memtables", ks.memtables);
            set(ks.keyspace, "filters", ks.filters);
            set(ks.keyspace, "indexes", ks.indexes);
            let labels = KeyspaceLabels {
                keyspace: ks.keyspace.to_owned(),
            };
            self.store_tables
                .get_or_create(&labels)
                .set(i64::try_from(ks.tables).unwrap_or(i64::MAX));
            self.store_levels
                .get_or_create(&labels)
                .set(i64::try_from(ks.levels).unwrap_or(i64::MAX));
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
        let labels = StageLabels {
            pipeline: pipeline.to_owned(),
            stage: stage.to_owned(),
        };
        self.handler_duration
            .get_or_create(&labels)
            .observe(seconds);
        self.handler_windows.get_or_create(&labels).record(seconds);
    }

    /// A stage's latency window, for the engine to record into without a
    /// lookup per call.
    pub fn handler_window(&self, pipeline: &str, stage: &str) -> Arc<LatencyWindow> {
        self.handler_windows
            .get_or_create(&StageLabels {
                pipeline: pipeline.to_owned(),
                stage: stage.to_owned(),
            })
            .clone()
    }

    /// The p50 and p99 of a stage's handler durations since the last call
    /// (None when there were none), starting a new window.
    pub fn take_handler_window(&self, pipeline: &str, stage: &str) -> Option<(f64, f64)> {
        self.handler_windows
            .get(&StageLabels {
                pipeline: pipeline.to_owned(),
                stage: stage.to_owned(),
            })
            .and_then(|window| window.take())
    }

    /// Counts one message a stage dead-lettered after a failure of `kind`.
    pub fn count_dead_letter(&self, pipeline: &str, stage: &str, kind: &str) {
        self.dead_letters
            .get_or_create(&KindLabels {
                pipeline: pipeline.to_owned(),
                stage: stage.to_owned(),
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// A stage's dead letters so far by the kind of their last failure, in
    /// the order of [`FailureKind::ALL`].
    pub fn dead_letters_by_kind(&self, pipeline: &str, stage: &str) -> Vec<(&'static str, u64)> {
        FailureKind::ALL
            .iter()
            .map(|kind| {
                let labels = KindLabels {
                    pipeline: pipeline.to_owned(),
                    stage: stage.to_owned(),
                    kind: kind.as_str().to_owned(),
                };
                (
                    kind.as_str(),
                    self.dead_letters.get(&labels).map_or(0, |c| c.get()),
                )
            })
            .collect()
    }

    /// A stage's settled and failed deliveries so far, by outcome, in the
    /// order of [`outcomes`].
    pub fn processed_by_outcome(&self, pipeline: &str, stage: &str) -> Vec<(&'static str, u64)> {
        outcomes()
            .map(|outcome| {
                let labels = OutcomeLabels {
                    pipeline: pipeline.to_owned(),
                    stage: stage.to_owned(),
                    outcome: outcome.to_owned(),
                };
                (outcome, self.processed.get(&labels).map_or(0, |c| c.get()))
            })
            .collect()
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

    /// The OpenMetrics 1.0 text exposition of every metric (what
    /// prometheus-client writes: counter families named without `_total`,
    /// a closing `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The Prometheus text format 0.0.4 of every metric: the OpenMetrics
    /// text with each counter family named as its samples are
    /// (`..._total`) and no `# EOF`, so a parser of the classic format
    /// types every counter as a counter.
    pub fn encode_prometheus(&self) -> String {
        openmetrics_to_prometheus(&self.encode())
    }
}

/// Rewrites OpenMetrics text into Prometheus text format 0.0.4.
fn openmetrics_to_prometheus(text: &str) -> String {
    let counters: std::collections::HashSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(text.len() + 16 * counters.len());
    for line in text.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let rewritten = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            (counters.contains(name) && !name.ends_with("_total"))
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match rewritten {
            Some(line) => out.push_str(line.trim_end()),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The resident set size, from `/proc/self/status` (`VmRSS`, in kB).
fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// When this process started, in seconds since the Unix epoch: its start
/// in clock ticks after boot (`/proc/self/stat`) plus the boot time
/// (`/proc/stat`), at the usual 100 ticks a second; else now.
fn process_start_time() -> f64 {
    let from_proc = || -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which is in parentheses.
        let after = stat.rsplit_once(')')?.1;
        let ticks: f64 = after.split_whitespace().nth(19)?.parse().ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let btime: f64 = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        Some(btime + ticks / 100.0)
    };
    from_proc().unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    })
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

/// Buckets of a [`LatencyWindow`]: a quarter of a doubling apart from
/// [`WINDOW_FIRST`], so a quantile read off them is at most 19 % high, up
/// to about 40 minutes.
const WINDOW_BUCKETS: usize = 112;
/// The upper bound of a [`LatencyWindow`]'s first bucket, in seconds.
const WINDOW_FIRST: f64 = 1e-5;

/// Durations counted into fine log-spaced buckets until taken: the
/// quantiles of one interval of a stage's history, in fixed memory and
/// without a lock on the hot path.
pub struct LatencyWindow {
    counts: [std::sync::atomic::AtomicU64; WINDOW_BUCKETS],
}

impl Default for LatencyWindow {
    fn default() -> Self {
        LatencyWindow {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl LatencyWindow {
    /// Counts one duration.
    pub fn record(&self, seconds: f64) {
        let index = if seconds > WINDOW_FIRST {
            ((seconds / WINDOW_FIRST).log2() * 4.0).ceil() as usize
        } else {
            0
        };
        self.counts[index.min(WINDOW_BUCKETS - 1)]
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The p50 and p99 (each its bucket's upper bound) of what was
    /// counted since the last take, emptying the window; None when empty.
    pub fn take(&self) -> Option<(f64, f64)> {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.swap(0, std::sync::atomic::Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let at = |q: f64| {
            let rank = ((total as f64 * q).ceil() as u64).max(1);
            let mut seen = 0;
            for (index, count) in counts.iter().enumerate() {
                seen += count;
                if seen >= rank {
                    return WINDOW_FIRST * 2f64.powf(index as f64 / 4.0);
                }
            }
            WINDOW_FIRST * 2f64.powf((WINDOW_BUCKETS - 1) as f64 / 4.0)
        };
        Some((at(0.5), at(0.99)))
    }
}

/// How many recent waits a lane keeps for its quantiles.
const LANE_WINDOW: usize = 1024;

/// One priority lane's waits: the histogram `/metrics` exports, and the
/// last [`LANE_WINDOW`] waits, from which `status` reads a p50 and p99 of
/// now rather than since start.
pub struct LaneWaits {
    histogram: Histogram,
    recent: std::sync::Mutex<std::collections::VecDeque<u32>>,
}

impl LaneWaits {
    fn new(histogram: Histogram) -> LaneWaits {
        LaneWaits {
            histogram,
            recent: std::sync::Mutex::new(std::collections::VecDeque::with_capacity(LANE_WINDOW)),
        }
    }

    /// Records the wait of a message published at `published_at` (ms since
    /// the epoch), ending now.
    pub fn record(&self, published_at: u64) {
        let micros = crate::broker::now_millis()
            .saturating_sub(published_at)
            .saturating_mul(1000);
        self.histogram.observe(micros as f64 / 1e6);
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if recent.len() == LANE_WINDOW {
            recent.pop_front();
        }
        recent.push_back(u32::try_from(micros / 1000).unwrap_or(u32::MAX));
    }

    /// The p50 and p99 of the recent waits, in seconds.
    pub fn quantiles(&self) -> Option<(f64, f64)> {
        let mut waits: Vec<u32> = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .copied()
            .collect();
        if waits.is_empty() {
            return None;
        }
        waits.sort_unstable();
        let at = |q: f64| {
            let index = ((waits.len() as f64 * q).ceil() as usize).clamp(1, waits.len()) - 1;
            f64::from(waits[index]) / 1000.0
        };
        Some((at(0.5), at(0.99)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_stage_loses_its_http_latency_series_and_keeps_its_counts() {
        let metrics = Metrics::new();
        metrics.observe_http("p", "gone", "api.example.com", 0.01);
        metrics.observe_http("p", "gone", "", 0.02);
        metrics.observe_http("p", "kept", "api.example.com", 0.03);
        metrics
            .http_requests
            .get_or_create(&HttpLabels {
                pipeline: "p".into(),
                stage: "gone".into(),
                host: "api.example.com".into(),
                status: "2xx".into(),
            })
            .inc();
        let series = |text: &str, stage: &str| {
            text.lines()
                .filter(|l| {
                    l.starts_with("sluice_http_request_duration_seconds_count")
                        && l.contains(&format!("stage=\"{stage}\""))
                })
                .count()
        };
        let before = metrics.encode();
        assert_eq!(series(&before, "gone"), 2, "{before}");
        metrics.forget_stage("p", "gone");
        let after = metrics.encode();
        assert_eq!(series(&after, "gone"), 0, "{after}");
        assert_eq!(series(&after, "kept"), 1, "{after}");
        assert!(
            after.lines().any(
                |l| l.starts_with("sluice_http_requests_total") && l.contains("stage=\"gone\"")
            ),
            "counters stay: {after}"
        );
    }

    #[test]
    fn a_latency_window_reads_quantiles_within_a_bucket_and_empties() {
        let window = LatencyWindow::default();
        assert_eq!(window.take(), None);
        for _ in 0..98 {
            window.record(0.002);
        }
        window.record(0.5);
        window.record(0.5);
        let (p50, p99) = window.take().expect("counted");
        assert!((0.002..0.002 * 1.19).contains(&p50), "{p50}");
        assert!((0.5..0.5 * 1.19).contains(&p99), "{p99}");
        assert_eq!(window.take(), None, "a take empties the window");
        window.record(0.0);
        window.record(1e9);
        assert!(
            window.take().is_some(),
            "out-of-range values land in the end buckets"
        );
    }

    #[test]
    fn prometheus_text_names_counter_families_with_total_and_has_no_eof() {
        let metrics = Metrics::new();
        metrics.count_published("orders", 3);
        let om = metrics.encode();
        assert!(
            om.contains("# TYPE sluice_messages_published counter"),
            "{om}"
        );
        assert!(om.trim_end().ends_with("# EOF"));
        let text = metrics.encode_prometheus();
        assert!(
            text.contains("# TYPE sluice_messages_published_total counter"),
            "{text}"
        );
        assert!(
            text.contains("# HELP sluice_messages_published_total "),
            "{text}"
        );
        assert!(text.contains("sluice_messages_published_total{topic=\"orders\"} 3"));
        assert!(!text.contains("# EOF"));
        assert!(text.contains("# TYPE process_open_fds gauge"), "{text}");
        assert!(text.contains("# TYPE sluice_ingest_responses_total counter"));
        assert!(text.contains("sluice_build_info{version="));
    }
}
