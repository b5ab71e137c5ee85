//! The object-store sink: messages into rolling JSON-lines or Parquet
//! files (or one object each) on S3, GCS, Azure or a directory, acked
//! once the file holding them is complete in the store.
//!
//! `encode.rs` turns messages into a file's bytes (and refuses those that
//! do not fit a Parquet schema), `files.rs` keeps the open files and rolls
//! them, `upload.rs` writes a finished file with a create-only put, and
//! `config.rs` builds the sink from its block.

mod config;
pub(crate) mod encode;
mod files;
pub mod sink;
pub(crate) mod upload;

pub use crate::config::connectors::object_store::ObjectStoreSinkConfig;
pub use sink::ObjectStoreSink;
