//! The Postgres connector end to end: the real `sluice` binary, a real
//! Postgres (initdb'd by the test on a free port) and, where two daemons
//! share the work, a real nats-server. The outbox source under concurrent
//! producers with rollbacks, the table sink exactly once across a kill -9,
//! batches as multi-row inserts, the user's own statement, poison rows
//! dead-lettered with the server's message, a Postgres restart mid-run,
//! and the password never shown.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_harness::postgres::PostgresServer;
use sluice_tests::{Backend, Daemon, Msg, header, write_pipeline};

fn pg() -> PostgresServer {
    PostgresServer::start().unwrap_or_else(|e| panic!("starting postgres: {e:#}"))
}

fn count(server: &PostgresServer, sql: &str) -> u64 {
    server
        .psql(sql)
        .unwrap_or_else(|e| panic!("{e:#}"))
        .parse()
        .unwrap_or_else(|e| panic!("`{sql}` is not a count: {e}"))
}

/// Polls `done` until it holds; panics with `context()` after `limit`.
fn wait_for(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < limit,
            "timed out waiting for {what}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A table exists (the daemon created it).
fn has_table(server: &PostgresServer, table: &str) -> bool {
    server
        .psql(&format!("SELECT to_regclass('{table}') IS NOT NULL"))
        .is_ok_and(|t| t == "t")
}

/// Runs `producers` concurrent producers, each inserting `per_producer`
/// rows into `outbox` in transactions of `rows_per_tx`, rolling back
/// every 7th transaction. Returns the payloads of committed rows.
fn produce(
    url: &str,
    producers: usize,
    per_producer: usize,
    rows_per_tx: usize,
) -> BTreeSet<String> {
    let threads: Vec<_> = (0..producers)
        .map(|p| {
            let url = url.to_owned();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let (mut client, connection) =
                        tokio_postgres::connect(&url, tokio_postgres::NoTls)
                            .await
                            .expect("producer connects");
                    tokio::spawn(connection);
                    let mut committed = Vec::new();
                    for t in 0..per_producer / rows_per_tx {
                        let tx = client.transaction().await.expect("begin");
                        let mut rows = Vec::new();
                        for r in 0..rows_per_tx {
                            let payload = format!("p{p}-t{t}-r{r}");
                            let headers = json!({"producer": format!("p{p}"), "tx": t});
                            tx.execute(
                                "INSERT INTO outbox (payload, key, headers) VALUES ($1, $2, $3)",
                                &[&payload.as_bytes(), &format!("p{p}"), &headers],
                            )
                            .await
                            .expect("insert");
                            rows.push(payload);
                        }
                        if t % 7 == 6 {
                            tx.rollback().await.expect("rollback");
                        } else {
                            tx.commit().await.expect("commit");
                            committed.extend(rows);
                        }
                    }
                    committed
                })
            })
        })
        .collect();
    let mut all = BTreeSet::new();
    for t in threads {
        all.extend(t.join().expect("producer"));
    }
    all
}

/// The text payloads of a table's rows.
fn payloads(server: &PostgresServer, table: &str) -> Vec<String> {
    let out = server
        .psql(&format!(
            "SELECT convert_from(payload, 'UTF8') FROM {table}"
        ))
        .expect("payloads");
    out.lines().map(str::to_owned).collect()
}

fn outbox_pipeline(url: &str) -> String {
    format!(
        r#"
name: outbox
topics:
  - orders
sources:
  - name: from-outbox
    to: orders
    postgres:
      url: "{url}"
      outbox: outbox
      batch: 200
      poll: 200ms
sinks:
  - name: to-table
    subscribe: orders
    concurrency: 4
    batch: {{max: 100, wait: 20ms}}
    postgres:
      url: "{url}"
      table: received
"#
    )
}

