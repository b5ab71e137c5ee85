use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::*;

/// Committed state in memory, for the [`Txn`] rules alone.
#[derive(Default)]
struct Committed(Mutex<BTreeMap<String, Entry>>);

impl Committed {
    fn with(entries: &[(&str, &str, u64, u64)]) -> Arc<Self> {
        let committed = Committed::default();
        for (key, value, revision, expires_at) in entries {
            committed.0.lock().expect("lock").insert(
                (*key).to_owned(),
                Entry {
                    value: value.as_bytes().to_vec(),
                    revision: *revision,
                    expires_at: *expires_at,
                    writer: "m0".into(),
                    written_at: 1,
                },
            );
        }
        Arc::new(committed)
    }
}

#[async_trait::async_trait]
impl StateReader for Committed {
    async fn get(&self, _store: &str, key: &str) -> Result<Option<Entry>, String> {
        Ok(self.0.lock().expect("lock").get(key).cloned())
    }

    async fn list(
        &self,
        _store: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Entry)>, String> {
        Ok(self
            .0
            .lock()
            .expect("ok")
            .iter()
            .filter(|(k, _)| k.starts_with(prefix) && after.is_none_or(|a| k.as_str() > a))
            .take(limit)
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect())
    }

    async fn meta(&self, _store: &str) -> Result<StoreMeta, String> {
        let entries = self.0.lock().expect("lock");
        Ok(StoreMeta {
            revision: entries.values().map(|e| e.revision).max().unwrap_or(0),
            bytes: entries.iter().map(|(k, e)| e.size(k)).sum(),
            keys: entries.len() as u64,
        })
    }
}

const NOW: u64 = 1_000_000;

fn txn(reader: Arc<Committed>, max_bytes: u64) -> Txn {
    Txn::new(
        StateAccess {
            reader,
            store: "p/s".into(),
            max_bytes,
        },
        "m1".into(),
        NOW,
    )
}

#[tokio::test]
async fn a_call_reads_its_own_writes_and_commits_only_what_it_wrote() {
    let mut t = txn(Committed::with(&[("a", "1", 5, 0)]), 1 << 20);
    assert_eq!(
        t.get("a").await.expect("ok"),
        Some(Seen {
            value: b"1".to_vec(),
            revision: 5
        })
    );
    t.set("b", b"x".to_vec(), None).await.expect("ok");
    assert_eq!(t.get("b").await.expect("ok").expect("ok").revision, PENDING);
    t.delete("a").await.expect("ok");
    assert_eq!(t.get("a").await.expect("ok"), None);
    let writes = t.finish().expect("writes");
    // Only what was read from the store is checked at commit.
    assert_eq!(writes.checks, vec![("a".to_owned(), 5)]);
    assert_eq!(
        writes.writes,
        vec![
            ("a".to_owned(), Write::Delete),
            (
                "b".to_owned(),
                Write::Put {
                    value: b"x".to_vec(),
                    expires_at: 0
                }
            )
        ]
    );
    assert_eq!(writes.writer, "m1");
}

#[tokio::test]
async fn a_call_that_only_reads_commits_nothing() {
    let mut t = txn(Committed::with(&[("a", "1", 5, 0)]), 1 << 20);
    t.get("a").await.expect("ok");
    t.list("", 10).await.expect("ok");
    assert!(t.finish().is_none());
}

#[tokio::test]
async fn increment_counts_from_zero_keeps_the_expiry_and_notes_what_it_read() {
    let mut t = txn(Committed::with(&[("n", "41", 3, NOW + 500)]), 1 << 20);
    assert_eq!(t.increment("n", 1).await.expect("ok"), 42);
    assert_eq!(t.increment("n", 2).await.expect("ok"), 44);
    assert_eq!(t.increment("fresh", -3).await.expect("ok"), -3);
    let writes = t.finish().expect("ok");
    assert_eq!(
        writes.checks,
        vec![("fresh".to_owned(), 0), ("n".to_owned(), 3)]
    );
    assert_eq!(
        writes.writes[1],
        (
            "n".to_owned(),
            Write::Put {
                value: b"44".to_vec(),
                expires_at: NOW + 500
            }
        )
    );
}

#[tokio::test]
async fn increment_refuses_text_and_overflow() {
    let mut t = txn(
        Committed::with(&[
            ("word", "hello", 1, 0),
            ("big", &i64::MAX.to_string(), 2, 0),
        ]),
        1 << 20,
    );
    assert!(matches!(
        t.increment("word", 1).await,
        Err(StateError::Invalid(_))
    ));
    assert!(matches!(
        t.increment("big", 1).await,
        Err(StateError::Invalid(_))
    ));
    assert!(t.finish().is_none(), "a refused increment writes nothing");
}

