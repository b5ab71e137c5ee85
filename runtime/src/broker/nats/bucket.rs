//! A small in-memory KV bucket the daemons on one server share (rate
//! limits, configuration versions): created on first use, one value per
//! key, entries expiring `max_age` after their last write.

use std::time::Duration;

use async_nats::jetstream::{self, kv};

use crate::broker::BrokerError;

/// A shared in-memory KV bucket, opened (created or updated) on first use.
pub(super) struct MemoryBucket {
    js: jetstream::Context,
    replicas: usize,
    name: &'static str,
    description: &'static str,
    max_age: Duration,
    store: tokio::sync::OnceCell<kv::Store>,
}

impl MemoryBucket {
    pub(super) fn new(
        js: jetstream::Context,
        replicas: usize,
        name: &'static str,
        description: &'static str,
        max_age: Duration,
    ) -> MemoryBucket {
        MemoryBucket {
            js,
            replicas,
            name,
            description,
            max_age,
            store: tokio::sync::OnceCell::new(),
        }
    }

    /// The bucket, created (or its settings updated) on the first call.
    pub(super) async fn store(&self) -> Result<&kv::Store, BrokerError> {
        self.store
            .get_or_try_init(|| async {
                self.js
                    .create_or_update_key_value(kv::Config {
                        bucket: self.name.to_owned(),
                        description: self.description.to_owned(),
                        history: 1,
                        max_age: self.max_age,
                        storage: jetstream::stream::StorageType::Memory,
                        num_replicas: self.replicas,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| {
                        BrokerError::Unavailable(format!("KV bucket {}: creating: {e}", self.name))
                    })
            })
            .await
    }
}
