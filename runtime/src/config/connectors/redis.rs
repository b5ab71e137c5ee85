//! The `redis:` blocks of a source and of a sink: the configuration
//! reference for the Redis connector.

use std::num::NonZeroU32;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::names::check_plain_name;
use super::tls::{TlsFiles, TlsOptions};
use super::{ConfigProblem, SinkBlock, SourceBlock, describe};
use crate::config::{HumanDuration, SecretUrl};

/// A Redis stream read through a consumer group.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedisSourceConfig {
    /// `url`: see [`RedisConnection`].
    #[serde(flatten)]
    pub connection: RedisConnection,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
    /// The stream key.
    pub stream: String,
    /// The consumer group, created (with the stream) if missing.
    pub group: String,
    /// This daemon's consumer name in the group. Default: the host name
    /// and process id, so several daemons are competing consumers.
    #[serde(default)]
    pub consumer: Option<String>,
    /// Where a group created now starts: `new` (entries added from now
    /// on) or `oldest` (the whole stream). An existing group keeps its
    /// position.
    #[serde(default)]
    pub start: StartFrom,
    /// The most entries one read takes.
    #[serde(default = "default_read_batch")]
    pub batch: NonZeroU32,
    /// Entries another consumer read and did not acknowledge for this
    /// long are reclaimed (`XAUTOCLAIM`): that consumer is taken for dead.
    #[serde(default = "default_claim_idle")]
    pub claim_idle: HumanDuration,
    /// The entry field that holds the payload.
    #[serde(default = "default_payload_field")]
    pub payload_field: String,
    /// The entry field that holds the key, if any. Every other field
    /// becomes a header.
    #[serde(default = "default_key_field")]
    pub key_field: String,
}

/// Where a Redis block, source or sink, connects, flattened into the
/// block so the key stays beside its own. The TLS files are the block's
/// [`TlsOptions`], flattened beside it (serde cannot flatten one struct
/// in another under a block that denies unknown keys). Read, with them,
/// by [`crate::connect::redis`]'s one connection builder.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct RedisConnection {
    /// `redis://[user:password@]host:port/db` (or `rediss://` for TLS).
    /// `${VAR}` is expanded; the password is never shown.
    pub url: SecretUrl,
}

/// Where a new consumer group starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// Entries added after the group is created (`$`).
    #[default]
    New,
    /// The whole stream (`0`).
    Oldest,
}

/// 100.
pub fn default_read_batch() -> NonZeroU32 {
    NonZeroU32::new(100).unwrap_or(NonZeroU32::MIN)
}

/// 30 s (the default `ack_wait`).
pub fn default_claim_idle() -> HumanDuration {
    HumanDuration::secs(30)
}

/// `payload`.
pub fn default_payload_field() -> String {
    "payload".into()
}

/// `key`.
pub fn default_key_field() -> String {
    "key".into()
}

/// A Redis stream that messages are appended to.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = |schema: &mut schemars::Schema| describe(schema, "url", SINK_URL))]
pub struct RedisSinkConfig {
    /// `url`: see [`RedisConnection`].
    #[serde(flatten)]
    pub connection: RedisConnection,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
    /// The stream key.
    pub stream: String,
    /// Trim the stream to about this many entries (`MAXLEN ~`). No trim
    /// when absent.
    #[serde(default)]
    pub maxlen: Option<u64>,
    /// How long a written message id is remembered (in the key
    /// `sluice:dedup:<stream>:<message id>`), so a redelivered message is
    /// not appended twice.
    #[serde(default = "default_sink_dedup_ttl")]
    pub dedup_ttl: HumanDuration,
}

/// The sink's own words for `url` in the JSON Schema.
const SINK_URL: &str = "`redis://[user:password@]host:port/db` (or `rediss://`).";

/// 24 h.
pub fn default_sink_dedup_ttl() -> HumanDuration {
    HumanDuration::secs(24 * 3600)
}

fn check_url(url: &SecretUrl, tls: TlsFiles<'_>, problems: &mut Vec<ConfigProblem>) {
    match url.scheme().as_str() {
        "redis" => {
            if let Some(option) = tls.first_given() {
                problems.push(ConfigProblem::at(
                    &[option],
                    format!("`{option}` is for TLS: write the URL as `rediss://` (it is `{url}`)"),
                ));
            }
        }
        "rediss" => {
            if url.url().fragment() == Some("insecure") {
                problems.push(ConfigProblem::at(
                    &["url"],
                    format!(
                        "`{url}`: `#insecure` (no certificate check) is not supported; give \
                         the server's CA certificate as `tls_ca`"
                    ),
                ));
            }
            tls.check(problems);
        }
        _ => problems.push(ConfigProblem::at(
            &["url"],
            format!(
                "`{url}` is not a Redis URL; use `redis://host:6379/0` (or `rediss://` for TLS)"
            ),
        )),
    }
}

impl SourceBlock for RedisSourceConfig {
    fn resolve_paths(&mut self, dir: &std::path::Path) {
        self.tls.resolve_paths(dir);
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        check_url(&self.connection.url, self.tls.files(), &mut problems);
        for (key, value) in [("stream", &self.stream), ("group", &self.group)] {
            if let Err(e) = check_plain_name(value) {
                problems.push(ConfigProblem::at(&[key], e));
            }
        }
        if let Some(consumer) = &self.consumer
            && let Err(e) = check_plain_name(consumer)
        {
            problems.push(ConfigProblem::at(&["consumer"], e));
        }
        if self.claim_idle.get().is_zero() {
            problems.push(ConfigProblem::at(
                &["claim_idle"],
                "`claim_idle` must be longer than 0s",
            ));
        }
        problems
    }

    fn describe(&self) -> String {
        format!(
            "redis stream `{}` (group `{}`) at {}",
            self.stream, self.group, self.connection.url
        )
    }

    fn redelivery_horizon(&self) -> std::time::Duration {
        self.claim_idle.get()
    }

    fn read_max(&self) -> usize {
        usize::try_from(self.batch.get()).unwrap_or(usize::MAX)
    }
}

impl SinkBlock for RedisSinkConfig {
    fn resolve_paths(&mut self, dir: &std::path::Path) {
        self.tls.resolve_paths(dir);
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        check_url(&self.connection.url, self.tls.files(), &mut problems);
        if let Err(e) = check_plain_name(&self.stream) {
            problems.push(ConfigProblem::at(&["stream"], e));
        }
        if self.maxlen == Some(0) {
            problems.push(ConfigProblem::at(
                &["maxlen"],
                "`maxlen` must be at least 1 (leave it out for no trim)",
            ));
        }
        problems
    }

    fn describe(&self) -> String {
        format!("redis stream `{}` at {}", self.stream, self.connection.url)
    }
}
