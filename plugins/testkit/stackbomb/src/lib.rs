//! Test plugin: overflows the stack.
//!
//! Recurses without bound. Each frame keeps a local buffer alive across the
//! recursive call (through `black_box`), so the recursion cannot be turned into
//! a loop. Tests use it to check that a stack overflow traps the call instead
//! of crashing the daemon.
//!
//! Config keys: none.

use std::hint::black_box;

use sluice_sdk::{Message, Outcome};

fn handle(msg: Message) -> Outcome {
    let depth = recurse(black_box(msg.payload.len() as u64));
    Ok(vec![sluice_sdk::Emit::to_default(depth.to_le_bytes())])
}

#[inline(never)]
#[allow(unconditional_recursion, reason = "overflowing the stack is the point")]
fn recurse(n: u64) -> u64 {
    let frame = black_box([n; 16]);
    let below = recurse(black_box(n.wrapping_add(1)));
    black_box(frame)[0].wrapping_add(below)
}

sluice_sdk::export_handler!(handle);
