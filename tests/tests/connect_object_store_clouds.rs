//! The object-store sink on `az://` and `gs://`, end to end: the real
//! `sluice` binary writing to Azurite (npm `azurite`) and to
//! fake-gcs-server (Go module `github.com/fsouza/fake-gcs-server`), each
//! installed by `cargo xtask setup` and started by `sluice_harness`, every
//! object read back by `tests/fixtures/read_objects.py` (pyarrow for
//! Parquet and gzip, the blob and JSON REST APIs through urllib).
//!
//! Azurite takes everything the sink does, so it is tested as it is:
//! Parquet and gzipped JSON lines, through both ways of pointing the
//! client at it (the crate's emulator mode, and `endpoint:` with an
//! account key), a file above the multipart threshold, and the
//! create-only put. fake-gcs-server 1.56 serves GCS's JSON API but not
//! the XML API the object_store crate's GCS client writes with: one test
//! pins what the bare server does with those writes (refuses them; the
//! sink holds that as an outage), and the rest write through the
//! harness's gateway that turns them into JSON API uploads (see
//! `sluice_harness::fake_gcs` and `docs/connectors/object_store.md`).

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde_json::{Value, json};
use sluice_harness::azurite::AzuriteServer;
use sluice_harness::fake_gcs::FakeGcsServer;
use sluice_tests::{Daemon, Msg};

const LONG: Duration = Duration::from_secs(120);

/// What the reader found.
struct Objects {
    /// Key → rows (or the reader's error), and for Azure `blocks`.
    objects: Vec<Value>,
    /// Uploads in progress (`None` where the store cannot say).
    uploads: Option<u64>,
}

impl Objects {
    fn read(args: &[&str]) -> Objects {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/read_objects.py");
        let out = Command::new("python3")
            .arg(script)
            .args(args)
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
            uploads: doc["uploads"].as_u64(),
        }
    }

    fn azure(azurite: &AzuriteServer, container: &str) -> Objects {
        Objects::read(&["az", &azurite.endpoint(), container])
    }

    fn gcs(gcs: &FakeGcsServer, bucket: &str) -> Objects {
        Objects::read(&["gs", &gcs.endpoint(), bucket])
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

    /// Rows per object, smallest first.
    fn counts(&self) -> Vec<usize> {
        let mut counts: Vec<usize> = self
            .objects
            .iter()
            .map(|o| o["rows"].as_array().map_or(0, Vec::len))
            .collect();
        counts.sort_unstable();
        counts
    }

    fn keys(&self) -> Vec<&str> {
        self.objects
            .iter()
            .map(|o| o["key"].as_str().unwrap_or_default())
            .collect()
    }
}

/// `{order_id: "o<i>", qty: i}` with ids `<prefix><i>`.
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

/// A pipeline with the sink `lake` on topic `orders`, its
/// `object_store:` block `block`: no stage in between, so that what is
/// tested is the sink and the store.
fn pipeline(block: &str) -> String {
    format!(
        "name: clouds\ntopics: [orders]\n\
         sinks:\n  - name: lake\n    subscribe: orders\n    object_store:\n{}",
        sluice_tests::edges::indent(block, 6)
    )
}

/// The set of `field` in `rows`.
fn ids(rows: &[Value], field: &str) -> BTreeSet<String> {
    rows.iter()
        .map(|r| {
            r[field]
                .as_str()
                .unwrap_or_else(|| panic!("{field} in {r}"))
                .to_owned()
        })
        .collect()
}

