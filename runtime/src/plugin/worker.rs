//! A worker slot: one plugin instance at a time, reused across calls and
//! replaced after anything that may have left it in a bad state.
//!
//! This is where a call's limits are applied and where every way a call can
//! end is turned into either checked emits or a classified [`Failure`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Store, Trap};

use super::bindings::{HandlerError, batch, single, v2};
use super::sandbox::{DeadlineExceeded, MemoryLimitExceeded, StoreState};
use super::{Emit, Message, Plugin, Pre, World};
use crate::broker::check_portable;
use crate::failure::{Failure, FailureKind};

/// The limits one call runs under. Set per stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time a call may take (for a batch-handler, the whole batch).
    pub timeout: Duration,
    /// Bytes of linear memory an instance may hold, summed over its memories.
    pub memory: usize,
    /// Bytes a call may emit for one message: payloads, keys and headers.
    pub max_output_bytes: usize,
    /// Messages a call may emit for one input message.
    pub max_emits: usize,
    /// Bytes of log text (host `log`, stdout, stderr) a call may write.
    pub max_log_bytes: usize,
}

impl Limits {
    /// The hostcall fuel for a call over `messages` inputs: how many bytes the
    /// guest may hand the host in one crossing, including the call's return
    /// value. Derived from the output caps (plus room for each emit's record
    /// and headers), so an oversized result is refused while it is still in
    /// guest memory instead of being copied into the host first.
    fn hostcall_fuel(&self, messages: usize) -> usize {
        const PER_EMIT_OVERHEAD: usize = 512;
        self.max_output_bytes
            .saturating_add(self.max_emits.saturating_mul(PER_EMIT_OVERHEAD))
            .saturating_mul(messages.max(1))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(30),
            memory: 256 << 20,
            max_output_bytes: 32 << 20,
            max_emits: 1024,
            max_log_bytes: 64 << 10,
        }
    }
}

/// The topics a call may emit to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outputs {
    /// Only these topics; the first is the default output (`topic: ""`).
    Declared(Vec<String>),
    /// Any topic; `topic: ""` becomes the given default. For `plugin test`.
    Any {
        /// What an emit to the default output is called.
        default: String,
    },
}

/// Whether an instance serves many messages or one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// Reuse the instance until a failure or limit discards it (fast).
    #[default]
    Reuse,
    /// A fresh instance for every call: no state survives between messages.
    PerMessage,
}

/// Everything a worker needs besides the plugin.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Per-call limits.
    pub limits: Limits,
    /// The stage's `config:` map, read by the `config-get` import.
    pub config: Arc<BTreeMap<String, String>>,
    /// Where emits may go.
    pub outputs: Outputs,
    /// The stage's own input topics, with `timers: true`: an emit may go
    /// to one of them, but only delayed (a timer), never straight back.
    pub timer_topics: Vec<String>,
    /// The secrets the stage grants (`sluice:plugin/secrets`); their values
    /// are removed from the guest's logs and failure reasons.
    pub secrets: super::GuestSecrets,
    /// The store the stage grants (`sluice:plugin/state`), if any.
    pub state: Option<crate::state::StateAccess>,
    /// The outbound HTTP the stage grants (`wasi:http`), if any.
    pub http: Option<super::HttpSender>,
    /// Instance reuse policy.
    pub isolation: Isolation,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        WorkerSettings {
            limits: Limits::default(),
            config: Arc::default(),
            outputs: Outputs::Any {
                default: "out".into(),
            },
            timer_topics: Vec::new(),
            secrets: super::GuestSecrets::default(),
            state: None,
            http: None,
            isolation: Isolation::Reuse,
        }
    }
}

/// The result of handling one message.
pub type Outcome = Result<Vec<Emit>, Failure>;

/// One worker slot of a plugin. Calls take `&mut self`: a slot runs one call
/// at a time, and a stage's concurrency is its number of workers.
pub struct Worker {
    plugin: Plugin,
    settings: WorkerSettings,
    live: Option<Live>,
    instantiations: u64,
}

