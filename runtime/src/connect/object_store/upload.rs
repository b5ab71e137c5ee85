//! Where finished files go, and how: a create-only put, so that a write
//! again after a crash can never replace a complete object.
//!
//! - A cloud store gets `PutMode::Create` (S3's `If-None-Match: *`), or a
//!   multipart upload above [`MULTIPART_ABOVE`]. A multipart upload cannot
//!   be create-only, but each file's name carries a fresh UUIDv7, so no
//!   two uploads share a name; a failed one is aborted.
//! - A directory gets a staged file, fdatasynced, then hard-linked into
//!   place (which fails if the name is taken) and its directory fsynced:
//!   a complete object or none, even across a power cut.
//!
//! The sink's files come spooled on local disk ([`Target::put_file`]): a
//! directory hard-links the spool file into place (no copy, when the two
//! share a filesystem), and a cloud store above [`MULTIPART_ABOVE`] gets
//! it in parts read from the spool (`multipart.rs`, journaled), so a file
//! is never whole in memory. [`Target::put`] takes bytes in memory (one
//! raw message, an archive), as before.
//!
//! Every failure is an outage ([`SinkError::Unavailable`]): the records
//! wait, their attempts untouched, and are written again into a new file.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};

use super::config::ObjectStoreSinkConfig;
use super::multipart::Multipart;
use super::spool::Spooled;
use crate::config::StoreUrl;
use crate::connect::SinkError;

/// Files larger than this are uploaded in parts.
pub(super) const MULTIPART_ABOVE: usize = 16 << 20;

/// The size of each part of a multipart upload.
const PART_SIZE: usize = super::multipart::PART_SIZE;

/// How a put went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Put {
    /// The object is new.
    Created,
    /// An object of that name was there already (a raw message written
    /// before a crash): left as it is.
    AlreadyThere,
}

/// A store files are written to.
pub(crate) enum Target {
    /// A directory on this machine.
    Dir(PathBuf),
    /// A cloud store, its key prefix, and its URL for messages.
    Cloud {
        store: Arc<dyn ObjectStore>,
        prefix: String,
        url: String,
    },
}

impl Target {
    /// The target of `config`: the directory created, the cloud client
    /// built (nothing contacted).
    pub(crate) fn open(config: &ObjectStoreSinkConfig) -> Result<Self, String> {
        let url = config.store_url()?;
        if let StoreUrl::File(dir) = &url {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            return Ok(Target::Dir(dir.clone()));
        }
        let location = crate::object_stores::Location {
            url: &url,
            region: config.region.as_deref(),
            endpoint: config.endpoint.as_deref(),
            allow_http: config.allow_http,
        };
        let store = crate::object_stores::open_cloud(location)
            .unwrap_or_else(|| Err(format!("{url} is not a store a sink can write")))?;
        Ok(Target::Cloud {
            store,
            prefix: url.prefix().to_owned(),
            url: url.to_string(),
        })
    }

    /// The full URL of object `key`, for logs and dead letters.
    pub(crate) fn url_of(&self, key: &str) -> String {
        match self {
            Target::Dir(dir) => format!("file://{}", dir.join(key).display()),
            Target::Cloud { url, .. } => format!("{url}/{key}"),
        }
    }

    /// Writes `bytes` as object `key` (below the store's prefix), only if
    /// no object has that name.
    pub(crate) async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<Put, SinkError> {
        match self {
            Target::Dir(dir) => {
                let (dir, owned) = (dir.clone(), key.to_owned());
                tokio::task::spawn_blocking(move || durable_create(&dir, &owned, &bytes))
                    .await
                    .map_err(|e| SinkError::Unavailable(format!("the write task failed: {e}")))?
                    .map_err(|e| SinkError::Unavailable(format!("{}: {e}", self.url_of(key))))
            }
            Target::Cloud { store, .. } => {
                let path = self.path_of(key);
                let failed = |e: object_store::Error| {
                    SinkError::Unavailable(format!("{}: {e}", self.url_of(key)))
                };
                if bytes.len() > MULTIPART_ABOVE {
                    let upload = store.put_multipart(&path).await.map_err(failed)?;
                    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
                    for chunk in bytes.chunks(PART_SIZE) {
                        writer.wait_for_capacity(4).await.map_err(failed)?;
                        writer.write(chunk);
                    }
                    // `finish` aborts the upload itself when it fails.
                    writer.finish().await.map_err(failed)?;
                    return Ok(Put::Created);
                }
                let options = PutOptions {
                    mode: PutMode::Create,
                    ..PutOptions::default()
                };
                match store
                    .put_opts(&path, PutPayload::from(bytes), options)
                    .await
                {
                    Ok(_) => Ok(Put::Created),
                    Err(object_store::Error::AlreadyExists { .. }) => Ok(Put::AlreadyThere),
                    Err(e) => Err(failed(e)),
                }
            }
        }
    }

    /// The store path of object `key` (below the store's prefix).
    fn path_of(&self, key: &str) -> Path {
        match self {
            Target::Cloud { prefix, .. } if !prefix.is_empty() => {
                Path::from(format!("{prefix}/{key}"))
            }
            _ => Path::from(key),
        }
    }

