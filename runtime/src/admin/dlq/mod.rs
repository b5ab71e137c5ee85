//! The dead-letter tools: list, show, redrive and purge a stage's DLQ.
//!
//! A stage is addressed as `/v1/dlq/{pipeline}/{stage}`; its DLQ is
//! [`Stage::dlq_topic`](crate::config::Stage::dlq_topic). When several
//! stages share one DLQ topic, each sees only the entries whose provenance
//! names it (entries without provenance are shown to all of them).
//!
//! Redrive reads entries oldest first and, for each, publishes
//! [`dlq::redrive_message`] to the source topic and only then removes the
//! entry, so a crash in between leaves the entry in place; redoing it
//! publishes the same deterministic id, which the broker's duplicate window
//! drops. An entry without provenance cannot be routed back: it is skipped
//! with a reason and stays in the DLQ, never dropped.
//!
//! List, redrive and purge take a [`DlqFilter`] (`filter.rs`): by failure
//! kind, time dead-lettered, error text, header and key.

mod filter;

pub use filter::{DlqFilter, Matcher};

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::openapi::{BodyErrors, StageErrors, StagePath};
use super::topics::payload_fields;
use super::{AdminState, ApiError, StageEntry};
use crate::broker::{BrokerError, Message, Stored, now_millis};
use crate::dlq::{self, Provenance};

/// The slowest redrive rate taken, in messages per second: one a day.
const MIN_REDRIVE_RATE: f64 = 1.0 / 86_400.0;

/// Entries listed unless `limit` says otherwise.
const DEFAULT_LIST: usize = 100;
/// The most entries one list returns.
const MAX_LIST: usize = 1000;
/// Entries read from the broker at a time while scanning.
const PAGE: usize = 256;
/// Characters of a text payload shown in a list.
const PREVIEW_CHARS: usize = 80;
/// Entries a dry run shows in full besides counting them.
pub const SAMPLE: usize = 10;
/// Why an entry without provenance is skipped.
const NO_PROVENANCE: &str = "no DLQ provenance headers: cannot tell where to redrive it";

/// A DLQ entry in a list: where it came from and why it failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DlqEntry {
    /// Its sequence in the DLQ topic (what `show` takes).
    pub seq: u64,
    /// The entry's message id.
    pub id: String,
    /// The last failure's kind (`retry`, `rejected`, `trap`, ...).
    pub kind: Option<String>,
    /// The last failure's message.
    pub error: Option<String>,
    /// Attempts made before dead-lettering.
    pub attempts: Option<u32>,
    /// First failure, ms since the Unix epoch.
    pub first_failure: Option<u64>,
    /// Last failure, ms since the Unix epoch.
    pub last_failure: Option<u64>,
    /// The topic it was consumed from (where a redrive sends it).
    pub source_topic: Option<String>,
    /// Its sequence there.
    pub source_seq: Option<u64>,
    /// The message key.
    pub key: Option<String>,
    /// The W3C trace id of the message's `traceparent`, to find its trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Payload size in bytes.
    pub payload_bytes: u64,
    /// The start of a text payload, or `<N bytes, binary>`.
    pub payload_preview: String,
    /// Set when the entry cannot be redriven, saying why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// `GET /v1/dlq/{pipeline}/{stage}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DlqList {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
    /// The DLQ topic.
    pub topic: String,
    /// Messages in the DLQ topic.
    pub depth: u64,
    /// Entries, oldest first.
    pub entries: Vec<DlqEntry>,
}

/// `GET /v1/dlq/{pipeline}/{stage}/{seq}`: one entry in full.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DlqEntryDetail {
    /// The summary a list shows.
    #[serde(flatten)]
    pub summary: DlqEntry,
    /// The DLQ topic.
    pub topic: String,
    /// Every header, provenance included, in order.
    pub headers: Vec<(String, String)>,
    /// The payload, when it is UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The payload in standard base64, when it is not text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    /// When the entry was published to the DLQ, ms since the Unix epoch.
    pub published_at: u64,
}

/// The body of `POST .../redrive`; every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RedriveRequest {
    /// Redrive at most this many entries (default: all).
    pub limit: Option<u64>,
    /// At most this many messages per second (default: no limit), so a
    /// large redrive does not swamp the stage it feeds.
    pub rate: Option<f64>,
    /// Report what would be redriven without changing anything.
    pub dry_run: bool,
    /// Only the entries this takes (default: every entry).
    pub filter: DlqFilter,
}

