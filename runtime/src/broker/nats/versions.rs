//! NATS KV as [`SharedVersions`]: one entry per daemon in the KV bucket
//! `SLUICE_DAEMONS`, its configuration version and since when, as JSON.
//! Kept in memory; an entry expires [`ANNOUNCEMENT_TTL`] after its last
//! write, so a daemon killed outright stops counting within that.

use async_nats::jetstream::{self, kv};
use async_trait::async_trait;
use futures_util::StreamExt;

use crate::broker::BrokerError;
use crate::broker::versions::{ANNOUNCEMENT_TTL, Announcement, SharedVersions};

/// The KV bucket of daemons' configuration versions.
pub const DAEMONS_BUCKET: &str = "SLUICE_DAEMONS";

/// Daemons' announcements in a NATS KV bucket.
pub(super) struct NatsVersions {
    js: jetstream::Context,
    replicas: usize,
    store: tokio::sync::OnceCell<kv::Store>,
}

impl NatsVersions {
    pub(super) fn new(js: jetstream::Context, replicas: usize) -> NatsVersions {
        NatsVersions {
            js,
            replicas,
            store: tokio::sync::OnceCell::new(),
        }
    }

    async fn store(&self) -> Result<&kv::Store, BrokerError> {
        self.store
            .get_or_try_init(|| async {
                self.js
                    .create_or_update_key_value(kv::Config {
                        bucket: DAEMONS_BUCKET.to_owned(),
                        description: "sluice: the configuration version each daemon runs".into(),
                        history: 1,
                        max_age: ANNOUNCEMENT_TTL,
                        storage: jetstream::stream::StorageType::Memory,
                        num_replicas: self.replicas,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| unavailable("creating", &e))
            })
            .await
    }
}

fn unavailable(what: &str, err: &(impl std::fmt::Display + ?Sized)) -> BrokerError {
    BrokerError::Unavailable(format!("daemons bucket {DAEMONS_BUCKET}: {what}: {err}"))
}

#[async_trait]
impl SharedVersions for NatsVersions {
    async fn announce(&self, announcement: &Announcement) -> Result<(), BrokerError> {
        let value = serde_json::to_vec(announcement).map_err(|e| unavailable("encoding", &e))?;
        self.store()
            .await?
            .put(&announcement.daemon, value.into())
            .await
            .map_err(|e| unavailable("writing", &e))?;
        Ok(())
    }

    async fn all(&self) -> Result<Vec<Announcement>, BrokerError> {
        let store = self.store().await?;
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
