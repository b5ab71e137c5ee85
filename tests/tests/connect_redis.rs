//! The Redis Streams source and sink end to end: a real redis-server per
//! test (`sluice_harness::redis`), the real `sluice` binary, real plugins.
//! Every delivery check is set-based, by the entry's `id` field in the
//! output stream: each input exactly once, none lost, none twice.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use redis::{Commands, Value};
use sluice_harness::redis::RedisServer;
use sluice_tests::edges::{
    Delivered, Duplicates, Upstream, edge_pipeline, round_trip_under_faults,
};
use sluice_tests::{Backend, Daemon, counts, header, plugin, write_pipeline};

const LONG: Duration = Duration::from_secs(240);

fn server() -> RedisServer {
    RedisServer::start().unwrap_or_else(|e| panic!("starting redis-server: {e:#}"))
}

fn client(url: &str) -> redis::Connection {
    let client = redis::Client::open(url).expect("a redis URL");
    let started = Instant::now();
    loop {
        match client.get_connection() {
            Ok(conn) => return conn,
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("connecting to redis: {e}"),
        }
    }
}

/// Appends `n` entries `payload = "msg-<i>"` (ids `<prefix><i>` in a
/// field `n`) to `stream`, in pipelines of 1,000.
fn produce(conn: &mut redis::Connection, stream: &str, from: usize, n: usize) {
    for chunk in (from..from + n).collect::<Vec<_>>().chunks(1000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            pipe.cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("payload")
                .arg(format!("msg-{i}"))
                .arg("n")
                .arg(i.to_string())
                .ignore();
        }
        pipe.exec(conn).expect("XADD");
    }
}

/// Every entry of `stream`, as field maps, oldest first.
fn entries(conn: &mut redis::Connection, stream: &str) -> Vec<BTreeMap<String, String>> {
    entries_with_ids(conn, stream)
        .into_iter()
        .map(|(_, fields)| fields)
        .collect()
}

/// [`entries`] with each entry's id (`<ms>-<seq>`: when Redis took it).
fn entries_with_ids(
    conn: &mut redis::Connection,
    stream: &str,
) -> Vec<(String, BTreeMap<String, String>)> {
    let mut out = Vec::new();
    let mut from = "-".to_string();
    loop {
        let page: Value = redis::cmd("XRANGE")
            .arg(stream)
            .arg(&from)
            .arg("+")
            .arg("COUNT")
            .arg(1000)
            .query(conn)
            .expect("XRANGE");
        let Value::Array(page) = page else {
            return out;
        };
        if page.is_empty() {
            return out;
        }
        for entry in &page {
            let Value::Array(pair) = entry else { continue };
            let id: String = redis::from_redis_value(pair[0].clone()).expect("id");
            let fields: Vec<String> = redis::from_redis_value(pair[1].clone()).expect("fields");
            let map = fields
                .chunks(2)
                .map(|c| (c[0].clone(), c[1].clone()))
                .collect();
            from = format!("({id}");
            out.push((id, map));
        }
    }
}

fn len(conn: &mut redis::Connection, stream: &str) -> usize {
    conn.xlen(stream).expect("XLEN")
}

/// The group's pending count (`XPENDING` summary).
fn pending(conn: &mut redis::Connection, stream: &str, group: &str) -> u64 {
    let summary: Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .query(conn)
        .expect("XPENDING");
    match summary {
        Value::Array(parts) => redis::from_redis_value(parts[0].clone()).expect("count"),
        other => panic!("XPENDING replied {other:?}"),
    }
}

/// The group's lag (`XINFO GROUPS`).
fn lag(conn: &mut redis::Connection, stream: &str, group: &str) -> Option<u64> {
    let groups: Vec<BTreeMap<String, Value>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query(conn)
        .expect("XINFO GROUPS");
    groups
        .into_iter()
        .find(|g| g.get("name") == Some(&Value::BulkString(group.as_bytes().to_vec())))
        .and_then(|g| redis::from_redis_value(g.get("lag")?.clone()).ok())
}

