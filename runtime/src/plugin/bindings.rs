//! The one place the WIT contract becomes Rust.
//!
//! Two `bindgen!` invocations per contract version, one per world, share
//! that version's `types` and `host` interfaces, so a [`Message`] or an
//! [`Emit`] is one Rust type whichever world a plugin implements. The 0.1.0
//! types are the host's own; 0.2.0's are the same records under another
//! package version, converted at the call (`v2`). Nothing outside `plugin/`
//! sees the generated modules.

#![allow(missing_docs, clippy::all)]

/// The `handler` world of 0.1.0: one message per call.
pub(crate) mod single {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "sluice:plugin/handler@0.1.0",
        exports: { default: async },
    });
}

/// The `batch-handler` world of 0.1.0: a list of messages per call.
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

/// Contract 0.2.0: 0.1.0 and the capabilities.
pub(crate) mod v2 {
    /// The `handler` world of 0.2.0.
    pub(crate) mod single {
        wasmtime::component::bindgen!({
            path: "../wit/v0.2",
            world: "sluice:plugin/handler@0.2.0",
            exports: { default: async },
            // A state read is a round trip to the server on NATS.
            imports: { "sluice:plugin/state": async },
        });
    }

    /// The `batch-handler` world of 0.2.0.
    pub(crate) mod batch {
        wasmtime::component::bindgen!({
            path: "../wit/v0.2",
            world: "sluice:plugin/batch-handler@0.2.0",
            exports: { default: async },
            with: {
                "sluice:plugin/types@0.2.0": super::single::sluice::plugin::types,
                "sluice:plugin/host@0.2.0": super::single::sluice::plugin::host,
                "sluice:plugin/secrets@0.2.0": super::single::sluice::plugin::secrets,
            },
        });
    }

    use super::single::sluice::plugin::types as v1;
    pub(crate) use single::sluice::plugin::host::Level;
    pub(crate) use single::sluice::plugin::secrets::SecretError;
    pub(crate) use single::sluice::plugin::state::{Entry as StateEntry, StateError};
    use single::sluice::plugin::types as v2;

    impl From<&v1::Message> for v2::Message {
        fn from(m: &v1::Message) -> Self {
            v2::Message {
                id: m.id.clone(),
                topic: m.topic.clone(),
                key: m.key.clone(),
                headers: m.headers.clone(),
                payload: m.payload.clone(),
                attempt: m.attempt,
                published_at: m.published_at,
            }
        }
    }

    impl From<v2::Emit> for v1::Emit {
        fn from(e: v2::Emit) -> Self {
            v1::Emit {
                topic: e.topic,
                key: e.key,
                headers: e.headers,
                payload: e.payload,
            }
        }
    }

    impl From<v2::HandlerError> for v1::HandlerError {
        fn from(e: v2::HandlerError) -> Self {
            match e {
                v2::HandlerError::Retry(after) => v1::HandlerError::Retry(after),
                v2::HandlerError::Reject(why) => v1::HandlerError::Reject(why),
            }
        }
    }

    impl From<Level> for super::Level {
        fn from(level: Level) -> Self {
            match level {
                Level::Trace => super::Level::Trace,
                Level::Debug => super::Level::Debug,
                Level::Info => super::Level::Info,
                Level::Warn => super::Level::Warn,
                Level::Error => super::Level::Error,
            }
        }
    }

    /// A 0.2.0 outcome as the host's own.
    pub(crate) fn outcome(
        o: Result<Vec<v2::Emit>, v2::HandlerError>,
    ) -> Result<Vec<v1::Emit>, v1::HandlerError> {
        o.map(|emits| emits.into_iter().map(Into::into).collect())
            .map_err(Into::into)
    }

    /// 0.1.0 messages as 0.2.0's.
    pub(crate) fn messages(msgs: &[v1::Message]) -> Vec<v2::Message> {
        msgs.iter().map(Into::into).collect()
    }
}

pub use single::sluice::plugin::host::Level;
pub use single::sluice::plugin::types::{Emit, HandlerError, Message};
