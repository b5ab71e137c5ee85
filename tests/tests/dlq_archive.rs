//! Archives (issue 45, Must show 5), the real binary end to end: a
//! stage's `dlq: {archive}` keeps every purged dead letter, with its
//! provenance, as `dlq show` printed it; `dlq redrive --from-archive`
//! puts them back on their source topic and the stage handles them again;
//! a store that refuses makes the purge refuse and delete nothing; and a
//! topic's `retention: {max_age, archive}` on the embedded broker archives
//! what no one acked before dropping it, holding while the store refuses.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use sluice_harness::moto::MotoServer;
use sluice_tests::{Daemon, Msg, plugin};

const LIMIT: Duration = Duration::from_secs(30);

/// The `fail` test plugin's choice (`plugins/testkit/fail`): FNV-1a of
/// the id, murmur3's finalizer, the top 53 bits as a fraction. With
/// `fraction: 0.5` a message fails when this is below one half.
fn fails(id: &str) -> bool {
    let mut h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    ((h >> 11) as f64 / (1u64 << 53) as f64) < 0.5
}

/// `n` ids the stage rejects, whose redrive (id `<id>~r1@shop/check`) it
/// accepts; and `n` it accepts at once.
fn ids(n: usize) -> (Vec<String>, Vec<String>) {
    let (mut rejected, mut accepted) = (Vec::new(), Vec::new());
    for i in 0.. {
        let id = format!("order-{i}");
        if fails(&id) && !fails(&format!("{id}~r1@shop/check")) && rejected.len() < n {
            rejected.push(id);
        } else if !fails(&id) && accepted.len() < n {
            accepted.push(id);
        }
        if rejected.len() == n && accepted.len() == n {
            break;
        }
    }
    (rejected, accepted)
}