/// Asserts that `out` holds exactly the ids `want` (each once) and
/// returns the entries.
fn assert_exactly_once(
    conn: &mut redis::Connection,
    out: &str,
    want: usize,
) -> Vec<BTreeMap<String, String>> {
    let got = entries(conn, out);
    let ids = counts(got.iter().map(|e| e.get("id").map_or("", String::as_str)));
    let dupes: Vec<_> = ids.iter().filter(|(_, c)| **c > 1).collect();
    assert!(dupes.is_empty(), "{out}: duplicate ids {dupes:?}");
    assert_eq!(ids.len(), want, "{out}: distinct ids");
    assert_eq!(got.len(), want, "{out}: entries");
    got
}

/// The edge suite's pipeline (`in` -> stage `upper` -> `up` -> sink
/// `out`), with the source `src` reading the Redis stream `in` (plus
/// `extra_source` lines) and the sink appending to the stream `out`.
fn upper_pipeline(dir: &Path, url: &str, extra_source: &str) -> std::path::PathBuf {
    edge_pipeline(dir, &source_block(url, extra_source), &sink_block(url))
}

fn source_block(url: &str, extra: &str) -> String {
    format!(
        "redis:\n  url: \"{url}\"\n  stream: in\n  group: g\n  start: oldest\n  batch: 200\n{extra}\n"
    )
}

fn sink_block(url: &str) -> String {
    format!("batch:\n  max: 100\n  wait: 20ms\nredis:\n  url: \"{url}\"\n  stream: out\n")
}

/// A real redis-server as the edge suite's upstream: `in` is read, `out`
/// written (the sink keeps each message's id in the entry's `id` field).
struct RedisUpstream {
    server: RedisServer,
    conn: redis::Connection,
}

impl Upstream for RedisUpstream {
    fn source_block(&self) -> String {
        source_block(&self.server.url(), "")
    }

    fn sink_block(&self) -> String {
        sink_block(&self.server.url())
    }

    fn produce(&mut self, from: usize, n: usize) {
        produce(&mut self.conn, "in", from, n);
    }

    fn delivered(&mut self) -> Vec<Delivered> {
        entries(&mut self.conn, "out")
            .into_iter()
            .map(|mut e| Delivered {
                payload: e.remove("payload").unwrap_or_default(),
                sluice_id: e.remove("id"),
            })
            .collect()
    }

    fn restart(&mut self) {
        self.server.restart().expect("restart redis-server");
        self.conn = client(&self.server.url());
    }

    fn log(&self) -> String {
        self.server.log()
    }
}

fn wait_for_len(daemon: &Daemon, conn: &mut redis::Connection, stream: &str, n: usize) {
    daemon.wait_until(&format!("{n} entries in {stream}"), LONG, |_| {
        len(conn, stream) >= n
    });
}

fn metrics(daemon: &Daemon) -> String {
    reqwest::blocking::get(format!("{}/metrics", daemon.base))
        .expect("GET /metrics")
        .text()
        .expect("metrics text")
}

/// Waits until the group has nothing pending (the last acks are sent
/// after the publish).
fn wait_no_pending(daemon: &Daemon, conn: &mut redis::Connection, stream: &str, group: &str) {
    daemon.wait_until("no pending entries upstream", LONG, |_| {
        pending(conn, stream, group) == 0
    });
}

#[test]
fn five_thousand_entries_arrive_uppercased_exactly_once() {
    let redis = server();
    let mut conn = client(&redis.url());
    let n = 5_000;
    produce(&mut conn, "in", 0, n);
    let dir = tempfile::tempdir().expect("dir");
    let file = upper_pipeline(dir.path(), &redis.url(), "");
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    wait_for_len(&daemon, &mut conn, "out", n);
    wait_no_pending(&daemon, &mut conn, "in", "g");
    let got = assert_exactly_once(&mut conn, "out", n);
    for entry in &got {
        let payload = &entry["payload"];
        assert!(payload.starts_with("MSG-"), "{payload}");
        // The upstream field `n` travelled as a header.
        assert_eq!(payload, &format!("MSG-{}", entry["n"]));
    }
    // The dedup keys are where the docs say.
    let keys: Vec<String> = conn.keys("sluice:dedup:out:*").expect("KEYS");
    assert_eq!(keys.len(), n);
}

