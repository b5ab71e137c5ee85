//! The HTTP webhook sink against a raw `reqwest` loop, side by side in one
//! run (samples alternate A, B, A, B, ...; figures are medians).
//!
//! `cargo bench -p sluice --bench connect_http` (release), or `cargo test
//! -p sluice --bench connect_http` (debug, small N, to check it runs).
//!
//! Both sides deliver the same N messages of 256 B to the same local hyper
//! receiver, which answers `200` to every request, with 8 requests in
//! flight:
//!
//! - **A, raw**: 8 tokio tasks sharing one `reqwest::Client`, each POSTing
//!   the next message (with its `Idempotency-Key`) until all are sent.
//! - **B, sink**: the sink as the daemon runs it: a backlog of N messages
//!   pre-published into a durable embedded broker (the daemon's defaults),
//!   then a sink stage with `concurrency: 8` (the engine, 8 `SinkHandler`
//!   slots sharing one `HttpSink`) draining it: fetch, request, ack. Timed
//!   from the engine's start to the receiver's N-th request. Once with the
//!   broker's default `sync: always` (every ack fsynced, group commit), and
//!   once with `sync: os`, to tell the durable ack's share from the HTTP
//!   path's.
//!
//! - **C, handler**: a stage whose handler makes the request (the `fetcher`
//!   test plugin, through `wasi:http` and the guarded sender of the stage's
//!   `http:`), `concurrency: 8`, over the same backlog: fetch, call the
//!   handler, which POSTs, then publish its output and ack in one
//!   transaction (`sync: always`). Timed to the receiver's N-th request.
//!
//! The sink does more per message than the raw loop (a durable ack, the
//! `Sluice-*` headers); the target is sink ≥ 0.8 × raw. The handler stage
//! also runs a wasm call and publishes an output; its target is ≥ 0.7 × raw
//! (issue 43).
//!
//! Environment: `SLUICE_BENCH_N` (20,000; 300 in a debug build),
//! `SLUICE_BENCH_SAMPLES` (5; 1 in a debug build), `SLUICE_BENCH_CASES`
//! (which cases run, comma-separated from `raw`, `sink`, `sink-os`,
//! `noop`, `handler`; all unless given): e.g. `SLUICE_BENCH_CASES=raw,handler`
//! for C against A alone; `SLUICE_BENCH_ANSWER` (0): the bytes of the
//! receiver's answer body (each side reads it whole).

#![allow(missing_docs)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use sluice::broker::embedded::{EmbeddedBroker, EmbeddedOptions, SyncMode};
use sluice::broker::{Broker, Message, TopicSpec};
use sluice::connect::{Context, Health, SinkConfig, SinkDef, SinkHandler};
use sluice::engine::{Engine, StageHandler, StageSetup};
use sluice::metrics::Metrics;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PAYLOAD: usize = 256;
const CONCURRENCY: usize = 8;

fn env(name: &str, release: usize, debug: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            debug
        } else {
            release
        })
}

fn main() {
    let n = env("SLUICE_BENCH_N", 20_000, 300);
    let samples = env("SLUICE_BENCH_SAMPLES", 5, 1);
    let receiver_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("receiver runtime");
    let count = Arc::new(AtomicUsize::new(0));
    let answer = Bytes::from(vec![b'y'; env("SLUICE_BENCH_ANSWER", 0, 0)]);
    let addr = receiver_rt.block_on(receiver(count.clone(), answer));
    let url = format!("http://{addr}/hook");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");

    let host = sluice::plugin::PluginHost::new(sluice::plugin::HostConfig::default())
        .expect("plugin host");
    let fetcher = host
        .load(sluice_harness::plugin("fetcher"))
        .expect("the fetcher plugin (cargo xtask plugins)");
    let cases = std::env::var("SLUICE_BENCH_CASES").unwrap_or_default();
    let run = |case: &str| cases.is_empty() || cases.split(',').any(|c| c.trim() == case);
    let (mut raw, mut sink, mut sink_os, mut noop, mut handler, mut handler_os) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for _ in 0..samples {
        if run("raw") {
            raw.push(rt.block_on(raw_loop(n, &url, &count)));
        }
        if run("sink") {
            sink.push(rt.block_on(sink_stage(n, &url, &count, SyncMode::Always)));
        }
        if run("sink-os") {
            sink_os.push(rt.block_on(sink_stage(n, &url, &count, SyncMode::Os)));
        }
        if run("noop") {
            noop.push(rt.block_on(noop_stage(n)));
        }
        if run("handler") {
            handler.push(rt.block_on(handler_stage(n, addr, &count, &fetcher, SyncMode::Always)));
        }
        if run("handler-os") {
            handler_os.push(rt.block_on(handler_stage(n, addr, &count, &fetcher, SyncMode::Os)));
        }
    }
    for (name, samples) in [
        ("raw", &raw),
        ("sink", &sink),
        ("sink-os", &sink_os),
        ("noop", &noop),
        ("handler", &handler),
        ("handler-os", &handler_os),
    ] {
        if !samples.is_empty() {
            let each: Vec<String> = samples.iter().map(|s| format!("{s:.0}")).collect();
            println!("{name}: {} msgs/s (each sample, in order)", each.join(", "));
        }
    }
    println!("| case | raw reqwest msgs/s | sink msgs/s | sink/raw |");
    println!("|---|---|---|---|");
    let a = median(&raw);
    for (name, b) in [
        ("broker sync: always (default)", median(&sink)),
        ("broker sync: os", median(&sink_os)),
        (
            "a handler's POST (wasi:http, fetcher plugin), sync: always",
            median(&handler),
        ),
    ] {
        if !b.is_nan() {
            println!(
                "| {n} × {PAYLOAD} B, {CONCURRENCY} in flight, 200 OK, {name} | {a:.0} | {b:.0} | {:.2} |",
                b / a
            );
        }
    }
    if !noop.is_empty() {
        println!(
            "| (the engine alone: the same backlog, a handler that does nothing, sync: always) | | {:.0} | |",
            median(&noop)
        );
    }
}