/// An entry a redrive left in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SkippedEntry {
    /// Its sequence in the DLQ topic.
    pub seq: u64,
    /// Its message id.
    pub id: String,
    /// Why it was skipped.
    pub reason: String,
}

/// What a redrive did (or, dry, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RedriveReport {
    /// Whether this was a dry run (nothing changed).
    pub dry_run: bool,
    /// Entries published back to their source topic and removed.
    pub redriven: u64,
    /// Entries left in place; see `skipped_entries`.
    pub skipped: u64,
    /// The ids of the redriven messages, as published.
    pub ids: Vec<String>,
    /// The entries left in place and why.
    pub skipped_entries: Vec<SkippedEntry>,
    /// True when the daemon began shutting down before the redrive ended.
    pub interrupted: bool,
    /// True when the redrive stopped at its time limit
    /// ([`REDRIVE_TIME_LIMIT`]) with entries left: run it again to go on.
    #[serde(default)]
    pub time_limit_reached: bool,
    /// On a dry run, the first [`SAMPLE`] entries it would redrive.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sample: Vec<DlqEntry>,
}

/// The longest one redrive runs: past it the redrive stops after the entry
/// in hand and reports how far it got, so no single call holds its stage's
/// DLQ (or a client) for ever.
pub const REDRIVE_TIME_LIMIT: Duration = Duration::from_secs(300);

/// The body of `POST .../purge`: `{"limit": N}` or `{"all": true}`, and
/// optionally a filter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PurgeRequest {
    /// Purge the oldest N entries (that the filter takes).
    pub limit: Option<u64>,
    /// Purge every entry (that the filter takes). Required when `limit` is
    /// absent, so an empty request never deletes a whole DLQ.
    pub all: bool,
    /// Report what would be purged without deleting anything.
    pub dry_run: bool,
    /// Only the entries this takes (default: every entry).
    pub filter: DlqFilter,
}

/// What a purge removed (or, dry, would remove).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PurgeReport {
    /// Entries removed (or that would be).
    pub purged: u64,
    /// Whether this was a dry run (nothing deleted).
    #[serde(default)]
    pub dry_run: bool,
    /// On a dry run, the first [`SAMPLE`] entries it would delete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sample: Vec<DlqEntry>,
    /// With `dlq: {archive}`, the objects the purged entries were written
    /// to (JSON lines, as `dlq show` prints them) before they were deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub archived: Vec<String>,
}

/// The list's query string: `limit`, and the filter's fields by the same
/// names (`kind` and `header` may repeat). An unknown name is refused,
/// so a misspelt filter never lists everything.
fn list_query(query: Option<&str>) -> Result<(Option<usize>, DlqFilter), ApiError> {
    let mut limit = None;
    let mut filter = DlqFilter::default();
    for (name, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let value = value.into_owned();
        match &*name {
            "limit" => match value.parse() {
                Ok(n @ 1..=MAX_LIST) => limit = Some(n),
                _ => {
                    return Err(ApiError::BadRequest(format!(
                        "limit must be a whole number from 1 to {MAX_LIST}, not `{value}`"
                    )));
                }
            },
            "kind" => filter.kind.push(value),
            "header" => filter.header.push(value),
            "since" => filter.since = Some(value),
            "until" => filter.until = Some(value),
            "error" => filter.error = Some(value),
            "key" => filter.key = Some(value),
            "seq" => filter.seq.push(value.parse().map_err(|_| {
                ApiError::BadRequest(format!("seq must be a whole number, not `{value}`"))
            })?),
            other => {
                return Err(ApiError::BadRequest(format!(
                    "unknown query parameter `{other}`; a DLQ list takes limit, kind, since, \
                     until, error, header, key and seq"
                )));
            }
        }
    }
    Ok((limit, filter))
}

/// The filter checked against the clock now, or a 400 saying what is wrong.
fn matcher(filter: &DlqFilter) -> Result<Matcher, ApiError> {
    filter
        .resolve(now_millis())
        .map_err(|why| ApiError::BadRequest(format!("bad filter: {why}")))
}

/// The `{stage}` path parameter.
const STAGE_PATH: &str = "A stage of a loaded pipeline (a sink is a stage).";

