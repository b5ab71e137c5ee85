//! Skipped tests, counted where CI shows them.
//!
//! A test that cannot run here (a tmpfs mount needs root, say) returns
//! early; `cargo test` then hides whatever it printed and counts it as
//! passed. [`skip`] also appends a line to the file named by
//! [`SKIP_LOG_ENV`], which `cargo xtask test` sets and reads back after the
//! run, so the number of skipped tests, and why, is in CI's output.

use std::io::Write as _;

/// The environment variable naming the file skipped tests are recorded in.
pub const SKIP_LOG_ENV: &str = "SLUICE_SKIP_LOG";

/// Records that `test` was skipped because of `why`, on stderr and in the
/// skip log when one is set. The caller returns right after.
pub fn skip(test: &str, why: &str) {
    let line = format!("SKIPPED {test}: {why}");
    eprintln!("{line}");
    let Some(path) = std::env::var_os(SKIP_LOG_ENV) else {
        return;
    };
    // One `write` of a short line to a file opened for appending lands
    // whole even when several test processes write at once.
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
    if let Err(err) = appended {
        eprintln!("(could not record the skip in {}: {err})", path.display());
    }
}
