//! The dedup step of a stage, between resolving the claim and invoking:
//! asks the stage's [`DedupStore`] whether this message's key is new,
//! being handled elsewhere, or already handled.

use std::sync::Arc;
use std::time::Duration;

use crate::broker::Ticket;
use crate::broker::{Message, consumer_name};
use crate::config::{Dedup, DedupKey, MissingKey, Stage};
use crate::dedup::{self, Begin, BeginRequest, DedupStore};
use crate::failure::{Failure, FailureKind};
use crate::plugin::Message as PluginMessage;

/// What the stage does with a delivery after the dedup check.
#[derive(Debug)]
pub(super) enum Gate {
    /// Run the handler, and complete with the ticket (None: the message
    /// has no key and the stage processes such messages without dedup).
    Run(Option<Ticket>),
    /// Another delivery holds the key: ask again after this long.
    Wait(Duration),
    /// The key was handled: republish its outputs and ack.
    Duplicate {
        /// The recorded outputs, if kept.
        outputs: Option<Vec<Message>>,
        /// When it was handled (ms since the epoch).
        completed_at: u64,
    },
    /// Settle it as this failure (no key, conflict, store unreachable).
    Fail(Failure),
}

/// One stage's dedup settings and store.
pub(super) struct DedupGate {
    store: Arc<dyn DedupStore>,
    scope: String,
    key: DedupKey,
    missing_key: MissingKey,
    payload_hash: bool,
    lease: Duration,
    ttl: Duration,
}

impl DedupGate {
    /// The gate of `stage` in `pipeline` over `store`.
    pub(super) fn new(
        pipeline: &str,
        stage: &Stage,
        dedup: &Dedup,
        store: Arc<dyn DedupStore>,
    ) -> DedupGate {
        DedupGate {
            store,
            scope: consumer_name(pipeline, &stage.name),
            key: dedup.key.clone(),
            missing_key: dedup.missing_key,
            payload_hash: dedup.payload_hash,
            lease: stage.delivery.timeout.get() + dedup::LEASE_MARGIN,
            ttl: dedup.ttl.get(),
        }
    }

    /// Gives `ticket`'s key back (a failed store call only means its lease
    /// runs out instead).
    pub(super) async fn release(&self, ticket: &Ticket) {
        if let Err(err) = self.store.release(ticket).await {
            tracing::debug!(error = %err, "giving a dedup key back failed; its lease runs out");
        }
    }

    /// Checks `message` (its payload already resolved).
    pub(super) async fn check(&self, message: &PluginMessage) -> Gate {
        let key = match dedup::key_of(&self.key, &message.id, &message.headers, &message.payload) {
            Ok(key) => key,
            Err(why) => {
                return match self.missing_key {
                    MissingKey::Reject => Gate::Fail(Failure::new(FailureKind::Rejected, why)),
                    MissingKey::Process => Gate::Run(None),
                };
            }
        };
        let request = BeginRequest {
            scope: self.scope.clone(),
            digest: dedup::key_digest(&key),
            key: key.clone(),
            hash: self
                .payload_hash
                .then(|| dedup::payload_hash(&message.payload)),
            lease: self.lease,
            ttl: self.ttl,
        };
        match self.store.begin(request).await {
            Ok(Begin::Run(ticket)) => Gate::Run(Some(ticket)),
            Ok(Begin::Busy(wait)) => Gate::Wait(wait),
            Ok(Begin::Done {
                outputs,
                completed_at,
            }) => Gate::Duplicate {
                outputs,
                completed_at,
            },
            Ok(Begin::Conflict) => Gate::Fail(Failure::new(
                FailureKind::DedupConflict,
                format!(
                    "dedup key `{key}` ({}) was already handled with a different payload",
                    self.key
                ),
            )),
            Err(err) => Gate::Fail(Failure::new(
                FailureKind::PublishFailed,
                format!("the dedup store could not be read: {err}"),
            )),
        }
    }
}
