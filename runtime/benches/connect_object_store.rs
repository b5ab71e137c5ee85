//! The object-store sink writing Parquet against a raw loop that builds
//! the same record batches with the same crates (serde_json, arrow,
//! parquet) and writes the same files; samples alternating in one run,
//! medians.
//!
//! `cargo bench -p sluice --bench connect_object_store`; in the debug test
//! profile (`cargo test -p sluice --bench connect_object_store`) it runs
//! with a small N. `SLUICE_BENCH_N` sets the messages per sample,
//! `SLUICE_BENCH_CASES=file,s3` which targets run.
//!
//! - **sink**: a sink stage (`object_store:` Parquet, zstd, files of
//!   50,000 records, batches of 500, `concurrency: 2`) on the embedded
//!   broker, fed by a pre-published backlog of N JSON orders (~50 B):
//!   time from the engine's start until every message is acked, which is
//!   after the file holding it is complete in the store.
//! - **raw**: the same N payloads, parsed with serde_json into arrow
//!   builders 500 at a time, written by parquet's `ArrowWriter` (zstd),
//!   50,000 rows a file; each file fsynced (`file://`) or PUT (S3) when it
//!   is done.
//!
//! Target (`file://`): sink ≥ 0.8 × raw. Against moto S3: reported.

#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::builder::{Float64Builder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use sluice::broker::embedded::{EmbeddedBroker, EmbeddedOptions};
use sluice::broker::{Broker, Message, TopicSpec};
use sluice::connect::{Context, Health, SinkConfig, SinkDef, SinkHandler};
use sluice::engine::{Engine, StageHandler, StageSetup};
use sluice::metrics::Metrics;
use sluice_harness::moto::MotoServer;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 500;
const CONCURRENCY: usize = 2;
/// Rows per file (fewer when a sample has fewer messages): N should be a
/// multiple, so that both sides write only full files.
const FILE_ROWS: usize = 50_000;

fn main() {
    // The sink reads S3 credentials from the environment, as in production;
    // the process cannot set its own safely once threads run, so it runs
    // itself again with moto's.
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        let status = std::process::Command::new(std::env::current_exe().expect("exe"))
            .args(std::env::args_os().skip(1))
            .env("AWS_ACCESS_KEY_ID", sluice_harness::moto::ACCESS_KEY_ID)
            .env(
                "AWS_SECRET_ACCESS_KEY",
                sluice_harness::moto::SECRET_ACCESS_KEY,
            )
            .env("AWS_DEFAULT_REGION", sluice_harness::moto::REGION)
            .status()
            .expect("run the bench again");
        std::process::exit(status.code().unwrap_or(1));
    }
    let n: usize = std::env::var("SLUICE_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            5_000
        } else {
            200_000
        });
    let samples = if cfg!(debug_assertions) { 1 } else { 5 };
    let cases = std::env::var("SLUICE_BENCH_CASES").unwrap_or_else(|_| "file,s3".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let payloads: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..n)
            .map(|i| {
                format!(r#"{{"order_id":"o{i}","qty":{i},"price":{}.25}}"#, i % 1000).into_bytes()
            })
            .collect(),
    );
    println!("| benchmark | raw loop | sink | ratio sink/raw |");
    println!("|---|---:|---:|---:|");
    if cases.contains("file") {
        let (mut raw, mut sink) = (Vec::new(), Vec::new());
        for _ in 0..samples {
            let dir = tempfile::tempdir().expect("dir");
            raw.push(rt.block_on(run_raw(Target::Dir(dir.path().into()), &payloads)));
            let dir = tempfile::tempdir().expect("dir");
            let store = format!("file://{}", dir.path().display());
            sink.push(rt.block_on(run_sink(&store, "", &payloads)));
        }
        report(
            &format!("Parquet to `file://`, msgs/s, {n} orders"),
            &raw,
            &sink,
        );
        // The engine and broker alone: the same stage with a sink that
        // takes each batch and writes nothing, the ceiling of any sink.
        let ceiling: Vec<f64> = (0..samples)
            .map(|_| rt.block_on(run_stage(None, "", &payloads)))
            .collect();
        report(
            &format!(
                "the same stage with a sink that writes nothing (the engine's ceiling), msgs/s, {n} orders"
            ),
            &raw,
            &ceiling,
        );
    }
    if cases.contains("s3") {
        let moto = MotoServer::start().expect("moto");
        let (mut raw, mut sink) = (Vec::new(), Vec::new());
        for sample in 0..samples {
            let bucket = format!("raw-{sample}");
            moto.create_bucket(&bucket).expect("bucket");
            let store = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(&bucket)
                .with_endpoint(moto.endpoint())
                .with_allow_http(true)
                .build()
                .expect("s3");
            raw.push(rt.block_on(run_raw(Target::Cloud(Arc::new(store)), &payloads)));
            let bucket = format!("sink-{sample}");
            moto.create_bucket(&bucket).expect("bucket");
            let extra = format!("endpoint: {}\nallow_http: true\n", moto.endpoint());
            sink.push(rt.block_on(run_sink(&format!("s3://{bucket}"), &extra, &payloads)));
        }
        report(
            &format!("Parquet to moto S3, msgs/s, {n} orders (moto bounds it)"),
            &raw,
            &sink,
        );
    }
}

