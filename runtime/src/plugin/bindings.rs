//! The one place the WIT contract becomes Rust.
//!
//! Two `bindgen!` invocations, one per world, share the `types` and `host`
//! interfaces so a [`Message`] or an [`Emit`] is one Rust type whichever world
//! a plugin implements. Nothing outside `plugin/` sees the generated modules.

#![allow(missing_docs, clippy::all)]

/// The `handler` world: one message per call.
pub(crate) mod single {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "sluice:plugin/handler@0.1.0",
        exports: { default: async },
    });
}

/// The `batch-handler` world: a list of messages per call.
pub(crate) mod batch {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "sluice:plugin/batch-handler@0.1.0",
        exports: { default: async },
        with: {
            "sluice:plugin/types@0.1.0": super::single::sluice::plugin::types,
            "sluice:plugin/host@0.1.0": super::single::sluice::plugin::host,
        },
    });
}

pub use single::sluice::plugin::host::Level;
pub use single::sluice::plugin::types::{Emit, HandlerError, Message};
