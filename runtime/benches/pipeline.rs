//! Pipeline benchmarks on the embedded broker, each comparison side by side
//! in one run (samples alternate A, B, A, B, ...; figures are medians).
//!
//! `cargo bench -p sluice --bench pipeline` (or `cargo xtask bench pipeline`).
//!
//! - **wasm vs native**: a stage running the `uppercase` plugin against the
//!   same logic as native Rust in the same engine: publish N messages, then
//!   time until the stage has completed them all (consume → handle →
//!   publish output + ack in one transaction). Target: wasm ≥ 0.85 × native.
//! - **poison**: the `fail` plugin with 0% vs 1% of messages retried until
//!   they are dead-lettered: the healthy messages' rate with poison over the
//!   rate without. Target: ≥ 0.90.
//! - **dedup**: the same `uppercase` stage without and with `dedup: {key:
//!   id, payload_hash: true}` (every message new: a begin and a COMPLETED
//!   record per message). Target: dedup on costs at most 1.3× the time per
//!   message, i.e. a rate ratio ≥ 0.77.
//! - **batch vs unbatched**: a batch stage (`batch: {max: 64}`, the
//!   `upper-batch` plugin) against the same logic unbatched (`uppercase`),
//!   durable (`sync: always`). A batch's items are completed together, so
//!   their fsyncs fold into the group commit. Target: batch ≥ 1.0 ×
//!   unbatched.
//! - **languages**: the same uppercase stage (durable, 40,000 × 64 B) with
//!   the handler in Rust, Python and JavaScript (`uppercase`,
//!   `uppercase-py`, `uppercase-js`), at concurrency 1 and 4. Targets:
//!   Python ≥ 0.6 × Rust, JavaScript ≥ 0.4 × Rust. Also the JavaScript
//!   logic as a batch stage (`upper-batch-js`, batch max 64) against the
//!   unbatched Rust stage.
//! - **stage hop**: the `identity` plugin as a stage (one output per
//!   input) against the raw broker loop that does the same work: fetch up
//!   to 256, then publish one output and ack each in one atomic
//!   `complete`, all of a fetch's completes in flight at once, in
//!   `CONCURRENCY` loops. Durable (sync always). Also the process's CPU
//!   per message on each side (user + system, every thread: the
//!   committer's too), so the engine's own CPU is the difference. Target:
//!   stage ≥ 0.8 × raw loop.
//! - **daemon backlog RSS**: the real `sluice run` binary with a stage that
//!   holds its first message for a minute, while 1,000,000 messages of 64 B
//!   are published through the admin API: the daemon's VmRSS at 100k, 500k
//!   and 1M waiting. Target: under 150 MB and flat.
//! - **state**: the `stateful` plugin with one increment (or one get and
//!   one set) per message committed with the ack, against the same calls
//!   with the state calls skipped. Target: at least 0.8x.
//! - **state-rss**: 1,000,000 keys (16-byte values) committed into one
//!   store of the embedded broker, 1,000 a completion as a handler's writes
//!   are, then 100,000 reads through its state reader: this process's
//!   VmRSS above what it was with the broker open and empty. Target: under
//!   150 MB (the keys live on disk).
//! - **rate**: the `uppercase` stage without and with a `rate` far above
//!   what it does (1,000,000/s, burst 1,000): what the limiter costs when
//!   it never waits. Target: ≥ 0.95, median of at least 9 samples.
//! - **lanes**: issue 26's must-show 3: 100,000 bulk messages waiting, a
//!   stage at concurrency 4 whose handler takes 5 ms, a critical message
//!   every 10 ms for 20 s; the critical lane's wait p50 and p99, under
//!   `strict` and `weighted` 8:1. Target: strict p99 under 50 ms.
//! - **lane overhead**: the `uppercase` stage reading one topic against
//!   the same stage with two lanes (`strict`), all the work on one: what
//!   a task per delivery costs against the plain worker loops.

