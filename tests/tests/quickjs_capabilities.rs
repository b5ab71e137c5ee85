//! The capabilities of contract 0.2.0 on the QuickJS engine, against the
//! real `sluice` binary: a project made by `sluice plugin new --lang js`
//! (QuickJS, what it writes) whose handler uses the SDK's `sluice-state.js`,
//! `sluice-secrets.js` and the global `fetch`, built with no toolchain.
//!
//! - On a stage that grants all three, it counts per key in state (an
//!   increment followed by a reject is discarded with the outcome, so the
//!   count goes on from the last ack), reads its secret, and POSTs to a
//!   real HTTP server on loopback (`localhost`, with `allow_private`),
//!   reading the answer's status, headers and JSON.
//! - The same component on a stage that grants none is not refused: the
//!   engine imports every capability, so `validate` passes and the daemon
//!   loads it, and each call of a capability fails with an error naming
//!   the stage (`pipeline/stage`) and the grant to add, which reaches the
//!   dead letter as its reason. The server sees nothing from that stage.
//!
//! (A component built with componentize-js, which imports only what its
//! code uses, is refused at load on such a stage: `js_capabilities`,
//! `outbound_http` and `secrets` check that.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use sluice_tests::receiver::{Receiver, Reply};
use sluice_tests::{Daemon, Msg, sluice_bin, write_pipeline};

const LONG: Duration = Duration::from_secs(120);
const TOKEN: &str = "qjs-t0ken-19-chars";

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

const HANDLER: &str = r#"import { Reject, handler } from "./sluice.js";
import * as state from "./sluice-state.js";
import * as secrets from "./sluice-secrets.js";

export const messageHandler = handler(async (msg) => {
  const text = msg.text();
  if (text === "count") return `count ${msg.key} ${state.increment(`count/${msg.key}`)}`;
  if (text === "count-then-reject") {
    state.increment(`count/${msg.key}`);
    throw new Reject("rejected after an increment");
  }
  if (text === "secret") return `secret of ${secrets.get("token").length} characters`;
  if (text.startsWith("fetch ")) {
    let answer;
    try {
      answer = await fetch(text.slice("fetch ".length), {
        method: "POST",
        headers: { "content-type": "text/plain", "x-from": "quickjs" },
        body: `from ${msg.id}`,
      });
    } catch (e) {
      throw new Reject(e.message);
    }
    const json = await answer.json();
    return `${answer.status} ${answer.ok} ${answer.headers.get("x-served-by")} ${json.echo}`;
  }
  throw new Reject(`unknown request ${text}`);
});
"#;

