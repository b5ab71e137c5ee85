//! One claim store: where payloads are written and read back, over
//! `object_store` (S3, in-memory, and the local file system for reads,
//! listing and deletes), with our own durable put for `file://`.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use super::ClaimError;
use crate::config::{ClaimCheck, StoreUrl};

/// A claim store, opened. Objects are named `<topic>/<uuidv7>` below the
/// store's root (the directory, the bucket's prefix), and referenced as
/// `<store url>/<topic>/<uuidv7>`.
#[derive(Debug)]
pub struct ClaimStore {
    /// `file:///abs/dir`, `s3://bucket[/prefix]` or `memory://name`.
    url: String,
    /// The directory of a `file://` store (durable puts, the sweeper).
    root: Option<PathBuf>,
    /// The S3 key prefix, empty for the others.
    prefix: String,
    store: Arc<dyn ObjectStore>,
}

impl ClaimStore {
    /// Opens the store `claim` names: creates a `file://` directory, builds
    /// the S3 client (credentials from the standard `AWS_*` variables), or
    /// makes an empty in-memory store. Nothing is read or written on S3 yet.
    ///
    /// # Errors
    ///
    /// A bad URL, a directory that cannot be created, S3 options the client
    /// refuses.
    pub fn open(claim: &ClaimCheck) -> Result<ClaimStore, ClaimError> {
        let url = claim.store_url().map_err(ClaimError::Store)?;
        match &url {
            StoreUrl::File(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| {
                    ClaimError::Store(format!(
                        "cannot create the claim directory {}: {e}",
                        dir.display()
                    ))
                })?;
                let root = dir.canonicalize().map_err(|e| {
                    ClaimError::Store(format!("claim directory {}: {e}", dir.display()))
                })?;
                let store = LocalFileSystem::new_with_prefix(&root)
                    .map_err(|e| ClaimError::Store(e.to_string()))?;
                Ok(ClaimStore {
                    url: StoreUrl::File(root.clone()).to_string(),
                    root: Some(root),
                    prefix: String::new(),
                    store: Arc::new(store),
                })
            }
            StoreUrl::S3 { .. } | StoreUrl::Gcs { .. } | StoreUrl::Azure { .. } => {
                let location = crate::object_stores::Location {
                    url: &url,
                    region: claim.region.as_deref(),
                    endpoint: claim.endpoint.as_deref(),
                    allow_http: claim.allow_http,
                };
                let store = crate::object_stores::open_cloud(location)
                    .unwrap_or_else(|| Err(format!("{url} is not a cloud store")))
                    .map_err(ClaimError::Store)?;
                Ok(ClaimStore {
                    url: url.to_string(),
                    root: None,
                    prefix: url.prefix().to_owned(),
                    store,
                })
            }
            StoreUrl::Memory(_) => Ok(ClaimStore {
                url: url.to_string(),
                root: None,
                prefix: String::new(),
                store: Arc::new(object_store::memory::InMemory::new()),
            }),
        }
    }

    /// The store's URL, which every reference into it starts with.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The directory of a `file://` store.
    pub fn root(&self) -> Option<&FsPath> {
        self.root.as_deref()
    }

    /// The reference of object `key` (`<topic>/<id>`).
    pub fn reference(&self, key: &str) -> String {
        format!("{}/{key}", self.url)
    }

    /// The key of `reference`, if it points into this store.
    pub fn key_of<'a>(&self, reference: &'a str) -> Option<&'a str> {
        reference
            .strip_prefix(self.url.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
            .filter(|key| !key.is_empty())
    }

    fn path(&self, key: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.prefix))
        }
    }

    /// Writes `payload` as a new object under `topic` and returns its key,
    /// once the object is durable: on S3 when the PUT succeeded; for
    /// `file://`, once the file and its directory are fsynced.
    ///
    /// `file://` does not use `LocalFileSystem::put`: it renames a staged
    /// file into place but never fsyncs, so a power cut after the message
    /// was published could lose the object it references. Ours writes a
    /// temporary file, fsyncs it, renames it and fsyncs the directory (and
    /// the root when the topic's directory was created).
    ///
    /// # Errors
    ///
    /// The store failed; nothing is referenced.
    pub async fn put(&self, topic: &str, payload: Bytes) -> Result<String, ClaimError> {
        let key = format!("{topic}/{}", uuid::Uuid::now_v7());
        match &self.root {
            Some(root) => {
                let root = root.clone();
                let key = key.clone();
                tokio::task::spawn_blocking(move || durable_write(&root, &key, &payload))
                    .await
                    .map_err(|e| ClaimError::Store(format!("claim write task: {e}")))?
                    .map_err(|e| ClaimError::Store(format!("writing a claim object: {e}")))?;
            }
            None => {
                self.store
                    .put(&self.path(&key), PutPayload::from_bytes(payload))
                    .await
                    .map_err(|e| ClaimError::Store(format!("{}: {e}", self.url)))?;
            }
        }
        Ok(key)
    }

    /// Reads object `key`.
    ///
    /// # Errors
    ///
    /// [`ClaimError::Missing`] when there is no such object; otherwise the
    /// store failed.
    pub async fn get(&self, key: &str) -> Result<Bytes, ClaimError> {
        let missing = |e: object_store::Error| match e {
            object_store::Error::NotFound { .. } => {
                ClaimError::Missing(format!("no object {}", self.reference(key)))
            }
            e => ClaimError::Store(format!("reading {}: {e}", self.reference(key))),
        };
        let result = self.store.get(&self.path(key)).await.map_err(missing)?;
        result.bytes().await.map_err(missing)
    }

    /// Deletes object `key` (one that is not there is not an error).
    ///
    /// # Errors
    ///
    /// The store failed.
    pub async fn delete(&self, key: &str) -> Result<(), ClaimError> {
        match self.store.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(ClaimError::Store(format!(
                "deleting {}: {e}",
                self.reference(key)
            ))),
        }
    }

    /// The keys of objects last modified before `cutoff`.
    ///
    /// # Errors
    ///
    /// The store failed.
    pub async fn list_older_than(&self, cutoff: SystemTime) -> Result<Vec<String>, ClaimError> {
        let prefix = (!self.prefix.is_empty()).then(|| Path::from(self.prefix.as_str()));
        let mut listing = self.store.list(prefix.as_ref());
        let mut old = Vec::new();
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(|e| ClaimError::Store(format!("listing {}: {e}", self.url)))?;
            if SystemTime::from(meta.last_modified) >= cutoff {
                continue;
            }
            let full = meta.location.as_ref();
            let key = if self.prefix.is_empty() {
                full
            } else {
                full.strip_prefix(self.prefix.as_str())
                    .map_or(full, |k| k.trim_start_matches('/'))
            };
            old.push(key.to_owned());
        }
        Ok(old)
    }
}

