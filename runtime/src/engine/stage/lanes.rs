//! Per-key ordering lanes: a stage with `ordering:` handles the
//! deliveries of one key one at a time, in fetch order, each retried in
//! place, while other keys go on. [`Lanes`] holds, per key with a delivery
//! running, the deliveries queued behind it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;
use tracing::Instrument;

use super::{Job, StageRunner, lock};
use crate::config::OrderingKey;

/// The ordering lanes of one stage.
pub(super) struct Lanes {
    /// What orders (None: the stage does not).
    ordering: Option<OrderingKey>,
    /// Per key with a delivery running, the deliveries queued behind it.
    queues: Mutex<HashMap<String, VecDeque<Job>>>,
}

impl Lanes {
    pub(super) fn new(ordering: Option<OrderingKey>) -> Lanes {
        Lanes {
            ordering,
            queues: Mutex::new(HashMap::new()),
        }
    }

    /// The ordering key of a message, if the stage orders and it has one.
    pub(super) fn key_of(&self, message: &crate::broker::Message) -> Option<String> {
        match self.ordering.as_ref()? {
            OrderingKey::Key => message.key.clone(),
            OrderingKey::Header(name) => message.header(name).map(str::to_owned),
        }
    }

    /// Queues `job` behind its key's running delivery; or, if none runs,
    /// opens the key's lane and gives `job` back to be run now.
    fn push(&self, key: &str, job: Job) -> Option<Job> {
        let mut queues = lock(&self.queues);
        if let Some(queue) = queues.get_mut(key) {
            queue.push_back(job);
            return None;
        }
        queues.insert(key.to_owned(), VecDeque::new());
        Some(job)
    }

    /// The next delivery of `key`'s lane, or `None` (and the lane closed)
    /// when none is queued.
    fn next(&self, key: &str) -> Option<Job> {
        let mut queues = lock(&self.queues);
        let next = queues.get_mut(key).and_then(VecDeque::pop_front);
        if next.is_none() {
            queues.remove(key);
        }
        next
    }

    /// Every queued delivery (none of them started), taken out: shutdown
    /// hands them back.
    pub(super) fn take_queued(&self) -> Vec<Job> {
        lock(&self.queues)
            .values_mut()
            .flat_map(|queue| queue.drain(..))
            .collect()
    }
}

impl StageRunner {
    /// Queues `job` behind the running delivery of its key, or opens the
    /// key's lane with it: a task that runs the lane until it is empty.
    pub(super) fn enqueue(self: &Arc<Self>, key: String, job: Job, tasks: &mut JoinSet<()>) {
        if let Some(first) = self.lanes.push(&key, job) {
            let runner = self.clone();
            tasks.spawn(async move { runner.run_lane(key, first).await }.in_current_span());
        }
    }

    /// Handles `first` and then every delivery queued behind it on `key`,
    /// one at a time, in order. Retries happen in place, so a failing
    /// message holds back only its own key.
    async fn run_lane(self: Arc<Self>, key: String, first: Job) {
        let mut next = Some(first);
        while let Some(job) = next {
            self.process(job, true, None).await;
            next = self.lanes.next(&key);
        }
    }
}
