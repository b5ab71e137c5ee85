//! TLS to Redis (`rediss://`) and Postgres (`sslmode=verify-full`), end to
//! end: real servers of the test's own serving TLS with a self-signed
//! certificate, the real `sluice` binary. A connector given the
//! certificate as `tls_ca` moves every message; one without it is held
//! (nothing dead-lettered) and readiness says the certificate is not
//! trusted. A Redis that requires client certificates (mutual TLS) takes
//! the one in `tls_cert`/`tls_key`, and a connector without one is held
//! with a reason that names them. Also the Postgres `statement_timeout`:
//! the server itself cancels a statement that runs too long.

use std::path::Path;
use std::time::Duration;

use sluice_harness::postgres::PostgresServer;
use sluice_harness::redis::RedisServer;
use sluice_tests::{Daemon, Msg, header, write_pipeline};

const LONG: Duration = Duration::from_secs(120);

use sluice_tests::self_signed_certificate as certificate;

/// A client's own self-signed certificate and key (PEM): the servers
/// trust it as the CA of their clients.
fn client_certificate() -> (String, String) {
    let client = rcgen::generate_simple_self_signed(vec!["sluice-client".into()])
        .expect("a client certificate");
    (client.cert.pem(), client.signing_key.serialize_pem())
}

fn write_ca(dir: &Path, pem: &str) {
    std::fs::create_dir_all(dir.join("certs")).expect("mkdir");
    std::fs::write(dir.join("certs/ca.pem"), pem).expect("write ca");
}

