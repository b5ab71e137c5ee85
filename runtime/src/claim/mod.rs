//! The claim check: large payloads go to an object store, and the broker
//! carries a reference.
//!
//! - `store.rs`: one store (`file://`, `s3://`, `memory://`) over
//!   `object_store`, with a durable (fsynced) put for `file://`;
//! - `broker.rs`: [`ClaimingBroker`], a [`Broker`](crate::broker::Broker)
//!   decorator that offloads in `publish`, `complete` and `dead_letter`, so
//!   every publish path (ingest, CLI publish, handler emits, DLQ, redrive)
//!   is covered in one place;
//! - `sweep.rs`: the retention sweeper of `file://` stores.
//!
//! The engine resolves references before a handler runs
//! ([`Claims::resolve`], called from `engine/stage.rs`).
//!
//! # The reference
//!
//! An offloaded message has an empty body and three headers:
//!
//! | header | value |
//! |---|---|
//! | `sluice-claim` | `<store url>/<topic>/<uuidv7>`, e.g. `s3://bucket/claims/orders/0199...` or `file:///var/lib/sluice/claims/orders/0199...` |
//! | `sluice-claim-size` | the payload's length in bytes |
//! | `sluice-claim-blake3` | the payload's BLAKE3 hash, lowercase hex (`b3sum` prints the same) |
//!
//! The reference is the object's full URL, so any client that can read the
//! store can resolve it without Sluice. On resolve, the size and hash are
//! checked (a reference from an earlier Sluice, with `sluice-claim-sha256`
//! instead, is checked against that). BLAKE3 rather than SHA-256 because
//! the payload is hashed twice on its way through, and for a 10 MB payload
//! BLAKE3 takes ~1.7 ms here against SHA-256's ~7 ms even with the CPU's
//! SHA instructions; a missing object (or one whose bytes do not match) is
//! `claim-missing`, which is retried (read-after-write on some stores) and
//! then dead-lettered with the reference kept.

mod broker;
mod store;
mod sweep;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use sha2::{Digest as _, Sha256};

pub use broker::ClaimingBroker;
pub use store::ClaimStore;
pub use sweep::{SweepReport, sweep_period, sweeper};

use crate::broker::Message;
use crate::config::{ClaimCheck, Pipeline, default_dlq};
use crate::metrics::{DirectionLabels, Metrics};

/// The header naming the object that holds the payload.
pub const CLAIM_HEADER: &str = "sluice-claim";
/// The header with the payload's size in bytes.
pub const CLAIM_SIZE_HEADER: &str = "sluice-claim-size";
/// The header with the payload's BLAKE3 hash (lowercase hex).
pub const CLAIM_DIGEST_HEADER: &str = "sluice-claim-blake3";
/// The header with the payload's SHA-256 (lowercase hex) that references
/// made before BLAKE3 carry; still checked on resolve.
pub const CLAIM_SHA256_HEADER: &str = "sluice-claim-sha256";

/// Why a claim-check step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The payload is larger than the topic's `max_payload`.
    #[error(
        "the payload of {size} bytes is larger than the `max_payload` of topic `{topic}` ({max} bytes)"
    )]
    TooLarge {
        /// The topic.
        topic: String,
        /// The payload's size.
        size: u64,
        /// Its `max_payload`.
        max: u64,
    },
    /// The referenced object is not there, or its bytes do not match the
    /// reference's size and hash.
    #[error("claim missing: {0}")]
    Missing(String),
    /// The store failed or cannot be opened.
    #[error("claim store: {0}")]
    Store(String),
}

/// One topic's claim check, with its store opened.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Where its large payloads go.
    pub store: Arc<ClaimStore>,
    /// Payloads above this many bytes are offloaded.
    pub threshold: u64,
    /// Payloads above this many bytes are refused.
    pub max_payload: u64,
    /// How long objects are kept at least.
    pub retention: Duration,
}

