//! Constructors and trait impls for [`HandlerError`], so failing is one short
//! expression and errors work with `?` and `Display`.

use std::fmt;
use std::time::Duration;

use crate::HandlerError;

impl HandlerError {
    /// A permanent failure: the message is dead-lettered now with `reason`
    /// (kind `rejected`) and never retried. Use it for input that can never
    /// succeed, such as a malformed payload.
    pub fn reject(reason: impl fmt::Display) -> Self {
        Self::Reject(reason.to_string())
    }

    /// A transient failure: the message is delivered again after the stage's
    /// `retry.backoff` delay, until `retry.max_attempts`.
    pub fn retry() -> Self {
        Self::Retry(None)
    }

    /// A transient failure with an explicit delay, e.g. from a rate limiter's
    /// hint, instead of the stage's backoff policy. Millisecond precision;
    /// longer than `u64::MAX` ms saturates.
    pub fn retry_after(delay: Duration) -> Self {
        Self::Retry(Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)))
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Retry(None) => f.write_str("retry"),
            Self::Retry(Some(ms)) => write!(f, "retry after {ms} ms"),
            Self::Reject(reason) => write!(f, "rejected: {reason}"),
        }
    }
}

impl std::error::Error for HandlerError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_and_display_say_what_happens() {
        assert_eq!(HandlerError::retry().to_string(), "retry");
        assert_eq!(
            HandlerError::retry_after(Duration::from_millis(1500)).to_string(),
            "retry after 1500 ms"
        );
        assert_eq!(
            HandlerError::reject(format_args!("bad {}", 7)).to_string(),
            "rejected: bad 7"
        );
    }

    #[test]
    fn retry_after_keeps_milliseconds_and_saturates() {
        assert_eq!(
            HandlerError::retry_after(Duration::from_micros(2_999)),
            HandlerError::Retry(Some(2))
        );
        assert_eq!(
            HandlerError::retry_after(Duration::MAX),
            HandlerError::Retry(Some(u64::MAX))
        );
    }
}
