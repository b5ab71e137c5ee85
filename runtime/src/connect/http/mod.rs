//! An HTTP webhook sink: each message is a request to one URL, signed
//! with HMAC-SHA256 when a secret is given.

mod config;
pub mod sink;

pub use crate::config::connectors::http::HttpSinkConfig;
pub use sink::HttpSink;