fn want(prefix: &str, n: usize) -> BTreeSet<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// Parquet with a schema on Azurite, the client in the object_store
/// crate's emulator mode (`AZURE_STORAGE_USE_EMULATOR`,
/// `AZURITE_BLOB_STORAGE_URL`): three files closed by `max_records`, read
/// back whole with the exact set of ids, nothing left uncommitted.
#[test]
fn parquet_on_azurite_in_emulator_mode() {
    let azurite = AzuriteServer::start().expect("azurite");
    azurite.create_container("lake").expect("container");
    let yaml = pipeline(
        "store: az://lake/events\nformat: parquet\ncompression: zstd\n\
         path: \"orders/dt={date}/\"\nroll: {max_records: 100, max_age: 10m}\n\
         schema: {order_id: string, qty: {type: int64, nullable: false}}\n",
    );
    let daemon = Daemon::with_yaml(&yaml).envs(azurite.env()).start();
    daemon.publish("orders", &orders("p", 0..300));
    daemon.wait_until("three files of 100", LONG, |d| {
        d.metric_sum("sluice_sink_object_records_total") == 300.0
    });
    let found = Objects::azure(&azurite, "lake");
    assert_eq!(found.counts(), [100, 100, 100], "{:?}", found.keys());
    let rows = found.rows();
    assert_eq!(rows.len(), 300, "no duplicates without a crash");
    assert_eq!(ids(&rows, "sluice_id"), want("p", 300));
    for row in &rows {
        let n: u64 = row["sluice_id"].as_str().expect("id")[1..]
            .parse()
            .expect("n");
        assert_eq!(row["qty"].as_u64(), Some(n), "{row}");
        assert_eq!(row["order_id"], format!("o{n}"), "{row}");
    }
    for key in found.keys() {
        assert!(
            key.starts_with("events/orders/dt=") && key.ends_with(".parquet"),
            "{key}"
        );
    }
    assert_eq!(
        found.uploads,
        Some(0),
        "no blob left with uncommitted blocks"
    );
}

/// Gzipped JSON lines on Azurite, the client pointed at it as at a real
/// account: `endpoint:` (the account URL) and the account's name and key
/// in `AZURE_STORAGE_ACCOUNT_NAME`/`AZURE_STORAGE_ACCOUNT_KEY`. Three
/// files close by `max_records`; SIGTERM uploads the open fourth.
#[test]
fn gzip_jsonl_on_azurite_through_endpoint_and_sigterm_uploads_the_open_file() {
    let azurite = AzuriteServer::start().expect("azurite");
    azurite.create_container("lake").expect("container");
    let yaml = pipeline(&format!(
        "store: az://lake\nendpoint: {}\nallow_http: true\nformat: jsonl\ncompression: gzip\n\
         path: \"{{topic}}/\"\nroll: {{max_records: 100, max_age: 10m}}\n",
        azurite.account_url()
    ));
    let mut daemon = Daemon::with_yaml(&yaml).envs(azurite.account_env()).start();
    daemon.publish("orders", &orders("j", 0..350));
    daemon.wait_until("three full files", LONG, |d| {
        d.metric_sum("sluice_sink_object_records_total") == 300.0
            && d.metric_sum("sluice_sink_open_files") == 1.0
    });
    let (status, _) = daemon.sigterm();
    assert!(status.success(), "{status:?}\n{}", daemon.log());
    let found = Objects::azure(&azurite, "lake");
    assert_eq!(found.counts(), [50, 100, 100, 100], "{:?}", found.keys());
    let rows = found.rows();
    assert_eq!(rows.len(), 350);
    assert_eq!(ids(&rows, "id"), want("j", 350));
    for row in &rows {
        assert_eq!(row["topic"], "orders", "{row}");
        assert!(row["payload"]["order_id"].is_string(), "{row}");
    }
    for key in found.keys() {
        assert!(
            key.starts_with("orders/") && key.ends_with(".jsonl.gz"),
            "{key}"
        );
    }
    assert_eq!(found.uploads, Some(0));
}

/// One file above the sink's multipart threshold (16 MiB): 72 records of
/// 256 KiB in one JSON-lines file, uploaded in 8 MiB parts (Azure blocks,
/// committed by one block list), read back whole.
#[test]
fn a_file_above_16_mib_goes_to_azurite_in_blocks() {
    let azurite = AzuriteServer::start().expect("azurite");
    azurite.create_container("big").expect("container");
    let yaml = pipeline("store: az://big\nformat: jsonl\nroll: {max_records: 72, max_age: 10m}\n");
    let daemon = Daemon::with_yaml(&yaml).envs(azurite.env()).start();
    publish_big(&daemon, "orders", "m", 72);
    daemon.wait_until("the big file", LONG, |d| {
        d.metric_sum("sluice_sink_object_records_total") == 72.0
    });
    let found = Objects::azure(&azurite, "big");
    assert_eq!(found.objects.len(), 1, "{:?}", found.keys());
    let object = &found.objects[0];
    let size = object["size"].as_u64().expect("size");
    eprintln!(
        "{}: {size} bytes in {} blocks",
        object["key"], object["blocks"]
    );
    assert!(
        size > 16 << 20,
        "{size} bytes: not above the multipart threshold"
    );
    // 8 MiB parts: three blocks for 18 MiB. A single put has none.
    assert!(
        object["blocks"].as_u64().expect("blocks") >= 3,
        "not a multipart upload: {}",
        object["blocks"]
    );
    check_big_rows(&found.rows(), "m", 72);
    assert_eq!(found.uploads, Some(0));
}

