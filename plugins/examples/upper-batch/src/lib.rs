//! Example batch handler: upper-cases every item of a batch.
//!
//! Implements the `batch-handler` world, so a stage with `batch: { max, wait }`
//! hands it many messages per call. Each item's payload is upper-cased (ASCII)
//! and emitted to the default output with the item's key and headers. An item
//! with an empty payload is rejected with the reason `empty payload` while the
//! other items of the same batch still succeed: a partial batch failure.
//!
//! Config keys: none.

use sluice_sdk::{Emit, HandlerError, Message, Outcome};

fn handle_batch(msgs: Vec<Message>) -> Vec<Outcome> {
    msgs.into_iter().map(upper).collect()
}

fn upper(msg: Message) -> Outcome {
    if msg.payload.is_empty() {
        return Err(HandlerError::reject("empty payload"));
    }
    Ok(vec![
        Emit::to_default(msg.payload.to_ascii_uppercase())
            .with_key(msg.key)
            .with_headers(msg.headers),
    ])
}

sluice_sdk::export_batch_handler!(handle_batch);
