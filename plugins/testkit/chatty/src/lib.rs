//! Test plugin: talks through every output channel, then optionally panics.
//!
//! Writes `lines` lines to stdout (`println!`), to stderr (`eprintln!`) and
//! through the host `log` import, each line `bytes` long, then passes the
//! message through to the default output, or panics with the message given
//! in `panic`. Tests use it to check that guest output reaches the host's
//! logs, that the per-call log budget caps it, and that a panic's message
//! ends up in the failure.
//!
//! Config keys:
//!
//! * `lines` (default `1`): lines per channel.
//! * `bytes` (default `40`): length of each line.
//! * `panic` (optional): panic with this message after writing.
//! * `panic_if_payload` (optional): with `panic`, panic only for messages
//!   whose payload is exactly this text (to poison one message of a batch).

use sluice_sdk::{Emit, Message, Outcome};

fn handle(msg: Message) -> Outcome {
    let lines: usize = sluice_sdk::config_parse("lines")?.unwrap_or(1);
    let bytes: usize = sluice_sdk::config_parse("bytes")?.unwrap_or(40);
    for i in 0..lines {
        let text = format!("line {i} ")
            .chars()
            .chain(std::iter::repeat('.'))
            .take(bytes)
            .collect::<String>();
        println!("stdout {text}");
        eprintln!("stderr {text}");
        sluice_sdk::log::info(&format!("log {text}"));
    }
    if let Some(message) = sluice_sdk::config("panic") {
        let only_for = sluice_sdk::config("panic_if_payload");
        if only_for.is_none_or(|poison| poison.as_bytes() == msg.payload.as_slice()) {
            panic!("{message}");
        }
    }
    Ok(vec![Emit::to_default(msg.payload).with_key(msg.key)])
}

sluice_sdk::export_handler!(handle);
