//! Test plugin: CPU-bound work with no host calls in the loop.
//!
//! Hashes the payload `rounds` times (FNV-1a over the bytes, then a
//! multiply-xorshift round) and emits the 8-byte result, little-endian, to the
//! default output. Every iteration is a loop back-edge where wasmtime's epoch
//! check sits, so comparing this plugin with epoch interruption on and off
//! measures exactly what those checks cost.
//!
//! Config keys:
//!
//! * `rounds` (default `10000`): how many times to hash the payload.

use sluice_sdk::{Emit, Message, Outcome};

fn handle(msg: Message) -> Outcome {
    let rounds: u64 = sluice_sdk::config_parse("rounds")?.unwrap_or(10_000);
    let mut state = 0xcbf2_9ce4_8422_2325_u64;
    for round in 0..rounds {
        for &byte in &msg.payload {
            state = (state ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        state ^= round;
        state = state.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        state ^= state >> 29;
    }
    Ok(vec![Emit::to_default(state.to_le_bytes().to_vec())])
}

sluice_sdk::export_handler!(handle);
