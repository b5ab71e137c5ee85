//! What a stage calls for each message: a plugin worker, or (for benchmarks
//! and tests) native Rust code behind the same interface.

use async_trait::async_trait;

use crate::plugin::{Message, Outcome, Worker};
use crate::state::StateWrites;

/// The outcome of a batch item its handler took but has not finished: a
/// record in an object-store file that is still open. It resolves when the
/// file is complete in the store (or failed). Meanwhile the engine keeps
/// the delivery's lease (the heartbeat extends it) and its in-flight
/// permit, with the worker slot free for the next call.
pub type PendingOutcome = futures_util::future::BoxFuture<'static, Outcome>;

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

    /// The items of the last batch call whose outcome is not final yet,
    /// one entry per message in order (`None`: its outcome is the one
    /// returned). Empty (the default): every outcome returned is final.
    fn take_pending(&mut self) -> Vec<Option<PendingOutcome>> {
        Vec::new()
    }

    /// Shutdown began: finish what is pending now (close and upload open
    /// files) rather than when a limit is reached, so it settles within
    /// the drain deadline. Nothing by default.
    fn flush(&self) {}

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