/// A pipeline of sources alone is whole: it feeds a topic that another
/// pipeline file drains (topics are shared between pipelines), and
/// `validate` takes it.
#[test]
fn an_ingest_pipeline_of_sources_alone_feeds_another_pipeline() {
    let redis = server();
    let mut conn = client(&redis.url());
    let n = 500;
    produce(&mut conn, "in", 0, n);
    let dir = tempfile::tempdir().expect("dir");
    let ingest = write_pipeline(
        dir.path(),
        "ingest",
        &format!(
            r#"
name: ingest
topics: [orders]
sources:
  - name: src
    to: orders
    redis: {{url: "{url}", stream: in, group: g, start: oldest}}
"#,
            url = redis.url()
        ),
    );
    let deliver = write_pipeline(
        dir.path(),
        "deliver",
        &format!(
            r#"
name: deliver
topics: [orders]
sinks:
  - name: out
    subscribe: orders
    redis: {{url: "{url}", stream: out}}
"#,
            url = redis.url()
        ),
    );
    let validated = std::process::Command::new(sluice_tests::sluice_bin())
        .arg("validate")
        .arg(&ingest)
        .output()
        .expect("sluice validate");
    assert!(
        validated.status.success(),
        "validate refused a pipeline of sources alone: {}",
        String::from_utf8_lossy(&validated.stderr)
    );
    let daemon = Daemon::start(&[&ingest, &deliver], &dir.path().join("data"));
    wait_for_len(&daemon, &mut conn, "out", n);
    wait_no_pending(&daemon, &mut conn, "in", "g");
    assert_exactly_once(&mut conn, "out", n);
}

#[test]
fn start_new_skips_what_was_there_and_an_existing_group_keeps_its_place() {
    let redis = server();
    let mut conn = client(&redis.url());
    produce(&mut conn, "in", 0, 10);
    // A group that exists already, at the end: `start: oldest` below does
    // not move it.
    let _: Value = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("in")
        .arg("old")
        .arg("$")
        .query(&mut conn)
        .expect("XGROUP CREATE");
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: rp
topics: [in, in2]
sources:
  - name: fresh
    to: in
    redis: {{url: "{url}", stream: in, group: fresh, start: new}}
  - name: kept
    to: in2
    redis: {{url: "{url}", stream: in, group: old, start: oldest}}
sinks:
  - name: out
    subscribe: in
    redis: {{url: "{url}", stream: out}}
  - name: out2
    subscribe: in2
    redis: {{url: "{url}", stream: out2}}
"#,
        url = redis.url(),
    );
    let file = write_pipeline(dir.path(), "rp", &yaml);
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("the group `fresh` exists", LONG, |_| {
        lag(&mut conn, "in", "fresh").is_some()
    });
    produce(&mut conn, "in", 10, 5);
    wait_for_len(&daemon, &mut conn, "out", 5);
    wait_for_len(&daemon, &mut conn, "out2", 5);
    wait_no_pending(&daemon, &mut conn, "in", "fresh");
    std::thread::sleep(Duration::from_millis(500));
    for out in ["out", "out2"] {
        let got = assert_exactly_once(&mut conn, out, 5);
        let mut payloads: Vec<&str> = got.iter().map(|e| e["payload"].as_str()).collect();
        payloads.sort_unstable();
        assert_eq!(
            payloads,
            vec!["msg-10", "msg-11", "msg-12", "msg-13", "msg-14"],
            "{out}"
        );
    }
}