/// The big records read back: each id once, each padding whole.
fn check_big_rows(rows: &[Value], prefix: &str, n: usize) {
    assert_eq!(rows.len(), n);
    assert_eq!(ids(rows, "id"), want(prefix, n));
    for row in rows {
        assert_eq!(
            row["payload"]["pad"].as_str().map(str::len),
            Some(BIG_PAD),
            "{}",
            row["id"]
        );
    }
}

/// The padding of each big record.
const BIG_PAD: usize = 256 << 10;

/// `n` records of [`BIG_PAD`] bytes each to `topic`, published a few at
/// a time (the batch endpoint takes 64 MiB a request).
fn publish_big(daemon: &Daemon, topic: &str, prefix: &str, n: usize) {
    let messages: Vec<Msg> = (0..n)
        .map(|i| {
            let pad: String = (0..BIG_PAD)
                .map(|j| char::from(b'a' + ((i * 7 + j * 13) % 26) as u8))
                .collect();
            Msg::new(
                format!("{prefix}{i}"),
                json!({"n": i, "pad": pad}).to_string(),
            )
        })
        .collect();
    for chunk in messages.chunks(16) {
        daemon.publish(topic, chunk);
    }
}

/// Azurite honours `PutMode::Create` (the sink's create-only put): a
/// second create of a key fails with `AlreadyExists` and leaves the first
/// object as it was. Driven through the object_store client directly,
/// pointed at Azurite as at an account (the emulator mode takes its URL
/// from the environment only, which a test cannot set safely).
#[test]
fn azurite_refuses_a_second_create_of_the_same_key() {
    let azurite = AzuriteServer::start().expect("azurite");
    azurite.create_container("lake").expect("container");
    let store = object_store::azure::MicrosoftAzureBuilder::new()
        .with_container_name("lake")
        .with_account(sluice_harness::azurite::ACCOUNT)
        .with_access_key(sluice_harness::azurite::ACCOUNT_KEY)
        .with_endpoint(azurite.account_url())
        .with_allow_http(true)
        .build()
        .expect("azure client");
    create_twice(&store);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio")
}

/// Parquet with a schema on fake-gcs-server, through the harness's XML
/// API gateway (the sink's client writes GCS's XML API, which the server
/// lacks), configured only by the environment: a service-account key
/// with `gcs_base_url` and `disable_oauth`. Read back from the server
/// itself through its JSON API.
#[test]
fn parquet_on_fake_gcs_server_through_the_xml_gateway() {
    let gcs = FakeGcsServer::start().expect("fake-gcs-server");
    gcs.create_bucket("lake").expect("bucket");
    let yaml = pipeline(
        "store: gs://lake/events\nallow_http: true\nformat: parquet\ncompression: snappy\n\
         path: \"orders/dt={date}/\"\nroll: {max_records: 100, max_age: 10m}\n\
         schema: {order_id: string, qty: {type: int64, nullable: false}}\n",
    );
    let daemon = Daemon::with_yaml(&yaml).envs(gcs.xml_env()).start();
    daemon.publish("orders", &orders("q", 0..300));
    daemon.wait_until("three files of 100", LONG, |d| {
        d.metric_sum("sluice_sink_object_records_total") == 300.0
    });
    let found = Objects::gcs(&gcs, "lake");
    assert_eq!(found.counts(), [100, 100, 100], "{:?}", found.keys());
    let rows = found.rows();
    assert_eq!(rows.len(), 300, "no duplicates without a crash");
    assert_eq!(ids(&rows, "sluice_id"), want("q", 300));
    for row in &rows {
        let n: u64 = row["sluice_id"].as_str().expect("id")[1..]
            .parse()
            .expect("n");
        assert_eq!(row["qty"].as_u64(), Some(n), "{row}");
    }
    for key in found.keys() {
        assert!(
            key.starts_with("events/orders/dt=") && key.ends_with(".parquet"),
            "{key}"
        );
    }
}