fn report(what: &str, raw: &[f64], sink: &[f64]) {
    let (a, b) = (median(raw), median(sink));
    println!("| {what} | {a:.0} | {b:.0} | {:.2} |", b / a);
    eprintln!("  samples raw {raw:.0?} sink {sink:.0?}");
}

enum Target {
    Dir(std::path::PathBuf),
    Cloud(Arc<dyn ObjectStore>),
}

fn schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("sluice_id", DataType::Utf8, false),
        Field::new("sluice_key", DataType::Utf8, true),
        Field::new(
            "sluice_published_at",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        ),
        Field::new("order_id", DataType::Utf8, true),
        Field::new("price", DataType::Float64, true),
        Field::new("qty", DataType::Int64, true),
    ]))
}

fn writer() -> ArrowWriter<Vec<u8>> {
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(64 * 1024))
        .build();
    ArrowWriter::try_new(Vec::new(), schema(), Some(properties)).expect("writer")
}

/// One batch of payloads as a record batch, parsed as the sink parses.
fn batch(first: usize, payloads: &[Vec<u8>]) -> RecordBatch {
    let (mut ids, mut keys, mut times) = (
        StringBuilder::new(),
        StringBuilder::new(),
        arrow_array::builder::TimestampMillisecondBuilder::new().with_timezone("UTC"),
    );
    let (mut order, mut price, mut qty) = (
        StringBuilder::new(),
        Float64Builder::new(),
        Int64Builder::new(),
    );
    for (i, payload) in payloads.iter().enumerate() {
        let value: serde_json::Value = serde_json::from_slice(payload).expect("json");
        ids.append_value(format!("m{}", first + i));
        keys.append_null();
        times.append_value(1_764_000_000_000);
        order.append_option(value["order_id"].as_str());
        price.append_option(value["price"].as_f64());
        qty.append_option(value["qty"].as_i64());
    }
    let arrays: Vec<ArrayRef> = vec![
        Arc::new(ids.finish()),
        Arc::new(keys.finish()),
        Arc::new(times.finish()),
        Arc::new(order.finish()),
        Arc::new(price.finish()),
        Arc::new(qty.finish()),
    ];
    RecordBatch::try_new(schema(), arrays).expect("batch")
}

/// What a user would write instead: batches into a writer, a file every
/// `FILE_ROWS` rows, each made durable before the next.
async fn run_raw(target: Target, payloads: &[Vec<u8>]) -> f64 {
    let started = Instant::now();
    for (file, rows) in payloads.chunks(FILE_ROWS.min(payloads.len())).enumerate() {
        let mut w = writer();
        for (j, chunk) in rows.chunks(BATCH).enumerate() {
            w.write(&batch(file * rows.len() + j * BATCH, chunk))
                .expect("write");
        }
        let bytes = w.into_inner().expect("finish");
        let name = format!("part-{file}.parquet");
        match &target {
            Target::Dir(dir) => {
                let path = dir.join(&name);
                tokio::task::spawn_blocking(move || {
                    use std::io::Write;
                    let mut f = std::fs::File::create(path).expect("create");
                    f.write_all(&bytes).expect("write");
                    f.sync_data().expect("sync");
                })
                .await
                .expect("task");
            }
            Target::Cloud(store) => {
                store
                    .put(
                        &object_store::path::Path::from(name),
                        PutPayload::from(bytes),
                    )
                    .await
                    .expect("put");
            }
        }
    }
    payloads.len() as f64 / started.elapsed().as_secs_f64()
}

