//! Both edges at once, under faults (issue 13's first "must show"): a Redis
//! stream feeds an `uppercase` stage, which feeds a Postgres table sink,
//! with 50,000 entries produced while the daemons run. Mid-run, daemons
//! are killed with SIGKILL three times, redis-server is restarted and
//! Postgres is restarted. Every upstream entry must become exactly one
//! row: none lost, none twice. On the embedded broker (one daemon) and on
//! NATS (two daemons sharing the group and the table).
//!
//! The producer writes each entry with an explicit id (`<i>-1`), so its own
//! retries across the Redis restart never add an entry twice: whatever
//! repeats downstream is Sluice's doing.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_harness::postgres::PostgresServer;
use sluice_harness::redis::RedisServer;
use sluice_tests::{Backend, Daemon, plugin, write_pipeline};

const N: usize = 50_000;
const LIMIT: Duration = Duration::from_secs(300);

/// Appends entries `1..=N` to `in` in chunks, pacing itself so the run
/// lasts long enough for the faults to land mid-run, and retrying across
/// a Redis restart. An id the stream already has (a retried chunk that
/// had gone through) is refused by Redis and skipped.
fn producer(url: String, produced: Arc<AtomicUsize>, stop: Arc<AtomicBool>) {
    let client = redis::Client::open(url.as_str()).expect("a redis URL");
    let mut conn = None;
    let mut i = 1;
    while i <= N && !stop.load(Ordering::Relaxed) {
        let end = (i + 499).min(N);
        let connection = match &mut conn {
            Some(c) => c,
            None => match client.get_connection() {
                Ok(c) => conn.insert(c),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            },
        };
        let mut failed = false;
        for n in i..=end {
            let sent: redis::RedisResult<redis::Value> = redis::cmd("XADD")
                .arg("in")
                .arg(format!("{n}-1"))
                .arg("payload")
                .arg(format!("msg-{n}"))
                .query(connection);
            match sent {
                Ok(_) => {}
                Err(e) if e.to_string().contains("equal or smaller") => {}
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            conn = None;
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        produced.store(end, Ordering::Relaxed);
        i = end + 1;
        std::thread::sleep(Duration::from_millis(40));
    }
}

fn pipeline(dir: &std::path::Path, redis: &str, pg: &str) -> std::path::PathBuf {
    let yaml = format!(
        r#"
name: edges
topics: [orders, orders.upper]
sources:
  - name: from-redis
    to: orders
    redis:
      url: "{redis}"
      stream: in
      group: sluice
      start: oldest
      claim_idle: 3s
stages:
  - name: upper
    subscribe: orders
    plugin: {plugin}
    publish: [orders.upper]
    concurrency: 2
    ack_wait: 5s
sinks:
  - name: archive
    subscribe: orders.upper
    concurrency: 2
    ack_wait: 5s
    batch: {{max: 100, wait: 20ms}}
    postgres:
      url: "{pg}"
      table: orders_out
"#,
        plugin = plugin("uppercase"),
    );
    write_pipeline(dir, "edges", &yaml)
}

/// Rows in the sink's table (0 until it exists), or `None` while Postgres
/// does not answer.
fn rows(pg: &PostgresServer) -> Option<u64> {
    let out = pg
        .psql("select count(*) from (select 1 from pg_tables where tablename = 'orders_out') t")
        .ok()?;
    if out.trim() == "0" {
        return Some(0);
    }
    pg.psql("select count(*) from orders_out")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Waits until the table holds at least `at_least` rows.
fn wait_rows(pg: &PostgresServer, at_least: u64, logs: &dyn Fn() -> String) {
    let started = Instant::now();
    while rows(pg).unwrap_or(0) < at_least {
        assert!(
            started.elapsed() < LIMIT,
            "timed out waiting for {at_least} rows (have {:?})\n{}",
            rows(pg),
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn redis_to_postgres_under_faults(backend: &Backend, daemon_count: usize) {
    let mut redis = RedisServer::start().unwrap_or_else(|e| panic!("redis-server: {e:#}"));
    let mut pg = PostgresServer::start().unwrap_or_else(|e| panic!("postgres: {e:#}"));
    let dir = tempfile::tempdir().expect("dir");
    let file = pipeline(dir.path(), &redis.url(), &pg.url());
    let daemons: Vec<Mutex<Daemon>> = (0..daemon_count)
        .map(|k| {
            Mutex::new(Daemon::start_on(
                backend,
                &[&file],
                &dir.path().join(format!("data{k}")),
            ))
        })
        .collect();
    let logs = || {
        daemons
            .iter()
            .map(|d| d.lock().map(|d| d.log()).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    let produced = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (url, produced, stop) = (redis.url(), produced.clone(), stop.clone());
        std::thread::spawn(move || producer(url, produced, stop))
    };

    // The faults, each once the table shows progress, each checked to
    // come before the end.
    let mut at_fault = Vec::new();
    let kill = |k: usize| {
        let mut daemon = daemons[k % daemon_count].lock().expect("daemon");
        daemon.kill9();
        std::thread::sleep(Duration::from_millis(300));
        daemon.restart();
    };
    wait_rows(&pg, 4_000, &logs);
    at_fault.push(("kill -9 #1", rows(&pg)));
    kill(0);
    wait_rows(&pg, 10_000, &logs);
    at_fault.push(("redis-server restart", rows(&pg)));
    redis.restart().expect("redis-server restarts");
    wait_rows(&pg, 16_000, &logs);
    at_fault.push(("kill -9 #2", rows(&pg)));
    kill(1);
    wait_rows(&pg, 22_000, &logs);
    at_fault.push(("postgres restart", rows(&pg)));
    pg.restart().expect("postgres restarts");
    wait_rows(&pg, 28_000, &logs);
    at_fault.push(("kill -9 #3", rows(&pg)));
    kill(2);

    wait_rows(&pg, N as u64, &logs);
    stop.store(true, Ordering::Relaxed);
    feeder.join().expect("the producer");
    // Anything redelivered late (a reclaimed entry, an expired lease)
    // would land now: the quiet window is the check, as a redelivery that
    // does not happen leaves no event to wait for.
    std::thread::sleep(Duration::from_secs(4));

    for (fault, rows_then) in &at_fault {
        let rows_then = rows_then.unwrap_or(0);
        assert!(
            rows_then < N as u64,
            "the {fault} came after the end ({rows_then} rows)"
        );
    }
    assert_eq!(produced.load(Ordering::Relaxed), N);
    let total: u64 = pg
        .psql("select count(*) from orders_out")
        .expect("count")
        .trim()
        .parse()
        .expect("a count");
    let payloads: BTreeSet<String> = pg
        .psql("select convert_from(payload, 'UTF8') from orders_out")
        .expect("payloads")
        .lines()
        .map(str::to_owned)
        .collect();
    let expected: BTreeSet<String> = (1..=N).map(|n| format!("MSG-{n}")).collect();
    let missing = expected.difference(&payloads).take(5).collect::<Vec<_>>();
    assert!(missing.is_empty(), "lost entries, e.g. {missing:?}");
    assert_eq!(payloads.len(), N, "unexpected rows");
    assert_eq!(
        total,
        N as u64,
        "{} duplicate rows",
        total.saturating_sub(N as u64)
    );
    // Nothing left unacknowledged upstream, nothing dead-lettered.
    let mut conn = redis::Client::open(redis.url().as_str())
        .and_then(|c| c.get_connection())
        .expect("a connection to redis");
    let summary: redis::Value = redis::cmd("XPENDING")
        .arg("in")
        .arg("sluice")
        .query(&mut conn)
        .expect("XPENDING");
    let pending: u64 = match summary {
        redis::Value::Array(parts) => redis::from_redis_value(parts[0].clone()).expect("count"),
        other => panic!("XPENDING replied {other:?}"),
    };
    assert_eq!(pending, 0, "entries still pending upstream");
    let daemon = daemons[0].lock().expect("daemon");
    for stage in ["upper", "archive"] {
        let dead = daemon.get(&format!("/v1/dlq/edges/{stage}?limit=10"));
        assert_eq!(
            dead["entries"].as_array().map_or(0, Vec::len),
            0,
            "dead letters in {stage}: {dead}"
        );
    }
}

#[test]
fn embedded_one_daemon() {
    redis_to_postgres_under_faults(&Backend::embedded(), 1);
}

#[test]
fn nats_two_daemons() {
    redis_to_postgres_under_faults(&Backend::nats(), 2);
}
