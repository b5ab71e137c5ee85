//! Trace export over OTLP, against the real `sluice run` binary and an OTLP
//! receiver the test starts (`tests/otlp/receiver.py`, built on the
//! official `opentelemetry-proto` types: no collector binary can be had
//! here):
//!
//! - one message's spans form one trace across three stages, each attempt
//!   a span (a retried one a span per attempt), each stage's the child of
//!   the one before, the first the child of the producer's `traceparent`;
//!   the dead letter sits in the same trace, under its last attempt;
//! - a message that came without a context starts a trace of its own,
//!   which its dead letter keeps all the same;
//! - a batch call is one span, linked to each of its messages' contexts;
//! - an attempt's span ends with its settle, not after the retry's pause;
//! - a reload is a span of its own (made through the `tracing` bridge);
//! - a collector that is down loses spans, never messages; its outage is
//!   logged once (not at every export), and so is its recovery;
//! - a setting export cannot honour is refused before anything starts.

use std::time::Duration;

use serde_json::{Value, json};
use sha2::Digest as _;
use sluice_tests::otlp::OtlpReceiver;
use sluice_tests::{Daemon, Msg, TRACE_ID, header, plugin};

/// The producer's span: the example of the W3C recommendation.
const PARENT: &str = sluice_tests::TRACEPARENT;
const PARENT_SPAN: &str = "00f067aa0ba902b7";
const STATE: &str = sluice_tests::TRACESTATE;

/// OTLP's `SPAN_KIND_CONSUMER` and `STATUS_CODE_ERROR`.
const CONSUMER: u64 = 5;
const ERROR: u64 = 2;

/// A span's attribute.
fn attr<'a>(span: &'a Value, name: &str) -> &'a Value {
    &span["attributes"][name]
}

/// The hex SHA-256 of a plugin file: what its spans name.
fn sha256_of(path: &str) -> String {
    hex::encode(sha2::Sha256::digest(
        std::fs::read(path).expect("read plugin"),
    ))
}

