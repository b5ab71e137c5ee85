//! A stage on NATS JetStream against a raw async-nats loop on the same
//! server, side by side in one run (samples alternate A, B, A, B, ...;
//! figures are medians).
//!
//! `cargo bench -p sluice --bench nats` (or `cargo xtask bench nats`).
//!
//! Both sides start from the same backlog of N messages of 64 B in a file
//! stream and are timed until every message has been consumed, published to
//! an output stream (each publish's PubAck awaited, with a `Nats-Msg-Id`)
//! and acked, and the server has applied the acks:
//!
//! - **raw**: hand-written async-nats, as a throughput-minded consumer would
//!   write it: a pull `messages()` stream (batches of 256), and up to 256
//!   messages at once each doing publish → await PubAck → ack. No handler.
//! - **sluice**: the engine with [`NatsBroker`] and the `identity` wasm
//!   plugin: fetch → valve → wasm handler → publish with a deterministic id
//!   → ack, per message.
//!
//! Both run twice: on a server with `sync_interval: always` (an fsync per
//! write, as the tests use) and on nats-server's default sync.
//!
//! Target: sluice ≥ 0.75 × raw.

#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{
    self,
    consumer::{AckPolicy, PullConsumer},
    context::PublishAckFuture,
    stream::StorageType,
};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::join_all;
use sluice::broker::nats::{NatsBroker, NatsOptions, durable_name, stream_name};
use sluice::broker::{Broker, ConsumerSpec, TopicSpec};
use sluice::config::{HumanDuration, Stage};
use sluice::engine::{Engine, StageHandler, StageSetup};
use sluice::metrics::Metrics;
use sluice::plugin::{HostConfig, PluginHost};
use sluice_harness::nats::{FlagServer, NatsServer};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SAMPLES: usize = 5;
const MESSAGES: usize = 20_000;
const PAYLOAD: usize = 64;
const FETCH: usize = 256;
/// How often completion is checked. Each check is a JetStream API request
/// the server answers, so checking much more often would load the server
/// the two sides share.
const POLL: Duration = Duration::from_millis(10);
thread_local! {
    static RAW_LIMITS: bool = std::env::var("NATS_BENCH_RAW_LIMITS").is_ok();
}
/// Messages the raw loop works on at once.
const IN_FLIGHT: usize = 256;

