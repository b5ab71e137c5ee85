//! Handler state (`sluice:plugin/state`, contract 0.2.0) against the real
//! `sluice run` binary, with the `stateful` test plugin, on both brokers
//! (`embedded::*` and `nats::*`, a KV bucket per store) unless said:
//!
//! - counters per key stay exact through two kill -9s, with and without
//!   `ordering: key` (each message counted once: its increment commits
//!   with its output and its ack, or not at all);
//! - a call that writes and then retries, rejects or traps leaves nothing;
//! - eight workers compare-and-setting one key lose no update, and the
//!   conflicts show as `state-conflict` in the metrics;
//! - an expiring lock refuses a second holder, then admits it;
//! - a full store refuses a write and says why;
//! - operators list keys with the read token, read and delete values with
//!   the full one;
//! - (embedded) `data check` reads the state and `data salvage` keeps it,
//!   a reload that restarts the stage keeps it, and a dead letter names
//!   the keys its handler read, which `dlq show --as-case` turns into the
//!   case's starting state;
//! - (embedded) a stage with `timers: true` schedules work for itself with
//!   delayed emits to its own input, and an undelayed one is dead-lettered;
//! - a stage that does not grant `state:` is refused at `file:line:col`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{Backend, Daemon, Msg, header, plugin, sluice_bin, write_pipeline};

const LONG: Duration = Duration::from_secs(300);

