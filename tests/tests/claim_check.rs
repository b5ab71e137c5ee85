//! The claim check end to end: the real `sluice run` binary, real plugins
//! (`digest` reports the SHA-256 of what its handler received), a `file://`
//! store and a real S3 API (moto's server), on the embedded broker and on a
//! real nats-server.
//!
//! - a 50 MiB payload through the ingest API (embedded broker): the broker
//!   holds a reference, the handler gets every byte, a large output is
//!   offloaded too, and the daemon's RSS (sampled every 20 ms) stays under 4x
//!   the payload; the same against S3;
//! - a few MiB the same way on both brokers: on NATS, above the server's
//!   1 MiB `max_payload`, the stream holds an empty body and the reference;
//! - an object deleted while its reference waits in the DLQ (a store's
//!   lifecycle rule outliving a dead letter): its redrive is retried, then
//!   dead-lettered as `claim-missing`, the dead letter keeping the
//!   reference; on both brokers with a `file://` store, and against S3;
//! - above `max_payload`: 413 with a JSON error, and a clear error from
//!   `sluice publish`; nothing enqueued (both brokers);
//! - the sweeper: old unreferenced objects go, referenced ones stay (both
//!   brokers).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use sluice::claim::{
    CLAIM_DIGEST_HEADER, CLAIM_HEADER, CLAIM_SIZE_HEADER, claim_digest, sha256_hex,
};
use sluice_harness::moto::MotoServer;
use sluice_tests::{Backend, Daemon, header, on_both_brokers, plugin, sluice_bin, write_pipeline};

const LONG: Duration = Duration::from_secs(300);
const BIG: usize = 50 << 20;
const ECHO: usize = 1 << 20;