/// Issue 13, "must show 2": four producers, every 7th transaction rolled
/// back, two daemons on NATS sharing the outbox: every committed row
/// exactly once downstream, no rolled-back row, the outbox empty.
#[test]
fn outbox_two_daemons_on_nats_every_committed_row_once() {
    let backend = Backend::nats();
    let server = pg();
    let dir = tempfile::tempdir().expect("dir");
    let file = write_pipeline(dir.path(), "outbox", &outbox_pipeline(&server.url()));
    let a = Daemon::start_on(&backend, &[&file], &dir.path().join("a"));
    let b = Daemon::start_on(&backend, &[&file], &dir.path().join("b"));
    wait_for(
        "the outbox table",
        Duration::from_secs(60),
        || has_table(&server, "outbox"),
        || a.log(),
    );
    let committed = produce(&server.url(), 4, 2500, 10);
    // 1000 transactions, 35 of each producer's 250 rolled back.
    assert_eq!(committed.len(), 10_000 - 4 * 35 * 10);
    let expected = committed.len() as u64;
    let context = || format!("daemon a:\n{}\ndaemon b:\n{}", a.log(), b.log());
    wait_for(
        "every committed row in `received`",
        Duration::from_secs(600),
        || {
            has_table(&server, "received")
                && count(&server, "SELECT count(*) FROM received") >= expected
        },
        context,
    );
    wait_for(
        "the outbox to be empty",
        Duration::from_secs(60),
        || count(&server, "SELECT count(*) FROM outbox") == 0,
        context,
    );
    let got = payloads(&server, "received");
    let distinct: BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(got.len(), distinct.len(), "a row arrived twice");
    assert_eq!(
        distinct, committed,
        "downstream differs from the committed rows"
    );
    // Both daemons took part, and together read each row once.
    let (ra, rb) = (
        a.metric_sum("sluice_source_messages_total") as u64,
        b.metric_sum("sluice_source_messages_total") as u64,
    );
    assert!(ra > 0 && rb > 0, "one daemon did all the work: {ra} + {rb}");
    assert_eq!(ra + rb, expected, "rows read more than once: {ra} + {rb}");
    // Key and headers came through.
    let row = server
        .psql("SELECT key, headers->>'producer', headers->>'tx' FROM received WHERE convert_from(payload, 'UTF8') = 'p2-t0-r3'")
        .expect("row");
    assert_eq!(row, "p2|p2|0");
}

fn sink_pipeline(url: &str, extra: &str) -> String {
    format!(
        r#"
name: sinks
topics:
  - events
sinks:
  - name: to-table
    subscribe: events
    concurrency: 4
    batch: {{max: 50, wait: 10ms}}
    postgres:
      url: "{url}"
      table: app_events
{extra}"#
    )
}

/// 5,000 messages into a table exactly once, with a kill -9 mid-run
/// (redelivered writes are no-ops), in multi-row inserts.
#[test]
fn table_sink_exactly_once_across_kill9_in_multi_row_inserts() {
    let server = pg();
    // The sink's own table, made beforehand with a trigger that takes 2 ms a
    // row, so the kill lands mid-run however fast the machine: without it
    // the sink once wrote all 5,000 rows between two polls.
    server
        .psql(
            "CREATE TABLE app_events (id text PRIMARY KEY, topic text, key text, headers jsonb, \
             payload bytea, published_at timestamptz); \
             CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_sleep(0.002); RETURN NEW; END $$; \
             CREATE TRIGGER slow BEFORE INSERT ON app_events FOR EACH ROW EXECUTE FUNCTION slow_insert();",
        )
        .expect("create the slow table");
    let dir = tempfile::tempdir().expect("dir");
    let file = write_pipeline(dir.path(), "sinks", &sink_pipeline(&server.url(), ""));
    let mut d = Daemon::start(&[&file], &dir.path().join("data"));
    let n = 5000;
    let messages: Vec<Msg> = (0..n)
        .map(|i| Msg::new(format!("e-{i}"), format!("event {i}")).key(format!("k{}", i % 10)))
        .collect();
    d.publish("events", &messages);
    wait_for(
        "some rows",
        Duration::from_secs(300),
        || {
            has_table(&server, "app_events")
                && count(&server, "SELECT count(*) FROM app_events") >= 500
        },
        || d.log(),
    );
    d.kill9();
    let before = count(&server, "SELECT count(*) FROM app_events");
    assert!(
        before < n,
        "all written before the kill; the test shows nothing"
    );
    d.restart();
    wait_for(
        "every row",
        Duration::from_secs(300),
        || count(&server, "SELECT count(*) FROM app_events") >= n,
        || d.log(),
    );
    let ids = server.psql("SELECT id FROM app_events").expect("ids");
    let ids: Vec<&str> = ids.lines().collect();
    let distinct: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len() as u64, n);
    let want: BTreeSet<String> = (0..n).map(|i| format!("e-{i}")).collect();
    assert_eq!(distinct, want.iter().map(String::as_str).collect());
    let row = server
        .psql("SELECT topic, key, convert_from(payload, 'UTF8'), published_at IS NOT NULL, headers FROM app_events WHERE id = 'e-42'")
        .expect("row");
    assert_eq!(row, "events|k2|event 42|t|{}");
    // Rows that one statement inserted share its transaction id: batches
    // went in as multi-row inserts.
    let biggest = count(
        &server,
        "SELECT max(c) FROM (SELECT count(*) AS c FROM app_events GROUP BY xmin::text) s",
    );
    assert!(biggest > 1, "every row was inserted on its own");
    assert_eq!(d.depth("sinks.to-table.dlq"), 0);
}

