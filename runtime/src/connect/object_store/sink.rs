//! The object-store sink at work: each batch's messages are rendered to
//! their path, checked against the Parquet schema (a message that does not
//! fit is rejected alone, with the field named), and appended to their
//! path's open file; each comes back [`Accepted::Pending`] until its file
//! is complete in the store. A file rolls at a limit (`files.rs`), on a
//! timer for `max_age`, and at shutdown ([`Sink::flush`]); its upload
//! (`upload.rs`) answers every record in it.
//!
//! `raw` writes one object per message, named by the message id, with a
//! create-only put: a redelivered message finds its object there.
//!
//! An upload that fails is an outage: its records are held (no attempt
//! spent) and written again into a new file. One that takes longer than
//! `stall` marks the sink down (readiness names it) until it ends. So is
//! a spool file that cannot be written (a full disk).
//!
//! Files are built on the spool (`spool.rs`), under the daemon's data
//! directory; at start, a spool left by a sink that is gone is cleared
//! and the multipart uploads its journal names are aborted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::oneshot;

use super::config::{ObjectFormat, ObjectStoreSinkConfig, PathPart, parse_path};
use super::encode::{Columns, Encoder, FileError, Row};
use super::files::{Closed, Files, Limits, Waiter};
use super::journal::Journal;
use super::multipart::Multipart;
use super::spool::{Spool, Stale};
use super::upload::{Put, Target};
use crate::connect::{Accepted, Context, Sink, SinkError};
use crate::plugin::Message;

/// Writes messages to object storage.
pub struct ObjectStoreSink {
    inner: Arc<Inner>,
}

struct Inner {
    config: ObjectStoreSinkConfig,
    path: Vec<PathPart>,
    columns: Option<Arc<Columns>>,
    target: Target,
    /// Where files are built.
    spool: Spool,
    /// A cloud store's multipart side, journaled in the spool.
    multipart: Option<Multipart>,
    files: Mutex<Files>,
    /// Set once shutdown began: every file is closed at once.
    closing: AtomicBool,
    ctx: Context,
    /// `<pipeline>/<sink>`, for the health.
    label: String,
}

impl ObjectStoreSink {
    /// The sink of `config`, its target opened (nothing contacted), with
    /// its roll timer running.
    ///
    /// # Errors
    ///
    /// A store that cannot be opened, a path or schema that does not
    /// parse, a spool directory that cannot be made.
    pub fn new(config: &ObjectStoreSinkConfig, ctx: &Context) -> Result<Self, String> {
        let columns = match config.format {
            ObjectFormat::Parquet => Some(Arc::new(Columns::new(&config.schema)?)),
            _ => None,
        };
        let limits = Limits {
            records: config.roll.max_records.get(),
            bytes: config.roll.max_bytes.bytes(),
            age: config.roll.max_age.get(),
            open_files: usize::try_from(config.max_open_files.get()).unwrap_or(usize::MAX),
        };
        let target = Target::open(config)?;
        let (spool, stale) = open_spool(ctx)?;
        let journal = Journal::open(spool.dir())
            .map_err(|e| format!("the spool's journal {}: {e}", spool.dir().display()))?;
        let url = config.store_url()?.to_string();
        let typed = super::multipart::open(config)?;
        clear_stale(stale, typed.clone(), &url);
        let inner = Arc::new(Inner {
            path: parse_path(&config.path)?,
            columns,
            target,
            spool,
            multipart: typed.map(|store| Multipart::new(store, Arc::new(journal), url)),
            files: Mutex::new(Files::new(limits)),
            closing: AtomicBool::new(false),
            label: ctx.label(),
            ctx: ctx.clone(),
            config: config.clone(),
        });
        if config.format != ObjectFormat::Raw {
            tokio::spawn(roll_on_age(Arc::downgrade(&inner), limits.age));
        }
        Ok(ObjectStoreSink { inner })
    }
}

