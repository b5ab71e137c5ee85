//! The Postgres table sink against a raw tokio-postgres loop, samples
//! alternating in one run (figures are medians).
//!
//! `cargo bench -p sluice --bench connect_postgres`; in the debug test
//! profile (`cargo test -p sluice --bench connect_postgres`) it runs with
//! a small N. `SLUICE_BENCH_N` sets the rows per sample.
//!
//! - **sink**: a batch sink stage (`batch: {max: 100}`, `concurrency: 2`,
//!   `table:`) on the embedded broker, fed by a pre-published backlog of N
//!   messages of 64 B: time from the engine's start until N rows are in
//!   the table.
//! - **raw**: the same N rows through two tokio-postgres connections, each
//!   a loop of prepared multi-row `INSERT ... VALUES (...), (...) ON
//!   CONFLICT (id) DO NOTHING` of 100 rows.
//!
//! Target: sink ≥ 0.8 × raw.

#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use sluice::broker::embedded::{EmbeddedBroker, EmbeddedOptions};
use sluice::broker::{Broker, Message, TopicSpec};
use sluice::connect::{Context, Health, SinkConfig, SinkDef, SinkHandler};
use sluice::engine::{Engine, StageHandler, StageSetup};
use sluice::metrics::Metrics;
use sluice_harness::postgres::PostgresServer;
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 100;
const CONCURRENCY: usize = 2;

fn main() {
    let n: usize = std::env::var("SLUICE_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            2_000
        } else {
            50_000
        });
    let samples = if cfg!(debug_assertions) { 2 } else { 5 };
    let server = PostgresServer::start().expect("postgres");
    let url = server.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (mut raw, mut sink, mut direct, mut ceiling) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for sample in 0..samples {
        raw.push(rt.block_on(run_raw(&url, &format!("raw_{sample}"), n)));
        sink.push(rt.block_on(run_sink(&url, &format!("sink_{sample}"), n)));
        direct.push(rt.block_on(run_direct(&url, &format!("direct_{sample}"), n)));
        let noop = Arc::new(Noop(std::sync::atomic::AtomicUsize::new(0)));
        ceiling.push(rt.block_on(run_stage(&url, &format!("noop_{sample}"), n, Some(noop))));
    }
    println!("| benchmark | A | B | ratio B/A |");
    println!("|---|---|---|---|");
    let (ma, mb) = (median(&raw), median(&sink));
    println!(
        "| postgres rows/s, {n} × 64 B, batch {BATCH}, concurrency {CONCURRENCY} (raw tokio-postgres | table sink) | {ma:.0} | {mb:.0} | {:.2} |",
        mb / ma
    );
    let mc = median(&direct);
    println!(
        "| postgres rows/s, the same, connector alone (raw tokio-postgres | `Sink::write_batch` without the engine) | {ma:.0} | {mc:.0} | {:.2} |",
        mc / ma
    );
    let md = median(&ceiling);
    println!(
        "| msgs/s of the same batch stage with a sink that does nothing (table sink | no-op sink): the engine's ceiling | {mb:.0} | {md:.0} | {:.2} |",
        md / mb
    );
}

