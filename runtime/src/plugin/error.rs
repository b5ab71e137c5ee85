//! Typed errors for loading plugins and creating the host.
//!
//! Failures of a *call* are not errors here: they are [`crate::Failure`]s with
//! a kind, because the engine routes them (retry, dead-letter). These are the
//! errors that stop a plugin from being used at all, and each names the file
//! and says what was expected, because the person reading it is fixing a
//! pipeline or a build.

use std::path::PathBuf;

/// Why a plugin file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("{path}: cannot read plugin file: {source}")]
    Read {
        /// The plugin file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not WebAssembly at all.
    #[error(
        "{path}: not a WebAssembly file (it does not start with the `\\0asm` magic bytes); \
         expected a component built with `cargo build --target wasm32-wasip2`"
    )]
    NotWasm {
        /// The plugin file.
        path: PathBuf,
    },
    /// The file is a core module, not a component.
    #[error(
        "{path}: this is a core WebAssembly module, not a component; expected a component \
         implementing sluice:plugin@{contract}. Build for the `wasm32-wasip2` target (not \
         `wasm32-unknown-unknown` or `wasm32-wasip1`), or wrap the module with \
         `wasm-tools component new`"
    )]
    CoreModule {
        /// The plugin file.
        path: PathBuf,
        /// The contract versions this host implements.
        contract: &'static str,
    },
    /// The file is a component but compiling it failed.
    #[error("{path}: invalid WebAssembly component: {reason}")]
    Compile {
        /// The plugin file.
        path: PathBuf,
        /// What wasmtime said.
        reason: String,
    },
    /// The component exports the Sluice handler interface at another,
    /// incompatible contract version.
    #[error(
        "{path}: built against {found}, which this host does not support; expected \
         sluice:plugin@{contract} (rebuild the plugin with a matching sluice-sdk)"
    )]
    IncompatibleContract {
        /// The plugin file.
        path: PathBuf,
        /// The interface the component exports.
        found: String,
        /// The contract versions this host implements.
        contract: &'static str,
    },
    /// The component implements some other world.
    #[error(
        "{path}: not a Sluice plugin: it exports {found}; expected a component of world \
         `sluice:plugin/handler` (exporting `sluice:plugin/message-handler@{contract}`) \
         or `sluice:plugin/batch-handler` (exporting \
         `sluice:plugin/batch-message-handler@{contract}`)"
    )]
    NotAPlugin {
        /// The plugin file.
        path: PathBuf,
        /// A description of what it exports.
        found: String,
        /// The contract versions this host implements.
        contract: &'static str,
    },
    /// The component exports both worlds' interfaces; the host cannot tell
    /// which one the author meant.
    #[error(
        "{path}: exports both `message-handler` and `batch-message-handler`; a plugin must \
         implement exactly one of the worlds `handler` and `batch-handler`"
    )]
    AmbiguousWorld {
        /// The plugin file.
        path: PathBuf,
    },
    /// The component imports an interface the sandbox does not link.
    #[error("{path}: imports `{import}`, which Sluice does not provide: {hint}")]
    UnsupportedImport {
        /// The plugin file.
        path: PathBuf,
        /// The import's full name.
        import: String,
        /// What to do about it.
        hint: String,
    },
    /// The component imports a capability its stage does not grant.
    #[error("{path}: imports `{import}`, which stage `{stage}` does not grant: {grant}")]
    NotGranted {
        /// The plugin file.
        path: PathBuf,
        /// The import's full name.
        import: String,
        /// The stage that loads it.
        stage: String,
        /// What to add to the stage to grant it.
        grant: String,
    },
    /// The component's memories start larger than the memory limit.
    #[error(
        "{path}: needs at least {needs_mib} MiB of memory (its memories' declared initial \
         size), more than the limit of {limit_mib} MiB; raise {setting} to at least {needs_mib}MiB"
    )]
    MemoryTooSmall {
        /// The plugin file.
        path: PathBuf,
        /// What it declares, rounded up to MiB.
        needs_mib: u64,
        /// The limit it would get, in MiB.
        limit_mib: u64,
        /// The setting that sets the limit.
        setting: &'static str,
    },
    /// The component's exports or imports do not match the contract's types,
    /// or it imports something the sandbox does not provide.
    #[error("{path}: does not fit the sluice:plugin@{contract} contract: {reason}")]
    Contract {
        /// The plugin file.
        path: PathBuf,
        /// What did not match.
        reason: String,
        /// The contract versions this host implements.
        contract: &'static str,
    },
}

/// Why the plugin host could not be created.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// wasmtime rejected the engine configuration.
    #[error("cannot configure the WebAssembly engine: {0}")]
    Engine(String),
    /// The compile cache directory could not be created.
    #[error("cannot create the compile cache at {path}: {source}")]
    Cache {
        /// The cache directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Renders a wasmtime error with its whole cause chain on one line.
pub(crate) fn chain(err: &wasmtime::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
    }
    parts.join(": ")
}