/// `GET /v1/dlq/{pipeline}/{stage}`.
#[utoipa::path(get, path = "/v1/dlq/{pipeline}/{stage}", operation_id = "list_dead_letters", tag = "dlq",
    params(
        StagePath,
        ("limit" = Option<u64>, Query, minimum = 1, maximum = 1000,
            description = "At most this many entries (default 100)."),
        DlqFilter,
    ),
    responses(
        (status = 200, description = "The stage's entries that the filter takes, oldest first.",
            body = DlqList),
        StageErrors,
    ))]
pub(super) async fn list(
    State(state): State<AdminState>,
    path: Result<Path<StagePath>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<DlqList>, ApiError> {
    let Path(StagePath { pipeline, stage }) = path?;
    let (limit, filter) = list_query(query.as_deref())?;
    Ok(Json(
        state.dlq_list(&pipeline, &stage, limit, &filter).await?,
    ))
}

/// `GET /v1/dlq/{pipeline}/{stage}/{seq}`.
#[utoipa::path(get, path = "/v1/dlq/{pipeline}/{stage}/{seq}", operation_id = "show_dead_letter", tag = "dlq",
    params(
        ("pipeline" = String, Path, description = "A loaded pipeline."),
        ("stage" = String, Path, description = STAGE_PATH),
        ("seq" = u64, Path, description = "The entry's `seq`, as a list shows it."),
    ),
    responses(
        (status = 200, description = "The entry in full: payload, headers, provenance.",
            body = DlqEntryDetail),
        (status = 400, description = "The path is not valid.", body = super::ErrorBody),
        (status = 404, description = "No such stage, or no such entry in its DLQ.",
            body = super::ErrorBody),
        (status = 503, description = "The broker cannot answer now.", body = super::ErrorBody,
            headers(("Retry-After" = u32))),
    ))]
pub(super) async fn show(
    State(state): State<AdminState>,
    path: Result<Path<(String, String, u64)>, PathRejection>,
) -> Result<Json<DlqEntryDetail>, ApiError> {
    let Path((pipeline, stage, seq)) = path?;
    Ok(Json(state.dlq_show(&pipeline, &stage, seq).await?))
}

/// `POST /v1/dlq/{pipeline}/{stage}/redrive`.
#[utoipa::path(post, path = "/v1/dlq/{pipeline}/{stage}/redrive", operation_id = "redrive", tag = "dlq",
    description = "Publishes the entries the filter takes back to the topic they failed from, oldest first, each removed only once published; `dry_run` counts them and changes nothing. An empty body redrives everything.",
    params(StagePath),
    request_body(content = Option<RedriveRequest>, content_type = "application/json",
        description = "Optional: an empty body is `{}`."),
    responses(
        (status = 200, description = "What it did (or, dry, would do).", body = RedriveReport),
        StageErrors,
        BodyErrors,
    ))]
pub(super) async fn redrive(
    State(state): State<AdminState>,
    path: Result<Path<StagePath>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<RedriveReport>, ApiError> {
    let Path(StagePath { pipeline, stage }) = path?;
    // The stage first, so an unknown one is a 404 whatever the body.
    state.stage(&pipeline, &stage).await?;
    let request: RedriveRequest = json_body(&headers, body, state.body_limit)?;
    check_limit(request.limit)?;
    Ok(Json(state.dlq_redrive(&pipeline, &stage, &request).await?))
}

/// `POST /v1/dlq/{pipeline}/{stage}/purge`.
#[utoipa::path(post, path = "/v1/dlq/{pipeline}/{stage}/purge", operation_id = "purge", tag = "dlq",
    description = "Deletes the oldest `limit` entries, or with `all: true` every entry, that the filter takes; `dry_run` counts them and deletes nothing.",
    params(StagePath),
    request_body(content = PurgeRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "What it did (or, dry, would do).", body = PurgeReport),
        StageErrors,
        BodyErrors,
    ))]
