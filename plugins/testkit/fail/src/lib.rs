//! Test plugin: fails a chosen fraction of messages on purpose.
//!
//! Whether a message fails is decided from an FNV-1a hash of its id, so a
//! redelivery of the same message is chosen again: with `mode: retry` a chosen
//! message fails on every attempt until it is dead-lettered. Messages that are
//! not chosen pass through unchanged (payload, key and headers) to the default
//! output.
//!
//! Config keys:
//!
//! * `mode` (default `retry`): `retry` returns a transient error, `reject` a
//!   permanent one.
//! * `fraction` (default `1.0`): the share of messages that fail, from `0.0`
//!   (none) to `1.0` (all).
//! * `retry_after_ms` (optional): with `mode: retry`, asks for this delay in
//!   milliseconds instead of the stage's backoff.
//! * `reason` (default `injected failure`): with `mode: reject`, the reason.
//!
//! An invalid config value rejects the message with a reason naming the key.

use std::time::Duration;

use sluice_sdk::{Emit, HandlerError, Message, Outcome};

fn handle(msg: Message) -> Outcome {
    let fraction: f64 = sluice_sdk::config_parse("fraction")?.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&fraction) {
        return Err(HandlerError::reject(format_args!(
            "config `fraction` = {fraction} is outside 0..=1"
        )));
    }
    if unit_interval(mix(fnv1a(msg.id.as_bytes()))) >= fraction {
        return Ok(vec![
            Emit::to_default(msg.payload)
                .with_key(msg.key)
                .with_headers(msg.headers),
        ]);
    }
    match sluice_sdk::config_or("mode", "retry").as_str() {
        "retry" => match sluice_sdk::config_parse::<u64>("retry_after_ms")? {
            Some(ms) => Err(HandlerError::retry_after(Duration::from_millis(ms))),
            None => Err(HandlerError::retry()),
        },
        "reject" => Err(HandlerError::reject(sluice_sdk::config_or(
            "reason",
            "injected failure",
        ))),
        other => Err(HandlerError::reject(format_args!(
            "config `mode` = {other:?} is invalid: expected `retry` or `reject`"
        ))),
    }
}

/// 64-bit FNV-1a: tiny, dependency-free and stable across builds.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The murmur3 64-bit finalizer. FNV-1a's high bits barely change when ids
/// differ only in their last characters (`order-1`, `order-2`, ...), which
/// would skew the chosen fraction; this spreads every input bit over all 64.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Maps a hash onto `[0, 1)` using its top 53 bits (an `f64`'s precision).
fn unit_interval(hash: u64) -> f64 {
    (hash >> 11) as f64 / (1u64 << 53) as f64
}

sluice_sdk::export_handler!(handle);
