//! Per-key ordering lanes: a stage with `ordering:` handles the
//! deliveries of one key one at a time, in fetch order, each retried in
//! place, while other keys go on. The lane map holds, per key with a
//! delivery running, the deliveries queued behind it.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::task::JoinSet;
use tracing::Instrument;

use super::{Job, StageRunner, lock};
use crate::config::OrderingKey;

impl StageRunner {
    /// The ordering key of a message, if the stage orders and it has one.
    pub(super) fn lane_key(&self, message: &crate::broker::Message) -> Option<String> {
        match self.ordering.as_ref()? {
            OrderingKey::Key => message.key.clone(),
            OrderingKey::Header(name) => message.header(name).map(str::to_owned),
        }
    }

    /// Queues `job` behind the running delivery of its key, or opens the
    /// key's lane with it: a task that runs the lane until it is empty.
    pub(super) fn enqueue(self: &Arc<Self>, key: String, job: Job, tasks: &mut JoinSet<()>) {
        {
            let mut lanes = lock(&self.lanes);
            if let Some(queue) = lanes.get_mut(&key) {
                queue.push_back(job);
                return;
            }
            lanes.insert(key.clone(), VecDeque::new());
        }
        let runner = self.clone();
        tasks.spawn(async move { runner.run_lane(key, job).await }.in_current_span());
    }

    /// Handles `first` and then every delivery queued behind it on `key`,
    /// one at a time, in order. Retries happen in place, so a failing
    /// message holds back only its own key.
    async fn run_lane(self: Arc<Self>, key: String, first: Job) {
        let mut next = Some(first);
        while let Some(job) = next {
            self.process(job, true, None).await;
            let mut lanes = lock(&self.lanes);
            next = lanes.get_mut(&key).and_then(VecDeque::pop_front);
            if next.is_none() {
                lanes.remove(&key);
            }
        }
    }
}