/// Publishes NDJSON lines (with headers) through the batch endpoint.
fn publish_lines(d: &Daemon, topic: &str, lines: &[Value]) {
    let body: String = lines.iter().map(|l| l.to_string() + "\n").collect();
    let response = reqwest::blocking::Client::new()
        .post(format!("{}/v1/topics/{topic}/batch", d.base))
        .header("content-type", "application/x-ndjson")
        .body(body)
        .send()
        .expect("publish");
    assert!(
        response.status().is_success(),
        "{}",
        response.text().unwrap_or_default()
    );
}

/// `statement:` into the user's own schema with `$payload_json` and
/// `$header_x`; a payload the jsonb column cannot take is dead-lettered
/// as `rejected` with the server's message, and the rest of its batch is
/// written.
#[test]
fn statement_sink_into_own_schema_and_poison_dead_lettered() {
    let server = pg();
    server
        .psql("CREATE SCHEMA shop; CREATE TABLE shop.orders (order_id text PRIMARY KEY, doc jsonb NOT NULL, trace text, at timestamptz)")
        .expect("schema");
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: stmt
topics:
  - orders
sinks:
  - name: to-shop
    subscribe: orders
    batch: {{max: 20, wait: 50ms}}
    postgres:
      url: "{}"
      statement: |
        -- a comment with $nothing in it
        INSERT INTO shop.orders (order_id, doc, trace, at)
        VALUES ($id, $payload_json, $header_x, $published_at)
        ON CONFLICT (order_id) DO NOTHING
"#,
        server.url()
    );
    let file = write_pipeline(dir.path(), "stmt", &yaml);
    let d = Daemon::start(&[&file], &dir.path().join("data"));
    let mut lines: Vec<Value> = (0..100)
        .map(|i| json!({"id": format!("o-{i}"), "payload": format!("{{\"n\": {i}}}"), "headers": {"x": format!("trace-{i}")}}))
        .collect();
    lines.insert(50, json!({"id": "poison", "payload": "not json {"}));
    publish_lines(&d, "orders", &lines);
    wait_for(
        "100 orders",
        Duration::from_secs(300),
        || count(&server, "SELECT count(*) FROM shop.orders") >= 100,
        || d.log(),
    );
    d.wait_until("the poison in the DLQ", Duration::from_secs(120), |d| {
        d.depth("stmt.to-shop.dlq") >= 1
    });
    let dead = d.read_all("stmt.to-shop.dlq");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(header(&dead[0], "sluice-dlq-kind"), Some("rejected"));
    assert_eq!(header(&dead[0], "sluice-dlq-original-id"), Some("poison"));
    let error = header(&dead[0], "sluice-dlq-error").unwrap_or_default();
    assert!(
        error.contains("invalid input syntax for type json") && error.contains("22P02"),
        "not the server's message: {error}"
    );
    assert_eq!(count(&server, "SELECT count(*) FROM shop.orders"), 100);
    let row = server
        .psql("SELECT doc->>'n', trace, at IS NOT NULL FROM shop.orders WHERE order_id = 'o-7'")
        .expect("row");
    assert_eq!(row, "7|trace-7|t");
}