/// The sink's spool directory, under the daemon's data directory (the
/// system's temporary directory outside a daemon), with the stale
/// instance directories found there.
fn open_spool(ctx: &Context) -> Result<(Spool, Vec<Stale>), String> {
    let base = ctx.data_dir.clone().unwrap_or_else(|| {
        let temp = std::env::temp_dir();
        tracing::info!(sink = %ctx.label(), dir = %temp.display(), "no data directory: spooling files under the temporary directory");
        temp.join("sluice-spool")
    });
    let root = base
        .join("spool")
        .join("object_store")
        .join(segment(&ctx.pipeline))
        .join(segment(&ctx.name));
    Spool::open(&root).map_err(|e| format!("the spool directory {}: {e}", root.display()))
}

/// Clears what sinks that are gone left on the spool: their spool files
/// are gone already (`Spool::open`); the multipart uploads their journals
/// name are aborted in the background (retried while the store is down),
/// then their directories removed. What cannot be aborted from here is
/// logged and left.
fn clear_stale(
    stale: Vec<Stale>,
    store: Option<Arc<dyn object_store::multipart::MultipartStore>>,
    url: &str,
) {
    for dir in stale {
        let journal = match Journal::open(&dir.dir) {
            Ok(journal) => journal,
            Err(e) => {
                tracing::error!(dir = %dir.dir.display(), error = %e, "a stale spool's journal cannot be read; left in place (its uploads, if any, need aborting by hand)");
                continue;
            }
        };
        let entries = journal.entries();
        if entries.is_empty() {
            remove_stale(dir);
            continue;
        }
        let Some(store) = store.clone() else {
            for entry in entries {
                tracing::error!(store = %entry.store, object = %entry.path, upload = %entry.id, "a multipart upload cut by a crash is on a store this sink no longer writes to: abort it by hand");
            }
            continue;
        };
        tracing::info!(dir = %dir.dir.display(), uploads = entries.len(), "aborting the multipart uploads a crash cut");
        tokio::spawn(super::multipart::abort_journaled(
            store,
            Arc::new(journal),
            url.to_owned(),
            move |kept| {
                if !kept {
                    remove_stale(dir);
                }
            },
        ));
    }
}

fn remove_stale(dir: Stale) {
    let path = dir.dir.clone();
    if let Err(e) = dir.remove() {
        tracing::warn!(dir = %path.display(), error = %e, "a stale spool directory could not be removed");
    }
}

/// Closes the files that reach `max_age`, checking at a quarter of it
/// (within 20 ms and 1 s). Ends when the sink is dropped.
async fn roll_on_age(inner: Weak<Inner>, age: Duration) {
    let every = (age / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let mut closed = Vec::new();
        {
            let now = Instant::now();
            let mut files = inner.lock_files();
            files.close_aged(now, &mut closed);
            inner.gauges(&files, now);
        }
        inner.upload_all(closed);
    }
}

impl Inner {
    fn lock_files(&self) -> std::sync::MutexGuard<'_, Files> {
        self.files.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the open-files and oldest-record gauges.
    fn gauges(&self, files: &Files, now: Instant) {
        let labels = self.labels();
        let open = i64::try_from(files.len()).unwrap_or(i64::MAX);
        self.ctx
            .metrics
            .sink_open_files
            .get_or_create(&labels)
            .set(open);
        let oldest = files.oldest(now).unwrap_or_default().as_secs_f64();
        self.ctx
            .metrics
            .sink_oldest_unflushed
            .get_or_create(&labels)
            .set(oldest);
    }

    fn labels(&self) -> crate::metrics::ConnectorLabels {
        crate::metrics::ConnectorLabels {
            connector: self.label.clone(),
        }
    }

    /// Counts an object completed in the store.
    fn count(&self, bytes: usize, records: u64) {
        let labels = self.labels();
        let metrics = &self.ctx.metrics;
        metrics.sink_objects.get_or_create(&labels).inc();
        metrics
            .sink_object_bytes
            .get_or_create(&labels)
            .inc_by(u64::try_from(bytes).unwrap_or(u64::MAX));
        metrics
            .sink_object_records
            .get_or_create(&labels)
            .inc_by(records);
    }