/// A hyper server answering 200 (and `answer`) to everything, counting
/// requests.
async fn receiver(count: Arc<AtomicUsize>, answer: Bytes) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (count, answer) = (count.clone(), answer.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (count, answer) = (count.clone(), answer.clone());
                    async move {
                        let _ = req.into_body().collect().await;
                        count.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, Infallible>(Response::new(Full::new(answer)))
                    }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn payload() -> Bytes {
    Bytes::from(vec![b'x'; PAYLOAD])
}

/// A: 8 tasks posting N messages through one client; msgs/s.
async fn raw_loop(n: usize, url: &str, count: &AtomicUsize) -> f64 {
    let client = reqwest::Client::new();
    let next = Arc::new(AtomicUsize::new(0));
    let body = payload();
    let before = count.load(Ordering::Relaxed);
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (client, next, body, url) =
                (client.clone(), next.clone(), body.clone(), url.to_owned());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let response = client
                        .post(&url)
                        .header("content-type", "application/octet-stream")
                        .header("idempotency-key", format!("m{i}"))
                        .body(body.clone())
                        .send()
                        .await
                        .expect("post");
                    assert!(response.status().is_success());
                    let _ = response.bytes().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = started.elapsed();
    assert_eq!(count.load(Ordering::Relaxed) - before, n);
    n as f64 / elapsed.as_secs_f64()
}

/// B: the sink stage draining a pre-published backlog; msgs/s.
async fn sink_stage(n: usize, url: &str, count: &AtomicUsize, sync: SyncMode) -> f64 {
    let dir = tempfile::tempdir().expect("dir");
    let broker = backlog(dir.path(), sync, &["in", "bench.notify.dlq"], n, payload()).await;
    let def: SinkDef = serde_saphyr::from_str(&format!(
        "name: notify\nsubscribe: in\nconcurrency: {CONCURRENCY}\nhttp: {{url: '{url}'}}\n"
    ))
    .expect("sink yaml");
    let stage = def.to_stage();
    let metrics = Arc::new(Metrics::new());
    let ctx = Context {
        pipeline: "bench".into(),
        name: "notify".into(),
        metrics: metrics.clone(),
        health: Arc::new(Health::new()),
        data_dir: None,
    };
    let sink = def
        .http
        .as_ref()
        .expect("http block")
        .build(&ctx)
        .await
        .expect("build the sink");
    let setup = StageSetup {
        pipeline: "bench".into(),
        handlers: (0..CONCURRENCY)
            .map(|_| {
                Box::new(SinkHandler::new(
                    sink.clone(),
                    ctx.clone(),
                    stage.delivery.timeout.get(),
                    stage.delivery.retry.backoff.max.get(),
                )) as Box<dyn StageHandler>
            })
            .collect(),
        stage,
        shutdown_timeout: Duration::from_secs(5),
        plugin_sha256: None,
    };
    let before = count.load(Ordering::Relaxed);
    let started = Instant::now();
    let engine = Engine::start(broker.clone(), metrics, None, None, vec![setup])
        .await
        .expect("engine");
    while count.load(Ordering::Relaxed) - before < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    engine.shutdown().await;
    n as f64 / elapsed.as_secs_f64()
}

/// C: a stage whose handler POSTs each message (the `fetcher` plugin
/// through `wasi:http`), draining a pre-published backlog; msgs/s.
async fn handler_stage(
    n: usize,
    addr: SocketAddr,
    count: &AtomicUsize,
    fetcher: &sluice::plugin::Plugin,
    sync: SyncMode,
) -> f64 {
    let dir = tempfile::tempdir().expect("dir");
    let body = format!(
        "POST http://{addr}/hook {}",
        String::from_utf8_lossy(&payload())
    );
    let broker = backlog(
        dir.path(),
        sync,
        &["in", "out", "bench.call.dlq"],
        n,
        Bytes::from(body),
    )
    .await;
    let stage: sluice::config::Stage = serde_saphyr::from_str(&format!(
        "name: call
subscribe: in
plugin: fetcher.wasm
publish: [out]
concurrency: {CONCURRENCY}
http: {{allow: ['{addr}']}}
"
    ))
    .expect("stage yaml");
    let mut settings = stage.worker_settings();
    settings.http = stage
        .outbound(None)
        .expect("the sender")
        .map(sluice::plugin::HttpSender::Live);
    let setup = StageSetup {
        pipeline: "bench".into(),
        handlers: (0..CONCURRENCY)
            .map(|_| Box::new(fetcher.worker(settings.clone())) as Box<dyn StageHandler>)
            .collect(),
        stage,
        shutdown_timeout: Duration::from_secs(5),
        plugin_sha256: None,
    };
    let before = count.load(Ordering::Relaxed);
    let started = Instant::now();
    let engine = Engine::start(
        broker.clone(),
        Arc::new(Metrics::new()),
        None,
        None,
        vec![setup],
    )
    .await
    .expect("engine");
    while count.load(Ordering::Relaxed) - before < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    engine.shutdown().await;
    n as f64 / elapsed.as_secs_f64()
}

/// An embedded broker in `dir` with `topics`, and `n` messages of `body`
/// waiting in `in`.
async fn backlog(
    dir: &std::path::Path,
    sync: SyncMode,
    topics: &[&str],
    n: usize,
    body: Bytes,
) -> Arc<dyn Broker> {
    let broker: Arc<dyn Broker> =
        EmbeddedBroker::open(EmbeddedOptions::new(dir).sync(sync)).expect("broker");
    for name in topics {
        broker
            .ensure_topic(&TopicSpec::new(*name))
            .await
            .expect("topic");
    }
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let batch = chunk
            .iter()
            .map(|i| Message::new(format!("m{i}"), "in", body.clone()))
            .collect();
        broker.publish(batch).await.expect("publish");
    }
    broker
}