#[test]
fn a_redis_restart_mid_run_loses_nothing_and_is_shown() {
    let mut redis = server();
    let url = redis.url();
    let mut conn = client(&url);
    let n = 10_000;
    produce(&mut conn, "in", 0, n);
    let dir = tempfile::tempdir().expect("dir");
    let file = upper_pipeline(dir.path(), &url, "");
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("some output", LONG, |_| len(&mut conn, "out") > 200);
    let at_stop = len(&mut conn, "out");
    redis.stop();
    assert!(at_stop < n, "the restart came after the end ({at_stop})");
    // During the outage: readiness names the source, the gauge says 0.
    daemon.wait_until("readiness degraded", LONG, |d| {
        let ready = d.get("/health/ready");
        ready["status"] == "degraded"
            && ready["reasons"].as_array().is_some_and(|r| {
                r.iter()
                    .any(|r| r.as_str().unwrap_or("").contains("edge/src"))
            })
    });
    daemon.wait_until("connector_up 0", LONG, |d| {
        metrics(d).contains("sluice_connector_up{connector=\"edge/src\"} 0")
    });
    // More entries arrive while it is down (written after it is back).
    redis.start_again().expect("redis back");
    let mut conn = client(&url);
    produce(&mut conn, "in", n, 1_000);
    wait_for_len(&daemon, &mut conn, "out", n + 1_000);
    wait_no_pending(&daemon, &mut conn, "in", "g");
    assert_exactly_once(&mut conn, "out", n + 1_000);
    let text = metrics(&daemon);
    let outages = text
        .lines()
        .find(|l| l.starts_with("sluice_connector_outages_total{connector=\"edge/src\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(outages >= 1.0, "{text}");
    daemon.wait_until("ready again", LONG, |d| {
        d.get("/health/ready")["status"] == "ready"
    });
}

/// A server restarted without persistence comes back empty: no stream,
/// no group. Producers write again at once; the source creates its group
/// again after the last entry it read (not at `$`, which `start: new`
/// says for a first start), so none of what they wrote meanwhile is
/// skipped.
#[test]
fn a_restart_that_loses_the_group_skips_nothing_written_since() {
    let mut upstream = server();
    let target = server();
    let url = upstream.url();
    let mut conn = client(&url);
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: rp
topics: [in]
sources:
  - name: src
    to: in
    redis: {{url: "{url}", stream: in, group: g, start: new}}
sinks:
  - name: out
    subscribe: in
    redis: {{url: "{out}", stream: out}}
"#,
        out = target.url(),
    );
    let file = write_pipeline(dir.path(), "rp", &yaml);
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("the group exists", LONG, |_| {
        conn.exists::<_, bool>("in").unwrap_or(false) && lag(&mut conn, "in", "g").is_some()
    });
    produce(&mut conn, "in", 0, 100);
    let mut out = client(&target.url());
    wait_for_len(&daemon, &mut out, "out", 100);
    upstream.stop_losing_data();
    upstream.start_again().expect("redis back");
    let mut conn = client(&url);
    produce(&mut conn, "in", 100, 100);
    wait_for_len(&daemon, &mut out, "out", 200);
    wait_no_pending(&daemon, &mut conn, "in", "g");
    std::thread::sleep(Duration::from_millis(300));
    assert_exactly_once(&mut out, "out", 200);
    assert!(
        daemon
            .log()
            .contains("created it again after the last entry read"),
        "{}",
        daemon.log()
    );
}

/// The edge suite: 20,000 entries, two kill -9s and a Redis restart; the
/// sink's dedup key makes every entry arrive exactly once.
#[test]
fn the_edge_suite_under_kills_and_a_restart_loses_and_duplicates_nothing() {
    let server = server();
    let conn = client(&server.url());
    let mut up = RedisUpstream { server, conn };
    let report = round_trip_under_faults(&mut up, 20_000, Duplicates::None);
    assert_eq!(report.distinct, 20_000);
}

#[test]
fn a_dead_consumers_entries_are_reclaimed() {
    let redis = server();
    let mut conn = client(&redis.url());
    let _: Value = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("in")
        .arg("g")
        .arg("0")
        .arg("MKSTREAM")
        .query(&mut conn)
        .expect("XGROUP CREATE");
    produce(&mut conn, "in", 0, 100);
    // `ghost` reads them all and dies without acking.
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("g")
        .arg("ghost")
        .arg("COUNT")
        .arg(1000)
        .arg("STREAMS")
        .arg("in")
        .arg(">")
        .query(&mut conn)
        .expect("XREADGROUP");
    assert_eq!(pending(&mut conn, "in", "g"), 100);
    // One of them is deleted meanwhile: XAUTOCLAIM reports it gone.
    let first: Value = redis::cmd("XRANGE")
        .arg("in")
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(1)
        .query(&mut conn)
        .expect("XRANGE");
    let Value::Array(first) = first else {
        panic!("XRANGE")
    };
    let Value::Array(pair) = &first[0] else {
        panic!("entry")
    };
    let first_id: String = redis::from_redis_value(pair[0].clone()).expect("id");
    let _: i64 = conn.xdel("in", &[&first_id]).expect("XDEL");
    produce(&mut conn, "in", 100, 50);
    let dir = tempfile::tempdir().expect("dir");
    let file = upper_pipeline(dir.path(), &redis.url(), "  claim_idle: 2s");
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    wait_for_len(&daemon, &mut conn, "out", 149);
    wait_no_pending(&daemon, &mut conn, "in", "g");
    let got = assert_exactly_once(&mut conn, "out", 149);
    assert!(got.iter().any(|e| e["payload"] == "MSG-1"));
    assert!(
        !got.iter().any(|e| e["payload"] == "MSG-0"),
        "deleted entry came out"
    );
}

#[test]
fn backpressure_keeps_the_topic_at_its_mark_and_the_rest_in_redis() {
    let redis = server();
    let mut conn = client(&redis.url());
    let n = 20_000;
    produce(&mut conn, "in", 0, n);
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: bp
topics:
  - name: in
    high_water_mark: 1000
  - done
sources:
  - name: src
    to: in
    redis:
      url: "{url}"
      stream: in
      group: g
      start: oldest
      batch: 100
stages:
  - name: slow
    subscribe: in
    plugin: {plugin}
    config:
      ms: 5
    publish: [done]
"#,
        url = redis.url(),
        plugin = plugin("sleepy"),
    );
    let file = write_pipeline(dir.path(), "bp", &yaml);
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    let pid = daemon.pid().expect("pid");
    daemon.wait_until("the topic fills", LONG, |d| d.depth("in") >= 900);
    let mut max_depth = 0;
    let mut rss = Vec::new();
    for i in 0..60 {
        max_depth = max_depth.max(daemon.depth("in"));
        if i % 10 == 0 {
            rss.push(vm_rss_kb(pid));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The source reports what waits upstream (XINFO GROUPS lag).
    daemon.wait_until("a source lag in /metrics", LONG, |d| {
        metrics(d).lines().any(|l| {
            l.starts_with("sluice_source_lag{")
                && l.contains("source=\"src\"")
                && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) > Some(1000.0)
        })
    });
    let waiting = lag(&mut conn, "in", "g").unwrap_or(0) + pending(&mut conn, "in", "g");
    let done = daemon.depth("done");
    eprintln!(
        "backpressure: max topic depth {max_depth}, waiting upstream {waiting}, done {done}, \
         VmRSS kB samples {rss:?}"
    );
    assert!(max_depth <= 1000 + 100, "depth {max_depth} passed the mark");
    assert!(
        waiting > 10_000,
        "the rest should wait in Redis, only {waiting} do"
    );
    let max_rss = rss.iter().copied().max().unwrap_or(0);
    assert!(max_rss < 200 * 1024, "VmRSS {max_rss} kB");
}

fn vm_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn poison_entries_and_a_non_stream_target_are_dead_lettered() {
    let redis = server();
    let mut conn = client(&redis.url());
    let _: () = conn.set("out", "not a stream").expect("SET");
    let _: String = conn
        .xadd("in", "*", &[("other", "no payload here")])
        .expect("XADD");
    produce(&mut conn, "in", 0, 3);
    let dir = tempfile::tempdir().expect("dir");
    let file = upper_pipeline(dir.path(), &redis.url(), "");
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("the poison entry in edge.src.dlq", LONG, |d| {
        d.depth("edge.src.dlq") >= 1
    });
    daemon.wait_until("three rejected writes in edge.out.dlq", LONG, |d| {
        d.depth("edge.out.dlq") >= 3
    });
    wait_no_pending(&daemon, &mut conn, "in", "g");
    let poison = daemon.read_all("edge.src.dlq");
    assert_eq!(poison.len(), 1, "{poison:?}");
    let text = poison[0].to_string();
    assert!(text.contains("no `payload` field"), "{text}");
    assert_eq!(header(&poison[0], "other"), Some("no payload here"));
    let rejected = daemon.read_all("edge.out.dlq");
    assert_eq!(rejected.len(), 3);
    for m in &rejected {
        let text = m.to_string();
        assert!(text.contains("rejected"), "{text}");
        assert!(text.contains("WRONGTYPE"), "{text}");
    }
    // The target key is untouched, and no dedup key is left behind, so a
    // replay after fixing the target writes them.
    let still: String = conn.get("out").expect("GET");
    assert_eq!(still, "not a stream");
    let keys: Vec<String> = conn.keys("sluice:dedup:*").expect("KEYS");
    assert!(keys.is_empty(), "{keys:?}");
}

#[test]
fn an_out_of_memory_target_is_retried_until_it_takes_the_writes() {
    let upstream = server();
    let target = server();
    let mut up = client(&upstream.url());
    let mut down = client(&target.url());
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query(&mut down)
        .expect("CONFIG SET maxmemory");
    produce(&mut up, "in", 0, 200);
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: rp
topics: [in]
sources:
  - name: src
    to: in
    redis: {{url: "{up}", stream: in, group: g, start: oldest}}
sinks:
  - name: out
    subscribe: in
    retry:
      max_attempts: 1000
      backoff: {{initial: 50ms, max: 200ms}}
    batch: {{max: 50, wait: 10ms}}
    redis: {{url: "{down}", stream: out}}
"#,
        up = upstream.url(),
        down = target.url(),
    );
    let file = write_pipeline(dir.path(), "rp", &yaml);
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    // The target refuses (OOM): retried, nothing written, nothing lost.
    daemon.wait_until("retries counted", LONG, |d| {
        metrics(d)
            .lines()
            .any(|l| l.contains("retry") && l.contains("stage=\"out\"") && !l.ends_with(" 0"))
    });
    assert_eq!(len(&mut down, "out"), 0);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query(&mut down)
        .expect("CONFIG SET maxmemory 0");
    wait_for_len(&daemon, &mut down, "out", 200);
    std::thread::sleep(Duration::from_millis(500));
    assert_exactly_once(&mut down, "out", 200);
    assert_eq!(daemon.depth("rp.out.dlq"), 0);
}

