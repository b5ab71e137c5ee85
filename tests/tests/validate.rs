//! `sluice validate` and `sluice schema`, the real binary against real
//! pipeline files and real plugins.
//!
//! The malformed corpus lives in `tests/fixtures/malformed/`: each file's
//! first line says where the first error must be reported and a fragment of
//! its message, as `# expect: LINE:COL: fragment`. Files too large to check
//! in (10,000-deep nesting, a file over 1 MiB) are generated here.

use sluice_tests::sluice_bin;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// One compile cache for the whole test binary, as a daemon host has one.
static CACHE: LazyLock<tempfile::TempDir> =
    LazyLock::new(|| tempfile::tempdir().expect("a cache dir"));

const FIXTURES: &str = "tests/fixtures/malformed";

/// How long one `validate` may take before the test calls it hung. Not a
/// speed claim (a loaded 2-core machine makes any tight bound flaky): it
/// catches a rejection that waits on something, such as a server that is
/// not there.
const LIMIT: Duration = Duration::from_secs(30);

fn root() -> PathBuf {
    sluice_harness::repo_root()
}

/// Runs `sluice` in the repository root, so paths print as given.
fn sluice(args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(sluice_bin())
        .args(args)
        .current_dir(root())
        .env("SLUICE_CACHE_DIR", CACHE.path())
        .env("SLUICE_LOG", "warn")
        // The secret pipelines/charge.yaml reads from the environment.
        .env("PAYMENTS_TOKEN", "validate-only")
        .env_remove("SLUICE_TEST_SURELY_UNSET_HOST")
        .stdin(Stdio::null())
        .output()
        .expect("run sluice");
    (out, started.elapsed())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Builds the plugins the fixtures and examples name (once per process).
fn plugins() {
    for name in ["uppercase", "router", "notahandler"] {
        assert!(sluice_harness::plugin(name).is_file());
    }
}

/// Asserts a rejection: exit 2, no panic, the position and message on one
/// stderr line, and within [`LIMIT`]. `line_col` is `LINE:COL`, or `LINE`
/// when any column will do.
fn assert_rejected(path: &str, out: &Output, took: Duration, line_col: &str, fragment: &str) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{path}: exit code; stderr:\n{err}"
    );
    assert!(!err.contains("panicked"), "{path}: panicked:\n{err}");
    let prefix = match line_col.contains(':') {
        true => format!("{path}:{line_col}: "),
        false => format!("{path}:{line_col}:"),
    };
    assert!(
        err.lines()
            .any(|l| l.starts_with(&prefix) && l.contains(fragment)),
        "{path}: expected a line starting `{prefix}` containing `{fragment}`; stderr:\n{err}"
    );
    assert!(took < LIMIT, "{path}: took {took:?}");
}

#[test]
fn the_example_pipelines_validate() {
    plugins();
    let (out, _) = sluice(&[
        "validate",
        "pipelines/quickstart.yaml",
        "pipelines/orders.yaml",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "stderr:\n{}", stderr(&out));
    assert!(
        text.contains("ok: pipelines/quickstart.yaml (pipeline quickstart: 1 stage)"),
        "{text}"
    );
    assert!(
        text.contains("ok: pipelines/orders.yaml (pipeline orders: 3 stages)"),
        "{text}"
    );

    // A directory holds many pipelines.
    let (out, _) = sluice(&["validate", "pipelines"]);
    assert!(out.status.success(), "stderr:\n{}", stderr(&out));
    // One `ok:` line per example, whichever connectors' examples are there.
    let examples = std::fs::read_dir(root().join("pipelines"))
        .expect("pipelines/")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "yaml"))
        })
        .count();
    assert!(examples >= 3, "only {examples} examples");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        examples
    );
}

