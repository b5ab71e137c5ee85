//! Test plugin: never returns.
//!
//! Loops forever on the CPU, so tests can check that the runtime's per-call
//! timeout (epoch interruption) stops it without stalling other stages.
//!
//! Config keys: none.

use std::hint::black_box;

use sluice_sdk::{Message, Outcome};

fn handle(msg: Message) -> Outcome {
    let mut counter = msg.payload.len() as u64;
    loop {
        // black_box keeps the optimiser from proving the loop has no effect.
        counter = black_box(counter.wrapping_add(1));
    }
}

sluice_sdk::export_handler!(handle);