struct Live {
    store: Store<StoreState>,
    exports: Exports,
}

enum Exports {
    Single(single::Handler),
    Batch(batch::BatchHandler),
    SingleV2(v2::single::Handler),
    BatchV2(v2::batch::BatchHandler),
}

impl Worker {
    pub(crate) fn new(plugin: Plugin, settings: WorkerSettings) -> Self {
        Worker {
            plugin,
            settings,
            live: None,
            instantiations: 0,
        }
    }

    /// The plugin this worker runs.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// Drops the instance (the next call starts a fresh one): after a call
    /// that ended in a way the worker could not see through, a host panic.
    pub fn discard_instance(&mut self) {
        self.live = None;
    }

    /// The state writes of the last call, taken: the engine commits them
    /// with an `ok` outcome and drops them otherwise.
    pub fn take_state(&mut self) -> Option<crate::state::StateWrites> {
        self.live.as_mut()?.store.data_mut().take_state()
    }

    /// The state keys the last call read (for a dead letter), before
    /// [`Worker::take_state`].
    pub fn state_read(&self) -> Vec<String> {
        self.live
            .as_ref()
            .map(|live| live.store.data().state_read())
            .unwrap_or_default()
    }

    /// How many instances this worker has created so far (1 + replacements).
    pub fn instantiations(&self) -> u64 {
        self.instantiations
    }

    /// Handles one message.
    pub async fn handle(&mut self, msg: &Message) -> Outcome {
        let item = match self.call(std::slice::from_ref(msg)).await {
            Ok(mut raw) => raw
                .pop()
                .unwrap_or_else(|| Err(Failure::new(FailureKind::Trap, "no outcome returned"))),
            Err(failure) => return Err(failure),
        };
        let mut limit_hit = false;
        let outcome = self.check_outcome(item, &mut limit_hit);
        self.end_call(limit_hit);
        outcome
    }

    /// Handles several messages and returns one outcome per message, in order.
    /// A `batch-handler` plugin gets them in one call. A `handler` plugin gets
    /// one call each, so a message that traps fails alone: the ones before it
    /// keep their results and the ones after it run on a fresh instance.
    pub async fn handle_batch(&mut self, msgs: &[Message]) -> Vec<Outcome> {
        if self.plugin.world() == World::Handler {
            let mut outcomes = Vec::with_capacity(msgs.len());
            for msg in msgs {
                outcomes.push(self.handle(msg).await);
            }
            return outcomes;
        }
        if msgs.is_empty() {
            return Vec::new();
        }
        let raw = match self.call(msgs).await {
            Ok(raw) => raw,
            Err(failure) => return vec![Err(failure); msgs.len()],
        };
        let mut limit_hit = false;
        let outcomes = raw
            .into_iter()
            .map(|item| self.check_outcome(item, &mut limit_hit))
            .collect();
        self.end_call(limit_hit);
        outcomes
    }

    /// Checks one guest result; notes whether it hit an output limit.
    fn check_outcome(&self, item: Outcome, limit_hit: &mut bool) -> Outcome {
        let checked = item
            .map_err(|failure| self.redacted(failure))
            .and_then(|emits| self.check_emits(emits));
        *limit_hit |= matches!(&checked, Err(f) if matches!(f.kind, FailureKind::OutputTooLarge | FailureKind::UndeclaredTopic));
        checked
    }

    /// Drops the instance after a limit was hit, or always under per-message isolation.
    fn end_call(&mut self, limit_hit: bool) {
        if limit_hit || self.settings.isolation == Isolation::PerMessage {
            self.live = None;
        }
    }