#[test]
fn every_malformed_file_is_rejected_at_its_line_and_column() {
    plugins();
    // Fill the compile cache first, as a daemon's is after its first start:
    // checking a plugin compiles it (about half a second for a debug build),
    // and that first compile is not what this test measures.
    let _ = sluice(&[
        "validate",
        "pipelines",
        &format!("{FIXTURES}/wrong-world-plugin.yaml"),
    ]);

    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(root().join(FIXTURES))
        .expect("the corpus")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    fixtures.sort();
    assert!(fixtures.len() >= 30, "only {} fixtures", fixtures.len());
    for fixture in fixtures {
        let name = fixture
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a name");
        let path = format!("{FIXTURES}/{name}");
        let text = std::fs::read_to_string(&fixture).expect("read fixture");
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{path}: first line must be `# expect: L:C: fragment`"));
        let mut parts = expect.splitn(3, ':');
        let (line, col, fragment) = (parts.next(), parts.next(), parts.next());
        let (Some(line), Some(col), Some(fragment)) = (line, col, fragment) else {
            panic!("{path}: malformed expectation `{expect}`");
        };
        let line_col = format!("{line}:{col}");
        let (out, took) = sluice(&["validate", &path]);
        assert_rejected(&path, &out, took, &line_col, fragment.trim());
        // The corpus's passwords are `hunter2`: never echoed.
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !said.contains("hunter2"),
            "{path}: a password shows: {said}"
        );

        // `sluice run` refuses it the same way, before it opens the data
        // directory or binds the admin port: no partial daemon.
        let data = tempfile::tempdir().expect("tempdir");
        let data_dir = data.path().join("data");
        let data_arg = data_dir.display().to_string();
        let (out, took) = sluice(&[
            "run",
            &path,
            "--data-dir",
            &data_arg,
            "--admin",
            "127.0.0.1:0",
        ]);
        assert_rejected(&path, &out, took, &line_col, fragment.trim());
        assert!(
            stderr(&out).contains("nothing was started"),
            "{path}: {}",
            stderr(&out)
        );
        assert!(
            !data_dir.exists(),
            "{path}: `sluice run` created its data directory"
        );
    }
}

/// Writes `text` to a file in a fresh directory and validates it.
fn validate_text(name: &str, text: &[u8]) -> (String, Output, Duration, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(name);
    std::fs::write(&file, text).expect("write");
    let path = file.display().to_string();
    let (out, took) = sluice(&["validate", "--no-plugins", &path]);
    (path, out, took, dir)
}

#[test]
fn ten_thousand_deep_nesting_is_rejected_quickly() {
    let block = format!("name: deep\nstages:\n  - {}x\n", "- ".repeat(10_000));
    let (path, out, took, _dir) = validate_text("block.yaml", block.as_bytes());
    assert_rejected(&path, &out, took, "3", "nesting is deeper than 32 levels");

    let flow = format!(
        "name: deep\nstages: {}{}\n",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let (path, out, took, _dir) = validate_text("flow.yaml", flow.as_bytes());
    assert_rejected(&path, &out, took, "2", "nesting is deeper than 32 levels");

    let maps = format!(
        "name: deep\nstages: {}1{}\n",
        "{a: ".repeat(10_000),
        "}".repeat(10_000)
    );
    let (path, out, took, _dir) = validate_text("maps.yaml", maps.as_bytes());
    assert_rejected(&path, &out, took, "2", "nesting is deeper than 32 levels");
}

#[test]
fn oversized_empty_and_non_utf8_files_are_rejected() {
    let mut big = b"name: big\nstages: []\n".to_vec();
    big.extend(std::iter::repeat_n(b'#', 2 << 20));
    let (path, out, took, _dir) = validate_text("big.yaml", &big);
    assert_rejected(&path, &out, took, "1:1", "larger than 1024 KiB");

    let (path, out, took, _dir) = validate_text("empty.yaml", b"");
    assert_rejected(&path, &out, took, "1:1", "no pipeline in it");

    let (path, out, took, _dir) = validate_text("latin1.yaml", b"name: caf\xe9\n");
    assert_rejected(&path, &out, took, "1:10", "not valid UTF-8");
}

#[test]
fn duplicate_pipeline_names_across_files_are_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = "name: same\ntopics: [a]\nstages:\n  - {name: s, subscribe: a, plugin: x.wasm}\n";
    std::fs::write(dir.path().join("one.yaml"), text).expect("write");
    std::fs::write(dir.path().join("two.yml"), text).expect("write");
    std::fs::write(dir.path().join("notes.txt"), "not a pipeline").expect("write");
    let dir_arg = dir.path().display().to_string();
    let (out, took) = sluice(&["validate", "--no-plugins", &dir_arg]);
    let two = dir.path().join("two.yml").display().to_string();
    assert_rejected(
        &two,
        &out,
        took,
        "1:7",
        "pipeline `same` is already defined in",
    );
    assert!(stderr(&out).contains("one.yaml:1:7"), "{}", stderr(&out));
}

