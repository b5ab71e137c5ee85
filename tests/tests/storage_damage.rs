//! A damaged embedded store, with the real `sluice` binary: damage in the
//! middle of the journal refuses to start and changes no file; a torn tail
//! starts with everything before it; `sluice data check` reports the
//! damage and `sluice data salvage` copies what is readable and reports
//! what was lost.
//!
//! The data directory is filled through a running daemon and stopped with
//! SIGTERM. A clean stop leaves the messages in the journal: fjall does not
//! flush memtables when it closes, and a few thousand small messages stay
//! well below the 4 MiB memtable (the test asserts the journal holds them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};
use sluice::broker::embedded::journal;
use sluice_tests::{Daemon, Msg, plugin, sluice_to_exit, write_pipeline};

/// Messages published to `side` (no stage reads it, so all stay stored).
const N: usize = 3000;
/// Messages per publish request, so the journal holds many batches.
const CHUNK: usize = 10;

fn payload(i: usize) -> String {
    format!("payload-{i}-{}", "x".repeat(80))
}

fn pipeline(dir: &Path) -> PathBuf {
    let yaml = format!(
        r#"
name: damage
topics:
  - name: in
  - out
  - side
stages:
  - name: work
    subscribe: in
    plugin: {plugin}
    concurrency: 1
    publish: [out]
"#,
        plugin = plugin("identity"),
    );
    write_pipeline(dir, "damage", &yaml)
}

/// A stopped data directory holding `N` messages in `side`, in its journal.
fn filled(dir: &Path) -> (PathBuf, PathBuf) {
    let file = pipeline(dir);
    let data = dir.join("data");
    let mut daemon = Daemon::start(&[file.as_path()], &data);
    let messages: Vec<Msg> = (0..N)
        .map(|i| Msg::new(format!("t{i}"), payload(i)))
        .collect();
    for chunk in messages.chunks(CHUNK) {
        daemon.publish("side", chunk);
    }
    let (status, _) = daemon.sigterm();
    assert!(status.success(), "stop: {status:?}\n{}", daemon.log());
    let (_, valid) = journal_of(&data);
    assert!(
        valid > (N * 80) as u64,
        "the journal holds only {valid} bytes: the messages were flushed to tables"
    );
    (file, data)
}

/// The journal holding the data, and where its data ends.
fn journal_of(data: &Path) -> (PathBuf, u64) {
    let journals = journal::verify(&data.join("store")).expect("read journals");
    let j = journals
        .into_iter()
        .max_by_key(|j| j.valid_end)
        .expect("a journal");
    (j.path, j.valid_end)
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).expect("mkdir");
    for entry in std::fs::read_dir(src).expect("read_dir") {
        let entry = entry.expect("entry");
        let to = dst.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).expect("copy");
        }
    }
}

/// Size and SHA-256 of every file under `dir`.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("read");
                let hash = Sha256::digest(&bytes).to_vec();
                out.insert(path, (bytes.len() as u64, hash));
            }
        }
    }
    out
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The ids and payloads read are exactly `t0..t(k-1)` in order; returns k.
fn assert_prefix(messages: &[Value]) -> usize {
    for (i, m) in messages.iter().enumerate() {
        assert_eq!(m["id"], format!("t{i}"), "message {i}: {m}");
        assert_eq!(m["payload"], payload(i), "message {i}");
        assert_eq!(m["seq"], i as u64 + 1, "message {i}");
    }
    messages.len()
}