    /// Runs the guest and returns its per-message results, or the failure of
    /// the call as a whole (after which the instance is discarded).
    async fn call(&mut self, msgs: &[Message]) -> Result<Vec<Outcome>, Failure> {
        let limits = self.settings.limits;
        let result = match self.instance().await {
            Ok(live) => live.call(msgs, &limits).await,
            Err(err) => Err(err),
        };
        let mut stderr_tail = None;
        if let Some(live) = &self.live {
            let log = &live.store.data().log_budget;
            if result.is_err() {
                stderr_tail = log.stderr_tail();
            }
            let dropped = log.reset(self.settings.limits.max_log_bytes);
            if dropped > 0 {
                tracing::warn!(
                    plugin = %self.plugin.name(),
                    dropped_bytes = dropped,
                    "Plugin log output over the per-call budget was dropped."
                );
            }
        }
        result.map_err(|err| {
            self.live = None;
            let mut failure = classify(err, &self.settings.limits);
            if let (FailureKind::Trap, Some(tail)) = (failure.kind, stderr_tail) {
                failure.message = match super::stdio::trap_hint(&tail) {
                    Some(hint) => {
                        format!("{} (guest stderr: {tail}); hint: {hint}", failure.message)
                    }
                    None => format!("{} (guest stderr: {tail})", failure.message),
                };
            }
            self.redacted(failure)
        })
    }

    /// `failure` with the stage's secret values removed from its reason.
    fn redacted(&self, mut failure: Failure) -> Failure {
        if let std::borrow::Cow::Owned(clean) = self.settings.secrets.redact(&failure.message) {
            failure.message = clean;
        }
        failure
    }

    async fn instance(&mut self) -> wasmtime::Result<&mut Live> {
        if self.live.is_none() {
            let limits = &self.settings.limits;
            let state = StoreState::new(
                self.plugin.inner.name.clone(),
                self.settings.config.clone(),
                self.settings.secrets.clone(),
                self.settings.state.clone(),
                self.settings.http.clone(),
                limits.memory.min(self.plugin.inner.host.max_memory),
                self.plugin.inner.host.clock.clone(),
            );
            let mut store = Store::new(&self.plugin.inner.host.engine, state);
            store.limiter(|state| state as &mut dyn wasmtime::ResourceLimiter);
            store.data().log_budget.reset(limits.max_log_bytes);
            if self.plugin.inner.host.epoch_interruption {
                store.epoch_deadline_callback(StoreState::on_epoch_tick);
            }
            begin(&mut store, limits, 1);
            let exports = match &self.plugin.inner.pre {
                Pre::Single(pre) => Exports::Single(pre.instantiate_async(&mut store).await?),
                Pre::Batch(pre) => Exports::Batch(pre.instantiate_async(&mut store).await?),
                Pre::SingleV2(pre) => Exports::SingleV2(pre.instantiate_async(&mut store).await?),
                Pre::BatchV2(pre) => Exports::BatchV2(pre.instantiate_async(&mut store).await?),
            };
            store.data_mut().disarm();
            self.instantiations += 1;
            self.live = Some(Live { store, exports });
        }
        self.live
            .as_mut()
            .ok_or_else(|| wasmtime::Error::msg("instance vanished"))
    }