/// `n` bytes that do not compress: xorshift64.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// Samples a process's VmRSS every 20 ms until dropped; `peak()` is the
/// largest seen, in bytes.
struct RssSampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (peak, stop) = (peak.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(rss) = vm_rss(pid) {
                        peak.fetch_max(rss, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        RssSampler {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn vm_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .no_proxy()
        .build()
        .expect("http client")
}

/// POSTs `payload` as one message; returns the status and JSON body.
fn post(daemon: &Daemon, topic: &str, id: &str, payload: Vec<u8>) -> (u16, Value) {
    let response = http()
        .post(format!("{}/v1/topics/{topic}/messages", daemon.admin_url()))
        .header("idempotency-key", id)
        .body(payload)
        .send()
        .expect("POST");
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

/// Announces a body of `len` bytes to `topic` but sends none (see
/// [`sluice_tests::announce`]); returns the status and JSON body of the answer.
fn post_announced(daemon: &Daemon, topic: &str, len: usize) -> (u16, Value) {
    let (status, raw) = sluice_tests::announce(
        daemon.admin_url(),
        &format!("/v1/topics/{topic}/messages"),
        len,
    );
    (status, sluice_tests::raw_json_body(&raw))
}

/// The one message of `topic` with header `x-part: part`.
fn part(messages: &[Value], part: &str) -> Value {
    messages
        .iter()
        .find(|m| header(m, "x-part") == Some(part))
        .unwrap_or_else(|| panic!("no `{part}` output in {messages:#?}"))
        .clone()
}

/// Asserts that `message` is a reference (empty body, the three headers)
/// to `payload`, and returns the reference.
fn assert_reference(message: &Value, payload: &[u8]) -> String {
    assert_eq!(message["payload"].as_str(), Some(""), "{message}");
    assert_eq!(
        header(message, CLAIM_SIZE_HEADER),
        Some(payload.len().to_string().as_str())
    );
    assert_eq!(
        header(message, CLAIM_DIGEST_HEADER),
        Some(claim_digest(payload).as_str())
    );
    header(message, CLAIM_HEADER)
        .expect("a claim reference")
        .to_owned()
}

fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        total += if path.is_dir() {
            dir_size(&path)
        } else {
            entry.metadata().map(|m| m.len()).unwrap_or(0)
        };
    }
    total
}

/// The pipeline of the round-trip tests: `in` is digested (the handler's view:
/// hash + length, and its first MiB echoed back, which is above the
/// threshold), `parked` has no stage, so what the broker stores stays to
/// be read.
fn big_pipeline(dir: &Path, claim: &str) -> PathBuf {
    let yaml = format!(
        r#"
name: big
claim_check: {claim}
topics: [in, out, parked]
stages:
  - name: digest
    subscribe: in
    plugin: {digest}
    publish: [out]
    config: {{echo_bytes: {ECHO}}}
    timeout: 120s
    ack_wait: 120s
"#,
        digest = plugin("digest")
    );
    write_pipeline(dir, "big", &yaml)
}

/// Publishes `len` bytes to `parked` and to `in` and checks what the
/// broker holds and what the handler saw. Returns the references of the
/// parked input and of the echoed output.
fn round_trip(daemon: &Daemon, len: usize) -> (String, String) {
    let payload = noise(len, 42);
    let sha = sha256_hex(&payload);

    let (status, body) = post(daemon, "parked", "parked-1", payload.clone());
    assert_eq!(status, 202, "{body}");
    let parked = daemon.read_all("parked");
    assert_eq!(parked.len(), 1);
    let parked_ref = assert_reference(&parked[0], &payload);

    let (status, body) = post(daemon, "in", "big-1", payload.clone());
    assert_eq!(status, 202, "{body}");
    daemon.wait_until("both outputs", LONG, |d| d.depth("out") >= 2);
    let out = daemon.read_all("out");
    assert_eq!(out.len(), 2, "{out:#?}");
    let digest = part(&out, "digest");
    assert_eq!(
        digest["payload"].as_str(),
        Some(format!("{sha} {len}").as_str()),
        "the handler must receive all {len} bytes intact"
    );
    // The handler saw the message as published: no claim headers.
    let seen = header(&digest, "x-input-headers").unwrap_or_default();
    assert!(!seen.contains("sluice-claim"), "handler saw {seen:?}");
    let echo_ref = assert_reference(&part(&out, "echo"), &payload[..ECHO]);
    (parked_ref, echo_ref)
}

#[test]
fn fifty_mib_through_ingest_with_a_file_store_in_bounded_memory() {
    let dir = tempfile::tempdir().expect("dir");
    // A relative store: next to the pipeline file.
    let file = big_pipeline(
        dir.path(),
        "{store: file://claims, threshold: 256KiB, max_payload: 64MiB}",
    );
    let data = dir.path().join("data");
    let daemon = Daemon::start(&[&file], &data);
    let data_before = dir_size(&data);
    let pid = daemon.pid().expect("running");
    let idle = vm_rss(pid).expect("VmRSS");
    let sampler = RssSampler::start(pid);

    let (parked_ref, echo_ref) = round_trip(&daemon, BIG);
    let peak = sampler.peak();
    drop(sampler);

    let claims = dir
        .path()
        .join("claims")
        .canonicalize()
        .expect("claims dir");
    let prefix = format!("file://{}/", claims.display());
    for (reference, len, seed_sha) in [
        (&parked_ref, BIG, sha256_hex(&noise(BIG, 42))),
        (&echo_ref, ECHO, sha256_hex(&noise(BIG, 42)[..ECHO])),
    ] {
        let path = reference.strip_prefix("file://").expect("a file reference");
        assert!(reference.starts_with(&prefix), "{reference}");
        let bytes = std::fs::read(path).expect("the object");
        assert_eq!(bytes.len(), len);
        assert_eq!(sha256_hex(&bytes), seed_sha);
    }
    // The broker holds references only: its data directory stays far
    // below one payload.
    let stored = dir_size(&data).saturating_sub(data_before);
    assert!(
        stored < (BIG / 10) as u64,
        "the data dir grew by {stored} bytes"
    );

    // Counted in the metrics.
    let metrics = http()
        .get(format!("{}/metrics", daemon.admin_url()))
        .send()
        .and_then(|r| r.text())
        .expect("metrics");
    assert!(
        metrics.contains("sluice_claim_bytes_total{direction=\"put\"}"),
        "{metrics}"
    );
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    eprintln!(
        "daemon RSS: idle {:.1} MiB, peak {:.1} MiB (+{:.1} MiB) for a {} MiB payload; data dir grew {} KiB",
        mib(idle),
        mib(peak),
        mib(peak.saturating_sub(idle)),
        BIG >> 20,
        stored >> 10
    );
    assert!(peak > 0, "RSS was never sampled");
    // What the payload costs, over the daemon's idle RSS: a debug build idles
    // near 100 MiB (its code pages and the plugin's compile), which no
    // payload handling can change. The payload is held at most twice at once
    // (the handler's copy on the host, and the guest's linear memory).
    assert!(
        peak.saturating_sub(idle) < (4 * BIG) as u64,
        "the daemon's RSS grew by {} bytes, over 4x the payload ({} bytes)",
        peak.saturating_sub(idle),
        4 * BIG
    );
}

/// A client of the S3 server's `bucket`, signing as the daemon does.
fn s3_client(s3: &MotoServer, bucket: &str) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_endpoint(s3.endpoint())
        .with_allow_http(true)
        .with_region(sluice_harness::moto::REGION)
        .with_access_key_id(sluice_harness::moto::ACCESS_KEY_ID)
        .with_secret_access_key(sluice_harness::moto::SECRET_ACCESS_KEY)
        .build()
        .expect("an S3 client")
}

/// Runs `future` to its end, from a test's thread.
fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(future)
}

