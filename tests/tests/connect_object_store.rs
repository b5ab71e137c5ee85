//! The object-store sink end to end: the real `sluice` binary writing to a
//! directory (`file://`) and to moto's S3 server, every object read back
//! by real readers (pyarrow for Parquet and compressed streams, boto3 for
//! S3: `tests/fixtures/read_objects.py`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_harness::moto::MotoServer;
use sluice_tests::{Daemon, Msg, plugin};

const LONG: Duration = Duration::from_secs(180);

/// What the reader found.
struct Objects {
    /// Key → rows (or the reader's error).
    objects: Vec<Value>,
    /// Multipart uploads still in progress (S3).
    uploads: u64,
}

impl Objects {
    fn read(args: &[&str], env: &[(String, String)]) -> Objects {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/read_objects.py");
        let out = Command::new("python3")
            .arg(script)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("python3 tests/fixtures/read_objects.py (pyarrow: `cargo xtask setup`)");
        assert!(
            out.status.success(),
            "read_objects.py {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
        Objects {
            objects: doc["objects"].as_array().cloned().unwrap_or_default(),
            uploads: doc["uploads"].as_u64().unwrap_or_default(),
        }
    }

    fn dir(dir: &Path) -> Objects {
        if !dir.exists() {
            return Objects {
                objects: Vec::new(),
                uploads: 0,
            };
        }
        Objects::read(&["file", &dir.display().to_string()], &[])
    }

    fn s3(moto: &MotoServer, bucket: &str) -> Objects {
        Objects::read(&["s3", &moto.endpoint(), bucket], &moto.env())
    }

    /// Every row of every object, panicking on one that did not read.
    fn rows(&self) -> Vec<Value> {
        let mut rows = Vec::new();
        for object in &self.objects {
            assert!(
                object.get("error").is_none(),
                "an object did not read back whole: {object}"
            );
            rows.extend(object["rows"].as_array().cloned().unwrap_or_default());
        }
        rows
    }

    /// Rows per object, in key order.
    fn counts(&self) -> Vec<usize> {
        let mut by_key: Vec<(String, usize)> = self
            .objects
            .iter()
            .map(|o| {
                (
                    o["key"].as_str().unwrap_or_default().to_owned(),
                    o["rows"].as_array().map_or(0, Vec::len),
                )
            })
            .collect();
        by_key.sort();
        by_key.into_iter().map(|(_, n)| n).collect()
    }
}

/// `n` orders `{order_id: "o<i>", qty: i}` with ids `<prefix><i>`.
fn orders(prefix: &str, range: std::ops::Range<usize>) -> Vec<Msg> {
    range
        .map(|i| {
            Msg::new(
                format!("{prefix}{i}"),
                json!({"order_id": format!("o{i}"), "qty": i}).to_string(),
            )
        })
        .collect()
}

/// A pipeline: `orders` through the uppercase plugin into `orders.upper`,
/// and the sink `files` on it with `block` (indented under `object_store:`).
fn lake(block: &str) -> String {
    lake_with("", block)
}

/// [`lake`] with stage knobs (`knobs`, one per line) on the sink.
fn lake_with(knobs: &str, block: &str) -> String {
    format!(
        "name: lake\ntopics: [orders, orders.upper]\n\
         stages:\n  - name: upper\n    subscribe: orders\n    plugin: {plugin}\n    publish: [orders.upper]\n\
         sinks:\n  - name: files\n    subscribe: orders.upper\n{knobs}    object_store:\n{block}",
        plugin = plugin("uppercase"),
        knobs = sluice_tests::edges::indent(knobs, 4),
        block = sluice_tests::edges::indent(block, 6),
    )
}

/// The `ORDER_ID`s (uppercased by the stage) of `rows`, with each one's
/// `sluice_id`s.
fn by_order(rows: &[Value]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for row in rows {
        let order = row["ORDER_ID"].as_str().expect("ORDER_ID").to_owned();
        let id = row["sluice_id"].as_str().expect("sluice_id").to_owned();
        out.entry(order).or_default().insert(id);
    }
    out
}

#[test]
fn a_parquet_file_rolls_at_max_records_and_sigterm_uploads_the_open_one() {
    let out = tempfile::tempdir().expect("dir");
    let yaml = lake(&format!(
        "store: file://{}\nformat: parquet\ncompression: snappy\npath: \"orders/dt={{date}}/\"\n\
         roll: {{max_records: 100, max_age: 10m}}\n\
         schema: {{ORDER_ID: string, QTY: {{type: int64, nullable: false}}}}\n",
        out.path().display()
    ));
    let mut daemon = Daemon::with_yaml(&yaml).start();
    daemon.publish("orders", &orders("m", 0..250));
    // Two files of 100 are closed by the record limit alone (the age limit
    // is ten minutes away); 50 records wait in the open file.
    daemon.wait_until("two full files", LONG, |_| {
        Objects::dir(out.path()).objects.len() >= 2
    });
    daemon.wait_until("the rest in the open file", LONG, |d| {
        d.metric_sum("sluice_sink_open_files") == 1.0
            && d.metric_sum("sluice_sink_object_records_total") == 200.0
    });
    assert_eq!(Objects::dir(out.path()).counts(), [100, 100]);
    // The console's figures: one file open, its oldest record waiting.
    let status = daemon.get("/v1/status");
    let sink = status
        .as_array()
        .and_then(|stages| stages.iter().find(|s| s["stage"] == "files"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(sink["kind"], "sink:object_store", "{status}");
    assert_eq!(sink["open_files"]["count"], 1, "{sink}");
    assert!(
        sink["open_files"]["oldest_seconds"].as_f64().is_some(),
        "{sink}"
    );
    let (status, took) = daemon.sigterm();
    assert!(status.success(), "{status:?}\n{}", daemon.log());
    assert!(took < Duration::from_secs(30), "{took:?}");
    let found = Objects::dir(out.path());
    let mut counts = found.counts();
    counts.sort_unstable();
    assert_eq!(counts, [50, 100, 100], "SIGTERM uploads the open file");
    let rows = found.rows();
    let orders = by_order(&rows);
    let want: BTreeSet<String> = (0..250).map(|i| format!("O{i}")).collect();
    assert_eq!(orders.keys().cloned().collect::<BTreeSet<_>>(), want);
    assert_eq!(rows.len(), 250, "no duplicates without a crash");
    for row in &rows {
        let order: usize = row["ORDER_ID"].as_str().expect("id")[1..]
            .parse()
            .expect("n");
        assert_eq!(row["QTY"].as_u64(), Some(order as u64), "{row}");
        assert!(row["sluice_published_at"].as_str().is_some(), "{row}");
    }
    assert!(
        found.objects.iter().all(|o| o["key"]
            .as_str()
            .is_some_and(|k| k.starts_with("orders/dt=") && k.ends_with(".parquet"))),
        "{:?}",
        found.objects.iter().map(|o| &o["key"]).collect::<Vec<_>>()
    );
}

#[test]
fn a_gzip_jsonl_file_rolls_at_max_bytes_alone() {
    let out = tempfile::tempdir().expect("dir");
    // The size is checked after each batch a file takes: batches of 10
    // make that about every 10 records, whatever the timing.
    let yaml = lake_with(
        "batch: {max: 10, wait: 10ms}",
        &format!(
            "store: file://{}\nformat: jsonl\ncompression: gzip\npath: \"{{topic}}/\"\n\
             roll: {{max_bytes: 2KiB, max_age: 10m}}\n",
            out.path().display()
        ),
    );
    let daemon = Daemon::with_yaml(&yaml).start();
    // Random-looking payloads, so gzip cannot shrink 2 KiB to nothing.
    let messages: Vec<Msg> = (0..400)
        .map(|i| {
            let noise: String = (0..64)
                .map(|j| char::from(b'a' + ((i * 31 + j * 17) % 26) as u8))
                .collect();
            Msg::new(format!("b{i}"), json!({"n": i, "noise": noise}).to_string())
        })
        .collect();
    daemon.publish("orders", &messages);
    daemon.wait_until("files closed by size", LONG, |_| {
        Objects::dir(out.path()).objects.len() >= 3
    });
    let found = Objects::dir(out.path());
    for object in &found.objects {
        let key = object["key"].as_str().expect("key");
        assert!(
            key.starts_with("orders.upper/") && key.ends_with(".jsonl.gz"),
            "{key}"
        );
        // Closed by the byte limit: at least 2 KiB, and far from the
        // 10,000-record limit.
        assert!(object["size"].as_u64().expect("size") >= 2048, "{object}");
        let rows = object["rows"].as_array().expect("rows");
        assert!(rows.len() < 400, "{}", rows.len());
        assert_eq!(rows[0]["topic"], "orders.upper");
        assert!(rows[0]["payload"]["NOISE"].is_string(), "{}", rows[0]);
    }
}

#[test]
fn a_zstd_jsonl_file_rolls_at_max_age_alone_and_raw_writes_one_object_per_message() {
    let out = tempfile::tempdir().expect("dir");
    let raw = tempfile::tempdir().expect("dir");
    let yaml = format!(
        "{}  - name: raw\n    subscribe: orders.upper\n    object_store:\n      store: file://{}\n      format: raw\n      path: \"{{key}}/\"\n",
        lake(&format!(
            "store: file://{}\nformat: jsonl\ncompression: zstd\nroll: {{max_age: 1s}}\n",
            out.path().display()
        )),
        raw.path().display()
    );
    let daemon = Daemon::with_yaml(&yaml).start();
    let mut messages = orders("a", 0..10);
    for m in &mut messages {
        m.key = Some("tenant/1".into());
    }
    daemon.publish("orders", &messages);
    let started = Instant::now();
    // Ten records against a limit of 10,000 records and 64 MiB: only the
    // age closes the file.
    daemon.wait_until("the file closed by age", LONG, |_| {
        !Objects::dir(out.path()).objects.is_empty()
    });
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed before max_age: {:?}",
        started.elapsed()
    );
    let found = Objects::dir(out.path());
    assert_eq!(found.counts(), [10]);
    assert!(
        found.objects[0]["key"]
            .as_str()
            .is_some_and(|k| k.ends_with(".jsonl.zst"))
    );
    daemon.wait_until("ten raw objects", LONG, |_| {
        Objects::dir(raw.path()).objects.len() == 10
    });
    for object in Objects::dir(raw.path()).objects {
        let key = object["key"].as_str().expect("key");
        // The key's `/` cannot make a directory: it is escaped.
        assert!(key.starts_with("tenant%2F1/"), "{key}");
        let body = object["rows"][0]["raw"].as_str().expect("raw");
        assert!(body.contains("ORDER_ID"), "{body}");
    }
}

#[test]
fn a_message_that_does_not_fit_the_schema_is_dead_lettered_naming_the_field() {
    let out = tempfile::tempdir().expect("dir");
    let yaml = format!(
        "name: lake\ntopics: [orders]\n\
         sinks:\n  - name: files\n    subscribe: orders\n    batch: {{max: 50, wait: 200ms}}\n    object_store:\n\
         {}",
        sluice_tests::edges::indent(
            &format!(
                "store: file://{}\nformat: parquet\nroll: {{max_age: 1s}}\n\
                 schema: {{order_id: string, qty: {{type: int64, nullable: false}}}}\n",
                out.path().display()
            ),
            6
        )
    );
    let daemon = Daemon::with_yaml(&yaml).start();
    let mut messages = orders("s", 0..6);
    messages[2].payload = json!({"order_id": "o2", "qty": "two"}).to_string();
    messages[4].payload = json!({"order_id": "o4"}).to_string();
    // One publish: the six reach the sink in one batch.
    daemon.publish("orders", &messages);
    daemon.wait_until("the good four written", LONG, |_| {
        Objects::dir(out.path()).rows().len() == 4
    });
    let entries = daemon.get("/v1/dlq/lake/files?limit=100")["entries"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut errors: Vec<(String, String)> = entries
        .iter()
        .map(|e| {
            assert_eq!(e["kind"], "rejected", "{e}");
            (
                e["id"].as_str().expect("id").to_owned(),
                e["error"].as_str().expect("error").to_owned(),
            )
        })
        .collect();
    errors.sort();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(errors[0].0, "s2");
    assert!(
        errors[0].1.contains("field `qty`") && errors[0].1.contains("int64"),
        "{errors:?}"
    );
    assert_eq!(errors[1].0, "s4");
    assert!(errors[1].1.contains("field `qty`: missing"), "{errors:?}");
    let written: BTreeSet<String> = Objects::dir(out.path())
        .rows()
        .iter()
        .map(|r| r["sluice_id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(
        written,
        ["s0", "s1", "s3", "s5"]
            .map(String::from)
            .into_iter()
            .collect()
    );
}

/// The S3 pipeline on moto: uppercase stage, Parquet, files of at most
/// 1,000 records or 2 s.
fn s3_lake(moto: &MotoServer, stall: &str) -> String {
    lake(&format!(
        "store: s3://lake/events\nendpoint: {}\nallow_http: true\nregion: us-east-1\n\
         format: parquet\ncompression: zstd\npath: \"orders/dt={{date}}/hour={{hour}}/\"\n\
         roll: {{max_records: 1000, max_bytes: 64MiB, max_age: 2s}}\nstall: {stall}\n\
         schema: {{ORDER_ID: string, QTY: int64}}\n",
        moto.endpoint()
    ))
}

/// `n` orders as [`orders`], with a `note`: of `NOTE` random letters for
/// those below `big` (so that Parquet cannot shrink them much and a file
/// passes the sink's multipart threshold in a few thousand records), of a
/// few for the rest.
fn big_orders(prefix: &str, range: std::ops::Range<usize>, big: usize) -> Vec<Msg> {
    const NOTE: usize = 2000;
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    range
        .map(|i| {
            let note: String = (0..if i < big { NOTE } else { 8 })
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    char::from(b'a' + (seed % 26) as u8)
                })
                .collect();
            Msg::new(
                format!("{prefix}{i}"),
                json!({"order_id": format!("o{i}"), "qty": i, "note": note}).to_string(),
            )
        })
        .collect()
}

/// The multipart uploads journaled in the spool of the sink `lake/files`
/// under the data directory `data`, of every instance.
fn journaled_uploads(data: &Path) -> usize {
    let root = data.join("spool/object_store/lake/files");
    let Ok(dirs) = std::fs::read_dir(&root) else {
        return 0;
    };
    dirs.flatten()
        .filter_map(|d| std::fs::read(d.path().join("multipart.json")).ok())
        .filter_map(|bytes| serde_json::from_slice::<Vec<Value>>(&bytes).ok())
        .map(|entries| entries.len())
        .sum()
}

/// The spool instance directories of the sink `lake/files` (one per sink
/// that ran and was not cleared yet).
fn spool_instances(data: &Path) -> usize {
    std::fs::read_dir(data.join("spool/object_store/lake/files"))
        .map(|dirs| dirs.flatten().filter(|d| d.path().is_dir()).count())
        .unwrap_or(0)
}

/// Kills the daemon while a multipart upload is in progress: once the
/// sink's journal names one, moto is paused (so the upload cannot finish)
/// and, if the journal still names it, the daemon is killed; moto then
/// resumes, with the upload left in progress for the next start to abort.
fn kill_during_a_multipart_upload(
    daemon: &mut sluice_tests::Daemon,
    moto: &MotoServer,
    data: &Path,
) {
    loop {
        daemon.wait_until("a multipart upload journaled", LONG, |_| {
            journaled_uploads(data) > 0
        });
        moto.pause().expect("SIGSTOP moto");
        if journaled_uploads(data) > 0 {
            daemon.kill9();
            moto.resume().expect("SIGCONT moto");
            return;
        }
        // It completed in between: catch the next one.
        moto.resume().expect("SIGCONT moto");
    }
}

#[test]
fn twenty_thousand_messages_to_s3_in_parquet_survive_two_kill_9s() {
    let moto = MotoServer::start().expect("moto");
    moto.create_bucket("lake").expect("bucket");
    // The first 9,500 orders carry ~2 KB each: the file they fill rolls at
    // 18 MiB (~9,000 of them), above the sink's 16 MiB multipart
    // threshold, so it goes up in parts. The rest are small, in files of
    // 10,000 records (or 20 s, the tail).
    // A short ack_wait, so that what a killed run held is redelivered soon
    // (the sink extends the leases of records waiting in its files).
    let yaml = lake_with(
        "ack_wait: 10s\n",
        &format!(
            "store: s3://lake/events\nendpoint: {}\nallow_http: true\nregion: us-east-1\n\
         format: parquet\npath: \"orders/dt={{date}}/hour={{hour}}/\"\n\
         roll: {{max_records: 10000, max_bytes: 18MiB, max_age: 20s}}\n\
         schema: {{ORDER_ID: string, QTY: int64, NOTE: string}}\n",
            moto.endpoint()
        ),
    );
    let dir = tempfile::tempdir().expect("dir");
    let file = sluice_tests::write_pipeline(dir.path(), "pipeline", &yaml);
    let data = dir.path().join("data");
    let mut daemon = sluice_tests::Daemon::builder(&[&file], &data)
        .envs(moto.env())
        .start();
    const N: usize = 20_000;
    let started = Instant::now();
    let phase = |what: &str| eprintln!("{:>6.1?} {what}", started.elapsed());
    daemon.publish("orders", &big_orders("k", 0..N, 9_500));
    phase("published");
    // The first kill cuts a multipart upload.
    kill_during_a_multipart_upload(&mut daemon, &moto, &data);
    assert!(
        Objects::s3(&moto, "lake").uploads >= 1,
        "the kill left a multipart upload in progress"
    );
    phase("killed during a multipart upload");
    daemon.restart();
    // The second once the new run has put a file up.
    daemon.wait_until("an object after the restart", LONG, |d| {
        d.metric_sum("sluice_sink_objects_total") >= 1.0
    });
    daemon.kill9();
    phase("killed again");
    daemon.restart();
    // Every order in some object, and the cut upload aborted at start
    // (moto lists no upload in progress).
    let mut found = None;
    daemon.wait_until("every order in, no upload in progress", LONG, |_| {
        let objects = Objects::s3(&moto, "lake");
        let done = objects.uploads == 0 && by_order(&objects.rows()).len() == N;
        found = Some(objects);
        done
    });
    phase("every order in, no upload in progress");
    daemon.wait_until("the stale spools cleared", LONG, |_| {
        spool_instances(&data) == 1
    });
    phase("the stale spools cleared");
    let found = found.expect("read");
    let rows = found.rows();
    let orders = by_order(&rows);
    let want: BTreeSet<String> = (0..N).map(|i| format!("O{i}")).collect();
    assert_eq!(
        orders.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "0 lost"
    );
    // A record written again after a crash carries the same sluice_id.
    for (order, ids) in &orders {
        assert_eq!(ids.len(), 1, "{order} arrived under several ids: {ids:?}");
    }
    for object in &found.objects {
        let key = object["key"].as_str().expect("key");
        assert!(key.starts_with("events/orders/dt="), "{key}");
    }
    eprintln!(
        "{} objects, {} rows for {N} orders ({} written twice)",
        found.objects.len(),
        rows.len(),
        rows.len() - N
    );
}

#[test]
fn a_store_stopped_for_20_s_holds_every_message_and_readiness_names_the_sink() {
    let moto = MotoServer::start().expect("moto");
    moto.create_bucket("lake").expect("bucket");
    let yaml = s3_lake(&moto, "2s");
    let daemon = Daemon::with_yaml(&yaml).envs(moto.env()).start();
    daemon.publish("orders", &orders("w", 0..1000));
    daemon.wait_until("the first file", LONG, |_| {
        !Objects::s3(&moto, "lake").objects.is_empty()
    });
    moto.pause().expect("SIGSTOP moto");
    let stopped = Instant::now();
    daemon.publish("orders", &orders("w", 1000..3000));
    daemon.wait_until("readiness names the stalled sink", LONG, |d| {
        let (status, reasons) = d.readiness();
        status != "ready" && reasons.contains("lake/files")
    });
    let (_, reasons) = daemon.readiness();
    assert!(reasons.contains("stalled"), "{reasons}");
    std::thread::sleep(Duration::from_secs(20).saturating_sub(stopped.elapsed()));
    assert_eq!(daemon.depth("lake.files.dlq"), 0, "nothing dead-lettered");
    moto.resume().expect("SIGCONT moto");
    daemon.wait_until("every order after the outage", LONG, |_| {
        std::thread::sleep(Duration::from_secs(1));
        by_order(&Objects::s3(&moto, "lake").rows()).len() == 3000
    });
    daemon.wait_until("ready again", LONG, |d| d.readiness().0 == "ready");
    assert_eq!(daemon.depth("lake.files.dlq"), 0);
}
