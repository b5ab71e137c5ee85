//! The `amqp:` blocks' connector side: how each is built into a running
//! source or sink. The blocks themselves (the YAML, its checks) are
//! `crate::config::connectors::amqp`.

use async_trait::async_trait;

use super::{AmqpSink, AmqpSource};
pub(crate) use crate::config::connectors::amqp::*;
use crate::connect::{BuildError, Context, Sink, SinkConfig, Source, SourceConfig};

#[async_trait]
impl SourceConfig for AmqpSourceConfig {
    async fn build(&self, ctx: &Context) -> Result<Box<dyn Source>, BuildError> {
        let source = AmqpSource::new(self, &ctx.label())
            .map_err(|message| BuildError::source(ctx, message))?;
        Ok(Box::new(source))
    }
}

#[async_trait]
impl SinkConfig for AmqpSinkConfig {
    async fn build(&self, ctx: &Context) -> Result<std::sync::Arc<dyn Sink>, BuildError> {
        let sink =
            AmqpSink::new(self, &ctx.label()).map_err(|message| BuildError::sink(ctx, message))?;
        Ok(std::sync::Arc::new(sink))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{SinkBlock, SourceBlock};
    use crate::connect::testing::{block, problem_paths as paths};

    fn source(yaml: &str) -> AmqpSourceConfig {
        block(yaml)
    }

    fn sink(yaml: &str) -> AmqpSinkConfig {
        block(yaml)
    }

    #[test]
    fn a_source_block_takes_its_defaults() {
        let c = source("url: amqp://u:p@h:5672/%2f\nqueue: in\n");
        assert!(c.check().is_empty(), "{:?}", c.check());
        assert_eq!(c.prefetch.get(), 500);
        assert_eq!(c.read_max(), 100);
        let bare = source("url: amqp://h\nqueue: in\n");
        assert!(bare.check().is_empty(), "{:?}", bare.check());
    }

    #[test]
    fn source_checks_name_the_offending_key() {
        let c = source("url: http://h/\nqueue: \"\"\nconsumer_tag: \"a\\nb\"\n");
        assert_eq!(paths(&c.check()), vec!["url", "queue", "consumer_tag"]);
        let empty_vhost = source("url: amqp://h:5672/\nqueue: in\n");
        let problems = empty_vhost.check();
        assert_eq!(paths(&problems), vec!["url"]);
        assert!(problems[0].message.contains("%2f"), "{problems:?}");
    }

    #[test]
    fn sink_checks_name_the_offending_key() {
        let c = sink("url: amqp://h/%2f\nexchange: x\nrouting_key: \"a.{id}\"\n");
        assert_eq!(paths(&c.check()), vec!["routing_key"]);
        let c = sink("url: amqp://h/%2f\nexchange: \"\"\nrouting_key: \"\"\n");
        assert_eq!(paths(&c.check()), vec!["routing_key"]);
        let ok = sink("url: amqp://h/%2f\nexchange: x\nrouting_key: \"orders.{key}\"\n");
        assert!(ok.check().is_empty(), "{:?}", ok.check());
    }

    #[test]
    fn tls_options_need_amqps_and_the_password_is_hidden() {
        let c = source("url: amqp://u:hunter2@h/%2f\nqueue: q\ntls_ca: /etc/ca.pem\n");
        assert_eq!(paths(&c.check()), vec!["tls_ca"]);
        let said = c.describe();
        assert!(!said.contains("hunter2") && said.contains("***"), "{said}");
        let missing = source("url: amqps://u:hunter2@h/%2f\nqueue: q\ntls_ca: /no/such.pem\n");
        assert_eq!(paths(&missing.check()), vec!["tls_ca"]);
    }
}