/// Postgres restarted mid-run under both connectors: nothing lost, no
/// duplicates, and readiness shows them degraded meanwhile.
#[test]
fn postgres_restart_mid_run_loses_nothing() {
    let mut server = pg();
    let dir = tempfile::tempdir().expect("dir");
    let file = write_pipeline(dir.path(), "outbox", &outbox_pipeline(&server.url()));
    let d = Daemon::start(&[&file], &dir.path().join("data"));
    wait_for(
        "the outbox table",
        Duration::from_secs(60),
        || has_table(&server, "outbox"),
        || d.log(),
    );
    let insert = |server: &PostgresServer, from: usize, to: usize| {
        server
            .psql(&format!(
                "INSERT INTO outbox (payload) SELECT convert_to('row-' || g, 'UTF8') FROM generate_series({from}, {to}) g"
            ))
            .expect("insert");
    };
    for chunk in 0..10 {
        insert(&server, chunk * 200, chunk * 200 + 199);
    }
    wait_for(
        "some rows downstream",
        Duration::from_secs(300),
        || has_table(&server, "received") && count(&server, "SELECT count(*) FROM received") >= 200,
        || d.log(),
    );
    server.stop();
    d.wait_until(
        "readiness to show the outage",
        Duration::from_secs(60),
        |d| {
            let ready = d.get("/health/ready");
            ready["status"] == "degraded" && ready.to_string().contains("outbox/")
        },
    );
    server.start_again().expect("postgres starts again");
    for chunk in 10..15 {
        insert(&server, chunk * 200, chunk * 200 + 199);
    }
    let n = 3000;
    wait_for(
        "every row downstream",
        Duration::from_secs(300),
        || count(&server, "SELECT count(*) FROM received") >= n,
        || d.log(),
    );
    wait_for(
        "the outbox to be empty",
        Duration::from_secs(60),
        || count(&server, "SELECT count(*) FROM outbox") == 0,
        || d.log(),
    );
    let got = payloads(&server, "received");
    let distinct: BTreeSet<&String> = got.iter().collect();
    assert_eq!(got.len(), n as usize);
    assert_eq!(distinct.len(), n as usize, "duplicates downstream");
    d.wait_until("readiness to recover", Duration::from_secs(60), |d| {
        d.get("/health/ready")["status"] == "ready"
    });
    assert_eq!(d.depth("outbox.to-table.dlq"), 0);
}

/// The password never reaches the log, readiness or status: with the
/// server down, and with a wrong password.
#[test]
fn password_never_shown() {
    let mut server = pg();
    let wrong = server.url().replace(server.password(), "Wr0ngPassw0rd-zz");
    let dir = tempfile::tempdir().expect("dir");
    let extra = format!(
        r#"  - name: wrong-password
    subscribe: events
    postgres:
      url: "{wrong}"
      table: other
"#
    );
    let mut yaml = sink_pipeline(&server.url(), &extra);
    yaml.push_str(&format!(
        r#"sources:
  - name: from-outbox
    to: events
    postgres:
      url: "{}"
      outbox: outbox
"#,
        server.url()
    ));
    let file = write_pipeline(dir.path(), "sinks", &yaml);
    let d = Daemon::start(&[&file], &dir.path().join("data"));
    d.publish("events", &[Msg::new("m1", "one")]);
    d.wait_until("the wrong password refused", Duration::from_secs(60), |d| {
        d.get("/health/ready")
            .to_string()
            .contains("wrong-password")
    });
    wait_for(
        "m1 written",
        Duration::from_secs(60),
        || {
            has_table(&server, "app_events")
                && count(&server, "SELECT count(*) FROM app_events") == 1
        },
        || d.log(),
    );
    server.stop();
    d.publish("events", &[Msg::new("m2", "two")]);
    d.wait_until("both connectors down", Duration::from_secs(60), |d| {
        let ready = d.get("/health/ready").to_string();
        ready.contains("sinks/to-table") && ready.contains("sinks/from-outbox")
    });
    let ready = d.get("/health/ready").to_string();
    let status = d.get("/v1/status").to_string();
    let log = d.log();
    for (what, text) in [("readiness", &ready), ("status", &status), ("log", &log)] {
        assert!(
            !text.contains(server.password()),
            "{what} shows the password:\n{text}"
        );
        assert!(
            !text.contains("Wr0ngPassw0rd"),
            "{what} shows the wrong password:\n{text}"
        );
    }
    assert!(
        log.contains("***") || ready.contains("***"),
        "the URL is never shown redacted:\n{ready}\n{log}"
    );
}