/// A QuickJS project with [`HANDLER`], built; its component.
fn built_project(parent: &Path) -> PathBuf {
    let out = sluice(parent, &["plugin", "new", "caps", "--lang", "js"]);
    assert!(out.status.success(), "plugin new: {}", text(&out.stderr));
    let dir = parent.join("caps");
    let package = std::fs::read_to_string(dir.join("package.json")).expect("package.json");
    assert!(
        package.contains(r#""sluice": { "engine": "quickjs" }"#),
        "{package}"
    );
    std::fs::write(dir.join("handler.js"), HANDLER).expect("write handler.js");
    let out = sluice(&dir, &["plugin", "build"]);
    assert!(out.status.success(), "build:\n{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let wasm = PathBuf::from(stdout.lines().last().expect("a path").trim());
    assert!(wasm.is_file(), "{} is not the component", wasm.display());
    wasm
}

#[test]
fn a_quickjs_handler_uses_granted_capabilities_and_ungranted_ones_fail_naming_the_grant() {
    let parent = tempfile::tempdir().expect("dir");
    let wasm = built_project(parent.path());

    let server = Receiver::start(Arc::new(|hit, _| {
        Reply::status(201)
            .header("x-served-by", "api-1")
            .header("content-type", "application/json")
            .body(serde_json::json!({ "echo": hit.text() }).to_string())
    }));
    let port = server.addr.port();
    let token_file = parent.path().join("token");
    std::fs::write(&token_file, TOKEN).expect("write token");
    let yaml = format!(
        r#"
name: caps
secrets:
  token: {{ file: {token} }}
topics: [in, bare-in, out]
stages:
  - name: full
    subscribe: in
    plugin: {plugin}
    publish: [out]
    retry: {{ max_attempts: 1 }}
    state: true
    secrets: [token]
    http:
      allow: ["localhost:{port}"]
      allow_private: true
  - name: bare
    subscribe: bare-in
    plugin: {plugin}
    publish: [out]
    retry: {{ max_attempts: 1 }}
"#,
        token = token_file.display(),
        plugin = wasm.display(),
    );

    // The engine is not refused for what the bare stage does not grant.
    let check = tempfile::tempdir().expect("dir");
    let file = write_pipeline(check.path(), "caps", &yaml);
    let out = sluice(check.path(), &["validate", &file.display().to_string()]);
    assert!(
        out.status.success(),
        "validate:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    let d = Daemon::with_yaml(&yaml).start();
    let url = format!("http://localhost:{port}/v1/items");
    d.publish(
        "in",
        &[
            Msg::new("c1", "count").key("a"),
            Msg::new("c2", "count").key("a"),
            Msg::new("c3", "count-then-reject").key("a"),
            Msg::new("c4", "count").key("a"),
            Msg::new("s1", "secret"),
            Msg::new("f1", format!("fetch {url}")),
        ],
    );
    d.wait_until("the granted stage's outputs", LONG, |d| {
        d.depth("out") >= 5 && d.depth("caps.full.dlq") >= 1
    });
    let mut out: Vec<String> = d
        .read_all("out")
        .iter()
        .map(|m| m["payload"].as_str().expect("text").to_owned())
        .collect();
    out.sort();
    assert_eq!(
        out,
        [
            "201 true api-1 from f1",
            "count a 1",
            "count a 2",
            "count a 3",
            "secret of 18 characters",
        ],
        "the rejected call's increment was discarded"
    );
    let hits = server.hits();
    assert_eq!(hits.len(), 1, "one request");
    assert_eq!(hits[0].method, "POST");
    assert_eq!(hits[0].path, "/v1/items");
    assert_eq!(hits[0].header("x-from"), Some("quickjs"));
    assert_eq!(hits[0].key(), "f1:0", "the host's Idempotency-Key");
    let dead = d.read_all("caps.full.dlq");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        sluice_tests::header(&dead[0], "sluice-dlq-error"),
        Some("rejected after an increment")
    );

    // The same component where nothing is granted: each call fails, naming
    // the stage and the grant.
    d.publish(
        "bare-in",
        &[
            Msg::new("b-state", "count").key("a"),
            Msg::new("b-secret", "secret"),
            Msg::new("b-fetch", format!("fetch {url}")),
        ],
    );
    d.wait_until("the bare stage's dead letters", LONG, |d| {
        d.depth("caps.bare.dlq") >= 3
    });
    let dead = d.read_all("caps.bare.dlq");
    let reason = |id: &str| {
        let entry = dead
            .iter()
            .find(|m| m["id"] == id)
            .unwrap_or_else(|| panic!("no dead letter for {id}: {dead:?}"));
        sluice_tests::header(entry, "sluice-dlq-error")
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(
        reason("b-state"),
        "state not granted: stage `caps/bare` does not grant state; add `state: true` to it"
    );
    let secret = reason("b-secret");
    assert!(
        secret.starts_with("secret not granted: stage `caps/bare` does not grant secrets;")
            && secret.contains("`secrets:`"),
        "{secret}"
    );
    let fetch = reason("b-fetch");
    assert!(
        fetch.contains(&format!("fetch POST {url} failed"))
            && fetch.contains(
                "stage `caps/bare` does not grant http; add `http: {allow: [HOST, ...]}` to it"
            ),
        "{fetch}"
    );
    assert_eq!(server.hits().len(), 1, "the bare stage reached the server");
    assert_eq!(d.depth("out"), 5, "the bare stage emitted");
    let log = d.log();
    assert!(!log.contains(TOKEN), "the log holds the secret:\n{log}");
}
