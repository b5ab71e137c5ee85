//! `sluice dlq redrive --from-archive <URL>` (issue 45): dead letters that
//! `dlq purge` archived, put back on the topic each failed from.
//!
//! The CLI reads the archive itself, with the user's credentials (the
//! standard `AWS_*`, `GOOGLE_*`, `AZURE_*` variables and the flags below):
//! the daemon never fetches a URL a caller names. It then goes through two
//! calls the API already has, per stage and per chunk of entries:
//!
//! 1. each entry is put back in its stage's DLQ (ingest takes a DLQ entry's
//!    provenance headers on a DLQ topic only), under the id
//!    `<entry id>~archived`, so restoring one archive twice stores it once
//!    while the broker's duplicate window remembers it;
//! 2. those entries (by seq) are redriven as any DLQ entry is: to their
//!    source topic, for the failed stage only, with the deterministic
//!    redrive id (`<original>~r<n>@<pipeline>/<stage>`), key, headers and
//!    `traceparent` kept, so dedup and tracing hold.
//!
//! A crash between the two leaves the entries in the DLQ, never lost; the
//! archive itself is never changed.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine as _;

use super::client::{Client, ClientError, Outgoing};
use crate::admin::{DlqEntryDetail, DlqFilter, RedriveRequest};
use crate::config::StoreUrl;

/// Entries restored and redriven per round trip.
const CHUNK: usize = 500;

/// Where an archive is and how to reach it.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct ArchiveArgs {
    /// Redrive the dead letters archived under URL by `dlq purge` (a `dlq: {archive}`):
    /// file:///dir, s3://bucket/prefix, gs://..., az://..., a folder or one object. Each goes
    /// back to its source topic, for the stage named in its provenance (only PIPELINE/STAGE's
    /// when given).
    #[arg(long, value_name = "URL")]
    pub(crate) from_archive: Option<String>,
    /// The archive's endpoint: an S3-compatible service, a GCS emulator or Azurite.
    #[arg(long, value_name = "URL", requires = "from_archive")]
    pub(crate) endpoint: Option<String>,
    /// The archive's S3 region (else AWS_DEFAULT_REGION/AWS_REGION, else us-east-1).
    #[arg(long, value_name = "REGION", requires = "from_archive")]
    pub(crate) region: Option<String>,
    /// Allow a plain http:// --endpoint (local test services).
    #[arg(long, requires = "from_archive")]
    pub(crate) allow_http: bool,
}

/// One archived dead letter, and the object it was read from.
pub(crate) struct Archived {
    pub(crate) object: String,
    pub(crate) entry: DlqEntryDetail,
}

/// Every dead letter under `url`, objects in name order (UUIDv7 names
/// under date folders: oldest first), lines in order.
///
/// # Errors
///
/// Usage (exit 2) for a URL that is not a store, an archive with no
/// object, or a line that is not an entry as `dlq show` prints it (named
/// by object and line); Failed for a store that cannot be read.
pub(crate) fn read(args: &ArchiveArgs, url: &str) -> Result<Vec<Archived>, ClientError> {
    let parsed = StoreUrl::parse(url).map_err(ClientError::Usage)?;
    let objects = match &parsed {
        StoreUrl::File(path) => read_dir(path)?,
        StoreUrl::Memory(_) => {
            return Err(ClientError::Usage(format!(
                "{url}: a memory:// store holds nothing outside its process"
            )));
        }
        _ => read_cloud(args, &parsed)?,
    };
    if objects.is_empty() {
        return Err(ClientError::Usage(format!(
            "no archive objects (*.jsonl, *.jsonl.gz, *.jsonl.zst) under {url}"
        )));
    }
    let mut out = Vec::new();
    for (object, bytes) in objects {
        let text = decompress(&object, bytes)?;
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let entry: DlqEntryDetail = serde_json::from_str(line).map_err(|e| {
                ClientError::Usage(format!(
                    "{object}:{}: not a dead letter as `dlq show` prints it: {e}",
                    n + 1
                ))
            })?;
            out.push(Archived {
                object: object.clone(),
                entry,
            });
        }
    }
    Ok(out)
}

fn is_archive_object(name: &str) -> bool {
    [".jsonl", ".jsonl.gz", ".jsonl.zst"]
        .iter()
        .any(|ext| name.ends_with(ext))
}

/// The objects of a directory (recursively) or the one file named.
fn read_dir(path: &Path) -> Result<Vec<(String, Vec<u8>)>, ClientError> {
    let missing =
        |e: std::io::Error| ClientError::Usage(format!("no archive at {}: {e}", path.display()));
    let meta = std::fs::metadata(path).map_err(missing)?;
    let mut files: Vec<PathBuf> = Vec::new();
    if meta.is_file() {
        files.push(path.to_owned());
    } else {
        let mut stack = vec![path.to_owned()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).map_err(missing)? {
                let entry = entry.map_err(missing)?.path();
                let name = entry
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if entry.is_dir() {
                    stack.push(entry);
                } else if is_archive_object(&name) && !name.starts_with('.') {
                    files.push(entry);
                }
            }
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let bytes = std::fs::read(&file)
                .map_err(|e| ClientError::Failed(format!("cannot read {}: {e}", file.display())))?;
            Ok((format!("file://{}", file.display()), bytes))
        })
        .collect()
}