/// How much is written before the kernel is asked to start putting it on
/// disk (see [`start_writeback`]).
const WRITE_CHUNK: usize = 1 << 20;

/// Writes `<root>/<key>` durably: temp file, fdatasync, rename, fsync of
/// the directory (and of `root` when the key's directory is new).
///
/// The file is written a chunk at a time, each chunk handed to the disk
/// as soon as it is in the page cache, so that by the time of the
/// fdatasync most of the payload is already on its way: the wait for the
/// disk overlaps the copying instead of following it (for 10 MB, about
/// 5 ms against 9 ms on this project's machines; BENCHMARKS.md).
fn durable_write(root: &FsPath, key: &str, payload: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let target = root.join(key);
    let dir = target.parent().unwrap_or(root);
    if !dir.is_dir() {
        std::fs::create_dir_all(dir)?;
        sync_dir(root)?;
    }
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staged = dir.join(format!(".{name}.tmp"));
    let result = (|| {
        let mut file = std::fs::File::create(&staged)?;
        let mut offset = 0;
        for chunk in payload.chunks(WRITE_CHUNK) {
            file.write_all(chunk)?;
            start_writeback(&file, offset, chunk.len());
            offset += chunk.len() as u64;
        }
        // fdatasync also writes the size, the metadata the data needs.
        file.sync_data()?;
        drop(file);
        std::fs::rename(&staged, &target)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&staged);
    }
    result
}

fn sync_dir(dir: &FsPath) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Asks the kernel to start writing `len` bytes of `file` at `offset` to
/// disk, without waiting for them. Only a head start: durability comes
/// from the fdatasync after, which also reports any write error, so this
/// one's result is not needed.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn start_writeback(file: &std::fs::File, offset: u64, len: usize) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: sync_file_range takes a file descriptor and plain integers
    // and touches no memory of ours; the descriptor stays open for the
    // call, borrowed from `file`.
    let _ = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
}

/// Elsewhere the fdatasync alone does the work.
#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &std::fs::File, _offset: u64, _len: usize) {}
