//! The on-disk cache of compiled components.
//!
//! Compiling a component with Cranelift takes tens of milliseconds for Rust
//! and seconds for Python or JavaScript guests; loading a cached artifact
//! takes well under a millisecond. Entries are keyed by the SHA-256 of the
//! component's bytes and of the engine's compatibility hash (which covers the
//! wasmtime version, the target and every code-affecting setting), so a
//! changed plugin, a wasmtime upgrade or a changed engine setting each miss.
//!
//! Loading a compiled artifact maps native code into the daemon, so an entry
//! is only ever loaded if this user wrote it, for this key:
//!
//! - **The directory must be ours, and nobody else may be able to replace
//!   it** (see [`check_tree`]): the cache directory must be owned by this
//!   user (it is narrowed to 0700), and every directory above it must be
//!   owned by this user or root and not writable by group or others, except
//!   a sticky directory (like `/tmp`, mode 1777) owned by root or this user:
//!   there only an entry's owner can rename or delete it, so nobody else
//!   can swap our directory for theirs. Otherwise the host warns and runs
//!   without the cache. It never changes the owner or mode of a directory
//!   it does not own.
//! - **Each entry is bound to its key**: the file carries its key and a
//!   keyed BLAKE3 MAC over key and artifact, under a 32-byte secret kept in
//!   the directory (`mac.key`, 0600, ours). Both are checked before the
//!   bytes reach wasmtime, so an entry copied under another plugin's key,
//!   or written by anyone without the secret, is a miss: the plugin is
//!   compiled afresh and the entry rewritten.
//! - **The cache is pruned to a size cap**, least recently used first (a
//!   hit refreshes an entry's modification time): a Python or JavaScript
//!   plugin's entry is about 35 MB, and every rebuild adds one.
//!
//! Entries are written to a temporary file and renamed into place, so a
//! reader never sees half an entry.

use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

use super::error::{HostError, LoadError, chain};

/// Marks a file as a Sluice compiled-component entry, format 2 (key-bound).
const MAGIC: &[u8; 8] = b"SLUICEC2";

/// The file holding the cache's MAC secret.
const SECRET_FILE: &str = "mac.key";

/// What an entry's file name ends with.
const ENTRY_SUFFIX: &str = ".cwasm";

/// The default size cap of the cache: 1 GiB.
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 1 << 30;

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
    store: Option<Store>,
}

/// An open, checked cache directory.
#[derive(Clone)]
struct Store {
    dir: PathBuf,
    secret: [u8; 32],
    max_bytes: u64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

impl CompileCache {
    /// Opens (creating if needed) the cache at `dir`, capped at `max_bytes`;
    /// `None` disables caching. A directory that is not safe (see the
    /// module docs) disables it too, with a warning that says why.
    pub(crate) fn open(dir: Option<PathBuf>, max_bytes: u64) -> Result<Self, HostError> {
        let Some(dir) = dir else {
            return Ok(CompileCache { store: None });
        };
        create_private_dir(&dir).map_err(|source| HostError::Cache {
            path: dir.clone(),
            source,
        })?;
        let refuse = |why: String| {
            tracing::warn!(
                cache = %dir.display(),
                "The compile cache directory is not safe to load native code from: {why}. \
                 Running without the cache: every plugin is compiled at start. Use a \
                 directory of your own (mode 0700) under directories only you or root can \
                 write, or pass --no-cache."
            );
            Ok(CompileCache { store: None })
        };
        if let Err(why) = check_tree(&dir) {
            return refuse(why);
        }
        if let Err(err) = make_private(&dir) {
            return refuse(format!("it cannot be made private (0700): {err}"));
        }
        let secret = match load_or_create_secret(&dir) {
            Ok(secret) => secret,
            Err(why) => return refuse(why),
        };
        let store = Store {
            dir,
            secret,
            max_bytes,
        };
        store.prune(None);
        Ok(CompileCache { store: Some(store) })
    }

    /// Whether compiled components are cached.
    pub(crate) fn is_enabled(&self) -> bool {
        self.store.is_some()
    }

