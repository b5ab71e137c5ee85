//! Logging through the runtime, so lines land in its log inside the span of
//! the stage and the message being handled (stdout/stderr work too, but carry
//! no level).
//!
//! ```ignore
//! sluice_sdk::log::info(&format!("routing {} to {topic}", msg.id));
//! ```

use crate::bindings::handler::sluice::plugin::host::{self, Level};

/// Logs at trace level: very detailed, usually filtered out.
pub fn trace(text: &str) {
    host::log(Level::Trace, text);
}

/// Logs at debug level: details useful while developing a handler.
pub fn debug(text: &str) {
    host::log(Level::Debug, text);
}

/// Logs at info level: notable, expected events.
pub fn info(text: &str) {
    host::log(Level::Info, text);
}

/// Logs at warn level: something unexpected that the handler coped with.
pub fn warn(text: &str) {
    host::log(Level::Warn, text);
}

/// Logs at error level: something failed.
pub fn error(text: &str) {
    host::log(Level::Error, text);
}
