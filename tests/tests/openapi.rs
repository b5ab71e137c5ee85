//! The admin API described, against the real `sluice run` binary:
//!
//! - `GET /v1/openapi.json` serves an OpenAPI 3.1 document, the same one
//!   `sluice schema --openapi` prints, behind the token like every `/v1`
//!   route;
//! - schemathesis (PyPI, installed by `cargo xtask setup`) reads that
//!   document and sends generated requests, valid and invalid, to every
//!   operation of a daemon that has topics, messages and dead letters: once
//!   with the full token, once with the read token. Every response is
//!   checked against the document: no server error except a 503 that the
//!   operation lists, only documented statuses, content types, headers and
//!   bodies, invalid input refused, requests without the token refused.

use std::process::Command;
use std::time::Duration;

use reqwest::blocking::Client;
use serde_json::Value;
use serde_json::json;
use sluice_tests::{Daemon, plugin};

const FULL: &str = "full-token-openapi-5c1e";
const READ: &str = "read-token-openapi-90ad";

/// `shop`: `in` -> `work` (uppercase) -> `out`, and `bad` -> `reject`,
/// which dead-letters everything at once.
fn shop_yaml() -> String {
    format!(
        r#"
name: shop
topics: [in, out, bad]
stages:
  - name: work
    subscribe: in
    plugin: {uppercase}
    publish: [out]
  - name: reject
    subscribe: bad
    plugin: {fail}
    config: {{mode: reject, reason: "poison for the fuzzer"}}
"#,
        uppercase = plugin("uppercase"),
        fail = plugin("fail"),
    )
}

fn start() -> Daemon {
    Daemon::with_yaml(&shop_yaml())
        .envs([
            ("SLUICE_ADMIN_TOKEN", FULL),
            ("SLUICE_ADMIN_READ_TOKEN", READ),
        ])
        .start()
}

fn http() -> Client {
    sluice_tests::http_client(Duration::from_secs(60))
}

fn document(d: &Daemon, token: &str) -> reqwest::blocking::Response {
    http()
        .get(d.url("/v1/openapi.json"))
        .bearer_auth(token)
        .send()
        .expect("GET /v1/openapi.json")
}

#[test]
fn the_document_is_served_behind_the_token_and_matches_the_cli() {
    let d = start();
    let none = http().get(d.url("/v1/openapi.json")).send().expect("GET");
    assert_eq!(none.status(), 401);

    let served = document(&d, READ);
    assert_eq!(served.status(), 200);
    assert_eq!(
        served.headers()["content-type"].to_str().expect("ASCII"),
        "application/json"
    );
    let served: Value = served.json().expect("JSON");
    assert_eq!(served["openapi"], "3.1.0");
    assert_eq!(
        served["info"]["version"],
        env!("CARGO_PKG_VERSION"),
        "the document carries the daemon's version"
    );

    let printed = Command::new(sluice_tests::sluice_bin())
        .args(["schema", "--openapi"])
        .output()
        .expect("sluice schema --openapi");
    assert!(printed.status.success(), "{printed:?}");
    let printed: Value = serde_json::from_slice(&printed.stdout).expect("JSON on stdout");
    assert_eq!(
        printed, served,
        "`sluice schema --openapi` prints what is served"
    );

    // Every route the daemon answers is in it, with each method.
    let paths = served["paths"].as_object().expect("paths");
    for (path, method) in [
        ("/v1/topics/{topic}/messages", "post"),
        ("/v1/topics/{topic}/messages", "get"),
        ("/v1/topics/{topic}/batch", "post"),
        ("/v1/dlq/{pipeline}/{stage}", "get"),
        ("/v1/dlq/{pipeline}/{stage}/{seq}", "get"),
        ("/v1/dlq/{pipeline}/{stage}/redrive", "post"),
        ("/v1/dlq/{pipeline}/{stage}/purge", "post"),
        ("/v1/stages/{pipeline}/{stage}/pause", "post"),
        ("/v1/stages/{pipeline}/{stage}/resume", "post"),
        ("/v1/reload", "post"),
        ("/v1/reload", "get"),
        ("/v1/status", "get"),
        ("/v1/sources", "get"),
        ("/health/ready", "get"),
        ("/metrics", "get"),
    ] {
        assert!(
            paths[path][method].is_object(),
            "{method} {path} is missing from the document"
        );
    }
}

/// The daemon with something in every place the fuzzer reads: messages
/// in `in`/`out`, entries in `reject`'s DLQ.
fn seeded() -> Daemon {
    let d = start();
    let client = http();
    let batch = |topic: &str, lines: &[String]| {
        let r = client
            .post(d.url(&format!("/v1/topics/{topic}/batch")))
            .bearer_auth(FULL)
            .header("content-type", "application/x-ndjson")
            .body(lines.join("\n"))
            .send()
            .expect("batch");
        assert_eq!(r.status(), 202, "{}", r.text().unwrap_or_default());
    };
    let good: Vec<String> = (0..20)
        .map(|i| json!({"id": format!("g{i}"), "payload": format!("hello {i}")}).to_string())
        .collect();
    batch("in", &good);
    let bad: Vec<String> = (0..40)
        .map(|i| json!({"id": format!("b{i}"), "payload": format!("{{\"n\":{i}}}")}).to_string())
        .collect();
    batch("bad", &bad);
    d.wait_until("the DLQ filled", Duration::from_secs(60), |d| {
        http()
            .get(d.url("/v1/dlq/shop/reject"))
            .bearer_auth(READ)
            .send()
            .ok()
            .and_then(|r| r.json::<Value>().ok())
            .and_then(|v| v["depth"].as_u64())
            == Some(40)
    });
    d
}