pub(super) async fn purge(
    State(state): State<AdminState>,
    path: Result<Path<StagePath>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<PurgeReport>, ApiError> {
    let Path(StagePath { pipeline, stage }) = path?;
    state.stage(&pipeline, &stage).await?;
    let request: PurgeRequest = json_body(&headers, body, state.body_limit)?;
    check_limit(request.limit)?;
    Ok(Json(state.dlq_purge(&pipeline, &stage, &request).await?))
}

/// A body's `limit` within the document's `int64`, the range every JSON
/// client can send: a larger one is refused, not taken as "all".
fn check_limit(limit: Option<u64>) -> Result<(), ApiError> {
    match limit {
        Some(limit) if i64::try_from(limit).is_err() => Err(ApiError::BadRequest(format!(
            "limit {limit} is out of range; leave it out to take every entry"
        ))),
        _ => Ok(()),
    }
}

impl AdminState {
    /// Up to `limit` (default 100, at most 1000) of a stage's DLQ entries
    /// that `filter` takes, oldest first: what
    /// `GET /v1/dlq/{pipeline}/{stage}` answers.
    ///
    /// # Errors
    ///
    /// The stage is unknown, the filter is bad, or the broker failed.
    pub async fn dlq_list(
        &self,
        pipeline: &str,
        stage: &str,
        limit: Option<usize>,
        filter: &DlqFilter,
    ) -> Result<DlqList, ApiError> {
        let stage = self.stage(pipeline, stage).await?;
        let matcher = matcher(filter)?;
        let limit = limit.unwrap_or(DEFAULT_LIST).clamp(1, MAX_LIST);
        let depth = match self.broker().topic_stats(&stage.dlq_topic).await {
            Ok(stats) => stats.depth,
            Err(BrokerError::UnknownTopic(_)) => 0,
            Err(err) => return Err(err.into()),
        };
        let mut entries = Vec::new();
        let mut scan = Scan::snapshot(&stage, matcher, self).await?;
        'pages: while let Some(page) = scan.page(self).await? {
            for stored in page {
                if entries.len() >= limit {
                    break 'pages;
                }
                entries.push(summary(&stored));
            }
        }
        Ok(DlqList {
            pipeline: stage.pipeline.clone(),
            stage: stage.stage.clone(),
            topic: stage.dlq_topic.clone(),
            depth,
            entries,
        })
    }

    /// The stage's DLQ entry at `seq`, in full: what
    /// `GET /v1/dlq/{pipeline}/{stage}/{seq}` answers.
    ///
    /// # Errors
    ///
    /// The stage is unknown, it has no entry at `seq`, or the broker failed.
    pub async fn dlq_show(
        &self,
        pipeline: &str,
        stage: &str,
        seq: u64,
    ) -> Result<DlqEntryDetail, ApiError> {
        let stage = self.stage(pipeline, stage).await?;
        let found = match self
            .broker()
            .read(&stage.dlq_topic, seq, 1, Duration::ZERO)
            .await
        {
            Ok(found) => found,
            Err(BrokerError::UnknownTopic(_)) => Vec::new(),
            Err(err) => return Err(err.into()),
        };
        let stored = found
            .into_iter()
            .find(|s| s.seq == seq && belongs(&s.message, &stage))
            .ok_or_else(|| {
                ApiError::NotFound(format!(
                    "no entry with seq {seq} in the DLQ of {pipeline}/{}",
                    stage.stage
                ))
            })?;
        Ok(detail(&stage, &stored))
    }

    /// Publishes a stage's DLQ entries back to their source topics, oldest
    /// first, each removed after its publish (see the module docs): what
    /// `POST /v1/dlq/{pipeline}/{stage}/redrive` does.
    ///
    /// # Errors
    ///
    /// The stage is unknown, the rate is not positive, or the broker failed
    /// (the entries redriven before stay redriven).
    pub async fn dlq_redrive(
        &self,
        pipeline: &str,
        stage: &str,
        request: &RedriveRequest,
    ) -> Result<RedriveReport, ApiError> {
        let stage = self.stage(pipeline, stage).await?;
        let interval = match request.rate {
            None => None,
            // At least one a day: a slower rate's interval would not fit
            // a `Duration` (and would mean a redrive that never ends).
            Some(rate) if rate.is_finite() && rate >= MIN_REDRIVE_RATE => {
                Some(Duration::from_secs_f64(1.0 / rate))
            }
            Some(rate) => {
                return Err(ApiError::BadRequest(format!(
                    "rate must be a number of messages per second, at least one a day \
                     (0.0000116), not {rate}"
                )));
            }
        };
        let matcher = matcher(&request.filter)?;
        let limit = request.limit.unwrap_or(u64::MAX);
        let lock = self.dlq_lock(&stage);
        let _exclusive = lock.lock().await;
        let deadline = tokio::time::Instant::now() + self.redrive_time_limit;
        let mut report = RedriveReport {
            dry_run: request.dry_run,
            ..RedriveReport::default()
        };
        let mut last_publish: Option<Instant> = None;
        // Whether each source topic seen so far is one to publish to, so a
        // state without pipelines asks the broker once per topic.
        let mut sources: HashMap<String, bool> = HashMap::new();
        let mut scan = Scan::snapshot(&stage, matcher, self).await?;
        'pages: while report.redriven < limit {
            let Some(page) = scan.page(self).await? else {
                break;
            };
            for stored in page {
                if report.redriven >= limit {
                    break 'pages;
                }
                if tokio::time::Instant::now() >= deadline {
                    report.time_limit_reached = true;
                    break 'pages;
                }
                let entry = &stored.message;
                let Some(provenance) = Provenance::read(entry) else {
                    report.skip(&stored, NO_PROVENANCE.into());
                    continue;
                };
                let known = match sources.get(&provenance.source_topic) {
                    Some(&known) => known,
                    None => {
                        let known = match self.topic(&provenance.source_topic).await {
                            Ok(_) => true,
                            Err(ApiError::UnknownTopic(_) | ApiError::NoSuchTopic(_)) => false,
                            Err(err) => return Err(err),
                        };
                        sources.insert(provenance.source_topic.clone(), known);
                        known
                    }
                };
                if !known {
                    let reason = if self.inner.open {
                        format!(
                            "its source topic `{}` does not exist on the broker",
                            provenance.source_topic
                        )
                    } else {
                        format!(
                            "its source topic `{}` is not declared by the loaded pipelines",
                            provenance.source_topic
                        )
                    };
                    report.skip(&stored, reason);
                    continue;
                }
                let mut message = dlq::redrive_message(entry, &provenance);
                if stage.kind == "source" {
                    // A source's dead letter never reached the topic: it
                    // goes back as new, to every stage reading the topic.
                    message.headers.retain(|(name, _)| name != dlq::REDRIVE_TO);
                }
                if !request.dry_run {
                    if let (Some(interval), Some(last)) = (interval, last_publish) {
                        let wait = interval.saturating_sub(last.elapsed());
                        tokio::select! {
                            () = tokio::time::sleep(wait) => {}
                            () = self.shutting_down() => {
                                report.interrupted = true;
                                break 'pages;
                            }
                            () = tokio::time::sleep_until(deadline) => {
                                report.time_limit_reached = true;
                                break 'pages;
                            }
                        }
                    }
                    last_publish = Some(Instant::now());
                    publish_then_remove(self, &stage, &stored, message.clone())
                        .await
                        .inspect_err(|err| {
                            tracing::warn!(
                                "redrive of {}/{} stopped after {} messages: {err}",
                                stage.pipeline,
                                stage.stage,
                                report.redriven
                            );
                        })?;
                }
                if request.dry_run && report.sample.len() < SAMPLE {
                    report.sample.push(summary(&stored));
                }
                report.redriven += 1;
                report.ids.push(message.id);
            }
        }
        if !request.dry_run && (report.redriven > 0 || report.skipped > 0) {
            tracing::info!(
                redriven = report.redriven,
                skipped = report.skipped,
                "redrive from the DLQ of {}/{}",
                stage.pipeline,
                stage.stage,
            );
        }
        Ok(report)
    }

    /// Deletes the oldest `limit` of a stage's DLQ entries that the
    /// request's filter takes, or all of them: what
    /// `POST /v1/dlq/{pipeline}/{stage}/purge` does.
    ///
    /// # Errors
    ///
    /// The stage is unknown, the request says neither or both of `limit`
    /// and `all`, the filter is bad, or the broker failed.
    pub async fn dlq_purge(
        &self,
        pipeline: &str,
        stage: &str,
        request: &PurgeRequest,
    ) -> Result<PurgeReport, ApiError> {
        let stage = self.stage(pipeline, stage).await?;
        let limit = match (request.limit, request.all) {
            (Some(limit), false) => limit,
            (None, true) => u64::MAX,
            (Some(_), true) => {
                return Err(ApiError::BadRequest("give limit or all, not both".into()));
            }
            (None, false) => {
                return Err(ApiError::BadRequest(
                    "say how much to purge: {\"limit\": N} for the oldest N entries, or {\"all\": true}"
                        .into(),
                ));
            }
        };
        let matcher = matcher(&request.filter)?;
        let lock = self.dlq_lock(&stage);
        let _exclusive = lock.lock().await;
        let mut report = PurgeReport {
            dry_run: request.dry_run,
            ..PurgeReport::default()
        };
        // With an archive, entries are written before they are deleted:
        // the store is opened first, so one that is refused deletes nothing.
        let mut archive = match (&stage.archive, request.dry_run) {
            (Some(archive), false) => Some(Held::open(archive)?),
            _ => None,
        };
        let mut scan = Scan::snapshot(&stage, matcher, self).await?;
        while report.purged + archive.as_ref().map_or(0, Held::len) < limit {
            let Some(page) = scan.page(self).await? else {
                break;
            };
            let held = archive.as_ref().map_or(0, Held::len);
            let room = usize::try_from(limit - report.purged - held).unwrap_or(usize::MAX);
            let taken = &page[..room.min(page.len())];
            if taken.is_empty() {
                continue;
            }
            if request.dry_run {
                let room = SAMPLE.saturating_sub(report.sample.len());
                report.sample.extend(taken.iter().take(room).map(summary));
                report.purged += taken.len() as u64;
                continue;
            }
            match &mut archive {
                Some(held) => {
                    held.hold(&stage, taken);
                    if held.full() {
                        report.purged += held.flush(self, &stage, report.purged).await?;
                    }
                }
                None => {
                    let seqs: Vec<u64> = taken.iter().map(|s| s.seq).collect();
                    report.purged += self.broker().remove(&stage.dlq_topic, &seqs).await?;
                }
            }
        }
        if let Some(held) = &mut archive {
            report.purged += held.flush(self, &stage, report.purged).await?;
            report.archived = std::mem::take(&mut held.objects);
        }
        if report.purged > 0 && !request.dry_run {
            tracing::info!(
                purged = report.purged,
                "purge of the DLQ of {}/{}",
                stage.pipeline,
                stage.stage
            );
        }
        Ok(report)
    }
}

