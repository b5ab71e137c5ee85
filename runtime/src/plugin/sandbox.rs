//! What a plugin instance can reach, and the limits it runs under.
//!
//! [`StoreState`] is the data of every wasmtime `Store`: the empty WASI
//! context (no files, environment, arguments or sockets; clocks and random
//! only), the stage's `config:` map behind the `config-get` import, the log
//! budget, the memory accounting and the current call's deadline.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, StoreContextMut, UpdateDeadline};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::outbound::{CallHooks, HttpSender};

use super::bindings::{Level, single::sluice::plugin::host, v2};
use super::clock::TickClock;
use super::secrets::GuestSecrets;
use super::stdio::{GuestOutputFactory, LogBudget, Stream};
use crate::state::{StateAccess, StateError, StateWrites, Txn};

/// The longest text one `log` call forwards; the rest is cut.
const MAX_LOG_LINE: usize = 4096;
/// Upper bound on table elements (function references) per instance.
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Raised (as a trap) when an instance tries to grow its memories past the
/// stage's limit. Classified as `out-of-memory`.
#[derive(Debug, thiserror::Error)]
#[error("memory limit of {limit} bytes exceeded (the instance asked for {requested} bytes in all)")]
pub(crate) struct MemoryLimitExceeded {
    pub(crate) limit: usize,
    pub(crate) requested: usize,
}

/// Raised (as a trap) when a call runs past its deadline. Classified as
/// `timeout`.
#[derive(Debug, thiserror::Error)]
#[error("handler exceeded its timeout of {0:?}")]
pub(crate) struct DeadlineExceeded(pub(crate) Duration);

/// The data of one plugin instance's store.
pub(crate) struct StoreState {
    wasi: WasiCtx,
    table: ResourceTable,
    plugin: Arc<str>,
    config: Arc<BTreeMap<String, String>>,
    secrets: GuestSecrets,
    pub(crate) log_budget: LogBudget,
    memory_limit: usize,
    memory_used: usize,
    last_growth: usize,
    clock: TickClock,
    /// The tick by which the current call must be done, and its timeout.
    deadline: Option<(u64, Duration)>,
    /// The stage's store, if it grants `state:`.
    state: Option<StateAccess>,
    /// The current call's view of it.
    txn: Option<Txn>,
    /// `wasi:http`'s own state (its limits).
    http_ctx: WasiHttpCtx,
    /// The stage's outbound HTTP, and the call under way.
    http: CallHooks,
}

impl StoreState {
    pub(crate) fn new(
        plugin: Arc<str>,
        config: Arc<BTreeMap<String, String>>,
        secrets: GuestSecrets,
        state: Option<StateAccess>,
        outbound: Option<HttpSender>,
        memory_limit: usize,
        clock: TickClock,
    ) -> Self {
        let log_budget = LogBudget::default();
        let wasi = WasiCtxBuilder::new()
            .stdout(GuestOutputFactory {
                plugin: plugin.clone(),
                stream: Stream::Stdout,
                budget: log_budget.clone(),
                secrets: secrets.clone(),
            })
            .stderr(GuestOutputFactory {
                plugin: plugin.clone(),
                stream: Stream::Stderr,
                budget: log_budget.clone(),
                secrets: secrets.clone(),
            })
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let http = CallHooks::new(outbound, secrets.stage());
        StoreState {
            wasi,
            table: ResourceTable::new(),
            plugin,
            config,
            secrets,
            log_budget,
            memory_limit,
            memory_used: 0,
            last_growth: 0,
            clock,
            deadline: None,
            state,
            txn: None,
            http_ctx: WasiHttpCtx::new(),
            http,
        }
    }

    /// Starts the outbound HTTP of a call handling message `id` (a
    /// batch's first): its requests' idempotency keys count from 0.
    pub(crate) fn begin_http(&mut self, id: &str) {
        self.http.begin(id);
    }

    /// Starts the state view of a call handling message `id` (a call's
    /// writes never outlive it: the last call's are dropped here if the
    /// engine did not take them).
    pub(crate) fn begin_state(&mut self, id: &str) {
        self.txn = self
            .state
            .clone()
            .map(|access| Txn::new(access, id.to_owned(), crate::broker::now_millis()));
    }

    /// The keys the current (or last) call read.
    pub(crate) fn state_read(&self) -> Vec<String> {
        self.txn.as_ref().map(Txn::read_keys).unwrap_or_default()
    }

    /// What the last call wrote, taken.
    pub(crate) fn take_state(&mut self) -> Option<StateWrites> {
        self.txn.take().and_then(Txn::finish)
    }

    /// The current call's state view, or why there is none.
    fn txn(&mut self) -> Result<&mut Txn, v2::StateError> {
        match &mut self.txn {
            Some(txn) => Ok(txn),
            None => {
                let stage = self.secrets.stage();
                tracing::warn!(target: "sluice::guest", plugin = %self.plugin, stage, "a handler used state its stage does not grant");
                Err(v2::StateError::NotGranted(format!(
                    "stage `{stage}` does not grant state; add `state: true` to it"
                )))
            }
        }
    }

    /// Arms the deadline of the next guest execution.
    pub(crate) fn arm(&mut self, timeout: Duration) {
        self.deadline = Some((self.clock.deadline_after(timeout), timeout));
        self.http.arm(std::time::Instant::now() + timeout);
    }

    /// Disarms it once the guest has returned.
    pub(crate) fn disarm(&mut self) {
        self.deadline = None;
    }