    /// Writes the spooled `file` as object `key`, only if no object has
    /// that name: hard-linked into a directory, put whole to a cloud store
    /// up to [`MULTIPART_ABOVE`] and in parts through `multipart` above.
    pub(super) async fn put_file(
        &self,
        key: &str,
        file: Spooled,
        multipart: Option<&Multipart>,
    ) -> Result<Put, SinkError> {
        match (self, multipart) {
            (Target::Dir(dir), _) => {
                let (dir, owned) = (dir.clone(), key.to_owned());
                tokio::task::spawn_blocking(move || durable_link(&dir, &owned, &file))
                    .await
                    .map_err(|e| SinkError::Unavailable(format!("the write task failed: {e}")))?
                    .map_err(|e| SinkError::Unavailable(format!("{}: {e}", self.url_of(key))))
            }
            (Target::Cloud { .. }, Some(multipart)) if file.size > MULTIPART_ABOVE as u64 => {
                let path = self.path_of(key);
                multipart
                    .upload(&path, &file, &self.url_of(key))
                    .await
                    .map(|()| Put::Created)
            }
            (Target::Cloud { .. }, _) => {
                let bytes = tokio::fs::read(&file.path)
                    .await
                    .map_err(|e| SinkError::Unavailable(format!("reading the spool file: {e}")))?;
                drop(file);
                self.put(key, bytes).await
            }
        }
    }
}

/// The parent directory of `<dir>/<key>`, created (and its new entries
/// fsynced, up to the store's root) if it is not there, and the target.
fn prepare(dir: &FsPath, key: &str) -> std::io::Result<(PathBuf, PathBuf)> {
    let target = dir.join(key);
    let parent = target.parent().unwrap_or(dir).to_owned();
    if !parent.is_dir() {
        std::fs::create_dir_all(&parent)?;
        // The new directories' entries, up to the store's root.
        let mut at = parent.as_path();
        while at.starts_with(dir) {
            sync_dir(at)?;
            match at.parent() {
                Some(up) if at != dir => at = up,
                _ => break,
            }
        }
    }
    Ok((parent, target))
}

/// Writes `<dir>/<key>` only if it is not there: a staged file,
/// fdatasynced, hard-linked into place (refused if the name is taken),
/// the stage removed and the directory fsynced.
fn durable_create(dir: &FsPath, key: &str, bytes: &[u8]) -> std::io::Result<Put> {
    let (parent, target) = prepare(dir, key)?;
    staged_create(&parent, &target, |file| {
        use std::io::Write;
        file.write_all(bytes)
    })
}

/// As [`durable_create`], from a spool file: fdatasynced and hard-linked
/// into place itself, or copied to a staged file when the spool is on
/// another filesystem than the directory.
fn durable_link(dir: &FsPath, key: &str, spooled: &Spooled) -> std::io::Result<Put> {
    let (parent, target) = prepare(dir, key)?;
    spooled.file.sync_data()?;
    match link_into_place(&spooled.path, &target, &parent) {
        Err(e) if e.kind() == std::io::ErrorKind::CrossesDevices => {
            staged_create(&parent, &target, |file| {
                let mut from = std::fs::File::open(&spooled.path)?;
                std::io::copy(&mut from, file).map(|_| ())
            })
        }
        done => done,
    }
}

/// A staged file beside `target`, filled by `fill`, fdatasynced, then
/// linked into place; the stage is removed either way.
fn staged_create(
    parent: &FsPath,
    target: &FsPath,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<Put> {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staged = parent.join(format!(".{name}.{}.tmp", uuid::Uuid::now_v7()));
    let result = (|| {
        let mut file = std::fs::File::create(&staged)?;
        fill(&mut file)?;
        file.sync_data()?;
        drop(file);
        link_into_place(&staged, target, parent)
    })();
    let _ = std::fs::remove_file(&staged);
    result
}

/// Hard-links `from` as `target` (refused if the name is taken) and
/// fsyncs the directory.
fn link_into_place(from: &FsPath, target: &FsPath, parent: &FsPath) -> std::io::Result<Put> {
    let put = match std::fs::hard_link(from, target) {
        Ok(()) => Put::Created,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Put::AlreadyThere,
        Err(e) => return Err(e),
    };
    sync_dir(parent)?;
    Ok(put)
}

fn sync_dir(dir: &FsPath) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_created_once_and_never_replaced() {
        let dir = tempfile::tempdir().expect("dir");
        let put = durable_create(dir.path(), "a/b/c.jsonl", b"one").expect("create");
        assert_eq!(put, Put::Created);
        let put = durable_create(dir.path(), "a/b/c.jsonl", b"two").expect("again");
        assert_eq!(put, Put::AlreadyThere);
        let read = std::fs::read(dir.path().join("a/b/c.jsonl")).expect("read");
        assert_eq!(read, b"one");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("a/b"))
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left.len(), 1, "no staged file is left: {left:?}");
    }
}
