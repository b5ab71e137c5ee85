//! Peak memory of the object-store sink while it rolls 256 MB Parquet
//! files to `file://` (issue 45): the sink alone, fed batches directly,
//! so the engine's in-flight messages are not counted.
//!
//! - Orders of ~2 KB (a note of random letters, which zstd cannot shrink
//!   much), batches of 500, `roll: {max_bytes: 256MiB}`, Parquet with zstd;
//!   the sink's row group is 65,536 rows or 64 MiB encoded, whichever
//!   comes first (`encode.rs`); with these records, the bytes.
//! - Idle: the process's RSS once the sink is built. Peak: `VmHWM`, reset
//!   (`/proc/self/clear_refs`) just before the first batch, read after the
//!   last file is in the store.
//! - One row group's size in memory: a raw `ArrowWriter` with the sink's
//!   properties fed the same batches, its `memory_size()` just before each
//!   row group is written out (the largest), and the Arrow size of the
//!   batches it held.
//!
//! `cargo bench -p sluice --bench connect_object_store_rss`;
//! `SLUICE_BENCH_FILES` sets how many files (2 by default). Linux only.

#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::builder::{
    Float64Builder, Int64Builder, StringBuilder, TimestampMillisecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use sluice::connect::{Accepted, Context, Health, SinkConfig, SinkDef};
use sluice::metrics::Metrics;
use sluice::plugin::Message;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 500;
const NOTE: usize = 2000;

fn main() {
    let files: u64 = std::env::var("SLUICE_BENCH_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 1 } else { 2 });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let out = tempfile::tempdir().expect("dir");
    let data = tempfile::tempdir().expect("dir");
    let (idle, peak, messages, seconds, written) =
        rt.block_on(run_sink(out.path(), data.path(), files));
    let (group_memory, group_arrow, group_rows) = row_group_size(messages.min(400_000));
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    println!("| measure | value |");
    println!("|---|---:|");
    println!(
        "| files rolled at max_bytes 256 MiB (then the open one flushed), bytes in the store | {files}, {:.0} MiB |",
        mib(written)
    );
    println!("| messages (~2 KB orders), time | {messages}, {seconds:.1} s |");
    println!("| RSS idle (sink built) | {:.0} MiB |", mib(idle));
    println!(
        "| peak RSS above idle | {:.0} MiB |",
        mib(peak.saturating_sub(idle))
    );
    println!(
        "| one row group in memory: ArrowWriter::memory_size() at its flush ({group_rows} rows) | {:.0} MiB |",
        mib(group_memory)
    );
    println!(
        "| the same rows as Arrow arrays | {:.0} MiB |",
        mib(group_arrow)
    );
    println!(
        "| peak above idle / one row group (memory_size), target < 3 | {:.2} |",
        peak.saturating_sub(idle) as f64 / group_memory as f64
    );
}

/// A note of `NOTE` random letters and digits (xorshift).
fn note(seed: &mut u64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    (0..NOTE)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            char::from(ALPHABET[(*seed % ALPHABET.len() as u64) as usize])
        })
        .collect()
}

fn payload(i: usize, seed: &mut u64) -> Vec<u8> {
    format!(
        r#"{{"order_id":"o{i}","qty":{i},"price":{}.25,"note":"{}"}}"#,
        i % 1000,
        note(seed)
    )
    .into_bytes()
}

/// Feeds the sink until `files` files are in the store: (idle RSS, peak
/// RSS, messages, seconds, bytes written).
async fn run_sink(
    out: &std::path::Path,
    data: &std::path::Path,
    files: u64,
) -> (u64, u64, usize, f64, u64) {
    let yaml = format!(
        "name: lake\nsubscribe: in\nobject_store:\n  store: \"file://{}\"\n  format: parquet\n  \
         compression: zstd\n  path: \"\"\n  roll: {{max_records: 100000000, max_bytes: 256MiB, max_age: 1h}}\n  \
         schema: {{order_id: string, qty: int64, price: float64, note: string}}\n",
        out.display()
    );
    let def: SinkDef = serde_saphyr::from_str(&yaml).expect("sink");
    let metrics = Arc::new(Metrics::new());
    let ctx = Context {
        pipeline: "b".into(),
        name: "lake".into(),
        metrics: metrics.clone(),
        health: Arc::new(Health::default()),
        data_dir: Some(data.to_owned()),
    };
    let sink = def
        .object_store
        .as_ref()
        .expect("object_store block")
        .build(&ctx)
        .await
        .expect("build");
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let idle = status("VmRSS");
    std::fs::write("/proc/self/clear_refs", "5").expect("reset the peak RSS");
    let started = Instant::now();
    // The last record's outcome of each batch: its file is the last one
    // its batch went into, so awaiting them all awaits every file.
    let mut last = Vec::new();
    let mut i = 0;
    while stored_files(out) < files {
        let batch: Vec<Message> = (0..BATCH)
            .map(|k| Message {
                id: format!("m{}", i + k),
                topic: "in".into(),
                key: None,
                headers: Vec::new(),
                payload: payload(i + k, &mut seed),
                attempt: 1,
                published_at: 1_700_000_000_000,
            })
            .collect();
        i += BATCH;
        let mut results = sink.accept_batch(&batch).await;
        match results.pop() {
            Some(Ok(Accepted::Pending(pending))) => last.push(pending),
            other => panic!("not pending: {:?}", other.map(|r| r.map(|_| ()))),
        }
    }
    sink.flush();
    for pending in last {
        tokio::time::timeout(Duration::from_secs(600), pending)
            .await
            .expect("uploaded in time")
            .expect("uploaded");
    }
    let seconds = started.elapsed().as_secs_f64();
    let peak = status("VmHWM");
    (idle, peak, i, seconds, stored(out))
}

