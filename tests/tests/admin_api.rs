//! The admin API and the CLI commands that use it, against the real thing:
//! an embedded broker in a temporary directory, `admin::serve` on a real
//! loopback socket, pipelines loaded from YAML by `config::load`, and the
//! real `sluice` binary for the CLI.
//!
//! The engine is not running here, so each test declares the topics and
//! consumers itself (as the engine does at start) and seeds dead letters by
//! publishing entries stamped with `Provenance::stamp`.
//!
//! Nothing asserts on timing; waits are generous, so a loaded machine makes
//! the tests slower, never flaky.

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice::admin::{self, AdminState};
use sluice::broker::embedded::{EmbeddedBroker, EmbeddedOptions, SyncMode};
use sluice::broker::{Broker, ConsumerSpec, Message, TopicSpec, consumer_name};
use sluice::config::{self, Pipeline};
use sluice::dlq::{self, Provenance};
use sluice::metrics::Metrics;
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const PIPELINE: &str = r#"
name: shop
topics:
  - orders
  - orders.done
  - name: limited
    high_water_mark: 2
stages:
  - name: route
    subscribe: orders
    plugin: identity.wasm
    publish: [orders.done]
  - name: audit
    subscribe: orders
    plugin: identity.wasm
"#;

/// A running admin server over a fresh embedded broker.
struct InProcessAdmin {
    dir: TempDir,
    broker: Arc<EmbeddedBroker>,
    addr: SocketAddr,
    http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<std::io::Result<()>>>,
}

impl InProcessAdmin {
    async fn start() -> InProcessAdmin {
        InProcessAdmin::start_with(|state| state).await
    }

    async fn start_with(configure: impl FnOnce(AdminState) -> AdminState) -> InProcessAdmin {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("shop.yaml");
        std::fs::write(&file, PIPELINE).expect("write pipeline");
        let pipelines = config::load(&[file]).expect("the pipeline is valid");
        let broker =
            EmbeddedBroker::open(EmbeddedOptions::new(dir.path().join("data")).sync(SyncMode::Os))
                .expect("open broker");
        declare(&*broker, &pipelines).await;
        let state = configure(AdminState::new(
            broker.clone(),
            Arc::new(Metrics::new()),
            pipelines,
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(admin::serve(listener, state, async move {
            let _ = stopped.await;
        }));
        InProcessAdmin {
            dir,
            broker,
            addr,
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("client"),
            stop: Some(stop),
            server: Some(server),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.url(path)).send().await.expect("GET")
    }

    async fn get_json(&self, path: &str) -> Value {
        let response = self.get(path).await;
        assert_eq!(response.status(), 200, "GET {path}");
        response.json().await.expect("JSON")
    }

    async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .body(body)
            .send()
            .await
            .expect("POST")
    }

    async fn post_json(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("POST");
        let status = response.status().as_u16();
        (status, response.json().await.expect("JSON"))
    }

    async fn depth(&self, topic: &str) -> u64 {
        self.broker.topic_stats(topic).await.expect("stats").depth
    }

    /// Runs the real `sluice` binary against this daemon.
    fn cli(&self, args: &[&str]) -> Output {
        self.cli_with_stdin(args, None)
    }

    fn cli_with_stdin(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut child = Command::new(sluice_tests::sluice_bin())
            .args(args)
            .env("SLUICE_ADMIN", self.addr.to_string())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run sluice");
        if let Some(bytes) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(bytes)
                .expect("write stdin");
        }
        child.wait_with_output().expect("sluice output")
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            tokio::time::timeout(Duration::from_secs(20), server)
                .await
                .expect("the server stops promptly")
                .expect("server task")
                .expect("server result");
        }
    }
}

/// What the engine does at start: declare every topic, DLQ and consumer.
async fn declare(broker: &dyn Broker, pipelines: &[Pipeline]) {
    for pipeline in pipelines {
        for topic in &pipeline.topics {
            broker
                .ensure_topic(&TopicSpec::new(topic.name.clone()))
                .await
                .expect("topic");
        }
        for stage in &pipeline.stages {
            broker
                .ensure_topic(&TopicSpec::new(stage.dlq_topic(&pipeline.name)))
                .await
                .expect("dlq topic");
            broker
                .ensure_consumer(&ConsumerSpec {
                    name: consumer_name(&pipeline.name, &stage.name),
                    topic: stage.subscribe.topic().to_owned(),
                    filter: stage.subscribe.filter.clone(),
                    ack_wait: Duration::from_secs(60),
                    max_ack_pending: None,
                    max_deliver: None,
                })
                .await
                .expect("consumer");
        }
    }
}

/// Dead-letters a message of `shop/route` the way the engine will: the
/// original message, stamped with provenance, published to the DLQ topic.
async fn seed_dead_letter(broker: &dyn Broker, id: &str, payload: &str, kind: &str) -> u64 {
    let mut entry = Message::new(id, "shop.route.dlq", payload.as_bytes().to_vec());
    entry.key = Some("k1".into());
    entry.headers.push(("trace".into(), "t-1".into()));
    Provenance {
        pipeline: "shop".into(),
        stage: "route".into(),
        source_topic: "orders".into(),
        source_seq: 7,
        original_id: id.into(),
        attempts: 5,
        kind: kind.into(),
        error: format!("{kind}: handler said no"),
        first_failure: 1_700_000_000_000,
        last_failure: 1_700_000_060_000,
    }
    .stamp(&mut entry);
    broker.publish(vec![entry]).await.expect("seed")[0].seq
}