    /// Resolves the default topic, then enforces declared topics, caps and
    /// keys and headers every broker can carry.
    fn check_emits(&self, mut emits: Vec<Emit>) -> Outcome {
        let limits = &self.settings.limits;
        if emits.len() > limits.max_emits {
            return Err(Failure::new(
                FailureKind::OutputTooLarge,
                format!(
                    "handler emitted {} messages; the stage allows at most {}",
                    emits.len(),
                    limits.max_emits
                ),
            ));
        }
        let bytes: usize = emits.iter().map(emit_size).sum();
        if bytes > limits.max_output_bytes {
            return Err(Failure::new(
                FailureKind::OutputTooLarge,
                format!(
                    "handler emitted {bytes} bytes; the stage allows at most {} per message",
                    limits.max_output_bytes
                ),
            ));
        }
        for emit in &mut emits {
            match &self.settings.outputs {
                Outputs::Any { default } if emit.topic.is_empty() => emit.topic.clone_from(default),
                Outputs::Any { .. } => {}
                Outputs::Declared(declared) if emit.topic.is_empty() => match declared.first() {
                    Some(first) => emit.topic.clone_from(first),
                    None => {
                        return Err(Failure::new(
                            FailureKind::UndeclaredTopic,
                            "handler emitted to the default output, but the stage declares no `publish` topics",
                        ));
                    }
                },
                Outputs::Declared(declared)
                    if !declared.contains(&emit.topic)
                        && !self.settings.timer_topics.contains(&emit.topic) =>
                {
                    return Err(Failure::new(
                        FailureKind::UndeclaredTopic,
                        format!(
                            "handler emitted to topic `{}`, which the stage does not declare (declared: {})",
                            emit.topic,
                            if declared.is_empty() {
                                "none".to_owned()
                            } else {
                                declared.join(", ")
                            }
                        ),
                    ));
                }
                Outputs::Declared(_) => {}
            }
            // Checked here, on every broker, not left to the NATS client
            // (which panics on a line break in a header): the same handler
            // output then fails the same way wherever the pipeline runs.
            // Permanent, like a reject: the handler would emit it again.
            if let Err(err) = check_portable(emit.key.as_deref(), &emit.headers) {
                return Err(Failure::new(
                    FailureKind::Rejected,
                    format!(
                        "handler emitted a message to `{}` that NATS cannot carry: {err}",
                        emit.topic
                    ),
                ));
            }
            // A delay header the broker could not read: permanent too.
            let now = crate::broker::now_millis();
            let due = match crate::delay::due_in(&emit.headers, now) {
                Ok(due) => due,
                Err(err) => {
                    return Err(Failure::new(
                        FailureKind::Rejected,
                        format!(
                            "handler emitted a message to `{}` with a delay that cannot be used: {err}",
                            emit.topic
                        ),
                    ));
                }
            };
            // A timer: to its own input only delayed, or every call would
            // feed the next at once, forever.
            if self.settings.timer_topics.contains(&emit.topic) && due.is_none_or(|at| at <= now) {
                return Err(Failure::new(
                    FailureKind::UndeclaredTopic,
                    format!(
                        "handler emitted to `{}`, the stage's own input, without a delay: \
                         `timers: true` lets a stage emit to its own input only with \
                         `sluice-delay` or `sluice-deliver-at` (a timer), so that no \
                         message comes straight back",
                        emit.topic
                    ),
                ));
            }
        }
        Ok(emits)
    }
}

impl Live {
    async fn call(&mut self, msgs: &[Message], limits: &Limits) -> wasmtime::Result<Vec<Outcome>> {
        let results = match &self.exports {
            Exports::Single(handler) => {
                let mut results = Vec::with_capacity(msgs.len());
                for msg in msgs {
                    begin(&mut self.store, limits, 1);
                    let guest = handler
                        .sluice_plugin_message_handler()
                        .call_handle(&mut self.store, msg)
                        .await?;
                    results.push(guest.map_err(from_handler_error));
                }
                results
            }
            Exports::Batch(handler) => {
                begin(&mut self.store, limits, msgs.len());
                let guest = handler
                    .sluice_plugin_batch_message_handler()
                    .call_handle_batch(&mut self.store, msgs)
                    .await?;
                check_batch_len(guest.len(), msgs.len())?;
                guest
                    .into_iter()
                    .map(|r| r.map_err(from_handler_error))
                    .collect()
            }
            Exports::SingleV2(handler) => {
                let mut results = Vec::with_capacity(msgs.len());
                for msg in v2::messages(msgs) {
                    begin(&mut self.store, limits, 1);
                    self.store.data_mut().begin_state(&msg.id);
                    self.store.data_mut().begin_http(&msg.id);
                    let guest = handler
                        .sluice_plugin_message_handler()
                        .call_handle(&mut self.store, &msg)
                        .await?;
                    results.push(v2::outcome(guest).map_err(from_handler_error));
                }
                results
            }
            Exports::BatchV2(handler) => {
                begin(&mut self.store, limits, msgs.len());
                if let Some(first) = msgs.first() {
                    self.store.data_mut().begin_http(&first.id);
                }
                let guest = handler
                    .sluice_plugin_batch_message_handler()
                    .call_handle_batch(&mut self.store, &v2::messages(msgs))
                    .await?;
                check_batch_len(guest.len(), msgs.len())?;
                guest
                    .into_iter()
                    .map(|r| v2::outcome(r).map_err(from_handler_error))
                    .collect()
            }
        };
        self.store.data_mut().disarm();
        Ok(results)
    }
}

