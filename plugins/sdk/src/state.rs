//! The stage's key-value store (`state: true` on the stage), committed with
//! the message's outputs and its ack.
//!
//! A call's writes are buffered and the call reads its own writes. They
//! commit only if the call returns `Ok`: after an `Err`, a panic or a
//! timeout nothing of them remains. So a counter per key counts each
//! message exactly once, across retries, redeliveries and crashes:
//!
//! ```ignore
//! use sluice_sdk::{state, Emit, Message, Outcome};
//!
//! fn handle(msg: Message) -> Outcome {
//!     let key = format!("count/{}", msg.key.as_deref().unwrap_or("-"));
//!     let n = state::increment(&key, 1)?;
//!     Ok(vec![Emit::to_default(n.to_string())])
//! }
//! ```
//!
//! Concurrency is optimistic: if a value the call read changed before the
//! commit, the call runs again on the new value (kind `state-conflict`,
//! spending no attempt). [`compare_and_set`] with revision 0 and a TTL is an
//! expiring lock.

use std::time::Duration;

use crate::HandlerError;
use crate::bindings::handler::sluice::plugin::state as raw;

/// One stored value and the store's revision when it was written.
pub use raw::Entry;

/// Why a state operation failed: `NotGranted` (the stage has no `state:`),
/// `StoreFull` (the store is at its `max_bytes`), `Invalid` (a key or value
/// the store does not take), `Unavailable` (try again later).
pub use raw::StateError;

/// The value at `key`, or `None` if absent or expired.
pub fn get(key: &str) -> Result<Option<Entry>, StateError> {
    raw::get(key)
}

/// The value at `key` as text, or `None`; a value that is not UTF-8 is
/// `Invalid`.
pub fn get_text(key: &str) -> Result<Option<String>, StateError> {
    get(key)?
        .map(|e| {
            String::from_utf8(e.value)
                .map_err(|_| StateError::Invalid(format!("the value at `{key}` is not UTF-8")))
        })
        .transpose()
}

/// Sets `key` to `value`, with no expiry.
pub fn set(key: &str, value: impl AsRef<[u8]>) -> Result<(), StateError> {
    raw::set(key, value.as_ref(), None)
}

/// Sets `key` to `value`, expiring after `ttl` (millisecond precision).
pub fn set_with_ttl(key: &str, value: impl AsRef<[u8]>, ttl: Duration) -> Result<(), StateError> {
    raw::set(key, value.as_ref(), Some(millis(ttl)))
}

/// Deletes `key` (absent is fine).
pub fn delete(key: &str) -> Result<(), StateError> {
    raw::delete(key)
}

/// Sets `key` to `value` only if its revision is still `revision` (0: only
/// if absent); `Ok(false)` if it moved. With `ttl`, the value expires.
pub fn compare_and_set(
    key: &str,
    revision: u64,
    value: impl AsRef<[u8]>,
    ttl: Option<Duration>,
) -> Result<bool, StateError> {
    raw::compare_and_set(key, revision, value.as_ref(), ttl.map(millis))
}

/// Adds `delta` to the decimal number at `key` (absent counts as 0) and
/// returns the new value; the value keeps its expiry.
pub fn increment(key: &str, delta: i64) -> Result<i64, StateError> {
    raw::increment(key, delta)
}

/// The keys under `prefix`, in order, at most `limit` (at most 1,000).
pub fn list(prefix: &str, limit: u32) -> Result<Vec<String>, StateError> {
    raw::list(prefix, limit)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What went wrong, in words (the bindings' `Display` shows the variant).
pub fn describe(e: &StateError) -> String {
    match e {
        StateError::NotGranted(why) => format!("state not granted: {why}"),
        StateError::StoreFull(why) => format!("state store full: {why}"),
        StateError::Invalid(why) => format!("invalid state operation: {why}"),
        StateError::Unavailable(why) => format!("state unavailable: {why}"),
    }
}

/// With `?` in a handler: a store that cannot be read now, or is full, is
/// retried (space may free up; `retry.max_attempts` ends it with this
/// reason); a missing grant or an invalid key is a bug in the handler or
/// the pipeline, and rejects.
impl From<StateError> for HandlerError {
    fn from(e: StateError) -> Self {
        match e {
            StateError::Unavailable(_) | StateError::StoreFull(_) => HandlerError::Retry(None),
            StateError::NotGranted(_) | StateError::Invalid(_) => {
                HandlerError::reject(describe(&e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_what_failed_and_map_to_retry_or_reject() {
        let full = StateError::StoreFull("at 1 KiB".into());
        assert_eq!(describe(&full), "state store full: at 1 KiB");
        assert_eq!(HandlerError::from(full), HandlerError::Retry(None));
        assert_eq!(
            HandlerError::from(StateError::Unavailable("down".into())),
            HandlerError::Retry(None)
        );
        assert_eq!(
            HandlerError::from(StateError::NotGranted("add `state: true`".into())),
            HandlerError::Reject("state not granted: add `state: true`".into())
        );
        assert_eq!(
            HandlerError::from(StateError::Invalid("empty key".into())),
            HandlerError::Reject("invalid state operation: empty key".into())
        );
    }

    #[test]
    fn ttls_are_milliseconds_and_saturate() {
        assert_eq!(millis(Duration::from_micros(2_500)), 2);
        assert_eq!(millis(Duration::MAX), u64::MAX);
    }
}
