//! The `sqs:` blocks of a source and of a sink: the configuration
//! reference for the Amazon SQS connector.
//!
//! There are no credentials in the block: they come from the standard AWS
//! chain (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`,
//! `AWS_PROFILE` and `~/.aws`, web identity, ECS and EC2 instance roles).

use std::num::NonZeroU32;

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigProblem, SinkBlock, SourceBlock, describe};
use crate::config::HumanDuration;

/// The most entries one batch call (`SendMessageBatch`,
/// `DeleteMessageBatch`, `ChangeMessageVisibilityBatch`) and one
/// `ReceiveMessage` take: SQS's own limit.
pub const MAX_BATCH: usize = 10;

/// The longest long poll SQS allows (`WaitTimeSeconds`).
pub const MAX_WAIT: Duration = Duration::from_secs(20);

/// The longest visibility timeout SQS allows (12 hours).
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// Whether `queue_url` names a FIFO queue: SQS requires their names to end
/// in `.fifo`.
pub fn is_fifo(queue_url: &str) -> bool {
    queue_url.trim_end_matches('/').ends_with(".fifo")
}

/// Whether `text` may be an SQS `MessageGroupId` or
/// `MessageDeduplicationId` as it is: 1 to 128 characters, each a letter,
/// a digit or ASCII punctuation.
pub fn is_sqs_token(text: &str) -> bool {
    !text.is_empty() && text.len() <= 128 && text.bytes().all(|b| b.is_ascii_graphic())
}

/// An SQS queue messages are received from.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SqsSourceConfig {
    /// The queue's URL (`https://sqs.<region>.amazonaws.com/<account>/<name>`).
    /// A name ending in `.fifo` is a FIFO queue: its `MessageGroupId`
    /// becomes the key.
    pub queue_url: String,
    /// `endpoint` and `region`: see [`SqsConnection`].
    #[serde(flatten)]
    pub connection: SqsConnection,
    /// How long one receive waits for a message (long polling,
    /// `WaitTimeSeconds`; whole seconds, at most 20 s).
    #[serde(default = "default_wait_time")]
    pub wait_time: HumanDuration,
    /// How long a received message stays invisible to other consumers
    /// (whole seconds, 1 s to 12 h). It is extended while the message's
    /// publish is held up (a full topic, the broker down), and it is how
    /// soon a message read before a crash comes back.
    #[serde(default = "default_visibility_timeout")]
    pub visibility_timeout: HumanDuration,
    /// The most messages one receive takes (1 to 10, SQS's limit).
    #[serde(default = "default_source_batch")]
    pub batch: NonZeroU32,
}

/// Where an SQS block, source or sink, sends its calls (the queue is the
/// block's own `queue_url`): flattened into the block, so the keys stay
/// beside its own. The credentials come from the standard AWS chain.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct SqsConnection {
    /// Another endpoint than AWS's for the region, for an SQS-compatible
    /// server (`http://localhost:4566`).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The AWS region. Default: the standard chain's (`AWS_REGION`, the
    /// profile), else `us-east-1`.
    #[serde(default)]
    pub region: Option<String>,
}

/// 20 s, the longest long poll.
pub fn default_wait_time() -> HumanDuration {
    HumanDuration::secs(20)
}

/// 30 s, SQS's own default.
pub fn default_visibility_timeout() -> HumanDuration {
    HumanDuration::secs(30)
}

/// 10, the most SQS returns.
pub fn default_source_batch() -> NonZeroU32 {
    NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN)
}

/// `sluice`.
pub fn default_message_group() -> String {
    "sluice".into()
}

/// An SQS queue messages are sent to.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = sink_descriptions)]
pub struct SqsSinkConfig {
    /// The queue's URL. A name ending in `.fifo` is a FIFO queue: the key
    /// becomes the `MessageGroupId` and the Sluice message id the
    /// `MessageDeduplicationId`.
    pub queue_url: String,
    /// `endpoint` and `region`: see [`SqsConnection`].
    #[serde(flatten)]
    pub connection: SqsConnection,
    /// A delay for every message (`DelaySeconds`, whole seconds, at most
    /// 15 min). Standard queues only: FIFO queues refuse a per-message
    /// delay.
    #[serde(default)]
    pub delay: Option<HumanDuration>,
    /// The header whose value delays its message (`30`, in seconds, or
    /// `30s`, `2m`), over `delay`. Standard queues only.
    #[serde(default)]
    pub delay_header: Option<String>,
    /// FIFO queues: the `MessageGroupId` of a message without a key (one
    /// group, so those messages are kept in the order they were sent).
    #[serde(default)]
    pub message_group: Option<String>,
}

/// The sink's own words, in the JSON Schema, for the fields of
/// [`SqsConnection`] whose doc comment is the source's.
fn sink_descriptions(schema: &mut schemars::Schema) {
    for (field, text) in [
        (
            "endpoint",
            "Another endpoint than AWS's for the region, for an SQS-compatible\nserver.",
        ),
        (
            "region",
            "The AWS region. Default: the standard chain's, else `us-east-1`.",
        ),
    ] {
        describe(schema, field, text);
    }
}