/// Refuses a batch result without one outcome per message.
fn check_batch_len(outcomes: usize, messages: usize) -> wasmtime::Result<()> {
    if outcomes == messages {
        return Ok(());
    }
    Err(wasmtime::Error::msg(format!(
        "batch handler returned {outcomes} outcomes for {messages} messages; it must return exactly one per message"
    )))
}

/// Arms the next guest execution over `messages` inputs: its deadline, an
/// epoch deadline one tick away, and its hostcall fuel.
fn begin(store: &mut Store<StoreState>, limits: &Limits, messages: usize) {
    store.data_mut().arm(limits.timeout);
    store.set_epoch_deadline(1);
    store.set_hostcall_fuel(limits.hostcall_fuel(messages));
}

fn emit_size(emit: &Emit) -> usize {
    emit.payload.len()
        + emit.topic.len()
        + emit.key.as_ref().map_or(0, String::len)
        + emit
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
}

fn from_handler_error(err: HandlerError) -> Failure {
    match err {
        HandlerError::Retry(after) => Failure {
            kind: FailureKind::Retry,
            message: match after {
                Some(ms) => format!("handler asked to retry after {ms} ms"),
                None => "handler asked to retry".to_owned(),
            },
            retry_after: after.map(Duration::from_millis),
            state_read: Vec::new(),
        },
        HandlerError::Reject(reason) => Failure::new(FailureKind::Rejected, reason),
    }
}

/// wasmtime 48 reports exhausted hostcall fuel with a private error type, so
/// it is recognised by its text; the plugin tests pin this (bigout).
const HOSTCALL_FUEL_EXHAUSTED: &str = "fuel allocated for hostcalls has been exhausted";

/// Classifies a failed guest execution with the fixed failure kinds.
fn classify(err: wasmtime::Error, limits: &Limits) -> Failure {
    if err.downcast_ref::<DeadlineExceeded>().is_some() {
        return Failure::new(
            FailureKind::Timeout,
            format!(
                "handler did not finish within its timeout of {:?}",
                limits.timeout
            ),
        );
    }
    if err
        .chain()
        .any(|cause| cause.to_string().contains(HOSTCALL_FUEL_EXHAUSTED))
    {
        return Failure::new(
            FailureKind::OutputTooLarge,
            format!(
                "handler output is larger than the stage allows ({} bytes and {} emits per message); \
                 it was refused before being copied out of the sandbox",
                limits.max_output_bytes, limits.max_emits
            ),
        );
    }
    if let Some(oom) = err.downcast_ref::<MemoryLimitExceeded>() {
        return Failure::new(FailureKind::OutOfMemory, oom.to_string());
    }
    let message = match err.downcast_ref::<Trap>() {
        Some(Trap::StackOverflow) => {
            "handler trapped: call stack exhausted (unbounded recursion?)".to_owned()
        }
        Some(trap) => format!("handler trapped: {trap}"),
        None => format!(
            "handler failed: {}",
            super::error::chain(&err).lines().next().unwrap_or_default()
        ),
    };
    Failure::new(FailureKind::Trap, message)
}
