//! Archives (issue 45): what the runtime is about to remove, written
//! first to an object store as JSON lines, with the object-store sink's
//! create-only put ([`Target`]), so nothing is removed that the store has
//! not taken whole.
//!
//! - [`ArchiveWriter`] writes one object of lines and says where. `dlq
//!   purge` (`admin::dlq`) uses it for the entries it is about to delete,
//!   as `dlq show` prints them.
//! - [`retention`] is the task the daemon starts for each topic with
//!   `retention: {max_age, archive}`: it reads what is older than
//!   `max_age`, writes it, and only then removes it. A DLQ topic's lines
//!   are its entries as `dlq show` prints them, as a purge writes them. The broker is given
//!   no age retention for such a topic, so it never drops what this task
//!   has not written. While the store refuses, nothing is removed and the
//!   topic is reported down in readiness, naming the archive and why.

use std::sync::Arc;
use std::time::Duration;

use super::object_store::encode::json_line;
use super::object_store::upload::{Put, Target};
use crate::broker::{Broker, BrokerError, Stored, now_millis};
use crate::config::Archive;
use crate::config::connectors::object_store::Compression;
use crate::metrics::Metrics;

/// Messages read, written and removed at a time by [`retention`].
const PAGE: usize = 1000;

/// Why an archive did not take an object. The text names the store's
/// URL (credentials come from the environment, never the URL) and the
/// store's own answer.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The store cannot be reached or opened (a bad endpoint, a directory
    /// that cannot be created).
    #[error("the archive {store} cannot be opened: {why}")]
    Open {
        /// The store's URL.
        store: String,
        /// What failed.
        why: String,
    },
    /// The object was not written whole.
    #[error("the archive did not take {object}: {why}")]
    Write {
        /// The object's URL.
        object: String,
        /// What failed.
        why: String,
    },
}

/// An archive, opened: writes objects of JSON lines under its prefix.
pub struct ArchiveWriter {
    archive: Archive,
    target: Target,
}

impl ArchiveWriter {
    /// Opens `archive` (a directory is created; a cloud client is built,
    /// nothing contacted).
    ///
    /// # Errors
    ///
    /// [`ArchiveError::Open`] when the store's fields are refused or its
    /// directory cannot be created.
    pub fn open(archive: &Archive) -> Result<Self, ArchiveError> {
        let target = Target::open(&archive.sink_config()).map_err(|why| ArchiveError::Open {
            store: archive.describe(),
            why,
        })?;
        Ok(ArchiveWriter {
            archive: archive.clone(),
            target,
        })
    }

    /// Writes `lines` (JSON lines, each ending in `\n`) as one new object
    /// under `<path>/<parts...>/`, compressed as the block says, and
    /// returns its URL once it is complete in the store.
    ///
    /// # Errors
    ///
    /// [`ArchiveError::Write`] when the store did not take it whole.
    pub async fn write(&self, parts: &[&str], lines: &[u8]) -> Result<String, ArchiveError> {
        let key = self
            .archive
            .object_key(parts, &uuid::Uuid::now_v7().to_string());
        let object = self.target.url_of(&key);
        let failed = |why: String| ArchiveError::Write {
            object: object.clone(),
            why,
        };
        let bytes = compress(self.archive.compression, lines).map_err(failed)?;
        match self.target.put(&key, bytes).await {
            Ok(Put::Created) => Ok(object.clone()),
            // A fresh UUIDv7 name: only a clash nobody can explain.
            Ok(Put::AlreadyThere) => Err(failed("an object of that name is there already".into())),
            Err(e) => Err(failed(e.to_string())),
        }
    }
}

/// Today's date, UTC, as `2026-11-30`: the folder an archive object goes
/// in, so an operator finds a day's removals together.
pub fn today() -> String {
    time::OffsetDateTime::now_utc().date().to_string()
}

fn compress(compression: Option<Compression>, lines: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Write;
    match compression {
        None => Ok(lines.to_vec()),
        Some(Compression::Gzip) => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(lines).map_err(|e| format!("gzip: {e}"))?;
            gz.finish().map_err(|e| format!("gzip: {e}"))
        }
        Some(Compression::Zstd) => zstd::encode_all(lines, 3).map_err(|e| format!("zstd: {e}")),
        Some(Compression::Snappy) => Err("an archive takes gzip or zstd, not snappy".into()),
    }
}

