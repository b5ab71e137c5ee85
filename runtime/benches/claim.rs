//! Claim-check cost: a 10 MB round trip through the claim check against a
//! direct `object_store` put + get of the same bytes to the same store.
//!
//! `cargo bench -p sluice --bench claim` prints a Markdown table. Samples
//! alternate between the sides so noise from a shared machine lands on
//! every side; each figure is the median of [`SAMPLES`].
//!
//! Sides (all on one `file://` store in a temporary directory):
//!
//! - **claim round trip**: publish through [`ClaimingBroker`] over the
//!   embedded broker (BLAKE3 hash, durable write: fsync of the file and its
//!   directory, then the reference published with the broker's own fsync),
//!   fetch the reference, resolve it (read + size and hash check), ack;
//! - **claim offload + resolve**: the same claim-check work without the
//!   broker (`Claims::offload` + `Claims::resolve`);
//! - **direct put + get**: `LocalFileSystem::put` + `get` (no fsync);
//! - **direct put + fsync + get**: the same plus an fsync of the file and
//!   its directory, the durability the claim check promises.

#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use sluice::broker::embedded::{EmbeddedBroker, EmbeddedOptions};
use sluice::broker::{Broker, ConsumerSpec, Message, TopicSpec};
use sluice::claim::{ClaimingBroker, Claims};
use sluice::config::{ClaimCheck, HumanDuration, HumanSize};

/// The same allocator as the `sluice` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PAYLOAD: usize = 10_000_000;
const SAMPLES: usize = 15;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().expect("dir");
    let store_dir = dir.path().join("claims");
    std::fs::create_dir_all(&store_dir).expect("store dir");
    let check = ClaimCheck {
        store: format!("file://{}", store_dir.display()),
        threshold: HumanSize(256 << 10),
        retention: HumanDuration::secs(3600),
        max_payload: HumanSize::mib(64),
        region: None,
        endpoint: None,
        allow_http: false,
    };
    let claims = Arc::new(Claims::new(vec![("big".into(), check)]).expect("claims"));
    let embedded =
        EmbeddedBroker::open(EmbeddedOptions::new(dir.path().join("data"))).expect("broker");
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
    let direct = LocalFileSystem::new_with_prefix(&store_dir).expect("local fs");
    let payload = Bytes::from(
        (0..PAYLOAD)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761) as u8)
            .collect::<Vec<u8>>(),
    );

    let (mut round, mut inner, mut plain, mut synced) = (vec![], vec![], vec![], vec![]);
    for i in 0..SAMPLES + 1 {
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

        // The claim check's own work.
        let started = Instant::now();
        let reference = claims
            .offload(Message::new(format!("o{i}"), "big", payload.clone()))
            .await
            .expect("offload");
        let resolved = claims.resolve(&reference).await.expect("resolve");
        assert_eq!(resolved.map(|b| b.len()), Some(PAYLOAD));
        let t_inner = started.elapsed();

        // Direct put + get.
        let path = Path::from(format!("direct/{i}"));
        let started = Instant::now();
        direct
            .put(&path, PutPayload::from_bytes(payload.clone()))
            .await
            .expect("put");
        let got = direct
            .get(&path)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(got.len(), PAYLOAD);
        let t_plain = started.elapsed();

        // Direct put + fsync + get.
        let path = Path::from(format!("synced/{i}"));
        let started = Instant::now();
        direct
            .put(&path, PutPayload::from_bytes(payload.clone()))
            .await
            .expect("put");
        let file = store_dir.join("synced").join(i.to_string());
        tokio::task::spawn_blocking(move || {
            std::fs::File::open(&file)?.sync_all()?;
            std::fs::File::open(file.parent().expect("dir"))?.sync_all()
        })
        .await
        .expect("join")
        .expect("fsync");
        let got = direct
            .get(&path)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes");
        assert_eq!(got.len(), PAYLOAD);
        let t_synced = started.elapsed();

        if i > 0 {
            // The first round warms the page cache and the broker.
            round.push(t_round);
            inner.push(t_inner);
            plain.push(t_plain);
            synced.push(t_synced);
        }
    }
    let (round, inner, plain, synced) =
        (median(round), median(inner), median(plain), median(synced));
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!("\n10 MB payload, file:// store, median of {SAMPLES} alternating samples\n");
    println!(
        "| claim round trip (broker) | claim offload + resolve | direct put + get | direct put + fsync + get | round trip / direct | offload+resolve / direct | round trip / direct+fsync |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {:.2}x | {:.2}x | {:.2}x |",
        ms(round),
        ms(inner),
        ms(plain),
        ms(synced),
        ratio(round, plain),
        ratio(inner, plain),
        ratio(round, synced),
    );
}
