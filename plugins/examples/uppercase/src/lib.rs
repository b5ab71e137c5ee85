//! Example handler: upper-cases the payload.
//!
//! Each message's payload is upper-cased (ASCII letters only; other bytes,
//! including UTF-8 multi-byte sequences, are left as they are) and emitted to
//! the stage's default output with the input's key and headers.
//!
//! Config keys: none.

use sluice_sdk::{Emit, Message, Outcome};

fn handle(msg: Message) -> Outcome {
    let payload = msg.payload.to_ascii_uppercase();
    Ok(vec![
        Emit::to_default(payload)
            .with_key(msg.key)
            .with_headers(msg.headers),
    ])
}

sluice_sdk::export_handler!(handle);
