//! Entry points for the fuzz targets in `fuzz/` (the `fuzz` feature).
//!
//! Each takes arbitrary bytes, as they would arrive from a file, a damaged
//! disk or a producer, and must return: a panic, a hang or an unbounded
//! allocation is a bug. They call the same parsers Sluice runs, minus the
//! file system and the network.

use std::path::Path;

/// A pipeline file through the loader: YAML to the validated model.
pub fn pipeline_file(bytes: &[u8]) {
    let _ = crate::config::load_bytes(Path::new("/fuzz/pipeline.yaml"), bytes);
}

/// A `cases.yaml` file through `sluice plugin test`'s reader.
pub fn cases_file(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        let _ = crate::cli::parse_cases(text, "cases.yaml");
    }
}

/// A batch body through ingest's NDJSON reader and message checks, for a
/// normal topic and for a dead-letter topic.
pub fn ingest_batch(bytes: &[u8]) {
    for is_dlq in [false, true] {
        if let Ok(messages) = crate::admin::batch_messages(bytes, is_dlq) {
            assert!(
                messages.iter().all(|m| !m.payload.is_empty()),
                "ingest accepted an empty payload"
            );
        }
    }
}

/// A journal file through the reader `sluice data check` and `salvage`
/// use.
pub fn journal(bytes: &[u8]) {
    crate::broker::embedded::journal::walk(bytes);
}

/// A stored value through every record decoder of the embedded store.
pub fn store_record(bytes: &[u8]) {
    crate::broker::embedded::decode_every_record(bytes);
}
