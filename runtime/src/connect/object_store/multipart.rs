//! Multipart uploads of spooled files, journaled so none is orphaned.
//!
//! `put_multipart` (`WriteMultipart`) hides the upload id, so a crash mid
//! upload would leave its parts in the store for good; this uses the
//! store's `MultipartStore` side instead (`create_multipart`, `put_part`,
//! `complete_multipart`, `abort_multipart`) and writes each id to the
//! spool directory's journal (`journal.rs`) before the first part.
//!
//! `crate::object_stores::open_cloud` hands back a `dyn ObjectStore`,
//! which cannot be asked for its multipart side, so [`open`] builds the
//! same client again, typed, from the same fields.
//!
//! A part is read from the spool file when there is room for it: at most
//! [`IN_FLIGHT`] parts of [`PART_SIZE`] are in memory at a time.
//!
//! What is left: a crash in the moment between the store answering
//! `create_multipart` and the journal's fsync leaves an upload no journal
//! names. A bucket lifecycle rule that aborts incomplete uploads after a
//! day is the backstop; the docs say so.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesOrdered;
use object_store::gcp::GoogleConfigKey;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{ClientConfigKey, MultipartId, PutPayload};
use tokio::io::AsyncReadExt as _;

use super::config::ObjectStoreSinkConfig;
use super::journal::{Entry, Journal};
use super::spool::Spooled;
use crate::config::StoreUrl;
use crate::connect::SinkError;

/// The size of each part.
pub(super) const PART_SIZE: usize = 8 << 20;

/// Parts uploading (and so in memory) at once.
const IN_FLIGHT: usize = 2;

/// A cloud store's multipart side, with the journal of a spool directory.
pub(super) struct Multipart {
    store: Arc<dyn MultipartStore>,
    journal: Arc<Journal>,
    /// The store's URL, as journaled.
    url: String,
}

/// The typed client of a cloud store, built as
/// `crate::object_stores::open_cloud` builds it (the same builders, from
/// the environment, the block's fields on top and only when set; keep the
/// two in step); `None` for a directory.
///
/// # Errors
///
/// Options the client refuses.
pub(super) fn open(
    config: &ObjectStoreSinkConfig,
) -> Result<Option<Arc<dyn MultipartStore>>, String> {
    let url = config.store_url()?;
    let endpoint = config.endpoint.as_deref();
    let built: Result<Arc<dyn MultipartStore>, String> = match &url {
        StoreUrl::S3 { bucket, .. } => {
            let mut builder =
                object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
            if let Some(region) = config.region.as_deref() {
                builder = builder.with_region(region);
            }
            if let Some(endpoint) = endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            if config.allow_http {
                builder = builder.with_allow_http(true);
            }
            builder
                .build()
                .map(|s| Arc::new(s) as _)
                .map_err(|e| e.to_string())
        }
        StoreUrl::Gcs { bucket, .. } => {
            let mut builder =
                object_store::gcp::GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket);
            if let Some(endpoint) = endpoint {
                builder =
                    builder.with_config(GoogleConfigKey::BaseUrl, endpoint.trim_end_matches('/'));
            }
            if config.allow_http {
                builder = builder
                    .with_config(GoogleConfigKey::Client(ClientConfigKey::AllowHttp), "true");
            }
            builder
                .build()
                .map(|s| Arc::new(s) as _)
                .map_err(|e| e.to_string())
        }
        StoreUrl::Azure { container, .. } => {
            // `open_cloud` has refused an endpoint in emulator mode already
            // (the sink's `Target::open` runs first).
            let mut builder = object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_container_name(container);
            if let Some(endpoint) = endpoint {
                builder = builder.with_endpoint(endpoint.trim_end_matches('/').to_owned());
            }
            if config.allow_http {
                builder = builder.with_allow_http(true);
            }
            builder
                .build()
                .map(|s| Arc::new(s) as _)
                .map_err(|e| e.to_string())
        }
        StoreUrl::File(_) | StoreUrl::Memory(_) => return Ok(None),
    };
    built.map(Some).map_err(|e| format!("{url}: {e}"))
}

impl Multipart {
    pub(super) fn new(store: Arc<dyn MultipartStore>, journal: Arc<Journal>, url: String) -> Self {
        Multipart {
            store,
            journal,
            url,
        }
    }

