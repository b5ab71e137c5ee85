//! Hot reload against the real `sluice run`: the three triggers (`sluice
//! reload` / `POST /v1/reload`, SIGHUP, `--watch`), validation first, only
//! what changed restarting, the refusals, and what `status` and `/metrics`
//! say afterwards. Every message published along the way comes out exactly
//! once, and after a plugin swap by the new plugin.
//!
//! The plugin "swapped for a new build" is the stage's plugin file
//! rewritten in place: `identity` (payload unchanged) and `uppercase`
//! (payload upper-cased), so each output says which one handled it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{Daemon, Msg};

const LONG: Duration = Duration::from_secs(120);

/// `in` -> a (its plugin file `a.wasm`) -> `mid` -> b -> `out`, and any
/// `extra` stages, with b's concurrency `b_concurrency`.
fn pipeline(dir: &Path, b_concurrency: u32, extra_topics: &str, extra: &str) -> PathBuf {
    let yaml = format!(
        "name: live\n\
         topics: [in, mid, out{extra_topics}]\n\
         shutdown_timeout: 5s\n\
         stages:\n\
         \x20 - name: a\n\
         \x20   subscribe: in\n\
         \x20   plugin: ./a.wasm\n\
         \x20   publish: [mid]\n\
         \x20   concurrency: 2\n\
         \x20 - name: b\n\
         \x20   subscribe: mid\n\
         \x20   plugin: {identity}\n\
         \x20   publish: [out]\n\
         \x20   concurrency: {b_concurrency}\n\
         {extra}",
        identity = sluice_tests::plugin("identity"),
    );
    let path = dir.join("live.yaml");
    std::fs::write(&path, yaml).expect("write the pipeline");
    path
}

/// Puts plugin `name`'s component at `dir/a.wasm`, as a deploy would: a
/// new file renamed over the old one.
fn install_a(dir: &Path, name: &str) {
    let staged = dir.join("a.wasm.new");
    std::fs::copy(sluice_harness::plugin(name), &staged).expect("copy the plugin");
    std::fs::rename(&staged, dir.join("a.wasm")).expect("rename the plugin into place");
}

/// `n` messages `{prefix}-{i}` with lowercase payloads.
fn batch(prefix: &str, n: usize) -> Vec<Msg> {
    (0..n)
        .map(|i| Msg::new(format!("{prefix}-{i}"), format!("hello {prefix} {i}")))
        .collect()
}

/// `POST /v1/reload` with `body`: the status and the report.
fn post_reload(daemon: &Daemon, body: Value) -> (u16, Value) {
    let response = reqwest::blocking::Client::new()
        .post(daemon.url("/v1/reload"))
        .json(&body)
        .timeout(LONG)
        .send()
        .expect("POST /v1/reload");
    let status = response.status().as_u16();
    (status, response.json().expect("a JSON report"))
}

/// `sluice reload --json ARGS`: the exit code and the report.
fn cli_reload(daemon: &Daemon, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["reload", "--json"];
    all.extend_from_slice(args);
    let out = daemon.cli(&all, &[]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "sluice reload printed no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

/// The payloads in `out`, by the input id their chain started from.
fn outputs(daemon: &Daemon, topic: &str) -> Vec<(String, String)> {
    daemon
        .read_all(topic)
        .iter()
        .map(|m| {
            let payload = m["payload"].as_str().unwrap_or_default().to_owned();
            // The payload carries the input's words: `hello {prefix} {i}`.
            (payload.to_lowercase(), payload)
        })
        .collect()
}

fn names(report: &Value, field: &str) -> Vec<String> {
    report["changes"][field]
        .as_array()
        .unwrap_or_else(|| panic!("no changes.{field} in {report}"))
        .iter()
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other["name"].as_str().unwrap_or_default().to_owned(),
        })
        .collect()
}

