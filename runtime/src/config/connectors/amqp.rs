//! The `amqp:` blocks of a source and of a sink: the configuration
//! reference for the RabbitMQ (AMQP 0.9.1) connector.

use std::num::{NonZeroU16, NonZeroU32};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::tls::{TlsFiles, TlsOptions};
use super::{ConfigProblem, SinkBlock, SourceBlock, describe};
use crate::config::SecretUrl;

/// A RabbitMQ queue consumed with manual acknowledgements.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AmqpSourceConfig {
    /// `url`: see [`AmqpConnection`].
    #[serde(flatten)]
    pub connection: AmqpConnection,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
    /// The queue consumed. It must exist: the connector declares no
    /// topology (its arguments, such as `x-delivery-limit` or a
    /// dead-letter exchange, are the queue owner's).
    pub queue: String,
    /// The most messages delivered and not yet acknowledged (`basic.qos`),
    /// lowered to the room under the topic's high-water mark.
    #[serde(default = "default_prefetch")]
    pub prefetch: NonZeroU16,
    /// The most messages one read takes.
    #[serde(default = "default_read_batch")]
    pub batch: NonZeroU32,
    /// The consumer tag. Default: `sluice-<host>-<pid>`.
    #[serde(default)]
    pub consumer_tag: Option<String>,
}

/// Where an AMQP block, source or sink, connects, flattened into the
/// block so the key stays beside its own. The TLS files are the block's
/// [`TlsOptions`], flattened beside it (serde cannot flatten one struct
/// in another under a block that denies unknown keys). Read, with them,
/// by [`crate::connect::amqp`]'s one connection builder.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct AmqpConnection {
    /// `amqp://user:password@host:5672/vhost` (`%2f` for the vhost `/`,
    /// or no path at all), or `amqps://` for TLS. `${VAR}` is expanded;
    /// the password is never shown.
    pub url: SecretUrl,
}

/// 500.
pub fn default_prefetch() -> NonZeroU16 {
    NonZeroU16::new(500).unwrap_or(NonZeroU16::MIN)
}

/// 100.
pub fn default_read_batch() -> NonZeroU32 {
    NonZeroU32::new(100).unwrap_or(NonZeroU32::MIN)
}

/// A RabbitMQ exchange messages are published to, with publisher confirms.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = |schema: &mut schemars::Schema| describe(schema, "url", SINK_URL))]
pub struct AmqpSinkConfig {
    /// `url`: see [`AmqpConnection`].
    #[serde(flatten)]
    pub connection: AmqpConnection,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
    /// The exchange published to; `""` is the default exchange (the routing
    /// key is then a queue name). It must exist.
    pub exchange: String,
    /// The routing key: text, where `{key}` stands for the message's key
    /// (`orders.{key}`).
    pub routing_key: String,
}

/// The sink's own words for `url` in the JSON Schema.
const SINK_URL: &str = "`amqp://user:password@host:5672/vhost`, or `amqps://`.";

/// Checks a URL: the scheme, the vhost, the TLS options.
fn check_url(url: &SecretUrl, tls: TlsFiles<'_>, problems: &mut Vec<ConfigProblem>) {
    match url.scheme().as_str() {
        "amqp" => {
            if let Some(option) = tls.first_given() {
                problems.push(ConfigProblem::at(
                    &[option],
                    format!("`{option}` is for TLS: write the URL as `amqps://` (it is `{url}`)"),
                ));
            }
        }
        "amqps" => tls.check(problems),
        _ => {
            problems.push(ConfigProblem::at(
                &["url"],
                format!(
                    "`{url}` is not an AMQP URL; use `amqp://user:password@host:5672/%2f` (or \
                     `amqps://` for TLS)"
                ),
            ));
            return;
        }
    }
    let parsed = url.url();
    if parsed.host_str().is_none_or(str::is_empty) {
        problems.push(ConfigProblem::at(
            &["url"],
            format!("`{url}` names no host"),
        ));
    }
    if parsed.path() == "/" {
        problems.push(ConfigProblem::at(
            &["url"],
            format!(
                "`{url}` names the empty vhost (its path is just `/`); write `/%2f` for the default \
                 vhost `/`, or leave the path out"
            ),
        ));
    } else if parsed.path().trim_start_matches('/').contains('/') {
        problems.push(ConfigProblem::at(
            &["url"],
            format!("`{url}`: a vhost with a `/` is written with `%2f`"),
        ));
    }
    if let Err(e) = url.expose().parse::<lapin::uri::AMQPUri>() {
        problems.push(ConfigProblem::at(
            &["url"],
            url.scrub(&format!("`{url}` is not an AMQP URI: {e}")),
        ));
    }
}

