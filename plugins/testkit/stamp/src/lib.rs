//! Test plugin: passes each message through to the default output with its
//! payload, key and headers, adding headers that let end-to-end tests check
//! what the engine did:
//!
//! * `x-input-id`: the input message's id;
//! * `x-attempt`: the attempt number the handler saw;
//! * `x-start-us` / `x-end-us`: wall-clock microseconds since the Unix epoch
//!   when handling began and ended (for ordering and overlap checks).
//!
//! Config keys:
//!
//! * `sleep_ms` (default 0): busy-work this long per message;
//! * `fail_prefix` (default `FAIL`) and `fail_until_attempt` (default 0):
//!   a message whose payload starts with the prefix asks for a retry until
//!   its attempt reaches `fail_until_attempt` (0: never fails);
//! * `retry_after_ms`: the delay such a retry asks for (default: the
//!   stage's backoff);
//! * `heal_on_redrive` (default false): a redriven message (one with a
//!   `sluice-redrives` header) never fails, as if the bug had been fixed.
//! * `extra_header` and `extra_value` (default: none): one more header on
//!   every output, taken as it is, so a test can emit a header no broker
//!   can carry (a value with a line break, a name with a space).
//! * `delay_ms` (default: none): emit the output with this delay (the SDK's
//!   `with_delay`: a `sluice-delay: <N>ms` header that replaces any delay
//!   header the output carries, `extra_header`'s included), so a test can see
//!   the broker hold it. `0` still sets the header, which means now. For an
//!   absolute time, set `extra_header` to `sluice-deliver-at` instead.

use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_sdk::{Emit, HandlerError, Message, Outcome};

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn handle(msg: Message) -> Outcome {
    let start = now_us();
    let sleep_ms: u64 = sluice_sdk::config_parse("sleep_ms")?.unwrap_or(0);
    let fail_until: u32 = sluice_sdk::config_parse("fail_until_attempt")?.unwrap_or(0);
    let prefix = sluice_sdk::config_or("fail_prefix", "FAIL");
    let deadline = Instant::now() + Duration::from_millis(sleep_ms);
    let mut work = 0u64;
    while Instant::now() < deadline {
        work = black_box(work.wrapping_add(1));
    }
    let healed = sluice_sdk::config_parse::<bool>("heal_on_redrive")?.unwrap_or(false)
        && msg
            .headers
            .iter()
            .any(|(name, _)| name == "sluice-redrives");
    if msg.payload.starts_with(prefix.as_bytes()) && msg.attempt < fail_until && !healed {
        return match sluice_sdk::config_parse::<u64>("retry_after_ms")? {
            Some(ms) => Err(HandlerError::retry_after(Duration::from_millis(ms))),
            None => Err(HandlerError::retry()),
        };
    }
    let mut headers = msg.headers;
    headers.push(("x-input-id".into(), msg.id));
    headers.push(("x-attempt".into(), msg.attempt.to_string()));
    headers.push(("x-start-us".into(), start.to_string()));
    headers.push(("x-end-us".into(), now_us().to_string()));
    if let Some(name) = sluice_sdk::config("extra_header") {
        headers.push((name, sluice_sdk::config_or("extra_value", "")));
    }
    let emit = Emit::to_default(msg.payload)
        .with_key(msg.key)
        .with_headers(headers);
    Ok(vec![match sluice_sdk::config_parse::<u64>("delay_ms")? {
        Some(ms) => emit.with_delay(Duration::from_millis(ms)),
        None => emit,
    }])
}

sluice_sdk::export_handler!(handle);
