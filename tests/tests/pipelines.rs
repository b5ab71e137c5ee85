//! Pipelines end to end, on both brokers: the real `sluice run` binary,
//! real plugins, driven over the admin API, with kill -9 and SIGTERM. Every
//! check is set-based, by message id.
//!
//! Each test body takes a [`Backend`] and runs twice, as `embedded::<name>`
//! (the daemon's own broker in its data directory) and `nats::<name>` (a
//! fresh nats-server of the test's own, `--broker nats://...`), through the
//! [`on_both_brokers!`] list at the end: the same assertions, so a
//! behaviour that differs between the brokers fails one of the two. Where a
//! test kills the daemon, on NATS the nats-server keeps running.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use sluice::engine::emit_id;
use sluice_tests::{Backend, Daemon, Msg, counts, header, on_both_brokers, plugin, write_pipeline};

const LONG: Duration = Duration::from_secs(180);

fn payloads(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m["payload"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn orders_10k_every_input_is_routed_or_dead_lettered_exactly_once(backend: &Backend) {
    sluice_harness::plugin("router");
    sluice_harness::plugin("uppercase");
    let data = tempfile::tempdir().expect("data dir");
    let orders = sluice_harness::repo_root().join("pipelines/orders.yaml");
    let daemon = Daemon::start_on(backend, &[&orders], data.path());

    let regions = ["eu", "us", "eu", "us", "eu", "us", "eu", "us", "eu", "mars"];
    let n = 10_000;
    let messages: Vec<Msg> = (0..n)
        .map(|i| {
            let region = regions[i % regions.len()];
            // Every 97th message is not JSON: rejected by the router.
            let payload = match i % 97 {
                0 => format!("not json {i}"),
                _ => json!({"region": region, "n": i}).to_string(),
            };
            Msg::new(format!("o{i}"), payload).key(format!("customer-{}", i % 50))
        })
        .collect();
    daemon.publish("orders", &messages);

    // The oracle: where each input must end up, by id.
    let mut expect_eu = BTreeSet::new();
    let mut expect_us = BTreeSet::new();
    let mut expect_dlq = BTreeSet::new();
    for (i, m) in messages.iter().enumerate() {
        let routed = emit_id("orders", "route", &m.id, 0);
        match (i % 97, regions[i % regions.len()]) {
            (0, _) | (_, "mars") => expect_dlq.insert(m.id.clone()),
            (_, "eu") => expect_eu.insert(emit_id("orders", "eu", &routed, 0)),
            _ => expect_us.insert(emit_id("orders", "us", &routed, 0)),
        };
    }
    let total = expect_eu.len() + expect_us.len() + expect_dlq.len();
    assert_eq!(total, n);
    daemon.wait_until("all 10k settled", LONG, |d| {
        d.depth("orders.eu.done") + d.depth("orders.us.done") + d.depth("orders.dlq") >= total
    });
    std::thread::sleep(Duration::from_millis(500));

    let check = |topic: &str, expected: &BTreeSet<String>| {
        let got = daemon.read_all(topic);
        let ids = counts(got.iter().map(|m| m["id"].as_str().unwrap_or_default()));
        let dupes: Vec<_> = ids.iter().filter(|(_, c)| **c > 1).collect();
        assert!(dupes.is_empty(), "{topic}: duplicates {dupes:?}");
        let got: BTreeSet<String> = ids.keys().map(|s| (*s).to_owned()).collect();
        assert_eq!(
            got.len(),
            expected.len(),
            "{topic}: {} missing, {} unexpected",
            expected.difference(&got).count(),
            got.difference(expected).count()
        );
        assert_eq!(&got, expected, "{topic}");
    };
    check("orders.eu.done", &expect_eu);
    check("orders.us.done", &expect_us);
    check("orders.dlq", &expect_dlq);

    // Outputs are upper-cased; DLQ entries keep the original payload and
    // say why, with provenance.
    let eu = daemon.read_all("orders.eu.done");
    assert!(
        payloads(&eu)
            .iter()
            .all(|p| p.contains("\"REGION\":\"EU\""))
    );
    for entry in daemon.read_all("orders.dlq") {
        // Not JSON: the router rejects it. Region `mars`: the router picks
        // topic `mars`, which the stage does not declare.
        let kind = match entry["payload"].as_str() {
            Some(p) if p.starts_with("not json") => "rejected",
            _ => "undeclared-topic",
        };
        assert_eq!(header(&entry, "sluice-dlq-kind"), Some(kind), "{entry}");
        assert_eq!(header(&entry, "sluice-dlq-attempts"), Some("1"), "{entry}");
        assert_eq!(header(&entry, "sluice-dlq-stage"), Some("route"));
        assert_eq!(header(&entry, "sluice-dlq-source-topic"), Some("orders"));
        assert!(
            entry["key"]
                .as_str()
                .is_some_and(|k| k.starts_with("customer-"))
        );
    }
}

fn fan_out_gives_every_subscriber_every_message(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: fan
topics: [in, out.a, out.b]
stages:
  - name: a
    subscribe: in
    plugin: {stamp}
    publish: [out.a]
  - name: b
    subscribe: in
    plugin: {stamp}
    publish: [out.b]
    config: {{sleep_ms: 2}}
"#,
        stamp = plugin("stamp")
    );
    let file = write_pipeline(dir.path(), "fan", &yaml);
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    let messages: Vec<Msg> = (0..500).map(|i| Msg::new(format!("f{i}"), "x")).collect();
    daemon.publish("in", &messages);
    daemon.wait_until("both branches", LONG, |d| {
        d.read_all("out.a").len() == 500 && d.read_all("out.b").len() == 500
    });
    for topic in ["out.a", "out.b"] {
        let got = daemon.read_all(topic);
        let inputs: BTreeSet<&str> = got.iter().filter_map(|m| header(m, "x-input-id")).collect();
        assert_eq!(inputs.len(), 500, "{topic}");
    }
}

fn poison_pipeline(dir: &std::path::Path, mode: &str) -> std::path::PathBuf {
    let yaml = format!(
        r#"
name: poison
topics: [in, out]
stages:
  - name: work
    subscribe: in
    plugin: {fail}
    publish: [out]
    concurrency: 4
    config: {{fraction: 0.01, mode: {mode}}}
    retry:
      max_attempts: 3
      backoff: {{initial: 10ms, max: 50ms, jitter: 0.5}}
"#,
        fail = plugin("fail")
    );
    write_pipeline(dir, &format!("poison-{mode}"), &yaml)
}

fn poison_run(backend: &Backend, mode: &str, attempts: &str, kind: &str) {
    let dir = tempfile::tempdir().expect("dir");
    let file = poison_pipeline(dir.path(), mode);
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    let n = 3000;
    let messages: Vec<Msg> = (0..n).map(|i| Msg::new(format!("p{i}"), "x")).collect();
    daemon.publish("in", &messages);
    daemon.wait_until("all settled", LONG, |d| {
        d.depth("out") + d.depth("poison.work.dlq") >= n
    });
    std::thread::sleep(Duration::from_millis(300));
    let out = daemon.read_all("out");
    let dlq = daemon.read_all("poison.work.dlq");
    assert_eq!(out.len() + dlq.len(), n, "nothing lost, nothing doubled");
    // About 1% is poison (the plugin picks by a hash of the id).
    assert!(
        (10..=60).contains(&dlq.len()),
        "{} dead-lettered",
        dlq.len()
    );
    let out_ids: BTreeSet<&str> = out.iter().filter_map(|m| m["id"].as_str()).collect();
    for entry in &dlq {
        assert_eq!(
            header(entry, "sluice-dlq-attempts"),
            Some(attempts),
            "{entry}"
        );
        assert_eq!(header(entry, "sluice-dlq-kind"), Some(kind), "{entry}");
        assert_eq!(header(entry, "sluice-dlq-pipeline"), Some("poison"));
        assert_eq!(header(entry, "sluice-dlq-source-topic"), Some("in"));
        assert!(header(entry, "sluice-dlq-source-seq").is_some());
        let first: u64 = header(entry, "sluice-dlq-first-failure")
            .and_then(|v| v.parse().ok())
            .expect("first");
        let last: u64 = header(entry, "sluice-dlq-last-failure")
            .and_then(|v| v.parse().ok())
            .expect("last");
        assert!(first <= last);
        let original = header(entry, "sluice-dlq-original-id").expect("original id");
        let output_id = emit_id("poison", "work", original, 0);
        assert!(
            !out_ids.contains(output_id.as_str()),
            "{original} both output and DLQ"
        );
    }
}

fn poison_retries_land_in_the_dlq_after_exactly_max_attempts(backend: &Backend) {
    poison_run(backend, "retry", "3", "retry");
}

fn poison_rejects_land_in_the_dlq_at_once(backend: &Backend) {
    poison_run(backend, "reject", "1", "rejected");
}

fn stamp_pipeline(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let yaml = format!(
        r#"
name: crashy
topics: [in, out]
shutdown_timeout: 5s
stages:
  - name: work
    subscribe: in
    plugin: {stamp}
    publish: [out]
{extra}
"#,
        stamp = plugin("stamp")
    );
    write_pipeline(dir, "crashy", &yaml)
}

/// Asserts `out` holds exactly one output per input `c0..c{n}`.
fn assert_exactly_once(out: &[Value], prefix: &str, n: usize) {
    let by_input = counts(out.iter().filter_map(|m| header(m, "x-input-id")));
    let dupes: Vec<_> = by_input.iter().filter(|(_, c)| **c > 1).collect();
    assert!(dupes.is_empty(), "duplicate outputs: {dupes:?}");
    let ids = counts(out.iter().filter_map(|m| m["id"].as_str()));
    assert!(ids.values().all(|c| *c == 1), "duplicate output ids");
    let missing: Vec<String> = (0..n)
        .map(|i| format!("{prefix}{i}"))
        .filter(|id| !by_input.contains_key(id.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    assert_eq!(out.len(), n);
}

fn kill_9_five_times_loses_nothing_and_duplicates_nothing(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = stamp_pipeline(
        dir.path(),
        "    concurrency: 4\n    config: {sleep_ms: 1}\n",
    );
    let data = dir.path().join("data");
    let mut daemon = Daemon::start_on(backend, &[&file], &data);
    let n = 20_000;
    let messages: Vec<Msg> = (0..n)
        .map(|i| Msg::new(format!("c{i}"), format!("m{i}")))
        .collect();
    // Paused while the inputs go in, so a slow publish on a loaded machine
    // cannot let the stage finish before the first kill.
    daemon.post("/v1/stages/crashy/work/pause", json!({}));
    daemon.publish("in", &messages);
    daemon.post("/v1/stages/crashy/work/resume", json!({}));
    let mut seen_at_kill = Vec::new();
    for round in 0..5u64 {
        // Let it work a while, at a different point each round.
        std::thread::sleep(Duration::from_millis(
            300 + fastrand::u64(0..700) + round * 50,
        ));
        seen_at_kill.push(daemon.depth("out"));
        daemon.kill9();
        daemon.restart();
    }
    daemon.wait_until("all 20k outputs", LONG, |d| d.depth("out") >= n);
    std::thread::sleep(Duration::from_millis(500));
    let out = daemon.read_all("out");
    assert_exactly_once(&out, "c", n);
    let reinvoked = out
        .iter()
        .filter(|m| header(m, "x-attempt").is_some_and(|a| a != "1"))
        .count();
    eprintln!(
        "outputs seen at each kill: {seen_at_kill:?}; outputs from a redelivery: {reinvoked}"
    );
    assert!(
        seen_at_kill.iter().any(|s| *s > 0 && *s < n),
        "the kills should land mid-run: {seen_at_kill:?}"
    );
}

/// How late a delayed message may start: generous, for a slow shared
/// machine, yet a message minutes late fails.
const DELAY_SLACK: Duration = Duration::from_secs(30);

/// The stage's default `ack_wait`: how long a redelivery after a kill may
/// wait for the crashed delivery's lease on NATS.
const ACK_WAIT_MS: u64 = 30_000;

/// Issue 26's first must-show: 10,000 messages each delayed 1-60 s, the
/// daemon killed with kill -9 twice meanwhile. Every message is handled
/// exactly once, none before its time, and none more than [`DELAY_SLACK`]
/// after it (a message due while the daemon was down counts from the
/// restart; one handled again after a kill also waits out the lease).
/// The spread of lateness is printed, for BENCHMARKS.md.
fn delays_survive_two_kill_9s_each_once_and_never_early(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = stamp_pipeline(dir.path(), "    concurrency: 8\n");
    let data = dir.path().join("data");
    let mut daemon = Daemon::start_on(backend, &[&file], &data);
    let n = 10_000;
    let start = sluice::broker::now_millis();
    let due: Vec<u64> = (0..n)
        .map(|_| start + 1_000 + fastrand::u64(0..59_000))
        .collect();
    let messages: Vec<Msg> = (0..n)
        .map(|i| Msg::new(format!("d{i}"), format!("m{i}")).deliver_at(due[i]))
        .collect();
    daemon.publish("in", &messages);
    let mut down = Vec::new();
    for at in [15_000, 35_000] {
        let wait = (start + at).saturating_sub(sluice::broker::now_millis());
        std::thread::sleep(Duration::from_millis(wait));
        let killed = sluice::broker::now_millis();
        daemon.kill9();
        std::thread::sleep(Duration::from_secs(2));
        daemon.restart();
        down.push((killed, sluice::broker::now_millis()));
    }
    daemon.wait_until("all 10k delayed outputs", LONG, |d| d.depth("out") >= n);
    std::thread::sleep(Duration::from_millis(500));
    let out = daemon.read_all("out");
    assert_exactly_once(&out, "d", n);
    let mut early = Vec::new();
    let mut late = Vec::new();
    let mut lag_ms = Vec::new();
    let mut again = 0;
    for m in &out {
        let input: usize = header(m, "x-input-id")
            .and_then(|id| id.strip_prefix('d'))
            .and_then(|i| i.parse().ok())
            .expect("x-input-id");
        let started_ms = header(m, "x-start-us")
            .and_then(|us| us.parse::<u64>().ok())
            .expect("x-start-us")
            / 1000;
        let due_ms = due[input];
        if started_ms < due_ms {
            early.push((input, due_ms - started_ms));
        }
        // The bound counts from the later of its due time and the end of
        // the last restart before it started: a message due while the
        // daemon was down, or in flight at a kill, could not go sooner.
        // A redelivery after a kill also waits for the crashed delivery's
        // lease (on NATS, the stage's 30 s ack_wait).
        let restarted = down
            .iter()
            .map(|(_, to)| *to)
            .filter(|to| *to <= started_ms)
            .max()
            .unwrap_or(0);
        let redelivered = header(m, "x-attempt").is_some_and(|a| a != "1");
        let bound = due_ms.max(restarted)
            + DELAY_SLACK.as_millis() as u64
            + if redelivered { ACK_WAIT_MS } else { 0 };
        if started_ms > bound {
            late.push((input, started_ms - due_ms));
        }
        // Due while the daemon was down (or restarting): late by design.
        // Handled again after a kill (attempt 2 on): its first delivery's
        // time is not in the output, only the redelivery's, which waited
        // for the crash (on NATS, for the lease to expire).
        if redelivered {
            again += 1;
        } else if !down
            .iter()
            .any(|(from, to)| (*from..=*to + 1_000).contains(&due_ms))
        {
            lag_ms.push(started_ms.saturating_sub(due_ms));
        }
    }
    assert!(
        early.is_empty(),
        "{} handled early, e.g. {:?}",
        early.len(),
        &early[..early.len().min(5)]
    );
    assert!(
        late.is_empty(),
        "{} handled more than {DELAY_SLACK:?} after their due time (or restart), e.g. (input, ms late) {:?}",
        late.len(),
        &late[..late.len().min(5)]
    );
    lag_ms.sort_unstable();
    let pct = |p: usize| lag_ms[(lag_ms.len() * p / 100).min(lag_ms.len() - 1)];
    let within = lag_ms.iter().filter(|l| **l <= 1_000).count();
    eprintln!(
        "delay lag on {}: {} first deliveries not due during a kill; p50 {} ms, p99 {} ms, max {} ms; {:.2} % within 1 s; {again} handled again after a kill",
        backend.name(),
        lag_ms.len(),
        pct(50),
        pct(99),
        lag_ms.last().copied().unwrap_or(0),
        100.0 * within as f64 / lag_ms.len().max(1) as f64
    );
}

/// A handler's emit with a delay (the SDK's `with_delay`, here the stamp
/// plugin's `delay_ms`) is held by the broker, counted as delayed on the
/// output topic meanwhile, and enters it no sooner than the delay after the
/// handler ended, without the delay header.
fn a_handler_emit_with_a_delay_waits_before_it_reaches_its_topic(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = stamp_pipeline(dir.path(), "    config: {delay_ms: 3000}\n");
    let data = dir.path().join("data");
    let daemon = Daemon::start_on(backend, &[&file], &data);
    let n = 5;
    let messages: Vec<Msg> = (0..n)
        .map(|i| Msg::new(format!("e{i}"), format!("m{i}")))
        .collect();
    daemon.publish("in", &messages);
    daemon.wait_until("the outputs delayed", LONG, |d| {
        d.get("/v1/topics/out")["delayed"].as_u64() == Some(n as u64)
    });
    assert_eq!(
        daemon.depth("out"),
        0,
        "nothing is in the topic before its time"
    );
    daemon.wait_until("the delayed outputs", LONG, |d| d.depth("out") >= n);
    for m in daemon.read_all("out") {
        let ended_ms = header(&m, "x-end-us")
            .and_then(|us| us.parse::<u64>().ok())
            .expect("x-end-us")
            / 1000;
        let entered = m["published_at"].as_u64().expect("published_at");
        assert!(
            entered >= ended_ms + 3_000,
            "entered {} ms after the handler ended: {m}",
            entered.saturating_sub(ended_ms)
        );
        assert!(header(&m, "sluice-delay").is_none(), "{m}");
    }
    assert_eq!(daemon.get("/v1/topics/out")["delayed"].as_u64(), Some(0));
}

fn sigterm_under_load_drains_in_time_and_redelivers_nothing_done(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = stamp_pipeline(
        dir.path(),
        "    concurrency: 2\n    config: {sleep_ms: 20}\n",
    );
    let data = dir.path().join("data");
    // Every handler call's start is logged with its message id, and the
    // log runs on across the restart: a message handled before the
    // shutdown and again after it shows up twice, even though its second
    // output (same id) would be dropped by the duplicate window.
    let mut daemon = Daemon::builder(&[&file], &data)
        .on(backend)
        .envs([("SLUICE_LOG", "warn,sluice=info,sluice::calls=debug")])
        .start();
    let n = 600;
    let messages: Vec<Msg> = (0..n).map(|i| Msg::new(format!("t{i}"), "x")).collect();
    daemon.publish("in", &messages);
    daemon.wait_until("some progress", LONG, |d| d.depth("out") >= 20);
    let (status, took) = daemon.sigterm();
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        daemon.log()
    );
    // shutdown_timeout is 5 s; each call takes 20 ms, so it drains well within.
    assert!(took < Duration::from_secs(5 + 3), "took {took:?}");
    let calls_before = handler_calls(&daemon.log());
    assert!(
        (20..n).contains(&calls_before.values().sum::<usize>()),
        "the shutdown should land mid-run: {} calls before it",
        calls_before.len()
    );
    daemon.restart();
    daemon.wait_until("all outputs", LONG, |d| d.depth("out") >= n);
    let out = daemon.read_all("out");
    assert_exactly_once(&out, "t", n);
    // No call was abandoned (20 ms calls, a 5 s deadline) and none failed,
    // so every message was handled exactly once across both runs: one
    // handled before the shutdown was not handed out again after it.
    let calls = handler_calls(&daemon.log());
    let twice: Vec<_> = calls.iter().filter(|(_, c)| **c != 1).collect();
    assert!(
        twice.is_empty(),
        "handled more than once: {twice:?}\nlog:\n{}",
        daemon.log()
    );
    assert_eq!(calls.len(), n, "every message handled");
}

/// Handler calls per message id, from the `sluice::calls=debug` lines
/// (`handler call starts id=...`).
fn handler_calls(log: &str) -> BTreeMap<String, usize> {
    let mut calls = BTreeMap::new();
    for line in log.lines().filter(|l| l.contains("handler call starts")) {
        let id = line
            .split_whitespace()
            .find_map(|word| word.strip_prefix("id="))
            .unwrap_or_else(|| panic!("no id in {line:?}"));
        *calls.entry(id.to_owned()).or_insert(0) += 1;
    }
    calls
}

fn a_handler_slower_than_ack_wait_is_not_redelivered(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = stamp_pipeline(
        dir.path(),
        "    concurrency: 3\n    ack_wait: 1s\n    timeout: 10s\n    config: {sleep_ms: 3000}\n",
    );
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    let messages: Vec<Msg> = (0..3).map(|i| Msg::new(format!("s{i}"), "x")).collect();
    daemon.publish("in", &messages);
    daemon.wait_until("3 outputs", LONG, |d| d.read_all("out").len() >= 3);
    // The quiet window is the check (a redelivery that does not happen
    // leaves no event to wait for): with ack_wait 1 s and 3 s calls, a
    // wrongful redelivery would start about 1 s into the first call and
    // publish its output about 3 s later, within these 4 s.
    std::thread::sleep(Duration::from_secs(4));
    let out = daemon.read_all("out");
    assert_eq!(out.len(), 3);
    assert!(
        out.iter().all(|m| header(m, "x-attempt") == Some("1")),
        "{out:?}"
    );
}

fn per_key_ordering_serialises_keys_and_parallelises_across_them(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = stamp_pipeline(
        dir.path(),
        "    concurrency: 4\n    ordering: {key: key}\n    retry: {max_attempts: 5}\n    config: {sleep_ms: 20, fail_until_attempt: 3, retry_after_ms: 1000}\n",
    );
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    let keys = ["k0", "k1", "k2", "k3"];
    let mut messages = Vec::new();
    for i in 0..10 {
        for key in keys {
            // k0's third message fails twice before it succeeds.
            let payload = if key == "k0" && i == 2 {
                format!("FAIL {key} {i}")
            } else {
                format!("{key} {i}")
            };
            messages.push(Msg::new(format!("{key}-{i}"), payload).key(key));
        }
    }
    daemon.publish("in", &messages);
    daemon.wait_until("40 outputs", LONG, |d| d.read_all("out").len() >= 40);
    let out = daemon.read_all("out");
    assert_eq!(out.len(), 40);
    let span = |m: &Value| -> (u64, u64) {
        let n = |h| header(m, h).and_then(|v| v.parse().ok()).expect("stamp");
        (n("x-start-us"), n("x-end-us"))
    };
    let mut per_key: BTreeMap<&str, Vec<(u64, u64, usize)>> = BTreeMap::new();
    for m in &out {
        let key = m["key"].as_str().expect("key");
        let input = header(m, "x-input-id").expect("input id");
        let index: usize = input
            .rsplit('-')
            .next()
            .and_then(|i| i.parse().ok())
            .expect("index");
        let (start, end) = span(m);
        per_key.entry(key).or_default().push((start, end, index));
    }
    for (key, spans) in &mut per_key {
        spans.sort();
        let order: Vec<usize> = spans.iter().map(|s| s.2).collect();
        assert_eq!(
            order,
            (0..10).collect::<Vec<_>>(),
            "{key} handled out of order"
        );
        for pair in spans.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "{key}: two messages ran at once");
        }
    }
    // Different keys overlapped in time.
    let firsts: Vec<(u64, u64)> = keys
        .iter()
        .map(|k| (per_key[k][0].0, per_key[k][0].1))
        .collect();
    let overlaps = firsts
        .iter()
        .enumerate()
        .any(|(i, a)| firsts.iter().skip(i + 1).any(|b| a.0 < b.1 && b.0 < a.1));
    let any_overlap = overlaps || {
        let all: Vec<(u64, u64, &str)> = per_key
            .iter()
            .flat_map(|(k, s)| s.iter().map(move |x| (x.0, x.1, *k)))
            .collect();
        all.iter()
            .any(|a| all.iter().any(|b| a.2 != b.2 && a.0 < b.1 && b.0 < a.1))
    };
    assert!(any_overlap, "different keys never ran in parallel");
    // The failing message held back only k0: every other key finished
    // before k0's failing message finally succeeded.
    let k0_fail_end = per_key["k0"][2].1;
    for key in ["k1", "k2", "k3"] {
        let last_end = per_key[key].last().expect("spans").1;
        assert!(
            last_end < k0_fail_end,
            "{key} was held back by k0's failure"
        );
    }
    let retried = out
        .iter()
        .find(|m| header(m, "x-input-id") == Some("k0-2"))
        .expect("k0-2");
    assert_eq!(header(retried, "x-attempt"), Some("3"));
}