    /// Uploads `file` as `path` in parts; `shown` names it in errors.
    /// A failed upload is aborted (or left journaled, and aborted in the
    /// background, when the abort fails too).
    pub(super) async fn upload(
        &self,
        path: &Path,
        file: &Spooled,
        shown: &str,
    ) -> Result<(), SinkError> {
        let failed = |e: &dyn std::fmt::Display| SinkError::Unavailable(format!("{shown}: {e}"));
        let id = self
            .store
            .create_multipart(path)
            .await
            .map_err(|e| failed(&e))?;
        let entry = Entry {
            store: self.url.clone(),
            path: path.to_string(),
            id: id.clone(),
        };
        let adding = entry.clone();
        if let Err(e) = self.journaled(move |j| j.add(adding)).await {
            // Not journaled: abort it now, or say which it is.
            if let Err(abort) = self.store.abort_multipart(path, &id).await {
                tracing::error!(object = %shown, upload = %id, error = %abort, "a multipart upload that could not be journaled could not be aborted either: abort it by hand");
            }
            return Err(failed(&format_args!("journaling the upload: {e}")));
        }
        let sent = self.send_parts(path, &id, file).await;
        let done = match sent {
            Ok(parts) => self
                .store
                .complete_multipart(path, &id, parts)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match done {
            Ok(()) => {
                let removing = entry.clone();
                if let Err(e) = self.journaled(move |j| j.remove(&removing)).await {
                    // Complete in the store: the next start's abort finds
                    // nothing to abort.
                    tracing::warn!(object = %shown, error = %e, "the journal could not drop a completed upload");
                }
                Ok(())
            }
            Err(e) => {
                self.abort_or_leave(entry).await;
                Err(failed(&e))
            }
        }
    }

    /// Reads the spool file a part at a time, [`IN_FLIGHT`] uploading.
    async fn send_parts(
        &self,
        path: &Path,
        id: &MultipartId,
        file: &Spooled,
    ) -> Result<Vec<PartId>, String> {
        let mut reader = tokio::fs::File::open(&file.path)
            .await
            .map_err(|e| format!("reading the spool file: {e}"))?;
        let mut parts = Vec::new();
        let mut sending: FuturesOrdered<BoxFuture<'_, object_store::Result<PartId>>> =
            FuturesOrdered::new();
        for index in 0.. {
            if sending.len() >= IN_FLIGHT
                && let Some(sent) = sending.next().await
            {
                parts.push(sent.map_err(|e| e.to_string())?);
            }
            let mut chunk = Vec::with_capacity(PART_SIZE);
            while chunk.len() < PART_SIZE {
                let read = (&mut reader)
                    .take((PART_SIZE - chunk.len()) as u64)
                    .read_to_end(&mut chunk)
                    .await
                    .map_err(|e| format!("reading the spool file: {e}"))?;
                if read == 0 {
                    break;
                }
            }
            if chunk.is_empty() && index > 0 {
                break;
            }
            let last = chunk.len() < PART_SIZE;
            sending.push_back(
                self.store
                    .put_part(path, id, index, PutPayload::from(chunk)),
            );
            if last {
                break;
            }
        }
        while let Some(sent) = sending.next().await {
            parts.push(sent.map_err(|e| e.to_string())?);
        }
        Ok(parts)
    }

    /// Aborts `entry`'s upload; if that fails, keeps retrying in the
    /// background (it stays journaled meanwhile, for the next start).
    async fn abort_or_leave(&self, entry: Entry) {
        if !abort_once(self.store.as_ref(), &self.journal, &entry).await {
            let (store, journal) = (self.store.clone(), self.journal.clone());
            tokio::spawn(abort_until_done(store, journal, entry));
        }
    }

    async fn journaled(
        &self,
        change: impl FnOnce(&Journal) -> std::io::Result<()> + Send + 'static,
    ) -> std::io::Result<()> {
        let journal = self.journal.clone();
        tokio::task::spawn_blocking(move || change(&journal))
            .await
            .map_err(std::io::Error::other)?
    }
}

/// Aborts `entry`'s upload and drops it from `journal`: whether it is
/// gone. An upload the store no longer knows (completed, or aborted
/// already) counts as gone.
async fn abort_once(store: &dyn MultipartStore, journal: &Arc<Journal>, entry: &Entry) -> bool {
    let path = Path::from(entry.path.as_str());
    match store.abort_multipart(&path, &entry.id).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => {
            tracing::warn!(store = %entry.store, object = %entry.path, upload = %entry.id, error = %e, "aborting a multipart upload failed; retrying");
            return false;
        }
    }
    let journal = journal.clone();
    let owned = entry.clone();
    match tokio::task::spawn_blocking(move || journal.remove(&owned)).await {
        Ok(Ok(())) => {
            tracing::info!(store = %entry.store, object = %entry.path, upload = %entry.id, "aborted a multipart upload");
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(upload = %entry.id, error = %e, "the journal could not drop an aborted upload; retrying");
            false
        }
        Err(e) => {
            tracing::warn!(upload = %entry.id, error = %e, "the journal task failed; retrying");
            false
        }
    }
}