/// Entries a purge will delete once its archive holds them: written as
/// one object per [`ARCHIVE_ENTRIES`] entries or [`ARCHIVE_BYTES`] bytes of
/// lines (so a large purge neither holds the whole DLQ in memory nor
/// writes thousands of tiny objects), and removed only after the object
/// is complete.
struct Held {
    writer: crate::connect::archive::ArchiveWriter,
    lines: Vec<u8>,
    seqs: Vec<u64>,
    /// The objects written so far.
    objects: Vec<String>,
}

/// Most entries in one archive object.
const ARCHIVE_ENTRIES: usize = 10_000;
/// Most bytes of JSON lines in one archive object (before compression).
const ARCHIVE_BYTES: usize = 32 << 20;

impl Held {
    fn open(archive: &crate::config::Archive) -> Result<Self, ApiError> {
        let writer = crate::connect::archive::ArchiveWriter::open(archive).map_err(|e| {
            ApiError::Unavailable(format!(
                "{e}; nothing was purged (the DLQ is archived first)"
            ))
        })?;
        Ok(Held {
            writer,
            lines: Vec::new(),
            seqs: Vec::new(),
            objects: Vec::new(),
        })
    }

    fn len(&self) -> u64 {
        self.seqs.len() as u64
    }

    fn full(&self) -> bool {
        self.seqs.len() >= ARCHIVE_ENTRIES || self.lines.len() >= ARCHIVE_BYTES
    }

