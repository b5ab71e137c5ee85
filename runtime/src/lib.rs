//! Sluice: a stream processor whose handlers are sandboxed WebAssembly
//! components.
//!
//! - [`config`]: pipeline files: the YAML model, validation, JSON Schema.
//! - [`plugin`]: the wasmtime host that loads and runs handler plugins.
//! - [`failure`]: the fixed names of the ways an attempt can fail.
//! - [`broker`]: the queue seam and the embedded durable broker.
//! - [`claim`]: the claim check: large payloads in an object store.
//! - [`dedup`]: handler-level idempotency records (IN_PROGRESS, COMPLETED).
//! - [`state`]: handler state (contract 0.2.0), committed with the ack.
//! - [`dlq`]: dead-letter provenance and redrive.
//! - [`engine`]: the stage runner: fetch, valve, lanes, invoke, settle.
//! - [`metrics`]: the Prometheus metrics.
//! - [`admin`]: the daemon's admin HTTP API (ingest, reads, status, DLQ, metrics).
//! - [`daemon`]: `sluice run`: load, open, start, drain.
//! - [`cli`]: the `sluice` command line.
//! - [`timestamp`]: RFC 3339 times and durations back from now, as text.
//! - [`trace`]: W3C Trace Context: the `traceparent` a message carries on.
//! - [`retry_after`]: the wait an HTTP `Retry-After` asks for.
//! - [`tls`]: TLS for every client: connectors and a handler's outbound HTTP.

pub mod admin;
pub mod broker;
pub mod claim;
pub mod cli;
pub mod config;
pub mod connect;
pub mod daemon;
pub mod dedup;
pub mod delay;
pub mod dlq;
pub mod engine;
pub mod failure;
#[cfg(feature = "fuzz")]
#[doc(hidden)]
pub mod fuzz;
pub mod metrics;
pub mod object_stores;
pub mod otel;
pub mod plugin;
pub mod reload;
pub mod retry_after;
pub mod service;
pub mod state;
pub mod timestamp;
pub mod tls;
pub mod trace;

pub use failure::{Failure, FailureKind};