/// Every topic's effective `claim_check`: its own, else its pipeline's. A
/// pipeline's implicit dead-letter topics take the pipeline's. Topics with
/// none are absent.
pub fn topic_checks(pipelines: &[Pipeline]) -> HashMap<String, ClaimCheck> {
    let mut out = HashMap::new();
    for pipeline in pipelines {
        for topic in &pipeline.topics {
            if let Some(check) = topic.claim_check.as_ref().or(pipeline.claim_check.as_ref()) {
                out.entry(topic.name.clone())
                    .or_insert_with(|| check.clone());
            }
        }
        if let Some(check) = &pipeline.claim_check {
            for stage in &pipeline.stages {
                if stage.delivery.dlq_name().is_none() {
                    out.entry(default_dlq(&pipeline.name, &stage.name))
                        .or_insert_with(|| check.clone());
                }
            }
        }
    }
    out
}

/// The claim checks of a daemon: each topic's policy and the stores they
/// use, shared by the publishing decorator, the engine's resolver and the
/// sweeper.
#[derive(Debug)]
pub struct Claims {
    stores: Vec<Arc<ClaimStore>>,
    topics: HashMap<String, Policy>,
    put_bytes: Counter,
    get_bytes: Counter,
    /// A read from a store failed and none has succeeded since: the
    /// outage is logged once, and its end.
    read_failing: std::sync::atomic::AtomicBool,
}

impl Claims {
    /// The claim checks of `pipelines`, or `None` when none has one.
    ///
    /// # Errors
    ///
    /// A store cannot be opened.
    pub fn from_pipelines(pipelines: &[Pipeline]) -> Result<Option<Claims>, ClaimError> {
        let checks = topic_checks(pipelines);
        if checks.is_empty() {
            return Ok(None);
        }
        let mut sorted: Vec<(String, ClaimCheck)> = checks.into_iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        Claims::new(sorted).map(Some)
    }