async fn run_sink(store: &str, extra: &str, payloads: &[Vec<u8>]) -> f64 {
    run_stage(Some(store), extra, payloads).await
}

/// A sink that takes every batch and writes nothing.
struct Noop;

#[async_trait::async_trait]
impl sluice::connect::Sink for Noop {
    async fn write(&self, _: &sluice::plugin::Message) -> Result<(), sluice::connect::SinkError> {
        Ok(())
    }
}

/// The sink stage on `store` (`None`: with the [`Noop`] sink), timed until
/// every message is acked.
async fn run_stage(store: Option<&str>, extra: &str, payloads: &[Vec<u8>]) -> f64 {
    let noop = store.is_none();
    let store = store.unwrap_or("file:///tmp");
    let dir = tempfile::tempdir().expect("dir");
    let broker: Arc<dyn Broker> =
        EmbeddedBroker::open(EmbeddedOptions::new(dir.path())).expect("broker");
    for name in ["in", "b.lake.dlq"] {
        broker
            .ensure_topic(&TopicSpec::new(name))
            .await
            .expect("topic");
    }
    for (c, chunk) in payloads.chunks(1000).enumerate() {
        let batch = chunk
            .iter()
            .enumerate()
            .map(|(i, p)| Message::new(format!("m{}", c * 1000 + i), "in", p.clone()))
            .collect();
        broker.publish(batch).await.expect("publish");
    }
    let rows = FILE_ROWS.min(payloads.len());
    let block = format!(
        "store: \"{store}\"\n{extra}format: parquet\ncompression: zstd\npath: \"\"\n\
         roll: {{max_records: {rows}, max_bytes: 1GiB, max_age: 10m}}\n\
         schema: {{order_id: string, qty: int64, price: float64}}\n"
    );
    let yaml = format!(
        "name: lake\nsubscribe: in\nconcurrency: {CONCURRENCY}\nbatch: {{max: {BATCH}, wait: 5ms}}\n\
         object_store:\n{}",
        block
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect::<String>()
    );
    let def: SinkDef = serde_saphyr::from_str(&yaml).expect("sink");
    let stage = def.to_stage();
    let metrics = Arc::new(Metrics::new());
    let ctx = Context {
        pipeline: "b".into(),
        name: "lake".into(),
        metrics: metrics.clone(),
        health: Arc::new(Health::default()),
        data_dir: None,
    };
    let built: Arc<dyn sluice::connect::Sink> = if noop {
        Arc::new(Noop)
    } else {
        def.object_store
            .as_ref()
            .expect("object_store block")
            .build(&ctx)
            .await
            .expect("build")
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
        shutdown_timeout: Duration::from_secs(30),
        plugin_sha256: None,
    };
    let started = Instant::now();
    let engine = Engine::start(broker.clone(), metrics.clone(), None, None, vec![setup])
        .await
        .expect("engine");
    // Done when every message is acked: each is acked only once the file
    // holding it is complete in the store.
    let consumer = sluice::broker::consumer_name("b", "lake");
    loop {
        let stats = broker.consumer_stats(&consumer).await.expect("stats");
        if stats.pending == 0 && stats.in_flight == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed();
    engine.shutdown().await;
    let encoded = metrics.encode();
    let records = encoded
        .lines()
        .find(|l| l.starts_with("sluice_sink_object_records_total{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(
        noop || records >= payloads.len() as f64,
        "the sink wrote {records} of {}",
        payloads.len()
    );
    payloads.len() as f64 / took.as_secs_f64()
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