#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sluice::broker::embedded::{EmbeddedBroker, EmbeddedOptions};
use sluice::broker::{Broker, Message, TopicSpec};
use sluice::config::{HumanDuration, Stage};
use sluice::engine::{Engine, StageHandler, StageSetup};
use sluice::metrics::Metrics;
use sluice::plugin::{Emit, HostConfig, Message as PluginMessage, Outcome, PluginHost};
use sluice::{Failure, FailureKind};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SAMPLES: usize = 5;
const MESSAGES: usize = 40_000;
const CONCURRENCY: u32 = 2;
/// Messages per stage-hop sample: enough that the CPU time, read to 10 ms,
/// is within a few per cent.
const HOP_MESSAGES: usize = 100_000;

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants =
        |section: &str| filter.is_empty() || filter.iter().any(|f| section.contains(f.as_str()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let host = PluginHost::new(HostConfig {
        max_instances: 16,
        ..HostConfig::default()
    })
    .expect("plugin host");
    println!("| benchmark | A | B | ratio B/A |");
    println!("|---|---|---|---|");
    if wants("wasm-vs-native") {
        let uppercase = host
            .load(sluice_harness::plugin("uppercase"))
            .expect("uppercase");
        let (mut native, mut wasm) = (Vec::new(), Vec::new());
        for _ in 0..SAMPLES {
            native.push(rt.block_on(run_stage(MESSAGES, |_| {
                Box::new(NativeUppercase) as Box<dyn StageHandler>
            })));
            let stage = stage("uppercase", &[]);
            wasm.push(rt.block_on(run_stage(MESSAGES, |_| {
                Box::new(uppercase.worker(stage.worker_settings())) as Box<dyn StageHandler>
            })));
        }
        report(
            &format!(
                "uppercase stage, {MESSAGES} × 64 B, concurrency {CONCURRENCY} (native | wasm), msgs/s"
            ),
            &native,
            &wasm,
        );
    }
    if wants("stage-hop") {
        stage_hop(&rt, &host);
    }
    if wants("dedup") {
        let plain = stage("uppercase", &[]);
        let mut deduplicated = plain.clone();
        deduplicated.delivery.dedup = Some(sluice::config::Dedup {
            key: sluice::config::DedupKey::Id,
            ttl: HumanDuration::secs(3600),
            payload_hash: true,
            missing_key: sluice::config::MissingKey::Reject,
        });
        uppercase_side_by_side(
            &rt,
            &host,
            [&plain, &deduplicated],
            SAMPLES,
            "uppercase stage, msgs/s, dedup off | on (key: id, payload_hash)",
        );
    }
    if wants("state") {
        state_side_by_side(&rt, &host);
    }
    if wants("state-rss") {
        rt.block_on(state_rss());
    }
    if wants("rate") {
        // Issue 26: a limit far above what the stage does must cost next
        // to nothing (target: at least 0.95x).
        let plain = stage("uppercase", &[]);
        let mut limited = plain.clone();
        limited.delivery.rate = Some(sluice::config::Rate {
            limit: "1000000/s".parse().expect("rate"),
            burst: std::num::NonZeroU32::new(1000).expect("1000"),
            per: None,
            max_keys: sluice::config::Rate::default_max_keys(),
        });
        uppercase_side_by_side(
            &rt,
            &host,
            [&plain, &limited],
            SAMPLES.max(9),
            "uppercase stage, msgs/s, no rate | rate: 1000000/s (far above it)",
        );
    }
    if wants("lanes") {
        lanes(&rt, "strict", "priority: strict");
        lanes(
            &rt,
            "weighted 8:1",
            "priority: {weighted: {jobs.critical: 8, jobs.bulk: 1}}",
        );
    }
    if wants("lane-overhead") {
        // A stage with lanes runs a task per delivery, where a one-topic
        // stage runs plain worker loops: what that costs when all the work
        // is on one lane.
        let plain = stage("uppercase", &[]);
        let mut lanes = plain.clone();
        lanes.subscribe =
            serde_saphyr::from_str("{topics: [in, idle], priority: strict}").expect("subscribe");
        uppercase_side_by_side(
            &rt,
            &host,
            [&plain, &lanes],
            SAMPLES,
            "uppercase stage, msgs/s, one topic | two lanes (strict), all the work on one",
        );
    }
    if wants("batch-vs-unbatched") {
        let uppercase = host
            .load(sluice_harness::plugin("uppercase"))
            .expect("uppercase");
        let upper_batch = host
            .load(sluice_harness::plugin("upper-batch"))
            .expect("upper-batch");
        let single = stage("uppercase", &[]);
        let mut batched = stage("upper-batch", &[]);
        batched.delivery.batch = Some(sluice::config::Batch {
            max: std::num::NonZeroU32::new(64).expect("64"),
            wait: HumanDuration::millis(100),
        });
        let (mut unbatched, mut batch) = (Vec::new(), Vec::new());
        for _ in 0..SAMPLES {
            let settings = single.worker_settings();
            unbatched.push(rt.block_on(run_stage_as(MESSAGES, single.clone(), |_| {
                Box::new(uppercase.worker(settings.clone())) as Box<dyn StageHandler>
            })));
            let settings = batched.worker_settings();
            batch.push(rt.block_on(run_stage_as(MESSAGES, batched.clone(), |_| {
                Box::new(upper_batch.worker(settings.clone())) as Box<dyn StageHandler>
            })));
        }
        report(
            &format!(
                "durable (sync always), {MESSAGES} × 64 B, concurrency {CONCURRENCY}, msgs/s: uppercase unbatched | upper-batch, batch max 64"
            ),
            &unbatched,
            &batch,
        );
    }
    if wants("languages") {
        languages(&rt, &host);
    }
    if wants("daemon-rss") {
        daemon_rss();
    }
    if wants("poison") {
        let fail = host.load(sluice_harness::plugin("fail")).expect("fail");
        let (mut clean, mut poisoned, mut rejected) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..SAMPLES {
            for (fraction, mode, out) in [
                ("0.0", "retry", &mut clean),
                ("0.01", "retry", &mut poisoned),
                ("0.01", "reject", &mut rejected),
            ] {
                if std::env::var("POISON_ONLY").is_ok_and(|m| m != mode || fraction == "0.0") {
                    continue;
                }
                let stage = stage("fail", &[("fraction", fraction), ("mode", mode)]);
                out.push(rt.block_on(run_stage(MESSAGES, |_| {
                    Box::new(fail.worker(stage.worker_settings())) as Box<dyn StageHandler>
                })));
            }
        }
        report(
            "healthy msgs/s, fail plugin, 0% | 1% poison (3 attempts, 10 ms backoff)",
            &clean,
            &poisoned,
        );
        report(
            "healthy msgs/s, fail plugin, 0% | 1% rejected (dead-lettered at once)",
            &clean,
            &rejected,
        );
    }
}

fn stage(plugin: &str, config: &[(&str, &str)]) -> Stage {
    let mut yaml = format!(
        "name: s\nsubscribe: in\nplugin: {plugin}.wasm\npublish: [out]\nconcurrency: {CONCURRENCY}\nretry: {{max_attempts: 3, backoff: {{initial: 10ms, max: 10ms}}}}\n"
    );
    if !config.is_empty() {
        yaml.push_str("config:\n");
        for (k, v) in config {
            yaml.push_str(&format!("  {k}: \"{v}\"\n"));
        }
    }
    let mut stage: Stage = serde_saphyr::from_str(&yaml).expect("stage");
    stage.delivery.ack_wait = HumanDuration::secs(30);
    stage
}

/// Publishes `n` messages, runs one stage over them until each is an output
/// or a dead letter, and returns the rate of outputs, in msgs/s.
async fn run_stage(n: usize, handler: impl Fn(&Arc<dyn Broker>) -> Box<dyn StageHandler>) -> f64 {
    run_stage_as(n, stage("uppercase", &[]), handler).await
}

/// [`run_stage`] with the stage's settings given.
/// `handler` is given the broker, for a handler that keeps state in it.
async fn run_stage_as(
    n: usize,
    stage: Stage,
    handler: impl Fn(&Arc<dyn Broker>) -> Box<dyn StageHandler>,
) -> f64 {
    let payload = bytes::Bytes::from(vec![b'a'; 64]);
    run_stage_on(
        n,
        stage,
        |i| Message::new(format!("m{i}"), "in", payload.clone()),
        handler,
    )
    .await
}

/// [`run_stage_as`] over messages whose payload is `op`, with keys spread
/// over 100.
async fn run_keyed(
    n: usize,
    op: &str,
    stage: Stage,
    handler: impl Fn(&Arc<dyn Broker>) -> Box<dyn StageHandler>,
) -> f64 {
    let op = bytes::Bytes::from(op.as_bytes().to_vec());
    run_stage_on(
        n,
        stage,
        |i| {
            let mut m = Message::new(format!("m{i}"), "in", op.clone());
            m.key = Some(format!("k{}", i % 100));
            m
        },
        handler,
    )
    .await
}

/// [`run_stage_as`] over the messages `message` makes.
async fn run_stage_on(
    n: usize,
    stage: Stage,
    message: impl Fn(usize) -> Message,
    handler: impl Fn(&Arc<dyn Broker>) -> Box<dyn StageHandler>,
) -> f64 {
    let dir = tempfile::tempdir().expect("dir");
    let embedded = EmbeddedBroker::open(EmbeddedOptions::new(dir.path())).expect("broker");
    let dedup: Arc<dyn sluice::dedup::DedupStore> = embedded.clone();
    let broker: Arc<dyn Broker> = embedded;
    for name in ["in", "idle", "out", "s.s.dlq"] {
        broker
            .ensure_topic(&TopicSpec::new(name))
            .await
            .expect("topic");
    }
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let batch = chunk.iter().map(|i| message(*i)).collect();
        broker.publish(batch).await.expect("publish");
    }
    let setup = StageSetup {
        pipeline: "s".into(),
        handlers: (0..stage.delivery.concurrency.get())
            .map(|_| handler(&broker))
            .collect(),
        stage,
        shutdown_timeout: Duration::from_secs(5),
        plugin_sha256: None,
    };
    let started = Instant::now();
    let metrics = Arc::new(Metrics::new());
    let engine = Engine::start(
        broker.clone(),
        metrics.clone(),
        None,
        Some(dedup),
        vec![setup],
    )
    .await
    .expect("engine");
    // Done when every input is an output or a dead letter. The rate is the
    // healthy stream's: outputs over the time until the last output, so the
    // poison's final retries (after the healthy work is done) do not count.
    let mut last_output = (0, started.elapsed());
    loop {
        let out = broker.topic_stats("out").await.expect("stats").last_seq;
        let dead = broker.topic_stats("s.s.dlq").await.expect("stats").last_seq;
        if out > last_output.0 {
            last_output = (out, started.elapsed());
        }
        if out + dead >= n as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let rate = last_output.0 as f64 / last_output.1.as_secs_f64();
    engine.shutdown().await;
    if std::env::var_os("BENCH_CONFLICTS").is_some() {
        for line in metrics.encode().lines() {
            if line.contains("conflict") && !line.starts_with('#') {
                eprintln!("  {line}");
            }
        }
    }
    rate
}

/// The uppercase plugin under two stage settings, samples alternating,
/// reported as A | B.
fn uppercase_side_by_side(
    rt: &tokio::runtime::Runtime,
    host: &PluginHost,
    stages: [&Stage; 2],
    samples: usize,
    title: &str,
) {
    let uppercase = host
        .load(sluice_harness::plugin("uppercase"))
        .expect("uppercase");
    let mut rates = [Vec::new(), Vec::new()];
    for _ in 0..samples {
        for (stage, out) in stages.iter().zip(rates.iter_mut()) {
            let settings = stage.worker_settings();
            out.push(rt.block_on(run_stage_as(MESSAGES, (*stage).clone(), |_| {
                Box::new(uppercase.worker(settings.clone())) as Box<dyn StageHandler>
            })));
        }
    }
    report(title, &rates[0], &rates[1]);
}

/// Issue 43: the `stateful` plugin's `inc` (one increment per message,
/// keys spread over 100) against the same call with its state calls
/// skipped (`dry`), on the same stage: what committing state with the ack
/// costs. The inputs carry keys, as a counter per key would.
fn state_side_by_side(rt: &tokio::runtime::Runtime, host: &PluginHost) {
    let stateful = host
        .load(sluice_harness::plugin("stateful"))
        .expect("stateful");
    for (op, title) in [
        ("inc", "one increment per message"),
        ("get-set", "one get and one set per message"),
    ] {
        let plain = stage("stateful", &[("dry", "1")]);
        let with_state = stage("stateful", &[("bench", "1")]);
        let mut rates = [Vec::new(), Vec::new()];
        for _ in 0..SAMPLES {
            for (stage, out) in [&plain, &with_state].into_iter().zip(rates.iter_mut()) {
                let granted = !stage.config.contains_key("dry");
                out.push(
                    rt.block_on(run_keyed(MESSAGES, op, (*stage).clone(), |broker| {
                        let mut settings = stage.worker_settings();
                        if granted {
                            settings.state = Some(sluice::state::StateAccess {
                                reader: broker.state().expect("the embedded broker keeps state"),
                                store: "s/s".into(),
                                max_bytes: u64::MAX,
                            });
                        }
                        Box::new(stateful.worker(settings)) as Box<dyn StageHandler>
                    })),
                );
            }
        }
        report(
            &format!(
                "stateful stage, msgs/s, {title}: state calls skipped | committed with the ack"
            ),
            &rates[0],
            &rates[1],
        );
    }
}

/// Issue 26, must show 3: a bulk backlog of 100,000, a stage at
/// concurrency 4 whose handler takes 5 ms, and a critical message every
/// 10 ms for 20 s. Prints the critical lane's wait (publish to slot) p50
/// and p99, and how many bulk messages were handled meanwhile.
fn lanes(rt: &tokio::runtime::Runtime, name: &str, priority: &str) {
    const BULK: usize = 100_000;
    const CRITICAL: usize = 2_000;
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("dir");
        let broker: Arc<dyn Broker> =
            EmbeddedBroker::open(EmbeddedOptions::new(dir.path())).expect("broker");
        for topic in ["jobs.critical", "jobs.bulk", "out", "s.s.dlq"] {
            broker
                .ensure_topic(&TopicSpec::new(topic))
                .await
                .expect("topic");
        }
        let payload = bytes::Bytes::from(vec![b'a'; 64]);
        for chunk in (0..BULK).collect::<Vec<_>>().chunks(1000) {
            let batch = chunk
                .iter()
                .map(|i| Message::new(format!("b{i}"), "jobs.bulk", payload.clone()))
                .collect();
            broker.publish(batch).await.expect("publish");
        }
        let yaml = format!(
            "name: s\nsubscribe: {{topics: [jobs.critical, jobs.bulk], {priority}}}\n\
             plugin: x.wasm\npublish: [out]\nconcurrency: 4\n"
        );
        let mut stage: Stage = serde_saphyr::from_str(&yaml).expect("stage");
        stage.delivery.ack_wait = HumanDuration::secs(30);
        let metrics = Arc::new(Metrics::new());
        let setup = StageSetup {
            pipeline: "s".into(),
            handlers: (0..4)
                .map(|_| Box::new(Sleeper(Duration::from_millis(5))) as Box<dyn StageHandler>)
                .collect(),
            stage,
            shutdown_timeout: Duration::from_secs(5),
            plugin_sha256: None,
        };
        let engine = Engine::start(broker.clone(), metrics.clone(), None, None, vec![setup])
            .await
            .expect("engine");
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        for i in 0..CRITICAL {
            tick.tick().await;
            let message = Message::new(format!("c{i}"), "jobs.critical", payload.clone());
            broker.publish(vec![message]).await.expect("publish");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let out = broker.topic_stats("out").await.expect("stats").last_seq;
        engine.shutdown().await;
        let (p50, p99) = metrics
            .lane_wait_quantiles("s", "s", "jobs.critical")
            .unwrap_or((f64::NAN, f64::NAN));
        let bulk_done = out.saturating_sub(CRITICAL as u64);
        println!(
            "| lanes {name}: {BULK} bulk waiting, concurrency 4, 5 ms calls, a critical message every 10 ms for 20 s | critical wait p50 {:.1} ms, p99 {:.1} ms (last 1,024) | bulk handled meanwhile: {bulk_done} | |",
            p50 * 1000.0,
            p99 * 1000.0
        );
    });
}

