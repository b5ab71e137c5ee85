//! The admin API locked down, against the real `sluice run` binary:
//!
//! - with tokens set, a `/v1` call without one is 401 (`WWW-Authenticate:
//!   Bearer`), the read token reads but a write with it is 403, and the
//!   probes and `/metrics` stay open;
//! - a JSON endpoint refuses a `text/plain` body (415), a foreign `Host`
//!   is refused (DNS rebinding), and so is a POST from another site's page
//!   (`Origin`), ingest included;
//! - a non-loopback `--admin` without a token exits 2 unless
//!   `--admin-insecure`;
//! - an address that guesses 10 wrong tokens in a minute is refused (429,
//!   a valid token too) while loopback goes on;
//! - the CLI sends the token from the environment or a file, and says
//!   which variable to set when it has none or only the read one;
//! - TLS: the daemon serves HTTPS with a certificate made here, and the CLI
//!   reaches it with `--admin-ca`;
//! - slow clients: hundreds of idle sockets neither delay a request nor
//!   stay open past the header timeout;
//! - health: liveness and readiness; metrics in the format their content
//!   type names.
//!
//! Tokens never appear in the daemon's log.

use std::io::Read;
use std::net::TcpStream;
use std::process::Output;
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serde_json::Value;
use sluice_tests::{Daemon, Exited, plugin};

const FULL: &str = "full-token-3f9a1c";
const READ: &str = "read-token-77be20";

/// A pipeline `shop`: `in` -> stage `work` (uppercase) -> `out`.
fn shop_yaml() -> String {
    format!(
        r#"
name: shop
topics: [in, out]
stages:
  - name: work
    subscribe: in
    plugin: {plugin}
    publish: [out]
"#,
        plugin = plugin("uppercase"),
    )
}

/// The `shop` pipeline in a directory of its own, with `args` after it
/// and `env`; ready.
fn start_shop(args: &[&str], env: &[(&str, &str)]) -> Daemon {
    start_yaml(&shop_yaml(), args, env)
}

/// [`start_shop`] with another pipeline.
fn start_yaml(yaml: &str, args: &[&str], env: &[(&str, &str)]) -> Daemon {
    Daemon::with_yaml(yaml)
        .args(args)
        .envs(env.iter().copied())
        .start()
}

/// [`start_shop`], or its log and exit status when it exits first.
fn try_start_shop(args: &[&str], env: &[(&str, &str)]) -> Result<Daemon, Exited> {
    Daemon::with_yaml(&shop_yaml())
        .args(args)
        .envs(env.iter().copied())
        .try_start()
}

fn http() -> Client {
    sluice_tests::http_client(Duration::from_secs(30))
}