/// The objects under a cloud store's prefix, read on a runtime of their
/// own (the CLI's daemon client is blocking).
fn read_cloud(args: &ArchiveArgs, url: &StoreUrl) -> Result<Vec<(String, Vec<u8>)>, ClientError> {
    use futures_util::TryStreamExt;
    use object_store::ObjectStoreExt;
    let location = crate::object_stores::Location {
        url,
        region: args.region.as_deref(),
        endpoint: args.endpoint.as_deref(),
        allow_http: args.allow_http,
    };
    let store = crate::object_stores::open_cloud(location)
        .unwrap_or_else(|| Err(format!("{url} is not a cloud store")))
        .map_err(ClientError::Usage)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ClientError::Failed(format!("cannot start a runtime: {e}")))?;
    let base = url.to_string();
    let bucket_url = base
        .strip_suffix(url.prefix())
        .unwrap_or(&base)
        .trim_end_matches('/')
        .to_owned();
    runtime.block_on(async {
        let prefix =
            (!url.prefix().is_empty()).then(|| object_store::path::Path::from(url.prefix()));
        let failed = |e: object_store::Error| ClientError::Failed(format!("{url}: {e}"));
        let mut listed: Vec<object_store::ObjectMeta> = store
            .list(prefix.as_ref())
            .try_collect()
            .await
            .map_err(failed)?;
        listed.retain(|meta| is_archive_object(meta.location.as_ref()));
        listed.sort_by(|a, b| a.location.cmp(&b.location));
        let mut out = Vec::with_capacity(listed.len());
        for meta in listed {
            let bytes = store
                .get(&meta.location)
                .await
                .map_err(failed)?
                .bytes()
                .await
                .map_err(failed)?;
            out.push((format!("{bucket_url}/{}", meta.location), bytes.to_vec()));
        }
        Ok(out)
    })
}

fn decompress(object: &str, bytes: Vec<u8>) -> Result<String, ClientError> {
    let bad = |e: std::io::Error| ClientError::Usage(format!("{object}: cannot decompress: {e}"));
    let raw = if object.ends_with(".gz") {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes.as_slice())
            .read_to_end(&mut out)
            .map_err(bad)?;
        out
    } else if object.ends_with(".zst") {
        zstd::decode_all(bytes.as_slice()).map_err(bad)?
    } else {
        bytes
    };
    String::from_utf8(raw)
        .map_err(|_| ClientError::Usage(format!("{object}: not UTF-8 text (JSON lines)")))
}

/// What a redrive from an archive did, for the summary.
#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct ArchiveReport {
    /// Whether nothing was changed.
    pub(crate) dry_run: bool,
    /// Messages published back to their source topics (or, dry, that would be).
    pub(crate) redriven: u64,
    /// Their ids as published (dry: the archived entries' ids).
    pub(crate) ids: Vec<String>,
    /// Entries not redriven, and why (they stay in the archive).
    pub(crate) skipped: Vec<String>,
}

