//! Idempotency records: what a stage with a `dedup:` block keeps per key
//! (IN_PROGRESS, COMPLETED) in its broker, and [`decide`], the one rule
//! over them. Not the broker's duplicate window on message ids: that one
//! drops a repeated publish; these make a handler run at most once per
//! key.
//!
//! Each key has a [`Record`] in an [`IdempotencyStore`] (the embedded
//! broker's own store, or a NATS KV bucket), scoped by the stage's
//! consumer:
//!
//! - **IN_PROGRESS** while a handler runs, with a lease of the handler
//!   timeout plus the `dedup:` block's margin. A crash leaves it behind;
//!   once its lease is over, the next delivery takes it over and runs the
//!   handler again.
//! - **COMPLETED** once the outputs are published, holding those outputs, so
//!   a duplicate can republish them with their original ids (the broker's
//!   duplicate window drops whatever already arrived) and be acked.
//!
//! The brokers store and apply these, so they live here, beside the
//! [`Ticket`] a key's holder carries; the stage's side (the key of a
//! message, the lease margin) is [`crate::dedup`], which uses them
//! (issue 44: a broker names no stage policy).

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{BrokerError, Message, Ticket};

/// How old a COMPLETED record may be for its outputs to be republished on
/// a duplicate. Below both brokers' shortest duplicate window (2 minutes),
/// so a republish is always recognised and dropped where it already
/// arrived; an older record's outputs are not republished (they were
/// durable before the record was written), the duplicate is only acked.
pub const REPUBLISH_WITHIN: Duration = Duration::from_secs(60);

/// The most output payload bytes a COMPLETED record keeps for
/// republishing; bigger outputs are recorded without them (the key is
/// still deduplicated, a lost output cannot be repaired from the record).
pub const MAX_RECORDED_OUTPUT_BYTES: usize = 1 << 20;

/// The outputs a COMPLETED record keeps: all of them, or none when they
/// exceed [`MAX_RECORDED_OUTPUT_BYTES`].
pub fn recordable(outputs: &[Message]) -> Option<Vec<Message>> {
    let bytes: usize = outputs.iter().map(|m| m.payload.len()).sum();
    (bytes <= MAX_RECORDED_OUTPUT_BYTES).then(|| outputs.to_vec())
}

/// A key's state, as stored (rmp-serde).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    /// A handler is running for this key.
    InProgress {
        /// Who holds it: unique per attempt.
        token: String,
        /// Until when (ms since the epoch) the holder owns it.
        lease_until: u64,
        /// SHA-256 of the payload, when the stage records hashes.
        hash: Option<Vec<u8>>,
        /// When the record may be forgotten.
        expires_at: u64,
    },
    /// The handler ran and its outputs were published.
    Completed {
        /// The holder that completed it.
        token: String,
        /// When (ms since the epoch).
        completed_at: u64,
        /// SHA-256 of the payload, when the stage records hashes.
        hash: Option<Vec<u8>>,
        /// The outputs, with their ids, for republishing; `None` when they
        /// were too big to keep in the record.
        outputs: Option<Vec<Message>>,
        /// When the record may be forgotten.
        expires_at: u64,
    },
}

impl Record {
    /// When the record may be forgotten.
    pub fn expires_at(&self) -> u64 {
        match self {
            Record::InProgress { expires_at, .. } | Record::Completed { expires_at, .. } => {
                *expires_at
            }
        }
    }

    fn hash(&self) -> Option<&[u8]> {
        match self {
            Record::InProgress { hash, .. } | Record::Completed { hash, .. } => hash.as_deref(),
        }
    }
}

/// What a delivery asks the store for.
#[derive(Debug, Clone)]
pub struct BeginRequest {
    /// The stage's consumer name: keys are per stage.
    pub scope: String,
    /// The dedup key.
    pub key: String,
    /// [`key_digest`](crate::dedup::key_digest) of the key: what stores
    /// key their records by,
    /// computed once per delivery.
    pub digest: [u8; 32],
    /// SHA-256 of the payload, when the stage records hashes.
    pub hash: Option<Vec<u8>>,
    /// How long the holder owns the key (handler timeout + margin).
    pub lease: Duration,
    /// How long the key is remembered.
    pub ttl: Duration,
}

/// What a delivery does, given its key's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// The key is this delivery's: run the handler, then complete or release.
    Run(Ticket),
    /// Another delivery holds the key; ask again after this long.
    Busy(Duration),
    /// The key was handled: republish these outputs (if kept and recent)
    /// and ack.
    Done {
        /// The recorded outputs.
        outputs: Option<Vec<Message>>,
        /// When the key was completed (ms since the epoch).
        completed_at: u64,
    },
    /// The key was seen with a different payload.
    Conflict,
}

