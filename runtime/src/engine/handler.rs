//! What a stage calls for each message: a plugin worker, or (for benchmarks
//! and tests) native Rust code behind the same interface.

use async_trait::async_trait;

use crate::plugin::{Message, Outcome, Worker};
use crate::state::StateWrites;

/// One worker slot of a stage. A stage with `concurrency: N` owns N of them
/// and lends each to one call at a time.
#[async_trait]
pub trait StageHandler: Send {
    /// Handles one message.
    async fn handle(&mut self, message: &Message) -> Outcome;

    /// Handles a batch, one outcome per message, in order.
    async fn handle_batch(&mut self, messages: &[Message]) -> Vec<Outcome> {
        let mut outcomes = Vec::with_capacity(messages.len());
        for message in messages {
            outcomes.push(self.handle(message).await);
        }
        outcomes
    }

    /// A call panicked (a bug on the host side): drop any state the call
    /// may have left half-changed before the handler is used again.
    fn after_panic(&mut self) {}

    /// The state writes of the last call, taken (none if it made none, or
    /// the handler has no state). The engine commits them with an `ok`
    /// and drops them otherwise.
    fn take_state(&mut self) -> Option<StateWrites> {
        None
    }

    /// The state keys the last call read, for its dead letter (none if
    /// the handler has no state).
    fn state_read(&self) -> Vec<String> {
        Vec::new()
    }
}

#[async_trait]
impl StageHandler for Worker {
    async fn handle(&mut self, message: &Message) -> Outcome {
        Worker::handle(self, message).await
    }

    async fn handle_batch(&mut self, messages: &[Message]) -> Vec<Outcome> {
        Worker::handle_batch(self, messages).await
    }

    fn after_panic(&mut self) {
        self.discard_instance();
    }

    fn take_state(&mut self) -> Option<StateWrites> {
        Worker::take_state(self)
    }

    fn state_read(&self) -> Vec<String> {
        Worker::state_read(self)
    }
}
