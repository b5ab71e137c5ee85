//! The Kafka connector over TLS and SASL, against Apache Kafka's own
//! listeners (`sluice_harness::kafka::KafkaServer::start_secure`):
//!
//! - SSL with client certificates (mutual TLS);
//! - SASL_SSL with SCRAM-SHA-512;
//! - SASL_PLAINTEXT with PLAIN;
//!
//! each a round trip in which every message arrives. A broker whose
//! certificate is not trusted, a wrong password, and a topic the user has
//! no ACL for are each held (nothing dead-lettered) and said in the log
//! and readiness, and no password ever shows. The broker runs KRaft's
//! `StandardAuthorizer`; the test's own client sets topics and ACLs up
//! through the plaintext listener, as a super user.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::Value;
use sluice_harness::kafka::{KafkaServer, Listener, Secure};
use sluice_tests::edges::{
    Delivered, Duplicates, Upstream, check_exact_set, edge_pipeline, round_trip_over_tls,
    wait_for_deliveries,
};
use sluice_tests::{Daemon, Msg, write_pipeline};

const LONG: Duration = Duration::from_secs(180);

/// The user the ACLs allow, and a password only the broker and this
/// test know.
const USER: &str = "alice";
const PASSWORD: &str = "alice-s3cret-Pw";
/// A wrong password: it must never show anywhere.
const WRONG: &str = "not-alices-Pw-9931";

/// Runs the outside client with `args`; its JSON answer.
fn client(args: &[&str]) -> Value {
    sluice_tests::kafka_client(args)
}