/// - A 503 is the API saying "not now" (the broker, a drain, a full
///   reload queue): allowed where the operation documents it, which
///   `status_code_conformance` holds it to; any other 5xx fails.
/// - `positive_data_acceptance` (every request the schema allows gets a
///   2xx) is off for the operations whose inputs carry meanings a JSON
///   Schema cannot state: ingest's delay headers (at most 365 days
///   ahead) and keys (the broker's portable characters), and the DLQ
///   filters (`since` no later than `until`, times in RFC 3339 or as a
///   duration back). The server refuses such input with a 400 that says
///   why; every other check still runs on them.
const SCHEMATHESIS_CONFIG: &str = r#"
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "503"]

[[operations]]
include-operation-id-regex = "^(publish|publish_batch|list_dead_letters|redrive|purge)$"
checks.positive_data_acceptance.enabled = false
"#;

/// Runs schemathesis against `d` with `token`; panics with its report
/// unless it found nothing.
fn schemathesis(d: &Daemon, token: &str) {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("schemathesis.toml");
    std::fs::write(&config, SCHEMATHESIS_CONFIG).expect("config");
    let report = dir.path().join("report");
    let output = Command::new(schemathesis_bin())
        // Its cache (`.schemathesis/`) goes with the run, not into the tree.
        .current_dir(dir.path())
        .arg("--config-file")
        .arg(&config)
        .args(["run", &d.url("/v1/openapi.json")])
        .args(["--header", &format!("Authorization: Bearer {token}")])
        // Every check but the response-time one (no timing assertions).
        // Deterministic and bounded: a few dozen cases an operation in
        // each phase (coverage, fuzzing, stateful sequences of calls), one
        // worker (the daemon's own limits are not under test here), and
        // long-polls capped by the document's maximum.
        .args(["--max-examples", "40", "--workers", "1"])
        .args(["--request-timeout", "45", "--no-shrink"])
        .args(["--generation-deterministic"])
        // The batch endpoint's JSON lines (tests/schemathesis/sluice_hooks.py).
        .env("SCHEMATHESIS_HOOKS", "sluice_hooks")
        .env(
            "PYTHONPATH",
            sluice_harness::repo_root()
                .join("tests")
                .join("schemathesis"),
        )
        .arg("--report-dir")
        .arg(&report)
        .args(["--output-truncate", "false"])
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run schemathesis (installed by `cargo xtask setup`)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "schemathesis found problems with the {} token:\n{stdout}\n{}\n--- daemon log ---\n{}",
        if token == FULL { "full" } else { "read" },
        String::from_utf8_lossy(&output.stderr),
        d.log()
    );
    // It did test: every operation of the document (schemathesis leaves
    // out at most the document's own URL), hundreds of cases.
    let operations = served_operations(d, token);
    let figure = |label: &str| -> usize {
        stdout
            .lines()
            .find_map(|line| line.trim().strip_prefix(label))
            .and_then(|rest| rest.trim().split('/').next_back()?.parse().ok())
            .unwrap_or(0)
    };
    let (selected, tested) = (figure("Selected:"), figure("Tested:"));
    assert!(
        tested == selected && selected + 1 >= operations,
        "{tested} of {selected} selected operations tested; the document has {operations}:\n{stdout}"
    );
    let generated: u64 = stdout
        .lines()
        .find_map(|line| line.trim().split_once(" generated, "))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(0);
    assert!(generated >= 500, "only {generated} cases:\n{stdout}");
}

/// How many operations the served document has.
fn served_operations(d: &Daemon, token: &str) -> usize {
    let doc: Value = document(d, token).json().expect("JSON");
    doc["paths"]
        .as_object()
        .expect("paths")
        .values()
        .map(|item| item.as_object().map_or(0, serde_json::Map::len))
        .sum()
}

/// `st` from the same Python that `cargo xtask setup` installed into.
fn schemathesis_bin() -> std::path::PathBuf {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .expect("python3");
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("st")
}

#[test]
fn schemathesis_finds_nothing_with_the_full_token() {
    let d = seeded();
    schemathesis(&d, FULL);
    // The daemon is whole afterwards: still ready, nothing lost.
    let (status, reasons) = d.readiness();
    assert_eq!(status, "ready", "{reasons}");
}

#[test]
fn schemathesis_finds_nothing_with_the_read_token() {
    let d = seeded();
    schemathesis(&d, READ);
    // The read token changed nothing: every dead letter is still there.
    let dlq: Value = http()
        .get(d.url("/v1/dlq/shop/reject"))
        .bearer_auth(READ)
        .send()
        .expect("GET")
        .json()
        .expect("JSON");
    assert_eq!(dlq["depth"], 40, "{dlq}");
}