/// `create: false` runs no DDL (the source waits, degraded, until the
/// table exists; no trigger, so it polls); a row whose `headers` is not a
/// JSON object is dead-lettered with the reason and leaves the outbox.
#[test]
fn outbox_without_create_and_a_bad_headers_row() {
    let server = pg();
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: manual
topics:
  - orders
sources:
  - name: from-outbox
    to: orders
    postgres:
      url: "{url}"
      outbox: app.outbox
      create: false
      poll: 100ms
sinks:
  - name: to-table
    subscribe: orders
    postgres:
      url: "{url}"
      table: received
"#,
        url = server.url()
    );
    let file = write_pipeline(dir.path(), "manual", &yaml);
    let d = Daemon::start(&[&file], &dir.path().join("data"));
    d.wait_until("the missing table reported", Duration::from_secs(60), |d| {
        let ready = d.get("/health/ready").to_string();
        ready.contains("manual/from-outbox") && ready.contains("does not exist")
    });
    assert!(!has_table(&server, "app.outbox"), "create: false ran DDL");
    server
        .psql(
            "CREATE SCHEMA app; CREATE TABLE app.outbox (id bigserial PRIMARY KEY, payload bytea NOT NULL, \
             key text, headers jsonb, created_at timestamptz NOT NULL DEFAULT now()); \
             INSERT INTO app.outbox (payload, headers) VALUES ('good', '{\"a\": \"b\"}'), ('bad', '[1, 2]'), ('null', NULL)",
        )
        .expect("outbox");
    wait_for(
        "two rows downstream",
        Duration::from_secs(120),
        || has_table(&server, "received") && count(&server, "SELECT count(*) FROM received") >= 2,
        || d.log(),
    );
    wait_for(
        "the outbox to be empty",
        Duration::from_secs(60),
        || count(&server, "SELECT count(*) FROM app.outbox") == 0,
        || d.log(),
    );
    let mut got = payloads(&server, "received");
    got.sort();
    assert_eq!(got, ["good", "null"]);
    assert_eq!(
        server
            .psql("SELECT headers->>'a' FROM received WHERE id = 'from-outbox:1'")
            .expect("row"),
        "b"
    );
    assert_eq!(
        count(
            &server,
            "SELECT count(*) FROM pg_proc WHERE proname = 'outbox_sluice_notify'"
        ),
        0,
        "create: false made a trigger function"
    );
    let dead = d.read_all("manual.from-outbox.dlq");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(header(&dead[0], "sluice-dlq-kind"), Some("rejected"));
    let error = header(&dead[0], "sluice-dlq-error").unwrap_or_default();
    assert!(error.contains("must be a JSON object"), "{error}");
}

/// SQLSTATE classes decide the outcome: a serialization failure (40001)
/// is retried until it succeeds, a check constraint (23514) is rejected
/// at once with the server's message, and neither blocks the others.
#[test]
fn sqlstate_decides_retry_or_reject() {
    let server = pg();
    server
        .psql(
            "CREATE SEQUENCE tries; \
             CREATE TABLE notes (id text PRIMARY KEY, body text CHECK (length(body) < 10)); \
             CREATE FUNCTION write_note(i text, b text) RETURNS void LANGUAGE plpgsql AS $$ \
             BEGIN \
               IF i = 'flaky' AND nextval('tries') < 3 THEN \
                 RAISE EXCEPTION 'could not serialize, try again' USING ERRCODE = '40001'; \
               END IF; \
               INSERT INTO notes VALUES (i, b) ON CONFLICT (id) DO NOTHING; \
             END $$",
        )
        .expect("schema");
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: classes
topics:
  - notes
sinks:
  - name: to-notes
    subscribe: notes
    retry: {{max_attempts: 5, backoff: {{initial: 10ms, max: 50ms}}}}
    postgres:
      url: "{}"
      statement: SELECT write_note($id, $payload_text)
"#,
        server.url()
    );
    let file = write_pipeline(dir.path(), "classes", &yaml);
    let d = Daemon::start(&[&file], &dir.path().join("data"));
    d.publish(
        "notes",
        &[
            Msg::new("flaky", "short"),
            Msg::new("too-long", "far too long for the check"),
            Msg::new("fine", "ok"),
        ],
    );
    wait_for(
        "flaky and fine written",
        Duration::from_secs(120),
        || count(&server, "SELECT count(*) FROM notes") >= 2,
        || d.log(),
    );
    d.wait_until("the rejected note", Duration::from_secs(60), |d| {
        d.depth("classes.to-notes.dlq") >= 1
    });
    let mut ids: Vec<String> = server
        .psql("SELECT id FROM notes")
        .expect("ids")
        .lines()
        .map(str::to_owned)
        .collect();
    ids.sort();
    assert_eq!(ids, ["fine", "flaky"]);
    assert!(
        count(&server, "SELECT last_value FROM tries") >= 3,
        "flaky was not retried"
    );
    let dead = d.read_all("classes.to-notes.dlq");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(header(&dead[0], "sluice-dlq-original-id"), Some("too-long"));
    assert_eq!(header(&dead[0], "sluice-dlq-kind"), Some("rejected"));
    assert_eq!(header(&dead[0], "sluice-dlq-attempts"), Some("1"));
    let error = header(&dead[0], "sluice-dlq-error").unwrap_or_default();
    assert!(
        error.contains("23514") && error.contains("notes_body_check"),
        "{error}"
    );
}

