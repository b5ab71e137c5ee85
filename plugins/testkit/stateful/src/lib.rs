//! Test plugin: a `sluice:plugin@0.2.0` handler that uses its stage's
//! state (`sluice:plugin/state`), so its stage must grant `state:`.
//!
//! Built directly with `wit-bindgen` against `wit/v0.2/plugin.wit`.
//!
//! Config: `sleep_ms`, a pause (busy, on the wasm clock) between reading
//! and returning, so concurrent calls overlap; `dry`, for the benchmark:
//! `inc` and `get-set` skip their state calls and emit the same shape;
//! `tally` (the soak): any message increments one of 16 counters
//! `tally/0` .. `tally/15` (by its id) and emits nothing.
//!
//! Per message, by payload (`K` is the message's key, `-` if none):
//! - `inc`: increments `count/K` and emits `K N`;
//! - `get K2`: emits `K2=VALUE` with the value of `count/K2`, or `K2=absent`;
//! - `cas-inc`: reads `shared`, then compare-and-sets it to one more on the
//!   revision it read; emits the new value;
//! - `retry`, `reject`, `trap`: writes `left/K`, then fails that way;
//! - `read-reject KEY...`: reads each KEY, then rejects;
//! - `lock HOLDER TTL_MS`: compare-and-sets `lock` to HOLDER, only if
//!   absent, expiring after TTL_MS; emits `got HOLDER` or `held`;
//! - `fill BYTES`: sets `fill/<message id>` to BYTES bytes; emits `filled`,
//!   or rejects with the store's error;
//! - `list PREFIX`: emits the keys under PREFIX, comma-separated;
//! - `get-set`: reads `value/K` and sets it to the message id; emits `K`;
//! - `tick N` (a timer, on a stage with `timers: true`): increments
//!   `ticks/K`; while N > 0, emits `tick N-1` with key K to its own input
//!   (config `self`), delayed by config `delay_ms` (default 200); at 0,
//!   emits `done K TICKS` to the default output;
//! - `tick-now`: emits `tick 0` to its own input without a delay, which
//!   the host refuses (`undeclared-topic`).

mod bindings {
    #![allow(missing_docs, unsafe_code, clippy::all)]
    wit_bindgen::generate!({
        world: "handler",
        path: "../../../wit/v0.2",
    });
}

use std::time::{Duration, Instant};

use bindings::exports::sluice::plugin::message_handler::Guest;
use bindings::sluice::plugin::host::config_get;
use bindings::sluice::plugin::state::{self, StateError};
use bindings::sluice::plugin::types::{Emit, HandlerError, Message, Outcome};

struct Stateful;

fn emit(payload: impl Into<Vec<u8>>) -> Outcome {
    Ok(vec![Emit {
        topic: String::new(),
        key: None,
        headers: Vec::new(),
        payload: payload.into(),
    }])
}

fn why(e: StateError) -> String {
    match e {
        StateError::NotGranted(w) => format!("not-granted: {w}"),
        StateError::StoreFull(w) => format!("store-full: {w}"),
        StateError::Invalid(w) => format!("invalid: {w}"),
        StateError::Unavailable(w) => format!("unavailable: {w}"),
    }
}

/// A state error the handler cannot work around: retried.
fn retry(e: StateError) -> HandlerError {
    bindings::sluice::plugin::host::log(bindings::sluice::plugin::host::Level::Warn, &why(e));
    HandlerError::Retry(None)
}

