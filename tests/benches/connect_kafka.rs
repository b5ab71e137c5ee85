//! The Kafka source and sink against raw rdkafka loops, side by side in
//! one run (samples alternate A, B, A, B, ...; figures are medians), on
//! Apache Kafka (`sluice_harness::kafka::KafkaServer`: one KRaft node, the
//! release the tests run); then how long partitions go unread while a
//! member of a group of two daemons leaves and joins.
//!
//! `cargo bench -p sluice-tests --bench connect_kafka` (it runs the release
//! `sluice` binary: `cargo build --release -p sluice` first); in the debug
//! test profile (`cargo test -p sluice-tests --bench connect_kafka`) it
//! runs a small N and one sample, to check that it works. `SLUICE_BENCH_N`
//! sets N, `SLUICE_BENCH_SAMPLES` the samples per side and
//! `SLUICE_BENCH_ONLY` which parts run (comma-separated: `round-trip`,
//! `source`, `sink`, `rebalance`; all by default).
//!
//! Every topic has 4 partitions and is made before its sample; messages
//! are 64 B with a key (their number), so they spread over the partitions.
//! The producers (the bench's and the sink's) are idempotent with
//! `acks=all` and `linger.ms=5`. Each row is one case, for a batch size b
//! of 100 and of 1,000; the daemon's side also gives its CPU time (user
//! and system, all threads, from `/proc/<pid>/stat`) per message over the
//! timed window. Target: B >= 0.7 x A (messages/s) for the round trip.
//!
//! - **Round trip.** Timing starts when the bench's producer starts
//!   writing N messages to the input topic (reports awaited per 1,000),
//!   with the reader already holding its partitions (the daemon's start-up
//!   and the group's first assignment are not timed).
//!   - A, raw loop: one Rust task, rdkafka: a consumer of group `raw`
//!     takes up to b messages (waiting 5 ms for more once it has one),
//!     produces each to the output topic with its key and a `sluice-id`
//!     header (as the sink does), awaits every delivery report, then
//!     commits the batch's offsets (asynchronously); until N are done.
//!   - B, sluice: the real `sluice run` binary (embedded broker, durable,
//!     default sync): a Kafka source (`batch: b`) -> `identity` stage
//!     (concurrency 2) -> Kafka sink (concurrency 2, `batch: {max: b,
//!     wait: 5ms}`); until N are in the output topic (the sum of its high
//!     watermarks, polled every 10 ms).
//! - **Source alone.** N messages are in the input topic before the
//!   reader starts (so the group's assignment is not timed); timing starts
//!   when the first of them is read and ends when the last is.
//!   - A: the round trip's consumer without the produce: take up to b,
//!     commit their offsets (asynchronously), until N are taken; from the
//!     first message's arrival, over N - 1.
//!   - B: a daemon whose pipeline is a Kafka source (`batch: b`) into a
//!     Sluice topic and nothing else; from the first time the topic's depth
//!     (`GET /v1/topics/in`, polled every 5 ms) is not zero, until it is N,
//!     over the messages after that first poll.
//! - **Sink alone.** N messages wait to be written; timing starts when the
//!   writing starts and ends when the last delivery is known. Both
//!   producers have written one message before (connected, producer id
//!   known).
//!   - A: one rdkafka producer: b messages sent (key, `sluice-id` header),
//!     every report awaited, then the next b; until N are delivered.
//!   - B: a daemon whose pipeline is a Sluice topic -> Kafka sink, as in
//!     the round trip (concurrency 2, so two batches may be in flight,
//!     `batch: {max: b, wait: 5ms}`); the N messages are published into the
//!     topic (the ingest API) while the sink is paused (`POST
//!     /v1/stages/bench/out/pause`); timing starts at the resume and ends
//!     when the output topic's high watermarks sum to N (polled every 5
//!     ms).
//!
//! **Rebalance pause** (a figure, not a test). Two daemons, each with its
//! own data, run the same pipeline: a Kafka source (group `reb`, the
//! defaults: classic protocol, cooperative-sticky assignor, `batch` 500,
//! `session_timeout` 10 s, so heartbeats every 3.3 s) into a Sluice topic.
//! The bench writes 1,000 messages a second to the input topic throughout.
//! Each cycle: 4 s steady; SIGTERM to the second daemon (a leave), then 15
//! s from the SIGTERM; it starts again (a join, with its data), 15 s.
//! Afterwards every message both daemons stored is read back with its
//! publish time (ms) and its id (`src:<partition>:<offset>`); a message is
//! new when its offset is past every offset of its partition stored
//! before it (a partition read again by its new owner from the committed
//! offset is not new). For each event (and for the steady seconds before
//! each leave, for comparison) it reports the longest time from the event
//! with nothing new on any partition, and the longest any one partition
//! went without anything new (`>` when that gap still ran at the end of
//! the 15 s); medians and maxima over the cycles (5 in a release build, 1
//! in debug). `SLUICE_BENCH_VERBOSE=1` also prints the gaps per partition
//! and cycle, both daemons' logs and the broker's (its group coordinator
//! says when each rebalance starts and ends).

