//! The web console's server side, against the real `sluice run` binary
//! (the browser test is `console.rs`):
//!
//! - the page and its assets are served with a Content-Security-Policy
//!   that allows no inline script, and are not framed;
//! - signing in with a token sets an HttpOnly, SameSite=Strict cookie; the
//!   cookie reads the API with the token's role; a read session changes
//!   nothing; a full session changes things only with its CSRF token;
//!   signing out ends the session; a cross-site sign-in is refused;
//! - `GET /v1/stages/{pipeline}/{stage}`: the config as loaded and a
//!   history point every 10 s with throughput, latency and outcomes;
//! - a DLQ selection by `seq` lists and redrives only those entries.

use std::time::Duration;

use reqwest::blocking::{Client, Response};
use serde_json::{Value, json};
use sluice_tests::{Daemon, Msg, plugin};

const FULL: &str = "full-token-c0ns01e";
const READ: &str = "read-token-c0ns01e";

fn http() -> Client {
    sluice_tests::http_client(Duration::from_secs(30))
}

/// `shop`: `in` -> `work` (uppercase) -> `out`, and `out` -> `check`
/// (fail, rejecting: every message dead-letters at once).
fn start(tokens: bool) -> Daemon {
    let yaml = format!(
        r#"
name: shop
topics: [in, out]
stages:
  - name: work
    subscribe: in
    plugin: {upper}
    publish: [out]
  - name: check
    subscribe: out
    plugin: {fail}
    config: {{mode: reject}}
"#,
        upper = plugin("uppercase"),
        fail = plugin("fail"),
    );
    let mut builder = Daemon::with_yaml(&yaml);
    if tokens {
        builder = builder.envs([
            ("SLUICE_ADMIN_TOKEN", FULL),
            ("SLUICE_ADMIN_READ_TOKEN", READ),
        ]);
    }
    builder.start()
}

/// Signs in with `token`: the cookie header value and the CSRF token.
fn sign_in(d: &Daemon, token: &str) -> (String, String) {
    let r = http()
        .post(d.url("/ui/session"))
        .json(&json!({ "token": token }))
        .send()
        .expect("POST /ui/session");
    assert_eq!(r.status(), 200);
    let set_cookie = r
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .expect("Set-Cookie")
        .to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    let body: Value = r.json().expect("JSON");
    let cookie = set_cookie.split(';').next().expect("name=value").to_owned();
    (cookie, body["csrf"].as_str().expect("csrf").to_owned())
}

fn post(d: &Daemon, path: &str, cookie: &str, csrf: Option<&str>) -> Response {
    let mut request = http()
        .post(d.url(path))
        .header("cookie", cookie)
        .header("content-type", "application/json")
        .body("{}");
    if let Some(csrf) = csrf {
        request = request.header("x-sluice-csrf", csrf);
    }
    request.send().expect("POST")
}

#[test]
fn the_page_is_served_under_a_strict_policy() {
    let d = start(true);
    for (path, kind) in [
        ("/ui", "text/html"),
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let r = http().get(d.url(path)).send().expect("GET");
        assert_eq!(r.status(), 200, "{path}");
        let header = |name: &str| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert!(header("content-type").starts_with(kind), "{path}");
        let csp = header("content-security-policy");
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
        assert!(csp.contains("default-src 'none'"), "{path}: {csp}");
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(header("x-content-type-options"), "nosniff");
    }
    let page = http()
        .get(d.url("/ui"))
        .send()
        .expect("GET")
        .text()
        .expect("text");
    assert!(page.contains("/ui/app.js"), "{page}");
    assert!(!page.contains("<script>"), "no inline script: {page}");
    // A page of another name (DNS rebinding) is refused like the API.
    let rebound = http()
        .get(d.url("/ui"))
        .header("host", "evil.example")
        .send()
        .expect("GET");
    assert_eq!(rebound.status(), 421);
}

