//! Ingest rate: messages per second the ingest API accepts, against
//! `Broker::publish` of the same messages on the same kind of broker, side
//! by side in one run (samples alternate A, B, A, B, ...; figures are
//! medians).
//!
//! `cargo bench -p sluice --bench ingest`.
//!
//! Both sides publish to an embedded broker with the defaults a daemon has
//! (durable: fsync with group commit), a fresh one per sample, 1 KiB
//! payloads, each message with its own id (the `Idempotency-Key`, so both
//! sides pay for the duplicate window):
//!
//! - **single**: one message per call. A: `CLIENTS` tasks each calling
//!   `publish(vec![m])` in a loop. B: `CLIENTS` HTTP clients, each over its
//!   own keep-alive connection, each POSTing `/v1/topics/in/messages` in a
//!   loop.
//! - **batch**: `BATCH` messages per call. A: `publish` of `BATCH` messages.
//!   B: `POST /v1/topics/in/batch` with `BATCH` JSON lines.
//!
//! The admin server is the daemon's own (`admin::serve` over the loaded
//! pipeline), on loopback, in this process: the HTTP clients share the
//! machine's cores with the server, as local producers would. No stage
//! consumes, so only acceptance is measured; the topic has no
//! `high_water_mark` (with one, each request also reads the topic's depth).
//!
//! - **token**: the single-message HTTP side again, once against a server
//!   with no token and once against one requiring `SLUICE_ADMIN_TOKEN`
//!   (each request sends `Authorization: Bearer`, checked in constant
//!   time), to show what the admin API's authentication costs.
//!
//! Environment: `INGEST_SAMPLES` (5), `INGEST_SINGLE` (messages per single
//! sample, 20000), `INGEST_BATCHED` (messages per batch sample, 100000),
//! `INGEST_CLIENTS` (16), `INGEST_BATCH` (100).

#![allow(missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use sluice::admin::{self, AdminState};
use sluice::broker::embedded::{EmbeddedBroker, EmbeddedOptions};
use sluice::broker::{Broker, Message, TopicSpec};
use sluice::metrics::Metrics;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PAYLOAD: usize = 1024;

const PIPELINE: &str = "name: ingest\ntopics: [in, out]\nstages:\n  - name: s\n    subscribe: in\n    plugin: identity.wasm\n    publish: [out]\n";

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Settings {
    samples: usize,
    single: usize,
    batched: usize,
    clients: usize,
    batch: usize,
}