/// `NATS_BENCH_SAMPLES`, for quick looks while profiling.
fn samples() -> usize {
    std::env::var("NATS_BENCH_SAMPLES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(SAMPLES)
}

fn concurrency() -> u32 {
    std::env::var("NATS_BENCH_CONCURRENCY")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(4)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let host = PluginHost::new(HostConfig {
        max_instances: 16,
        ..HostConfig::default()
    })
    .expect("plugin host");
    let identity = host
        .load(sluice_harness::plugin("identity"))
        .expect("identity plugin");
    let concurrency = concurrency();
    println!("| benchmark | A | B | ratio B/A |");
    println!("|---|---|---|---|");
    if std::env::var("NATS_BENCH_ONLY").as_deref() == Ok("state") {
        state_side_by_side(&rt, &host);
        return;
    }
    // Once on a server that fsyncs every write (as the tests' servers do,
    // and as a durable deployment may), once on nats-server's default sync
    // (every 2 min), where the runtime's own cost shows most.
    let modes: &[bool] = match std::env::var("NATS_BENCH_SYNC").as_deref() {
        Ok("default") => &[false],
        Ok("always") => &[true],
        _ => &[false, true],
    };
    for &durable in modes {
        let server = if let Ok(url) = std::env::var("NATS_BENCH_URL") {
            Server::External(url)
        } else if durable {
            Server::Harness(Box::new(NatsServer::start().expect("nats-server")))
        } else {
            Server::DefaultSync(FlagServer::start(&[]).expect("nats-server"))
        };
        let url = server.url();
        let (mut raw, mut staged, mut native) = (Vec::new(), Vec::new(), Vec::new());
        let only = std::env::var("NATS_BENCH_ONLY").unwrap_or_default();
        for sample in 0..samples() {
            if only != "raw" && !only.is_empty() {
                raw.push(1.0);
            } else {
                raw.push(rt.block_on(raw_loop(&url, sample)));
            }
            if only == "raw" {
                staged.push(1.0);
                native.push(1.0);
                continue;
            }
            let stage = stage(concurrency);
            if only == "native" {
                staged.push(1.0);
            } else {
                staged.push(rt.block_on(sluice_stage(&url, &stage, || {
                    Box::new(identity.worker(stage.worker_settings())) as Box<dyn StageHandler>
                })));
            }
            if only == "wasm" {
                native.push(1.0);
            } else {
                native.push(rt.block_on(sluice_stage(&url, &stage, || {
                    Box::new(NativeIdentity) as Box<dyn StageHandler>
                })));
            }
        }
        let sync = if durable {
            "sync_interval: always"
        } else {
            "default sync"
        };
        report(
            &format!(
                "consume → publish → ack on NATS ({sync}), {MESSAGES} × {PAYLOAD} B (raw async-nats | sluice stage, wasm identity, concurrency {concurrency}), msgs/s"
            ),
            &raw,
            &staged,
        );
        report(
            &format!("the same ({sync}) (raw async-nats | sluice stage, native identity), msgs/s"),
            &raw,
            &native,
        );
    }
}

/// The server a comparison runs on.
enum Server {
    Harness(Box<NatsServer>),
    /// nats-server's default sync: no config, flags only.
    DefaultSync(FlagServer),
    /// One the caller runs (`NATS_BENCH_URL`), e.g. to read its /varz.
    External(String),
}

impl Server {
    fn url(&self) -> String {
        match self {
            Server::Harness(server) => server.url(),
            Server::DefaultSync(server) => server.url(),
            Server::External(url) => url.clone(),
        }
    }
}

fn stage(concurrency: u32) -> Stage {
    let yaml = format!(
        "name: s\nsubscribe: in\nplugin: identity.wasm\npublish: [out]\nconcurrency: {concurrency}\n"
    );
    let mut stage: Stage = serde_saphyr::from_str(&yaml).expect("stage");
    stage.delivery.ack_wait = HumanDuration::secs(30);
    stage.delivery.max_ack_pending = std::env::var("NATS_BENCH_MAX_ACK_PENDING")
        .ok()
        .and_then(|m| m.parse().ok());
    stage
}

/// The identity handler in native Rust, to show the wasm call's share.
struct NativeIdentity;

#[async_trait::async_trait]
impl StageHandler for NativeIdentity {
    async fn handle(&mut self, message: &sluice::plugin::Message) -> sluice::plugin::Outcome {
        Ok(vec![sluice::plugin::Emit {
            topic: "out".into(),
            key: message.key.clone(),
            headers: message.headers.clone(),
            payload: message.payload.clone(),
        }])
    }
}

/// Fills `subject` with the backlog.
async fn preload(js: &jetstream::Context, subject: &str) {
    let payload = Bytes::from(vec![b'x'; PAYLOAD]);
    let mut acks: Vec<PublishAckFuture> = Vec::with_capacity(1000);
    for i in 0..MESSAGES {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("m{i}").as_str());
        acks.push(
            js.publish_with_headers(subject.to_owned(), headers, payload.clone())
                .await
                .expect("publish"),
        );
        if acks.len() == 1000 {
            for ack in join_all(acks.drain(..).map(std::future::IntoFuture::into_future)).await {
                ack.expect("publish ack");
            }
        }
    }
    for ack in join_all(acks.drain(..).map(std::future::IntoFuture::into_future)).await {
        ack.expect("publish ack");
    }
}