    /// Claim checks for the given topics. Topics naming the same store
    /// settings share one opened store.
    ///
    /// # Errors
    ///
    /// A store cannot be opened.
    pub fn new(checks: Vec<(String, ClaimCheck)>) -> Result<Claims, ClaimError> {
        let mut opened: Vec<(ClaimCheck, Arc<ClaimStore>)> = Vec::new();
        let mut topics = HashMap::new();
        for (topic, check) in checks {
            let same_store = |c: &ClaimCheck| {
                c.store == check.store
                    && c.region == check.region
                    && c.endpoint == check.endpoint
                    && c.allow_http == check.allow_http
            };
            let store = match opened.iter().find(|(c, _)| same_store(c)) {
                Some((_, store)) => store.clone(),
                None => {
                    let store = Arc::new(ClaimStore::open(&check)?);
                    opened.push((check.clone(), store.clone()));
                    store
                }
            };
            topics.insert(
                topic,
                Policy {
                    store,
                    threshold: check.threshold.bytes(),
                    max_payload: check.max_payload.bytes(),
                    retention: check.retention.get(),
                },
            );
        }
        Ok(Claims {
            stores: opened.into_iter().map(|(_, s)| s).collect(),
            topics,
            put_bytes: Counter::default(),
            get_bytes: Counter::default(),
            read_failing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Counts offloaded and resolved bytes into
    /// `sluice_claim_bytes_total{direction="put"|"get"}`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        let counter = |direction: &str| {
            metrics
                .claim_bytes
                .get_or_create(&DirectionLabels {
                    direction: direction.to_owned(),
                })
                .clone()
        };
        self.put_bytes = counter("put");
        self.get_bytes = counter("get");
        self
    }

    /// The policy of `topic`, if it has a claim check.
    pub fn policy(&self, topic: &str) -> Option<&Policy> {
        self.topics.get(topic)
    }

    /// Every topic with a claim check, and its policy.
    pub fn policies(&self) -> impl Iterator<Item = (&str, &Policy)> {
        self.topics.iter().map(|(t, p)| (t.as_str(), p))
    }

    /// The opened stores.
    pub fn stores(&self) -> &[Arc<ClaimStore>] {
        &self.stores
    }

    /// The largest `max_payload` of any topic: the most an ingest request
    /// body may need to carry.
    pub fn largest_max_payload(&self) -> u64 {
        self.topics
            .values()
            .map(|p| p.max_payload)
            .max()
            .unwrap_or(0)
    }

    /// Applies `message.topic`'s claim check: a payload above the
    /// threshold is written to the store (durably) and replaced by a
    /// reference; a message that already is a reference (a dead letter, a
    /// redrive) passes as it is, as does one on a topic without a claim
    /// check.
    ///
    /// # Errors
    ///
    /// [`ClaimError::TooLarge`] above `max_payload`; [`ClaimError::Store`]
    /// when the write failed (nothing was referenced).
    pub async fn offload(&self, mut message: Message) -> Result<Message, ClaimError> {
        if is_reference(&message) {
            return Ok(message);
        }
        if message.header(CLAIM_HEADER).is_some() {
            // A stale reference on a message with a body (copied headers):
            // the body is the truth.
            strip_claim_headers(&mut message.headers);
        }
        let Some(policy) = self.topics.get(&message.topic) else {
            return Ok(message);
        };
        let size = message.payload.len() as u64;
        if size > policy.max_payload {
            return Err(ClaimError::TooLarge {
                topic: message.topic.clone(),
                size,
                max: policy.max_payload,
            });
        }
        if size <= policy.threshold {
            return Ok(message);
        }
        let payload = std::mem::take(&mut message.payload);
        // Hashing a large payload takes milliseconds: off the async
        // workers, and alongside the write (the two share no state).
        let hashing = payload.clone();
        let (digest, key) = tokio::join!(
            tokio::task::spawn_blocking(move || claim_digest(&hashing)),
            policy.store.put(&message.topic, payload)
        );
        let digest =
            digest.map_err(|e| ClaimError::Store(format!("hashing a claim payload: {e}")))?;
        let key = key?;
        self.put_bytes.inc_by(size);
        message
            .headers
            .push((CLAIM_HEADER.into(), policy.store.reference(&key)));
        message
            .headers
            .push((CLAIM_SIZE_HEADER.into(), size.to_string()));
        message.headers.push((CLAIM_DIGEST_HEADER.into(), digest));
        Ok(message)
    }

    /// The payload a reference points to, checked against its size and
    /// hash; `None` when `message` is not a reference.
    ///
    /// # Errors
    ///
    /// [`ClaimError::Missing`] when the object is not there (or no
    /// configured store holds it, or its bytes do not match);
    /// [`ClaimError::Store`] when the store failed.
    pub async fn resolve(&self, message: &Message) -> Result<Option<Bytes>, ClaimError> {
        if !is_reference(message) {
            return Ok(None);
        }
        let reference = message.header(CLAIM_HEADER).unwrap_or_default();
        let Some((store, key)) = self
            .stores
            .iter()
            .find_map(|s| s.key_of(reference).map(|k| (s, k)))
        else {
            return Err(ClaimError::Missing(format!(
                "`{reference}` is in no claim store this daemon has configured"
            )));
        };
        let payload = match store.get(key).await {
            Ok(payload) => {
                if self
                    .read_failing
                    .swap(false, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::info!("the claim store answers again");
                }
                payload
            }
            Err(ClaimError::Store(why)) => {
                if !self
                    .read_failing
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    tracing::warn!(error = %why, "cannot read the claim store; claim-checked messages wait for it, no attempt spent (logged once per outage)");
                }
                return Err(ClaimError::Store(why));
            }
            Err(e) => return Err(e),
        };
        self.get_bytes.inc_by(payload.len() as u64);
        if let Some(size) = message.header(CLAIM_SIZE_HEADER)
            && size.parse::<usize>().ok() != Some(payload.len())
        {
            return Err(ClaimError::Missing(format!(
                "`{reference}` holds {} bytes, but the reference says {size}",
                payload.len()
            )));
        }
        let check = match (
            message.header(CLAIM_DIGEST_HEADER),
            message.header(CLAIM_SHA256_HEADER),
        ) {
            (Some(expected), _) => Some((expected, "blake3", claim_digest as fn(&[u8]) -> String)),
            (None, Some(expected)) => Some((expected, "sha256", sha256_hex as fn(&[u8]) -> String)),
            (None, None) => None,
        };
        if let Some((expected, name, hash)) = check {
            let hashing = payload.clone();
            let actual = tokio::task::spawn_blocking(move || hash(&hashing))
                .await
                .map_err(|e| ClaimError::Store(format!("hashing a claim payload: {e}")))?;
            if !expected.eq_ignore_ascii_case(&actual) {
                return Err(ClaimError::Missing(format!(
                    "`{reference}` does not match the reference's {name}"
                )));
            }
        }
        Ok(Some(payload))
    }
}