#[test]
fn sessions_carry_the_role_and_changes_need_the_csrf_token() {
    let d = start(true);
    let anonymous = http().get(d.url("/ui/session")).send().expect("GET");
    assert_eq!(anonymous.status(), 401);
    let wrong = http()
        .post(d.url("/ui/session"))
        .json(&json!({ "token": "guess" }))
        .send()
        .expect("POST");
    assert_eq!(wrong.status(), 401);
    let cross_site = http()
        .post(d.url("/ui/session"))
        .header("origin", "https://evil.example")
        .json(&json!({ "token": FULL }))
        .send()
        .expect("POST");
    assert_eq!(cross_site.status(), 403);

    // Read: reads, and every change is 403, CSRF token or not.
    let (cookie, csrf) = sign_in(&d, READ);
    let session: Value = http()
        .get(d.url("/ui/session"))
        .header("cookie", &cookie)
        .send()
        .expect("GET")
        .json()
        .expect("JSON");
    assert_eq!(session["role"], "read");
    assert_eq!(session["csrf"], csrf.as_str());
    let status = http()
        .get(d.url("/v1/status"))
        .header("cookie", &cookie)
        .send()
        .expect("GET");
    assert_eq!(status.status(), 200);
    for path in [
        "/v1/stages/shop/work/pause",
        "/v1/dlq/shop/check/purge",
        "/v1/dlq/shop/check/redrive",
        "/v1/reload",
        "/v1/topics/in/messages",
    ] {
        assert_eq!(post(&d, path, &cookie, Some(&csrf)).status(), 403, "{path}");
    }

    // Full: a change without the CSRF token, or with another session's, is
    // 403; with its own it goes through.
    let (full, full_csrf) = sign_in(&d, FULL);
    let pause = "/v1/stages/shop/work/pause";
    assert_eq!(post(&d, pause, &full, None).status(), 403);
    assert_eq!(post(&d, pause, &full, Some(&csrf)).status(), 403);
    let paused = post(&d, pause, &full, Some(&full_csrf));
    assert_eq!(paused.status(), 200);
    assert_eq!(paused.json::<Value>().expect("JSON")["paused"], true);
    assert_eq!(
        post(&d, "/v1/stages/shop/work/resume", &full, Some(&full_csrf)).status(),
        200
    );

    // Signing out ends the session for the API too.
    let out = http()
        .delete(d.url("/ui/session"))
        .header("cookie", &full)
        .header("x-sluice-csrf", &full_csrf)
        .send()
        .expect("DELETE");
    assert_eq!(out.status(), 204);
    let after = http()
        .get(d.url("/v1/status"))
        .header("cookie", &full)
        .send()
        .expect("GET");
    assert_eq!(after.status(), 401);

    let log = d.log();
    assert!(log.contains("console sign-in refused"), "{log}");
    assert!(
        !log.contains(FULL) && !log.contains(READ),
        "tokens are never logged"
    );
    assert!(!log.contains(&full_csrf), "CSRF tokens are never logged");
}

#[test]
fn without_tokens_the_console_is_open_like_the_api() {
    let d = start(false);
    let session: Value = http()
        .get(d.url("/ui/session"))
        .send()
        .expect("GET")
        .json()
        .expect("JSON");
    assert_eq!(session["role"], "open");
}

