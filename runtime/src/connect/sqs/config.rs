//! The `sqs:` blocks of a source and of a sink: the configuration
//! reference for the Amazon SQS connector.
//!
//! There are no credentials in the block: they come from the standard AWS
//! chain (`AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` / `AWS_SESSION_TOKEN`,
//! `AWS_PROFILE` and `~/.aws`, web identity, ECS and EC2 instance roles).

use std::num::NonZeroU32;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    MAX_BATCH, MAX_VISIBILITY, MAX_WAIT, SqsSink, SqsSource, Target, is_fifo, is_sqs_token,
};
use crate::config::HumanDuration;
use crate::connect::{BuildError, ConfigProblem, Context, Sink, SinkConfig, Source, SourceConfig};

/// An SQS queue messages are received from.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SqsSourceConfig {
    /// The queue's URL (`https://sqs.<region>.amazonaws.com/<account>/<name>`).
    /// A name ending in `.fifo` is a FIFO queue: its `MessageGroupId`
    /// becomes the key.
    pub queue_url: String,
    /// Another endpoint than AWS's for the region, for an SQS-compatible
    /// server (`http://localhost:4566`).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The AWS region. Default: the standard chain's (`AWS_REGION`, the
    /// profile), else `us-east-1`.
    #[serde(default)]
    pub region: Option<String>,
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
pub struct SqsSinkConfig {
    /// The queue's URL. A name ending in `.fifo` is a FIFO queue: the key
    /// becomes the `MessageGroupId` and the Sluice message id the
    /// `MessageDeduplicationId`.
    pub queue_url: String,
    /// Another endpoint than AWS's for the region, for an SQS-compatible
    /// server.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// The AWS region. Default: the standard chain's, else `us-east-1`.
    #[serde(default)]
    pub region: Option<String>,
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

impl SqsSourceConfig {
    pub(crate) fn target(&self) -> Target {
        Target {
            queue_url: self.queue_url.clone(),
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
        }
    }
}

impl SqsSinkConfig {
    pub(crate) fn target(&self) -> Target {
        Target {
            queue_url: self.queue_url.clone(),
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
        }
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

#[async_trait]
impl SourceConfig for SqsSourceConfig {
    fn resolve_paths(&mut self, _dir: &std::path::Path) {}

    fn kind(&self) -> &'static str {
        "sqs"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        check_target(
            &self.queue_url,
            self.endpoint.as_deref(),
            self.region.as_deref(),
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

    async fn build(&self, ctx: &Context) -> Result<Box<dyn Source>, BuildError> {
        Ok(Box::new(SqsSource::new(self, ctx)))
    }
}

#[async_trait]
impl SinkConfig for SqsSinkConfig {
    fn resolve_paths(&mut self, _dir: &std::path::Path) {}

    fn kind(&self) -> &'static str {
        "sqs"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        check_target(
            &self.queue_url,
            self.endpoint.as_deref(),
            self.region.as_deref(),
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

    async fn build(&self, ctx: &Context) -> Result<std::sync::Arc<dyn Sink>, BuildError> {
        let _ = ctx;
        Ok(std::sync::Arc::new(SqsSink::new(self)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::testing::{block, problem_paths as paths};

    const Q: &str = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders";

    fn source(yaml: &str) -> SqsSourceConfig {
        block(yaml)
    }

    fn sink(yaml: &str) -> SqsSinkConfig {
        block(yaml)
    }

    #[test]
    fn a_source_block_takes_its_defaults() {
        let c = source(&format!("queue_url: {Q}\n"));
        assert!(c.check().is_empty(), "{:?}", c.check());
        assert_eq!(c.read_max(), 10);
        assert_eq!(c.wait_time.get(), std::time::Duration::from_secs(20));
        assert_eq!(c.redelivery_horizon(), std::time::Duration::from_secs(30));
        assert!(c.describe().contains("orders"));
    }

    #[test]
    fn source_checks_name_the_offending_key() {
        let c = source(
            "queue_url: not a url\nendpoint: ftp://x\nregion: EU West\nwait_time: 21s\nvisibility_timeout: 1500ms\nbatch: 11\n",
        );
        assert_eq!(
            paths(&c.check()),
            vec![
                "queue_url",
                "endpoint",
                "region",
                "wait_time",
                "visibility_timeout",
                "batch"
            ]
        );
        let bad_name = source("queue_url: https://sqs.x.amazonaws.com/1/a%20b\n");
        assert_eq!(paths(&bad_name.check()), vec!["queue_url"]);
    }

    #[test]
    fn sink_checks_name_the_offending_key() {
        let fifo = sink(&format!(
            "queue_url: {Q}.fifo\ndelay: 5s\ndelay_header: wait\nmessage_group: \"a b\"\n"
        ));
        assert_eq!(
            paths(&fifo.check()),
            vec!["delay", "delay_header", "message_group"]
        );
        let standard = sink(&format!("queue_url: {Q}\ndelay: 16m\nmessage_group: g\n"));
        assert_eq!(paths(&standard.check()), vec!["delay", "message_group"]);
        let ok = sink(&format!(
            "queue_url: {Q}\ndelay: 10s\ndelay_header: delay\nendpoint: http://127.0.0.1:4566\nregion: eu-west-1\n"
        ));
        assert!(ok.check().is_empty(), "{:?}", ok.check());
        let ok_fifo = sink(&format!("queue_url: {Q}.fifo\nmessage_group: orders\n"));
        assert!(ok_fifo.check().is_empty(), "{:?}", ok_fifo.check());
    }
}