/// The connector without the engine: `write_batch` of 100 messages in a
/// loop on `CONCURRENCY` tasks, to tell the connector's cost from the
/// broker's and the stage runner's.
async fn run_direct(url: &str, table: &str, n: usize) -> f64 {
    let yaml = format!("url: \"{url}\"\ntable: {table}\n");
    let config: sluice::connect::postgres::TableSinkConfig =
        serde_saphyr::from_str(&yaml).expect("config");
    let ctx = Context {
        pipeline: "b".into(),
        name: "direct".into(),
        metrics: Arc::new(Metrics::new()),
        health: Arc::new(Health::default()),
        data_dir: None,
    };
    let slots = std::num::NonZeroU32::new(CONCURRENCY as u32).expect("non-zero");
    let sink = config.build_for(&ctx, slots).await.expect("build");
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|worker| {
            let sink = sink.clone();
            tokio::spawn(async move {
                let mut i = worker * BATCH;
                while i < n {
                    let batch: Vec<sluice::plugin::Message> = (i..i + BATCH)
                        .map(|j| {
                            sluice::plugin::Message::new(format!("m{j}"), "in", vec![b'a'; 64])
                        })
                        .collect();
                    for result in sink.write_batch(&batch).await {
                        result.expect("write");
                    }
                    i += BATCH * CONCURRENCY;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("worker");
    }
    n as f64 / started.elapsed().as_secs_f64()
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

async fn count(client: &tokio_postgres::Client, table: &str) -> usize {
    let n: i64 = client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await
        .map(|r| r.get(0))
        .unwrap_or(0);
    usize::try_from(n).unwrap_or(0)
}

async fn run_raw(url: &str, table: &str, n: usize) -> f64 {
    let admin = connect(url).await;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table} (id text PRIMARY KEY, topic text, key text, headers jsonb, payload bytea, published_at timestamptz)"
        ))
        .await
        .expect("create");
    let values: Vec<String> = (0..BATCH)
        .map(|r| {
            let b = r * 6;
            format!(
                "(${}, ${}, ${}, ${}, ${}, ${})",
                b + 1,
                b + 2,
                b + 3,
                b + 4,
                b + 5,
                b + 6
            )
        })
        .collect();
    let sql = format!(
        "INSERT INTO {table} (id, topic, key, headers, payload, published_at) VALUES {} ON CONFLICT (id) DO NOTHING",
        values.join(", ")
    );
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|worker| {
            let url = url.to_owned();
            let sql = sql.clone();
            tokio::spawn(async move {
                let client = connect(&url).await;
                let statement = client.prepare(&sql).await.expect("prepare");
                let payload = vec![b'a'; 64];
                let headers = serde_json::json!({});
                let topic = "in".to_owned();
                let key: Option<String> = None;
                let now = SystemTime::now();
                let mut i = worker * BATCH;
                while i < n {
                    let ids: Vec<String> = (i..i + BATCH).map(|j| format!("m{j}")).collect();
                    let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(BATCH * 6);
                    for id in &ids {
                        params.extend([
                            id as &(dyn ToSql + Sync),
                            &topic,
                            &key,
                            &headers,
                            &payload,
                            &now,
                        ]);
                    }
                    client.execute(&statement, &params).await.expect("insert");
                    i += BATCH * CONCURRENCY;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("worker");
    }
    let took = started.elapsed();
    let rows = count(&admin, table).await;
    assert!(rows >= n, "raw wrote {rows} of {n}");
    rows as f64 / took.as_secs_f64()
}

/// A sink that only counts: the ceiling of the engine and the broker.
struct Noop(std::sync::atomic::AtomicUsize);

#[async_trait::async_trait]
impl sluice::connect::Sink for Noop {
    async fn write(&self, _: &sluice::plugin::Message) -> Result<(), sluice::connect::SinkError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

async fn run_sink(url: &str, table: &str, n: usize) -> f64 {
    run_stage(url, table, n, None).await
}

async fn run_stage(url: &str, table: &str, n: usize, noop: Option<Arc<Noop>>) -> f64 {
    let dir = tempfile::tempdir().expect("dir");
    let broker: Arc<dyn Broker> =
        EmbeddedBroker::open(EmbeddedOptions::new(dir.path())).expect("broker");
    for name in ["in", "b.to-table.dlq"] {
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
    let yaml = format!(
        "name: to-table\nsubscribe: in\nconcurrency: {CONCURRENCY}\nbatch: {{max: {BATCH}, wait: 5ms}}\npostgres:\n  url: \"{url}\"\n  table: {table}\n"
    );
    let def: SinkDef = serde_saphyr::from_str(&yaml).expect("sink");
    let stage = def.to_stage();
    let metrics = Arc::new(Metrics::new());
    let ctx = Context {
        pipeline: "b".into(),
        name: "to-table".into(),
        metrics: metrics.clone(),
        health: Arc::new(Health::default()),
        data_dir: None,
    };
    let built: Arc<dyn sluice::connect::Sink> = match &noop {
        Some(noop) => noop.clone(),
        None => def
            .postgres
            .as_ref()
            .expect("postgres block")
            .build_for(&ctx, *stage.delivery.concurrency)
            .await
            .expect("build"),
    };
    let setup = StageSetup {
        pipeline: "b".into(),
        handlers: (0..CONCURRENCY)
            .map(|_| {
                Box::new(SinkHandler::new(
                    built.clone(),
                    ctx.clone(),
                    Duration::from_secs(30),
                    Duration::from_secs(1),
                )) as Box<dyn StageHandler>
            })
            .collect(),
        stage,
        shutdown_timeout: Duration::from_secs(5),
        plugin_sha256: None,
    };
    let admin = connect(url).await;
    let started = Instant::now();
    let engine = Engine::start(broker.clone(), metrics, None, None, vec![setup])
        .await
        .expect("engine");
    // Done when the stage has settled every message: a row is written
    // before its message is acked, so all N rows are in the table then.
    // Asking the broker costs Postgres nothing; polling `count(*)` every
    // few ms (as this bench first did) took a core from Postgres while the
    // raw loop, which counts once at the end, had both.
    let consumer = sluice::broker::consumer_name("b", "to-table");
    loop {
        let stats = broker.consumer_stats(&consumer).await.expect("stats");
        if stats.pending == 0 && stats.in_flight == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let took = started.elapsed();
    engine.shutdown().await;
    let done = match &noop {
        Some(noop) => noop.0.load(std::sync::atomic::Ordering::Relaxed),
        None => count(&admin, table).await,
    };
    assert!(done >= n, "the sink wrote {done} of {n}");
    n as f64 / took.as_secs_f64()
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
