//! Example handler: upper-cases a text payload.
//!
//! Each message's payload must be UTF-8 text. It is upper-cased (ASCII
//! letters only; other characters are left as they are) and emitted to the
//! stage's default output with the input's key and headers.
//!
//! A payload that is not UTF-8 is rejected: it goes to the stage's
//! dead-letter topic at once, with the reason, instead of being retried.
//!
//! Config keys: none.

use sluice_sdk::{Emit, HandlerError, Message, Outcome};

fn handle(msg: Message) -> Outcome {
    if let Err(err) = std::str::from_utf8(&msg.payload) {
        return Err(HandlerError::reject(format_args!(
            "payload is not UTF-8 text ({err})"
        )));
    }
    let payload = msg.payload.to_ascii_uppercase();
    Ok(vec![
        Emit::to_default(payload)
            .with_key(msg.key)
            .with_headers(msg.headers),
    ])
}

sluice_sdk::export_handler!(handle);
