//! Edges: connectors that move messages between outside systems and topics.
//!
//! ```text
//! outside system --source--> topic --stage (plugin)--> topic --sink--> outside system
//! ```
//!
//! - **A source** ([`Source`]) reads an upstream (a Redis stream, a
//!   Postgres outbox table), and [`source::run`] publishes what it reads
//!   into a topic, durably and with an id derived from the upstream
//!   identity, *then* acknowledges upstream. It stops reading at the
//!   topic's `high_water_mark`, so the data waits upstream.
//! - **A sink** ([`Sink`]) is a stage whose handler is built in:
//!   [`SinkHandler`] puts it behind the same [`StageHandler`] interface a
//!   plugin worker has, so the stage runner gives it every knob (valve,
//!   retries, backoff, DLQ, ordering, batch, dedup). Its errors map onto
//!   the outcome table: a permanent refusal is `rejected`, a transient one
//!   `retry` (with the target's `Retry-After`), an outage `unavailable`
//!   (held in place, no attempt spent).
//!
//! One folder per connector (`redis/`, `postgres/`, `http/`), each with
//! the same files: `config.rs` (the YAML block, which is the reference),
//! `source.rs` and/or `sink.rs`. Adding a connector touches its folder and
//! the two definitions below ([`SourceDef`], [`SinkDef`]) only. The engine
//! and the source runner ask a connector's [`Capabilities`], never its
//! name.
//!
//! [`StageHandler`]: crate::engine::StageHandler

pub mod amqp;
pub mod archive;
pub mod health;
pub mod http;
pub mod kafka;
pub mod mqtt;
pub mod names;
pub mod nats;
pub mod object_store;
pub mod postgres;
pub mod redis;
pub mod sink;
pub mod source;
pub mod sqs;
#[cfg(test)]
pub(crate) mod testing;
pub mod tls;

use std::num::NonZeroU32;
use std::sync::Arc;

use async_trait::async_trait;

pub use crate::config::connectors::{ConfigProblem, SinkBlock, SinkDef, SourceBlock, SourceDef};
pub use crate::config::{Secret, SecretText, SecretUrl};
pub use health::Health;
pub use sink::{Accepted, Pending, Sink, SinkError, SinkHandler};
pub use source::{Source, SourceError, SourceMessage};

use crate::metrics::Metrics;

/// What an upstream can do. The source runner decides by these, never by
/// which connector it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Each message is acknowledged on its own (Redis `XACK`, an SQS
    /// delete, a JetStream ack), rather than a read as a whole (a Postgres
    /// transaction): the runner reads again while earlier reads are being
    /// made durable ([`Source::reads_in_flight`]).
    pub per_message_ack: bool,
    /// The upstream keeps the messages of one key in order (a Kafka
    /// partition, an SQS FIFO message group, an MQTT session): the runner
    /// publishes reads into the topic one after another, in the order it
    /// made them, so the topic keeps that order for `ordering: key`.
    pub ordered_by_key: bool,
    /// The upstream can tell how many messages wait ([`Source::lag`]);
    /// the runner asks every few seconds and shows it.
    pub lag: bool,
}

/// Where a connector runs, for its logs, metrics and readiness.
#[derive(Clone)]
pub struct Context {
    /// The pipeline.
    pub pipeline: String,
    /// The source's or sink's name.
    pub name: String,
    /// The daemon's metrics.
    pub metrics: Arc<Metrics>,
    /// The daemon's connector health, which readiness reads.
    pub health: Arc<Health>,
    /// The daemon's data directory, where a connector keeps local state
    /// (an object-store sink spools the files it builds there). `None`
    /// outside a daemon (tests, benches): such a connector then uses the
    /// system's temporary directory, and says so.
    pub data_dir: Option<std::path::PathBuf>,
}

impl Context {
    /// `<pipeline>/<name>`, how logs and readiness name the connector.
    pub fn label(&self) -> String {
        format!("{}/{}", self.pipeline, self.name)
    }
}