fn main() {
    let s = Settings {
        samples: env("INGEST_SAMPLES", 5),
        single: env("INGEST_SINGLE", 20_000),
        batched: env("INGEST_BATCHED", 100_000),
        clients: env("INGEST_CLIENTS", 16),
        batch: env("INGEST_BATCH", 100),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (mut direct1, mut http1, mut direct_n, mut http_n, mut http1_token) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for sample in 0..s.samples {
        direct1.push(rt.block_on(direct(s.single, 1, s.clients)));
        // The token side right beside the no-token side, first one then the
        // other in turn, so drift in the machine's load hits both alike.
        if sample % 2 == 0 {
            http1.push(rt.block_on(http_single(s.single, s.clients, None)));
            http1_token.push(rt.block_on(http_single(s.single, s.clients, Some(TOKEN))));
        } else {
            http1_token.push(rt.block_on(http_single(s.single, s.clients, Some(TOKEN))));
            http1.push(rt.block_on(http_single(s.single, s.clients, None)));
        }
        direct_n.push(rt.block_on(direct(s.batched, s.batch, s.clients)));
        http_n.push(rt.block_on(http_batch(s.batched, s.batch, s.clients)));
        eprintln!(
            "sample {sample}: single direct {:.0} http {:.0} http+token {:.0}; batch direct {:.0} http {:.0} msgs/s",
            direct1[sample], http1[sample], http1_token[sample], direct_n[sample], http_n[sample]
        );
    }
    println!(
        "\n### Ingest: {PAYLOAD} B messages, embedded broker (durable), median of {} alternating samples\n",
        s.samples
    );
    println!(
        "| per call | clients | direct `Broker::publish` msgs/s | ingest API msgs/s | ratio API/direct |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (label, a, b) in [
        (
            "1 message (`POST .../messages`)".to_owned(),
            &direct1,
            &http1,
        ),
        (
            format!("{} messages (`POST .../batch`)", s.batch),
            &direct_n,
            &http_n,
        ),
    ] {
        let (ma, mb) = (median(a), median(b));
        println!(
            "| {label} | {} | {ma:.0} | {mb:.0} | {:.2} |",
            s.clients,
            mb / ma
        );
    }
    println!(
        "\n### Ingest with a token: 1 message per `POST .../messages`, {} clients, median of {} alternating samples\n",
        s.clients, s.samples
    );
    println!(
        "| no token msgs/s | with token msgs/s | ratio of medians | median of per-sample ratios |"
    );
    println!("|---:|---:|---:|---:|");
    let (open, token) = (median(&http1), median(&http1_token));
    let ratios: Vec<f64> = http1_token.iter().zip(&http1).map(|(t, o)| t / o).collect();
    println!(
        "| {open:.0} | {token:.0} | {:.2} | {:.2} |",
        token / open,
        median(&ratios)
    );
}

/// The full-access token of the token side.
const TOKEN: &str = "bench-token-0123456789abcdef";

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// A fresh embedded broker with the daemon's defaults and topic `in`.
async fn broker(dir: &std::path::Path) -> Arc<EmbeddedBroker> {
    let broker = EmbeddedBroker::open(EmbeddedOptions::new(dir)).expect("broker");
    for name in ["in", "out"] {
        broker
            .ensure_topic(&TopicSpec::new(name))
            .await
            .expect("topic");
    }
    broker
}

fn payload() -> Bytes {
    Bytes::from(vec![b'a'; PAYLOAD])
}

/// `clients` tasks publishing `n` messages straight to the broker, `per`
/// per call. Returns msgs/s.
async fn direct(n: usize, per: usize, clients: usize) -> f64 {
    let dir = tempfile::tempdir().expect("dir");
    let broker = broker(dir.path()).await;
    let next = Arc::new(AtomicUsize::new(0));
    let payload = payload();
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (broker, next, payload) = (broker.clone(), next.clone(), payload.clone());
            tokio::spawn(async move {
                loop {
                    let first = next.fetch_add(per, Ordering::Relaxed);
                    if first >= n {
                        return;
                    }
                    let batch: Vec<Message> = (first..(first + per).min(n))
                        .map(|i| Message::new(format!("m{i}"), "in", payload.clone()))
                        .collect();
                    let acks = broker.publish(batch).await.expect("publish");
                    assert!(acks.iter().all(|a| !a.duplicate));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("publisher");
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    check(&*broker, n).await;
    rate
}

/// Every message was stored once.
async fn check(broker: &dyn Broker, n: usize) {
    let stats = broker.topic_stats("in").await.expect("stats");
    assert_eq!(stats.last_seq, n as u64, "every message stored once");
}

/// Waits for the HTTP clients, takes the rate, checks that all `n`
/// messages were stored and stops the server.
async fn finish(
    tasks: Vec<tokio::task::JoinHandle<()>>,
    started: Instant,
    n: usize,
    broker: &EmbeddedBroker,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
) -> f64 {
    for task in tasks {
        task.await.expect("client");
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    check(broker, n).await;
    let _ = stop.send(());
    let _ = server.await;
    rate
}

/// The daemon's admin server over a fresh broker; returns its base URL and
/// what stops it.
async fn server(
    dir: &std::path::Path,
    token: Option<&str>,
) -> (
    Arc<EmbeddedBroker>,
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let broker = broker(&dir.join("data")).await;
    let file = dir.join("ingest.yaml");
    std::fs::write(&file, PIPELINE).expect("pipeline");
    let pipelines = sluice::config::load(&[file]).expect("valid pipeline");
    let state = AdminState::new(broker.clone(), Arc::new(Metrics::new()), pipelines).with_access(
        admin::AccessConfig {
            full: token.and_then(admin::Token::new),
            ..admin::AccessConfig::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(admin::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    (broker, base, stop, server)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        // One keep-alive connection per client task.
        .pool_max_idle_per_host(1)
        .build()
        .expect("client")
}

/// `clients` HTTP clients POSTing `n` single messages, with `token` when
/// the server requires one. Returns msgs/s.
async fn http_single(n: usize, clients: usize, token: Option<&str>) -> f64 {
    let dir = tempfile::tempdir().expect("dir");
    let (broker, base, stop, server) = server(dir.path(), token).await;
    let auth = token.map(|t| format!("Bearer {t}"));
    let url = format!("{base}/v1/topics/in/messages");
    let next = Arc::new(AtomicUsize::new(0));
    let payload = payload();
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (url, next, payload, http) = (url.clone(), next.clone(), payload.clone(), client());
            let auth = auth.clone();
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let mut request = http.post(&url).header("idempotency-key", format!("m{i}"));
                    if let Some(auth) = &auth {
                        request = request.header("authorization", auth);
                    }
                    let response = request.body(payload.clone()).send().await.expect("POST");
                    assert_eq!(response.status(), 202);
                    let _ = response.bytes().await.expect("receipt");
                }
            })
        })
        .collect();
    finish(tasks, started, n, &broker, stop, server).await
}

/// `clients` HTTP clients POSTing `n` messages as batches of `per` JSON
/// lines. Returns msgs/s (building each body is counted: a producer pays
/// for it too).
async fn http_batch(n: usize, per: usize, clients: usize) -> f64 {
    let dir = tempfile::tempdir().expect("dir");
    let (broker, base, stop, server) = server(dir.path(), None).await;
    let url = format!("{base}/v1/topics/in/batch");
    let next = Arc::new(AtomicUsize::new(0));
    let text = "a".repeat(PAYLOAD);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (url, next, text, http) = (url.clone(), next.clone(), text.clone(), client());
            tokio::spawn(async move {
                loop {
                    let first = next.fetch_add(per, Ordering::Relaxed);
                    if first >= n {
                        return;
                    }
                    let mut body = String::with_capacity(per * (PAYLOAD + 40));
                    for i in first..(first + per).min(n) {
                        body.push_str("{\"id\":\"m");
                        body.push_str(&i.to_string());
                        body.push_str("\",\"payload\":\"");
                        body.push_str(&text);
                        body.push_str("\"}\n");
                    }
                    let response = http
                        .post(&url)
                        .header("content-type", "application/x-ndjson")
                        .body(body)
                        .send()
                        .await
                        .expect("POST");
                    assert_eq!(response.status(), 202);
                    let _ = response.bytes().await.expect("receipt");
                }
            })
        })
        .collect();
    finish(tasks, started, n, &broker, stop, server).await
}