#![allow(missing_docs)]

use sluice_tests::bench;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::json;
use sluice_harness::kafka::KafkaServer;
use sluice_tests::{Daemon, Msg, write_pipeline};

const SAMPLES: usize = 5;
const BATCHES: [usize; 2] = [100, 1000];
const PARTITIONS: usize = 4;
/// How long a sample may take before the bench gives up on it.
const LIMIT: Duration = Duration::from_secs(600);

/// What one row measures, with its batch size.
#[derive(Debug, Clone, Copy)]
enum Case {
    RoundTrip(usize),
    Source(usize),
    Sink(usize),
}

impl Case {
    fn name(self, n: usize) -> String {
        match self {
            Case::RoundTrip(b) => format!(
                "round trip, {n} x 64 B, batch {b}: raw consume+produce+commit vs source -> identity -> sink"
            ),
            Case::Source(b) => format!(
                "source alone, {n} x 64 B waiting, batch {b}: raw consume+commit vs source -> sluice topic"
            ),
            Case::Sink(b) => format!(
                "sink alone, {n} x 64 B waiting, batch {b}: raw produce, reports per batch vs sluice topic -> sink"
            ),
        }
    }
}

fn main() {
    let (n, samples) = bench::size(2_000, 20_000, SAMPLES);
    let only = std::env::var("SLUICE_BENCH_ONLY").unwrap_or_default();
    let runs = |part: &str| only.is_empty() || only.split(',').any(|p| p.trim() == part);
    let rt = bench::runtime();
    let server = KafkaServer::start().expect("Apache Kafka");
    let brokers = server.brokers();
    let mut cases = Vec::new();
    for b in BATCHES {
        if runs("round-trip") {
            cases.push(Case::RoundTrip(b));
        }
    }
    for b in BATCHES {
        if runs("source") {
            cases.push(Case::Source(b));
        }
    }
    for b in BATCHES {
        if runs("sink") {
            cases.push(Case::Sink(b));
        }
    }
    if !cases.is_empty() {
        sluice_harness::plugin("identity");
        bench::side_by_side(
            &cases,
            samples,
            |case, run| match case {
                Case::RoundTrip(b) => rt.block_on(raw_round_trip(&brokers, n, b, run)),
                Case::Source(b) => rt.block_on(raw_source(&brokers, n, b, run)),
                Case::Sink(b) => rt.block_on(raw_sink(&brokers, n, b, run)),
            },
            |case, run| match case {
                Case::RoundTrip(b) => sluice_round_trip(&rt, &brokers, n, b, run),
                Case::Source(b) => sluice_source(&rt, &brokers, n, b, run),
                Case::Sink(b) => sluice_sink(&rt, &brokers, n, b, run),
            },
            |case| case.name(n),
        );
    }
    if runs("rebalance") {
        let cycles = if cfg!(debug_assertions) { 1 } else { 5 };
        rebalance(&rt, &brokers, cycles);
        if verbose() {
            println!("{}", server.log());
        }
    }
}