#[test]
fn damage_in_the_journal_refuses_to_start_and_changes_no_file() {
    let dir = tempfile::tempdir().expect("dir");
    let (file, data) = filled(dir.path());
    let file = file.display().to_string();

    // The undamaged directory checks clean.
    let clean = sluice_to_exit(&["data", "check", "--data-dir", &data.display().to_string()]);
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean));
    assert!(String::from_utf8_lossy(&clean.stdout).contains("ok:"));

    for pct in [10u64, 30, 50, 70, 90] {
        let copy = dir.path().join(format!("copy-{pct}"));
        copy_dir(&data, &copy);
        let (jnl, valid) = journal_of(&copy);
        let at = valid * pct / 100;
        let mut bytes = std::fs::read(&jnl).expect("read journal");
        for b in &mut bytes[at as usize..at as usize + 16] {
            *b ^= 0xff;
        }
        std::fs::write(&jnl, &bytes).expect("write journal");
        let before = snapshot(&copy);
        let d = copy.display().to_string();

        let run = sluice_to_exit(&["run", &file, "--data-dir", &d, "--admin", "127.0.0.1:0"]);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            !run.status.success() && run.status.code().is_some(),
            "{pct}%: {}",
            text(&run)
        );
        let name = jnl
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(
            stderr.contains("damaged") && stderr.contains(&name) && !stderr.contains("panicked"),
            "{pct}%: {}",
            text(&run)
        );
        assert_eq!(snapshot(&copy), before, "{pct}%: a file changed");

        // check: exit 1, the journal named, the topic's lost range.
        let check = sluice_to_exit(&["data", "check", "--data-dir", &d]);
        let out = String::from_utf8_lossy(&check.stdout);
        assert_eq!(check.status.code(), Some(1), "{pct}%: {}", text(&check));
        assert!(
            out.contains("DAMAGED") && out.contains(&name),
            "{pct}%: {out}"
        );
        assert!(out.contains("topic side: messages"), "{pct}%: {out}");
        assert_eq!(snapshot(&copy), before, "{pct}%: check changed a file");

        // salvage: a new directory with everything before the damage, the
        // loss reported from the first missing seq, nothing changed here.
        let to = dir.path().join(format!("salvaged-{pct}"));
        let salvage = sluice_to_exit(&[
            "data",
            "salvage",
            "--data-dir",
            &d,
            "--to",
            &to.display().to_string(),
        ]);
        let out = String::from_utf8_lossy(&salvage.stdout).into_owned();
        assert_eq!(salvage.status.code(), Some(1), "{pct}%: {}", text(&salvage));
        assert_eq!(snapshot(&copy), before, "{pct}%: salvage changed a file");
        let report = std::fs::read_to_string(to.join("salvage-report.txt")).expect("report");
        assert!(report.contains("DAMAGED"), "{report}");

        let mut daemon = Daemon::start(&[Path::new(&file)], &to);
        let kept = assert_prefix(&daemon.read_all("side"));
        assert!(kept < N, "{pct}%: nothing lost?");
        let lost_from = format!("topic side: messages seq {}..={N}", kept + 1);
        assert!(
            out.contains(&lost_from),
            "{pct}%: wanted `{lost_from}` in\n{out}"
        );
        // Seqs lost are never handed out again.
        daemon.publish("side", &[Msg::new("after", "after")]);
        let all = daemon.read_all("side");
        let last = all.last().expect("the new message");
        assert_eq!(last["id"], "after");
        assert!(last["seq"].as_u64() > Some(N as u64), "{last}");
        let (status, _) = daemon.sigterm();
        assert!(status.success());
    }
}

#[test]
fn a_torn_tail_starts_with_everything_before_it_intact() {
    let dir = tempfile::tempdir().expect("dir");
    let (file, data) = filled(dir.path());
    let (jnl, valid) = journal_of(&data);
    // Cut into the last batch: the write a crash interrupted.
    std::fs::File::options()
        .write(true)
        .open(&jnl)
        .expect("open journal")
        .set_len(valid - 5)
        .expect("cut");

    let d = data.display().to_string();
    let check = sluice_to_exit(&["data", "check", "--data-dir", &d]);
    assert_eq!(check.status.code(), Some(0), "{}", text(&check));
    assert!(
        String::from_utf8_lossy(&check.stdout).contains("torn tail"),
        "{}",
        text(&check)
    );

    let mut daemon = Daemon::start(&[file.as_path()], &data);
    let kept = assert_prefix(&daemon.read_all("side"));
    assert!(kept >= N - CHUNK, "only {kept} of {N} messages kept");

    // The tools refuse a directory a daemon holds.
    let busy = sluice_to_exit(&["data", "check", "--data-dir", &d]);
    assert_eq!(busy.status.code(), Some(2), "{}", text(&busy));
    assert!(String::from_utf8_lossy(&busy.stderr).contains("in use"));

    let (status, _) = daemon.sigterm();
    assert!(status.success(), "{}", daemon.log());
}

