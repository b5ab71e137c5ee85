//! Secrets and values from the environment never show, against the real
//! `sluice run` binary:
//!
//! - a pipeline's `secrets:` (one from a variable, one from a file) used by
//!   connector blocks as `{secret:name}`, and a stage `config:` value
//!   written `${VAR}`;
//! - every GET route of the admin API (from its own OpenAPI document), with
//!   the full token and the read token, `/metrics`, `sluice status`,
//!   `sluice validate` and the daemon's log at `debug`: none holds a value.
//!
//! The secrets are in use: the HTTP sink signs with one (the receiver
//! checks the signature), so a test that passed because nothing was
//! resolved would fail here.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use sluice_tests::{Daemon, plugin, sluice_bin};

const FULL: &str = "full-token-secrets-41c2";
const READ: &str = "read-token-secrets-0e7b";
/// The HMAC key of the HTTP sink, from a variable.
const HOOK_KEY: &str = "hook-key-V4lu3-from-env";
/// The Redis password, from a file.
const REDIS_PW: &str = "redis-pw-F1le-s3cret";
/// A stage `config:` value from the environment.
const API_KEY: &str = "api-key-Cf9-from-env";
/// A token the host puts into a handler's outbound requests.
const CALL_TOKEN: &str = "call-t0ken-Hdr-injected";