/// A queue, exchange or tag name: 1..=255 bytes (AMQP short strings),
/// no control characters.
fn check_short(key: &'static str, value: &str, empty_ok: bool, problems: &mut Vec<ConfigProblem>) {
    if value.is_empty() && !empty_ok {
        problems.push(ConfigProblem::at(&[key], format!("`{key}` is empty")));
    } else if value.len() > 255 {
        problems.push(ConfigProblem::at(
            &[key],
            format!("`{key}` is {} bytes; AMQP allows at most 255", value.len()),
        ));
    } else if value.chars().any(char::is_control) {
        problems.push(ConfigProblem::at(
            &[key],
            format!("`{key}` {value:?} holds a control character"),
        ));
    }
}

impl SourceBlock for AmqpSourceConfig {
    fn resolve_paths(&mut self, dir: &std::path::Path) {
        self.tls.resolve_paths(dir);
    }

    fn kind(&self) -> &'static str {
        "amqp"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        check_url(&self.connection.url, self.tls.files(), &mut problems);
        check_short("queue", &self.queue, false, &mut problems);
        if let Some(tag) = &self.consumer_tag {
            check_short("consumer_tag", tag, false, &mut problems);
        }
        problems
    }

    fn describe(&self) -> String {
        format!("amqp queue `{}` at {}", self.queue, self.connection.url)
    }

    fn redelivery_horizon(&self) -> std::time::Duration {
        // Unacknowledged deliveries return to the queue when the channel
        // closes (a crash, a reconnect) and are read again at once; a
        // daemon that stays down longer than the topic's duplicate window
        // (twice this) can publish a redelivery twice.
        std::time::Duration::from_secs(300)
    }

    fn read_max(&self) -> usize {
        usize::try_from(self.batch.get()).unwrap_or(usize::MAX)
    }
}

impl SinkBlock for AmqpSinkConfig {
    fn resolve_paths(&mut self, dir: &std::path::Path) {
        self.tls.resolve_paths(dir);
    }

    fn kind(&self) -> &'static str {
        "amqp"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        check_url(&self.connection.url, self.tls.files(), &mut problems);
        check_short("exchange", &self.exchange, true, &mut problems);
        if let Err(e) = RoutingKey::parse(&self.routing_key) {
            problems.push(ConfigProblem::at(&["routing_key"], e));
        }
        if self.exchange.is_empty() && self.routing_key.is_empty() {
            problems.push(ConfigProblem::at(
                &["routing_key"],
                "with the default exchange (`exchange: \"\"`) the routing key is the queue's \
                 name; it cannot be empty",
            ));
        }
        problems
    }

    fn describe(&self) -> String {
        format!(
            "amqp exchange `{}` (routing key `{}`) at {}",
            self.exchange, self.routing_key, self.connection.url
        )
    }
}

/// A sink's routing key: text with `{key}` standing for the message's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoutingKey {
    /// The text around each `{key}`: one more part than there are keys.
    pub(crate) parts: Vec<String>,
}

impl RoutingKey {
    /// Parses a template; the only placeholder is `{key}`.
    pub(crate) fn parse(template: &str) -> Result<RoutingKey, String> {
        let mut parts = Vec::new();
        let mut rest = template;
        loop {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(rest.to_owned());
                    break;
                }
                Some(at) if rest[at..].starts_with("{key}") => {
                    parts.push(rest[..at].to_owned());
                    rest = &rest[at + "{key}".len()..];
                }
                Some(at) => {
                    return Err(format!(
                        "`routing_key` {template:?}: only `{{key}}` (the message's key) may stand \
                         in braces, found {:?}",
                        &rest[at..rest.len().min(at + 12)]
                    ));
                }
            }
        }
        if template.chars().any(char::is_control) {
            return Err(format!(
                "`routing_key` {template:?} holds a control character"
            ));
        }
        if template.len() > 255 {
            return Err(format!(
                "`routing_key` is {} bytes; AMQP allows at most 255",
                template.len()
            ));
        }
        Ok(RoutingKey { parts })
    }
}
