//! The NATS source and sink against a raw async-nats loop, side by side
//! in one run (samples alternate A, B, A, B, ...; figures are medians).
//!
//! `cargo bench -p sluice-tests --bench connect_nats`; in the debug test
//! profile (`cargo test -p sluice-tests --bench connect_nats`) it runs a
//! small N, to check that it works. `SLUICE_BENCH_N` sets N.
//!
//! - **A, raw loop**: one Rust task with one connection: a durable pull
//!   consumer of stream `in` with explicit acks, `fetch` of b messages
//!   (when none are ready, a pull of one that waits up to 1 s),
//!   a JetStream publish of each to stream `out` with all `PubAck`s awaited
//!   together, then `+ACK` of each and a flush; until N are in `out`.
//! - **B, sluice**: the real `sluice run` binary (embedded broker, durable,
//!   default sync): a NATS source (`stream`, `batch: b`) -> `identity`
//!   stage (concurrency 2) -> NATS sink (JetStream, concurrency 2, `batch:
//!   {max: b}`); until N are in `out`.
//!
//! Each for a batch size b of 100 and of 1,000; and b = 100 with a
//! `high_water_mark` of 1,000 on the source's topic. Both start timing when
//! the producer starts publishing N messages of 64 B (PubAcks awaited in
//! groups of 1,000), with the reader already waiting: the daemon's
//! start-up is not timed. Target: B >= 0.7 x A (messages/s).

#![allow(missing_docs)]

use sluice_tests::bench;
use std::future::IntoFuture;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, stream};
use bytes::Bytes;
use futures_util::StreamExt;
use sluice_harness::nats::NatsServer;
use sluice_tests::Daemon;

const SAMPLES: usize = 5;
/// The read batch (`fetch`, the source's `batch`) and the write batch
/// (PubAcks awaited together, the sink's `batch.max`), the same on both
/// sides; and the `high_water_mark` of the source's topic, if any.
const CASES: [(usize, Option<u64>); 3] = [(100, None), (1000, None), (100, Some(1000))];

fn main() {
    let (n, samples) = bench::size(2_000, 20_000, SAMPLES);
    let rt = bench::runtime();
    sluice_harness::plugin("identity");
    let server = NatsServer::start().expect("nats-server");
    let url = server.url();
    let client = rt
        .block_on(async_nats::connect(&url))
        .expect("connect to nats-server");
    // The context spawns its acker task: inside the runtime.
    let js = {
        let _inside = rt.enter();
        jetstream::new(client.clone())
    };
    bench::side_by_side(
        &CASES,
        samples,
        |(batch, _), run| rt.block_on(raw_loop(&client, &js, n, batch, run)),
        |(batch, mark), run| through_sluice(&rt, &js, &url, n, batch, mark, run),
        |(batch, mark)| {
            let mark = mark.map_or_else(String::new, |m| format!(", high_water_mark {m}"));
            format!(
                "nats jetstream -> nats jetstream, {n} x 64 B, batch {batch}{mark}, messages/s: raw fetch+publish+ack loop | sluice source -> identity -> sink (embedded, durable)"
            )
        },
    );
}

fn payload(i: usize) -> Bytes {
    Bytes::from(format!("{i:0>64}"))
}

/// Streams `<prefix>IN_<run>` and `<prefix>OUT_<run>` on subjects
/// `<prefix>.in.<run>` / `.out.`; their names.
async fn streams(js: &jetstream::Context, prefix: &str, run: &str) -> [(String, String); 2] {
    let run = run.replace('-', "_");
    let names = [
        (format!("{prefix}IN_{run}"), format!("{prefix}.in.{run}")),
        (format!("{prefix}OUT_{run}"), format!("{prefix}.out.{run}")),
    ];
    for (name, subject) in &names {
        js.create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            duplicate_window: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .expect("create stream");
    }
    names
}

