//! Stage dedup end to end, on both brokers: the real `sluice run` binary,
//! the real `identity` plugin, duplicates published as separate broker
//! messages (distinct ids, one dedup key), and a `kill -9` between the
//! handler and the dedup record.
//!
//! The handler's invocations are counted by the daemon's own
//! `sluice_handler_duration_seconds_count` (one observation per call).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{Backend, Daemon, Msg, header, on_both_brokers, plugin, write_pipeline};

const LONG: Duration = Duration::from_secs(240);
const ORDERS: usize = 1000;
const COPIES: usize = 3;

fn pipeline(dir: &Path) -> std::path::PathBuf {
    let yaml = format!(
        "name: shop\n\
         topics: [orders, receipts]\n\
         stages:\n\
         \x20 - name: once\n\
         \x20   subscribe: orders\n\
         \x20   plugin: {}\n\
         \x20   publish: [receipts]\n\
         \x20   concurrency: 4\n\
         \x20   timeout: 2s\n\
         \x20   ack_wait: 30s\n\
         \x20   retry: {{max_attempts: 5, backoff: {{initial: 100ms, max: 1s}}}}\n\
         \x20   dedup: {{key: json:/order, ttl: 1h, payload_hash: true}}\n",
        plugin("identity")
    );
    write_pipeline(dir, "shop", &yaml)
}

/// `ORDERS` orders, each published `COPIES` times under distinct message
/// ids (so the broker's own duplicate window does not drop them), copies
/// of one order next to each other so they are in flight together.
fn duplicated_orders() -> Vec<Msg> {
    let mut messages = Vec::with_capacity(ORDERS * COPIES);
    for i in 0..ORDERS {
        for copy in 0..COPIES {
            let payload = json!({"order": format!("o{i}"), "amount": i}).to_string();
            messages.push(Msg::new(format!("o{i}-copy{copy}"), payload));
        }
    }
    messages
}

fn order_of(message: &Value) -> String {
    let payload: Value =
        serde_json::from_str(message["payload"].as_str().expect("text payload")).expect("json");
    payload["order"].as_str().expect("order").to_owned()
}

/// A value of the daemon's `/metrics` for the `shop/once` stage.
fn stage_metric(daemon: &Daemon, name: &str, outcome: Option<&str>) -> u64 {
    let text = reqwest::blocking::get(format!("{}/metrics", daemon.base))
        .expect("metrics")
        .text()
        .expect("metrics text");
    text.lines()
        .filter(|line| line.starts_with(name) && line.contains("stage=\"once\""))
        .filter(|line| outcome.is_none_or(|o| line.contains(&format!("outcome=\"{o}\""))))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Every order appears exactly once among the receipts.
fn assert_one_receipt_per_order(receipts: &[Value]) {
    let mut per_order: BTreeMap<String, usize> = BTreeMap::new();
    for receipt in receipts {
        *per_order.entry(order_of(receipt)).or_default() += 1;
    }
    let doubled: Vec<_> = per_order.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.is_empty(),
        "orders with more than one receipt: {doubled:?}"
    );
    assert_eq!(per_order.len(), ORDERS, "orders with a receipt");
    let ids: BTreeSet<&str> = receipts.iter().filter_map(|r| r["id"].as_str()).collect();
    assert_eq!(ids.len(), receipts.len(), "receipt ids are unique");
}

