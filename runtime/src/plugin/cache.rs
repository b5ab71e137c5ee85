//! The on-disk cache of compiled components.
//!
//! Compiling a component with Cranelift takes tens of milliseconds for Rust
//! and seconds for Python or JavaScript guests; loading a cached artifact
//! takes well under a millisecond. Entries are keyed by the SHA-256 of the
//! component's bytes and of the engine's compatibility hash (which covers the
//! wasmtime version, the target and every code-affecting setting), so a
//! changed plugin, a wasmtime upgrade or a changed engine setting each miss.
//!
//! Loading a compiled artifact maps native code into the process, so only
//! artifacts this host wrote itself are loaded: the directory is created
//! private (0700), entries are written to a temporary file and renamed into
//! place, and each entry carries the SHA-256 of its contents, checked before
//! the bytes reach wasmtime. A torn, truncated or altered entry is a miss and
//! is rewritten.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::error::{HostError, LoadError, chain};

/// Marks a file as a Sluice compiled-component entry, format 1.
const MAGIC: &[u8; 8] = b"SLUICEC1";

/// Where a loaded component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    /// Loaded from the cache without compiling.
    Hit,
    /// Compiled, then stored for next time.
    Miss,
    /// Compiled; the host runs without a cache.
    Disabled,
}

/// A directory of compiled components, or none.
#[derive(Debug, Clone)]
pub(crate) struct CompileCache {
    dir: Option<PathBuf>,
}

impl CompileCache {
    /// Opens (creating if needed) the cache at `dir`; `None` disables caching.
    ///
    /// The directory must be private: an existing one is narrowed to 0700,
    /// and if that fails (someone else owns it) the host runs uncached, since
    /// anyone who can write the directory could plant native code in it.
    pub(crate) fn open(dir: Option<PathBuf>) -> Result<Self, HostError> {
        let Some(dir) = dir else {
            return Ok(CompileCache { dir: None });
        };
        create_private_dir(&dir).map_err(|source| HostError::Cache {
            path: dir.clone(),
            source,
        })?;
        if let Err(err) = make_private(&dir) {
            tracing::warn!(
                cache = %dir.display(),
                error = %err,
                "The compile cache directory cannot be made private (0700); running without it."
            );
            return Ok(CompileCache { dir: None });
        }
        Ok(CompileCache { dir: Some(dir) })
    }

    /// Whether compiled components are cached.
    pub(crate) fn is_enabled(&self) -> bool {
        self.dir.is_some()
    }

    /// Returns the compiled component for `bytes`, from the cache if possible.
    pub(crate) fn component(
        &self,
        engine: &Engine,
        bytes: &[u8],
        path: &Path,
    ) -> Result<(Component, CacheStatus), LoadError> {
        let Some(dir) = &self.dir else {
            return Ok((compile(engine, bytes, path)?, CacheStatus::Disabled));
        };
        let entry = dir.join(format!("{}.cwasm", cache_key(engine, bytes)));
        if let Some(component) = load_entry(engine, &entry) {
            return Ok((component, CacheStatus::Hit));
        }
        let component = compile(engine, bytes, path)?;
        if let Err(err) = store_entry(&component, &entry) {
            tracing::warn!(cache = %entry.display(), error = %err, "Could not store the compiled plugin; it will be compiled again next start.");
        }
        Ok((component, CacheStatus::Miss))
    }
}

fn compile(engine: &Engine, bytes: &[u8], path: &Path) -> Result<Component, LoadError> {
    Component::new(engine, bytes).map_err(|err| LoadError::Compile {
        path: path.to_owned(),
        reason: chain(&err),
    })
}

/// `sha256(component) - sha256(engine compatibility)`, hex.
fn cache_key(engine: &Engine, bytes: &[u8]) -> String {
    struct DigestHasher(Sha256);
    impl Hasher for DigestHasher {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
    }
    let mut engine_hash = DigestHasher(Sha256::new());
    engine
        .precompile_compatibility_hash()
        .hash(&mut engine_hash);
    let engine_digest = engine_hash.0.finalize();
    let component_digest = Sha256::digest(bytes);
    format!("{}-{}", hex(&component_digest), &hex(&engine_digest)[..16])
}

fn load_entry(engine: &Engine, entry: &Path) -> Option<Component> {
    let file = std::fs::read(entry).ok()?;
    let (header, artifact) = file.split_at_checked(MAGIC.len() + 32)?;
    if &header[..MAGIC.len()] != MAGIC || header[MAGIC.len()..] != Sha256::digest(artifact)[..] {
        tracing::warn!(cache = %entry.display(), "Ignoring a damaged compiled-plugin cache entry; recompiling.");
        return None;
    }
    // SAFETY: `Component::deserialize` maps native code from `artifact`, which
    // is only sound for bytes wasmtime itself produced. The entry sits in our
    // private cache directory, was renamed into place whole, and its digest
    // matches the one we wrote beside it, so these are bytes this host
    // serialized. wasmtime also checks the version and engine settings and
    // fails (a miss) rather than loading a mismatched artifact.
    #[allow(unsafe_code)]
    let loaded = unsafe { Component::deserialize(engine, artifact) };
    match loaded {
        Ok(component) => Some(component),
        Err(err) => {
            tracing::debug!(cache = %entry.display(), error = %chain(&err), "Cache entry not loadable by this engine; recompiling.");
            None
        }
    }
}

fn store_entry(component: &Component, entry: &Path) -> std::io::Result<()> {
    let artifact = component
        .serialize()
        .map_err(|err| std::io::Error::other(chain(&err)))?;
    let dir = entry.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile_in(dir)?;
    tmp.1.write_all(MAGIC)?;
    tmp.1.write_all(&Sha256::digest(&artifact))?;
    tmp.1.write_all(&artifact)?;
    tmp.1.sync_all()?;
    std::fs::rename(&tmp.0, entry).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp.0);
    })
}

/// A uniquely named temporary file in `dir`, created exclusively.
fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!(".tmp-{}-{n}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    Ok((path, file))
}

/// Narrows `dir` to owner-only access; fails unless we own it.
fn make_private(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir)?.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    Ok(())
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