/// A CA, the broker's certificate (for `127.0.0.1`) and a client
/// certificate (`CN=sluice-client`, a super user on the broker), each
/// signed by the CA; the client's files written for the daemon.
struct Pki {
    secure: Secure,
    ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    _dir: tempfile::TempDir,
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().expect("a CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name = rcgen::DistinguishedName::new();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "sluice test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("the CA certificate");
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().expect("a server key");
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("server params")
        .signed_by(&server_key, &issuer)
        .expect("the server certificate");
    let client_key = KeyPair::generate().expect("a client key");
    let mut client_params = CertificateParams::new(Vec::<String>::new()).expect("client params");
    client_params.distinguished_name = rcgen::DistinguishedName::new();
    client_params
        .distinguished_name
        .push(DnType::CommonName, "sluice-client");
    let client = client_params
        .signed_by(&client_key, &issuer)
        .expect("the client certificate");
    let dir = tempfile::tempdir().expect("dir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    };
    let ca = write("ca.pem", &ca_cert.pem());
    let client_cert = write("client.pem", &client.pem());
    let client_key_file = write("client.key", &client_key.serialize_pem());
    Pki {
        secure: Secure {
            cert_pem: server.pem(),
            key_pem: server_key.serialize_pem(),
            client_ca_pem: ca_cert.pem(),
            users: vec![(USER.to_owned(), PASSWORD.to_owned())],
        },
        ca,
        client_cert,
        client_key: client_key_file,
        _dir: dir,
    }
}

/// A secure broker with topics `in` and `out` (2 partitions each) that
/// `alice` may read and write, and group `sluice` she may join.
struct SecureKafka {
    server: KafkaServer,
    pki: Pki,
    /// The plaintext listener, for the test's own client.
    admin: String,
}

impl SecureKafka {
    fn start() -> SecureKafka {
        let pki = pki();
        let server = KafkaServer::start_secure(&pki.secure)
            .unwrap_or_else(|e| panic!("starting Kafka: {e:#}"));
        let admin = server.brokers();
        for topic in ["in", "out"] {
            client(&["create", &admin, topic, "2"]);
        }
        let principal = format!("User:{USER}");
        client(&[
            "allow", &admin, &principal, "topic", "in", "READ", "DESCRIBE",
        ]);
        client(&[
            "allow", &admin, &principal, "topic", "out", "WRITE", "DESCRIBE",
        ]);
        client(&["allow", &admin, &principal, "group", "sluice", "READ"]);
        SecureKafka { server, pki, admin }
    }

    fn address(&self, listener: Listener) -> String {
        self.server.listener(listener).expect("the listener")
    }

    /// The connection lines of a block on `listener`, as `password`.
    fn connection(&self, listener: Listener, password: &str, trusted: bool) -> String {
        let ca = if trusted {
            format!("tls_ca: {}\n", self.pki.ca.display())
        } else {
            String::new()
        };
        let brokers = self.address(listener);
        match listener {
            Listener::Plaintext => format!("brokers: \"{brokers}\"\n"),
            Listener::Ssl => format!(
                "brokers: \"{brokers}\"\nsecurity: ssl\n{ca}tls_cert: {}\ntls_key: {}\n",
                self.pki.client_cert.display(),
                self.pki.client_key.display()
            ),
            Listener::SaslSsl => format!(
                "brokers: \"{brokers}\"\nsecurity: sasl_ssl\n{ca}\
                 sasl: {{mechanism: SCRAM-SHA-512, username: {USER}, password: \"{password}\"}}\n"
            ),
            Listener::SaslPlaintext => format!(
                "brokers: \"{brokers}\"\nsecurity: sasl_plaintext\n\
                 sasl: {{mechanism: PLAIN, username: {USER}, password: \"{password}\"}}\n"
            ),
        }
    }
}

/// The edge suite's upstream over one secure listener.
struct Over {
    kafka: SecureKafka,
    listener: Listener,
}

impl Upstream for Over {
    fn source_block(&self) -> String {
        format!(
            "kafka:\n{}  topic: in\n  group: sluice\n  start: earliest\n",
            sluice_tests::edges::indent(&self.kafka.connection(self.listener, PASSWORD, true), 2)
        )
    }

    fn sink_block(&self) -> String {
        format!(
            "batch: {{max: 100, wait: 20ms}}\nkafka:\n{}  topic: out\n",
            sluice_tests::edges::indent(&self.kafka.connection(self.listener, PASSWORD, true), 2)
        )
    }

    fn produce(&mut self, from: usize, n: usize) {
        client(&[
            "produce",
            &self.kafka.admin,
            "in",
            &from.to_string(),
            &n.to_string(),
        ]);
    }

    fn delivered(&mut self) -> Vec<Delivered> {
        client(&["dump", &self.kafka.admin, "out"])
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| Delivered {
                payload: m["payload"].as_str().unwrap_or_default().to_owned(),
                sluice_id: m["headers"]["sluice-id"].as_str().map(str::to_owned),
            })
            .collect()
    }

    fn restart(&mut self) {
        self.kafka.server.restart().expect("Kafka restarts");
    }

    fn log(&self) -> String {
        self.kafka.server.log()
    }
}

/// A sink on topic `copy` that cannot get through, as the TLS suite's
/// held sink: its block, with a short delivery timeout.
fn held_sink(kafka: &SecureKafka, listener: Listener, password: &str, trusted: bool) -> String {
    format!(
        "kafka:\n{}  topic: out\n  delivery_timeout: 3s\n",
        sluice_tests::edges::indent(&kafka.connection(listener, password, trusted), 2)
    )
}

#[test]
fn tls_with_client_certificates_moves_every_message_and_an_untrusted_broker_is_held_and_said() {
    let kafka = SecureKafka::start();
    let untrusted = held_sink(&kafka, Listener::Ssl, PASSWORD, false);
    let mut up = Over {
        kafka,
        listener: Listener::Ssl,
    };
    round_trip_over_tls(&mut up, 2_000, Duplicates::SameId, &untrusted);
}

#[test]
fn sasl_ssl_with_scram_moves_every_message_and_an_untrusted_broker_is_held_and_said() {
    let kafka = SecureKafka::start();
    let untrusted = held_sink(&kafka, Listener::SaslSsl, PASSWORD, false);
    let mut up = Over {
        kafka,
        listener: Listener::SaslSsl,
    };
    round_trip_over_tls(&mut up, 2_000, Duplicates::SameId, &untrusted);
}

#[test]
fn sasl_plaintext_with_plain_moves_every_message() {
    let mut up = Over {
        kafka: SecureKafka::start(),
        listener: Listener::SaslPlaintext,
    };
    let n = 2_000;
    up.produce(0, n);
    let dir = tempfile::tempdir().expect("dir");
    let file = edge_pipeline(dir.path(), &up.source_block(), &up.sink_block());
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    wait_for_deliveries(&daemon, &mut up, n, "over SASL_PLAINTEXT");
    let got = up.delivered();
    check_exact_set(&got, n, Duplicates::SameId, &|| daemon.log());
    assert!(
        !daemon.log().contains(PASSWORD),
        "the password shows in the log"
    );
}

/// Everything a daemon shows about itself: readiness, status, sources,
/// `sluice status`, and its log.
fn everything_shown(daemon: &Daemon) -> String {
    let cli = daemon.cli(&["status"], &[]);
    format!(
        "{}\n{}\n{}\n{}\n{}",
        daemon.get("/health/ready"),
        daemon.get("/v1/status"),
        daemon.get("/v1/sources"),
        String::from_utf8_lossy(&cli.stdout),
        daemon.log()
    )
}

/// A pipeline `kx` with a source `src` (block `source`) and a sink
/// `out` on topic `in` (block `sink`).
fn pipeline(dir: &Path, source: &str, sink: &str) -> PathBuf {
    let yaml = format!(
        "name: kx\ntopics: [in]\nsources:\n  - name: src\n    to: in\n{}\
         sinks:\n  - name: out\n    subscribe: in\n    retry: {{max_attempts: 2}}\n{}",
        sluice_tests::edges::indent(source, 4),
        sluice_tests::edges::indent(sink, 4)
    );
    write_pipeline(dir, "kx", &yaml)
}

/// Waits until readiness says both `kx/src` and `kx/out` are down with
/// `reason`; then checks nothing was dead-lettered and that `secret`
/// shows nowhere.
fn held_and_said(daemon: &Daemon, reason: &str, secret: &str) {
    daemon.publish("in", &[Msg::new("held-1", "waits")]);
    daemon.wait_until(&format!("readiness says `{reason}`"), LONG, |d| {
        let (status, reasons) = d.readiness();
        status == "degraded"
            && reasons.matches(reason).count() >= 2
            && reasons.contains("kx/src")
            && reasons.contains("kx/out")
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(daemon.depth("kx.out.dlq"), 0, "held, not dead-lettered");
    let shown = everything_shown(daemon);
    assert!(
        daemon.log().contains(reason),
        "the log says `{reason}`:\n{}",
        daemon.log()
    );
    assert!(!shown.contains(secret), "`{secret}` shows:\n{shown}");
}

#[test]
fn a_wrong_password_is_held_and_said_without_the_password() {
    let kafka = SecureKafka::start();
    let dir = tempfile::tempdir().expect("dir");
    // SCRAM over TLS for the source, PLAIN for the sink: both refused.
    let source = format!(
        "kafka:\n{}  topic: in\n  group: sluice\n",
        sluice_tests::edges::indent(&kafka.connection(Listener::SaslSsl, WRONG, true), 2)
    );
    let sink = format!(
        "kafka:\n{}  topic: out\n  delivery_timeout: 3s\n",
        sluice_tests::edges::indent(&kafka.connection(Listener::SaslPlaintext, WRONG, true), 2)
    );
    let file = pipeline(dir.path(), &source, &sink);
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    held_and_said(
        &daemon,
        "SASL authentication failed for user `alice`",
        WRONG,
    );
}

#[test]
fn a_topic_the_user_may_not_read_or_write_is_said_not_a_silent_stall() {
    let kafka = SecureKafka::start();
    // Topics that exist, with no ACL for alice.
    for topic in ["secret-in", "secret-out"] {
        client(&["create", &kafka.admin, topic, "1"]);
    }
    client(&["produce", &kafka.admin, "secret-in", "0", "3"]);
    let dir = tempfile::tempdir().expect("dir");
    let source = format!(
        "kafka:\n{}  topic: secret-in\n  group: sluice\n  start: earliest\n",
        sluice_tests::edges::indent(&kafka.connection(Listener::SaslSsl, PASSWORD, true), 2)
    );
    let sink = format!(
        "kafka:\n{}  topic: secret-out\n  delivery_timeout: 3s\n",
        sluice_tests::edges::indent(
            &kafka.connection(Listener::SaslPlaintext, PASSWORD, true),
            2
        )
    );
    let file = pipeline(dir.path(), &source, &sink);
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    held_and_said(&daemon, "is not authorized for the topic", PASSWORD);
    let log = daemon.log();
    assert!(
        log.contains("Read and Describe") && log.contains("Write and Describe"),
        "the log says which ACL to grant:\n{log}"
    );
    // Nothing of the forbidden topic was read.
    assert_eq!(daemon.depth("in"), 1, "only the message published here");
}