fn redrive_once_is_enough_and_a_message_that_fails_again_returns_to_the_dlq(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let stamp = plugin("stamp");
    let yaml = format!(
        r#"
name: rd
topics: [in, out.a, out.b, out.c, out.b2]
stages:
  - name: b2
    subscribe: out.b
    plugin: {stamp}
    publish: [out.b2]
  - name: a
    subscribe: in
    plugin: {stamp}
    publish: [out.a]
  - name: b
    subscribe: in
    plugin: {stamp}
    publish: [out.b]
    config: {{fail_until_attempt: 100, heal_on_redrive: true}}
    retry: {{max_attempts: 2, backoff: {{initial: 10ms}}}}
  - name: c
    subscribe: in
    plugin: {stamp}
    publish: [out.c]
    config: {{fail_until_attempt: 100}}
    retry: {{max_attempts: 2, backoff: {{initial: 10ms}}}}
"#
    );
    let file = write_pipeline(dir.path(), "rd", &yaml);
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    let messages: Vec<Msg> = (0..10)
        .map(|i| {
            Msg::new(
                format!("r{i}"),
                if i % 3 == 0 {
                    format!("FAIL {i}")
                } else {
                    format!("ok {i}")
                },
            )
        })
        .collect();
    daemon.publish("in", &messages);
    let settled = |d: &Daemon| {
        d.read_all("out.a").len() == 10
            && d.read_all("out.b2").len() + d.read_all("rd.b.dlq").len() == 10
            && d.read_all("out.c").len() + d.read_all("rd.c.dlq").len() == 10
    };
    daemon.wait_until("first pass", LONG, settled);
    assert_eq!(daemon.read_all("rd.b.dlq").len(), 4);
    assert_eq!(daemon.read_all("rd.c.dlq").len(), 4);

    // A dry run changes nothing.
    let dry = daemon.post("/v1/dlq/rd/b/redrive", json!({"dry_run": true}));
    assert_eq!(dry["redriven"], 4, "{dry}");
    assert_eq!(daemon.read_all("rd.b.dlq").len(), 4);

    // Redrive b: the fixed handler succeeds; only b runs again.
    let first = daemon.post("/v1/dlq/rd/b/redrive", json!({}));
    assert_eq!(first["redriven"], 4, "{first}");
    daemon.wait_until("b redriven", LONG, |d| d.read_all("out.b2").len() == 10);
    let second = daemon.post("/v1/dlq/rd/b/redrive", json!({}));
    assert_eq!(second["redriven"], 0, "{second}");
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        daemon.read_all("out.b2").len(),
        10,
        "second redrive made outputs"
    );
    assert_eq!(
        daemon.read_all("out.a").len(),
        10,
        "the redrive re-ran stage a"
    );
    assert!(daemon.read_all("rd.b.dlq").is_empty());
    // Outputs of a redriven message flow on downstream like any other (b's
    // outputs are consumed by b2, so they are counted in out.b2).
    let downstream = daemon.read_all("out.b2");
    let inputs: BTreeSet<&str> = downstream
        .iter()
        .filter_map(|m| header(m, "x-input-id"))
        .collect();
    assert_eq!(inputs.len(), 10, "{downstream:?}");
    assert!(
        downstream
            .iter()
            .all(|m| header(m, "sluice-redrive-to").is_none())
    );

    // Redrive c: it fails again and comes back with its attempts counted.
    // At 5 msgs/s the first redriven message is back in the DLQ long before
    // the redrive ends; the redrive must not pick it up again.
    let redriven = daemon.post("/v1/dlq/rd/c/redrive", json!({"rate": 5}));
    assert_eq!(redriven["redriven"], 4, "{redriven}");
    daemon.wait_until("c back in the DLQ", LONG, |d| {
        let dlq = d.read_all("rd.c.dlq");
        dlq.len() == 4
            && dlq
                .iter()
                .all(|e| header(e, "sluice-redrives") == Some("1"))
    });
    std::thread::sleep(Duration::from_millis(800));
    let dlq = daemon.read_all("rd.c.dlq");
    assert_eq!(dlq.len(), 4, "it must not loop");
    for entry in &dlq {
        assert_eq!(header(entry, "sluice-dlq-attempts"), Some("2"));
        assert!(
            entry["id"]
                .as_str()
                .is_some_and(|id| id.ends_with("~r1@rd/c")),
            "{entry}"
        );
    }
    assert_eq!(daemon.read_all("out.c").len(), 6);
}

