//! A full disk under the embedded store, with the real `sluice` binary on a
//! 16 MiB tmpfs: writes answer 503 (never 500), and once the tmpfs grows
//! the daemon takes writes again by itself, without a restart; every
//! message answered 202 is processed.
//!
//! Needs root (mount); without it the test skips with the reason "not
//! root", which `cargo xtask test` refuses when it runs as root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sluice_tests::{Daemon, plugin, write_pipeline};

/// Unmounts the tmpfs when the test ends, however it ends.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("mkdir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount tmpfs failed");
        Tmpfs(dir.to_owned())
    }

    fn grow(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .expect("run mount");
        assert!(status.success(), "remount failed");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// `POST /v1/topics/in/messages` with id `id`; the status code. Every
/// 503 must say when to come back (`Retry-After`).
fn ingest(http: &reqwest::blocking::Client, daemon: &Daemon, id: &str, body: &str) -> u16 {
    match http
        .post(format!("{}/v1/topics/in/messages", daemon.base))
        .header("idempotency-key", id)
        .body(body.to_owned())
        .send()
    {
        Ok(r) => {
            let status = r.status().as_u16();
            if status == 503 {
                assert!(
                    r.headers().contains_key("retry-after"),
                    "a 503 without Retry-After: {:?}",
                    r.headers()
                );
            }
            status
        }
        Err(e) => panic!("ingest {id}: {e}"),
    }
}

/// `GET /health/ready`'s status code.
fn readiness(http: &reqwest::blocking::Client, daemon: &Daemon) -> u16 {
    match http.get(format!("{}/health/ready", daemon.base)).send() {
        Ok(r) => r.status().as_u16(),
        Err(e) => panic!("readiness: {e}"),
    }
}

fn body(i: usize) -> String {
    format!("m{i}-{}", "x".repeat(2000))
}

#[test]
fn a_full_disk_answers_503_and_recovers_without_a_restart() {
    if !sluice_harness::skip::is_root() {
        sluice_harness::skip::skip(
            "a_full_disk_answers_503_and_recovers_without_a_restart",
            sluice_harness::skip::Reason::NotRoot,
            "mounting a tmpfs needs root",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    // Dropped after the daemon (declared first): the daemon is killed
    // before the unmount.
    let tmpfs = Tmpfs::mount(&data, "16m");
    let yaml = format!(
        r#"
name: full
topics:
  - in
  - out
stages:
  - name: up
    subscribe: in
    plugin: {plugin}
    concurrency: 2
    publish: [out]
"#,
        plugin = plugin("uppercase"),
    );
    let file = write_pipeline(dir.path(), "full", &yaml);
    let mut daemon = Daemon::start(&[file.as_path()], &data);
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");

    // Ingest until the disk is full and writes have failed for a while.
    let mut answers: BTreeMap<usize, u16> = BTreeMap::new();
    let mut refused = 0;
    let mut seen_not_ready = false;
    let started = Instant::now();
    let mut i = 0;
    while refused < 20 {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the disk never filled; log:\n{}",
            daemon.log()
        );
        let status = ingest(&http, &daemon, &format!("id{i}"), &body(i));
        assert!(
            status == 202 || status == 503,
            "message {i}: {status}, want 202 or 503; log:\n{}",
            daemon.log()
        );
        if status == 503 {
            refused += 1;
            if readiness(&http, &daemon) == 503 {
                seen_not_ready = true;
            }
        }
        answers.insert(i, status);
        i += 1;
    }
    assert!(
        seen_not_ready,
        "/health/ready never said not-ready while writes were refused; log:\n{}",
        daemon.log()
    );
    // A little later: still an answer that loses nothing (503, or 202 once
    // a reopen found room for a small write), never a 500.
    std::thread::sleep(Duration::from_secs(2));
    let later = ingest(&http, &daemon, &format!("id{i}"), &body(i));
    assert!(later == 202 || later == 503, "later: {later}");
    answers.insert(i, later);

    // Room again: the same daemon takes the refused messages.
    tmpfs.grow("256m");
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, status) in answers.iter_mut() {
        while *status != 202 {
            assert!(
                Instant::now() < deadline,
                "message {i} still refused after the disk grew; log:\n{}",
                daemon.log()
            );
            *status = ingest(&http, &daemon, &format!("id{i}"), &body(*i));
            assert!(*status == 202 || *status == 503, "message {i}: {status}");
            if *status != 202 {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    let n = answers.len();

    // Every accepted message is processed, once.
    daemon.wait_until("every output", Duration::from_secs(180), |d| {
        d.depth("out") >= n
    });
    std::thread::sleep(Duration::from_secs(1));
    let out = daemon.read_all("out");
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for m in &out {
        let payload = m["payload"].as_str().expect("text payload");
        let id = payload.split('-').next().expect("prefix").to_owned();
        *seen.entry(id).or_default() += 1;
    }
    for i in 0..n {
        let id = format!("M{i}");
        assert!(
            seen.contains_key(&id),
            "{id} was accepted but not processed; log:\n{}",
            daemon.log()
        );
    }
    assert_eq!(out.len(), n, "duplicates: {:?}", {
        seen.iter().filter(|(_, c)| **c > 1).collect::<Vec<_>>()
    });

    let (status, _) = daemon.sigterm();
    assert!(
        status.success(),
        "SIGTERM: {status:?}; log:\n{}",
        daemon.log()
    );
}
