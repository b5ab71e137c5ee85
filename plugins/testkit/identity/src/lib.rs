//! Test plugin: the identity handler.
//!
//! Emits each message's payload unchanged to the default output, keeping its
//! key and headers. Benchmarks use it to measure the runtime's own overhead,
//! so it does nothing else.
//!
//! Config keys: none.

use sluice_sdk::{Emit, Message, Outcome};

fn handle(msg: Message) -> Outcome {
    Ok(vec![
        Emit::to_default(msg.payload)
            .with_key(msg.key)
            .with_headers(msg.headers),
    ])
}

sluice_sdk::export_handler!(handle);