/// One HTTP request as the receiver saw it: its headers, lowercased
/// names, and body.
struct Request {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// An HTTP receiver (a thread per connection) answering `204` to every
/// request and handing each one over.
fn receiver() -> (String, mpsc::Receiver<Request>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    let mut headers = Vec::new();
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.trim_end().split_once(':') {
                            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
                        }
                    }
                    let len = headers
                        .iter()
                        .find(|(k, _)| k == "content-length")
                        .and_then(|(_, v)| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    let mut body = vec![0; len];
                    if reader.read_exact(&mut body).is_err() {
                        break;
                    }
                    let _ = tx.send(Request { headers, body });
                    if stream
                        .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    (format!("http://{addr}/in"), rx)
}

/// `v1=` of a `Sluice-Signature` header, as the receiver recomputes it.
fn signature(key: &str, t: &str, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).expect("key");
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

#[test]
fn secrets_and_environment_values_appear_in_no_output() {
    let (hook, requests) = receiver();
    let secrets = tempfile::tempdir().expect("dir");
    let pw_file = secrets.path().join("redis-password");
    std::fs::write(&pw_file, format!("{REDIS_PW}\n")).expect("write");
    // Redis on a closed port: its sink is an outage, held and said, with
    // the URL (and its password) in what is said.
    let closed = sluice_harness::process::free_port().expect("port");
    let yaml = format!(
        r#"
name: shop
secrets:
  hook_key: {{env: SLUICE_TEST_HOOK_KEY}}
  redis_pw: {{file: "{pw_file}"}}
  call_token: {{env: SLUICE_TEST_CALL_TOKEN}}
topics: [in, out, calls, called]
stages:
  - name: work
    subscribe: in
    plugin: {plugin}
    publish: [out]
    config: {{api_key: "${{SLUICE_TEST_API_KEY}}", plain: visible}}
  - name: call
    subscribe: calls
    plugin: {fetcher}
    publish: [called]
    http:
      allow: ["{hook_host}"]
      headers:
        "{hook_host}": {{Authorization: "Bearer {{secret:call_token}}"}}
sinks:
  - name: hook
    subscribe: out
    http: {{url: "{hook}", secret: "{{secret:hook_key}}"}}
  - name: cache
    subscribe: out
    redis: {{url: "redis://:{{secret:redis_pw}}@127.0.0.1:{closed}/0", stream: done}}
"#,
        pw_file = pw_file.display(),
        plugin = plugin("uppercase"),
        fetcher = plugin("fetcher"),
        hook_host = hook.trim_start_matches("http://").trim_end_matches("/in"),
    );
    let env = [
        ("SLUICE_ADMIN_TOKEN", FULL),
        ("SLUICE_ADMIN_READ_TOKEN", READ),
        ("SLUICE_TEST_HOOK_KEY", HOOK_KEY),
        ("SLUICE_TEST_API_KEY", API_KEY),
        ("SLUICE_TEST_CALL_TOKEN", CALL_TOKEN),
        ("SLUICE_LOG", "debug"),
    ];
    // Spans exported over OTLP are scanned too.
    let otlp = sluice_tests::otlp::OtlpReceiver::start();
    let d = Daemon::with_yaml(&yaml).envs(env).envs(otlp.env()).start();
    let secret_values = [HOOK_KEY, REDIS_PW, API_KEY, CALL_TOKEN];
    let assert_clean = |what: &str, text: &str| {
        for value in secret_values {
            assert!(
                !text.contains(value),
                "{what} shows a secret value:\n{text}"
            );
        }
    };

    let http = sluice_tests::http_client(Duration::from_secs(30));
    let get = |path: &str, token: &str| -> (u16, String) {
        let res = http
            .get(d.url(path))
            .bearer_auth(token)
            .send()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        (res.status().as_u16(), res.text().unwrap_or_default())
    };

    // In use: the sink signs with the key from the variable.
    let posted = http
        .post(d.url("/v1/topics/in/messages"))
        .bearer_auth(FULL)
        .body("hello")
        .send()
        .expect("POST");
    assert_eq!(posted.status(), 202);
    let request = requests
        .recv_timeout(Duration::from_secs(60))
        .expect("the webhook is called");
    let header = request
        .headers
        .iter()
        .find(|(k, _)| k == "sluice-signature")
        .map(|(_, v)| v.clone())
        .expect("a Sluice-Signature header");
    let (t, v1) = header
        .split_once(",v1=")
        .map(|(t, v)| (t.trim_start_matches("t=").to_owned(), v.to_owned()))
        .expect("t=...,v1=...");
    assert_eq!(
        v1,
        signature(HOOK_KEY, &t, &request.body),
        "signed with the secret"
    );
    // A handler's request carries the token the host put in.
    let called = http
        .post(d.url("/v1/topics/calls/messages"))
        .bearer_auth(FULL)
        .body(format!("GET {hook}"))
        .send()
        .expect("POST");
    assert_eq!(called.status(), 202);
    let request = requests
        .recv_timeout(Duration::from_secs(60))
        .expect("the handler's request");
    assert!(
        request
            .headers
            .iter()
            .any(|(k, v)| k == "authorization" && *v == format!("Bearer {CALL_TOKEN}")),
        "the injected header: {:?}",
        request.headers
    );
    // The Redis sink's outage is said, with its URL (masked) in the reason.
    d.wait_until("the cache sink down", Duration::from_secs(60), |_| {
        get("/v1/status", READ).1.contains("redis://:***@127.0.0.1")
    });

    // The stage shows `config:` as written.
    let (_, stage) = get("/v1/stages/shop/work", READ);
    let stage: Value = serde_json::from_str(&stage).expect("JSON");
    assert_eq!(
        stage["config"]["config"]["api_key"], "${SLUICE_TEST_API_KEY}",
        "{stage}"
    );
    assert_eq!(stage["config"]["config"]["plain"], "visible", "{stage}");

    // Every GET route, both tokens.
    let (_, spec) = get("/v1/openapi.json", FULL);
    let spec: Value = serde_json::from_str(&spec).expect("OpenAPI JSON");
    let paths = spec["paths"].as_object().expect("paths");
    let mut fetched = 0;
    for (path, ops) in paths {
        if ops.get("get").is_none() {
            continue;
        }
        let stages: &[&str] = if path.contains("{stage}") {
            &["work", "call", "hook", "cache"]
        } else {
            &["work"]
        };
        for stage in stages {
            let concrete = path
                .replace("{pipeline}", "shop")
                .replace("{stage}", stage)
                .replace("{topic}", "in");
            for token in [FULL, READ] {
                let (status, body) = get(&concrete, token);
                assert_clean(&format!("GET {concrete} ({status})"), &body);
                fetched += 1;
            }
        }
    }
    assert!(
        fetched >= 10,
        "only {fetched} GETs: is the OpenAPI document complete?"
    );
    let metrics = http
        .get(d.url("/metrics"))
        .send()
        .and_then(|r| r.text())
        .expect("GET /metrics");
    assert_clean("/metrics", &metrics);

    let status = d.cli(&["status"], &[("SLUICE_ADMIN_TOKEN", FULL)]);
    assert!(status.status.success(), "{status:?}");
    assert_clean("sluice status", &String::from_utf8_lossy(&status.stdout));

    let dir = tempfile::tempdir().expect("dir");
    let file = sluice_tests::write_pipeline(dir.path(), "shop", &yaml);
    let validated = Command::new(sluice_bin())
        .args(["validate", "--no-plugins"])
        .arg(&file)
        .envs(env)
        .output()
        .expect("sluice validate");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&validated.stdout),
        String::from_utf8_lossy(&validated.stderr)
    );
    assert!(validated.status.success(), "{said}");
    assert_clean("sluice validate", &said);

    assert_clean("the daemon's log at debug", &d.log());

    // The handler's HTTP call was exported as a client span (whose
    // request carried the injected header): no span holds a value.
    let spans = otlp.wait_for("the handler's HTTP client span", |spans| {
        // OTLP's SpanKind CLIENT is 3.
        spans.iter().any(|s| s["kind"] == 3 && s["name"] == "GET")
    });
    assert_clean(
        "the exported spans",
        &serde_json::to_string(&spans).expect("JSON"),
    );
}