/// A handler that takes a fixed time and emits its input.
struct Sleeper(Duration);

#[async_trait]
impl StageHandler for Sleeper {
    async fn handle(&mut self, message: &PluginMessage) -> Outcome {
        tokio::time::sleep(self.0).await;
        Ok(vec![Emit {
            topic: "out".into(),
            key: message.key.clone(),
            headers: message.headers.clone(),
            payload: message.payload.clone(),
        }])
    }
}

/// The uppercase example in Rust, Python and JavaScript, side by side.
fn languages(rt: &tokio::runtime::Runtime, host: &PluginHost) {
    let load = |name: &str| host.load(sluice_harness::plugin(name)).expect(name);
    let (rust, python, js, js_batched) = (
        load("uppercase"),
        load("uppercase-py"),
        load("uppercase-js"),
        load("upper-batch-js"),
    );
    let js_batch_stage = stage("upper-batch-js", &[]);
    for concurrency in [1, 4] {
        let mut stage = stage("uppercase", &[]);
        stage.delivery.concurrency = sluice::config::Concurrency::fixed(
            std::num::NonZeroU32::new(concurrency).expect("non-zero"),
        );
        let settings = stage.worker_settings();
        let mut rates = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..SAMPLES {
            for (plugin, out) in [&rust, &python, &js].into_iter().zip(rates.iter_mut()) {
                out.push(rt.block_on(run_stage_as(MESSAGES, stage.clone(), |_| {
                    Box::new(plugin.worker(settings.clone())) as Box<dyn StageHandler>
                })));
            }
        }
        // JavaScript's way to throughput: a batch stage, which spreads the
        // fixed cost of a call into the component over a batch.
        let mut batched = js_batch_stage.clone();
        batched.delivery.concurrency = stage.delivery.concurrency;
        batched.delivery.batch = Some(sluice::config::Batch {
            max: std::num::NonZeroU32::new(64).expect("64"),
            wait: HumanDuration::millis(100),
        });
        let batch_settings = batched.worker_settings();
        let mut js_batch = Vec::new();
        for _ in 0..SAMPLES {
            js_batch.push(rt.block_on(run_stage_as(MESSAGES, batched.clone(), |_| {
                Box::new(js_batched.worker(batch_settings.clone())) as Box<dyn StageHandler>
            })));
        }
        let [rust, python, js] = &rates;
        report(
            &format!(
                "uppercase stage, durable, {MESSAGES} × 64 B, concurrency {concurrency}, msgs/s: Rust | Python"
            ),
            rust,
            python,
        );
        report(
            &format!(
                "uppercase stage, durable, {MESSAGES} × 64 B, concurrency {concurrency}, msgs/s: Rust | JavaScript"
            ),
            rust,
            js,
        );
        report(
            &format!(
                "uppercase stage, durable, {MESSAGES} × 64 B, concurrency {concurrency}, msgs/s: Rust | JavaScript, batch max 64"
            ),
            rust,
            &js_batch,
        );
    }
}

