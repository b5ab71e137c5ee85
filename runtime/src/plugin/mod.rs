//! The WebAssembly plugin host.
//!
//! Plugins are components implementing the `sluice:plugin` contract in
//! `wit/`. This module is the only place wasmtime types appear: the rest of
//! Sluice sees [`PluginHost`], [`Plugin`], [`Worker`], the contract's
//! [`Message`] and [`Emit`], and classified [`crate::Failure`]s, so a wasmtime
//! upgrade touches one folder.
//!
//! - `inspect`: a component's imports, exports and declared memory, read
//!   without compiling it (milliseconds, where a compile takes seconds).
//! - `host`: the engine, linker, epoch ticker and plugin loading.
//! - `cache`: compiled components on disk.
//! - `sandbox`: what an instance can reach and its memory accounting.
//! - `stdio`: the guest's stdout/stderr into logs, under a budget.
//! - `worker`: instance reuse, per-call limits, failure classification.
//! - `secrets`: the secrets a stage grants its guest, and their redaction.
//! - `stage`: a pipeline file's stage as worker settings, grants and its
//!   outbound sender; `check`: each stage's plugin file, for the loader.
//! - `bindings`: the `bindgen!`s of the contract's versions.

mod bindings;
mod cache;
mod check;
mod clock;
mod error;
mod host;
mod inspect;
mod outbound;
mod sandbox;
mod secrets;
mod stage;
mod stdio;
mod worker;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use bindings::{Emit, HandlerError, Level, Message};
pub use cache::{CacheStatus, DEFAULT_CACHE_MAX_BYTES};
pub use check::PluginCheck;
pub use error::{HostError, LoadError};
pub use host::{HostConfig, PluginHost, check_memory, plugin_file_sha256};
pub use inspect::Inspection;
pub use outbound::{HttpSender, Outbound, OutboundPolicy, Script, ScriptedExchange, is_private};
pub use secrets::GuestSecrets;
pub use worker::{Isolation, Limits, Outcome, Outputs, Worker, WorkerSettings};

/// The newest contract version this host implements. It implements
/// every [`Contract`]: `sluice:plugin@0.1.0` and `@0.2.0`.
pub const CONTRACT_VERSION: &str = Contract::NEWEST.as_str();

/// The versions this host implements, as errors say them after
/// `sluice:plugin@`.
pub(crate) const IMPLEMENTED: &str = "0.1.0 or @0.2.0";

/// A version of the `sluice:plugin` contract (`wit/plugin.wit`,
/// `wit/v0.2/plugin.wit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Contract {
    /// 0.1.0: transform only.
    V0_1,
    /// 0.2.0: 0.1.0 and the capabilities a stage grants.
    V0_2,
}

impl Contract {
    /// The newest version.
    pub const NEWEST: Contract = Contract::V0_2;

    /// The version as WIT writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Contract::V0_1 => "0.1.0",
            Contract::V0_2 => "0.2.0",
        }
    }

    /// The version written `version`, if this host implements it.
    pub fn parse(version: &str) -> Option<Contract> {
        match version {
            "0.1.0" => Some(Contract::V0_1),
            "0.2.0" => Some(Contract::V0_2),
            _ => None,
        }
    }

    /// Whether this version has `capability`.
    pub fn offers(self, capability: Capability) -> bool {
        match capability {
            Capability::Secrets | Capability::State | Capability::Http => self >= Contract::V0_2,
        }
    }
}

/// A capability of contract 0.2.0: an interface a component imports only
/// if its stage grants it in YAML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// `sluice:plugin/secrets`: reading the secrets the stage lists.
    Secrets,
    /// `sluice:plugin/state`: the stage's key-value store, committed with
    /// the ack.
    State,
    /// `wasi:http/outgoing-handler` (and its `types`): outbound HTTP to
    /// the hosts the stage allows.
    Http,
}

impl Capability {
    /// Every capability.
    pub const ALL: &[Capability] = &[Capability::Secrets, Capability::State, Capability::Http];