#[test]
fn a_reload_applies_what_changed_and_refuses_what_is_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    install_a(dir.path(), "identity");
    let file = pipeline(dir.path(), 2, "", "");
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    let mut expected: BTreeSet<String> = BTreeSet::new();

    // 1. Before anything: identity all through.
    let first = batch("one", 50);
    daemon.publish("in", &first);
    expected.extend(first.iter().map(|m| m.payload.clone()));
    daemon.wait_until("the first batch", LONG, |d| d.depth("out") == 50);

    // 2. A new plugin build for stage a: only a restarts; what is
    // published afterwards is handled by the new plugin.
    install_a(dir.path(), "uppercase");
    let (code, report) = cli_reload(&daemon, &[]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["trigger"], "api");
    assert_eq!(names(&report, "stages_restarted"), ["live/a"], "{report}");
    assert_eq!(
        report["changes"]["stages_restarted"][0]["why"],
        json!(["plugin"])
    );
    for other in [
        "stages_added",
        "stages_removed",
        "topics_added",
        "topics_removed",
    ] {
        assert!(names(&report, other).is_empty(), "{other}: {report}");
    }
    let second = batch("two", 50);
    daemon.publish("in", &second);
    expected.extend(second.iter().map(|m| m.payload.clone()));
    daemon.wait_until("the second batch", LONG, |d| d.depth("out") == 100);
    let upper: Vec<String> = outputs(&daemon, "out")
        .into_iter()
        .filter(|(lower, _)| lower.starts_with("hello two"))
        .map(|(_, payload)| payload)
        .collect();
    assert_eq!(upper.len(), 50);
    assert!(
        upper.iter().all(|p| p.starts_with("HELLO TWO")),
        "a message published after the swap was handled by the old plugin: {upper:?}"
    );

    // 3. A concurrency change: only b restarts, at the new value.
    pipeline(dir.path(), 4, "", "");
    let (status, report) = post_reload(&daemon, json!({}));
    assert_eq!(status, 200, "{report}");
    assert_eq!(names(&report, "stages_restarted"), ["live/b"], "{report}");
    assert_eq!(
        report["changes"]["stages_restarted"][0]["why"],
        json!(["concurrency 2 -> 4"])
    );

    // 4. An invalid file changes nothing: 422 with the place, the record
    // and the metric say so, and the previous configuration runs on.
    std::fs::write(
        &file,
        std::fs::read_to_string(&file)
            .expect("read")
            .replace("concurrency: 4", "concurrensy: 4"),
    )
    .expect("write");
    let (status, report) = post_reload(&daemon, json!({}));
    assert_eq!(status, 422, "{report}");
    assert_eq!(report["ok"], false);
    let error = &report["errors"][0];
    assert!(
        error["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("live.yaml"))
            && error["line"].as_u64() == Some(14)
            && error["col"].as_u64().is_some()
            && error["message"]
                .as_str()
                .is_some_and(|m| m.contains("concurrensy")),
        "{report}"
    );
    let (code, _) = cli_reload(&daemon, &[]);
    assert_eq!(code, 2, "a refused reload exits 2");
    let summary = daemon.get("/v1/reload");
    assert_eq!(summary["succeeded"], 2, "{summary}");
    assert_eq!(summary["failed"], 2, "{summary}");
    assert_eq!(
        daemon.metric_sum("sluice_config_last_reload_successful"),
        0.0
    );
    let metrics = daemon.metrics_text();
    assert!(
        metrics.contains("sluice_config_reloads_total{result=\"failure\"} 2"),
        "{metrics}"
    );
    let status = daemon.cli(&["status"], &[]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains("reloads: 2 applied, 2 refused; last REFUSED"),
        "{status}"
    );
    let third = batch("three", 50);
    daemon.publish("in", &third);
    expected.extend(third.iter().map(|m| m.payload.clone()));
    daemon.wait_until("the third batch, on the old config", LONG, |d| {
        d.depth("out") == 150
    });

    // 5. A stage added with a topic of its own.
    let extra = "\x20 - name: c\n\
                 \x20   subscribe: mid\n\
                 \x20   plugin: ./a.wasm\n\
                 \x20   publish: [side]\n";
    pipeline(dir.path(), 4, ", side", extra);
    let (status, report) = post_reload(&daemon, json!({}));
    assert_eq!(status, 200, "{report}");
    assert_eq!(names(&report, "stages_added"), ["live/c"], "{report}");
    let mut added = names(&report, "topics_added");
    added.sort();
    assert_eq!(added, ["live.c.dlq", "side"], "{report}");
    assert!(names(&report, "stages_restarted").is_empty(), "{report}");
    let fourth = batch("four", 50);
    daemon.publish("in", &fourth);
    expected.extend(fourth.iter().map(|m| m.payload.clone()));
    daemon.wait_until("the fourth batch, on both branches", LONG, |d| {
        d.depth("out") == 200 && d.depth("side") == 50
    });

    // 6. Removing it and its topic: `side` holds messages, so refused...
    pipeline(dir.path(), 4, "", "");
    let (status, report) = post_reload(&daemon, json!({}));
    assert_eq!(status, 422, "{report}");
    assert!(
        report["errors"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("topic `side` still holds 50 messages")),
        "{report}"
    );
    assert_eq!(daemon.depth("side"), 50);
    // ...unless forced; the messages stay in the broker.
    let (code, report) = cli_reload(&daemon, &["--force"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["forced"], true);
    assert_eq!(names(&report, "stages_removed"), ["live/c"], "{report}");
    assert!(
        names(&report, "topics_removed").contains(&"side".to_owned()),
        "{report}"
    );
    assert!(
        report["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("live.c") && w.contains("keeps its place")),
        "{report}"
    );

    // 7. SIGHUP: the same reload; back to the identity plugin.
    install_a(dir.path(), "identity");
    let pid = daemon.pid().expect("running");
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("kill -HUP");
    assert!(hup.success());
    daemon.wait_until("the SIGHUP reload", LONG, |d| {
        let summary = d.get("/v1/reload");
        summary["last"]["trigger"] == "signal" && summary["succeeded"] == 5
    });
    let last = &daemon.get("/v1/reload")["last"];
    assert_eq!(names(last, "stages_restarted"), ["live/a"], "{last}");
    let fifth = batch("five", 50);
    daemon.publish("in", &fifth);
    expected.extend(fifth.iter().map(|m| m.payload.clone()));
    daemon.wait_until("the fifth batch", LONG, |d| d.depth("out") == 250);

    // Exactly once: every input's words in `out`, once each.
    let got: Vec<String> = outputs(&daemon, "out")
        .into_iter()
        .map(|(lower, _)| lower)
        .collect();
    let unique: BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(got.len(), unique.len(), "duplicated outputs");
    assert_eq!(unique, expected, "lost or altered outputs");
    let fifth_out: Vec<(String, String)> = outputs(&daemon, "out")
        .into_iter()
        .filter(|(lower, _)| lower.starts_with("hello five"))
        .collect();
    assert!(
        fifth_out.iter().all(|(lower, payload)| lower == payload),
        "after the swap back, identity handles everything: {fifth_out:?}"
    );
    assert!(
        daemon.metric_sum("sluice_config_last_reload_successful") == 1.0,
        "the last reload succeeded"
    );
}

#[test]
fn watch_reloads_when_a_plugin_or_file_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    install_a(dir.path(), "identity");
    let file = pipeline(dir.path(), 2, "", "");
    let daemon = Daemon::builder(&[&file], &dir.path().join("data"))
        .args(["--watch"])
        .start();
    daemon.publish("in", &batch("before", 20));
    daemon.wait_until("the first batch", LONG, |d| d.depth("out") == 20);

    install_a(dir.path(), "uppercase");
    daemon.wait_until("a reload by --watch", LONG, |d| {
        d.get("/v1/reload")["last"]["trigger"] == "watch"
    });
    let last = daemon.get("/v1/reload")["last"].clone();
    assert_eq!(last["ok"], true, "{last}");
    assert_eq!(names(&last, "stages_restarted"), ["live/a"], "{last}");
    daemon.publish("in", &batch("after", 20));
    daemon.wait_until("the second batch", LONG, |d| d.depth("out") == 40);
    let after: Vec<(String, String)> = outputs(&daemon, "out")
        .into_iter()
        .filter(|(lower, _)| lower.starts_with("hello after"))
        .collect();
    assert!(
        after
            .iter()
            .all(|(lower, payload)| *payload == lower.to_uppercase()),
        "{after:?}"
    );

    // A broken file: refused, logged, and the daemon runs on.
    std::fs::write(&file, "name: live\ntopics: [in\n").expect("write");
    daemon.wait_until("a refused reload by --watch", LONG, |d| {
        d.get("/v1/reload")["failed"] == 1
    });
    assert!(
        daemon
            .log()
            .contains("reload refused; the previous configuration keeps running"),
        "{}",
        daemon.log()
    );
    daemon.publish("in", &batch("still", 20));
    daemon.wait_until("the third batch", LONG, |d| d.depth("out") == 60);
}

#[test]
fn a_read_only_token_cannot_reload() {
    let dir = tempfile::tempdir().expect("tempdir");
    install_a(dir.path(), "identity");
    let file = pipeline(dir.path(), 2, "", "");
    let daemon = Daemon::builder(&[&file], &dir.path().join("data"))
        .envs([
            ("SLUICE_ADMIN_TOKEN", "full-secret-token-123"),
            ("SLUICE_ADMIN_READ_TOKEN", "read-secret-token-456"),
        ])
        .start();
    let out = daemon.cli(
        &["reload"],
        &[("SLUICE_ADMIN_READ_TOKEN", "read-secret-token-456")],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("read-only"), "{stderr}");
    assert!(!stderr.contains("read-secret-token-456"), "{stderr}");
    let out = daemon.cli(
        &["reload", "--json"],
        &[("SLUICE_ADMIN_TOKEN", "full-secret-token-123")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `in` -> a (`./a.wasm`) -> `m1` -> b (concurrency `b`) -> `m2` -> c ->
/// `out`, with stage d (`m2` -> `side`) when `with_d`; `side` is declared
/// either way, so removing d removes no topic. `broken` writes a file that
/// does not parse.
fn three_stages(dir: &Path, b: u32, with_d: bool, broken: bool) -> PathBuf {
    let identity = sluice_tests::plugin("identity");
    let d = if with_d {
        format!(
            "\x20 - name: d\n\
             \x20   subscribe: m2\n\
             \x20   plugin: {identity}\n\
             \x20   publish: [side]\n"
        )
    } else {
        String::new()
    };
    let yaml = format!(
        "name: load\n\
         topics: [in, m1, m2, out, side]\n\
         shutdown_timeout: 5s\n\
         stages:\n\
         \x20 - name: a\n\
         \x20   subscribe: in\n\
         \x20   plugin: ./a.wasm\n\
         \x20   publish: [m1]\n\
         \x20   concurrency: 2\n\
         \x20 - name: b\n\
         \x20   subscribe: m1\n\
         \x20   plugin: {identity}\n\
         \x20   publish: [m2]\n\
         \x20   concurrency: {b}\n\
         \x20 - name: c\n\
         \x20   subscribe: m2\n\
         \x20   plugin: {identity}\n\
         \x20   publish: [out]\n\
         \x20   concurrency: 2\n\
         {d}{tail}",
        tail = if broken { "  - name: [oops\n" } else { "" }
    );
    let path = dir.join("load.yaml");
    std::fs::write(&path, yaml).expect("write the pipeline");
    path
}

/// Issue 27's "reload under load": 20 reloads while a producer publishes
/// 2,000 messages a second through three stages. A plugin swapped for a new
/// build, a concurrency change, a stage added and removed (its topic stays)
/// and an invalid file, four times over. Then: every input comes out of the
/// last stage exactly once, and every input sent after a swap's reload
/// returned (and accepted before the next began) was handled by the plugin it
/// put in.
#[test]
fn twenty_reloads_under_two_thousand_messages_a_second_lose_and_repeat_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    const RATE: usize = 2_000;
    const TICK: Duration = Duration::from_millis(100);
    let per_tick = RATE * TICK.as_millis() as usize / 1000;

    let dir = tempfile::tempdir().expect("tempdir");
    install_a(dir.path(), "identity");
    let file = three_stages(dir.path(), 2, false, false);
    let daemon = Arc::new(Daemon::start(&[&file], &dir.path().join("data")));

    // The producer: `per_tick` messages every tick, each batch's send and
    // accept times recorded. A batch sent before a reload returned may
    // still be handled by the plugin the reload replaced, even when it is
    // accepted after, so the check below takes only batches sent after.
    let stop = Arc::new(AtomicBool::new(false));
    let accepted: Arc<Mutex<Vec<(usize, Instant, Instant)>>> = Arc::default();
    let producer = {
        let (daemon, stop, accepted) = (daemon.clone(), stop.clone(), accepted.clone());
        std::thread::spawn(move || {
            let mut next = 0usize;
            let mut tick = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                let batch: Vec<Msg> = (next..next + per_tick)
                    .map(|i| Msg::new(format!("L-{i}"), format!("load {i}")))
                    .collect();
                let sent = Instant::now();
                daemon.publish("in", &batch);
                let at = Instant::now();
                accepted
                    .lock()
                    .expect("accepted")
                    .extend((next..next + per_tick).map(|i| (i, sent, at)));
                next += per_tick;
                tick += TICK;
                if let Some(wait) = tick.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
        })
    };

    // Twenty reloads, a kind at a time. `swaps` keeps, for each plugin
    // swap, when its reload began and returned and which plugin it put in.
    let mut swaps: Vec<(Instant, Instant, &str)> = Vec::new();
    let mut plugin = "identity";
    let mut b = 2;
    let mut refused = 0;
    for round in 0..20 {
        std::thread::sleep(Duration::from_millis(700));
        let began = Instant::now();
        // What the reload must answer: its status, and the one stage it
        // restarts, adds or removes.
        let (expect, field, stage) = match round % 5 {
            0 => {
                plugin = if plugin == "identity" {
                    "uppercase"
                } else {
                    "identity"
                };
                install_a(dir.path(), plugin);
                (200, "stages_restarted", "load/a")
            }
            1 => {
                b = if b == 2 { 4 } else { 2 };
                three_stages(dir.path(), b, false, false);
                (200, "stages_restarted", "load/b")
            }
            2 => {
                three_stages(dir.path(), b, true, false);
                (200, "stages_added", "load/d")
            }
            3 => {
                three_stages(dir.path(), b, false, false);
                (200, "stages_removed", "load/d")
            }
            _ => {
                three_stages(dir.path(), b, false, true);
                (422, "", "")
            }
        };
        let (status, report) = post_reload(&daemon, json!({}));
        assert_eq!(status, expect, "reload {round}: {report}");
        if expect == 422 {
            refused += 1;
            // The good file back, unreloaded: the daemon runs it already.
            three_stages(dir.path(), b, false, false);
            continue;
        }
        assert_eq!(names(&report, field), [stage], "reload {round}: {report}");
        // Only d's (empty) dead-letter topic comes and goes; `side` stays.
        assert!(
            names(&report, "topics_removed")
                .iter()
                .all(|t| t == "load.d.dlq"),
            "{report}"
        );
        if round % 5 == 0 {
            swaps.push((began, Instant::now(), plugin));
        }
    }
    // Ten seconds of load at least, however fast the reloads went (they
    // can finish in less on a quiet machine).
    let loaded = Instant::now();
    while accepted.lock().expect("accepted").len() < RATE * 10
        && loaded.elapsed() < Duration::from_secs(120)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    producer.join().expect("the producer");
    let accepted = std::mem::take(&mut *accepted.lock().expect("accepted"));
    let total = accepted.len();
    assert!(total >= RATE * 10, "the producer published only {total}");

    daemon.wait_until(
        "every input out of stage c",
        Duration::from_secs(600),
        |d| d.depth("out") >= total,
    );
    let out = daemon.read_all("out");
    // Each input's number, and whether stage a upper-cased it.
    let mut seen = vec![0u32; total];
    let mut upper = vec![false; total];
    for message in &out {
        let payload = message["payload"].as_str().unwrap_or_default();
        let number: usize = payload
            .to_lowercase()
            .strip_prefix("load ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("an output no input calls for: {payload:?}"));
        assert!(number < total, "an output no input calls for: {payload:?}");
        seen[number] += 1;
        upper[number] = payload.starts_with("LOAD");
    }
    let lost: Vec<usize> = (0..total).filter(|i| seen[*i] == 0).collect();
    let repeated: Vec<usize> = (0..total).filter(|i| seen[*i] > 1).collect();
    assert!(
        lost.is_empty(),
        "{} inputs lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
    assert!(
        repeated.is_empty(),
        "{} inputs came out more than once: {:?}",
        repeated.len(),
        &repeated[..repeated.len().min(20)]
    );
    // After each swap, up to the next one's start: the swap's plugin.
    let mut checked = 0;
    for (k, (_, returned, plugin)) in swaps.iter().enumerate() {
        let until = swaps.get(k + 1).map(|(began, _, _)| *began);
        for (i, sent, at) in &accepted {
            if *sent > *returned && until.is_none_or(|u| *at < u) {
                assert_eq!(
                    upper[*i],
                    *plugin == "uppercase",
                    "input {i} was published after swap {k} to {plugin} and handled by the other plugin"
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked > RATE,
        "too few inputs fell after a swap: {checked}"
    );
    let summary = daemon.get("/v1/reload");
    assert_eq!(summary["succeeded"], 16, "{summary}");
    assert_eq!(summary["failed"], refused, "{summary}");
    eprintln!(
        "reload under load: {total} inputs, 20 reloads ({} swaps), {checked} checked against their swap's plugin",
        swaps.len()
    );
}

/// Two daemons on one NATS, each with its own copy of the files: after the
/// first reloads, they run different configurations, and it says so; after
/// the second, they agree again, and it says how long the switch took.
#[test]
fn daemons_on_nats_log_the_window_in_which_they_run_different_configurations() {
    let server = sluice_harness::nats::NatsServer::start().expect("nats-server");
    let (one, two) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let start = |dir: &Path| {
        install_a(dir, "identity");
        let file = pipeline(dir, 2, "", "");
        Daemon::start_with_broker(Some(server.url()), &[&file], &dir.join("data"))
    };
    let (first, second) = (start(one.path()), start(two.path()));

    install_a(one.path(), "uppercase");
    let (code, report_one) = cli_reload(&first, &[]);
    assert_eq!(code, 0, "{report_one}");
    let split = "the daemons on this NATS run different configurations";
    first.wait_until("the first daemon to see the split", LONG, |d| {
        d.log().contains(split)
    });

    install_a(two.path(), "uppercase");
    let (code, report_two) = cli_reload(&second, &[]);
    assert_eq!(code, 0, "{report_two}");
    assert_eq!(
        report_one["version"], report_two["version"],
        "the same files, the same version"
    );
    // The first daemon saw them disagree, so it says when they agree.
    let agreed = "all 2 daemons on this NATS run configuration";
    first.wait_until("the daemons to agree again", LONG, |d| {
        d.log().contains(agreed)
    });
    let log = first.log();
    let line = log
        .lines()
        .find(|l| l.contains(agreed))
        .expect("the agreement line");
    let seconds: f64 = line
        .rsplit("over ")
        .next()
        .and_then(|rest| rest.trim_end_matches(" s").trim().parse().ok())
        .unwrap_or_else(|| panic!("no window in {line:?}"));
    assert!(seconds > 0.0, "{line}");
    assert!(
        line.contains(report_two["version"].as_str().expect("a version")),
        "{line}"
    );
}
