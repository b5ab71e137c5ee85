//! Handler output a broker cannot take, end to end: the real `sluice run`
//! binary, real plugins, a real nats-server.
//!
//! - an emit with a header NATS cannot carry (a line break in its value):
//!   dead-lettered as `rejected` naming the header, on both brokers alike,
//!   and the daemon goes on settling (async-nats would panic on it);
//! - a reject reason of several lines, which becomes the dead letter's
//!   `sluice-dlq-error` header: joined on one line, on both brokers;
//! - an emit over the NATS server's `max_payload`, without a claim check:
//!   dead-lettered on its first attempt as `output-too-large`, since no
//!   retry can make it fit; the same above a claim check's `max_payload`.

use std::time::Duration;

use serde_json::Value;
use sluice_tests::{Backend, Daemon, header, on_both_brokers, plugin, write_pipeline};

const LONG: Duration = Duration::from_secs(120);
/// What `bigout` emits: twice the NATS server's default `max_payload`.
const TWO_MIB: usize = 2 << 20;

/// The value of metric `name` summed over the series of stage `stage`.
fn stage_metric(daemon: &Daemon, name: &str, stage: &str) -> u64 {
    let text = reqwest::blocking::get(format!("{}/metrics", daemon.admin_url()))
        .and_then(|r| r.text())
        .expect("metrics");
    text.lines()
        .filter(|line| line.starts_with(name) && line.contains(&format!("stage=\"{stage}\"")))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The one entry of `dlq`, once there is one.
fn the_dead_letter(daemon: &Daemon, dlq: &str) -> Value {
    daemon.wait_until("a dead letter", LONG, |d| d.depth(dlq) >= 1);
    let entries = daemon.read_all(dlq);
    assert_eq!(entries.len(), 1, "{entries:#?}");
    entries[0].clone()
}

/// The daemon wrote no panic to its log (a panicking task would be gone
/// while the process lives on).
fn assert_no_panic(daemon: &Daemon) {
    let log = daemon.log();
    assert!(!log.contains("panicked"), "the daemon panicked:\n{log}");
}

/// Stage `bad` emits a header whose value holds a line break; stage `good`
/// (same input) emits plain ones. Each bad emit is dead-lettered at once
/// as `rejected`; the good outputs keep flowing after it, which on NATS
/// shows the settle path survived.
fn an_emit_with_a_header_nats_cannot_carry_is_dead_lettered(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let stamp = plugin("stamp");
    let yaml = format!(
        r#"name: hdr
topics: [in, out]
stages:
  - name: bad
    subscribe: in
    plugin: {stamp}
    publish: [out]
    config: {{extra_header: x-note, extra_value: "two\nlines"}}
    retry: {{max_attempts: 3, backoff: {{initial: 50ms, max: 100ms}}}}
  - name: good
    subscribe: in
    plugin: {stamp}
    publish: [out]
"#
    );
    let file = write_pipeline(dir.path(), "hdr", &yaml);
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));

    daemon.publish_bytes("in", "m-1", b"first");
    let entry = the_dead_letter(&daemon, "hdr.bad.dlq");
    assert_eq!(
        header(&entry, "sluice-dlq-kind"),
        Some("rejected"),
        "{entry}"
    );
    assert_eq!(header(&entry, "sluice-dlq-attempts"), Some("1"), "{entry}");
    let error = header(&entry, "sluice-dlq-error").unwrap_or_default();
    assert!(
        error.contains("`x-note`") && error.contains("line break") && error.contains("NATS"),
        "{error}"
    );
    assert_eq!(entry["payload"].as_str(), Some("first"), "{entry}");

    // The daemon goes on: another message is settled by both stages.
    daemon.publish_bytes("in", "m-2", b"second");
    daemon.wait_until("the second dead letter", LONG, |d| {
        d.depth("hdr.bad.dlq") >= 2
    });
    daemon.wait_until("both good outputs", LONG, |d| d.depth("out") >= 2);
    let out = daemon.read_all("out");
    assert_eq!(out.len(), 2, "{out:#?}");
    assert!(
        out.iter().all(|m| header(m, "x-note").is_none()),
        "{out:#?}"
    );
    // Permanent: the handler ran once per message, never retried.
    assert_eq!(
        stage_metric(&daemon, "sluice_handler_duration_seconds_count", "bad"),
        2
    );
    assert_no_panic(&daemon);
}