/// Reads an object straight from the S3 server, with a signed request.
fn s3_get(s3: &MotoServer, bucket: &str, key: &str) -> Vec<u8> {
    use object_store::ObjectStoreExt;
    let store = s3_client(s3, bucket);
    block_on(async {
        let path = object_store::path::Path::from(key);
        let got = store
            .get(&path)
            .await
            .unwrap_or_else(|e| panic!("GET {key}: {e}"));
        got.bytes().await.expect("the object's bytes").to_vec()
    })
}

/// Deletes an object straight from the S3 server, after checking it is
/// there (S3 answers a DELETE of a missing key with success too).
fn s3_delete(s3: &MotoServer, bucket: &str, key: &str) {
    use object_store::ObjectStoreExt;
    let store = s3_client(s3, bucket);
    block_on(async {
        let path = object_store::path::Path::from(key);
        store
            .head(&path)
            .await
            .unwrap_or_else(|e| panic!("HEAD {key} before deleting it: {e}"));
        store
            .delete(&path)
            .await
            .unwrap_or_else(|e| panic!("DELETE {key}: {e}"));
        assert!(
            matches!(
                store.head(&path).await,
                Err(object_store::Error::NotFound { .. })
            ),
            "{key} is still there"
        );
    });
}

/// Where a test's claim objects go.
enum Store {
    /// `file://claims`, next to the pipeline file.
    File,
    /// `s3://claims/sluice` on a moto server of the test's own.
    S3(MotoServer),
}

impl Store {
    /// A moto server with a `claims` bucket.
    fn s3() -> Store {
        let s3 = MotoServer::start().unwrap_or_else(|e| panic!("starting moto: {e:#}"));
        s3.create_bucket("claims").expect("bucket");
        Store::S3(s3)
    }

    /// A `claim_check:` block for this store, with `settings` added
    /// (`threshold: 1KiB`, ...).
    fn claim_check(&self, settings: &str) -> String {
        match self {
            Store::File => format!("{{store: file://claims, {settings}}}"),
            Store::S3(s3) => format!(
                "{{store: s3://claims/sluice, endpoint: \"{}\", allow_http: true, {settings}}}",
                s3.endpoint()
            ),
        }
    }

    /// What the daemon needs in its environment to reach the store.
    fn env(&self) -> Vec<(String, String)> {
        match self {
            Store::File => Vec::new(),
            Store::S3(s3) => s3.env(),
        }
    }

    /// Deletes the object `reference` points to.
    fn delete(&self, reference: &str) {
        match self {
            Store::File => {
                let path = reference
                    .strip_prefix("file://")
                    .unwrap_or_else(|| panic!("not a file reference: {reference}"));
                std::fs::remove_file(path).expect("delete the object");
            }
            Store::S3(s3) => {
                let key = reference
                    .strip_prefix("s3://claims/")
                    .unwrap_or_else(|| panic!("not in the bucket: {reference}"));
                s3_delete(s3, "claims", key);
            }
        }
    }
}

