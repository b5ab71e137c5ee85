//! The `postgres:` blocks' connector side: how each is built into a running
//! source or sink. The blocks themselves (the YAML, its checks) are
//! `crate::config::connectors::postgres`.

use async_trait::async_trait;

use std::num::NonZeroU32;

use super::connection;
use super::outbox::OutboxSource;
use super::table::TableSink;
use crate::config::SinkBlock;
pub(crate) use crate::config::connectors::postgres::*;
use crate::connect::tls::TlsFiles;
use crate::connect::{BuildError, Context, Sink, SinkConfig, Source, SourceConfig};

#[async_trait]
impl SourceConfig for OutboxConfig {
    async fn build(&self, ctx: &Context) -> Result<Box<dyn Source>, BuildError> {
        let settings = settings(&self.connection, self.tls.files(), ctx, "source")?;
        Ok(Box::new(OutboxSource::new(
            self.connection.url.clone(),
            settings,
            self.outbox.clone(),
            self.create,
            self.poll.get(),
        )))
    }
}

#[async_trait]
impl SinkConfig for TableSinkConfig {
    async fn build(&self, ctx: &Context) -> Result<std::sync::Arc<dyn Sink>, BuildError> {
        self.build_for(ctx, *crate::config::default_concurrency())
            .await
    }
    /// The sink with a pool of `concurrency` connections, one per worker
    /// slot (opened on demand).
    async fn build_for(
        &self,
        ctx: &Context,
        concurrency: NonZeroU32,
    ) -> Result<std::sync::Arc<dyn Sink>, BuildError> {
        let problems = self.check();
        if let Some(problem) = problems.first() {
            return Err(BuildError::sink(ctx, problem.message.clone()));
        }
        let settings = settings(&self.connection, self.tls.files(), ctx, "sink")?;
        let sink = TableSink::new(
            self.connection.url.clone(),
            settings,
            self.table.as_deref(),
            self.statement.as_deref(),
            self.create,
            usize::try_from(concurrency.get()).unwrap_or(usize::MAX),
        )
        .map_err(|message| BuildError::sink(ctx, message))?;
        Ok(std::sync::Arc::new(sink))
    }
}

/// The connection settings of a block, source or sink, or why they
/// cannot be made.
fn settings(
    block: &PostgresConnection,
    files: TlsFiles<'_>,
    ctx: &Context,
    connector: &'static str,
) -> Result<connection::ConnectSettings, BuildError> {
    connection::settings(&block.url, files, block.statement_timeout.get())
        .map_err(|message| BuildError::new(connector, ctx, message))
}
