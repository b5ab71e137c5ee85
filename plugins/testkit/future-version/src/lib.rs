//! Test plugin: a handler for a contract version the runtime does not know.
//!
//! Built directly with `wit-bindgen` against `wit/plugin.wit` in this crate, a
//! copy of the Sluice contract re-versioned as `sluice:plugin@0.9.0` with an
//! extra `trace-id` field in `message`. It exports
//! `sluice:plugin/message-handler@0.9.0`, so a runtime implementing 0.1.0 must
//! refuse to load it as an incompatible contract version (and must not be
//! fooled into calling it with the 0.1.0 ABI).
//!
//! If it were ever run, it would pass each message through unchanged.
//!
//! Config keys: none.

mod bindings {
    #![allow(missing_docs, unsafe_code, clippy::all)]
    wit_bindgen::generate!({
        world: "handler",
        path: "wit",
    });
}

use bindings::exports::sluice::plugin::message_handler::Guest;
use bindings::sluice::plugin::types::{Emit, Message, Outcome};

struct FutureHandler;

impl Guest for FutureHandler {
    fn handle(msg: Message) -> Outcome {
        Ok(vec![Emit {
            topic: String::new(),
            key: msg.key,
            headers: msg.headers,
            payload: msg.payload,
        }])
    }
}

bindings::export!(FutureHandler with_types_in bindings);
