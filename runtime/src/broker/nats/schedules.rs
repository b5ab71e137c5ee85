//! When a topic's next delayed message is due, on NATS.
//!
//! Delayed messages are JetStream message schedules in the topic's stream
//! ([`naming::delay_subjects`]), each with its due time in its
//! `Nats-Schedule` header (`@at <RFC 3339>`), and the server does not say
//! which is earliest. So the earliest is found by reading the schedules'
//! headers (an ephemeral ordered consumer, headers only), up to
//! [`SCAN_MAX`] of them, and kept for [`FRESH`]: `status` and `/metrics`
//! ask for it on every stage every few seconds. Past [`SCAN_MAX`] it is
//! not known (`None`); a delayed message published with an earlier time
//! shows within [`FRESH`], and once the time read has passed the next one
//! shows within [`MIN_GAP`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::stream::Stream;
use futures_util::StreamExt;

use super::naming;
use crate::broker::now_millis;

/// The most schedules read to find the earliest (about 150 bytes of
/// headers each, so about 1.5 MB on the wire at most).
pub const SCAN_MAX: u64 = 10_000;
/// How long an answer is kept, unless its time has passed.
const FRESH: Duration = Duration::from_secs(10);
/// The least time between two reads of one topic's schedules, even when
/// the time read has passed (a steady flow of delays would otherwise read
/// them on every ask).
const MIN_GAP: Duration = Duration::from_secs(5);
/// A read that takes longer gives up: the time is then not known.
const SCAN_LIMIT: Duration = Duration::from_secs(2);

/// The earliest due time of each topic's schedules, as last read.
#[derive(Default)]
pub struct NextDue {
    known: Mutex<HashMap<String, (Instant, Option<u64>)>>,
}

impl NextDue {
    /// When the earliest of `topic`'s `delayed` schedules is due (ms since
    /// the epoch), if known.
    pub async fn get(&self, stream: &Stream, topic: &str, delayed: u64) -> Option<u64> {
        if delayed == 0 || delayed > SCAN_MAX {
            return None;
        }
        let cached = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(topic)
            .copied();
        if let Some((read_at, due)) = cached {
            let passed = due.is_some_and(|due| due <= now_millis());
            let age = read_at.elapsed();
            if age < MIN_GAP || (age < FRESH && !passed) {
                return due;
            }
        }
        let due = earliest(stream, topic).await;
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(topic.to_owned(), (Instant::now(), due));
        due
    }
}

/// Reads the headers of every schedule of `topic` and returns the earliest
/// due time; `None` if there are none, or reading failed or took too long.
async fn earliest(stream: &Stream, topic: &str) -> Option<u64> {
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: naming::delay_subjects(topic),
            headers_only: true,
            ..Default::default()
        })
        .await
        .ok()?;
    let name = consumer.cached_info().name.clone();
    let read = async {
        let mut messages = consumer.messages().await.ok()?;
        let mut earliest: Option<u64> = None;
        let mut seen = 0u64;
        while let Some(message) = messages.next().await {
            let message = message.ok()?;
            let due = message
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Schedule"))
                .and_then(|v| v.as_str().strip_prefix("@at "))
                .and_then(|at| crate::timestamp::parse_rfc3339_millis(at).ok());
            if let Some(due) = due {
                earliest = Some(earliest.map_or(due, |e| e.min(due)));
            }
            seen += 1;
            let pending = message.info().map(|i| i.pending).unwrap_or(0);
            if pending == 0 || seen >= SCAN_MAX {
                break;
            }
        }
        earliest
    };
    let earliest = tokio::time::timeout(SCAN_LIMIT, read).await.ok().flatten();
    // Ephemeral, so the server would drop it once idle; sooner is tidier.
    let _ = stream.delete_consumer(&name).await;
    earliest
}
