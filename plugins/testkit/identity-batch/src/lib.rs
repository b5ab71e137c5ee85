//! Test plugin: the identity batch handler.
//!
//! Implements the `batch-handler` world: every item of the batch is emitted
//! unchanged to the default output, keeping its key and headers, so tests and
//! benchmarks can exercise the batch path alone.
//!
//! Config keys: none.

use sluice_sdk::{Emit, Message, Outcome};

fn handle_batch(msgs: Vec<Message>) -> Vec<Outcome> {
    msgs.into_iter()
        .map(|msg| {
            Ok(vec![
                Emit::to_default(msg.payload)
                    .with_key(msg.key)
                    .with_headers(msg.headers),
            ])
        })
        .collect()
}

sluice_sdk::export_batch_handler!(handle_batch);
