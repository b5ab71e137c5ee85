//! NATS KV as [`SharedVersions`]: one entry per daemon in the KV bucket
//! `SLUICE_DAEMONS`, its configuration version and since when, as JSON.
//! Kept in memory; an entry expires [`ANNOUNCEMENT_TTL`] after its last
//! write, so a daemon killed outright stops counting within that.

use async_nats::jetstream;
use async_trait::async_trait;
use futures_util::StreamExt;

use super::bucket::MemoryBucket;
use crate::broker::BrokerError;
use crate::broker::versions::{ANNOUNCEMENT_TTL, Announcement, SharedVersions};

/// The KV bucket of daemons' configuration versions.
pub const DAEMONS_BUCKET: &str = "SLUICE_DAEMONS";

/// Daemons' announcements in a NATS KV bucket.
pub(super) struct NatsVersions {
    bucket: MemoryBucket,
}

impl NatsVersions {
    pub(super) fn new(js: jetstream::Context, replicas: usize) -> NatsVersions {
        NatsVersions {
            bucket: MemoryBucket::new(
                js,
                replicas,
                DAEMONS_BUCKET,
                "sluice: the configuration version each daemon runs",
                ANNOUNCEMENT_TTL,
            ),
        }
    }
}

fn unavailable(what: &str, err: &(impl std::fmt::Display + ?Sized)) -> BrokerError {
    BrokerError::Unavailable(format!("daemons bucket {DAEMONS_BUCKET}: {what}: {err}"))
}

#[async_trait]
impl SharedVersions for NatsVersions {
    async fn announce(&self, announcement: &Announcement) -> Result<(), BrokerError> {
        let value = serde_json::to_vec(announcement).map_err(|e| unavailable("encoding", &e))?;
        self.bucket
            .store()
            .await?
            .put(&announcement.daemon, value.into())
            .await
            .map_err(|e| unavailable("writing", &e))?;
        Ok(())
    }

    async fn all(&self) -> Result<Vec<Announcement>, BrokerError> {
        let store = self.bucket.store().await?;
        let mut keys = store.keys().await.map_err(|e| unavailable("listing", &e))?;
        let mut out = Vec::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(|e| unavailable("listing", &e))?;
            let Some(value) = store
                .get(&key)
                .await
                .map_err(|e| unavailable("reading", &e))?
            else {
                continue;
            };
            // An entry this version cannot read is another version's: skip.
            if let Ok(announcement) = serde_json::from_slice::<Announcement>(&value) {
                out.push(announcement);
            }
        }
        Ok(out)
    }
}