#[test]
fn fifty_mib_through_ingest_with_an_s3_store() {
    let s3 = MotoServer::start().unwrap_or_else(|e| panic!("starting moto: {e:#}"));
    s3.create_bucket("claims").expect("bucket");
    let dir = tempfile::tempdir().expect("dir");
    let file = big_pipeline(
        dir.path(),
        &format!(
            "{{store: s3://claims/sluice, threshold: 256KiB, max_payload: 64MiB, endpoint: \"{}\", allow_http: true}}",
            s3.endpoint()
        ),
    );
    let daemon = Daemon::start_with_env(None, &[&file], &dir.path().join("data"), s3.env());
    let (parked_ref, echo_ref) = round_trip(&daemon, BIG);
    let payload = noise(BIG, 42);
    for (reference, expected) in [(&parked_ref, &payload[..]), (&echo_ref, &payload[..ECHO])] {
        let key = reference
            .strip_prefix("s3://claims/")
            .unwrap_or_else(|| panic!("not in the bucket: {reference}"));
        assert!(key.starts_with("sluice/"), "{key}");
        let object = s3_get(&s3, "claims", key);
        assert_eq!(object.len(), expected.len());
        assert_eq!(sha256_hex(&object), sha256_hex(expected));
    }
}

/// A file:// store, a few MiB through ingest, on both brokers: on NATS
/// the payload and the echoed 1 MiB output are both above the server's
/// 1 MiB `max_payload`, so they only get through as references. The
/// stream itself (read by a plain NATS client, not the daemon) holds an
/// empty body with the reference headers.
fn a_payload_over_the_threshold_travels_as_a_reference(backend: &Backend) {
    const LEN: usize = 3 << 20;
    let dir = tempfile::tempdir().expect("dir");
    let file = big_pipeline(
        dir.path(),
        "{store: file://claims, threshold: 256KiB, max_payload: 64MiB}",
    );
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    let (parked_ref, echo_ref) = round_trip(&daemon, LEN);

    let payload = noise(LEN, 42);
    for (reference, expected) in [(&parked_ref, &payload[..]), (&echo_ref, &payload[..ECHO])] {
        let path = reference
            .strip_prefix("file://")
            .unwrap_or_else(|| panic!("not a file reference: {reference}"));
        let object = std::fs::read(path).expect("the object");
        assert_eq!(object.len(), expected.len());
        assert_eq!(sha256_hex(&object), sha256_hex(expected));
    }

    if let Some(server) = backend.nats_server() {
        let watcher = sluice_tests::jetstream::Watcher::connect(&server.url());
        for (topic, reference, len) in [("parked", &parked_ref, LEN), ("out", &echo_ref, ECHO)] {
            let stored = watcher.read_all(topic);
            let message = stored
                .iter()
                .find(|m| m.header(CLAIM_HEADER) == Some(reference.as_str()))
                .unwrap_or_else(|| panic!("`{topic}` holds no message with {reference}"));
            assert!(
                message.payload.is_empty(),
                "a {} byte body",
                message.payload.len()
            );
            assert_eq!(
                message.header(CLAIM_SIZE_HEADER),
                Some(len.to_string().as_str())
            );
            assert!(message.header(CLAIM_DIGEST_HEADER).is_some());
        }
    }
}

