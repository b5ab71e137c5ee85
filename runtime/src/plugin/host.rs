//! The plugin host: one wasmtime engine, one linker, one epoch ticker, and
//! the loading of plugin files into ready-to-instantiate [`Plugin`]s.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::Digest as _;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig};

use super::bindings::v2;
use super::bindings::{batch, single};
use super::cache::{CacheStatus, CompileCache};
use super::clock::{EpochTicker, TickClock};
use super::error::{HostError, LoadError, chain};
use super::inspect::{Inspection, inspect};
use super::sandbox::StoreState;
use super::{Contract, Plugin, PluginInner, Pre, World};

/// How the host is set up. Stage-level limits live in [`super::Limits`].
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Where compiled components are cached between runs; `None` compiles
    /// every time.
    pub cache_dir: Option<PathBuf>,
    /// The size cap of the cache directory: past it, the least recently
    /// used entries are deleted.
    pub cache_max_bytes: u64,
    /// How often the epoch advances. It is the granularity of timeouts and of
    /// how often a busy handler yields its thread to other tasks.
    pub tick: Duration,
    /// The largest memory limit any stage may set (at most 4 GiB, the most a
    /// 32-bit memory can address); it sizes each pooled memory slot. A stage
    /// limit above it is lowered to it.
    pub max_memory: usize,
    /// How many plugin instances may be alive at once, across all plugins.
    pub max_instances: u32,
    /// Whether to compile in epoch checks. Without them timeouts cannot be
    /// enforced and busy handlers never yield; the switch exists only so the
    /// benchmark can measure what the checks cost.
    #[doc(hidden)]
    pub epoch_interruption: bool,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            cache_dir: None,
            cache_max_bytes: super::cache::DEFAULT_CACHE_MAX_BYTES,
            tick: default_tick(),
            max_memory: MAX_WASM32_MEMORY,
            max_instances: 128,
            epoch_interruption: true,
        }
    }
}

/// The address space of a 32-bit linear memory.
const MAX_WASM32_MEMORY: usize = 4 << 30;

/// 10 ms: timeouts land within a tick or two, and a CPU-bound handler holds
/// a runtime thread for at most that long before yielding.
fn default_tick() -> Duration {
    Duration::from_millis(10)
}

/// Loads plugins and hands out workers. Cheap to clone; all clones share one
/// engine. Dropping the last clone stops the epoch ticker.
#[derive(Clone)]
pub struct PluginHost {
    inner: Arc<HostInner>,
}

pub(crate) struct HostInner {
    pub(crate) engine: Engine,
    linker: Linker<StoreState>,
    cache: CompileCache,
    pub(crate) epoch_interruption: bool,
    /// The pooled slot size: no stage limit can exceed it.
    pub(crate) max_memory: usize,
    /// How many instances may be alive at once.
    max_instances: u32,
    /// Counts epoch ticks; deadlines are measured on it.
    pub(crate) clock: TickClock,
    _ticker: Option<EpochTicker>,
}

impl PluginHost {
    /// Creates the engine (Cranelift, epoch interruption, pooling allocator)
    /// and the linker with the sandbox's imports.
    pub fn new(config: HostConfig) -> Result<Self, HostError> {
        let engine = build_engine(&config)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| HostError::Engine(chain(&e)))?;
        // Linked for every plugin; a plugin that imports it runs only on a
        // stage whose `http:` grants it (`Inspection::check_grants`), and
        // without a grant every request is refused.
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|e| HostError::Engine(chain(&e)))?;
        single::Handler::add_to_linker::<StoreState, HasSelf<StoreState>>(&mut linker, |state| {
            state
        })
        .map_err(|e| HostError::Engine(chain(&e)))?;
        v2::single::Handler::add_to_linker::<StoreState, HasSelf<StoreState>>(
            &mut linker,
            |state| state,
        )
        .map_err(|e| HostError::Engine(chain(&e)))?;
        let cache = CompileCache::open(config.cache_dir.clone(), config.cache_max_bytes)?;
        let clock = TickClock::new(config.tick);
        let ticker = match config.epoch_interruption {
            true => Some(
                EpochTicker::start(engine.clone(), clock.clone()).map_err(|e| {
                    HostError::Engine(format!("cannot start the epoch ticker thread: {e}"))
                })?,
            ),
            false => None,
        };
        Ok(PluginHost {
            inner: Arc::new(HostInner {
                engine,
                linker,
                cache,
                epoch_interruption: config.epoch_interruption,
                max_memory: config.max_memory.min(MAX_WASM32_MEMORY),
                max_instances: config.max_instances,
                clock,
                _ticker: ticker,
            }),
        })
    }

    /// Whether compiled plugins are cached on disk (a cache directory was
    /// configured and is safe: see the `cache` module).
    pub fn caches_compiled_plugins(&self) -> bool {
        self.inner.cache.is_enabled()
    }

    /// How many plugin instances may be alive at once
    /// ([`HostConfig::max_instances`]).
    pub fn max_instances(&self) -> u32 {
        self.inner.max_instances
    }

    /// Loads, compiles (or fetches from the cache), checks and pre-links the
    /// plugin at `path`.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<Plugin, LoadError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.load_bytes(path, &bytes)
    }

    /// Like [`PluginHost::load`], for bytes already in memory; `path` names
    /// the plugin in errors and logs.
    pub fn load_bytes(&self, path: &Path, bytes: &[u8]) -> Result<Plugin, LoadError> {
        // Milliseconds: refuse what cannot work before a compile of seconds.
        let inspection = self.inspect_bytes(path, bytes)?;
        let world = inspection.world;
        let contract = inspection.contract;
        let sha256 = super::cache::hex(&sha2::Sha256::digest(bytes));
        let (component, cache_status) =
            self.inner
                .cache
                .component(&self.inner.engine, bytes, &sha256, path)?;
        let contract_error = |err: wasmtime::Error| LoadError::Contract {
            path: path.to_owned(),
            reason: chain(&err),
            contract: contract.as_str(),
        };
        let instance_pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(contract_error)?;
        let pre = match (world, contract) {
            (World::Handler, Contract::V0_1) => {
                Pre::Single(single::HandlerPre::new(instance_pre).map_err(contract_error)?)
            }
            (World::BatchHandler, Contract::V0_1) => {
                Pre::Batch(batch::BatchHandlerPre::new(instance_pre).map_err(contract_error)?)
            }
            (World::Handler, Contract::V0_2) => {
                Pre::SingleV2(v2::single::HandlerPre::new(instance_pre).map_err(contract_error)?)
            }
            (World::BatchHandler, Contract::V0_2) => {
                Pre::BatchV2(v2::batch::BatchHandlerPre::new(instance_pre).map_err(contract_error)?)
            }
        };
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "plugin".into());
        tracing::info!(plugin = %name, path = %path.display(), sha256 = %sha256, world = world.as_str(), contract = contract.as_str(), cache = cache_status.as_str(), "Loaded plugin.");
        Ok(Plugin {
            inner: Arc::new(PluginInner {
                name: name.into(),
                path: path.to_owned(),
                sha256,
                world,
                inspection,
                cache_status,
                pre,
                host: self.inner.clone(),
            }),
        })
    }
}

