//! The pipeline model: what a pipeline file may say. These structs are the
//! configuration reference; `sluice schema` prints them as a JSON Schema and
//! `docs/pipelines.md` follows them.
//!
//! Every optional field has a default from a named `default_*` function, and
//! every struct rejects keys it does not know. Values a serde type cannot
//! express (name patterns, cross-references between topics and stages,
//! `multiplier >= 1`) are checked in `validate.rs`, with positions.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde::{Serialize, Serializer};

use super::units::{HumanDuration, HumanSize};

/// One pipeline: its topics and the stages that connect them. A file holds
/// one pipeline; a directory holds one per `*.yaml`/`*.yml` file.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pipeline {
    /// The pipeline's name, unique across all loaded files: lowercase letters,
    /// digits, `_`, `-` and `.`. It prefixes the default dead-letter topics
    /// (`<pipeline>.<stage>.dlq`) and labels metrics.
    pub name: String,
    /// Where the topics live: `embedded` (the durable single-node broker built
    /// into the daemon) or a `nats://host:port` URL for NATS JetStream
    /// (see `docs/nats.md` for its options). `sluice run --broker` overrides it,
    /// so the same file runs on either.
    #[serde(default = "default_broker")]
    pub broker: String,
    /// The topics stages subscribe and publish to. Every topic a stage names
    /// must be declared here, except the implicit dead-letter topics.
    ///
    /// A list rather than a map keyed by name: a topic and a stage are both
    /// "a named thing with settings", and both are written the same way
    /// (`- name: ...`); a topic with no settings can be just its name
    /// (`- orders`). Duplicate names are reported by `sluice validate`.
    #[serde(default, deserialize_with = "short_list")]
    #[schemars(with = "Vec<ShortForm<Topic>>")]
    pub topics: Vec<Topic>,
    /// The stages, each a plugin between an input topic and its outputs.
    /// After loading, every sink is here too, as a stage whose handler is
    /// built in (its `sink` set), so every stage knob works on it.
    #[serde(default)]
    pub stages: Vec<Stage>,
    /// Sources: each moves messages from an outside system (a Redis
    /// stream, a Postgres outbox table) into a declared topic.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<super::SourceDef>,
    /// Sinks: stages whose handler is built in, writing each message of a
    /// topic to an outside system (an HTTP webhook, a Postgres table, a
    /// Redis stream).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sinks: Vec<super::SinkDef>,
    /// How long the daemon waits for in-flight messages on SIGTERM/SIGINT
    /// before it naks the rest and exits.
    #[serde(default = "default_shutdown_timeout")]
    pub shutdown_timeout: HumanDuration,
    /// Large payloads go to an object store and the broker carries a
    /// reference: applies to every topic of this pipeline (and its
    /// dead-letter topics) unless a topic sets its own. Off when absent.
    #[serde(default)]
    pub claim_check: Option<super::ClaimCheck>,
    /// Secrets, each named once by reference (`{env: VAR}` or `{file:
    /// PATH}`, exactly one) and read at load and on every reload. A
    /// connector's password and token fields take one as
    /// `{secret:name}`; no value is ever shown.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, super::SecretSource>,
    /// The values of `secrets`, read by the loader.
    #[serde(skip)]
    #[schemars(skip)]
    pub secret_values: super::SecretValues,
    /// The file this pipeline was read from (set by the loader).
    #[serde(skip)]
    pub source: PathBuf,
}

/// The broker used when a pipeline names none.
pub fn default_broker() -> String {
    "embedded".into()
}

/// 30 s.
pub fn default_shutdown_timeout() -> HumanDuration {
    HumanDuration::secs(30)
}

/// A topic: a durable, ordered stream of messages. Several stages
/// subscribing to one topic each get every message (fan-out).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Topic {
    /// The topic's name, e.g. `orders` or `orders.eu`.
    pub name: String,
    /// Backpressure: once this many messages wait in the topic, ingest
    /// answers 429 until it drains. No limit when absent.
    #[serde(default)]
    pub high_water_mark: Option<u64>,
    /// Messages older than this are removed even if not every subscriber
    /// has acked them. Kept until acked by all when absent. A duration
    /// (`7d`), or `{max_age: 7d, archive: {store: ...}}` to write what is
    /// removed to an object store first (the embedded broker only: NATS
    /// drops by `MaxAge` itself, so there is no archive there).
    #[serde(default, deserialize_with = "retention_form")]
    #[schemars(with = "Option<RetentionForm>")]
    pub retention: Option<Retention>,
    /// This topic's claim check, replacing the pipeline's `claim_check`.
    #[serde(default)]
    pub claim_check: Option<super::ClaimCheck>,
}

