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
    stage.ack_wait = HumanDuration::secs(30);
    stage.max_ack_pending = std::env::var("NATS_BENCH_MAX_ACK_PENDING")
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
async fn settled(consumer: &PullConsumer) {
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
    settled(&consumer).await;
    let rate = MESSAGES as f64 / started.elapsed().as_secs_f64();
    for subject in [&input, &output] {
        js.delete_stream(subject.replace('.', "_"))
            .await
            .expect("delete stream");
    }
    rate
}

/// The engine over [`NatsBroker`]; returns msgs/s.
async fn sluice_stage(
    url: &str,
    stage: &Stage,
    handler: impl Fn() -> Box<dyn StageHandler>,
) -> f64 {
    let broker = NatsBroker::connect(
        NatsOptions::parse(url).expect("url"),
        Duration::from_secs(10),
    )
    .await
    .expect("connect");
    // The names the stage (and its plugin's default output) were built
    // with; each sample deletes its streams at the end.
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
    let mut stage = stage.clone();
    stage.dlq = Some(dlq.clone());
    let setup = StageSetup {
        pipeline: "p".into(),
        handlers: (0..stage.concurrency.get()).map(|_| handler()).collect(),
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
    settled(&consumer).await;
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