/// Why a connector could not be built from its configuration (checked
/// again at start-up: a CA file may have gone since `validate`).
#[derive(Debug, thiserror::Error)]
#[error("{connector} `{name}`: {message}")]
pub struct BuildError {
    /// `source` or `sink`.
    pub connector: &'static str,
    /// Its name.
    pub name: String,
    /// What is wrong.
    pub message: String,
}

impl BuildError {
    /// The source `ctx` names could not be built, for `message`.
    pub fn source(ctx: &Context, message: impl Into<String>) -> Self {
        Self::new("source", ctx, message)
    }

    /// The sink `ctx` names could not be built, for `message`.
    pub fn sink(ctx: &Context, message: impl Into<String>) -> Self {
        Self::new("sink", ctx, message)
    }

    /// A `connector` (`source` or `sink`) that could not be built.
    pub fn new(connector: &'static str, ctx: &Context, message: impl Into<String>) -> Self {
        BuildError {
            connector,
            name: ctx.name.clone(),
            message: message.into(),
        }
    }
}

/// What every source connector's block provides besides what config
/// knows of it ([`SourceBlock`]: its key, checks, description): the
/// running source.
#[async_trait]
pub trait SourceConfig: SourceBlock {
    /// The source, not yet connected: it connects on its first read and
    /// reconnects by itself, so an upstream that is down at start-up is
    /// an outage, not a failed start.
    async fn build(&self, ctx: &Context) -> Result<Box<dyn Source>, BuildError>;
}

/// What every sink connector's block provides besides what config knows
/// of it ([`SinkBlock`]): the running sink.
#[async_trait]
pub trait SinkConfig: SinkBlock {
    /// The sink, not yet connected (a target that is down at start-up is
    /// an outage, not a failed start). All worker slots share it.
    async fn build(&self, ctx: &Context) -> Result<Arc<dyn Sink>, BuildError>;
    /// [`build`](Self::build) for a sink stage of `concurrency` worker
    /// slots, for a connector that sizes a connection pool to them. The
    /// default ignores it.
    async fn build_for(
        &self,
        ctx: &Context,
        concurrency: NonZeroU32,
    ) -> Result<Arc<dyn Sink>, BuildError> {
        let _ = concurrency;
        self.build(ctx).await
    }
}

/// The connectors of a definition's blocks, from one list of its block
/// fields (config's `KINDS` is the same list: a unit test checks both
/// against the struct).
macro_rules! connectors {
    ($def:ty, $config:ident, [$($field:ident),+ $(,)?]) => {
        impl $def {
            /// The connector blocks present, as connectors that build:
            /// exactly one is valid (`validate` reports none or several).
            pub fn connectors(&self) -> Vec<&dyn $config> {
                let mut found: Vec<&dyn $config> = Vec::new();
                $(
                    if let Some(c) = &self.$field {
                        found.push(c);
                    }
                )+
                found
            }

            /// The connector block (the first, if several were given).
            pub fn connector(&self) -> Option<&dyn $config> {
                self.connectors().into_iter().next()
            }
        }
    };
}

connectors!(
    SourceDef,
    SourceConfig,
    [redis, postgres, mqtt, nats, sqs, amqp, kafka]
);

connectors!(
    SinkDef,
    SinkConfig,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A block added to `SourceDef` or `SinkDef` and to config's `KINDS`
    /// but not to `connectors!` here would be checked and never built.
    #[test]
    fn every_block_config_knows_is_a_connector() {
        let source: SourceDef =
            testing::block("name: s\nto: t\nredis: {url: 'redis://h', stream: s, group: g}\n");
        assert_eq!(source.connectors().len(), source.blocks().len());
        let kinds = |d: &[&dyn SourceConfig]| d.iter().map(|c| c.kind()).collect::<Vec<_>>();
        assert_eq!(kinds(&source.connectors()), ["redis"]);
    }
}