/// Over `server`'s TLS port: a source and a sink with the TLS options
/// `good` move `n` entries from `in` to `out`; a sink with `held` on
/// topic `copy` is held (nothing dead-lettered, nothing written) with
/// `reason` in readiness. Returns the daemon's log.
fn redis_moves_all_and_holds_one(
    server: &RedisServer,
    dir: &Path,
    good: &str,
    held: &str,
    reason: &str,
) -> String {
    let tls_url = server.tls_url().expect("a TLS port");
    let pipeline = write_pipeline(
        dir,
        "secure",
        &format!(
            "name: secure\n\
             topics: [in, copy]\n\
             sources:\n\
             \x20 - name: from-redis\n\
             \x20   to: in\n\
             \x20   redis: {{url: '{tls_url}', stream: in, group: g, start: oldest{good}}}\n\
             sinks:\n\
             \x20 - name: to-redis\n\
             \x20   subscribe: in\n\
             \x20   redis: {{url: '{tls_url}', stream: out{good}}}\n\
             \x20 - name: held\n\
             \x20   subscribe: copy\n\
             \x20   retry: {{max_attempts: 2, backoff: {{initial: 100ms, max: 500ms}}}}\n\
             \x20   redis: {{url: '{tls_url}', stream: never{held}}}\n"
        ),
    );
    // Over the plain port, as an outside producer.
    for i in 0..200 {
        let reply = server
            .command(&["XADD", "in", "*", "payload", &format!("m-{i}")])
            .expect("XADD");
        assert!(reply.starts_with('$'), "{reply}");
    }
    let daemon = Daemon::start(&[&pipeline], &dir.join("data"));
    daemon.wait_until("200 entries arrive over TLS", LONG, |_| {
        server.command(&["XLEN", "out"]).is_ok_and(|r| r == ":200")
    });
    daemon.publish(
        "copy",
        &(0..3)
            .map(|i| Msg::new(format!("c{i}"), "x"))
            .collect::<Vec<_>>(),
    );
    daemon.wait_until(&format!("readiness says `{reason}`"), LONG, |d| {
        let (status, reasons) = d.readiness();
        status == "degraded" && reasons.contains("secure/held") && reasons.contains(reason)
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        daemon.depth("secure.held.dlq"),
        0,
        "held, not dead-lettered"
    );
    assert_eq!(server.command(&["EXISTS", "never"]).expect("EXISTS"), ":0");
    daemon.log()
}

#[test]
fn redis_over_tls_moves_every_entry_and_an_untrusted_server_is_held_and_said() {
    let (cert, key) = certificate();
    let server = RedisServer::start_with_tls(&cert, &key)
        .unwrap_or_else(|e| panic!("starting redis-server with TLS: {e:#}"));
    let dir = tempfile::tempdir().expect("tempdir");
    write_ca(dir.path(), &cert);
    let log = redis_moves_all_and_holds_one(
        &server,
        dir.path(),
        ", tls_ca: certs/ca.pem",
        "",
        "not trusted",
    );
    assert!(
        log.contains("not trusted") && log.contains("tls_ca"),
        "the log says why and what to do:\n{log}"
    );
}

#[test]
fn redis_with_client_certificates_takes_tls_cert_and_holds_a_client_without_one() {
    let (cert, key) = certificate();
    let (client_cert, client_key) = client_certificate();
    let server = RedisServer::start_with_client_auth(&cert, &key, &client_cert)
        .unwrap_or_else(|e| panic!("starting redis-server with client auth: {e:#}"));
    let dir = tempfile::tempdir().expect("tempdir");
    write_ca(dir.path(), &cert);
    std::fs::write(dir.path().join("certs/client.pem"), &client_cert).expect("write");
    std::fs::write(dir.path().join("certs/client.key"), &client_key).expect("write");
    let log = redis_moves_all_and_holds_one(
        &server,
        dir.path(),
        ", tls_ca: certs/ca.pem, tls_cert: certs/client.pem, tls_key: certs/client.key",
        ", tls_ca: certs/ca.pem",
        "tls_cert",
    );
    assert!(
        !log.contains("PRIVATE KEY"),
        "the key never reaches the log:\n{log}"
    );
}

#[test]
fn postgres_over_tls_with_verify_full_and_plaintext_is_refused() {
    let (cert, key) = certificate();
    let mut server = PostgresServer::start().unwrap_or_else(|e| panic!("starting postgres: {e:#}"));
    server
        .enable_tls(&cert, &key)
        .unwrap_or_else(|e| panic!("turning TLS on: {e:#}"));
    let url = format!("{}?sslmode=verify-full", server.url());
    let plain = server.url();
    let dir = tempfile::tempdir().expect("tempdir");
    write_ca(dir.path(), &cert);
    let pipeline = write_pipeline(
        dir.path(),
        "pgtls",
        &format!(
            "name: pgtls\n\
             topics: [events, plain, untrusted]\n\
             sources:\n\
             \x20 - name: outbox\n\
             \x20   to: events\n\
             \x20   postgres: {{url: '{url}', outbox: tls_outbox, tls_ca: certs/ca.pem}}\n\
             sinks:\n\
             \x20 - name: to-table\n\
             \x20   subscribe: events\n\
             \x20   postgres: {{url: '{url}', table: tls_rows, tls_ca: certs/ca.pem}}\n\
             \x20 - name: no-tls\n\
             \x20   subscribe: plain\n\
             \x20   postgres: {{url: '{plain}', table: never_plain}}\n\
             \x20 - name: no-ca\n\
             \x20   subscribe: untrusted\n\
             \x20   postgres: {{url: '{url}', table: never_untrusted}}\n"
        ),
    );
    let daemon = Daemon::start(&[&pipeline], &dir.path().join("data"));
    daemon.wait_until("the outbox table is created over TLS", LONG, |_| {
        server
            .psql("SELECT to_regclass('tls_outbox') IS NOT NULL")
            .is_ok_and(|t| t == "t")
    });
    server
        .psql(
            "INSERT INTO tls_outbox (payload, key) \
             SELECT convert_to('row-' || i, 'UTF8'), 'k' FROM generate_series(1, 300) i",
        )
        .expect("insert");
    daemon.wait_until("300 rows arrive over TLS", LONG, |_| {
        server
            .psql("SELECT count(*) FROM tls_rows")
            .is_ok_and(|n| n == "300")
    });
    assert_eq!(
        server
            .psql("SELECT count(*) FROM tls_outbox")
            .expect("count"),
        "0"
    );
    // The server saw TLS connections from the daemon.
    let tls_sessions = server
        .psql("SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE s.ssl AND a.client_addr IS NOT NULL")
        .expect("pg_stat_ssl");
    assert!(
        tls_sessions.parse::<u32>().unwrap_or(0) >= 1,
        "{tls_sessions}"
    );

    daemon.publish("plain", &[Msg::new("p1", "x")]);
    daemon.publish("untrusted", &[Msg::new("u1", "x")]);
    daemon.wait_until("readiness names both held sinks", LONG, |d| {
        let (status, reasons) = d.readiness();
        status == "degraded"
            && reasons.contains("pgtls/no-tls")
            && reasons.contains("pgtls/no-ca")
            && reasons.contains("not trusted")
    });
    assert_eq!(daemon.depth("pgtls.no-tls.dlq"), 0);
    assert_eq!(daemon.depth("pgtls.no-ca.dlq"), 0);
    let (_, reasons) = daemon.readiness();
    assert!(
        !reasons.contains(server.password()),
        "no password in readiness: {reasons}"
    );
}

#[test]
fn postgres_with_client_certificates_takes_tls_cert_and_holds_a_client_without_one() {
    let (cert, key) = certificate();
    let (client_cert, client_key) = client_certificate();
    let mut server = PostgresServer::start().unwrap_or_else(|e| panic!("starting postgres: {e:#}"));
    server
        .enable_tls(&cert, &key)
        .unwrap_or_else(|e| panic!("turning TLS on: {e:#}"));
    server
        .require_client_certs(&client_cert)
        .unwrap_or_else(|e| panic!("requiring client certificates: {e:#}"));
    let url = format!("{}?sslmode=verify-full", server.url());
    let dir = tempfile::tempdir().expect("tempdir");
    write_ca(dir.path(), &cert);
    std::fs::write(dir.path().join("certs/client.pem"), &client_cert).expect("write");
    std::fs::write(dir.path().join("certs/client.key"), &client_key).expect("write");
    let pipeline = write_pipeline(
        dir.path(),
        "pgmutual",
        &format!(
            "name: pgmutual\n\
             topics: [events, anonymous]\n\
             sinks:\n\
             \x20 - name: to-table\n\
             \x20   subscribe: events\n\
             \x20   postgres: {{url: '{url}', table: mutual_rows, tls_ca: certs/ca.pem, tls_cert: certs/client.pem, tls_key: certs/client.key}}\n\
             \x20 - name: no-cert\n\
             \x20   subscribe: anonymous\n\
             \x20   postgres: {{url: '{url}', table: never_anonymous, tls_ca: certs/ca.pem}}\n"
        ),
    );
    let daemon = Daemon::start(&[&pipeline], &dir.path().join("data"));
    daemon.publish(
        "events",
        &(0..50)
            .map(|i| Msg::new(format!("e{i}"), "x"))
            .collect::<Vec<_>>(),
    );
    daemon.publish("anonymous", &[Msg::new("a1", "x")]);
    daemon.wait_until("50 rows arrive over mutual TLS", LONG, |_| {
        server
            .psql("SELECT count(*) FROM mutual_rows")
            .is_ok_and(|n| n == "50")
    });
    daemon.wait_until(
        "readiness says the server wants a client certificate",
        LONG,
        |d| {
            let (status, reasons) = d.readiness();
            status == "degraded"
                && reasons.contains("pgmutual/no-cert")
                && reasons.contains("tls_cert")
        },
    );
    assert_eq!(
        daemon.depth("pgmutual.no-cert.dlq"),
        0,
        "held, not dead-lettered"
    );
    assert_eq!(
        server
            .psql("SELECT to_regclass('never_anonymous') IS NULL")
            .expect("psql"),
        "t"
    );
}

#[test]
fn postgres_statement_timeout_cancels_on_the_server_and_spends_attempts() {
    let server = PostgresServer::start().unwrap_or_else(|e| panic!("starting postgres: {e:#}"));
    server
        .psql("CREATE TABLE slow_rows (id text PRIMARY KEY)")
        .expect("create");
    let dir = tempfile::tempdir().expect("tempdir");
    let pipeline = write_pipeline(
        dir.path(),
        "slow",
        &format!(
            "name: slow\n\
             topics: [in]\n\
             sinks:\n\
             \x20 - name: to-rows\n\
             \x20   subscribe: in\n\
             \x20   retry: {{max_attempts: 2, backoff: {{initial: 100ms, max: 200ms}}}}\n\
             \x20   postgres:\n\
             \x20     url: '{}'\n\
             \x20     statement_timeout: 300ms\n\
             \x20     statement: \"INSERT INTO slow_rows SELECT $id FROM pg_sleep(CASE WHEN $payload_text = 'slow' THEN 30 ELSE 0 END)\"\n",
            server.url()
        ),
    );
    let daemon = Daemon::start(&[&pipeline], &dir.path().join("data"));
    daemon.publish("in", &[Msg::new("fast", "quick"), Msg::new("slow", "slow")]);
    daemon.wait_until("the slow one is dead-lettered", LONG, |d| {
        d.depth("slow.to-rows.dlq") >= 1
    });
    let dead = daemon.read_all("slow.to-rows.dlq");
    assert_eq!(header(&dead[0], "sluice-dlq-original-id"), Some("slow"));
    let error = header(&dead[0], "sluice-dlq-error").unwrap_or_default();
    assert!(error.contains("statement timeout"), "{error}");
    assert_eq!(header(&dead[0], "sluice-dlq-attempts"), Some("2"));
    assert_eq!(
        server
            .psql("SELECT string_agg(id, ',') FROM slow_rows")
            .expect("rows"),
        "fast"
    );
    // Cancelled by the server: no statement of the daemon's still runs.
    assert_eq!(
        server
            .psql("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%pg_sleep%' AND pid <> pg_backend_pid()")
            .expect("activity"),
        "0"
    );
}