/// Aborts `entry`'s upload, retrying (1 s, doubling to 1 min) until the
/// store answers.
pub(super) async fn abort_until_done(
    store: Arc<dyn MultipartStore>,
    journal: Arc<Journal>,
    entry: Entry,
) {
    let mut wait = Duration::from_secs(1);
    while !abort_once(store.as_ref(), &journal, &entry).await {
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(60));
    }
}

/// Aborts every upload `journal` holds for the store `url` (a stale
/// spool directory's, at start), then calls `done`. An entry for another
/// store (the block's `store:` changed since) cannot be aborted from
/// here: it is logged with what an operator needs to abort it, and kept.
pub(super) async fn abort_journaled(
    store: Arc<dyn MultipartStore>,
    journal: Arc<Journal>,
    url: String,
    done: impl FnOnce(bool),
) {
    let mut kept = false;
    for entry in journal.entries() {
        if entry.store != url {
            tracing::error!(store = %entry.store, object = %entry.path, upload = %entry.id, "a multipart upload cut by a crash is on a store this sink no longer writes to: abort it by hand");
            kept = true;
            continue;
        }
        abort_until_done(store.clone(), journal.clone(), entry).await;
    }
    done(kept);
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use object_store::ObjectStoreExt as _;
    use object_store::memory::InMemory;

    use super::*;
    use crate::connect::object_store::spool::Spool;

    #[tokio::test]
    async fn a_file_goes_up_in_parts_from_the_spool_and_leaves_no_journal_entry() {
        let root = tempfile::tempdir().expect("dir");
        let (spool, _) = Spool::open(root.path()).expect("spool");
        let mut out = spool.create().expect("spool file");
        let bytes: Vec<u8> = (0..(PART_SIZE * 2 + 12_345))
            .map(|i| (i % 251) as u8)
            .collect();
        out.write_all(&bytes).expect("write");
        let file = out.finish().expect("finish");
        let store = Arc::new(InMemory::new());
        let journal = Arc::new(Journal::open(spool.dir()).expect("journal"));
        let multipart = Multipart::new(store.clone(), journal.clone(), "s3://b".into());
        let path = Path::from("p/x.parquet");
        multipart
            .upload(&path, &file, "s3://b/p/x.parquet")
            .await
            .expect("upload");
        let got = store
            .get(&path)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(got.as_ref(), bytes.as_slice(), "three parts, in order");
        assert!(journal.entries().is_empty(), "completed: not journaled");
    }

    #[tokio::test]
    async fn a_journaled_upload_of_a_stale_spool_is_aborted_and_forgotten() {
        let root = tempfile::tempdir().expect("dir");
        let store = Arc::new(InMemory::new());
        let path = Path::from("p/cut.parquet");
        let id = store.create_multipart(&path).await.expect("create");
        let journal = Arc::new(Journal::open(root.path()).expect("journal"));
        let entry = |id: &str, store: &str| Entry {
            store: store.into(),
            path: path.to_string(),
            id: id.into(),
        };
        journal.add(entry(&id, "s3://b")).expect("add");
        // One on another store: kept, and said.
        journal.add(entry("9", "s3://other")).expect("add");
        let (sender, receiver) = tokio::sync::oneshot::channel();
        abort_journaled(
            store.clone(),
            journal.clone(),
            "s3://b".into(),
            move |kept| {
                let _ = sender.send(kept);
            },
        )
        .await;
        assert!(receiver.await.expect("done"), "the other store's is kept");
        assert_eq!(journal.entries(), [entry("9", "s3://other")]);
        // The aborted upload is gone from the store.
        let again = store
            .put_part(&path, &id, 0, PutPayload::from_static(b"x"))
            .await;
        assert!(again.is_err(), "aborted: {again:?}");
        assert!(store.head(&path).await.is_err(), "nothing was completed");
    }
}
