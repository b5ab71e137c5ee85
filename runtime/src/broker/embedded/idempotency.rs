//! The embedded broker as an [`IdempotencyStore`].
//!
//! The embedded broker belongs to one process (its data directory is
//! locked), so a key being handled (IN_PROGRESS) is only ever held by a
//! handler in this process, and a crash ends every such hold. Holds
//! therefore live in memory ([`Holds`]), and only COMPLETED records are
//! stored: written by the committer in the same batch as the outputs and
//! the removal of the pending entry (the completion), so a key is recorded handled
//! exactly when its outputs exist. A begin is a map lookup and a point
//! read, with no write and no wait for the committer; after a crash nothing
//! is left holding a key, and the redelivery runs at once.
//!
//! Order keeps it exact: a begin checks the holds and then the store under
//! the holds' lock; a completing holder's hold goes only after its batch
//! is committed, so a begin in between sees the hold (busy, ask again) and
//! then the record.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

use super::EmbeddedBroker;
use super::commit::group::Group;
use super::store::{decode, encode, idempotency_key, storage};
use crate::broker::Ticket;
use crate::broker::idempotency::{self, Begin, BeginRequest, IdempotencyStore, Record};
use crate::broker::{BrokerError, Message, Receipt, now_millis};

/// Keys held by running handlers: stored key -> the holder's record.
#[derive(Default)]
pub(super) struct Holds(Mutex<HashMap<Vec<u8>, Record>>);

impl Holds {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Record>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops the hold of `key` if `ticket` has it.
    fn release(&self, key: &[u8], ticket: &Ticket) {
        let mut holds = self.lock();
        if idempotency::held_by(holds.get(key), ticket) {
            holds.remove(key);
        }
    }
}

impl Group<'_> {
    /// Adds a completion's COMPLETED record to the batch.
    ///
    /// It does not repeat the outputs: they are in this same batch, so a
    /// key recorded handled always has its outputs published, and there is
    /// never a lost publish for a duplicate to repair (it is only acked).
    /// Nor does it check for another holder's record: a key has one holder
    /// in this process until its lease (handler timeout + margin) is over,
    /// and if a second one completes after that, its outputs carry the same
    /// key-derived ids and the duplicate window drops them.
    pub(super) fn complete_record(
        &mut self,
        key: Vec<u8>,
        ticket: &Ticket,
    ) -> Result<(), BrokerError> {
        let record = idempotency::completed(ticket, None, self.now);
        self.batch
            .insert(&self.store.idempotency, key, encode(&record)?);
        Ok(())
    }
}

fn stored(read: Result<Option<fjall::Slice>, fjall::Error>) -> Result<Option<Record>, BrokerError> {
    match read.map_err(|e| storage("reading a dedup record", e))? {
        Some(bytes) => decode(&bytes).map(Some),
        None => Ok(None),
    }
}

/// Where the next sweep of expired records starts: the sweep walks the
/// `idempotency` keyspace a chunk at a time, wrapping around, rather than
/// keeping a time index (which would cost every completion a second write).
#[derive(Default)]
pub(super) struct SweepCursor(Mutex<Vec<u8>>);

/// Records looked at per sweep. Maintenance runs every 200 ms, so a full
/// pass over a million records takes under two minutes; TTLs are hours.
const SWEEP_CHUNK: usize = 2_000;

/// Removes expired dedup records among the next [`SWEEP_CHUNK`] after the
/// cursor, and moves it on.
pub(super) fn sweep(group: &mut Group<'_>) -> Result<(), BrokerError> {
    let store = group.store.clone();
    let mut cursor = group
        .shared
        .dedup_sweep
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let mut seen = 0;
    let mut last = None;
    for guard in store.idempotency.range(cursor.clone()..) {
        if seen == SWEEP_CHUNK {
            break;
        }
        let (key, value) = guard
            .into_inner()
            .map_err(|e| storage("reading a dedup record", e))?;
        let record: Record = decode(&value)?;
        // Maintenance runs between groups, so nothing in flight can have
        // rewritten this record.
        if record.expires_at() <= group.now {
            group.batch.remove(&store.idempotency, key.clone());
        }
        last = Some(key);
        seen += 1;
    }
    *cursor = match last {
        // Just past the last key seen.
        Some(key) if seen == SWEEP_CHUNK => {
            let mut next = key.to_vec();
            next.push(0);
            next
        }
        // The end: start over next time.
        _ => Vec::new(),
    };
    Ok(())
}

#[async_trait]
impl IdempotencyStore for EmbeddedBroker {
    async fn ensure_scope(
        &self,
        _scope: &str,
        _ttl: std::time::Duration,
    ) -> Result<(), BrokerError> {
        // Records carry their own expiry; there is nothing to prepare.
        Ok(())
    }

    async fn begin(&self, request: BeginRequest) -> Result<Begin, BrokerError> {
        let key = idempotency_key(&request.scope, &request.digest);
        let mut holds = self.shared.holds.lock();
        let found = match holds.get(&key) {
            Some(held) => Some(held.clone()),
            None => stored(self.shared.store.get()?.idempotency.get(&key))?,
        };
        let (begin, write) = idempotency::decide(
            found.as_ref(),
            &request,
            now_millis(),
            &idempotency::new_token(),
        );
        if let Some(held) = write {
            holds.insert(key, held);
        }
        Ok(begin)
    }

    async fn release(&self, ticket: &Ticket) -> Result<(), BrokerError> {
        let key = idempotency_key(&ticket.scope, &ticket.digest);
        self.shared.holds.release(&key, ticket);
        Ok(())
    }
}

impl EmbeddedBroker {
    /// [`Broker::complete`](crate::broker::Broker::complete) with a ticket:
    /// the outputs, the COMPLETED record and the removal of the pending
    /// entry in one transaction.
    pub(super) async fn complete_recorded(
        &self,
        ticket: &Ticket,
        receipt: &Receipt,
        outputs: Vec<Message>,
        state: Option<crate::state::StateWrites>,
    ) -> Result<(), BrokerError> {
        idempotency::crash_hook();
        let key = idempotency_key(&ticket.scope, &ticket.digest);
        let result = self
            .complete_with(receipt, outputs, Some((key.clone(), ticket.clone())), state)
            .await;
        // Committed (the record is readable) or failed (it is not): either
        // way the hold has done its job.
        self.shared.holds.release(&key, ticket);
        result
    }
}