/// kill -9 of the daemon while it drains the outbox: the open read's
/// transaction dies with its connection, the rows are read again after
/// the restart, and each arrives once.
#[test]
fn outbox_kill9_mid_run_each_row_once() {
    let server = pg();
    let dir = tempfile::tempdir().expect("dir");
    let file = write_pipeline(dir.path(), "outbox", &outbox_pipeline(&server.url()));
    let mut d = Daemon::start(&[&file], &dir.path().join("data"));
    wait_for(
        "the outbox table",
        Duration::from_secs(60),
        || has_table(&server, "outbox"),
        || d.log(),
    );
    let n: u64 = 20_000;
    server
        .psql(&format!(
            "INSERT INTO outbox (payload) SELECT convert_to('row-' || g, 'UTF8') FROM generate_series(1, {n}) g"
        ))
        .expect("insert");
    wait_for(
        "some rows downstream",
        Duration::from_secs(300),
        || {
            has_table(&server, "received")
                && count(&server, "SELECT count(*) FROM received") >= 1000
        },
        || d.log(),
    );
    d.kill9();
    let left = count(&server, "SELECT count(*) FROM outbox");
    assert!(
        left > 0,
        "the outbox was drained before the kill; the test shows nothing"
    );
    d.restart();
    wait_for(
        "every row downstream",
        Duration::from_secs(300),
        || count(&server, "SELECT count(*) FROM received") >= n,
        || d.log(),
    );
    wait_for(
        "the outbox to be empty",
        Duration::from_secs(60),
        || count(&server, "SELECT count(*) FROM outbox") == 0,
        || d.log(),
    );
    assert_eq!(
        count(&server, "SELECT count(DISTINCT payload) FROM received"),
        n,
        "a row arrived under two ids, or was lost"
    );
    assert_eq!(count(&server, "SELECT count(*) FROM received"), n);
    // The restart found the trigger there and left it alone.
    assert_eq!(
        count(
            &server,
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'outbox'::regclass AND NOT tgisinternal"
        ),
        1
    );
}

/// `LISTEN/NOTIFY` wakes a waiting read: with `poll: 1h` and a read
/// waiting an hour, an insert is read well within the test's limit, and
/// acked rows leave the table.
#[test]
fn a_notification_wakes_the_outbox_read() {
    use sluice::connect::{Context, Health, SourceConfig};
    let server = pg();
    let yaml = format!("url: \"{}\"\noutbox: woken\npoll: 1h\n", server.url());
    let config: sluice::connect::postgres::OutboxConfig =
        serde_saphyr::from_str(&yaml).expect("config");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let ctx = Context {
            pipeline: "p".into(),
            name: "woken".into(),
            metrics: std::sync::Arc::new(sluice::metrics::Metrics::new()),
            health: std::sync::Arc::new(Health::default()),
            data_dir: None,
        };
        let mut source = config.build(&ctx).await.expect("build");
        // Connects, creates the table and trigger, and listens.
        let first = source.read(10, Duration::ZERO).await.expect("first read");
        assert!(first.is_empty());
        let url = server.url();
        let producer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("producer connects");
            tokio::spawn(connection);
            client
                .execute(
                    "INSERT INTO woken (payload, headers) VALUES ('hello', '{\"h\": \"v\"}')",
                    &[],
                )
                .await
                .expect("insert");
        });
        let read = tokio::time::timeout(
            Duration::from_secs(120),
            source.read(10, Duration::from_secs(3600)),
        )
        .await
        .expect("no wake-up within 120 s: NOTIFY did not reach the reader")
        .expect("read");
        producer.await.expect("producer");
        assert_eq!(read.len(), 1);
        assert_eq!(&read[0].payload[..], b"hello");
        assert_eq!(read[0].headers, vec![("h".to_owned(), "v".to_owned())]);
        assert_eq!(source.lag().await, Some(1));
        source.ack().await.expect("ack");
    });
    assert_eq!(count(&server, "SELECT count(*) FROM woken"), 0);
}