fn payloads(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m["payload"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn pipeline(stage: &str) -> String {
    format!(
        r#"
name: st
topics: [in, out]
shutdown_timeout: 5s
stages:
  - name: count
    subscribe: in
    plugin: {plugin}
    publish: [out]
{stage}"#,
        plugin = plugin("stateful"),
    )
}

/// What `sluice_messages_processed_total` counts for the stage with this outcome.
fn processed(daemon: &Daemon, outcome: &str) -> u64 {
    let needle = format!("outcome=\"{outcome}\"");
    daemon
        .metrics_text()
        .lines()
        .filter(|l| {
            l.starts_with("sluice_messages_processed_total")
                && l.contains("stage=\"count\"")
                && l.contains(&needle)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// 20,000 increments over 100 keys, concurrency 8, two kill -9s; then
/// each counter is read back through the handler.
fn counters_stay_exact_through_two_kill_9s(backend: &Backend, extra: &str) {
    let dir = tempfile::tempdir().expect("dir");
    let file = write_pipeline(
        dir.path(),
        "st",
        &pipeline(&format!(
            "    state: true\n    concurrency: 8\n    config: {{sleep_ms: 1}}\n{extra}"
        )),
    );
    let mut daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    let n = 20_000;
    let keys = 100;
    let messages: Vec<Msg> = (0..n)
        .map(|i| Msg::new(format!("c{i}"), "inc").key(format!("k{}", i % keys)))
        .collect();
    // Paused while the inputs go in, so the kills land mid-run.
    daemon.post("/v1/stages/st/count/pause", json!({}));
    daemon.publish("in", &messages);
    daemon.post("/v1/stages/st/count/resume", json!({}));
    let mut seen_at_kill = Vec::new();
    for round in 0..2u64 {
        std::thread::sleep(Duration::from_millis(
            400 + fastrand::u64(0..800) + round * 300,
        ));
        seen_at_kill.push(daemon.depth("out"));
        daemon.kill9();
        daemon.restart();
    }
    daemon.wait_until("every increment's output", LONG, |d| d.depth("out") >= n);
    let gets: Vec<Msg> = (0..keys)
        .map(|k| Msg::new(format!("g{k}"), format!("get k{k}")))
        .collect();
    daemon.publish("in", &gets);
    daemon.wait_until("every counter read", LONG, |d| d.depth("out") >= n + keys);
    std::thread::sleep(Duration::from_millis(300));
    let out = payloads(&daemon.read_all("out"));
    assert_eq!(out.len(), n + keys, "one output per input, no more");
    let mut counters = BTreeMap::new();
    let mut emitted = BTreeSet::new();
    for line in &out {
        if let Some((key, value)) = line.split_once('=') {
            counters.insert(key.to_owned(), value.to_owned());
        } else {
            assert!(
                emitted.insert(line.clone()),
                "`{line}` emitted twice: one increment counted twice"
            );
        }
    }
    assert_eq!(emitted.len(), n, "one output per increment");
    // Read after every increment was done: each must be exactly n / keys.
    let expected = (n / keys).to_string();
    let wrong: Vec<_> = (0..keys)
        .map(|k| format!("k{k}"))
        .filter(|k| counters.get(k) != Some(&expected))
        .map(|k| format!("{k}={:?}", counters.get(&k)))
        .collect();
    let again: Vec<String> = daemon
        .log()
        .lines()
        .filter(|l| l.contains("was committed before"))
        .map(str::to_owned)
        .collect();
    assert!(
        wrong.is_empty(),
        "counters off (expected {expected} each): {wrong:?}\n{again:#?}"
    );
    // Every value 1..=200 of every key was emitted once by its increment.
    for k in 0..keys {
        for v in 1..=n / keys {
            assert!(
                emitted.contains(&format!("k{k} {v}")),
                "k{k} never reached {v}"
            );
        }
    }
    let conflicts = processed(&daemon, "state-conflict");
    let messages_again: BTreeSet<&str> = again
        .iter()
        .filter_map(|l| {
            l.split(|c: char| !c.is_ascii_alphanumeric()).find(|w| {
                w.len() > 1 && w.starts_with('c') && w[1..].bytes().all(|b| b.is_ascii_digit())
            })
        })
        .collect();
    eprintln!(
        "outputs seen at each kill: {seen_at_kill:?}; state conflicts: {conflicts}; \
         committed messages delivered again (their writes dropped): {} times, {} messages; {:?}",
        again.len(),
        messages_again.len(),
        &again[..again.len().min(5)]
    );
    assert!(
        seen_at_kill.iter().any(|s| *s > 0 && *s < n),
        "the kills should land mid-run: {seen_at_kill:?}"
    );
    // Only what a daemon held when it was killed comes back: at most its
    // in-flight limit (512) per kill. More means deliveries waited
    // somewhere past `ack_wait` and were delivered twice (a NATS pull
    // inbox once did: 12,000 of 20,000).
    assert!(
        messages_again.len() <= 2 * 512,
        "{} committed messages were delivered again",
        messages_again.len()
    );
}

/// One test per broker: `embedded::name()` and `nats::name()`.
macro_rules! on_both_brokers {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(#[test]
            fn $name() {
                super::$name(&sluice_tests::Backend::embedded());
            })*
        }
        mod nats {
            $(#[test]
            fn $name() {
                // Each commit of state is a sync on a single-replica
                // server; on this machine's disk that would be the whole
                // test's time.
                super::$name(&sluice_tests::Backend::nats_on_tmpfs());
            })*
        }
    };
}

on_both_brokers!(
    counters_per_key_stay_exact_through_two_kill_9s,
    counters_per_key_stay_exact_through_two_kill_9s_with_ordering_by_key,
    a_call_that_writes_then_fails_leaves_nothing,
    eight_workers_compare_and_set_one_key_and_lose_no_update,
    an_expiring_lock_refuses_a_second_holder_until_its_ttl,
    a_full_store_refuses_a_write_and_says_why,
    operators_list_keys_with_the_read_token_and_values_and_deletes_with_the_full_one,
);

fn counters_per_key_stay_exact_through_two_kill_9s(backend: &Backend) {
    counters_stay_exact_through_two_kill_9s(backend, "");
}

fn counters_per_key_stay_exact_through_two_kill_9s_with_ordering_by_key(backend: &Backend) {
    counters_stay_exact_through_two_kill_9s(backend, "    ordering: {key: key}\n");
}

fn a_call_that_writes_then_fails_leaves_nothing(backend: &Backend) {
    let daemon = Daemon::with_yaml(&pipeline(
        "    state: true\n    retry: {max_attempts: 2, backoff: {initial: 10ms, max: 20ms}}\n",
    ))
    .on(backend)
    .start();
    daemon.publish(
        "in",
        &[
            Msg::new("m-retry", "retry").key("a"),
            Msg::new("m-reject", "reject").key("b"),
            Msg::new("m-trap", "trap").key("c"),
        ],
    );
    daemon.wait_until("three dead letters", LONG, |d| d.depth("st.count.dlq") >= 3);
    let dead = daemon.read_all("st.count.dlq");
    let kinds: BTreeSet<&str> = dead
        .iter()
        .filter_map(|m| header(m, "sluice-dlq-kind"))
        .collect();
    assert_eq!(kinds, BTreeSet::from(["retry", "rejected", "trap"]));
    daemon.publish("in", &[Msg::new("m-list", "list left/")]);
    daemon.wait_until("the listing", LONG, |d| d.depth("out") >= 1);
    assert_eq!(
        payloads(&daemon.read_all("out")),
        vec![String::new()],
        "a failed call's write was kept"
    );
}

fn eight_workers_compare_and_set_one_key_and_lose_no_update(backend: &Backend) {
    let daemon = Daemon::with_yaml(&pipeline(
        "    state: true\n    concurrency: 8\n    config: {sleep_ms: 2}\n",
    ))
    .on(backend)
    .start();
    let n = 400;
    let messages: Vec<Msg> = (0..n)
        .map(|i| Msg::new(format!("c{i}"), "cas-inc"))
        .collect();
    daemon.publish("in", &messages);
    daemon.wait_until("every output", LONG, |d| d.depth("out") >= n);
    std::thread::sleep(Duration::from_millis(300));
    let out = payloads(&daemon.read_all("out"));
    let values: BTreeSet<u64> = out.iter().map(|v| v.parse().expect("a number")).collect();
    assert_eq!(out.len(), n, "one output each");
    assert_eq!(
        values,
        (1..=n as u64).collect::<BTreeSet<_>>(),
        "each value once: two calls that read the same value both committed"
    );
    let conflicts = processed(&daemon, "state-conflict");
    eprintln!("state conflicts: {conflicts}");
    assert!(conflicts > 0, "eight overlapping workers never conflicted");
    assert_eq!(daemon.depth("st.count.dlq"), 0, "a conflict spent attempts");
}

fn an_expiring_lock_refuses_a_second_holder_until_its_ttl(backend: &Backend) {
    let daemon = Daemon::with_yaml(&pipeline("    state: true\n"))
        .on(backend)
        .start();
    daemon.publish("in", &[Msg::new("l-a", "lock A 1500")]);
    daemon.wait_until("A's answer", LONG, |d| d.depth("out") >= 1);
    daemon.publish("in", &[Msg::new("l-b0", "lock B 1500")]);
    daemon.wait_until("B's first answer", LONG, |d| d.depth("out") >= 2);
    let out = payloads(&daemon.read_all("out"));
    assert_eq!(out, ["got A", "held"]);
    // B asks again until admitted: the lock has expired by then.
    let mut asked = 1;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = payloads(&daemon.read_all("out"));
        if out.iter().any(|p| p == "got B") {
            assert_eq!(out.iter().filter(|p| *p == "got B").count(), 1);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "B never got the lock: {out:?}"
        );
        if out.len() == asked + 1 {
            daemon.publish("in", &[Msg::new(format!("l-b{asked}"), "lock B 1500")]);
            asked += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn a_full_store_refuses_a_write_and_says_why(backend: &Backend) {
    let daemon = Daemon::with_yaml(&pipeline(
        "    state: {store: small, max_bytes: 1KiB}\n    retry: {max_attempts: 1}\n",
    ))
    .on(backend)
    .start();
    daemon.publish("in", &[Msg::new("f1", "fill 600")]);
    daemon.wait_until("the first fill", LONG, |d| d.depth("out") >= 1);
    daemon.publish("in", &[Msg::new("f2", "fill 600")]);
    daemon.wait_until("the second fill refused", LONG, |d| {
        d.depth("st.count.dlq") >= 1
    });
    let dead = daemon.read_all("st.count.dlq");
    let reason = header(&dead[0], "sluice-dlq-error").unwrap_or_default();
    assert!(
        reason.contains("store-full")
            && reason.contains("st/small")
            && reason.contains("max_bytes"),
        "{reason}"
    );
    assert_eq!(payloads(&daemon.read_all("out")), ["filled"]);
}

#[test]
fn a_stage_without_state_refuses_a_plugin_that_imports_state() {
    let dir = tempfile::tempdir().expect("dir");
    let file = write_pipeline(dir.path(), "st", &pipeline(""));
    let validated = Command::new(sluice_bin())
        .arg("validate")
        .arg(&file)
        .output()
        .expect("sluice validate");
    let said = String::from_utf8_lossy(&validated.stderr).into_owned()
        + &String::from_utf8_lossy(&validated.stdout);
    assert!(!validated.status.success(), "{said}");
    let at = format!("{}:8:13", file.display());
    assert!(
        said.contains(&at)
            && said.contains("sluice:plugin/state@0.2.0")
            && said.contains("state: true"),
        "validate says where and why (`{at}`):\n{said}"
    );
}

fn operators_list_keys_with_the_read_token_and_values_and_deletes_with_the_full_one(
    backend: &Backend,
) {
    const FULL: &str = "full-token-state-6b1f";
    const READ: &str = "read-token-state-02ac";
    let daemon = Daemon::with_yaml(&pipeline("    state: true\n"))
        .envs([
            ("SLUICE_ADMIN_TOKEN", FULL),
            ("SLUICE_ADMIN_READ_TOKEN", READ),
        ])
        .on(backend)
        .start();
    daemon.publish(
        "in",
        &[
            Msg::new("a1", "inc").key("a"),
            Msg::new("a2", "inc").key("a"),
            Msg::new("a3", "inc").key("a"),
            Msg::new("b1", "inc").key("b"),
        ],
    );
    daemon.wait_until("four outputs", LONG, |d| d.depth("out") >= 4);
    let read = [("SLUICE_ADMIN_READ_TOKEN", READ)];
    let full = [("SLUICE_ADMIN_TOKEN", FULL)];
    let text = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    };

    let listed = daemon.cli(&["state", "list", "st/count", "--prefix", "count/"], &read);
    let said = text(&listed);
    assert!(listed.status.success(), "{said}");
    assert!(
        said.contains("store st/count:") && said.contains("count/a") && said.contains("count/b"),
        "{said}"
    );
    assert!(
        !said.contains("seen/"),
        "the prefix was not applied: {said}"
    );
    // `count/a` holds "3": 7 + 1 bytes.
    assert!(
        said.lines()
            .any(|l| l.starts_with("count/a") && l.split_whitespace().nth(1) == Some("8")),
        "{said}"
    );

    let refused = daemon.cli(&["state", "get", "st/count", "count/a"], &read);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("not its values"),
        "{}",
        text(&refused)
    );

    let got = daemon.cli(&["state", "get", "st/count", "count/a"], &full);
    assert!(got.status.success(), "{}", text(&got));
    assert_eq!(String::from_utf8_lossy(&got.stdout), "3");

    let deleted = daemon.cli(&["state", "delete", "st/count", "count/a"], &full);
    assert!(deleted.status.success(), "{}", text(&deleted));
    assert!(text(&deleted).contains("deleted"), "{}", text(&deleted));
    let gone = daemon.cli(&["state", "get", "st/count", "count/a"], &full);
    assert!(!gone.status.success(), "{}", text(&gone));
    // The handler starts the counter again.
    daemon.publish("in", &[Msg::new("a4", "inc").key("a")]);
    daemon.wait_until("the fifth output", LONG, |d| d.depth("out") >= 5);
    assert!(payloads(&daemon.read_all("out")).contains(&"a 1".to_owned()));
    // A stage without `state:` has no store to show.
    let none = daemon.cli(&["state", "list", "st/nope"], &read);
    assert!(!none.status.success());
}

#[test]
fn a_timer_stage_schedules_its_own_delayed_work_and_an_undelayed_emit_to_itself_is_dead_lettered() {
    let yaml = format!(
        r#"
name: st
topics: [in, out]
shutdown_timeout: 5s
stages:
  - name: count
    subscribe: in
    plugin: {plugin}
    publish: [out]
    state: true
    timers: true
    config: {{self: in, delay_ms: 300}}
"#,
        plugin = plugin("stateful"),
    );
    let daemon = Daemon::with_yaml(&yaml).start();
    let began = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let keys = ["a", "b", "c", "d", "e"];
    let mut messages: Vec<Msg> = keys
        .iter()
        .map(|k| Msg::new(format!("t-{k}"), "tick 3").key(*k))
        .collect();
    messages.push(Msg::new("t-now", "tick-now").key("z"));
    daemon.publish("in", &messages);

    daemon.wait_until("every timer's end", LONG, |d| d.depth("out") >= 5);
    let out = daemon.read_all("out");
    let mut done: Vec<String> = payloads(&out);
    done.sort();
    assert_eq!(
        done,
        keys.iter()
            .map(|k| format!("done {k} 4"))
            .collect::<Vec<_>>(),
        "each key ticks four times (the first call and three timers), once each"
    );
    for m in &out {
        let entered = m["published_at"].as_u64().expect("published_at");
        assert!(
            entered >= began + 900,
            "three 300 ms timers ended {} ms after the start: {m}",
            entered.saturating_sub(began)
        );
    }

    daemon.wait_until("the undelayed emit's dead letter", LONG, |d| {
        d.depth("st.count.dlq") >= 1
    });
    let dead = daemon.read_all("st.count.dlq");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        header(&dead[0], "sluice-dlq-kind"),
        Some("undeclared-topic")
    );
    let reason = header(&dead[0], "sluice-dlq-error").unwrap_or_default();
    assert!(
        reason.contains("own input") && reason.contains("without a delay"),
        "{reason}"
    );
    // Nothing of the refused call reached the topic or the store.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(daemon.depth("out"), 5);
}

#[test]
fn a_stage_that_publishes_to_its_own_input_needs_timers() {
    let dir = tempfile::tempdir().expect("dir");
    let yaml = pipeline("    state: true\n").replace("publish: [out]", "publish: [out, in]");
    let file = write_pipeline(dir.path(), "loop", &yaml);
    let out = Command::new(sluice_bin())
        .arg("validate")
        .arg(&file)
        .output()
        .expect("validate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("its own input"), "{stderr}");
    assert!(stderr.contains("timers: true"), "{stderr}");
    assert!(
        stderr.contains(":9:"),
        "the position of `publish`: {stderr}"
    );

    let yaml = pipeline("    state: true\n    timers: true\n")
        .replace("publish: [out]", "publish: [out, in]");
    let file = write_pipeline(dir.path(), "timers", &yaml);
    let out = Command::new(sluice_bin())
        .arg("validate")
        .arg(&file)
        .output()
        .expect("validate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `sluice data check` reads a store's state with everything else, and
/// `data salvage` carries it into the new directory: the counters a
/// daemon on the salvaged copy reads are the ones the first one wrote.
#[test]
fn data_check_and_salvage_keep_the_state() {
    let dir = tempfile::tempdir().expect("dir");
    let file = write_pipeline(dir.path(), "st", &pipeline("    state: true\n"));
    let data = dir.path().join("data");
    let mut daemon = Daemon::start(&[&file], &data);
    let incs: Vec<Msg> = (0..30)
        .map(|i| Msg::new(format!("i{i}"), "inc").key(format!("k{}", i % 3)))
        .collect();
    daemon.publish("in", &incs);
    daemon.wait_until("every increment", LONG, |d| d.depth("out") >= 30);
    let (status, _) = daemon.sigterm();
    assert!(status.success());

    let d = data.display().to_string();
    let checked = sluice_tests::sluice_to_exit(&["data", "check", "--data-dir", &d]);
    let said = String::from_utf8_lossy(&checked.stdout).into_owned()
        + &String::from_utf8_lossy(&checked.stderr);
    assert_eq!(checked.status.code(), Some(0), "{said}");
    assert!(said.contains("ok:"), "{said}");

    let to = dir.path().join("salvaged");
    let salvaged = sluice_tests::sluice_to_exit(&[
        "data",
        "salvage",
        "--data-dir",
        &d,
        "--to",
        &to.display().to_string(),
    ]);
    assert_eq!(
        salvaged.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&salvaged.stdout),
        String::from_utf8_lossy(&salvaged.stderr)
    );
    let daemon = Daemon::start(&[&file], &to);
    let gets: Vec<Msg> = (0..3)
        .map(|k| Msg::new(format!("g{k}"), format!("get k{k}")))
        .collect();
    daemon.publish("in", &gets);
    daemon.wait_until("the counters", LONG, |d| d.depth("out") >= 33);
    let out = payloads(&daemon.read_all("out"));
    for k in 0..3 {
        assert!(
            out.contains(&format!("k{k}=10")),
            "k{k} is not 10 on the salvaged copy: {out:?}"
        );
    }
}

/// A dead letter names the state keys its last attempt read, and `dlq show
/// --as-case` turns it into a case that starts from their values: with
/// the full token. The read token gets the keys without the values.
#[test]
fn a_dead_letters_case_starts_from_the_state_its_handler_read() {
    const FULL: &str = "full-token-case-77a1";
    const READ: &str = "read-token-case-3c90";
    let daemon = Daemon::with_yaml(&pipeline("    state: true\n"))
        .envs([
            ("SLUICE_ADMIN_TOKEN", FULL),
            ("SLUICE_ADMIN_READ_TOKEN", READ),
        ])
        .start();
    daemon.publish("in", &[Msg::new("a1", "inc").key("a")]);
    daemon.wait_until("the increment", LONG, |d| d.depth("out") >= 1);
    daemon.publish("in", &[Msg::new("r1", "read-reject count/a count/nobody")]);
    daemon.wait_until("the dead letter", LONG, |d| d.depth("st.count.dlq") >= 1);
    let dead = daemon.read_all("st.count.dlq");
    let named = header(&dead[0], "sluice-dlq-state-read").unwrap_or_default();
    assert_eq!(named, r#"["count/a","count/nobody"]"#, "{}", dead[0]);
    let seq = dead[0]["seq"].as_u64().expect("seq");
    let seq = seq.to_string();
    let text = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    };

    let full = daemon.cli(
        &["dlq", "show", "st/count", &seq, "--as-case"],
        &[("SLUICE_ADMIN_TOKEN", FULL)],
    );
    let case = text(&full);
    assert!(full.status.success(), "{case}");
    assert!(
        case.contains("    state:\n      \"count/a\": \"1\"\n"),
        "{case}"
    );
    assert!(case.contains("# \"count/nobody\": (absent"), "{case}");
    assert!(!case.contains("sluice-dlq-state-read"), "{case}");

    let read = daemon.cli(
        &["dlq", "show", "st/count", &seq, "--as-case"],
        &[("SLUICE_ADMIN_TOKEN", READ)],
    );
    let case = text(&read);
    assert!(read.status.success(), "{case}");
    assert!(case.contains("values left out"), "{case}");
    assert!(
        case.contains("# \"count/a\": (absent, not text, or withheld)"),
        "{case}"
    );
    assert!(
        !case.contains("\"count/a\": \"1\""),
        "the read token saw a value: {case}"
    );
}

/// A reload that restarts a stage with state (its concurrency changed)
/// keeps its store: the counters carry on from where they were.
#[test]
fn a_reload_that_restarts_a_stage_keeps_its_state() {
    let dir = tempfile::tempdir().expect("dir");
    let file = write_pipeline(dir.path(), "st", &pipeline("    state: true\n"));
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    let incs = |from: usize| -> Vec<Msg> {
        (from..from + 10)
            .map(|i| Msg::new(format!("i{i}"), "inc").key("a"))
            .collect()
    };
    daemon.publish("in", &incs(0));
    daemon.wait_until("ten increments", LONG, |d| d.depth("out") >= 10);

    write_pipeline(
        dir.path(),
        "st",
        &pipeline("    state: true\n    concurrency: 3\n"),
    );
    let reloaded = reqwest::blocking::Client::new()
        .post(daemon.url("/v1/reload"))
        .json(&json!({}))
        .timeout(LONG)
        .send()
        .expect("POST /v1/reload");
    assert_eq!(reloaded.status().as_u16(), 200);
    let report: Value = reloaded.json().expect("a JSON report");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(
        report["changes"]["stages_restarted"][0]["name"], "st/count",
        "the stage was restarted: {report}"
    );

    daemon.publish("in", &incs(10));
    daemon.wait_until("ten more", LONG, |d| d.depth("out") >= 20);
    daemon.publish("in", &[Msg::new("g", "get a")]);
    daemon.wait_until("the counter", LONG, |d| d.depth("out") >= 21);
    let out = payloads(&daemon.read_all("out"));
    assert!(
        out.contains(&"a=20".to_owned()),
        "the counter restarted with the stage: {out:?}"
    );
}
