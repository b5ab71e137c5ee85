//! `sluice plugin test`, the real binary against real plugins.

use sluice_tests::sluice_bin;
use std::process::{Command, Output, Stdio};

fn sluice(args: &[&str]) -> Output {
    Command::new(sluice_bin())
        .args(args)
        .env("SLUICE_LOG", "warn")
        .env_remove("SLUICE_CACHE_DIR")
        .arg("--no-cache")
        .stdin(Stdio::null())
        .output()
        .expect("run sluice")
}

fn plugin(name: &str) -> String {
    sluice_harness::plugin(name).display().to_string()
}

fn json_lines(output: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[test]
fn uppercase_prints_hello_upper_cased() {
    let out = sluice(&["plugin", "test", &plugin("uppercase"), "--data", "hello"]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let emits = json_lines(&out);
    assert_eq!(emits.len(), 1);
    assert_eq!(emits[0]["payload"], "HELLO");
    assert_eq!(emits[0]["topic"], "out");
}

#[test]
fn flags_reach_the_handler() {
    let out = sluice(&[
        "plugin",
        "test",
        &plugin("router"),
        "--data",
        r#"{"kind":"refund"}"#,
        "--key",
        "k9",
        "--header",
        "a=b=c",
        "--config",
        "field=kind",
        "--config",
        "route.refund=payments.refunds",
        "--publish",
        "payments.refunds",
    ]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let emits = json_lines(&out);
    assert_eq!(emits[0]["topic"], "payments.refunds");
    assert_eq!(emits[0]["key"], "k9");
    assert_eq!(emits[0]["headers"], serde_json::json!([["a", "b=c"]]));
}

#[test]
fn binary_payloads_are_printed_as_base64() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("payload.bin");
    std::fs::write(&file, [0xff, b'a', 0x00]).expect("write");
    let out = sluice(&[
        "plugin",
        "test",
        &plugin("identity"),
        "--file",
        file.to_str().expect("utf-8 path"),
    ]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let emits = json_lines(&out);
    assert_eq!(emits[0]["payload_base64"], "/2EA");
    assert!(emits[0].get("payload").is_none());
}

#[test]
fn failures_print_the_kind_and_exit_1() {
    let cases: [(&[&str], &str); 4] = [
        (&["router", "--data", "not json"], "rejected: "),
        (&["spin", "--timeout", "200ms"], "timeout: "),
        (&["stackbomb"], "trap: "),
        (&["membomb", "--memory", "32MiB"], "out-of-memory: "),
    ];
    for (args, prefix) in cases {
        let path = plugin(args[0]);
        let mut full = vec!["plugin", "test", path.as_str()];
        full.extend(&args[1..]);
        let out = sluice(&full);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.lines().any(|l| l.starts_with(prefix)),
            "{args:?}: expected a line starting {prefix:?}, got {stderr}"
        );
        assert!(out.stdout.is_empty(), "nothing is emitted on failure");
    }
}

#[test]
fn bad_files_and_flags_exit_2_with_one_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = dir.path().join("readme.wasm");
    std::fs::write(&text, "hello").expect("write");
    let out = sluice(&["plugin", "test", text.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one error: {stderr}");
    assert!(
        stderr.contains("readme.wasm") && stderr.contains("not a WebAssembly file"),
        "{stderr}"
    );

    let out = sluice(&["plugin", "test", &plugin("uppercase"), "--timeout", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected a duration"));
}

/// Runs `plugin test` on `chatty` with logs at `info` and returns stderr.
fn chatty_stderr(config: &[&str]) -> String {
    let path = plugin("chatty");
    let mut cmd = Command::new(sluice_bin());
    cmd.args(["plugin", "test", &path, "--no-cache", "--data", "x"])
        .env("SLUICE_LOG", "info")
        .stdin(Stdio::null());
    for entry in config {
        cmd.args(["--config", entry]);
    }
    let out = cmd.output().expect("run sluice");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn guest_stdout_stderr_and_log_reach_the_host_log() {
    let stderr = chatty_stderr(&["lines=2"]);
    for channel in ["stdout line 0", "stderr line 1", "log line 1"] {
        assert!(
            stderr.contains(channel),
            "{channel:?} missing from the log:\n{stderr}"
        );
    }
}

#[test]
fn guest_output_is_capped_per_call() {
    // 3 channels x 2000 lines x 200 bytes = 1.2 MB written; the default budget is 64 KiB.
    let stderr = chatty_stderr(&["lines=2000", "bytes=200"]);
    assert!(
        stderr.len() < 200_000,
        "log output is bounded, got {} bytes",
        stderr.len()
    );
    assert!(
        stderr.contains("dropped"),
        "the drop is reported:\n{}",
        &stderr[stderr.len().saturating_sub(500)..]
    );
}

/// A handler that reads secrets (contract 0.2.0) is tested offline with
/// `--secret NAME=env:VAR` or `file:PATH`: without one it is refused as on
/// a stage that grants none; a value given in place of a source is refused
/// without being repeated; the value is removed from a reject's reason.
#[test]
fn secrets_are_granted_with_their_source_never_their_value() {
    let reader = plugin("secret-reader");
    let value = "offline-Tok-5150";
    let run = |args: &[&str]| {
        let out = Command::new(sluice_bin())
            .args(["plugin", "test", &reader])
            .args(args)
            .env("SLUICE_TEST_OFFLINE_TOKEN", value)
            .stdin(Stdio::null())
            .output()
            .expect("sluice runs");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out, stderr)
    };
    let (out, stderr) = run(&["--data", "emit"]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("sluice:plugin/secrets@0.2.0") && stderr.contains("--secret NAME=env:VAR"),
        "{stderr}"
    );

    let granted = ["--secret", "token=env:SLUICE_TEST_OFFLINE_TOKEN"];
    let (out, stderr) = run(&[&["--data", "emit"][..], &granted].concat());
    assert!(out.status.success(), "{stderr}");
    assert_eq!(json_lines(&out)[0]["payload"], value);

    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{value}\n")).expect("write");
    let from_file = format!("token=file:{}", file.display());
    let (out, stderr) = run(&["--data", "emit", "--secret", &from_file]);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        json_lines(&out)[0]["payload"],
        value,
        "one trailing newline dropped"
    );

    let (out, stderr) = run(&[&["--data", "reject"][..], &granted].concat());
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refused with [secret token]") && !stderr.contains(value),
        "{stderr}"
    );

    let (out, stderr) = run(&["--data", "emit", "--secret", "token=plain-guess-9"]);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`env:VAR` or `file:PATH`") && !stderr.contains("plain-guess-9"),
        "{stderr}"
    );
}

/// A handler that uses state is tested offline: a case gives the store
/// before the call and the keys it must hold after; a call that fails
/// leaves the store as it was.
#[test]
fn cases_give_the_state_before_a_call_and_check_it_after() {
    let dir = tempfile::tempdir().expect("dir");
    let cases = dir.path().join("cases.yaml");
    std::fs::write(
        &cases,
        r#"
cases:
  - name: counts on from the stored value
    input: { payload: inc, key: a }
    state: { count/a: "41" }
    expect:
      emits: [{ payload: "a 42" }]
      state: { count/a: "42" }
  - name: a rejected call writes nothing
    input: { payload: reject, key: b }
    expect:
      rejected: "after a write"
      state: { left/b: null }
  - name: a lock held by another stays
    input: { payload: lock B 1000 }
    state: { lock: A }
    expect:
      emits: [{ payload: held }]
      state: { lock: A }
  - name: a wrong expectation is shown
    input: { payload: inc, key: a }
    expect:
      ok: true
      state: { count/a: "99" }
"#,
    )
    .expect("write");
    let out = sluice(&[
        "plugin",
        "test",
        &plugin("stateful"),
        "--cases",
        &cases.display().to_string(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("3 passed, 1 failed"), "{text}");
    assert!(
        text.contains("FAIL  a wrong expectation is shown")
            && text.contains(r#"state `count/a`: expected "99", got "1""#),
        "{text}"
    );

    // One message: what the call would commit is said on stderr.
    let out = sluice(&[
        "plugin",
        "test",
        &plugin("stateful"),
        "--data",
        "inc",
        "--key",
        "k",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("state: count/k = 1"),
        "{out:?}"
    );
}

#[test]
fn cases_answer_http_requests_from_their_exchanges_without_a_server() {
    let dir = tempfile::tempdir().expect("dir");
    let cases = dir.path().join("cases.yaml");
    std::fs::write(
        &cases,
        r#"
cases:
  - name: a charge is answered
    input: { payload: "POST https://payments.example.com/charge order-7" }
    http:
      - request: { method: POST, url: "https://payments.example.com/charge" }
        response: { status: 201, body: created }
    expect:
      emits: [{ payload: "status 201 created" }]
  - name: a redirect is followed with a new request
    input: { payload: "GET https://a.example.com/old" }
    http:
      - request: { url: "https://b.example.com/new" }
        response: { body: moved }
      - request: { url: "https://a.example.com/old" }
        response: { status: 302, headers: { location: "https://b.example.com/new" } }
    expect:
      emits: [{ payload: "status 200 moved" }]
  - name: a request no exchange matches
    input: { payload: "GET https://elsewhere.example.com/x" }
    expect: { ok: true }
  - name: an exchange that is never used
    input: { payload: "GET https://a.example.com/one" }
    http:
      - request: { url: "https://a.example.com/one" }
      - request: { url: "https://a.example.com/two" }
    expect: { ok: true }
"#,
    )
    .expect("write");
    let out = sluice(&[
        "plugin",
        "test",
        &plugin("fetcher"),
        "--cases",
        &cases.display().to_string(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("2 passed, 2 failed"), "{text}");
    assert!(
        text.contains("http: unexpected request GET https://elsewhere.example.com/x"),
        "{text}"
    );
    assert!(
        text.contains("http: expected request ANY https://a.example.com/two was not made"),
        "{text}"
    );

    // One message, no cases: the request is refused, and said so.
    let out = sluice(&[
        "plugin",
        "test",
        &plugin("fetcher"),
        "--data",
        "GET https://api.example.com/",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("error"),
        "{out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a single run makes no requests"),
        "{out:?}"
    );
}
