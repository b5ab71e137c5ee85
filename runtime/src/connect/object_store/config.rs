//! The `object_store:` block's connector side: the running sink. The block
//! itself (the YAML, its checks) is `crate::config::connectors::object_store`.

use std::sync::Arc;

use async_trait::async_trait;

use crate::config::SinkBlock;
pub(crate) use crate::config::connectors::object_store::*;
use crate::connect::{BuildError, Context, Sink, SinkConfig};

#[async_trait]
impl SinkConfig for ObjectStoreSinkConfig {
    async fn build(&self, ctx: &Context) -> Result<Arc<dyn Sink>, BuildError> {
        if let Some(problem) = self.check().first() {
            return Err(BuildError::sink(ctx, problem.message.clone()));
        }
        let sink = super::ObjectStoreSink::new(self, ctx).map_err(|e| BuildError::sink(ctx, e))?;
        Ok(Arc::new(sink))
    }
}
