//! Test plugin: reports what it received, so tests can check that a large
//! (claim-checked) payload reached the handler intact without echoing all
//! of it.
//!
//! For each message it emits, to the default output:
//!
//! 1. the text `<sha256 hex> <length>` of the payload, with header
//!    `x-part: digest` and the input's key;
//! 2. when config `echo_bytes` is more than 0, the payload's first
//!    `echo_bytes` bytes (all of it if shorter), with header `x-part: echo`,
//!    so an output above the claim threshold is offloaded too.
//!
//! It also sends the input's header names to the log, one line, so a test
//! can check that the runtime's `sluice-claim` headers were not passed on.
//!
//! Config keys:
//!
//! * `echo_bytes` (default 0): how much of the payload to echo back.

use sha2::{Digest, Sha256};
use sluice_sdk::{Emit, Message, Outcome};

fn handle(msg: Message) -> Outcome {
    let echo: usize = sluice_sdk::config_parse("echo_bytes")?.unwrap_or(0);
    let digest = Sha256::digest(&msg.payload);
    let mut hex = String::with_capacity(64);
    for byte in digest {
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte & 15)]));
    }
    let names: Vec<&str> = msg.headers.iter().map(|(n, _)| n.as_str()).collect();
    let mut out = vec![
        Emit::to_default(format!("{hex} {}", msg.payload.len()).into_bytes())
            .with_key(msg.key.clone())
            .with_headers(vec![
                ("x-part".to_owned(), "digest".to_owned()),
                ("x-input-headers".to_owned(), names.join(",")),
            ]),
    ];
    if echo > 0 {
        let mut payload = msg.payload;
        payload.truncate(echo);
        out.push(
            Emit::to_default(payload)
                .with_key(msg.key)
                .with_headers(vec![("x-part".to_owned(), "echo".to_owned())]),
        );
    }
    Ok(out)
}

sluice_sdk::export_handler!(handle);
