//! Example handler: enrich each message from an HTTP lookup, with a cache
//! in state.
//!
//! Each input is a JSON object with a `customer` field. The handler looks
//! the customer up (`GET {lookup_url}/customers/<customer>`), adds the
//! answer as the field `customer_info`, and emits the result. Answers are
//! cached in the stage's state for `cache_ttl_ms` (default 60,000), so a
//! busy customer costs one lookup a minute; the cache entries expire by
//! themselves.
//!
//! Config: `lookup_url` (required), whose host the stage's `http.allow`
//! lists; `cache_ttl_ms`.
//!
//! An unknown customer (`404`) rejects the message; other failures of the
//! lookup retry it.

use std::time::Duration;

use sluice_sdk::{Emit, HandlerError, Message, Outcome, http, state};

fn handle(msg: Message) -> Outcome {
    let mut doc: serde_json::Value = msg.json()?;
    let Some(customer) = doc
        .get("customer")
        .and_then(|c| c.as_str())
        .map(str::to_owned)
    else {
        return Err(HandlerError::reject(
            "the message has no string field `customer`",
        ));
    };
    let cache = format!("customer/{customer}");
    let info = match state::get_text(&cache)? {
        Some(cached) => cached,
        None => {
            let info = lookup(&customer)?;
            let ttl: u64 = sluice_sdk::config_parse("cache_ttl_ms")?.unwrap_or(60_000);
            state::set_with_ttl(&cache, &info, Duration::from_millis(ttl))?;
            info
        }
    };
    let info: serde_json::Value = serde_json::from_str(&info)
        .map_err(|e| HandlerError::reject(format_args!("the lookup's answer is not JSON: {e}")))?;
    doc["customer_info"] = info;
    Ok(vec![Emit::json("", &doc)?.with_key(msg.key)])
}

/// The lookup service's answer for `customer`, as text.
fn lookup(customer: &str) -> Result<String, HandlerError> {
    let Some(url) = sluice_sdk::config("lookup_url") else {
        return Err(HandlerError::reject("config `lookup_url` is not set"));
    };
    let answer = http::Request::get(&format!(
        "{}/customers/{customer}",
        url.trim_end_matches('/')
    ))
    .send()?;
    match answer.status {
        200..=299 => Ok(answer.text()),
        404 => Err(HandlerError::reject(format_args!(
            "unknown customer `{customer}`"
        ))),
        _ => Err(HandlerError::retry()),
    }
}

sluice_sdk::export_handler!(handle);
