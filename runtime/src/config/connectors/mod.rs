//! The connector blocks of a pipeline file (`sources:`, `sinks:`): plain
//! data, their checks and how they read for people. One file per
//! connector (`redis.rs`, `postgres.rs`, ...), the configuration reference
//! of its blocks; `tls.rs` the TLS options every block flattens in,
//! `names.rs` the SQL and command names they are checked against.
//!
//! Config names no connector code: `crate::connect` reads these blocks and
//! builds them (`SourceConfig`, `SinkConfig` are subtraits of
//! [`SourceBlock`], [`SinkBlock`]).

pub mod amqp;
pub mod http;
pub mod kafka;
pub mod mqtt;
pub mod mqtt_topic;
pub mod names;
pub mod nats;
pub mod object_store;
pub mod postgres;
pub mod postgres_statement;
pub mod redis;
pub mod sqs;
pub mod tls;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Batch, Delivery, HumanDuration, Stage, Subscribe, default_memory};

/// A problem in a connector block, at a path of keys below the block
/// (`["stream"]`), for `file:line:col` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The keys from the connector block to the offending value.
    pub path: Vec<&'static str>,
    /// What is wrong, and what would be right.
    pub message: String,
}

impl ConfigProblem {
    /// A problem at `path`.
    pub fn at(path: &[&'static str], message: impl Into<String>) -> Self {
        ConfigProblem {
            path: path.to_vec(),
            message: message.into(),
        }
    }
}

/// What config knows of every source block: its key, its checks, how it
/// reads for people. Building it into a running source is
/// `crate::connect::SourceConfig`'s (a subtrait of this one).
pub trait SourceBlock: Send + Sync {
    /// The block's key: `redis`, `postgres`.
    fn kind(&self) -> &'static str;
    /// Checks beyond what the types say (identifiers, ranges); nothing is
    /// contacted.
    fn check(&self) -> Vec<ConfigProblem>;
    /// What is valid but worth saying (a core NATS subject is read at
    /// most once): `validate` prints these as warnings, and the daemon logs
    /// them at start-up. None by default.
    fn warnings(&self) -> Vec<ConfigProblem> {
        Vec::new()
    }
    /// The upstream for people, with no password: `redis://host:6379/0
    /// stream orders-in`.
    fn describe(&self) -> String;
    /// How long after a read the same upstream message may be read again
    /// (a crash before the ack, a reclaim): the topic's duplicate window
    /// must cover it.
    fn redelivery_horizon(&self) -> Duration;
    /// The most messages one read takes (the block's `batch`).
    fn read_max(&self) -> usize;
    /// Makes the block's relative file paths (`tls_ca`) absolute against
    /// `dir`, the pipeline file's directory.
    fn resolve_paths(&mut self, dir: &Path);
}

/// What config knows of every sink block. Building it into a running sink
/// is `crate::connect::SinkConfig`'s (a subtrait of this one).
pub trait SinkBlock: Send + Sync {
    /// The block's key: `http`, `postgres`, `redis`.
    fn kind(&self) -> &'static str;
    /// Checks beyond what the types say (identifiers, URLs, ranges);
    /// nothing is contacted.
    fn check(&self) -> Vec<ConfigProblem>;
    /// What is valid but worth saying (a password sent unencrypted):
    /// `validate` prints these as warnings, and the daemon logs them at
    /// start-up. None by default.
    fn warnings(&self) -> Vec<ConfigProblem> {
        Vec::new()
    }
    /// The target for people, with no password or secret.
    fn describe(&self) -> String;
    /// Makes the block's relative file paths (`tls_ca`) absolute against
    /// `dir`, the pipeline file's directory.
    fn resolve_paths(&mut self, dir: &Path);
}

/// A part a connector block flattens in (`#[serde(flatten)]`), read on
/// its own from the block's YAML. serde reads a flattened part only after
/// the whole block, from values it has buffered without their positions,
/// so an error in it would point at the block; read alone (it denies no
/// unknown keys, so it skips the block's others), it points at the value.
pub(crate) type FlattenedPart = fn(&super::tree::Node) -> Result<(), super::tree::DeError>;

/// The parts connector blocks, source or sink, flatten in, each with the
/// key of the blocks that do (`None`: every block): each connector's
/// connection struct, then [`tls::TlsOptions`], the order serde reads
/// them in. A block that flattens another part lists it here.
pub(crate) const FLATTENED_PARTS: &[(Option<&str>, FlattenedPart)] = &[
    (Some("amqp"), |block| {
        amqp::AmqpConnection::deserialize(block).map(|_| ())
    }),
    (Some("kafka"), |block| {
        kafka::KafkaConnection::deserialize(block).map(|_| ())
    }),
    (Some("mqtt"), |block| {
        mqtt::MqttConnection::deserialize(block).map(|_| ())
    }),
    (Some("nats"), |block| {
        nats::NatsConnection::deserialize(block).map(|_| ())
    }),
    (Some("postgres"), |block| {
        postgres::PostgresConnection::deserialize(block).map(|_| ())
    }),
    (Some("redis"), |block| {
        redis::RedisConnection::deserialize(block).map(|_| ())
    }),
    (Some("sqs"), |block| {
        sqs::SqsConnection::deserialize(block).map(|_| ())
    }),
    (None, |block| {
        tls::TlsOptions::deserialize(block).map(|_| ())
    }),
];

/// Gives `field` of a block's JSON Schema its own description. A
/// connection field shared by a connector's source and sink block (its
/// `...Connection` struct) is declared once, with the source's doc
/// comment; the other block keeps its own words in the schema this way.
pub(crate) fn describe(schema: &mut schemars::Schema, field: &str, text: &str) {
    if let Some(property) = schema
        .get_mut("properties")
        .and_then(|properties| properties.get_mut(field))
        .and_then(|property| property.as_object_mut())
    {
        property.insert("description".to_owned(), text.into());
    }
}

/// A source's mapping of an upstream field onto a delay: which header
/// (an SQS attribute, an AMQP header, an MQTT user property, a Kafka, NATS
/// or Redis field as the connector turns it into a header) carries the
/// time, and how to read it.
///
/// ```yaml
/// sources:
///   - name: jobs
///     to: jobs
///     delay_from: {header: run-at, as: unix_seconds}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DelayFrom {
    /// The header that carries the time; matched in any case. A message
    /// without it is delivered at once.
    pub header: String,
    /// How to read it: `delay` (a duration like `90s`, or seconds; the
    /// default), `deliver_at` (RFC 3339), `unix_seconds` or `unix_millis`.
    #[serde(default, rename = "as")]
    pub format: DelayFormat,
}

