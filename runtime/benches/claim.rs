//! Claim-check cost: a 10 MB round trip through the claim check against a
//! direct `object_store` put + get of the same bytes to the same store.
//!
//! `cargo bench -p sluice --bench claim` prints a Markdown table, one row
//! per store: a `file://` store in a temporary directory, and an S3 store
//! on a moto server of the bench's own (skipped, with a note, when moto is
//! not installed; `cargo xtask test` installs it). `CLAIM_BENCH_STORES`
//! (`file`, `s3`, or both, comma-separated) picks the rows. Samples
//! alternate between the sides so noise from a shared machine lands on
//! every side; each figure is the median of `CLAIM_BENCH_SAMPLES`
//! (default 15), after one warm-up round.
//!
//! Sides, each against the same store:
//!
//! - **claim round trip**: publish through [`ClaimingBroker`] over the
//!   embedded broker (BLAKE3 hash, durable write, then the reference
//!   published with the broker's own fsync), fetch the reference, resolve
//!   it (read + size and hash check), ack;
//! - **claim offload + resolve**: the same claim-check work without the
//!   broker (`Claims::offload` + `Claims::resolve`);
//! - **direct put + get**: the store's own `put` + `get`. On S3 a put is
//!   durable when it returns; `LocalFileSystem::put` never fsyncs, so for
//!   `file://` there is one more side,
//! - **direct put + fsync + get**: the same plus an fsync of the file and
//!   its directory, the durability the claim check promises.

#![allow(missing_docs)]

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sluice::broker::embedded::{EmbeddedBroker, EmbeddedOptions};
use sluice::broker::{Broker, ConsumerSpec, Message, TopicSpec};
use sluice::claim::{ClaimingBroker, Claims};
use sluice::config::{ClaimCheck, HumanDuration, HumanSize};
use sluice_harness::moto::MotoServer;

/// The same allocator as the `sluice` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PAYLOAD: usize = 10_000_000;

/// One store's figures, medians.
struct Row {
    store: &'static str,
    round: Duration,
    inner: Duration,
    /// The offload alone, of `inner`.
    offload: Duration,
    direct: Duration,
    /// `file://` only: the direct put made as durable as the claim check's.
    direct_fsync: Option<Duration>,
}

/// The store under test, for the direct sides.
struct Direct {
    store: Arc<dyn ObjectStore>,
    /// For `file://`: the directory objects land in, to fsync them.
    root: Option<PathBuf>,
}

