//! NATS KV as an [`IdempotencyStore`]: one bucket per stage,
//! `SLUICE_DEDUP_<durable>`, whose max age is the stage's `dedup.ttl`.
//!
//! Keys are the hex digest (SHA-256) of the dedup key (KV keys allow few
//! characters). Every write is conditional: a begin creates the key if
//! absent or updates it at the revision it read, so two daemons racing for
//! one key cannot both take it; completing updates at the revision the
//! begin wrote. Unlike the embedded store, the COMPLETED record cannot
//! share a transaction with the outputs: they are published (PubAcks
//! awaited) first, then the record is written, then the delivery acked. A
//! crash in between leaves IN_PROGRESS, whose lease runs out, and the
//! handler runs again with the same output ids, which the streams'
//! duplicate window drops.

use std::time::Duration;

use async_nats::jetstream::kv;
use async_trait::async_trait;
use bytes::Bytes;

use super::{NatsBroker, naming, read, write};
use crate::broker::Ticket;
use crate::broker::idempotency::{self, Begin, BeginRequest, IdempotencyStore, Record};
use crate::broker::{Broker, BrokerError, Message, Receipt, now_millis};

/// A begin that loses a race re-reads and decides again, this many times.
const MAX_RACES: usize = 8;

/// The largest record written; a COMPLETED record whose outputs would make
/// it bigger is written without them (the NATS default max_payload is 1 MB).
const MAX_RECORD_BYTES: usize = 512 * 1024;

/// The KV bucket of a stage's dedup records.
pub(super) fn bucket_name(scope: &str) -> String {
    format!("SLUICE_DEDUP_{}", naming::durable_name(scope))
}

