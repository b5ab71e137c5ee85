//! Kafka: a source (a consumer group, offsets committed only once
//! everything up to them is durably in the topic, contiguous per
//! partition, and committed for a revoked partition before it is
//! released) and a sink (the idempotent producer, `acks=all`, each write
//! awaiting its delivery report).
//!
//! Both use rdkafka (librdkafka, built from source): the client the Rust
//! field runs Kafka with, and the one with the group protocol, rebalance
//! callbacks, the idempotent producer and delivery reports done the way
//! the Java client does them. Its TLS is OpenSSL's (librdkafka has no
//! rustls); its errors carry no password (the SASL password is only ever
//! handed to librdkafka), and are scrubbed of it all the same.

mod config;
mod diagnosis;
mod sink;
mod source;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

pub use crate::config::connectors::kafka::{
    Brokers, GroupProtocol, KafkaSinkConfig, KafkaSourceConfig, Sasl, SaslMechanism, Security,
    StartFrom,
};
pub use sink::KafkaSink;
pub use source::KafkaSource;

use crate::config::connectors::kafka::KafkaConnection;
use crate::connect::tls::TlsFiles;

/// The librdkafka settings shared by the consumer and the producer: the
/// brokers, the client id, TLS and SASL. Fails on a TLS file that cannot
/// be read (named in the message).
pub(crate) fn client_config(
    conn: &KafkaConnection,
    tls: TlsFiles<'_>,
) -> Result<ClientConfig, String> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", conn.brokers.joined())
        .set("security.protocol", conn.security.protocol())
        // Errors come back through the calls and the error callback; the
        // library's own log lines go to `tracing` at debug level.
        .set("log_level", "4")
        .set("socket.connection.setup.timeout.ms", "5000")
        .set("reconnect.backoff.max.ms", "2000");
    if let Some(id) = &conn.client_id {
        config.set("client.id", id);
    }
    if matches!(conn.security, Security::Ssl | Security::SaslSsl) {
        if let Some(ca) = tls.ca {
            crate::connect::tls::read_roots(ca)?;
            config.set("ssl.ca.location", ca.to_string_lossy());
        }
        if let (Some(cert), Some(key)) = (tls.cert, tls.key) {
            tls.identity()?;
            config
                .set("ssl.certificate.location", cert.to_string_lossy())
                .set("ssl.key.location", key.to_string_lossy());
        }
        config.set("enable.ssl.certificate.verification", "true");
    }
    if let Some(sasl) = &conn.sasl {
        config
            .set("sasl.mechanism", sasl.mechanism.name())
            .set("sasl.username", &sasl.username)
            .set("sasl.password", sasl.password.expose());
    }
    Ok(config)
}

/// `text` with the SASL password (if any) replaced by `***`.
pub(crate) fn scrub(sasl: Option<&Sasl>, text: &str) -> String {
    match sasl {
        Some(sasl) if !sasl.password.expose().is_empty() => {
            text.replace(sasl.password.expose(), "***")
        }
        _ => text.to_owned(),
    }
}

/// The librdkafka error code inside `err`, if it carries one.
pub(crate) fn code(err: &KafkaError) -> Option<RDKafkaErrorCode> {
    err.rdkafka_error_code()
}

/// Whether `code` means the brokers cannot be reached or talked to (an
/// outage), as opposed to a refusal of one request: everything
/// [`diagnosis::cause_of`] can name (unreachable, TLS, authentication, ACLs:
/// the operator fixes those and the messages wait), and the coordinator and
/// metadata states a rebalance or a broker restart passes through.
pub(crate) fn is_outage(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    diagnosis::cause_of(code, "").is_some()
        || matches!(
            code,
            C::CoordinatorNotAvailable
                | C::NotCoordinator
                | C::UnknownTopic
                | C::UnknownTopicOrPartition
                | C::WaitingForCoordinator
                | C::Fatal
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::testing::block;

    /// A PEM file of a self-signed certificate, and its key, in `dir`.
    fn pem_files(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("a cert");
        let (ca, key) = (dir.join("ca.pem"), dir.join("key.pem"));
        std::fs::write(&ca, cert.cert.pem()).expect("write");
        std::fs::write(&key, cert.signing_key.serialize_pem()).expect("write");
        (ca, key)
    }

    #[test]
    fn tls_and_sasl_options_reach_librdkafka_and_the_password_is_scrubbed() {
        let dir = tempfile::tempdir().expect("dir");
        let (ca, key) = pem_files(dir.path());
        let sink: KafkaSinkConfig = block(&format!(
            "brokers: \"b1:9093,b2:9093\"\ntopic: out\nsecurity: sasl_ssl\n\
             sasl: {{mechanism: SCRAM-SHA-512, username: app, password: hunter2}}\n\
             tls_ca: {ca}\ntls_cert: {ca}\ntls_key: {key}\nclient_id: edge-1\n",
            ca = ca.display(),
            key = key.display()
        ));
        let config = client_config(&sink.connection, sink.tls.files()).expect("a client config");
        let get = |k: &str| config.get(k).map(str::to_owned);
        assert_eq!(get("bootstrap.servers").as_deref(), Some("b1:9093,b2:9093"));
        assert_eq!(get("security.protocol").as_deref(), Some("sasl_ssl"));
        assert_eq!(get("ssl.ca.location"), Some(ca.display().to_string()));
        assert_eq!(
            get("ssl.certificate.location"),
            Some(ca.display().to_string())
        );
        assert_eq!(get("ssl.key.location"), Some(key.display().to_string()));
        assert_eq!(
            get("enable.ssl.certificate.verification").as_deref(),
            Some("true")
        );
        assert_eq!(get("sasl.mechanism").as_deref(), Some("SCRAM-SHA-512"));
        assert_eq!(get("sasl.username").as_deref(), Some("app"));
        assert_eq!(get("client.id").as_deref(), Some("edge-1"));
        let said = scrub(
            sink.connection.sasl.as_ref(),
            "SASL authentication failed for app/hunter2",
        );
        assert!(!said.contains("hunter2"), "{said}");
        // Plaintext sets no TLS or SASL at all.
        let plain: KafkaSinkConfig = block("brokers: \"b1:9092\"\ntopic: out\n");
        let config = client_config(&plain.connection, plain.tls.files()).expect("a client config");
        assert_eq!(config.get("security.protocol"), Some("plaintext"));
        assert_eq!(config.get("ssl.ca.location"), None);
        assert_eq!(config.get("sasl.password"), None);
    }

    #[test]
    fn a_ca_file_that_is_not_pem_is_refused_with_its_name() {
        let dir = tempfile::tempdir().expect("dir");
        let bad = dir.path().join("ca.pem");
        std::fs::write(&bad, "not a certificate").expect("write");
        let sink: KafkaSinkConfig = block(&format!(
            "brokers: \"b1:9093\"\ntopic: out\nsecurity: ssl\ntls_ca: {}\n",
            bad.display()
        ));
        let Err(err) = client_config(&sink.connection, sink.tls.files()) else {
            panic!("a CA file that is not PEM was taken");
        };
        assert!(err.contains("ca.pem"), "{err}");
    }
}