/// A handler that takes every message at once.
struct Noop;

#[async_trait::async_trait]
impl StageHandler for Noop {
    async fn handle(&mut self, _: &sluice::plugin::Message) -> sluice::plugin::Outcome {
        Ok(Vec::new())
    }
}

/// The engine's own ceiling for this backlog: the sink stage with a no-op
/// handler; msgs/s.
async fn noop_stage(n: usize) -> f64 {
    let dir = tempfile::tempdir().expect("dir");
    let broker = backlog(
        dir.path(),
        SyncMode::Always,
        &["in", "bench.notify.dlq"],
        n,
        payload(),
    )
    .await;
    let def: SinkDef = serde_saphyr::from_str(&format!(
        "name: notify\nsubscribe: in\nconcurrency: {CONCURRENCY}\nhttp: {{url: 'http://127.0.0.1:9/'}}\n"
    ))
    .expect("sink yaml");
    let setup = StageSetup {
        pipeline: "bench".into(),
        handlers: (0..CONCURRENCY)
            .map(|_| Box::new(Noop) as Box<dyn StageHandler>)
            .collect(),
        stage: def.to_stage(),
        shutdown_timeout: Duration::from_secs(5),
        plugin_sha256: None,
    };
    let consumer = setup.consumers().remove(0).name;
    let started = Instant::now();
    let engine = Engine::start(
        broker.clone(),
        Arc::new(Metrics::new()),
        None,
        None,
        vec![setup],
    )
    .await
    .expect("engine");
    loop {
        let stats = broker.consumer_stats(&consumer).await.expect("stats");
        if stats.pending == 0 && stats.in_flight == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    engine.shutdown().await;
    n as f64 / elapsed.as_secs_f64()
}

/// The median of `samples`; NaN for none (a case not run).
fn median(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