#[test]
fn the_password_never_appears() {
    let redis = RedisServer::start_with_password(Some("hunter2"))
        .unwrap_or_else(|e| panic!("starting redis-server: {e:#}"));
    let port = redis.port();
    drop(redis); // down: every contact fails
    let url = format!("redis://:hunter2@127.0.0.1:{port}/0");
    let dir = tempfile::tempdir().expect("dir");
    let file = upper_pipeline(dir.path(), &url, "");
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("the outage is shown", LONG, |d| {
        d.get("/health/ready")["status"] == "degraded"
    });
    let ready = daemon.get("/health/ready").to_string();
    let status = daemon.get("/v1/status").to_string();
    let log = daemon.log();
    for (what, text) in [("ready", &ready), ("status", &status), ("log", &log)] {
        assert!(
            !text.contains("hunter2"),
            "{what} shows the password: {text}"
        );
    }
    // Readiness says which server is down, with the password as `***`;
    // so does the log.
    assert!(ready.contains("redis://:***@127.0.0.1"), "{ready}");
    assert!(log.contains("redis://:***@127.0.0.1"), "{log}");
    // Status names the sink's target the same way.
    assert!(status.contains("redis://:***@127.0.0.1"), "{status}");
}

#[test]
fn a_wrong_password_is_an_outage_without_the_password() {
    let redis = RedisServer::start_with_password(Some("right-one"))
        .unwrap_or_else(|e| panic!("starting redis-server: {e:#}"));
    let url = format!("redis://:hunter2@127.0.0.1:{}/0", redis.port());
    let dir = tempfile::tempdir().expect("dir");
    let file = upper_pipeline(dir.path(), &url, "");
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("the outage is shown", LONG, |d| {
        let ready = d.get("/health/ready").to_string();
        ready.contains("edge/src")
    });
    let ready = daemon.get("/health/ready").to_string();
    assert!(!ready.contains("hunter2"), "{ready}");
    assert!(ready.contains("***"), "{ready}");
    assert!(!daemon.log().contains("hunter2"), "{}", daemon.log());
}