/// How a [`DelayFrom`] header is read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DelayFormat {
    /// A duration from now (`90s`, `2h`) or a number of seconds.
    #[default]
    Delay,
    /// A time in RFC 3339.
    DeliverAt,
    /// A Unix time in seconds.
    UnixSeconds,
    /// A Unix time in milliseconds.
    UnixMillis,
}

/// The methods over a definition's connector blocks (`SourceDef`,
/// `SinkDef`), from one list of its block fields, so that a connector
/// added to the struct is added to `blocks`, `resolve_paths` and `KINDS`
/// at once (a unit test checks the list against the struct). The
/// connector side (`crate::connect`) reads the same blocks as connectors it
/// can build.
macro_rules! connector_blocks {
    ($def:ty, $block:ident, [$($field:ident),+ $(,)?]) => {
        impl $def {
            /// The keys a connector block may have.
            pub const KINDS: &'static [&'static str] = &[$(stringify!($field)),+];

            /// The connector blocks present: exactly one is valid
            /// (`validate` reports none or several).
            pub fn blocks(&self) -> Vec<&dyn $block> {
                let mut found: Vec<&dyn $block> = Vec::new();
                $(
                    if let Some(c) = &self.$field {
                        found.push(c);
                    }
                )+
                found
            }

            /// Makes every block's relative paths absolute against `dir`.
            pub fn resolve_paths(&mut self, dir: &Path) {
                $(
                    if let Some(c) = &mut self.$field {
                        c.resolve_paths(dir);
                    }
                )+
            }
        }
    };
}

/// A source as the pipeline file declares it: a name, a topic, and one
/// connector block.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceDef {
    /// The source's name, unique among the pipeline's stages, sinks and
    /// sources: lowercase letters, digits, `_`, `-` and `.`. It prefixes
    /// every message id the source publishes (`<name>:<upstream id>`) and
    /// names its dead-letter topic (`<pipeline>.<name>.dlq`), which takes
    /// upstream messages that cannot become a message (a header no broker
    /// can carry, a missing payload field).
    pub name: String,
    /// The declared topic it publishes into.
    pub to: String,
    /// Delay each message by an upstream header: `{header: run-at, as:
    /// unix_seconds}` (`as`: `delay`, the default, `deliver_at`,
    /// `unix_seconds`, `unix_millis`). A value that does not read
    /// dead-letters the message with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_from: Option<DelayFrom>,
    /// Read a Redis stream through a consumer group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<redis::RedisSourceConfig>,
    /// Drain a Postgres transactional-outbox table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<postgres::OutboxConfig>,
    /// Subscribe to an MQTT topic filter in a persistent session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mqtt: Option<mqtt::MqttSourceConfig>,
    /// Read a NATS JetStream stream through a durable consumer, or a core
    /// subject (at most once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats: Option<nats::NatsSourceConfig>,
    /// Receive from an Amazon SQS queue (long polling, deleted after the
    /// durable publish).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqs: Option<sqs::SqsSourceConfig>,
    /// Consume a RabbitMQ queue (manual acks after the durable publish).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amqp: Option<amqp::AmqpSourceConfig>,
    /// Consume Kafka topics in a consumer group (offsets committed after
    /// the durable publish, contiguous per partition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka: Option<kafka::KafkaSourceConfig>,
}