/// Creates `topic` with [`PARTITIONS`] partitions (the broker does not
/// create topics on first use).
async fn create(brokers: &str, topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let spec = NewTopic::new(topic, PARTITIONS as i32, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics([&spec], &options)
        .await
        .expect("create topics");
    for result in results {
        if let Err((name, code)) = result {
            assert_eq!(
                code,
                RDKafkaErrorCode::TopicAlreadyExists,
                "create {name}: {code}"
            );
        }
    }
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

/// A consumer of `group` that commits by itself, from the earliest offset.
fn consumer(brokers: &str, group: &str) -> StreamConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer")
}

/// The 64 B payload of message `i`.
fn payload(i: usize) -> String {
    format!("{i:0>64}")
}

/// Writes `n` messages of 64 B to `topic`, awaiting the reports of each
/// 1,000.
async fn produce(brokers: &str, topic: &str, n: usize) {
    let producer = producer(brokers);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let sent: Vec<_> = chunk
            .iter()
            .map(|i| {
                let payload = payload(*i);
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

/// One message taken by a raw loop.
struct Taken {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
}

/// Takes up to `batch` messages: waits up to 1 s for the first, then 5 ms
/// for each next one. Empty when none came. Sets `first` to when the
/// first message ever came, if it is not set.
async fn take(consumer: &StreamConsumer, batch: usize, first: &mut Option<Instant>) -> Vec<Taken> {
    let mut taken = Vec::with_capacity(batch);
    while taken.len() < batch {
        let wait = if taken.is_empty() { 1000 } else { 5 };
        match tokio::time::timeout(Duration::from_millis(wait), consumer.recv()).await {
            Ok(Ok(m)) => taken.push({
                first.get_or_insert_with(Instant::now);
                Taken {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                }
            }),
            Ok(Err(e)) => panic!("consume: {e}"),
            Err(_) => break,
        }
    }
    taken
}

/// Commits, asynchronously, the offsets after `taken` in `topic`.
fn commit(consumer: &StreamConsumer, topic: &str, taken: &[Taken]) {
    let mut last = BTreeMap::new();
    for t in taken {
        let e = last.entry(t.partition).or_insert(t.offset);
        *e = (*e).max(t.offset);
    }
    let mut commit = TopicPartitionList::new();
    for (p, o) in last {
        commit
            .add_partition_offset(topic, p, Offset::Offset(o + 1))
            .expect("offset");
    }
    consumer.commit(&commit, CommitMode::Async).expect("commit");
}

/// Waits until `consumer` holds partitions.
async fn assigned(consumer: &StreamConsumer) {
    let started = Instant::now();
    while consumer.assignment().map(|a| a.count()).unwrap_or(0) == 0 {
        let _ = tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await;
        assert!(started.elapsed() < Duration::from_secs(60), "no assignment");
    }
}

/// Sends `(id, key, payload)` each to `topic` with a `sluice-id` header,
/// then awaits every report.
async fn send_batch<'a>(
    producer: &FutureProducer,
    topic: &str,
    batch: impl Iterator<Item = (&'a str, Option<&'a [u8]>, &'a [u8])>,
) {
    let sent: Vec<_> = batch
        .map(|(id, key, payload)| {
            let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
                key: "sluice-id",
                value: Some(id.as_bytes()),
            });
            let mut record = FutureRecord::<[u8], [u8]>::to(topic)
                .payload(payload)
                .headers(headers);
            if let Some(key) = key {
                record = record.key(key);
            }
            producer
                .send_result(record)
                .map_err(|(e, _)| e)
                .expect("queue")
        })
        .collect();
    for result in join_all(sent).await {
        result.expect("report").expect("delivered");
    }
}

/// Round trip, A: the raw loop, in messages/s.
async fn raw_round_trip(brokers: &str, n: usize, batch: usize, run: &str) -> f64 {
    let (input, output) = (format!("raw-in-{run}"), format!("raw-out-{run}"));
    create(brokers, &input).await;
    create(brokers, &output).await;
    let consumer = consumer(brokers, &format!("raw-{run}"));
    consumer.subscribe(&[&input]).expect("subscribe");
    let out = producer(brokers);
    assigned(&consumer).await;
    let started = Instant::now();
    let feeder = {
        let (brokers, input) = (brokers.to_owned(), input.clone());
        tokio::spawn(async move { produce(&brokers, &input, n).await })
    };
    let mut done = 0;
    while done < n {
        let taken = take(&consumer, batch, &mut None).await;
        assert!(started.elapsed() < LIMIT, "only {done} of {n} done");
        if taken.is_empty() {
            continue;
        }
        let ids: Vec<String> = taken
            .iter()
            .map(|t| format!("{}:{}", t.partition, t.offset))
            .collect();
        send_batch(
            &out,
            &output,
            taken
                .iter()
                .zip(&ids)
                .map(|(t, id)| (id.as_str(), t.key.as_deref(), &t.payload[..])),
        )
        .await;
        commit(&consumer, &input, &taken);
        done += taken.len();
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    feeder.await.expect("producer");
    rate
}

/// Source alone, A: consume and commit a waiting backlog, in messages/s
/// from the first message read.
async fn raw_source(brokers: &str, n: usize, batch: usize, run: &str) -> f64 {
    let input = format!("src-raw-{run}");
    create(brokers, &input).await;
    produce(brokers, &input, n).await;
    let consumer = consumer(brokers, &format!("src-raw-{run}"));
    consumer.subscribe(&[&input]).expect("subscribe");
    let waiting = Instant::now();
    let mut first: Option<Instant> = None;
    let mut done = 0;
    while done < n {
        let taken = take(&consumer, batch, &mut first).await;
        assert!(waiting.elapsed() < LIMIT, "only {done} of {n} read");
        if taken.is_empty() {
            continue;
        }
        commit(&consumer, &input, &taken);
        done += taken.len();
    }
    let first = first.expect("read something");
    (n - 1) as f64 / first.elapsed().as_secs_f64()
}

/// Sink alone, A: produce N waiting messages b at a time, every report
/// of a batch awaited before the next, in messages/s.
async fn raw_sink(brokers: &str, n: usize, batch: usize, run: &str) -> f64 {
    let output = format!("snk-raw-{run}");
    create(brokers, &output).await;
    let producer = producer(brokers);
    send_batch(
        &producer,
        &output,
        std::iter::once(("warm", None, &b"warm"[..])),
    )
    .await;
    let messages: Vec<(String, String, String)> = (0..n)
        .map(|i| (format!("m{i}"), i.to_string(), payload(i)))
        .collect();
    let started = Instant::now();
    for chunk in messages.chunks(batch) {
        send_batch(
            &producer,
            &output,
            chunk
                .iter()
                .map(|(id, key, payload)| (id.as_str(), Some(key.as_bytes()), payload.as_bytes())),
        )
        .await;
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// A consumer for high watermarks only.
fn probe(rt: &tokio::runtime::Runtime, brokers: &str, run: &str) -> StreamConsumer {
    let _inside = rt.enter();
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("probe-{run}"))
        .create()
        .expect("probe")
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

/// Waits, polling every `every`, until `topic` holds `want` messages.
fn wait_delivered(
    probe: &StreamConsumer,
    topic: &str,
    want: usize,
    every: Duration,
    daemon: &Daemon,
) {
    let started = Instant::now();
    loop {
        let got = delivered(probe, topic);
        if got >= want as i64 {
            return;
        }
        assert!(
            started.elapsed() < LIMIT,
            "only {got} of {want} arrived in {topic}; log:\n{}",
            daemon.log()
        );
        std::thread::sleep(every);
    }
}

/// The `kafka:` block of a source reading `topic` as `group`.
fn source_block(brokers: &str, topic: &str, group: &str, batch: usize) -> String {
    let buffer = (batch * 4).max(2000);
    format!(
        r#"kafka: {{brokers: "{brokers}", topic: {topic}, group: {group}, start: earliest, batch: {batch}, buffer: {buffer}}}"#
    )
}

/// Round trip, B: through the real daemon, in messages/s.
fn sluice_round_trip(
    rt: &tokio::runtime::Runtime,
    brokers: &str,
    n: usize,
    batch: usize,
    run: &str,
) -> bench::Sample {
    let (input, output) = (format!("in-{run}"), format!("out-{run}"));
    rt.block_on(create(brokers, &input));
    rt.block_on(create(brokers, &output));
    let dir = tempfile::tempdir().expect("dir");
    let file = bench::round_trip_pipeline(
        dir.path(),
        None,
        batch,
        &source_block(brokers, &input, &format!("g-{run}"), batch),
        &format!(r#"kafka: {{brokers: "{brokers}", topic: {output}}}"#),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    let probe = probe(rt, brokers, run);
    // The group has its partitions once the source reports their lag.
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
    wait_delivered(&probe, &output, n, Duration::from_millis(10), &daemon);
    window.finish(&daemon, n)
}

/// Source alone, B: a waiting backlog into a Sluice topic, in messages/s
/// from the first time the topic is not empty.
fn sluice_source(
    rt: &tokio::runtime::Runtime,
    brokers: &str,
    n: usize,
    batch: usize,
    run: &str,
) -> bench::Sample {
    let input = format!("src-in-{run}");
    rt.block_on(create(brokers, &input));
    rt.block_on(produce(brokers, &input, n));
    let dir = tempfile::tempdir().expect("dir");
    let file = source_pipeline(
        dir.path(),
        &source_block(brokers, &input, &format!("src-{run}"), batch),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    let started = Instant::now();
    let (window, first) = loop {
        let depth = daemon.depth("in");
        if depth > 0 {
            break (bench::Window::start(&daemon), depth);
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "nothing read; log:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        first < n,
        "the whole backlog arrived before the first poll: raise SLUICE_BENCH_N"
    );
    loop {
        let depth = daemon.depth("in");
        if depth >= n {
            break;
        }
        assert!(
            window.elapsed() < LIMIT,
            "only {depth} of {n} read; log:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    window.finish(&daemon, n - first)
}

/// Sink alone, B: N messages waiting in a Sluice topic, the sink resumed,
/// in messages/s.
fn sluice_sink(
    rt: &tokio::runtime::Runtime,
    brokers: &str,
    n: usize,
    batch: usize,
    run: &str,
) -> bench::Sample {
    let output = format!("snk-out-{run}");
    rt.block_on(create(brokers, &output));
    let dir = tempfile::tempdir().expect("dir");
    let file = sink_pipeline(
        dir.path(),
        batch,
        &format!(r#"kafka: {{brokers: "{brokers}", topic: {output}}}"#),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    let probe = probe(rt, brokers, run);
    // The sink's producer connects and gets its producer id.
    daemon.publish("mid", &[Msg::new("warm", "warm")]);
    wait_delivered(&probe, &output, 1, Duration::from_millis(20), &daemon);
    daemon.post("/v1/stages/bench/out/pause", json!({}));
    let messages: Vec<Msg> = (0..n)
        .map(|i| Msg::new(format!("m{i}"), payload(i)).key(i.to_string()))
        .collect();
    daemon.publish("mid", &messages);
    let depth = daemon.depth("mid");
    assert_eq!(depth, n, "the paused sink took some");
    let window = bench::Window::start(&daemon);
    daemon.post("/v1/stages/bench/out/resume", json!({}));
    wait_delivered(&probe, &output, n + 1, Duration::from_millis(5), &daemon);
    window.finish(&daemon, n)
}

/// A pipeline of only `source` (one line, `kafka: {...}`) into topic `in`.
fn source_pipeline(dir: &Path, source: &str) -> PathBuf {
    let yaml = format!(
        r#"
name: bench
topics: [in]
sources:
  - name: src
    to: in
    {source}
"#
    );
    write_pipeline(dir, "bench", &yaml)
}

/// A pipeline of only topic `mid` -> `sink` (one line), as in the round
/// trip: concurrency `SLUICE_BENCH_CONCURRENCY` (else 2), batches of
/// `batch` (5 ms wait).
fn sink_pipeline(dir: &Path, batch: usize, sink: &str) -> PathBuf {
    let yaml = format!(
        r#"
name: bench
topics: [mid]
sinks:
  - name: out
    subscribe: mid
    concurrency: {conc}
    batch: {{max: {batch}, wait: 5ms}}
    {sink}
"#,
        conc = std::env::var("SLUICE_BENCH_CONCURRENCY").unwrap_or_else(|_| "2".into()),
    );
    write_pipeline(dir, "bench", &yaml)
}

/// The steady input of the rebalance figure, in messages a second.
const STEADY_RATE: usize = 1000;
/// The steady time before each leave.
const STEADY: Duration = Duration::from_secs(4);
/// The time watched after a leave and after a join: longer than two
/// heartbeat intervals of the source's default (`session_timeout` 10 s,
/// heartbeats every 3.3 s) and the group's rebalance after them.
const WATCH: Duration = Duration::from_secs(15);

/// `SLUICE_BENCH_VERBOSE` is set: the rebalance figure also prints each
/// cycle's gaps per partition and the daemons' and the broker's logs.
fn verbose() -> bool {
    std::env::var_os("SLUICE_BENCH_VERBOSE").is_some()
}

/// Now, in ms since the epoch (the clock the daemons stamp messages with).
fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch");
    i64::try_from(since.as_millis()).expect("fits")
}

/// One leave-and-join cycle's times, in ms since the epoch, and how long
/// the stopped daemon took to exit.
struct Cycle {
    steady: i64,
    leave: i64,
    join: i64,
    end: i64,
    exit_ms: i64,
}

/// A gap, in ms; `open` when it still ran at the end of the time watched
/// (the partition was not read again within it).
#[derive(Clone, Copy)]
struct Gap {
    ms: i64,
    open: bool,
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", if self.open { ">" } else { "" }, self.ms)
    }
}

/// The rebalance figure: see the file's doc. Prints its table.
fn rebalance(rt: &tokio::runtime::Runtime, brokers: &str, cycles: usize) {
    let input = "reb-in";
    rt.block_on(create(brokers, input));
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (brokers, stop) = (brokers.to_owned(), stop.clone());
        rt.spawn(async move {
            let producer = producer(&brokers);
            let per_tick = STEADY_RATE / 100;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let mut i = 0;
            let mut pending = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..per_tick {
                    let (payload, key) = (payload(i), i.to_string());
                    pending.push(
                        producer
                            .send_result(FutureRecord::to(input).payload(&payload).key(&key))
                            .map_err(|(e, _)| e)
                            .expect("queue"),
                    );
                    i += 1;
                }
                if pending.len() >= 1000 {
                    for result in join_all(pending.drain(..)).await {
                        result.expect("report").expect("delivered");
                    }
                }
            }
            for result in join_all(pending).await {
                result.expect("report").expect("delivered");
            }
            i
        })
    };
    let block =
        format!(r#"kafka: {{brokers: "{brokers}", topic: {input}, group: reb, start: earliest}}"#);
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let a_file = source_pipeline(dir_a.path(), &block);
    let b_file = source_pipeline(dir_b.path(), &block);
    let a = Daemon::start(&[&a_file], &dir_a.path().join("data"));
    let mut b = Daemon::start(&[&b_file], &dir_b.path().join("data"));
    // Both read: each holds partitions.
    for d in [&a, &b] {
        let before = d.depth("in");
        d.wait_until("the daemon to read", Duration::from_secs(60), |d| {
            d.depth("in") > before + 10
        });
    }
    let mut times = Vec::new();
    for _ in 0..cycles {
        let steady = now_ms();
        std::thread::sleep(STEADY);
        let (leave, left) = (now_ms(), Instant::now());
        b.term();
        b.wait();
        let exit_ms = now_ms() - leave;
        std::thread::sleep(WATCH.saturating_sub(left.elapsed()));
        let (join, joined) = (now_ms(), Instant::now());
        b.restart();
        std::thread::sleep(WATCH.saturating_sub(joined.elapsed()));
        times.push(Cycle {
            steady,
            leave,
            join,
            end: now_ms(),
            exit_ms,
        });
    }
    stop.store(true, Ordering::Relaxed);
    let written = rt.block_on(feeder).expect("feeder");
    // Every message stored, as (published at, partition, offset).
    let mut stored: Vec<(i64, i32, i64)> = [&a, &b]
        .iter()
        .flat_map(|d| d.read_all("in"))
        .map(|m| {
            let at = m["published_at"].as_i64().expect("published_at");
            let id = m["id"].as_str().expect("id");
            // `<source>:<partition>:<offset>`.
            let mut parts = id.rsplit(':');
            let o = parts.next().and_then(|o| o.parse().ok());
            let p = parts.next().and_then(|p| p.parse().ok());
            (at, p.expect("partition"), o.expect("offset"))
        })
        .collect();
    stored.sort_unstable();
    // The times of the new ones, all partitions and per partition.
    let mut high: BTreeMap<i32, i64> = BTreeMap::new();
    let mut all = Vec::new();
    let mut by_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for &(at, p, o) in &stored {
        let h = high.entry(p).or_insert(-1);
        if o > *h {
            *h = o;
            all.push(at);
            by_partition.entry(p).or_default().push(at);
        }
    }
    let longest = |from: i64, to: i64| {
        let any = gap(&all, from, to);
        let one = by_partition
            .values()
            .map(|t| gap(t, from, to))
            .max_by_key(|g| g.ms)
            .unwrap_or(Gap {
                ms: to - from,
                open: true,
            });
        (any, one)
    };
    let (mut steady, mut leave, mut join) = (Vec::new(), Vec::new(), Vec::new());
    for c in &times {
        steady.push(longest(c.steady, c.leave));
        leave.push(longest(c.leave, c.join));
        join.push(longest(c.join, c.end));
        if verbose() {
            for (p, t) in &by_partition {
                println!(
                    "cycle at {}: partition {p}: steady {}, leave {}, join {} ms",
                    c.leave,
                    gap(t, c.steady, c.leave),
                    gap(t, c.leave, c.join),
                    gap(t, c.join, c.end)
                );
            }
        }
    }
    if verbose() {
        println!("first daemon's log:\n{}", a.log());
        println!("second daemon's log:\n{}", b.log());
    }
    let exits: Vec<f64> = times.iter().map(|c| c.exit_ms as f64).collect();
    println!();
    println!(
        "rebalance: 2 daemons, group `reb` (classic, cooperative-sticky), {PARTITIONS} partitions, \
         {STEADY_RATE} msg/s in, {cycles} cycles; {written} written, {} distinct offsets stored; \
         the stopped daemon exited {:.0} ms (median) after its SIGTERM",
        all.len(),
        bench::median(&exits)
    );
    println!(
        "| event | nothing new on any partition, ms: median (max) | one partition without anything new, ms: median (max) | per cycle (any / one) |"
    );
    println!("|---|---|---|---|");
    let after = WATCH.as_secs();
    for (name, rows) in [
        (
            format!("steady, the {} s before each leave", STEADY.as_secs()),
            &steady,
        ),
        (
            format!("leave: SIGTERM to one daemon, the next {after} s"),
            &leave,
        ),
        (format!("join: it starts again, the next {after} s"), &join),
    ] {
        let any: Vec<f64> = rows.iter().map(|r| r.0.ms as f64).collect();
        let one: Vec<f64> = rows.iter().map(|r| r.1.ms as f64).collect();
        let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        let each: Vec<String> = rows.iter().map(|r| format!("{} / {}", r.0, r.1)).collect();
        println!(
            "| {name} | {:.0} ({:.0}) | {:.0} ({:.0}) | {} |",
            bench::median(&any),
            max(&any),
            bench::median(&one),
            max(&one),
            each.join(", ")
        );
    }
}

/// The longest time within `[from, to)` with none of `times` (sorted),
/// counted from `from`; open when it is the one that runs to `to`.
fn gap(times: &[i64], from: i64, to: i64) -> Gap {
    let mut prev = from;
    let mut longest = Gap { ms: 0, open: false };
    for &t in times.iter().filter(|t| **t > from) {
        if t >= to {
            break;
        }
        if t - prev > longest.ms {
            longest = Gap {
                ms: t - prev,
                open: false,
            };
        }
        prev = t;
    }
    if to - prev > longest.ms {
        longest = Gap {
            ms: to - prev,
            open: true,
        };
    }
    longest
}
