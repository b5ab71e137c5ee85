//! The retention sweeper of `file://` claim stores.
//!
//! Objects are never deleted when a message is acked: a fan-out topic's
//! other stages, a dead letter and its redrive may still need them. Instead
//! the daemon runs this task: every [`sweep_period`] it lists each
//! `file://` store's objects older than the store's retention and, if
//! there are any, collects every reference still held by a stored message
//! (claim-checked topics and dead-letter topics, read through
//! [`Broker::read`]) and deletes the old objects nobody references.
//!
//! Read order closes the races with messages moving while we read: DLQ
//! topics, then the other topics, then the DLQ topics again. A dead letter
//! (topic → DLQ) is seen in the topic or in the second DLQ pass; a redrive
//! (publish to the topic, then remove from the DLQ) in the first DLQ pass
//! or in the topic. A new object is never old, so a message being
//! published is safe too.
//!
//! Only objects under the topics this daemon claim-checks (keys are
//! `<topic>/<id>`) are considered: daemons with other pipelines may share
//! the directory, and the references to their objects are in topics and
//! dead-letter queues this daemon does not read.
//!
//! S3 stores are not swept: set a lifecycle rule on the bucket (`docs/claim-check.md`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use super::{CLAIM_HEADER, ClaimError, ClaimStore, Claims};
use crate::broker::Broker;

/// What one sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepReport {
    /// Objects older than their retention that were deleted.
    pub deleted: usize,
    /// Objects older than their retention that are still referenced.
    pub kept: usize,
}

/// How often the sweeper runs for a retention: a tenth of it, between one
/// second and one hour.
pub fn sweep_period(retention: Duration) -> Duration {
    (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

/// The `file://` stores and the longest retention any topic asks of each
/// (an object is kept as long as the most patient topic wants).
fn file_stores(claims: &Claims) -> Vec<(Arc<ClaimStore>, Duration)> {
    let mut out: Vec<(Arc<ClaimStore>, Duration)> = Vec::new();
    for (_, policy) in claims.policies() {
        if policy.store.root().is_none() {
            continue;
        }
        match out.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &policy.store)) {
            Some((_, retention)) => *retention = (*retention).max(policy.retention),
            None => out.push((policy.store.clone(), policy.retention)),
        }
    }
    out
}

/// One sweep of every `file://` store. `topics` are the topics whose
/// messages may hold references (the claim-checked ones), `dlqs` the
/// dead-letter topics.
///
/// # Errors
///
/// A store or the broker failed; nothing more is deleted in this sweep.
pub async fn sweep(
    claims: &Claims,
    broker: &dyn Broker,
    topics: &[String],
    dlqs: &[String],
) -> Result<SweepReport, ClaimError> {
    let now = SystemTime::now();
    let owned: HashSet<&str> = claims.policies().map(|(topic, _)| topic).collect();
    let mut candidates: Vec<(Arc<ClaimStore>, Vec<String>)> = Vec::new();
    for (store, retention) in file_stores(claims) {
        let cutoff = now.checked_sub(retention).unwrap_or(SystemTime::UNIX_EPOCH);
        let mut old = store.list_older_than(cutoff).await?;
        old.retain(|key| {
            key.split('/')
                .next()
                .is_some_and(|topic| owned.contains(topic))
        });
        if !old.is_empty() {
            candidates.push((store, old));
        }
    }
    let mut report = SweepReport::default();
    if candidates.is_empty() {
        return Ok(report);
    }
    let mut referenced = HashSet::new();
    for topic in dlqs.iter().chain(topics).chain(dlqs) {
        collect_references(broker, topic, &mut referenced).await?;
    }
    for (store, old) in candidates {
        for key in old {
            if referenced.contains(&store.reference(&key)) {
                report.kept += 1;
            } else {
                store.delete(&key).await?;
                report.deleted += 1;
            }
        }
    }
    Ok(report)
}

/// Adds the claim reference of every message stored in `topic`.
async fn collect_references(
    broker: &dyn Broker,
    topic: &str,
    into: &mut HashSet<String>,
) -> Result<(), ClaimError> {
    const PAGE: usize = 1000;
    let mut from = 0;
    loop {
        let page = match broker.read(topic, from, PAGE, Duration::ZERO).await {
            Ok(page) => page,
            // Not declared (yet): it holds nothing.
            Err(crate::broker::BrokerError::UnknownTopic(_)) => return Ok(()),
            Err(err) => return Err(ClaimError::Store(format!("reading `{topic}`: {err}"))),
        };
        let Some(last) = page.last().map(|s| s.seq) else {
            return Ok(());
        };
        for stored in &page {
            for (name, value) in &stored.message.headers {
                if name == CLAIM_HEADER {
                    into.insert(value.clone());
                }
            }
        }
        if page.len() < PAGE {
            return Ok(());
        }
        from = last + 1;
    }
}

/// Runs [`sweep`] every [`sweep_period`] of the shortest retention until
/// `stop` turns true. Does nothing when there is no `file://` store.
pub async fn sweeper(
    claims: Arc<Claims>,
    broker: Arc<dyn Broker>,
    topics: Vec<String>,
    dlqs: Vec<String>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(shortest) = file_stores(&claims).iter().map(|(_, r)| *r).min() else {
        return;
    };
    let mut ticker = tokio::time::interval(sweep_period(shortest));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        match sweep(&claims, broker.as_ref(), &topics, &dlqs).await {
            Ok(report) if report.deleted > 0 || report.kept > 0 => tracing::info!(
                deleted = report.deleted,
                kept = report.kept,
                "claim sweep: removed unreferenced objects past their retention"
            ),
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(error = %err, "claim sweep failed; trying again next period")
            }
        }
    }
}