fn quickstart_shows_outputs_and_one_dead_letter(backend: &Backend) {
    sluice_harness::plugin("uppercase");
    let data = tempfile::tempdir().expect("data dir");
    let quickstart = sluice_harness::repo_root().join("pipelines/quickstart.yaml");
    let daemon = Daemon::start_on(backend, &[&quickstart], data.path());
    daemon.publish(
        "greetings",
        &[Msg::new("g1", "hello"), Msg::new("g2", "sluice")],
    );
    // The demo's poison: not UTF-8, so the uppercase handler rejects it.
    daemon.publish_bytes("greetings", "g3", &[0xff, 0xfe]);
    daemon.wait_until("outputs and the dead letter", LONG, |d| {
        d.read_all("greetings.upper").len() == 2 && d.read_all("quickstart.shout.dlq").len() == 1
    });
    assert_eq!(
        payloads(&daemon.read_all("greetings.upper")),
        ["HELLO", "SLUICE"]
    );
    let dlq = daemon.read_all("quickstart.shout.dlq");
    assert_eq!(dlq[0]["id"], "g3", "{dlq:?}");
    let headers = &dlq[0]["headers"];
    let header = |name: &str| {
        headers
            .as_array()
            .and_then(|hs| hs.iter().find(|h| h[0] == name))
            .map(|h| h[1].clone())
    };
    assert_eq!(
        header("sluice-dlq-kind"),
        Some("rejected".into()),
        "{dlq:?}"
    );
    assert_eq!(header("sluice-dlq-attempts"), Some("1".into()), "{dlq:?}");
}

