//! The object-store sink: messages into rolling JSON-lines or Parquet
//! files (or one object each) on S3, GCS, Azure or a directory, acked
//! once the file holding them is complete in the store.
//!
//! `encode.rs` turns messages into a file's bytes (and refuses those that
//! do not fit a Parquet schema), written through to a spool file on local
//! disk (`spool.rs`); `files.rs` keeps the open files and rolls them,
//! `upload.rs` writes a finished file with a create-only put, in parts
//! above a size (`multipart.rs`, each upload journaled by `journal.rs` so
//! a crash cannot orphan it), and `config.rs` builds the sink from its
//! block.

mod config;
pub(crate) mod encode;
mod files;
mod journal;
mod multipart;
pub mod sink;
mod spool;
pub(crate) mod upload;

pub use crate::config::connectors::object_store::ObjectStoreSinkConfig;
pub use sink::ObjectStoreSink;