impl PluginHost {
    /// Reads the plugin at `path` without compiling it: its world, what it
    /// imports, and the memory it needs (checked against this host's
    /// largest memory). What `sluice validate` checks.
    ///
    /// # Errors
    ///
    /// A [`LoadError`] naming what cannot work and what to do.
    pub fn inspect(&self, path: impl AsRef<Path>) -> Result<(Inspection, String), LoadError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        let inspection = self.inspect_bytes(path, &bytes)?;
        Ok((inspection, super::cache::hex(&sha2::Sha256::digest(&bytes))))
    }

    fn inspect_bytes(&self, path: &Path, bytes: &[u8]) -> Result<Inspection, LoadError> {
        let inspection = inspect(path, bytes)?;
        check_memory(
            path,
            &inspection,
            self.inner.max_memory as u64,
            "the memory limit (a stage's `memory:`, `--memory` of `plugin test`)",
        )?;
        Ok(inspection)
    }
}

/// Refuses a component whose memories start above `limit` bytes.
///
/// # Errors
///
/// [`LoadError::MemoryTooSmall`], naming `setting`.
pub fn check_memory(
    path: &Path,
    inspection: &Inspection,
    limit: u64,
    setting: &'static str,
) -> Result<(), LoadError> {
    const MIB: u64 = 1 << 20;
    if inspection.min_memory <= limit {
        return Ok(());
    }
    Err(LoadError::MemoryTooSmall {
        path: path.to_owned(),
        needs_mib: inspection.min_memory.div_ceil(MIB),
        limit_mib: limit / MIB,
        setting,
    })
}

fn build_engine(config: &HostConfig) -> Result<Engine, HostError> {
    let mut pooling = PoolingAllocationConfig::default();
    pooling
        .total_component_instances(config.max_instances)
        .total_memories(config.max_instances.saturating_mul(2))
        .total_tables(config.max_instances.saturating_mul(4))
        .total_stacks(config.max_instances)
        .total_core_instances(config.max_instances.saturating_mul(8))
        .max_memory_size(config.max_memory.min(MAX_WASM32_MEMORY));
    let mut wasm = Config::new();
    wasm.strategy(wasmtime::Strategy::Cranelift)
        .cranelift_opt_level(OptLevel::Speed)
        .epoch_interruption(config.epoch_interruption)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
    Engine::new(&wasm).map_err(|e| HostError::Engine(chain(&e)))
}

/// The sha256 a [`Plugin`] loaded from `path` reports
/// ([`Plugin::sha256`]), read without compiling it: how a reload tells
/// which plugin files changed.
///
/// # Errors
///
/// The file cannot be read.
pub fn plugin_file_sha256(path: &Path) -> std::io::Result<String> {
    Ok(super::cache::hex(&sha2::Sha256::digest(std::fs::read(
        path,
    )?)))
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost").finish_non_exhaustive()
    }
}

impl CacheStatus {
    /// A short lowercase word for logs and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Hit => "hit",
            CacheStatus::Miss => "miss",
            CacheStatus::Disabled => "disabled",
        }
    }
}