/// The `uppercase` example's logic in native Rust.
struct NativeUppercase;

#[async_trait]
impl StageHandler for NativeUppercase {
    async fn handle(&mut self, message: &PluginMessage) -> Outcome {
        if std::str::from_utf8(&message.payload).is_err() {
            return Err(Failure::new(
                FailureKind::Rejected,
                "payload is not UTF-8 text",
            ));
        }
        Ok(vec![Emit {
            topic: "out".into(),
            key: message.key.clone(),
            headers: message.headers.clone(),
            payload: message.payload.to_ascii_uppercase(),
        }])
    }
}

/// The stage hop: raw broker loop (A) against the identity stage (B), in
/// msgs/s and in CPU µs per message.
fn stage_hop(rt: &tokio::runtime::Runtime, host: &PluginHost) {
    let identity = host
        .load(sluice_harness::plugin("identity"))
        .expect("identity");
    let stage = stage("identity", &[]);
    let settings = stage.worker_settings();
    let (mut raw, mut wasm) = (Vec::new(), Vec::new());
    let (mut raw_cpu, mut wasm_cpu) = (Vec::new(), Vec::new());
    // `STAGE_HOP_SIDE=raw` or `=stage` runs one side alone, to profile it.
    let side = std::env::var("STAGE_HOP_SIDE").unwrap_or_default();
    for _ in 0..SAMPLES {
        if side != "stage" {
            let before = cpu_time();
            raw.push(rt.block_on(raw_loop(HOP_MESSAGES)));
            raw_cpu.push(per_message_us(cpu_time() - before, HOP_MESSAGES));
        }
        if side == "raw" {
            continue;
        }
        let before = cpu_time();
        wasm.push(rt.block_on(run_stage_as(HOP_MESSAGES, stage.clone(), |_| {
            Box::new(identity.worker(settings.clone())) as Box<dyn StageHandler>
        })));
        wasm_cpu.push(per_message_us(cpu_time() - before, HOP_MESSAGES));
    }
    report(
        &format!(
            "stage hop, durable, {HOP_MESSAGES} × 64 B, concurrency {CONCURRENCY}, msgs/s: raw broker loop | identity stage"
        ),
        &raw,
        &wasm,
    );
    report(
        "stage hop, CPU µs per message (all threads, publish included): raw broker loop | identity stage",
        &raw_cpu,
        &wasm_cpu,
    );
}