/// Decides what a delivery does with the record it found, and what to
/// write. `token` is the new holder's, used if the delivery gets the key.
pub fn decide(
    found: Option<&Record>,
    request: &BeginRequest,
    now: u64,
    token: &str,
) -> (Begin, Option<Record>) {
    let found = found.filter(|r| r.expires_at() > now);
    if let Some(record) = found
        && let (Some(recorded), Some(received)) = (record.hash(), request.hash.as_deref())
        && recorded != received
    {
        return (Begin::Conflict, None);
    }
    match found {
        Some(Record::Completed {
            outputs,
            completed_at,
            ..
        }) => (
            Begin::Done {
                outputs: outputs.clone(),
                completed_at: *completed_at,
            },
            None,
        ),
        Some(Record::InProgress { lease_until, .. }) if *lease_until > now => {
            (Begin::Busy(Duration::from_millis(lease_until - now)), None)
        }
        // Absent, expired, or held by a holder whose lease ran out (it
        // crashed or lost its way): this delivery takes the key.
        _ => {
            let record = Record::InProgress {
                token: token.to_owned(),
                lease_until: now.saturating_add(millis(request.lease)),
                hash: request.hash.clone(),
                expires_at: now.saturating_add(millis(request.ttl)),
            };
            let ticket = Ticket {
                scope: request.scope.clone(),
                key: request.key.clone(),
                digest: request.digest,
                token: token.to_owned(),
                hash: request.hash.clone(),
                revision: 0,
                ttl: request.ttl,
            };
            (Begin::Run(ticket), Some(record))
        }
    }
}

/// The COMPLETED record a ticket's holder writes.
pub fn completed(ticket: &Ticket, outputs: Option<Vec<Message>>, now: u64) -> Record {
    Record::Completed {
        token: ticket.token.clone(),
        completed_at: now,
        hash: ticket.hash.clone(),
        outputs,
        expires_at: now.saturating_add(millis(ticket.ttl)),
    }
}

/// Whether `found` is still the IN_PROGRESS record of `ticket`.
pub fn held_by(found: Option<&Record>, ticket: &Ticket) -> bool {
    matches!(found, Some(Record::InProgress { token, .. }) if *token == ticket.token)
}

/// Whether `found` is a COMPLETED record written by another holder (its
/// outputs, not this holder's, are the key's).
pub fn completed_by_other(found: Option<&Record>, ticket: &Ticket) -> bool {
    matches!(found, Some(Record::Completed { token, .. }) if *token != ticket.token)
}

/// A new holder token: unique across processes (a random prefix drawn
/// once per process) and within one (a counter), without a random draw
/// per message.
pub fn new_token() -> String {
    use std::sync::LazyLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PROCESS: LazyLock<String> = LazyLock::new(|| uuid::Uuid::now_v7().simple().to_string());
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}.{}", *PROCESS, NEXT.fetch_add(1, Ordering::Relaxed))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The environment variable of the crash test hook: with `N`, the process
/// aborts at the N-th completion of a deduplicated delivery, after the
/// handler ran (and, on NATS, after its outputs were published) and before
/// the COMPLETED record is written: the window the dedup guarantee names.
/// For tests only; unset in production.
pub const CRASH_HOOK_ENV: &str = "SLUICE_TEST_ABORT_BEFORE_DEDUP_RECORD";

/// Aborts the process here if [`CRASH_HOOK_ENV`] says this is the
/// completion to die at.
pub fn crash_hook() {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    static SEEN: AtomicU64 = AtomicU64::new(0);
    let at = AT.get_or_init(|| std::env::var(CRASH_HOOK_ENV).ok()?.parse().ok());
    if let Some(at) = *at
        && SEEN.fetch_add(1, Ordering::Relaxed) + 1 == at
    {
        eprintln!("{CRASH_HOOK_ENV}={at}: aborting before the dedup record is written");
        std::process::abort();
    }
}

