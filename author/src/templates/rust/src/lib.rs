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

// What a stage can grant a handler, each only when its YAML says so (see
// the SDK's docs, `cargo doc --open -p sluice-sdk`):
//
// - `state: true`: a key-value store whose writes commit with the message's
//   outputs and ack, so a counter counts each message exactly once:
//       let n = sluice_sdk::state::increment("seen", 1)?;
// - `http: {allow: [api.example.com]}`: outbound requests to listed hosts,
//   each with an `Idempotency-Key` that a redelivery repeats:
//       let answer = sluice_sdk::http::Request::get("https://api.example.com/v1/x").send()?;
// - `secrets: [api_key]`: a secret of the pipeline's `secrets:` block:
//       let key = sluice_sdk::secrets::get("api_key")?;
//
// A handler that calls none of them needs none of them granted.

sluice_sdk::export_handler!(handle);