    /// Adds entries as `dlq show` prints them, one JSON line each.
    fn hold(&mut self, stage: &StageEntry, taken: &[Stored]) {
        for stored in taken {
            self.lines.extend(archive_line(&stage.dlq_topic, stored));
            self.seqs.push(stored.seq);
        }
    }

    /// Writes what is held as one object, then removes those entries;
    /// returns how many went. A store that refuses removes nothing and
    /// says so, with how many earlier objects' entries were purged.
    async fn flush(
        &mut self,
        state: &AdminState,
        stage: &StageEntry,
        purged_before: u64,
    ) -> Result<u64, ApiError> {
        if self.seqs.is_empty() {
            return Ok(0);
        }
        let parts = [
            stage.pipeline.as_str(),
            stage.stage.as_str(),
            &crate::connect::archive::today(),
        ];
        let object = self.writer.write(&parts, &self.lines).await.map_err(|e| {
            tracing::warn!(
                "purge of the DLQ of {}/{} stopped: {e}",
                stage.pipeline,
                stage.stage
            );
            ApiError::Unavailable(format!(
                "{e}; those entries were not purged (the DLQ is archived first){}",
                if purged_before > 0 {
                    format!(", and the {purged_before} before them were archived and purged")
                } else {
                    String::new()
                }
            ))
        })?;
        self.objects.push(object);
        self.lines.clear();
        let seqs = std::mem::take(&mut self.seqs);
        Ok(state.broker().remove(&stage.dlq_topic, &seqs).await?)
    }
}