#[test]
fn one_message_is_one_trace_across_three_stages_and_its_dead_letter() {
    let (uppercase, chatty, fail) = (plugin("uppercase"), plugin("chatty"), plugin("fail"));
    let yaml = format!(
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
    publish: [done]
    retry: {{max_attempts: 2, backoff: {{initial: 10ms}}}}
"#
    );
    let receiver = OtlpReceiver::start();
    let daemon = Daemon::with_yaml(&yaml).envs(receiver.env()).start();
    for (id, headers) in [
        ("t1", vec![("traceparent", PARENT), ("tracestate", STATE)]),
        ("t2", vec![]),
    ] {
        let mut request = reqwest::blocking::Client::new()
            .post(daemon.url("/v1/topics/in/messages"))
            .header("idempotency-key", id)
            .body(format!("payload of {id}"));
        for (name, value) in headers {
            request = request.header(name, value);
        }
        assert_eq!(request.send().expect("publish").status(), 202);
    }
    daemon.wait_until("both dead-lettered", Duration::from_secs(120), |d| {
        d.depth("traced.third.dlq") == 2
    });
    let spans = receiver.wait_for("the last attempts' spans", |spans| {
        spans
            .iter()
            .filter(|s| attr(s, "sluice.outcome") == "dead-lettered")
            .count()
            == 2
    });
    assert_eq!(
        spans.len(),
        8,
        "two messages, four attempts each: {spans:#?}"
    );

    let entries = daemon.get("/v1/dlq/traced/third");
    let entry = |id: &str| -> Value {
        let list = entries["entries"].as_array().expect("entries");
        let found = list
            .iter()
            .find(|e| {
                e["payload_preview"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(id))
            })
            .unwrap_or_else(|| panic!("no DLQ entry for {id}: {entries}"));
        daemon.get(&format!("/v1/dlq/traced/third/{}", found["seq"]))
    };

    let sha = |stage: &str| match stage {
        "first" => sha256_of(&uppercase),
        "second" => sha256_of(&chatty),
        _ => sha256_of(&fail),
    };
    // Each message's spans, checked the same way; t1's trace is its
    // producer's, t2's one its first attempt started.
    for (id, trace_id) in [("T1", Some(TRACE_ID)), ("T2", None)] {
        let first = spans
            .iter()
            .find(|s| {
                attr(s, "sluice.stage") == "first"
                    && (s["trace_id"] == TRACE_ID) == trace_id.is_some()
            })
            .unwrap_or_else(|| panic!("{id}: no span of the first stage: {spans:#?}"));
        let trace = first["trace_id"].as_str().expect("trace id").to_owned();
        let mine: Vec<&Value> = spans.iter().filter(|s| s["trace_id"] == trace).collect();
        assert_eq!(mine.len(), 4, "{id}: one trace of four spans: {mine:#?}");
        let of = |stage: &str| -> Vec<&Value> {
            let mut of: Vec<&Value> = mine
                .iter()
                .copied()
                .filter(|s| attr(s, "sluice.stage") == stage)
                .collect();
            of.sort_by_key(|s| attr(s, "sluice.attempt").as_i64());
            of
        };
        let (first, second, third) = (of("first"), of("second"), of("third"));
        assert_eq!(
            (first.len(), second.len(), third.len()),
            (1, 1, 2),
            "{mine:#?}"
        );
        // The chain: producer -> first -> second -> each try of third.
        let expected_root = if trace_id.is_some() { PARENT_SPAN } else { "" };
        assert_eq!(first[0]["parent_span_id"], expected_root, "{id}: {mine:#?}");
        assert_eq!(
            second[0]["parent_span_id"], first[0]["span_id"],
            "{mine:#?}"
        );
        for attempt in &third {
            assert_eq!(attempt["parent_span_id"], second[0]["span_id"], "{mine:#?}");
        }
        for (stage, span, attempt, outcome) in [
            ("first", first[0], 1, "ok"),
            ("second", second[0], 1, "ok"),
            ("third", third[0], 1, "retry"),
            ("third", third[1], 2, "dead-lettered"),
        ] {
            assert_eq!(span["name"], format!("process traced/{stage}"), "{span}");
            assert_eq!(span["kind"], CONSUMER, "{span}");
            assert_eq!(span["service"], "sluice", "{span}");
            assert_eq!(attr(span, "sluice.pipeline"), "traced", "{span}");
            assert_eq!(attr(span, "sluice.attempt"), attempt, "{span}");
            assert_eq!(attr(span, "sluice.outcome"), outcome, "{span}");
            assert_eq!(
                attr(span, "sluice.plugin.sha256"),
                sha(stage).as_str(),
                "{span}"
            );
            assert_eq!(
                attr(span, "messaging.destination.name"),
                span_topic(stage),
                "{span}"
            );
            let failed = outcome != "ok";
            assert_eq!(span["status"]["code"] == ERROR, failed, "{span}");
        }
        // The dead letter is in the trace, under the attempt that gave up.
        let shown = entry(id);
        assert_eq!(shown["trace_id"], trace.as_str(), "{shown}");
        let parent = header(&shown, "traceparent").expect("the dead letter's traceparent");
        assert_eq!(
            parent,
            format!(
                "00-{trace}-{}-01",
                third[1]["span_id"].as_str().unwrap_or("")
            ),
            "{shown}"
        );
        if trace_id.is_some() {
            // The producer's trace state goes along.
            assert_eq!(header(&shown, "tracestate"), Some(STATE), "{shown}");
        }
    }
}

/// The topic each stage of `traced` reads.
fn span_topic(stage: &str) -> &'static str {
    match stage {
        "first" => "in",
        "second" => "mid",
        _ => "late",
    }
}

#[test]
fn a_batch_call_is_one_span_linked_to_each_of_its_messages() {
    let yaml = format!(
        r#"
name: batched
topics: [in, out]
stages:
  - name: upper
    subscribe: in
    plugin: {}
    publish: [out]
    batch: {{max: 4, wait: 200ms}}
"#,
        plugin("identity-batch")
    );
    let receiver = OtlpReceiver::start();
    let daemon = Daemon::with_yaml(&yaml).envs(receiver.env()).start();
    // Held paused until all four wait, so that one call takes them.
    daemon.post("/v1/stages/batched/upper/pause", json!({}));
    let parents: Vec<String> = (1..=4)
        .map(|i| format!("00-{:032x}-{:016x}-01", 0xabc0 + i, 0xdef0 + i))
        .collect();
    for (i, parent) in parents.iter().enumerate() {
        let response = reqwest::blocking::Client::new()
            .post(daemon.url("/v1/topics/in/messages"))
            .header("idempotency-key", format!("b{i}"))
            .header("traceparent", parent)
            .body(format!("item {i}"))
            .send()
            .expect("publish");
        assert_eq!(response.status(), 202);
    }
    daemon.post("/v1/stages/batched/upper/resume", json!({}));
    daemon.wait_until("all four out", Duration::from_secs(60), |d| {
        d.depth("out") == 4
    });
    let spans = receiver.wait_for("the batch span", |spans| !spans.is_empty());
    assert_eq!(spans.len(), 1, "one call, one span: {spans:#?}");
    let span = &spans[0];
    assert_eq!(span["name"], "process batched/upper", "{span}");
    assert_eq!(attr(span, "messaging.batch.message_count"), 4, "{span}");
    let mut linked: Vec<String> = span["links"]
        .as_array()
        .expect("links")
        .iter()
        .map(|l| {
            format!(
                "00-{}-{}-01",
                l["trace_id"].as_str().unwrap_or(""),
                l["span_id"].as_str().unwrap_or("")
            )
        })
        .collect();
    linked.sort();
    assert_eq!(linked, parents, "{span}");
    // Each item's output goes on in its own message's trace.
    let mut carried: Vec<String> = daemon
        .read_all("out")
        .iter()
        .filter_map(|m| header(m, "traceparent").map(str::to_owned))
        .collect();
    carried.sort();
    assert_eq!(carried, parents);
}