/// `sluice stage pause`: a call in flight finishes and settles; nothing
/// new is fetched, across a kill -9 and restart; `status` and `/metrics`
/// show it; `resume` (through the API) delivers what waited, each once.
fn a_paused_stage_finishes_its_calls_fetches_nothing_and_stays_paused_across_a_restart(
    backend: &Backend,
) {
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: hold
topics: [in, out]
stages:
  - name: work
    subscribe: in
    plugin: {stamp}
    publish: [out]
    config: {{sleep_ms: 1500}}
"#,
        stamp = plugin("stamp")
    );
    let file = write_pipeline(dir.path(), "hold", &yaml);
    let mut daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    daemon.publish("in", &[Msg::new("slow", "x")]);
    daemon.wait_until("the call in flight", LONG, |d| in_flight(d) == 1);
    let out = daemon.cli(&["stage", "pause", "hold/work"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "paused hold/work"
    );
    // The call in flight finishes and its output is published.
    daemon.wait_until("the call in flight to settle", LONG, |d| {
        d.depth("out") == 1 && in_flight(d) == 0
    });
    let waiting: Vec<Msg> = (0..5).map(|i| Msg::new(format!("w{i}"), "x")).collect();
    daemon.publish("in", &waiting);
    // The quiet window is the check: the five are in the topic (`publish`
    // returned), and a paused stage that fetched one would publish its
    // output within it; a fetch that does not happen leaves no event.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(daemon.depth("out"), 1, "a paused stage fetched");
    let status = daemon.get("/v1/status");
    assert_eq!(status[0]["paused"], true, "{status}");
    assert_eq!(status[0]["depth"], 5, "{status}");
    assert_eq!(daemon.metric_sum("sluice_stage_paused"), 1.0);
    let table = daemon.cli(&["status"], &[]);
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("hold/work (PAUSED)"),
        "{}",
        String::from_utf8_lossy(&table.stdout)
    );

    daemon.kill9();
    daemon.restart();
    // `restart` returns once the daemon is ready, its stages running; the
    // quiet window is the check that the restarted stage fetches nothing.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        daemon.depth("out"),
        1,
        "the pause did not survive a restart"
    );
    assert_eq!(daemon.get("/v1/status")[0]["paused"], true);

    let resumed = daemon.post("/v1/stages/hold/work/resume", json!({}));
    assert_eq!(resumed["paused"], false, "{resumed}");
    daemon.wait_until("the waiting messages", LONG, |d| d.depth("out") == 6);
    std::thread::sleep(Duration::from_millis(500));
    let inputs: BTreeSet<String> = daemon
        .read_all("out")
        .iter()
        .filter_map(|m| header(m, "x-input-id").map(str::to_owned))
        .collect();
    assert_eq!(inputs.len(), 6, "each message once: {inputs:?}");
    assert_eq!(daemon.get("/v1/status")[0]["paused"], false);
    assert_eq!(daemon.metric_sum("sluice_stage_paused"), 0.0);
    // An unknown stage is a clear 404 through the CLI (exit 2).
    let unknown = daemon.cli(&["stage", "pause", "hold/nope"], &[]);
    assert_eq!(unknown.status.code(), Some(2));
}

