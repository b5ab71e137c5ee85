//! The `redis:` blocks' connector side: how each is built into a running
//! source or sink. The blocks themselves (the YAML, its checks) are
//! `crate::config::connectors::redis`.

use async_trait::async_trait;

use super::{RedisSink, RedisSource};
pub(crate) use crate::config::connectors::redis::*;
use crate::connect::{BuildError, Context, Sink, SinkConfig, Source, SourceConfig};

#[async_trait]
impl SourceConfig for RedisSourceConfig {
    async fn build(&self, ctx: &Context) -> Result<Box<dyn Source>, BuildError> {
        let source = RedisSource::new(self).map_err(|message| BuildError::source(ctx, message))?;
        tracing::debug!(source = %ctx.label(), consumer = source.consumer(), "redis consumer");
        Ok(Box::new(source))
    }
}

#[async_trait]
impl SinkConfig for RedisSinkConfig {
    async fn build(&self, ctx: &Context) -> Result<std::sync::Arc<dyn Sink>, BuildError> {
        let sink = RedisSink::new(self).map_err(|message| BuildError::sink(ctx, message))?;
        Ok(std::sync::Arc::new(sink))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{SinkBlock, SourceBlock};
    use crate::connect::testing::{block, problem_paths as paths};

    fn source(yaml: &str) -> RedisSourceConfig {
        block(yaml)
    }

    #[test]
    fn a_source_block_takes_its_defaults() {
        let c = source("url: redis://h:6379/0\nstream: s\ngroup: g\n");
        assert!(c.check().is_empty());
        assert_eq!(c.start, StartFrom::New);
        assert_eq!(c.read_max(), 100);
        assert_eq!(c.payload_field, "payload");
        assert_eq!(c.key_field, "key");
        assert_eq!(c.redelivery_horizon(), std::time::Duration::from_secs(30));
    }

    #[test]
    fn source_checks_name_the_offending_key() {
        let c = source(
            "url: http://h/\nstream: \"a b\"\ngroup: \"g{x}\"\nconsumer: \"c 1\"\nclaim_idle: 0s\n",
        );
        assert_eq!(
            paths(&c.check()),
            vec!["url", "stream", "group", "consumer", "claim_idle"]
        );
    }

    #[test]
    fn sink_checks_name_the_offending_key() {
        let c: RedisSinkConfig =
            serde_saphyr::from_str("url: postgres://h/\nstream: \"o;ut\"\nmaxlen: 0\n")
                .expect("a sink block");
        assert_eq!(paths(&c.check()), vec!["url", "stream", "maxlen"]);
        let ok: RedisSinkConfig =
            serde_saphyr::from_str("url: redis://h/\nstream: out\n").expect("a sink block");
        assert!(ok.check().is_empty());
        assert_eq!(
            ok.dedup_ttl.get(),
            std::time::Duration::from_secs(24 * 3600)
        );
    }

    #[test]
    fn describe_hides_the_password() {
        let c = source("url: redis://:hunter2@h:6379/0\nstream: s\ngroup: g\n");
        let said = c.describe();
        assert!(!said.contains("hunter2") && said.contains("***"), "{said}");
    }

    #[test]
    fn tls_options_are_checked() {
        let ok = source("url: rediss://:hunter2@h:6380/0\nstream: s\ngroup: g\n");
        assert!(ok.check().is_empty(), "{:?}", ok.check());
        let insecure = source("url: rediss://:hunter2@h:6380/0#insecure\nstream: s\ngroup: g\n");
        let problems = insecure.check();
        assert_eq!(paths(&problems), vec!["url"]);
        assert!(
            problems[0].message.contains("tls_ca") && !problems[0].message.contains("hunter2"),
            "{:?}",
            problems[0]
        );
        let plain_with_ca =
            source("url: redis://h:6379/0\nstream: s\ngroup: g\ntls_ca: /etc/ca.pem\n");
        assert_eq!(paths(&plain_with_ca.check()), vec!["tls_ca"]);
        let missing_ca =
            source("url: rediss://h:6379/0\nstream: s\ngroup: g\ntls_ca: /no/such/ca.pem\n");
        let problems = missing_ca.check();
        assert_eq!(paths(&problems), vec!["tls_ca"]);
        assert!(problems[0].message.contains("/no/such/ca.pem"));
    }
}
