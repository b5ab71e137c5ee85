//! W3C Trace Context through a pipeline, against the real `sluice run`
//! binary on both brokers:
//!
//! - a `traceparent` (and `tracestate`) request header on ingest becomes
//!   the message's own; an invalid one is ignored, not refused;
//! - it goes on through three stages: one whose handler copies its input's
//!   headers (`uppercase`), one whose handler drops them (`chatty`: the
//!   engine carries the context on), and one that rejects (`fail`);
//! - the dead letter keeps it: `trace_id` in the API's list and `show`,
//!   and in `sluice dlq list` and `sluice dlq show`.

use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{Backend, Daemon, TRACE_ID, header, on_both_brokers, plugin};

/// The example of the W3C recommendation.
const PARENT: &str = sluice_tests::TRACEPARENT;
const STATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";

/// `traced`: `in` -> first (uppercase, copies headers) -> `mid` -> second
/// (chatty, drops headers) -> `late` -> third (fail: reject) -> DLQ.
fn yaml() -> String {
    format!(
        r#"
name: traced
topics: [in, mid, late, done]
stages:
  - name: first
    subscribe: in
    plugin: {uppercase}
    publish: [mid]
  - name: second
    subscribe: mid
    plugin: {chatty}
    config: {{lines: 0}}
    publish: [late]
  - name: third
    subscribe: late
    plugin: {fail}
    config: {{mode: reject, reason: "traced to the end"}}
    publish: [done]
"#,
        uppercase = plugin("uppercase"),
        chatty = plugin("chatty"),
        fail = plugin("fail"),
    )
}

/// The stages, in the order a message meets them.
const STAGES: [&str; 3] = ["first", "second", "third"];

/// One single-message POST with `headers`.
fn post(daemon: &Daemon, id: &str, headers: &[(&str, &str)]) {
    let mut request = reqwest::blocking::Client::new()
        .post(daemon.url("/v1/topics/in/messages"))
        .header("idempotency-key", id)
        .body(format!("payload of {id}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().expect("publish");
    assert_eq!(response.status(), 202, "{id}: {:?}", response.text());
}

/// The message of `topic` whose payload ends with `id` (any case).
fn find(daemon: &Daemon, topic: &str, id: &str) -> Value {
    daemon
        .read_all(topic)
        .into_iter()
        .find(|m| {
            m["payload"]
                .as_str()
                .is_some_and(|p| p.to_lowercase().ends_with(id))
        })
        .unwrap_or_else(|| panic!("no message for {id} in {topic}"))
}

fn context_travels_through_every_stage_into_the_dlq(backend: &Backend) {
    let daemon = Daemon::with_yaml(&yaml()).on(backend).start();
    // Completed messages leave their topic: each stage is held paused until
    // the topic before it has been looked at.
    for stage in STAGES {
        daemon.post(&format!("/v1/stages/traced/{stage}/pause"), json!({}));
    }
    post(
        &daemon,
        "t1",
        &[("traceparent", PARENT), ("tracestate", STATE)],
    );
    post(
        &daemon,
        "t2",
        &[("traceparent", "00-not-a-trace-01"), ("tracestate", "a=b")],
    );
    for (topic, stage) in ["in", "mid", "late"].into_iter().zip(STAGES) {
        daemon.wait_until(topic, Duration::from_secs(120), |d| d.depth(topic) == 2);
        let traced = find(&daemon, topic, "t1");
        assert_eq!(
            header(&traced, "traceparent"),
            Some(PARENT),
            "{topic}: {traced}"
        );
        assert_eq!(
            header(&traced, "tracestate"),
            Some(STATE),
            "{topic}: {traced}"
        );
        let untraced = find(&daemon, topic, "t2");
        assert_eq!(
            header(&untraced, "traceparent"),
            None,
            "{topic}: {untraced}"
        );
        assert_eq!(header(&untraced, "tracestate"), None, "{topic}: {untraced}");
        daemon.post(&format!("/v1/stages/traced/{stage}/resume"), json!({}));
    }
    daemon.wait_until("both dead-lettered", Duration::from_secs(120), |d| {
        d.depth("traced.third.dlq") == 2
    });

    let list = daemon.get("/v1/dlq/traced/third");
    let entries = list["entries"].as_array().expect("entries");
    let entry = |id: &str| {
        entries
            .iter()
            .find(|e| {
                e["payload_preview"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(id))
            })
            .unwrap_or_else(|| panic!("no DLQ entry for {id}: {list}"))
    };
    assert_eq!(entry("T1")["trace_id"], TRACE_ID, "{list}");
    assert!(entry("T2").get("trace_id").is_none(), "{list}");
    let seq = entry("T1")["seq"].as_u64().expect("seq");

    let shown = daemon.get(&format!("/v1/dlq/traced/third/{seq}"));
    assert_eq!(shown["trace_id"], TRACE_ID, "{shown}");
    assert_eq!(header(&shown, "traceparent"), Some(PARENT), "{shown}");

    let cli = daemon.cli(&["dlq", "show", "traced/third", &seq.to_string()], &[]);
    assert!(cli.status.success(), "{cli:?}");
    let printed: Value = serde_json::from_slice(&cli.stdout).expect("show prints JSON");
    assert_eq!(printed["trace_id"], TRACE_ID, "{printed}");

    let cli = daemon.cli(&["dlq", "list", "traced/third"], &[]);
    assert!(cli.status.success(), "{cli:?}");
    let table = String::from_utf8_lossy(&cli.stdout);
    assert!(
        table.lines().next().is_some_and(|h| h.contains("TRACE")),
        "{table}"
    );
    assert!(table.contains(TRACE_ID), "{table}");
}

on_both_brokers!(context_travels_through_every_stage_into_the_dlq);