/// Publishes one redriven message, then removes its DLQ entry: in that
/// order, so a failure in between duplicates (harmlessly, by id) rather than
/// loses it.
async fn publish_then_remove(
    state: &AdminState,
    stage: &StageEntry,
    stored: &Stored,
    message: Message,
) -> Result<(), ApiError> {
    let topic = message.topic.clone();
    let acks = state.broker().publish(vec![message]).await?;
    if acks.first().is_some_and(|ack| !ack.duplicate) {
        state.metrics().count_published(&topic, 1);
    }
    state
        .broker()
        .remove(&stage.dlq_topic, &[stored.seq])
        .await?;
    Ok(())
}

impl RedriveReport {
    fn skip(&mut self, stored: &Stored, reason: String) {
        self.skipped += 1;
        self.skipped_entries.push(SkippedEntry {
            seq: stored.seq,
            id: stored.message.id.clone(),
            reason,
        });
    }
}

/// Walks a stage's DLQ entries that a filter takes, oldest first, a page
/// at a time.
struct Scan<'a> {
    stage: &'a StageEntry,
    matcher: Matcher,
    next: u64,
    /// The last seq to visit (inclusive).
    until: u64,
}

impl<'a> Scan<'a> {
    /// A scan of the entries that are in the DLQ now. A redrive uses it: a
    /// redriven message that fails again lands back in the DLQ while the
    /// redrive is still running, and must not be picked up by the same
    /// redrive (that would loop until the rate limit or the attempts ran out).
    async fn snapshot(
        stage: &'a StageEntry,
        matcher: Matcher,
        state: &AdminState,
    ) -> Result<Self, ApiError> {
        let until = match state.broker().topic_stats(&stage.dlq_topic).await {
            Ok(stats) => stats.last_seq,
            Err(BrokerError::UnknownTopic(_)) => 0,
            Err(err) => return Err(err.into()),
        };
        Ok(Scan {
            stage,
            matcher,
            next: 1,
            until,
        })
    }

    /// The next page of this stage's entries (possibly empty when another
    /// stage's entries filled it); None at the end.
    async fn page(&mut self, state: &AdminState) -> Result<Option<Vec<Stored>>, ApiError> {
        if self.next > self.until {
            return Ok(None);
        }
        let page = match state
            .broker()
            .read(&self.stage.dlq_topic, self.next, PAGE, Duration::ZERO)
            .await
        {
            Ok(page) => page,
            // Not declared yet: nothing was ever dead-lettered there.
            Err(BrokerError::UnknownTopic(_)) => return Ok(None),
            Err(err) => return Err(err.into()),
        };
        let Some(last) = page.last() else {
            return Ok(None);
        };
        self.next = last.seq + 1;
        let until = self.until;
        Ok(Some(
            page.into_iter()
                .filter(|s| {
                    s.seq <= until
                        && belongs(&s.message, self.stage)
                        && self.matcher.matches(s.seq, &s.message)
                })
                .collect(),
        ))
    }
}

/// Whether a DLQ entry is this stage's: its provenance names the stage, or
/// it has none to say otherwise.
fn belongs(entry: &Message, stage: &StageEntry) -> bool {
    match (entry.header(dlq::PIPELINE), entry.header(dlq::STAGE)) {
        (Some(pipeline), Some(name)) => pipeline == stage.pipeline && name == stage.stage,
        _ => true,
    }
}

/// An entry in full, as `dlq show` prints it and an archive keeps it.
fn detail(stage: &StageEntry, stored: &Stored) -> DlqEntryDetail {
    detail_in(&stage.dlq_topic, stored)
}

/// An entry of DLQ topic `topic` in full.
fn detail_in(topic: &str, stored: &Stored) -> DlqEntryDetail {
    let m = &stored.message;
    let (payload, payload_base64) = payload_fields(&m.payload);
    DlqEntryDetail {
        summary: summary(stored),
        topic: topic.to_owned(),
        headers: m.headers.clone(),
        payload,
        payload_base64,
        published_at: m.published_at,
    }
}

/// A dead letter of DLQ topic `topic` as one archive line: the entry as
/// `dlq show` prints it, then `\n`. The retention archiver of a DLQ topic
/// writes these (the daemon hands it this), so every archived dead letter
/// reads the same, whether a purge or retention removed it, and
/// `dlq redrive --from-archive` takes both.
pub fn archive_line(topic: &str, stored: &Stored) -> Vec<u8> {
    // A struct of strings and numbers: serialising cannot fail.
    let mut line = serde_json::to_vec(&detail_in(topic, stored)).unwrap_or_default();
    line.push(b'\n');
    line
}