    /// The interface, without its version.
    pub fn interface(self) -> &'static str {
        match self {
            Capability::Secrets => "sluice:plugin/secrets",
            Capability::State => "sluice:plugin/state",
            Capability::Http => "wasi:http/outgoing-handler",
        }
    }

    /// The import's full name at `contract` (WASI's own interfaces carry
    /// WASI's version, not the contract's).
    pub fn import(self, contract: Contract) -> String {
        match self {
            Capability::Http => "wasi:http/outgoing-handler@0.2".to_owned(),
            _ => format!("{}@{}", self.interface(), contract.as_str()),
        }
    }

    /// What a stage adds to grant it.
    pub fn how_to_grant(self) -> &'static str {
        match self {
            Capability::Secrets => {
                "list the secrets it may read under the stage's `secrets:` (names from the \
                 pipeline's `secrets:` block)"
            }
            Capability::State => {
                "add `state: true` to the stage (or `state: {store: NAME, max_bytes: 64MiB}`)"
            }
            Capability::Http => {
                "add `http: {allow: [HOST, ...]}` to the stage, listing the hosts it calls"
            }
        }
    }
}

/// Which world of the contract a plugin implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum World {
    /// `handler`: one message per call.
    Handler,
    /// `batch-handler`: a list of messages per call, one result per item.
    BatchHandler,
}

impl World {
    /// The world's WIT name.
    pub fn as_str(self) -> &'static str {
        match self {
            World::Handler => "handler",
            World::BatchHandler => "batch-handler",
        }
    }
}

/// A loaded, checked and pre-linked plugin. Cheap to clone; create a
/// [`Worker`] per concurrent slot.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<PluginInner>,
}

struct PluginInner {
    name: Arc<str>,
    path: PathBuf,
    /// The SHA-256 of the plugin file, lowercase hex.
    sha256: String,
    world: World,
    /// What it declares: its contract version and the capabilities it
    /// imports.
    inspection: Inspection,
    cache_status: CacheStatus,
    pre: Pre,
    host: Arc<host::HostInner>,
}

enum Pre {
    Single(bindings::single::HandlerPre<sandbox::StoreState>),
    Batch(bindings::batch::BatchHandlerPre<sandbox::StoreState>),
    SingleV2(bindings::v2::single::HandlerPre<sandbox::StoreState>),
    BatchV2(bindings::v2::batch::BatchHandlerPre<sandbox::StoreState>),
}

impl Plugin {
    /// The SHA-256 of the plugin file as loaded, 64 lowercase hex digits
    /// (what a stage's `sha256:` pins).
    pub fn sha256(&self) -> &str {
        &self.inner.sha256
    }

    /// The plugin's name (its file stem), used in logs.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The world it implements.
    pub fn world(&self) -> World {
        self.inner.world
    }

    /// The contract version it was built against.
    pub fn contract(&self) -> Contract {
        self.inner.inspection.contract
    }

    /// Refuses it for a stage that does not grant every capability it
    /// imports ([`Inspection::check_grants`]).
    ///
    /// # Errors
    ///
    /// [`LoadError::NotGranted`].
    pub fn check_grants(&self, stage: &str, granted: &[Capability]) -> Result<(), LoadError> {
        self.inner
            .inspection
            .check_grants(&self.inner.path, stage, granted)
    }

    /// Whether loading it compiled or used the cache.
    pub fn cache_status(&self) -> CacheStatus {
        self.inner.cache_status
    }

    /// A new worker slot. Instances are created lazily, on the first call.
    pub fn worker(&self, settings: WorkerSettings) -> Worker {
        Worker::new(self.clone(), settings)
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name())
            .field("world", &self.world())
            .finish_non_exhaustive()
    }
}

impl Message {
    /// A message with the given id and payload and neutral metadata; handy in
    /// tests and the CLI.
    pub fn new(
        id: impl Into<String>,
        topic: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Message {
            id: id.into(),
            topic: topic.into(),
            key: None,
            headers: Vec::new(),
            payload: payload.into(),
            attempt: 1,
            published_at: 0,
        }
    }
}