    /// Returns the compiled component for `bytes`, from the cache if possible.
    /// `sha256` is the hex SHA-256 of `bytes`.
    pub(crate) fn component(
        &self,
        engine: &Engine,
        bytes: &[u8],
        sha256: &str,
        path: &Path,
    ) -> Result<(Component, CacheStatus), LoadError> {
        let Some(store) = &self.store else {
            return Ok((compile(engine, bytes, path)?, CacheStatus::Disabled));
        };
        let key = cache_key(engine, sha256);
        let entry = store.dir.join(format!("{key}{ENTRY_SUFFIX}"));
        if let Some(component) = store.load_entry(engine, &key, &entry) {
            // Recently used: pruned last.
            if let Ok(file) = std::fs::File::options().write(true).open(&entry) {
                let _ = file.set_modified(SystemTime::now());
            }
            return Ok((component, CacheStatus::Hit));
        }
        let component = compile(engine, bytes, path)?;
        match store.store_entry(&component, &key, &entry) {
            Ok(()) => store.prune(Some(&entry)),
            Err(err) => {
                tracing::warn!(cache = %entry.display(), error = %err, "Could not store the compiled plugin; it will be compiled again next start.");
            }
        }
        Ok((component, CacheStatus::Miss))
    }
}

impl Store {
    /// The MAC binding `artifact` to `key`.
    fn mac(&self, key: &str, artifact: &[u8]) -> blake3::Hash {
        let mut mac = blake3::Hasher::new_keyed(&self.secret);
        mac.update(&u64::try_from(key.len()).unwrap_or(u64::MAX).to_le_bytes());
        mac.update(key.as_bytes());
        mac.update(artifact);
        mac.finalize()
    }

    /// The component in `entry` if the file is a whole entry for `key`
    /// with a valid MAC; anything else is a miss.
    fn load_entry(&self, engine: &Engine, key: &str, entry: &Path) -> Option<Component> {
        let file = std::fs::read(entry).ok()?;
        let Some(artifact) = self.verify(key, &file) else {
            tracing::warn!(cache = %entry.display(), "Ignoring a compiled-plugin cache entry that is damaged, of an older format, or not this plugin's (its key or MAC does not match); recompiling.");
            return None;
        };
        // SAFETY: `Component::deserialize` maps native code from `artifact`, which
        // is only sound for bytes wasmtime itself produced. The entry carries
        // this plugin's key and a MAC over key and bytes made with the secret
        // only this user can read (in a directory only this user can change,
        // checked at open), so these are bytes this host serialized for this
        // very plugin. wasmtime also checks the version and engine settings and
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

    /// The artifact of an entry file, if it is one for `key` with a valid MAC.
    fn verify<'a>(&self, key: &str, file: &'a [u8]) -> Option<&'a [u8]> {
        let rest = file.strip_prefix(MAGIC.as_slice())?;
        let (len, rest) = rest.split_at_checked(2)?;
        let len = usize::from(u16::from_le_bytes([len[0], len[1]]));
        let (stored_key, rest) = rest.split_at_checked(len)?;
        let (mac, artifact) = rest.split_at_checked(32)?;
        if stored_key != key.as_bytes() {
            return None;
        }
        // `blake3::Hash` compares in constant time.
        let mac = blake3::Hash::from_bytes(mac.try_into().ok()?);
        (mac == self.mac(key, artifact)).then_some(artifact)
    }

    fn store_entry(&self, component: &Component, key: &str, entry: &Path) -> std::io::Result<()> {
        let artifact = component
            .serialize()
            .map_err(|err| std::io::Error::other(chain(&err)))?;
        let len = u16::try_from(key.len()).map_err(|_| std::io::Error::other("key too long"))?;
        let (tmp_path, mut tmp) = tempfile_in(&self.dir)?;
        let written = (|| {
            tmp.write_all(MAGIC)?;
            tmp.write_all(&len.to_le_bytes())?;
            tmp.write_all(key.as_bytes())?;
            tmp.write_all(self.mac(key, &artifact).as_bytes())?;
            tmp.write_all(&artifact)?;
            tmp.sync_all()?;
            std::fs::rename(&tmp_path, entry)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp_path);
        }
        written
    }

    /// Deletes the least recently used entries until the cache is within
    /// its cap. `keep` (the entry just written) is never deleted, so a
    /// single entry larger than the cap still serves the next start.
    fn prune(&self, keep: Option<&Path>) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = dir
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(ENTRY_SUFFIX))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                meta.is_file().then(|| {
                    (
                        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        meta.len(),
                        e.path(),
                    )
                })
            })
            .collect();
        let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
        if total <= self.max_bytes {
            return;
        }
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            if Some(path.as_path()) == keep {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    total = total.saturating_sub(len);
                    tracing::info!(cache = %path.display(), bytes = len, cap = self.max_bytes, "Pruned a compiled-plugin cache entry (the cache is over its size cap; least recently used first).");
                }
                Err(err) => {
                    tracing::warn!(cache = %path.display(), error = %err, "Could not prune a compiled-plugin cache entry.");
                }
            }
        }
    }
}

