//! The examples of contract 0.2.0's capabilities, as `pipelines/` has them
//! and `plugins/examples/` builds them (with the Rust SDK), run end to end
//! by the real `sluice run` binary against real HTTP services of the
//! test's own. Each pipeline file is used as it is, but for the service's
//! address, the plugin's path and (for the window) the window's length.
//!
//! - **charge**: 400 orders, 40 of them sent twice, through two kill -9s:
//!   the payment service (which honours `Idempotency-Key`, as Stripe's
//!   does) charges each order exactly once, always with the token from the
//!   `secrets:` block, and each order's receipt is emitted;
//! - **enrich**: messages of three customers and one unknown one: each
//!   known customer is looked up once (the cache in state), every message
//!   comes out with its record, and the unknown one is dead-lettered;
//! - **window**: events of two keys: the windows' counts add up to the
//!   events, exactly, and each result carries its window's start and end.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use sluice_tests::receiver::{Receiver, Reply};
use sluice_tests::{Daemon, Msg, header, plugin};

const LONG: Duration = Duration::from_secs(300);
const TOKEN: &str = "pay-t0ken-Ex4mple";

/// `pipelines/<name>.yaml` with `from` → `to` replaced, and the plugin's
/// path made absolute.
fn example(name: &str, replace: &[(&str, String)]) -> String {
    let path = sluice_harness::repo_root().join(format!("pipelines/{name}.yaml"));
    let mut yaml = std::fs::read_to_string(&path).expect("the example pipeline");
    let relative = format!("../target/plugins/{name}.wasm");
    assert!(yaml.contains(&relative), "{name}.yaml names its plugin");
    yaml = yaml.replace(&relative, &plugin(name));
    for (from, to) in replace {
        assert!(yaml.contains(from), "{name}.yaml has `{from}`");
        yaml = yaml.replace(from, to);
    }
    yaml
}