impl From<String> for Topic {
    fn from(name: String) -> Self {
        Topic {
            name,
            high_water_mark: None,
            retention: None,
            claim_check: None,
        }
    }
}

/// A stage: one plugin, fed by one topic, publishing to declared topics,
/// with the delivery policy around it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// The stage's name, unique in its pipeline: lowercase letters, digits,
    /// `_`, `-` and `.`.
    pub name: String,
    /// The input: a topic name, or `{topic, filter}` where `filter` maps
    /// header names to the values a message must carry to reach this stage.
    #[serde(deserialize_with = "short")]
    #[schemars(with = "ShortForm<Subscribe>")]
    pub subscribe: Subscribe,
    /// The handler: a WebAssembly component file, relative to the directory
    /// of the pipeline file (the loader makes it absolute).
    pub plugin: PathBuf,
    /// Pins the plugin file's SHA-256 (64 hex digits, as `sha256sum`
    /// prints it): a file with any other hash refuses to start. Each
    /// plugin's hash is logged when it is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<Sha256Pin>,
    /// Settings the plugin reads with `config-get`. Values are text; numbers
    /// and booleans are converted to their text.
    #[serde(default)]
    pub config: BTreeMap<String, ConfigValue>,
    /// The secrets the handler may read (`sluice:plugin/secrets`, contract
    /// 0.2.0): names from the pipeline's `secrets:` block. None by
    /// default; a plugin that imports the interface on a stage listing
    /// none is refused at load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// The key-value store the handler reads and writes
    /// (`sluice:plugin/state`, contract 0.2.0), committed with each
    /// message's outputs and ack: `true` for the stage's own store, or
    /// `{store, max_bytes}`. Not granted by default.
    #[serde(
        default,
        deserialize_with = "super::state::grant",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<super::StateGrant>")]
    pub state: Option<super::StateGrant>,
    /// Lets the handler schedule work for itself: an emit to the stage's
    /// own input topic, delayed (`sluice-delay` or `sluice-deliver-at`).
    /// An undelayed emit to its own input would come straight back, so it
    /// is dead-lettered as `undeclared-topic`. Off by default.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timers: bool,
    /// The outbound HTTP the handler may make (`wasi:http`, contract
    /// 0.2.0): the hosts it may call, the longest a request may take,
    /// and headers the host adds. Not granted by default. (A sink's
    /// `http:` block, the webhook, is another thing, under `sinks:`.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<super::HttpGrant>,
    /// The topics the plugin may emit to; the first is its default output.
    /// An emit to any other topic is dead-lettered as `undeclared-topic`.
    #[serde(default)]
    pub publish: Vec<String>,
    /// The delivery policy: concurrency, leases, retries, dead letters,
    /// ordering, batches, timeout, rate, ack limit and dedup. Its keys sit
    /// in the stage's own mapping; a sink has the same ones.
    #[serde(flatten)]
    pub delivery: Delivery,
    /// The memory limit of one plugin instance, summed over its memories.
    #[serde(default = "default_memory")]
    pub memory: HumanSize,
    /// A handler's `retry(after)` holds the whole stage for that long, not
    /// only its message (as a sink's `429 Retry-After` always does).
    #[serde(default)]
    pub hold_on_retry_after: bool,
    /// Set for a sink: the built-in handler that runs instead of a plugin
    /// (`plugin` is then empty). Filled in by the loader from `sinks:`.
    #[serde(skip)]
    #[schemars(skip)]
    pub sink: Option<Arc<super::SinkDef>>,
}

