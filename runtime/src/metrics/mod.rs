//! The daemon's Prometheus metrics, under the stable names registered in
//! [`Metrics::new`] (`families.rs`); operators' dashboards and alerts rely
//! on them. The engine and the ingest path count into [`Metrics`]; gauges
//! that describe the broker (depth, age, in-flight, DLQ depth) are read
//! from it when `/metrics` is scraped, so they are never stale.
//!
//! This file holds the registry and what the rest of Sluice calls on it;
//! `labels.rs` the label sets, `exposition.rs` the Prometheus 0.0.4 text,
//! `process.rs` the process gauges, `windows.rs` the structures the engine
//! records into beside the histograms.

mod exposition;
mod families;
mod labels;
mod process;
mod windows;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::broker::StoreMemory;
use crate::failure::FailureKind;

pub use labels::{
    BuildLabels, ConnectorLabels, DirectionLabels, HttpHostLabels, HttpLabels, INGEST_STATUSES,
    KeyspaceLabels, KindLabels, LaneLabels, OutcomeLabels, PartitionLabels, ReloadLabels,
    SourceLabels, StageLabels, StatusLabels, StoreMemoryLabels, TopicLabels,
};
pub use windows::{LaneWaits, LatencyWindow};

/// Per `(pipeline, source)`, the lag of each partition last reported.
type PartitionLags = BTreeMap<(String, String), Vec<(String, u64)>>;

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
    /// `sluice_sink_objects_total{connector}`: objects an object-store
    /// sink completed in its store.
    pub sink_objects: Family<ConnectorLabels, Counter>,
    /// `sluice_sink_object_bytes_total{connector}`: their bytes.
    pub sink_object_bytes: Family<ConnectorLabels, Counter>,
    /// `sluice_sink_object_records_total{connector}`: the records in them.
    pub sink_object_records: Family<ConnectorLabels, Counter>,
    /// `sluice_sink_open_files{connector}`: files an object-store sink is
    /// filling.
    pub sink_open_files: Family<ConnectorLabels, Gauge>,
    /// `sluice_sink_oldest_unflushed_seconds{connector}`: how long the
    /// oldest record not yet in the store has waited in an open file.
    pub sink_oldest_unflushed: Family<ConnectorLabels, Gauge<f64, AtomicU64>>,
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

impl Metrics {
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
        exposition::openmetrics_to_prometheus(&self.encode())
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
}
