//! The JavaScript SDK's capabilities (contract 0.2.0) on SpiderMonkey, as
//! a user meets them: `sluice plugin new --lang js`, a handler that uses
//! the stage's state, a secret and `fetch`, `sluice plugin build` with
//! componentize-js, and `sluice plugin test --cases` giving each case its
//! state and its HTTP exchanges. The component imports only what the code
//! uses: a handler that reads no secret runs where no secret is given. The
//! same project runs on the QuickJS engine, which imports every capability:
//! there a capability not given fails its calls instead of the load.
//!
//! Needs the componentize-js that `cargo xtask setup` installs in
//! `plugins/js/node_modules`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use sluice_tests::sluice_bin;

fn sluice(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(sluice_bin())
        .args(args)
        .current_dir(dir)
        .env("SLUICE_CACHE_DIR", sluice_tests::CACHE.path())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run sluice")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A new JS project switched to SpiderMonkey, with the repository's
/// componentize-js linked in (as `cargo xtask plugins` stages them).
fn spidermonkey_project(parent: &Path, name: &str) -> PathBuf {
    let out = sluice(parent, &["plugin", "new", name, "--lang", "js"], &[]);
    assert!(out.status.success(), "plugin new: {}", text(&out.stderr));
    let dir = parent.join(name);
    let modules = sluice_harness::repo_root().join("plugins/js/node_modules");
    assert!(
        modules
            .join("@bytecodealliance/componentize-js/package.json")
            .is_file(),
        "componentize-js is not installed in {}: run `cargo xtask setup`",
        modules.display()
    );
    std::os::unix::fs::symlink(&modules, dir.join("node_modules")).expect("link node_modules");
    set_engine(&dir, "spidermonkey");
    dir
}

fn set_engine(dir: &Path, engine: &str) {
    let package = format!(
        "{{\n  \"private\": true,\n  \"type\": \"module\",\n  \"sluice\": {{ \"engine\": \"{engine}\" }}\n}}\n"
    );
    std::fs::write(dir.join("package.json"), package).expect("write package.json");
}

fn build(dir: &Path) -> Output {
    sluice(dir, &["plugin", "build"], &[])
}

const HANDLER: &str = r#"import { Reject, Retry, handler } from "./sluice.js";
import * as state from "./sluice-state.js";
import * as secrets from "./sluice-secrets.js";

export const messageHandler = handler(async (msg) => {
  const text = msg.text();
  if (text === "empty-key") return String(state.get(""));
  if (text === "secret") return `token of ${secrets.get("api_token").length} characters`;
  if (text === "missing-secret") return secrets.get("other");
  if (text === "fetch") {
    const answer = await fetch("https://api.example.com/v1/items?id=7", { method: "POST", body: msg.payload });
    if (answer.status === 503) throw new Retry(1000);
    if (!answer.ok) throw new Reject(`refused: ${answer.status}`);
    return `${answer.status} ${await answer.text()} ${answer.headers.get("x-served-by")}`;
  }
  const n = state.increment(`count/${msg.key}`);
  state.set(`last/${msg.key}`, text, { ttl: 60_000 });
  const locked = state.compareAndSet("lock", 0, msg.id, { ttl: 1000 });
  return { n, previous: state.getText(`prev/${msg.key}`) ?? null, locked, keys: state.list("count/") };
});
"#;

const CASES: &str = r#"cases:
  - name: counts, remembers, and a held lock stays held
    input: { key: a, payload: hello }
    state: { "count/a": "41", "prev/a": "before", "lock": "held" }
    expect:
      emits:
        - payload_json: { n: 42, previous: before, locked: false, keys: ["count/a"] }
      state: { "count/a": "42", "last/a": "hello", "lock": "held" }
  - name: a free lock is taken
    input: { key: b, payload: hi }
    expect:
      emits:
        - payload_json: { n: 1, previous: null, locked: true, keys: ["count/b"] }
      state: { "count/b": "1", "last/b": "hi" }
  - name: an invalid key rejects with the host's reason, and writes nothing
    input: { key: c, payload: empty-key }
    expect:
      rejected: "invalid state operation: "
      state: { "count/c": null }
  - name: a secret the stage lists
    input: { payload: secret }
    expect:
      emits: [{ payload: "token of 6 characters" }]
  - name: a secret the stage does not list rejects
    input: { payload: missing-secret }
    expect:
      rejected: "secret not granted: "
  - name: fetch, in an async handler
    input: { payload: fetch }
    http:
      - request: { method: POST, url: "https://api.example.com/v1/items?id=7" }
        response: { status: 201, headers: { x-served-by: api-1 }, body: made }
    expect:
      emits: [{ payload: "201 made api-1" }]
  - name: a 503 retries
    input: { payload: fetch }
    http:
      - request: { method: POST, url: "https://api.example.com/v1/items?id=7" }
        response: { status: 503 }
    expect:
      retry: { after_ms: 1000 }
"#;

#[test]
fn a_javascript_handler_uses_state_secrets_and_fetch() {
    let parent = tempfile::tempdir().expect("dir");
    let dir = spidermonkey_project(parent.path(), "caps");
    std::fs::write(dir.join("handler.js"), HANDLER).expect("write handler.js");
    std::fs::write(dir.join("cases.yaml"), CASES).expect("write cases.yaml");

    // The same project on QuickJS: no toolchain, and the same cases pass.
    set_engine(&dir, "quickjs");
    let out = build(&dir);
    assert!(
        out.status.success(),
        "quickjs build:\n{}",
        text(&out.stderr)
    );
    let cases = ["plugin", "test", ".", "--cases", "cases.yaml"];
    let with_secret = [cases.as_slice(), &["--secret", "api_token=env:CAPS_TOKEN"]].concat();
    let out = sluice(&dir, &with_secret, &[("CAPS_TOKEN", "s3cret")]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("7 passed, 0 failed"), "{stdout}");
    // The engine imports every capability, so it is not refused without a
    // secret given: the call that reads one fails, naming the grant.
    let out = sluice(&dir, &cases, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("6 passed, 1 failed"), "{stdout}");
    assert!(
        stdout.contains("stage `plugin test` does not grant secrets"),
        "{stdout}"
    );
    set_engine(&dir, "spidermonkey");

    let out = build(&dir);
    assert!(out.status.success(), "build:\n{}", text(&out.stderr));
    let world = std::fs::read_to_string(dir.join("target/wit-v0.2/world.wit")).expect("world");
    assert!(
        world.contains(
            "import host;\n    import secrets;\n    import state;\n    export message-handler;"
        ),
        "{world}"
    );

    let cases = ["plugin", "test", ".", "--cases", "cases.yaml"];
    let with_secret = [cases.as_slice(), &["--secret", "api_token=env:CAPS_TOKEN"]].concat();
    let out = sluice(&dir, &with_secret, &[("CAPS_TOKEN", "s3cret")]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("7 passed, 0 failed"), "{stdout}");

    // The component imports secrets: without one given, it is refused.
    let out = sluice(&dir, &cases, &[]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("--secret"), "{err}");

    // A wrong expectation of state fails, with what the store holds.
    let wrong = CASES.replace(r#"{ "count/a": "42","#, r#"{ "count/a": "43","#);
    std::fs::write(dir.join("wrong.yaml"), wrong).expect("write");
    let wrong_args = [
        "plugin",
        "test",
        ".",
        "--cases",
        "wrong.yaml",
        "--secret",
        "api_token=env:CAPS_TOKEN",
    ];
    let out = sluice(&dir, &wrong_args, &[("CAPS_TOKEN", "s3cret")]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("6 passed, 1 failed"), "{stdout}");
    assert!(stdout.contains("state `count/a`"), "{stdout}");

    // Only state now: the component imports neither secrets nor wasi:http,
    // so it runs with no secret given.
    let only_state = HANDLER
        .replace("import * as secrets from \"./sluice-secrets.js\";\n", "")
        .replace(
            "if (text === \"secret\") return `token of ${secrets.get(\"api_token\").length} characters`;\n",
            "",
        )
        .replace("if (text === \"missing-secret\") return secrets.get(\"other\");\n", "");
    let start = only_state
        .find("  if (text === \"fetch\")")
        .expect("the fetch branch");
    let end = only_state[start..].find("\n  }\n").expect("its end") + start + 4;
    let only_state = format!("{}{}", &only_state[..start], &only_state[end..]);
    assert!(
        !only_state.contains("secrets") && !only_state.contains("fetch"),
        "{only_state}"
    );
    std::fs::write(dir.join("handler.js"), only_state).expect("write handler.js");
    let state_cases: String = CASES
        .split("\n  - name: ")
        .filter(|case| !case.contains("secret") && !case.contains("fetch"))
        .collect::<Vec<_>>()
        .join("\n  - name: ");
    std::fs::write(dir.join("cases.yaml"), &state_cases).expect("write cases.yaml");
    let out = build(&dir);
    assert!(out.status.success(), "build:\n{}", text(&out.stderr));
    let world = std::fs::read_to_string(dir.join("target/wit-v0.2/world.wit")).expect("world");
    assert!(
        !world.contains("secrets") && world.contains("import state;"),
        "{world}"
    );
    let out = sluice(&dir, &cases, &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("3 passed, 0 failed"), "{stdout}");
}