/// A handler on contract 0.2.0 reads the secrets its stage lists, end to
/// end in the daemon: the value reaches what it emits, and never the log
/// (host log, stdout, stderr) nor a dead letter's reason; a name the stage
/// does not list is a reject that names the fix. `validate` refuses the
/// same plugin on a stage that lists no secret, at that stage's plugin,
/// and `run` refuses to start it.
#[test]
fn a_handler_reads_the_secrets_its_stage_lists_and_they_stay_out_of_logs() {
    const VALUE: &str = "guest-Secret-77d1";
    let pipeline = |listed: &str| {
        format!(
            r#"
name: shop
secrets:
  token: {{env: SLUICE_TEST_GUEST_TOKEN}}
topics: [in, out]
stages:
  - name: reader
    subscribe: in
    plugin: {plugin}
    publish: [out]
{listed}    retry: {{max_attempts: 1}}
"#,
            plugin = plugin("secret-reader"),
        )
    };
    let env = [("SLUICE_TEST_GUEST_TOKEN", VALUE), ("SLUICE_LOG", "debug")];
    let d = Daemon::with_yaml(&pipeline("    secrets: [token]\n"))
        .envs(env)
        .start();
    d.publish(
        "in",
        &[
            sluice_tests::Msg::new("m-emit", "emit"),
            sluice_tests::Msg::new("m-log", "log"),
            sluice_tests::Msg::new("m-reject", "reject"),
            sluice_tests::Msg::new("m-trap", "trap"),
            sluice_tests::Msg::new("m-other", "other"),
        ],
    );
    d.wait_until("outputs and dead letters", Duration::from_secs(60), |d| {
        d.depth("out") >= 2 && d.depth("shop.reader.dlq") >= 3
    });
    let out: Vec<String> = d
        .read_all("out")
        .iter()
        .map(|m| m["payload"].as_str().expect("text").to_owned())
        .collect();
    assert_eq!(out, vec![VALUE.to_owned(), "logged".to_owned()]);
    let dead = d.read_all("shop.reader.dlq");
    let reason = |id: &str| {
        let entry = dead
            .iter()
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("no dead letter for {id}: {dead:?}"));
        sluice_tests::header(entry, "sluice-dlq-error")
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(reason("m-reject"), "refused with [secret token]");
    let trap = reason("m-trap");
    assert!(trap.contains("failed holding [secret token]"), "{trap}");
    let other = reason("m-other");
    assert!(
        other.contains("does not list the secret `other`"),
        "{other}"
    );
    let dead_text = serde_json::to_string(&dead).expect("json");
    assert!(!dead_text.contains(VALUE), "a dead letter holds the value");
    let log = d.log();
    assert!(!log.contains(VALUE), "the log holds the value:\n{log}");
    for redacted in [
        "the secret is [secret token]",
        "stdout has [secret token]",
        "stderr has [secret token]",
    ] {
        assert!(log.contains(redacted), "no `{redacted}` in:\n{log}");
    }
    d.term();

    // The same plugin on a stage that grants nothing.
    let dir = tempfile::tempdir().expect("dir");
    let file = sluice_tests::write_pipeline(dir.path(), "shop", &pipeline(""));
    let validated = Command::new(sluice_bin())
        .arg("validate")
        .arg(&file)
        .envs(env)
        .output()
        .expect("sluice validate");
    let said = String::from_utf8_lossy(&validated.stderr).into_owned()
        + &String::from_utf8_lossy(&validated.stdout);
    assert!(!validated.status.success(), "{said}");
    let at = format!("{}:9:13", file.display());
    assert!(
        said.contains(&at)
            && said.contains("sluice:plugin/secrets@0.2.0")
            && said.contains("stage `reader` does not grant"),
        "validate says where and why (`{at}`):\n{said}"
    );
    let run = Command::new(sluice_bin())
        .args(["run", "--admin", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg(&file)
        .stdin(std::process::Stdio::null())
        .envs(env)
        .output()
        .expect("sluice run");
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success() && said.contains("does not grant"),
        "{said}"
    );
}