    /// The rendered path of `message` (the directory part of its key).
    fn dir_of(&self, message: &Message) -> String {
        let at = time::OffsetDateTime::from_unix_timestamp_nanos(
            i128::from(message.published_at) * 1_000_000,
        )
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
        let mut out = String::new();
        for part in &self.path {
            match part {
                PathPart::Text(text) => out.push_str(text),
                PathPart::Field("topic") => out.push_str(&segment(&message.topic)),
                PathPart::Field("date") => out.push_str(&format!(
                    "{:04}-{:02}-{:02}",
                    at.year(),
                    u8::from(at.month()),
                    at.day()
                )),
                PathPart::Field("year") => out.push_str(&format!("{:04}", at.year())),
                PathPart::Field("month") => out.push_str(&format!("{:02}", u8::from(at.month()))),
                PathPart::Field("day") => out.push_str(&format!("{:02}", at.day())),
                PathPart::Field("hour") => out.push_str(&format!("{:02}", at.hour())),
                PathPart::Field("minute") => out.push_str(&format!("{:02}", at.minute())),
                PathPart::Field(_) => {
                    out.push_str(&segment(message.key.as_deref().unwrap_or_default()));
                }
                PathPart::Header(name) => {
                    let value = message
                        .headers
                        .iter()
                        .rev()
                        .find(|(n, _)| n.eq_ignore_ascii_case(name))
                        .map_or("", |(_, v)| v.as_str());
                    out.push_str(&segment(value));
                }
            }
        }
        out
    }

    /// Starts uploading each closed file; its upload answers its records.
    fn upload_all(self: &Arc<Self>, closed: Vec<Closed>) {
        for file in closed {
            let inner = self.clone();
            tokio::spawn(async move { inner.upload(file).await });
        }
    }

    async fn upload(&self, file: Closed) {
        let result = match file.file {
            Ok(spooled) => {
                let name = format!(
                    "{}part-{}.{}",
                    file.dir,
                    uuid::Uuid::now_v7(),
                    self.config.extension()
                );
                tracing::debug!(object = %self.target.url_of(&name), records = file.records, "uploading a file");
                let size = usize::try_from(spooled.size).unwrap_or(usize::MAX);
                let put = self
                    .target
                    .put_file(&name, spooled, self.multipart.as_ref());
                let put = self.watched(&name, put).await;
                if put.is_ok() {
                    self.count(size, file.records);
                }
                put.map(|_| ())
            }
            Err(why) => Err(self.file_failed(&why)),
        };
        for waiter in file.waiters {
            let _ = waiter.send(result.clone());
        }
    }

    /// The records' outcome when their file could not be written: an
    /// outage (readiness names it) for the spool's failures, an attempt
    /// for an encoding bug.
    fn file_failed(&self, why: &FileError) -> SinkError {
        if let FileError::Spool(_) = why {
            let said = format!("the spool under {}: {why}", self.spool.dir().display());
            self.ctx.health.down(&self.ctx.metrics, &self.label, &said);
        }
        why.to_sink_error()
    }

    /// `put`, with the sink marked down while it is stalled past `stall`
    /// or failing, and up again once one succeeds.
    async fn watched(
        &self,
        name: &str,
        put: impl std::future::Future<Output = Result<Put, SinkError>>,
    ) -> Result<Put, SinkError> {
        let stall = self.config.stall.get();
        tokio::pin!(put);
        let result = tokio::select! {
            result = &mut put => result,
            () = tokio::time::sleep(stall) => {
                self.ctx.health.down(
                    &self.ctx.metrics,
                    &self.label,
                    &format!(
                        "writing {} has stalled for {}",
                        self.target.url_of(name),
                        humantime::format_duration(stall)
                    ),
                );
                put.await
            }
        };
        match &result {
            Ok(_) => self.ctx.health.up(&self.ctx.metrics, &self.label),
            Err(SinkError::Unavailable(why)) => {
                self.ctx.health.down(&self.ctx.metrics, &self.label, why);
            }
            Err(_) => {}
        }
        result
    }

    /// One object per message, named by its id.
    async fn write_raw(&self, messages: &[Message]) -> Vec<Result<Accepted, SinkError>> {
        let puts = messages.iter().map(|message| async move {
            let name = format!("{}{}", self.dir_of(message), segment(&message.id));
            let put = self
                .watched(&name, self.target.put(&name, message.payload.clone()))
                .await?;
            if put == Put::Created {
                self.count(message.payload.len(), 1);
            }
            Ok(Accepted::Written)
        });
        futures_util::future::join_all(puts).await
    }
}