/// Waits until the server has applied every ack of `consumer`.
async fn acks_applied(consumer: &PullConsumer) {
    loop {
        let info = consumer.get_info().await.expect("consumer info");
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The hand-written loop; returns msgs/s.
async fn raw_loop(url: &str, sample: usize) -> f64 {
    let client = async_nats::connect(url).await.expect("connect");
    let js = jetstream::new(client.clone());
    let (input, output) = (format!("raw{sample}.in"), format!("raw{sample}.out"));
    for subject in [&input, &output] {
        js.create_stream(jetstream::stream::Config {
            name: subject.replace('.', "_"),
            subjects: vec![subject.clone()],
            storage: StorageType::File,
            // The same retention as Sluice gives a subscribed topic, so both
            // sides make the server delete each input once it is acked.
            retention: if *subject == input && !RAW_LIMITS.with(|l| *l) {
                jetstream::stream::RetentionPolicy::Interest
            } else {
                jetstream::stream::RetentionPolicy::Limits
            },
            ..Default::default()
        })
        .await
        .expect("create stream");
    }
    let stream = js
        .get_stream(input.replace('.', "_"))
        .await
        .expect("input stream");
    let consumer: PullConsumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("raw".into()),
            ack_policy: AckPolicy::Explicit,
            max_ack_pending: -1,
            ..Default::default()
        })
        .await
        .expect("create consumer");
    preload(&js, &input).await;

    let started = Instant::now();
    let messages = consumer
        .stream()
        .max_messages_per_batch(FETCH)
        .messages()
        .await
        .expect("messages");
    let (js_ref, output_ref) = (&js, &output);
    messages
        .take(MESSAGES)
        .for_each_concurrent(IN_FLIGHT, |message| async move {
            let message = message.expect("message");
            let id = message
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .map(|v| format!("{}-out", v.as_str()))
                .unwrap_or_default();
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", id.as_str());
            js_ref
                .publish_with_headers(output_ref.clone(), headers, message.payload.clone())
                .await
                .expect("publish")
                .await
                .expect("publish ack");
            message.ack().await.expect("ack");
        })
        .await;
    client.flush().await.expect("flush");
    acks_applied(&consumer).await;
    let rate = MESSAGES as f64 / started.elapsed().as_secs_f64();
    for subject in [&input, &output] {
        js.delete_stream(subject.replace('.', "_"))
            .await
            .expect("delete stream");
    }
    rate
}

/// A broker on `url` with the streams a sample's stage uses: its input
/// (an interest stream), its output and its dead letters, by the names the
/// stage (and its plugin's default output) were built with. Each sample
/// deletes them at its end.
async fn connect_with_streams(url: &str) -> (Arc<NatsBroker>, String, String, String) {
    let broker = NatsBroker::connect(
        NatsOptions::parse(url).expect("url"),
        Duration::from_secs(10),
    )
    .await
    .expect("connect");
    let (input, output, dlq) = ("in".to_owned(), "out".to_owned(), "s.dlq".to_owned());
    broker
        .ensure_topic(&TopicSpec {
            subscribed: true,
            ..TopicSpec::new(input.clone())
        })
        .await
        .expect("topic");
    for name in [&output, &dlq] {
        broker
            .ensure_topic(&TopicSpec::new(name.clone()))
            .await
            .expect("topic");
    }
    (broker, input, output, dlq)
}

