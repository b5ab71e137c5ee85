//! Sluice: a stream processor whose handlers are sandboxed WebAssembly
//! components.
//!
//! - [`config`]: pipeline files: the YAML model, validation, JSON Schema.
//! - [`plugin`]: the wasmtime host that loads and runs handler plugins.
//! - [`failure`]: the fixed names of the ways an attempt can fail.
//! - [`cli`]: the `sluice` command line.

pub mod cli;
pub mod config;
pub mod failure;
pub mod plugin;

pub use failure::{Failure, FailureKind};