connector_blocks!(
    SourceDef,
    SourceBlock,
    [redis, postgres, mqtt, nats, sqs, amqp, kafka]
);

impl SourceDef {
    /// `<pipeline>.<source>.dlq`.
    pub fn dlq_topic(&self, pipeline: &str) -> String {
        super::default_dlq(pipeline, &self.name)
    }
}

/// A sink as the pipeline file declares it: a stage (every knob but
/// `plugin`, `publish`, `config` and `memory`) whose handler is one
/// connector block.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = sink_delivery_docs)]
pub struct SinkDef {
    /// The sink's name, unique among the pipeline's stages, sinks and
    /// sources: lowercase letters, digits, `_`, `-` and `.`.
    pub name: String,
    /// The input, as for a stage: a topic name, or `{topic, filter}`.
    #[serde(deserialize_with = "crate::config::subscribe_short")]
    #[schemars(with = "crate::config::SubscribeForm")]
    pub subscribe: Subscribe,
    /// The delivery policy, as for a stage: its keys sit in the sink's
    /// own mapping. The schema describes them in a sink's words
    /// ([`SINK_DELIVERY_DOCS`]).
    #[serde(flatten)]
    pub delivery: super::Delivery,
    /// POST each message to an HTTP endpoint (a webhook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<http::HttpSinkConfig>,
    /// Insert each message as a row of a Postgres table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<postgres::TableSinkConfig>,
    /// Append each message to a Redis stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<redis::RedisSinkConfig>,
    /// Publish each message to an MQTT topic (QoS 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mqtt: Option<mqtt::MqttSinkConfig>,
    /// Publish each message to a NATS subject (JetStream by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats: Option<nats::NatsSinkConfig>,
    /// Send each message to an Amazon SQS queue (`SendMessageBatch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqs: Option<sqs::SqsSinkConfig>,
    /// Publish each message to a RabbitMQ exchange (publisher confirms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amqp: Option<amqp::AmqpSinkConfig>,
    /// Produce each message to a Kafka topic (idempotent producer, acks
    /// from all in-sync replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka: Option<kafka::KafkaSinkConfig>,
    /// Write messages to object storage (S3, GCS, Azure, files): rolling
    /// JSON-lines or Parquet files, or one object each. A message is acked
    /// once the file holding it is complete in the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_store: Option<object_store::ObjectStoreSinkConfig>,
}

connector_blocks!(
    SinkDef,
    SinkBlock,
    [
        http,
        postgres,
        redis,
        mqtt,
        nats,
        sqs,
        amqp,
        kafka,
        object_store
    ]
);

impl SinkDef {
    /// The stage that runs this sink: the same knobs, no plugin, and the
    /// sink itself as its built-in handler.
    pub fn to_stage(&self) -> Stage {
        Stage {
            name: self.name.clone(),
            subscribe: self.subscribe.clone(),
            plugin: std::path::PathBuf::new(),
            sha256: None,
            config: BTreeMap::new(),
            secrets: Vec::new(),
            state: None,
            timers: false,
            http: None,
            publish: Vec::new(),
            delivery: Delivery {
                batch: self.delivery.batch.clone().or_else(|| self.default_batch()),
                max_ack_pending: self
                    .delivery
                    .max_ack_pending
                    .or_else(|| self.default_in_flight()),
                ..self.delivery.clone()
            },
            memory: default_memory(),
            // A target's `429 Retry-After` holds a sink in any case.
            hold_on_retry_after: false,
            sink: Some(Arc::new(self.clone())),
        }
    }
}

impl SinkDef {
    /// The batch a sink runs with when `batch:` is not given: none, but
    /// for an object-store sink, whose writes go into open files (one call
    /// a record would be slow for no gain).
    fn default_batch(&self) -> Option<Batch> {
        self.object_store.as_ref().map(|_| Batch {
            max: std::num::NonZeroU32::new(500).unwrap_or(std::num::NonZeroU32::MIN),
            wait: HumanDuration::millis(50),
        })
    }

