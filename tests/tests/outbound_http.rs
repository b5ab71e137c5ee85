//! Handlers' outbound HTTP (`wasi:http/outgoing-handler`, contract 0.2.0)
//! against the real `sluice run` binary and real HTTP servers of the
//! test's own, with the `fetcher` test plugin (payload `METHOD URL
//! [BODY]`; it follows one redirect and emits `status N BODY` or `error
//! CODE`):
//!
//! - a listed host is called, with `Idempotency-Key: <message id>:0` and
//!   the grant's header with its secret put in, which never shows in the
//!   daemon's log;
//! - each refusal reaches the handler as an error and the server sees
//!   nothing: a host not listed, a redirect to a host not listed, a name
//!   that resolves to loopback without `allow_private`;
//! - a slow server is cut at `http.timeout` and the worker goes on;
//! - a `429` with `Retry-After` holds the host: the next call fails at once
//!   without reaching the server;
//! - a plugin that imports `wasi:http` on a stage without `http:` is
//!   refused at `file:line:col`;
//! - one POST per message, 10,000 messages, two kill -9s, on both brokers:
//!   the server sees every message, and each message's repeated calls
//!   carry the same `Idempotency-Key`.
//!
//! Waits are generous; nothing asserts on speed.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sluice_tests::receiver::{Receiver, Reply, always};
use sluice_tests::{Backend, Daemon, Msg, on_both_brokers, plugin, sluice_bin, write_pipeline};

const LONG: Duration = Duration::from_secs(120);
const TOKEN: &str = "tok-Outb0und-7c1e";

