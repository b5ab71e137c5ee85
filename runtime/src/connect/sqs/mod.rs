//! Amazon SQS: a source (long polling `ReceiveMessage`, the visibility of
//! held messages extended, `DeleteMessageBatch` after the durable
//! publish) and a sink (`SendMessageBatch` of up to 10, every failed entry
//! retried or dead-lettered by its error code; FIFO queues get the key as
//! the group id and the Sluice id as the deduplication id).
//!
//! Both use the official AWS SDK for Rust (`aws-sdk-sqs`, with
//! `aws-config` for the standard credential and region chains). The
//! client is made on first use (loading credentials may contact an
//! instance metadata service, so it is not done at start-up), with the
//! SDK's own retries off: the source runner's backoff and the sink stage's
//! retry policy do the waiting, and an outage is reported at once. Every
//! call has a deadline ([`CALL_TIMEOUT`]), so a server that stops
//! answering is an outage, not a hang.

mod config;
mod sink;
mod source;

use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::meta::region::RegionProviderChain;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::Region;
use aws_sdk_sqs::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use tokio::sync::OnceCell;

pub use crate::config::connectors::sqs::{
    MAX_BATCH, MAX_VISIBILITY, MAX_WAIT, SqsSinkConfig, SqsSourceConfig, is_fifo, is_sqs_token,
};
pub use sink::SqsSink;
pub use source::SqsSource;

/// The region when neither the block nor the environment names one.
pub const DEFAULT_REGION: &str = "us-east-1";

/// How long one call (other than a long poll's wait) may take: well under
/// a sink stage's default `timeout` (30 s), so a server that stops
/// answering is an outage (held, no attempt spent), not a timed-out
/// attempt.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A queue's connection settings: where, and through which endpoint and
/// region.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) queue_url: String,
    pub(crate) endpoint: Option<String>,
    pub(crate) region: Option<String>,
}

impl Target {
    /// Whether the queue is a FIFO queue (its name ends in `.fifo`).
    pub(crate) fn fifo(&self) -> bool {
        is_fifo(&self.queue_url)
    }
}

/// A client made on first use and shared from then on.
pub(crate) struct LazyClient {
    target: Target,
    client: OnceCell<Client>,
}

impl LazyClient {
    pub(crate) fn new(target: Target) -> Self {
        LazyClient {
            target,
            client: OnceCell::new(),
        }
    }

    /// A client made already (tests: explicit credentials, no chain).
    #[cfg(test)]
    pub(crate) fn with_client(target: Target, client: Client) -> Self {
        LazyClient {
            target,
            client: OnceCell::new_with(Some(client)),
        }
    }

    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// The client, made now if it is the first call: the region is the
    /// block's, else the standard chain's (`AWS_REGION`, the profile),
    /// else [`DEFAULT_REGION`]; credentials come from the standard chain
    /// when a request is signed.
    pub(crate) async fn get(&self) -> &Client {
        self.client
            .get_or_init(|| async {
                let region =
                    RegionProviderChain::first_try(self.target.region.clone().map(Region::new))
                        .or_default_provider()
                        .or_else(Region::new(DEFAULT_REGION));
                let mut loader = aws_config::defaults(BehaviorVersion::latest())
                    .region(region)
                    .retry_config(RetryConfig::disabled())
                    .timeout_config(
                        TimeoutConfig::builder()
                            .connect_timeout(CONNECT_TIMEOUT)
                            .build(),
                    );
                if let Some(endpoint) = &self.target.endpoint {
                    loader = loader.endpoint_url(endpoint);
                }
                Client::new(&loader.load().await)
            })
            .await
    }
}

/// What a failed call means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// SQS could not be reached or used: no answer, a connection error, a
    /// server error, missing or refused credentials, no such queue. Held
    /// and retried; shown by readiness.
    Unavailable(String),
    /// SQS refuses for now (throttling).
    Throttled(String),
    /// SQS refuses this request for good (the sender's fault): the code
    /// and message.
    Refused(String),
}

impl CallError {
    /// The text, whatever the kind.
    pub(crate) fn text(&self) -> &str {
        match self {
            CallError::Unavailable(t) | CallError::Throttled(t) | CallError::Refused(t) => t,
        }
    }
}

/// Error codes that mean "not now" whatever the request.
const THROTTLING: &[&str] = &[
    "RequestThrottled",
    "ThrottlingException",
    "Throttling",
    "KmsThrottled",
    "KMS.ThrottlingException",
    "ServiceUnavailable",
    "InternalError",
    "InternalFailure",
    "RequestTimeout",
];

/// Error codes that say the queue or the credentials cannot be used (not
/// this message): an outage until the operator fixes it, never a
/// dead-lettered message.
const UNUSABLE: &[&str] = &[
    "AccessDenied",
    "AccessDeniedException",
    "AWS.SimpleQueueService.NonExistentQueue",
    "QueueDoesNotExist",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "ExpiredToken",
    "InvalidSecurity",
    "MissingAuthenticationToken",
    "RequestExpired",
    "InvalidAddress",
    "KmsAccessDenied",
    "KmsDisabled",
    "KmsNotFound",
    "KmsInvalidState",
    "KmsInvalidKeyUsage",
    "KmsOptInRequired",
    "AWS.SimpleQueueService.UnsupportedOperation",
];