/// How messages are delivered to a stage or a sink and what happens when
/// a call fails: the keys both share, flattened into their mappings. The
/// docs are a stage's; a sink's schema says them in a sink's words
/// (`SINK_DELIVERY_DOCS` in `connectors/mod.rs`). It allows any other key:
/// the stage or sink around it rejects the unknown ones, and `parse.rs`
/// reads it alone from their whole mapping to place its errors.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
pub struct Delivery {
    /// How many messages this stage handles at once, per daemon: a number,
    /// or `{max: 64, adaptive: true}` for a limit that follows the
    /// handler's latency and failures (AIMD) up to `max`.
    #[serde(default = "default_concurrency")]
    pub concurrency: Concurrency,
    /// How long a delivered message stays invisible to other consumers
    /// before it is redelivered. The lease is extended automatically while
    /// the handler runs.
    #[serde(default = "default_ack_wait")]
    pub ack_wait: HumanDuration,
    /// Retries with exponential backoff before a message is dead-lettered.
    #[serde(default)]
    pub retry: Retry,
    /// The dead-letter topic: a name, or `{topic, archive}`. Default
    /// topic: `<pipeline>.<stage>.dlq`, which needs no declaration; any
    /// other name must be a declared topic. With `archive: {store: ...}`,
    /// `dlq purge` writes every entry it deletes to that object store
    /// first, in JSON lines, and deletes nothing the store did not take.
    #[serde(default, deserialize_with = "short_some")]
    #[schemars(with = "Option<ShortForm<Dlq>>")]
    pub dlq: Option<Dlq>,
    /// Per-key ordering: messages with the same key are handled one at a
    /// time, in publish order; different keys run in parallel. No ordering
    /// when absent.
    #[serde(default)]
    pub ordering: Option<Ordering>,
    /// Hand the plugin messages in batches. A `batch-handler` plugin gets
    /// the whole batch in one call; a `handler` plugin is called per message.
    #[serde(default)]
    pub batch: Option<Batch>,
    /// The longest one call of the plugin may take (for a batch, the whole
    /// batch). A call that takes longer fails as `timeout` and is retried.
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    /// How many messages the handler may be handed per unit of time:
    /// `50/s`, or `{limit: 50/s, burst: 10}`, or `{limit: 5/s, per: key}`
    /// for a bucket per key. On NATS the limit holds for all daemons
    /// together. No limit when absent.
    #[serde(
        default,
        deserialize_with = "super::rate_short",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "super::RateForm")]
    pub rate: Option<super::Rate>,
    /// The most messages delivered but not yet acked for this stage, across
    /// all daemons (JetStream's MaxAckPending), and what one daemon holds
    /// at once. When absent: the larger of 2 × concurrency × batch size
    /// and 512 (`engine::DEFAULT_IN_FLIGHT`).
    #[serde(default)]
    pub max_ack_pending: Option<u32>,
    /// Handler-level idempotency: handle each dedup key once per `ttl`.
    /// Off when absent.
    #[serde(default)]
    pub dedup: Option<super::Dedup>,
}

/// 1.
pub fn default_concurrency() -> Concurrency {
    Concurrency::fixed(NonZeroU32::MIN)
}

/// A stage's concurrency: a fixed number of calls at once, or an adaptive
/// limit between 1 and `max`. Dereferences to the most calls at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Concurrency {
    /// The most calls at once (the limit itself, unless adaptive).
    pub max: NonZeroU32,
    /// Whether the limit adapts, from 1 up to `max`: one more while calls
    /// fill every slot and latency stays at its moving average, cut by a
    /// tenth after a retry, a timeout, an `unavailable`, or latency
    /// twice the average.
    #[serde(default)]
    pub adaptive: bool,
}

impl Concurrency {
    /// `max` calls at once, always.
    pub fn fixed(max: NonZeroU32) -> Concurrency {
        Concurrency {
            max,
            adaptive: false,
        }
    }
}

impl JsonSchema for Concurrency {
    fn schema_name() -> Cow<'static, str> {
        "Concurrency".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [
                {"type": "integer", "minimum": 1, "description": "Calls at once."},
                {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["max"],
                    "properties": {
                        "max": {"type": "integer", "minimum": 1, "description": "The most calls at once."},
                        "adaptive": {"type": "boolean", "description": "The limit adapts from 1 up to `max` (AIMD)."}
                    }
                }
            ]
        })
    }
}

impl std::ops::Deref for Concurrency {
    type Target = NonZeroU32;

    fn deref(&self) -> &NonZeroU32 {
        &self.max
    }
}