/// Gzipped JSON lines on fake-gcs-server, the gateway given as
/// `endpoint:` (which overrides the key's `gcs_base_url`, here the bare
/// server); SIGTERM uploads the open file. Then one file above the
/// multipart threshold, which the gateway sees arrive as an XML multipart
/// upload.
#[test]
fn gzip_jsonl_and_a_multipart_file_on_fake_gcs_server_through_endpoint() {
    let gcs = FakeGcsServer::start().expect("fake-gcs-server");
    gcs.create_bucket("lake").expect("bucket");
    gcs.create_bucket("big").expect("bucket");
    let yaml = format!(
        "{}  - name: big\n    subscribe: large\n    object_store:\n{}",
        pipeline(&format!(
            "store: gs://lake\nendpoint: {}\nallow_http: true\nformat: jsonl\n\
             compression: gzip\npath: \"{{topic}}/\"\nroll: {{max_records: 100, max_age: 10m}}\n",
            gcs.xml_endpoint()
        ))
        .replace("topics: [orders]", "topics: [orders, large]"),
        sluice_tests::edges::indent(
            &format!(
                "store: gs://big\nendpoint: {}\nallow_http: true\nformat: jsonl\n\
                 roll: {{max_records: 72, max_age: 10m}}\n",
                gcs.xml_endpoint()
            ),
            6
        )
    );
    let mut daemon = Daemon::with_yaml(&yaml).envs(gcs.env()).start();
    daemon.publish("orders", &orders("k", 0..350));
    publish_big(&daemon, "large", "m", 72);
    daemon.wait_until("three full files and the big one", LONG, |d| {
        d.metric_sum("sluice_sink_object_records_total") == 300.0 + 72.0
    });
    let (status, _) = daemon.sigterm();
    assert!(status.success(), "{status:?}\n{}", daemon.log());
    let found = Objects::gcs(&gcs, "lake");
    assert_eq!(found.counts(), [50, 100, 100, 100], "{:?}", found.keys());
    let rows = found.rows();
    assert_eq!(rows.len(), 350);
    assert_eq!(ids(&rows, "id"), want("k", 350));
    for key in found.keys() {
        assert!(
            key.starts_with("orders/") && key.ends_with(".jsonl.gz"),
            "{key}"
        );
    }
    let big = Objects::gcs(&gcs, "big");
    assert_eq!(big.objects.len(), 1, "{:?}", big.keys());
    let size = big.objects[0]["size"].as_u64().expect("size");
    assert!(
        size > 16 << 20,
        "{size} bytes: not above the multipart threshold"
    );
    assert_eq!(
        gcs.multipart_uploads_completed(),
        1,
        "not a multipart upload"
    );
    check_big_rows(&big.rows(), "m", 72);
}

/// fake-gcs-server honours `PutMode::Create` through the gateway (as
/// `ifGenerationMatch=0`): a second create of a key fails with
/// `AlreadyExists` and leaves the first object as it was.
#[test]
fn fake_gcs_server_refuses_a_second_create_of_the_same_key_through_the_gateway() {
    let gcs = FakeGcsServer::start().expect("fake-gcs-server");
    gcs.create_bucket("lake").expect("bucket");
    let store = object_store::gcp::GoogleCloudStorageBuilder::new()
        .with_bucket_name("lake")
        .with_service_account_key(gcs.service_account_key())
        .with_base_url(&gcs.xml_endpoint())
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
        .build()
        .expect("gcs client");
    create_twice(&store);
}

/// A create-only put of a key, then another: the second is refused with
/// `AlreadyExists`, the first object unchanged.
fn create_twice(store: &dyn ObjectStore) {
    runtime().block_on(async {
        let path = object_store::path::Path::from("once/a.jsonl");
        let create = || PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        store
            .put_opts(&path, PutPayload::from_static(b"first\n"), create())
            .await
            .expect("the first create");
        let second = store
            .put_opts(&path, PutPayload::from_static(b"second\n"), create())
            .await;
        assert!(
            matches!(second, Err(object_store::Error::AlreadyExists { .. })),
            "{second:?}"
        );
        let body = store
            .get(&path)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("body");
        assert_eq!(&body[..], b"first\n");
    });
}