/// Redrives `entries` (those of `only`, when given) through `client`.
///
/// # Errors
///
/// The daemon refused a call; what was redriven before stays redriven,
/// and every entry is still in the archive.
pub(crate) fn redrive(
    client: &Client,
    entries: Vec<Archived>,
    only: Option<(&str, &str)>,
    rate: Option<f64>,
    dry_run: bool,
) -> Result<ArchiveReport, ClientError> {
    let mut report = ArchiveReport {
        dry_run,
        ..ArchiveReport::default()
    };
    let mut stages: BTreeMap<(String, String), Vec<Archived>> = BTreeMap::new();
    for archived in entries {
        let header = |name: &str| {
            archived
                .entry
                .headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        match (header(crate::dlq::PIPELINE), header(crate::dlq::STAGE)) {
            (Some(pipeline), Some(stage)) => {
                if only.is_none_or(|(p, s)| p == pipeline && s == stage) {
                    stages.entry((pipeline, stage)).or_default().push(archived);
                }
            }
            _ => report.skipped.push(format!(
                "{} ({}): no DLQ provenance headers: cannot tell where to redrive it",
                archived.entry.summary.id, archived.object
            )),
        }
    }
    for ((pipeline, stage), entries) in stages {
        if dry_run {
            for archived in &entries {
                match would_publish(&archived.entry) {
                    Some(id) => {
                        report.redriven += 1;
                        report.ids.push(id);
                    }
                    None => report.skipped.push(format!(
                        "{} ({}): incomplete DLQ provenance headers: cannot tell where to \
                         redrive it",
                        archived.entry.summary.id, archived.object
                    )),
                }
            }
            continue;
        }
        // The stage's DLQ as the daemon knows it now (it may have moved).
        let topic = match client.dlq_list(&pipeline, &stage, 1, &DlqFilter::default()) {
            Ok(list) => list.topic,
            Err(ClientError::Api { status, message }) if status.as_u16() == 404 => {
                report.skipped.push(format!(
                    "{} entries of {pipeline}/{stage}: {message}",
                    entries.len()
                ));
                continue;
            }
            Err(err) => return Err(err),
        };
        for chunk in entries.chunks(CHUNK) {
            let mut seqs = Vec::with_capacity(chunk.len());
            for archived in chunk {
                seqs.push(restore(client, &topic, &archived.entry)?);
            }
            let request = RedriveRequest {
                rate,
                filter: DlqFilter {
                    seq: seqs,
                    ..DlqFilter::default()
                },
                ..RedriveRequest::default()
            };
            let done = client.dlq_redrive(&pipeline, &stage, &request)?;
            report.redriven += done.redriven;
            report.ids.extend(done.ids);
            report
                .skipped
                .extend(done.skipped_entries.into_iter().map(|s| {
                    format!(
                        "{} (left in the DLQ of {pipeline}/{stage}): {}",
                        s.id, s.reason
                    )
                }));
        }
    }
    Ok(report)
}

/// The id a redrive of `entry` would publish (what the daemon's redrive
/// builds, `dlq::redrive_message`), for a dry run; None without full
/// provenance, which the daemon would skip too.
fn would_publish(entry: &DlqEntryDetail) -> Option<String> {
    let mut message =
        crate::broker::Message::new(entry.summary.id.clone(), entry.topic.clone(), Vec::new());
    message.headers.clone_from(&entry.headers);
    let provenance = crate::dlq::Provenance::read(&message)?;
    Some(crate::dlq::redrive_message(&message, &provenance).id)
}

/// Puts one archived entry back in its stage's DLQ; returns its seq there.
fn restore(client: &Client, topic: &str, entry: &DlqEntryDetail) -> Result<u64, ClientError> {
    let payload = match (&entry.payload, &entry.payload_base64) {
        (Some(text), _) => text.clone().into_bytes(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| {
                ClientError::Usage(format!(
                    "entry {}: its payload_base64 is not base64: {e}",
                    entry.summary.id
                ))
            })?,
        (None, None) => Vec::new(),
    };
    let receipt = client.publish(
        topic,
        Outgoing {
            payload,
            key: entry.summary.key.clone(),
            headers: entry.headers.clone(),
            id: Some(format!("{}~archived", entry.summary.id)),
            delay: None,
            deliver_at: None,
        },
    )?;
    Ok(receipt.seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry as `dlq show` prints it, with full provenance.
    fn entry(id: &str) -> String {
        let headers = [
            ("sluice-dlq-pipeline", "shop"),
            ("sluice-dlq-stage", "check"),
            ("sluice-dlq-source-topic", "in"),
            ("sluice-dlq-source-seq", "7"),
            ("sluice-dlq-original-id", id),
            ("sluice-dlq-attempts", "1"),
            ("sluice-dlq-kind", "rejected"),
            ("sluice-dlq-error", "no stock"),
            ("sluice-dlq-first-failure", "1"),
            ("sluice-dlq-last-failure", "2"),
        ];
        serde_json::json!({
            "seq": 1, "id": format!("{id}~dlq"), "kind": "rejected", "error": "no stock",
            "attempts": 1, "first_failure": 1, "last_failure": 2, "source_topic": "in",
            "source_seq": 7, "key": null, "payload_bytes": 2, "payload_preview": "{}",
            "topic": "shop.check.dlq", "headers": headers, "payload": "{}", "published_at": 3,
        })
        .to_string()
            + "\n"
    }

    #[test]
    fn what_an_archive_writes_in_each_compression_reads_back_in_order() {
        let dir = tempfile::tempdir().expect("dir");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        for (i, compression) in ["", "compression: gzip\n", "compression: zstd\n"]
            .iter()
            .enumerate()
        {
            let yaml = format!("store: 'file://{}'\n{compression}", dir.path().display());
            let archive: crate::config::Archive = serde_saphyr::from_str(&yaml).expect("block");
            let writer = crate::connect::archive::ArchiveWriter::open(&archive).expect("open");
            let object = runtime
                .block_on(writer.write(
                    &["shop", "check", &format!("d{i}")],
                    entry(&format!("m{i}")).as_bytes(),
                ))
                .expect("written");
            assert!(object.starts_with("file://"), "{object}");
        }
        let url = format!("file://{}", dir.path().display());
        let read = read(&ArchiveArgs::default(), &url).expect("read back");
        let ids: Vec<&str> = read.iter().map(|a| a.entry.summary.id.as_str()).collect();
        assert_eq!(ids, ["m0~dlq", "m1~dlq", "m2~dlq"]);
        assert_eq!(
            would_publish(&read[0].entry).as_deref(),
            Some("m0~r1@shop/check")
        );
        let bad = dir.path().join("shop/check/d0/bad.jsonl");
        std::fs::write(&bad, "{\"id\": 1}\n").expect("write");
        let Err(ClientError::Usage(why)) = super::read(&ArchiveArgs::default(), &url) else {
            panic!("a malformed line is refused");
        };
        assert!(why.contains("bad.jsonl:1: not a dead letter"), "{why}");
    }
}
