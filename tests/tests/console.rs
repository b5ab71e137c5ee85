//! The web console (`/ui`) in a real browser, against the real `sluice run`
//! binary.
//!
//! The daemon runs `shop` with both tokens: `orders` -> `check` (identity)
//! -> `checked` -> `work` (the `fail` plugin, rejecting everything) ->
//! `done`, so every order ends in `work`'s DLQ. Then
//! `tests/console/console.mjs` (playwright-core, driving Debian's Chromium;
//! both installed by `cargo xtask setup`) signs in and goes through every
//! view. On the way it:
//!
//! - checks the overview's numbers against the `/v1/status` answer it drew;
//! - searches the DLQ by key, selects some of the matches, fixes `work` (the
//!   pipeline file swapped for one where `work` runs `identity`, then
//!   `POST /v1/reload`) and redrives the selection through the page's
//!   confirmation dialog;
//! - signs in with the read token, finds no write button, and sees the
//!   server refuse every write route (403), and a full session's write
//!   without its CSRF header too;
//! - checks the CSP header, and that the page logged no error and no CSP
//!   violation.
//!
//! This file then checks the outcome independently over the API: exactly
//! the redriven orders came out of `done`, the rest stayed in the DLQ.
//!
//! A second test drives the state view (`tests/console/state.mjs`) over a
//! stage running the `stateful` test plugin: keys, sizes and totals against
//! the API, prefix and paging, a value, a delete (the handler then counts
//! the key from 1 again), and the read token seeing no value.
//!
//! Screenshots of each view go to a temporary directory, or to
//! `SLUICE_SCREENSHOTS` (relative to the repository root:
//! `SLUICE_SCREENSHOTS=docs/console` refreshes the documentation's).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use reqwest::blocking::Client;
use serde_json::{Value, json};
use sluice_tests::{Daemon, plugin, write_pipeline};

const FULL: &str = "full-token-console-6d2e";
const READ: &str = "read-token-console-b41f";
/// Orders published; the even ones are keyed `red`, the odd ones `blue`.
const ORDERS: usize = 10;
/// How many of the `red` matches the script selects and redrives
/// (console.mjs: `REDRIVE`).
const REDRIVEN: usize = 3;
const LONG: Duration = Duration::from_secs(120);

/// `shop` with `work` running `work_plugin` (with `work_config`).
fn shop_yaml(work_plugin: &str, work_config: &str) -> String {
    format!(
        r#"name: shop
topics: [orders, checked, done]
stages:
  - name: check
    subscribe: orders
    plugin: {identity}
    publish: [checked]
    concurrency: 2
  - name: work
    subscribe: checked
    plugin: {work_plugin}
    publish: [done]
    concurrency: 4
{work_config}"#,
        identity = plugin("identity"),
    )
}

fn http() -> Client {
    sluice_tests::http_client(Duration::from_secs(60))
}

fn get(d: &Daemon, path: &str) -> Value {
    let r = http()
        .get(d.url(path))
        .bearer_auth(FULL)
        .send()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    assert!(r.status().is_success(), "GET {path}: {}", r.status());
    r.json().expect("JSON")
}

fn repo_root() -> PathBuf {
    sluice_harness::repo_root()
}

/// Node.js, the Chromium binary and the console test's packages, or a
/// panic saying how to get them: a missing tool must fail the test, never
/// skip it.
fn check_tools(console: &Path) -> String {
    let chromium = std::env::var("SLUICE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: run `cargo xtask setup` (Debian package `chromium`)"
    );
    assert!(
        console
            .join("node_modules/playwright-core/package.json")
            .is_file(),
        "tests/console/node_modules is missing: run `cargo xtask setup` (npm ci there)"
    );
    chromium
}