fn payloads(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m["payload"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn charge_charges_each_order_once_through_duplicates_and_two_kill_9s() {
    // The payment service: one charge per Idempotency-Key (a repeated key
    // gets the first answer again), and 401 without the token.
    let charges: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let book = charges.clone();
    let service = Receiver::start(Arc::new(move |hit, _| {
        if hit.header("authorization") != Some(&format!("Bearer {TOKEN}")) {
            return Reply::status(401).body("no token");
        }
        let order: Value = serde_json::from_slice(&hit.body).unwrap_or_default();
        let id = order["order"].as_str().unwrap_or("?").to_owned();
        let mut book = book.lock().unwrap_or_else(|e| e.into_inner());
        let receipt = book
            .entry(hit.key())
            .or_insert_with(|| format!("receipt {id}"))
            .clone();
        // A service that takes a while, so that the kills land mid-run.
        Reply {
            delay: Some(Duration::from_millis(20)),
            ..Reply::status(200).body(receipt)
        }
    }));
    let yaml = example("charge", &[("127.0.0.1:8080", service.addr.to_string())]);
    let mut daemon = Daemon::with_yaml(&yaml)
        .envs([("PAYMENTS_TOKEN", TOKEN)])
        .start();
    let orders = 400;
    let mut messages: Vec<Msg> = (0..orders)
        .map(|i| {
            Msg::new(
                format!("m{i}"),
                format!(r#"{{"order": "o{i}", "amount": {i}}}"#),
            )
            .key(format!("o{i}"))
        })
        .collect();
    // Every tenth order sent twice, as another message.
    messages.extend((0..orders).step_by(10).map(|i| {
        Msg::new(
            format!("again{i}"),
            format!(r#"{{"order": "o{i}", "amount": {i}}}"#),
        )
        .key(format!("o{i}"))
    }));
    let total = messages.len();
    daemon.post("/v1/stages/charge/charge/pause", serde_json::json!({}));
    daemon.publish("orders", &messages);
    daemon.post("/v1/stages/charge/charge/resume", serde_json::json!({}));
    let mut seen_at_kill = Vec::new();
    for round in 0..2u64 {
        std::thread::sleep(Duration::from_millis(
            300 + fastrand::u64(0..500) + round * 200,
        ));
        seen_at_kill.push(daemon.depth("charged"));
        daemon.kill9();
        daemon.restart();
    }
    daemon.wait_until("every receipt", LONG, |d| d.depth("charged") >= total);
    let receipts = payloads(&daemon.read_all("charged"));
    assert_eq!(receipts.len(), total, "one receipt per order message");
    let charged: BTreeMap<String, usize> = charges
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .fold(BTreeMap::new(), |mut by_order, receipt| {
            *by_order.entry(receipt.clone()).or_default() += 1;
            by_order
        });
    let twice: Vec<_> = charged.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "orders charged more than once: {twice:?}");
    assert_eq!(charged.len(), orders, "every order charged");
    let seen: BTreeSet<&String> = receipts.iter().collect();
    assert_eq!(seen.len(), orders, "each order's receipt");
    assert_eq!(daemon.depth("charge.charge.dlq"), 0);
    assert!(
        service.hits().iter().all(|h| h.status != 401),
        "a request without the token"
    );
    assert!(!daemon.log().contains(TOKEN), "the token is in the log");
    assert!(
        seen_at_kill.iter().any(|s| *s < total),
        "the kills should land mid-run: {seen_at_kill:?}"
    );
}

#[test]
fn enrich_looks_each_customer_up_once_and_dead_letters_an_unknown_one() {
    let service = Receiver::start(Arc::new(|hit, _| {
        match hit.path.strip_prefix("/customers/") {
            Some(id @ ("c1" | "c2" | "c3")) => {
                Reply::status(200).body(format!(r#"{{"id": "{id}", "tier": "gold"}}"#))
            }
            _ => Reply::status(404),
        }
    }));
    let yaml = example("enrich", &[("127.0.0.1:8081", service.addr.to_string())]);
    let daemon = Daemon::with_yaml(&yaml).start();
    let mut messages: Vec<Msg> = (0..30)
        .map(|i| {
            let c = format!("c{}", i % 3 + 1);
            Msg::new(
                format!("e{i}"),
                format!(r#"{{"customer": "{c}", "n": {i}}}"#),
            )
            .key(c)
        })
        .collect();
    messages.push(Msg::new("who", r#"{"customer": "nobody"}"#).key("nobody"));
    daemon.publish("events", &messages);
    daemon.wait_until("every enriched message", LONG, |d| {
        d.depth("enriched") >= 30
    });
    daemon.wait_until("the dead letter", LONG, |d| {
        d.depth("enrich.enrich.dlq") >= 1
    });
    for m in daemon.read_all("enriched") {
        let doc: Value = serde_json::from_str(m["payload"].as_str().expect("text")).expect("json");
        assert_eq!(doc["customer_info"]["id"], doc["customer"], "{doc}");
        assert_eq!(doc["customer_info"]["tier"], "gold");
    }
    let lookups: BTreeMap<String, usize> =
        service.hits().iter().fold(BTreeMap::new(), |mut n, h| {
            *n.entry(h.path.clone()).or_default() += 1;
            n
        });
    for c in ["c1", "c2", "c3"] {
        assert_eq!(
            lookups.get(&format!("/customers/{c}")),
            Some(&1),
            "{c} looked up once, then cached: {lookups:?}"
        );
    }
    let dead = daemon.read_all("enrich.enrich.dlq");
    assert_eq!(header(&dead[0], "sluice-dlq-kind"), Some("rejected"));
    assert!(
        header(&dead[0], "sluice-dlq-error").is_some_and(|e| e.contains("unknown customer")),
        "{dead:?}"
    );
}

#[test]
fn window_counts_add_up_to_the_events_with_each_window_s_bounds() {
    let window = 2_000u64;
    let yaml = example(
        "window",
        &[("window_ms: 60000", format!("window_ms: {window}"))],
    );
    let daemon = Daemon::with_yaml(&yaml).start();
    let mut messages = Vec::new();
    for (key, n) in [("a", 5), ("b", 3)] {
        for i in 0..n {
            messages.push(Msg::new(format!("{key}{i}"), "click").key(key));
        }
    }
    daemon.publish("clicks", &messages);
    // Each key's events fall in one window, or two if the publish crossed
    // a boundary: results come until the counts add up.
    let total = |d: &Daemon| -> BTreeMap<String, u64> {
        d.read_all("counts")
            .iter()
            .fold(BTreeMap::new(), |mut sum, m| {
                let doc: Value =
                    serde_json::from_str(m["payload"].as_str().unwrap_or("{}")).unwrap_or_default();
                *sum.entry(doc["key"].as_str().unwrap_or("?").to_owned())
                    .or_default() += doc["count"].as_u64().unwrap_or(0);
                sum
            })
    };
    daemon.wait_until("the windows' results", LONG, |d| {
        total(d) == BTreeMap::from([("a".to_owned(), 5), ("b".to_owned(), 3)])
    });
    std::thread::sleep(Duration::from_millis(window + 500));
    assert_eq!(
        total(&daemon),
        BTreeMap::from([("a".to_owned(), 5), ("b".to_owned(), 3)]),
        "no window counted twice"
    );
    for m in daemon.read_all("counts") {
        let doc: Value = serde_json::from_str(m["payload"].as_str().expect("text")).expect("json");
        let (start, end) = (
            doc["window_start"].as_u64().expect("start"),
            doc["window_end"].as_u64().expect("end"),
        );
        assert_eq!(end - start, window, "{doc}");
        assert_eq!(start % window, 0, "aligned: {doc}");
        let entered = m["published_at"].as_u64().expect("published_at");
        assert!(entered >= end, "a result before its window ended: {doc}");
    }
}