    /// The deliveries a sink holds unacked when `max_ack_pending` is not
    /// given: the engine's default, but for an object-store sink, whose
    /// records wait in open files until the file is uploaded: enough for
    /// a file to reach `roll.max_records` (and one batch more).
    fn default_in_flight(&self) -> Option<u32> {
        let roll = &self.object_store.as_ref()?.roll;
        let batch = self
            .delivery
            .batch
            .as_ref()
            .map_or(500, |b| u64::from(b.max.get()));
        Some(u32::try_from(roll.max_records.get().saturating_add(batch)).unwrap_or(u32::MAX))
    }
}

/// What the schema says of a sink's delivery keys, in a sink's words
/// ([`super::Delivery`]'s docs are a stage's): the key and its description.
const SINK_DELIVERY_DOCS: &[(&str, &str)] = &[
    ("concurrency", "How many writes run at once, per daemon."),
    (
        "ack_wait",
        "How long a delivered message stays invisible to other consumers\n\
         before it is redelivered (extended while a write runs).",
    ),
    (
        "retry",
        "Retries with backoff before a message is dead-lettered. A target\n\
         that is unreachable spends no attempts: the message waits.",
    ),
    (
        "dlq",
        "The dead-letter topic, or `{topic, archive}`. Default topic:\n\
         `<pipeline>.<sink>.dlq`. With `archive: {store: ...}`, `dlq purge`\n\
         writes every entry it deletes to that object store first.",
    ),
    ("ordering", "Per-key ordering, as for a stage."),
    (
        "batch",
        "Write in batches (one multi-row insert, one pipeline of commands).",
    ),
    (
        "timeout",
        "The longest one write may take (for a batch, the whole batch); a\n\
         write that takes longer fails as `timeout` and is retried.",
    ),
    (
        "max_ack_pending",
        "The most messages delivered but not yet acked, across all daemons.",
    ),
    (
        "rate",
        "How many messages it may write per unit of time, as for a stage:\n\
         `50/s`, `{limit: 50/s, burst: 10}`, `{limit: 5/s, per: key}`.",
    ),
    ("dedup", "Handler-level idempotency, as for a stage."),
];

/// Puts [`SINK_DELIVERY_DOCS`] into `SinkDef`'s schema.
fn sink_delivery_docs(schema: &mut schemars::Schema) {
    let Some(properties) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) else {
        return;
    };
    for (key, doc) in SINK_DELIVERY_DOCS {
        if let Some(property) = properties.get_mut(*key).and_then(|p| p.as_object_mut()) {
            property.insert("description".into(), (*doc).into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The top-level keys of `T`'s schema, but `others`, sorted.
    fn block_keys<T: JsonSchema>(others: &[&str]) -> Vec<String> {
        let schema = schemars::schema_for!(T);
        let properties = schema
            .get("properties")
            .and_then(|p| p.as_object())
            .expect("a struct's schema has properties");
        let mut keys: Vec<String> = properties
            .keys()
            .filter(|k| !others.contains(&k.as_str()))
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    fn sorted(kinds: &[&str]) -> Vec<String> {
        let mut kinds: Vec<String> = kinds.iter().map(|k| k.to_string()).collect();
        kinds.sort();
        kinds
    }

    /// A sink's schema describes each delivery key in its own words: a key
    /// added to `Delivery` needs a line in `SINK_DELIVERY_DOCS`.
    #[test]
    fn every_delivery_key_has_a_sink_doc() {
        let mut documented: Vec<String> = SINK_DELIVERY_DOCS
            .iter()
            .map(|(k, _)| k.to_string())
            .collect();
        documented.sort();
        assert_eq!(block_keys::<super::super::Delivery>(&[]), documented);
    }

    /// A connector block added to `SourceDef` or `SinkDef` but not to its
    /// `connector_blocks!` list would be parsed and then ignored.
    #[test]
    fn every_connector_block_of_the_structs_is_in_their_lists() {
        assert_eq!(
            block_keys::<SourceDef>(&["name", "to", "delay_from"]),
            sorted(SourceDef::KINDS)
        );
        let stage_knobs = [
            "name",
            "subscribe",
            "concurrency",
            "ack_wait",
            "retry",
            "dlq",
            "ordering",
            "batch",
            "timeout",
            "max_ack_pending",
            "rate",
            "dedup",
        ];
        assert_eq!(block_keys::<SinkDef>(&stage_knobs), sorted(SinkDef::KINDS));
    }
}
