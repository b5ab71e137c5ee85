//! NATS KV as [`SharedRates`]: the buckets of stages' `rate` limits, one
//! entry per stage in the KV bucket `SLUICE_RATES`, so a limit holds for
//! every daemon on the server together.
//!
//! An entry holds the bucket's TAT (see [`crate::broker::rates`]) in
//! microseconds since the Unix epoch, as text. A reservation reads it and
//! writes the new TAT at the revision it read; a daemon that loses the
//! race reads again. The TAT is wall-clock time, so the daemons' clocks
//! must agree: a daemon whose clock runs ahead by `d` sees the bucket `d`
//! fuller than it is. The KV bucket is kept in memory (a server restart
//! refills every bucket) and its entries expire an hour after their last
//! write, as an idle bucket is full anyway.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, kv};
use async_trait::async_trait;
use bytes::Bytes;

use super::bucket::MemoryBucket;
use super::naming;
use crate::broker::BrokerError;
use crate::broker::rates::{Gcra, SharedRates};

/// The KV bucket of every stage's rate limit.
pub const RATES_BUCKET: &str = "SLUICE_RATES";

/// A reservation that loses the race re-reads and tries again, this many
/// times.
const MAX_RACES: usize = 16;

/// Shared rate buckets in a NATS KV bucket.
pub(super) struct NatsRates {
    bucket: MemoryBucket,
}

impl NatsRates {
    pub(super) fn new(js: jetstream::Context, replicas: usize) -> NatsRates {
        NatsRates {
            bucket: MemoryBucket::new(
                js,
                replicas,
                RATES_BUCKET,
                "sluice: the token buckets of stages' rate limits",
                Duration::from_secs(3600),
            ),
        }
    }
}

fn wall_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn kv_error(what: &str, err: &(impl std::fmt::Display + ?Sized)) -> BrokerError {
    BrokerError::Unavailable(format!("rate bucket {RATES_BUCKET}: {what}: {err}"))
}

#[async_trait]
impl SharedRates for NatsRates {
    async fn reserve(&self, name: &str, rule: Gcra, cost: u32) -> Result<Duration, BrokerError> {
        let store = self.bucket.store().await?;
        let key = naming::durable_name(name);
        for _ in 0..MAX_RACES {
            let (tat, revision) = match store
                .entry(&key)
                .await
                .map_err(|e| kv_error("reading", &e))?
            {
                Some(entry) if entry.operation == kv::Operation::Put => (
                    std::str::from_utf8(&entry.value)
                        .ok()
                        .and_then(|text| text.parse::<u64>().ok())
                        .unwrap_or(0),
                    entry.revision,
                ),
                Some(entry) => (0, entry.revision),
                None => (0, 0),
            };
            let now = wall_micros();
            let (at, next) = rule.reserve(tat, now, cost);
            let value = Bytes::from(next.to_string());
            let written = if revision == 0 {
                match store.create(&key, value).await {
                    Ok(_) => true,
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => false,
                    Err(e) => return Err(kv_error("creating", &e)),
                }
            } else {
                match store.update(&key, value, revision).await {
                    Ok(_) => true,
                    Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => false,
                    Err(e) => return Err(kv_error("updating", &e)),
                }
            };
            if written {
                return Ok(Duration::from_micros(at.saturating_sub(now)));
            }
        }
        Err(BrokerError::Unavailable(format!(
            "rate bucket {RATES_BUCKET}: {key} is written by too many daemons at once"
        )))
    }
}
