//! Test plugin: allocates memory until the host stops it.
//!
//! Keeps pushing 1 MiB chunks filled with non-zero bytes (so every page is
//! really touched) into a vector that is never freed, so tests can check that
//! the runtime's memory limit ends the call as `out-of-memory` rather than
//! exhausting the machine.
//!
//! Config keys: none.

use std::hint::black_box;

use sluice_sdk::{Message, Outcome};

const CHUNK: usize = 1 << 20;

fn handle(_msg: Message) -> Outcome {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(black_box(vec![0xA5; CHUNK]));
        black_box(&hoard);
    }
}

sluice_sdk::export_handler!(handle);