/// Checks the settings every block has.
fn check_target(
    queue_url: &str,
    endpoint: Option<&str>,
    region: Option<&str>,
    problems: &mut Vec<ConfigProblem>,
) {
    match url::Url::parse(queue_url) {
        Ok(url)
            if matches!(url.scheme(), "http" | "https")
                && url.host().is_some()
                && url
                    .path_segments()
                    .and_then(|mut s| s.next_back())
                    .is_some_and(|name| !name.is_empty()) =>
        {
            let name = url
                .path_segments()
                .and_then(|mut s| s.next_back())
                .unwrap_or("");
            if name.len() > 80
                || !name
                    .trim_end_matches(".fifo")
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
            {
                problems.push(ConfigProblem::at(
                    &["queue_url"],
                    format!(
                        "`{queue_url}`: the queue name `{name}` is not an SQS queue name (up to 80 \
                         letters, digits, `_` and `-`, ending in `.fifo` for a FIFO queue)"
                    ),
                ));
            }
        }
        _ => problems.push(ConfigProblem::at(
            &["queue_url"],
            format!(
                "`{queue_url}` is not an SQS queue URL; use \
                 `https://sqs.<region>.amazonaws.com/<account>/<queue>`"
            ),
        )),
    }
    if let Some(endpoint) = endpoint
        && !url::Url::parse(endpoint)
            .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
    {
        problems.push(ConfigProblem::at(
            &["endpoint"],
            format!("`{endpoint}` is not an endpoint URL; use `https://host[:port]` (or `http://` for a local server)"),
        ));
    }
    if let Some(region) = region
        && (region.is_empty()
            || !region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
    {
        problems.push(ConfigProblem::at(
            &["region"],
            format!("`{region}` is not an AWS region name (such as `eu-west-1`)"),
        ));
    }
}

/// Whole seconds within `range`, or a problem at `key`.
fn check_seconds(
    key: &'static str,
    value: std::time::Duration,
    min: std::time::Duration,
    max: std::time::Duration,
    problems: &mut Vec<ConfigProblem>,
) {
    let whole = value.subsec_nanos() == 0;
    if !whole || value < min || value > max {
        problems.push(ConfigProblem::at(
            &[key],
            format!(
                "`{key}` must be whole seconds from {} to {} (it is {})",
                humantime::format_duration(min),
                humantime::format_duration(max),
                humantime::format_duration(value)
            ),
        ));
    }
}

impl SourceBlock for SqsSourceConfig {
    fn resolve_paths(&mut self, _dir: &std::path::Path) {}

    fn kind(&self) -> &'static str {
        "sqs"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        check_target(
            &self.queue_url,
            self.connection.endpoint.as_deref(),
            self.connection.region.as_deref(),
            &mut problems,
        );
        check_seconds(
            "wait_time",
            self.wait_time.get(),
            std::time::Duration::ZERO,
            MAX_WAIT,
            &mut problems,
        );
        check_seconds(
            "visibility_timeout",
            self.visibility_timeout.get(),
            std::time::Duration::from_secs(1),
            MAX_VISIBILITY,
            &mut problems,
        );
        if usize::try_from(self.batch.get()).unwrap_or(usize::MAX) > MAX_BATCH {
            problems.push(ConfigProblem::at(
                &["batch"],
                format!(
                    "`batch` must be at most {MAX_BATCH} (SQS returns at most {MAX_BATCH} messages per receive)"
                ),
            ));
        }
        problems
    }

    fn describe(&self) -> String {
        format!("sqs queue `{}`", self.queue_url)
    }

    fn redelivery_horizon(&self) -> std::time::Duration {
        self.visibility_timeout.get()
    }

    fn read_max(&self) -> usize {
        usize::try_from(self.batch.get())
            .unwrap_or(MAX_BATCH)
            .min(MAX_BATCH)
    }
}

impl SinkBlock for SqsSinkConfig {
    fn resolve_paths(&mut self, _dir: &std::path::Path) {}

    fn kind(&self) -> &'static str {
        "sqs"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        check_target(
            &self.queue_url,
            self.connection.endpoint.as_deref(),
            self.connection.region.as_deref(),
            &mut problems,
        );
        let fifo = is_fifo(&self.queue_url);
        if let Some(delay) = self.delay {
            if fifo {
                problems.push(ConfigProblem::at(
                    &["delay"],
                    format!(
                        "`delay` is for standard queues: the FIFO queue `{}` refuses a per-message \
                         delay (set the queue's own `DelaySeconds` instead)",
                        self.queue_url
                    ),
                ));
            } else {
                check_seconds(
                    "delay",
                    delay.get(),
                    std::time::Duration::ZERO,
                    std::time::Duration::from_secs(900),
                    &mut problems,
                );
            }
        }
        if let Some(header) = &self.delay_header {
            if fifo {
                problems.push(ConfigProblem::at(
                    &["delay_header"],
                    format!(
                        "`delay_header` is for standard queues: the FIFO queue `{}` refuses a \
                         per-message delay",
                        self.queue_url
                    ),
                ));
            } else if header.is_empty() {
                problems.push(ConfigProblem::at(
                    &["delay_header"],
                    "`delay_header` must name a header",
                ));
            }
        }
        if let Some(group) = &self.message_group {
            if !fifo {
                problems.push(ConfigProblem::at(
                    &["message_group"],
                    format!(
                        "`message_group` is for FIFO queues (a name ending in `.fifo`); `{}` is a \
                         standard queue",
                        self.queue_url
                    ),
                ));
            } else if !is_sqs_token(group) {
                problems.push(ConfigProblem::at(
                    &["message_group"],
                    format!(
                        "`{group}` cannot be a MessageGroupId: 1 to 128 letters, digits and \
                         punctuation"
                    ),
                ));
            }
        }
        problems
    }

    fn describe(&self) -> String {
        format!("sqs queue `{}`", self.queue_url)
    }
}