/// The name an archived topic has in readiness while its store refuses.
pub fn retention_name(topic: &str) -> String {
    format!("retention-archive:{topic}")
}

/// How a stored message becomes one archive line (ending in `\n`).
pub type LineFn = Arc<dyn Fn(&Stored) -> Vec<u8> + Send + Sync>;

/// What [`retention`] works on.
pub struct RetentionArchive {
    /// The topic.
    pub topic: String,
    /// Messages published longer ago than this are archived, then removed.
    pub max_age: Duration,
    /// Where.
    pub archive: Archive,
    /// The line of each message: [`message_line`], or for a DLQ topic the
    /// entry as `dlq show` prints it (the daemon passes the admin API's),
    /// so `dlq redrive --from-archive` reads it as a purge's archive.
    pub line: LineFn,
}

/// A message as the object-store sink's JSON line: `id`, `topic`, `key`,
/// `headers`, `published_at` and the payload as JSON or `payload_base64`.
pub fn message_line(stored: &Stored) -> Vec<u8> {
    let m = &stored.message;
    // The sink's JSON line, which reads the contract's message.
    json_line(&crate::plugin::Message {
        id: m.id.clone(),
        topic: m.topic.clone(),
        key: m.key.clone(),
        headers: m.headers.clone(),
        payload: m.payload.to_vec(),
        attempt: 0,
        published_at: m.published_at,
    })
}

/// Archives and then removes the messages of one topic older than its
/// `max_age`, until `stop` turns true. A store that refuses holds the
/// removal (nothing is dropped), is logged when it starts and stops, and
/// marks the topic down in `health` meanwhile; the task tries again every
/// tick.
pub async fn retention(
    job: RetentionArchive,
    broker: Arc<dyn Broker>,
    health: Arc<super::Health>,
    metrics: Arc<Metrics>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let tick = (job.max_age / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let name = retention_name(&job.topic);
    let mut writer: Option<ArchiveWriter> = None;
    loop {
        let more = match retention_pass(&job, &broker, &mut writer).await {
            Ok(more) => {
                health.up(&metrics, &name);
                more
            }
            Err(why) => {
                if health.down(&metrics, &name, &why) {
                    tracing::warn!(
                        topic = %job.topic,
                        "retention holds: nothing older than {:?} is removed until the archive \
                         takes it: {why}",
                        job.max_age
                    );
                }
                false
            }
        };
        if *stop.borrow() {
            return;
        }
        if !more {
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// One page: the oldest messages past `max_age`, written, then removed.
/// True when a full page went (there may be more at once).
async fn retention_pass(
    job: &RetentionArchive,
    broker: &Arc<dyn Broker>,
    writer: &mut Option<ArchiveWriter>,
) -> Result<bool, String> {
    let cutoff = now_millis().saturating_sub(u64::try_from(job.max_age.as_millis()).unwrap_or(0));
    let page = match broker.read(&job.topic, 1, PAGE, Duration::ZERO).await {
        Ok(page) => page,
        Err(BrokerError::UnknownTopic(_)) => return Ok(false),
        Err(e) => return Err(format!("reading {}: {e}", job.topic)),
    };
    let old: Vec<_> = page
        .iter()
        .take_while(|s| s.message.published_at < cutoff)
        .collect();
    if old.is_empty() {
        return Ok(false);
    }
    if writer.is_none() {
        *writer = Some(ArchiveWriter::open(&job.archive).map_err(|e| e.to_string())?);
    }
    let Some(open) = writer.as_ref() else {
        return Ok(false);
    };
    let mut lines = Vec::new();
    for stored in &old {
        lines.extend((job.line)(stored));
    }
    let object = open
        .write(&[&job.topic, &today()], &lines)
        .await
        .map_err(|e| e.to_string())?;
    let seqs: Vec<u64> = old.iter().map(|s| s.seq).collect();
    let removed = broker
        .remove(&job.topic, &seqs)
        .await
        .map_err(|e| format!("removing archived messages of {}: {e}", job.topic))?;
    tracing::info!(
        topic = %job.topic,
        archived = seqs.len(),
        removed,
        "retention archived {object}"
    );
    Ok(old.len() == PAGE)
}
