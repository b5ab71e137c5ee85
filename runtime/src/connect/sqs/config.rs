//! The `sqs:` blocks' connector side: how each is built into a running
//! source or sink. The blocks themselves (the YAML, its checks) are
//! `crate::config::connectors::sqs`.

use async_trait::async_trait;

use super::{SqsSink, SqsSource, Target};
pub(crate) use crate::config::connectors::sqs::*;
use crate::connect::{BuildError, Context, Sink, SinkConfig, Source, SourceConfig};

impl SqsConnection {
    /// The queue `queue_url`, called at this endpoint and region: what a
    /// source's or a sink's client is built from.
    pub(crate) fn target(&self, queue_url: &str) -> Target {
        Target {
            queue_url: queue_url.to_owned(),
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
        }
    }
}

impl SqsSourceConfig {
    pub(crate) fn target(&self) -> Target {
        self.connection.target(&self.queue_url)
    }
}

impl SqsSinkConfig {
    pub(crate) fn target(&self) -> Target {
        self.connection.target(&self.queue_url)
    }
}

#[async_trait]
impl SourceConfig for SqsSourceConfig {
    async fn build(&self, ctx: &Context) -> Result<Box<dyn Source>, BuildError> {
        Ok(Box::new(SqsSource::new(self, ctx)))
    }
}

#[async_trait]
impl SinkConfig for SqsSinkConfig {
    async fn build(&self, ctx: &Context) -> Result<std::sync::Arc<dyn Sink>, BuildError> {
        let _ = ctx;
        Ok(std::sync::Arc::new(SqsSink::new(self)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{SinkBlock, SourceBlock};
    use crate::connect::testing::{block, problem_paths as paths};

    const Q: &str = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders";

    fn source(yaml: &str) -> SqsSourceConfig {
        block(yaml)
    }

    fn sink(yaml: &str) -> SqsSinkConfig {
        block(yaml)
    }

    #[test]
    fn a_source_block_takes_its_defaults() {
        let c = source(&format!("queue_url: {Q}\n"));
        assert!(c.check().is_empty(), "{:?}", c.check());
        assert_eq!(c.read_max(), 10);
        assert_eq!(c.wait_time.get(), std::time::Duration::from_secs(20));
        assert_eq!(c.redelivery_horizon(), std::time::Duration::from_secs(30));
        assert!(c.describe().contains("orders"));
    }

    #[test]
    fn source_checks_name_the_offending_key() {
        let c = source(
            "queue_url: not a url\nendpoint: ftp://x\nregion: EU West\nwait_time: 21s\nvisibility_timeout: 1500ms\nbatch: 11\n",
        );
        assert_eq!(
            paths(&c.check()),
            vec![
                "queue_url",
                "endpoint",
                "region",
                "wait_time",
                "visibility_timeout",
                "batch"
            ]
        );
        let bad_name = source("queue_url: https://sqs.x.amazonaws.com/1/a%20b\n");
        assert_eq!(paths(&bad_name.check()), vec!["queue_url"]);
    }

    #[test]
    fn sink_checks_name_the_offending_key() {
        let fifo = sink(&format!(
            "queue_url: {Q}.fifo\ndelay: 5s\ndelay_header: wait\nmessage_group: \"a b\"\n"
        ));
        assert_eq!(
            paths(&fifo.check()),
            vec!["delay", "delay_header", "message_group"]
        );
        let standard = sink(&format!("queue_url: {Q}\ndelay: 16m\nmessage_group: g\n"));
        assert_eq!(paths(&standard.check()), vec!["delay", "message_group"]);
        let ok = sink(&format!(
            "queue_url: {Q}\ndelay: 10s\ndelay_header: delay\nendpoint: http://127.0.0.1:4566\nregion: eu-west-1\n"
        ));
        assert!(ok.check().is_empty(), "{:?}", ok.check());
        let ok_fifo = sink(&format!("queue_url: {Q}.fifo\nmessage_group: orders\n"));
        assert!(ok_fifo.check().is_empty(), "{:?}", ok_fifo.check());
    }
}