impl<'de> Deserialize<'de> for Concurrency {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            max: NonZeroU32,
            #[serde(default)]
            adaptive: bool,
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Concurrency;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of calls at least 1, or {max, adaptive}")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Concurrency, E> {
                u32::try_from(v)
                    .ok()
                    .and_then(NonZeroU32::new)
                    .map(Concurrency::fixed)
                    .ok_or_else(|| E::invalid_value(de::Unexpected::Unsigned(v), &"a nonzero u32"))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Concurrency, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::invalid_value(
                        de::Unexpected::Signed(v),
                        &"a nonzero u32",
                    )),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Concurrency, E> {
                match v.trim().parse::<u64>() {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::invalid_type(de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Concurrency, A::Error> {
                let fields = Fields::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Concurrency {
                    max: fields.max,
                    adaptive: fields.adaptive,
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// 30 s.
pub fn default_ack_wait() -> HumanDuration {
    HumanDuration::secs(30)
}

/// 30 s.
pub fn default_timeout() -> HumanDuration {
    HumanDuration::secs(30)
}

/// 256 MiB.
pub fn default_memory() -> HumanSize {
    HumanSize::mib(256)
}

impl Stage {
    /// Whether this stage runs a built-in sink rather than a plugin.
    pub fn is_sink(&self) -> bool {
        self.sink.is_some()
    }

    /// Checks the plugin file's SHA-256 (`actual`, hex) against the
    /// stage's `sha256:` pin, if it has one; the error says both.
    pub fn check_pin(&self, actual: &str) -> Result<(), String> {
        match &self.sha256 {
            Some(pin) if !pin.matches(actual) => Err(format!(
                "plugin {} has SHA-256 {actual}, but the stage pins sha256: {pin}; \
                 refusing to run a plugin other than the one pinned (rebuild it, or \
                 update the pin if the change is intended)",
                self.plugin.display()
            )),
            _ => Ok(()),
        }
    }

    /// The store this stage's `state:` grants, as the broker names it
    /// (`<pipeline>/<store>`), with its size limit.
    pub fn state_store(&self, pipeline: &str) -> Option<(String, u64)> {
        let grant = self.state.as_ref()?;
        Some((
            crate::state::store_name(pipeline, grant.store_or(&self.name)),
            grant.max_bytes.bytes(),
        ))
    }

    /// The dead-letter topic of this stage in `pipeline`.
    pub fn dlq_topic(&self, pipeline: &str) -> String {
        self.delivery
            .dlq_name()
            .map_or_else(|| default_dlq(pipeline, &self.name), str::to_owned)
    }
}

/// A stage's `dlq:`: a topic name (`dlq: orders.failed`), or
/// `{topic: orders.failed, archive: {store: s3://...}}`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Dlq {
    /// The dead-letter topic. Default: `<pipeline>.<stage>.dlq`.
    #[serde(default)]
    pub topic: Option<String>,
    /// Where `dlq purge` writes the entries it deletes, first: JSON lines
    /// of the entries as `dlq show` prints them, provenance included, one
    /// create-only object per purge under
    /// `<path>/<pipeline>/<stage>/<date>/`. A purge the store does not
    /// take deletes nothing.
    #[serde(default)]
    pub archive: Option<super::Archive>,
}

impl From<String> for Dlq {
    fn from(topic: String) -> Self {
        Dlq {
            topic: Some(topic),
            archive: None,
        }
    }
}

impl Delivery {
    /// The `dlq:` topic as written, if any.
    pub fn dlq_name(&self) -> Option<&str> {
        self.dlq.as_ref().and_then(|d| d.topic.as_deref())
    }

    /// The `dlq:` archive, if any.
    pub fn dlq_archive(&self) -> Option<&super::Archive> {
        self.dlq.as_ref().and_then(|d| d.archive.as_ref())
    }
}

/// A topic's `retention:`: `7d`, or `{max_age: 7d, archive: {...}}`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Messages published longer ago than this are removed, acked or not.
    pub max_age: HumanDuration,
    /// Where the embedded broker writes what it removes, first: JSON lines
    /// of the messages (`id`, `key`, `headers`, `published_at`, the
    /// payload as JSON or base64) under `<path>/<topic>/<date>/`. While
    /// the store does not take them, nothing is removed.
    #[serde(default)]
    pub archive: Option<super::Archive>,
}

impl From<HumanDuration> for Retention {
    fn from(max_age: HumanDuration) -> Self {
        Retention {
            max_age,
            archive: None,
        }
    }
}

/// Reads `retention:`: a duration or the full mapping.
fn retention_form<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Retention>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Retention;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration (`7d`) or a mapping `{max_age: 7d, archive: {...}}`")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Retention, E> {
            v.parse::<HumanDuration>()
                .map(Retention::from)
                .map_err(E::custom)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Retention, E> {
            HumanDuration::deserialize(de::value::U64Deserializer::<E>::new(v)).map(Retention::from)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Retention, A::Error> {
            Retention::deserialize(de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_any(V).map(Some)
}

/// Schema of `retention:`: a duration or [`Retention`]'s mapping.
#[doc(hidden)]
pub struct RetentionForm;

impl JsonSchema for RetentionForm {
    fn schema_name() -> Cow<'static, str> {
        "DurationOrRetention".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let age = generator.subschema_for::<HumanDuration>();
        let full = generator.subschema_for::<Retention>();
        json_schema!({ "anyOf": [age, full] })
    }
}

/// `<pipeline>.<stage>.dlq`.
pub fn default_dlq(pipeline: &str, stage: &str) -> String {
    format!("{pipeline}.{stage}.dlq")
}

/// A stage's input: one topic, or several as priority lanes.
///
/// Written `subscribe: orders`, `{topic: orders, filter: {...}}`, or
/// `{topics: [jobs.critical, jobs.bulk], priority: strict}`.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(try_from = "SubscribeFields", into = "SubscribeFields")]
#[schemars(with = "SubscribeFields")]
pub struct Subscribe {
    /// The topics, as listed (for `strict`, highest priority first); one
    /// for the `topic` form.
    pub topics: Vec<String>,
    /// How several topics share the worker slots (None: one topic, or
    /// equal weights).
    pub priority: Option<Priority>,
    /// Header equality filter: only messages whose headers have all these
    /// values reach the stage; the others are acked unhandled.
    pub filter: BTreeMap<String, String>,
}

impl Subscribe {
    /// The first topic: the only one of a single-topic stage.
    pub fn topic(&self) -> &str {
        self.topics.first().map_or("", String::as_str)
    }

    /// Whether the stage reads several topics as priority lanes.
    pub fn has_lanes(&self) -> bool {
        self.topics.len() > 1
    }
}

impl From<String> for Subscribe {
    fn from(topic: String) -> Self {
        Subscribe {
            topics: vec![topic],
            priority: None,
            filter: BTreeMap::new(),
        }
    }
}

/// How a stage with several topics shares its worker slots among them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Priority {
    /// A free slot goes to the first listed topic with a message waiting:
    /// a lower lane runs only while every higher one is empty.
    Strict,
    /// A free slot goes to the lanes with messages waiting in proportion
    /// to these weights (every subscribed topic needs one, at least 1), so
    /// no lane with work ever gets none.
    Weighted(BTreeMap<String, NonZeroU32>),
}

/// How `subscribe:` is written; [`Subscribe`] is what it means.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscribeFields {
    /// The topic to consume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Several topics, as priority lanes; instead of `topic`. Without
    /// `priority` they share the worker slots equally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topics: Option<Vec<String>>,
    /// With `topics`: `strict` (the first listed topic drains before the
    /// next), or `{weighted: {topic: weight, ...}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// Header equality filter: only messages whose headers have all these
    /// values reach the stage; the others are acked unhandled.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub filter: BTreeMap<String, String>,
}

impl TryFrom<SubscribeFields> for Subscribe {
    type Error = String;

    fn try_from(fields: SubscribeFields) -> Result<Self, String> {
        let topics = match (fields.topic, fields.topics) {
            (Some(_), Some(_)) => {
                return Err(
                    "give `topic` (one topic) or `topics` (priority lanes), not both".into(),
                );
            }
            (None, None) => return Err("`subscribe` needs `topic` or `topics`".into()),
            (Some(topic), None) => vec![topic],
            (None, Some(topics)) if topics.is_empty() => {
                return Err("`topics` lists no topic".into());
            }
            (None, Some(topics)) => topics,
        };
        Ok(Subscribe {
            topics,
            priority: fields.priority,
            filter: fields.filter,
        })
    }
}

impl From<Subscribe> for SubscribeFields {
    fn from(subscribe: Subscribe) -> Self {
        let lanes = subscribe.has_lanes() || subscribe.priority.is_some();
        let mut topics = subscribe.topics;
        SubscribeFields {
            topic: if lanes { None } else { topics.pop() },
            topics: lanes.then_some(topics),
            priority: subscribe.priority,
            filter: subscribe.filter,
        }
    }
}

/// A `config:` value: text, or a number or boolean read as its text.
///
/// A value written with `${VAR}` is shown (admin API, console, `status`)
/// as written, never as its value: the environment is where deployments
/// keep keys, and a handler's keys belong in `secrets:`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigValue {
    /// What the plugin reads with `config-get`.
    pub value: String,
    /// The text as the file writes it, when it came from the environment.
    pub written: Option<String>,
}

impl ConfigValue {
    /// A value written as it is.
    pub fn new(value: impl Into<String>) -> Self {
        ConfigValue {
            value: value.into(),
            written: None,
        }
    }
}

impl<'de> Deserialize<'de> for ConfigValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ConfigValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("text, a number or a boolean")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ConfigValue, E> {
                Ok(ConfigValue::new(v.to_owned()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<ConfigValue, E> {
                Ok(ConfigValue::new(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ConfigValue, E> {
                Ok(ConfigValue::new(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ConfigValue, E> {
                Ok(ConfigValue::new(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ConfigValue, E> {
                Ok(ConfigValue::new(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<ConfigValue, E> {
                Err(E::custom(
                    "a config value is missing; write `\"\"` for an empty value",
                ))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for ConfigValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.written.as_deref().unwrap_or(&self.value))
    }
}

impl JsonSchema for ConfigValue {
    fn schema_name() -> Cow<'static, str> {
        "ConfigValue".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": ["string", "number", "boolean"],
            "description": "Text; numbers and booleans are passed to the plugin as their text."
        })
    }
}

/// Retries and backoff.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    /// Deliveries a message gets before it is dead-lettered, the first
    /// included (1 = no retries). A `reject` dead-letters at once.
    /// Default 5, or with a `schedule`, one more than its waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<NonZeroU32>,
    /// The delay before each redelivery.
    #[serde(default)]
    pub backoff: Backoff,
    /// The waits before each retry, explicitly, in place of `backoff`:
    /// `[1m, 5m, 30m, 2h, 8h, 3d]`. The n-th retry waits the n-th entry,
    /// the last one repeating; no jitter. Waits of hours or days are kept
    /// by the broker, durably, like any other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Vec<HumanDuration>>,
}

impl Retry {
    /// Deliveries before a message is dead-lettered: `max_attempts` as
    /// given, else one per wait of the `schedule` plus the first, else 5.
    pub fn attempts(&self) -> NonZeroU32 {
        self.max_attempts.unwrap_or_else(|| match &self.schedule {
            Some(waits) if !waits.is_empty() => NonZeroU32::new(
                u32::try_from(waits.len())
                    .unwrap_or(u32::MAX)
                    .saturating_add(1),
            )
            .unwrap_or(NonZeroU32::MIN),
            _ => default_max_attempts(),
        })
    }
}

/// 5.
pub fn default_max_attempts() -> NonZeroU32 {
    NonZeroU32::new(5).unwrap_or(NonZeroU32::MIN)
}

/// Exponential backoff with jitter: the n-th retry waits
/// `min(max, initial * multiplier^(n-1))`, randomly shortened by up to
/// `jitter` of itself. A handler's `retry(duration)` overrides it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    /// The delay before the first retry.
    #[serde(default = "default_backoff_initial")]
    pub initial: HumanDuration,
    /// The longest delay.
    #[serde(default = "default_backoff_max")]
    pub max: HumanDuration,
    /// How much each delay grows over the previous one; at least 1.
    #[serde(default = "default_backoff_multiplier")]
    pub multiplier: f64,
    /// The fraction of each delay that is randomised, from 0 (none) to 1.
    #[serde(default = "default_backoff_jitter")]
    pub jitter: f64,
}

/// 1 s.
pub fn default_backoff_initial() -> HumanDuration {
    HumanDuration::secs(1)
}

/// 60 s.
pub fn default_backoff_max() -> HumanDuration {
    HumanDuration::secs(60)
}

/// 2.0.
pub fn default_backoff_multiplier() -> f64 {
    2.0
}

/// 0.2.
pub fn default_backoff_jitter() -> f64 {
    0.2
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: default_backoff_initial(),
            max: default_backoff_max(),
            multiplier: default_backoff_multiplier(),
            jitter: default_backoff_jitter(),
        }
    }
}

/// Per-key ordering.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Ordering {
    /// What groups messages: `key` (the message key) or `header:NAME` (the
    /// value of header NAME).
    pub key: OrderingKey,
}

/// What per-key ordering groups messages by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderingKey {
    /// The message key.
    Key,
    /// The value of a header.
    Header(String),
}

impl FromStr for OrderingKey {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            None if text == "key" => Ok(OrderingKey::Key),
            Some(("header", name)) if !name.trim().is_empty() => {
                Ok(OrderingKey::Header(name.trim().to_owned()))
            }
            _ => Err(format!(
                "`{text}` is not an ordering key; expected `key` or `header:NAME`"
            )),
        }
    }
}

impl fmt::Display for OrderingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OrderingKey::Key => f.write_str("key"),
            OrderingKey::Header(name) => write!(f, "header:{name}"),
        }
    }
}