/// What a hand-written consumer of the embedded broker does for the same
/// hop as an identity stage: fetch, then one atomic complete (the output,
/// under the same deterministic id, and the ack) per message, a fetch's
/// completes all in flight, in `CONCURRENCY` loops. Publishing the inputs is outside the timing, as
/// in [`run_stage_as`].
async fn raw_loop(n: usize) -> f64 {
    let dir = tempfile::tempdir().expect("dir");
    let broker: Arc<dyn Broker> =
        EmbeddedBroker::open(EmbeddedOptions::new(dir.path())).expect("broker");
    for name in ["in", "out"] {
        broker
            .ensure_topic(&TopicSpec::new(name))
            .await
            .expect("topic");
    }
    let payload = bytes::Bytes::from(vec![b'a'; 64]);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let batch = chunk
            .iter()
            .map(|i| Message::new(format!("m{i}"), "in", payload.clone()))
            .collect();
        broker.publish(batch).await.expect("publish");
    }
    let consumer = sluice::broker::ConsumerSpec {
        name: "raw".into(),
        topic: "in".into(),
        filter: Default::default(),
        ack_wait: Duration::from_secs(30),
        max_ack_pending: None,
        max_deliver: None,
    };
    broker.ensure_consumer(&consumer).await.expect("consumer");
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let loops: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (broker, done) = (broker.clone(), done.clone());
            tokio::spawn(async move {
                while done.load(std::sync::atomic::Ordering::Relaxed) < n {
                    let deliveries = broker
                        .fetch_within("raw", 256, 64 << 20, Duration::from_millis(100))
                        .await
                        .expect("fetch");
                    let completes = deliveries.iter().map(|d| {
                        // The stage's output id (a hash of the input's), so
                        // the store files and probes the same keys.
                        let output = Message {
                            id: sluice::engine::emit_id("s", "s", &d.message.id, 0),
                            topic: "out".into(),
                            key: d.message.key.clone(),
                            headers: d.message.headers.clone(),
                            payload: bytes::Bytes::from(d.message.payload.to_vec()),
                            published_at: 0,
                        };
                        let broker = broker.clone();
                        async move {
                            broker
                                .complete(&sluice::broker::Completion::new(
                                    &d.receipt,
                                    vec![output],
                                ))
                                .await
                        }
                    });
                    for result in futures_util::future::join_all(completes).await {
                        result.expect("complete");
                    }
                    done.fetch_add(deliveries.len(), std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    for l in loops {
        l.await.expect("raw loop");
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    assert_eq!(
        broker.topic_stats("out").await.expect("stats").last_seq,
        n as u64,
        "the raw loop published one output per input"
    );
    rate
}

/// This process's CPU time so far, user and system, every thread (those
/// that ended too), from `/proc/self/stat`, to 10 ms.
fn cpu_time() -> Duration {
    /// `USER_HZ`, the unit of `/proc/<pid>/stat`'s times.
    const TICKS_PER_SECOND: u64 = 100;
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // After the command name in parentheses: utime is field 14, stime 15.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after_name
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    Duration::from_millis((fields[14 - 3] + fields[15 - 3]) * 1000 / TICKS_PER_SECOND)
}

fn per_message_us(cpu: Duration, n: usize) -> f64 {
    cpu.as_secs_f64() * 1e6 / n as f64
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn report(name: &str, a: &[f64], b: &[f64]) {
    if a.is_empty() || b.is_empty() {
        let one = if a.is_empty() { b } else { a };
        if !one.is_empty() {
            println!("| {name} (one side) | {:.1} |", median(one));
        }
        return;
    }
    let (ma, mb) = (median(a), median(b));
    println!("| {name} | {ma:.0} | {mb:.0} | {:.2} |", mb / ma);
}

/// The daemon's resident memory while a backlog builds up.
fn daemon_rss() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        "name: backlog\ntopics: [waiting, done]\nstages:\n  - name: slow\n    subscribe: waiting\n    plugin: {}\n    publish: [done]\n    timeout: 120s\n    config: {{ms: 60000}}\n",
        sluice_harness::plugin("sleepy").display()
    );
    let file = dir.path().join("backlog.yaml");
    std::fs::write(&file, yaml).expect("write pipeline");
    let mut daemon = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("run")
            .arg(&file)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--admin", "127.0.0.1:0"])
            .env("SLUICE_LOG", "warn,sluice=info")
            .env("SLUICE_CACHE_DIR", dir.path().join("cache"))
            .stderr(Stdio::piped())
            .spawn()
            .expect("sluice run"),
    );
    let stderr = daemon.0.stderr.take().expect("stderr");
    // Keep draining the daemon's log after the ready line: a full pipe would
    // block its writes and stall it.
    let (ready, started_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("admin on http://").nth(1) {
                let _ = ready.send(rest.split(';').next().unwrap_or_default().to_owned());
            }
        }
    });
    let admin = started_rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the daemon did not start");
    let rss = |pid: u32| -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0.0);
        kib / 1024.0
    };
    let http = reqwest::blocking::Client::new();
    let payload = "a".repeat(64);
    let chunk = 5_000;
    let mut published = 0usize;
    let started = Instant::now();
    let mut rows = vec![("idle", rss(daemon.0.id()))];
    for checkpoint in [100_000usize, 500_000, 1_000_000] {
        while published < checkpoint {
            let mut body = String::with_capacity(chunk * 100);
            for i in published..published + chunk {
                body.push_str(&format!("{{\"id\":\"b{i}\",\"payload\":\"{payload}\"}}\n"));
            }
            let response = http
                .post(format!("http://{admin}/v1/topics/waiting/batch"))
                .header("content-type", "application/x-ndjson")
                .body(body)
                .send()
                .expect("publish");
            assert!(response.status().is_success(), "{}", response.status());
            published += chunk;
        }
        let label = match checkpoint {
            100_000 => "100k",
            500_000 => "500k",
            _ => "1M",
        };
        rows.push((label, rss(daemon.0.id())));
    }
    let took = started.elapsed();
    drop(daemon);
    let figures: Vec<String> = rows
        .iter()
        .map(|(l, mb)| format!("{l}: {mb:.0} MiB"))
        .collect();
    println!(
        "| daemon VmRSS with a backlog (published at {:.0} msgs/s over HTTP) | {} | | |",
        1_000_000.0 / took.as_secs_f64(),
        figures.join(", ")
    );
}