fn compile(engine: &Engine, bytes: &[u8], path: &Path) -> Result<Component, LoadError> {
    Component::new(engine, bytes).map_err(|err| LoadError::Compile {
        path: path.to_owned(),
        reason: chain(&err),
    })
}

/// `sha256(component) - sha256(engine compatibility)`, hex.
fn cache_key(engine: &Engine, component_sha256: &str) -> String {
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
    format!("{component_sha256}-{}", &hex(&engine_digest)[..16])
}

/// Reads the cache's MAC secret, creating it (32 random bytes, 0600) the
/// first time. Refused unless it is a regular file of ours that nobody
/// else can read or write.
fn load_or_create_secret(dir: &Path) -> Result<[u8; 32], String> {
    let path = dir.join(SECRET_FILE);
    if std::fs::symlink_metadata(&path).is_err() {
        let mut secret = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut random| random.read_exact(&mut secret))
            .map_err(|e| format!("cannot read random bytes for its secret: {e}"))?;
        let (tmp_path, mut tmp) =
            tempfile_in(dir).map_err(|e| format!("cannot create its secret: {e}"))?;
        let made = tmp
            .write_all(&secret)
            .and_then(|()| tmp.sync_all())
            // Never replaces a secret another process made meanwhile.
            .and_then(|()| std::fs::hard_link(&tmp_path, &path));
        let _ = std::fs::remove_file(&tmp_path);
        match made {
            Ok(()) => return Ok(secret),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(format!("cannot create its secret: {err}")),
        }
    }
    let meta = std::fs::symlink_metadata(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() || meta.len() != 32 {
        return Err(format!("{} is not a 32-byte file", path.display()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let me = effective_uid();
        if meta.uid() != me {
            return Err(format!(
                "{} is owned by uid {}, not by this user (uid {me})",
                path.display(),
                meta.uid()
            ));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(format!(
                "{} can be read or written by others (mode {:o})",
                path.display(),
                meta.mode() & 0o7777
            ));
        }
    }
    let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    bytes
        .try_into()
        .map_err(|_| format!("{} is not 32 bytes", path.display()))
}

/// Checks that nobody but this user (and root) can change what is in `dir`:
/// `dir` itself must be ours; every directory above it, on the path as
/// given and on the path with symlinks resolved, must be owned by us or
/// root and not writable by group or others, unless it is sticky (then
/// only an entry's owner can rename or delete it, so our directory cannot
/// be swapped for someone else's) and owned by root or us.
#[cfg(unix)]
fn check_tree(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    const STICKY: u32 = 0o1000;
    let me = effective_uid();
    let canonical =
        std::fs::canonicalize(dir).map_err(|e| format!("cannot resolve its path: {e}"))?;
    let meta = std::fs::metadata(&canonical).map_err(|e| format!("cannot read it: {e}"))?;
    if meta.uid() != me {
        return Err(format!(
            "it is owned by uid {}, not by this user (uid {me})",
            meta.uid()
        ));
    }
    let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    let parents = canonical
        .ancestors()
        .skip(1)
        .chain(absolute.ancestors().skip(1));
    for parent in parents {
        let meta = std::fs::metadata(parent)
            .map_err(|e| format!("cannot read its parent {}: {e}", parent.display()))?;
        let owner = meta.uid();
        if owner != me && owner != 0 {
            return Err(format!(
                "its parent {} is owned by uid {owner}, neither this user (uid {me}) nor root",
                parent.display()
            ));
        }
        let mode = meta.mode();
        if mode & 0o022 != 0 && mode & STICKY == 0 {
            return Err(format!(
                "its parent {} can be written by group or others (mode {:o}) and is not sticky",
                parent.display(),
                mode & 0o7777
            ));
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_tree(_dir: &Path) -> Result<(), String> {
    Ok(())
}

/// This process's effective user id.
#[cfg(unix)]
#[allow(unsafe_code)]
fn effective_uid() -> u32 {
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// A uniquely named temporary file in `dir`, created exclusively (0600).
fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!(".tmp-{}-{n}", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(&path)?;
    Ok((path, file))
}

/// Narrows `dir` (ours, checked before) to owner-only access.
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

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