fn kv_key(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn kv_error(what: &str, err: &(impl std::fmt::Display + ?Sized)) -> BrokerError {
    BrokerError::Unavailable(format!("dedup store: {what}: {err}"))
}

fn encode(record: &Record) -> Result<Bytes, BrokerError> {
    rmp_serde::to_vec(record)
        .map(Bytes::from)
        .map_err(|e| BrokerError::Storage(format!("encoding a dedup record: {e}")))
}

fn decode(bytes: &[u8]) -> Result<Record, BrokerError> {
    rmp_serde::from_slice(bytes)
        .map_err(|e| BrokerError::Storage(format!("decoding a dedup record: {e}")))
}

impl NatsBroker {
    /// The bucket of `scope`, from the cache or the server.
    async fn dedup_bucket(&self, scope: &str) -> Result<kv::Store, BrokerError> {
        if let Some(store) = read(&self.dedup_buckets).get(scope) {
            return Ok(store.clone());
        }
        let name = bucket_name(scope);
        let store = self.js.get_key_value(&name).await.map_err(|e| {
            BrokerError::Storage(format!(
                "dedup bucket {name} is not there ({e}); the daemon creates it at start-up"
            ))
        })?;
        write(&self.dedup_buckets).insert(scope.to_owned(), store.clone());
        Ok(store)
    }

    /// The current record of `key` and the revision to write at (0: none).
    async fn dedup_read(
        &self,
        bucket: &kv::Store,
        key: &str,
    ) -> Result<(Option<Record>, u64), BrokerError> {
        match bucket
            .entry(key)
            .await
            .map_err(|e| kv_error("reading", &e))?
        {
            Some(entry) if entry.operation == kv::Operation::Put => {
                Ok((Some(decode(&entry.value)?), entry.revision))
            }
            Some(entry) => Ok((None, entry.revision)),
            None => Ok((None, 0)),
        }
    }

    /// Writes `value` at `key` if its revision is still `revision` (0:
    /// if it does not exist). `Ok(None)` when another writer came first.
    async fn dedup_write(
        &self,
        bucket: &kv::Store,
        key: &str,
        value: Bytes,
        revision: u64,
    ) -> Result<Option<u64>, BrokerError> {
        if revision == 0 {
            match bucket.create(key, value).await {
                Ok(revision) => Ok(Some(revision)),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(None),
                Err(e) => Err(kv_error("creating a record", &e)),
            }
        } else {
            match bucket.update(key, value, revision).await {
                Ok(revision) => Ok(Some(revision)),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
                Err(e) => Err(kv_error("updating a record", &e)),
            }
        }
    }
}

#[async_trait]
impl IdempotencyStore for NatsBroker {
    async fn ensure_scope(&self, scope: &str, ttl: Duration) -> Result<(), BrokerError> {
        let name = bucket_name(scope);
        let store = self
            .js
            .create_or_update_key_value(kv::Config {
                bucket: name.clone(),
                description: format!("sluice dedup records of stage {scope}"),
                history: 1,
                max_age: ttl,
                storage: async_nats::jetstream::stream::StorageType::File,
                num_replicas: self.options.replicas,
                ..Default::default()
            })
            .await
            .map_err(|e| BrokerError::Provision(format!("creating dedup bucket {name}: {e}")))?;
        write(&self.dedup_buckets).insert(scope.to_owned(), store);
        Ok(())
    }

    async fn begin(&self, request: BeginRequest) -> Result<Begin, BrokerError> {
        let bucket = self.dedup_bucket(&request.scope).await?;
        let key = kv_key(&request.digest);
        let token = idempotency::new_token();
        for _ in 0..MAX_RACES {
            let (found, revision) = self.dedup_read(&bucket, &key).await?;
            let (begin, record) =
                idempotency::decide(found.as_ref(), &request, now_millis(), &token);
            let (Begin::Run(mut ticket), Some(record)) = (begin.clone(), record) else {
                return Ok(begin);
            };
            if let Some(written) = self
                .dedup_write(&bucket, &key, encode(&record)?, revision)
                .await?
            {
                ticket.revision = written;
                return Ok(Begin::Run(ticket));
            }
        }
        // Others keep writing this key: it is busy.
        Ok(Begin::Busy(Duration::from_millis(100)))
    }

    async fn release(&self, ticket: &Ticket) -> Result<(), BrokerError> {
        let bucket = self.dedup_bucket(&ticket.scope).await?;
        match bucket
            .delete_expect_revision(kv_key(&ticket.digest), Some(ticket.revision))
            .await
        {
            Ok(()) => Ok(()),
            Err(e) => {
                // A wrong-revision refusal may come back as a publish error:
                // look. Taken over meanwhile, the new holder's record stays.
                let (found, _) = self.dedup_read(&bucket, &kv_key(&ticket.digest)).await?;
                if idempotency::held_by(found.as_ref(), ticket) {
                    Err(kv_error("releasing a record", &e))
                } else {
                    Ok(())
                }
            }
        }
    }
}

impl NatsBroker {
    /// [`Broker::complete`] with a ticket: publishes the outputs (awaiting
    /// the PubAcks), then records the key COMPLETED, then acks.
    pub(super) async fn complete_recorded(
        &self,
        ticket: &Ticket,
        receipt: &Receipt,
        outputs: Vec<Message>,
    ) -> Result<(), BrokerError> {
        let bucket = self.dedup_bucket(&ticket.scope).await?;
        let key = kv_key(&ticket.digest);
        if !outputs.is_empty() {
            self.publish(outputs.clone()).await?;
        }
        idempotency::crash_hook();
        let now = now_millis();
        let mut record = encode(&idempotency::completed(
            ticket,
            idempotency::recordable(&outputs),
            now,
        ))?;
        if record.len() > MAX_RECORD_BYTES {
            record = encode(&idempotency::completed(ticket, None, now))?;
        }
        if self
            .dedup_write(&bucket, &key, record, ticket.revision)
            .await?
            .is_none()
        {
            // Another holder took the key after this one's lease ran out;
            // the outputs above have deterministic ids, so at worst the
            // streams' duplicate window drops them. Its record stands.
            tracing::debug!(key = %ticket.key, "dedup record taken over before completing");
        }
        self.ack(receipt).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_and_key_names_are_valid_for_kv() {
        assert_eq!(bucket_name("orders.route"), "SLUICE_DEDUP_orders_route");
        let key = kv_key(&crate::dedup::key_digest(
            "any key: with spaces / and ünïcode",
        ));
        assert_eq!(key.len(), 64);
        assert!(key.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
