//! The Kafka source and sink against a raw Kafka loop, side by side in
//! one run (samples alternate A, B, A, B, ...; figures are medians).
//!
//! `cargo bench -p sluice-tests --bench connect_kafka`; in the debug
//! test profile (`cargo test -p sluice-tests --bench connect_kafka`) it
//! runs a small N, to check that it works. `SLUICE_BENCH_N` sets N. The
//! broker is tansu (`sluice_harness::tansu`, SQLite storage), which bounds
//! both sides alike.
//!
//! - **A, raw loop**: one Rust task, rdkafka: a consumer of group `raw`
//!   takes up to b messages from topic `raw-in` (4 partitions), produces
//!   them to `raw-out` (idempotent, `acks=all`), awaits every delivery
//!   report, commits the offsets; until N are delivered.
//! - **B, sluice**: the real `sluice run` binary (embedded broker, durable,
//!   default sync): a Kafka source (`batch: b`) -> `identity` stage
//!   (concurrency 2) -> Kafka sink (concurrency 2, `batch: {max: b}`);
//!   until N messages are in `out` (the sum of its high watermarks).
//!
//! Each for a batch size b of 100 and of 1,000. Both start timing when the
//! producer starts writing N messages of 64 B to the input topic, with
//! the reader already waiting (the daemon's start-up and the group's
//! first assignment are not timed). Target: B >= 0.7 x A (messages/s).

#![allow(missing_docs)]

use sluice_tests::bench;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rdkafka::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use sluice_harness::tansu::TansuServer;
use sluice_tests::Daemon;

const SAMPLES: usize = 5;
const BATCHES: [usize; 2] = [100, 1000];
const PARTITIONS: usize = 4;

fn main() {
    let (n, samples) = bench::size(2_000, 20_000, SAMPLES);
    let rt = bench::runtime();
    sluice_harness::plugin("identity");
    let server = TansuServer::start().expect("tansu");
    let brokers = server.brokers();
    bench::side_by_side(
        &BATCHES,
        samples,
        |batch, run| rt.block_on(raw_loop(&brokers, n, batch, run)),
        |batch, run| through_sluice(&rt, &brokers, n, batch, run),
        |batch| {
            format!(
                "kafka topic -> kafka topic (tansu), {n} x 64 B, batch {batch}, messages/s: raw consume+produce+commit loop | sluice source -> identity -> sink (embedded, durable)"
            )
        },
    );
}

/// Creates `topic` with the outside client (tansu does not create topics
/// on first use the way the benchmark needs).
fn create(brokers: &str, topic: &str) {
    let script = sluice_harness::repo_root().join("tests/fixtures/kafka_client.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(["create", brokers, topic, &PARTITIONS.to_string()])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "create {topic}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn producer(brokers: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .expect("producer")
}

/// Writes `n` messages of 64 B to `topic`, awaiting every report.
async fn produce(brokers: &str, topic: &str, n: usize) {
    let producer = producer(brokers);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let sent: Vec<_> = chunk
            .iter()
            .map(|i| {
                let payload = format!("{i:0>64}");
                let key = i.to_string();
                producer
                    .send_result(FutureRecord::to(topic).payload(&payload).key(&key))
                    .map_err(|(e, _)| e)
                    .expect("queue")
            })
            .collect();
        for result in join_all(sent).await {
            result.expect("report").expect("delivered");
        }
    }
}

/// A: the raw loop, in messages/s.
async fn raw_loop(brokers: &str, n: usize, batch: usize, run: &str) -> f64 {
    let (input, output) = (format!("raw-in-{run}"), format!("raw-out-{run}"));
    create(brokers, &input);
    create(brokers, &output);
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("raw-{run}"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer");
    consumer.subscribe(&[&input]).expect("subscribe");
    let out = producer(brokers);
    // Wait for the assignment before timing.
    let started = Instant::now();
    while consumer.assignment().map(|a| a.count()).unwrap_or(0) == 0 {
        let _ = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await;
        assert!(started.elapsed() < Duration::from_secs(60), "no assignment");
    }
    let started = Instant::now();
    let feeder = {
        let (brokers, input) = (brokers.to_owned(), input.clone());
        tokio::spawn(async move { produce(&brokers, &input, n).await })
    };
    let mut done = 0;
    while done < n {
        let mut taken = Vec::with_capacity(batch);
        while taken.len() < batch {
            let wait = if taken.is_empty() { 1000 } else { 5 };
            match tokio::time::timeout(Duration::from_millis(wait), consumer.recv()).await {
                Ok(Ok(m)) => taken.push((
                    m.partition(),
                    m.offset(),
                    m.key().map(<[u8]>::to_vec),
                    m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                )),
                Ok(Err(e)) => panic!("consume: {e}"),
                Err(_) => break,
            }
        }
        if taken.is_empty() {
            continue;
        }
        let sent: Vec<_> = taken
            .iter()
            .map(|(_, _, key, payload)| {
                let mut record = FutureRecord::<[u8], [u8]>::to(&output).payload(payload);
                if let Some(key) = key {
                    record = record.key(key);
                }
                out.send_result(record).map_err(|(e, _)| e).expect("queue")
            })
            .collect();
        for result in join_all(sent).await {
            result.expect("report").expect("delivered");
        }
        let mut commit = TopicPartitionList::new();
        let mut last = std::collections::BTreeMap::new();
        for (p, o, _, _) in &taken {
            let e = last.entry(*p).or_insert(*o);
            *e = (*e).max(*o);
        }
        for (p, o) in last {
            commit
                .add_partition_offset(&input, p, Offset::Offset(o + 1))
                .expect("offset");
        }
        consumer.commit(&commit, CommitMode::Async).expect("commit");
        done += taken.len();
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    feeder.await.expect("producer");
    rate
}

/// The sum of `topic`'s high watermarks.
fn delivered(probe: &StreamConsumer, topic: &str) -> i64 {
    (0..PARTITIONS as i32)
        .map(|p| {
            probe
                .fetch_watermarks(topic, p, Duration::from_secs(5))
                .map(|(_, high)| high)
                .unwrap_or(0)
        })
        .sum()
}

/// B: through the real daemon, in messages/s.
fn through_sluice(
    rt: &tokio::runtime::Runtime,
    brokers: &str,
    n: usize,
    batch: usize,
    run: &str,
) -> bench::Sample {
    let (input, output) = (format!("in-{run}"), format!("out-{run}"));
    create(brokers, &input);
    create(brokers, &output);
    let dir = tempfile::tempdir().expect("dir");
    let buffer = (batch * 4).max(2000);
    let file = bench::round_trip_pipeline(
        dir.path(),
        None,
        batch,
        &format!(
            r#"kafka: {{brokers: "{brokers}", topic: {input}, group: g-{run}, start: earliest, batch: {batch}, buffer: {buffer}}}"#
        ),
        &format!(r#"kafka: {{brokers: "{brokers}", topic: {output}}}"#),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    let _guard = rt.enter();
    let probe: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("probe-{run}"))
        .create()
        .expect("probe");
    // The group has its partitions once the source reports its lag.
    let started = Instant::now();
    while !daemon
        .get("/v1/sources")
        .to_string()
        .contains("partition_lag")
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no assignment"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let window = bench::Window::start(&daemon);
    rt.block_on(produce(brokers, &input, n));
    loop {
        let got = delivered(&probe, &output);
        if got >= n as i64 {
            break;
        }
        assert!(
            window.elapsed() < Duration::from_secs(600),
            "only {got} of {n} arrived; log:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    window.finish(&daemon, n)
}