/// Rows published whose delete never committed (the server ended the
/// read's session between the publish and the commit) come back once
/// their locks go, possibly long after the topic's duplicate window: the
/// source remembers them, and deletes them then without handing them out
/// again. A table name past 49 characters (whose trigger name Postgres
/// would cut) works too.
#[test]
fn rows_published_before_a_lost_commit_are_not_read_twice() {
    use sluice::connect::{Context, Health, SourceConfig};
    let server = pg();
    let table = format!("outbox_{}", "x".repeat(50));
    let yaml = format!("url: \"{}\"\noutbox: {table}\npoll: 100ms\n", server.url());
    let config: sluice::connect::postgres::OutboxConfig =
        serde_saphyr::from_str(&yaml).expect("config");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let ctx = Context {
            pipeline: "p".into(),
            name: "src".into(),
            metrics: std::sync::Arc::new(sluice::metrics::Metrics::new()),
            health: std::sync::Arc::new(Health::default()),
            data_dir: None,
        };
        let mut source = config.build(&ctx).await.expect("build");
        assert!(source.read(10, Duration::ZERO).await.expect("first read").is_empty());
        server
            .psql(&format!(
                "INSERT INTO {table} (payload) SELECT convert_to('row-' || g, 'UTF8') FROM generate_series(1, 5) g"
            ))
            .expect("insert");
        // The insert's notification (or the next poll) brings them.
        let read = source.read(10, Duration::from_secs(10)).await.expect("read");
        assert_eq!(read.len(), 5);
        // Published (as far as the source knows); now the server ends the
        // session before the commit.
        server
            .psql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE state = 'idle in transaction' AND pid <> pg_backend_pid()",
            )
            .expect("terminate");
        assert!(source.ack().await.is_err(), "the commit cannot have succeeded");
        // The rows are back in the table, unlocked; the next reads find
        // them, and delete them rather than return them.
        let started = Instant::now();
        loop {
            // An error is the source reconnecting.
            if let Ok(again) = source.read(10, Duration::ZERO).await {
                assert!(again.is_empty(), "read twice: {:?}", again.len());
                if count(&server, &format!("SELECT count(*) FROM {table}")) == 0 {
                    break;
                }
            }
            assert!(started.elapsed() < Duration::from_secs(60), "rows left behind");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // The trigger made for the long name is there, under a name that fits.
    assert_eq!(
        count(
            &server,
            &format!(
                "SELECT count(*) FROM pg_trigger WHERE tgrelid = '{table}'::regclass AND NOT tgisinternal"
            )
        ),
        1
    );
}