/// A claim object deleted after its message was published and before the
/// stage consumes it: the message is retried (`claim-missing` may be a
/// store not yet consistent), then dead-lettered as `claim-missing`,
/// keeping the reference. The handler never sees it: a claim is resolved
/// before the handler runs.
///
/// The stage (one worker) is kept busy by a first message that takes 3 s,
/// so the second, offloaded one waits its turn while its object is
/// deleted. It may already be fetched meanwhile: a reference is resolved
/// only once a worker slot is free for it.
fn claim_missing(backend: &Backend, store: &Store) {
    let dir = tempfile::tempdir().expect("dir");
    let file = write_pipeline(
        dir.path(),
        "missing",
        &format!(
            r#"name: missing
claim_check: {claim}
topics: [in, out]
stages:
  - name: check
    subscribe: in
    plugin: {sleepy}
    concurrency: 1
    config: {{ms: 3000}}
    publish: [out]
    retry: {{max_attempts: 3, backoff: {{initial: 50ms, max: 100ms}}}}
"#,
            claim = store.claim_check("threshold: 1KiB"),
            sleepy = plugin("sleepy")
        ),
    );
    let daemon = Daemon::start_with_env(
        backend.broker_url(),
        &[&file],
        &dir.path().join("data"),
        store.env(),
    );
    let dlq = "missing.check.dlq";
    let (status, body) = post(&daemon, "in", "blocker", b"inline".to_vec());
    assert_eq!(status, 202, "{body}");
    daemon.wait_until("the blocker taken", LONG, |d| {
        d.get("/v1/status")[0]["in_flight"].as_u64() >= Some(1)
    });

    let payload = noise(64 << 10, 7);
    let (status, body) = post(&daemon, "in", "gone-1", payload.clone());
    assert_eq!(status, 202, "{body}");
    let stored = daemon.read_all("in");
    let queued = stored
        .iter()
        .find(|m| m["id"] == "gone-1")
        .unwrap_or_else(|| panic!("gone-1 is not in `in`: {stored:#?}"));
    let reference = assert_reference(queued, &payload);
    store.delete(&reference);
    assert_eq!(
        daemon.depth("out"),
        0,
        "the blocker finished before the object was deleted; the test proves nothing"
    );

    daemon.wait_until("dead-lettered as claim-missing", LONG, |d| {
        d.depth(dlq) >= 1
    });
    let entries = daemon.read_all(dlq);
    assert_eq!(entries.len(), 1, "{entries:#?}");
    let entry = &entries[0];
    assert_eq!(
        header(entry, "sluice-dlq-kind"),
        Some("claim-missing"),
        "{entry}"
    );
    assert_eq!(header(entry, "sluice-dlq-attempts"), Some("3"), "{entry}");
    let error = header(entry, "sluice-dlq-error").unwrap_or_default();
    assert!(error.contains(&reference), "{error}");
    // The dead letter keeps the reference, not a payload.
    assert_eq!(assert_reference(entry, &payload), reference);
    // Only the blocker reached the handler and its output.
    daemon.wait_until("the blocker's output", LONG, |d| d.depth("out") >= 1);
    assert_eq!(daemon.depth("out"), 1);
}

fn a_deleted_object_is_retried_then_dead_lettered_as_claim_missing(backend: &Backend) {
    claim_missing(backend, &Store::File);
}

#[test]
fn a_deleted_s3_object_is_retried_then_dead_lettered_as_claim_missing() {
    claim_missing(&Backend::embedded(), &Store::s3());
}

fn payloads_above_max_payload_are_refused_and_nothing_is_enqueued(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    let file = write_pipeline(
        dir.path(),
        "limits",
        &format!(
            r#"name: limits
topics:
  - name: capped
    claim_check: {{store: file://claims, threshold: 256KiB, max_payload: 1MiB}}
  - plain
  - out
stages:
  - {{name: s, subscribe: out, plugin: {digest}}}
"#,
            digest = plugin("digest")
        ),
    );
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));

    // The HTTP API: 413 with a JSON error.
    let (status, body) = post_announced(&daemon, "capped", 2 << 20);
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["code"], "payload_too_large", "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("max_payload") && error.contains("capped"),
        "{error}"
    );

    // `sluice publish`: a clear error, a failing exit.
    let big = dir.path().join("big.bin");
    std::fs::write(&big, noise(2 << 20, 2)).expect("write");
    let output = Command::new(sluice_bin())
        .args(["publish", "capped", "--file"])
        .arg(&big)
        .args(["--admin", daemon.admin_url()])
        .output()
        .expect("sluice publish");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("max_payload"), "{stderr}");

    // A topic without a claim check still refuses a body over the admin
    // body limit (64 MiB) with 413, even though `capped` raised the limit
    // of what the server reads at all.
    let (status, body) = post_announced(&daemon, "plain", (64 << 20) + 1);
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["code"], "payload_too_large", "{body}");

    assert_eq!(daemon.depth("capped"), 0);
    assert_eq!(daemon.depth("plain"), 0);

    // Under the limit, `sluice publish` goes through and is offloaded.
    let fine = dir.path().join("fine.bin");
    let payload = noise(512 << 10, 3);
    std::fs::write(&fine, &payload).expect("write");
    let output = Command::new(sluice_bin())
        .args(["publish", "capped", "--file"])
        .arg(&fine)
        .args(["--admin", daemon.admin_url()])
        .output()
        .expect("sluice publish");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stored = daemon.read_all("capped");
    assert_eq!(stored.len(), 1);
    assert_reference(&stored[0], &payload);
}