#[test]
fn a_message_its_producer_did_not_sample_is_not_traced_and_keeps_its_context() {
    let yaml = format!(
        r#"
name: sampled
topics: [in, mid, out]
stages:
  - {{name: one, subscribe: in, plugin: {identity}, publish: [mid]}}
  - {{name: two, subscribe: mid, plugin: {identity}, publish: [out]}}
"#,
        identity = plugin("identity")
    );
    let receiver = OtlpReceiver::start();
    // The SDK's default sampler: the parent's decision stands.
    let daemon = Daemon::with_yaml(&yaml).envs(receiver.env()).start();
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let sampled = "00-0af7651916cd43dd8448eb211c80319d-b7ad6b7169203332-01";
    for (id, parent) in [("not-sampled", unsampled), ("sampled", sampled)] {
        let response = reqwest::blocking::Client::new()
            .post(daemon.url("/v1/topics/in/messages"))
            .header("idempotency-key", id)
            .header("traceparent", parent)
            .body(id)
            .send()
            .expect("publish");
        assert_eq!(response.status(), 202);
    }
    daemon.wait_until("both out", Duration::from_secs(60), |d| d.depth("out") == 2);
    receiver.wait_for("the sampled message's two spans", |spans| spans.len() >= 2);
    // Export runs every 100 ms; a span of the other message would be in
    // by the time the sampled one's second span came, or soon after.
    std::thread::sleep(Duration::from_millis(500));
    let spans = receiver.spans();
    let traces: Vec<&str> = spans
        .iter()
        .map(|s| s["trace_id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        traces, ["0af7651916cd43dd8448eb211c80319d"; 2],
        "only the sampled message is traced: {spans:#?}"
    );
    for message in daemon.read_all("out") {
        let carried = header(&message, "traceparent").expect("a traceparent");
        if message["payload"] == "not-sampled" {
            // Passed on as the producer sent it: no span of ours is in it.
            assert_eq!(carried, unsampled, "{message}");
        } else {
            assert!(
                carried.starts_with("00-0af7651916cd43dd8448eb211c80319d-"),
                "{message}"
            );
            assert_ne!(
                carried, sampled,
                "the stage's span is the parent: {message}"
            );
            assert!(carried.ends_with("-01"), "{message}");
        }
    }
}

#[test]
fn an_attempt_span_ends_with_its_settle_not_after_the_retry_pause() {
    // An ordered stage retries in place: the pause before the next attempt
    // is spent in the same task, after the settle.
    let yaml = format!(
        r#"
name: paced
topics: [in, out]
stages:
  - name: s
    subscribe: in
    plugin: {}
    publish: [out]
    ordering: {{key: key}}
    retry: {{max_attempts: 2, backoff: {{initial: 1s, jitter: 0}}}}
"#,
        plugin("fail")
    );
    let receiver = OtlpReceiver::start();
    let daemon = Daemon::with_yaml(&yaml).envs(receiver.env()).start();
    daemon.publish("in", &[Msg::new("r1", "retried").key("k")]);
    let spans = receiver.wait_for("both attempts' spans", |spans| spans.len() == 2);
    let attempt = |n: i64| {
        spans
            .iter()
            .find(|s| attr(s, "sluice.attempt") == n)
            .unwrap_or_else(|| panic!("no span of attempt {n}: {spans:#?}"))
    };
    let (first, second) = (attempt(1), attempt(2));
    assert_eq!(attr(first, "sluice.outcome"), "retry", "{first}");
    let nanos = |span: &Value, field: &str| {
        span[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{field}: {span}"))
    };
    // The pause (1 s, no jitter) lies between the two spans, whatever the
    // load (a pause is never short): a span that lasted through it would
    // end as the next one starts.
    let gap = nanos(second, "start_ns").saturating_sub(nanos(first, "end_ns"));
    assert!(
        gap >= 900_000_000,
        "the first attempt's span ended {gap} ns before the second began: {spans:#?}"
    );
}

#[test]
fn a_reload_is_a_span_of_its_own() {
    let yaml = format!(
        "name: live\ntopics: [in, out]\nstages:\n  - name: s\n    subscribe: in\n    plugin: {}\n    publish: [out]\n",
        plugin("uppercase")
    );
    let receiver = OtlpReceiver::start();
    let daemon = Daemon::with_yaml(&yaml).envs(receiver.env()).start();
    let report = daemon.post("/v1/reload", json!({}));
    assert_eq!(report["ok"], true, "{report}");
    let spans = receiver.wait_for("the reload's span", |spans| {
        spans.iter().any(|s| s["name"] == "sluice reload")
    });
    let span = spans
        .iter()
        .find(|s| s["name"] == "sluice reload")
        .expect("waited for");
    assert_eq!(attr(span, "sluice.reload.trigger"), "api", "{span}");
    assert_eq!(attr(span, "sluice.reload.ok"), true, "{span}");
    assert_eq!(
        attr(span, "sluice.config.version"),
        &report["version"],
        "{span}"
    );
    assert_eq!(span["service"], "sluice", "{span}");
    assert_ne!(span["status"]["code"], ERROR, "{span}");
}

#[test]
fn a_collector_that_is_down_loses_spans_never_messages() {
    // A port nothing listens on yet: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let yaml = format!(
        "name: dark\ntopics: [in, out]\nstages:\n  - name: s\n    subscribe: in\n    plugin: {}\n    publish: [out]\n",
        plugin("uppercase")
    );
    let daemon = Daemon::with_yaml(&yaml)
        .envs([
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{port}"),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY", "50".into()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "500".into()),
        ])
        .start();
    // In rounds, so that many exports fail, each after its batch.
    for round in 0..4 {
        let messages: Vec<Msg> = (0..50)
            .map(|i| Msg::new(format!("m{round}-{i}"), format!("payload {i}")))
            .collect();
        daemon.publish("in", &messages);
        daemon.wait_until("the round out", Duration::from_secs(120), |d| {
            d.depth("out") == 50 * (round + 1)
        });
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(daemon.readiness().0, "ready");
    // The outage is told once, with where to, not at every export.
    let log = daemon.log();
    let failed = log.matches("trace export failed").count();
    assert_eq!(failed, 1, "one warning for the outage: {log}");
    assert!(log.contains(&format!("127.0.0.1:{port}")), "{log}");
    assert!(
        !log.contains("ExportError"),
        "the SDK's own, at every batch: {log}"
    );

    // The collector comes up: spans arrive, and the recovery is told.
    let receiver = OtlpReceiver::start_on(port);
    daemon.publish("in", &[Msg::new("after", "after the outage")]);
    receiver.wait_for("a span after the outage", |spans| {
        spans
            .iter()
            .any(|s| attr(s, "messaging.message.id") == "after")
    });
    daemon.wait_until("the recovery logged", Duration::from_secs(30), |d| {
        d.log().contains("trace export works again")
    });
}

#[test]
fn a_setting_export_cannot_honour_is_refused_before_anything_starts() {
    let yaml = format!(
        "name: p\ntopics: [in]\nstages:\n  - name: s\n    subscribe: in\n    plugin: {}\n",
        plugin("uppercase")
    );
    for (args, env, says) in [
        (vec!["--otlp", "ftp://127.0.0.1:4318"], vec![], "--otlp"),
        (vec!["--otlp", "127.0.0.1:4318"], vec![], "http://"),
        (
            vec![],
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
            "http/protobuf",
        ),
    ] {
        let exited = Daemon::with_yaml(&yaml)
            .args(&args)
            .envs(env)
            .try_start()
            .err()
            .unwrap_or_else(|| panic!("{args:?} started"));
        assert_eq!(
            exited.status.and_then(|s| s.code()),
            Some(2),
            "{args:?}: {}",
            exited.log
        );
        assert!(exited.log.contains(says), "{args:?}: {}", exited.log);
    }
}