#[test]
fn the_stage_view_has_its_config_and_history_and_a_selection_redrives_alone() {
    let d = start(false);
    let messages: Vec<Msg> = (0..6).map(|i| Msg::new(format!("m{i}"), "hello")).collect();
    d.publish("in", &messages);
    d.wait_until("six dead letters", Duration::from_secs(30), |d| {
        d.get("/v1/dlq/shop/check")["entries"]
            .as_array()
            .is_some_and(|e| e.len() == 6)
    });

    let detail = d.get("/v1/stages/shop/work");
    assert_eq!(detail["kind"], "plugin");
    assert_eq!(detail["config"]["subscribe"]["topic"], "in", "{detail}");
    assert_eq!(detail["config"]["publish"], json!(["out"]), "{detail}");
    assert_eq!(detail["history"]["interval_seconds"], 10);
    d.wait_until(
        "a history point with the six",
        Duration::from_secs(40),
        |d| {
            let points = d.get("/v1/stages/shop/work")["history"]["points"].clone();
            let ok: u64 = points
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["outcomes"]["ok"].as_u64())
                .sum();
            ok == 6
        },
    );
    let points = d.get("/v1/stages/shop/work")["history"]["points"].clone();
    let busy = points
        .as_array()
        .expect("points")
        .iter()
        .find(|p| p["outcomes"]["ok"].as_u64().is_some_and(|n| n > 0))
        .expect("a busy point");
    assert!(
        busy["p50_seconds"].as_f64().is_some_and(|s| s > 0.0),
        "{busy}"
    );
    assert!(
        busy["p99_seconds"].as_f64() >= busy["p50_seconds"].as_f64(),
        "{busy}"
    );
    // Each point's rate is what it settled over its interval (10 s): the
    // six published over however many points they fell in. The interval a
    // rate implies (settled / rate) may run long on a loaded machine, hence
    // the wide band; a rate per minute, per millisecond or over the
    // counters' totals falls far outside it.
    let interval = detail["history"]["interval_seconds"]
        .as_f64()
        .expect("interval");
    let mut settled_total = 0;
    for point in points.as_array().expect("points") {
        let settled: u64 = point["outcomes"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(_, n)| n.as_u64())
            .sum();
        settled_total += settled;
        let rate = point["processed_per_sec"].as_f64().expect("a rate");
        if settled == 0 {
            assert_eq!(rate, 0.0, "a rate with nothing settled: {point}");
            continue;
        }
        let implied = settled as f64 / rate;
        assert!(
            (interval / 2.0..=interval * 6.0).contains(&implied),
            "{settled} settled at {rate}/s implies an interval of {implied:.1} s, not about {interval} s: {point}"
        );
    }
    assert_eq!(settled_total, 6, "the six published: {points}");
    // The failing stage's points count its dead letters.
    d.wait_until(
        "the check stage's dead letters",
        Duration::from_secs(40),
        |d| {
            let points = d.get("/v1/stages/shop/check")["history"]["points"].clone();
            points
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["outcomes"]["dead-lettered"].as_u64())
                .sum::<u64>()
                == 6
        },
    );
    let points = d.get("/v1/stages/shop/check")["history"]["points"].clone();
    let rejected: u64 = points
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["failures"]["rejected"].as_u64())
        .sum();
    assert_eq!(rejected, 6, "failures by kind: {points}");
    assert!(
        d.metrics_text().contains(
            "sluice_dead_letters_total{pipeline=\"shop\",stage=\"check\",kind=\"rejected\"} 6"
        ),
        "{}",
        d.metrics_text()
    );
    let unknown = http()
        .get(d.url("/v1/stages/shop/nope"))
        .send()
        .expect("GET");
    assert_eq!(unknown.status(), 404);

    // Two picked by seq: listed alone, and a dry run counts just them.
    let entries = d.get("/v1/dlq/shop/check")["entries"].clone();
    let seqs: Vec<u64> = entries
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect();
    let picked = [seqs[1], seqs[4]];
    let listed = d.get(&format!(
        "/v1/dlq/shop/check?seq={}&seq={}",
        picked[0], picked[1]
    ));
    let listed: Vec<u64> = listed["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(listed, picked);
    let dry = d.post(
        "/v1/dlq/shop/check/redrive",
        json!({ "dry_run": true, "filter": { "seq": picked } }),
    );
    assert_eq!(dry["redriven"], 2, "{dry}");
    let purged = d.post(
        "/v1/dlq/shop/check/purge",
        json!({ "limit": 10, "filter": { "seq": [picked[0]] } }),
    );
    assert_eq!(purged["purged"], 1, "{purged}");
    let left = d.get("/v1/dlq/shop/check")["entries"]
        .as_array()
        .map(Vec::len);
    assert_eq!(left, Some(5));
    let bad = http()
        .get(d.url("/v1/dlq/shop/check?seq=first"))
        .send()
        .expect("GET");
    assert_eq!(bad.status(), 400);
}
