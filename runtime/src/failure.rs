//! The fixed vocabulary of failure kinds.
//!
//! Every failed attempt at a message is classified with one of these names, and
//! the same name appears everywhere the failure is visible: logs, dead-letter
//! headers, metrics and CLI output. Keeping the list in one enum keeps those
//! places from drifting apart.

use std::fmt;
use std::time::Duration;

/// Why an attempt at a message failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureKind {
    /// The handler asked for a retry.
    Retry,
    /// The handler rejected the message as permanently unprocessable, or
    /// emitted a key or header that no broker can carry (a line break in a
    /// value, say): the handler would do the same again, so no retry helps.
    Rejected,
    /// The handler trapped (panic, unreachable, stack overflow, bad contract use).
    Trap,
    /// The handler ran past its per-call timeout.
    Timeout,
    /// The handler tried to grow its memory past the stage's limit.
    OutOfMemory,
    /// The handler emitted more bytes or more messages than the stage allows.
    OutputTooLarge,
    /// The handler emitted to a topic the stage does not declare.
    UndeclaredTopic,
    /// A claim-check reference points at an object that is not (yet) there.
    ClaimMissing,
    /// Publishing the outputs or answering the delivery (complete, nak, dead
    /// letter) failed at the broker.
    PublishFailed,
    /// The dedup key was already handled with a different payload.
    DedupConflict,
    /// A sink's target could not be reached (connection refused, DNS, a
    /// lost connection). Not the message's fault: the delivery is held and
    /// tried again in place, with backoff, without spending an attempt, for
    /// as long as the outage lasts.
    Unavailable,
    /// A state value the handler's call read was changed by another call
    /// before this one committed (or the store filled up meanwhile):
    /// nothing of the call was written, and it runs again on the new value.
    StateConflict,
}

impl FailureKind {
    /// Every kind, in a stable order (for metrics and docs).
    pub const ALL: [FailureKind; 12] = [
        FailureKind::Retry,
        FailureKind::Rejected,
        FailureKind::Trap,
        FailureKind::Timeout,
        FailureKind::OutOfMemory,
        FailureKind::OutputTooLarge,
        FailureKind::UndeclaredTopic,
        FailureKind::ClaimMissing,
        FailureKind::PublishFailed,
        FailureKind::DedupConflict,
        FailureKind::Unavailable,
        FailureKind::StateConflict,
    ];

    /// The fixed name used in logs, headers, metrics and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Retry => "retry",
            FailureKind::Rejected => "rejected",
            FailureKind::Trap => "trap",
            FailureKind::Timeout => "timeout",
            FailureKind::OutOfMemory => "out-of-memory",
            FailureKind::OutputTooLarge => "output-too-large",
            FailureKind::UndeclaredTopic => "undeclared-topic",
            FailureKind::ClaimMissing => "claim-missing",
            FailureKind::PublishFailed => "publish-failed",
            FailureKind::DedupConflict => "dedup-conflict",
            FailureKind::Unavailable => "unavailable",
            FailureKind::StateConflict => "state-conflict",
        }
    }

    /// Whether another attempt may succeed. Non-retryable kinds go to the
    /// dead-letter stream at once; retryable ones until `max_attempts`.
    pub fn is_retryable(self) -> bool {
        match self {
            FailureKind::Retry
            | FailureKind::Trap
            | FailureKind::Timeout
            | FailureKind::OutOfMemory
            | FailureKind::ClaimMissing
            | FailureKind::PublishFailed
            | FailureKind::Unavailable
            | FailureKind::StateConflict => true,
            FailureKind::Rejected
            | FailureKind::OutputTooLarge
            | FailureKind::UndeclaredTopic
            | FailureKind::DedupConflict => false,
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One failed attempt: its kind, a human-readable message, and, for a
/// handler-requested retry, the delay it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The classification.
    pub kind: FailureKind,
    /// What happened, for people.
    pub message: String,
    /// A delay the handler asked for with `retry(some(ms))`.
    pub retry_after: Option<Duration>,
    /// The keys of its stage's state store the failed call read, for the
    /// dead letter ([`crate::dlq::STATE_READ`]).
    pub state_read: Vec<String>,
}

impl Failure {
    /// A failure of `kind` with a message.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
            retry_after: None,
            state_read: Vec::new(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Failure {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_design_vocabulary() {
        let names: Vec<_> = FailureKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "retry",
                "rejected",
                "trap",
                "timeout",
                "out-of-memory",
                "output-too-large",
                "undeclared-topic",
                "claim-missing",
                "publish-failed",
                "dedup-conflict",
                "unavailable",
                "state-conflict"
            ]
        );
    }

    #[test]
    fn only_transient_failures_retry() {
        let retryable: Vec<_> = FailureKind::ALL
            .iter()
            .filter(|k| k.is_retryable())
            .map(|k| k.as_str())
            .collect();
        assert_eq!(
            retryable,
            [
                "retry",
                "trap",
                "timeout",
                "out-of-memory",
                "claim-missing",
                "publish-failed",
                "unavailable",
                "state-conflict"
            ]
        );
    }
}