fn two_daemons_share_one_group(backend: &Backend) {
    let redis = server();
    let mut conn = client(&redis.url());
    let n = 4_000;
    let dir = tempfile::tempdir().expect("dir");
    let file = upper_pipeline(dir.path(), &redis.url(), "");
    let a = Daemon::start_on(backend, &[&file], &dir.path().join("a"));
    let b = Daemon::start_on(backend, &[&file], &dir.path().join("b"));
    // Both are waiting on the group before the first entry: neither can
    // have read everything before the other started.
    produce(&mut conn, "in", 0, n);
    wait_for_len(&a, &mut conn, "out", n);
    wait_no_pending(&b, &mut conn, "in", "g");
    std::thread::sleep(Duration::from_secs(1));
    assert_exactly_once(&mut conn, "out", n);
    // Both were consumers of the group, both read entries, and together
    // they read each entry once (an entry read twice would also be
    // published twice into `in`, under the same id: counted here).
    let consumers: Vec<Value> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg("in")
        .arg("g")
        .query(&mut conn)
        .expect("XINFO CONSUMERS");
    assert_eq!(consumers.len(), 2, "{consumers:?}");
    let read = |d: &Daemon| d.metric_sum("sluice_source_messages_total") as usize;
    let (ra, rb) = (read(&a), read(&b));
    assert!(
        ra > 0 && rb > 0,
        "one daemon did all the reading: {ra} + {rb}"
    );
    assert_eq!(ra + rb, n, "entries read more than once: {ra} + {rb}");
    // And the stage between them: each daemon counts its own handler
    // calls, and together they called the handler once per message. The
    // outputs cannot show this: a second call's output has the first's id,
    // which the broker's duplicate window (or the sink's) drops. Nothing
    // here is redelivered (no kill, every call far inside its lease), so
    // no extra call is allowed.
    // (The sink's writes are timed in the same histogram, hence the
    // stage's own series.)
    let calls = |d: &Daemon| -> usize {
        d.metrics_text()
            .lines()
            .filter(|l| {
                l.starts_with("sluice_handler_duration_seconds_count{")
                    && l.contains("stage=\"upper\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as usize
    };
    let (ca, cb) = (calls(&a), calls(&b));
    assert!(
        ca > 0 && cb > 0,
        "one daemon's stage did all the work: {ca} + {cb} handler calls"
    );
    assert_eq!(
        ca + cb,
        n,
        "the stage's handler calls across both daemons: {ca} + {cb}, for {n} messages"
    );
}

#[test]
fn several_daemons_on_nats_are_competing_consumers() {
    two_daemons_share_one_group(&Backend::nats());
}

/// A source's `delay_from` end to end: entries whose `run-at` field (unix
/// milliseconds) lies ahead reach the sink no earlier than that, once
/// each; entries without it go at once, ahead of them.
#[test]
fn a_sources_delay_from_holds_each_entry_until_its_time() {
    let redis = server();
    let mut conn = client(&redis.url());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    // Far enough ahead that a slow daemon start still sees them not due.
    let due: Vec<u64> = (0..5).map(|i| now + 10_000 + i * 300).collect();
    for (i, at) in due.iter().enumerate() {
        let _: String = conn
            .xadd(
                "in",
                "*",
                &[
                    ("payload", format!("due-{at}")),
                    ("run-at", at.to_string()),
                    ("n", format!("d{i}")),
                ],
            )
            .expect("XADD");
    }
    for i in 0..5 {
        let _: String = conn
            .xadd(
                "in",
                "*",
                &[("payload", format!("now-{i}")), ("n", format!("n{i}"))],
            )
            .expect("XADD");
    }
    let dir = tempfile::tempdir().expect("dir");
    let file = write_pipeline(
        dir.path(),
        "later",
        &format!(
            r#"
name: later
topics: [jobs]
sources:
  - name: src
    to: jobs
    delay_from: {{header: run-at, as: unix_millis}}
    redis: {{url: "{url}", stream: in, group: g, start: oldest}}
sinks:
  - name: out
    subscribe: jobs
    redis: {{url: "{url}", stream: out}}
"#,
            url = redis.url()
        ),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    wait_for_len(&daemon, &mut conn, "out", 10);
    let out = entries_with_ids(&mut conn, "out");
    let took = |id: &str| -> u64 {
        id.split('-')
            .next()
            .and_then(|ms| ms.parse().ok())
            .expect("a stream id")
    };
    let payloads: Vec<&str> = out.iter().map(|(_, f)| f["payload"].as_str()).collect();
    assert_eq!(
        counts(payloads.iter().copied()).values().max(),
        Some(&1),
        "each entry once: {payloads:?}"
    );
    let first_delayed = out
        .iter()
        .filter(|(_, f)| f["payload"].starts_with("due-"))
        .map(|(id, _)| took(id))
        .min()
        .expect("the delayed entries");
    for (id, fields) in &out {
        let payload = &fields["payload"];
        if let Some(at) = payload.strip_prefix("due-") {
            let at: u64 = at.parse().expect("due time");
            assert!(
                took(id) >= at,
                "{payload} reached the sink {} ms early",
                at - took(id)
            );
        } else {
            assert!(
                took(id) < first_delayed,
                "{payload} waited behind the delayed entries"
            );
        }
    }
    assert_eq!(out.len(), 10, "{payloads:?}");
}
