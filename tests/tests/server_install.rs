//! What a server install relies on, against the real `sluice run`:
//!
//! - systemd's notify protocol, through the test's own `NOTIFY_SOCKET`
//!   (systemd is not PID 1 here): `READY=1` once the daemon answers,
//!   watchdog pings at the interval asked for (at least one per
//!   `WATCHDOG_USEC`), `RELOADING=1` then `READY=1` on a reload,
//!   `STOPPING=1` on SIGTERM;
//! - the daemon runs with transparent huge pages off (`THP_enabled: 0`,
//!   BENCHMARKS.md "The soak's RSS"), unless the operator's
//!   `MIMALLOC_ALLOW_THP` leaves them to mimalloc;
//! - every metric `deploy/grafana/sluice.json` and
//!   `deploy/prometheus/alerts.yaml` query is one the daemon exports, with
//!   the labels they select on.
//!
//! `cargo xtask test` checks the rest of `deploy/` with outside tools
//! (promtool, systemd-analyze): `xtask/src/deploy.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_harness::skip::{KernelFeature, Reason};
use sluice_tests::{Daemon, Msg};

/// A generous bound for what takes milliseconds: a 2-core machine running
/// other tests beside this one.
const LONG: Duration = Duration::from_secs(60);

/// `in` -> uppercase -> `out`; its poison (not UTF-8) goes to the DLQ.
fn pipeline() -> String {
    format!(
        "name: ops\n\
         topics: [in, out]\n\
         stages:\n\
         \x20 - name: shout\n\
         \x20   subscribe: in\n\
         \x20   plugin: {}\n\
         \x20   publish: [out]\n\
         \x20   retry: {{max_attempts: 1}}\n",
        sluice_tests::plugin("uppercase")
    )
}

/// The datagrams sent to `socket` until `until` holds for one of them, or
/// `LONG` passes; each datagram is one notification (lines `KEY=VALUE`).
fn receive_until(socket: &UnixDatagram, mut until: impl FnMut(&str) -> bool) -> Vec<String> {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    while started.elapsed() < LONG {
        match socket.recv(&mut buf) {
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                let done = until(&text);
                got.push(text);
                if done {
                    return got;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("recv on the notify socket: {e}"),
        }
    }
    panic!("no matching notification within {LONG:?}; got {got:?}")
}

/// A notify socket of the test's own, as systemd would give a service
/// (`NOTIFY_SOCKET`): its directory (kept while the test runs), its path,
/// and the socket, reading with a short timeout.
fn notify_socket() -> (tempfile::TempDir, std::path::PathBuf, UnixDatagram) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    (dir, path, socket)
}

/// The `WATCHDOG_USEC` the notify test asks for: 200 ms, so pings every
/// 100 ms.
const WATCHDOG_USEC: u64 = 200_000;

#[test]
fn the_daemon_speaks_systemds_notify_protocol() {
    let (_dir, socket_path, socket) = notify_socket();
    let mut daemon = Daemon::with_yaml(&pipeline())
        .envs([
            ("NOTIFY_SOCKET", socket_path.to_str().expect("utf-8 path")),
            ("WATCHDOG_USEC", &WATCHDOG_USEC.to_string()),
        ])
        .start();

    let ready = receive_until(&socket, |n| n.lines().any(|l| l == "READY=1"));
    let ready = ready.last().expect("a notification");
    let status = ready
        .lines()
        .find_map(|l| l.strip_prefix("STATUS="))
        .unwrap_or_else(|| panic!("READY=1 comes with a STATUS= line: {ready:?}"));
    assert!(
        status.contains("ops (1 stage)") && status.contains(daemon.admin_url()),
        "the status names the pipelines and the admin address: {status:?}"
    );
    // Ready means the admin API answers and the stages run.
    assert_eq!(daemon.readiness().0, "ready");

    // The watchdog: pings at half the interval, 40 in a window of 20
    // intervals. systemd kills a service that misses one whole interval,
    // so fewer than 20 (one per interval) is a watchdog that fails its
    // purpose; the slack to 40 is for a loaded machine, and nothing bounds
    // the pings from above.
    let window = Duration::from_micros(WATCHDOG_USEC * 20);
    let first = receive_until(&socket, |n| n.lines().any(|l| l == "WATCHDOG=1"));
    let started = Instant::now();
    let mut pings = 1;
    receive_until(&socket, |n| {
        pings += usize::from(n.lines().any(|l| l == "WATCHDOG=1"));
        started.elapsed() >= window
    });
    assert!(
        pings >= 20,
        "{pings} watchdog pings in {window:?} with WATCHDOG_USEC={WATCHDOG_USEC}: \
         at least one per interval is needed, two are sent (after {first:?})"
    );

    // A reload: RELOADING=1 (with MONOTONIC_USEC, as Type=notify-reload
    // units need), then READY=1 again with a status.
    let reloaded = reqwest::blocking::Client::new()
        .post(daemon.url("/v1/reload"))
        .json(&serde_json::json!({}))
        .timeout(LONG)
        .send()
        .expect("POST /v1/reload");
    assert!(
        reloaded.status().is_success(),
        "reload: {}",
        reloaded.text().unwrap_or_default()
    );
    let reload = receive_until(&socket, |n| n.lines().any(|l| l == "READY=1"));
    let reloading = reload
        .iter()
        .position(|n| n.lines().any(|l| l == "RELOADING=1"))
        .unwrap_or_else(|| panic!("no RELOADING=1 before the READY=1 of a reload: {reload:?}"));
    let monotonic: u64 = reload[reloading]
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|us| us.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "RELOADING=1 comes with MONOTONIC_USEC: {:?}",
                reload[reloading]
            )
        });
    assert!(monotonic > 0, "{:?}", reload[reloading]);
    assert!(
        reload
            .last()
            .is_some_and(|n| n.lines().any(|l| l.starts_with("STATUS="))),
        "the READY=1 after a reload comes with a status: {reload:?}"
    );

    daemon.term();
    let stopping = receive_until(&socket, |n| n.lines().any(|l| l == "STOPPING=1"));
    assert!(
        !stopping.iter().any(|n| n.contains("READY=1")),
        "no second READY=1: {stopping:?}"
    );
    assert!(daemon.wait().success(), "{}", daemon.log());
}