fn pipeline(archive: &str) -> String {
    format!(
        r#"
name: shop
topics: [in, out]
stages:
  - name: check
    subscribe: in
    plugin: {fail}
    publish: [out]
    config: {{mode: reject, fraction: 0.5, reason: "no stock"}}
    dlq: {{archive: {{{archive}}}}}
"#,
        fail = plugin("fail"),
    )
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(out: &Output) -> String {
    let (stdout, stderr) = text(out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    stdout
}

/// Publishes `rejected` and `accepted`, waits for the DLQ to hold the
/// rejected and `out` the rest, and returns each entry as `dlq show`
/// prints it, by message id.
fn dead_letters(d: &Daemon, rejected: &[String], accepted: &[String]) -> BTreeMap<String, Value> {
    let messages: Vec<Msg> = rejected
        .iter()
        .chain(accepted)
        .map(|id| Msg::new(id.clone(), format!(r#"{{"order":"{id}"}}"#)).key(id.clone()))
        .collect();
    d.publish("in", &messages);
    d.wait_until("the rejected dead-lettered", LIMIT, |d| {
        d.depth("shop.check.dlq") == rejected.len() && d.depth("out") == accepted.len()
    });
    let list: Value =
        serde_json::from_str(&ok(&d.cli(&["dlq", "list", "shop/check", "--json"], &[])))
            .expect("list JSON");
    let mut shown = BTreeMap::new();
    for entry in list["entries"].as_array().expect("entries") {
        let seq = entry["seq"].to_string();
        let one: Value =
            serde_json::from_str(&ok(&d.cli(&["dlq", "show", "shop/check", &seq], &[])))
                .expect("show JSON");
        let original = one["headers"]
            .as_array()
            .and_then(|h| h.iter().find(|p| p[0] == "sluice-dlq-original-id"))
            .map(|p| p[1].as_str().expect("text").to_owned())
            .expect("provenance names the original id");
        shown.insert(original, one);
    }
    assert_eq!(
        shown.keys().cloned().collect::<BTreeSet<_>>(),
        rejected.iter().cloned().collect(),
    );
    shown
}

/// Every line of every `*.jsonl` file under `dir`.
fn archived_lines(dir: &Path) -> Vec<Value> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).expect("read the archive") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut lines = Vec::new();
    for file in files {
        let name = file
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if name.starts_with('.') {
            // A write being staged (file:// stages, then hard-links).
            continue;
        }
        assert!(name.ends_with(".jsonl"), "{file:?}");
        for line in std::fs::read_to_string(&file).expect("read").lines() {
            lines.push(serde_json::from_str(line).expect("a JSON line"));
        }
    }
    lines
}

/// The payloads `topic` holds.
fn payloads(d: &Daemon, topic: &str) -> BTreeSet<String> {
    d.read_all(topic)
        .iter()
        .map(|m| m["payload"].as_str().expect("text payload").to_owned())
        .collect()
}

#[test]
fn a_purged_dlq_is_archived_with_provenance_and_redriven_from_the_archive() {
    let dir = tempfile::tempdir().expect("dir");
    let store: PathBuf = dir.path().join("archive");
    let d = Daemon::with_yaml(&pipeline(&format!(
        "store: \"file://{}\", path: dead",
        store.display()
    )))
    .start();
    let (rejected, accepted) = ids(3);
    let shown = dead_letters(&d, &rejected, &accepted);

    // The store refuses (its directory is a file): the purge refuses and
    // deletes nothing.
    std::fs::write(&store, b"not a directory").expect("block the store");
    let out = d.cli(&["dlq", "purge", "shop/check", "--all"], &[]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stderr.contains("cannot be opened") && stderr.contains("nothing was purged"),
        "{stderr}"
    );
    assert_eq!(d.depth("shop.check.dlq"), rejected.len());
    std::fs::remove_file(&store).expect("unblock the store");

    // Archived, then deleted: the archive holds the entries exactly as
    // `dlq show` printed them, provenance and all.
    let stdout = ok(&d.cli(&["dlq", "purge", "shop/check", "--all"], &[]));
    assert!(stdout.contains("purged 3 entries"), "{stdout}");
    assert!(stdout.contains("archived to file://"), "{stdout}");
    assert_eq!(d.depth("shop.check.dlq"), 0);
    let lines = archived_lines(&store);
    assert_eq!(lines.len(), rejected.len());
    for line in &lines {
        let original = line["headers"]
            .as_array()
            .and_then(|h| h.iter().find(|p| p[0] == "sluice-dlq-original-id"))
            .map(|p| p[1].as_str().expect("text"))
            .expect("provenance");
        assert_eq!(line, &shown[original], "archived as `dlq show` printed it");
        assert_eq!(line["source_topic"], "in");
        assert_eq!(line["kind"], "rejected");
        assert_eq!(line["error"], "no stock");
    }

    // A dry run changes nothing; the redrive puts them back on `in`, the
    // stage accepts them this time, and `out` has every payload.
    let url = format!("file://{}", store.display());
    let stdout = ok(&d.cli(
        &["dlq", "redrive", "--from-archive", &url, "--dry-run"],
        &[],
    ));
    assert!(stdout.contains("would redrive 3 messages"), "{stdout}");
    for id in &rejected {
        assert!(stdout.contains(&format!("{id}~r1@shop/check")), "{stdout}");
    }
    assert_eq!(d.depth("shop.check.dlq"), 0);
    let stdout = ok(&d.cli(&["dlq", "redrive", "--from-archive", &url], &[]));
    assert!(stdout.contains("redrove 3 messages"), "{stdout}");
    for id in &rejected {
        assert!(stdout.contains(&format!("{id}~r1@shop/check")), "{stdout}");
    }
    d.wait_until("the redriven handled", LIMIT, |d| {
        d.depth("out") == rejected.len() + accepted.len()
    });
    let want: BTreeSet<String> = rejected
        .iter()
        .chain(&accepted)
        .map(|id| format!(r#"{{"order":"{id}"}}"#))
        .collect();
    assert_eq!(payloads(&d, "out"), want);
    assert_eq!(d.depth("shop.check.dlq"), 0);

    // Redriving the same archive again is deduplicated, not handled twice.
    let stdout = ok(&d.cli(&["dlq", "redrive", "--from-archive", &url], &[]));
    assert!(stdout.contains("redrove 0 messages"), "{stdout}");

    // A missing archive and a malformed one are clear errors (exit 2).
    let out = d.cli(
        &[
            "dlq",
            "redrive",
            "--from-archive",
            &format!("{url}-missing"),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(text(&out).1.contains("no archive at"), "{:?}", text(&out));
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&bad).expect("dir");
    std::fs::write(bad.join("x.jsonl"), "{\"id\": 1}\n").expect("write");
    let out = d.cli(
        &[
            "dlq",
            "redrive",
            "--from-archive",
            &format!("file://{}", bad.display()),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(
        text(&out).1.contains("x.jsonl:1: not a dead letter"),
        "{:?}",
        text(&out)
    );
}

#[test]
fn a_purged_dlq_is_archived_to_s3_compressed_and_redriven_from_there() {
    let moto = MotoServer::start().expect("moto");
    moto.create_bucket("keep").expect("bucket");
    let d = Daemon::with_yaml(&pipeline(&format!(
        "store: \"s3://keep/dlq\", endpoint: \"{}\", allow_http: true, compression: gzip",
        moto.endpoint()
    )))
    .envs(moto.env())
    .start();
    let (rejected, accepted) = ids(2);
    dead_letters(&d, &rejected, &accepted);
    let stdout = ok(&d.cli(&["dlq", "purge", "shop/check", "--all"], &[]));
    assert!(
        stdout.contains("archived to s3://keep/dlq/shop/check/"),
        "{stdout}"
    );
    assert!(stdout.contains(".jsonl.gz"), "{stdout}");
    assert_eq!(d.depth("shop.check.dlq"), 0);

    let env: Vec<(String, String)> = moto.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let endpoint = moto.endpoint();
    let args = |dry: bool| {
        let mut args = vec![
            "dlq",
            "redrive",
            "--from-archive",
            "s3://keep/dlq",
            "--endpoint",
            endpoint.as_str(),
            "--allow-http",
            "--json",
        ];
        if dry {
            args.push("--dry-run");
        }
        args
    };
    let dry: Value = serde_json::from_str(&ok(&d.cli(&args(true), &env))).expect("JSON");
    assert_eq!(dry["redriven"], 2, "{dry}");
    let done: Value = serde_json::from_str(&ok(&d.cli(&args(false), &env))).expect("JSON");
    assert_eq!(done["redriven"], 2, "{done}");
    d.wait_until("the redriven handled", LIMIT, |d| d.depth("out") == 4);
}

#[test]
fn retention_archives_what_no_one_acked_and_holds_while_the_store_refuses() {
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("retained");
    // The store refuses from the start: nothing may be dropped.
    std::fs::write(&store, b"not a directory").expect("block the store");
    let yaml = format!(
        r#"
name: keep
topics:
  - name: events
    retention: {{max_age: 1s, archive: {{store: "file://{store}"}}}}
stages:
  - name: slow
    subscribe: events
    plugin: {fail}
    config: {{mode: retry}}
    retry: {{max_attempts: 100, backoff: {{initial: 10m, max: 10m}}}}
"#,
        store = store.display(),
        fail = plugin("fail"),
    );
    let file = sluice_tests::write_pipeline(dir.path(), "keep", &yaml);
    let d = Daemon::builder(&[&file], &dir.path().join("data")).start();
    let messages: Vec<Msg> = (0..20)
        .map(|i| Msg::new(format!("e-{i}"), format!(r#"{{"n":{i}}}"#)))
        .collect();
    d.publish("events", &messages);
    d.wait_until("readiness names the archive", LIMIT, |d| {
        d.readiness().1.contains("retention-archive:events")
    });
    // Past max_age and refused by the store: all still there.
    assert_eq!(d.depth("events"), 20);

    std::fs::remove_file(&store).expect("unblock the store");
    d.wait_until("retention archived and dropped", LIMIT, |d| {
        d.depth("events") == 0
    });
    let lines = archived_lines(&store);
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["id"].as_str().expect("id"))
        .collect();
    let unique: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), 20, "each once: {ids:?}");
    assert_eq!(
        unique,
        (0..20)
            .map(|i| format!("e-{i}"))
            .collect::<BTreeSet<_>>()
            .iter()
            .map(String::as_str)
            .collect()
    );
    for line in &lines {
        let n: u64 = line["id"].as_str().expect("id")[2..].parse().expect("n");
        assert_eq!(line["payload"]["n"], n, "{line}");
        assert_eq!(line["topic"], "events");
    }
    d.wait_until("readiness clears", LIMIT, |d| {
        !d.readiness().1.contains("retention-archive:events")
    });

    // The archivers start with the daemon: a reload that changes one is
    // refused, saying so, rather than applied halfway.
    std::fs::write(&file, yaml.replace("max_age: 1s", "max_age: 2s")).expect("rewrite");
    let out = d.cli(&["reload", "--json"], &[]);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("the retention archivers start with the daemon"),
        "{stdout}\n{stderr}"
    );
}

#[test]
fn a_dlq_topics_retention_archives_its_entries_as_dlq_show_prints_them() {
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("dead");
    // The default DLQ topic, declared to give it a retention with an
    // archive: what its retention drops is archived as a purge's would be.
    let yaml = format!(
        r#"
name: shop
topics:
  - in
  - name: shop.check.dlq
    retention: {{max_age: 1s, archive: {{store: "file://{store}"}}}}
stages:
  - name: check
    subscribe: in
    plugin: {fail}
    config: {{mode: reject, reason: "no stock"}}
"#,
        store = store.display(),
        fail = plugin("fail"),
    );
    let d = Daemon::with_yaml(&yaml).start();
    let messages: Vec<Msg> = (0..3)
        .map(|i| Msg::new(format!("d-{i}"), format!(r#"{{"n":{i}}}"#)))
        .collect();
    d.publish("in", &messages);
    d.wait_until("dead-lettered, archived and dropped", LIMIT, |d| {
        store.is_dir() && archived_lines(&store).len() == 3 && d.depth("shop.check.dlq") == 0
    });
    for line in archived_lines(&store) {
        assert_eq!(line["topic"], "shop.check.dlq", "{line}");
        assert_eq!(line["source_topic"], "in", "{line}");
        assert_eq!(line["kind"], "rejected", "{line}");
        assert_eq!(line["error"], "no stock", "{line}");
    }
    let url = format!("file://{}", store.display());
    let stdout = ok(&d.cli(
        &["dlq", "redrive", "--from-archive", &url, "--dry-run"],
        &[],
    ));
    assert!(stdout.contains("would redrive 3 messages"), "{stdout}");
}
