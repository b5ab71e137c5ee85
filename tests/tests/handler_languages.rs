//! Handlers in Rust, Python and JavaScript, as a new user meets them: from
//! an empty directory outside the repository, `sluice plugin new`, `sluice
//! plugin build`, `sluice plugin test --cases`, then a real pipeline of
//! 1,000 messages in which rejects reach the DLQ as `rejected` and retries
//! as `retry` (never `trap`). Also: the repository's Python and JS example
//! handlers, and handlers written against the raw bindings with no SDK.
//!
//! Needs the toolchains `cargo xtask setup` installs (componentize-py from
//! PyPI; npm for componentize-js) and, for Rust, crates.io. A JS project is
//! on QuickJS unless it says otherwise, and needs none of them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use sluice_tests::{Daemon, Msg, header, plugin, sluice_bin, write_pipeline};

fn sluice(dir: &Path, args: &[&str]) -> Output {
    Command::new(sluice_bin())
        .args(args)
        .current_dir(dir)
        .env("SLUICE_CACHE_DIR", sluice_tests::CACHE.path())
        .stdin(Stdio::null())
        .output()
        .expect("run sluice")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `plugin new`, then `plugin build` (a JS project is on QuickJS: no npm);
/// returns the project directory and the component.
fn new_project(parent: &Path, name: &str, lang: &str) -> (PathBuf, PathBuf) {
    let out = sluice(parent, &["plugin", "new", name, "--lang", lang]);
    assert!(out.status.success(), "plugin new: {}", text(&out.stderr));
    let dir = parent.join(name);
    for file in ["README.md", "cases.yaml", "wit/plugin.wit"] {
        assert!(dir.join(file).is_file(), "{lang}: no {file}");
    }
    if lang == "js" {
        let package = std::fs::read_to_string(dir.join("package.json")).expect("package.json");
        assert!(
            package.contains(r#""sluice": { "engine": "quickjs" }"#),
            "{package}"
        );
    }
    (dir.clone(), build(&dir, lang))
}

/// `plugin build` in `dir`; returns the component.
fn build(dir: &Path, lang: &str) -> PathBuf {
    let out = sluice(dir, &["plugin", "build"]);
    assert!(out.status.success(), "{lang} build:\n{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let wasm = PathBuf::from(stdout.lines().last().expect("a path").trim());
    assert!(
        wasm.is_file(),
        "{lang}: {} is not the built component",
        wasm.display()
    );
    wasm
}

/// The generated cases pass; a broken expectation fails with a diff.
fn cases_pass_and_a_wrong_one_fails(dir: &Path, lang: &str) {
    let out = sluice(dir, &["plugin", "test", ".", "--cases", "cases.yaml"]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{lang} cases:\n{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("4 passed, 0 failed"), "{stdout}");

    let wrong = std::fs::read_to_string(dir.join("cases.yaml"))
        .expect("cases")
        .replace("payload: HELLO", "payload: HELLo");
    std::fs::write(dir.join("wrong.yaml"), wrong).expect("write");
    let out = sluice(dir, &["plugin", "test", ".", "--cases", "wrong.yaml"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL  upper-cases text"), "{stdout}");
    assert!(
        stdout.contains("- expected: ") && stdout.contains("\"payload\":\"HELLo\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("+ actual:   ") && stdout.contains("\"payload\":\"HELLO\""),
        "{stdout}"
    );
    assert!(stdout.contains("3 passed, 1 failed"), "{stdout}");
}

/// 1,000 messages through `wasm`: every tenth is blank (rejected), every
/// tenth from the second on starts with `later` (retried, then
/// dead-lettered as `retry`); the rest come out upper-cased.
fn runs_in_a_pipeline(wasm: &Path, lang: &str) {
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: langs
topics: [in, out]
stages:
  - name: work
    subscribe: in
    plugin: {}
    publish: [out]
    concurrency: 4
    retry:
      max_attempts: 2
      backoff: {{initial: 10ms, max: 10ms}}
"#,
        wasm.display()
    );
    let file = write_pipeline(dir.path(), "langs", &yaml);
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    let n = 1000;
    let messages: Vec<Msg> = (0..n)
        .map(|i| {
            let payload = match i % 10 {
                // Ingest refuses an empty payload; blank is "empty" to the handler.
                0 => " ".to_owned(),
                1 => format!("later {i}"),
                _ => format!("msg {i}"),
            };
            Msg::new(format!("m{i}"), payload).key(format!("k{}", i % 7))
        })
        .collect();
    daemon.publish("in", &messages);
    daemon.wait_until("all settled", Duration::from_secs(300), |d| {
        d.depth("out") + d.depth("langs.work.dlq") >= n
    });
    std::thread::sleep(Duration::from_millis(300));
    let out = daemon.read_all("out");
    let dlq = daemon.read_all("langs.work.dlq");
    assert_eq!(out.len(), 800, "{lang}: outputs");
    assert_eq!(dlq.len(), 200, "{lang}: dead letters");
    for m in &out {
        let payload = m["payload"].as_str().expect("text payload");
        assert!(payload.starts_with("MSG "), "{lang}: {m}");
        assert!(
            m["key"].as_str().is_some_and(|k| k.starts_with('k')),
            "{lang}: key kept: {m}"
        );
    }
    let mut kinds = BTreeMap::new();
    for entry in &dlq {
        let kind = header(entry, "sluice-dlq-kind").expect("kind").to_owned();
        let payload = entry["payload"].as_str().unwrap_or_default();
        match kind.as_str() {
            "rejected" => {
                assert_eq!(payload, " ", "{lang}: {entry}");
                assert_eq!(header(entry, "sluice-dlq-attempts"), Some("1"), "{entry}");
                assert!(
                    header(entry, "sluice-dlq-error").is_some_and(|e| e.contains("empty payload")),
                    "{lang}: {entry}"
                );
            }
            "retry" => {
                assert!(payload.starts_with("later"), "{lang}: {entry}");
                assert_eq!(header(entry, "sluice-dlq-attempts"), Some("2"), "{entry}");
            }
            other => panic!("{lang}: a dead letter of kind {other}: {entry}"),
        }
        *kinds.entry(kind).or_insert(0) += 1;
    }
    assert_eq!(kinds.get("rejected"), Some(&100), "{lang}: {kinds:?}");
    assert_eq!(kinds.get("retry"), Some(&100), "{lang}: {kinds:?}");
}

fn from_an_empty_directory(lang: &str) {
    let parent = tempfile::tempdir().expect("dir");
    let (dir, wasm) = new_project(parent.path(), &format!("hello-{lang}"), lang);
    cases_pass_and_a_wrong_one_fails(&dir, lang);
    runs_in_a_pipeline(&wasm, lang);
}

#[test]
fn a_python_handler_from_an_empty_directory() {
    from_an_empty_directory("python");
}

#[test]
fn a_javascript_handler_from_an_empty_directory() {
    from_an_empty_directory("js");
}

#[test]
fn a_rust_handler_from_an_empty_directory() {
    from_an_empty_directory("rust");
}

/// A JS project on SpiderMonkey (componentize-js): before `npm install`
/// the build names what is missing and how to get it; then it builds,
/// passes its cases and runs in a pipeline.
#[test]
fn a_javascript_handler_on_spidermonkey() {
    let parent = tempfile::tempdir().expect("dir");
    let out = sluice(parent.path(), &["plugin", "new", "monkey", "--lang", "js"]);
    assert!(out.status.success(), "plugin new: {}", text(&out.stderr));
    let dir = parent.path().join("monkey");
    let package = format!(
        r#"{{
  "name": "monkey",
  "private": true,
  "type": "module",
  "sluice": {{ "engine": "spidermonkey" }},
  "devDependencies": {{
    "@bytecodealliance/componentize-js": "{}",
    "@bytecodealliance/preview2-shim": "{}"
  }}
}}
"#,
        sluice_author::files::COMPONENTIZE_JS,
        sluice_author::files::PREVIEW2_SHIM
    );
    std::fs::write(dir.join("package.json"), package).expect("write");
    let out = sluice(&dir, &["plugin", "build"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("componentize-js was not found") && err.contains("npm install"),
        "{err}"
    );
    let npm = Command::new("npm")
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--prefer-offline",
            "--loglevel=error",
        ])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .status()
        .expect("npm");
    assert!(npm.success(), "npm install");
    let wasm = build(&dir, "js on spidermonkey");
    cases_pass_and_a_wrong_one_fails(&dir, "js on spidermonkey");
    runs_in_a_pipeline(&wasm, "js on spidermonkey");
}

/// A new JS project (QuickJS) builds with no toolchain at all when this
/// `sluice` carries the prebuilt engine: no cargo, clang or npm on the
/// PATH, an empty cache. Its scripts may import each other from
/// subdirectories; an unchanged project is not rebuilt; an uncaught
/// exception traps with its message; a batch handler builds too.
#[test]
fn a_quickjs_project_builds_without_a_toolchain() {
    let parent = tempfile::tempdir().expect("dir");
    let out = sluice(parent.path(), &["plugin", "new", "quick", "--lang", "js"]);
    assert!(out.status.success(), "plugin new: {}", text(&out.stderr));
    let dir = parent.path().join("quick");
    std::fs::create_dir_all(dir.join("lib")).expect("mkdir");
    std::fs::write(
        dir.join("lib/shout.mjs"),
        "export const shout = (text) => `${text.toUpperCase()}!`;\n",
    )
    .expect("write");
    let source = std::fs::read_to_string(dir.join("handler.js")).expect("source");
    let source = source
        .replace(
            r#"import { Reject, Retry, handler } from "./sluice.js";"#,
            "import { Reject, Retry, handler } from \"./sluice.js\";\nimport { shout } from \"./lib/shout.mjs\";",
        )
        .replace("return text.toUpperCase();", "return shout(text);");
    std::fs::write(dir.join("handler.js"), source).expect("write");

    let cache = tempfile::tempdir().expect("cache");
    let bare = |args: &[&str]| {
        Command::new(sluice_bin())
            .args(args)
            .current_dir(&dir)
            .env("PATH", "/nonexistent")
            .env("SLUICE_CACHE_DIR", cache.path())
            .env_remove("CARGO")
            .env_remove("WASI_SDK")
            .stdin(Stdio::null())
            .output()
            .expect("run sluice")
    };
    let out = bare(&["plugin", "build"]);
    let err = text(&out.stderr);
    if sluice_author::files::quickjs_prebuilt(sluice_author::World::Handler).is_none() {
        // Without the engine only a machine that could not build it may
        // pass: anywhere else its build failed, which is a defect.
        use sluice_harness::skip::{Reason, skip, wasm_toolchain};
        if let Err(why) = Reason::NoWasmToolchain.holds() {
            panic!(
                "this build of Sluice carries no prebuilt QuickJS engine, yet {why} ({:?}): \
                 the engine's build failed (its log is quickjs-build.log under \
                 target/*/build/sluice-author-*/out)",
                wasm_toolchain()
            );
        }
        // The first QuickJS build then needs the toolchain, and says which.
        assert!(
            !out.status.success() && err.contains("carries no prebuilt QuickJS engine"),
            "{err}"
        );
        skip(
            "a_quickjs_project_builds_without_a_toolchain",
            Reason::NoWasmToolchain,
            &format!(
                "no prebuilt QuickJS engine: {}",
                wasm_toolchain().err().unwrap_or_default()
            ),
        );
        return;
    }
    assert!(
        out.status.success(),
        "quickjs build with no toolchain:\n{err}"
    );
    let wasm = PathBuf::from(text(&out.stdout).lines().last().expect("a path").trim());
    let out = bare(&["plugin", "test", ".", "--data", "hi"]);
    assert!(
        text(&out.stdout).contains(r#""payload":"HI!""#),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let before = std::fs::read(&wasm).expect("wasm");
    let out = bare(&["plugin", "build"]);
    assert!(
        text(&out.stderr).contains("up to date"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read(&wasm).expect("wasm"), before, "same bytes");

    let source = std::fs::read_to_string(dir.join("handler.js")).expect("source");
    let source = source.replace(
        "return shout(text);",
        "throw new RangeError(`no vowels in ${text}`);",
    );
    std::fs::write(dir.join("handler.js"), source).expect("write");
    let out = bare(&["plugin", "test", ".", "--data", "xyz"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    let trap = &err[err.rfind("trap: ").unwrap_or_else(|| panic!("{err}"))..];
    assert!(trap.contains("RangeError: no vowels in xyz"), "{trap}");

    // A batch handler: the engine of the other world.
    let batch = std::fs::read_to_string(
        sluice_harness::repo_root().join("plugins/js/examples/upper-batch/handler.js"),
    )
    .expect("example");
    std::fs::write(dir.join("handler.js"), batch).expect("write");
    let out = bare(&["plugin", "test", ".", "--data", "hi"]);
    assert!(
        text(&out.stdout).contains(r#""payload":"HI""#),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn an_unchanged_project_is_not_rebuilt_and_a_changed_one_is() {
    let parent = tempfile::tempdir().expect("dir");
    let (dir, wasm) = new_project(parent.path(), "again", "python");
    let before = std::fs::read(&wasm).expect("wasm");
    let out = sluice(&dir, &["plugin", "build"]);
    assert!(out.status.success());
    assert!(
        text(&out.stderr).contains("up to date"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read(&wasm).expect("wasm"), before, "same bytes");
    let app = std::fs::read_to_string(dir.join("app.py")).expect("app");
    std::fs::write(
        dir.join("app.py"),
        app.replace("text.upper()", "text.upper() + '!'"),
    )
    .expect("write");
    let out = sluice(&dir, &["plugin", "build"]);
    assert!(out.status.success());
    assert!(!text(&out.stderr).contains("up to date"));
    let out = sluice(&dir, &["plugin", "test", ".", "--data", "hi"]);
    assert!(
        text(&out.stdout).contains(r#""payload":"HI!""#),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn a_missing_tool_is_named_with_its_install_command() {
    let parent = tempfile::tempdir().expect("dir");
    let out = sluice(
        parent.path(),
        &["plugin", "new", "lonely", "--lang", "python"],
    );
    assert!(out.status.success());
    let out = Command::new(sluice_bin())
        .args(["plugin", "build"])
        .current_dir(parent.path().join("lonely"))
        .env("PATH", "/nonexistent")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(
            "componentize-py was not found; install it with: pip install componentize-py==0.25.1"
        ),
        "{err}"
    );

    let out = sluice(parent.path(), &["plugin", "build"]);
    assert!(
        text(&out.stderr).contains("is not a plugin project"),
        "{}",
        text(&out.stderr)
    );
    let out = sluice(parent.path(), &["plugin", "new", "lonely", "--lang", "js"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("already exists and is not empty"));
    let out = sluice(
        parent.path(),
        &["plugin", "new", "Bad Name", "--lang", "js"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("invalid plugin name"));
}

/// The repository's examples in both languages, and handlers written
/// against the raw bindings (no SDK): the contract alone is enough.
#[test]
fn examples_and_raw_bindings_run_through_plugin_test() {
    let here = Path::new(".");
    for name in [
        "uppercase-py",
        "uppercase-js",
        "raw-py",
        "raw-js",
        "uppercase-qjs",
        "raw-qjs",
    ] {
        let wasm = plugin(name);
        let out = sluice(
            here,
            &["plugin", "test", &wasm, "--data", "hello", "--key", "k"],
        );
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        assert!(
            stdout.contains(r#""key":"k""#) && stdout.contains(r#""payload":"HELLO""#),
            "{name}: {stdout}"
        );
    }
    for name in ["raw-py", "raw-js", "raw-qjs"] {
        let wasm = plugin(name);
        fails_with(name, &wasm, "", "rejected: empty payload");
        fails_with(name, &wasm, "retry", "retry");
    }
    for name in ["router-py", "router-js", "router-qjs"] {
        let wasm = plugin(name);
        let out = sluice(
            here,
            &[
                "plugin",
                "test",
                &wasm,
                "--data",
                r#"{"type":"order"}"#,
                "--config",
                "route.order=orders",
            ],
        );
        assert!(
            text(&out.stdout).contains(r#""topic":"orders""#),
            "{name}: {}",
            text(&out.stdout)
        );
        fails_with(name, &wasm, "[1]", "rejected: field `type` is missing");
        fails_with(name, &wasm, "not json", "rejected: payload is not JSON");
    }
}

/// `plugin test WASM --data DATA` fails (exit 1) saying `wanted` on stderr.
fn fails_with(name: &str, wasm: &str, data: &str, wanted: &str) {
    let out = sluice(Path::new("."), &["plugin", "test", wasm, "--data", data]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{name}, {data:?}: {err}");
    assert!(err.contains(wanted), "{name}, {data:?}: {err}");
}

/// An exception that is not Reject or Retry traps, and the trap's text
/// names it (the first lines of stderr), in both languages. A handler on the
/// raw bindings that returns a bare list instead of the contract's result
/// traps with a hint that says what to return.
#[test]
fn an_uncaught_exception_traps_with_its_message() {
    let parent = tempfile::tempdir().expect("dir");
    // (language, handler file, what the SDK handler is rewritten to, what the trap says)
    let python_bare_list = "\nfrom wit_world.imports import types\n\n\
        class MessageHandler:\n    def handle(self, msg):\n        \
        return [types.Emit(topic='', key=None, headers=[], payload=msg.payload)]\n";
    let js_bare_array = "\nexport const messageHandler = {\n  handle(msg) {\n    \
        return [{ topic: \"\", key: undefined, headers: [], payload: msg.payload }];\n  },\n};\n";
    let cases = [
        (
            "python",
            "app.py",
            Edit::Replace(
                "return text.upper()",
                "raise ValueError('no vowels in ' + text)",
            ),
            "ValueError: no vowels in xyz",
        ),
        (
            "js",
            "handler.js",
            Edit::Replace(
                "return text.toUpperCase();",
                "throw new RangeError(`no vowels in ${text}`);",
            ),
            "RangeError: no vowels in xyz",
        ),
        (
            "python",
            "app.py",
            Edit::Append("MessageHandler = sluice.handler(handle)", python_bare_list),
            "hint: componentize-py traps this way when a Python handler on the raw bindings \
             returns something other than Ok([emits])",
        ),
        (
            "js",
            "handler.js",
            Edit::Append("export const messageHandler = handler(", js_bare_array),
            "hint: a JavaScript handler on the raw bindings must return { tag: \"ok\", val: [emits] }",
        ),
    ];
    for (i, (lang, file, edit, wanted)) in cases.into_iter().enumerate() {
        let name = format!("boom-{i}-{lang}");
        let (dir, _) = new_project(parent.path(), &name, lang);
        let source = std::fs::read_to_string(dir.join(file)).expect("source");
        let edited = match edit {
            Edit::Replace(from, to) => {
                assert!(source.contains(from), "{lang}: {from}");
                source.replace(from, to)
            }
            // The SDK's export is renamed, and the raw one appended.
            Edit::Append(export, raw) => {
                assert!(source.contains(export), "{lang}: {export}");
                let renamed = export.replace("MessageHandler =", "SdkHandler =");
                let renamed = renamed.replace("export const messageHandler", "const sdkHandler");
                source.replace(export, &renamed) + raw
            }
        };
        std::fs::write(dir.join(file), edited).expect("write");
        let out = sluice(&dir, &["plugin", "test", ".", "--data", "xyz"]);
        assert_eq!(out.status.code(), Some(1), "{lang}");
        let err = text(&out.stderr);
        // The failure is printed last: "trap: <message, with the stderr excerpt>".
        let trap = &err[err
            .rfind("trap: ")
            .unwrap_or_else(|| panic!("{lang}: {err}"))..];
        assert!(trap.contains(wanted), "{lang}: {trap}");
    }
}

/// How a test rewrites a generated handler.
enum Edit {
    /// Replace the first text with the second.
    Replace(&'static str, &'static str),
    /// Rename the export that starts with the first text, and append the second.
    Append(&'static str, &'static str),
}

/// What cannot work is refused from the component's outline, before any
/// compile, naming the import or the number and what to do.
#[test]
fn loading_refuses_what_cannot_work_before_compiling() {
    let dir = tempfile::tempdir().expect("dir");
    // componentize-js's default build links wasi:http.
    let staged = sluice_harness::repo_root().join("plugins/js/examples/uppercase");
    let project = dir.path().join("http");
    std::fs::create_dir_all(project.join("wit")).expect("dir");
    std::fs::copy(staged.join("handler.js"), project.join("handler.js")).expect("copy");
    std::fs::write(project.join("sluice.js"), sluice_author::files::JS_SDK.1).expect("sdk");
    std::fs::write(project.join("wit/plugin.wit"), sluice_author::files::WIT.1).expect("wit");
    let cli = sluice_harness::repo_root()
        .join("plugins/js/node_modules/@bytecodealliance/componentize-js/src/cli.js");
    let wasm = dir.path().join("http.wasm");
    let built = Command::new("node")
        .arg(&cli)
        .args(["handler.js", "-w", "wit", "-n", "handler", "-o"])
        .arg(&wasm)
        .current_dir(&project)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("node");
    assert!(built.success(), "componentize-js");
    let out = sluice(
        dir.path(),
        &[
            "plugin",
            "test",
            wasm.to_str().expect("utf-8"),
            "--data",
            "x",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("imports `wasi:http/") && err.contains("-d http -d fetch-event"),
        "{err}"
    );
    assert!(
        !err.contains("Loaded plugin"),
        "refused before compiling: {err}"
    );

    // Below the memory a Python component declares.
    let py = plugin("uppercase-py");
    let out = sluice(
        dir.path(),
        &["plugin", "test", &py, "--data", "x", "--memory", "8MiB"],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("needs at least") && err.contains("more than the limit of 8 MiB"),
        "{err}"
    );
    let yaml = format!(
        "name: small\ntopics: [in, out]\nstages:\n  - name: s\n    subscribe: in\n    plugin: {py}\n    publish: [out]\n    memory: 8MiB\n"
    );
    let file = write_pipeline(dir.path(), "small", &yaml);
    let out = sluice(dir.path(), &["validate", file.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("small.yaml:8:13:") && err.contains("raise the stage's `memory`"),
        "{err}"
    );
    // The same file with enough memory validates, without a compile.
    std::fs::write(&file, yaml.replace("8MiB", "64MiB")).expect("write");
    let out = sluice(dir.path(), &["validate", file.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("Loaded plugin"),
        "{}",
        text(&out.stderr)
    );
}

/// The author's loop on a real dead letter: a Python handler traps on
/// non-ASCII text in a pipeline; the dead letter, replayed with
/// `--from-dlq` and as a case from `dlq show --as-case`, fails against the
/// old handler and passes against the fixed one.
#[test]
fn a_dead_letter_replays_against_the_old_and_the_fixed_handler() {
    let parent = tempfile::tempdir().expect("dir");
    let (dir, wasm) = new_project(parent.path(), "ascii", "python");
    let app = std::fs::read_to_string(dir.join("app.py")).expect("app");
    let broken = app.replace(
        "return text.upper()",
        "return text.encode('ascii').decode().upper()",
    );
    std::fs::write(dir.join("app.py"), &broken).expect("write");
    let out = sluice(&dir, &["plugin", "build"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let data = tempfile::tempdir().expect("dir");
    let yaml = format!(
        "name: shop\ntopics: [in, out]\nstages:\n  - name: shout\n    subscribe: in\n    plugin: {}\n    publish: [out]\n    retry: {{max_attempts: 2, backoff: {{initial: 10ms, max: 10ms}}}}\n",
        wasm.display()
    );
    let file = write_pipeline(data.path(), "shop", &yaml);
    let daemon = Daemon::start(&[&file], &data.path().join("data"));
    daemon.publish(
        "in",
        &[
            Msg::new("a1", "plain"),
            Msg::new("a2", "crème brûlée").key("dessert"),
        ],
    );
    daemon.wait_until("a dead letter", Duration::from_secs(60), |d| {
        d.depth("shop.shout.dlq") >= 1 && d.depth("out") >= 1
    });
    let admin = daemon.base.clone();
    let out = sluice(
        &dir,
        &["dlq", "list", "shop/shout", "--json", "--admin", &admin],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let entry = &list["entries"][0];
    assert_eq!(entry["kind"], "trap", "{entry}");
    let seq = entry["seq"].as_u64().expect("seq").to_string();
    let from = format!("shop/shout/{seq}");

    let replay = || {
        sluice(
            &dir,
            &[
                "plugin",
                "test",
                ".",
                "--from-dlq",
                &from,
                "--admin",
                &admin,
            ],
        )
    };

    // Against the broken handler: the replay fails, naming what happened.
    let out = replay();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("which failed with trap after 2 attempt(s)"),
        "{}",
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("FAIL  dead letter shop/shout/") && stdout.contains("UnicodeEncodeError"),
        "{stdout}"
    );

    // As a case appended to the project's cases.
    let out = sluice(
        &dir,
        &[
            "dlq",
            "show",
            "shop/shout",
            &seq,
            "--as-case",
            "--admin",
            &admin,
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let case = text(&out.stdout);
    assert!(
        case.contains(r#"payload: "crème brûlée""#) && case.contains(r#"key: "dessert""#),
        "{case}"
    );
    assert!(
        case.contains(r#"id: "a2""#) && case.contains("attempt: 2"),
        "{case}"
    );
    let mut cases = std::fs::read_to_string(dir.join("cases.yaml")).expect("cases");
    cases.push_str(&case);
    std::fs::write(dir.join("cases.yaml"), cases).expect("write");
    let out = sluice(&dir, &["plugin", "test", ".", "--cases", "cases.yaml"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("4 passed, 1 failed"),
        "{}",
        text(&out.stdout)
    );

    // The fix: both pass, on the real message.
    std::fs::write(dir.join("app.py"), &app).expect("write");
    let out = sluice(&dir, &["plugin", "test", ".", "--cases", "cases.yaml"]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("5 passed, 0 failed"),
        "{}",
        text(&out.stdout)
    );
    let out = replay();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("1 passed, 0 failed"),
        "{}",
        text(&out.stdout)
    );
}

/// The repository's Python and JavaScript router examples in one pipeline:
/// each routes by a JSON field to the topics its config names, keeps the
/// payload and key, and rejects what has no `type` (DLQ kind `rejected`).
#[test]
fn the_router_examples_route_in_a_pipeline() {
    let dir = tempfile::tempdir().expect("dir");
    let stage = |lang: &str| {
        format!(
            "  - name: route-{lang}\n    subscribe: in-{lang}\n    plugin: {}\n    \
             publish: [{lang}.orders, {lang}.refunds]\n    concurrency: 2\n    \
             config: {{ route.order: {lang}.orders, route.refund: {lang}.refunds }}\n",
            plugin(&format!("router-{lang}"))
        )
    };
    let yaml = format!(
        "name: shop\ntopics: [in-py, in-js, py.orders, py.refunds, js.orders, js.refunds]\nstages:\n{}{}",
        stage("py"),
        stage("js")
    );
    let file = write_pipeline(dir.path(), "shop", &yaml);
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    let n = 200;
    let messages: Vec<Msg> = (0..n)
        .map(|i| {
            let payload = match i % 10 {
                0 => format!(r#"{{"id":{i}}}"#),
                k if k % 2 == 0 => format!(r#"{{"type":"order","id":{i}}}"#),
                _ => format!(r#"{{"type":"refund","id":{i}}}"#),
            };
            Msg::new(format!("r{i}"), payload).key(format!("c{}", i % 3))
        })
        .collect();
    for lang in ["py", "js"] {
        daemon.publish(&format!("in-{lang}"), &messages);
    }
    for lang in ["py", "js"] {
        let (orders, refunds, dlq) = (
            format!("{lang}.orders"),
            format!("{lang}.refunds"),
            format!("shop.route-{lang}.dlq"),
        );
        daemon.wait_until("all routed", Duration::from_secs(120), |d| {
            d.depth(&orders) + d.depth(&refunds) + d.depth(&dlq) >= n
        });
        let (orders, refunds, dlq) = (
            daemon.read_all(&orders),
            daemon.read_all(&refunds),
            daemon.read_all(&dlq),
        );
        assert_eq!(
            (orders.len(), refunds.len(), dlq.len()),
            (80, 100, 20),
            "{lang}"
        );
        for (msgs, kind) in [(&orders, "order"), (&refunds, "refund")] {
            for m in msgs {
                let doc: serde_json::Value =
                    serde_json::from_str(m["payload"].as_str().expect("text")).expect("json");
                assert_eq!(doc["type"], kind, "{lang}: {m}");
                let id = doc["id"].as_u64().expect("id");
                assert_eq!(m["key"], format!("c{}", id % 3), "{lang}: key kept: {m}");
            }
        }
        for entry in &dlq {
            assert_eq!(
                header(entry, "sluice-dlq-kind"),
                Some("rejected"),
                "{entry}"
            );
            assert!(
                header(entry, "sluice-dlq-error")
                    .is_some_and(|e| e.contains("field `type` is missing")),
                "{lang}: {entry}"
            );
        }
    }
}

/// A Python handler on contract 0.2.0, from `plugin new`, that counts the
/// messages of each key in the stage's state and reads a secret, in a real
/// pipeline on the embedded broker, through a kill -9: every count from 1
/// to the key's number of messages is emitted exactly once (the increments
/// commit with the outputs and the ack), each output carries the secret's
/// length, and a stage that grants state but not the secret refuses the
/// component at validation, while the plain template's component (which
/// uses neither) loads on a stage that grants nothing.
#[test]
fn a_python_handler_counts_per_key_in_state_and_reads_a_secret() {
    let parent = tempfile::tempdir().expect("dir");
    let (plain_dir, plain) = new_project(parent.path(), "plain", "python");
    assert!(plain_dir.join("wit/v0.2/plugin.wit").is_file());
    let (dir, _) = new_project(parent.path(), "counter", "python");
    std::fs::write(
        dir.join("app.py"),
        "import sluice\n\n\n\
         def handle(msg):\n    \
             n = sluice.state.increment(f\"count/{msg.key}\")\n    \
             token = sluice.secrets.get(\"token\")\n    \
             return f\"{msg.key} {n} {len(token)}\"\n\n\n\
         MessageHandler = sluice.handler(handle)\n",
    )
    .expect("write");
    let wasm = build(&dir, "python");
    let check = tempfile::tempdir().expect("dir");
    let token = "t0ken-of-17-chars";
    let token_file = check.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write");
    let stage = |plugin: &Path, grants: &str| {
        format!(
            r#"
name: counts
secrets:
  token: {{ file: {} }}
topics: [in, out]
stages:
  - name: count
    subscribe: in
    plugin: {}
    publish: [out]
    concurrency: 4
    ordering: {{ key: key }}
{grants}"#,
            token_file.display(),
            plugin.display()
        )
    };
    // Without `secrets:`, the counter is refused; the plain handler is not.
    let refused = write_pipeline(check.path(), "refused", &stage(&wasm, "    state: true\n"));
    let out = sluice(check.path(), &["validate", &refused.display().to_string()]);
    let err = text(&out.stderr) + &text(&out.stdout);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("imports `sluice:plugin/secrets@0.2.0`, which stage `count` does not grant"),
        "{err}"
    );
    let plain_yaml = write_pipeline(check.path(), "plain", &stage(&plain, ""));
    let out = sluice(
        check.path(),
        &["validate", &plain_yaml.display().to_string()],
    );
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    let yaml = stage(&wasm, "    state: true\n    secrets: [token]\n");
    let mut daemon = Daemon::with_yaml(&yaml).start();
    let keys = ["a", "b", "c"];
    let n = 300;
    let messages: Vec<Msg> = (0..n)
        .map(|i| Msg::new(format!("m{i}"), "x").key(keys[i % keys.len()]))
        .collect();
    daemon.publish("in", &messages[..n / 2]);
    daemon.wait_until("some counted", LONG_WAIT, |d| d.depth("out") >= 20);
    daemon.kill9();
    daemon.restart();
    daemon.publish("in", &messages[n / 2..]);
    daemon.wait_until("all counted", LONG_WAIT, |d| d.depth("out") >= n);
    std::thread::sleep(Duration::from_millis(300));
    let out = daemon.read_all("out");
    assert_eq!(out.len(), n, "one output per message");
    let mut counts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for m in &out {
        let payload = m["payload"].as_str().expect("text payload");
        let parts: Vec<&str> = payload.split(' ').collect();
        assert_eq!(parts.len(), 3, "{payload}");
        assert_eq!(parts[2], token.len().to_string(), "{payload}");
        counts
            .entry(parts[0].to_owned())
            .or_default()
            .push(parts[1].parse().expect("a count"));
    }
    for key in keys {
        let mut seen = counts.remove(key).unwrap_or_default();
        seen.sort_unstable();
        let want: Vec<u64> = (1..=(n / keys.len()) as u64).collect();
        assert_eq!(seen, want, "key {key}: each count once");
    }
    assert!(counts.is_empty(), "unexpected keys: {counts:?}");
    assert_eq!(daemon.depth("counts.count.dlq"), 0);
}

/// A Python handler's HTTP calls in a running pipeline: a POST to the
/// listed host arrives with the host's `Idempotency-Key` and the JSON the
/// handler sent, and a call to a host the stage does not list raises
/// `sluice.http.Refused` in the handler, with nothing sent there.
#[test]
fn a_python_handler_posts_to_a_listed_host_and_is_refused_an_unlisted_one() {
    use sluice_tests::receiver::{Receiver, always};
    let listed = Receiver::start(always(201));
    let unlisted = Receiver::start(always(200));
    let parent = tempfile::tempdir().expect("dir");
    let (dir, _) = new_project(parent.path(), "caller", "python");
    std::fs::write(
        dir.join("app.py"),
        "import sluice\n\n\n\
         def handle(msg):\n    \
             url = sluice.config(\"url\")\n    \
             other = sluice.config(\"other\")\n    \
             answer = sluice.http.post(url, json={\"id\": msg.id})\n    \
             try:\n        \
                 sluice.http.get(other)\n        \
                 refused = \"no\"\n    \
             except sluice.http.Refused:\n        \
                 refused = \"yes\"\n    \
             return f\"{answer.status} refused={refused}\"\n\n\n\
         MessageHandler = sluice.handler(handle)\n",
    )
    .expect("write");
    let wasm = build(&dir, "python");
    let host = listed.addr.to_string();
    let yaml = format!(
        r#"
name: calls
topics: [in, out]
stages:
  - name: call
    subscribe: in
    plugin: {plugin}
    publish: [out]
    config: {{url: "{url}", other: "{other}"}}
    http:
      allow: ["{host}"]
      allow_private: true
"#,
        plugin = wasm.display(),
        url = listed.url("http", "/orders"),
        other = unlisted.url("http", "/nope"),
    );
    let daemon = Daemon::with_yaml(&yaml).start();
    daemon.publish("in", &[Msg::new("m1", "x")]);
    daemon.wait_until("the answer", LONG_WAIT, |d| {
        d.depth("out") >= 1 || d.depth("calls.call.dlq") >= 1
    });
    let dead = daemon.read_all("calls.call.dlq");
    assert!(dead.is_empty(), "dead-lettered: {dead:?}");
    let out: Vec<String> = daemon
        .read_all("out")
        .iter()
        .map(|m| m["payload"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(out, ["201 refused=yes"]);
    let hits = listed.hits();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].method, "POST");
    assert_eq!(hits[0].path, "/orders");
    assert_eq!(hits[0].key(), "m1:0", "message id and call index");
    let body: serde_json::Value = serde_json::from_slice(&hits[0].body).expect("JSON body");
    assert_eq!(body["id"], "m1");
    assert!(
        unlisted.hits().is_empty(),
        "the unlisted host was reached: {:?}",
        unlisted.hits()
    );
}

const LONG_WAIT: Duration = Duration::from_secs(300);