/// A handler's reject reason goes into the dead letter's
/// `sluice-dlq-error` header, so a reason of several lines must still make
/// a header NATS can carry: its lines are joined on one, on both brokers.
fn a_reject_reason_of_several_lines_is_dead_lettered_on_one_line(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"name: why
topics: [in]
stages:
  - name: reject
    subscribe: in
    plugin: {fail}
    config: {{mode: reject, reason: "first line\nsecond line\r\nthird line"}}
"#,
        fail = plugin("fail")
    );
    let file = write_pipeline(dir.path(), "why", &yaml);
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));

    daemon.publish_bytes("in", "m-1", b"first");
    let entry = the_dead_letter(&daemon, "why.reject.dlq");
    assert_eq!(
        header(&entry, "sluice-dlq-kind"),
        Some("rejected"),
        "{entry}"
    );
    assert_eq!(
        header(&entry, "sluice-dlq-error"),
        Some("first line / second line / third line"),
        "{entry}"
    );
    // And the daemon goes on dead-lettering.
    daemon.publish_bytes("in", "m-2", b"second");
    daemon.wait_until("the second dead letter", LONG, |d| {
        d.depth("why.reject.dlq") >= 2
    });
    assert_no_panic(&daemon);
}

on_both_brokers!(
    an_emit_with_a_header_nats_cannot_carry_is_dead_lettered,
    a_reject_reason_of_several_lines_is_dead_lettered_on_one_line,
);

/// `bigout` emits 2 MiB through a limit of 1 MiB (`claim`: the pipeline's
/// `claim_check:` line, or none). That can never succeed, so the message
/// is dead-lettered on its first attempt as `output-too-large`, with a
/// reason naming the size, the limit and the remedy, and the handler is
/// not run again.
fn an_emit_over_a_limit_is_dead_lettered_at_once(backend: &Backend, claim: &str) {
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"name: big
{claim}
topics: [in, out]
stages:
  - name: emit
    subscribe: in
    plugin: {bigout}
    publish: [out]
    config: {{mode: bytes, bytes: {TWO_MIB}}}
    retry: {{max_attempts: 3, backoff: {{initial: 50ms, max: 100ms}}}}
"#,
        bigout = plugin("bigout")
    );
    let file = write_pipeline(dir.path(), "big", &yaml);
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));

    daemon.publish_bytes("in", "m-1", b"go");
    let entry = the_dead_letter(&daemon, "big.emit.dlq");
    assert_eq!(
        header(&entry, "sluice-dlq-kind"),
        Some("output-too-large"),
        "{entry}"
    );
    assert_eq!(header(&entry, "sluice-dlq-attempts"), Some("1"), "{entry}");
    let error = header(&entry, "sluice-dlq-error").unwrap_or_default();
    assert!(error.contains(&TWO_MIB.to_string()), "the size: {error}");
    assert!(
        error.contains(&(1u32 << 20).to_string()),
        "the limit: {error}"
    );
    assert!(error.contains("max_payload"), "the limit's name: {error}");
    assert!(error.contains("claim_check"), "the remedy: {error}");
    assert_eq!(daemon.depth("out"), 0);
    assert_eq!(
        stage_metric(&daemon, "sluice_handler_duration_seconds_count", "emit"),
        1,
        "the handler must not be retried"
    );
    assert_no_panic(&daemon);
}

/// Without a claim check, on NATS: the server takes at most 1 MiB (its
/// default `max_payload`).
#[test]
fn an_emit_over_the_nats_max_payload_is_dead_lettered_at_once() {
    an_emit_over_a_limit_is_dead_lettered_at_once(&Backend::nats(), "");
}

/// Above a claim check's `max_payload`, which the claim check refuses
/// before any broker sees the message.
#[test]
fn an_emit_over_the_claim_check_max_payload_is_dead_lettered_at_once() {
    an_emit_over_a_limit_is_dead_lettered_at_once(
        &Backend::embedded(),
        "claim_check: {store: file://claims, threshold: 256KiB, max_payload: 1MiB}",
    );
}