/// The engine over [`NatsBroker`]; returns msgs/s.
async fn sluice_stage(
    url: &str,
    stage: &Stage,
    handler: impl Fn() -> Box<dyn StageHandler>,
) -> f64 {
    let (broker, input, output, dlq) = connect_with_streams(url).await;
    let mut stage = stage.clone();
    stage.delivery.dlq = Some(dlq.clone().into());
    let setup = StageSetup {
        pipeline: "p".into(),
        handlers: (0..stage.delivery.concurrency.get())
            .map(|_| handler())
            .collect(),
        stage,
        shutdown_timeout: Duration::from_secs(5),
        plugin_sha256: None,
    };
    // The consumer exists before the backlog: the input is an interest stream.
    let spec: ConsumerSpec = setup.consumers().remove(0);
    broker.ensure_consumer(&spec).await.expect("consumer");
    let js = jetstream::new(broker.client().clone());
    preload(&js, &input).await;
    let consumer: PullConsumer = js
        .get_stream(stream_name(&input))
        .await
        .expect("stream")
        .get_consumer(&durable_name(&spec.name))
        .await
        .expect("consumer");

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
        let out = broker.topic_stats(&output).await.expect("stats").last_seq;
        if out >= MESSAGES as u64 {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    broker.flush().await.expect("flush");
    acks_applied(&consumer).await;
    let rate = MESSAGES as f64 / started.elapsed().as_secs_f64();
    engine.shutdown().await;
    for topic in [&input, &output, &dlq] {
        js.delete_stream(stream_name(topic))
            .await
            .expect("delete stream");
    }
    rate
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn report(name: &str, a: &[f64], b: &[f64]) {
    let (ma, mb) = (median(a), median(b));
    println!("| {name} | {ma:.0} | {mb:.0} | {:.2} |", mb / ma);
}

/// Messages per sample of the state comparison: each commit with state is
/// a JetStream atomic batch, which a single-replica server syncs.
const STATE_MESSAGES: usize = 4_000;

/// Issue 43, "the same on NATS": the `stateful` plugin doing one
/// increment (or one get and one set) per message, keys spread over 100,
/// its writes committed as one atomic batch with the call's marker,
/// against the same calls with the state calls skipped (`dry`), on one
/// server: its store on tmpfs (what the runtime and the server's batch
/// cost) and on disk (what a durable server's batch sync adds).
/// `NATS_BENCH_ONLY=state cargo bench -p sluice --bench nats`.
fn state_side_by_side(rt: &tokio::runtime::Runtime, host: &PluginHost) {
    let stateful = host
        .load(sluice_harness::plugin("stateful"))
        .expect("stateful plugin");
    let concurrency = std::env::var("NATS_BENCH_CONCURRENCY")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(2);
    for on_tmpfs in [true, false] {
        let server = if on_tmpfs {
            NatsServer::start_on_tmpfs()
        } else {
            NatsServer::start()
        }
        .expect("nats-server");
        for (op, title) in [
            ("inc", "one increment per message"),
            ("get-set", "one get and one set per message"),
        ] {
            let mut rates = [Vec::new(), Vec::new()];
            for sample in 0..samples() {
                for (granted, out) in [false, true].into_iter().zip(rates.iter_mut()) {
                    out.push(rt.block_on(state_stage(
                        &server.url(),
                        &stateful,
                        op,
                        granted,
                        concurrency,
                        sample,
                    )));
                }
            }
            let store = if on_tmpfs {
                "store on tmpfs"
            } else {
                "store on disk"
            };
            report(
                &format!(
                    "stateful stage on NATS ({store}), {title}, {STATE_MESSAGES} msgs, concurrency {concurrency} (state calls skipped | committed with the ack), msgs/s"
                ),
                &rates[0],
                &rates[1],
            );
        }
    }
}

/// One sample of [`state_side_by_side`]; returns msgs/s, timed until the
/// last output.
async fn state_stage(
    url: &str,
    plugin: &sluice::plugin::Plugin,
    op: &str,
    granted: bool,
    concurrency: u32,
    sample: usize,
) -> f64 {
    use sluice::broker::Message;
    let (broker, input, output, dlq) = connect_with_streams(url).await;
    let config = if granted { "bench" } else { "dry" };
    let yaml = format!(
        "name: s\nsubscribe: in\nplugin: stateful.wasm\npublish: [out]\nconcurrency: {concurrency}\nconfig: {{{config}: \"1\"}}\n"
    );
    let mut stage: Stage = serde_saphyr::from_str(&yaml).expect("stage");
    stage.delivery.ack_wait = HumanDuration::secs(30);
    stage.delivery.dlq = Some(dlq.clone().into());
    // A store of its own per sample, so no sample starts from another's.
    let store: Arc<str> = format!("p/bench{sample}{op}{granted}").into();
    let handlers = (0..concurrency)
        .map(|_| {
            let mut settings = stage.worker_settings();
            if granted {
                settings.state = Some(sluice::state::StateAccess {
                    reader: broker.state().expect("the NATS broker keeps state"),
                    store: store.clone(),
                    max_bytes: u64::MAX,
                });
            }
            Box::new(plugin.worker(settings)) as Box<dyn StageHandler>
        })
        .collect();
    let setup = StageSetup {
        pipeline: "p".into(),
        handlers,
        stage,
        shutdown_timeout: Duration::from_secs(5),
        plugin_sha256: None,
    };
    let spec: ConsumerSpec = setup.consumers().remove(0);
    broker.ensure_consumer(&spec).await.expect("consumer");
    let payload = Bytes::from(op.as_bytes().to_vec());
    for chunk in (0..STATE_MESSAGES).collect::<Vec<_>>().chunks(500) {
        let batch = chunk
            .iter()
            .map(|i| {
                let mut m = Message::new(format!("m{sample}-{i}"), &input, payload.clone());
                m.key = Some(format!("k{}", i % 100));
                m
            })
            .collect();
        broker.publish(batch).await.expect("publish");
    }
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
        let out = broker.topic_stats(&output).await.expect("stats").last_seq;
        let dead = broker.topic_stats(&dlq).await.expect("stats").last_seq;
        assert_eq!(dead, 0, "a dead letter in the state bench");
        if out >= STATE_MESSAGES as u64 {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let rate = STATE_MESSAGES as f64 / started.elapsed().as_secs_f64();
    engine.shutdown().await;
    let js = jetstream::new(broker.client().clone());
    for topic in [&input, &output, &dlq] {
        js.delete_stream(stream_name(topic))
            .await
            .expect("delete stream");
    }
    rate
}
