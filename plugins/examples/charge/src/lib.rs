//! Example handler: charge each order exactly once.
//!
//! Each input is a JSON order, `{"order": "o-17", "amount": 1250}`. The
//! handler POSTs it to the payment service (`{payments_url}/charges`) and
//! emits the service's receipt. Three things make the charge happen once:
//!
//! * the host adds `Idempotency-Key: <message id>:0` to the request, so
//!   when the daemon dies between the charge and the ack, the redelivered
//!   message repeats the same key and the service does not charge again;
//! * the receipt is kept in state (`charged/<order>`), committed with the
//!   output and the ack, so the same order sent twice (two messages) is
//!   charged once and its receipt emitted again;
//! * the service's token never reaches the handler: the stage's
//!   `http.headers` puts `Authorization: Bearer {secret:...}` in.
//!
//! Config: `payments_url` (required), the service's base URL, whose host
//! the stage's `http.allow` lists.
//!
//! A `4xx` other than `429` rejects the order (dead-lettered with the
//! service's answer); a `429`, a `5xx`, a timeout or a refused connection
//! retries it.

use sluice_sdk::{Emit, HandlerError, Message, Outcome, http, state};

fn handle(msg: Message) -> Outcome {
    let order: serde_json::Value = msg.json()?;
    let Some(id) = order.get("order").and_then(|o| o.as_str()) else {
        return Err(HandlerError::reject(
            "the order has no string field `order`",
        ));
    };
    let done = format!("charged/{id}");
    if let Some(receipt) = state::get_text(&done)? {
        sluice_sdk::log::info(&format!("order {id} was charged before; its receipt again"));
        return Ok(vec![Emit::to_default(receipt).with_key(id.to_owned())]);
    }
    let Some(url) = sluice_sdk::config("payments_url") else {
        return Err(HandlerError::reject("config `payments_url` is not set"));
    };
    let answer = http::Request::post(&format!("{}/charges", url.trim_end_matches('/')))
        .json(&order)?
        .send()?;
    match answer.status {
        200..=299 => {}
        429 | 500..=599 => return Err(HandlerError::retry()),
        status => {
            return Err(HandlerError::reject(format_args!(
                "the payment service refused order {id}: {status} {}",
                answer.text()
            )));
        }
    }
    let receipt = answer.text();
    state::set(&done, &receipt)?;
    Ok(vec![Emit::to_default(receipt).with_key(id.to_owned())])
}

sluice_sdk::export_handler!(handle);