/// Every regular file below `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn age(path: &Path, by: Duration) {
    let file = std::fs::File::options()
        .write(true)
        .open(path)
        .expect("open to set mtime");
    file.set_modified(SystemTime::now() - by)
        .expect("set mtime");
}

fn the_sweeper_removes_old_unreferenced_objects_and_keeps_referenced_ones(backend: &Backend) {
    let dir = tempfile::tempdir().expect("dir");
    // Retention 2s: objects are "old" once their mtime is 2 s back, and the
    // sweeper runs every second. Ages are set by hand below, so nothing
    // here depends on timing.
    let file = write_pipeline(
        dir.path(),
        "sweep",
        &format!(
            r#"name: sweep
claim_check: {{store: file://claims, threshold: 1KiB, retention: 2s}}
topics: [pending, in]
stages:
  - name: reject
    subscribe: in
    plugin: {fail}
    config: {{mode: reject}}
"#,
            fail = plugin("fail")
        ),
    );
    let daemon = Daemon::start_on(backend, &[&file], &dir.path().join("data"));
    let (status, body) = post(&daemon, "pending", "p-1", noise(8 << 10, 1));
    assert_eq!(status, 202, "{body}");
    let (status, body) = post(&daemon, "in", "d-1", noise(8 << 10, 2));
    assert_eq!(status, 202, "{body}");
    daemon.wait_until("dead-lettered", LONG, |d| d.depth("sweep.reject.dlq") >= 1);
    let pending_ref = header(&daemon.read_all("pending")[0], CLAIM_HEADER)
        .expect("pending reference")
        .to_owned();
    let dlq_ref = header(&daemon.read_all("sweep.reject.dlq")[0], CLAIM_HEADER)
        .expect("DLQ reference")
        .to_owned();
    let referenced: Vec<PathBuf> = [&pending_ref, &dlq_ref]
        .iter()
        .map(|r| PathBuf::from(r.strip_prefix("file://").expect("file ref")))
        .collect();

    // Referenced objects aged first, then an orphan written and aged: any
    // sweep that sees the orphan as old sees the referenced ones as old.
    for path in &referenced {
        age(path, Duration::from_secs(3600));
    }
    let claims = dir.path().join("claims");
    // Another daemon's object, under a topic this one does not claim-check
    // (a shared directory): not this daemon's to judge.
    std::fs::create_dir_all(claims.join("theirs")).expect("dir");
    let theirs = claims.join("theirs").join("their-object");
    std::fs::write(&theirs, b"referenced elsewhere").expect("theirs");
    age(&theirs, Duration::from_secs(3600));
    let orphan = claims.join("in").join("orphan-object");
    std::fs::write(&orphan, b"nobody references me").expect("orphan");
    age(&orphan, Duration::from_secs(3600));

    daemon.wait_until("the orphan swept", LONG, |_| !orphan.exists());
    assert!(theirs.exists(), "another daemon's object was swept");
    std::fs::remove_dir_all(claims.join("theirs")).expect("cleanup");
    for path in &referenced {
        assert!(
            path.exists(),
            "{} was swept though referenced",
            path.display()
        );
    }
    assert_eq!(files(&claims).len(), 2, "{:?}", files(&claims));
}

on_both_brokers!(
    a_payload_over_the_threshold_travels_as_a_reference,
    a_deleted_object_is_retried_then_dead_lettered_as_claim_missing,
    payloads_above_max_payload_are_refused_and_nothing_is_enqueued,
    the_sweeper_removes_old_unreferenced_objects_and_keeps_referenced_ones,
);