    /// Called by wasmtime each epoch tick while wasm runs: trap once the
    /// deadline has passed, otherwise yield to the tokio scheduler so a
    /// CPU-bound handler never monopolises a worker thread.
    pub(crate) fn on_epoch_tick(
        store: StoreContextMut<'_, Self>,
    ) -> wasmtime::Result<UpdateDeadline> {
        let state = store.data();
        match state.deadline {
            Some((at, timeout)) if state.clock.now() >= at => {
                Err(wasmtime::Error::new(DeadlineExceeded(timeout)))
            }
            _ => Ok(UpdateDeadline::Yield(1)),
        }
    }
}

impl WasiHttpView for StoreState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http_ctx,
            table: &mut self.table,
            hooks: &mut self.http,
        }
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl ResourceLimiter for StoreState {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let growth = desired.saturating_sub(current);
        let requested = self.memory_used.saturating_add(growth);
        if requested > self.memory_limit {
            return Err(wasmtime::Error::new(MemoryLimitExceeded {
                limit: self.memory_limit,
                requested,
            }));
        }
        self.memory_used = requested;
        self.last_growth = growth;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        // The growth we counted did not happen (e.g. past the memory's own maximum).
        self.memory_used -= self.last_growth;
        self.last_growth = 0;
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

impl host::Host for StoreState {
    fn log(&mut self, level: Level, text: String) {
        let mut end = self.log_budget.take(text.len().min(MAX_LOG_LINE));
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if end == 0 && !text.is_empty() {
            return;
        }
        let text = self.secrets.redact(&text[..end]);
        let plugin = &*self.plugin;
        match level {
            Level::Trace => tracing::trace!(target: "sluice::guest", plugin, "{text}"),
            Level::Debug => tracing::debug!(target: "sluice::guest", plugin, "{text}"),
            Level::Info => tracing::info!(target: "sluice::guest", plugin, "{text}"),
            Level::Warn => tracing::warn!(target: "sluice::guest", plugin, "{text}"),
            Level::Error => tracing::error!(target: "sluice::guest", plugin, "{text}"),
        }
    }

    fn config_get(&mut self, key: String) -> Option<String> {
        self.config.get(&key).cloned()
    }
}

impl super::bindings::single::sluice::plugin::types::Host for StoreState {}

impl v2::single::sluice::plugin::host::Host for StoreState {
    fn log(&mut self, level: v2::Level, text: String) {
        host::Host::log(self, level.into(), text);
    }

    fn config_get(&mut self, key: String) -> Option<String> {
        host::Host::config_get(self, key)
    }
}

impl v2::single::sluice::plugin::types::Host for StoreState {}

impl v2::single::sluice::plugin::secrets::Host for StoreState {
    fn get(&mut self, name: String) -> Result<String, v2::SecretError> {
        if self.secrets.is_empty() {
            // Only an engine that imports every capability gets here (a
            // component importing secrets on such a stage is refused at
            // load).
            let stage = self.secrets.stage();
            tracing::warn!(target: "sluice::guest", plugin = %self.plugin, stage, secret = %name, "a handler asked for a secret on a stage that grants none");
            return Err(v2::SecretError::NotGranted(format!(
                "stage `{stage}` does not grant secrets; list the ones it may read under its \
                 `secrets:` (names from the pipeline's `secrets:` block)"
            )));
        }
        self.secrets.get(&name).map_err(|why| {
            tracing::warn!(target: "sluice::guest", plugin = %self.plugin, secret = %name, "a handler asked for a secret its stage does not list");
            v2::SecretError::NotGranted(why)
        })
    }
}

impl From<StateError> for v2::StateError {
    fn from(e: StateError) -> Self {
        match e {
            StateError::NotGranted(why) => v2::StateError::NotGranted(why),
            StateError::StoreFull(why) => v2::StateError::StoreFull(why),
            StateError::Invalid(why) => v2::StateError::Invalid(why),
            StateError::Unavailable(why) => v2::StateError::Unavailable(why),
        }
    }
}

impl v2::single::sluice::plugin::state::Host for StoreState {
    async fn get(&mut self, key: String) -> Result<Option<v2::StateEntry>, v2::StateError> {
        Ok(self.txn()?.get(&key).await?.map(|seen| v2::StateEntry {
            value: seen.value,
            revision: seen.revision,
        }))
    }

    async fn set(
        &mut self,
        key: String,
        value: Vec<u8>,
        ttl_ms: Option<u64>,
    ) -> Result<(), v2::StateError> {
        Ok(self.txn()?.set(&key, value, ttl_ms).await?)
    }

    async fn delete(&mut self, key: String) -> Result<(), v2::StateError> {
        Ok(self.txn()?.delete(&key).await?)
    }

    async fn compare_and_set(
        &mut self,
        key: String,
        revision: u64,
        value: Vec<u8>,
        ttl_ms: Option<u64>,
    ) -> Result<bool, v2::StateError> {
        Ok(self
            .txn()?
            .compare_and_set(&key, revision, value, ttl_ms)
            .await?)
    }

    async fn increment(&mut self, key: String, delta: i64) -> Result<i64, v2::StateError> {
        Ok(self.txn()?.increment(&key, delta).await?)
    }

    async fn list(&mut self, prefix: String, limit: u32) -> Result<Vec<String>, v2::StateError> {
        Ok(self.txn()?.list(&prefix, limit).await?)
    }
}