/// `broker` wrapped in a [`ClaimingBroker`] when any of `pipelines` has a
/// claim check (with the stores opened), else `broker` itself.
///
/// # Errors
///
/// A store cannot be opened.
pub fn wrap_broker(
    broker: Arc<dyn crate::broker::Broker>,
    pipelines: &[Pipeline],
) -> Result<Arc<dyn crate::broker::Broker>, ClaimError> {
    Ok(match Claims::from_pipelines(pipelines)? {
        Some(claims) => Arc::new(ClaimingBroker::new(broker, Arc::new(claims))),
        None => broker,
    })
}

/// Whether `message` is a claim reference: the header, and an empty body.
pub fn is_reference(message: &Message) -> bool {
    message.payload.is_empty() && message.header(CLAIM_HEADER).is_some()
}

/// Removes the claim headers (what a handler must not see or copy on).
pub fn strip_claim_headers(headers: &mut Vec<(String, String)>) {
    headers.retain(|(name, _)| {
        name != CLAIM_HEADER
            && name != CLAIM_SIZE_HEADER
            && name != CLAIM_DIGEST_HEADER
            && name != CLAIM_SHA256_HEADER
    });
}

/// The hash a reference carries: BLAKE3, lowercase hex.
pub fn claim_digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for byte in digest {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HumanDuration, HumanSize};

    fn check(store: &str) -> ClaimCheck {
        ClaimCheck {
            store: store.into(),
            threshold: HumanSize(16),
            retention: HumanDuration::secs(60),
            max_payload: HumanSize(1024),
            region: None,
            endpoint: None,
            allow_http: false,
        }
    }

    fn claims() -> Claims {
        Claims::new(vec![("big".into(), check("memory://t"))]).expect("memory store")
    }

    #[tokio::test]
    async fn offloads_above_the_threshold_and_resolves_back() {
        let claims = claims();
        let payload = Bytes::from(vec![7u8; 100]);
        let message = claims
            .offload(Message::new("1", "big", payload.clone()))
            .await
            .expect("offloaded");
        assert!(message.payload.is_empty());
        let reference = message.header(CLAIM_HEADER).expect("a reference");
        assert!(reference.starts_with("memory://t/big/"), "{reference}");
        assert_eq!(message.header(CLAIM_SIZE_HEADER), Some("100"));
        assert_eq!(
            message.header(CLAIM_DIGEST_HEADER),
            Some(claim_digest(&payload).as_str())
        );
        let resolved = claims.resolve(&message).await.expect("resolves");
        assert_eq!(resolved, Some(payload));
        // A reference passes as it is (DLQ, redrive).
        let again = claims.offload(message.clone()).await.expect("passes");
        assert_eq!(again, message);
    }

    #[tokio::test]
    async fn a_reference_with_the_earlier_sha256_header_is_still_checked() {
        let claims = claims();
        let payload = Bytes::from(vec![9u8; 100]);
        let mut message = claims
            .offload(Message::new("1", "big", payload.clone()))
            .await
            .expect("offloaded");
        message
            .headers
            .retain(|(name, _)| name != CLAIM_DIGEST_HEADER);
        message
            .headers
            .push((CLAIM_SHA256_HEADER.into(), sha256_hex(&payload)));
        assert_eq!(claims.resolve(&message).await, Ok(Some(payload)));
        for (name, value) in &mut message.headers {
            if name == CLAIM_SHA256_HEADER {
                *value = "00".into();
            }
        }
        assert!(matches!(
            claims.resolve(&message).await,
            Err(ClaimError::Missing(why)) if why.contains("sha256")
        ));
        let mut headers = message.headers.clone();
        strip_claim_headers(&mut headers);
        assert!(headers.is_empty(), "{headers:?}");
    }

    #[tokio::test]
    async fn small_and_unchecked_payloads_stay_inline() {
        let claims = claims();
        let small = Message::new("1", "big", &b"tiny"[..]);
        assert_eq!(claims.offload(small.clone()).await, Ok(small.clone()));
        assert_eq!(claims.resolve(&small).await, Ok(None));
        let other = Message::new("2", "other", vec![1u8; 5000]);
        assert_eq!(claims.offload(other.clone()).await, Ok(other));
    }

    #[tokio::test]
    async fn refuses_above_max_payload() {
        let claims = claims();
        let err = claims
            .offload(Message::new("1", "big", vec![0u8; 2000]))
            .await
            .expect_err("too large");
        assert!(matches!(
            err,
            ClaimError::TooLarge {
                size: 2000,
                max: 1024,
                ..
            }
        ));
    }

    #[tokio::test]
    async fn a_missing_or_altered_object_is_claim_missing() {
        let claims = claims();
        let message = claims
            .offload(Message::new("1", "big", vec![1u8; 100]))
            .await
            .expect("offloaded");
        let mut altered = message.clone();
        for (name, value) in &mut altered.headers {
            if name == CLAIM_DIGEST_HEADER {
                *value = "00".into();
            }
        }
        assert!(matches!(
            claims.resolve(&altered).await,
            Err(ClaimError::Missing(_))
        ));
        let reference = message.header(CLAIM_HEADER).expect("a reference");
        let store = &claims.stores()[0];
        store
            .delete(store.key_of(reference).expect("in the store"))
            .await
            .expect("deleted");
        assert!(matches!(
            claims.resolve(&message).await,
            Err(ClaimError::Missing(_))
        ));
        let mut foreign = message;
        foreign.headers = vec![(CLAIM_HEADER.into(), "s3://elsewhere/x".into())];
        assert!(matches!(
            claims.resolve(&foreign).await,
            Err(ClaimError::Missing(_))
        ));
    }

    #[tokio::test]
    async fn file_stores_write_durably_and_list_by_age() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("file://{}", dir.path().display());
        let claims = Claims::new(vec![("big".into(), check(&url))]).expect("file store");
        let message = claims
            .offload(Message::new("1", "big", vec![3u8; 100]))
            .await
            .expect("offloaded");
        let store = &claims.stores()[0];
        let key = store
            .key_of(message.header(CLAIM_HEADER).expect("ref"))
            .expect("key");
        let on_disk = store.root().expect("a directory").join(key);
        assert_eq!(std::fs::read(&on_disk).expect("the file"), vec![3u8; 100]);
        let future = std::time::SystemTime::now() + Duration::from_secs(3600);
        assert_eq!(
            store.list_older_than(future).await.expect("listed"),
            vec![key.to_owned()]
        );
        let past = std::time::SystemTime::now() - Duration::from_secs(3600);
        assert!(
            store
                .list_older_than(past)
                .await
                .expect("listed")
                .is_empty()
        );
        assert_eq!(
            claims.resolve(&message).await.expect("resolves"),
            Some(Bytes::from(vec![3u8; 100]))
        );
    }
}