/// A stage reading `jobs.critical` and `jobs.bulk` as priority lanes
/// under `priority`, one call at a time, each `sleep_ms` long; paused
/// while a test fills both lanes, so their backlogs meet the valve
/// together when it resumes.
fn lanes_daemon(backend: &Backend, dir: &std::path::Path, priority: &str, sleep_ms: u32) -> Daemon {
    let yaml = format!(
        r#"
name: lanes
topics: [jobs.critical, jobs.bulk, out]
stages:
  - name: work
    subscribe:
      topics: [jobs.critical, jobs.bulk]
      priority: {priority}
    plugin: {stamp}
    publish: [out]
    config: {{sleep_ms: {sleep_ms}}}
"#,
        stamp = plugin("stamp")
    );
    let file = write_pipeline(dir, "lanes", &yaml);
    let daemon = Daemon::start_on(backend, &[&file], &dir.join("data"));
    let out = daemon.cli(&["stage", "pause", "lanes/work"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    daemon
}

/// The input ids of `out`, in the order their handler calls started.
fn call_order(daemon: &Daemon) -> Vec<String> {
    let mut calls: Vec<(u64, String)> = daemon
        .read_all("out")
        .iter()
        .map(|m| {
            let start = header(m, "x-start-us")
                .and_then(|us| us.parse().ok())
                .expect("x-start-us");
            (
                start,
                header(m, "x-input-id").expect("x-input-id").to_owned(),
            )
        })
        .collect();
    calls.sort();
    calls.into_iter().map(|(_, id)| id).collect()
}

fn strict_lanes_drain_the_critical_lane_before_the_bulk_one(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    // Calls of 50 ms: long next to a fetch's round trip, even on a busy
    // machine, so the startup race below is a call or two at most.
    let daemon = lanes_daemon(backend, dir.path(), "strict", 50);
    let bulk: Vec<Msg> = (0..60).map(|i| Msg::new(format!("b{i}"), "x")).collect();
    let critical: Vec<Msg> = (0..15).map(|i| Msg::new(format!("c{i}"), "x")).collect();
    // Bulk first: publish order must not be what puts critical ahead.
    daemon.publish("jobs.bulk", &bulk);
    daemon.publish("jobs.critical", &critical);
    let status = daemon.get("/v1/status");
    let lanes = &status[0]["lanes"];
    assert_eq!(lanes[0]["topic"], "jobs.critical", "{status}");
    assert_eq!(lanes[0]["depth"], 15, "{status}");
    assert_eq!(lanes[1]["depth"], 60, "{status}");
    assert_eq!(
        status[0]["depth"], 75,
        "the stage's depth sums its lanes: {status}"
    );

    let resumed = daemon.post("/v1/stages/lanes/work/resume", json!({}));
    assert_eq!(resumed["paused"], false, "{resumed}");
    daemon.wait_until("every call", LONG, |d| d.depth("out") >= 75);
    let order = call_order(&daemon);
    assert_eq!(order.len(), 75, "each message once");
    assert_eq!(
        order.iter().collect::<BTreeSet<_>>().len(),
        75,
        "each message once"
    );
    // With one worker slot, a bulk call may take the slot while the
    // critical lane's first fetch after the resume is still in flight (each
    // lane's fetch is its own round trip): a call or two at the start. Once
    // a critical message is in the stage, no bulk call runs until the
    // critical lane is empty.
    let first_critical = order
        .iter()
        .position(|id| id.starts_with('c'))
        .expect("critical");
    let last_critical = order
        .iter()
        .rposition(|id| id.starts_with('c'))
        .expect("critical");
    let interleaved = order[first_critical..last_critical]
        .iter()
        .filter(|id| id.starts_with('b'))
        .count();
    assert_eq!(
        interleaved, 0,
        "bulk calls ran between critical ones: {order:?}"
    );
    assert!(
        first_critical <= 2,
        "{first_critical} bulk calls ran before the first critical one: {order:?}"
    );

    // Each lane's wait shows in status and /metrics.
    let status = daemon.get("/v1/status");
    for lane in status[0]["lanes"].as_array().expect("lanes") {
        assert!(lane["wait_p99_seconds"].as_f64().is_some(), "{status}");
    }
    assert_eq!(daemon.metric_sum("sluice_lane_wait_seconds_count"), 75.0);
    let table = daemon.cli(&["status"], &[]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("> jobs.bulk (wait p50 "), "{table}");
}

fn weighted_lanes_share_the_slots_in_proportion(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let daemon = lanes_daemon(
        backend,
        dir.path(),
        "{weighted: {jobs.critical: 3, jobs.bulk: 1}}",
        5,
    );
    let bulk: Vec<Msg> = (0..80).map(|i| Msg::new(format!("b{i}"), "x")).collect();
    let critical: Vec<Msg> = (0..80).map(|i| Msg::new(format!("c{i}"), "x")).collect();
    daemon.publish("jobs.bulk", &bulk);
    daemon.publish("jobs.critical", &critical);
    daemon.post("/v1/stages/lanes/work/resume", json!({}));
    daemon.wait_until("every call", LONG, |d| d.depth("out") >= 160);
    let order = call_order(&daemon);
    assert_eq!(
        order.iter().collect::<BTreeSet<_>>().len(),
        160,
        "each message once"
    );
    // While both lanes have work (the first 80 calls: critical cannot run
    // out before then), 3 in 4 slots go to critical and the bulk lane
    // still moves. Either lane's first fetch may start a call or two
    // before the other lane waits too.
    let bulk_share = order[..80].iter().filter(|id| id.starts_with('b')).count();
    assert!(
        (17..=23).contains(&bulk_share),
        "bulk had {bulk_share} of the first 80 calls, not about 20: {order:?}"
    );
}

/// A stage limited to `rate` whose handler (stamp) takes no time.
fn rate_pipeline(dir: &std::path::Path, rate: &str, extra: &str) -> std::path::PathBuf {
    let yaml = format!(
        r#"
name: paced
topics: [in, out]
stages:
  - name: work
    subscribe: in
    plugin: {stamp}
    publish: [out]
    concurrency: 4
    rate: {rate}
{extra}
"#,
        stamp = plugin("stamp")
    );
    write_pipeline(dir, "paced", &yaml)
}

/// The wall-clock start of every call, in microseconds, sorted.
fn call_starts(daemon: &Daemon) -> Vec<u64> {
    let mut starts: Vec<u64> = daemon
        .read_all("out")
        .iter()
        .filter_map(|m| header(m, "x-start-us")?.parse().ok())
        .collect();
    starts.sort_unstable();
    starts
}

fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Publishes a first message and waits for its output, so the plugin is
/// warm and the bucket's turns start when the next messages arrive.
fn warm_up(daemon: &Daemon) {
    daemon.publish("in", &[Msg::new("warm", "x")]);
    daemon.wait_until("the warm-up call", LONG, |d| d.depth("out") >= 1);
}

/// `rate: 10/s` (burst 1) at concurrency 4: the k-th of 30 calls starts
/// no sooner than k × 100 ms after they were published, so the last at
/// least 2.9 s after; unlimited, they would take milliseconds, and a
/// limiter running at 14/s would finish in about 2.1 s. The bound counts
/// from the publish, not from the first call, because a call starts after
/// its turn on the limiter's grid, never before, but may start late: a
/// late first call would shorten a span measured from it.
fn a_rate_limit_spaces_the_calls_never_faster_than_the_limit(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = rate_pipeline(dir.path(), "10/s", "");
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    warm_up(&daemon);
    let n = 30;
    let messages: Vec<Msg> = (0..n).map(|i| Msg::new(format!("r{i}"), "x")).collect();
    let published_us = wall_us();
    daemon.publish("in", &messages);
    daemon.wait_until("every call", LONG, |d| d.depth("out") > n);
    let starts = call_starts(&daemon);
    assert_on_the_grid(&starts[1..], published_us, 100_000, "at 10/s");
    assert_exactly_once(&without_warm_up(daemon.read_all("out")), "r", n);
}

/// The outputs but the warm-up's (see [`warm_up`]).
fn without_warm_up(out: Vec<Value>) -> Vec<Value> {
    out.into_iter()
        .filter(|m| header(m, "x-input-id") != Some("warm"))
        .collect()
}

/// Asserts the k-th of `starts` (sorted, µs) began at least k intervals
/// after `from_us`: what a limit of one call per `interval_us` with a burst
/// of one allows, whenever each call actually started. A lower bound only.
fn assert_on_the_grid(starts: &[u64], from_us: u64, interval_us: u64, what: &str) {
    // The handler's wall clock and the limiter's monotonic one may differ
    // by a little; a limiter 40 % fast misses by far more.
    const CLOCKS_US: u64 = 20_000;
    let n = starts.len();
    let early: Vec<(usize, u64)> = starts
        .iter()
        .enumerate()
        .filter(|(k, at)| **at + CLOCKS_US < from_us + *k as u64 * interval_us)
        .map(|(k, at)| (k, (from_us + k as u64 * interval_us - at) / 1000))
        .collect();
    let span_ms = starts[n - 1].saturating_sub(from_us) / 1000;
    assert!(
        early.is_empty(),
        "{n} calls {what}: the last started {span_ms} ms after the publish, at least {} ms promised; {} calls ahead of the grid, e.g. (k, ms early) {:?}",
        (n as u64 - 1) * interval_us / 1000,
        early.len(),
        &early[..early.len().min(5)]
    );
}

/// A handler's `retry(after 2s)` on a stage with `hold_on_retry_after`
/// holds every call of the stage, not just its message's, for 2 s.
fn a_retry_after_holds_the_whole_stage_when_asked(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = rate_pipeline(
        dir.path(),
        "1000/s",
        "    hold_on_retry_after: true\n    config: {fail_until_attempt: 2, retry_after_ms: 2000}\n",
    );
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    warm_up(&daemon);
    let before_us = wall_us();
    daemon.publish("in", &[Msg::new("asks", "FAIL once")]);
    std::thread::sleep(Duration::from_millis(300));
    let later: Vec<Msg> = (0..5).map(|i| Msg::new(format!("h{i}"), "x")).collect();
    daemon.publish("in", &later);
    daemon.wait_until("every call", LONG, |d| d.depth("out") >= 7);
    let out = daemon.read_all("out");
    let retried = out
        .iter()
        .find(|m| header(m, "x-input-id") == Some("asks"))
        .expect("the retried message's output");
    assert_eq!(header(retried, "x-attempt"), Some("2"), "{retried}");
    // The hold began when the failed call returned, after `before_us`, and
    // lasts 2 s; the later messages came 300 ms in and waited for it.
    for m in out
        .iter()
        .filter(|m| header(m, "x-input-id").is_some_and(|id| id.starts_with('h')))
    {
        let start: u64 = header(m, "x-start-us")
            .and_then(|us| us.parse().ok())
            .expect("x-start-us");
        assert!(
            start >= before_us + 2_000_000,
            "a message ran {} ms into the 2 s hold: {m}",
            start.saturating_sub(before_us) / 1000
        );
    }
    assert!(
        daemon.metric_sum("sluice_stage_hold_until_timestamp_seconds") > 0.0,
        "the hold shows in /metrics"
    );
}

on_both_brokers!(
    a_paused_stage_finishes_its_calls_fetches_nothing_and_stays_paused_across_a_restart,
    orders_10k_every_input_is_routed_or_dead_lettered_exactly_once,
    fan_out_gives_every_subscriber_every_message,
    poison_retries_land_in_the_dlq_after_exactly_max_attempts,
    poison_rejects_land_in_the_dlq_at_once,
    kill_9_five_times_loses_nothing_and_duplicates_nothing,
    delays_survive_two_kill_9s_each_once_and_never_early,
    a_handler_emit_with_a_delay_waits_before_it_reaches_its_topic,
    sigterm_under_load_drains_in_time_and_redelivers_nothing_done,
    a_handler_slower_than_ack_wait_is_not_redelivered,
    per_key_ordering_serialises_keys_and_parallelises_across_them,
    redrive_once_is_enough_and_a_message_that_fails_again_returns_to_the_dlq,
    quickstart_shows_outputs_and_one_dead_letter,
    strict_lanes_drain_the_critical_lane_before_the_bulk_one,
    weighted_lanes_share_the_slots_in_proportion,
    a_rate_limit_spaces_the_calls_never_faster_than_the_limit,
    a_retry_after_holds_the_whole_stage_when_asked,
);

/// On NATS two daemons with the same limited stage keep to the limit
/// together: the k-th of 60 calls across both starts no sooner than
/// k × 100 ms after they were published (so the last at least 5.9 s
/// after); two daemons each at 10/s on their own finish in about 3 s.
/// Every input comes out exactly once, and both daemons did some.
#[test]
fn two_daemons_on_nats_share_one_rate_limit() {
    let backend = Backend::nats();
    let dir = tempfile::tempdir().expect("dir");
    // A small window, so both daemons get some of the messages.
    let file = rate_pipeline(dir.path(), "10/s", "    max_ack_pending: 4\n");
    let a = Daemon::start_on(&backend, &[&file], &dir.path().join("a"));
    let b = Daemon::start_on(&backend, &[&file], &dir.path().join("b"));
    warm_up(&a);
    let n = 60;
    let messages: Vec<Msg> = (0..n).map(|i| Msg::new(format!("r{i}"), "x")).collect();
    let published_us = wall_us();
    a.publish("in", &messages);
    a.wait_until("every call", LONG, |d| d.depth("out") > n);
    // The quiet half second is the check that no duplicate comes after
    // the last first output.
    std::thread::sleep(Duration::from_millis(500));
    assert_exactly_once(&without_warm_up(a.read_all("out")), "r", n);
    let starts = call_starts(&a);
    assert_on_the_grid(
        &starts[1..],
        published_us,
        100_000,
        "at 10/s over two daemons",
    );
    let by_b = b.metric_sum("sluice_messages_processed_total");
    assert!(by_b > 0.0, "daemon b handled none, so nothing was shared");
}

/// Large messages meet the stage's byte budget before its count limit:
/// with a backlog of 3 MiB messages and a 300 ms handler, the stage holds
/// about `IN_FLIGHT_BYTES` / 3 MiB of them (plus the one the fetch loop
/// waits with), not the `DEFAULT_IN_FLIGHT` its count limit would allow;
/// the rest waits in the broker, and every message is still processed.
/// The budget is the engine's, the same on both brokers; this runs on the
/// embedded one, whose messages may be this large, and whose topic keeps
/// what was published before any stage subscribed, so the whole backlog
/// is there before the stage starts, however fast this machine publishes.
#[test]
fn large_messages_are_held_within_the_byte_budget() {
    use sluice::engine::{DEFAULT_IN_FLIGHT, IN_FLIGHT_BYTES};
    const SIZE: usize = 3 << 20;
    let fit = IN_FLIGHT_BYTES / SIZE;
    let n = fit * 2 + 10;
    assert!(
        n < DEFAULT_IN_FLIGHT,
        "the count limit must not be what binds"
    );
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    let pipeline = |stage: &str, topic: &str| {
        write_pipeline(
            dir.path(),
            "big",
            &format!(
                "name: big\ntopics: [in, out, idle]\nstages:\n  - name: {stage}\n    subscribe: {topic}\n    plugin: {}\n    concurrency: 1\n    config: {{ms: 300}}\n    publish: [out]\n",
                plugin("sleepy")
            ),
        )
    };
    // The backlog first, while the stage reads another topic.
    {
        let daemon = Daemon::start(&[&pipeline("parked", "idle")], &data);
        let payload = vec![b'b'; SIZE];
        std::thread::scope(|s| {
            for producer in 0..4 {
                let (daemon, payload) = (&daemon, &payload);
                s.spawn(move || {
                    for i in (producer..n).step_by(4) {
                        daemon.publish_bytes("in", &format!("big-{i}"), payload);
                    }
                });
            }
        });
        assert_eq!(daemon.depth("in"), n);
    }
    let daemon = Daemon::start(&[&pipeline("slow", "in")], &data);
    let held = std::sync::atomic::AtomicUsize::new(0);
    while daemon.depth("out") < n {
        held.fetch_max(in_flight(&daemon), std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(50));
    }
    let held = held.into_inner();
    eprintln!("{n} messages of {SIZE} B: at most {held} held at once (budget fits {fit})");
    assert!(
        held <= fit + 2,
        "the stage held {held} messages of {SIZE} B at once; its byte budget fits {fit}"
    );
    assert!(
        held >= fit / 2,
        "the stage did not fill its budget ({held})"
    );
    let status = daemon.get("/v1/status");
    assert_eq!(status[0]["processed_total"], n, "{status}");
    assert_eq!(status[0]["dlq_depth"], 0, "{status}");
    assert_eq!(daemon.depth("out"), n, "every message processed once");
}

/// Deliveries the daemon's only stage holds now.
fn in_flight(daemon: &Daemon) -> usize {
    let held = daemon.get("/v1/status")[0]["in_flight"]
        .as_u64()
        .expect("in_flight");
    usize::try_from(held).expect("fits")
}