impl<'de> Deserialize<'de> for OrderingKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = OrderingKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`key` or `header:NAME`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<OrderingKey, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

impl Serialize for OrderingKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl JsonSchema for OrderingKey {
    fn schema_name() -> Cow<'static, str> {
        "OrderingKey".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": "^(key|header:.+)$",
            "description": "`key` (the message key) or `header:NAME` (the value of header NAME)."
        })
    }
}

/// A plugin file's SHA-256, as 64 lowercase hex digits (upper case is
/// accepted and lowered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sha256Pin(String);

impl Sha256Pin {
    /// The digest as 64 lowercase hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `actual` (any case) is this digest.
    pub fn matches(&self, actual: &str) -> bool {
        self.0.eq_ignore_ascii_case(actual)
    }
}

impl std::str::FromStr for Sha256Pin {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(Sha256Pin(text.to_ascii_lowercase()))
        } else {
            Err(format!(
                "`{text}` is not a SHA-256: expected 64 hex digits, as `sha256sum` prints"
            ))
        }
    }
}

impl fmt::Display for Sha256Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Sha256Pin {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Sha256Pin;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a SHA-256 as 64 hex digits")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Sha256Pin, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

impl Serialize for Sha256Pin {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl JsonSchema for Sha256Pin {
    fn schema_name() -> Cow<'static, str> {
        "Sha256".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": "^[0-9a-fA-F]{64}$",
            "description": "A SHA-256 digest: 64 hex digits, as `sha256sum` prints it."
        })
    }
}

