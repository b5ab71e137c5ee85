//! The Redis source and sink against a raw Redis loop, side by side in
//! one run (samples alternate A, B, A, B, ...; figures are medians).
//!
//! `cargo bench -p sluice-tests --bench connect_redis`; in the debug
//! test profile (`cargo test -p sluice-tests --bench connect_redis`) it runs a small
//! N, to check that it works. `SLUICE_BENCH_N` sets N.
//!
//! - **A, raw loop**: one Rust task with one connection: `XREADGROUP COUNT
//!   b` from stream `in`, one pipeline of `XADD` to `out` for the batch,
//!   `XACK`; until N entries are in `out`.
//! - **B, sluice**: the real `sluice run` binary (embedded broker, durable,
//!   default sync): a Redis source (`batch: b`) -> `identity` stage
//!   (concurrency 2) -> Redis sink (concurrency 2, `batch: {max: b}`, the
//!   dedup script per message); until N entries are in `out`.
//!
//! Each for a batch size b of 100 and of 1,000; and b = 100 with a
//! `high_water_mark` of 1,000 on the source's topic, where the source
//! reads only as fast as the topic drains.
//!
//! Both start timing when the producer starts appending N entries of 64 B
//! (in pipelines of 1,000) to `in`, with the reader already waiting: the
//! daemon's start-up is not timed. Target: B >= 0.7 x A (entries/s).

#![allow(missing_docs)]

use sluice_tests::bench;
use std::time::{Duration, Instant};

use redis::{AsyncCommands, Value};
use sluice_harness::redis::RedisServer;
use sluice_tests::Daemon;

const SAMPLES: usize = 5;
/// The read batch (`COUNT`, the source's `batch`) and the write batch (one
/// pipeline, the sink's `batch.max`), the same on both sides; and the
/// `high_water_mark` of the source's topic, if any (the raw loop holds
/// nothing, so it has none).
const CASES: [(usize, Option<u64>); 3] = [(100, None), (1000, None), (100, Some(1000))];

fn main() {
    let (n, samples) = bench::size(2_000, 20_000, SAMPLES);
    let rt = bench::runtime();
    sluice_harness::plugin("identity");
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    bench::side_by_side(
        &CASES,
        samples,
        |(batch, _), run| rt.block_on(raw_loop(&url, n, batch, run)),
        |(batch, mark), run| through_sluice(&rt, &url, n, batch, mark, run),
        |(batch, mark)| {
            let mark = mark.map_or_else(String::new, |m| format!(", high_water_mark {m}"));
            format!(
                "redis stream -> redis stream, {n} x 64 B, batch {batch}{mark}, entries/s: raw XREADGROUP+XADD+XACK loop | sluice source -> identity -> sink (embedded, durable)"
            )
        },
    );
}

fn payload(i: usize) -> String {
    format!("{i:0>64}")
}

async fn produce(conn: &mut redis::aio::MultiplexedConnection, stream: &str, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            pipe.cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("payload")
                .arg(payload(*i))
                .ignore();
        }
        let () = pipe.query_async(conn).await.expect("XADD");
    }
}

async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

async fn create_group(conn: &mut redis::aio::MultiplexedConnection, stream: &str) {
    let _: Value = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg("g")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await
        .expect("XGROUP CREATE");
}

/// A: the raw loop, in entries/s.
async fn raw_loop(url: &str, n: usize, batch: usize, run: &str) -> f64 {
    let (input, output) = (format!("raw-in-{run}"), format!("raw-out-{run}"));
    let mut setup = connect(url).await;
    create_group(&mut setup, &input).await;
    let started = Instant::now();
    let producer = {
        let mut conn = connect(url).await;
        let input = input.clone();
        tokio::spawn(async move { produce(&mut conn, &input, n).await })
    };
    let mut conn = connect(url).await;
    let mut done = 0;
    while done < n {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("g")
            .arg("c")
            .arg("COUNT")
            .arg(batch)
            .arg("BLOCK")
            .arg(1000)
            .arg("STREAMS")
            .arg(&input)
            .arg(">")
            .query_async(&mut conn)
            .await
            .expect("XREADGROUP");
        let entries = entries(reply);
        if entries.is_empty() {
            continue;
        }
        let mut pipe = redis::pipe();
        for (id, payload) in &entries {
            pipe.cmd("XADD")
                .arg(&output)
                .arg("*")
                .arg("payload")
                .arg(payload)
                .arg("id")
                .arg(id)
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.expect("XADD");
        let ids: Vec<&String> = entries.iter().map(|(id, _)| id).collect();
        let _: i64 = conn.xack(&input, "g", &ids).await.expect("XACK");
        done += entries.len();
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    producer.await.expect("producer");
    rate
}

/// `(id, payload)` of each entry of an `XREADGROUP` reply.
fn entries(reply: Value) -> Vec<(String, Vec<u8>)> {
    let Value::Array(streams) = reply else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for stream in streams {
        let Value::Array(mut pair) = stream else {
            continue;
        };
        let Some(Value::Array(list)) = pair.pop() else {
            continue;
        };
        for entry in list {
            let Value::Array(mut parts) = entry else {
                continue;
            };
            let fields: Vec<Vec<u8>> =
                redis::from_redis_value(parts.pop().unwrap_or(Value::Nil)).unwrap_or_default();
            let id: String =
                redis::from_redis_value(parts.pop().unwrap_or(Value::Nil)).unwrap_or_default();
            let payload = fields
                .chunks(2)
                .find(|c| c[0] == b"payload")
                .map(|c| c[1].clone())
                .unwrap_or_default();
            out.push((id, payload));
        }
    }
    out
}

/// B: through the real daemon, in entries/s.
fn through_sluice(
    rt: &tokio::runtime::Runtime,
    url: &str,
    n: usize,
    batch: usize,
    mark: Option<u64>,
    run: &str,
) -> bench::Sample {
    let (input, output) = (format!("in-{run}"), format!("out-{run}"));
    let dir = tempfile::tempdir().expect("dir");
    let file = bench::round_trip_pipeline(
        dir.path(),
        mark,
        batch,
        &format!(
            r#"redis: {{url: "{url}", stream: {input}, group: g, start: oldest, batch: {batch}}}"#
        ),
        &format!(r#"redis: {{url: "{url}", stream: {output}}}"#),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    let mut conn = rt.block_on(connect(url));
    // The group exists once the source has read (an empty stream) once.
    let started = Instant::now();
    loop {
        let exists: bool = rt.block_on(conn.exists(&input)).expect("EXISTS");
        if exists {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no group");
        std::thread::sleep(Duration::from_millis(10));
    }
    let window = bench::Window::start(&daemon);
    rt.block_on(async {
        let mut producer = connect(url).await;
        produce(&mut producer, &input, n).await;
        loop {
            let len: usize = conn.xlen(&output).await.expect("XLEN");
            if len >= n {
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