/// What fake-gcs-server 1.56 does with the object_store crate's GCS
/// client, configured as the sink configures it (a service-account key
/// with `gcs_base_url` and `disable_oauth`, the crate CI's way): reads
/// work (an object uploaded through the JSON API is listed and read
/// back); every write, create-only or not, is refused with a 400
/// (`invalid uploadType`: the server has no XML API `PUT`), and so is a
/// multipart upload. If this starts failing, the emulator has gained the
/// XML API: test the sink on it end to end as on Azurite.
#[test]
fn fake_gcs_server_reads_through_the_gcs_client_but_refuses_its_writes() {
    let gcs = FakeGcsServer::start().expect("fake-gcs-server");
    gcs.create_bucket("lake").expect("bucket");
    let (status, body) = gcs
        .request(
            "POST",
            "/upload/storage/v1/b/lake/o?uploadType=media&name=events/seed.jsonl",
            Some("application/octet-stream"),
            b"{\"n\":1}\n",
        )
        .expect("JSON API upload");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let store = object_store::gcp::GoogleCloudStorageBuilder::new()
        .with_bucket_name("lake")
        .with_service_account_key(gcs.service_account_key())
        .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
        .with_retry(object_store::RetryConfig {
            max_retries: 0,
            ..object_store::RetryConfig::default()
        })
        .build()
        .expect("gcs client");
    runtime().block_on(async {
        use futures_util::TryStreamExt as _;
        let listed: Vec<_> = store
            .list(Some(&object_store::path::Path::from("events")))
            .try_collect()
            .await
            .expect("list");
        assert_eq!(listed.len(), 1, "{listed:?}");
        let path = object_store::path::Path::from("events/seed.jsonl");
        let body = store
            .get(&path)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("body");
        assert_eq!(&body[..], b"{\"n\":1}\n");

        let create = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let put = store
            .put_opts(
                &object_store::path::Path::from("events/new.jsonl"),
                PutPayload::from_static(b"x\n"),
                create,
            )
            .await;
        let message = format!("{put:?}");
        assert!(
            put.is_err() && message.contains("invalid uploadType"),
            "fake-gcs-server took an XML API put: {message}"
        );
        let multipart = store
            .put_multipart(&object_store::path::Path::from("events/big.jsonl"))
            .await;
        assert!(
            multipart.is_err(),
            "fake-gcs-server started an XML multipart upload"
        );
    });
    assert_eq!(
        Objects::gcs(&gcs, "lake").rows(),
        [json!({"n": 1})],
        "only the seed object: nothing written by the refused puts"
    );
}

/// The sink on `gs://` against fake-gcs-server, configured only through
/// the standard environment (`GOOGLE_SERVICE_ACCOUNT_KEY` with
/// `gcs_base_url` and `disable_oauth`) and `allow_http`: its puts reach
/// the server and are refused (above), which the sink holds as an outage:
/// readiness names the sink with the server's answer, and nothing is
/// dead-lettered or acked.
#[test]
fn gs_on_fake_gcs_server_is_held_as_an_outage_with_the_servers_answer() {
    let gcs = FakeGcsServer::start().expect("fake-gcs-server");
    gcs.create_bucket("lake").expect("bucket");
    let yaml = pipeline(
        "store: gs://lake/events\nallow_http: true\nformat: jsonl\n\
         roll: {max_records: 10, max_age: 10m}\nstall: 1s\n",
    );
    let daemon = Daemon::with_yaml(&yaml).envs(gcs.env()).start();
    daemon.publish("orders", &orders("g", 0..10));
    daemon.wait_until("readiness names the stalled sink", LONG, |d| {
        let (status, reasons) = d.readiness();
        status != "ready" && reasons.contains("clouds/lake")
    });
    let (_, reasons) = daemon.readiness();
    eprintln!("readiness: {reasons}");
    assert!(reasons.contains("gs://lake/events"), "{reasons}");
    daemon.wait_until("the server's answer in the log", LONG, |d| {
        d.log().contains("invalid uploadType")
    });
    assert_eq!(daemon.depth("clouds.lake.dlq"), 0, "nothing dead-lettered");
    assert_eq!(daemon.metric_sum("sluice_sink_object_records_total"), 0.0);
    assert!(Objects::gcs(&gcs, "lake").objects.is_empty());
}