/// Whether a code (of a call or of a batch entry) is throttling.
pub(crate) fn is_throttling(code: &str) -> bool {
    THROTTLING.contains(&code)
}

/// Whether a code says the queue or the credentials cannot be used.
pub(crate) fn is_unusable(code: &str) -> bool {
    UNUSABLE.contains(&code)
}

/// Classifies a failed call on `queue_url`.
pub(crate) fn classify<E>(queue_url: &str, what: &str, err: &SdkError<E>) -> CallError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let detail = DisplayErrorContext(err).to_string();
    match err {
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let code = service.err().code().unwrap_or("").to_owned();
            let message = service.err().message().unwrap_or("").to_owned();
            let text = format!("sqs {what} on `{queue_url}`: {code} (HTTP {status}): {message}");
            if is_throttling(&code) || status == 429 {
                CallError::Throttled(text)
            } else if is_unusable(&code) || status >= 500 || status == 403 || status == 401 {
                CallError::Unavailable(text)
            } else {
                CallError::Refused(text)
            }
        }
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            CallError::Unavailable(format!("sqs {what} on `{queue_url}`: {detail}"))
        }
        // No credentials, no region: nothing was sent, and nothing will be
        // until the environment is fixed.
        _ => CallError::Unavailable(format!("sqs {what} on `{queue_url}`: {detail}")),
    }
}

/// The outage of a call that did not answer within `limit`.
pub(crate) fn timed_out(queue_url: &str, what: &str, limit: Duration) -> CallError {
    CallError::Unavailable(format!(
        "sqs {what} on `{queue_url}`: no answer within {}",
        humantime::format_duration(limit)
    ))
}

/// `text` as an SQS token: itself when [`is_sqs_token`], else
/// `sha256-<64 hex digits>` of it.
pub fn sqs_token(text: &str) -> String {
    if is_sqs_token(text) {
        return text.to_owned();
    }
    use sha2::Digest as _;
    format!(
        "sha256-{}",
        hex::encode(sha2::Sha256::digest(text.as_bytes()))
    )
}

/// Why `name` cannot be an SQS message attribute name, if it cannot: up
/// to 256 letters, digits, `_`, `-` and `.`, no leading, trailing or
/// doubled `.`, and no `AWS.` or `Amazon.` prefix.
pub fn attribute_name_problem(name: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if name.is_empty() || name.len() > 256 {
        Some(format!(
            "`{name}` cannot be an SQS message attribute name: 1 to 256 characters"
        ))
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
    {
        Some(format!(
            "`{name}` cannot be an SQS message attribute name: only letters, digits, `_`, `-` and `.`"
        ))
    } else if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        Some(format!(
            "`{name}` cannot be an SQS message attribute name: no leading, trailing or doubled `.`"
        ))
    } else if lower.starts_with("aws.") || lower.starts_with("amazon.") {
        Some(format!(
            "`{name}` cannot be an SQS message attribute name: `AWS.` and `Amazon.` are reserved"
        ))
    } else {
        None
    }
}

/// Whether every character of `text` is one SQS takes in a message body
/// or attribute value (XML 1.0 characters: tab, newline, carriage return,
/// and U+0020 to U+10FFFF but the surrogates, U+FFFE and U+FFFF).
pub fn sqs_text_ok(text: &str) -> bool {
    text.chars().all(|c| {
        matches!(c, '\t' | '\n' | '\r')
            || ('\u{20}'..='\u{D7FF}').contains(&c)
            || ('\u{E000}'..='\u{FFFD}').contains(&c)
            || c >= '\u{10000}'
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_kept_when_they_fit_and_hashed_otherwise() {
        assert_eq!(sqs_token("src:1b2c-3d"), "src:1b2c-3d");
        let long = "x".repeat(129);
        let hashed = sqs_token(&long);
        assert!(
            hashed.starts_with("sha256-") && hashed.len() == 71,
            "{hashed}"
        );
        assert!(is_sqs_token(&hashed));
        assert_ne!(sqs_token("a b"), "a b");
        assert_eq!(sqs_token("a b"), sqs_token("a b"));
    }

    #[test]
    fn attribute_names_follow_sqs_rules() {
        assert!(attribute_name_problem("sluice-id").is_none());
        assert!(attribute_name_problem("trace.parent_1").is_none());
        for bad in ["", "a b", ".a", "a.", "a..b", "AWS.x", "amazon.y", "é"] {
            assert!(attribute_name_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn text_sqs_refuses_is_found() {
        assert!(sqs_text_ok("héllo\n\tworld"));
        assert!(!sqs_text_ok("nul\u{0}"));
        assert!(!sqs_text_ok("bell\u{7}"));
        assert!(!sqs_text_ok("\u{FFFF}"));
    }

    #[test]
    fn fifo_queues_are_known_by_their_name() {
        assert!(is_fifo("https://sqs.eu-west-1.amazonaws.com/1/out.fifo"));
        assert!(!is_fifo("https://sqs.eu-west-1.amazonaws.com/1/out"));
    }
}