/// Bytes in the store's files.
fn stored(dir: &std::path::Path) -> u64 {
    walk(dir).iter().map(|(_, len)| len).sum()
}

fn stored_files(dir: &std::path::Path) -> u64 {
    walk(dir).len() as u64
}

fn walk(dir: &std::path::Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("list").flatten() {
        let path = entry.path();
        let meta = entry.metadata().expect("stat");
        if meta.is_dir() {
            found.extend(walk(&path));
        } else if path.extension().is_some_and(|e| e == "parquet") {
            found.push((path, meta.len()));
        }
    }
    found
}

/// A `/proc/self/status` figure, in bytes.
fn status(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").expect("status");
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("field")
        * 1024
}

/// The largest row group a raw writer with the sink's properties holds
/// before it writes it out: (its `memory_size()`, the Arrow size of the
/// batches in it, its rows).
fn row_group_size(messages: usize) -> (u64, u64, usize) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("sluice_id", DataType::Utf8, false),
        Field::new("sluice_key", DataType::Utf8, true),
        Field::new(
            "sluice_published_at",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            false,
        ),
        Field::new("note", DataType::Utf8, true),
        Field::new("order_id", DataType::Utf8, true),
        Field::new("price", DataType::Float64, true),
        Field::new("qty", DataType::Int64, true),
    ]));
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(64 * 1024))
        .set_max_row_group_bytes(Some(64 << 20))
        .build();
    let mut writer =
        ArrowWriter::try_new(std::io::sink(), schema.clone(), Some(properties)).expect("writer");
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let (mut largest, mut arrow, mut rows) = (0_u64, 0_u64, 0_usize);
    let (mut held_arrow, mut held_rows) = (0_u64, 0_usize);
    for first in (0..messages).step_by(BATCH) {
        let batch = batch(&schema, first, &mut seed);
        let groups = writer.flushed_row_groups().len();
        let before = writer.memory_size() as u64;
        writer.write(&batch).expect("write");
        held_arrow += batch.get_array_memory_size() as u64;
        held_rows += batch.num_rows();
        if writer.flushed_row_groups().len() > groups {
            if before > largest {
                (largest, arrow, rows) = (before, held_arrow, held_rows);
            }
            (held_arrow, held_rows) = (0, 0);
        }
    }
    (largest, arrow, rows)
}

fn batch(schema: &Arc<Schema>, first: usize, seed: &mut u64) -> RecordBatch {
    let (mut ids, mut keys, mut notes, mut orders) = (
        StringBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
        StringBuilder::new(),
    );
    let mut times = TimestampMillisecondBuilder::new().with_timezone("UTC");
    let (mut prices, mut qtys) = (Float64Builder::new(), Int64Builder::new());
    for i in first..first + BATCH {
        ids.append_value(format!("m{i}"));
        keys.append_null();
        times.append_value(1_700_000_000_000);
        notes.append_value(note(seed));
        orders.append_value(format!("o{i}"));
        prices.append_value((i % 1000) as f64 + 0.25);
        qtys.append_value(i as i64);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(ids.finish()),
        Arc::new(keys.finish()),
        Arc::new(times.finish()),
        Arc::new(notes.finish()),
        Arc::new(orders.finish()),
        Arc::new(prices.finish()),
        Arc::new(qtys.finish()),
    ];
    RecordBatch::try_new(schema.clone(), columns).expect("batch")
}