/// Batching.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// The most messages in one batch.
    pub max: NonZeroU32,
    /// How long to wait for a batch to fill before handing over what there is.
    #[serde(default = "default_batch_wait")]
    pub wait: HumanDuration,
}

/// 100 ms.
pub fn default_batch_wait() -> HumanDuration {
    HumanDuration::millis(100)
}

/// Either just a name or the full form: `subscribe: orders` or
/// `subscribe: {topic: orders, filter: {...}}`; `- orders` or
/// `- {name: orders, retention: 7d}`.
fn short<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + From<String>,
{
    Short::<T>::deserialize(d).map(|s| s.0)
}

fn short_some<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + From<String>,
{
    short(d).map(Some)
}

fn short_list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + From<String>,
{
    Vec::<Short<T>>::deserialize(d).map(|v| v.into_iter().map(|s| s.0).collect())
}

struct Short<T>(T);

impl<'de, T: Deserialize<'de> + From<String>> Deserialize<'de> for Short<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de> + From<String>> Visitor<'de> for V<T> {
            type Value = Short<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a topic name or a mapping")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Short<T>, E> {
                Ok(Short(T::from(v.to_owned())))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Short<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Short)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// Schema of a [`Short`] field: a string or `T`'s mapping.
#[doc(hidden)]
pub struct ShortForm<T>(PhantomData<T>);

