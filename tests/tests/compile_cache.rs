//! The compile cache cannot be poisoned: real plugins built from
//! `plugins/`, real cache directories.
//!
//! - an entry copied under another plugin's key is refused (a miss: the
//!   plugin is compiled afresh, and the other plugin's code never runs);
//! - a cache directory owned by another user, or under a directory others
//!   can write, is not used (and not changed);
//! - the cache is pruned to its size cap, least recently used first.

#![cfg(unix)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use sluice::plugin::{CacheStatus, HostConfig, Message, PluginHost, WorkerSettings};

fn host(cache: &Path, max_bytes: u64) -> PluginHost {
    PluginHost::new(HostConfig {
        cache_dir: Some(cache.to_owned()),
        cache_max_bytes: max_bytes,
        max_instances: 4,
        max_memory: 64 << 20,
        ..HostConfig::default()
    })
    .expect("host")
}

/// The cache entry of the plugin file `plugin` in `cache`, if any.
fn entry_of(cache: &Path, plugin: &Path) -> Option<PathBuf> {
    let digest = Sha256::digest(std::fs::read(plugin).expect("plugin bytes"));
    let prefix: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    entries(cache).into_iter().find(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
    })
}

/// Every entry file in `cache`.
fn entries(cache: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(cache)
        .expect("cache dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect();
    found.sort();
    found
}

fn run(plugin: &sluice::plugin::Plugin, payload: &str) -> Result<Vec<u8>, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(
        plugin
            .worker(WorkerSettings::default())
            .handle(&Message::new("1", "t", payload.as_bytes().to_vec())),
    )
    .map(|emits| emits.into_iter().flat_map(|e| e.payload).collect())
    .map_err(|f| f.to_string())
}

#[test]
fn an_entry_copied_under_another_plugins_key_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let uppercase = sluice_harness::plugin("uppercase");
    let identity = sluice_harness::plugin("identity");

    let first = host(&cache, u64::MAX);
    assert_eq!(
        first.load(&uppercase).expect("load").cache_status(),
        CacheStatus::Miss
    );
    assert_eq!(
        first.load(&identity).expect("load").cache_status(),
        CacheStatus::Miss
    );
    let a = entry_of(&cache, &uppercase).expect("uppercase's entry");
    let b = entry_of(&cache, &identity).expect("identity's entry");
    assert_ne!(a, b);
    // The attack: uppercase's compiled code under identity's key.
    std::fs::copy(&a, &b).expect("swap the entry");

    let restarted = host(&cache, u64::MAX);
    let loaded = restarted.load(&identity).expect("identity loads");
    assert_eq!(
        loaded.cache_status(),
        CacheStatus::Miss,
        "the swapped entry must not be a hit"
    );
    assert_eq!(
        run(&loaded, "quiet please").expect("identity runs"),
        b"quiet please",
        "identity's own code ran, not uppercase's"
    );
    // The entry was rewritten for identity, and uppercase's is untouched.
    let again = host(&cache, u64::MAX);
    let reloaded = again.load(&identity).expect("load");
    assert_eq!(reloaded.cache_status(), CacheStatus::Hit);
    assert_eq!(run(&reloaded, "still").expect("runs"), b"still");
    let upper = again.load(&uppercase).expect("load");
    assert_eq!(upper.cache_status(), CacheStatus::Hit);
    assert_eq!(run(&upper, "abc").expect("runs"), b"ABC");
}

#[test]
fn a_cache_directory_owned_by_another_user_is_not_used_nor_changed() {
    if !sluice_harness::skip::is_root() {
        sluice_harness::skip::skip(
            "a_cache_directory_owned_by_another_user_is_not_used_nor_changed",
            sluice_harness::skip::Reason::NotRoot,
            "giving the cache directory to another user needs root",
        );
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).expect("mkdir");
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    const NOBODY: u32 = 65534;
    std::os::unix::fs::chown(&cache, Some(NOBODY), Some(NOBODY)).expect("chown to nobody");

    let host = host(&cache, u64::MAX);
    assert!(
        !host.caches_compiled_plugins(),
        "a foreign cache dir is refused"
    );
    let plugin = host
        .load(sluice_harness::plugin("uppercase"))
        .expect("loads uncached");
    assert_eq!(plugin.cache_status(), CacheStatus::Disabled);
    let meta = std::fs::metadata(&cache).expect("meta");
    assert_eq!(meta.uid(), NOBODY, "the owner is left alone");
    assert_eq!(meta.mode() & 0o7777, 0o755, "the mode is left alone");
    assert!(
        std::fs::read_dir(&cache).expect("read").next().is_none(),
        "nothing was written into it"
    );
}

#[test]
fn a_cache_under_a_directory_others_can_write_is_not_used() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let cache = shared.join("cache");
    let host = host(&cache, u64::MAX);
    assert!(
        !host.caches_compiled_plugins(),
        "anyone could swap the cache dir under a world-writable, non-sticky parent"
    );

    // The same parent with the sticky bit (like /tmp): only an entry's
    // owner can rename it, so our own 0700 directory in it is safe.
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let host = self::host(&cache, u64::MAX);
    assert!(host.caches_compiled_plugins());
    let mode = std::fs::metadata(&cache).expect("meta").mode();
    assert_eq!(mode & 0o777, 0o700);
    let secret = std::fs::metadata(cache.join("mac.key")).expect("the MAC secret");
    assert_eq!(secret.mode() & 0o777, 0o600);
}

#[test]
fn the_cache_is_pruned_to_its_cap_least_recently_used_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let [a, b, c] = ["uppercase", "identity", "router"].map(sluice_harness::plugin);

    // Sizes first, in an uncapped cache of their own.
    let sizer = dir.path().join("sizer");
    let uncapped = host(&sizer, u64::MAX);
    for p in [&a, &b, &c] {
        uncapped.load(p).expect("load");
    }
    let size = |p: &Path| {
        std::fs::metadata(entry_of(&sizer, p).expect("entry"))
            .expect("meta")
            .len()
    };
    let (sa, sb, sc) = (size(&a), size(&b), size(&c));

    // Room for a and either of the others, not for all three.
    let cap = sa + sb.max(sc);
    let capped = host(&cache, cap);
    capped.load(&a).expect("load a");
    std::thread::sleep(std::time::Duration::from_millis(20));
    capped.load(&b).expect("load b");
    std::thread::sleep(std::time::Duration::from_millis(20));
    // A hit makes a the most recently used.
    assert_eq!(
        capped.load(&a).expect("a again").cache_status(),
        CacheStatus::Hit
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    capped.load(&c).expect("load c");
    assert!(
        entry_of(&cache, &b).is_none(),
        "b, the least recently used, is pruned"
    );
    assert!(entry_of(&cache, &a).is_some(), "a was used recently");
    assert!(
        entry_of(&cache, &c).is_some(),
        "the entry just written stays"
    );
    let total: u64 = entries(&cache)
        .iter()
        .map(|p| std::fs::metadata(p).expect("meta").len())
        .sum();
    assert!(total <= cap, "{total} bytes over the cap of {cap}");

    // A cap smaller than one entry: everything is pruned at open, and the
    // entry just written is kept until the next one.
    let tiny = host(&cache, 1);
    assert_eq!(entries(&cache), Vec::<PathBuf>::new(), "pruned at open");
    tiny.load(&a).expect("load a");
    tiny.load(&b).expect("load b");
    assert_eq!(
        entries(&cache),
        vec![entry_of(&cache, &b).expect("b's entry")]
    );
}