fn payloads(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m["payload"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A pipeline with one `fetcher` stage and this `http:` block (indented
/// under the stage), `api_token` defined from the environment.
fn pipeline(http: &str, extra: &str) -> String {
    format!(
        r#"
name: out
topics: [in, out]
secrets:
  api_token: {{env: OUTBOUND_TOKEN}}
stages:
  - name: call
    subscribe: in
    plugin: {plugin}
    publish: [out]
    retry: {{max_attempts: 1}}
{extra}    http:
{http}"#,
        plugin = plugin("fetcher"),
    )
}

fn start(yaml: &str) -> Daemon {
    Daemon::with_yaml(yaml)
        .envs([("OUTBOUND_TOKEN", TOKEN), ("SLUICE_LOG", "debug")])
        .start()
}

/// Publishes one request per payload and returns the handler's outputs.
fn run(daemon: &Daemon, requests: &[String]) -> Vec<String> {
    let before = daemon.depth("out");
    let messages: Vec<Msg> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| Msg::new(format!("r{before}-{i}"), r.clone()))
        .collect();
    daemon.publish("in", &messages);
    daemon.wait_until("every answer", LONG, |d| {
        d.depth("out") >= before + requests.len()
    });
    payloads(&daemon.read_all("out"))[before..].to_vec()
}

#[test]
fn a_listed_host_gets_the_request_with_its_idempotency_key_and_secret_header() {
    let server = Receiver::start(Arc::new(|_, _| Reply::status(200).body("charged")));
    let host = server.addr.to_string();
    let daemon = start(&pipeline(
        &format!(
            "      allow: [\"{host}\"]\n      headers:\n        \"{host}\": {{Authorization: \"Bearer {{secret:api_token}}\"}}\n"
        ),
        "",
    ));
    let out = run(
        &daemon,
        &[format!("POST {} order-1", server.url("http", "/charge"))],
    );
    assert_eq!(out, ["status 200 charged"]);
    let hits = server.hits();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].method, "POST");
    assert_eq!(hits[0].path, "/charge");
    assert_eq!(hits[0].text(), "order-1");
    assert_eq!(
        hits[0].header("authorization"),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(hits[0].key(), "r0-0:0", "message id and call index");
    // The grant as shown: the reference, never the value.
    let stage = daemon.get("/v1/stages/out/call");
    assert!(!stage.to_string().contains(TOKEN), "{stage}");
    assert!(stage.to_string().contains("{secret:api_token}"), "{stage}");
    assert!(!daemon.log().contains(TOKEN), "the token is in the log");
    assert_eq!(requests(&daemon, &host, "2xx"), 1);
    let metrics = daemon.metrics_text();
    assert!(
        metrics
            .contains("sluice_http_request_duration_seconds_count{pipeline=\"out\",stage=\"call\""),
        "{metrics}"
    );
    assert!(!metrics.contains(TOKEN));
}

/// `sluice_http_requests_total` of the stage for `host` and `status`.
fn requests(daemon: &Daemon, host: &str, status: &str) -> u64 {
    let (host, status) = (format!("host=\"{host}\""), format!("status=\"{status}\""));
    daemon
        .metrics_text()
        .lines()
        .filter(|l| {
            l.starts_with("sluice_http_requests_total") && l.contains(&host) && l.contains(&status)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

#[test]
fn refused_requests_reach_the_handler_as_errors_and_the_server_sees_nothing() {
    let listed = Receiver::start(always(200));
    let unlisted = Receiver::start(always(200));
    let to_unlisted = unlisted.url("http", "/elsewhere");
    let redirecting = Receiver::start(Arc::new(move |_, _| {
        Reply::status(302).header("location", to_unlisted.clone())
    }));
    let daemon = start(&pipeline(
        &format!(
            "      allow: [\"{}\", \"{}\", \"localhost:{}\"]\n",
            listed.addr,
            redirecting.addr,
            listed.addr.port()
        ),
        "",
    ));
    let out = run(
        &daemon,
        &[
            format!("GET {}", unlisted.url("http", "/direct")),
            format!("GET {}", redirecting.url("http", "/moved")),
            format!("GET http://localhost:{}/by-name", listed.addr.port()),
            format!("GET {}", listed.url("http", "/fine")),
        ],
    );
    assert!(
        out[0].starts_with("error") && out[0].contains("Denied"),
        "{out:?}"
    );
    assert!(
        out[1].starts_with("error") && out[1].contains("Denied"),
        "{out:?}"
    );
    assert!(
        out[2].starts_with("error") && out[2].contains("Prohibited"),
        "{out:?}"
    );
    assert_eq!(out[3], "status 200 ", "{out:?}");
    assert!(unlisted.hits().is_empty(), "{:?}", unlisted.hits());
    assert_eq!(redirecting.hits().len(), 1, "the redirect itself");
    let paths: Vec<String> = listed.hits().iter().map(|h| h.path.clone()).collect();
    assert_eq!(paths, ["/fine"], "a name resolving to loopback got through");
    let log = daemon.log();
    assert!(
        log.contains("not in the stage's `http.allow`") && log.contains(&unlisted.addr.to_string()),
        "{log}"
    );
    assert!(log.contains("resolves only to loopback"), "{log}");
    assert_eq!(requests(&daemon, "", "refused"), 2, "two hosts not listed");
    assert_eq!(
        requests(
            &daemon,
            &format!("localhost:{}", listed.addr.port()),
            "refused"
        ),
        1,
        "a name resolving to loopback"
    );
    assert_eq!(requests(&daemon, &redirecting.addr.to_string(), "3xx"), 1);
}

#[test]
fn allow_private_lets_a_listed_name_reach_loopback() {
    let server = Receiver::start(always(200));
    let port = server.addr.port();
    let daemon = start(&pipeline(
        &format!("      allow: [\"localhost:{port}\"]\n      allow_private: true\n"),
        "",
    ));
    let out = run(&daemon, &[format!("GET http://localhost:{port}/named")]);
    assert_eq!(out, ["status 200 "]);
    assert_eq!(server.hits().len(), 1);
}

#[test]
fn a_slow_server_is_cut_at_the_timeout_and_the_worker_goes_on() {
    let slow = Receiver::start(Arc::new(|hit, _| {
        let reply = Reply::status(200).body("late");
        if hit.path == "/slow" {
            Reply {
                delay: Some(Duration::from_secs(20)),
                ..reply
            }
        } else {
            reply
        }
    }));
    let daemon = start(&pipeline(
        &format!("      allow: [\"{}\"]\n      timeout: 500ms\n", slow.addr),
        "",
    ));
    let out = run(
        &daemon,
        &[
            format!("GET {}", slow.url("http", "/slow")),
            format!("GET {}", slow.url("http", "/quick")),
        ],
    );
    assert!(
        out[0].starts_with("error") && out[0].contains("Timeout"),
        "{out:?}"
    );
    assert_eq!(out[1], "status 200 late");
    assert_eq!(requests(&daemon, &slow.addr.to_string(), "timeout"), 1);
}

#[test]
fn a_429_with_retry_after_holds_the_host_and_the_next_call_fails_at_once() {
    let server = Receiver::start(Arc::new(|hit, _| {
        if hit.path == "/busy" {
            Reply::status(429).header("retry-after", "60")
        } else {
            Reply::status(200)
        }
    }));
    let daemon = start(&pipeline(
        &format!("      allow: [\"{}\"]\n", server.addr),
        "",
    ));
    let out = run(&daemon, &[format!("GET {}", server.url("http", "/busy"))]);
    assert_eq!(out, ["status 429 "]);
    let out = run(&daemon, &[format!("GET {}", server.url("http", "/later"))]);
    assert!(
        out[0].starts_with("error") && out[0].contains("held"),
        "{out:?}"
    );
    assert_eq!(server.hits().len(), 1, "a held call reached the server");
    assert_eq!(requests(&daemon, &server.addr.to_string(), "held"), 1);
}

#[test]
fn a_plugin_that_imports_http_on_a_stage_without_http_is_refused_where_it_is_named() {
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        "name: out\ntopics: [in, out]\nstages:\n  - name: call\n    subscribe: in\n    plugin: {}\n    publish: [out]\n",
        plugin("fetcher")
    );
    let file = write_pipeline(dir.path(), "nohttp", &yaml);
    let out = Command::new(sluice_bin())
        .arg("validate")
        .arg(&file)
        .output()
        .expect("validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("nohttp.yaml:6:"),
        "the `plugin:` line: {text}"
    );
    assert!(text.contains("wasi:http/outgoing-handler"), "{text}");
    assert!(text.contains("http: {allow:"), "{text}");
}

on_both_brokers!(every_message_reaches_the_server_through_two_kill_9s_with_one_key_each);

fn every_message_reaches_the_server_through_two_kill_9s_with_one_key_each(backend: &Backend) {
    let server = Receiver::start(always(200));
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: out
topics: [in, out]
shutdown_timeout: 5s
stages:
  - name: call
    subscribe: in
    plugin: {plugin}
    publish: [out]
    concurrency: 8
    config: {{retry_on_error: "1"}}
    retry: {{max_attempts: 20, backoff: {{initial: 50ms, max: 1s}}}}
    http:
      allow: ["{host}"]
"#,
        plugin = plugin("fetcher"),
        host = server.addr,
    );
    let file = write_pipeline(dir.path(), "out", &yaml);
    let mut daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    let n = 10_000;
    let url = server.url("http", "/charge");
    let messages: Vec<Msg> = (0..n)
        .map(|i| Msg::new(format!("m{i}"), format!("POST {url} m{i}")))
        .collect();
    // Paused while the inputs go in, so the kills land mid-run.
    daemon.post("/v1/stages/out/call/pause", serde_json::json!({}));
    daemon.publish("in", &messages);
    daemon.post("/v1/stages/out/call/resume", serde_json::json!({}));
    let mut seen_at_kill = Vec::new();
    for round in 0..2u64 {
        std::thread::sleep(Duration::from_millis(
            500 + fastrand::u64(0..800) + round * 300,
        ));
        seen_at_kill.push(server.hits().len());
        daemon.kill9();
        daemon.restart();
    }
    daemon.wait_until("every call's output", LONG * 3, |d| d.depth("out") >= n);
    let hits = server.hits();
    let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for hit in &hits {
        keys.entry(hit.text()).or_default().insert(hit.key());
    }
    let missing: Vec<String> = (0..n)
        .map(|i| format!("m{i}"))
        .filter(|id| !keys.contains_key(id))
        .collect();
    assert!(missing.is_empty(), "never reached the server: {missing:?}");
    let mixed: Vec<_> = keys
        .iter()
        .filter(|(id, k)| k.len() != 1 || !k.contains(&format!("{id}:0")))
        .collect();
    assert!(
        mixed.is_empty(),
        "calls of one message with other keys: {mixed:?}"
    );
    eprintln!(
        "requests: {} for {n} messages ({} repeated); seen at each kill: {seen_at_kill:?}",
        hits.len(),
        hits.len() - n
    );
    assert!(
        seen_at_kill.iter().any(|s| *s > 0 && *s < n),
        "the kills should land mid-run: {seen_at_kill:?}"
    );
}