fn with_tokens() -> Daemon {
    start_shop(
        &[],
        &[
            ("SLUICE_ADMIN_TOKEN", FULL),
            ("SLUICE_ADMIN_READ_TOKEN", READ),
        ],
    )
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn tokens_gate_every_v1_call_and_probes_stay_open() {
    let d = with_tokens();
    let http = http();
    let bearer = |t: &str| format!("Bearer {t}");

    let none = http.get(d.url("/v1/status")).send().expect("GET");
    assert_eq!(none.status(), 401);
    assert!(
        none.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("Bearer")),
        "{:?}",
        none.headers()
    );
    let body: Value = none.json().expect("JSON error");
    assert_eq!(body["code"], "unauthorized");
    for path in ["/v1/topics", "/v1/topics/in/messages", "/v1/dlq/shop/work"] {
        let r = http.get(d.url(path)).send().expect("GET");
        assert_eq!(r.status(), 401, "{path}");
    }
    let wrong = http
        .get(d.url("/v1/status"))
        .header("authorization", bearer("guess"))
        .send()
        .expect("GET");
    assert_eq!(wrong.status(), 401);

    for token in [READ, FULL] {
        let r = http
            .get(d.url("/v1/status"))
            .header("authorization", bearer(token))
            .send()
            .expect("GET");
        assert_eq!(r.status(), 200);
        let r = http
            .get(d.url("/v1/dlq/shop/work"))
            .header("authorization", bearer(token))
            .send()
            .expect("GET");
        assert_eq!(r.status(), 200);
    }

    // A write with the read token: 403, and nothing purged or published.
    let purge = http
        .post(d.url("/v1/dlq/shop/work/purge"))
        .header("authorization", bearer(READ))
        .header("content-type", "application/json")
        .body(r#"{"all":true}"#)
        .send()
        .expect("POST");
    assert_eq!(purge.status(), 403);
    let ingest = http
        .post(d.url("/v1/topics/out/messages"))
        .header("authorization", bearer(READ))
        .body("x")
        .send()
        .expect("POST");
    assert_eq!(ingest.status(), 403);
    let none = http
        .post(d.url("/v1/topics/out/messages"))
        .body("x")
        .send()
        .expect("POST");
    assert_eq!(none.status(), 401);

    // The full token publishes.
    let ok = http
        .post(d.url("/v1/topics/out/messages"))
        .header("authorization", bearer(FULL))
        .body("hello")
        .send()
        .expect("POST");
    assert_eq!(ok.status(), 202);
    let stats: Value = http
        .get(d.url("/v1/topics/out"))
        .header("authorization", bearer(READ))
        .send()
        .expect("GET")
        .json()
        .expect("JSON");
    assert_eq!(stats["depth"], 1, "{stats}");

    // Probes and metrics need no token.
    for path in ["/health", "/health/live", "/health/ready", "/metrics"] {
        let r = http.get(d.url(path)).send().expect("GET");
        assert_eq!(r.status(), 200, "{path}");
    }

    // Mutating calls are logged with client and role; tokens never are.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.log().contains("role=\"full\"") && !d.log().contains("role=full") {
        assert!(Instant::now() < deadline, "no audit line:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = d.log();
    assert!(log.contains("127.0.0.1:"), "{log}");
    assert!(!log.contains(FULL) && !log.contains(READ), "{log}");
}

#[test]
fn browsers_cannot_reach_in_by_body_type_host_or_origin() {
    let d = with_tokens();
    let http = http();
    let auth = format!("Bearer {FULL}");

    // A text/plain purge (a CORS simple request) is not JSON: 415.
    let plain = http
        .post(d.url("/v1/dlq/shop/work/purge"))
        .header("authorization", &auth)
        .header("content-type", "text/plain")
        .body(r#"{"all":true}"#)
        .send()
        .expect("POST");
    assert_eq!(plain.status(), 415);
    let json = http
        .post(d.url("/v1/dlq/shop/work/purge"))
        .header("authorization", &auth)
        .header("content-type", "application/json")
        .body(r#"{"all":true}"#)
        .send()
        .expect("POST");
    assert_eq!(json.status(), 200);

    // DNS rebinding: another name in Host.
    let evil = http
        .get(d.url("/v1/status"))
        .header("authorization", &auth)
        .header("host", "evil.example")
        .send()
        .expect("GET");
    assert!(
        evil.status() == 421 || evil.status() == 403,
        "{}",
        evil.status()
    );
    let body: Value = evil.json().expect("JSON error");
    assert!(
        body["error"].as_str().unwrap_or_default().contains("Host"),
        "{body}"
    );
    let localhost = http
        .get(d.url("/v1/status"))
        .header("authorization", &auth)
        .header("host", d.addr.replace("127.0.0.1", "localhost"))
        .send()
        .expect("GET");
    assert_eq!(localhost.status(), 200);

    // A page of another site POSTing: refused, ingest included, and
    // nothing is stored.
    for path in ["/v1/topics/out/messages", "/v1/dlq/shop/work/purge"] {
        let r = http
            .post(d.url(path))
            .header("authorization", &auth)
            .header("origin", "http://evil.example")
            .header("content-type", "application/json")
            .body("{\"all\":true}")
            .send()
            .expect("POST");
        assert_eq!(r.status(), 403, "{path}");
    }
    let stats: Value = http
        .get(d.url("/v1/topics/out"))
        .header("authorization", &auth)
        .send()
        .expect("GET")
        .json()
        .expect("JSON");
    assert_eq!(stats["depth"], 0, "{stats}");
    // The daemon's own origin is fine.
    let same = http
        .post(d.url("/v1/topics/out/messages"))
        .header("authorization", &auth)
        .header("origin", &d.base)
        .body("ok")
        .send()
        .expect("POST");
    assert_eq!(same.status(), 202);
}

#[test]
fn a_non_loopback_bind_needs_a_token_or_admin_insecure() {
    let refused = try_start_shop(&["--admin", "0.0.0.0:0"], &[]);
    match refused {
        Ok(_) => panic!("the daemon started on 0.0.0.0 without a token"),
        Err(Exited { log, status }) => {
            assert_eq!(status.and_then(|s| s.code()), Some(2), "{log}");
            assert!(log.contains("SLUICE_ADMIN_TOKEN"), "{log}");
            assert!(log.contains("--admin-insecure"), "{log}");
        }
    }
    let insecure = start_shop(&["--admin", "0.0.0.0:0", "--admin-insecure"], &[]);
    assert!(insecure.addr.starts_with("0.0.0.0:"), "{}", insecure.addr);
    let port = insecure.addr.rsplit(':').next().expect("port");
    let status = http()
        .get(format!("http://127.0.0.1:{port}/v1/status"))
        .send()
        .expect("GET");
    assert_eq!(status.status(), 200);
    let with_token = start_shop(&["--admin", "0.0.0.0:0"], &[("SLUICE_ADMIN_TOKEN", FULL)]);
    assert!(with_token.addr.starts_with("0.0.0.0:"));
}

#[test]
fn an_address_that_guesses_tokens_is_refused_for_a_while() {
    // Loopback is never refused: the guesses come from another address of
    // this machine, one root adds (and removes again) when it has none.
    let from = match sluice_harness::skip::OutsideAddress::get() {
        Ok(from) => from,
        Err(reason) => {
            sluice_harness::skip::skip(
                "an_address_that_guesses_tokens_is_refused_for_a_while",
                reason,
                "this machine has no address but loopback to send from, and none could be added",
            );
            return;
        }
    };
    let ip = from.ip();
    let d = start_shop(&["--admin", "0.0.0.0:0"], &[("SLUICE_ADMIN_TOKEN", FULL)]);
    let port = d.addr.rsplit(':').next().expect("port");
    let outside = format!("http://{ip}:{port}");
    let http = http();
    let status = |token: &str| {
        http.get(format!("{outside}/v1/status"))
            .bearer_auth(token)
            .send()
            .expect("GET")
    };
    assert_eq!(status(FULL).status(), 200, "reachable from {ip}");
    // Nine wrong guesses, bearer and console sign-in alike: still let in.
    for i in 0..9 {
        let wrong = if i % 2 == 0 {
            status(&format!("guess-{i}")).status()
        } else {
            http.post(format!("{outside}/ui/session"))
                .header("content-type", "application/json")
                .body(format!(r#"{{"token": "guess-{i}"}}"#))
                .send()
                .expect("sign in")
                .status()
        };
        assert_eq!(wrong, 401, "guess {i}");
    }
    // No token at all is not a guess.
    let bare = http
        .get(format!("{outside}/v1/status"))
        .send()
        .expect("GET");
    assert_eq!(bare.status(), 401);
    assert_eq!(status(FULL).status(), 200, "nine guesses do not block");
    assert_eq!(status("guess-10").status(), 401);
    // The tenth blocked the address: the right token is refused too.
    let refused = status(FULL);
    assert_eq!(refused.status(), 429);
    let after: u64 = refused
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After in seconds");
    assert!((290..=300).contains(&after), "Retry-After {after}");
    let body: Value = refused.json().expect("JSON");
    assert_eq!(body["code"], "too_many_auth_failures", "{body}");
    let sign_in = http
        .post(format!("{outside}/ui/session"))
        .header("content-type", "application/json")
        .body(format!(r#"{{"token": "{FULL}"}}"#))
        .send()
        .expect("sign in");
    assert_eq!(sign_in.status(), 429);
    // Loopback is not refused, and the probes stay open to everyone.
    let local = http
        .get(format!("http://127.0.0.1:{port}/v1/status"))
        .bearer_auth(FULL)
        .send()
        .expect("GET");
    assert_eq!(local.status(), 200);
    let live = http
        .get(format!("{outside}/health/live"))
        .send()
        .expect("GET");
    assert_eq!(live.status(), 200);
    // The log is written as it goes: wait for the line.
    d.wait_until("the refusal in the log", Duration::from_secs(10), |d| {
        d.log().contains("failed authentications")
    });
    let log = d.log();
    assert!(log.contains(&ip.to_string()), "{log}");
    assert!(!log.contains(FULL), "a token reached the log");
}

#[test]
fn the_cli_sends_the_token_from_the_environment_or_a_file() {
    let d = with_tokens();
    let dir = tempfile::tempdir().expect("tempdir");
    let full_file = dir.path().join("full");
    std::fs::write(&full_file, format!("{FULL}\n")).expect("write");
    let read_file = dir.path().join("read");
    std::fs::write(&read_file, READ).expect("write");
    let full_flag = full_file.display().to_string();
    let read_flag = read_file.display().to_string();

    let out = d.cli(
        &["publish", "out", "--data", "from-env"],
        &[("SLUICE_ADMIN_TOKEN", FULL)],
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = d.cli(
        &[
            "publish",
            "out",
            "--data",
            "from-file",
            "--admin-token-file",
            &full_flag,
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = d.cli(&["status", "--admin-read-token-file", &read_flag], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = d.cli(&["status"], &[("SLUICE_ADMIN_READ_TOKEN", READ)]);
    assert!(out.status.success(), "{}", text(&out));
    let out = d.cli(
        &["tail", "out", "--from-start", "--count", "2"],
        &[("SLUICE_ADMIN_TOKEN", FULL)],
    );
    assert!(out.status.success(), "{}", text(&out));
    let tail = String::from_utf8_lossy(&out.stdout);
    assert!(
        tail.contains("from-env") && tail.contains("from-file"),
        "{tail}"
    );

    // No token: a clear error naming the variable and flag.
    let out = d.cli(&["status"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SLUICE_ADMIN_TOKEN") && err.contains("--admin-token-file"),
        "{err}"
    );
    // The read token on a write: says it is read-only and what to set.
    let out = d.cli(
        &["dlq", "purge", "shop/work", "--all"],
        &[("SLUICE_ADMIN_READ_TOKEN", READ)],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("read-only") && err.contains("SLUICE_ADMIN_TOKEN"),
        "{err}"
    );
    assert!(!err.contains(READ), "{err}");
    // A wrong token: refused, named by its source, not printed.
    let out = d.cli(&["status"], &[("SLUICE_ADMIN_TOKEN", "nope-nope")]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SLUICE_ADMIN_TOKEN") && !err.contains("nope-nope"),
        "{err}"
    );
}

#[test]
fn tls_serves_https_and_the_cli_trusts_it_with_admin_ca() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("a self-signed certificate");
    let cert_file = dir.path().join("admin.crt");
    let key_file = dir.path().join("admin.key");
    std::fs::write(&cert_file, cert.cert.pem()).expect("write cert");
    std::fs::write(&key_file, cert.signing_key.serialize_pem()).expect("write key");
    let cert_flag = cert_file.display().to_string();
    let key_flag = key_file.display().to_string();

    let d = start_shop(
        &["--admin-tls-cert", &cert_flag, "--admin-tls-key", &key_flag],
        &[("SLUICE_ADMIN_TOKEN", FULL)],
    );
    assert!(d.base.starts_with("https://"), "{}", d.base);

    let out = d.cli(
        &[
            "publish",
            "out",
            "--data",
            "over-tls",
            "--admin-ca",
            &cert_flag,
        ],
        &[("SLUICE_ADMIN_TOKEN", FULL)],
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = d.cli(
        &["status"],
        &[
            ("SLUICE_ADMIN_TOKEN", FULL),
            ("SLUICE_ADMIN_CA", &cert_flag),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    // Without the CA the certificate is not trusted: a clear error.
    let out = d.cli(&["status"], &[("SLUICE_ADMIN_TOKEN", FULL)]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--admin-ca"),
        "{}",
        text(&out)
    );
    // Plain HTTP to the TLS port gets no answer.
    let plain = http()
        .get(format!("http://{}/health", d.addr))
        .send()
        .map(|r| r.status().as_u16());
    assert!(!matches!(plain, Ok(200)), "{plain:?}");
    // A client that trusts the certificate reads the probes.
    let trusted = Client::builder()
        .no_proxy()
        .tls_certs_only([reqwest::Certificate::from_pem(cert.cert.pem().as_bytes()).expect("pem")])
        .build()
        .expect("client");
    let ready = trusted.get(d.url("/health/ready")).send().expect("GET");
    assert_eq!(ready.status(), 200);
}

#[test]
fn idle_sockets_neither_delay_a_request_nor_outstay_the_header_timeout() {
    let d = start_shop(&[], &[("SLUICE_ADMIN_HEADER_TIMEOUT", "2s")]);
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(&d.addr).expect("connect"))
        .collect();
    let started = Instant::now();
    let r = http().get(d.url("/health")).send().expect("GET");
    assert_eq!(r.status(), 200);
    // Generous: the point is that it is not queued behind 300 sockets.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Each idle socket is closed by the server within its header timeout
    // (2 s; 20 s allows for a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(20);
    for mut socket in idle {
        let left = deadline.saturating_duration_since(Instant::now());
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(10))))
            .expect("timeout");
        let mut buf = Vec::new();
        // Read to EOF: whatever the server wrote before closing (hyper may
        // answer 408), then the close.
        match socket.read_to_end(&mut buf) {
            Ok(_) => {}
            Err(err) => assert!(
                !matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "an idle socket was still open after 20 s: {err}"
            ),
        }
    }
}

#[test]
fn health_splits_liveness_from_readiness_and_metrics_match_their_type() {
    let d = start_shop(&[], &[]);
    let http = http();
    let live: Value = http
        .get(d.url("/health/live"))
        .send()
        .expect("GET")
        .json()
        .expect("JSON");
    assert_eq!(live["status"], "ok");
    let ready = http.get(d.url("/health/ready")).send().expect("GET");
    assert_eq!(ready.status(), 200);
    let ready: Value = ready.json().expect("JSON");
    assert_eq!(ready["status"], "ready", "{ready}");
    assert!(ready["reasons"].as_array().is_some_and(Vec::is_empty));

    // Ingest answers are counted by status.
    let ok = http
        .post(d.url("/v1/topics/out/messages"))
        .body("x")
        .send()
        .expect("POST");
    assert_eq!(ok.status(), 202);
    let bad = http
        .post(d.url("/v1/topics/out/messages"))
        .body("")
        .send()
        .expect("POST");
    assert_eq!(bad.status(), 400);

    let plain = http.get(d.url("/metrics")).send().expect("GET");
    assert_eq!(
        plain.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let body = plain.text().expect("text");
    assert!(
        body.contains("# TYPE sluice_messages_published_total counter"),
        "{body}"
    );
    assert!(!body.contains("# EOF"), "{body}");
    assert!(
        body.contains("sluice_ingest_responses_total{status=\"202\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("sluice_ingest_responses_total{status=\"400\"} 1"),
        "{body}"
    );
    assert!(
        body.contains("sluice_ingest_responses_total{status=\"429\"} 0"),
        "{body}"
    );
    assert!(body.contains("sluice_storage_errors_total 0"), "{body}");
    // The store says where its memory goes: the accepted message sits in
    // the `messages` memtable.
    let memtable: u64 = body
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"sluice_store_memory_bytes{keyspace="messages",part="memtables"} "#)
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no messages memtable gauge:\n{body}"));
    assert!(memtable > 0, "{body}");
    for name in [
        r#"sluice_store_memory_bytes{keyspace="*",part="cache"}"#,
        r#"sluice_store_memory_bytes{keyspace="pending",part="filters"}"#,
        r#"sluice_store_tables{keyspace="messages"}"#,
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
        "sluice_build_info{version=",
    ] {
        assert!(body.contains(name), "{name}:\n{body}");
    }
    let om = http
        .get(d.url("/metrics"))
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3",
        )
        .send()
        .expect("GET");
    assert_eq!(
        om.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let body = om.text().expect("text");
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
    assert!(body.contains("# TYPE sluice_messages_published counter"));
}

#[test]
fn ingest_answers_503_with_retry_after_while_the_daemon_drains() {
    let yaml = format!(
        r#"
name: slow
shutdown_timeout: 30s
topics: [in, out]
stages:
  - name: nap
    subscribe: in
    plugin: {sleepy}
    concurrency: 1
    config: {{ms: 4000}}
    publish: [out]
"#,
        sleepy = plugin("sleepy"),
    );
    let mut d = start_yaml(&yaml, &[], &[]);
    let http = http();
    let r = http
        .post(d.url("/v1/topics/in/messages"))
        .body("x")
        .send()
        .expect("POST");
    assert_eq!(r.status(), 202);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status: Value = http
            .get(d.url("/v1/status"))
            .send()
            .expect("GET")
            .json()
            .expect("JSON");
        if status[0]["in_flight"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the message was never taken: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    d.term();
    // While the handler call in hand finishes, ingest says 503.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let r = http
            .post(d.url("/v1/topics/out/messages"))
            .body("late")
            .send()
            .expect("the server answers while it drains");
        if r.status() != 202 {
            break r;
        }
        assert!(Instant::now() < deadline, "ingest still 202 after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().expect("JSON");
    assert_eq!(body["code"], "draining", "{body}");
    let ready = http.get(d.url("/health/ready")).send().expect("GET");
    assert_eq!(ready.status(), 503);
    assert!(ready.headers().contains_key("retry-after"));
    let ready: Value = ready.json().expect("JSON");
    assert_eq!(ready["status"], "not-ready");
    assert!(
        ready["reasons"][0]
            .as_str()
            .unwrap_or_default()
            .contains("draining")
    );
    let live = http.get(d.url("/health/live")).send().expect("GET");
    assert_eq!(live.status(), 200);
    let exit = d.wait();
    assert!(exit.success(), "{exit:?}\n{}", d.log());
}

#[test]
fn request_bodies_in_flight_have_a_global_budget() {
    use std::io::Write;
    let d = start_shop(&[], &[("SLUICE_ADMIN_BODY_BUDGET", "1MiB")]);
    let http = http();
    // A slow client announces 768 KiB and sends a little: its body holds
    // that much of the budget while it dribbles.
    let open_slow = || {
        let mut slow = TcpStream::connect(&d.addr).expect("connect");
        write!(
            slow,
            "POST /v1/topics/out/messages HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n\r\nxxxx",
            d.addr,
            768 << 10
        )
        .expect("write");
        slow.flush().expect("flush");
        slow.set_nonblocking(true).expect("nonblocking");
        slow
    };
    let mut slow = open_slow();
    // Another 512 KiB does not fit beside it: 503 busy, with Retry-After.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let r = http
            .post(d.url("/v1/topics/out/messages"))
            .body(vec![b'a'; 512 << 10])
            .send()
            .expect("POST");
        if r.status() != 202 {
            break r;
        }
        // The slow request was not read yet, or (on a loaded machine) it
        // arrived while this one held the budget and was itself refused:
        // then it has its answer, or was closed, and is sent again.
        if !matches!(slow.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        {
            slow = open_slow();
        }
        assert!(Instant::now() < deadline, "never refused");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().expect("JSON");
    assert_eq!(body["code"], "busy", "{body}");
    // A body larger than the whole budget could never fit: 413, answered
    // from the headers alone. (A client still sending the body may see the
    // connection close before it reads the answer, so ask with headers
    // only and read the answer.)
    let mut huge = TcpStream::connect(&d.addr).expect("connect");
    write!(
        huge,
        "POST /v1/topics/out/messages HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n\r\n",
        d.addr,
        2 << 20
    )
    .expect("write");
    huge.flush().expect("flush");
    huge.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut status_line = [0u8; 12];
    std::io::Read::read_exact(&mut huge, &mut status_line).expect("an answer to the headers");
    assert_eq!(
        &status_line,
        b"HTTP/1.1 413",
        "{}",
        String::from_utf8_lossy(&status_line)
    );
    // Once the slow client is gone, its share comes back.
    drop(slow);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = http
            .post(d.url("/v1/topics/out/messages"))
            .body(vec![b'a'; 512 << 10])
            .send()
            .expect("POST");
        if r.status() == 202 {
            break;
        }
        assert_eq!(r.status(), 503);
        assert!(Instant::now() < deadline, "the budget never came back");
        std::thread::sleep(Duration::from_millis(50));
    }
    let metrics = http
        .get(d.url("/metrics"))
        .send()
        .expect("GET")
        .text()
        .expect("text");
    assert!(
        metrics.contains("sluice_ingest_responses_total{status=\"503\"} ")
            && !metrics.contains("sluice_ingest_responses_total{status=\"503\"} 0"),
        "{metrics}"
    );
}

/// A client that announces a body and goes quiet does not hold its share
/// of the budget for good: past the idle timeout it gets 408 and the
/// budget is free again.
#[test]
fn a_body_that_stops_arriving_is_dropped_and_its_budget_freed() {
    use std::io::{Read, Write};
    let d = start_shop(
        &[],
        &[
            ("SLUICE_ADMIN_BODY_BUDGET", "1MiB"),
            ("SLUICE_ADMIN_BODY_IDLE_TIMEOUT", "1s"),
        ],
    );
    let mut quiet = TcpStream::connect(&d.addr).expect("connect");
    write!(
        quiet,
        "POST /v1/topics/out/messages HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n\r\nxxxx",
        d.addr,
        768 << 10
    )
    .expect("write");
    quiet.flush().expect("flush");
    quiet
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut answer = [0u8; 12];
    quiet.read_exact(&mut answer).expect("an answer");
    assert_eq!(
        &answer,
        b"HTTP/1.1 408",
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // Its 768 KiB are free again: 512 KiB more fit at once (the connection
    // is still open: the client has not gone).
    let r = http()
        .post(d.url("/v1/topics/out/messages"))
        .body(vec![b'a'; 512 << 10])
        .send()
        .expect("POST");
    assert_eq!(r.status(), 202, "{:?}", r.text());
    drop(quiet);
}

#[test]
fn metrics_and_probes_answer_at_once_with_nats_down() {
    let mut nats = sluice_harness::nats::NatsServer::start().expect("nats-server");
    let d = start_shop(&["--broker", &nats.url()], &[]);
    let http = http();
    let body = http
        .get(d.url("/metrics"))
        .send()
        .expect("GET")
        .text()
        .expect("text");
    assert!(body.contains("sluice_queue_depth{"), "{body}");
    nats.stop().expect("stop nats-server");
    for _ in 0..3 {
        let started = Instant::now();
        let r = http.get(d.url("/metrics")).send().expect("GET /metrics");
        assert_eq!(r.status(), 200);
        let body = r.text().expect("text");
        // The last broker gauges are still shown.
        assert!(body.contains("sluice_queue_depth{"), "{body}");
        // It took 10 s before; the scrape waits at most 1 s for the broker.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "/metrics took {:?} with NATS down",
            started.elapsed()
        );
        let started = Instant::now();
        let r = http.get(d.url("/health/ready")).send().expect("GET ready");
        assert!(r.status() == 200 || r.status() == 503, "{}", r.status());
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

#[test]
fn connections_past_the_cap_are_closed_at_once() {
    let d = start_shop(
        &[],
        &[
            ("SLUICE_ADMIN_MAX_CONNECTIONS", "20"),
            ("SLUICE_ADMIN_HEADER_TIMEOUT", "60s"),
        ],
    );
    let held: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(&d.addr).expect("connect"))
        .collect();
    // Let the server accept all twenty.
    std::thread::sleep(Duration::from_millis(500));
    let mut extra = TcpStream::connect(&d.addr).expect("connect");
    extra
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut buf = Vec::new();
    match extra.read_to_end(&mut buf) {
        Ok(_) => assert!(buf.is_empty(), "{}", String::from_utf8_lossy(&buf)),
        Err(err) => assert!(
            !matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "a connection past the cap stayed open: {err}"
        ),
    }
    // The held ones are still open (their header timeout is a minute).
    let mut first = held.into_iter().next().expect("one");
    first
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut byte = [0u8; 1];
    let still_open = matches!(
        std::io::Read::read(&mut first, &mut byte),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
    );
    assert!(still_open, "a connection under the cap was closed");
    drop(first);
    // Once they go, requests are served again.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match http().get(d.url("/health")).send() {
            Ok(r) if r.status() == 200 => break,
            other => {
                assert!(Instant::now() < deadline, "never served again: {other:?}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Issue 27's "read-only": every route that changes something, tried with
/// the read token, is 403 and changes nothing; the same calls with the full
/// token go through (so the 403s are not the routes failing otherwise).
#[test]
fn a_read_token_changes_nothing_through_any_write_route() {
    let d = with_tokens();
    let http = http();
    let call = |token: &str, path: &str, content_type: &str, body: &str| {
        http.post(d.url(path))
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", content_type)
            .body(body.to_owned())
            .send()
            .expect("POST")
            .status()
            .as_u16()
    };
    // A dead letter to redrive and purge: not UTF-8, so the stage rejects it.
    let published = http
        .post(d.url("/v1/topics/in/messages"))
        .header("authorization", format!("Bearer {FULL}"))
        .body(vec![0xffu8, 0xfe])
        .send()
        .expect("POST");
    assert_eq!(published.status(), 202);
    let dlq_depth = || {
        http.get(d.url("/v1/topics/shop.work.dlq"))
            .header("authorization", format!("Bearer {READ}"))
            .send()
            .expect("GET")
            .json::<Value>()
            .expect("JSON")["depth"]
            .as_u64()
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while dlq_depth() != 1 {
        assert!(Instant::now() < deadline, "no dead letter:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(100));
    }

    let json = "application/json";
    let writes: [(&str, &str, &str); 7] = [
        ("/v1/topics/in/messages", "text/plain", "x"),
        (
            "/v1/topics/in/batch",
            "application/x-ndjson",
            "{\"payload\":\"x\"}\n",
        ),
        ("/v1/dlq/shop/work/redrive", json, "{}"),
        ("/v1/dlq/shop/work/purge", json, "{\"all\":true}"),
        ("/v1/stages/shop/work/pause", json, "{}"),
        ("/v1/stages/shop/work/resume", json, "{}"),
        ("/v1/reload", json, "{}"),
    ];
    for (path, content_type, body) in writes {
        assert_eq!(call(READ, path, content_type, body), 403, "{path}");
    }
    let status: Value = http
        .get(d.url("/v1/status"))
        .header("authorization", format!("Bearer {READ}"))
        .send()
        .expect("GET")
        .json()
        .expect("JSON");
    assert_eq!(status[0]["paused"], false, "{status}");
    assert_eq!(dlq_depth(), 1, "the dead letter is still there");
    let reloads: Value = http
        .get(d.url("/v1/reload"))
        .header("authorization", format!("Bearer {READ}"))
        .send()
        .expect("GET")
        .json()
        .expect("JSON");
    assert_eq!(reloads["succeeded"], 0, "{reloads}");
    let published: Value = http
        .get(d.url("/v1/topics/in"))
        .header("authorization", format!("Bearer {READ}"))
        .send()
        .expect("GET")
        .json()
        .expect("JSON");
    assert_eq!(
        published["last_seq"], 1,
        "only the first publish: {published}"
    );

    // The same calls with the full token: each goes through.
    for (path, content_type, body) in writes {
        let status = call(FULL, path, content_type, body);
        assert!((200..300).contains(&status), "{path}: {status}");
    }
}