/// Kills the daemon however the bench ends: a daemon left behind keeps its
/// busy handler spinning and skews every later measurement on the machine.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// This process's resident memory, in bytes.
fn self_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Issue 43: RSS with 1,000,000 keys in a store (see the module docs).
async fn state_rss() {
    use sluice::broker::{Completion, ConsumerSpec};
    use sluice::state::{StateWrites, Write};
    const KEYS: usize = 1_000_000;
    const PER_CALL: usize = 1_000;
    let dir = tempfile::tempdir().expect("dir");
    let broker = EmbeddedBroker::open(EmbeddedOptions::new(dir.path())).expect("broker");
    broker
        .ensure_topic(&TopicSpec::new("in"))
        .await
        .expect("topic");
    broker
        .ensure_consumer(&ConsumerSpec {
            name: "s.s".into(),
            topic: "in".into(),
            filter: std::collections::BTreeMap::new(),
            ack_wait: Duration::from_secs(60),
            max_ack_pending: None,
            max_deliver: None,
        })
        .await
        .expect("consumer");
    let idle = self_rss();
    let calls = KEYS / PER_CALL;
    let inputs = (0..calls)
        .map(|i| Message::new(format!("m{i}"), "in", "x"))
        .collect();
    broker.publish(inputs).await.expect("publish");
    let started = Instant::now();
    let mut done = 0;
    while done < calls {
        let deliveries = broker
            .fetch("s.s", 64, Duration::from_secs(1))
            .await
            .expect("fetch");
        for d in deliveries {
            let writes = (0..PER_CALL)
                .map(|k| {
                    let n = done * PER_CALL + k;
                    (
                        format!("key/{n:08}"),
                        Write::Put {
                            value: format!("{n:016}").into_bytes(),
                            expires_at: 0,
                        },
                    )
                })
                .collect();
            let mut completion = Completion::new(&d.receipt, Vec::new());
            completion.state = Some(StateWrites {
                store: "s/s".into(),
                max_bytes: u64::MAX,
                writer: d.message.id.clone(),
                checks: Vec::new(),
                writes,
            });
            broker.complete(&completion).await.expect("complete");
            done += 1;
        }
    }
    let written = started.elapsed();
    let after_writes = self_rss();
    let reader = broker.state().expect("the embedded broker keeps state");
    let mut found = 0;
    for i in 0..100_000u64 {
        let n = (i * 7_919) % KEYS as u64;
        if reader
            .get("s/s", &format!("key/{n:08}"))
            .await
            .expect("get")
            .is_some()
        {
            found += 1;
        }
    }
    assert_eq!(found, 100_000, "every key read back");
    let after_reads = self_rss();
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "| state store, 1,000,000 keys ({:.1} s to commit): VmRSS above idle after the writes | {:.1} MB | after 100,000 reads | {:.1} MB |",
        written.as_secs_f64(),
        mb(after_writes.saturating_sub(idle)),
        mb(after_reads.saturating_sub(idle)),
    );
}