fn main() {
    let stores = std::env::var("CLAIM_BENCH_STORES").unwrap_or_else(|_| "file,s3".into());
    let samples: usize = std::env::var("CLAIM_BENCH_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let dir = tempfile::tempdir().expect("dir");
    let moto = if stores.contains("s3") {
        match MotoServer::start() {
            Ok(moto) => {
                moto.create_bucket("claims").expect("bucket");
                // The claim store reads its credentials from the standard
                // AWS variables, as the daemon does.
                for (name, value) in moto.env() {
                    set_env(&name, &value);
                }
                Some(moto)
            }
            Err(e) => {
                eprintln!("skipping the S3 row: moto did not start ({e:#})");
                None
            }
        }
    } else {
        None
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows = Vec::new();
    runtime.block_on(async {
        if stores.contains("file") {
            let root = dir.path().join("claims");
            std::fs::create_dir_all(&root).expect("store dir");
            let check = claim_check(format!("file://{}", root.display()), None);
            let direct = Direct {
                store: Arc::new(
                    object_store::local::LocalFileSystem::new_with_prefix(&root).expect("local"),
                ),
                root: Some(root),
            };
            rows.push(measure("file://", check, direct, &dir.path().join("file"), samples).await);
        }
        if let Some(moto) = &moto {
            let check = claim_check("s3://claims/bench".into(), Some(moto.endpoint()));
            let direct = Direct {
                store: Arc::new(
                    object_store::aws::AmazonS3Builder::from_env()
                        .with_bucket_name("claims")
                        .with_endpoint(moto.endpoint())
                        .with_allow_http(true)
                        .build()
                        .expect("s3 client"),
                ),
                root: None,
            };
            rows.push(
                measure(
                    "s3:// (moto)",
                    check,
                    direct,
                    &dir.path().join("s3"),
                    samples,
                )
                .await,
            );
        }
    });
    print_table(&rows, samples);
}

/// Sets an environment variable while the process has one thread.
#[allow(unsafe_code)]
fn set_env(name: &str, value: &str) {
    // SAFETY: called from `main` before the runtime (or any other thread)
    // starts, so nothing can read the environment concurrently.
    unsafe { std::env::set_var(name, value) }
}

fn claim_check(store: String, endpoint: Option<String>) -> ClaimCheck {
    ClaimCheck {
        store,
        threshold: HumanSize(256 << 10),
        retention: HumanDuration::secs(3600),
        max_payload: HumanSize::mib(64),
        region: None,
        allow_http: endpoint.is_some(),
        endpoint,
    }
}

async fn measure(
    label: &'static str,
    check: ClaimCheck,
    direct: Direct,
    data: &FsPath,
    samples: usize,
) -> Row {
    let claims = Arc::new(Claims::new(vec![("big".into(), check)]).expect("claims"));
    let embedded = EmbeddedBroker::open(EmbeddedOptions::new(data)).expect("broker");
    let broker = ClaimingBroker::new(embedded, claims.clone());
    broker
        .ensure_topic(&TopicSpec {
            subscribed: true,
            ..TopicSpec::new("big")
        })
        .await
        .expect("topic");
    broker
        .ensure_consumer(&ConsumerSpec {
            name: "bench.claim".into(),
            topic: "big".into(),
            filter: Default::default(),
            ack_wait: Duration::from_secs(60),
            max_ack_pending: None,
            max_deliver: None,
        })
        .await
        .expect("consumer");
    let payload = Bytes::from(
        (0..PAYLOAD)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8)
            .collect::<Vec<u8>>(),
    );

    let (mut round, mut inner, mut plain, mut synced) = (vec![], vec![], vec![], vec![]);
    let mut offload = vec![];
    for i in 0..=samples {
        // Claim round trip through the broker.
        let started = Instant::now();
        broker
            .publish(vec![Message::new(format!("m{i}"), "big", payload.clone())])
            .await
            .expect("publish");
        let delivery = broker
            .fetch("bench.claim", 1, Duration::from_secs(5))
            .await
            .expect("fetch")
            .pop()
            .expect("a delivery");
        let resolved = claims
            .resolve(&delivery.message)
            .await
            .expect("resolve")
            .expect("a reference");
        assert_eq!(resolved.len(), PAYLOAD);
        drop(resolved);
        broker.ack(&delivery.receipt).await.expect("ack");
        let t_round = started.elapsed();
        let mut written = vec![reference_of(&delivery.message)];

        // The claim check's own work.
        let started = Instant::now();
        let reference = claims
            .offload(Message::new(format!("o{i}"), "big", payload.clone()))
            .await
            .expect("offload");
        let t_offload = started.elapsed();
        let resolved = claims.resolve(&reference).await.expect("resolve");
        assert_eq!(resolved.map(|b| b.len()), Some(PAYLOAD));
        let t_inner = started.elapsed();
        written.push(reference_of(&reference));

        let t_plain = direct_round_trip(&direct, &format!("direct/{i}"), &payload, false).await;
        let t_synced = match direct.root {
            Some(_) => {
                Some(direct_round_trip(&direct, &format!("synced/{i}"), &payload, true).await)
            }
            None => None,
        };

        // Untimed: every object of this round is deleted, so that no side
        // pays for writing back another's dirty pages (an fsync on ext4
        // can flush more than its own file).
        let store = &claims.stores()[0];
        for reference in written {
            let key = store.key_of(&reference).expect("a key").to_owned();
            store.delete(&key).await.expect("delete");
        }
        for key in [format!("direct/{i}"), format!("synced/{i}")] {
            match direct.store.delete(&Path::from(key)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => panic!("delete: {e}"),
            }
        }

        if i > 0 {
            // The first round warms the page cache, the connections and the
            // broker.
            round.push(t_round);
            inner.push(t_inner);
            offload.push(t_offload);
            plain.push(t_plain);
            synced.extend(t_synced);
        }
    }
    Row {
        store: label,
        round: median(round),
        inner: median(inner),
        offload: median(offload),
        direct: median(plain),
        direct_fsync: (!synced.is_empty()).then(|| median(synced)),
    }
}

/// The claim reference `message` carries.
fn reference_of(message: &Message) -> String {
    message
        .header(sluice::claim::CLAIM_HEADER)
        .expect("a claim reference")
        .to_owned()
}

/// A direct put of `payload` as `key`, optionally fsynced (file and
/// directory), then a get of it.
async fn direct_round_trip(direct: &Direct, key: &str, payload: &Bytes, fsync: bool) -> Duration {
    let path = Path::from(key);
    let started = Instant::now();
    direct
        .store
        .put(&path, PutPayload::from_bytes(payload.clone()))
        .await
        .expect("put");
    if let (true, Some(root)) = (fsync, &direct.root) {
        let file = root.join(key);
        tokio::task::spawn_blocking(move || {
            std::fs::File::open(&file)?.sync_all()?;
            std::fs::File::open(file.parent().expect("dir"))?.sync_all()
        })
        .await
        .expect("join")
        .expect("fsync");
    }
    let got = direct
        .store
        .get(&path)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes");
    assert_eq!(got.len(), PAYLOAD);
    started.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn print_table(rows: &[Row], samples: usize) {
    let ratio = |a: Duration, b: Duration| format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64());
    println!("\n10 MB payload, median of {samples} alternating samples\n");
    println!(
        "| store | claim round trip (broker) | claim offload + resolve | of which offload | direct put + get | direct put + fsync + get | round trip / direct | offload+resolve / direct | round trip / direct+fsync |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let dash = || "-".to_owned();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.store,
            ms(row.round),
            ms(row.inner),
            ms(row.offload),
            ms(row.direct),
            row.direct_fsync.map_or_else(dash, ms),
            ratio(row.round, row.direct),
            ratio(row.inner, row.direct),
            row.direct_fsync
                .map_or_else(dash, |synced| ratio(row.round, synced)),
        );
    }
}