/// The schema of a `subscribe:` field (a topic name or `{topic, filter}`),
/// for other sections that take one (sinks).
#[doc(hidden)]
pub type SubscribeForm = ShortForm<Subscribe>;

/// Reads a `subscribe:` field: a topic name or `{topic, filter}`.
#[doc(hidden)]
pub fn subscribe_short<'de, D: Deserializer<'de>>(d: D) -> Result<Subscribe, D::Error> {
    short(d)
}

impl<T: JsonSchema> JsonSchema for ShortForm<T> {
    fn schema_name() -> Cow<'static, str> {
        format!("NameOr{}", T::schema_name()).into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let full = generator.subschema_for::<T>();
        json_schema!({
            "anyOf": [{"type": "string", "description": "Just the topic name."}, full]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let stage: Stage =
            super::super::parse::from_str_for_tests("name: s\nsubscribe: in\nplugin: p.wasm\n");
        assert_eq!(stage.delivery.concurrency.get(), 1);
        assert_eq!(stage.delivery.ack_wait, HumanDuration::secs(30));
        assert_eq!(stage.delivery.timeout, HumanDuration::secs(30));
        assert_eq!(stage.memory, HumanSize::mib(256));
        assert_eq!(stage.delivery.retry.attempts().get(), 5);
        assert_eq!(stage.delivery.retry.backoff.initial, HumanDuration::secs(1));
        assert_eq!(stage.delivery.retry.backoff.max, HumanDuration::secs(60));
        assert_eq!(stage.delivery.retry.backoff.multiplier, 2.0);
        assert_eq!(stage.delivery.retry.backoff.jitter, 0.2);
        assert_eq!(stage.dlq_topic("p"), "p.s.dlq");
        assert_eq!(stage.subscribe.topic(), "in");
        assert!(stage.publish.is_empty() && stage.config.is_empty());
        assert!(stage.delivery.ordering.is_none() && stage.delivery.batch.is_none());
        assert!(stage.delivery.max_ack_pending.is_none());
    }

    #[test]
    fn dlq_and_retention_read_their_short_and_full_forms() {
        let named: Stage = super::super::parse::from_str_for_tests(
            "name: s\nsubscribe: in\nplugin: p.wasm\ndlq: failed\n",
        );
        assert_eq!(named.dlq_topic("p"), "failed");
        assert!(named.delivery.dlq_archive().is_none());
        let full: Stage = super::super::parse::from_str_for_tests(
            "name: s\nsubscribe: in\nplugin: p.wasm\ndlq: {archive: {store: 'file:///a'}}\n",
        );
        assert_eq!(full.dlq_topic("p"), "p.s.dlq");
        assert_eq!(
            full.delivery.dlq_archive().map(|a| a.store.as_str()),
            Some("file:///a")
        );
        let short: Topic = super::super::parse::from_str_for_tests("name: t\nretention: 7d\n");
        let short = short.retention.expect("retention");
        assert_eq!(short.max_age, HumanDuration::secs(7 * 86_400));
        assert!(short.archive.is_none());
        let full: Topic = super::super::parse::from_str_for_tests(
            "name: t\nretention: {max_age: 1h, archive: {store: 's3://b/p'}}\n",
        );
        let full = full.retention.expect("retention");
        assert_eq!(full.max_age, HumanDuration::secs(3600));
        assert_eq!(full.archive.map(|a| a.store), Some("s3://b/p".to_owned()));
    }

    #[test]
    fn subscribe_reads_one_topic_or_priority_lanes() {
        let one: Stage =
            super::super::parse::from_str_for_tests("name: s\nsubscribe: in\nplugin: p.wasm\n");
        assert_eq!(one.subscribe.topics, ["in"]);
        assert!(!one.subscribe.has_lanes() && one.subscribe.priority.is_none());

        let strict: Stage = super::super::parse::from_str_for_tests(
            "name: s\nplugin: p.wasm\nsubscribe:\n  topics: [jobs.critical, jobs.bulk]\n  priority: strict\n",
        );
        assert_eq!(strict.subscribe.topics, ["jobs.critical", "jobs.bulk"]);
        assert_eq!(strict.subscribe.priority, Some(Priority::Strict));
        assert!(strict.subscribe.has_lanes());

        let weighted: Stage = super::super::parse::from_str_for_tests(
            "name: s\nplugin: p.wasm\nsubscribe:\n  topics: [a, b]\n  priority: {weighted: {a: 8, b: 1}}\n",
        );
        let Some(Priority::Weighted(weights)) = &weighted.subscribe.priority else {
            panic!("not weighted: {:?}", weighted.subscribe.priority);
        };
        assert_eq!(weights.get("a").map(|w| w.get()), Some(8));
        assert_eq!(weights.get("b").map(|w| w.get()), Some(1));

        // What it writes back reads the same.
        for stage in [one, strict, weighted] {
            let text = serde_json::to_string(&stage.subscribe).expect("serializes");
            let again: Subscribe = serde_json::from_str(&text).expect("reads back");
            assert_eq!(again, stage.subscribe, "{text}");
        }
    }

    #[test]
    fn subscribe_refuses_both_forms_or_neither() {
        for (yaml, says) in [
            ("{topic: a, topics: [b]}", "not both"),
            ("{filter: {k: v}}", "needs `topic` or `topics`"),
            ("{topics: []}", "lists no topic"),
            ("{topics: [a], priority: loudest}", "loudest"),
        ] {
            let err = serde_saphyr::from_str::<Subscribe>(yaml)
                .expect_err(yaml)
                .to_string();
            assert!(err.contains(says), "{yaml}: {err}");
        }
    }

    #[test]
    fn ordering_keys() {
        assert_eq!("key".parse(), Ok(OrderingKey::Key));
        assert_eq!(
            "header:tenant".parse(),
            Ok(OrderingKey::Header("tenant".into()))
        );
        assert!("header:".parse::<OrderingKey>().is_err());
        assert!("value".parse::<OrderingKey>().is_err());
    }
}
