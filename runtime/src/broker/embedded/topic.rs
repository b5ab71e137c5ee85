//! A topic in memory: its counters (kept in step with the store by the
//! committer, so stats never touch disk) and the wake-up for waiting
//! readers.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use super::store::TopicRecord;
use crate::broker::{TopicStats, now_millis};

/// A declared topic.
pub(super) struct Topic {
    /// Short id used in keys.
    pub id: u32,
    /// Its name.
    pub name: Arc<str>,
    /// Counters and settings; written only by the committer thread.
    pub state: Mutex<TopicState>,
    /// Woken after each commit that adds messages, and on naks.
    pub notify: Notify,
}

/// What the committer keeps about a topic.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct TopicState {
    /// Age retention in ms.
    pub retention_ms: Option<u64>,
    /// The oldest stored seq; `last_seq + 1` when empty.
    pub first_seq: u64,
    /// The newest seq ever assigned and committed.
    pub last_seq: u64,
    /// Messages stored.
    pub depth: u64,
    /// Publish time of the message at `first_seq` (0 when empty).
    pub first_published_at: u64,
    /// Messages waiting for their due time ([`super::delayed`]).
    pub delayed: u64,
    /// The last delay counter used in a delayed key.
    pub delay_seq: u64,
    /// When the earliest delayed message is due (ms since the epoch; 0
    /// when none is delayed). In memory only: read from the store on open.
    pub next_due: u64,
}

impl TopicState {
    /// The durable form.
    pub fn record(&self, id: u32) -> TopicRecord {
        TopicRecord {
            id,
            retention_ms: self.retention_ms,
            first_seq: self.first_seq,
            last_seq: self.last_seq,
            depth: self.depth,
            delayed: self.delayed,
            delay_seq: self.delay_seq,
        }
    }
}

impl Topic {
    /// A topic from its state.
    pub fn new(id: u32, name: &str, state: TopicState) -> Topic {
        Topic {
            id,
            name: name.into(),
            state: Mutex::new(state),
            notify: Notify::new(),
        }
    }

    /// The counters (poison-tolerant: they are plain numbers).
    pub fn state(&self) -> MutexGuard<'_, TopicState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A copy of the counters.
    pub fn snapshot(&self) -> TopicState {
        *self.state()
    }

    /// The public stats, from memory.
    pub fn stats(&self) -> TopicStats {
        let s = self.snapshot();
        let delayed = s.delayed;
        let next_due = (s.next_due > 0).then_some(s.next_due);
        if s.depth == 0 {
            return TopicStats {
                depth: 0,
                first_seq: 0,
                last_seq: s.last_seq,
                oldest_age: None,
                delayed,
                next_due,
            };
        }
        TopicStats {
            depth: s.depth,
            first_seq: s.first_seq,
            last_seq: s.last_seq,
            oldest_age: Some(Duration::from_millis(
                now_millis().saturating_sub(s.first_published_at),
            )),
            delayed,
            next_due,
        }
    }
}