#[tokio::test]
async fn compare_and_set_is_a_lock_that_expires() {
    // Held until NOW + 10.
    let reader = Committed::with(&[("lock", "holder-1", 7, NOW + 10)]);
    let mut t = txn(reader.clone(), 1 << 20);
    assert!(
        !t.compare_and_set("lock", 0, b"holder-2".to_vec(), Some(1000))
            .await
            .expect("ok")
    );
    assert!(
        t.finish().is_none(),
        "a refused compare-and-set writes nothing"
    );

    // After the TTL the key reads as absent: revision 0 takes it, and the
    // commit still checks the expired entry's revision.
    let mut later = Txn::new(
        StateAccess {
            reader,
            store: "p/s".into(),
            max_bytes: 1 << 20,
        },
        "m2".into(),
        NOW + 10,
    );
    assert_eq!(later.get("lock").await.expect("ok"), None);
    assert!(
        later
            .compare_and_set("lock", 0, b"holder-2".to_vec(), Some(1000))
            .await
            .expect("ok")
    );
    let writes = later.finish().expect("ok");
    assert_eq!(writes.checks, vec![("lock".to_owned(), 7)]);
}

#[tokio::test]
async fn compare_and_set_on_the_revision_read() {
    let mut t = txn(Committed::with(&[("k", "v", 9, 0)]), 1 << 20);
    assert!(
        !t.compare_and_set("k", 8, b"w".to_vec(), None)
            .await
            .expect("ok")
    );
    assert!(
        t.compare_and_set("k", 9, b"w".to_vec(), None)
            .await
            .expect("ok")
    );
    // Now pending: only PENDING matches.
    assert!(
        !t.compare_and_set("k", 9, b"z".to_vec(), None)
            .await
            .expect("ok")
    );
    assert!(
        t.compare_and_set("k", PENDING, b"z".to_vec(), None)
            .await
            .expect("ok")
    );
}

#[tokio::test]
async fn a_full_store_refuses_growth_but_not_a_rewrite_of_the_same_size() {
    // "k" + "12345" = 6 bytes held; the limit is 8.
    let mut t = txn(Committed::with(&[("k", "12345", 1, 0)]), 8);
    assert!(matches!(
        t.set("other", b"abc".to_vec(), None).await,
        Err(StateError::StoreFull(_))
    ));
    t.set("k", b"54321".to_vec(), None).await.expect("ok");
    t.set("k", b"1234567".to_vec(), None).await.expect("ok");
    assert!(matches!(
        t.set("k", b"12345678".to_vec(), None).await,
        Err(StateError::StoreFull(_))
    ));
    // Deleting makes room within the call.
    t.delete("k").await.expect("ok");
    t.set("z", b"1234567".to_vec(), None).await.expect("ok");
}

#[tokio::test]
async fn keys_values_and_counts_are_bounded() {
    let mut t = txn(Committed::with(&[]), u64::MAX);
    assert!(matches!(t.get("").await, Err(StateError::Invalid(_))));
    assert!(matches!(
        t.get(&"k".repeat(MAX_KEY_BYTES + 1)).await,
        Err(StateError::Invalid(_))
    ));
    assert!(matches!(
        t.set("k", vec![0; MAX_VALUE_BYTES + 1], None).await,
        Err(StateError::Invalid(_))
    ));
    assert!(matches!(
        t.set("k", vec![], Some(0)).await,
        Err(StateError::Invalid(_))
    ));
    for i in 0..MAX_WRITES_PER_CALL {
        t.set(&format!("k{i}"), vec![], None).await.expect("ok");
    }
    assert!(matches!(
        t.set("one-more", vec![], None).await,
        Err(StateError::Invalid(_))
    ));
    assert!(matches!(
        t.list("", MAX_LIST + 1).await,
        Err(StateError::Invalid(_))
    ));
}

#[tokio::test]
async fn list_merges_the_calls_writes_and_skips_expired_and_deleted_keys() {
    let reader = Committed::with(&[
        ("a1", "", 1, 0),
        ("a2", "", 2, NOW - 1),
        ("a3", "", 3, 0),
        ("a4", "", 4, 0),
        ("b1", "", 5, 0),
    ]);
    let mut t = txn(reader, 1 << 20);
    t.delete("a3").await.expect("ok");
    t.set("a0", vec![], None).await.expect("ok");
    assert_eq!(t.list("a", 10).await.expect("ok"), ["a0", "a1", "a4"]);
    assert_eq!(t.list("a", 2).await.expect("ok"), ["a0", "a1"]);
    assert_eq!(t.list("c", 2).await.expect("ok"), Vec::<String>::new());
}