fn summary(stored: &Stored) -> DlqEntry {
    let m = &stored.message;
    let num = |name: &str| m.header(name).and_then(|v| v.parse::<u64>().ok());
    DlqEntry {
        seq: stored.seq,
        id: m.id.clone(),
        kind: m.header(dlq::KIND).map(str::to_owned),
        error: m.header(dlq::ERROR).map(str::to_owned),
        attempts: m.header(dlq::ATTEMPTS).and_then(|v| v.parse().ok()),
        first_failure: num(dlq::FIRST_FAILURE),
        last_failure: num(dlq::LAST_FAILURE),
        source_topic: m.header(dlq::SOURCE_TOPIC).map(str::to_owned),
        source_seq: num(dlq::SOURCE_SEQ),
        key: m.key.clone(),
        trace_id: crate::trace::trace_id(&m.headers),
        payload_bytes: m.payload.len() as u64,
        payload_preview: preview(&m.payload),
        problem: Provenance::read(m)
            .is_none()
            .then(|| NO_PROVENANCE.to_owned()),
    }
}

fn preview(payload: &[u8]) -> String {
    match std::str::from_utf8(payload) {
        Ok(text) => {
            let mut chars = text.chars();
            let head: String = chars.by_ref().take(PREVIEW_CHARS).collect();
            if chars.next().is_some() {
                format!("{head}…")
            } else {
                head
            }
        }
        Err(_) => format!("<{} bytes, binary>", payload.len()),
    }
}

/// Parses an optional JSON body: empty (with no content type) means every
/// default, so `curl -X POST` with no body works. A body, or a content
/// type, must be `application/json`: a browser's form-encoded or
/// `text/plain` post (no CORS preflight) is refused with 415.
pub(super) fn json_body<T: DeserializeOwned + Default>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<T, ApiError> {
    let content_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let body = body.map_err(|r| ApiError::from_body(r, limit))?;
    let json = content_type.as_deref().map(|v| {
        let essence = v.split(';').next().unwrap_or_default().trim();
        essence.eq_ignore_ascii_case("application/json")
            || essence
                .rsplit_once('+')
                .is_some_and(|(_, suffix)| suffix.eq_ignore_ascii_case("json"))
    });
    match (json, body.is_empty()) {
        (Some(true), _) | (None, true) => {}
        (Some(false), _) | (None, false) => {
            return Err(ApiError::NotJson(
                content_type.map_or_else(|| "(none)".to_owned(), |v| format!("`{v}`")),
            ));
        }
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    // `null` is "no body" too: the document calls the body optional, which
    // JSON clients (and OpenAPI 3.1) spell as null as often as empty.
    serde_json::from_slice::<Option<T>>(&body)
        .map(Option::unwrap_or_default)
        .map_err(|e| ApiError::BadRequest(format!("the request body is not valid: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previews_are_short_and_binary_safe() {
        assert_eq!(preview(b"hello"), "hello");
        let long = "é".repeat(100);
        let p = preview(long.as_bytes());
        assert_eq!(p.chars().count(), PREVIEW_CHARS + 1);
        assert!(p.ends_with('…'));
        assert_eq!(preview(&[0xff, 0xfe]), "<2 bytes, binary>");
    }

    #[test]
    fn request_bodies_default_when_empty_and_reject_typos() {
        let json = {
            let mut h = HeaderMap::new();
            h.insert(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            );
            h
        };
        let r: RedriveRequest =
            json_body(&HeaderMap::new(), Ok(Bytes::new()), 10).expect("empty is defaults");
        assert_eq!(r, RedriveRequest::default());
        let r: RedriveRequest = json_body(
            &json,
            Ok(Bytes::from_static(br#"{"dry_run":true,"limit":2}"#)),
            100,
        )
        .expect("valid");
        assert!(r.dry_run && r.limit == Some(2));
        assert!(
            json_body::<RedriveRequest>(&json, Ok(Bytes::from_static(br#"{"dryrun":true}"#)), 100)
                .is_err()
        );
        // A body without a JSON content type (a browser's text/plain post).
        let err = json_body::<PurgeRequest>(
            &HeaderMap::new(),
            Ok(Bytes::from_static(br#"{"all":true}"#)),
            100,
        )
        .expect_err("untyped body");
        assert_eq!(err.status(), 415);
    }
}
