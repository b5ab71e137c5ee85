//! Any NATS client can produce into a pipeline and read its outputs: a
//! Python program using nats-py alone (`fixtures/nats_interop.py`, run with
//! `python3`) publishes into the source subject of a pipeline that runs on
//! NATS, with and without `Nats-Msg-Id`, and reads the output subject.
//! This test judges what it saw, by id: each input has exactly one output,
//! with the deterministic id, the upper-cased payload, its headers and key.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;
use sluice::broker::nats::stream_name;
use sluice::engine::emit_id;
use sluice_tests::{Backend, Daemon, plugin, write_pipeline};

const IN: &str = "interop.in";
const OUT: &str = "interop.out";

#[test]
fn a_nats_py_producer_and_reader_see_right_and_complete_outputs() {
    let backend = Backend::nats();
    let server = backend.nats_server().expect("a nats-server");
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: interop
topics: [{IN}, {OUT}]
stages:
  - name: shout
    subscribe: {IN}
    plugin: {uppercase}
    publish: [{OUT}]
    concurrency: 4
"#,
        uppercase = plugin("uppercase")
    );
    let file = write_pipeline(dir.path(), "interop", &yaml);
    let daemon = Daemon::start_on(&backend, &[&file], &dir.path().join("data"));

    let n = 1000;
    let script = sluice_harness::repo_root()
        .join("tests/fixtures/nats_interop.py")
        .display()
        .to_string();
    let run = Command::new("python3")
        .args([&script, &server.url(), IN, OUT, &n.to_string()])
        .output()
        .expect("run python3 (with nats-py: `cargo xtask setup`)");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{script} failed ({}):\n{}\n{stdout}\ndaemon log:\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr),
        daemon.log()
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();

    // What must come out, by output id: (payload, x-py, key).
    let mut expected: BTreeMap<String, (String, String, Option<String>)> = BTreeMap::new();
    for line in lines.iter().filter(|l| l["published"].is_u64()) {
        let i = line["published"].as_u64().expect("i");
        assert_eq!(line["duplicate"], false, "{line}");
        let input = match line["id"].as_str() {
            Some(id) => {
                assert_eq!(id, format!("py-{i}"));
                id.to_owned()
            }
            // No Nats-Msg-Id: Sluice names it by its place in the stream.
            None => format!("{}:{}", stream_name(IN), line["seq"]),
        };
        let key = (i % 3 == 0).then(|| format!("k{}", i % 5));
        expected.insert(
            emit_id("interop", "shout", &input, 0),
            (format!("HELLO {i}"), i.to_string(), key),
        );
    }
    assert_eq!(expected.len(), n, "every publish reported");
    let again = lines
        .iter()
        .find(|l| l["published"] == "again")
        .expect("the repeated publish");
    assert_eq!(
        again["duplicate"], true,
        "the stream kept py-0 twice: {again}"
    );

    let outputs: Vec<&Value> = lines.iter().filter_map(|l| l.get("output")).collect();
    let id_of = |o: &Value| o["headers"]["Nats-Msg-Id"].as_str().map(str::to_owned);
    let mut per_id: BTreeMap<String, usize> = BTreeMap::new();
    for o in &outputs {
        assert_eq!(o["subject"], OUT, "{o}");
        let id = id_of(o).unwrap_or_else(|| panic!("an output without Nats-Msg-Id: {o}"));
        *per_id.entry(id).or_insert(0) += 1;
    }
    let dupes: Vec<_> = per_id.iter().filter(|(_, c)| **c > 1).collect();
    assert!(dupes.is_empty(), "outputs seen twice: {dupes:?}");

    // The plain core message without headers: one output, matched by payload.
    let plain: Vec<&&Value> = outputs
        .iter()
        .filter(|o| o["payload"] == "PLAIN CORE")
        .collect();
    assert_eq!(plain.len(), 1, "the header-less core publish: {plain:?}");
    let plain_id = id_of(plain[0]).expect("id");

    let got: BTreeSet<&String> = per_id.keys().filter(|id| **id != plain_id).collect();
    let want: BTreeSet<&String> = expected.keys().collect();
    let missing: Vec<_> = want.difference(&got).collect();
    let unexpected: Vec<_> = got.difference(&want).collect();
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "{} missing (e.g. {:?}), {} unexpected (e.g. {:?})",
        missing.len(),
        &missing[..missing.len().min(5)],
        unexpected.len(),
        &unexpected[..unexpected.len().min(5)]
    );
    assert_eq!(outputs.len(), n + 1);

    for o in &outputs {
        let id = id_of(o).expect("id");
        if id == plain_id {
            continue;
        }
        let (payload, x_py, key) = &expected[&id];
        assert_eq!(o["payload"], payload.as_str(), "{o}");
        assert_eq!(o["headers"]["x-py"], x_py.as_str(), "{o}");
        assert_eq!(o["headers"]["Sluice-Key"].as_str(), key.as_deref(), "{o}");
    }
}