#[test]
fn a_file_with_several_errors_reports_all_of_them() {
    plugins();
    let text = "\
name: shop
topics: [in, out, in]
stages:
  - name: a
    subscribe: nowhere
    plugin: ../../no-such.wasm
    publish: [out, ghost]
    dlq: graveyard
  - name: a
    subscribe: in
    plugin: ../../no-such.wasm
    publish: [in]
";
    let (path, out, _, _dir) = validate_text("many.yaml", text.as_bytes());
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for (at, fragment) in [
        ("2:19", "topic `in` is declared twice"),
        ("5:16", "subscribes to `nowhere`"),
        ("7:20", "publishes to `ghost`"),
        ("8:10", "dead-letters to `graveyard`"),
        ("9:11", "stage `a` is defined twice"),
        ("12:15", "its own input"),
    ] {
        assert!(
            err.lines()
                .any(|l| l.starts_with(&format!("{path}:{at}: ")) && l.contains(fragment)),
            "missing {at} {fragment}:\n{err}"
        );
    }
    assert!(err.contains("6 problems found"), "{err}");

    // With plugins checked, both missing plugins are reported too.
    let (out, _) = sluice(&["validate", &path]);
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{path}:6:13: plugin file not found")),
        "{err}"
    );
    assert!(
        err.contains(&format!("{path}:11:13: plugin file not found")),
        "{err}"
    );
    assert!(err.contains("8 problems found"), "{err}");

    // Type errors in different stages are reported together as well.
    let text = "\
name: shop
topics: [in]
stages:
  - {name: a, subscribe: in, plugin: x.wasm, concurrency: 0}
  - {name: b, subscribe: in, plugin: x.wasm, timeout: forever}
";
    let (path, out, _, _dir) = validate_text("types.yaml", text.as_bytes());
    let err = stderr(&out);
    assert!(err.contains(&format!("{path}:4:59: ")), "{err}");
    assert!(err.contains(&format!("{path}:5:55: `forever`")), "{err}");
}

#[test]
fn environment_variables_are_expanded() {
    let text = "\
name: ${SLUICE_TEST_PIPELINE_NAME}
broker: ${SLUICE_TEST_SURELY_UNSET_HOST:-embedded}
topics: [in]
stages:
  - name: s
    subscribe: in
    plugin: x.wasm
    concurrency: ${SLUICE_TEST_WORKERS}
";
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("env.yaml");
    std::fs::write(&file, text).expect("write");
    let out = Command::new(sluice_bin())
        .args(["validate", "--no-plugins"])
        .arg(&file)
        .env("SLUICE_TEST_PIPELINE_NAME", "from-env")
        .env("SLUICE_TEST_WORKERS", "8")
        .env_remove("SLUICE_TEST_SURELY_UNSET_HOST")
        .output()
        .expect("run sluice");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("(pipeline from-env: 1 stage)"));
}