/// A setup the sink cannot write to yet (the statement's table is
/// missing: SQLSTATE 42P01) holds the messages, no attempt spent and
/// nothing dead-lettered, until the table exists; and a trigger that
/// raises for one row of a batch (P0001) rejects that row alone.
#[test]
fn a_missing_table_holds_and_a_trigger_exception_rejects_one_row() {
    let server = pg();
    let dir = tempfile::tempdir().expect("dir");
    let yaml = format!(
        r#"
name: setup
topics:
  - notes
sinks:
  - name: to-notes
    subscribe: notes
    batch: {{max: 10, wait: 200ms}}
    retry: {{max_attempts: 2, backoff: {{initial: 10ms, max: 50ms}}}}
    postgres:
      url: "{}"
      statement: INSERT INTO later (id, body) VALUES ($id, $payload_text) ON CONFLICT (id) DO NOTHING
"#,
        server.url()
    );
    let file = write_pipeline(dir.path(), "setup", &yaml);
    let d = Daemon::start(&[&file], &dir.path().join("data"));
    let messages: Vec<Msg> = (0..6)
        .map(|i| {
            Msg::new(
                format!("n{i}"),
                if i == 3 {
                    "bad".into()
                } else {
                    format!("note {i}")
                },
            )
        })
        .collect();
    d.publish("notes", &messages);
    d.wait_until("the missing table reported", Duration::from_secs(60), |d| {
        let ready = d.get("/health/ready").to_string();
        ready.contains("setup/to-notes") && ready.contains("42P01")
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        d.depth("setup.to-notes.dlq"),
        0,
        "a setup fault dead-lettered messages"
    );
    server
        .psql(
            "CREATE TABLE later (id text PRIMARY KEY, body text); \
             CREATE FUNCTION no_bad() RETURNS trigger LANGUAGE plpgsql AS $$ \
               BEGIN IF NEW.body = 'bad' THEN RAISE EXCEPTION 'bad note'; END IF; RETURN NEW; END $$; \
             CREATE TRIGGER no_bad BEFORE INSERT ON later FOR EACH ROW EXECUTE FUNCTION no_bad()",
        )
        .expect("table");
    wait_for(
        "five notes written",
        Duration::from_secs(120),
        || count(&server, "SELECT count(*) FROM later") >= 5,
        || d.log(),
    );
    d.wait_until("the rejected note", Duration::from_secs(60), |d| {
        d.depth("setup.to-notes.dlq") >= 1
    });
    let dead = d.read_all("setup.to-notes.dlq");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(header(&dead[0], "sluice-dlq-original-id"), Some("n3"));
    assert_eq!(header(&dead[0], "sluice-dlq-kind"), Some("rejected"));
    let error = header(&dead[0], "sluice-dlq-error").unwrap_or_default();
    assert!(
        error.contains("bad note") && error.contains("P0001"),
        "{error}"
    );
    assert_eq!(count(&server, "SELECT count(*) FROM later"), 5);
}

/// A user without CREATE on the schema (Postgres 15's default for
/// `public`) drains an outbox and fills a table made for it, with
/// `create: true` (the default): only what is missing is created. A
/// missing privilege holds messages until the GRANT.
#[test]
fn create_true_needs_no_create_privilege_when_all_exists() {
    let server = pg();
    server
        .psql(
            "CREATE ROLE app LOGIN PASSWORD 'app-pw-123'; \
             REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
             CREATE TABLE outbox (id bigserial PRIMARY KEY, payload bytea NOT NULL, key text, \
               headers jsonb, created_at timestamptz NOT NULL DEFAULT now()); \
             CREATE FUNCTION outbox_sluice_notify() RETURNS trigger LANGUAGE plpgsql AS $$ \
               BEGIN PERFORM pg_notify('sluice_outbox_outbox', ''); RETURN NULL; END $$; \
             CREATE TRIGGER outbox_sluice_notify AFTER INSERT ON outbox \
               FOR EACH STATEMENT EXECUTE FUNCTION outbox_sluice_notify(); \
             CREATE TABLE received (id text PRIMARY KEY, topic text, key text, headers jsonb, \
               payload bytea, published_at timestamptz); \
             GRANT SELECT, UPDATE, DELETE ON outbox TO app; \
             INSERT INTO outbox (payload) SELECT convert_to('row-' || g, 'UTF8') FROM generate_series(1, 500) g",
        )
        .expect("setup");
    let url = format!(
        "postgres://app:app-pw-123@127.0.0.1:{}/postgres",
        server.port()
    );
    let dir = tempfile::tempdir().expect("dir");
    let file = write_pipeline(dir.path(), "outbox", &outbox_pipeline(&url));
    let d = Daemon::start(&[&file], &dir.path().join("data"));
    // No privilege on `received` yet: the sink holds the messages (a
    // GRANT fixes it), it does not dead-letter them.
    d.wait_until(
        "the missing privilege reported",
        Duration::from_secs(60),
        |d| {
            let ready = d.get("/health/ready").to_string();
            ready.contains("outbox/to-table") && ready.contains("permission denied")
        },
    );
    assert_eq!(d.depth("outbox.to-table.dlq"), 0);
    server
        .psql("GRANT SELECT, INSERT ON received TO app")
        .expect("grant");
    wait_for(
        "every row downstream",
        Duration::from_secs(120),
        || count(&server, "SELECT count(*) FROM received") >= 500,
        || d.log(),
    );
    assert_eq!(
        count(&server, "SELECT count(DISTINCT payload) FROM received"),
        500
    );
    wait_for(
        "the outbox to be empty",
        Duration::from_secs(60),
        || count(&server, "SELECT count(*) FROM outbox") == 0,
        || d.log(),
    );
}
