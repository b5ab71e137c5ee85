//! Postgres: a transactional-outbox source (rows read in `id` order with
//! `FOR UPDATE SKIP LOCKED`, published, then deleted in the same
//! transaction; `LISTEN/NOTIFY` wakes it) and a table sink (`INSERT ...
//! ON CONFLICT (id) DO NOTHING`, or the user's own statement).

mod config;

pub use config::{OutboxConfig, TableSinkConfig};