fn pause() {
    let ms: u64 = config_get("sleep_ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let until = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

impl Guest for Stateful {
    fn handle(msg: Message) -> Outcome {
        let key = msg.key.clone().unwrap_or_else(|| "-".into());
        if config_get("tally").is_some() {
            // Spread over 16 counters by the id, so concurrent calls
            // seldom touch the same one.
            let slot = msg.id.bytes().map(u32::from).sum::<u32>() % 16;
            state::increment(&format!("tally/{slot}"), 1).map_err(retry)?;
            return Ok(Vec::new());
        }
        let text = String::from_utf8_lossy(&msg.payload).into_owned();
        let mut words = text.split_whitespace();
        match words.next().unwrap_or_default() {
            "inc" if config_get("dry").is_some() => emit(format!("{key} 0")),
            "get-set" if config_get("dry").is_some() => emit(key),
            "get-set" => {
                let k = format!("value/{key}");
                state::get(&k).map_err(retry)?;
                state::set(&k, msg.id.as_bytes(), None).map_err(retry)?;
                emit(key)
            }
            "inc" if config_get("bench").is_some() => {
                let n = state::increment(&format!("count/{key}"), 1).map_err(retry)?;
                emit(format!("{key} {n}"))
            }
            "inc" => {
                let seen = format!("seen/{}", msg.id);
                if state::get(&seen).map_err(retry)?.is_some() {
                    bindings::sluice::plugin::host::log(
                        bindings::sluice::plugin::host::Level::Warn,
                        &format!("ALREADY COMMITTED {} attempt {}", msg.id, msg.attempt),
                    );
                }
                state::set(&seen, b"1", None).map_err(retry)?;
                let n = state::increment(&format!("count/{key}"), 1).map_err(retry)?;
                pause();
                emit(format!("{key} {n}"))
            }
            "get" => {
                let other = words.next().unwrap_or("-");
                match state::get(&format!("count/{other}")).map_err(retry)? {
                    Some(entry) => {
                        emit(format!("{other}={}", String::from_utf8_lossy(&entry.value)))
                    }
                    None => emit(format!("{other}=absent")),
                }
            }
            "cas-inc" => {
                let (n, revision) = match state::get("shared").map_err(retry)? {
                    Some(entry) => (
                        String::from_utf8_lossy(&entry.value)
                            .parse::<u64>()
                            .unwrap_or(0),
                        entry.revision,
                    ),
                    None => (0, 0),
                };
                pause();
                let next = (n + 1).to_string();
                if !state::compare_and_set("shared", revision, next.as_bytes(), None)
                    .map_err(retry)?
                {
                    return Err(HandlerError::Reject(
                        "compare-and-set refused within one call".into(),
                    ));
                }
                emit(next)
            }
            "read-reject" => {
                // Reads the keys named, then rejects: its dead letter
                // names them.
                for k in words {
                    state::get(k).map_err(retry)?;
                }
                Err(HandlerError::Reject("rejected after reading".into()))
            }
            "retry" | "reject" | "trap" => {
                state::set(&format!("left/{key}"), b"written", None).map_err(retry)?;
                match text.as_str() {
                    "retry" => Err(HandlerError::Retry(Some(10))),
                    "reject" => Err(HandlerError::Reject("rejected after a write".into())),
                    _ => panic!("trapped after a write"),
                }
            }
            "lock" => {
                let holder = words.next().unwrap_or("?");
                let ttl: u64 = words.next().and_then(|t| t.parse().ok()).unwrap_or(1000);
                if state::compare_and_set("lock", 0, holder.as_bytes(), Some(ttl)).map_err(retry)? {
                    emit(format!("got {holder}"))
                } else {
                    emit("held")
                }
            }
            "fill" => {
                let bytes: usize = words.next().and_then(|b| b.parse().ok()).unwrap_or(0);
                match state::set(&format!("fill/{}", msg.id), &vec![b'x'; bytes], None) {
                    Ok(()) => emit("filled"),
                    Err(e) => Err(HandlerError::Reject(why(e))),
                }
            }
            "list" => {
                let prefix = words.next().unwrap_or("");
                let keys = state::list(prefix, 1000).map_err(retry)?;
                emit(keys.join(","))
            }
            "tick" => {
                let left: u64 = words.next().and_then(|n| n.parse().ok()).unwrap_or(0);
                let ticks = state::increment(&format!("ticks/{key}"), 1).map_err(retry)?;
                if left == 0 {
                    return emit(format!("done {key} {ticks}"));
                }
                let delay = config_get("delay_ms").unwrap_or_else(|| "200".into());
                Ok(vec![Emit {
                    topic: config_get("self").unwrap_or_default(),
                    key: msg.key.clone(),
                    headers: vec![("sluice-delay".into(), format!("{delay}ms"))],
                    payload: format!("tick {}", left - 1).into_bytes(),
                }])
            }
            "tick-now" => Ok(vec![Emit {
                topic: config_get("self").unwrap_or_default(),
                key: msg.key.clone(),
                headers: Vec::new(),
                payload: b"tick 0".to_vec(),
            }]),
            other => Err(HandlerError::Reject(format!("unknown command `{other}`"))),
        }
    }
}

bindings::export!(Stateful with_types_in bindings);
