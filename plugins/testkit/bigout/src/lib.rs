//! Test plugin: produces too much output.
//!
//! Tests use it to check the runtime's caps on output bytes and emit count
//! (`output-too-large`) and the claim check for large payloads.
//!
//! Config keys:
//!
//! * `mode` (default `bytes`): `bytes` emits one message of `bytes` bytes;
//!   `count` emits `count` messages of one byte each. All go to the default
//!   output.
//! * `bytes` (default `67108864`, 64 MiB): the payload size in `bytes` mode.
//! * `count` (default `100000`): the number of emits in `count` mode.

use sluice_sdk::{Emit, HandlerError, Message, Outcome};

fn handle(_msg: Message) -> Outcome {
    match sluice_sdk::config_or("mode", "bytes").as_str() {
        "bytes" => {
            let bytes: usize = sluice_sdk::config_parse("bytes")?.unwrap_or(64 << 20);
            Ok(vec![Emit::to_default(vec![b'x'; bytes])])
        }
        "count" => {
            let count: usize = sluice_sdk::config_parse("count")?.unwrap_or(100_000);
            Ok((0..count)
                .map(|_| Emit::to_default(b"x".to_vec()))
                .collect())
        }
        other => Err(HandlerError::reject(format_args!(
            "config `mode` = {other:?} is invalid: expected `bytes` or `count`"
        ))),
    }
}

sluice_sdk::export_handler!(handle);
