//! Dedup: a stage's handler runs at most once per dedup key per TTL.
//!
//! This folder is the stage's side: which key a message has ([`key_of`],
//! from the `dedup:` block's key source), its digest and payload hash,
//! and the lease margin. The records themselves (IN_PROGRESS, COMPLETED),
//! [`decide`] and the store the brokers implement are the brokers'
//! ([`crate::broker::idempotency`]), re-exported here under their old
//! names: a broker stores them, so they sit with the broker, and this
//! side uses them.
//!
//! Not to be confused with the broker's duplicate window on message ids
//! (a repeated publish dropped), which is the broker's alone.

mod key;

pub use key::{key_digest, key_of, payload_hash};

/// Where a stage's idempotency records live: the brokers'
/// [`IdempotencyStore`], under the name the daemon and engine know.
pub use crate::broker::idempotency::IdempotencyStore as DedupStore;
pub use crate::broker::idempotency::{
    Begin, BeginRequest, CRASH_HOOK_ENV, IdempotencyStore, MAX_RECORDED_OUTPUT_BYTES,
    REPUBLISH_WITHIN, Record, completed, completed_by_other, crash_hook, decide, held_by,
    new_token, recordable,
};

/// Added to the handler timeout to make an IN_PROGRESS lease. It lives
/// with the `dedup:` block in config, which refuses a `ttl` shorter than
/// the lease.
pub use crate::config::LEASE_MARGIN;
