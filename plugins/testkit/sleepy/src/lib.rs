//! Test plugin: a slow handler.
//!
//! Busy-works on the CPU (checking a monotonic clock) for a configured time,
//! then passes the message through unchanged (payload, key, headers) to the
//! default output. It spins rather than sleeps so that it behaves like a slow,
//! CPU-bound handler: it holds its worker the whole time and is stopped by the
//! per-call timeout like any other guest code. Tests use it for timeouts,
//! concurrency valves, heartbeats and backpressure.
//!
//! Config keys:
//!
//! * `ms` (default `100`): how long to work, in milliseconds.

use std::hint::black_box;
use std::time::{Duration, Instant};

use sluice_sdk::{Emit, Message, Outcome};

fn handle(msg: Message) -> Outcome {
    let ms: u64 = sluice_sdk::config_parse("ms")?.unwrap_or(100);
    let deadline = Instant::now() + Duration::from_millis(ms);
    let mut work = 0u64;
    while Instant::now() < deadline {
        work = black_box(work.wrapping_add(1));
    }
    Ok(vec![
        Emit::to_default(msg.payload)
            .with_key(msg.key)
            .with_headers(msg.headers),
    ])
}

sluice_sdk::export_handler!(handle);