/// The largest table file under `store/keyspaces` (the messages').
fn largest_table(data: &Path) -> PathBuf {
    let mut best: Option<(u64, PathBuf)> = None;
    let mut stack = vec![data.join("store").join("keyspaces")];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.parent().and_then(|p| p.file_name()) == Some("tables".as_ref()) {
                let len = std::fs::metadata(&path).expect("metadata").len();
                if best.as_ref().is_none_or(|(l, _)| len > *l) {
                    best = Some((len, path));
                }
            }
        }
    }
    best.expect("a table file: the messages were never flushed")
        .1
}

/// A damaged table block: `check` names the topic and seq range,
/// `quarantine` removes exactly that range (keeping the old store), and the
/// daemon then serves everything else.
#[test]
fn a_damaged_table_block_is_reported_and_quarantined() {
    let dir = tempfile::tempdir().expect("dir");
    let file = pipeline(dir.path());
    let data = dir.path().join("data");
    let n = 6000;
    let big = |i: usize| format!("big-{i}-{}", "y".repeat(1000));
    let mut daemon = Daemon::start(&[file.as_path()], &data);
    let messages: Vec<Msg> = (0..n).map(|i| Msg::new(format!("t{i}"), big(i))).collect();
    // Over the 4 MiB memtable, so most of them are flushed to a table.
    daemon.publish("side", &messages);
    // Setup, not a check: time for the memtable to flush to a table (the
    // SIGTERM below flushes what is left too); the damage comes after.
    std::thread::sleep(Duration::from_secs(3));
    let (status, _) = daemon.sigterm();
    assert!(status.success());

    let table = largest_table(&data);
    let mut bytes = std::fs::read(&table).expect("read table");
    let at = bytes.len() / 2;
    for b in &mut bytes[at..at + 16] {
        *b ^= 0xff;
    }
    std::fs::write(&table, &bytes).expect("write table");
    let d = data.display().to_string();

    let check = sluice_to_exit(&["data", "check", "--data-dir", &d]);
    let out = String::from_utf8_lossy(&check.stdout).into_owned();
    assert_eq!(check.status.code(), Some(1), "{}", text(&check));
    let line = out
        .lines()
        .find(|l| l.contains("touches topic side: messages seq "))
        .unwrap_or_else(|| panic!("no damaged range in\n{out}"));
    let range = line.rsplit("seq ").next().expect("range");
    let (from, to) = range.split_once("..=").expect("a..=b");
    let (from, to): (u64, u64) = (from.parse().expect("from"), to.parse().expect("to"));
    assert!(from >= 1 && from <= to && to <= n as u64, "{line}");

    let q = sluice_to_exit(&[
        "data",
        "quarantine",
        "--data-dir",
        &d,
        "--topic",
        "side",
        "--from",
        &from.to_string(),
        "--to",
        &to.to_string(),
    ]);
    assert_eq!(q.status.code(), Some(0), "{}", text(&q));
    let report = std::fs::read_to_string(data.join("quarantine-report.txt")).expect("report");
    assert!(
        report.contains(&format!("topic side seq {from}..={to}")),
        "{report}"
    );
    let clean = sluice_to_exit(&["data", "check", "--data-dir", &d]);
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean));

    let mut daemon = Daemon::start(&[file.as_path()], &data);
    let all = daemon.read_all("side");
    let want: Vec<String> = (0..n)
        .filter(|i| !(from..=to).contains(&(*i as u64 + 1)))
        .map(|i| format!("t{i}"))
        .collect();
    let got: Vec<String> = all
        .iter()
        .map(|m| m["id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(got, want);
    for m in &all {
        let seq = m["seq"].as_u64().expect("seq") as usize;
        assert_eq!(m["payload"], big(seq - 1));
    }
    let (status, _) = daemon.sigterm();
    assert!(status.success());
}