#[test]
fn a_watchdog_meant_for_another_process_is_left_alone() {
    let (_dir, socket_path, socket) = notify_socket();
    // WATCHDOG_PID names another process (a wrapper's, say): the pings are
    // not this daemon's to send (sd_watchdog_enabled(3)).
    let mut daemon = Daemon::with_yaml(&pipeline())
        .envs([
            ("NOTIFY_SOCKET", socket_path.to_str().expect("utf-8 path")),
            ("WATCHDOG_USEC", "100000"),
            ("WATCHDOG_PID", "1"),
        ])
        .start();
    receive_until(&socket, |n| n.lines().any(|l| l == "READY=1"));
    daemon.term();
    let rest = receive_until(&socket, |n| n.lines().any(|l| l == "STOPPING=1"));
    assert!(
        !rest.iter().any(|n| n.contains("WATCHDOG=1")),
        "pings for another process's watchdog: {rest:?}"
    );
    assert!(daemon.wait().success(), "{}", daemon.log());
}

/// `THP_enabled` of `/proc/PID/status`: `Some(false)` once the process
/// turned huge pages off; `None` when the kernel does not say (before 5.0).
fn thp_enabled(pid: u32) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .map(|v| v.trim() != "0")
}

#[test]
fn the_daemon_keeps_its_heap_out_of_huge_pages_unless_told_otherwise() {
    let daemon = Daemon::with_yaml(&pipeline()).start();
    let Some(enabled) = thp_enabled(daemon.pid().expect("running")) else {
        sluice_harness::skip::skip(
            "the_daemon_keeps_its_heap_out_of_huge_pages_unless_told_otherwise",
            Reason::KernelFeature(KernelFeature::ThpStatusLine),
            "this kernel's /proc/PID/status has no THP_enabled line",
        );
        return;
    };
    assert!(
        !enabled,
        "the daemon runs with transparent huge pages on; its RSS grows in steps (BENCHMARKS.md)"
    );
    drop(daemon);

    let daemon = Daemon::with_yaml(&pipeline())
        .envs([("MIMALLOC_ALLOW_THP", "1")])
        .start();
    assert_eq!(
        thp_enabled(daemon.pid().expect("running")),
        Some(true),
        "MIMALLOC_ALLOW_THP leaves huge pages to mimalloc"
    );
}

/// The families `/metrics` declares (`# TYPE NAME KIND`), with the sample
/// names each one writes: a histogram's `_bucket`, `_sum` and `_count`.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        names.insert(name.to_owned());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// The label names each sample name carries in `/metrics`, over all its
/// samples.
fn exported_labels(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, rest)) = line.split_once('{') else {
            continue;
        };
        let set = labels.entry(name.to_owned()).or_default();
        let body = rest.split('}').next().unwrap_or_default();
        for pair in body.split(',') {
            if let Some((key, _)) = pair.split_once('=') {
                set.insert(key.trim().to_owned());
            }
        }
    }
    labels
}

/// Every Sluice or process metric a PromQL expression names, with the
/// labels its selector (`name{label=...}`) matches on.
fn queried_metrics(expr: &str) -> Vec<(String, BTreeSet<String>)> {
    let bytes = expr.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts_name = (expr[i..].starts_with("sluice_") || expr[i..].starts_with("process_"))
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
        if !starts_name {
            i += 1;
            continue;
        }
        let end = expr[i..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(expr.len(), |n| i + n);
        let name = expr[i..end].to_owned();
        let mut labels = BTreeSet::new();
        if expr[end..].starts_with('{')
            && let Some(close) = expr[end..].find('}')
        {
            for matcher in expr[end + 1..end + close].split(',') {
                let key: String = matcher
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !key.is_empty() {
                    labels.insert(key);
                }
            }
        }
        found.push((name, labels));
        i = end;
    }
    found
}