async fn produce(js: &jetstream::Context, subject: &str, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut acks = Vec::with_capacity(chunk.len());
        for &i in chunk {
            acks.push(
                js.publish(subject.to_owned(), payload(i))
                    .await
                    .expect("publish"),
            );
        }
        for ack in
            futures_util::future::join_all(acks.into_iter().map(IntoFuture::into_future)).await
        {
            ack.expect("PubAck");
        }
    }
}

async fn stored(js: &jetstream::Context, stream: &str) -> u64 {
    js.get_stream(stream)
        .await
        .expect("stream")
        .get_info()
        .await
        .expect("info")
        .state
        .messages
}

/// A: the raw loop, in messages/s.
async fn raw_loop(
    client: &async_nats::Client,
    js: &jetstream::Context,
    n: usize,
    batch: usize,
    run: &str,
) -> f64 {
    let [(input, in_subject), (_, out_subject)] = streams(js, "RAW", run).await;
    let consumer = js
        .get_stream(&input)
        .await
        .expect("stream")
        .create_consumer(pull::Config {
            durable_name: Some("raw".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("consumer");
    let started = Instant::now();
    let producer = {
        let js = js.clone();
        tokio::spawn(async move { produce(&js, &in_subject, n).await })
    };
    let mut done = 0;
    while done < n {
        let mut messages = consumer
            .fetch()
            .max_messages(batch)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .expect("fetch");
        let mut got = Vec::with_capacity(batch);
        while let Some(message) = messages.next().await {
            got.push(message.expect("a message"));
        }
        if got.is_empty() {
            // Nothing ready: wait for one (as the connector does), rather
            // than spin on empty fetches.
            let mut one = consumer
                .batch()
                .max_messages(1)
                .expires(Duration::from_secs(1))
                .messages()
                .await
                .expect("batch");
            while let Some(message) = one.next().await {
                got.push(message.expect("a message"));
            }
            if got.is_empty() {
                continue;
            }
        }
        let mut acks = Vec::with_capacity(got.len());
        for message in &got {
            acks.push(
                js.publish(out_subject.clone(), message.payload.clone())
                    .await
                    .expect("publish"),
            );
        }
        for ack in
            futures_util::future::join_all(acks.into_iter().map(IntoFuture::into_future)).await
        {
            ack.expect("PubAck");
        }
        for message in &got {
            message.ack().await.expect("ack");
        }
        client.flush().await.expect("flush");
        done += got.len();
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    producer.await.expect("producer");
    rate
}

/// B: through the real daemon, in messages/s.
fn through_sluice(
    rt: &tokio::runtime::Runtime,
    js: &jetstream::Context,
    url: &str,
    n: usize,
    batch: usize,
    mark: Option<u64>,
    run: &str,
) -> bench::Sample {
    let [(input, in_subject), (output, out_subject)] = rt.block_on(streams(js, "SL", run));
    let dir = tempfile::tempdir().expect("dir");
    let file = bench::round_trip_pipeline(
        dir.path(),
        mark,
        batch,
        &format!(
            r#"nats: {{url: "{url}", subject: "{in_subject}", stream: {input}, batch: {batch}}}"#
        ),
        &format!(r#"nats: {{url: "{url}", subject: "{out_subject}"}}"#),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    // The consumer exists once the source has read (an empty stream) once.
    let started = Instant::now();
    loop {
        let ready = rt.block_on(async {
            let stream = js.get_stream(&input).await.expect("stream");
            stream.consumer_info("sluice-bench-src").await.is_ok()
        });
        if ready {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no consumer");
        std::thread::sleep(Duration::from_millis(10));
    }
    let window = bench::Window::start(&daemon);
    rt.block_on(async {
        produce(js, &in_subject, n).await;
        loop {
            let len = stored(js, &output).await;
            if len >= n as u64 {
                break;
            }
            assert!(
                window.elapsed() < Duration::from_secs(600),
                "only {len} of {n} arrived; log:\n{}",
                daemon.log()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    window.finish(&daemon, n)
}