/// A value as one path segment: letters, digits, `-`, `_`, `.` and `=` as
/// they are, anything else (a `/` above all) as `%XX`; empty as `_`, and
/// `.` or `..` escaped, so a value can never climb out of its directory.
fn segment(value: &str) -> String {
    if value.is_empty() {
        return "_".into();
    }
    if value == "." || value == ".." {
        return value.replace('.', "%2E");
    }
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'=') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[async_trait]
impl Sink for ObjectStoreSink {
    async fn write(&self, message: &Message) -> Result<(), SinkError> {
        let mut results = self.accept_batch(std::slice::from_ref(message)).await;
        match results.pop() {
            Some(Ok(Accepted::Pending(pending))) => pending.await,
            Some(Ok(Accepted::Written)) => Ok(()),
            Some(Err(e)) => Err(e),
            None => Err(SinkError::Retry {
                reason: "no result".into(),
                after: None,
            }),
        }
    }

    async fn accept_batch(&self, messages: &[Message]) -> Vec<Result<Accepted, SinkError>> {
        let inner = &self.inner;
        if inner.config.format == ObjectFormat::Raw {
            return inner.write_raw(messages).await;
        }
        let mut results: Vec<Option<Result<Accepted, SinkError>>> =
            messages.iter().map(|_| None).collect();
        // The rows of each path, in order, with their places in the batch.
        let mut groups: BTreeMap<String, Vec<(usize, &Message, Row)>> = BTreeMap::new();
        for (i, message) in messages.iter().enumerate() {
            let row = match &inner.columns {
                Some(columns) => match columns.row(message) {
                    Ok(row) => row,
                    Err(why) => {
                        results[i] = Some(Err(SinkError::Rejected(format!(
                            "does not fit the parquet schema: {why}"
                        ))));
                        continue;
                    }
                },
                None => Vec::new(),
            };
            groups
                .entry(inner.dir_of(message))
                .or_default()
                .push((i, message, row));
        }
        let start = || {
            let out = inner
                .spool
                .create()
                .map_err(|e| FileError::Spool(e.to_string()))?;
            Encoder::new(&inner.config, inner.columns.as_ref(), out)
        };
        let mut closed = Vec::new();
        {
            let mut files = inner.lock_files();
            for (dir, group) in groups {
                let mut rows = Vec::with_capacity(group.len());
                let mut waiters: Vec<Waiter> = Vec::with_capacity(group.len());
                let mut places = Vec::with_capacity(group.len());
                for (i, message, row) in group {
                    let (sender, receiver) = oneshot::channel();
                    waiters.push(sender);
                    rows.push((message, row));
                    places.push((i, receiver));
                }
                let failed = files.append(&dir, rows, waiters, &start, &mut closed);
                if let Err((why, waiters)) = failed {
                    let outcome = inner.file_failed(&why);
                    for waiter in waiters {
                        let _ = waiter.send(Err(outcome.clone()));
                    }
                }
                for (i, receiver) in places {
                    results[i] = Some(Ok(Accepted::Pending(Box::pin(async move {
                        receiver.await.unwrap_or_else(|_| {
                            Err(SinkError::Unavailable(
                                "the sink stopped before the file holding this message was \
                                 written"
                                    .into(),
                            ))
                        })
                    }))));
                }
            }
            if inner.closing.load(Ordering::SeqCst) {
                files.close_all(&mut closed);
            }
            inner.gauges(&files, Instant::now());
        }
        inner.upload_all(closed);
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(SinkError::Retry {
                        reason: "no result".into(),
                        after: None,
                    })
                })
            })
            .collect()
    }

    fn flush(&self) {
        let inner = &self.inner;
        inner.closing.store(true, Ordering::SeqCst);
        let mut closed = Vec::new();
        inner.lock_files().close_all(&mut closed);
        if !closed.is_empty() {
            tracing::info!(
                sink = %inner.label,
                files = closed.len(),
                "shutdown: uploading the open files"
            );
        }
        inner.upload_all(closed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cannot_climb_out() {
        assert_eq!(segment("a/b"), "a%2Fb");
        assert_eq!(segment(".."), "%2E%2E");
        assert_eq!(segment(""), "_");
        assert_eq!(segment("tenant-1"), "tenant-1");
    }
}