/// Every `expr` in the dashboard (its panels' targets and its variables'
/// queries).
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dashboard];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v) {
                        ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                        _ => stack.push(v),
                    }
                }
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    out
}

/// Every `expr` of the alerting rules.
fn alert_queries(rules: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(rules).expect("read alerts.yaml");
    let doc: Value = serde_saphyr::from_str(&text).expect("alerts.yaml is YAML");
    doc["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").clone())
        .map(|r| r["expr"].as_str().expect("expr").to_owned())
        .collect()
}

#[test]
fn the_dashboard_and_the_alerts_query_metrics_the_daemon_exports() {
    // A source and a sink too (Redis, on a server of the test's own), so
    // the connector families have samples and their labels are checked.
    let redis = match sluice_harness::redis::RedisServer::start() {
        Ok(redis) => redis,
        Err(err) => panic!("cannot start redis-server (cargo xtask setup installs it): {err}"),
    };
    let yaml = format!(
        "{}sources:\n\
         \x20 - name: orders\n\
         \x20   to: in\n\
         \x20   redis: {{url: '{url}', stream: orders, group: sluice, start: oldest}}\n\
         sinks:\n\
         \x20 - name: done\n\
         \x20   subscribe: out\n\
         \x20   redis: {{url: '{url}', stream: done}}\n",
        pipeline(),
        url = redis.url()
    );
    let daemon = Daemon::with_yaml(&yaml).start();
    // Samples for the per-stage families: handled, failed into the DLQ;
    // one through the source.
    daemon.publish("in", &[Msg::new("a", "hello"), Msg::new("b", "sluice")]);
    daemon.publish_bytes("in", "poison", &[0xff, 0xfe]);
    let redis_cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &redis.port().to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    redis_cli(&["XADD", "orders", "*", "payload", "from redis"]);
    daemon.wait_until("three outputs, one dead letter, a source read", LONG, |d| {
        redis_cli(&["XLEN", "done"]) == "3"
            && d.read_all("ops.shout.dlq").len() == 1
            && d.metric_sum("sluice_source_messages_total") == 1.0
            && d.metrics_text().contains("sluice_source_lag{")
    });
    let text = daemon.metrics_text();
    let names = exported_names(&text);
    let labels = exported_labels(&text);

    let deploy = sluice_harness::repo_root().join("deploy");
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy.join("grafana/sluice.json")).expect("read the dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut queries: Vec<(String, String)> = dashboard_queries(&dashboard)
        .into_iter()
        .map(|q| ("deploy/grafana/sluice.json".to_owned(), q))
        .collect();
    let dashboard_count = queries.len();
    queries.extend(
        alert_queries(&deploy.join("prometheus/alerts.yaml"))
            .into_iter()
            .map(|q| ("deploy/prometheus/alerts.yaml".to_owned(), q)),
    );
    assert!(
        dashboard_count >= 15 && queries.len() > dashboard_count + 5,
        "found {dashboard_count} dashboard and {} alert queries",
        queries.len() - dashboard_count
    );

    let mut problems = Vec::new();
    let mut checked = BTreeSet::new();
    for (file, query) in &queries {
        for (metric, selected) in queried_metrics(query) {
            checked.insert(metric.clone());
            if !names.contains(&metric) {
                problems.push(format!("{file}: `{metric}` is not in /metrics ({query})"));
                continue;
            }
            // Labels are checked where the daemon wrote samples; a family
            // with none (no connector here) is checked by name only.
            if let Some(have) = labels.get(&metric) {
                for label in selected.difference(have) {
                    problems.push(format!(
                        "{file}: `{metric}` has no label `{label}` ({query}); it has {have:?}"
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{}\n\n/metrics:\n{text}",
        problems.join("\n")
    );
    // The families the operator most needs are on the dashboard.
    for needed in [
        "sluice_messages_processed_total",
        "sluice_queue_depth",
        "sluice_dlq_depth",
        "sluice_oldest_message_age_seconds",
        "sluice_connector_up",
        "sluice_handler_duration_seconds_bucket",
    ] {
        assert!(checked.contains(needed), "nothing queries {needed}");
    }
}

#[test]
fn the_metric_name_scanner_reads_selectors() {
    let found = queried_metrics(
        r#"sum by (le) (rate(sluice_handler_duration_seconds_bucket{pipeline=~"$p", stage!="x"}[5m])) / process_open_fds"#,
    );
    assert_eq!(
        found,
        vec![
            (
                "sluice_handler_duration_seconds_bucket".to_owned(),
                BTreeSet::from(["pipeline".to_owned(), "stage".to_owned()])
            ),
            ("process_open_fds".to_owned(), BTreeSet::new()),
        ]
    );
    assert!(queried_metrics("up{job=\"x\"} == 0").is_empty());
}
