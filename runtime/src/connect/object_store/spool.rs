//! Where a file is built before it goes to the store: a spool file on
//! local disk, so that a 256 MB file costs its current Parquet row group
//! (or a compressor's window) in memory, not 256 MB.
//!
//! Each running sink owns an instance directory,
//! `<data dir>/spool/object_store/<pipeline>/<sink>/<uuid>/`, locked
//! (`flock`) for as long as the sink lives. A new directory per instance,
//! because a reload builds the new sink while the old one still drains:
//! the two must never share files. At start, every sibling directory whose
//! lock can be taken belongs to a sink that is gone (a crash, a reload
//! that finished): its spool files are removed, since their records were
//! never acked and will be redelivered, and its journal of multipart
//! uploads (`journal.rs`) is handed back, to be aborted.
//!
//! A write that fails on the spool (a full disk) is an outage: the
//! records wait, their attempts untouched.

use std::fs::{File, TryLockError};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The lock file of an instance directory.
const LOCK: &str = ".lock";

/// The spool file buffer: large writes go straight through.
const BUFFER: usize = 256 << 10;

/// A running sink's spool directory, locked while it lives.
#[derive(Debug)]
pub(super) struct Spool {
    dir: PathBuf,
    /// Held for the lock; released when the sink is dropped.
    _lock: File,
}

/// An instance directory left by a sink that is gone, locked by us until
/// its journaled uploads are aborted and it is removed.
#[derive(Debug)]
pub(super) struct Stale {
    pub dir: PathBuf,
    _lock: File,
}

impl Stale {
    /// Removes the directory (its journal done with).
    pub(super) fn remove(self) -> std::io::Result<()> {
        std::fs::remove_dir_all(&self.dir)
    }
}

impl Spool {
    /// A fresh instance directory under `root` (the sink's own spool
    /// directory), with the stale siblings found there: their spool files
    /// already removed, their journals left for the caller.
    ///
    /// # Errors
    ///
    /// `root` cannot be created or written.
    pub(super) fn open(root: &Path) -> std::io::Result<(Spool, Vec<Stale>)> {
        std::fs::create_dir_all(root)?;
        let mut stale = Vec::new();
        for entry in std::fs::read_dir(root)? {
            let path = entry?.path();
            if !path.is_dir() {
                continue;
            }
            let Some(lock) = try_lock(&path)? else {
                continue; // a live sink's (a reload's old one)
            };
            for file in std::fs::read_dir(&path)? {
                let file = file?.path();
                if file.extension().is_some_and(|e| e == "spool") {
                    std::fs::remove_file(&file)?;
                }
            }
            stale.push(Stale {
                dir: path,
                _lock: lock,
            });
        }
        let dir = root.join(uuid::Uuid::now_v7().to_string());
        std::fs::create_dir_all(&dir)?;
        let lock = try_lock(&dir)?
            .ok_or_else(|| std::io::Error::other(format!("{} is locked already", dir.display())))?;
        Ok((Spool { dir, _lock: lock }, stale))
    }

    /// The instance directory.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new, empty spool file.
    pub(super) fn create(&self) -> std::io::Result<SpoolFile> {
        let path = self.dir.join(format!("{}.spool", uuid::Uuid::now_v7()));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        Ok(SpoolFile {
            out: Some(BufWriter::with_capacity(BUFFER, file)),
            path,
            written: 0,
        })
    }
}

/// Locks `dir`'s lock file; `None` when another holds it.
fn try_lock(dir: &Path) -> std::io::Result<Option<File>> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(LOCK))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// A spool file being written; removed if it is dropped unfinished.
#[derive(Debug)]
pub(super) struct SpoolFile {
    out: Option<BufWriter<File>>,
    path: PathBuf,
    written: u64,
}

impl SpoolFile {
    /// The bytes written so far.
    pub(super) fn written(&self) -> u64 {
        self.written
    }

    /// The file, flushed and complete.
    pub(super) fn finish(mut self) -> std::io::Result<Spooled> {
        let out = self
            .out
            .take()
            .ok_or_else(|| std::io::Error::other("the spool file is gone"))?;
        let file = out
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)?;
        Ok(Spooled {
            file,
            path: std::mem::take(&mut self.path),
            size: self.written,
        })
    }
}

impl Write for SpoolFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| std::io::Error::other("the spool file is gone"))?;
        let n = out.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self.out.as_mut() {
            Some(out) => out.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for SpoolFile {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            drop(self.out.take());
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A finished spool file, ready to upload; removed when dropped (once
/// uploaded, or to be written again from redelivered records).
#[derive(Debug)]
pub(super) struct Spooled {
    pub file: File,
    pub path: PathBuf,
    pub size: u64,
}

impl Drop for Spooled {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_spool_clears_the_files_of_a_sink_that_is_gone_but_not_a_live_ones() {
        let root = tempfile::tempdir().expect("dir");
        let (live, none) = Spool::open(root.path()).expect("open");
        assert!(none.is_empty());
        let mut kept = live.create().expect("create");
        kept.write_all(b"live").expect("write");
        let (gone, _) = Spool::open(root.path()).expect("open");
        let mut left = gone.create().expect("create");
        left.write_all(b"gone").expect("write");
        let left = left.finish().expect("finish");
        let left_path = left.path.clone();
        std::mem::forget(left); // as a crash would leave it
        let gone_dir = gone.dir().to_owned();
        drop(gone);
        let (_third, stale) = Spool::open(root.path()).expect("open");
        let dirs: Vec<_> = stale.iter().map(|s| s.dir.clone()).collect();
        assert_eq!(dirs, [gone_dir], "only the unlocked one is stale");
        assert!(!left_path.exists(), "its spool file is removed");
        assert!(kept.path.exists(), "the live sink's file is left alone");
        let done = kept.finish().expect("finish");
        assert_eq!(done.size, 4);
        assert_eq!(std::fs::read(&done.path).expect("read"), b"live");
    }
}
