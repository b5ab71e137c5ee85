//! {{name}}: a Sluice handler. It upper-cases text, rejects what it can never
//! handle and asks for a retry of what it cannot handle yet. Replace it with
//! yours; `cases.yaml` says what it should do.

use sluice_sdk::{Emit, HandlerError, Message, Outcome};

fn handle(msg: Message) -> Outcome {
    // Rejects a payload that is not UTF-8: dead-lettered now, as `rejected`.
    let text = msg.text()?;
    if text.trim().is_empty() {
        return Err(HandlerError::reject("empty payload"));
    }
    if text.starts_with("later") {
        // Transient: delivered again after the stage's backoff, and
        // dead-lettered as `retry` once `max_attempts` is spent.
        return Err(HandlerError::retry());
    }
    // One output to the stage's default output (its first `publish:` topic),
    // with the input's key and headers.
    Ok(vec![
        Emit::to_default(text.to_uppercase())
            .with_key(msg.key.clone())
            .with_headers(msg.headers.clone()),
    ])
}

sluice_sdk::export_handler!(handle);