#[test]
fn the_console_shows_the_pipeline_and_redrives_a_selection() {
    let console = repo_root().join("tests").join("console");
    let chromium = check_tools(&console);

    let dir = tempfile::tempdir().expect("tempdir");
    let broken = shop_yaml(
        &plugin("fail"),
        "    config: {mode: reject, reason: \"injected failure: the warehouse is closed\"}\n",
    );
    let fixed = shop_yaml(&plugin("identity"), "");
    let file = write_pipeline(dir.path(), "shop", &broken);
    let fixed_file = write_pipeline(dir.path(), "shop-fixed", &fixed);
    // Only `shop.yaml` is loaded; the script copies the fixed one over it.
    let d = Daemon::builder(&[&file], &dir.path().join("data"))
        .envs([
            ("SLUICE_ADMIN_TOKEN", FULL),
            ("SLUICE_ADMIN_READ_TOKEN", READ),
        ])
        .start();

    let lines: String = (0..ORDERS)
        .map(|i| {
            let colour = if i % 2 == 0 { "red" } else { "blue" };
            let region = if i < ORDERS / 2 { "eu" } else { "us" };
            json!({
                "id": format!("order-{i}"),
                "key": colour,
                "headers": {"region": region},
                "payload": json!({"order": i, "colour": colour, "items": [{"sku": "A-1", "qty": i + 1}]}).to_string(),
            })
            .to_string()
                + "\n"
        })
        .collect();
    let r = http()
        .post(d.url("/v1/topics/orders/batch"))
        .bearer_auth(FULL)
        .header("content-type", "application/x-ndjson")
        .body(lines)
        .send()
        .expect("publish");
    assert_eq!(r.status(), 202, "{}", r.text().unwrap_or_default());

    // Quiescent: every order dead-lettered by `work`, nothing in flight.
    d.wait_until("every order in work's DLQ", LONG, |d| {
        let status = get(d, "/v1/status");
        status.as_array().is_some_and(|stages| {
            stages
                .iter()
                .all(|s| s["depth"] == 0 && s["in_flight"] == 0)
                && stages
                    .iter()
                    .any(|s| s["stage"] == "work" && s["dlq_depth"] == ORDERS)
        })
    });

    run_script(
        &console,
        "console.mjs",
        &d,
        &chromium,
        dir.path(),
        &[
            ("SLUICE_PIPELINE_FILE", file.as_os_str()),
            ("SLUICE_PIPELINE_FIXED", fixed_file.as_os_str()),
        ],
    );

    // The outcome, checked here over the API as well: `done` holds exactly
    // REDRIVEN red orders (and the two messages the tail saw published
    // straight into it); the other orders are still dead letters.
    let done = get(&d, "/v1/topics/done/messages?from=0&max=1000");
    let payloads: Vec<Value> = done["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| serde_json::from_str(m["payload"].as_str()?).ok())
        .filter(|p: &Value| p.get("order").is_some())
        .collect();
    assert_eq!(payloads.len(), REDRIVEN, "{done}");
    assert!(payloads.iter().all(|p| p["colour"] == "red"), "{done}");
    let dlq = get(&d, "/v1/dlq/shop/work?limit=1000");
    let entries = dlq["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), ORDERS - REDRIVEN, "{dlq}");
    for p in &payloads {
        let id = format!("order-{}", p["order"]);
        assert!(
            !entries.iter().any(|e| e["payload_preview"]
                .as_str()
                .unwrap_or_default()
                .contains(&format!("\"order\":{}", p["order"]))),
            "{id} was redriven but is still in the DLQ: {dlq}"
        );
    }
    // Nothing the read session tried took effect.
    let status = get(&d, "/v1/status");
    assert!(
        status
            .as_array()
            .expect("stages")
            .iter()
            .all(|s| s["paused"] == false),
        "{status}"
    );
}

/// `st`: `in` -> `count` (the `stateful` plugin, `state: true`) -> `out`
/// -> `relay` (identity, no state) -> `done`.
fn state_yaml() -> String {
    format!(
        r#"name: st
topics: [in, out, done]
stages:
  - name: count
    subscribe: in
    plugin: {stateful}
    publish: [out]
    state: true
  - name: relay
    subscribe: out
    plugin: {identity}
    publish: [done]
"#,
        stateful = plugin("stateful"),
        identity = plugin("identity"),
    )
}

/// The state view (`#/state/st/count`): `tests/console/state.mjs` checks
/// the totals, keys, sizes and revisions against the API, the prefix
/// filter, paging with `after`, a value, a delete through the dialog, the
/// links from the overview and the stage view (only for the stage with
/// `state:`), and that the read token lists keys and sizes but is never
/// shown nor sent a value. Then, over the API: the cancelled delete left
/// `count/red` at 3, and the deleted key starts again from 1 when the
/// handler increments it next.
#[test]
fn the_console_shows_a_stages_state_and_deletes_a_key() {
    const MARKUP: &str = "<b>blue</b>&";
    let console = repo_root().join("tests").join("console");
    let chromium = check_tools(&console);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_pipeline(dir.path(), "st", &state_yaml());
    let d = Daemon::builder(&[&file], &dir.path().join("data"))
        .envs([
            ("SLUICE_ADMIN_TOKEN", FULL),
            ("SLUICE_ADMIN_READ_TOKEN", READ),
        ])
        .start();
    let publish = |id: &str, key: &str| {
        let line = json!({"id": id, "key": key, "payload": "inc"}).to_string() + "\n";
        let r = http()
            .post(d.url("/v1/topics/in/batch"))
            .bearer_auth(FULL)
            .header("content-type", "application/x-ndjson")
            .body(line)
            .send()
            .expect("publish");
        assert_eq!(r.status(), 202, "{}", r.text().unwrap_or_default());
    };
    for (i, key) in ["red", MARKUP, "red", MARKUP, "red"].iter().enumerate() {
        publish(&format!("m-{i}"), key);
    }
    let value = |d: &Daemon, key: &str| -> Option<String> {
        let path = format!("/v1/state/st/count/keys/{}", path_segment(key));
        let r = http()
            .get(d.url(&path))
            .bearer_auth(FULL)
            .send()
            .expect("GET a value");
        if r.status() == 404 {
            return None;
        }
        assert!(r.status().is_success(), "GET {path}: {}", r.status());
        let v: Value = r.json().expect("JSON");
        Some(v["value"].as_str().expect("text").to_owned())
    };
    d.wait_until("five increments committed", LONG, |d| {
        value(d, "count/red").as_deref() == Some("3")
            && value(d, &format!("count/{MARKUP}")).as_deref() == Some("2")
            && get(d, "/v1/state/st/count")["keys"] == 7
    });

    run_script(&console, "state.mjs", &d, &chromium, dir.path(), &[]);

    // The outcome, over the API: the cancelled delete changed nothing, the
    // confirmed one reached the handler's store (its counter restarts).
    assert_eq!(value(&d, "count/red").as_deref(), Some("3"));
    assert_eq!(value(&d, &format!("count/{MARKUP}")), None);
    publish("m-5", MARKUP);
    d.wait_until("the deleted counter restarted", LONG, |d| {
        value(d, &format!("count/{MARKUP}")).is_some()
    });
    assert_eq!(
        value(&d, &format!("count/{MARKUP}")).as_deref(),
        Some("1"),
        "the handler saw the deleted key absent"
    );
}

/// `key` as one path segment.
fn path_segment(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Runs `tests/console/<script>` in Node against daemon `d` with both
/// tokens, `chromium` and the screenshot directory (`SLUICE_SCREENSHOTS`,
/// else one under `tmp`), plus `extra` variables; fails the test with
/// what the script, and the daemon, said unless it exits 0.
fn run_script(
    console: &Path,
    script: &str,
    d: &Daemon,
    chromium: &str,
    tmp: &Path,
    extra: &[(&str, &std::ffi::OsStr)],
) {
    let shots = match std::env::var("SLUICE_SCREENSHOTS") {
        Ok(dir) if !dir.is_empty() => {
            let dir = repo_root().join(dir);
            std::fs::create_dir_all(&dir).expect("the screenshot directory");
            dir
        }
        _ => tmp.join("screenshots"),
    };
    let output = Command::new("node")
        .arg(console.join(script))
        .current_dir(console)
        .env("SLUICE_URL", d.admin_url())
        .env("SLUICE_FULL_TOKEN", FULL)
        .env("SLUICE_READ_TOKEN", READ)
        .env("SLUICE_CHROMIUM", chromium)
        .env("SLUICE_SCREENSHOT_DIR", &shots)
        .envs(extra.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run node tests/console/{script} (is Node.js installed?): {e}"));
    let said = format!(
        "node {script}: {:?}\nstdout:\n{}\nstderr:\n{}\ndaemon log:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        d.log()
    );
    assert!(output.status.success(), "{said}");
    println!("{said}");
}
