//! Test plugin: a batch handler that returns one outcome fewer than it was
//! given messages, breaking the contract's one-outcome-per-message rule. The
//! host must fail the whole batch (kind `trap`) rather than guess which
//! message an outcome belongs to. No config keys.

use sluice_sdk::{Emit, Message, Outcome};

fn handle_batch(msgs: Vec<Message>) -> Vec<Outcome> {
    msgs.into_iter()
        .skip(1)
        .map(|m| Ok(vec![Emit::to_default(m.payload)]))
        .collect()
}

sluice_sdk::export_batch_handler!(handle_batch);
