//! The `kafka:` blocks' connector side: how each is built into a running
//! source or sink. The blocks themselves (the YAML, its checks) are
//! `crate::config::connectors::kafka`.

use async_trait::async_trait;

use super::{KafkaSink, KafkaSource};
pub(crate) use crate::config::connectors::kafka::*;
use crate::connect::{BuildError, Context, Sink, SinkConfig, Source, SourceConfig};

#[async_trait]
impl SourceConfig for KafkaSourceConfig {
    async fn build(&self, ctx: &Context) -> Result<Box<dyn Source>, BuildError> {
        let source =
            KafkaSource::new(self, ctx).map_err(|message| BuildError::source(ctx, message))?;
        Ok(Box::new(source))
    }
}

#[async_trait]
impl SinkConfig for KafkaSinkConfig {
    async fn build(&self, ctx: &Context) -> Result<std::sync::Arc<dyn Sink>, BuildError> {
        let sink = KafkaSink::new(self).map_err(|message| BuildError::sink(ctx, message))?;
        Ok(std::sync::Arc::new(sink))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{SinkBlock, SourceBlock};
    use crate::connect::testing::{block, problem_paths as paths};

    fn source(yaml: &str) -> KafkaSourceConfig {
        block(yaml)
    }

    #[test]
    fn a_source_block_takes_its_defaults() {
        let c = source("brokers: h:9092\ntopic: in\ngroup: g\n");
        assert!(c.check().is_empty(), "{:?}", c.check());
        assert_eq!(c.start, StartFrom::Latest);
        assert_eq!(c.read_max(), 500);
        assert_eq!(c.topic_list(), vec!["in".to_owned()]);
        let many = source("brokers: [a:1, b:2]\ntopics: [x, y]\ngroup: g\nstart: earliest\n");
        assert!(many.check().is_empty());
        assert_eq!(many.connection.brokers.joined(), "a:1,b:2");
        assert_eq!(many.start, StartFrom::Earliest);
    }

    #[test]
    fn source_checks_name_the_offending_key() {
        let c = source(
            "brokers: \"kafka://h\"\ntopic: \"a b\"\ngroup: \"g/x\"\nsession_timeout: 0s\nbatch: 10\nbuffer: 5\n",
        );
        assert_eq!(
            paths(&c.check()),
            vec!["brokers", "topic", "group", "session_timeout", "buffer"]
        );
        let neither = source("brokers: h:1\ngroup: g\n");
        assert_eq!(paths(&neither.check()), vec!["topic"]);
        let both = source("brokers: h:1\ngroup: g\ntopic: a\ntopics: [b]\n");
        assert_eq!(paths(&both.check()), vec!["topics"]);
    }

    #[test]
    fn security_and_sasl_must_agree_and_the_password_is_hidden() {
        let c = source(
            "brokers: h:1\ntopic: t\ngroup: g\nsecurity: sasl_plaintext\nsasl:\n  mechanism: SCRAM-SHA-256\n  username: u\n  password: hunter2\n",
        );
        assert!(c.check().is_empty(), "{:?}", c.check());
        let shown = format!("{c:?} {}", c.describe());
        assert!(!shown.contains("hunter2"), "{shown}");
        let no_block = source("brokers: h:1\ntopic: t\ngroup: g\nsecurity: sasl_ssl\n");
        assert_eq!(paths(&no_block.check()), vec!["security"]);
        let no_security =
            source("brokers: h:1\ntopic: t\ngroup: g\nsasl:\n  username: u\n  password: p\n");
        assert_eq!(paths(&no_security.check()), vec!["sasl"]);
        let ca_plain = source("brokers: h:1\ntopic: t\ngroup: g\ntls_ca: /etc/ca.pem\n");
        assert_eq!(paths(&ca_plain.check()), vec!["tls_ca"]);
    }

    #[test]
    fn sasl_credentials_must_not_be_empty_and_the_password_is_never_quoted() {
        let base = "brokers: h:1\ntopic: t\ngroup: g\nsecurity: sasl_ssl\n";
        let no_password = source(&format!(
            "{base}sasl: {{username: alice, password: \"\"}}\n"
        ));
        assert_eq!(paths(&no_password.check()), vec!["sasl", "password"]);
        assert!(no_password.check()[0].message.contains("${VAR}"));
        let blank_user = source(&format!(
            "{base}sasl: {{username: \"  \", password: hunter2}}\n"
        ));
        assert_eq!(paths(&blank_user.check()), vec!["sasl", "username"]);
        // `ssl` where `sasl_ssl` was meant: said so, on a sink as on a source.
        let ssl: KafkaSinkConfig = block(
            "brokers: h:1\ntopic: t\nsecurity: ssl\nsasl: {mechanism: SCRAM-SHA-512, username: u, password: hunter2}\n",
        );
        let problems = ssl.check();
        assert_eq!(paths(&problems), vec!["sasl"]);
        assert!(
            problems[0].message.contains("write `security: sasl_ssl`"),
            "{problems:?}"
        );
        for c in [&no_password, &blank_user] {
            let said = format!("{:?} {:?}", c.check(), c.warnings());
            assert!(!said.contains("hunter2"), "{said}");
        }
        assert!(!format!("{problems:?}").contains("hunter2"));
    }

    #[test]
    fn plain_without_tls_is_valid_with_a_warning() {
        let plain = source(
            "brokers: h:1\ntopic: t\ngroup: g\nsecurity: sasl_plaintext\nsasl: {mechanism: PLAIN, username: u, password: hunter2}\n",
        );
        assert!(plain.check().is_empty(), "{:?}", plain.check());
        let warnings = plain.warnings();
        assert_eq!(paths(&warnings), vec!["sasl", "mechanism"]);
        assert!(warnings[0].message.contains("sasl_ssl"));
        assert!(!warnings[0].message.contains("hunter2"));
        let over_tls = source(
            "brokers: h:1\ntopic: t\ngroup: g\nsecurity: sasl_ssl\nsasl: {mechanism: PLAIN, username: u, password: p}\n",
        );
        assert!(over_tls.warnings().is_empty());
        let scram = source(
            "brokers: h:1\ntopic: t\ngroup: g\nsecurity: sasl_plaintext\nsasl: {mechanism: SCRAM-SHA-256, username: u, password: p}\n",
        );
        assert!(scram.warnings().is_empty());
    }

    #[test]
    fn a_sink_refuses_tls_files_without_tls_or_without_their_pair() {
        let ca: KafkaSinkConfig = block("brokers: h:1\ntopic: t\ntls_ca: /etc/ca.pem\n");
        let problems = ca.check();
        assert_eq!(paths(&problems), vec!["tls_ca"]);
        assert!(
            problems[0].message.contains("set `security: ssl`"),
            "{problems:?}"
        );
        let cert: KafkaSinkConfig = block(
            "brokers: h:1\ntopic: t\nsecurity: sasl_ssl\nsasl: {username: u, password: p}\ntls_cert: /no/such/client.pem\n",
        );
        // Not found, and no key.
        assert_eq!(paths(&cert.check()), vec!["tls_cert", "tls_cert"]);
    }

    #[test]
    fn sink_checks_name_the_offending_key() {
        let c: KafkaSinkConfig =
            serde_saphyr::from_str("brokers: \"\"\ntopic: \"o;ut\"\ndelivery_timeout: 0s\n")
                .expect("a sink block");
        assert_eq!(
            paths(&c.check()),
            vec!["brokers", "topic", "delivery_timeout"]
        );
        let ok: KafkaSinkConfig =
            serde_saphyr::from_str("brokers: h:9092\ntopic: out\n").expect("a sink block");
        assert!(ok.check().is_empty());
    }
}