/// SASL `PLAIN` without TLS is valid (a private network) but sends the
/// password as it is: `validate` warns for the source and the sink, and the
/// daemon logs the same at start-up; neither ever shows the password.
#[test]
fn plain_sasl_without_tls_is_warned_of_and_the_password_never_shown() {
    // A closed port: the daemon starts (an unreachable broker is an
    // outage, not a failed start) and holds the messages.
    let port = sluice_harness::process::free_port().expect("a free port");
    let kafka = |topic: &str| {
        format!(
            "brokers: \"127.0.0.1:{port}\"\n      topic: {topic}\n      \
             security: sasl_plaintext\n      \
             sasl: {{mechanism: PLAIN, username: alice, password: \"${{SLUICE_TEST_KAFKA_PW}}\"}}"
        )
    };
    let text = format!(
        "name: plain\ntopics: [in]\nsinks:\n  - name: out\n    subscribe: in\n    kafka:\n      \
         {}\nsources:\n  - name: src\n    to: in\n    kafka:\n      {}\n      group: g\n",
        kafka("out"),
        kafka("orders"),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("plain.yaml");
    std::fs::write(&file, &text).expect("write");
    let password = "pl41n-hunter2";
    let out = Command::new(sluice_bin())
        .args(["validate", "--no-plugins"])
        .arg(&file)
        .env("SLUICE_TEST_KAFKA_PW", password)
        .output()
        .expect("run sluice");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    for who in [
        "source `src` (kafka.sasl.mechanism)",
        "sink `out` (kafka.sasl.mechanism)",
    ] {
        assert!(
            err.lines()
                .any(|l| l.starts_with("warning:") && l.contains(who) && l.contains("unencrypted")),
            "no warning for {who}:\n{err}"
        );
    }
    assert!(!err.contains(password), "{err}");

    let daemon = sluice_tests::Daemon::builder(&[&file], &dir.path().join("data"))
        .envs([("SLUICE_TEST_KAFKA_PW", password)])
        .start();
    daemon.wait_until("both start-up warnings", Duration::from_secs(60), |d| {
        d.log().matches("sends the password unencrypted").count() >= 2
    });
    assert!(!daemon.log().contains(password), "{}", daemon.log());
}

#[test]
fn schema_is_json_with_the_stage_fields() {
    let (out, _) = sluice(&["schema"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let stage = &schema["$defs"]["Stage"]["properties"];
    for field in [
        "name",
        "subscribe",
        "plugin",
        "config",
        "publish",
        "concurrency",
        "ack_wait",
        "retry",
        "dlq",
        "ordering",
        "batch",
        "timeout",
        "memory",
        "max_ack_pending",
        "sha256",
    ] {
        assert!(stage.get(field).is_some(), "no `{field}` in {stage}");
    }
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(stage["ack_wait"]["default"], "30s");
    assert_eq!(stage["memory"]["default"], "256MiB");
    // Issue 45: `dlq:` is a name or `{topic, archive}`; a topic's
    // `retention:` a duration or `{max_age, archive}`.
    let defs = &schema["$defs"];
    let dlq = stage["dlq"].to_string();
    assert!(dlq.contains("NameOrDlq"), "{dlq}");
    assert_eq!(defs["NameOrDlq"]["anyOf"][0]["type"], "string");
    for field in ["topic", "archive"] {
        assert!(
            defs["Dlq"]["properties"].get(field).is_some(),
            "{}",
            defs["Dlq"]
        );
    }
    for field in [
        "store",
        "endpoint",
        "region",
        "allow_http",
        "path",
        "compression",
    ] {
        assert!(
            defs["Archive"]["properties"].get(field).is_some(),
            "{}",
            defs["Archive"]
        );
    }
    assert_eq!(defs["Archive"]["additionalProperties"], false);
    let retention = defs["Topic"]["properties"]["retention"].to_string();
    assert!(retention.contains("DurationOrRetention"), "{retention}");
    let forms = defs["DurationOrRetention"]["anyOf"].to_string();
    assert!(
        forms.contains("Duration") && forms.contains("Retention"),
        "{forms}"
    );
    assert!(defs["Retention"]["properties"].get("max_age").is_some());
}

#[test]
fn help_shows_an_example() {
    let (out, _) = sluice(&["validate", "--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Example: sluice validate"), "{text}");
    assert!(Path::new(&root().join("pipelines/quickstart.yaml")).is_file());
}

/// The SHA-256 of a file, lowercase hex, as `sha256sum` prints it.
fn sha256_of(path: &Path) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(std::fs::read(path).expect("read"));
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A one-stage pipeline running `plugin` with `sha256: <pin>`.
fn pinned(plugin: &Path, pin: &str) -> String {
    format!(
        "name: pinned\ntopics: [in, out]\nstages:\n  - name: s\n    subscribe: in\n    \
         plugin: {}\n    sha256: {pin}\n    publish: [out]\n",
        plugin.display()
    )
}

#[test]
fn a_plugin_sha256_pin_is_checked_and_a_mismatch_is_reported_with_both_hashes() {
    plugins();
    let uppercase = sluice_harness::plugin("uppercase");
    let actual = sha256_of(&uppercase);
    let dir = tempfile::tempdir().expect("tempdir");

    // The right pin (in either case) validates.
    for pin in [actual.clone(), actual.to_ascii_uppercase()] {
        let file = dir.path().join("good.yaml");
        std::fs::write(&file, pinned(&uppercase, &pin)).expect("write");
        let (out, _) = sluice(&["validate", &file.display().to_string()]);
        assert!(out.status.success(), "{pin}: {}", stderr(&out));
    }

    // Another plugin's hash: refused at the `sha256:` line, both hashes said.
    let other = sha256_of(&sluice_harness::plugin("router"));
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, pinned(&uppercase, &other)).expect("write");
    let path = file.display().to_string();
    let (out, _) = sluice(&["validate", &path]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.lines().any(|l| l.starts_with(&format!("{path}:7:13: "))
            && l.contains(&actual)
            && l.contains(&other)),
        "{err}"
    );

    // And `sluice run` refuses to start with it (exit 2), naming both.
    let out = Command::new(sluice_bin())
        .args(["run", &path, "--admin", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("SLUICE_CACHE_DIR", CACHE.path())
        .env("SLUICE_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run sluice");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("{path}:7:13: ")), "{err}");
    assert!(err.contains(&actual) && err.contains(&other), "{err}");
    assert!(
        !dir.path().join("data").exists(),
        "nothing was started: {err}"
    );
}

#[test]
fn a_malformed_sha256_pin_is_rejected_at_its_position() {
    for bad in [
        "abc",
        "zz2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b98",
    ] {
        let text = pinned(Path::new("x.wasm"), bad);
        let (path, out, took, _dir) = validate_text("pin.yaml", text.as_bytes());
        assert_rejected(&path, &out, took, "7:13", "not a SHA-256");
    }
}

/// `validate` reads a plugin without compiling it; what loads it (`run`,
/// `plugin test`) logs its SHA-256, the value a `sha256:` pin takes.
#[test]
fn loading_a_plugin_logs_its_sha256() {
    plugins();
    let uppercase = sluice_harness::plugin("uppercase");
    let out = Command::new(sluice_bin())
        .args(["plugin", "test"])
        .arg(&uppercase)
        .args(["--data", "x"])
        .env("SLUICE_CACHE_DIR", CACHE.path())
        .env("SLUICE_LOG", "info")
        .output()
        .expect("run sluice");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let actual = sha256_of(&uppercase);
    assert!(
        err.lines()
            .any(|l| l.contains("Loaded plugin") && l.contains(&format!("sha256={actual}"))),
        "{err}"
    );
}
