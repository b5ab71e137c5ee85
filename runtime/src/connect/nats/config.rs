//! The `nats:` blocks' connector side: how each is built into a running
//! source or sink. The blocks themselves (the YAML, its checks) are
//! `crate::config::connectors::nats`.

use async_trait::async_trait;

use super::{NatsSink, NatsSource};
pub(crate) use crate::config::connectors::nats::*;
use crate::connect::{BuildError, Context, Sink, SinkConfig, Source, SourceConfig};

#[async_trait]
impl SourceConfig for NatsSourceConfig {
    async fn build(&self, ctx: &Context) -> Result<Box<dyn Source>, BuildError> {
        let source = NatsSource::new(self, ctx)
            .await
            .map_err(|message| BuildError::source(ctx, message))?;
        Ok(Box::new(source))
    }
}

#[async_trait]
impl SinkConfig for NatsSinkConfig {
    async fn build(&self, ctx: &Context) -> Result<std::sync::Arc<dyn Sink>, BuildError> {
        let sink = NatsSink::new(self, ctx)
            .await
            .map_err(|message| BuildError::sink(ctx, message))?;
        Ok(std::sync::Arc::new(sink))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{SinkBlock, SourceBlock};

    /// Config writes the broker's key header as text (it names no broker).
    #[test]
    fn the_default_key_header_is_the_brokers() {
        assert_eq!(default_key_header(), crate::broker::nats::KEY_HEADER);
    }
    use crate::connect::testing::{block, problem_paths as paths};

    fn source(yaml: &str) -> NatsSourceConfig {
        block(yaml)
    }

    fn sink(yaml: &str) -> NatsSinkConfig {
        block(yaml)
    }

    #[test]
    fn a_source_block_takes_its_defaults() {
        let c = source("url: nats://h:4222\nsubject: orders.in\nstream: ORDERS\n");
        assert!(c.check().is_empty(), "{:?}", c.check());
        assert!(c.warnings().is_empty());
        assert_eq!(c.deliver, Deliver::All);
        assert_eq!(c.read_max(), 100);
        assert_eq!(c.key_header, "Sluice-Key");
        assert_eq!(c.redelivery_horizon(), std::time::Duration::from_secs(30));
        assert_eq!(default_durable("p.x", "src"), "sluice-p_x-src");
        let s = sink("url: nats://h:4222\nsubject: orders.out\n");
        assert!(s.jetstream);
        assert!(s.check().is_empty());
    }

    #[test]
    fn a_core_source_is_valid_with_a_warning() {
        let c = source("url: nats://h\nsubject: \"orders.>\"\nqueue: workers\n");
        assert!(c.check().is_empty(), "{:?}", c.check());
        let warnings = c.warnings();
        assert_eq!(paths(&warnings), vec!["subject"]);
        assert!(warnings[0].message.contains("at most once"));
        assert!(c.describe().contains("at most once"));
    }

    #[test]
    fn source_checks_name_the_offending_key() {
        let c = source(
            "url: http://h/\nsubject: \"a..b\"\nstream: \"A.B\"\ndurable: \"d x\"\nqueue: q\nack_wait: 0s\nkey_header: \"Nats-Key\"\n",
        );
        assert_eq!(
            paths(&c.check()),
            vec![
                "url",
                "subject",
                "key_header",
                "stream",
                "durable",
                "queue",
                "ack_wait"
            ]
        );
        let core = source("url: nats://h\nsubject: s\ndurable: d\ndeliver: new\n");
        assert_eq!(paths(&core.check()), vec!["durable", "deliver"]);
    }

    #[test]
    fn sink_checks_name_the_offending_key() {
        let c = sink("url: nats://h:4222\nsubject: \"orders.*\"\nkey_header: \"a b\"\n");
        assert_eq!(paths(&c.check()), vec!["subject", "key_header"]);
    }

    #[test]
    fn credentials_are_checked_and_never_shown() {
        let token_in_url = sink("url: nats://s3cretToken@h:4222\nsubject: s\n");
        assert_eq!(paths(&token_in_url.check()), vec!["url"]);
        let both = sink("url: nats://u:hunter2@h:4222\nsubject: s\ntoken: t0k3n\n");
        assert_eq!(paths(&both.check()), vec!["url"]);
        let half = sink("url: nats://h\nsubject: s\nuser: u\n");
        assert_eq!(paths(&half.check()), vec!["user"]);
        let said = format!(
            "{} {:?} {}",
            both.describe(),
            both,
            serde_json::to_string(&both).expect("json")
        );
        assert!(
            !said.contains("hunter2") && !said.contains("t0k3n"),
            "{said}"
        );
        let creds = sink("url: nats://h\nsubject: s\ncreds: /no/such.creds\n");
        assert_eq!(paths(&creds.check()), vec!["creds"]);
    }

    #[test]
    fn subjects_are_checked() {
        assert!(subject_problem("a.b.c", false).is_none());
        assert!(subject_problem("a.*.>", true).is_none());
        assert!(subject_problem("a.*", false).is_some());
        assert!(subject_problem("a.>.b", true).is_some());
        assert!(subject_problem("a.b*", true).is_some());
        assert!(subject_problem("", true).is_some());
        assert!(subject_problem(".a", true).is_some());
        assert!(stream_name_problem("ORDERS_1").is_none());
        assert!(stream_name_problem("a.b").is_some());
    }
}