/// Dead-letters `id` of `shop/route` with failure `kind` at `at` (ms since
/// the epoch), with header `tenant`.
async fn seed_failure(broker: &dyn Broker, id: &str, kind: &str, at: u64, tenant: &str) -> u64 {
    let mut entry = Message::new(id, "shop.route.dlq", format!("payload of {id}"));
    entry.key = Some(format!("key-{id}"));
    entry.headers.push(("tenant".into(), tenant.into()));
    Provenance {
        pipeline: "shop".into(),
        stage: "route".into(),
        source_topic: "orders".into(),
        source_seq: 1,
        original_id: id.into(),
        attempts: 3,
        kind: kind.into(),
        error: format!("{kind} in handler"),
        first_failure: at - 1000,
        last_failure: at,
    }
    .stamp(&mut entry);
    broker.publish(vec![entry]).await.expect("seed")[0].seq
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

// ---------------------------------------------------------------- the API

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_ok() {
    let d = InProcessAdmin::start().await;
    assert_eq!(d.get_json("/health").await, json!({"status": "ok"}));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_message_reads_back_with_key_headers_and_payload() {
    let d = InProcessAdmin::start().await;
    let response = d
        .http
        .post(d.url("/v1/topics/orders/messages"))
        .header("Sluice-Key", "customer-7")
        .header("Sluice-Header-Trace", "abc")
        .header("Sluice-Header-Source", "test")
        .body("hello")
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 202);
    let receipt: Value = response.json().await.expect("JSON");
    assert_eq!(receipt["topic"], "orders");
    assert_eq!(receipt["duplicate"], false);
    let seq = receipt["seq"].as_u64().expect("seq");
    let id = receipt["id"].as_str().expect("id").to_owned();
    assert!(!id.is_empty());

    // Bytes that are not UTF-8 come back as base64.
    let binary = d
        .post("/v1/topics/orders/messages", vec![0xffu8, 0x00, 0x01])
        .await;
    assert_eq!(binary.status(), 202);

    let read = d
        .get_json(&format!("/v1/topics/orders/messages?from={seq}&max=10"))
        .await;
    let messages = read["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2);
    let first = &messages[0];
    assert_eq!(first["seq"], seq);
    assert_eq!(first["id"], id.as_str());
    assert_eq!(first["key"], "customer-7");
    assert_eq!(first["payload"], "hello");
    assert_eq!(
        first["headers"],
        json!([["trace", "abc"], ["source", "test"]])
    );
    assert!(first["published_at"].as_u64().expect("published_at") > 0);
    assert_eq!(messages[1]["payload_base64"], "/wAB");
    assert!(messages[1].get("payload").is_none());
    assert_eq!(read["next"], seq + 2);
    assert_eq!(read["last_seq"], seq + 1);

    // Without `from`, a read starts at the oldest stored message.
    let all = d.get_json("/v1/topics/orders/messages").await;
    assert_eq!(all["messages"][0]["seq"], seq);

    let metrics = d.get("/metrics").await.text().await.expect("text");
    assert!(
        metrics.contains("sluice_messages_published_total{topic=\"orders\"} 2"),
        "{metrics}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_stores_a_message_once() {
    let d = InProcessAdmin::start().await;
    let mut receipts = Vec::new();
    for _ in 0..2 {
        let response = d
            .http
            .post(d.url("/v1/topics/orders/messages"))
            .header("Idempotency-Key", "order-42")
            .body("once")
            .send()
            .await
            .expect("POST");
        assert_eq!(response.status(), 202);
        receipts.push(response.json::<Value>().await.expect("JSON"));
    }
    assert_eq!(receipts[0]["id"], "order-42");
    assert_eq!(receipts[1]["id"], "order-42");
    assert_eq!(receipts[0]["seq"], receipts[1]["seq"]);
    assert_eq!(receipts[0]["duplicate"], false);
    assert_eq!(receipts[1]["duplicate"], true);
    assert_eq!(d.depth("orders").await, 1);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_json_errors_with_codes() {
    let d = InProcessAdmin::start().await;
    let expect = async |response: reqwest::Response, status: u16, code: &str| {
        assert_eq!(response.status(), status);
        let body: Value = response.json().await.expect("JSON error");
        assert_eq!(body["code"], code, "{body}");
        assert!(!body["error"].as_str().expect("message").is_empty());
        body
    };

    let body = expect(
        d.post("/v1/topics/nope/messages", "x").await,
        404,
        "unknown_topic",
    )
    .await;
    assert!(body["error"].as_str().expect("msg").contains("nope"));
    expect(
        d.post("/v1/topics/orders/messages", "").await,
        400,
        "bad_request",
    )
    .await;
    let long_key = "k".repeat(admin::MAX_ID_BYTES + 1);
    for bad_key in ["", long_key.as_str()] {
        let response = d
            .http
            .post(d.url("/v1/topics/orders/messages"))
            .header("Idempotency-Key", bad_key)
            .body("x")
            .send()
            .await
            .expect("POST");
        expect(response, 400, "bad_request").await;
    }
    // The runtime's own headers cannot be forged on a normal topic.
    let response = d
        .http
        .post(d.url("/v1/topics/orders/messages"))
        .header("Sluice-Header-Sluice-Redrive-To", "shop/audit")
        .body("x")
        .send()
        .await
        .expect("POST");
    expect(response, 400, "bad_request").await;
    let response = d
        .http
        .post(d.url("/v1/topics/orders/batch"))
        .header("Content-Type", "application/json")
        .body(r#"{"payload":"x"}"#)
        .send()
        .await
        .expect("POST");
    expect(response, 415, "unsupported_media_type").await;
    expect(d.get("/v1/nothing-here").await, 404, "not_found").await;
    expect(d.get("/v1/dlq/shop/nope").await, 404, "unknown_stage").await;
    expect(
        d.get("/v1/topics/orders/messages?from=minus-one").await,
        400,
        "bad_request",
    )
    .await;
    // Out of the ranges the OpenAPI document gives: refused, not cut.
    for query in [
        "max=0",
        "max=1001",
        "wait_ms=30001",
        "from=9007199254740992",
    ] {
        let body = expect(
            d.get(&format!("/v1/topics/orders/messages?{query}")).await,
            400,
            "bad_request",
        )
        .await;
        let name = query.split('=').next().expect("name");
        assert!(
            body["error"].as_str().expect("msg").contains(name),
            "{body}"
        );
    }
    for query in ["limit=0", "limit=1001", "limit=many"] {
        expect(
            d.get(&format!("/v1/dlq/shop/route?{query}")).await,
            400,
            "bad_request",
        )
        .await;
    }
    let (status, body) = d
        .post_json(
            "/v1/dlq/shop/route/redrive",
            json!({"limit": 9_223_372_036_854_775_808_u64}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    // `null` is an absent body, as the document's optional body allows.
    let response = d
        .http
        .post(d.url("/v1/dlq/shop/route/redrive"))
        .header("Content-Type", "application/json")
        .body("null")
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 200);
    assert_eq!(d.depth("orders").await, 0, "nothing was published");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_validated_whole_and_published_together() {
    let d = InProcessAdmin::start().await;
    let post = async |body: &str, content_type: &str| {
        d.http
            .post(d.url("/v1/topics/orders/batch"))
            .header("Content-Type", content_type)
            .body(body.to_owned())
            .send()
            .await
            .expect("POST")
    };
    // The second line is bad: nothing is published.
    let bad = "{\"payload\":\"a\"}\n{\"payload\":\"b\",\"colour\":1}\n";
    let response = post(bad, "application/x-ndjson").await;
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.expect("JSON");
    assert!(
        error["error"].as_str().expect("msg").starts_with("line 2:"),
        "{error}"
    );
    assert_eq!(d.depth("orders").await, 0);

    let good = concat!(
        "{\"payload\":\"a\",\"key\":\"k\",\"id\":\"b-1\"}\n",
        "\n",
        "{\"payload_base64\":\"/wAB\",\"headers\":{\"h\":\"v\"}}\n",
        "{\"payload\":\"c\",\"headers\":[[\"x\",\"1\"],[\"x\",\"2\"]],\"id\":\"b-1\"}\n",
    );
    let response = post(good, "application/jsonl; charset=utf-8").await;
    assert_eq!(response.status(), 202);
    let receipt: Value = response.json().await.expect("JSON");
    assert_eq!(receipt["published"], 2);
    assert_eq!(receipt["duplicates"], 1, "b-1 appears twice: {receipt}");
    assert_eq!(receipt["messages"].as_array().expect("list").len(), 3);
    let read = d.get_json("/v1/topics/orders/messages").await;
    let messages = read["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["key"], "k");
    assert_eq!(messages[1]["payload_base64"], "/wAB");
    assert_eq!(messages[1]["headers"], json!([["h", "v"]]));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_answers_429_at_the_high_water_mark() {
    let d = InProcessAdmin::start().await;
    for i in 0..2 {
        let response = d.post("/v1/topics/limited/messages", format!("m{i}")).await;
        assert_eq!(response.status(), 202);
    }
    let response = d.post("/v1/topics/limited/messages", "one too many").await;
    assert_eq!(response.status(), 429);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["code"], "backpressure");
    assert_eq!(
        d.depth("limited").await,
        2,
        "the refused message was not enqueued"
    );
    // The batch endpoint applies the same limit.
    let response = d
        .http
        .post(d.url("/v1/topics/limited/batch"))
        .header("Content-Type", "application/x-ndjson")
        .body("{\"payload\":\"x\"}\n")
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 429);
    assert_eq!(d.depth("limited").await, 2);
    // A topic without a limit is unaffected.
    assert_eq!(
        d.post("/v1/topics/orders/messages", "x").await.status(),
        202
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_gets_a_json_413() {
    let d = InProcessAdmin::start_with(|state| state.with_body_limit(1024)).await;
    let response = d.post("/v1/topics/orders/messages", vec![b'x'; 4096]).await;
    assert_eq!(response.status(), 413);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["code"], "payload_too_large");
    assert_eq!(d.depth("orders").await, 0, "nothing was enqueued");
    assert_eq!(
        d.post("/v1/topics/orders/messages", vec![b'x'; 1000])
            .await
            .status(),
        202
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_use_the_design_names_and_the_prometheus_content_type() {
    let d = InProcessAdmin::start().await;
    seed_dead_letter(&*d.broker, "m1", "bad", "rejected").await;
    d.post("/v1/topics/orders/messages", "x").await;
    let response = d.get("/metrics").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = response.text().await.expect("text");
    for name in [
        "sluice_messages_published_total",
        "sluice_messages_processed_total",
        "sluice_queue_depth",
        "sluice_oldest_message_age_seconds",
        "sluice_dlq_depth",
        "sluice_inflight",
        "sluice_handler_duration_seconds",
        "sluice_claim_bytes_total",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    // The broker-backed gauges are refreshed at scrape time.
    assert!(
        text.contains("sluice_dlq_depth{pipeline=\"shop\",stage=\"route\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("sluice_queue_depth{pipeline=\"shop\",stage=\"audit\"} 1"),
        "{text}"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_has_one_object_per_stage() {
    let d = InProcessAdmin::start().await;
    d.post("/v1/topics/orders/messages", "a").await;
    d.post("/v1/topics/orders/messages", "b").await;
    seed_dead_letter(&*d.broker, "m1", "bad", "trap").await;
    let status = d.get_json("/v1/status").await;
    let stages = status.as_array().expect("array");
    assert_eq!(stages.len(), 2);
    let route = &stages[0];
    assert_eq!(route["pipeline"], "shop");
    assert_eq!(route["stage"], "route");
    assert_eq!(route["topic"], "orders");
    assert_eq!(route["depth"], 2);
    assert_eq!(route["in_flight"], 0);
    assert_eq!(route["dlq_depth"], 1);
    assert_eq!(route["processed_total"], 0);
    assert_eq!(route["processed_per_sec"], 0.0);
    assert!(route["oldest_age_seconds"].as_f64().is_some(), "{route}");
    assert_eq!(stages[1]["stage"], "audit");
    assert_eq!(stages[1]["dlq_depth"], 0);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redrive_holds_only_its_own_stage_and_stops_at_its_time_limit() {
    let d = InProcessAdmin::start_with(|s| s.with_redrive_time_limit(Duration::from_secs(3))).await;
    let b = &*d.broker;
    for i in 0..3 {
        seed_dead_letter(b, &format!("m{i}"), "p", "rejected").await;
    }
    b.publish(vec![Message::new("a1", "shop.audit.dlq", "x")])
        .await
        .expect("publish");
    // Paced at one entry per 2 s: the third would go at 4 s, past the limit.
    let http = d.http.clone();
    let url = d.url("/v1/dlq/shop/route/redrive");
    let redrive = tokio::spawn(async move {
        http.post(url)
            .json(&json!({"rate": 0.5}))
            .send()
            .await?
            .json::<Value>()
            .await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while d.depth("shop.route.dlq").await > 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the redrive never began"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another stage's purge does not wait for the redrive.
    let (status, purged) = d
        .post_json("/v1/dlq/shop/audit/purge", json!({"all": true}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(purged["purged"], 1);
    assert!(
        !redrive.is_finished(),
        "the purge of shop/audit waited for the redrive of shop/route"
    );
    let report = redrive.await.expect("task").expect("redrive report");
    assert_eq!(report["time_limit_reached"], true, "{report}");
    assert_eq!(report["redriven"], 2, "{report}");
    assert_eq!(d.depth("shop.route.dlq").await, 1);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_list_show_redrive_and_purge() {
    let d = InProcessAdmin::start().await;
    let b = &*d.broker;
    let first = seed_dead_letter(b, "m1", "first", "rejected").await;
    seed_dead_letter(b, "m2", "second", "timeout").await;
    // An entry without provenance: it cannot be routed back.
    let orphan = b
        .publish(vec![Message::new("orphan", "shop.route.dlq", "lost")])
        .await
        .expect("publish")[0]
        .seq;

    let list = d.get_json("/v1/dlq/shop/route").await;
    assert_eq!(list["topic"], "shop.route.dlq");
    assert_eq!(list["depth"], 3);
    let entries = list["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[0]["seq"], first);
    assert_eq!(entries[0]["id"], "m1");
    assert_eq!(entries[0]["kind"], "rejected");
    assert_eq!(entries[0]["attempts"], 5);
    assert_eq!(entries[0]["source_topic"], "orders");
    assert_eq!(entries[0]["payload_preview"], "first");
    assert!(entries[0].get("problem").is_none());
    assert!(entries[2]["problem"].is_string(), "{}", entries[2]);
    let limited = d.get_json("/v1/dlq/shop/route?limit=1").await;
    assert_eq!(limited["entries"].as_array().expect("entries").len(), 1);
    // Another stage's DLQ is its own.
    let audit = d.get_json("/v1/dlq/shop/audit").await;
    assert_eq!(audit["entries"], json!([]));

    let show = d.get_json(&format!("/v1/dlq/shop/route/{first}")).await;
    assert_eq!(show["payload"], "first");
    assert_eq!(show["key"], "k1");
    assert_eq!(show["error"], "rejected: handler said no");
    let headers = show["headers"].as_array().expect("headers");
    assert!(headers.contains(&json!(["trace", "t-1"])));
    assert!(headers.contains(&json!([dlq::STAGE, "route"])));
    assert_eq!(d.get("/v1/dlq/shop/route/999").await.status(), 404);

    // A dry run reports and changes nothing.
    let (status, dry) = d
        .post_json("/v1/dlq/shop/route/redrive", json!({"dry_run": true}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["redriven"], 2);
    assert_eq!(dry["skipped"], 1);
    assert_eq!(dry["ids"], json!(["m1~r1@shop/route", "m2~r1@shop/route"]));
    assert_eq!(d.depth("shop.route.dlq").await, 3);
    assert_eq!(d.depth("orders").await, 0);

    let (status, report) = d
        .post_json("/v1/dlq/shop/route/redrive", json!({"rate": 100.0}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(report["redriven"], 2);
    assert_eq!(report["skipped"], 1);
    assert_eq!(
        report["ids"],
        json!(["m1~r1@shop/route", "m2~r1@shop/route"])
    );
    assert_eq!(report["skipped_entries"][0]["seq"], orphan);
    assert_eq!(report["skipped_entries"][0]["id"], "orphan");

    // Back on the source topic, targeted at the stage that failed, with
    // the original payload, key and headers and no provenance.
    let read = d.get_json("/v1/topics/orders/messages").await;
    let back = read["messages"].as_array().expect("messages");
    assert_eq!(back.len(), 2);
    assert_eq!(back[0]["id"], "m1~r1@shop/route");
    assert_eq!(back[0]["payload"], "first");
    assert_eq!(back[0]["key"], "k1");
    let headers = back[0]["headers"].as_array().expect("headers");
    assert!(headers.contains(&json!([dlq::REDRIVE_TO, "shop/route"])));
    assert!(headers.contains(&json!(["trace", "t-1"])));
    assert!(!headers.iter().any(|h| h[0] == dlq::KIND));

    // Only the orphan is left, and a second redrive finds nothing to do.
    assert_eq!(d.depth("shop.route.dlq").await, 1);
    // An empty body means every default.
    let again: Value = d
        .post("/v1/dlq/shop/route/redrive", "")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(again["redriven"], 0);
    assert_eq!(again["skipped"], 1);
    assert_eq!(d.depth("orders").await, 2);

    // Purge demands a count, then removes.
    let (status, _) = d.post_json("/v1/dlq/shop/route/purge", json!({})).await;
    assert_eq!(status, 400);
    seed_dead_letter(b, "m3", "third", "retry").await;
    let (status, purged) = d
        .post_json("/v1/dlq/shop/route/purge", json!({"limit": 1}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(purged["purged"], 1);
    let left = d.get_json("/v1/dlq/shop/route").await;
    assert_eq!(left["entries"][0]["id"], "m3", "the oldest went first");
    let (_, purged) = d
        .post_json("/v1/dlq/shop/route/purge", json!({"all": true}))
        .await;
    assert_eq!(purged["purged"], 1);
    assert_eq!(d.depth("shop.route.dlq").await, 0);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_returns_a_new_message_and_ends_on_shutdown() {
    let d = InProcessAdmin::start().await;
    let url = d.url("/v1/topics/orders/messages?from=1&wait_ms=20000");
    let http = d.http.clone();
    let poll = tokio::spawn(async move { http.get(url).send().await?.json::<Value>().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    d.post("/v1/topics/orders/messages", "late").await;
    let page = poll.await.expect("task").expect("read");
    assert_eq!(page["messages"][0]["payload"], "late");

    // A read past the next message does not wait: nothing can arrive
    // there before the message at `next` does.
    let next = page["next"].as_u64().expect("next");
    let started = Instant::now();
    let far = d
        .get_json(&format!(
            "/v1/topics/orders/messages?from={}&wait_ms=30000",
            next + 5
        ))
        .await;
    assert_eq!(far["messages"], json!([]));
    assert!(started.elapsed() < Duration::from_secs(20));

    // A poll that is waiting when the daemon stops ends at once, empty.
    let url = d.url(&format!(
        "/v1/topics/orders/messages?from={next}&wait_ms=30000"
    ));
    let http = d.http.clone();
    let poll = tokio::spawn(async move { http.get(url).send().await?.json::<Value>().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    d.stop().await;
    let page = poll.await.expect("task").expect("read");
    assert_eq!(page["messages"], json!([]));
    assert!(started.elapsed() < Duration::from_secs(20));
}

// ---------------------------------------------------------------- the CLI

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_publish_from_data_file_and_stdin() {
    let d = InProcessAdmin::start().await;
    let out = d.cli(&[
        "publish",
        "orders",
        "--data",
        "from-data",
        "--key",
        "k",
        "--header",
        "a=1",
        "--id",
        "cli-1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let receipt: Value = serde_json::from_str(stdout(&out).trim()).expect("JSON receipt");
    assert_eq!(
        receipt,
        json!({"id": "cli-1", "topic": "orders", "seq": 1, "duplicate": false})
    );

    let file = d.dir.path().join("payload.bin");
    std::fs::write(&file, [0xde, 0xad, 0xbe, 0xef]).expect("write");
    let out = d.cli(&["publish", "orders", "--file", file.to_str().expect("utf8")]);
    assert!(out.status.success(), "{}", stderr(&out));

    let out = d.cli_with_stdin(&["publish", "orders", "-"], Some(b"from stdin"));
    assert!(out.status.success(), "{}", stderr(&out));

    // The same id again is a duplicate.
    let out = d.cli(&["publish", "orders", "--data", "again", "--id", "cli-1"]);
    let receipt: Value = serde_json::from_str(stdout(&out).trim()).expect("JSON receipt");
    assert_eq!(receipt["duplicate"], true);

    let read = d.get_json("/v1/topics/orders/messages").await;
    let messages = read["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[0]["payload"], "from-data");
    assert_eq!(messages[0]["key"], "k");
    assert_eq!(messages[0]["headers"], json!([["a", "1"]]));
    assert_eq!(messages[1]["payload_base64"], "3q2+7w==");
    assert_eq!(messages[2]["payload"], "from stdin");

    // Bad input exits 2 with the daemon's message.
    let out = d.cli(&["publish", "nope", "--data", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with("error: unknown topic `nope`"),
        "{}",
        stderr(&out)
    );
    let out = d.cli(&["publish", "orders"]);
    assert_eq!(out.status.code(), Some(2));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_tail_prints_json_lines() {
    let d = InProcessAdmin::start().await;
    for payload in ["one", "two", "three"] {
        d.post("/v1/topics/orders/messages", payload).await;
    }
    let out = d.cli(&["tail", "orders", "--from-start", "--count", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["payload"], "one");
    assert_eq!(lines[1]["payload"], "two");
    assert_eq!(lines[1]["seq"], 2);

    // Without --from-start only new messages are printed: publish until the
    // follower (started in the background) has seen one.
    let mut child = Command::new(sluice_tests::sluice_bin())
        .args(["tail", "orders", "--count", "1", "--admin"])
        .arg(d.addr.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sluice tail");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("try_wait").is_none() {
        assert!(Instant::now() < deadline, "tail never saw a new message");
        d.post("/v1/topics/orders/messages", "new").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = child.wait_with_output().expect("output");
    assert!(out.status.success(), "{}", stderr(&out));
    let line: Value = serde_json::from_str(stdout(&out).trim()).expect("one JSON line");
    assert_eq!(line["payload"], "new");
    assert!(line["seq"].as_u64().expect("seq") > 3);
    d.stop().await;
}

/// Two batches of rejected, timeout and trap entries, dead-lettered 10 s
/// apart: a redrive of `--kind timeout --since <between them>` takes
/// exactly the second batch's timeouts; the rest stay. The list and purge
/// take the same filters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_filters_take_exactly_the_matching_entries() {
    let d = InProcessAdmin::start().await;
    let b = &*d.broker;
    let first = sluice::broker::now_millis() - 60_000;
    let second = first + 10_000;
    for (batch, at) in [("a", first), ("b", second)] {
        for kind in ["rejected", "timeout", "trap"] {
            for n in 0..3 {
                let tenant = if n == 0 { "acme" } else { "other" };
                seed_failure(b, &format!("{batch}-{kind}-{n}"), kind, at, tenant).await;
            }
        }
    }
    let between = sluice::timestamp::format_rfc3339_millis(first + 5_000);
    let ids = |value: &Value, field: &str| -> Vec<String> {
        value[field]
            .as_array()
            .expect(field)
            .iter()
            .map(|e| e["id"].as_str().expect("id").to_owned())
            .collect()
    };

    // The list takes the filters as query parameters.
    let listed = d
        .get_json(&format!(
            "/v1/dlq/shop/route?kind=timeout&since={}",
            url_escape(&between)
        ))
        .await;
    assert_eq!(
        ids(&listed, "entries"),
        ["b-timeout-0", "b-timeout-1", "b-timeout-2"]
    );
    let acme = d
        .get_json("/v1/dlq/shop/route?header=tenant%3Dacme&kind=trap&kind=rejected")
        .await;
    assert_eq!(
        ids(&acme, "entries"),
        ["a-rejected-0", "a-trap-0", "b-rejected-0", "b-trap-0"]
    );
    let keyed = d.get_json("/v1/dlq/shop/route?key=key-a-trap-1").await;
    assert_eq!(ids(&keyed, "entries"), ["a-trap-1"]);
    let by_error = d.get_json("/v1/dlq/shop/route?error=trap%20in").await;
    assert_eq!(ids(&by_error, "entries").len(), 6);

    // A dry run counts and shows the first ten, changing nothing.
    let (status, dry) = d
        .post_json(
            "/v1/dlq/shop/route/redrive",
            json!({"dry_run": true, "filter": {"kind": "timeout", "since": between}}),
        )
        .await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(dry["redriven"], 3, "{dry}");
    assert_eq!(
        ids(&dry, "sample"),
        ["b-timeout-0", "b-timeout-1", "b-timeout-2"]
    );
    assert_eq!(d.depth("shop.route.dlq").await, 18);

    let (status, report) = d
        .post_json(
            "/v1/dlq/shop/route/redrive",
            json!({"filter": {"kind": ["timeout"], "since": between}}),
        )
        .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["redriven"], 3, "{report}");
    assert_eq!(
        report["ids"],
        json!([
            "b-timeout-0~r1@shop/route",
            "b-timeout-1~r1@shop/route",
            "b-timeout-2~r1@shop/route"
        ])
    );
    assert_eq!(d.depth("orders").await, 3);
    let left = d.get_json("/v1/dlq/shop/route?limit=1000").await;
    let left = ids(&left, "entries");
    assert_eq!(left.len(), 15);
    assert!(
        left.iter().all(|id| !id.starts_with("b-timeout")),
        "{left:?}"
    );

    // Purge: a dry run, then the first batch's rejections only.
    let until = sluice::timestamp::format_rfc3339_millis(first);
    let (_, dry) = d
        .post_json(
            "/v1/dlq/shop/route/purge",
            json!({"all": true, "dry_run": true, "filter": {"kind": "rejected", "until": until}}),
        )
        .await;
    assert_eq!(dry["purged"], 3, "{dry}");
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert_eq!(d.depth("shop.route.dlq").await, 15);
    let (_, purged) = d
        .post_json(
            "/v1/dlq/shop/route/purge",
            json!({"all": true, "filter": {"kind": "rejected", "until": until}}),
        )
        .await;
    assert_eq!(purged["purged"], 3, "{purged}");
    let left = d.get_json("/v1/dlq/shop/route?kind=rejected").await;
    assert_eq!(
        ids(&left, "entries"),
        ["b-rejected-0", "b-rejected-1", "b-rejected-2"]
    );

    // Bad filters are refused with a reason, never read as "everything".
    for (path, body) in [
        (
            "/v1/dlq/shop/route/redrive",
            json!({"filter": {"kind": "timout"}}),
        ),
        (
            "/v1/dlq/shop/route/redrive",
            json!({"filter": {"since": "yesterday"}}),
        ),
        (
            "/v1/dlq/shop/route/purge",
            json!({"all": true, "filter": {"header": "tenant"}}),
        ),
        (
            "/v1/dlq/shop/route/purge",
            json!({"all": true, "filter": {"kinds": "trap"}}),
        ),
    ] {
        let (status, error) = d.post_json(path, body.clone()).await;
        assert_eq!(status, 400, "{body} -> {error}");
    }
    assert_eq!(d.get("/v1/dlq/shop/route?knd=trap").await.status(), 400);
    assert_eq!(d.get("/v1/dlq/shop/route?since=soon").await.status(), 400);
    assert_eq!(d.depth("shop.route.dlq").await, 12);
    d.stop().await;
}

fn url_escape(text: &str) -> String {
    text.replace(':', "%3A").replace('+', "%2B")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_dlq_filters_and_dry_runs() {
    let d = InProcessAdmin::start().await;
    let b = &*d.broker;
    let now = sluice::broker::now_millis();
    for n in 0..12 {
        seed_failure(b, &format!("t{n}"), "timeout", now - 1000, "acme").await;
    }
    seed_failure(b, "old", "timeout", now - 7_200_000, "acme").await;
    seed_failure(b, "r0", "rejected", now - 1000, "acme").await;

    let out = d.cli(&["dlq", "list", "shop/route", "--kind", "rejected"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.contains("r0"), "{text}");

    let out = d.cli(&[
        "dlq",
        "redrive",
        "shop/route",
        "--kind",
        "timeout",
        "--since",
        "1h",
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("would redrive 12 messages"), "{text}");
    assert!(text.contains("(and 2 more)"), "{text}");
    assert!(!text.contains("old"), "{text}");

    let out = d.cli(&[
        "dlq",
        "purge",
        "shop/route",
        "--all",
        "--kind",
        "timeout",
        "--until",
        "1h",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim(),
        "purged 1 entry from the DLQ of shop/route"
    );
    assert_eq!(d.depth("shop.route.dlq").await, 13);

    let out = d.cli(&["dlq", "list", "shop/route", "--kind", "nope"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unknown failure kind `nope`"),
        "{}",
        stderr(&out)
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_dlq_list_show_redrive_and_purge() {
    let d = InProcessAdmin::start().await;
    let seq = seed_dead_letter(&*d.broker, "m1", "bad order", "rejected").await;
    seed_dead_letter(&*d.broker, "m2", "worse order", "timeout").await;

    let out = d.cli(&["dlq", "list", "shop/route"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let mut lines = text.lines();
    let header = lines.next().expect("header");
    assert!(
        header.starts_with("SEQ") && header.contains("KIND"),
        "{text}"
    );
    let row = lines.next().expect("a row");
    assert!(row.starts_with(&seq.to_string()), "{text}");
    assert!(row.contains("m1") && row.contains("rejected"), "{text}");
    assert!(row.contains("rejected: handler said no"), "{text}");

    let out = d.cli(&["dlq", "show", "shop/route", &seq.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let entry: Value = serde_json::from_str(&stdout(&out)).expect("JSON entry");
    assert_eq!(entry["payload"], "bad order");

    let out = d.cli(&["dlq", "redrive", "shop/route", "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("would redrive 2 messages"),
        "{}",
        stdout(&out)
    );
    assert_eq!(d.depth("shop.route.dlq").await, 2);

    let out = d.cli(&["dlq", "redrive", "shop/route", "--limit", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("redrove 1 message "),
        "{}",
        stdout(&out)
    );
    assert_eq!(d.depth("orders").await, 1);

    let out = d.cli(&["dlq", "purge", "shop/route"]);
    assert_eq!(out.status.code(), Some(2), "purge without a count");
    let out = d.cli(&["dlq", "purge", "shop/route", "--all"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim(),
        "purged 1 entry from the DLQ of shop/route"
    );

    let out = d.cli(&["dlq", "list", "shop/nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown stage `shop/nope`"));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_status_prints_a_table_and_json() {
    let d = InProcessAdmin::start().await;
    d.post("/v1/topics/orders/messages", "a").await;
    let out = d.cli(&["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for column in [
        "PIPELINE/STAGE",
        "RATE(/s)",
        "DEPTH",
        "OLDEST",
        "IN-FLIGHT",
        "DLQ",
    ] {
        assert!(lines[0].contains(column), "{text}");
    }
    let route: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(route[0], "shop/route");
    assert_eq!(route[1], "0.0");
    assert_eq!(route[2], "1");

    let out = d.cli(&["status", "--json"]);
    let stages: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(stages[1]["stage"], "audit");
    d.stop().await;
}

/// Delays through ingest and `sluice publish`: the receipt names the due
/// time, `status` and the topic view count the message as delayed until
/// then, a delayed flood meets the high-water mark, and a bad delay is a
/// 400 (a usage error in the CLI) that publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_publishes_are_counted_until_due_and_bad_delays_are_refused() {
    let d = InProcessAdmin::start().await;
    let before = sluice::broker::now_millis();
    let response = d
        .http
        .post(d.url("/v1/topics/orders/messages"))
        .header("idempotency-key", "later-1")
        .header("Sluice-Delay", "2s")
        .body("x")
        .send()
        .await
        .expect("POST");
    assert_eq!(response.status(), 202);
    let receipt: Value = response.json().await.expect("JSON");
    assert_eq!(receipt["seq"], 0, "{receipt}");
    let at = sluice::timestamp::parse_rfc3339_millis(
        receipt["deliver_at"].as_str().expect("deliver_at"),
    )
    .expect("RFC 3339");
    assert!((before + 2_000..before + 3_000).contains(&at), "{receipt}");

    for bad in ["soon", "400d"] {
        let response = d
            .http
            .post(d.url("/v1/topics/orders/messages"))
            .header("Sluice-Delay", bad)
            .body("x")
            .send()
            .await
            .expect("POST");
        assert_eq!(response.status(), 400, "delay {bad}");
    }
    let batch = d
        .http
        .post(d.url("/v1/topics/orders/batch"))
        .header("content-type", "application/x-ndjson")
        .body("{\"payload\": \"a\"}\n{\"payload\": \"b\", \"deliver_at\": \"next tuesday\"}\n")
        .send()
        .await
        .expect("POST");
    assert_eq!(batch.status(), 400, "a bad line refuses the batch");

    let out = d.cli(&[
        "publish", "orders", "--data", "z", "--id", "later-2", "--delay", "1h",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("\"deliver_at\""), "{}", stdout(&out));
    let out = d.cli(&["publish", "orders", "--data", "z", "--delay", "whenever"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = d.cli(&[
        "publish",
        "orders",
        "--data",
        "z",
        "--at",
        "2020-01-01T00:00:00Z",
        "--id",
        "past",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));

    let topic = d.get_json("/v1/topics/orders").await;
    assert_eq!(
        (topic["depth"].as_u64(), topic["delayed"].as_u64()),
        (Some(1), Some(2)),
        "{topic}"
    );
    let status = d.get_json("/v1/status").await;
    let route = status
        .as_array()
        .and_then(|s| s.iter().find(|s| s["stage"] == "route"))
        .expect("route")
        .clone();
    assert_eq!(route["delayed"], 2, "{route}");
    assert_eq!(route["next_due"], receipt["deliver_at"], "{route}");
    let table = stdout(&d.cli(&["status"]));
    assert!(
        table.contains("DELAYED") && table.contains("2 (next in"),
        "{table}"
    );

    // Delayed messages count toward the mark: two delayed fill `limited`.
    for id in ["l1", "l2"] {
        let response = d
            .http
            .post(d.url("/v1/topics/limited/messages"))
            .header("idempotency-key", id)
            .header("sluice-deliver-at", "2099-01-01T00:00:00Z")
            .body("x")
            .send()
            .await
            .expect("POST");
        // 2099 is more than a year away: refused, nothing stored.
        assert_eq!(response.status(), 400);
        let response = d
            .http
            .post(d.url("/v1/topics/limited/messages"))
            .header("idempotency-key", id)
            .header("sluice-delay", "1h")
            .body("x")
            .send()
            .await
            .expect("POST");
        assert_eq!(response.status(), 202);
    }
    let full = d.post("/v1/topics/limited/messages", "x").await;
    assert_eq!(full.status(), 429, "delayed messages count toward the mark");

    // The 2-second one arrives on time, without its header.
    tokio::time::sleep(Duration::from_millis(
        at.saturating_sub(sluice::broker::now_millis()) + 300,
    ))
    .await;
    assert_eq!(d.depth("orders").await, 2);
    let page = d
        .get_json("/v1/topics/orders/messages?from=0&max=10&wait_ms=0")
        .await;
    let later = page["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["id"] == "later-1"))
        .expect("later-1 arrived")
        .clone();
    assert!(
        !later
            .to_string()
            .to_ascii_lowercase()
            .contains("sluice-deliver-at"),
        "{later}"
    );
    d.stop().await;
}

#[test]
fn cli_says_plainly_when_the_daemon_is_not_running() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let admin = format!("127.0.0.1:{port}");
    for args in [
        vec!["status"],
        vec!["publish", "orders", "--data", "x"],
        vec!["tail", "orders"],
        vec!["dlq", "list", "shop/route"],
    ] {
        let out = Command::new(sluice_tests::sluice_bin())
            .args(&args)
            .env("SLUICE_ADMIN", &admin)
            .output()
            .expect("run sluice");
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(
            stderr(&out),
            format!(
                "error: cannot reach the sluice daemon at http://{admin} (is `sluice run` running? set --admin or SLUICE_ADMIN)\n"
            ),
            "{args:?}"
        );
    }
}
