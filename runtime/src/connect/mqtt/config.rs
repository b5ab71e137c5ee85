//! The `mqtt:` blocks' connector side: how each is built into a running
//! source or sink. The blocks themselves (the YAML, its checks) are
//! `crate::config::connectors::mqtt`.

use async_trait::async_trait;

use super::{MqttSink, MqttSource};
pub(crate) use crate::config::connectors::mqtt::*;
use crate::connect::{BuildError, Context, Sink, SinkConfig, Source, SourceConfig};

#[async_trait]
impl SourceConfig for MqttSourceConfig {
    async fn build(&self, ctx: &Context) -> Result<Box<dyn Source>, BuildError> {
        let source =
            MqttSource::new(self, ctx).map_err(|message| BuildError::source(ctx, message))?;
        Ok(Box::new(source))
    }
}

#[async_trait]
impl SinkConfig for MqttSinkConfig {
    async fn build(&self, ctx: &Context) -> Result<std::sync::Arc<dyn Sink>, BuildError> {
        let sink = MqttSink::new(self, ctx).map_err(|message| BuildError::sink(ctx, message))?;
        Ok(std::sync::Arc::new(sink))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{SinkBlock, SourceBlock};
    use crate::connect::testing::{block, problem_paths as paths};

    fn source(yaml: &str) -> MqttSourceConfig {
        block(yaml)
    }

    fn sink(yaml: &str) -> MqttSinkConfig {
        block(yaml)
    }

    #[test]
    fn a_source_block_takes_its_defaults() {
        let c = source("url: mqtt://h:1883\ntopic: in/#\n");
        assert!(c.check().is_empty(), "{:?}", c.check());
        assert_eq!(c.connection.version, Version::V5);
        assert_eq!(c.qos, 1);
        assert_eq!(c.read_max(), 100);
        assert_eq!(c.receive_maximum, 1000);
        assert_eq!(c.key_property, "sluice-key");
        assert!(c.session_expiry.get().as_secs() > 0);
    }

    #[test]
    fn versions_are_read_as_written() {
        assert_eq!(
            source("url: mqtt://h\ntopic: a\nversion: 3.1.1\n")
                .connection
                .version,
            Version::V311
        );
        assert_eq!(
            source("url: mqtt://h\ntopic: a\nversion: 5\n")
                .connection
                .version,
            Version::V5
        );
        assert!(
            serde_saphyr::from_str::<MqttSourceConfig>("url: mqtt://h\ntopic: a\nversion: 4\n")
                .is_err()
        );
    }

    #[test]
    fn source_checks_name_the_offending_key() {
        let c = source(
            "url: http://h/\ntopic: \"a/#/b\"\nqos: 2\nclient_id: \"\"\nkeep_alive: 0s\n\
             session_expiry: 0s\nreceive_maximum: 0\n",
        );
        assert_eq!(
            paths(&c.check()),
            vec![
                "url",
                "qos",
                "client_id",
                "keep_alive",
                "topic",
                "session_expiry",
                "receive_maximum"
            ]
        );
    }

    #[test]
    fn sink_checks_name_the_offending_key() {
        let c = sink("url: mqtt://u:p@h\ntopic: \"out/+\"\nusername: x\ninflight: 0\n");
        assert_eq!(paths(&c.check()), vec!["username", "topic", "inflight"]);
        let ok = sink("url: mqtt://h:1883\ntopic: \"out/{key}\"\nretain: true\n");
        assert!(ok.check().is_empty(), "{:?}", ok.check());
    }

    #[test]
    fn describe_hides_the_password() {
        let c = source("url: mqtt://u:hunter2@h:1883\ntopic: a\n");
        let said = c.describe();
        assert!(!said.contains("hunter2") && said.contains("***"), "{said}");
        let c = source("url: mqtt://h:1883\ntopic: a\nusername: u\npassword: hunter2\n");
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn tls_options_are_checked() {
        let plain_with_ca = source("url: mqtt://h\ntopic: a\ntls_ca: /etc/ca.pem\n");
        assert_eq!(paths(&plain_with_ca.check()), vec!["tls_ca"]);
        let missing = source("url: mqtts://h\ntopic: a\ntls_ca: /no/such/ca.pem\n");
        assert_eq!(paths(&missing.check()), vec!["tls_ca"]);
    }
}
