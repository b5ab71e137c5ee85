//! Example handler: counts per key in tumbling windows, with state and a
//! delayed emit to the stage's own input as the window's timer (the stage
//! needs `state: true` and `timers: true`).
//!
//! An event (any message without the `window-timer` header) falls in the
//! window of its publish time: windows are `window_ms` long (default
//! 60,000), aligned to the epoch. The handler counts it under
//! `count/<key>/<window start>`; the window's first event also emits a
//! timer to the stage's own input, delivered when the window ends, with
//! the header `window-timer: <window start>`. When the timer comes back,
//! the handler reads the count, deletes it and emits
//! `{"key", "window_start", "window_end", "count"}` (times in milliseconds
//! since the epoch) to the stage's default output.
//!
//! Each count commits with its event's ack, so a window's count is exact
//! through retries and crashes. An event that arrives after its window's
//! timer fired starts the count again and emits a second result for that
//! window: a correction, for late data.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_sdk::{Emit, HandlerError, Message, Outcome, state};

/// The timer's header: the window start it closes.
const TIMER: &str = "window-timer";

fn handle(msg: Message) -> Outcome {
    let window: u64 = sluice_sdk::config_parse("window_ms")?.unwrap_or(60_000);
    if window == 0 {
        return Err(HandlerError::reject(
            "config `window_ms` must be more than 0",
        ));
    }
    let key = msg.key.clone().unwrap_or_else(|| "-".to_owned());
    if let Some(start) = msg.header(TIMER) {
        let start: u64 = start
            .parse()
            .map_err(|_| HandlerError::reject("a timer with a bad `window-timer` header"))?;
        let counter = format!("count/{key}/{start}");
        let count = state::get_text(&counter)?.unwrap_or_else(|| "0".to_owned());
        state::delete(&counter)?;
        let result = serde_json::json!({
            "key": key,
            "window_start": start,
            "window_end": start + window,
            "count": count.parse::<u64>().unwrap_or(0),
        });
        return Ok(vec![Emit::json("", &result)?.with_key(key)]);
    }
    let start = msg.published_at / window * window;
    let count = state::increment(&format!("count/{key}/{start}"), 1)?;
    if count > 1 {
        return Ok(Vec::new());
    }
    // The window's first event: its timer, due when the window ends.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let due_in = (start + window).saturating_sub(now).max(1);
    Ok(vec![
        Emit::new(msg.topic.clone(), Vec::new())
            .with_key(key)
            .with_header(TIMER, start.to_string())
            .with_delay(Duration::from_millis(due_in)),
    ])
}

sluice_sdk::export_handler!(handle);