fn duplicates_run_the_handler_once_per_key(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = pipeline(dir.path());
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    daemon.publish("orders", &duplicated_orders());
    // A known key with another payload, and a message without the key.
    daemon.publish(
        "orders",
        &[
            Msg::new(
                "o7-changed",
                json!({"order": "o7", "amount": -1}).to_string(),
            ),
            Msg::new("no-order", json!({"amount": 1}).to_string()),
        ],
    );
    let dlq = "shop.once.dlq";
    daemon.wait_until("receipts and dead letters", LONG, |d| {
        d.depth("receipts") >= ORDERS && d.depth(dlq) >= 2
    });
    // Let anything still in flight settle before counting.
    daemon.wait_until("the input drained", LONG, |d| {
        stage_metric(d, "sluice_messages_processed_total", Some("duplicate")) as usize
            >= ORDERS * (COPIES - 1)
    });

    let receipts = daemon.read_all("receipts");
    assert_eq!(receipts.len(), ORDERS, "one receipt per order");
    assert_one_receipt_per_order(&receipts);
    let calls = stage_metric(&daemon, "sluice_handler_duration_seconds_count", None);
    // A call that failed (on a loaded machine, a timeout) gave its key
    // back and ran again: a second call, not a duplicate.
    let failed: u64 = ["timeout", "trap", "retry"]
        .iter()
        .map(|kind| stage_metric(&daemon, "sluice_messages_processed_total", Some(kind)))
        .sum();
    assert_eq!(
        calls - failed,
        ORDERS as u64,
        "the handler ran once per order, besides {failed} failed calls (and none for the \
         conflict and the keyless message)"
    );
    assert_eq!(
        stage_metric(
            &daemon,
            "sluice_messages_processed_total",
            Some("duplicate")
        ),
        (ORDERS * (COPIES - 1)) as u64
    );

    let dead = daemon.read_all(dlq);
    assert_eq!(dead.len(), 2, "{dead:?}");
    let by_id: BTreeMap<&str, &Value> = dead
        .iter()
        .map(|m| (m["id"].as_str().expect("id"), m))
        .collect();
    let conflict = by_id["o7-changed"];
    assert_eq!(header(conflict, "sluice-dlq-kind"), Some("dedup-conflict"));
    let keyless = by_id["no-order"];
    assert_eq!(header(keyless, "sluice-dlq-kind"), Some("rejected"));
    let why = header(keyless, "sluice-dlq-error").unwrap_or_default();
    assert!(
        why.contains("json:/order"),
        "the reason names the key: {why}"
    );
}

fn a_crash_between_handler_and_record_keeps_outputs_unique(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = pipeline(dir.path());
    let data = dir.path().join("data");
    // Dies at the 300th completion: after the handler (and on NATS after
    // the outputs were published), before the COMPLETED record.
    let mut daemon = Daemon::start_with_env(
        backend.broker_url(),
        &[&file],
        &data,
        vec![(sluice::dedup::CRASH_HOOK_ENV.into(), "300".into())],
    );
    // The stage may reach the hook before the last batch is in: the
    // publish then fails with the daemon, and is repeated in full after
    // the restart (the ids make the repeats no-ops).
    let _ = daemon.try_publish("orders", &duplicated_orders());
    let status = daemon.wait_exit(LONG);
    assert!(!status.success(), "the crash hook aborts: {status}");
    assert!(
        daemon.log().contains(sluice::dedup::CRASH_HOOK_ENV),
        "it died at the hook:\n{}",
        daemon.log()
    );
    drop(daemon);

    let daemon = Daemon::start_on(backend, &[&file], &data);
    daemon.publish("orders", &duplicated_orders());
    daemon.wait_until("every order handled", LONG, |d| {
        let status = d.get("/v1/status");
        d.depth("receipts") >= ORDERS
            && status[0]["depth"].as_u64() == Some(0)
            && status[0]["in_flight"].as_u64() == Some(0)
    });
    let receipts = daemon.read_all("receipts");
    assert_one_receipt_per_order(&receipts);
    assert_eq!(receipts.len(), ORDERS);
    assert_eq!(daemon.depth("shop.once.dlq"), 0, "nothing dead-lettered");
    let calls = stage_metric(&daemon, "sluice_handler_duration_seconds_count", None);
    eprintln!(
        "after the restart the handler ran {calls} times for the {} orders not yet recorded",
        ORDERS
    );
}

on_both_brokers!(
    duplicates_run_the_handler_once_per_key,
    a_crash_between_handler_and_record_keeps_outputs_unique,
);
