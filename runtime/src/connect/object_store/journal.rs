//! The multipart uploads a sink has begun and not yet finished, on disk
//! (`multipart.json` in its spool directory), so that an upload cut by a
//! crash is aborted at the next start instead of left orphaned: the store
//! keeps (and bills) the parts of an upload nobody completes.
//!
//! An entry is written, fsynced, once the store has given the upload id
//! and before any part is sent; it goes once the upload is completed or
//! aborted. The whole file is rewritten each time (a temporary file,
//! fsynced, renamed over it, the directory fsynced): there are a few
//! entries at most, one per file uploading.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// The journal's file name in a spool directory.
const FILE: &str = "multipart.json";

/// One multipart upload begun.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Entry {
    /// The store's URL (`s3://bucket/prefix`), as the block gives it.
    pub store: String,
    /// The object's path in the store.
    pub path: String,
    /// The store's upload id.
    pub id: String,
}

/// A spool directory's journal.
#[derive(Debug)]
pub(super) struct Journal {
    path: PathBuf,
    entries: Mutex<Vec<Entry>>,
}

impl Journal {
    /// The journal of the spool directory `dir`, with what it holds.
    ///
    /// # Errors
    ///
    /// It cannot be read, or does not parse (said with its path: the
    /// uploads it names would be orphaned if it were dropped).
    pub(super) fn open(dir: &Path) -> std::io::Result<Journal> {
        let path = dir.join(FILE);
        let entries = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        Ok(Journal {
            path,
            entries: Mutex::new(entries),
        })
    }

    /// What it holds.
    pub(super) fn entries(&self) -> Vec<Entry> {
        self.lock().clone()
    }

    /// Records an upload begun, durably.
    pub(super) fn add(&self, entry: Entry) -> std::io::Result<()> {
        let mut entries = self.lock();
        entries.push(entry);
        let written = self.write(&entries);
        if written.is_err() {
            entries.pop();
        }
        written
    }

    /// Forgets an upload completed or aborted, durably.
    pub(super) fn remove(&self, entry: &Entry) -> std::io::Result<()> {
        let mut entries = self.lock();
        if !entries.contains(entry) {
            return Ok(());
        }
        let left: Vec<Entry> = entries.iter().filter(|e| *e != entry).cloned().collect();
        self.write(&left)?;
        *entries = left;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self, entries: &[Entry]) -> std::io::Result<()> {
        use std::io::Write;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let staged = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(entries).map_err(std::io::Error::other)?;
        let mut file = std::fs::File::create(&staged)?;
        file.write_all(&bytes)?;
        file.sync_data()?;
        drop(file);
        std::fs::rename(&staged, &self.path)?;
        std::fs::File::open(dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_survive_a_reopen_until_removed() {
        let dir = tempfile::tempdir().expect("dir");
        let journal = Journal::open(dir.path()).expect("open");
        let entry = |id: &str| Entry {
            store: "s3://b/p".into(),
            path: "p/x.parquet".into(),
            id: id.into(),
        };
        journal.add(entry("1")).expect("add");
        journal.add(entry("2")).expect("add");
        journal.remove(&entry("1")).expect("remove");
        let again = Journal::open(dir.path()).expect("reopen");
        assert_eq!(again.entries(), [entry("2")]);
    }
}