/// Where idempotency records live. Implemented by each broker over its
/// own storage, so that (on the embedded broker) the COMPLETED record
/// commits in the same transaction as the outputs and the ack. A stage's
/// `dedup:` block ([`crate::dedup`]) is what uses it.
///
/// A key is taken ([`IdempotencyStore::begin`]) and given back
/// ([`IdempotencyStore::release`]) here; it is recorded COMPLETED by the
/// broker's one completion, [`Broker::complete`](super::Broker::complete)
/// with a [`Completion`](super::Completion) carrying the ticket:
/// the embedded broker writes the outputs, the record and the ack in one
/// transaction; NATS publishes (awaiting the PubAcks), then records, then
/// acks. If another holder completed the key meanwhile, its outputs stand
/// and this delivery is only acked.
#[async_trait]
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Prepares storage for a stage's records (a NATS KV bucket with the
    /// TTL as its max age); idempotent.
    async fn ensure_scope(&self, scope: &str, ttl: Duration) -> Result<(), BrokerError>;

    /// Looks the key up and, per [`decide`], takes it for this delivery.
    async fn begin(&self, request: BeginRequest) -> Result<Begin, BrokerError>;

    /// Gives a key back after a failed attempt, so the retry can take it.
    /// A key no longer held by the ticket is left alone.
    async fn release(&self, ticket: &Ticket) -> Result<(), BrokerError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dedup::key_digest;

    fn request(hash: Option<&[u8]>) -> BeginRequest {
        BeginRequest {
            scope: "p_s".into(),
            key: "k".into(),
            digest: key_digest("k"),
            hash: hash.map(<[u8]>::to_vec),
            lease: Duration::from_secs(10),
            ttl: Duration::from_secs(100),
        }
    }

    #[test]
    fn a_new_key_is_taken_with_a_lease_and_a_ttl() {
        let (begin, write) = decide(None, &request(Some(b"h")), 1_000, "t1");
        let Begin::Run(ticket) = begin else {
            panic!("{begin:?}")
        };
        assert_eq!(ticket.token, "t1");
        assert_eq!(
            write,
            Some(Record::InProgress {
                token: "t1".into(),
                lease_until: 11_000,
                hash: Some(b"h".to_vec()),
                expires_at: 101_000
            })
        );
    }

    #[test]
    fn a_held_key_is_busy_until_its_lease_ends_then_taken_over() {
        let (_, held) = decide(None, &request(None), 1_000, "t1");
        let held = held.expect("record");
        let (begin, write) = decide(Some(&held), &request(None), 5_000, "t2");
        assert_eq!(begin, Begin::Busy(Duration::from_secs(6)));
        assert!(write.is_none());
        let (begin, write) = decide(Some(&held), &request(None), 11_000, "t2");
        assert!(matches!(begin, Begin::Run(t) if t.token == "t2"));
        assert!(matches!(write, Some(Record::InProgress { token, .. }) if token == "t2"));
    }

    #[test]
    fn a_completed_key_hands_back_its_outputs_until_it_expires() {
        let (Begin::Run(ticket), _) = decide(None, &request(None), 1_000, "t1") else {
            panic!()
        };
        let outputs = vec![Message::new("o1", "out", &b"x"[..])];
        let done = completed(&ticket, Some(outputs.clone()), 2_000);
        let (begin, write) = decide(Some(&done), &request(None), 3_000, "t2");
        assert_eq!(
            begin,
            Begin::Done {
                outputs: Some(outputs),
                completed_at: 2_000
            }
        );
        assert!(write.is_none());
        // Past its TTL the key is new again.
        let (begin, _) = decide(Some(&done), &request(None), 102_000, "t3");
        assert!(matches!(begin, Begin::Run(_)));
    }

    #[test]
    fn a_different_payload_hash_is_a_conflict_in_either_state() {
        let (Begin::Run(ticket), Some(held)) = decide(None, &request(Some(b"a")), 0, "t1") else {
            panic!()
        };
        let done = completed(&ticket, None, 10);
        for record in [&held, &done] {
            let (begin, write) = decide(Some(record), &request(Some(b"b")), 20, "t2");
            assert_eq!(begin, Begin::Conflict);
            assert!(write.is_none());
        }
        // The same hash, or no hash on either side, is no conflict.
        assert!(matches!(
            decide(Some(&done), &request(Some(b"a")), 20, "t2").0,
            Begin::Done { .. }
        ));
        assert!(matches!(
            decide(Some(&done), &request(None), 20, "t2").0,
            Begin::Done { .. }
        ));
    }

    #[test]
    fn ownership_checks() {
        let (Begin::Run(t1), Some(held)) = decide(None, &request(None), 0, "t1") else {
            panic!()
        };
        let (Begin::Run(t2), _) = decide(None, &request(None), 0, "t2") else {
            panic!()
        };
        assert!(held_by(Some(&held), &t1));
        assert!(!held_by(Some(&held), &t2));
        assert!(!held_by(None, &t1));
        let done = completed(&t1, None, 5);
        assert!(completed_by_other(Some(&done), &t2));
        assert!(!completed_by_other(Some(&done), &t1));
        assert!(!completed_by_other(Some(&held), &t2));
    }
}
