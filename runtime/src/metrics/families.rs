//! Every series the daemon exports, by name and help text, registered in
//! one place. `/metrics` lists them in the order they are registered here,
//! group by group; dashboards and alerts rely on the names.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::process::process_start_time;
use super::{BuildLabels, INGEST_STATUSES, Metrics, ReloadLabels, StatusLabels};

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let metrics = Metrics::unregistered();
        let mut registry = Registry::default();
        metrics.register_messages(&mut registry);
        metrics.register_stages(&mut registry);
        metrics.register_http_and_lanes(&mut registry);
        metrics.register_edges(&mut registry);
        metrics.register_connectors(&mut registry);
        metrics.register_store(&mut registry);
        metrics.register_process(&mut registry);
        metrics.register_reloads(&mut registry);
        Metrics {
            registry,
            ..metrics
        }
    }

    /// Every family and gauge at zero, in an empty registry.
    fn unregistered() -> Self {
        Metrics {
            registry: Registry::default(),
            published: Family::default(),
            processed: Family::default(),
            dead_letters: Family::default(),
            queue_depth: Family::default(),
            oldest_age: Family::default(),
            dlq_depth: Family::default(),
            inflight: Family::default(),
            stage_paused: Family::default(),
            delayed: Family::default(),
            next_due: Family::default(),
            hold_until: Family::default(),
            concurrency_limit: Family::default(),
            handler_duration: Family::new_with_constructor(|| {
                // 50 µs .. ~100 s.
                Histogram::new(exponential_buckets(0.000_05, 2.0, 22))
            }),
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(|| {
                // 100 µs .. ~100 s.
                Histogram::new(exponential_buckets(0.000_1, 2.0, 21))
            }),
            http_hosts: std::sync::Mutex::default(),
            lane_wait: Family::new_with_constructor(|| {
                // 100 µs .. ~30 min.
                Histogram::new(exponential_buckets(0.000_1, 2.0, 25))
            }),
            lane_windows: std::sync::Mutex::default(),
            handler_windows: Family::default(),
            claim_bytes: Family::default(),
            ingest_responses: Family::default(),
            storage_errors: Counter::default(),
            source_messages: Family::default(),
            source_lag: Family::default(),
            source_partition_lag: Family::default(),
            partition_lags: std::sync::Mutex::default(),
            connector_up: Family::default(),
            connector_outages: Family::default(),
            sink_objects: Family::default(),
            sink_object_bytes: Family::default(),
            sink_object_records: Family::default(),
            sink_open_files: Family::default(),
            sink_oldest_unflushed: Family::default(),
            store_memory: Family::default(),
            store_tables: Family::default(),
            store_levels: Family::default(),
            resident_memory: Gauge::default(),
            open_fds: Gauge::default(),
            start_time: Gauge::default(),
            reloads: Family::default(),
            last_reload_successful: Gauge::default(),
            last_reload_success: Gauge::default(),
        }
    }

    /// The messages counted as they move: published to a topic, settled by a stage, dead-lettered.
    fn register_messages(&self, registry: &mut Registry) {
        registry.register(
            "sluice_messages_published",
            "Messages published to a topic (ingest, CLI, handler emits, DLQ)",
            self.published.clone(),
        );
        registry.register(
            "sluice_messages_processed",
            "Deliveries a stage settled, by outcome",
            self.processed.clone(),
        );
        registry.register(
            "sluice_dead_letters",
            "Messages a stage dead-lettered, by the kind of their last failure",
            self.dead_letters.clone(),
        );
    }

    /// Each stage's gauges (read from the broker and the engine at scrape time) and its handler's durations.
    fn register_stages(&self, registry: &mut Registry) {
        registry.register(
            "sluice_queue_depth",
            "Messages waiting for a stage",
            self.queue_depth.clone(),
        );
        registry.register(
            "sluice_oldest_message_age_seconds",
            "Age of the oldest message a stage has not settled",
            self.oldest_age.clone(),
        );
        registry.register(
            "sluice_dlq_depth",
            "Messages in a stage's dead-letter topic",
            self.dlq_depth.clone(),
        );
        registry.register(
            "sluice_inflight",
            "Deliveries a stage holds and has not settled",
            self.inflight.clone(),
        );
        registry.register(
            "sluice_stage_paused",
            "1 while an operator has paused the stage (sluice stage pause), else 0",
            self.stage_paused.clone(),
        );
        registry.register(
            "sluice_delayed_messages",
            "Messages on a stage's topic waiting for their due time (Sluice-Delay, retries)",
            self.delayed.clone(),
        );
        registry.register(
            "sluice_next_due_seconds",
            "Seconds until the next delayed message on a stage's topic is due (0: none, or unknown: over 10,000 delayed on NATS)",
            self.next_due.clone(),
        );
        registry.register(
            "sluice_concurrency_limit",
            "Calls a stage may run at once now: its adaptive limit, or its fixed concurrency",
            self.concurrency_limit.clone(),
        );
        registry.register(
            "sluice_stage_hold_until_timestamp_seconds",
            "When a stage's hold after a Retry-After ends (Unix seconds; 0: it never held)",
            self.hold_until.clone(),
        );
        registry.register(
            "sluice_handler_duration_seconds",
            "Time a stage's handler took per call",
            self.handler_duration.clone(),
        );
    }

    /// Handlers' outbound HTTP requests, and the waits of priority lanes.
    fn register_http_and_lanes(&self, registry: &mut Registry) {
        registry.register(
            "sluice_http_requests",
            "Handlers' outbound HTTP requests per stage and host, by status class or why none was answered (refused, held, timeout, failed)",
            self.http_requests.clone(),
        );
        registry.register(
            "sluice_http_request_duration_seconds",
            "Time from sending a handler's outbound request to its answer, per stage and host",
            self.http_duration.clone(),
        );
        registry.register(
            "sluice_lane_wait_seconds",
            "For a stage with priority lanes: how long a message waited from its publish until a worker slot took it, per lane",
            self.lane_wait.clone(),
        );
    }

    /// What passes the daemon's edges: the claim check, ingest's answers, the store's errors.
    fn register_edges(&self, registry: &mut Registry) {
        registry.register(
            "sluice_claim_bytes",
            "Payload bytes moved through the claim check",
            self.claim_bytes.clone(),
        );
        registry.register(
            "sluice_ingest_responses",
            "Ingest requests answered, by HTTP status",
            self.ingest_responses.clone(),
        );
        registry.register(
            "sluice_storage_errors",
            "Storage errors the broker has seen (I/O failures, checksum mismatches)",
            self.storage_errors.clone(),
        );
        for status in INGEST_STATUSES {
            let _ = self.ingest_responses.get_or_create(&StatusLabels {
                status: status.to_string(),
            });
        }
    }

    /// Sources (messages, lag) and every connector's outages.
    fn register_connectors(&self, registry: &mut Registry) {
        registry.register(
            "sluice_source_messages",
            "Upstream messages a source published into its topic",
            self.source_messages.clone(),
        );
        registry.register(
            "sluice_source_lag",
            "Messages waiting upstream of a source, where the upstream can tell",
            self.source_lag.clone(),
        );
        registry.register(
            "sluice_source_partition_lag",
            "Messages waiting in each upstream partition a source reads (Kafka)",
            self.source_partition_lag.clone(),
        );
        registry.register(
            "sluice_connector_up",
            "1 while a source or sink reaches its outside system, 0 during an outage",
            self.connector_up.clone(),
        );
        registry.register(
            "sluice_connector_outages",
            "Outages of a source's or sink's outside system",
            self.connector_outages.clone(),
        );
        registry.register(
            "sluice_sink_objects",
            "Objects an object-store sink completed in its store",
            self.sink_objects.clone(),
        );
        registry.register(
            "sluice_sink_object_bytes",
            "Bytes of the objects an object-store sink completed",
            self.sink_object_bytes.clone(),
        );
        registry.register(
            "sluice_sink_object_records",
            "Records in the objects an object-store sink completed",
            self.sink_object_records.clone(),
        );
        registry.register(
            "sluice_sink_open_files",
            "Files an object-store sink is filling",
            self.sink_open_files.clone(),
        );
        registry.register(
            "sluice_sink_oldest_unflushed_seconds",
            "How long the oldest record not yet in the store has waited in an object-store sink's open file",
            self.sink_oldest_unflushed.clone(),
        );
    }

    /// The embedded store's memory and tables, read at scrape time.
    fn register_store(&self, registry: &mut Registry) {
        registry.register(
            "sluice_store_memory_bytes",
            "Memory the embedded store holds, by keyspace and part (memtables, filters, indexes; keyspace \"*\" for the shared block cache)",
            self.store_memory.clone(),
        );
        registry.register(
            "sluice_store_tables",
            "Tables the embedded store keeps on disk, by keyspace",
            self.store_tables.clone(),
        );
        registry.register(
            "sluice_store_levels",
            "Levels of each keyspace's tree in the embedded store that hold tables",
            self.store_levels.clone(),
        );
    }

    /// The process's own gauges and the build.
    fn register_process(&self, registry: &mut Registry) {
        let build_info = Family::<BuildLabels, Gauge>::default();
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            self.resident_memory.clone(),
        );
        registry.register(
            "process_open_fds",
            "Number of open file descriptors",
            self.open_fds.clone(),
        );
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            self.start_time.clone(),
        );
        registry.register(
            "sluice_build_info",
            "Always 1; the labels say which build runs",
            build_info.clone(),
        );
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        self.start_time.set(process_start_time());
    }

    /// Configuration reloads and their results.
    fn register_reloads(&self, registry: &mut Registry) {
        registry.register(
            "sluice_config_reloads",
            "Configuration reloads tried (SIGHUP, --watch, POST /v1/reload), by result",
            self.reloads.clone(),
        );
        registry.register(
            "sluice_config_last_reload_successful",
            "1 if the last reload succeeded (or none was tried), 0 if it failed and the previous configuration runs",
            self.last_reload_successful.clone(),
        );
        registry.register(
            "sluice_config_last_reload_success_timestamp_seconds",
            "When the running configuration was loaded: the start or the last successful reload (Unix seconds)",
            self.last_reload_success.clone(),
        );
        for result in ["success", "failure"] {
            let _ = self.reloads.get_or_create(&ReloadLabels {
                result: result.to_owned(),
            });
        }
        self.last_reload_successful.set(1);
        self.last_reload_success.set(process_start_time());
    }
}
